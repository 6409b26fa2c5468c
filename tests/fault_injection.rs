//! Fault injection: 2,000 samples per domain, about 1% of them broken at
//! positions drawn from a seed. Under `skip` every bad sample is reported
//! once, with its index, path and stage, and delivered + skipped = total;
//! under `retry` transient failures cost retries, not samples; under `fail`
//! the first bad sample stops the run with a clear error and every worker
//! thread is joined once the pipeline is dropped.
#![cfg(all(feature = "vision", feature = "text", feature = "audio"))]
use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};

use ferrofeed::audio::{AudioFiles, FeatureCollate, FeatureConfig, FeatureKind, FeatureStage};
use ferrofeed::core::prelude::*;
use ferrofeed::stages::{ImageFolder, ReadFile};
use ferrofeed::text::{CorpusOptions, PadCollate, TextCorpus, TextTokenizer, Tokenize};
use ferrofeed::vision::{synth, DecodeTransform, Image, Transform, IMAGE_EXTENSIONS};
use ferrofeed_core::sync::LockExt;
use rand::Rng;

mod common;

const TOTAL: usize = 2000;

/// Thread counts are process-wide: the tests of this file run one at a time.
static SERIAL: Mutex<()> = Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL.lock_unpoisoned()
}

/// `TOTAL / 100` distinct positions, from a seed.
fn bad_positions(seed: u64) -> BTreeSet<usize> {
    let mut rng = ferrofeed::core::rng::sample_rng(seed);
    let mut s = BTreeSet::new();
    while s.len() < TOTAL / 100 {
        s.insert(rng.random_range(0..TOTAL));
    }
    s
}

fn pool_threads() -> usize {
    std::fs::read_dir("/proc/self/task")
        .map(|d| {
            d.filter_map(Result::ok)
                .filter(|e| {
                    std::fs::read_to_string(e.path().join("comm"))
                        .is_ok_and(|c| c.starts_with("ff-"))
                })
                .count()
        })
        .unwrap_or(0)
}

