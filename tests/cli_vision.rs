//! The `ferrofeed` command end to end, as a user or a script runs it.
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

mod common;

/// The cache folder these tests share.
fn cache() -> PathBuf {
    std::env::temp_dir().join("ferrofeed-test-cache")
}

/// The command with the shared cache, for runs that set more of the
/// environment.
fn ff() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_ferrofeed"));
    c.env("FERROFEED_CACHE_DIR", cache());
    c
}

fn run(args: &[&str]) -> Output {
    common::run_in(&cache(), args)
}

fn ok(args: &[&str]) -> String {
    common::ok_in(&cache(), args)
}

fn make_dataset(dir: &Path, count: u64, seed: u64) {
    ok(&[
        "make-dataset",
        "vision",
        dir.to_str().unwrap(),
        "--count",
        &count.to_string(),
        "--seed",
        &seed.to_string(),
    ]);
}

/// `ferrofeed vision DATA ARGS --quiet --dump OUT`; returns OUT.
fn dump_to(data: &Path, out: PathBuf, args: &[&str]) -> PathBuf {
    let mut all = vec!["vision", data.to_str().unwrap()];
    all.extend_from_slice(args);
    all.extend_from_slice(&["--quiet", "--dump", out.to_str().unwrap()]);
    ok(&all);
    out
}

fn jpgs(dir: &Path) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = walk(dir)
        .into_iter()
        .filter(|p| p.extension().is_some_and(|e| e == "jpg"))
        .collect();
    v.sort();
    v
}

fn walk(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            out.extend(walk(&p));
        } else {
            out.push(p);
        }
    }
    out
}

/// The header of a `.npy` file: (descr, shape).
fn npy_header(path: &Path) -> (String, Vec<usize>) {
    let (descr, shape, _) = common::npy(path);
    (descr, shape)
}

#[test]
fn make_dataset_writes_camera_sized_images_when_asked() {
    let d = tempfile::tempdir().unwrap();
    let dir = d.path().join("large");
    ok(&[
        "make-dataset",
        "vision",
        dir.to_str().unwrap(),
        "--count",
        "3",
        "--image-size",
        "640x360",
    ]);
    let files = jpgs(&dir);
    assert_eq!(files.len(), 3);
    for f in files {
        let dims = ferrofeed::vision::peek_dimensions(&std::fs::read(&f).unwrap()).unwrap();
        assert_eq!(dims, (640, 360), "{}", f.display());
    }
    for bad in ["640", "0x10", "70000x10", "20000x20000"] {
        let out = run(&[
            "make-dataset",
            "vision",
            dir.to_str().unwrap(),
            "--image-size",
            bad,
        ]);
        assert!(!out.status.success(), "--image-size {bad} is refused");
    }
}

#[test]
fn make_dataset_is_deterministic_and_imagenet_like() {
    let d = tempfile::tempdir().unwrap();
    let (a, b) = (d.path().join("a"), d.path().join("b"));
    make_dataset(&a, 30, 4);
    make_dataset(&b, 30, 4);
    let (fa, fb) = (jpgs(&a), jpgs(&b));
    assert_eq!(fa.len(), 30);
    // Ten class folders, beside the file that marks the folder as written
    // by make-dataset.
    let classes = std::fs::read_dir(&a)
        .unwrap()
        .filter(|e| e.as_ref().unwrap().path().is_dir())
        .count();
    assert_eq!(classes, 10);
    assert!(a.join(ferrofeed::vision::synth::MARKER).is_file());
    for (x, y) in fa.iter().zip(&fb) {
        assert_eq!(std::fs::read(x).unwrap(), std::fs::read(y).unwrap());
    }
    let sizes: Vec<u64> = fa
        .iter()
        .map(|p| std::fs::metadata(p).unwrap().len())
        .collect();
    let mean = sizes.iter().sum::<u64>() / sizes.len() as u64;
    assert!(
        (30_000..150_000).contains(&mean),
        "mean JPEG size {mean} bytes is not photo-like"
    );
}

