//! `ferrofeed audio` end to end, as CLI.md describes it.
#![cfg(feature = "audio")]
use std::path::{Path, PathBuf};

mod common;
use common::{files_with_prefix as files, npy, npy_i64, ok_in as ok, report, run_in as run};

/// `ferrofeed make-dataset audio DIR --count COUNT --min-seconds 1
/// --max-seconds MAX` and any further flags.
fn make_audio(cache: &Path, dir: &Path, count: &str, max_seconds: &str, more: &[&str]) {
    let mut args = vec![
        "make-dataset",
        "audio",
        dir.to_str().unwrap(),
        "--count",
        count,
        "--min-seconds",
        "1",
        "--max-seconds",
        max_seconds,
    ];
    args.extend_from_slice(more);
    ok(cache, &args);
}

#[test]
fn synthetic_dataset_to_logmel_batches() {
    let tmp = tempfile::tempdir().unwrap();
    let cache = tmp.path().join("cache");
    let data = tmp.path().join("data");
    let d = data.to_str().unwrap();
    make_audio(&cache, &data, "6", "4", &["--seed", "3"]);
    let names: Vec<PathBuf> = files(&data, "");
    assert_eq!(names.len(), 6);
    let exts: Vec<String> = names
        .iter()
        .map(|p| p.extension().unwrap().to_string_lossy().into_owned())
        .collect();
    assert!(exts.contains(&"flac".to_string()) && exts.contains(&"wav".to_string()));
    // Deterministic.
    let again = tmp.path().join("again");
    make_audio(&cache, &again, "6", "4", &["--seed", "3"]);
    for n in &names {
        assert_eq!(
            std::fs::read(n).unwrap(),
            std::fs::read(again.join(n.file_name().unwrap())).unwrap()
        );
    }

    let dump = tmp.path().join("dump");
    let rep = tmp.path().join("r.json");
    let trace = tmp.path().join("trace.json");
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
            "--trace",
            trace.to_str().unwrap(),
            "--quiet",
        ],
    );
    let r = report(&rep);
    assert_eq!(r["domain"], "audio");
    assert_eq!(r["files"], 6);
    assert!(r["audio_seconds"].as_f64().unwrap() > 6.0);
    let index: Vec<serde_json::Value> =
        serde_json::from_slice(&std::fs::read(dump.join("index.json")).unwrap()).unwrap();
    let mut chunks = 0;
    let feature_files = files(&dump, "features_");
    for (k, f) in feature_files.iter().enumerate() {
        let (descr, shape, _) = npy(f);
        assert_eq!(descr, "<f4");
        assert_eq!(&shape[1..], &[80, 201]);
        // Full batches across files; only the last may hold fewer.
        if k + 1 < feature_files.len() {
            assert_eq!(shape[0], 4, "batch {k}");
        }
        chunks += shape[0];
    }
    // One index entry per delivered chunk: its index, file and start.
    assert_eq!(index.len(), chunks);
    let indices: Vec<i64> = files(&dump, "indices_")
        .iter()
        .flat_map(|f| npy_i64(f).1)
        .collect();
    let dumped_starts: Vec<i64> = files(&dump, "chunk_starts_")
        .iter()
        .flat_map(|f| npy_i64(f).1)
        .collect();
    let by_index: std::collections::HashMap<i64, &serde_json::Value> = index
        .iter()
        .map(|e| (e["index"].as_i64().unwrap(), e))
        .collect();
    for (i, start) in indices.iter().zip(&dumped_starts) {
        let e = by_index[i];
        assert_eq!(e["chunk_start"].as_i64(), Some(*start), "{e}");
        assert!(
            e["path"].as_str().unwrap().ends_with(".wav")
                || e["path"].as_str().unwrap().ends_with(".flac"),
            "{e}"
        );
    }
    let files_in_batch0: std::collections::HashSet<i64> = npy_i64(&files(&dump, "indices_")[0])
        .1
        .iter()
        .map(|i| i >> 40)
        .collect();
    assert!(files_in_batch0.len() > 1, "a batch mixes files");
    let lengths: Vec<i64> = files(&dump, "lengths_")
        .iter()
        .flat_map(|f| npy_i64(f).1)
        .collect();
    let starts: Vec<i64> = files(&dump, "chunk_starts_")
        .iter()
        .flat_map(|f| npy_i64(f).1)
        .collect();
    assert_eq!(lengths.len(), chunks);
    assert!(lengths.iter().all(|&l| (1..=201).contains(&l)));
    assert!(
        starts.iter().all(|&s| s % 24000 == 0),
        "chunks start every 1.5 s: {starts:?}"
    );
    assert_eq!(chunks as u64, r["samples"].as_u64().unwrap());
    // Every batch, whether a worker collated it or the consumer did (from
    // files' short last parts merged), has its collate slice and a flow
    // from there to its receipt.
    let t: serde_json::Value = serde_json::from_slice(&std::fs::read(&trace).unwrap()).unwrap();
    let events = t["traceEvents"].as_array().unwrap();
    let ids = |ph: &str| {
        let mut v: Vec<u64> = events
            .iter()
            .filter(|e| e["name"] == "batch" && e["ph"] == ph)
            .map(|e| e["id"].as_u64().unwrap())
            .collect();
        v.sort_unstable();
        v
    };
    assert_eq!(ids("f").len(), feature_files.len());
    assert_eq!(ids("s"), ids("f"));
    let collates = events
        .iter()
        .filter(|e| e["name"] == "collate" && e["ph"] == "X")
        .count();
    assert_eq!(collates, feature_files.len());

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

