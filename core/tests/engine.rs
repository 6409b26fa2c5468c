//! Engine behaviour a user relies on: plan checks, ordering, the byte budget,
//! error policies, panics, early drop, pool reuse, timeouts, iterable sources.
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use ferrofeed_core::prelude::*;
use ferrofeed_core::ShardIter;
use ferrofeed_core::{BuildError, ErrorKind};

mod common;
use common::{Blob, Val};

fn vals(n: u64) -> FnSource<impl Fn(u64) -> Result<Val, BoxError> + Send + Sync> {
    FnSource::new(n, |i| Ok(Val(i as i64)))
}

fn col(b: &Batch) -> Vec<i64> {
    b.get("v").unwrap().as_slice::<i64>().unwrap().to_vec()
}

fn collect_all(p: &Pipeline, epoch: u64) -> Vec<i64> {
    p.epoch(epoch).flat_map(|b| col(&b.unwrap())).collect()
}

#[test]
fn builder_rejects_a_stage_reading_a_missing_component() {
    let err = Pipeline::builder(vals(4))
        .map("needs_blob", |b: Blob, _: &StageCtx| {
            Ok(Val(b.0.len() as i64))
        })
        .collate(StackCollate::new().column::<Val>("v"))
        .build()
        .unwrap_err();
    match err {
        BuildError::MissingComponent {
            stage, component, ..
        } => {
            assert_eq!(stage, "needs_blob");
            assert_eq!(component, "Blob");
        }
        other => panic!("unexpected {other:?}"),
    }
}

#[test]
fn builder_rejects_reading_a_consumed_component() {
    let err = Pipeline::builder(vals(4))
        .map("to_blob", |v: Val, _: &StageCtx| Ok(Blob(vec![v.0 as u8])))
        .batch_size(2)
        .collate(StackCollate::new().column::<Val>("v"))
        .build()
        .unwrap_err();
    let msg = err.to_string();
    assert!(msg.contains("stage `collate` reads component Val"), "{msg}");
    assert!(msg.contains("`to_blob` already consumed"), "{msg}");
}

#[test]
fn builder_rejects_bad_options() {
    let c = || StackCollate::new().column::<Val>("v");
    assert_eq!(
        Pipeline::builder(vals(4))
            .batch_size(0)
            .collate(c())
            .build()
            .unwrap_err(),
        BuildError::ZeroBatchSize
    );
    let zero = Pipeline::builder(vals(4))
        .map_with(
            "s",
            StageOptions::new().workers(Parallelism::Fixed(0)),
            |v: Val, _: &StageCtx| Ok(v),
        )
        .collate(c())
        .build()
        .unwrap_err();
    assert_eq!(zero, BuildError::ZeroWorkers("s".into()));
    assert_eq!(
        Pipeline::builder(vals(4)).build().unwrap_err(),
        BuildError::NoCollate
    );
    assert_eq!(
        Pipeline::builder(vals(4))
            .max_bytes_in_flight(0)
            .collate(c())
            .build()
            .unwrap_err(),
        BuildError::ZeroBudget
    );
}

fn jittery(workers: usize, seed: u64, shuffle: bool) -> Pipeline {
    let delay = |tag: u64| {
        move |v: Val, ctx: &StageCtx| {
            // Pseudo-random per-sample delays scramble completion order.
            let us = ferrofeed_core::rng::derive_seed(&[v.0 as u64, tag, ctx.epoch()]) % 300;
            std::thread::sleep(Duration::from_micros(us));
            Ok(Val(v.0 * 3 + 1))
        }
    };
    Pipeline::builder(vals(400))
        .map_with(
            "a",
            StageOptions::new().workers(Parallelism::Fixed(workers)),
            delay(1),
        )
        .map_with(
            "b",
            StageOptions::new().workers(Parallelism::Fixed(1)),
            |v: Val, _: &StageCtx| Ok(Val(v.0 - 1)),
        )
        .map_with(
            "c",
            StageOptions::new().workers(Parallelism::Fixed(workers + 1)),
            delay(2),
        )
        .batch_size(7)
        .min_task_samples(1)
        .shuffle(shuffle)
        .seed(seed)
        .collate(StackCollate::new().column::<Val>("v"))
        .build()
        .unwrap()
}

