//! `ferrofeed audio` end to end, as CLI.md describes it.
#![cfg(feature = "audio")]
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn run(cache: &Path, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_ferrofeed"))
        .env("FERROFEED_CACHE_DIR", cache)
        .args(args)
        .output()
        .expect("the binary runs")
}

fn ok(cache: &Path, args: &[&str]) -> String {
    let out = run(cache, args);
    assert!(
        out.status.success(),
        "ferrofeed {args:?} failed:\n{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn header(path: &Path) -> (String, Vec<usize>, usize) {
    let bytes = std::fs::read(path).unwrap();
    let hlen = u16::from_le_bytes([bytes[8], bytes[9]]) as usize;
    let h = std::str::from_utf8(&bytes[10..10 + hlen])
        .unwrap()
        .to_string();
    let descr = h
        .split("'descr': '")
        .nth(1)
        .unwrap()
        .split('\'')
        .next()
        .unwrap()
        .to_string();
    let shape = h
        .split("'shape': (")
        .nth(1)
        .unwrap()
        .split(')')
        .next()
        .unwrap();
    let shape = shape
        .split(',')
        .filter_map(|s| s.trim().parse().ok())
        .collect();
    (descr, shape, 10 + hlen)
}

fn i64s(path: &Path) -> Vec<i64> {
    let (_, _, off) = header(path);
    std::fs::read(path).unwrap()[off..]
        .chunks_exact(8)
        .map(|c| i64::from_le_bytes(c.try_into().unwrap()))
        .collect()
}

fn files(dir: &Path, prefix: &str) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.file_name().unwrap().to_str().unwrap().starts_with(prefix))
        .collect();
    v.sort();
    v
}

fn report(path: &Path) -> serde_json::Value {
    serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap()
}

#[test]
fn synthetic_dataset_to_logmel_batches() {
    let tmp = tempfile::tempdir().unwrap();
    let cache = tmp.path().join("cache");
    let data = tmp.path().join("data");
    let d = data.to_str().unwrap();
    ok(
        &cache,
        &[
            "make-dataset",
            "audio",
            d,
            "--count",
            "6",
            "--min-seconds",
            "1",
            "--max-seconds",
            "4",
            "--seed",
            "3",
        ],
    );
    let names: Vec<PathBuf> = files(&data, "");
    assert_eq!(names.len(), 6);
    let exts: Vec<String> = names
        .iter()
        .map(|p| p.extension().unwrap().to_string_lossy().into_owned())
        .collect();
    assert!(exts.contains(&"flac".to_string()) && exts.contains(&"wav".to_string()));
    // Deterministic.
    let again = tmp.path().join("again");
    ok(
        &cache,
        &[
            "make-dataset",
            "audio",
            again.to_str().unwrap(),
            "--count",
            "6",
            "--min-seconds",
            "1",
            "--max-seconds",
            "4",
            "--seed",
            "3",
        ],
    );
    for n in &names {
        assert_eq!(
            std::fs::read(n).unwrap(),
            std::fs::read(again.join(n.file_name().unwrap())).unwrap()
        );
    }

    let dump = tmp.path().join("dump");
    let rep = tmp.path().join("r.json");
    ok(
        &cache,
        &[
            "audio",
            d,
            "--chunk-seconds",
            "2",
            "--overlap-seconds",
            "0.5",
            "--batch-size",
            "4",
            "--dump",
            dump.to_str().unwrap(),
            "--report-json",
            rep.to_str().unwrap(),
            "--quiet",
        ],
    );
    let r = report(&rep);
    assert_eq!(r["domain"], "audio");
    assert_eq!(r["files"], 6);
    assert!(r["audio_seconds"].as_f64().unwrap() > 6.0);
    let index: Vec<serde_json::Value> =
        serde_json::from_slice(&std::fs::read(dump.join("index.json")).unwrap()).unwrap();
    assert_eq!(index.len(), 6);
    let mut chunks = 0;
    for f in files(&dump, "features_") {
        let (descr, shape, _) = header(&f);
        assert_eq!(descr, "<f4");
        assert_eq!(&shape[1..], &[80, 201]);
        chunks += shape[0];
    }
    let lengths: Vec<i64> = files(&dump, "lengths_")
        .iter()
        .flat_map(|f| i64s(f))
        .collect();
    let starts: Vec<i64> = files(&dump, "chunk_starts_")
        .iter()
        .flat_map(|f| i64s(f))
        .collect();
    assert_eq!(lengths.len(), chunks);
    assert!(lengths.iter().all(|&l| (1..=201).contains(&l)));
    assert!(
        starts.iter().all(|&s| s % 24000 == 0),
        "chunks start every 1.5 s: {starts:?}"
    );
    assert_eq!(chunks as u64, r["samples"].as_u64().unwrap());

    let out = ok(
        &cache,
        &[
            "inspect",
            "audio",
            d,
            "--index",
            "0",
            "--chunk-seconds",
            "2",
        ],
    );
    assert!(
        out.contains("features") && out.contains("[80 × 201]"),
        "{out}"
    );
}

#[test]
fn bad_files_and_flags_give_clear_errors() {
    let tmp = tempfile::tempdir().unwrap();
    let cache = tmp.path().join("cache");
    let data = tmp.path().join("data");
    std::fs::create_dir(&data).unwrap();
    let good = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/audio/a_tone_16k.wav");
    std::fs::copy(&good, data.join("a.wav")).unwrap();
    std::fs::write(data.join("b.wav"), b"RIFF....WAVEjunk").unwrap();
    let d = data.to_str().unwrap();

    let out = run(&cache, &["audio", d, "--quiet"]);
    assert!(!out.status.success());
    let e = String::from_utf8_lossy(&out.stderr);
    assert!(e.contains("b.wav") && e.contains("source"), "{e}");
    assert_eq!(e.lines().count(), 1, "one clear line: {e}");

    let rep = tmp.path().join("r.json");
    ok(
        &cache,
        &[
            "audio",
            d,
            "--on-error",
            "skip",
            "--report-json",
            rep.to_str().unwrap(),
            "--quiet",
        ],
    );
    let r = report(&rep);
    assert_eq!(r["skipped"].as_array().unwrap().len(), 1);
    assert!(r["skipped"][0]["path"].as_str().unwrap().ends_with("b.wav"));
    assert_eq!(r["samples"], 1, "the good file's one padded 10 s chunk");

    for bad in [
        vec!["--overlap-seconds", "10"],
        vec!["--chunk-seconds", "0"],
        vec!["--n-fft", "401"],
        vec!["--sample-rate", "0"],
    ] {
        let mut args = vec!["audio", d, "--quiet"];
        args.extend(bad.iter().copied());
        let out = run(&cache, &args);
        assert!(!out.status.success(), "{bad:?} should be refused");
        let e = String::from_utf8_lossy(&out.stderr);
        assert!(
            e.starts_with("error:") && !e.contains("panicked"),
            "{bad:?}: {e}"
        );
    }
}