#[test]
fn channels_keep_gives_a_plane_per_channel() {
    let tmp = tempfile::tempdir().unwrap();
    let cache = tmp.path().join("cache");
    let data = tmp.path().join("stereo");
    let d = data.to_str().unwrap();
    make_audio(&cache, &data, "3", "2", &["--channels", "2"]);
    let dump = tmp.path().join("dump");
    ok(
        &cache,
        &[
            "audio",
            d,
            "--channels",
            "keep",
            "--chunk-seconds",
            "1",
            "--dump",
            dump.to_str().unwrap(),
            "--quiet",
        ],
    );
    for f in files(&dump, "features_") {
        let (descr, shape, _) = npy(&f);
        assert_eq!(descr, "<f4");
        assert_eq!(&shape[1..], &[2, 80, 101]);
    }
    // A mono file among stereo ones: the batch that mixes them fails, naming a sample.
    std::fs::copy(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/audio/a_tone_16k.wav"),
        data.join("zz_mono.wav"),
    )
    .unwrap();
    let out = run(
        &cache,
        &[
            "audio",
            d,
            "--channels",
            "keep",
            "--chunk-seconds",
            "1",
            "--interleave",
            "4",
            "--quiet",
        ],
    );
    assert!(!out.status.success());
    let e = String::from_utf8_lossy(&out.stderr);
    assert!(
        e.contains("channels × bins × frames") && e.contains("collate"),
        "{e}"
    );
}

#[test]
fn speech_files_join_the_dataset_and_run_through_the_pipeline() {
    let tmp = tempfile::tempdir().unwrap();
    let cache = tmp.path().join("cache");
    let data = tmp.path().join("speech");
    let d = data.to_str().unwrap();
    make_audio(&cache, &data, "2", "2", &["--speech"]);
    let names: Vec<PathBuf> = files(&data, "");
    assert_eq!(names.len(), 5);
    for (name, bytes) in ferrofeed::audio::synth::SPEECH {
        assert_eq!(std::fs::read(data.join(name)).unwrap(), bytes);
    }
    let rep = tmp.path().join("r.json");
    ok(
        &cache,
        &[
            "audio",
            d,
            "--report-json",
            rep.to_str().unwrap(),
            "--quiet",
        ],
    );
    let r = report(&rep);
    assert_eq!(r["files"], 5);
    assert!(r["skipped"].as_array().unwrap().is_empty(), "{r}");
    // 4.5 + 5.0 + 6.7 s of speech (resampled from 22.05 kHz) and 2–4 s of synthetic audio.
    let secs = r["audio_seconds"].as_f64().unwrap();
    assert!((18.0..21.0).contains(&secs), "{secs}");
}