#[test]
fn ordered_output_matches_sampler_order_under_random_delays() {
    let p = jittery(4, 11, true);
    let plan = p.plan(0).unwrap().unwrap();
    let got = collect_all(&p, 0);
    let want: Vec<i64> = plan
        .indices
        .iter()
        .map(|&i| (i as i64 * 3) * 3 + 1)
        .collect();
    assert_eq!(got, want);
    // Batch boundaries and indices follow the plan too.
    let batches: Vec<Batch> = p.epoch(0).map(|b| b.unwrap()).collect();
    assert_eq!(batches.len(), plan.num_batches());
    for (b, batch) in batches.iter().enumerate() {
        assert_eq!(batch.indices(), plan.batch(b));
    }
}

#[test]
fn results_do_not_depend_on_worker_count() {
    let one = collect_all(&jittery(1, 5, true), 3);
    let many = collect_all(&jittery(5, 5, true), 3);
    assert_eq!(one, many);
}

#[test]
fn unordered_mode_delivers_every_sample_once() {
    let p = Pipeline::builder(vals(500))
        .map_with(
            "s",
            StageOptions::new().workers(Parallelism::Fixed(4)),
            |v: Val, _: &StageCtx| {
                std::thread::sleep(Duration::from_micros((v.0 as u64 * 7919) % 200));
                Ok(v)
            },
        )
        .batch_size(5)
        .min_task_samples(1)
        .unordered()
        .collate(StackCollate::new().column::<Val>("v"))
        .build()
        .unwrap();
    let mut got = collect_all(&p, 0);
    got.sort_unstable();
    assert_eq!(got, (0..500).collect::<Vec<_>>());
}

#[test]
fn unordered_a_slow_first_sample_holds_back_no_other_batch() {
    // Sample 0 finishes only once every sample of the other batches has
    // gone through the stage (or after 5 s): the other workers must run ahead of it, from
    // the first task on (nothing measured yet), past any window.
    for batch in [1usize, 4] {
        let done = Arc::new(AtomicUsize::new(0));
        let d = Arc::clone(&done);
        let p = Pipeline::builder(vals(64))
            .map_with(
                "s",
                StageOptions::new().workers(Parallelism::Fixed(3)),
                move |v: Val, _: &StageCtx| {
                    if v.0 == 0 {
                        let t0 = Instant::now();
                        while d.load(Ordering::Acquire) < 64 - batch
                            && t0.elapsed() < Duration::from_secs(5)
                        {
                            std::thread::sleep(Duration::from_millis(1));
                        }
                    } else {
                        d.fetch_add(1, Ordering::AcqRel);
                    }
                    Ok(v)
                },
            )
            .batch_size(batch)
            .prefetch(4)
            .unordered()
            .collate(StackCollate::new().column::<Val>("v"))
            .build()
            .unwrap();
        let t0 = Instant::now();
        let firsts: Vec<u64> = p.epoch(0).map(|b| b.unwrap().indices()[0]).collect();
        assert_eq!(firsts.len(), 64 / batch);
        assert_eq!(firsts.last(), Some(&0), "batch {batch}: {firsts:?}");
        assert!(
            t0.elapsed() < Duration::from_secs(5),
            "batch {batch}: sample 0 timed out"
        );
    }
}

