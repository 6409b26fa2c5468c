//! `ferrofeed vision --stream-shards`: WebDataset shards read shard by
//! shard as an iterable source, end to end.
#![cfg(feature = "vision")]
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

mod common;
use common::{fail_in, files_with_prefix, npy_i64, ok_in, report};

fn cache() -> PathBuf {
    std::env::temp_dir().join("ferrofeed-test-cache")
}

/// `count` synthetic JPEGs as `shards` shards of WebDataset pairs
/// (`s<shard>_<i>.jpg` + `.cls`); the sample `bad` (shard, i), if any, gets
/// a label that is not an integer.
fn write_shards(dir: &Path, count: u64, shards: usize, bad: Option<(usize, usize)>) -> PathBuf {
    let data = dir.join("data");
    ok_in(
        &cache(),
        &[
            "make-dataset",
            "vision",
            data.to_str().unwrap(),
            "--count",
            &count.to_string(),
            "--seed",
            "5",
        ],
    );
    let mut jpgs = Vec::new();
    let mut stack = vec![data];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                stack.push(p);
            } else if p.extension().is_some_and(|x| x == "jpg") {
                jpgs.push(p);
            }
        }
    }
    jpgs.sort();
    let out = dir.join("shards");
    common::write_shards(&jpgs, &out, jpgs.len().div_ceil(shards), |s, i| {
        bad == Some((s, i))
    });
    out
}

/// Runs a streamed epoch into `dump` and returns the row indices of each
/// batch and the image bytes of each batch.
fn streamed(shards: &Path, dump: &Path, extra: &[&str]) -> (Vec<Vec<i64>>, Vec<Vec<u8>>) {
    let mut args = vec![
        "vision",
        shards.to_str().unwrap(),
        "--stream-shards",
        "--batch-size",
        "4",
        "--size",
        "32",
        "--quiet",
        "--dump",
        dump.to_str().unwrap(),
    ];
    args.extend_from_slice(extra);
    ok_in(&cache(), &args);
    let idx = files_with_prefix(dump, "indices_")
        .iter()
        .map(|f| npy_i64(f).1)
        .collect();
    let images = files_with_prefix(dump, "images_")
        .iter()
        .map(|f| std::fs::read(f).unwrap())
        .collect();
    (idx, images)
}

#[test]
fn streamed_shards_give_every_sample_once_the_same_for_any_worker_count() {
    let d = tempfile::tempdir().unwrap();
    let shards = write_shards(d.path(), 24, 4, None);
    let (a_idx, a_img) = streamed(&shards, &d.path().join("a"), &["--workers", "1"]);
    let (b_idx, b_img) = streamed(&shards, &d.path().join("b"), &["--workers", "3"]);
    let (c_idx, c_img) = streamed(&shards, &d.path().join("c"), &["--workers", "2"]);
    let all: Vec<i64> = a_idx.iter().flatten().copied().collect();
    assert_eq!(all.len(), 24, "every sample once");
    let distinct: BTreeSet<i64> = all.iter().copied().collect();
    assert_eq!(distinct.len(), 24);
    // Stream indices: shard in the high bits, position below.
    let shards_seen: BTreeSet<i64> = all.iter().map(|i| i >> 40).collect();
    assert_eq!(shards_seen, (0..4).collect());
    assert_eq!((&a_idx, &a_img), (&b_idx, &b_img), "1 and 3 workers");
    assert_eq!((&a_idx, &a_img), (&c_idx, &c_img), "2 workers");
    // Shuffled: not shard order, and another seed gives another order.
    let sorted: Vec<i64> = distinct.iter().copied().collect();
    assert_ne!(all, sorted);
    let (s_idx, _) = streamed(&shards, &d.path().join("s"), &["--seed", "9"]);
    assert_ne!(s_idx, a_idx);
    // index.json lists the samples under their stream indices.
    let index: serde_json::Value =
        serde_json::from_slice(&std::fs::read(d.path().join("a").join("index.json")).unwrap())
            .unwrap();
    let entries = index.as_array().unwrap();
    assert_eq!(entries.len(), 24);
    let first = entries.iter().find(|e| e["index"] == 1i64 << 40).unwrap();
    assert!(first["path"]
        .as_str()
        .unwrap()
        .ends_with("shard-001.tar#s1_0"));
}

