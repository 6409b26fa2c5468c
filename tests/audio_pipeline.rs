//! The audio pack against librosa, chunk boundaries, and hostile files,
//! through the library API.
#![cfg(feature = "audio")]
use std::path::{Path, PathBuf};
use std::sync::Arc;

use ferrofeed::audio::ChunkStream;
use ferrofeed::audio::Decoded;
use ferrofeed::audio::*;
use ferrofeed::core::prelude::*;

mod common;
use common::npy_f32;

fn data() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/audio")
}

fn decode_all(path: &Path) -> (Vec<f32>, u32) {
    let mut d = Decoded::open(path, &DecodeOptions::default()).unwrap();
    let mut all = Vec::new();
    while let Some(b) = d.next_block().unwrap() {
        all.extend(b);
    }
    (all, d.sample_rate())
}

#[test]
fn mel_and_logmel_agree_with_librosa() {
    for name in [
        "a_tone_16k.wav",
        "b_noise_22k.wav",
        "c_stereo_16k.flac",
        "d_speech_22k.mp3",
        "e_speech_22k.ogg",
    ] {
        let (y, sr) = decode_all(&data().join(name));
        let fx = FeatureExtractor::new(FeatureConfig {
            sample_rate: sr,
            ..FeatureConfig::default()
        })
        .unwrap();
        let (shape, want) = npy_f32(&data().join(format!("{name}.mel.npy")));
        let got = fx.compute(&y, FeatureKind::Mel);
        assert_eq!(vec![got.bins, got.frames], shape, "{name}");
        let max = want.iter().fold(0f32, |m, &v| m.max(v));
        let mut worst = 0f64;
        let mut compared = 0;
        for (&g, &w) in got.data.iter().zip(&want) {
            if w > max * 1e-6 {
                worst = worst.max((f64::from(g) - f64::from(w)).abs() / f64::from(w));
                compared += 1;
            }
        }
        assert!(compared > 1000, "{name}: {compared} bins compared");
        eprintln!("{name}: {compared} bins, worst mel relative error {worst:.2e}");
        assert!(worst <= 1e-3, "{name}: mel relative error {worst}");

        let (_, want_db) = npy_f32(&data().join(format!("{name}.logmel.npy")));
        let got_db = fx.compute(&y, FeatureKind::LogMel);
        let worst_db = got_db
            .data
            .iter()
            .zip(&want_db)
            .zip(&want)
            .filter(|(_, &w)| w > max * 1e-6)
            .map(|((&g, &w), _)| (g - w).abs())
            .fold(0f32, f32::max);
        // 1e-3 relative in power is 0.0043 dB.
        assert!(worst_db <= 0.005, "{name}: log-mel error {worst_db} dB");
    }
}

#[test]
fn overlapping_chunks_agree_with_the_whole_file_away_from_their_edges() {
    let path = data().join("a_tone_16k.wav");
    let (y, _) = decode_all(&path);
    let fx = FeatureExtractor::new(FeatureConfig::default()).unwrap();
    let whole = fx.compute(&y, FeatureKind::LogMel);
    // 0.5 s chunks every 0.3 s: the step is 30 hops, so frames line up.
    let opts = StreamOptions {
        chunk_seconds: 0.5,
        overlap_seconds: 0.2,
        ..StreamOptions::default()
    };
    let chunks: Vec<AudioChunk> = ChunkStream::open(&path, &opts)
        .unwrap()
        .map(Result::unwrap)
        .collect();
    assert_eq!(
        chunks.len(),
        6,
        "starts 0, 0.3, …, 1.5 s: the last ends at 2 s"
    );
    let edge = 400 / 2 / 160 + 1; // frames whose window reaches past a chunk edge
    let mut checked = 0;
    for c in &chunks {
        let f = fx.compute(&c.samples, FeatureKind::LogMel);
        let offset = c.start as usize / 160;
        let valid_frames = 1 + c.valid / 160;
        for t in edge..valid_frames.saturating_sub(edge) {
            for m in 0..80 {
                let a = f.data[m * f.frames + t];
                let b = whole.data[m * whole.frames + offset + t];
                assert!(
                    (a - b).abs() < 1e-3,
                    "chunk at {}: frame {t} band {m}: {a} vs {b}",
                    c.start
                );
            }
            checked += 1;
        }
    }
    assert!(checked > 150, "{checked} frames checked");
    // Consecutive chunks agree with each other where they overlap.
    let (c0, c1) = (&chunks[0], &chunks[1]);
    let (f0, f1) = (
        fx.compute(&c0.samples, FeatureKind::Mel),
        fx.compute(&c1.samples, FeatureKind::Mel),
    );
    let shift = (c1.start - c0.start) as usize / 160;
    for t in shift + edge..f0.frames - edge {
        for m in 0..80 {
            let (a, b) = (
                f0.data[m * f0.frames + t],
                f1.data[m * f1.frames + t - shift],
            );
            assert!(
                (a - b).abs() <= 1e-4 * a.abs().max(1e-6),
                "frame {t} band {m}"
            );
        }
    }
}