#[test]
fn byte_budget_bounds_what_is_in_flight() {
    const SAMPLE: usize = 100_000;
    const BUDGET: usize = 2_000_000;
    let p = Pipeline::builder(vals(300))
        .map_with(
            "inflate",
            StageOptions::new().workers(Parallelism::Fixed(4)),
            |v: Val, _: &StageCtx| Ok(Blob(vec![v.0 as u8; SAMPLE])),
        )
        .batch_size(4)
        .min_task_samples(1)
        .prefetch(64)
        .max_bytes_in_flight(BUDGET)
        .collate(StackCollate::new().column::<Blob>("blob"))
        .build()
        .unwrap();
    let mut n = 0;
    for b in p.epoch(0) {
        let b = b.unwrap();
        n += b.len();
        // A slow consumer lets producers run ahead as far as they may.
        std::thread::sleep(Duration::from_millis(2));
    }
    assert_eq!(n, 300);
    let peak = p.budget().peak();
    // Admission waits while the expected next task does not fit; the
    // overshoot is at most one task per worker racing the same check.
    let task = 4 * SAMPLE + 64;
    assert!(
        peak <= BUDGET + 4 * task,
        "peak {peak} over budget {BUDGET}"
    );
    assert!(peak >= 4 * SAMPLE, "the budget was used ({peak})");
    assert_eq!(p.budget().used(), 0, "every byte is released at the end");
}

#[test]
fn a_budget_smaller_than_one_batch_still_progresses() {
    let p = Pipeline::builder(vals(20))
        .map("inflate", |v: Val, _: &StageCtx| {
            Ok(Blob(vec![v.0 as u8; 1000]))
        })
        .batch_size(5)
        .max_bytes_in_flight(10)
        .collate(StackCollate::new().column::<Blob>("blob"))
        .build()
        .unwrap();
    // Holding every batch: the next needed task is always admitted.
    let held: Vec<Batch> = p.epoch(0).map(|b| b.unwrap()).collect();
    assert_eq!(held.len(), 4);
}

fn failing_source(bad: &'static [u64]) -> impl Source<Output = Val> {
    FnSource::new(100, move |i| {
        if bad.contains(&i) {
            Err(format!("cannot read item {i}").into())
        } else {
            Ok(Val(i as i64))
        }
    })
}

struct Keyed<S>(S);
impl<S: Source> Source for Keyed<S> {
    type Output = S::Output;
    fn len(&self) -> u64 {
        self.0.len()
    }
    fn get(&self, i: u64) -> Result<S::Output, BoxError> {
        self.0.get(i)
    }
    fn key(&self, i: u64) -> Option<String> {
        Some(format!("file-{i}.bin"))
    }
}

#[test]
fn fail_policy_yields_the_error_once_then_stops() {
    let p = Pipeline::builder(Keyed(failing_source(&[42])))
        .batch_size(10)
        .min_task_samples(1)
        .collate(StackCollate::new().column::<Val>("v"))
        .build()
        .unwrap();
    let items: Vec<Result<Batch, SampleError>> = p.epoch(0).collect();
    assert_eq!(items.len(), 5, "four full batches, then the error");
    for b in &items[..4] {
        assert!(b.is_ok());
    }
    let err = items[4].as_ref().unwrap_err();
    assert_eq!(err.index, Some(42));
    assert_eq!(err.path.as_deref(), Some("file-42.bin"));
    assert_eq!(err.stage, "source");
    assert!(err.to_string().contains("cannot read item 42"));
    let s = p.last_summary().unwrap();
    assert!(!s.completed);
    // The pipeline is reusable after a failed epoch.
    assert_eq!(p.epoch(1).take(2).filter(|b| b.is_ok()).count(), 2);
}