/// Waits up to 1 s for the pool threads to be gone.
fn assert_all_joined() {
    let t = std::time::Instant::now();
    while pool_threads() > 0 {
        assert!(
            t.elapsed() < std::time::Duration::from_secs(1),
            "{} pool threads still alive 1 s after the pipeline was dropped",
            pool_threads()
        );
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
}

/// Runs an epoch under `skip`; returns (delivered, skipped by index).
fn run_skip(p: &Pipeline) -> (usize, BTreeMap<u64, SampleError>) {
    let mut delivered = 0;
    for b in p.epoch(0) {
        delivered += b.expect("skip never yields an error").len();
    }
    let s = p.last_summary().expect("the epoch ended");
    let mut by_index = BTreeMap::new();
    for e in &s.skipped {
        let i = e.index.expect("every skipped sample has an index");
        assert!(e.path.is_some(), "every skipped sample has a path: {e}");
        assert!(
            by_index.insert(i, e.clone()).is_none(),
            "sample {i} reported twice"
        );
    }
    (delivered, by_index)
}

#[test]
fn text_lines() {
    let _g = serial();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("data.jsonl");
    let bad = bad_positions(1);
    let mut bytes = Vec::new();
    for i in 0..TOTAL {
        let line: Vec<u8> = if bad.contains(&i) {
            match i % 4 {
                0 => b"{\"text\": \"bad \xff\xfe utf-8\"}".to_vec(),
                1 => b"{\"text\": 42}".to_vec(),
                2 => b"{\"text\": \"truncated".to_vec(),
                _ => b"{\"body\": \"no text field\"}".to_vec(),
            }
        } else {
            format!("{{\"text\": \"sample number {i} with a few words\"}}").into_bytes()
        };
        bytes.extend_from_slice(&line);
        bytes.push(b'\n');
    }
    std::fs::write(&path, bytes).unwrap();
    let corpus = TextCorpus::open(&path, &CorpusOptions::default()).unwrap();
    let tok = TextTokenizer::embedded(64).unwrap();
    let build = |policy| {
        Pipeline::builder(TextCorpus::open(&path, &CorpusOptions::default()).unwrap())
            .stage("tokenize", Tokenize::new(tok.clone()))
            .batch_size(32)
            .seed(5)
            .on_error(policy)
            .collate(PadCollate::new(tok.pad_id()))
            .build()
            .unwrap()
    };
    let p = build(ErrorPolicy::Skip);
    let (delivered, skipped) = run_skip(&p);
    assert_eq!(delivered + skipped.len(), TOTAL);
    let want: BTreeSet<u64> = bad.iter().map(|&i| i as u64).collect();
    assert_eq!(skipped.keys().copied().collect::<BTreeSet<_>>(), want);
    for (i, e) in &skipped {
        let line = corpus.key(*i).unwrap();
        assert_eq!(e.path.as_deref(), Some(line.as_str()));
        assert!(line.ends_with(&format!(":{}", i + 1)));
        assert_eq!(e.stage, "source");
    }
    drop(p);

    let p = build(ErrorPolicy::Fail);
    let mut it = p.epoch(0);
    let err = it.find_map(Result::err).expect("a bad line stops the run");
    assert!(it.next().is_none(), "nothing after the error");
    assert!(err.to_string().contains("data.jsonl:"), "{err}");
    assert!(want.contains(&err.index.unwrap()));
    drop(it);
    drop(p);
    assert_all_joined();
}

fn tiny_jpeg(seed: u64) -> Vec<u8> {
    let (w, h) = (24u32, 16u32);
    let data = (0..w * h * 3)
        .map(|i| (i as u64 * 7 + seed * 13) as u8)
        .collect();
    synth::encode_jpeg(
        &Image {
            width: w,
            height: h,
            data,
        },
        90,
    )
    .unwrap()
}

#[test]
fn vision_files() {
    let _g = serial();
    let dir = tempfile::tempdir().unwrap();
    let bad = bad_positions(2);
    let png = b"\x89PNG\r\n\x1a\n\0\0\0\rIHDR".to_vec();
    let mut vanish = Vec::new();
    for i in 0..TOTAL {
        // Two classes; names sort in index order within each class.
        let class = dir.path().join(format!("c{}", i % 2));
        std::fs::create_dir_all(&class).unwrap();
        let path = class.join(format!("{i:05}.jpg"));
        let good = tiny_jpeg(i as u64);
        let bytes = if bad.contains(&i) {
            match i % 5 {
                0 => good[..good.len() / 2].to_vec(), // truncated
                1 => Vec::new(),                      // zero bytes
                2 => png.clone(),                     // wrong type
                3 => vec![0xa5; 3000],                // garbage
                _ => {
                    vanish.push(path.clone()); // unreadable: gone after the scan
                    good
                }
            }
        } else {
            good
        };
        std::fs::write(&path, bytes).unwrap();
    }
    let folder = ImageFolder::scan(dir.path(), IMAGE_EXTENSIONS).unwrap();
    for p in &vanish {
        std::fs::remove_file(p).unwrap();
    }
    let index_of: BTreeMap<String, u64> = folder
        .files()
        .iter()
        .enumerate()
        .map(|(k, (p, _))| (p.display().to_string(), k as u64))
        .collect();
    let build = |policy| {
        Pipeline::builder(folder.clone().into_source())
            .stage("read", ReadFile::default())
            .stage("decode", DecodeTransform::new(Transform::eval(16, 16)))
            .batch_size(64)
            .seed(5)
            .on_error(policy)
            .collate(ferrofeed::vision::collate())
            .build()
            .unwrap()
    };
    let p = build(ErrorPolicy::Skip);
    let (delivered, skipped) = run_skip(&p);
    assert_eq!(delivered + skipped.len(), TOTAL);
    assert_eq!(skipped.len(), bad.len());
    for (i, e) in &skipped {
        let path = e.path.clone().unwrap();
        assert_eq!(index_of[&path], *i, "index and path agree");
        let n: usize = Path::new(&path)
            .file_stem()
            .unwrap()
            .to_str()
            .unwrap()
            .parse()
            .unwrap();
        assert!(bad.contains(&n), "{path} was not broken");
        let want_stage = if vanish.iter().any(|v| v.display().to_string() == path) {
            "read"
        } else {
            "decode"
        };
        assert_eq!(e.stage, want_stage, "{e}");
    }
    drop(p);
    let p = build(ErrorPolicy::Fail);
    let err = p
        .epoch(0)
        .find_map(Result::err)
        .expect("a bad file stops the run");
    assert!(err.path.is_some() && err.index.is_some(), "{err}");
    drop(p);
    assert_all_joined();
}

/// A 16 kHz 16-bit mono WAV of `samples` samples.
fn wav(samples: usize) -> Vec<u8> {
    let x: Vec<f32> = (0..samples)
        .map(|i| ((i * 37) % 2000) as f32 / 1000.0 - 1.0)
        .collect();
    common::wav(16000, &x, false, None)
}

#[test]
fn audio_files() {
    let _g = serial();
    let dir = tempfile::tempdir().unwrap();
    let bad = bad_positions(3);
    let mut vanish = Vec::new();
    for i in 0..TOTAL {
        let path = dir.path().join(format!("{i:05}.wav"));
        let bytes = if bad.contains(&i) {
            match i % 5 {
                0 => wav(800)[..30].to_vec(), // truncated header
                1 => Vec::new(),              // zero bytes
                2 => tiny_jpeg(1),            // wrong type
                3 => vec![0x5a; 2000],        // garbage
                _ => {
                    vanish.push(path.clone());
                    wav(800)
                }
            }
        } else {
            wav(800)
        };
        std::fs::write(&path, bytes).unwrap();
    }
    let opts = ferrofeed::audio::StreamOptions {
        chunk_seconds: 0.1,
        ..Default::default()
    };
    let build = |policy| {
        let files = AudioFiles::scan(dir.path(), opts).unwrap();
        Pipeline::builder_iterable(files)
            .stage(
                "logmel",
                FeatureStage::new(FeatureConfig::default(), FeatureKind::LogMel).unwrap(),
            )
            .interleave(8)
            .batch_size(64)
            .seed(5)
            .on_error(policy)
            .collate(FeatureCollate::new())
            .build()
            .unwrap()
    };
    let p = build(ErrorPolicy::Skip);
    for v in &vanish {
        std::fs::remove_file(v).unwrap();
    }
    // Every good file is exactly one 0.1 s chunk (800 samples at 16 kHz).
    let (delivered, skipped) = run_skip(&p);
    assert_eq!(delivered + skipped.len(), TOTAL);
    let got: BTreeSet<usize> = skipped
        .values()
        .map(|e| {
            let path = e.path.clone().unwrap();
            assert_eq!(e.stage, "source");
            Path::new(&path)
                .file_stem()
                .unwrap()
                .to_str()
                .unwrap()
                .parse()
                .unwrap()
        })
        .collect();
    assert_eq!(got, bad);
    drop(p);
    let p = build(ErrorPolicy::Fail);
    let err = p
        .epoch(0)
        .find_map(Result::err)
        .expect("a bad file stops the run");
    assert!(err.to_string().contains(".wav"), "{err}");
    drop(p);
    assert_all_joined();
}

/// A source whose every sample fails its first `k` reads.
struct Flaky {
    reads: Vec<AtomicU32>,
    k: u32,
}

impl Source for Flaky {
    type Output = i64;
    fn len(&self) -> u64 {
        self.reads.len() as u64
    }
    fn get(&self, index: u64) -> Result<i64, BoxError> {
        let n = self.reads[index as usize].fetch_add(1, Ordering::Relaxed);
        if n < self.k {
            Err(format!("transient failure {n} of sample {index}").into())
        } else {
            Ok(index as i64)
        }
    }
    fn key(&self, index: u64) -> Option<String> {
        Some(format!("flaky/{index}"))
    }
}

#[test]
fn transient_failures_are_retried_not_lost() {
    let _g = serial();
    let source = Arc::new(Flaky {
        reads: (0..TOTAL).map(|_| AtomicU32::new(0)).collect(),
        k: 2,
    });
    let p = Pipeline::builder(Arc::clone(&source))
        .batch_size(50)
        .seed(5)
        .on_error(ErrorPolicy::Retry {
            attempts: 3,
            backoff: std::time::Duration::from_micros(50),
            then: ferrofeed::core::RetryThen::Fail,
        })
        .collate(StackCollate::new().column::<i64>("x"))
        .build()
        .unwrap();
    let mut seen: Vec<i64> = Vec::new();
    for b in p.epoch(0) {
        seen.extend(b.unwrap().get("x").unwrap().as_slice::<i64>().unwrap());
    }
    seen.sort();
    assert_eq!(seen, (0..TOTAL as i64).collect::<Vec<_>>());
    let s = p.last_summary().unwrap();
    assert!(s.skipped.is_empty());
    assert_eq!(s.retries, 2 * TOTAL as u64);
    drop(p);

    // With fewer retries than failures, `retry:1` then fails with the sample named.
    let source = Arc::new(Flaky {
        reads: (0..TOTAL).map(|_| AtomicU32::new(0)).collect(),
        k: 2,
    });
    let p = Pipeline::builder(source)
        .batch_size(50)
        .shuffle(false)
        .on_error("retry:1".parse().unwrap())
        .collate(StackCollate::new().column::<i64>("x"))
        .build()
        .unwrap();
    let err = p.epoch(0).find_map(Result::err).unwrap();
    assert_eq!(err.index, Some(0));
    assert_eq!(err.path.as_deref(), Some("flaky/0"));
    assert_eq!(err.attempts, 2);
    drop(p);
    assert_all_joined();
}
