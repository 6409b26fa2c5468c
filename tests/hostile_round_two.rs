//! Hostile input, round two: what a hostile but realistic user tried from
//! outside and the command got wrong — data lost or served stale, results
//! wrong without a word, runaways instead of clear errors. Each test runs
//! the command as that user did and asserts what they rely on.
#![cfg(all(feature = "vision", feature = "text", feature = "audio"))]
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

mod common;
use common::{fail_in, files_with_prefix, npy_i64, ok_in, report, run_in};

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

/// `make-dataset vision DIR --count N` with the cache under `tmp`.
fn make_vision(tmp: &Path, dir: &Path, count: u64) {
    ok_in(
        &tmp.join("cache"),
        &[
            "make-dataset",
            "vision",
            s(dir),
            "--count",
            &count.to_string(),
            "--image-size",
            "40x30",
        ],
    );
}

/// Every file under `dir`, relative to it, with its bytes.
fn tree(dir: &Path) -> Vec<(PathBuf, Vec<u8>)> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                stack.push(p);
            } else {
                let bytes = std::fs::read(&p).unwrap();
                out.push((p.strip_prefix(dir).unwrap().to_path_buf(), bytes));
            }
        }
    }
    out.sort();
    out
}

/// Runs the command, killing it after `limit`: `None` when it ran past.
fn run_bounded(cache: &Path, args: &[&str], limit: Duration) -> Option<Output> {
    let mut child = Command::new(env!("CARGO_BIN_EXE_ferrofeed"))
        .env("FERROFEED_CACHE_DIR", cache)
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let start = Instant::now();
    while start.elapsed() < limit {
        if child.try_wait().unwrap().is_some() {
            return Some(child.wait_with_output().unwrap());
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let _ = child.kill();
    let _ = child.wait();
    None
}

/// The dataset indices of every dumped batch, in order.
fn dumped_indices(dump: &Path) -> Vec<i64> {
    files_with_prefix(dump, "indices_")
        .iter()
        .flat_map(|p| npy_i64(p).1)
        .collect()
}

#[test]
fn make_dataset_vision_never_deletes_what_it_did_not_write() {
    let tmp = tempfile::tempdir().unwrap();
    let cache = tmp.path().join("cache");
    // A folder of the user's own files.
    let mine = tmp.path().join("mine");
    std::fs::create_dir_all(mine.join("photos")).unwrap();
    std::fs::write(mine.join("notes.txt"), b"three days of work").unwrap();
    std::fs::write(mine.join("photos/cat.jpg"), b"not really a jpeg").unwrap();
    let before = tree(&mine);
    let err = fail_in(
        &cache,
        &["make-dataset", "vision", s(&mine), "--count", "4"],
    );
    assert!(err.contains("not empty") && err.contains("mine"), "{err}");
    assert_eq!(tree(&mine), before, "the user's files are untouched");

    // `make-dataset vision .` in that folder: refused, nothing removed.
    let out = Command::new(env!("CARGO_BIN_EXE_ferrofeed"))
        .env("FERROFEED_CACHE_DIR", &cache)
        .current_dir(&mine)
        .args(["make-dataset", "vision", ".", "--count", "4"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert_eq!(tree(&mine), before);

    // A folder with only the dataset's own layout but one foreign file in
    // a class folder is not ours either.
    let data = tmp.path().join("data");
    make_vision(tmp.path(), &data, 20);
    std::fs::write(data.join("class_03/keep.txt"), b"mine").unwrap();
    let err = fail_in(
        &cache,
        &["make-dataset", "vision", s(&data), "--count", "4"],
    );
    assert!(err.contains("keep.txt"), "{err}");
    assert_eq!(
        std::fs::read(data.join("class_03/keep.txt")).unwrap(),
        b"mine"
    );
    std::fs::remove_file(data.join("class_03/keep.txt")).unwrap();

    // A dataset this command wrote is replaced whole: 20 images become 4.
    make_vision(tmp.path(), &data, 4);
    let jpgs = tree(&data)
        .into_iter()
        .filter(|(p, _)| p.extension().is_some_and(|e| e == "jpg"))
        .count();
    assert_eq!(jpgs, 4);

    // `.` when it is empty works and writes the dataset there.
    let empty = tmp.path().join("empty");
    std::fs::create_dir(&empty).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_ferrofeed"))
        .env("FERROFEED_CACHE_DIR", &cache)
        .current_dir(&empty)
        .args([
            "make-dataset",
            "vision",
            ".",
            "--count",
            "3",
            "--image-size",
            "40x30",
        ])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(empty.join("class_00/img_000000.jpg").is_file());
    assert!(empty.join("class_02/img_000002.jpg").is_file());
}

#[test]
fn resume_with_another_batch_size_or_shuffle_is_refused_by_name() {
    let tmp = tempfile::tempdir().unwrap();
    let cache = tmp.path().join("cache");
    let data = tmp.path().join("data");
    make_vision(tmp.path(), &data, 24);
    let state = tmp.path().join("s.json");
    let first = tmp.path().join("first");
    let base = [
        "vision",
        s(&data),
        "--transform",
        "eval",
        "--size",
        "16",
        "--resize",
        "16",
        "--quiet",
    ];
    let with = |more: &[&str]| -> Vec<String> {
        base.iter()
            .chain(more.iter())
            .map(|a| a.to_string())
            .collect()
    };
    let args = with(&[
        "--batch-size",
        "4",
        "--limit-batches",
        "2",
        "--save-state",
        s(&state),
        "--dump",
        s(&first),
    ]);
    ok_in(&cache, &args.iter().map(String::as_str).collect::<Vec<_>>());
    for (flag, value, field) in [
        ("--batch-size", "8", "batch_size"),
        ("--batch-size", "2", "batch_size"),
        ("--shuffle", "false", "shuffle"),
        ("--drop-last", "true", "drop_last"),
    ] {
        let mut more = vec!["--resume", s(&state), flag, value];
        if flag != "--batch-size" {
            more.extend(["--batch-size", "4"]);
        }
        let args = with(&more);
        let err = fail_in(&cache, &args.iter().map(String::as_str).collect::<Vec<_>>());
        assert!(err.contains(field), "{flag} {value}: {err}");
        assert!(!err.contains("Some("), "no debug text: {err}");
    }
    // The same settings continue exactly: every sample once.
    let rest = tmp.path().join("rest");
    let args = with(&[
        "--batch-size",
        "4",
        "--resume",
        s(&state),
        "--dump",
        s(&rest),
    ]);
    ok_in(&cache, &args.iter().map(String::as_str).collect::<Vec<_>>());
    let mut all = dumped_indices(&first);
    assert_eq!(all.len(), 8);
    all.extend(dumped_indices(&rest));
    all.sort_unstable();
    assert_eq!(all, (0..24).collect::<Vec<i64>>());

    // A hand-edited position past the end of the epoch is refused.
    let text = std::fs::read_to_string(&state).unwrap();
    let v: serde_json::Value = serde_json::from_str(&text).unwrap();
    let mut v = v.clone();
    v["position"] = serde_json::json!([99, 0]);
    let edited = tmp.path().join("edited.json");
    std::fs::write(&edited, v.to_string()).unwrap();
    let args = with(&["--batch-size", "4", "--resume", s(&edited)]);
    let err = fail_in(&cache, &args.iter().map(String::as_str).collect::<Vec<_>>());
    assert!(err.contains("past the end"), "{err}");
}

#[test]
fn text_resume_with_another_batching_is_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let cache = tmp.path().join("cache");
    let corpus = tmp.path().join("c.txt");
    // Equal lengths: a token budget of 64 or 128 holds other batches.
    let lines: String = (0..40)
        .map(|i| format!("line {i} word word word\n"))
        .collect();
    std::fs::write(&corpus, lines).unwrap();
    let state = tmp.path().join("s.json");
    ok_in(
        &cache,
        &[
            "text",
            s(&corpus),
            "--batch-size",
            "4",
            "--limit-batches",
            "2",
            "--save-state",
            s(&state),
            "--quiet",
        ],
    );
    let err = fail_in(
        &cache,
        &[
            "text",
            s(&corpus),
            "--batch-size",
            "8",
            "--resume",
            s(&state),
            "--quiet",
        ],
    );
    assert!(err.contains("batch_size"), "{err}");
    // Token budgets cut the plan another way: the plan digest differs.
    ok_in(
        &cache,
        &[
            "text",
            s(&corpus),
            "--max-tokens",
            "64",
            "--limit-batches",
            "1",
            "--save-state",
            s(&state),
            "--quiet",
        ],
    );
    let err = fail_in(
        &cache,
        &[
            "text",
            s(&corpus),
            "--max-tokens",
            "128",
            "--resume",
            s(&state),
            "--quiet",
        ],
    );
    assert!(err.contains("plan"), "{err}");
    ok_in(
        &cache,
        &[
            "text",
            s(&corpus),
            "--max-tokens",
            "64",
            "--resume",
            s(&state),
            "--quiet",
        ],
    );
}

/// Rewrites `path` with `bytes` (of the same length) and puts its
/// modification time back, as `touch -r`, rsync or an unpacked archive do.
fn rewrite_keeping_mtime(path: &Path, bytes: &[u8]) {
    let old = std::fs::metadata(path).unwrap();
    assert_eq!(old.len(), bytes.len() as u64);
    let mtime = old.modified().unwrap();
    std::fs::write(path, bytes).unwrap();
    let f = std::fs::File::options().write(true).open(path).unwrap();
    f.set_modified(mtime).unwrap();
    assert_eq!(std::fs::metadata(path).unwrap().modified().unwrap(), mtime);
}

#[test]
fn a_text_file_rewritten_with_its_size_and_time_kept_is_tokenized_again() {
    let tmp = tempfile::tempdir().unwrap();
    let cache = tmp.path().join("cache");
    let corpus = tmp.path().join("c.txt");
    std::fs::write(&corpus, "alpha beta gamma\ndelta epsilon zeta\n").unwrap();
    let dump = |name: &str, cache: &Path| -> Vec<i64> {
        let out = tmp.path().join(name);
        ok_in(
            cache,
            &[
                "text",
                s(&corpus),
                "--shuffle",
                "false",
                "--quiet",
                "--dump",
                s(&out),
            ],
        );
        npy_i64(&out.join("input_ids_000000.npy")).1
    };
    let first = dump("d1", &cache);
    rewrite_keeping_mtime(&corpus, b"river stone cloud\nsmall quiet house\n");
    let second = dump("d2", &cache);
    let fresh = dump("d3", &tmp.path().join("fresh-cache"));
    assert_ne!(first, second, "the old tokens were served");
    assert_eq!(second, fresh);
}

#[test]
fn an_audio_file_rewritten_with_its_size_and_time_kept_gets_new_features() {
    let tmp = tempfile::tempdir().unwrap();
    let cache = tmp.path().join("cache");
    let data = tmp.path().join("audio");
    std::fs::create_dir(&data).unwrap();
    let wav = data.join("a.wav");
    let tone = |f: f32| -> Vec<f32> {
        (0..16_000)
            .map(|i| 0.5 * (i as f32 * f * std::f32::consts::TAU / 16_000.0).sin())
            .collect()
    };
    std::fs::write(&wav, common::wav(16_000, &tone(440.0), false, None)).unwrap();
    let features = tmp.path().join("features");
    let dump = |name: &str, fc: &Path| -> Vec<u8> {
        let out = tmp.path().join(name);
        ok_in(
            &cache,
            &[
                "audio",
                s(&data),
                "--chunk-seconds",
                "1",
                "--feature-cache",
                s(fc),
                "--quiet",
                "--dump",
                s(&out),
            ],
        );
        std::fs::read(out.join("features_000000.npy")).unwrap()
    };
    let first = dump("d1", &features);
    assert_eq!(
        first,
        dump("d1b", &features),
        "a hit serves the same features"
    );
    rewrite_keeping_mtime(&wav, &common::wav(16_000, &tone(3000.0), false, None));
    let second = dump("d2", &features);
    let fresh = dump("d3", &tmp.path().join("fresh-features"));
    assert_ne!(first, second, "the old features were served");
    assert_eq!(second, fresh);
}

#[test]
fn a_class_folder_named_in_invalid_utf8_is_an_error_naming_it() {
    use std::os::unix::ffi::OsStrExt;
    let tmp = tempfile::tempdir().unwrap();
    let cache = tmp.path().join("cache");
    let data = tmp.path().join("data");
    make_vision(tmp.path(), &data, 6);
    let odd = data.join(std::ffi::OsStr::from_bytes(b"class_00\xff"));
    std::fs::create_dir(&odd).unwrap();
    std::fs::copy(data.join("class_00/img_000000.jpg"), odd.join("x.jpg")).unwrap();
    let err = fail_in(&cache, &["vision", s(&data), "--quiet"]);
    assert!(
        err.contains("not valid UTF-8") && err.contains("class_00"),
        "{err}"
    );
}

#[test]
fn limit_batches_zero_delivers_nothing() {
    let tmp = tempfile::tempdir().unwrap();
    let cache = tmp.path().join("cache");
    let data = tmp.path().join("data");
    make_vision(tmp.path(), &data, 8);
    let corpus = tmp.path().join("c.txt");
    std::fs::write(&corpus, "one\ntwo\nthree\n").unwrap();
    let audio = tmp.path().join("audio");
    std::fs::create_dir(&audio).unwrap();
    std::fs::write(
        audio.join("a.wav"),
        common::wav(16_000, &[0.1; 16_000], false, None),
    )
    .unwrap();
    for (domain, path) in [("vision", &data), ("text", &corpus), ("audio", &audio)] {
        let rep = tmp.path().join(format!("{domain}.json"));
        let dump = tmp.path().join(format!("{domain}-dump"));
        let state = tmp.path().join(format!("{domain}-state.json"));
        ok_in(
            &cache,
            &[
                domain,
                s(path),
                "--limit-batches",
                "0",
                "--quiet",
                "--report-json",
                s(&rep),
                "--dump",
                s(&dump),
                "--save-state",
                s(&state),
            ],
        );
        let r = report(&rep);
        assert_eq!(r["batches"], 0, "{domain}");
        assert_eq!(r["samples"], 0, "{domain}");
        assert!(files_with_prefix(&dump, "indices_").is_empty(), "{domain}");
        let st: serde_json::Value =
            serde_json::from_slice(&std::fs::read(&state).unwrap()).unwrap();
        assert_eq!(st["position"], serde_json::json!([0, 0]), "{domain}");
    }
}

#[test]
fn max_length_includes_the_special_tokens() {
    let tmp = tempfile::tempdir().unwrap();
    let cache = tmp.path().join("cache");
    let corpus = tmp.path().join("c.txt");
    std::fs::write(&corpus, "hello\nhello world again\nthree little words\n").unwrap();
    let err = fail_in(
        &cache,
        &["text", s(&corpus), "--max-length", "1", "--quiet"],
    );
    assert!(
        err.contains("max_length 1") && err.contains("special tokens"),
        "{err}"
    );
    for max in ["2", "3"] {
        let dump = tmp.path().join(format!("d{max}"));
        let rep = tmp.path().join(format!("r{max}.json"));
        ok_in(
            &cache,
            &[
                "text",
                s(&corpus),
                "--max-length",
                max,
                "--quiet",
                "--dump",
                s(&dump),
                "--report-json",
                s(&rep),
            ],
        );
        let (shape, _) = npy_i64(&dump.join("input_ids_000000.npy"));
        let max: usize = max.parse().unwrap();
        assert!(shape[1] <= max, "rows of {} for max_length {max}", shape[1]);
        // [CLS] [SEP] and at most one word: every line but (at 3) "hello"
        // was cut.
        let want = if max == 2 { 3 } else { 2 };
        assert_eq!(report(&rep)["truncated"], want, "max_length {max}");
    }
}

#[test]
fn a_run_served_from_the_token_cache_reports_the_truncated_count() {
    let tmp = tempfile::tempdir().unwrap();
    let cache = tmp.path().join("cache");
    let corpus = tmp.path().join("c.txt");
    let lines: String = (0..30)
        .map(|i| format!("{}\n", "word ".repeat(if i < 20 { 40 } else { 3 })))
        .collect();
    std::fs::write(&corpus, lines).unwrap();
    let mut seen = Vec::new();
    for run in ["built", "loaded"] {
        let rep = tmp.path().join(format!("{run}.json"));
        ok_in(
            &cache,
            &[
                "text",
                s(&corpus),
                "--max-length",
                "16",
                "--quiet",
                "--report-json",
                s(&rep),
            ],
        );
        let r = report(&rep);
        seen.push(r["truncated"].clone());
    }
    assert_eq!(seen, vec![serde_json::json!(20), serde_json::json!(20)]);
}

#[test]
fn dump_refuses_a_folder_that_already_holds_batches() {
    let tmp = tempfile::tempdir().unwrap();
    let cache = tmp.path().join("cache");
    let data = tmp.path().join("data");
    make_vision(tmp.path(), &data, 8);
    let dump = tmp.path().join("dump");
    let args = [
        "vision",
        s(&data),
        "--batch-size",
        "4",
        "--transform",
        "eval",
        "--size",
        "16",
        "--quiet",
        "--dump",
        s(&dump),
    ];
    ok_in(&cache, &args);
    let before = tree(&dump);
    let err = fail_in(&cache, &args);
    assert!(err.contains("already holds batches"), "{err}");
    assert_eq!(
        tree(&dump),
        before,
        "the first run's files are kept as they were"
    );
}

#[test]
fn settings_files_that_never_end_are_refused_unread() {
    let tmp = tempfile::tempdir().unwrap();
    let cache = tmp.path().join("cache");
    let corpus = tmp.path().join("c.txt");
    std::fs::write(&corpus, "one\ntwo\n").unwrap();
    for args in [
        vec!["text", s(&corpus), "--tokenizer", "/dev/zero", "--quiet"],
        vec!["text", s(&corpus), "--resume", "/dev/zero", "--quiet"],
    ] {
        let out = run_bounded(&cache, &args, Duration::from_secs(30))
            .unwrap_or_else(|| panic!("{args:?} ran on"));
        assert!(!out.status.success());
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            err.contains("/dev/zero") && err.contains("not a regular file"),
            "{err}"
        );
    }
    // A FIFO (nothing writes to it) is refused without blocking on it.
    let fifo = tmp.path().join("state.fifo");
    let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
    let args = ["text", s(&corpus), "--resume", s(&fifo), "--quiet"];
    let out = run_bounded(&cache, &args, Duration::from_secs(30)).expect("a FIFO blocks no run");
    assert!(!out.status.success());
}

#[test]
fn output_paths_are_checked_before_the_run() {
    let tmp = tempfile::tempdir().unwrap();
    let cache = tmp.path().join("cache");
    let corpus = tmp.path().join("c.txt");
    std::fs::write(&corpus, "one\ntwo\n").unwrap();
    let missing = tmp.path().join("no/such/folder/r.json");
    for flag in ["--report-json", "--report-html", "--save-state", "--trace"] {
        let out = run_in(
            &cache,
            &[
                "text",
                s(&corpus),
                "--quiet",
                "--dump",
                s(&tmp.path().join("d")),
                flag,
                s(&missing),
            ],
        );
        assert!(!out.status.success());
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            err.contains(flag) && err.contains("does not exist"),
            "{err}"
        );
        assert!(
            !tmp.path().join("d").exists(),
            "{flag}: nothing ran before the check"
        );
    }
}

#[test]
fn a_run_where_every_sample_failed_exits_non_zero() {
    let tmp = tempfile::tempdir().unwrap();
    let cache = tmp.path().join("cache");
    let corpus = tmp.path().join("c.jsonl");
    std::fs::write(&corpus, "{\"text\": \"one\"}\n{\"text\": \"two\"}\n").unwrap();
    let rep = tmp.path().join("r.json");
    let out = run_in(
        &cache,
        &[
            "text",
            s(&corpus),
            "--field",
            "txet",
            "--on-error",
            "skip",
            "--quiet",
            "--report-json",
            s(&rep),
        ],
    );
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("every sample failed") && err.contains("2 skipped"),
        "{err}"
    );
    assert_eq!(report(&rep)["skipped"].as_array().unwrap().len(), 2);
}