#[test]
fn dump_writes_batches_and_is_identical_across_runs_and_worker_counts() {
    let d = tempfile::tempdir().unwrap();
    let data = d.path().join("data");
    make_dataset(&data, 20, 1);
    let dump = |name: &str, extra: &[&str]| {
        let base = ["--batch-size", "8", "--seed", "5", "--size", "64"];
        dump_to(&data, d.path().join(name), &[&base[..], extra].concat())
    };
    let one = dump("one", &["--workers", "1"]);
    let two = dump("two", &["--workers", "2"]);
    // Autotune moves threads between read and decode while it runs; the
    // batches stay the same.
    let report = d.path().join("tuned.json");
    let tuned = dump(
        "tuned",
        &["--autotune", "--report-json", report.to_str().unwrap()],
    );
    let r: serde_json::Value = serde_json::from_slice(&std::fs::read(&report).unwrap()).unwrap();
    assert!(r["workers"]["read"].as_u64().is_some_and(|w| w >= 1), "{r}");
    assert!(
        r["workers"]["decode"].as_u64().is_some_and(|w| w >= 1),
        "{r}"
    );
    let (descr, shape) = npy_header(&one.join("images_000000.npy"));
    assert_eq!((descr.as_str(), shape), ("|u1", vec![8, 3, 64, 64]));
    assert_eq!(
        npy_header(&one.join("labels_000000.npy")),
        ("<i8".to_string(), vec![8])
    );
    assert_eq!(
        npy_header(&one.join("indices_000000.npy")),
        ("<i8".to_string(), vec![8])
    );
    assert_eq!(
        npy_header(&one.join("images_000002.npy")).1,
        vec![4, 3, 64, 64]
    );
    assert!(!one.join("images_000003.npy").exists());
    for k in 0..3 {
        for col in ["images", "labels", "indices"] {
            let f = format!("{col}_{k:06}.npy");
            assert_eq!(
                std::fs::read(one.join(&f)).unwrap(),
                std::fs::read(two.join(&f)).unwrap(),
                "{f}"
            );
            assert_eq!(
                std::fs::read(one.join(&f)).unwrap(),
                std::fs::read(tuned.join(&f)).unwrap(),
                "{f} with --autotune"
            );
        }
    }
    let index: serde_json::Value =
        serde_json::from_slice(&std::fs::read(one.join("index.json")).unwrap()).unwrap();
    let entries = index.as_array().unwrap();
    assert_eq!(entries.len(), 20);
    assert_eq!(entries[3]["index"], 3);
    assert!(entries[3]["path"].as_str().unwrap().ends_with(".jpg"));
    // A different seed shuffles differently.
    let other = d.path().join("other");
    ok(&[
        "vision",
        data.to_str().unwrap(),
        "--batch-size",
        "8",
        "--seed",
        "6",
        "--size",
        "64",
        "--quiet",
        "--dump",
        other.to_str().unwrap(),
    ]);
    assert_ne!(
        std::fs::read(one.join("indices_000000.npy")).unwrap(),
        std::fs::read(other.join("indices_000000.npy")).unwrap()
    );
}

fn corrupt_dataset(root: &Path) -> Vec<String> {
    make_dataset(root, 20, 2);
    let files = jpgs(root);
    // Truncated, zero-byte, not an image, garbage after a valid header.
    let bytes = std::fs::read(&files[3]).unwrap();
    std::fs::write(&files[3], &bytes[..bytes.len() / 2]).unwrap();
    std::fs::write(&files[7], b"").unwrap();
    std::fs::write(&files[11], b"plain text, not a picture").unwrap();
    let bomb = std::fs::read(
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/data/vision/bomb_65535.jpg"),
    )
    .unwrap();
    std::fs::write(&files[15], bomb).unwrap();
    [3, 7, 11, 15]
        .iter()
        .map(|&i| files[i].display().to_string())
        .collect()
}

