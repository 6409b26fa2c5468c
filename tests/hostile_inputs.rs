//! Hostile inputs: headers that lie about their size, archives that try to
//! escape, folders that loop, a 10 GB sparse "line". Each gets a clear error
//! (or its real content) with bounded memory — never an allocation the size
//! of the lie, a stack overflow or a hang.
#![cfg(all(feature = "vision", feature = "text", feature = "audio"))]
use std::path::Path;
use std::sync::Mutex;

use ferrofeed::audio::ChunkStream;
use ferrofeed::audio::{AudioFiles, StreamOptions};
use ferrofeed::core::prelude::*;
use ferrofeed::stages::{ImageFolder, TarShards};
use ferrofeed::text::{CorpusOptions, TextCorpus};
use ferrofeed::vision::{synth, DecodeTransform, Image, Transform, IMAGE_EXTENSIONS};
use ferrofeed_core::sync::LockExt;

mod common;

/// Memory is measured process-wide: one test at a time.
static SERIAL: Mutex<()> = Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL.lock_unpoisoned()
}

/// Resident memory of this process, MiB.
fn rss_mib() -> f64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmRSS:"))
                .and_then(|l| l.split_whitespace().nth(1)?.parse::<f64>().ok())
        })
        .map_or(0.0, |kb| kb / 1024.0)
}

fn small_jpeg() -> Vec<u8> {
    let img = Image {
        width: 16,
        height: 8,
        data: vec![128; 16 * 8 * 3],
    };
    synth::encode_jpeg(&img, 90).unwrap()
}

/// Rewrites the frame header (SOF0/SOF2) to claim `w × h`.
fn claim_size(jpeg: &mut [u8], w: u16, h: u16) {
    let mut i = 2;
    while i + 9 < jpeg.len() {
        assert_eq!(jpeg[i], 0xff);
        let marker = jpeg[i + 1];
        let len = u16::from_be_bytes([jpeg[i + 2], jpeg[i + 3]]) as usize;
        if marker == 0xc0 || marker == 0xc2 {
            jpeg[i + 5..i + 7].copy_from_slice(&h.to_be_bytes());
            jpeg[i + 7..i + 9].copy_from_slice(&w.to_be_bytes());
            return;
        }
        i += 2 + len;
    }
    panic!("no frame header");
}

#[test]
fn a_jpeg_claiming_65535_squared_is_refused_before_allocating() {
    let _g = serial();
    let dir = tempfile::tempdir().unwrap();
    let class = dir.path().join("a");
    std::fs::create_dir(&class).unwrap();
    let mut bomb = small_jpeg();
    claim_size(&mut bomb, 65535, 65535);
    std::fs::write(class.join("bomb.jpg"), &bomb).unwrap();
    std::fs::write(class.join("fine.jpg"), small_jpeg()).unwrap();
    let folder = ImageFolder::scan(dir.path(), IMAGE_EXTENSIONS).unwrap();
    let before = rss_mib();
    let p = Pipeline::builder(folder.into_source())
        .stage("read", ferrofeed::stages::ReadFile::default())
        .stage("decode", DecodeTransform::new(Transform::eval(8, 8)))
        .batch_size(2)
        .shuffle(false)
        .on_error(ErrorPolicy::Skip)
        .collate(ferrofeed::vision::collate())
        .build()
        .unwrap();
    let n: usize = p.epoch(0).map(|b| b.unwrap().len()).sum();
    assert_eq!(n, 1);
    let s = p.last_summary().unwrap();
    assert_eq!(s.skipped.len(), 1);
    let e = s.skipped[0].to_string();
    assert!(e.contains("bomb.jpg") && e.contains("decode"), "{e}");
    assert!(e.contains("65535"), "names the claimed size: {e}");
    // 65535² × 3 bytes would be 12 GiB.
    assert!(
        rss_mib() - before < 100.0,
        "grew {:.0} MiB",
        rss_mib() - before
    );
}

#[test]
fn a_wav_claiming_four_billion_samples_yields_what_it_holds() {
    let _g = serial();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("liar.wav");
    let x: Vec<f32> = (0..16000)
        .map(|i| ((i * 31) % 2000) as f32 / 1000.0 - 1.0)
        .collect();
    // The data chunk claims 2^32 - 1 bytes: 2^31 samples.
    let v = common::wav(16000, &x, false, Some(u32::MAX));
    std::fs::write(&path, &v).unwrap();
    let before = rss_mib();
    let opts = StreamOptions {
        chunk_seconds: 0.25,
        ..StreamOptions::default()
    };
    let mut real = 0;
    let mut errors = Vec::new();
    for c in ChunkStream::open(&path, &opts).unwrap() {
        match c {
            Ok(c) => real += c.valid,
            Err(e) => errors.push(e.to_string()),
        }
    }
    assert_eq!(real, 16000, "the samples the file really holds");
    assert!(errors.iter().all(|e| e.contains("liar.wav")), "{errors:?}");
    assert!(rss_mib() - before < 50.0);
}