#[test]
fn truncated_audio_is_an_error_naming_the_file() {
    let tmp = tempfile::tempdir().unwrap();
    let cache = tmp.path().join("cache");
    let data = tmp.path().join("audio");
    std::fs::create_dir(&data).unwrap();
    let tone: Vec<f32> = (0..48_000).map(|i| (i as f32 * 0.05).sin() * 0.3).collect();
    // A WAV cut in half.
    let mut cut = common::wav(16_000, &tone, false, None);
    cut.truncate(cut.len() / 2);
    std::fs::write(data.join("cut.wav"), cut).unwrap();
    // A WAV whose header claims 10⁹ samples.
    std::fs::write(
        data.join("lying.wav"),
        common::wav(16_000, &tone, false, Some(2_000_000_000)),
    )
    .unwrap();
    // A FLAC cut in half.
    let flacs = tmp.path().join("flacs");
    ok_in(
        &cache,
        &[
            "make-dataset",
            "audio",
            s(&flacs),
            "--count",
            "1",
            "--format",
            "flac",
            "--min-seconds",
            "3",
            "--max-seconds",
            "3",
        ],
    );
    let flac = std::fs::read_dir(&flacs)
        .unwrap()
        .next()
        .unwrap()
        .unwrap()
        .path();
    let bytes = std::fs::read(&flac).unwrap();
    std::fs::write(data.join("cut.flac"), &bytes[..bytes.len() / 2]).unwrap();
    // One whole file.
    std::fs::write(
        data.join("whole.wav"),
        common::wav(16_000, &tone, false, None),
    )
    .unwrap();

    let rep = tmp.path().join("r.json");
    ok_in(
        &cache,
        &[
            "audio",
            s(&data),
            "--chunk-seconds",
            "1",
            "--on-error",
            "skip",
            "--quiet",
            "--report-json",
            s(&rep),
        ],
    );
    let r = report(&rep);
    let mut bad: Vec<String> = r["skipped"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| {
            let path = e["path"].as_str().unwrap().to_string();
            assert!(e["error"].as_str().unwrap().contains("truncated"), "{e}");
            // `<file>#<chunk>`.
            let name = Path::new(&path)
                .file_name()
                .unwrap()
                .to_string_lossy()
                .into_owned();
            name.split('#').next().unwrap().to_string()
        })
        .collect();
    bad.sort();
    bad.dedup();
    assert_eq!(bad, ["cut.flac", "cut.wav", "lying.wav"]);
    // Under `fail` the run stops naming the file.
    std::fs::remove_file(data.join("cut.flac")).unwrap();
    std::fs::remove_file(data.join("lying.wav")).unwrap();
    let err = fail_in(
        &cache,
        &["audio", s(&data), "--chunk-seconds", "1", "--quiet"],
    );
    assert!(
        err.contains("cut.wav") && err.contains("truncated"),
        "{err}"
    );
}