#[test]
fn skip_policy_completes_and_reports_every_bad_file_once() {
    let d = tempfile::tempdir().unwrap();
    let data = d.path().join("data");
    let bad = corrupt_dataset(&data);
    let report = d.path().join("report.json");
    let out = ok(&[
        "vision",
        data.to_str().unwrap(),
        "--on-error",
        "skip",
        "--batch-size",
        "6",
        "--size",
        "32",
        "--quiet",
        "--report-json",
        report.to_str().unwrap(),
    ]);
    assert!(out.contains("skipped 4 samples"), "{out}");
    let r: serde_json::Value = serde_json::from_slice(&std::fs::read(&report).unwrap()).unwrap();
    assert_eq!(r["domain"], "vision");
    assert_eq!(r["samples"], 16);
    let skipped = r["skipped"].as_array().unwrap();
    let mut paths: Vec<String> = skipped
        .iter()
        .map(|s| s["path"].as_str().unwrap().to_string())
        .collect();
    paths.sort();
    let mut want = bad.clone();
    want.sort();
    assert_eq!(paths, want);
    for s in skipped {
        assert_eq!(s["stage"], "decode");
        assert!(s["index"].is_u64());
        assert!(!s["error"].as_str().unwrap().is_empty());
    }
    let errors: Vec<&str> = skipped
        .iter()
        .map(|s| s["error"].as_str().unwrap())
        .collect();
    assert!(errors.iter().any(|e| e.contains("truncated")), "{errors:?}");
    assert!(
        errors.iter().any(|e| e.contains("empty file")),
        "{errors:?}"
    );
    assert!(
        errors.iter().any(|e| e.contains("not an image")),
        "{errors:?}"
    );
    assert!(
        errors.iter().any(|e| e.contains("pixel limit")),
        "{errors:?}"
    );
    for key in [
        "stages",
        "workers",
        "cpus_available",
        "peak_bytes_in_flight",
        "samples_per_s",
        "seconds",
        "batches",
    ] {
        assert!(!r[key].is_null(), "{key} missing");
    }
    assert!(r["timeline"]["interval_s"]
        .as_f64()
        .is_some_and(|s| s > 0.0));
    assert!(r["timeline"]["points"].is_array());
}

