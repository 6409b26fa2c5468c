//! Shutdown and pool reuse, checked by counting this process's threads; the
//! tests here hold a lock so no other pipeline's threads are counted.
use std::sync::Mutex;
use std::time::{Duration, Instant};

use ferrofeed_core::prelude::*;

mod common;
use common::{ff_threads, Val};
use ferrofeed_core::sync::LockExt;

static SERIAL: Mutex<()> = Mutex::new(());

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
    let _g = SERIAL.lock_unpoisoned();
    let p = Pipeline::builder(vals(200))
        .map_with(
            "a",
            StageOptions::new().workers(Parallelism::Fixed(3)),
            |v: Val, _: &StageCtx| Ok(v),
        )
        .map_with(
            "b",
            StageOptions::new().workers(Parallelism::Fixed(2)),
            |v: Val, _: &StageCtx| Ok(Val(v.0 + 1)),
        )
        .batch_size(3)
        .min_task_samples(1)
        .shuffle(true)
        .collate(StackCollate::new().column::<Val>("v"))
        .build()
        .unwrap();
    // Threads name themselves as they start, which on a loaded machine can
    // be after other workers finished an epoch: wait for all six.
    assert_eq!(collect_all(&p, 1000).len(), 200);
    let deadline = Instant::now() + Duration::from_secs(5);
    while ff_threads() < 6 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(5));
    }
    let threads_before = ff_threads();
    assert_eq!(threads_before, 6, "3 + 2 pool threads and the monitor");
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
        ff_threads(),
        threads_before,
        "no thread is started per epoch"
    );
}

#[test]
fn dropping_the_pipeline_joins_every_thread_quickly() {
    let _g = SERIAL.lock_unpoisoned();
    let before = ff_threads();
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
                Ok(v)
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
    assert_eq!(ff_threads(), before);
}

#[test]
fn a_consumer_that_panics_mid_epoch_leaves_no_thread_behind() {
    let _g = SERIAL.lock_unpoisoned();
    let before = ff_threads();
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
    assert_eq!(ff_threads(), before);
}

/// Runs `f` on its own thread; a test that is still running after `limit`
/// fails (a hang is reported, not waited on forever).
fn watchdog<T: Send + 'static>(
    name: &str,
    limit: Duration,
    f: impl FnOnce() -> T + Send + 'static,
) -> T {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(f));
        let _ = tx.send(r);
    });
    match rx.recv_timeout(limit) {
        Ok(Ok(v)) => v,
        Ok(Err(p)) => std::panic::resume_unwind(p),
        Err(_) => panic!("{name}: still running after {limit:?} — a hang"),
    }
}

/// Waits (at most 1 s) for the pool threads to go back to `before`.
fn joined_within_a_second(before: usize, what: &str) {
    let t = Instant::now();
    while ff_threads() > before {
        assert!(
            t.elapsed() < Duration::from_secs(1),
            "{what}: {} pool threads left 1 s after the drop",
            ff_threads() - before
        );
        std::thread::sleep(Duration::from_millis(2));
    }
}

#[test]
fn misbehaving_stages_and_consumers_never_hang_and_leave_no_thread() {
    let _g = SERIAL.lock_unpoisoned();
    let before = ff_threads();

    // A stage that panics on some samples, under `skip`.
    watchdog("panicking stage", Duration::from_secs(20), || {
        let p = Pipeline::builder(vals(5_000))
            .map_with(
                "explodes",
                StageOptions::new().workers(Parallelism::Fixed(3)),
                |v: Val, _: &StageCtx| {
                    if v.0 % 1000 == 7 {
                        panic!("boom at {}", v.0);
                    }
                    Ok(v)
                },
            )
            .batch_size(16)
            .on_error(ErrorPolicy::Skip)
            .collate(StackCollate::new().column::<Val>("v"))
            .build()
            .unwrap();
        assert_eq!(collect_all(&p, 0).len(), 4_995);
        assert_eq!(p.last_summary().unwrap().skipped.len(), 5);
    });
    joined_within_a_second(before, "panicking stage");

    // A stage that blocks until released, with a per-stage timeout.
    let (release, blocked) = std::sync::mpsc::channel::<()>();
    let blocked = std::sync::Arc::new(Mutex::new(blocked));
    watchdog("blocking stage", Duration::from_secs(20), move || {
        let p = Pipeline::builder(vals(100))
            .map_with(
                "stuck",
                StageOptions::new()
                    .workers(Parallelism::Fixed(2))
                    .timeout(Duration::from_millis(100)),
                move |v: Val, _: &StageCtx| {
                    if v.0 == 42 {
                        let _ = blocked.lock_unpoisoned().recv();
                    }
                    Ok(v)
                },
            )
            .batch_size(4)
            .min_task_samples(1)
            .collate(StackCollate::new().column::<Val>("v"))
            .build()
            .unwrap();
        let err = p.epoch(0).find_map(Result::err).expect("the timeout fires");
        assert_eq!((err.stage.as_str(), err.index), ("stuck", Some(42)));
        // Released, the worker finishes and every thread can be joined.
        release.send(()).unwrap();
        let t = Instant::now();
        drop(p);
        assert!(
            t.elapsed() < Duration::from_secs(1),
            "drop took {:?}",
            t.elapsed()
        );
    });
    joined_within_a_second(before, "blocking stage");

    // A consumer that stops early, mid-epoch, in a long epoch.
    watchdog("early stop", Duration::from_secs(20), || {
        let p = Pipeline::builder(vals(10_000_000))
            .batch_size(8)
            .collate(StackCollate::new().column::<Val>("v"))
            .build()
            .unwrap();
        let got = p.epoch(0).take(3).filter(Result::is_ok).count();
        assert_eq!(got, 3);
        let t = Instant::now();
        drop(p);
        assert!(
            t.elapsed() < Duration::from_secs(1),
            "drop took {:?}",
            t.elapsed()
        );
    });
    joined_within_a_second(before, "early stop");

    // A consumer that panics mid-epoch.
    let r = std::panic::catch_unwind(|| {
        watchdog("consumer panic", Duration::from_secs(20), || {
            let p = Pipeline::builder(vals(10_000_000))
                .batch_size(8)
                .collate(StackCollate::new().column::<Val>("v"))
                .build()
                .unwrap();
            for (i, b) in p.epoch(0).enumerate() {
                b.unwrap();
                assert!(i < 5, "consumer gives up at batch {i}");
            }
        })
    });
    assert!(r.is_err());
    joined_within_a_second(before, "consumer panic");
}