#[test]
fn the_pipeline_batches_chunks_of_every_file() {
    let opts = StreamOptions {
        chunk_seconds: 0.5,
        overlap_seconds: 0.0,
        ..StreamOptions::default()
    };
    let files = AudioFiles::scan(&data(), opts).unwrap();
    assert_eq!(files.files().len(), 5);
    let read = files.samples_read();
    let p = Pipeline::builder_iterable(files)
        .stage(
            "logmel",
            FeatureStage::new(FeatureConfig::default(), FeatureKind::LogMel).unwrap(),
        )
        .interleave(3)
        .batch_size(4)
        .collate(FeatureCollate::new())
        .build()
        .unwrap();
    let mut chunks = Vec::new();
    for b in p.epoch(0) {
        let b = b.unwrap();
        let f = b.get("features").unwrap();
        assert_eq!(&f.shape()[1..], &[80, 51]);
        let lengths = b
            .get("lengths")
            .unwrap()
            .as_slice::<i64>()
            .unwrap()
            .to_vec();
        let starts = b
            .get("chunk_starts")
            .unwrap()
            .as_slice::<i64>()
            .unwrap()
            .to_vec();
        for ((&i, l), s) in b.indices().iter().zip(lengths).zip(starts) {
            chunks.push((i >> ferrofeed::core::STREAM_POSITION_BITS, s, l));
        }
    }
    chunks.sort();
    // a: 2 s → 4 chunks; b: 1.3 s at 22.05 kHz → 20800 samples at 16 kHz → 3 chunks (last 0.3 s);
    // c: 1 s → 2 chunks; d (MP3) and e (Ogg): 2.5 s at 22.05 kHz → 40000 samples → 5 chunks.
    let per_file: Vec<usize> = (0..5)
        .map(|f| chunks.iter().filter(|c| c.0 == f).count())
        .collect();
    assert_eq!(per_file, [4, 3, 2, 5, 5]);
    let b_last = chunks.iter().rfind(|c| c.0 == 1).unwrap();
    assert_eq!(b_last.1, 16000);
    assert_eq!(b_last.2, 1 + (20800 - 16000) / 160);
    assert_eq!(
        read.load(std::sync::atomic::Ordering::Relaxed),
        32000 + 20800 + 16000 + 2 * 40000
    );
}

fn wav_bytes(rate: u32, samples: &[f32]) -> Vec<u8> {
    common::wav(rate, samples, true, None)
}