#[test]
fn fail_policy_exits_non_zero_with_one_line_naming_the_sample() {
    let d = tempfile::tempdir().unwrap();
    let data = d.path().join("data");
    let bad = corrupt_dataset(&data);
    let out = run(&[
        "vision",
        data.to_str().unwrap(),
        "--shuffle",
        "false",
        "--size",
        "32",
        "--quiet",
    ]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    let line = err.lines().find(|l| l.starts_with("error:")).unwrap();
    assert!(line.contains("sample 3"), "{line}");
    assert!(line.contains(&bad[0]), "{line}");
    assert!(line.contains("stage `decode`"), "{line}");
}

#[test]
fn transform_none_refuses_mixed_sizes_naming_the_sample() {
    let d = tempfile::tempdir().unwrap();
    let data = d.path().join("data");
    make_dataset(&data, 6, 9);
    let out = run(&[
        "vision",
        data.to_str().unwrap(),
        "--transform",
        "none",
        "--batch-size",
        "6",
        "--quiet",
    ]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("stage `collate`") && err.contains("shape"),
        "{err}"
    );
    assert!(err.contains("sample "), "{err}");
}

#[test]
fn fast_decode_stays_close_to_the_default() {
    let d = tempfile::tempdir().unwrap();
    let data = d.path().join("data");
    make_dataset(&data, 8, 4);
    let dump = |name: &str, extra: &[&str]| {
        let base = ["--transform", "eval", "--batch-size", "8"];
        let out = dump_to(&data, d.path().join(name), &[&base[..], extra].concat());
        common::npy(&out.join("images_000000.npy")).2
    };
    let exact = dump("exact", &[]);
    let fast = dump("fast", &["--fast-decode"]);
    assert_eq!(exact.len(), fast.len());
    let mse = exact
        .iter()
        .zip(&fast)
        .map(|(a, b)| (f64::from(*a) - f64::from(*b)).powi(2))
        .sum::<f64>()
        / exact.len() as f64;
    let psnr = 10.0 * (255.0f64.powi(2) / mse.max(1e-12)).log10();
    assert!(psnr >= 35.0, "fast decode PSNR {psnr:.1} dB");
    if ferrofeed::vision::libjpeg::AVAILABLE {
        assert_ne!(exact, fast, "--fast-decode changed nothing");
    }
    eprintln!("fast decode vs default: PSNR {psnr:.1} dB");
}

/// The scan index changes where decoding starts, never the pixels: three
/// training epochs dump the same batches with it as without it.
#[test]
fn the_scan_index_leaves_every_batch_unchanged() {
    let d = tempfile::tempdir().unwrap();
    let data = d.path().join("data");
    make_dataset(&data, 12, 4);
    let dump = |name: &str, index: &str| {
        let report = d.path().join(format!("{name}.json"));
        let args = [
            "--epochs",
            "3",
            "--batch-size",
            "4",
            "--seed",
            "5",
            "--scan-index",
            index,
            "--report-json",
            report.to_str().unwrap(),
        ];
        let out = dump_to(&data, d.path().join(name), &args);
        let batches = (0..9)
            .map(|b| std::fs::read(out.join(format!("images_{b:06}.npy"))).unwrap())
            .collect::<Vec<_>>();
        let r: serde_json::Value =
            serde_json::from_slice(&std::fs::read(&report).unwrap()).unwrap();
        (batches, r)
    };
    let (with, report) = dump("with", "32MiB");
    let (without, plain) = dump("without", "0");
    assert_eq!(with.len(), 9);
    for (b, (a, z)) in with.iter().zip(&without).enumerate() {
        assert!(a == z, "batch {b} differs with the scan index");
    }
    // The report says what the index did: all 12 images marked, and later
    // epochs found marks they needed.
    if ferrofeed::vision::libjpeg::AVAILABLE {
        assert_eq!(report["scan_index_images"], 12, "{report}");
        assert!(report["scan_index_hits"].as_u64().unwrap() > 0, "{report}");
        assert!(
            report["scan_index_bytes"].as_u64().unwrap() > 12 * 1000,
            "{report}"
        );
    }
    assert!(plain.get("scan_index_images").is_none(), "{plain}");
}

#[test]
fn unusable_datasets_and_arguments_are_clear_errors() {
    let d = tempfile::tempdir().unwrap();
    let out = run(&["vision", d.path().to_str().unwrap(), "--quiet"]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("no class folders"));
    let out = run(&["vision", d.path().join("missing").to_str().unwrap()]);
    assert!(!out.status.success());
    let out = run(&["vision", d.path().to_str().unwrap(), "--workers", "0"]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("--workers must be at least 1"));
    let out = run(&[
        "vision",
        d.path().to_str().unwrap(),
        "--max-bytes-in-flight",
        "lots",
    ]);
    assert_eq!(out.status.code(), Some(2));
    let out = run(&[
        "vision",
        d.path().to_str().unwrap(),
        "--on-error",
        "sometimes",
    ]);
    assert_eq!(out.status.code(), Some(2));
    // Output sizes are refused before anything is allocated for them.
    let data = d.path().join("data");
    make_dataset(&data, 4, 2);
    let out = run(&[
        "vision",
        data.to_str().unwrap(),
        "--size",
        "100000",
        "--quiet",
    ]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("--size 100000") && err.contains("--max-pixels"),
        "{err}"
    );
    let out = run(&[
        "vision",
        data.to_str().unwrap(),
        "--size",
        "9000",
        "--batch-size",
        "4096",
        "--quiet",
    ]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("lower --size or --batch-size"), "{err}");
}

#[test]
fn inspect_prints_every_stage_and_writes_pngs() {
    let d = tempfile::tempdir().unwrap();
    let data = d.path().join("data");
    make_dataset(&data, 12, 3);
    let out_dir = d.path().join("look");
    let out = ok(&[
        "inspect",
        "vision",
        data.to_str().unwrap(),
        "--index",
        "5",
        "--out",
        out_dir.to_str().unwrap(),
    ]);
    for stage in ["[source]", "[read]", "[decode]", "[collate]"] {
        assert!(out.contains(stage), "{stage} missing in:\n{out}");
    }
    assert!(out.contains("Image RGB u8 [224, 224, 3]"), "{out}");
    let pngs: Vec<PathBuf> = walk(&out_dir);
    assert_eq!(pngs.len(), 1, "one stage holds an image: {pngs:?}");
    let past = run(&["inspect", "vision", data.to_str().unwrap(), "--index", "12"]);
    assert!(!past.status.success());
    assert!(String::from_utf8_lossy(&past.stderr).contains("the dataset has 12 samples"));
}

#[test]
fn webdataset_shards_run_and_name_members() {
    let d = tempfile::tempdir().unwrap();
    let data = d.path().join("data");
    make_dataset(&data, 10, 8);
    let shards = d.path().join("shards");
    common::write_shards(&jpgs(&data), &shards, 5, |_, i| i == 2);
    let dump = d.path().join("dump");
    let report = d.path().join("r.json");
    ok(&[
        "vision",
        shards.to_str().unwrap(),
        "--on-error",
        "skip",
        "--size",
        "48",
        "--quiet",
        "--dump",
        dump.to_str().unwrap(),
        "--report-json",
        report.to_str().unwrap(),
    ]);
    let index: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dump.join("index.json")).unwrap()).unwrap();
    let entries = index.as_array().unwrap();
    assert_eq!(entries.len(), 10);
    assert!(entries[0]["path"]
        .as_str()
        .unwrap()
        .ends_with("shard-000.tar#s0_0"));
    assert_eq!(entries[1]["label"], 1);
    let r: serde_json::Value = serde_json::from_slice(&std::fs::read(&report).unwrap()).unwrap();
    assert_eq!(r["samples"], 8, "the two bad labels are skipped");
    let skipped = r["skipped"].as_array().unwrap();
    assert_eq!(skipped.len(), 2);
    assert_eq!(skipped[0]["stage"], "source");
    assert!(skipped[0]["error"]
        .as_str()
        .unwrap()
        .contains("not an integer label"));
}