/// Full batches across files are deterministic for a seed and resume
/// exactly at any batch, also where short last parts of groups of files are
/// held back to fill the next batch (the state names them).
#[test]
fn full_batches_across_files_resume_exactly() {
    let tmp = tempfile::tempdir().unwrap();
    let cache = tmp.path().join("cache");
    let data = tmp.path().join("data");
    make_audio(&cache, &data, "7", "9", &["--seed", "5"]);
    let d = data.to_str().unwrap();
    let dump = |name: &str, extra: &[&str]| -> PathBuf {
        let out = tmp.path().join(name);
        let mut args = vec![
            "audio",
            d,
            "--chunk-seconds",
            "1",
            "--batch-size",
            "4",
            "--seed",
            "3",
            "--interleave",
            "2",
            "--quiet",
            "--dump",
            out.to_str().unwrap(),
        ];
        args.extend_from_slice(extra);
        ok(&cache, &args);
        out
    };
    let cols = |dir: &Path| -> Vec<Vec<u8>> {
        ["features_", "indices_", "chunk_starts_"]
            .iter()
            .flat_map(|p| files(dir, p))
            .map(|f| std::fs::read(f).unwrap())
            .collect()
    };
    let full = dump("full", &["--workers", "2"]);
    let sizes: Vec<usize> = files(&full, "indices_")
        .iter()
        .map(|f| npy_i64(f).1.len())
        .collect();
    assert!(
        sizes[..sizes.len() - 1].iter().all(|&n| n == 4),
        "{sizes:?}"
    );
    assert_eq!(
        cols(&dump("one-worker", &["--workers", "1"])),
        cols(&full),
        "any worker count"
    );
    let n = sizes.len();
    let mut held_back = 0;
    for k in [1, n / 3, n / 2, n - 1] {
        let state = tmp.path().join(format!("state-{k}.json"));
        let k_s = k.to_string();
        let a = dump(
            &format!("a{k}"),
            &[
                "--limit-batches",
                &k_s,
                "--save-state",
                state.to_str().unwrap(),
            ],
        );
        let saved: serde_json::Value =
            serde_json::from_slice(&std::fs::read(&state).unwrap()).unwrap();
        if saved.get("carry").is_some() {
            held_back += 1;
        }
        let b = dump(&format!("b{k}"), &["--resume", state.to_str().unwrap()]);
        for p in ["features_", "indices_", "chunk_starts_"] {
            let joined: Vec<Vec<u8>> = files(&a, p)
                .into_iter()
                .chain(files(&b, p))
                .map(|f| std::fs::read(f).unwrap())
                .collect();
            let want: Vec<Vec<u8>> = files(&full, p)
                .into_iter()
                .map(|f| std::fs::read(f).unwrap())
                .collect();
            assert_eq!(joined, want, "resumed after {k} batches: {p}");
        }
    }
    assert!(held_back > 0, "some saved state held a short part back");
}

/// SpecAugment masks and gain after the features: the same batches for any
/// worker count and run, different from epoch to epoch, and none of it
/// without the flags.
#[test]
fn augmentation_is_seeded_per_sample_and_epoch() {
    let tmp = tempfile::tempdir().unwrap();
    let cache = tmp.path().join("cache");
    let data = tmp.path().join("data");
    make_audio(&cache, &data, "4", "3", &["--seed", "5"]);
    let dump = |name: &str, workers: &str, aug: bool| -> Vec<Vec<u8>> {
        let out = tmp.path().join(name);
        let mut args = vec![
            "audio",
            data.to_str().unwrap(),
            "--chunk-seconds",
            "1",
            "--batch-size",
            "3",
            "--epochs",
            "2",
            "--shuffle",
            "false",
            "--workers",
            workers,
            "--quiet",
            "--dump",
            out.to_str().unwrap(),
        ];
        if aug {
            args.extend_from_slice(&[
                "--time-masks",
                "2",
                "--time-mask-width",
                "30",
                "--freq-masks",
                "1",
                "--freq-mask-width",
                "20",
                "--gain-db",
                "6",
            ]);
        }
        ok(&cache, &args);
        files(&out, "features_").iter().map(|p| npy(p).2).collect()
    };
    let one = dump("w1", "1", true);
    let two = dump("w2", "2", true);
    let plain = dump("plain", "2", false);
    assert_eq!(one, two, "augmented batches depend on the worker count");
    assert_eq!(one.len(), plain.len());
    assert!(
        one.iter().zip(&plain).all(|(a, b)| a != b),
        "some batch was not augmented"
    );
    // Unshuffled, the two epochs hold the same chunks in the same order:
    // only the draws differ.
    let half = plain.len() / 2;
    assert_eq!(plain[..half], plain[half..]);
    assert!(one[..half].iter().zip(&one[half..]).all(|(a, b)| a != b));
    let bad = run(
        &cache,
        &[
            "audio",
            data.to_str().unwrap(),
            "--gain-db",
            "99",
            "--quiet",
        ],
    );
    assert!(!bad.status.success());
    assert!(String::from_utf8_lossy(&bad.stderr).contains("--gain-db 99"));
}

