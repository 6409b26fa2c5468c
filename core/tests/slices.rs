//! Parts of an iterable source read in slices: a stage starts on a part's
//! first rows while the rest is still being read, idle workers run slices
//! of a part someone else reads, and the batches, their order, resumption
//! and the error policies are those of parts read whole.
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use ferrofeed_core::prelude::*;
use ferrofeed_core::ShardIter;

mod common;
use common::Val;

/// Shards of consecutive numbers; counts the items read, and fails to
/// yield item `bad`.
struct Counted {
    shards: usize,
    per: i64,
    bad: Option<i64>,
    read: Arc<AtomicU64>,
}
impl IterableSource for Counted {
    type Output = Val;
    fn num_shards(&self) -> usize {
        self.shards
    }
    fn shard_key(&self, s: usize) -> String {
        format!("shard-{s}")
    }
    fn open(&self, s: usize) -> Result<ShardIter<Val>, BoxError> {
        let (per, bad, read) = (self.per, self.bad, Arc::clone(&self.read));
        Ok(Box::new((0..per).map(move |i| {
            read.fetch_add(1, Ordering::SeqCst);
            let v = s as i64 * per + i;
            if Some(v) == bad {
                return Err("truncated record".into());
            }
            Ok(Val(v))
        })))
    }
}

struct Setup {
    shards: usize,
    per: i64,
    workers: usize,
    batch: usize,
    buffer: usize,
    bad_item: Option<i64>,
    bad_row: Option<i64>,
    policy: ErrorPolicy,
}

impl Default for Setup {
    fn default() -> Self {
        Setup {
            shards: 1,
            per: 400,
            workers: 3,
            batch: 16,
            buffer: 0,
            bad_item: None,
            bad_row: None,
            policy: ErrorPolicy::Fail,
        }
    }
}

/// The items read when each value went through the stage, and the threads
/// that ran it.
type Seen = Arc<Mutex<Vec<(i64, u64, String)>>>;

fn build(s: &Setup) -> (Pipeline, Seen) {
    let read = Arc::new(AtomicU64::new(0));
    let seen: Seen = Arc::default();
    let (counter, log, bad_row) = (Arc::clone(&read), Arc::clone(&seen), s.bad_row);
    let p = Pipeline::builder_iterable(Counted {
        shards: s.shards,
        per: s.per,
        bad: s.bad_item,
        read,
    })
    .map_with(
        "slow",
        StageOptions::new().workers(Parallelism::Fixed(s.workers)),
        move |v: Val, _: &StageCtx| {
            std::thread::sleep(Duration::from_micros(200));
            let name = std::thread::current().name().unwrap_or("").to_string();
            log.lock()
                .unwrap()
                .push((v.0, counter.load(Ordering::SeqCst), name));
            if Some(v.0) == bad_row {
                return Err::<Val, BoxError>("bad sample".into());
            }
            Ok(v)
        },
    )
    .batch_size(s.batch)
    .shuffle(s.buffer > 0)
    .shuffle_buffer(s.buffer)
    .seed(5)
    .on_error(s.policy)
    .collate(StackCollate::new().column::<Val>("v"))
    .build()
    .unwrap();
    (p, seen)
}

fn batches(p: &Pipeline, epoch: u64) -> Vec<Vec<i64>> {
    p.epoch(epoch)
        .map(|b| {
            b.unwrap()
                .get("v")
                .unwrap()
                .as_slice::<i64>()
                .unwrap()
                .to_vec()
        })
        .collect()
}