#[test]
fn hostile_files_are_named_errors_under_the_policy() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let good = std::fs::read(data().join("a_tone_16k.wav")).unwrap();
    std::fs::write(d.join("00_good.wav"), &good).unwrap();
    std::fs::write(d.join("01_empty.wav"), b"").unwrap();
    std::fs::write(d.join("02_garbage.mp3"), vec![0x42u8; 5000]).unwrap();
    std::fs::write(d.join("03_truncated.wav"), &good[..30]).unwrap();
    let mut nan = vec![0.1f32; 8000];
    nan[5000] = f32::NAN;
    std::fs::write(d.join("04_nan.wav"), wav_bytes(16000, &nan)).unwrap();
    std::fs::write(d.join("05_absurd_rate.wav"), wav_bytes(0, &[0.0; 100])).unwrap();
    std::fs::write(d.join("06_tiny.wav"), wav_bytes(16000, &[0.5; 50])).unwrap();
    std::fs::write(d.join("07_text.ogg"), b"this is not an ogg file at all").unwrap();
    let flac = std::fs::read(data().join("c_stereo_16k.flac")).unwrap();
    let mut corrupt = flac.clone();
    for b in corrupt[flac.len() / 2..flac.len() / 2 + 2000].iter_mut() {
        *b ^= 0x5a;
    }
    std::fs::write(d.join("08_corrupt.flac"), &corrupt).unwrap();

    let build = |policy, non_finite| {
        let opts = StreamOptions {
            chunk_seconds: 1.0,
            decode: DecodeOptions { non_finite },
            ..StreamOptions::default()
        };
        Pipeline::builder_iterable(AudioFiles::scan(d, opts).unwrap())
            .stage(
                "logmel",
                FeatureStage::new(FeatureConfig::default(), FeatureKind::LogMel).unwrap(),
            )
            .shuffle(false)
            .batch_size(4)
            .on_error(policy)
            .collate(FeatureCollate::new())
            .build()
            .unwrap()
    };
    let p = build(ErrorPolicy::Skip, NonFinite::Error);
    let mut rows = 0;
    for b in p.epoch(0) {
        rows += b.unwrap().len();
    }
    let s = p.last_summary().unwrap();
    let named: Vec<String> = s
        .skipped
        .iter()
        .map(|e| format!("{} | {}", e.path.clone().unwrap_or_default(), e))
        .collect();
    for bad in [
        "01_empty",
        "02_garbage",
        "03_truncated",
        "04_nan",
        "05_absurd_rate",
        "07_text",
    ] {
        assert!(
            named.iter().any(|n| n.contains(bad)),
            "{bad} not reported: {named:#?}"
        );
    }
    let e = named.iter().find(|n| n.contains("04_nan")).unwrap();
    assert!(e.contains("sample 5000 is NaN"), "{e}");
    let e = named.iter().find(|n| n.contains("05_absurd")).unwrap();
    assert!(e.contains("sample rate"), "{e}");
    assert!(named.iter().all(|n| !n.contains("panicked")), "{named:#?}");
    // The good file (2 chunks) and the tiny one (1 padded chunk) come through;
    // the corrupt FLAC either decodes what precedes the damage or is reported.
    assert!(rows >= 3, "{rows} rows");
    assert!(named.iter().any(|n| n.contains("08_corrupt")) || rows >= 4);

    // Zeroing NaNs accepts that file; `fail` stops at the first bad file.
    let p = build(ErrorPolicy::Skip, NonFinite::Zero);
    p.epoch(0).for_each(drop);
    let s = p.last_summary().unwrap();
    assert!(s.skipped.iter().all(|e| !e.to_string().contains("NaN")));
    let p = build(ErrorPolicy::Fail, NonFinite::Error);
    let e = p
        .epoch(0)
        .find_map(Result::err)
        .expect("fail stops the epoch");
    assert!(
        e.to_string().contains("01_empty") && e.to_string().contains("empty file"),
        "{e}"
    );
}

