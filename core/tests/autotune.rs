//! Autotune: worker counts change while epochs run, and nothing a user
//! relies on changes with them — every sample once, in sampler order, the
//! same batches as an untuned pipeline, threads gone on drop.
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use ferrofeed_core::prelude::*;
use ferrofeed_core::PipelineBuilder;
use ferrofeed_core::ShardIter;

mod common;
use common::ff_threads;
use ferrofeed_core::sync::LockExt;

/// Tests here count this process's `ff-` threads: one at a time.
static SERIAL: Mutex<()> = Mutex::new(());

fn spin(d: Duration) {
    let t = Instant::now();
    while t.elapsed() < d {
        std::hint::black_box(0);
    }
}

/// `fetch` sleeps (blocked, no CPU), `work` spins.
fn pipeline(n: u64, autotune: bool, fetch_us: u64) -> Pipeline {
    Pipeline::builder(FnSource::new(n, |i| Ok(i as i64)))
        .map("fetch", move |x: i64, _: &StageCtx| {
            std::thread::sleep(Duration::from_micros(fetch_us));
            Ok(x)
        })
        .map("work", |x: i64, _: &StageCtx| {
            spin(Duration::from_micros(20));
            Ok(x * 3)
        })
        .batch_size(8)
        .shuffle(true)
        .seed(7)
        .autotune(autotune)
        .autotune_max_workers(8)
        .autotune_interval(Duration::from_millis(10))
        .collate(StackCollate::new().column::<i64>("x"))
        .build()
        .expect("valid plan")
}

/// `b` with a fast tuner (up to 6 workers, every 5 ms) and an `x` column.
fn tuned(b: PipelineBuilder, batch_size: usize) -> Pipeline {
    b.batch_size(batch_size)
        .autotune(true)
        .autotune_max_workers(6)
        .autotune_interval(Duration::from_millis(5))
        .collate(StackCollate::new().column::<i64>("x"))
        .build()
        .expect("valid plan")
}

fn batches(p: &Pipeline, epoch: u64) -> Vec<Vec<i64>> {
    p.epoch(epoch)
        .map(|b| {
            b.expect("no errors")
                .get("x")
                .expect("column x")
                .as_slice::<i64>()
                .expect("i64")
                .to_vec()
        })
        .collect()
}

#[test]
fn a_blocked_stage_gets_more_workers_and_batches_are_unchanged() {
    let _serial = SERIAL.lock_unpoisoned();
    let tuned = pipeline(400, true, 1000);
    let plain = pipeline(400, false, 0);
    // Starts with one worker per stage.
    assert_eq!(tuned.workers()[1], ("fetch".to_string(), 1));
    for epoch in 0..3 {
        let got = batches(&tuned, epoch);
        assert_eq!(got, batches(&plain, epoch), "epoch {epoch}");
        let mut all: Vec<i64> = got.concat();
        all.sort_unstable();
        assert_eq!(all, (0..400).map(|i| i * 3).collect::<Vec<_>>());
    }
    // 1 ms asleep per sample and almost no CPU: the tuner gives `fetch`
    // most of its 8 threads, and `work` (20 µs) one.
    let w = tuned.workers();
    assert!(w[1].1 >= 4, "{w:?}");
    assert_eq!(w[2], ("work".to_string(), 1), "{w:?}");
    let log = tuned.autotune_log();
    assert!(!log.is_empty());
    assert!(log.last().is_some_and(|s| s.predicted_per_s > 0.0));
}

#[test]
fn counts_follow_costs_that_drift() {
    let _serial = SERIAL.lock_unpoisoned();
    // The fetch cost drops from 1 ms to nothing between epochs: the
    // tuner takes workers back.
    let slow = Arc::new(AtomicUsize::new(1));
    let s = Arc::clone(&slow);
    let p = Pipeline::builder(FnSource::new(300, |i| Ok(i as i64)))
        .map("fetch", move |x: i64, _: &StageCtx| {
            if s.load(Ordering::Relaxed) == 1 {
                std::thread::sleep(Duration::from_millis(1));
            }
            Ok(x)
        })
        .map("work", |x: i64, _: &StageCtx| {
            spin(Duration::from_micros(200));
            Ok(x)
        })
        .batch_size(4)
        .autotune(true)
        .autotune_max_workers(8)
        .autotune_interval(Duration::from_millis(10))
        .collate(StackCollate::new().column::<i64>("x"))
        .build()
        .expect("valid plan");
    let n: usize = p.epoch(0).map(|b| b.expect("ok").len()).sum();
    assert_eq!(n, 300);
    let before = p.workers()[1].1;
    assert!(before >= 2, "{:?}", p.workers());
    slow.store(0, Ordering::Relaxed);
    for epoch in 1..4 {
        let n: usize = p.epoch(epoch).map(|b| b.expect("ok").len()).sum();
        assert_eq!(n, 300);
    }
    let after = p.workers()[1].1;
    assert!(after < before, "fetch kept {after} of {before} workers");
}

#[test]
fn iterable_sources_and_early_drop() {
    let _serial = SERIAL.lock_unpoisoned();
    struct Shards;
    impl IterableSource for Shards {
        type Output = i64;
        fn num_shards(&self) -> usize {
            12
        }
        fn shard_key(&self, s: usize) -> String {
            format!("shard-{s}")
        }
        fn open(&self, s: usize) -> Result<ShardIter<i64>, BoxError> {
            Ok(Box::new((0..50).map(move |i| {
                std::thread::sleep(Duration::from_micros(200));
                Ok((s * 50 + i) as i64)
            })))
        }
    }
    let before = ff_threads();
    let p = Pipeline::builder_iterable(Shards).map("work", |x: i64, _: &StageCtx| Ok(x));
    let p = tuned(p, 16);
    for epoch in 0..2 {
        let mut all = batches(&p, epoch).concat();
        all.sort_unstable();
        assert_eq!(all, (0..600).collect::<Vec<_>>(), "epoch {epoch}");
    }
    // Stop mid-epoch, parked workers included: every thread goes.
    let mut it = p.epoch(2);
    assert!(it.next().is_some());
    drop(it);
    drop(p);
    let t = Instant::now();
    while ff_threads() > before && t.elapsed() < Duration::from_secs(1) {
        std::thread::sleep(Duration::from_millis(5));
    }
    assert_eq!(ff_threads(), before);
}

#[test]
fn a_failing_sample_stops_the_epoch_and_the_next_one_runs() {
    let _serial = SERIAL.lock_unpoisoned();
    let p = Pipeline::builder(FnSource::new(300, |i| Ok(i as i64)))
        .map("fetch", |x: i64, ctx: &StageCtx| {
            std::thread::sleep(Duration::from_micros(300));
            if ctx.epoch() == 0 && x == 211 {
                return Err::<i64, BoxError>("sample 211 is broken".into());
            }
            Ok(x)
        })
        .map("work", |x: i64, _: &StageCtx| Ok(x));
    let p = tuned(p, 4);
    let err = p.epoch(0).find_map(|b| b.err()).expect("epoch 0 fails");
    assert_eq!(err.index, Some(211));
    assert_eq!(err.stage, "fetch");
    // Workers the tuner parked or woke during the failed epoch all take part
    // in the next one.
    let n: usize = p.epoch(1).map(|b| b.expect("epoch 1 is clean").len()).sum();
    assert_eq!(n, 300);
}