fn read_npy_i64(path: &Path) -> Vec<i64> {
    common::npy_i64(path).1
}

fn dumped(dir: &Path, col: &str) -> Vec<Vec<u8>> {
    let mut files: Vec<PathBuf> = walk(dir)
        .into_iter()
        .filter(|p| {
            p.file_name()
                .unwrap()
                .to_str()
                .unwrap()
                .starts_with(&format!("{col}_"))
        })
        .collect();
    files.sort();
    files.iter().map(|f| std::fs::read(f).unwrap()).collect()
}

#[test]
fn save_state_and_resume_continue_the_exact_stream() {
    let d = tempfile::tempdir().unwrap();
    let data = d.path().join("data");
    make_dataset(&data, 22, 2);
    let with_seed = |seed: &str, extra: &[&str]| {
        let mut v = vec![
            "vision",
            data.to_str().unwrap(),
            "--batch-size",
            "4",
            "--size",
            "32",
            "--epochs",
            "2",
            "--seed",
            seed,
            "--quiet",
        ];
        v.extend_from_slice(extra);
        v.iter().map(|s| s.to_string()).collect::<Vec<_>>()
    };
    let common = |extra: &[&str]| with_seed("8", extra);
    let run_owned = |args: Vec<String>| {
        let refs: Vec<&str> = args.iter().map(String::as_str).collect();
        ok(&refs);
    };
    let (full, a, b) = (
        d.path().join("full"),
        d.path().join("a"),
        d.path().join("b"),
    );
    let state = d.path().join("state.json");
    run_owned(common(&["--dump", full.to_str().unwrap()]));
    run_owned(common(&[
        "--dump",
        a.to_str().unwrap(),
        "--limit-batches",
        "8",
        "--save-state",
        state.to_str().unwrap(),
    ]));
    let saved: serde_json::Value = serde_json::from_slice(&std::fs::read(&state).unwrap()).unwrap();
    assert_eq!(
        saved["epoch"], 1,
        "8 batches: all 6 of epoch 0 and 2 of epoch 1"
    );
    assert_eq!(saved["position"][0], 2);
    run_owned(common(&[
        "--dump",
        b.to_str().unwrap(),
        "--resume",
        state.to_str().unwrap(),
    ]));
    for col in ["images", "labels", "indices"] {
        let joined: Vec<Vec<u8>> = dumped(&a, col).into_iter().chain(dumped(&b, col)).collect();
        assert_eq!(joined, dumped(&full, col), "{col}");
    }
    // A state from another seed is refused with the difference named.
    let out = run(&with_seed("9", &["--resume", state.to_str().unwrap()])
        .iter()
        .map(String::as_str)
        .collect::<Vec<_>>());
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("seed = 8"));
    std::fs::write(&state, "{\"format\": \"ferrofeed-state-v1\"}").unwrap();
    let out = run(&common(&["--resume", state.to_str().unwrap()])
        .iter()
        .map(String::as_str)
        .collect::<Vec<_>>());
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("missing field"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn ranks_split_the_epoch_and_read_the_environment() {
    let d = tempfile::tempdir().unwrap();
    let data = d.path().join("data");
    make_dataset(&data, 15, 5);
    let mut all = Vec::new();
    for rank in 0..3 {
        let out = d.path().join(format!("r{rank}"));
        let o = ff()
            .args([
                "vision",
                data.to_str().unwrap(),
                "--batch-size",
                "2",
                "--size",
                "32",
                "--quiet",
                "--dump",
                out.to_str().unwrap(),
            ])
            .env("RANK", rank.to_string())
            .env("WORLD_SIZE", "3")
            .output()
            .unwrap();
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        let mut files: Vec<PathBuf> = walk(&out)
            .into_iter()
            .filter(|p| p.to_str().unwrap().contains("indices_"))
            .collect();
        files.sort();
        assert_eq!(files.len(), 3, "5 samples per rank in batches of 2");
        for f in files {
            all.extend(read_npy_i64(&f));
        }
    }
    all.sort_unstable();
    assert_eq!(all, (0..15).collect::<Vec<_>>());
    let bad = run(&[
        "vision",
        data.to_str().unwrap(),
        "--rank",
        "3",
        "--world-size",
        "3",
    ]);
    assert!(!bad.status.success());
    assert!(String::from_utf8_lossy(&bad.stderr).contains("rank 3 is not below the world size 3"));
}

/// 16 samples on 3 ranks: padded (the default) each rank reads 6 (two
/// repeated); `--pad-shards false` reads each sample once (6, 5, 5).
#[test]
fn unpadded_ranks_read_every_sample_once() {
    let d = tempfile::tempdir().unwrap();
    let data = d.path().join("data");
    make_dataset(&data, 16, 4);
    for (pad, want_counts) in [("true", [6, 6, 6]), ("false", [6, 5, 5])] {
        let mut all = Vec::new();
        for (rank, want) in want_counts.iter().enumerate() {
            let out = d.path().join(format!("p{pad}r{rank}"));
            ok(&[
                "vision",
                data.to_str().unwrap(),
                "--batch-size",
                "4",
                "--size",
                "32",
                "--quiet",
                "--rank",
                &rank.to_string(),
                "--world-size",
                "3",
                "--pad-shards",
                pad,
                "--dump",
                out.to_str().unwrap(),
            ]);
            let mut mine = Vec::new();
            for f in walk(&out)
                .into_iter()
                .filter(|p| p.to_str().unwrap().contains("indices_"))
            {
                mine.extend(read_npy_i64(&f));
            }
            assert_eq!(mine.len(), *want, "rank {rank}, pad {pad}");
            all.extend(mine);
        }
        all.sort_unstable();
        if pad == "false" {
            assert_eq!(all, (0..16).collect::<Vec<_>>());
        } else {
            all.dedup();
            assert_eq!(all, (0..16).collect::<Vec<_>>());
        }
    }
}

#[test]
fn trace_files_load_as_chrome_traces() {
    let d = tempfile::tempdir().unwrap();
    let data = d.path().join("data");
    make_dataset(&data, 10, 1);
    let trace = d.path().join("trace.json");
    ok(&[
        "vision",
        data.to_str().unwrap(),
        "--batch-size",
        "4",
        "--size",
        "32",
        "--quiet",
        "--trace",
        trace.to_str().unwrap(),
    ]);
    let t: serde_json::Value = serde_json::from_slice(&std::fs::read(&trace).unwrap()).unwrap();
    let events = t["traceEvents"].as_array().unwrap();
    let count = |name: &str, ph: &str| {
        events
            .iter()
            .filter(|e| e["name"] == name && e["ph"] == ph)
            .count()
    };
    assert_eq!(count("decode", "X"), 10, "one slice per sample");
    assert_eq!(count("read", "X"), 10);
    assert_eq!(count("collate", "X"), 3, "one slice per batch");
    assert_eq!(count("batch", "s"), 3);
    assert_eq!(count("batch", "f"), 3, "each batch flows to the consumer");
    assert!(count("thread_name", "M") >= 3);
    let bad = run(&[
        "vision",
        data.to_str().unwrap(),
        "--trace",
        "/nonexistent-dir/t.json",
    ]);
    assert!(!bad.status.success());
    assert!(String::from_utf8_lossy(&bad.stderr).contains("/nonexistent-dir/t.json"));
}

/// `--report-html`: one self-contained page with the headline, the stage
/// table, the plots over time (with data), the skipped samples and the
/// strip of samples, and no external reference.
#[test]
fn report_html_is_one_self_contained_page() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    make_dataset(&data, 40, 3);
    let class = std::fs::read_dir(&data)
        .unwrap()
        .next()
        .unwrap()
        .unwrap()
        .path();
    std::fs::write(class.join("zz_bad.jpg"), b"not a jpeg").unwrap();
    let page = dir.path().join("run.html");
    ok(&[
        "vision",
        data.to_str().unwrap(),
        "--batch-size",
        "8",
        "--epochs",
        "2",
        "--on-error",
        "skip",
        "--quiet",
        "--report-html",
        page.to_str().unwrap(),
    ]);
    let html = std::fs::read_to_string(&page).unwrap();
    assert!(html.len() < 2 << 20, "{} bytes", html.len());
    for bad in [
        "http://", "https://", "src=\"//", "href=", "@import", "<script", "<link", "url(",
    ] {
        assert!(!html.contains(bad), "external reference {bad:?}");
    }
    for want in [
        "ferrofeed vision",
        "images/s",
        "data stall",
        "bottleneck",
        ">decode<",
        ">collate<",
        "throughput",
        "queue fill",
        "bytes in flight",
        "workers per pool",
        "per-epoch rate",
        "Skipped samples (2)", // the bad file, once per epoch
        "zz_bad.jpg",
        "CPUs available",
        "data:image/png;base64,",
    ] {
        assert!(html.contains(want), "missing {want:?}");
    }
    // The throughput line has points.
    let line = html.split("<polyline").nth(1).unwrap();
    let points = line
        .split("points=\"")
        .nth(1)
        .unwrap()
        .split('"')
        .next()
        .unwrap();
    assert!(points.split(' ').count() >= 2, "{points}");
}