/// `--feature-cache`: later epochs and runs read features instead of
/// decoding, bit-identical to computing them; a corrupt entry, a changed
/// file or other settings are misses, recomputed; an unwritable folder
/// runs uncached; two processes can fill the same folder at once.
#[test]
fn the_feature_cache_serves_later_epochs_and_runs_exactly() {
    let tmp = tempfile::tempdir().unwrap();
    let cache = tmp.path().join("cache");
    let data = tmp.path().join("data");
    make_audio(&cache, &data, "5", "3", &["--seed", "8"]);
    let fc = tmp.path().join("features");
    let go = |name: &str, more: &[&str]| -> (Vec<Vec<u8>>, serde_json::Value) {
        let out = tmp.path().join(name);
        let rep = tmp.path().join(format!("{name}.json"));
        let mut args = vec![
            "audio",
            data.to_str().unwrap(),
            "--chunk-seconds",
            "1",
            "--batch-size",
            "4",
            "--epochs",
            "2",
            "--quiet",
            "--dump",
            out.to_str().unwrap(),
            "--report-json",
            rep.to_str().unwrap(),
        ];
        args.extend_from_slice(more);
        ok(&cache, &args);
        let batches = files(&out, "features_").iter().map(|p| npy(p).2).collect();
        (batches, report(&rep))
    };
    let cached = ["--feature-cache", fc.to_str().unwrap()];
    let (plain, _) = go("plain", &[]);
    let (first, r1) = go("first", &cached);
    assert_eq!(first, plain, "cached features differ from computed ones");
    assert_eq!(
        (
            r1["feature_cache_misses"].as_u64(),
            r1["feature_cache_hits"].as_u64()
        ),
        (Some(5), Some(5))
    );
    assert_eq!(r1["audio_seconds"], go("plain2", &[]).1["audio_seconds"]);
    let (second, r2) = go("second", &cached);
    assert_eq!(second, plain);
    assert_eq!(r2["feature_cache_hits"].as_u64(), Some(10));
    assert!(r2["feature_cache_bytes_read"].as_u64().unwrap() > 0);

    // A corrupt entry (one flipped byte) and a truncated one are recomputed.
    let mut entries: Vec<PathBuf> = files(&fc, "")
        .into_iter()
        .filter(|p| p.extension().is_some_and(|e| e == "ffac"))
        .collect();
    entries.sort();
    assert_eq!(entries.len(), 5);
    let mut bytes = std::fs::read(&entries[0]).unwrap();
    let mid = bytes.len() / 2;
    bytes[mid] ^= 0x40;
    std::fs::write(&entries[0], &bytes).unwrap();
    let len = std::fs::metadata(&entries[1]).unwrap().len();
    std::fs::OpenOptions::new()
        .write(true)
        .open(&entries[1])
        .unwrap()
        .set_len(len - 7)
        .unwrap();
    let (third, r3) = go("third", &cached);
    assert_eq!(third, plain);
    assert_eq!(r3["feature_cache_misses"].as_u64(), Some(2));

    // Other settings: new entries.
    let (_, r4) = go("mels", &[cached[0], cached[1], "--n-mels", "40"]);
    assert_eq!(r4["feature_cache_misses"].as_u64(), Some(5));

    // A changed file is a miss (its size and mtime are in the key).
    let victim = files(&data, "")
        .into_iter()
        .find(|p| p.extension().is_some_and(|e| e == "wav"))
        .unwrap();
    let mut w = std::fs::read(&victim).unwrap();
    w.extend_from_slice(&[0u8; 64]);
    std::fs::write(&victim, &w).unwrap();
    let (_, r5) = go("changed", &cached);
    assert_eq!(r5["feature_cache_misses"].as_u64(), Some(1));

    // A read-only folder: the run works, uncached.
    let ro = tmp.path().join("ro");
    std::fs::create_dir(&ro).unwrap();
    let mut perm = std::fs::metadata(&ro).unwrap().permissions();
    std::os::unix::fs::PermissionsExt::set_mode(&mut perm, 0o555);
    std::fs::set_permissions(&ro, perm).unwrap();
    let writable = std::fs::write(ro.join("probe"), b"x").is_ok(); // root ignores modes
    let (ro_run, _) = go("ro_run", &["--feature-cache", ro.to_str().unwrap()]);
    let (now, _) = go("now", &[]);
    assert_eq!(ro_run, now);
    if !writable {
        assert!(files(&ro, "").is_empty());
    }

    // Two processes filling one folder.
    let shared = tmp.path().join("shared");
    let spawn = |name: &str| {
        let out = tmp.path().join(name);
        std::process::Command::new(env!("CARGO_BIN_EXE_ferrofeed"))
            .env("FERROFEED_CACHE_DIR", &cache)
            .args([
                "audio",
                data.to_str().unwrap(),
                "--chunk-seconds",
                "1",
                "--batch-size",
                "4",
                "--quiet",
            ])
            .args([
                "--feature-cache",
                shared.to_str().unwrap(),
                "--dump",
                out.to_str().unwrap(),
            ])
            .spawn()
            .unwrap()
    };
    let (mut a, mut b) = (spawn("pa"), spawn("pb"));
    assert!(a.wait().unwrap().success() && b.wait().unwrap().success());
    let (after, r6) = go("after", &["--feature-cache", shared.to_str().unwrap()]);
    assert_eq!(after, now);
    assert_eq!(r6["feature_cache_misses"].as_u64(), Some(0));
    assert!(
        files(&shared, ".tmp").is_empty(),
        "temporary files left behind"
    );
}