#[test]
fn channels_can_be_kept_one_plane_each() {
    let path = data().join("c_stereo_16k.flac");
    let mut d = Decoded::open(&path, &DecodeOptions::default()).unwrap();
    let (mut left, mut right): (Vec<f32>, Vec<f32>) = (Vec::new(), Vec::new());
    while let Some(p) = d.next_channels().unwrap() {
        assert_eq!(p.len(), 2);
        left.extend(&p[0]);
        right.extend(&p[1]);
    }
    assert_eq!(left.len(), 16000);
    let (mono, _) = decode_all(&path);
    for i in (0..16000).step_by(997) {
        assert!((mono[i] - (left[i] + right[i]) / 2.0).abs() < 1e-6);
    }

    let opts = StreamOptions {
        chunk_seconds: 0.5,
        keep_channels: true,
        ..StreamOptions::default()
    };
    let chunks: Vec<AudioChunk> = ChunkStream::open(&path, &opts)
        .unwrap()
        .map(Result::unwrap)
        .collect();
    assert_eq!(chunks.len(), 2);
    assert!(chunks
        .iter()
        .all(|c| c.channels == 2 && c.samples.len() == 16000));
    assert_eq!(&chunks[1].samples[..8000], &left[8000..]);
    assert_eq!(&chunks[1].samples[8000..], &right[8000..]);

    let files = AudioFiles::scan(&path, opts).unwrap();
    let p = Pipeline::builder_iterable(files)
        .stage(
            "logmel",
            FeatureStage::new(FeatureConfig::default(), FeatureKind::LogMel).unwrap(),
        )
        .batch_size(4)
        .collate(FeatureCollate::new())
        .build()
        .unwrap();
    let b = p.epoch(0).next().unwrap().unwrap();
    let f = b.get("features").unwrap();
    assert_eq!(f.shape(), &[2, 2, 80, 51]);
    let fx = FeatureExtractor::new(FeatureConfig::default()).unwrap();
    let want_right = fx.compute(&right[..8000], FeatureKind::LogMel);
    let row = b.indices().iter().position(|&i| i & 0xff == 0).unwrap();
    let v = f.as_slice::<f32>().unwrap();
    let plane = &v[row * 2 * 80 * 51 + 80 * 51..(row + 1) * 2 * 80 * 51];
    assert_eq!(
        plane,
        &want_right.data[..],
        "the second plane is the right channel"
    );
}

/// An audio pipeline over WAV files knows its epoch length from their
/// headers: the hint equals the batches delivered, for mixed rates and
/// channel counts, with and without overlap, shuffled, sharded and with
/// drop_last. One file of another format makes the length unknown.
#[test]
fn the_epoch_length_is_known_from_the_headers() {
    let dir = tempfile::tempdir().unwrap();
    let mut names = synth::write_dataset_with(
        dir.path(),
        9,
        4,
        &synth::SynthOptions {
            seconds: 0.3..4.0,
            format: synth::Format::Wav,
            ..synth::SynthOptions::default()
        },
    )
    .unwrap();
    names.sort();
    assert!(names
        .iter()
        .all(|p| p.extension().is_some_and(|e| e == "wav")));
    for (chunk, overlap, batch, drop_last, world, offsets) in [
        (1.0, 0.0, 4, false, 1, 1),
        (0.7, 0.2, 3, true, 1, 1),
        (2.0, 0.5, 5, false, 2, 1),
        (0.25, 0.0, 16, false, 3, 1),
        // Random chunk offsets: the length follows each epoch's offsets.
        (1.0, 0.0, 1, false, 1, 8),
        (0.5, 0.1, 3, false, 2, 5),
    ] {
        let opts = StreamOptions {
            chunk_seconds: chunk,
            overlap_seconds: overlap,
            chunk_offsets: offsets,
            ..StreamOptions::default()
        };
        for rank in 0..world {
            let files = AudioFiles::scan(dir.path(), opts).unwrap();
            let p = Pipeline::builder_iterable(files)
                .stage(
                    "f",
                    FeatureStage::new(FeatureConfig::default(), FeatureKind::LogMel).unwrap(),
                )
                .batch_size(batch)
                .drop_last(drop_last)
                .shuffle(true)
                .shard(Shard::new(rank, world).unwrap())
                .collate(FeatureCollate::new())
                .build()
                .unwrap();
            for epoch in 0..4 {
                let hint = p.epoch_hint(epoch).expect("WAV headers give lengths");
                let got = p
                    .epoch(epoch)
                    .filter(|b| b.as_ref().map(|_| true).unwrap())
                    .count();
                assert_eq!(
                    hint, got,
                    "chunk {chunk} overlap {overlap} batch {batch} rank {rank}/{world} offsets {offsets}"
                );
            }
        }
    }
    let flac = synth::write_dataset_with(
        dir.path(),
        1,
        9,
        &synth::SynthOptions {
            seconds: 1.0..2.0,
            format: synth::Format::Flac,
            ..synth::SynthOptions::default()
        },
    )
    .unwrap();
    assert!(flac[0].extension().is_some_and(|e| e == "flac"));
    let files = AudioFiles::scan(dir.path(), StreamOptions::default()).unwrap();
    let p = Pipeline::builder_iterable(files)
        .stage(
            "f",
            FeatureStage::new(FeatureConfig::default(), FeatureKind::LogMel).unwrap(),
        )
        .collate(FeatureCollate::new())
        .build()
        .unwrap();
    assert_eq!(p.epoch_hint(0), None);
}