#[test]
fn the_image_cache_on_disk_gives_the_batches_of_the_ram_cache_and_serves_later_runs() {
    let d = tempfile::tempdir().unwrap();
    let data = d.path().join("data");
    make_dataset(&data, 10, 6);
    let store = d.path().join("image-cache");
    let dump = |name: &str, extra: &[&str]| {
        let report = d.path().join(format!("{name}.json"));
        let mut args = vec![
            "--epochs",
            "2",
            "--batch-size",
            "5",
            "--seed",
            "3",
            "--report-json",
            report.to_str().unwrap(),
        ];
        args.extend_from_slice(extra);
        let out = dump_to(&data, d.path().join(name), &args);
        let batches = (0..4)
            .map(|b| std::fs::read(out.join(format!("images_{b:06}.npy"))).unwrap())
            .collect::<Vec<_>>();
        let r: serde_json::Value =
            serde_json::from_slice(&std::fs::read(&report).unwrap()).unwrap();
        (batches, r)
    };
    let disk = ["--image-cache", store.to_str().unwrap()];
    // The RAM cache decodes whole images and crops them, as the disk cache does.
    let (ram, _) = dump("ram", &["--cache-bytes", "1GiB"]);
    let (first, r1) = dump("first", &disk);
    assert!(first == ram, "the disk cache changes no batch");
    // Epoch 0 misses and writes every image; epoch 1 reads them all.
    assert_eq!(r1["image_cache_misses"], 10, "{r1}");
    assert_eq!(r1["image_cache_hits"], 10, "{r1}");
    assert!(r1["image_cache_bytes_written"].as_u64().unwrap() > 10 * 100_000);
    // A later run decodes nothing; a damaged entry is decoded again.
    let entries: Vec<PathBuf> = walk(&store);
    assert_eq!(entries.len(), 10);
    std::fs::write(&entries[0], b"FFIC truncated").unwrap();
    let (second, r2) = dump("second", &disk);
    assert!(second == ram);
    assert_eq!(r2["image_cache_misses"], 1, "{r2}");
    assert_eq!(r2["image_cache_hits"], 19, "{r2}");
    // A cap below one image stores nothing and changes nothing.
    let small = d.path().join("small");
    let (capped, r3) = dump(
        "capped",
        &[
            "--image-cache",
            small.to_str().unwrap(),
            "--image-cache-size",
            "1KiB",
        ],
    );
    assert!(capped == ram);
    assert_eq!(r3["image_cache_hits"], 0, "{r3}");
    // A file where the folder should be is refused up front, naming it.
    let file = d.path().join("a-file");
    std::fs::write(&file, b"").unwrap();
    let out = run(&[
        "vision",
        data.to_str().unwrap(),
        "--image-cache",
        file.to_str().unwrap(),
        "--quiet",
    ]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("--image-cache"));
}