#[test]
fn a_webdataset_key_twice_in_a_shard_is_an_error_naming_key_and_shard() {
    let tmp = tempfile::tempdir().unwrap();
    let cache = tmp.path().join("cache");
    let data = tmp.path().join("data");
    make_vision(tmp.path(), &data, 3);
    let jpg = |i: usize| std::fs::read(data.join(format!("class_0{i}/img_00000{i}.jpg"))).unwrap();
    let shards = tmp.path().join("shards");
    std::fs::create_dir(&shards).unwrap();
    common::write_tar(
        &shards.join("shard-000.tar"),
        &[
            ("a.jpg", jpg(0)),
            ("a.cls", b"0".to_vec()),
            ("a.jpg", jpg(1)),
            ("a.cls", b"1".to_vec()),
            ("b.jpg", jpg(2)),
            ("b.cls", b"2".to_vec()),
        ],
    );
    for stream in [false, true] {
        let mut args = vec![
            "vision",
            s(&shards),
            "--transform",
            "eval",
            "--size",
            "16",
            "--quiet",
        ];
        if stream {
            args.push("--stream-shards");
        }
        let err = fail_in(&cache, &args);
        assert!(
            err.contains("`a` appears twice") && err.contains("shard-000.tar"),
            "stream {stream}: {err}"
        );
        let rep = tmp.path().join(format!("r{stream}.json"));
        args.extend(["--on-error", "skip", "--report-json", s(&rep)]);
        ok_in(&cache, &args);
        let r = report(&rep);
        assert_eq!(r["samples"], 1, "stream {stream}: only b is whole");
        let skipped = r["skipped"].as_array().unwrap();
        // The indexed reader keeps one sample for the key, the streamed one
        // each occurrence: every one is reported, none is delivered.
        assert!(!skipped.is_empty());
        for e in skipped {
            let (path, err) = (e["path"].as_str().unwrap(), e["error"].as_str().unwrap());
            assert!(path.contains("shard-000.tar#"), "{e}");
            assert!(err.contains("`a` appears twice"), "{e}");
        }
    }
}