#[test]
fn skip_policy_reports_every_skipped_sample() {
    let p = Pipeline::builder(Keyed(failing_source(&[3, 50, 99])))
        .map("bad_stage", |v: Val, _: &StageCtx| {
            if v.0 == 60 {
                Err("stage rejects 60".into())
            } else {
                Ok(v)
            }
        })
        .batch_size(8)
        .shuffle(true)
        .on_error(ErrorPolicy::Skip)
        .collate(StackCollate::new().column::<Val>("v"))
        .build()
        .unwrap();
    let mut it = p.epoch(0);
    let mut got: Vec<i64> = Vec::new();
    for b in it.by_ref() {
        got.extend(col(&b.unwrap()));
    }
    let s = it.summary().clone();
    drop(it);
    assert!(s.completed);
    assert_eq!(
        got.len() + s.skipped.len(),
        100,
        "delivered + skipped = total"
    );
    let mut skipped: Vec<u64> = s.skipped.iter().map(|e| e.index.unwrap()).collect();
    skipped.sort_unstable();
    assert_eq!(skipped, vec![3, 50, 60, 99]);
    let e60 = s.skipped.iter().find(|e| e.index == Some(60)).unwrap();
    assert_eq!(e60.stage, "bad_stage");
    assert_eq!(e60.path.as_deref(), Some("file-60.bin"));
}

#[test]
fn retry_recovers_transient_failures_and_counts_them() {
    let tries = Arc::new(AtomicUsize::new(0));
    let t2 = Arc::clone(&tries);
    let p = Pipeline::builder(vals(30))
        .map_with(
            "flaky",
            StageOptions::new().on_error(ErrorPolicy::Retry {
                attempts: 3,
                backoff: Duration::from_millis(1),
                then: ferrofeed_core::RetryThen::Fail,
            }),
            move |v: Val, ctx: &StageCtx| {
                t2.fetch_add(1, Ordering::Relaxed);
                // Every 5th sample fails on its first two attempts.
                if v.0 % 5 == 0 && ctx.attempt() < 2 {
                    Err(format!("transient failure on {}", v.0).into())
                } else {
                    Ok(v)
                }
            },
        )
        .batch_size(4)
        .collate(StackCollate::new().column::<Val>("v"))
        .build()
        .unwrap();
    let got = collect_all(&p, 0);
    assert_eq!(got, (0..30).collect::<Vec<_>>());
    let s = p.last_summary().unwrap();
    assert_eq!(s.retries, 12, "6 samples × 2 retries");
    assert_eq!(tries.load(Ordering::Relaxed), 30 + 12);
}

#[test]
fn retries_exhausted_then_skip() {
    let p = Pipeline::builder(vals(10))
        .map("never", |v: Val, _: &StageCtx| {
            if v.0 == 4 {
                Err("always broken".into())
            } else {
                Ok(v)
            }
        })
        .on_error("retry:2:skip".parse().unwrap())
        .batch_size(3)
        .collate(StackCollate::new().column::<Val>("v"))
        .build()
        .unwrap();
    let got = collect_all(&p, 0);
    assert_eq!(got.len(), 9);
    let s = p.last_summary().unwrap();
    assert_eq!(s.skipped.len(), 1);
    assert_eq!(s.skipped[0].attempts, 3);
    assert_eq!(s.retries, 2);
}

#[test]
fn a_panicking_stage_becomes_an_error_naming_it() {
    let p = Pipeline::builder(vals(50))
        .map("explodes", |v: Val, _: &StageCtx| {
            if v.0 == 17 {
                panic!("boom at 17");
            }
            Ok(v)
        })
        .batch_size(5)
        .collate(StackCollate::new().column::<Val>("v"))
        .build()
        .unwrap();
    let err = p.epoch(0).find_map(|b| b.err()).unwrap();
    assert_eq!(err.stage, "explodes");
    assert_eq!(err.index, Some(17));
    assert!(matches!(err.kind, ErrorKind::Panicked(ref m) if m.contains("boom at 17")));
    // Pool threads survived the panic.
    assert_eq!(p.epoch(1).filter(|b| b.is_err()).count(), 1);
}