#[test]
fn tar_entries_escaping_the_archive_are_refused() {
    let _g = serial();
    let dir = tempfile::tempdir().unwrap();
    for (name, entry) in [("dotdot.tar", "../evil.jpg"), ("abs.tar", "/etc/evil.jpg")] {
        let path = dir.path().join(name);
        // The tar crate refuses to write such names, so write the header by hand.
        let data = small_jpeg();
        let mut header = [0u8; 512];
        header[..entry.len()].copy_from_slice(entry.as_bytes());
        header[100..108].copy_from_slice(b"0000644\0");
        header[108..116].copy_from_slice(b"0000000\0");
        header[116..124].copy_from_slice(b"0000000\0");
        header[124..136].copy_from_slice(format!("{:011o}\0", data.len()).as_bytes());
        header[136..148].copy_from_slice(b"00000000000\0");
        header[156] = b'0';
        header[257..263].copy_from_slice(b"ustar\0");
        header[263..265].copy_from_slice(b"00");
        header[148..156].copy_from_slice(b"        ");
        let sum: u32 = header.iter().map(|&b| u32::from(b)).sum();
        header[148..156].copy_from_slice(format!("{sum:06o}\0 ").as_bytes());
        let mut bytes = header.to_vec();
        bytes.extend_from_slice(&data);
        bytes.resize(bytes.len().div_ceil(512) * 512 + 1024, 0);
        std::fs::write(&path, bytes).unwrap();
        let e = TarShards::open(&[path], IMAGE_EXTENSIONS)
            .err()
            .unwrap_or_else(|| panic!("{name} was accepted"))
            .to_string();
        assert!(e.contains(entry) && e.contains("refused"), "{e}");
    }
}

#[test]
fn symlink_loops_are_errors_not_stack_overflows() {
    let _g = serial();
    let dir = tempfile::tempdir().unwrap();
    let class = dir.path().join("a");
    std::fs::create_dir(&class).unwrap();
    std::fs::write(class.join("x.jpg"), small_jpeg()).unwrap();
    std::fs::write(class.join("x.txt"), "a line\n").unwrap();
    std::fs::write(class.join("x.wav"), b"RIFF").unwrap();
    std::os::unix::fs::symlink(dir.path(), class.join("loop")).unwrap();
    let e = ImageFolder::scan(dir.path(), IMAGE_EXTENSIONS)
        .unwrap_err()
        .to_string();
    assert!(e.contains("loop"), "{e}");
    let e = TextCorpus::open(dir.path(), &CorpusOptions::default())
        .err()
        .unwrap()
        .to_string();
    assert!(e.contains("loop"), "{e}");
    let e = AudioFiles::scan(dir.path(), StreamOptions::default())
        .unwrap_err()
        .to_string();
    assert!(e.contains("loop"), "{e}");
}

#[test]
fn a_10_gb_sparse_line_is_refused_with_bounded_memory() {
    let _g = serial();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("huge.txt");
    let size: u64 = 10 << 30;
    {
        use std::os::unix::fs::FileExt;
        let f = std::fs::File::create(&path).unwrap();
        f.set_len(size).unwrap();
        f.write_all_at(b"\nthe only real line\n", size - 20)
            .unwrap();
    }
    let before = rss_mib();
    let corpus = TextCorpus::open(&path, &CorpusOptions::default()).unwrap();
    assert_eq!(corpus.len(), 2);
    let e = corpus.get(0).unwrap_err().to_string();
    assert!(e.contains("huge.txt:1") && e.contains("longer than"), "{e}");
    assert_eq!(corpus.get(1).unwrap().0, "the only real line");
    let grew = rss_mib() - before;
    assert!(
        grew < 200.0,
        "indexing and reading grew RSS by {grew:.0} MiB"
    );
    assert!(Path::new(&path).exists());
}

/// Inputs the fuzzers (`fuzz/run.sh`) once crashed on: each must now be an
/// error or an image, never a panic.
#[test]
fn fuzz_regressions_decode_without_panicking() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/vision/fuzz");
    let mut n = 0;
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        let bytes = std::fs::read(&path).unwrap();
        let r = std::panic::catch_unwind(|| {
            let _ = ferrofeed::vision::decode(&bytes, &ferrofeed::vision::DecodeOptions::default());
            let stage = DecodeTransform::new(Transform::train(32));
            let stop = std::sync::atomic::AtomicBool::new(false);
            let ctx = StageCtx::detached(0, 0, 7, &stop);
            let _ = stage.process(ferrofeed::stages::Bytes::from(bytes.clone()), &ctx);
        });
        assert!(r.is_ok(), "{} panics", path.display());
        n += 1;
    }
    assert!(n >= 2);
}