/// Every chunk an epoch delivers, by (file, first sample): its features'
/// bits and valid frames; and the batches' count.
type ChunkMap = std::collections::BTreeMap<(PathBuf, i64), (Vec<u32>, i64)>;

/// Epoch `epoch` of `p` as a [`ChunkMap`] (`paths`: each shard's file),
/// and its batches' count; a chunk delivered twice fails.
fn epoch_chunks(p: &Pipeline, epoch: u64, paths: &[PathBuf]) -> (ChunkMap, usize) {
    let mut out = ChunkMap::new();
    let mut batches = 0;
    for b in p.epoch(epoch) {
        let b = b.unwrap();
        batches += 1;
        let f = b.get("features").unwrap();
        let per = f.shape()[1] * f.shape()[2];
        let data = f.as_slice::<f32>().unwrap();
        let starts = b.get("chunk_starts").unwrap().as_slice::<i64>().unwrap();
        let lengths = b.get("lengths").unwrap().as_slice::<i64>().unwrap();
        for (row, &i) in b.indices().iter().enumerate() {
            let path = paths[(i >> ferrofeed::core::STREAM_POSITION_BITS) as usize].clone();
            let bits = data[row * per..(row + 1) * per]
                .iter()
                .map(|x| x.to_bits())
                .collect();
            let old = out.insert((path, starts[row]), (bits, lengths[row]));
            assert!(old.is_none(), "a chunk delivered twice");
        }
    }
    (out, batches)
}

fn chunks_by_file(files: AudioFiles, workers: usize, epoch: u64) -> (ChunkMap, usize, u64) {
    use ferrofeed::core::{Parallelism, StageOptions};
    let paths: Vec<PathBuf> = files.shard_paths();
    let read = files.samples_read();
    let p = Pipeline::builder_iterable(files)
        .stage_with(
            "f",
            StageOptions::new().workers(Parallelism::Fixed(workers)),
            FeatureStage::new(FeatureConfig::default(), FeatureKind::LogMel).unwrap(),
        )
        .batch_size(3)
        .shuffle(true)
        .seed(11)
        .collate(FeatureCollate::new())
        .build()
        .unwrap();
    let (out, batches) = epoch_chunks(&p, epoch, &paths);
    (
        out,
        batches,
        read.load(std::sync::atomic::Ordering::Relaxed),
    )
}

