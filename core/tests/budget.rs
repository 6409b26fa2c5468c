//! The byte budget holds for every sample size from the very first task:
//! samples that grow as they move (a small source item, a large stage
//! output), map and iterable sources, fused and split stages, autotune.
//! Bound: peak bytes in flight ≤ budget + one batch (the task the consumer
//! needs next is always admitted). A budget too small for the batch the
//! consumer holds plus the next batch's samples and its collated copy runs
//! one batch at a time, and peaks at those three.
use std::time::Duration;

use ferrofeed_core::prelude::*;
use ferrofeed_core::ShardIter;

/// A source item: small (a file path, a few bytes).
#[derive(Clone)]
struct Small(u64);
impl Component for Small {
    fn nbytes(&self) -> usize {
        8
    }
}

mod common;
/// What a stage makes of it: `n` bytes (decoded pixels).
use common::Blob;

struct Shards {
    shards: usize,
    per: u64,
}
impl IterableSource for Shards {
    type Output = Small;
    fn num_shards(&self) -> usize {
        self.shards
    }
    fn shard_key(&self, s: usize) -> String {
        format!("shard-{s}")
    }
    fn open(&self, s: usize) -> Result<ShardIter<Small>, BoxError> {
        let per = self.per;
        Ok(Box::new(
            (0..per).map(move |i| Ok(Small(s as u64 * per + i))),
        ))
    }
}

#[derive(Clone, Copy, Debug)]
enum Kind {
    Map,
    Iterable,
}

#[derive(Clone, Copy, Debug)]
enum Stages {
    /// Both stages on one pool.
    Fused,
    /// Two pools of different sizes, linked by a queue.
    Split,
    /// Each stage its own tuned pool.
    Autotune,
}

/// Runs one epoch of `samples` items that grow to `size` bytes, with a slow
/// consumer, and returns (peak bytes in flight, samples delivered).
fn run(
    kind: Kind,
    stages: Stages,
    samples: u64,
    size: usize,
    batch: usize,
    budget: usize,
) -> (usize, usize) {
    let builder = match kind {
        Kind::Map => Pipeline::builder(FnSource::new(samples, |i| Ok(Small(i)))),
        Kind::Iterable => Pipeline::builder_iterable(Shards {
            shards: 6,
            per: samples / 6,
        })
        .interleave(2),
    };
    let (first, second) = match stages {
        Stages::Fused | Stages::Autotune => (Parallelism::Auto, Parallelism::Auto),
        Stages::Split => (Parallelism::Fixed(1), Parallelism::Fixed(3)),
    };
    let p = builder
        .map_with(
            "check",
            StageOptions::new().workers(first),
            |s: Small, _: &StageCtx| Ok(s),
        )
        .map_with(
            "inflate",
            StageOptions::new().workers(second),
            move |s: Small, _: &StageCtx| Ok(Blob(vec![s.0 as u8; size])),
        )
        .batch_size(batch)
        .cpus(3)
        .autotune(matches!(stages, Stages::Autotune))
        .max_bytes_in_flight(budget)
        .collate(StackCollate::new().column::<Blob>("blob"))
        .build()
        .unwrap();
    let mut n = 0;
    for b in p.epoch(0) {
        n += b.unwrap().len();
        // A slow consumer lets the workers run ahead as far as they may.
        std::thread::sleep(Duration::from_millis(1));
    }
    assert_eq!(p.budget().used(), 0, "every byte is released at the end");
    (p.budget().peak(), n)
}

fn check(samples: u64, size: usize, batch: usize, budget: usize) {
    for kind in [Kind::Map, Kind::Iterable] {
        for stages in [Stages::Fused, Stages::Split, Stages::Autotune] {
            let (peak, n) = run(kind, stages, samples, size, batch, budget);
            assert_eq!(
                n as u64, samples,
                "{kind:?} {stages:?}: every sample delivered"
            );
            let one_batch = batch * size;
            assert!(
                peak <= budget + one_batch,
                "{kind:?} {stages:?}, {size}-byte samples: peak {peak} over budget {budget} + one batch {one_batch}"
            );
            assert!(
                peak >= one_batch,
                "{kind:?} {stages:?}: the budget counted the batches ({peak})"
            );
        }
    }
}

#[test]
fn large_samples_stay_within_the_budget_from_the_first_task() {
    // 20 MB samples: before this held, the first tasks were admitted at an
    // estimate of zero bytes (6 × 3 of them in flight at once).
    check(24, 20 << 20, 1, 64 << 20);
    check(24, 20 << 20, 2, 160 << 20);
}

#[test]
fn small_samples_stay_within_the_budget() {
    check(1_800, 1 << 10, 8, 64 << 10);
}