#[test]
fn decode_only_blames_the_image_of_another_size() {
    let tmp = tempfile::tempdir().unwrap();
    let cache = tmp.path().join("cache");
    let data = tmp.path().join("data");
    make_vision(tmp.path(), &data, 12);
    let other = tmp.path().join("other");
    ok_in(
        &cache,
        &[
            "make-dataset",
            "vision",
            s(&other),
            "--count",
            "1",
            "--image-size",
            "30x40",
        ],
    );
    // First in path order, so first in its batch.
    let odd = data.join("class_00/aaa_odd.jpg");
    std::fs::copy(other.join("class_00/img_000000.jpg"), &odd).unwrap();
    let base = [
        "vision",
        s(&data),
        "--transform",
        "none",
        "--shuffle",
        "false",
        "--batch-size",
        "4",
        "--quiet",
    ];
    let err = fail_in(&cache, &base);
    assert!(err.contains("aaa_odd.jpg"), "the odd image is named: {err}");
    let rep = tmp.path().join("r.json");
    let mut args = base.to_vec();
    args.extend(["--on-error", "skip", "--report-json", s(&rep)]);
    ok_in(&cache, &args);
    let r = report(&rep);
    let skipped = r["skipped"].as_array().unwrap();
    assert_eq!(skipped.len(), 1, "{skipped:?}");
    assert!(skipped[0]["path"]
        .as_str()
        .unwrap()
        .ends_with("aaa_odd.jpg"));
    assert_eq!(r["samples"], 12, "every good image is delivered");
}