#[test]
fn long_files_are_read_as_segments_by_several_workers_with_the_chunks_of_one() {
    let dir = tempfile::tempdir().unwrap();
    let mut rng = ferrofeed::core::rng::sample_rng(5);
    // Noise does not compress: each long file is over the 1 MiB threshold.
    let long_wav = synth::signal("noise", 16_000 * 41 + 123, 16_000, &mut rng);
    synth::write_wav(&dir.path().join("long.wav"), &[long_wav], 16_000, false).unwrap();
    let l = synth::signal("noise", 44_100 * 17 + 5, 44_100, &mut rng);
    let r = synth::signal("chirp", 44_100 * 17 + 5, 44_100, &mut rng);
    synth::write_flac(&dir.path().join("long.flac"), &[l, r], 44_100).unwrap();
    let short = synth::signal("tone", 16_000 * 3, 16_000, &mut rng);
    synth::write_wav(&dir.path().join("short.wav"), &[short], 16_000, false).unwrap();
    for name in ["long.wav", "long.flac"] {
        let len = std::fs::metadata(dir.path().join(name)).unwrap().len();
        assert!(len >= SEGMENT_MIN_BYTES, "{name}: {len} bytes");
    }
    let opts = |segment_seconds: f64| StreamOptions {
        chunk_seconds: 1.0,
        overlap_seconds: 0.25,
        chunk_offsets: 3,
        segment_seconds,
        ..StreamOptions::default()
    };
    let whole = AudioFiles::scan(dir.path(), opts(0.0)).unwrap();
    assert_eq!(whole.segments().len(), 3, "0: one shard per file");
    let split = AudioFiles::scan(dir.path(), opts(4.0)).unwrap();
    let of = |f: &AudioFiles, name: &str| {
        f.segments()
            .iter()
            .filter(|s| f.files()[s.file].ends_with(name))
            .count()
    };
    // 4 s segments of 0.75 s steps: 5 chunks each; 41 s → 55 chunks → 11.
    assert_eq!(of(&split, "long.wav"), 11);
    assert!(of(&split, "long.flac") >= 4);
    assert_eq!(of(&split, "short.wav"), 1, "a short file stays whole");
    // The longest shard: the FLAC's last segment (17 s → 23 chunks: three
    // of 5, then 8 to the end); unknown when files are not split.
    assert_eq!(split.longest_shard(), Some(8));
    assert_eq!(whole.longest_shard(), None);
    for epoch in 0..2 {
        let files = AudioFiles::scan(dir.path(), opts(0.0)).unwrap();
        let (want, _, read) = chunks_by_file(files, 1, epoch);
        assert!(want.len() > 70);
        for workers in [1, 3] {
            let files = AudioFiles::scan(dir.path(), opts(4.0)).unwrap();
            let (got, batches, got_read) = chunks_by_file(files, workers, epoch);
            assert_eq!(got.len(), want.len(), "epoch {epoch}, {workers} workers");
            assert!(
                got == want,
                "epoch {epoch}, {workers} workers: a chunk differs from decoding its file whole"
            );
            assert_eq!(got_read, read, "every sample counted once");
            assert_eq!(batches, got.len().div_ceil(3));
        }
    }
    // Through the feature cache, each segment is an entry of its own: the
    // second epoch reads every one of them, with the same chunks.
    let cache_dir = tempfile::tempdir().unwrap();
    let cache = FeatureCache::open(cache_dir.path(), 1 << 30).unwrap();
    let split = AudioFiles::scan(dir.path(), opts(4.0)).unwrap();
    let shards = split.segments().len() as u64;
    let paths: Vec<PathBuf> = split.shard_paths();
    let stage = FeatureStage::new(FeatureConfig::default(), FeatureKind::LogMel).unwrap();
    let p = Pipeline::builder_iterable(CachedFeatures::new(split, stage, Arc::clone(&cache)))
        .seed(11)
        .batch_size(4)
        .collate(FeatureCollate::new())
        .build()
        .unwrap();
    let files = AudioFiles::scan(dir.path(), opts(0.0)).unwrap();
    let (want, _, _) = chunks_by_file(files, 1, 0);
    for epoch in [0, 0] {
        let (got, _) = epoch_chunks(&p, epoch, &paths);
        assert!(got == want, "the cache gives the chunks of decoding whole");
    }
    assert_eq!(
        (cache.folder().misses(), cache.folder().hits()),
        (shards, shards)
    );

    // The WAV's segments know their lengths from the header, so the epoch
    // length is known as for whole files.
    let wav_only = tempfile::tempdir().unwrap();
    std::fs::copy(
        dir.path().join("long.wav"),
        wav_only.path().join("long.wav"),
    )
    .unwrap();
    for epoch in 0..3 {
        let files = AudioFiles::scan(wav_only.path(), opts(4.0)).unwrap();
        assert_eq!(files.segments().len(), 11);
        let p = Pipeline::builder_iterable(files)
            .stage(
                "f",
                FeatureStage::new(FeatureConfig::default(), FeatureKind::LogMel).unwrap(),
            )
            .batch_size(4)
            .collate(FeatureCollate::new())
            .build()
            .unwrap();
        let hint = p.epoch_hint(epoch).unwrap();
        assert_eq!(hint, p.epoch(epoch).count(), "epoch {epoch}");
    }
}