#[test]
fn a_bad_sample_in_a_streamed_shard_is_reported_with_its_key() {
    let d = tempfile::tempdir().unwrap();
    let shards = write_shards(d.path(), 12, 3, Some((1, 2)));
    let rep = d.path().join("r.json");
    ok_in(
        &cache(),
        &[
            "vision",
            shards.to_str().unwrap(),
            "--stream-shards",
            "--on-error",
            "skip",
            "--size",
            "32",
            "--quiet",
            "--report-json",
            rep.to_str().unwrap(),
        ],
    );
    let r = report(&rep);
    assert_eq!(r["samples"], 11);
    let skipped = r["skipped"].as_array().unwrap();
    assert_eq!(skipped.len(), 1, "{r}");
    assert_eq!(skipped[0]["stage"], "source");
    let err = skipped[0]["error"].as_str().unwrap();
    assert!(
        err.contains("shard-001.tar#s1_2") && err.contains("not an integer label"),
        "{err}"
    );
    // Under the default policy the run fails, naming the sample.
    let err = fail_in(
        &cache(),
        &[
            "vision",
            shards.to_str().unwrap(),
            "--stream-shards",
            "--size",
            "32",
            "--quiet",
        ],
    );
    assert!(err.contains("s1_2"), "{err}");
}

#[test]
fn stream_shards_settings_that_do_not_apply_are_refused() {
    let d = tempfile::tempdir().unwrap();
    let tree = d.path().join("tree");
    ok_in(
        &cache(),
        &[
            "make-dataset",
            "vision",
            tree.to_str().unwrap(),
            "--count",
            "4",
        ],
    );
    let err = fail_in(
        &cache(),
        &[
            "vision",
            tree.to_str().unwrap(),
            "--stream-shards",
            "--quiet",
        ],
    );
    assert!(
        err.contains("--stream-shards") && err.contains(".tar"),
        "{err}"
    );
    let shards = write_shards(d.path(), 8, 2, None);
    let err = fail_in(
        &cache(),
        &[
            "vision",
            shards.to_str().unwrap(),
            "--shuffle-buffer",
            "8",
            "--quiet",
        ],
    );
    assert!(
        err.contains("--shuffle-buffer") && err.contains("--stream-shards"),
        "{err}"
    );
    // A given buffer size is taken; the epoch is still whole.
    let rep = d.path().join("r.json");
    ok_in(
        &cache(),
        &[
            "vision",
            shards.to_str().unwrap(),
            "--stream-shards",
            "--shuffle-buffer",
            "3",
            "--size",
            "32",
            "--quiet",
            "--report-json",
            rep.to_str().unwrap(),
        ],
    );
    assert_eq!(report(&rep)["samples"], 8);
}

#[test]
fn a_streamed_run_saved_mid_epoch_resumes_exactly() {
    let d = tempfile::tempdir().unwrap();
    let shards = write_shards(d.path(), 24, 4, None);
    let run = |dump: &Path, extra: &[&str]| {
        let mut args = vec!["--epochs", "2", "--seed", "4", "--workers", "2"];
        args.extend_from_slice(extra);
        streamed(&shards, dump, &args)
    };
    let state = d.path().join("state.json");
    let full = run(&d.path().join("full"), &[]);
    let a = run(
        &d.path().join("a"),
        &[
            "--limit-batches",
            "8",
            "--save-state",
            state.to_str().unwrap(),
        ],
    );
    let saved: serde_json::Value = serde_json::from_slice(&std::fs::read(&state).unwrap()).unwrap();
    assert_eq!(
        saved["epoch"], 1,
        "8 batches: all 6 of epoch 0 and 2 of epoch 1"
    );
    let b = run(&d.path().join("b"), &["--resume", state.to_str().unwrap()]);
    assert_eq!(full.0.len(), 12);
    let joined_idx: Vec<Vec<i64>> = a.0.into_iter().chain(b.0).collect();
    let joined_img: Vec<Vec<u8>> = a.1.into_iter().chain(b.1).collect();
    assert_eq!(joined_idx, full.0);
    assert_eq!(joined_img, full.1);
}