#[test]
fn absurd_sizes_are_refused_by_name_before_allocating() {
    let tmp = tempfile::tempdir().unwrap();
    let cache = tmp.path().join("cache");
    let audio = tmp.path().join("audio");
    std::fs::create_dir(&audio).unwrap();
    std::fs::write(
        audio.join("a.wav"),
        common::wav(16_000, &[0.1; 16_000], false, None),
    )
    .unwrap();
    let corpus = tmp.path().join("c.txt");
    std::fs::write(&corpus, "one\ntwo\n").unwrap();
    let cases: Vec<(Vec<&str>, &str)> = vec![
        (
            vec!["audio", s(&audio), "--n-mels", "1099511627776"],
            "n_mels",
        ),
        (vec!["audio", s(&audio), "--n-fft", "4000000000"], "n_fft"),
        (vec!["audio", s(&audio), "--hop", "4000000000"], "hop"),
        (
            vec!["audio", s(&audio), "--chunk-seconds", "1000000000"],
            "chunk-seconds",
        ),
        (
            vec!["audio", s(&audio), "--sample-rate", "4000000000"],
            "sample rate",
        ),
        (
            vec!["text", s(&corpus), "--pad-multiple", "100000000"],
            "pad-multiple",
        ),
        (
            vec![
                "text",
                s(&corpus),
                "--pack",
                "--max-length",
                "1099511627776",
            ],
            "max_length",
        ),
        (
            vec!["text", s(&corpus), "--max-tokens", "1099511627776"],
            "max-tokens",
        ),
        (vec!["text", s(&corpus), "--workers", "20000"], "1024"),
        (vec!["audio", s(&audio), "--workers", "20000"], "1024"),
    ];
    for (mut args, name) in cases {
        args.push("--quiet");
        let out = run_bounded(&cache, &args, Duration::from_secs(60))
            .unwrap_or_else(|| panic!("{args:?} ran on"));
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            matches!(out.status.code(), Some(1 | 2)),
            "{args:?}: a clear error, not an abort: {:?} {err}",
            out.status
        );
        assert!(err.contains(name), "{args:?}: {err}");
        assert!(!err.contains("panicked"), "{args:?}: {err}");
    }
}