#[test]
fn a_stage_that_blocks_forever_times_out_with_its_name() {
    let p = Pipeline::builder(vals(20))
        .map_with(
            "stuck",
            StageOptions::new()
                .workers(Parallelism::Fixed(2))
                .timeout(Duration::from_millis(100)),
            |v: Val, _: &StageCtx| {
                if v.0 == 9 {
                    // Blocks far longer than any test; the engine must not wait.
                    std::thread::sleep(Duration::from_secs(3600));
                }
                Ok(v)
            },
        )
        .batch_size(2)
        .min_task_samples(1)
        .collate(StackCollate::new().column::<Val>("v"))
        .build()
        .unwrap();
    let t = Instant::now();
    let err = p.epoch(0).find_map(|b| b.err()).unwrap();
    assert!(t.elapsed() < Duration::from_secs(5));
    assert_eq!(err.stage, "stuck");
    assert_eq!(err.index, Some(9));
    assert!(matches!(err.kind, ErrorKind::TimedOut(_)));
    // The stuck worker cannot be reclaimed: later epochs say so instead of hanging.
    let next = p.epoch(1).next().unwrap().unwrap_err();
    assert!(next.to_string().contains("stuck"), "{next}");
    let t = Instant::now();
    drop(p);
    assert!(t.elapsed() < Duration::from_secs(3));
}

#[test]
fn an_empty_source_gives_an_empty_epoch() {
    let p = Pipeline::builder(vals(0))
        .batch_size(4)
        .collate(StackCollate::new().column::<Val>("v"))
        .build()
        .unwrap();
    assert_eq!(p.epoch(0).count(), 0);
    assert!(p.last_summary().unwrap().completed);
}

#[test]
fn collate_errors_name_the_sample_and_skip_drops_only_it() {
    let p = Pipeline::builder(vals(12))
        .map("size", |v: Val, _: &StageCtx| {
            let n = if v.0 == 5 { 3 } else { 2 };
            Ok(Blob(vec![0; n]))
        })
        .batch_size(4)
        .on_error(ErrorPolicy::Skip)
        .collate(StackCollate::new().column::<Blob>("blob"))
        .build()
        .unwrap();
    let batches: Vec<Batch> = p.epoch(0).map(|b| b.unwrap()).collect();
    assert_eq!(batches.iter().map(|b| b.len()).sum::<usize>(), 11);
    let s = p.last_summary().unwrap();
    assert_eq!(s.skipped.len(), 1);
    assert_eq!(
        (s.skipped[0].index, s.skipped[0].stage.as_str()),
        (Some(5), "collate")
    );
}

#[test]
fn inspect_pulls_one_sample_through_every_stage() {
    let p = Pipeline::builder(Keyed(vals(50)))
        .map("double", |v: Val, _: &StageCtx| Ok(Val(v.0 * 2)))
        .batch_size(4)
        .collate(StackCollate::new().column::<Val>("v"))
        .build()
        .unwrap();
    let r = p.inspect(42, 0).unwrap();
    assert_eq!(r.path.as_deref(), Some("file-42.bin"));
    let names: Vec<&str> = r.steps.iter().map(|s| s.stage.as_str()).collect();
    assert_eq!(names, ["source", "double", "collate"]);
    assert!(r.steps[1].components[0].1.contains("84"));
    let past = p.inspect(50, 0).unwrap_err().to_string();
    assert!(past.contains("the dataset has 50 samples"), "{past}");
}