/// A shuffled stream: the first rows leave the shuffle buffer once it holds
/// its first items (32), not once it is full (256 here; often a whole
/// shard), so a streamed shard is decoded as it arrives; the buffer still
/// grows, the epoch holds every item once, shuffled the same way each run.
#[test]
fn a_shuffle_buffer_lets_items_out_before_it_is_full() {
    let setup = Setup {
        workers: 1,
        per: 400,
        buffer: 256,
        ..Setup::default()
    };
    let (p, seen) = build(&setup);
    let got = batches(&p, 0).concat();
    let first_read = seen.lock().unwrap()[0].1;
    assert!(
        first_read < 64,
        "the first row ran after {first_read} items were read"
    );
    let mut sorted = got.clone();
    sorted.sort_unstable();
    assert_eq!(sorted, (0..400).collect::<Vec<_>>());
    assert_ne!(got, (0..400).collect::<Vec<_>>(), "shuffled");
    // Items travel far: the buffer grew past its first 32.
    let far = got
        .iter()
        .enumerate()
        .filter(|&(at, &v)| (at as i64 - v).abs() > 64)
        .count();
    assert!(far > 100, "{far} items moved more than 64 places");
    let (again, _) = build(&setup);
    assert_eq!(batches(&again, 0).concat(), got, "the same order every run");
}

/// One worker, no shuffle: from the third part on, every row goes through
/// the stage before the items after its slice (a quarter of a batch) are
/// read — the stage does not wait for the whole part.
#[test]
fn a_stage_starts_on_a_part_before_the_part_is_read() {
    let setup = Setup {
        workers: 1,
        per: 160,
        ..Setup::default()
    };
    let (p, seen) = build(&setup);
    assert_eq!(batches(&p, 0).concat(), (0..160).collect::<Vec<_>>());
    let seen = seen.lock().unwrap();
    for &(v, read, _) in seen.iter().filter(|s| s.0 >= 32) {
        let slice_end = (v / 4 + 1) * 4;
        assert!(
            read as i64 <= slice_end,
            "row {v} ran after {read} items were read (its slice ends at {slice_end})"
        );
    }
}

/// Slices of one shard's parts run on every worker, and the batches are
/// those of one worker, in the same order, epoch after epoch, with and
/// without a shuffle buffer, with short last parts merged across shards.
#[test]
fn sliced_parts_give_the_batches_of_one_worker() {
    for (shards, per, buffer) in [(1, 400, 0), (1, 400, 37), (3, 150, 20)] {
        let one = build(&Setup {
            shards,
            per,
            buffer,
            workers: 1,
            ..Setup::default()
        })
        .0;
        let (many, seen) = build(&Setup {
            shards,
            per,
            buffer,
            workers: 3,
            ..Setup::default()
        });
        for epoch in 0..3 {
            seen.lock().unwrap().clear();
            let want = batches(&one, epoch);
            let sizes: Vec<usize> = want.iter().map(Vec::len).collect();
            assert!(
                sizes[..sizes.len() - 1].iter().all(|&n| n == 16),
                "{sizes:?}"
            );
            assert_eq!(
                batches(&many, epoch),
                want,
                "{shards}×{per}, buffer {buffer}"
            );
            if shards == 1 {
                let threads: std::collections::HashSet<String> =
                    seen.lock().unwrap().iter().map(|s| s.2.clone()).collect();
                assert!(threads.len() >= 2, "epoch {epoch}: {threads:?}");
            }
            if shards == 1 && buffer == 0 {
                // Helpers ran slices of parts the reader was reading.
                let mut by_part: std::collections::HashMap<i64, std::collections::HashSet<String>> =
                    Default::default();
                for (v, _, t) in seen.lock().unwrap().iter() {
                    by_part.entry(v / 16).or_default().insert(t.clone());
                }
                let shared = by_part.values().filter(|t| t.len() >= 2).count();
                assert!(shared >= 1, "epoch {epoch}: no part ran on two workers");
            }
        }
    }
}

#[test]
fn resuming_a_sliced_epoch_at_every_batch_equals_the_whole_run() {
    let setup = Setup {
        shards: 2,
        per: 90,
        buffer: 11,
        ..Setup::default()
    };
    let (p, _) = build(&setup);
    let whole = batches(&p, 1);
    let vals = |b: Batch| b.get("v").unwrap().as_slice::<i64>().unwrap().to_vec();
    for k in 0..=whole.len() {
        let mut it = p.epoch(1);
        let mut got: Vec<Vec<i64>> = it.by_ref().take(k).map(|b| vals(b.unwrap())).collect();
        let state = it.state();
        drop(it);
        got.extend(p.resume(&state).unwrap().map(|b| vals(b.unwrap())));
        assert_eq!(got, whole, "stopped after {k}");
    }
}

