//! Helpers shared by the end-to-end tests: running the `ferrofeed` command
//! with its own cache folder, reading `.npy` dumps and run reports, and
//! writing small WAV files and WebDataset shards.
#![allow(dead_code)]
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// Runs `ferrofeed ARGS` with `FERROFEED_CACHE_DIR=cache`.
pub fn run_in(cache: &Path, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_ferrofeed"))
        .env("FERROFEED_CACHE_DIR", cache)
        .args(args)
        .output()
        .expect("the binary runs")
}

/// Runs the command, asserts success and returns its stdout.
pub fn ok_in(cache: &Path, args: &[&str]) -> String {
    let out = run_in(cache, args);
    assert!(
        out.status.success(),
        "ferrofeed {args:?} failed:\n{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Runs the command, asserts failure and returns its stderr.
pub fn fail_in(cache: &Path, args: &[&str]) -> String {
    let out = run_in(cache, args);
    assert!(!out.status.success(), "ferrofeed {args:?} should fail");
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// An `.npy` file: (descr, shape, data bytes).
pub fn npy(path: &Path) -> (String, Vec<usize>, Vec<u8>) {
    let bytes = std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let hlen = u16::from_le_bytes([bytes[8], bytes[9]]) as usize;
    let h = std::str::from_utf8(&bytes[10..10 + hlen]).expect("ASCII header");
    assert!(h.contains("'fortran_order': False"), "{h}");
    let descr = h
        .split("'descr': '")
        .nth(1)
        .and_then(|s| s.split('\'').next())
        .expect("descr")
        .to_string();
    let shape = h
        .split("'shape': (")
        .nth(1)
        .and_then(|s| s.split(')').next())
        .expect("shape")
        .split(',')
        .filter_map(|s| s.trim().parse().ok())
        .collect();
    (descr, shape, bytes[10 + hlen..].to_vec())
}

/// (shape, values) of an int64 `.npy`.
pub fn npy_i64(path: &Path) -> (Vec<usize>, Vec<i64>) {
    let (descr, shape, data) = npy(path);
    assert_eq!(descr, "<i8", "{}", path.display());
    let v = data
        .chunks_exact(8)
        .map(|c| i64::from_le_bytes(c.try_into().expect("8 bytes")))
        .collect();
    (shape, v)
}

/// (shape, values) of a float32 `.npy`.
pub fn npy_f32(path: &Path) -> (Vec<usize>, Vec<f32>) {
    let (descr, shape, data) = npy(path);
    assert_eq!(descr, "<f4", "{}", path.display());
    let v = data
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes(c.try_into().expect("4 bytes")))
        .collect();
    (shape, v)
}

/// The files in `dir` whose names start with `prefix`, sorted.
pub fn files_with_prefix(dir: &Path, prefix: &str) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(dir)
        .expect("a folder")
        .map(|e| e.expect("an entry").path())
        .filter(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with(prefix))
        })
        .collect();
    v.sort();
    v
}

/// A `--report-json` file.
pub fn report(path: &Path) -> serde_json::Value {
    serde_json::from_slice(&std::fs::read(path).expect("the report exists")).expect("JSON")
}

/// A mono WAV file: 16-bit PCM (`float == false`) or 32-bit float; the RIFF
/// and data sizes can be made to lie with `claimed_data_bytes`.
pub fn wav(rate: u32, samples: &[f32], float: bool, claimed_data_bytes: Option<u32>) -> Vec<u8> {
    let width: u16 = if float { 4 } else { 2 };
    let data_len = samples.len() as u32 * u32::from(width);
    let claimed = claimed_data_bytes.unwrap_or(data_len);
    let mut v = Vec::new();
    v.extend_from_slice(b"RIFF");
    v.extend_from_slice(&claimed.saturating_add(36).to_le_bytes());
    v.extend_from_slice(b"WAVEfmt ");
    v.extend_from_slice(&16u32.to_le_bytes());
    v.extend_from_slice(&(if float { 3u16 } else { 1u16 }).to_le_bytes());
    v.extend_from_slice(&1u16.to_le_bytes());
    v.extend_from_slice(&rate.to_le_bytes());
    v.extend_from_slice(&rate.wrapping_mul(u32::from(width)).to_le_bytes());
    v.extend_from_slice(&width.to_le_bytes());
    v.extend_from_slice(&(width * 8).to_le_bytes());
    v.extend_from_slice(b"data");
    v.extend_from_slice(&claimed.to_le_bytes());
    for &s in samples {
        if float {
            v.extend_from_slice(&s.to_le_bytes());
        } else {
            v.extend_from_slice(&((s * 32767.0).round() as i16).to_le_bytes());
        }
    }
    v
}

/// Writes `members` (name, bytes) into the tar `path`, in order.
pub fn write_tar<N: AsRef<str>>(path: &Path, members: &[(N, Vec<u8>)]) {
    let mut b = tar::Builder::new(std::fs::File::create(path).unwrap());
    for (name, bytes) in members {
        let mut h = tar::Header::new_gnu();
        h.set_size(bytes.len() as u64);
        h.set_mode(0o644);
        h.set_cksum();
        b.append_data(&mut h, name.as_ref(), bytes.as_slice())
            .unwrap();
    }
    b.into_inner().unwrap();
}

/// Writes `jpgs` as WebDataset shards `out/shard-NNN.tar`, `per` images
/// each: member `s{shard}_{i}.jpg` with `s{shard}_{i}.cls` holding `i % 3`,
/// or `oops` where `bad(shard, i)`.
pub fn write_shards(jpgs: &[PathBuf], out: &Path, per: usize, bad: impl Fn(usize, usize) -> bool) {
    std::fs::create_dir_all(out).unwrap();
    for (s, chunk) in jpgs.chunks(per).enumerate() {
        let mut members = Vec::new();
        for (i, p) in chunk.iter().enumerate() {
            let key = format!("s{s}_{i}");
            let label = if bad(s, i) {
                "oops".to_string()
            } else {
                format!("{}\n", i % 3)
            };
            members.push((format!("{key}.jpg"), std::fs::read(p).unwrap()));
            members.push((format!("{key}.cls"), label.into_bytes()));
        }
        write_tar(&out.join(format!("shard-{s:03}.tar")), &members);
    }
}