/// `inspect` runs the pipeline's own plan: a stage's own policy applies
/// (here a retry that succeeds on the second try), and a skip under the
/// pipeline's policy is the inspected sample's error, named by the stage.
#[test]
fn inspect_runs_each_stage_under_its_own_policy() {
    let tries = Arc::new(AtomicUsize::new(0));
    let t = Arc::clone(&tries);
    let p = Pipeline::builder(Keyed(vals(10)))
        .map_with(
            "flaky",
            StageOptions::new().on_error(ErrorPolicy::Retry {
                attempts: 2,
                backoff: Duration::from_millis(1),
                then: ferrofeed_core::RetryThen::Fail,
            }),
            move |v: Val, _: &StageCtx| {
                if t.fetch_add(1, Ordering::SeqCst) == 0 {
                    Err("transient".into())
                } else {
                    Ok(v)
                }
            },
        )
        .map("odd", |v: Val, _: &StageCtx| {
            if v.0 % 2 == 1 {
                Err("odd value".into())
            } else {
                Ok(v)
            }
        })
        .on_error(ErrorPolicy::Skip)
        .collate(StackCollate::new().column::<Val>("v"))
        .build()
        .unwrap();
    let r = p.inspect(4, 0).unwrap();
    assert_eq!(
        tries.load(Ordering::SeqCst),
        2,
        "retried once, as in an epoch"
    );
    assert_eq!(r.steps.len(), 4);
    let e = p.inspect(3, 0).unwrap_err();
    assert_eq!((e.index, e.stage.as_str()), (Some(3), "odd"));
    assert_eq!(e.path.as_deref(), Some("file-3.bin"));
}

/// Shards of consecutive numbers; shard 2 fails to open when asked.
struct Ranges {
    shards: usize,
    per: i64,
    broken: Option<usize>,
}
impl IterableSource for Ranges {
    type Output = Val;
    fn num_shards(&self) -> usize {
        self.shards
    }
    fn shard_key(&self, s: usize) -> String {
        format!("shard-{s}")
    }
    fn open(&self, s: usize) -> Result<ShardIter<Val>, BoxError> {
        if Some(s) == self.broken {
            return Err("shard unreadable".into());
        }
        let per = self.per;
        Ok(Box::new((0..per).map(move |i| Ok(Val(s as i64 * per + i)))))
    }
}

#[test]
fn iterable_sources_read_each_element_once_into_full_batches() {
    let mut first: Option<Vec<Vec<i64>>> = None;
    for workers in [1, 3, 8] {
        let p = Pipeline::builder_iterable(Ranges {
            shards: 7,
            per: 23,
            broken: None,
        })
        .map_with(
            "id",
            StageOptions::new().workers(Parallelism::Fixed(workers)),
            |v: Val, _: &StageCtx| Ok(v),
        )
        .batch_size(5)
        .collate(StackCollate::new().column::<Val>("v"))
        .build()
        .unwrap();
        let got: Vec<Vec<i64>> = p.epoch(0).map(|b| col(&b.unwrap())).collect();
        // Each shard ends in a part of 3: those fill batches together
        // instead of ending one each.
        let sizes: Vec<usize> = got.iter().map(Vec::len).collect();
        assert!(
            sizes[..sizes.len() - 1].iter().all(|&n| n == 5),
            "{sizes:?}"
        );
        assert_eq!(sizes.len(), (7 * 23usize).div_ceil(5));
        let mut all = got.concat();
        all.sort_unstable();
        assert_eq!(all, (0..7 * 23).collect::<Vec<_>>(), "workers {workers}");
        // The same batches whatever the worker count.
        match &first {
            None => first = Some(got),
            Some(f) => assert_eq!(&got, f, "workers {workers}"),
        }
    }
}

/// One shard read by one worker: the others take its parts as they are
/// read, and the batches are those of a single worker, in order.
#[test]
fn a_single_shard_keeps_every_worker_busy() {
    let build = |workers: usize, seen: Arc<std::sync::Mutex<std::collections::HashSet<String>>>| {
        Pipeline::builder_iterable(Ranges {
            shards: 1,
            per: 240,
            broken: None,
        })
        .map_with(
            "slow",
            StageOptions::new().workers(Parallelism::Fixed(workers)),
            move |v: Val, _: &StageCtx| {
                std::thread::sleep(Duration::from_micros(500));
                let name = std::thread::current().name().unwrap_or("").to_string();
                seen.lock().unwrap().insert(name);
                Ok(v)
            },
        )
        .batch_size(4)
        .collate(StackCollate::new().column::<Val>("v"))
        .build()
        .unwrap()
    };
    let seen = Arc::new(std::sync::Mutex::new(std::collections::HashSet::new()));
    let p = build(3, Arc::clone(&seen));
    for epoch in 0..3 {
        seen.lock().unwrap().clear();
        assert_eq!(collect_all(&p, epoch), (0..240).collect::<Vec<_>>());
        let workers = seen.lock().unwrap().len();
        assert!(
            workers >= 2,
            "epoch {epoch}: {workers} worker ran the stage"
        );
    }
    let one = Arc::new(std::sync::Mutex::new(std::collections::HashSet::new()));
    let single = build(1, Arc::clone(&one));
    assert_eq!(collect_all(&single, 0), collect_all(&p, 0));
    assert_eq!(one.lock().unwrap().len(), 1);
}

