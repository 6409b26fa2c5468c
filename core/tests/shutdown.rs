//! Shutdown and pool reuse, checked by counting this process's threads; the
//! tests here hold a lock so no other pipeline's threads are counted.
use std::sync::Mutex;
use std::time::{Duration, Instant};

use ferrofeed_core::prelude::*;

static SERIAL: Mutex<()> = Mutex::new(());

#[derive(Clone, Debug, PartialEq)]
struct Val(i64);
impl Component for Val {
    fn nbytes(&self) -> usize {
        8
    }
}
impl Collatable for Val {
    type Elem = i64;
    fn shape(&self) -> Vec<usize> {
        Vec::new()
    }
    fn write(&self, out: &mut [i64]) {
        out[0] = self.0;
    }
}

fn vals(n: u64) -> FnSource<impl Fn(u64) -> Result<Val, BoxError> + Send + Sync> {
    FnSource::new(n, |i| Ok(Val(i as i64)))
}

fn collect_all(p: &Pipeline, epoch: u64) -> Vec<i64> {
    p.epoch(epoch)
        .flat_map(|b| {
            b.unwrap()
                .get("v")
                .unwrap()
                .as_slice::<i64>()
                .unwrap()
                .to_vec()
        })
        .collect()
}

#[test]
fn early_drop_and_a_hundred_epochs_reuse_the_pools() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let p = Pipeline::builder(vals(200))
        .map_with(
            "a",
            StageOptions::new().workers(Parallelism::Fixed(3)),
            |v: Val, _: &StageCtx| Ok::<_, BoxError>(v),
        )
        .map_with(
            "b",
            StageOptions::new().workers(Parallelism::Fixed(2)),
            |v: Val, _: &StageCtx| Ok::<_, BoxError>(Val(v.0 + 1)),
        )
        .batch_size(3)
        .min_task_samples(1)
        .shuffle(true)
        .collate(StackCollate::new().column::<Val>("v"))
        .build()
        .unwrap();
    // Threads name themselves as they start, which on a loaded machine can
    // be after other workers finished an epoch: wait for all five.
    assert_eq!(collect_all(&p, 1000).len(), 200);
    let deadline = Instant::now() + Duration::from_secs(5);
    while thread_count() < 5 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(5));
    }
    let threads_before = thread_count();
    assert_eq!(threads_before, 5, "3 + 2 pool threads");
    for e in 0..100 {
        if e % 3 == 0 {
            // Abandon mid-epoch.
            let taken = p.epoch(e).take(5).count();
            assert_eq!(taken, 5);
        } else {
            let mut got = collect_all(&p, e);
            got.sort_unstable();
            assert_eq!(got, (1..=200).collect::<Vec<_>>(), "epoch {e}");
        }
    }
    assert_eq!(
        thread_count(),
        threads_before,
        "no thread is started per epoch"
    );
}

/// Threads of this process started by ferrofeed (named `ff-…`).
fn thread_count() -> usize {
    std::fs::read_dir("/proc/self/task")
        .map(|d| {
            d.filter_map(|e| e.ok())
                .filter(|e| {
                    std::fs::read_to_string(e.path().join("comm"))
                        .is_ok_and(|c| c.starts_with("ff-"))
                })
                .count()
        })
        .unwrap_or(0)
}

#[test]
fn dropping_the_pipeline_joins_every_thread_quickly() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let before = thread_count();
    let p = Pipeline::builder(vals(1_000_000))
        .map_with(
            "cooperative",
            StageOptions::new().workers(Parallelism::Fixed(4)),
            |v: Val, ctx: &StageCtx| {
                for _ in 0..50 {
                    if ctx.should_stop() {
                        break;
                    }
                    std::thread::sleep(Duration::from_millis(1));
                }
                Ok::<_, BoxError>(v)
            },
        )
        .batch_size(2)
        .collate(StackCollate::new().column::<Val>("v"))
        .build()
        .unwrap();
    let mut it = p.epoch(0);
    assert!(it.next().unwrap().is_ok());
    let t = Instant::now();
    drop(it);
    drop(p);
    assert!(
        t.elapsed() < Duration::from_secs(1),
        "took {:?}",
        t.elapsed()
    );
    assert_eq!(thread_count(), before);
}

#[test]
fn a_consumer_that_panics_mid_epoch_leaves_no_thread_behind() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let before = thread_count();
    let r = std::panic::catch_unwind(|| {
        let p = Pipeline::builder(vals(10_000))
            .batch_size(4)
            .collate(StackCollate::new().column::<Val>("v"))
            .build()
            .unwrap();
        for (i, b) in p.epoch(0).enumerate() {
            b.unwrap();
            if i == 3 {
                panic!("consumer gives up");
            }
        }
    });
    assert!(r.is_err());
    assert_eq!(thread_count(), before);
}