#[test]
fn a_wav_claiming_one_hertz_is_refused_not_resampled_into_gigabytes() {
    let tmp = tempfile::tempdir().unwrap();
    let cache = tmp.path().join("cache");
    let audio = tmp.path().join("audio");
    std::fs::create_dir(&audio).unwrap();
    std::fs::write(
        audio.join("slow.wav"),
        common::wav(1, &[0.1; 1000], false, None),
    )
    .unwrap();
    std::fs::write(
        audio.join("fine.wav"),
        common::wav(16_000, &[0.1; 16_000], false, None),
    )
    .unwrap();
    let rep = tmp.path().join("r.json");
    let args = [
        "audio",
        s(&audio),
        "--chunk-seconds",
        "1",
        "--on-error",
        "skip",
        "--max-bytes-in-flight",
        "64MiB",
        "--quiet",
        "--report-json",
        s(&rep),
    ];
    let out = run_bounded(&cache, &args, Duration::from_secs(60)).expect("it ends");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let r = report(&rep);
    assert_eq!(r["samples"], 1, "the good file's one chunk");
    let skipped = r["skipped"].as_array().unwrap();
    assert_eq!(skipped.len(), 1);
    assert!(skipped[0]["path"].as_str().unwrap().ends_with("slow.wav"));
    assert!(
        skipped[0]["error"].as_str().unwrap().contains("1 Hz"),
        "{}",
        skipped[0]
    );
}

#[test]
fn a_retry_count_that_would_wait_for_days_is_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let cache = tmp.path().join("cache");
    let corpus = tmp.path().join("c.txt");
    std::fs::write(&corpus, "one\n").unwrap();
    let out = run_bounded(
        &cache,
        &[
            "text",
            s(&corpus),
            "--on-error",
            "retry:1000000000",
            "--quiet",
        ],
        Duration::from_secs(30),
    )
    .expect("refused at once");
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("at most 12 retries"));
}