/// A sample failing in a part another worker took: `fail` stops the epoch
/// naming it, after the batches before it; `skip` drops only it.
#[test]
fn a_failure_in_a_handed_off_part_follows_the_policy() {
    let build = |policy: ErrorPolicy| {
        Pipeline::builder_iterable(Ranges {
            shards: 1,
            per: 200,
            broken: None,
        })
        .map_with(
            "slow",
            StageOptions::new().workers(Parallelism::Fixed(3)),
            |v: Val, _: &StageCtx| {
                std::thread::sleep(Duration::from_micros(300));
                if v.0 == 123 {
                    return Err::<Val, BoxError>("bad sample".into());
                }
                Ok(v)
            },
        )
        .batch_size(4)
        .on_error(policy)
        .collate(StackCollate::new().column::<Val>("v"))
        .build()
        .unwrap()
    };
    let p = build(ErrorPolicy::Fail);
    for epoch in 0..2 {
        let mut got = Vec::new();
        let mut err = None;
        for b in p.epoch(epoch) {
            match b {
                Ok(b) => got.extend(col(&b)),
                Err(e) => {
                    err = Some(e);
                    break;
                }
            }
        }
        assert_eq!(got, (0..120).collect::<Vec<_>>(), "epoch {epoch}");
        let e = err.expect("the failure is reported");
        assert_eq!(e.index, Some(123));
        assert_eq!(e.stage, "slow");
    }
    let p = build(ErrorPolicy::Skip);
    let got = collect_all(&p, 0);
    let want: Vec<i64> = (0..200).filter(|&v| v != 123).collect();
    assert_eq!(got, want);
    let s = p.last_summary().unwrap();
    assert_eq!(s.skipped.len(), 1);
    assert_eq!(s.skipped[0].index, Some(123));
}

#[test]
fn iterable_shard_errors_follow_the_policy() {
    let p = Pipeline::builder_iterable(Ranges {
        shards: 4,
        per: 10,
        broken: Some(2),
    })
    .batch_size(4)
    .on_error(ErrorPolicy::Skip)
    .collate(StackCollate::new().column::<Val>("v"))
    .build()
    .unwrap();
    let got = collect_all(&p, 0);
    assert_eq!(got.len(), 30);
    let s = p.last_summary().unwrap();
    assert_eq!(s.skipped.len(), 1);
    assert_eq!(s.skipped[0].path.as_deref(), Some("shard-2"));
}