/// The chunks of a `--dump` run in delivery order, split into epochs (an
/// index seen again starts the next one): per epoch, each file's (shard's)
/// chunk starts.
fn starts_by_epoch(dump: &Path) -> Vec<std::collections::BTreeMap<i64, Vec<i64>>> {
    let indices: Vec<i64> = files(dump, "indices_")
        .iter()
        .flat_map(|f| npy_i64(f).1)
        .collect();
    let starts: Vec<i64> = files(dump, "chunk_starts_")
        .iter()
        .flat_map(|f| npy_i64(f).1)
        .collect();
    assert_eq!(indices.len(), starts.len());
    let mut epochs = vec![std::collections::BTreeMap::<i64, Vec<i64>>::new()];
    let mut seen = std::collections::HashSet::new();
    for (&i, &start) in indices.iter().zip(&starts) {
        if !seen.insert(i) {
            seen.clear();
            seen.insert(i);
            epochs.push(Default::default());
        }
        let file = i >> 40;
        epochs
            .last_mut()
            .unwrap()
            .entry(file)
            .or_default()
            .push(start);
    }
    for ep in &mut epochs {
        ep.values_mut().for_each(|v| v.sort());
    }
    epochs
}

/// `--chunk-offsets K`: each epoch, each file's chunk grid starts at one of
/// K offsets drawn from the seed, the epoch and the file — the same for any
/// worker count, new from epoch to epoch — and through the feature cache
/// each offset is an entry of its own, served exactly in later runs.
#[test]
fn random_chunk_offsets_per_epoch_and_through_the_feature_cache() {
    let tmp = tempfile::tempdir().unwrap();
    let cache = tmp.path().join("cache");
    let data = tmp.path().join("data");
    make_audio(&cache, &data, "5", "3", &["--seed", "9"]);
    let go = |name: &str, more: &[&str]| -> (Vec<Vec<u8>>, PathBuf, serde_json::Value) {
        let out = tmp.path().join(name);
        let rep = tmp.path().join(format!("{name}.json"));
        let mut args = vec![
            "audio",
            data.to_str().unwrap(),
            "--chunk-seconds",
            "0.5",
            "--batch-size",
            "4",
            "--epochs",
            "4",
            "--seed",
            "3",
            "--quiet",
            "--dump",
            out.to_str().unwrap(),
            "--report-json",
            rep.to_str().unwrap(),
        ];
        args.extend_from_slice(more);
        ok(&cache, &args);
        let batches = files(&out, "features_").iter().map(|p| npy(p).2).collect();
        (batches, out, report(&rep))
    };
    // 0.5 s at 16 kHz: chunks of 8000 samples, offsets 0, 2000, 4000, 6000;
    // every file (≥ 1 s) holds a chunk after any offset.
    let k4 = ["--chunk-offsets", "4"];
    let (one, dump, _) = go("w1", &[k4[0], k4[1], "--workers", "1"]);
    let (two, _, _) = go("w2", &[k4[0], k4[1], "--workers", "2"]);
    assert_eq!(one, two, "chunk offsets depend on the worker count");
    let epochs = starts_by_epoch(&dump);
    assert_eq!(epochs.len(), 4);
    let mut offsets = std::collections::BTreeSet::new();
    for (e, ep) in epochs.iter().enumerate() {
        assert_eq!(ep.len(), 5, "epoch {e} lost a file");
        for (file, starts) in ep {
            let off = starts[0];
            assert!([0, 2000, 4000, 6000].contains(&off), "{file}: {off}");
            for (k, s) in starts.iter().enumerate() {
                assert_eq!(*s, off + 8000 * k as i64, "epoch {e} {file}: {starts:?}");
            }
            offsets.insert((*file, e, off));
        }
    }
    let per_file_changes = epochs[0]
        .keys()
        .filter(|f| {
            let o: std::collections::BTreeSet<i64> = epochs.iter().map(|ep| ep[*f][0]).collect();
            o.len() > 1
        })
        .count();
    assert!(per_file_changes >= 3, "offsets barely change: {offsets:?}");
    // K = 1 (the default): every epoch the same grid from sample 0.
    let (_, plain_dump, _) = go("plain", &[]);
    for ep in starts_by_epoch(&plain_dump) {
        for (file, starts) in ep {
            assert!(
                starts
                    .iter()
                    .enumerate()
                    .all(|(k, s)| *s == 8000 * k as i64),
                "{file}: {starts:?}"
            );
        }
    }

    // Through the cache: the same batches; one entry per (file, offset).
    let fc = tmp.path().join("features");
    let cached = [k4[0], k4[1], "--feature-cache", fc.to_str().unwrap()];
    let distinct: std::collections::BTreeSet<(i64, i64)> =
        offsets.iter().map(|(f, _, o)| (*f, *o)).collect();
    let (first, first_dump, r1) = go("c1", &cached);
    assert_eq!(first, one, "cached features differ from computed ones");
    assert_eq!(starts_by_epoch(&first_dump), epochs);
    assert_eq!(
        r1["feature_cache_misses"].as_u64(),
        Some(distinct.len() as u64)
    );
    assert_eq!(
        r1["feature_cache_hits"].as_u64(),
        Some(20 - distinct.len() as u64)
    );
    let (second, _, r2) = go("c2", &cached);
    assert_eq!(second, one);
    assert_eq!(
        (
            r2["feature_cache_misses"].as_u64(),
            r2["feature_cache_hits"].as_u64()
        ),
        (Some(0), Some(20))
    );

    for bad in ["0", "8001"] {
        let out = run(
            &cache,
            &[
                "audio",
                data.to_str().unwrap(),
                "--chunk-seconds",
                "0.5",
                "--chunk-offsets",
                bad,
                "--quiet",
            ],
        );
        assert!(!out.status.success());
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(&format!("--chunk-offsets {bad}")), "{err}");
    }
}