#[test]
fn a_state_from_another_dataset_of_the_same_length_is_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let cache = tmp.path().join("cache");
    let (a, b) = (tmp.path().join("a"), tmp.path().join("b"));
    make_vision(tmp.path(), &a, 12);
    make_vision(tmp.path(), &b, 12);
    let state = tmp.path().join("s.json");
    let args = |data: &Path, more: &[&str]| -> Vec<String> {
        let mut v: Vec<String> = [
            "vision",
            s(data),
            "--batch-size",
            "4",
            "--transform",
            "eval",
            "--size",
            "16",
            "--quiet",
        ]
        .iter()
        .map(|x| x.to_string())
        .collect();
        v.extend(more.iter().map(|x| x.to_string()));
        v
    };
    let run_args = args(&a, &["--limit-batches", "1", "--save-state", s(&state)]);
    ok_in(
        &cache,
        &run_args.iter().map(String::as_str).collect::<Vec<_>>(),
    );
    let other = args(&b, &["--resume", s(&state)]);
    let err = fail_in(
        &cache,
        &other.iter().map(String::as_str).collect::<Vec<_>>(),
    );
    assert!(err.contains("dataset"), "{err}");
    let same = args(&a, &["--resume", s(&state)]);
    ok_in(&cache, &same.iter().map(String::as_str).collect::<Vec<_>>());

    // Text: two corpora of as many lines.
    let (c1, c2) = (tmp.path().join("c1.txt"), tmp.path().join("c2.txt"));
    std::fs::write(&c1, "one\ntwo\nthree\nfour\n").unwrap();
    std::fs::write(&c2, "uno\ndos\ntres\ncuatro\n").unwrap();
    let st = tmp.path().join("t.json");
    ok_in(
        &cache,
        &[
            "text",
            s(&c1),
            "--batch-size",
            "2",
            "--limit-batches",
            "1",
            "--save-state",
            s(&st),
            "--quiet",
        ],
    );
    let err = fail_in(
        &cache,
        &[
            "text",
            s(&c2),
            "--batch-size",
            "2",
            "--resume",
            s(&st),
            "--quiet",
        ],
    );
    assert!(err.contains("dataset"), "{err}");
}

/// A file named as a temporary of a killed process, two minutes old.
fn stale_temporary(path: &Path) {
    std::fs::write(path, b"half written").unwrap();
    let f = std::fs::File::options().write(true).open(path).unwrap();
    f.set_modified(std::time::SystemTime::now() - Duration::from_secs(120))
        .unwrap();
}

#[test]
fn temporaries_left_by_a_killed_run_are_swept_when_a_cache_opens() {
    let tmp = tempfile::tempdir().unwrap();
    let cache = tmp.path().join("cache");
    let audio = tmp.path().join("audio");
    std::fs::create_dir(&audio).unwrap();
    std::fs::write(
        audio.join("a.wav"),
        common::wav(16_000, &[0.1; 16_000], false, None),
    )
    .unwrap();
    let features = tmp.path().join("features");
    std::fs::create_dir_all(&features).unwrap();
    // No process has this id (above the kernel's pid_max).
    let stale = features.join(".tmp-4000000000-3-ThreadId(7)");
    stale_temporary(&stale);
    // A live process's fresh temporary is left alone.
    let live = features.join(format!(".tmp-{}-0-ThreadId(1)", std::process::id()));
    std::fs::write(&live, b"being written").unwrap();
    ok_in(
        &cache,
        &[
            "audio",
            s(&audio),
            "--chunk-seconds",
            "1",
            "--feature-cache",
            s(&features),
            "--quiet",
        ],
    );
    assert!(!stale.exists(), "the killed run's temporary was swept");
    assert!(live.exists());

    let tokens = cache.join("tokens");
    std::fs::create_dir_all(&tokens).unwrap();
    let stale = tokens.join("tokens-0123456789abcdef.tmp4000000000");
    stale_temporary(&stale);
    let corpus = tmp.path().join("c.txt");
    std::fs::write(&corpus, "one\ntwo\n").unwrap();
    ok_in(&cache, &["text", s(&corpus), "--quiet"]);
    assert!(!stale.exists());
}

#[test]
fn dangling_links_loops_and_fifos_are_samples_that_fail_by_name() {
    let tmp = tempfile::tempdir().unwrap();
    let cache = tmp.path().join("cache");
    let data = tmp.path().join("data");
    make_vision(tmp.path(), &data, 6);
    let class = data.join("class_01");
    std::os::unix::fs::symlink(tmp.path().join("gone.jpg"), class.join("dangling.jpg")).unwrap();
    std::os::unix::fs::symlink(class.join("loop_b.jpg"), class.join("loop_a.jpg")).unwrap();
    std::os::unix::fs::symlink(class.join("loop_a.jpg"), class.join("loop_b.jpg")).unwrap();
    let fifo = std::ffi::CString::new(s(&class.join("pipe.jpg"))).unwrap();
    assert_eq!(unsafe { libc::mkfifo(fifo.as_ptr(), 0o600) }, 0);
    std::os::unix::fs::symlink("/dev/zero", class.join("device.jpg")).unwrap();
    let rep = tmp.path().join("r.json");
    let args = [
        "vision",
        s(&data),
        "--transform",
        "eval",
        "--size",
        "16",
        "--on-error",
        "skip",
        "--quiet",
        "--report-json",
        s(&rep),
    ];
    let out = run_bounded(&cache, &args, Duration::from_secs(60)).expect("no read blocks");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let r = report(&rep);
    assert_eq!(r["samples"], 6);
    let mut named: Vec<String> = r["skipped"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| {
            let p = e["path"].as_str().unwrap();
            Path::new(p)
                .file_name()
                .unwrap()
                .to_string_lossy()
                .into_owned()
        })
        .collect();
    named.sort();
    assert_eq!(
        named,
        [
            "dangling.jpg",
            "device.jpg",
            "loop_a.jpg",
            "loop_b.jpg",
            "pipe.jpg"
        ]
    );
}