#[test]
fn interleaved_shards_fill_batches_across_shards() {
    let build = |workers: usize, broken: Option<usize>, policy: ErrorPolicy| {
        Pipeline::builder_iterable(Ranges {
            shards: 10,
            per: 3,
            broken,
        })
        .map_with(
            "id",
            StageOptions::new().workers(Parallelism::Fixed(workers)),
            |v: Val, _: &StageCtx| Ok(v),
        )
        .interleave(4)
        .shuffle(true)
        .shuffle_buffer(5)
        .seed(11)
        .batch_size(8)
        .on_error(policy)
        .collate(StackCollate::new().column::<Val>("v"))
        .build()
        .unwrap()
    };
    let batches = |p: &Pipeline| -> Vec<Vec<i64>> {
        p.epoch(0)
            .map(|b| {
                b.unwrap()
                    .get("v")
                    .unwrap()
                    .as_slice::<i64>()
                    .unwrap()
                    .to_vec()
            })
            .collect()
    };
    let p = build(2, None, ErrorPolicy::Fail);
    let got = batches(&p);
    // Groups of 4, 4 and 2 shards: 12, 12 and 6 items → parts 8+4, 8+4, 6;
    // the short last parts fill batches together: 8, 8, 4+4, 6.
    let sizes: Vec<usize> = got.iter().map(Vec::len).collect();
    assert_eq!(sizes, [8, 8, 8, 6]);
    let shards_in_first: std::collections::HashSet<i64> = got[0].iter().map(|v| v / 3).collect();
    assert!(
        shards_in_first.len() >= 3,
        "a batch mixes shards: {:?}",
        got[0]
    );
    let mut all: Vec<i64> = got.concat();
    all.sort();
    assert_eq!(all, (0..30).collect::<Vec<_>>(), "every item once");
    for workers in [1, 5] {
        assert_eq!(
            batches(&build(workers, None, ErrorPolicy::Fail)),
            got,
            "workers {workers}"
        );
    }
    // Stopped after every number of batches and resumed: the rest, exactly
    // (also with a short part held back to fill the next batch).
    for k in 0..=got.len() {
        let mut it = p.epoch(0);
        for _ in 0..k {
            it.next().unwrap().unwrap();
        }
        let state = it.state();
        drop(it);
        let rest: Vec<Vec<i64>> = p
            .resume(&state)
            .unwrap()
            .map(|b| col(&b.unwrap()))
            .collect();
        assert_eq!(rest, got[k..], "resumed after {k} batches");
    }
    // A shard that cannot be opened is skipped and named; its group goes on.
    let p = build(2, Some(2), ErrorPolicy::Skip);
    let n: usize = batches(&p).iter().map(Vec::len).sum();
    assert_eq!(n, 27);
    assert_eq!(
        p.last_summary().unwrap().skipped[0].path.as_deref(),
        Some("shard-2")
    );
    let p = build(2, Some(2), ErrorPolicy::Fail);
    let e = p
        .epoch(0)
        .find_map(Result::err)
        .expect("the broken shard fails the epoch");
    assert!(e.to_string().contains("shard-2"), "{e}");
}

#[test]
fn settings_for_the_other_source_kind_are_refused_by_name() {
    let err = Pipeline::builder(vals(10))
        .shuffle_buffer(8)
        .collate(StackCollate::new().column::<Val>("v"))
        .build()
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("`shuffle_buffer`") && err.contains("map-style"),
        "{err}"
    );
    let err = Pipeline::builder(vals(10))
        .interleave(2)
        .collate(StackCollate::new().column::<Val>("v"))
        .build()
        .unwrap_err()
        .to_string();
    assert!(err.contains("`interleave`"), "{err}");
    let err = Pipeline::builder_iterable(Ranges {
        shards: 2,
        per: 3,
        broken: None,
    })
    .batch_sampler(ferrofeed_core::FixedBatches {
        order: Order::Sequential,
        batch_size: 2,
        drop_last: false,
    })
    .collate(StackCollate::new().column::<Val>("v"))
    .build()
    .unwrap_err()
    .to_string();
    assert!(
        err.contains("`batch_sampler`") && err.contains("iterable"),
        "{err}"
    );
    // A closure stage needs no annotation of its error type.
    let p = Pipeline::builder(vals(4))
        .map("inc", |v: Val, _: &StageCtx| Ok(Val(v.0 + 1)))
        .collate(StackCollate::new().column::<Val>("v"))
        .build()
        .unwrap();
    assert_eq!(collect_all(&p, 0), [1, 2, 3, 4]);
}