/// A row failing in a slice, and an item the shard cannot yield in the
/// middle of a part: `fail` stops the epoch after the batches before that
/// part, naming the sample; `skip` drops only it.
#[test]
fn a_failure_in_a_slice_follows_the_policy() {
    for (bad_item, bad_row, stage) in [(None, Some(203), "slow"), (Some(203), None, "source")] {
        let setup = Setup {
            bad_item,
            bad_row,
            ..Setup::default()
        };
        let (p, _) = build(&setup);
        for epoch in 0..2 {
            let mut got = Vec::new();
            let mut err = None;
            for b in p.epoch(epoch) {
                match b {
                    Ok(b) => got.extend(b.get("v").unwrap().as_slice::<i64>().unwrap().to_vec()),
                    Err(e) => {
                        err = Some(e);
                        break;
                    }
                }
            }
            assert_eq!(got, (0..192).collect::<Vec<_>>(), "{stage}, epoch {epoch}");
            let e = err.expect("the failure is reported");
            assert_eq!((e.index, e.stage.as_str()), (Some(203), stage));
        }
        let (p, _) = build(&Setup {
            policy: ErrorPolicy::Skip,
            ..setup
        });
        let got = batches(&p, 0).concat();
        assert_eq!(got, (0..400).filter(|&v| v != 203).collect::<Vec<_>>());
        let s = p.last_summary().unwrap();
        assert_eq!(s.skipped.len(), 1, "{stage}");
        assert_eq!(
            (s.skipped[0].index, s.skipped[0].stage.as_str()),
            (Some(203), stage)
        );
    }
}

/// With a shuffle buffer, each row goes through the stage once it has been
/// read, before a slice's worth of later items (a quarter of a batch) is
/// read — not once it leaves the buffer, which lets one item out per two
/// read while it grows and holds hundreds here — and the rows run in the
/// order read; the batches are still shuffled.
#[test]
fn with_a_shuffle_buffer_rows_run_as_they_are_read() {
    let setup = Setup {
        workers: 1,
        per: 400,
        buffer: 256,
        ..Setup::default()
    };
    let (p, seen) = build(&setup);
    let got = batches(&p, 0).concat();
    assert_ne!(got, (0..400).collect::<Vec<_>>(), "shuffled");
    let seen = seen.lock().unwrap();
    let ran: Vec<i64> = seen.iter().map(|s| s.0).collect();
    assert_eq!(ran, (0..400).collect::<Vec<_>>(), "run in the order read");
    for &(v, read, _) in seen.iter() {
        assert!(
            read as i64 <= v + 1 + 4,
            "row {v} ran after {read} items were read"
        );
    }
}

/// A row failing while a shuffle buffer holds it: `fail` stops the epoch
/// with the batches that were complete, in the order `skip` gives them,
/// naming the sample; `skip` drops only it.
#[test]
fn a_failure_before_the_shuffle_buffer_follows_the_policy() {
    let setup = Setup {
        buffer: 64,
        bad_row: Some(203),
        ..Setup::default()
    };
    let (skipping, _) = build(&Setup {
        policy: ErrorPolicy::Skip,
        ..setup
    });
    let all = batches(&skipping, 0).concat();
    let mut sorted = all.clone();
    sorted.sort_unstable();
    assert_eq!(sorted, (0..400).filter(|&v| v != 203).collect::<Vec<_>>());
    let (p, _) = build(&setup);
    let mut got = Vec::new();
    let mut err = None;
    for b in p.epoch(0) {
        match b {
            Ok(b) => got.extend(b.get("v").unwrap().as_slice::<i64>().unwrap().to_vec()),
            Err(e) => {
                err = Some(e);
                break;
            }
        }
    }
    let e = err.expect("the failure is reported");
    assert_eq!((e.index, e.stage.as_str()), (Some(203), "slow"));
    assert_eq!(got.len() % 16, 0, "whole batches");
    assert!(!got.is_empty() && got.len() < 400, "{} rows", got.len());
    assert_eq!(got, all[..got.len()], "the batches of the skipping run");
}