#[test]
fn a_budget_smaller_than_one_batch_delivers_one_task_at_a_time() {
    for kind in [Kind::Map, Kind::Iterable] {
        for stages in [Stages::Fused, Stages::Split, Stages::Autotune] {
            let (peak, n) = run(kind, stages, 12, 1 << 20, 3, 1 << 10);
            assert_eq!(n, 12);
            // The batch the consumer holds, and the next task's samples and
            // their collated copy.
            assert!(
                peak <= 3 * (3 << 20) + 4096,
                "{kind:?} {stages:?}: peak {peak}"
            );
        }
    }
}

/// A gate the first task's later rows wait at until a row of another task
/// has started (or five seconds have passed).
#[derive(Default)]
struct Gate {
    open: std::sync::Mutex<bool>,
    cv: std::sync::Condvar,
}

impl Gate {
    fn open(&self) {
        *self.open.lock().unwrap() = true;
        self.cv.notify_all();
    }
    /// Whether the gate opened in time.
    fn wait(&self) -> bool {
        let g = self.open.lock().unwrap();
        let (g, _) = self
            .cv
            .wait_timeout_while(g, Duration::from_secs(5), |open| !*open)
            .unwrap();
        *g
    }
}

#[test]
fn the_first_task_lets_the_other_workers_in_after_its_first_row() {
    // Before anything is measured the budget admits only the task the
    // consumer needs next; the first task's first row runs through the
    // segment and collate alone, so its bytes are known and a second
    // worker starts another task while the first is still at work. Here
    // the first task cannot finish unless that happens.
    for kind in [Kind::Map, Kind::Iterable] {
        let gate = std::sync::Arc::new(Gate::default());
        let timed_out = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let builder = match kind {
            Kind::Map => Pipeline::builder(FnSource::new(24, |i| Ok(Small(i)))),
            Kind::Iterable => Pipeline::builder_iterable(Shards { shards: 6, per: 4 }),
        };
        let (g, t) = (
            std::sync::Arc::clone(&gate),
            std::sync::Arc::clone(&timed_out),
        );
        let p = builder
            .map_with(
                "inflate",
                StageOptions::new().workers(Parallelism::Fixed(2)),
                move |s: Small, ctx: &StageCtx| {
                    // Rows 1..4 form the rest of the first task (the first
                    // batch, or shard 0's first part).
                    if (1..4).contains(&ctx.index()) {
                        if !g.wait() {
                            t.store(true, std::sync::atomic::Ordering::Relaxed);
                        }
                    } else if ctx.index() >= 4 {
                        g.open();
                    }
                    Ok(Blob(vec![s.0 as u8; 1000]))
                },
            )
            .batch_size(4)
            .shuffle(false)
            .max_bytes_in_flight(1 << 20)
            .collate(StackCollate::new().column::<Blob>("blob"))
            .build()
            .unwrap();
        let n: usize = p.epoch(0).map(|b| b.unwrap().len()).sum();
        assert_eq!(n, 24, "{kind:?}");
        assert!(
            !timed_out.load(std::sync::atomic::Ordering::Relaxed),
            "{kind:?}: no other task started while the first one was unmeasured"
        );
        let batches: Vec<Vec<u8>> = p
            .epoch(1)
            .map(|b| {
                let b = b.unwrap();
                b.indices().iter().map(|&i| i as u8).collect()
            })
            .collect();
        assert_eq!(
            batches[0],
            vec![0, 1, 2, 3],
            "{kind:?}: the first task's rows in order"
        );
    }
}

/// Items run before the shuffle buffer only while the budget has room for
/// them: a buffer of 256 items whose rows weigh 1 KiB each (several groups
/// read at once) stays within a 64 KiB budget, and every sample comes.
#[test]
fn rows_waiting_in_a_shuffle_buffer_stay_within_the_budget() {
    let (size, batch, budget) = (1usize << 10, 8usize, 64usize << 10);
    let p = Pipeline::builder_iterable(Shards {
        shards: 6,
        per: 300,
    })
    .shuffle(true)
    .shuffle_buffer(256)
    .map("inflate", move |s: Small, _: &StageCtx| {
        Ok(Blob(vec![s.0 as u8; size]))
    })
    .batch_size(batch)
    .cpus(3)
    .max_bytes_in_flight(budget)
    .collate(StackCollate::new().column::<Blob>("blob"))
    .build()
    .unwrap();
    let mut n = 0;
    for b in p.epoch(0) {
        n += b.unwrap().len();
        std::thread::sleep(Duration::from_millis(1));
    }
    assert_eq!(n, 1800, "every sample delivered");
    let peak = p.budget().peak();
    // The budget, one batch the consumer holds, and the raw items waiting
    // in the buffer (8 bytes each, counted too): unbounded, the inflated
    // rows alone would reach 256 KiB.
    let waiting = 256 * 8;
    assert!(
        peak <= budget + batch * size + waiting,
        "peak {peak} over budget {budget} + one batch + the buffer's raw items"
    );
    assert_eq!(p.budget().used(), 0, "every byte is released at the end");
}