#[test]
fn a_truncated_tar_keeps_its_samples_before_the_break_under_skip() {
    let tmp = tempfile::tempdir().unwrap();
    let cache = tmp.path().join("cache");
    let data = tmp.path().join("data");
    make_vision(tmp.path(), &data, 4);
    let shards = tmp.path().join("shards");
    std::fs::create_dir(&shards).unwrap();
    let mut members = Vec::new();
    let names: Vec<String> = (0..4).map(|i| format!("s{i}")).collect();
    for (i, n) in names.iter().enumerate() {
        let jpg = std::fs::read(data.join(format!("class_0{i}/img_00000{i}.jpg"))).unwrap();
        members.push((format!("{n}.jpg"), jpg));
        members.push((format!("{n}.cls"), i.to_string().into_bytes()));
    }
    let whole = shards.join("shard-000.tar");
    common::write_tar(&whole, &members);
    // Cut inside the last image.
    let bytes = std::fs::read(&whole).unwrap();
    let cut = bytes.len() - 1024 - 700;
    std::fs::write(&whole, &bytes[..cut]).unwrap();
    // And a shard of garbage.
    std::fs::write(
        shards.join("shard-001.tar"),
        [0x9bu8, 0x07, 0x00, 0xff].repeat(300),
    )
    .unwrap();
    let rep = tmp.path().join("r.json");
    ok_in(
        &cache,
        &[
            "vision",
            s(&shards),
            "--transform",
            "eval",
            "--size",
            "16",
            "--on-error",
            "skip",
            "--quiet",
            "--report-json",
            s(&rep),
        ],
    );
    let r = report(&rep);
    assert!(r["samples"].as_u64().unwrap() >= 2, "{r}");
    let skipped = r["skipped"].as_array().unwrap();
    let text = serde_json::to_string(skipped).unwrap();
    assert!(
        text.contains("shard-000.tar") && text.contains("shard-001.tar"),
        "{text}"
    );
    for e in skipped {
        let err = e["error"].as_str().unwrap();
        assert!(
            err.chars()
                .all(|c| !c.is_control() && c != char::REPLACEMENT_CHARACTER),
            "printable: {err:?}"
        );
    }
    let err = fail_in(
        &cache,
        &["vision", s(&shards), "--transform", "eval", "--size", "16"],
    );
    assert!(err.contains("shard-00"), "{err}");
}

#[test]
fn audio_failures_name_the_file_and_chunk_not_an_encoded_index() {
    let tmp = tempfile::tempdir().unwrap();
    let cache = tmp.path().join("cache");
    let audio = tmp.path().join("audio");
    std::fs::create_dir(&audio).unwrap();
    for name in ["a.wav", "b.wav", "c.wav"] {
        std::fs::write(
            audio.join(name),
            common::wav(16_000, &[0.1; 32_000], false, None),
        )
        .unwrap();
    }
    // Float samples, one of them NaN in the second chunk.
    let mut samples = vec![0.1f32; 32_000];
    samples[20_000] = f32::NAN;
    std::fs::write(
        audio.join("d.wav"),
        common::wav(16_000, &samples, true, None),
    )
    .unwrap();
    let err = fail_in(
        &cache,
        &["audio", s(&audio), "--chunk-seconds", "1", "--quiet"],
    );
    let line = err.lines().find(|l| l.contains("d.wav")).unwrap_or(&err);
    assert!(line.contains("d.wav, chunk "), "{err}");
    // No index of 10 or more digits (the shard and position packed in one).
    let digits = line
        .split(|c: char| !c.is_ascii_digit())
        .map(str::len)
        .max()
        .unwrap_or(0);
    assert!(digits < 10, "{err}");
}

#[test]
fn retries_are_not_spent_on_a_file_that_cannot_decode() {
    let tmp = tempfile::tempdir().unwrap();
    let cache = tmp.path().join("cache");
    let data = tmp.path().join("data");
    make_vision(tmp.path(), &data, 6);
    std::fs::write(data.join("class_02/empty.jpg"), b"").unwrap();
    let rep = tmp.path().join("r.json");
    ok_in(
        &cache,
        &[
            "vision",
            s(&data),
            "--transform",
            "eval",
            "--size",
            "16",
            "--on-error",
            "retry:5:skip",
            "--quiet",
            "--report-json",
            s(&rep),
        ],
    );
    let r = report(&rep);
    assert_eq!(r["samples"], 6);
    let skipped = r["skipped"].as_array().unwrap();
    assert_eq!(skipped.len(), 1);
    assert!(skipped[0]["path"].as_str().unwrap().ends_with("empty.jpg"));
    let retries: u64 = r["stages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|st| st["retries"].as_u64().unwrap_or(0))
        .sum();
    assert_eq!(
        retries, 0,
        "a 0-byte image fails the same every time: {}",
        r["stages"]
    );
}
