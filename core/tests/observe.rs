//! Observability: per-stage reports, and the soak test
//! that persistent pools do not leak (ignored by default: run it with
//! `cargo test --release -p ferrofeed-core --test observe -- --ignored`).
use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicIsize, Ordering};
use std::time::Duration;

use ferrofeed_core::prelude::*;

/// Counts the heap bytes live in this test binary: a leak shows up here
/// exactly, where RSS moves with the allocator's caching.
struct Counting;
static LIVE: AtomicIsize = AtomicIsize::new(0);
// SAFETY: forwards to the system allocator and only counts.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        LIVE.fetch_add(l.size() as isize, Ordering::Relaxed);
        System.alloc(l)
    }
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        LIVE.fetch_sub(l.size() as isize, Ordering::Relaxed);
        System.dealloc(p, l)
    }
}
#[global_allocator]
static A: Counting = Counting;

#[test]
fn stage_reports_name_the_busy_stage() {
    let p = Pipeline::builder(FnSource::new(200, |i| Ok(i as i64)))
        .map_with(
            "cheap",
            StageOptions::new().workers(Parallelism::Fixed(2)),
            |x: i64, _: &StageCtx| Ok(x),
        )
        .map_with(
            "costly",
            StageOptions::new().workers(Parallelism::Fixed(2)),
            |x: i64, _: &StageCtx| {
                std::thread::sleep(Duration::from_micros(300));
                Ok(x)
            },
        )
        .batch_size(8)
        .collate(StackCollate::new().column::<i64>("x"))
        .build()
        .unwrap();
    p.reset_metrics();
    assert_eq!(p.epoch(0).map(|b| b.unwrap().len()).sum::<usize>(), 200);
    let r = p.stage_reports();
    let get = |n: &str| r.iter().find(|s| s.name == n).unwrap().clone();
    assert_eq!(get("costly").samples, 200);
    assert!(get("costly").mean_ms >= 0.25, "{:?}", get("costly"));
    assert!(get("costly").busy_fraction > get("cheap").busy_fraction);
    assert_eq!(r.first().unwrap().name, "source");
    assert_eq!(r.last().unwrap().name, "collate");
    let b = p.bottleneck().unwrap();
    assert_eq!(b.stage, "costly", "{b:?}");
    assert!(b.advice.contains("costly"), "{}", b.advice);
}

#[test]
fn cpu_share_tells_a_waiting_stage_from_a_working_one() {
    let run = |spin: bool| {
        let p = Pipeline::builder(FnSource::new(300, |i| Ok(i as i64)))
            .map_with(
                "slow",
                StageOptions::new().workers(Parallelism::Fixed(2)),
                move |x: i64, _: &StageCtx| {
                    let t = std::time::Instant::now();
                    if spin {
                        while t.elapsed() < Duration::from_micros(500) {
                            std::hint::black_box(0);
                        }
                    } else {
                        std::thread::sleep(Duration::from_micros(500));
                    }
                    Ok(x)
                },
            )
            .batch_size(8)
            .collate(StackCollate::new().column::<i64>("x"))
            .build()
            .unwrap();
        p.reset_metrics();
        assert_eq!(p.epoch(0).count(), 38);
        let share = p
            .stage_reports()
            .iter()
            .find(|s| s.name == "slow")
            .and_then(|s| s.cpu_fraction)
            .expect("measured");
        (share, p.bottleneck().unwrap())
    };
    let (waiting, b) = run(false);
    assert!(
        waiting < 0.3,
        "a sleeping stage is mostly off-CPU: {waiting}"
    );
    assert_eq!(b.stage, "slow");
    assert!(b.advice.contains("more workers, not CPUs"), "{}", b.advice);
    let (working, b) = run(true);
    assert!(
        working > 0.6,
        "a spinning stage is mostly on a CPU: {working}"
    );
    assert!(b.advice.contains("give it more CPUs"), "{}", b.advice);
}

#[test]
fn a_slow_consumer_is_named_as_the_bottleneck() {
    let p = Pipeline::builder(FnSource::new(400, |i| Ok(i as i64)))
        .map_with(
            "fast",
            StageOptions::new().workers(Parallelism::Fixed(2)),
            |x: i64, _: &StageCtx| Ok(x),
        )
        .batch_size(4)
        .min_task_samples(1)
        .collate(StackCollate::new().column::<i64>("x"))
        .build()
        .unwrap();
    p.reset_metrics();
    for b in p.epoch(0) {
        b.unwrap();
        std::thread::sleep(Duration::from_millis(2));
    }
    let b = p.bottleneck().unwrap();
    assert_eq!(b.stage, "consumer", "{b:?}");
}

#[test]
fn queue_fill_is_reported_for_split_segments() {
    let p = Pipeline::builder(FnSource::new(300, |i| Ok(i as i64)))
        .map_with(
            "a",
            StageOptions::new().workers(Parallelism::Fixed(2)),
            |x: i64, _: &StageCtx| Ok(x),
        )
        .map_with(
            "b",
            StageOptions::new().workers(Parallelism::Fixed(1)),
            |x: i64, _: &StageCtx| {
                std::thread::sleep(Duration::from_micros(200));
                Ok(x)
            },
        )
        .batch_size(5)
        .min_task_samples(1)
        // A small budget keeps tasks to a batch or two, so the queue is
        // sampled many times.
        .max_bytes_in_flight(2000)
        .collate(StackCollate::new().column::<i64>("x"))
        .build()
        .unwrap();
    assert_eq!(p.epoch(0).count(), 60);
    let r = p.stage_reports();
    let fill = r
        .iter()
        .find(|s| s.name == "b")
        .unwrap()
        .input_queue_fill
        .unwrap();
    assert!(fill > 0.3, "the slow stage's input queue fills up: {fill}");
    assert!(r
        .iter()
        .find(|s| s.name == "a")
        .unwrap()
        .input_queue_fill
        .is_none());
}

#[test]
fn the_timeline_shows_queues_filling_over_time() {
    // Phase 1: a slow stage `b` behind a fast one — b's input queue is full.
    // Phase 2 (epoch 1): a slow consumer — the output queue is full.
    let p = Pipeline::builder(FnSource::new(600, |i| Ok(i as i64)))
        .map_with(
            "a",
            StageOptions::new().workers(Parallelism::Fixed(2)),
            |x: i64, _: &StageCtx| Ok(x),
        )
        .map_with(
            "b",
            StageOptions::new().workers(Parallelism::Fixed(1)),
            |x: i64, ctx: &StageCtx| {
                if ctx.epoch() == 0 {
                    std::thread::sleep(Duration::from_micros(800));
                }
                Ok(x)
            },
        )
        .batch_size(5)
        .min_task_samples(1)
        // Small tasks (a batch or two), so queues hold several.
        .max_bytes_in_flight(2000)
        .trace(100_000)
        .collate(StackCollate::new().column::<i64>("x"))
        .build()
        .unwrap();
    p.reset_metrics();
    assert_eq!(p.epoch(0).count(), 120);
    let first = p.timeline().points.len();
    for b in p.epoch(1) {
        b.unwrap();
        std::thread::sleep(Duration::from_millis(5));
    }
    let tl = p.timeline();
    assert_eq!(tl.queues, vec!["b".to_string()]);
    assert_eq!(tl.pools, vec!["a".to_string(), "b".to_string()]);
    assert!(first >= 3 && tl.points.len() >= first + 3, "{first} {tl:?}");
    let (slow_stage, slow_consumer) = tl.points.split_at(first);
    let mean = |v: Vec<f64>| v.iter().sum::<f64>() / v.len().max(1) as f64;
    let b_fill = mean(slow_stage.iter().map(|p| p.input_queue_fill[0]).collect());
    let out_then = mean(slow_stage.iter().map(|p| p.output_queue_fill).collect());
    let out_later = mean(
        slow_consumer[1..]
            .iter()
            .map(|p| p.output_queue_fill)
            .collect(),
    );
    assert!(
        b_fill > 0.5,
        "b's queue fills while b is slow: {b_fill} {tl:?}"
    );
    assert!(
        out_then < 0.3,
        "the consumer found little waiting: {out_then}"
    );
    assert!(
        out_later > 0.7,
        "batches wait for a slow consumer: {out_later}"
    );
    assert!(tl.points.iter().all(|p| p.workers == vec![2, 1]));
    assert!(slow_stage.iter().any(|p| p.samples_per_s > 0.0));
    assert!(tl.points.windows(2).all(|w| w[0].t_s < w[1].t_s));
    // The same points are counter tracks in the trace.
    let json = p.trace_json().unwrap();
    assert!(json.contains("\"ph\":\"C\"") && json.contains("queue fill"));
    // reset_metrics starts it afresh.
    p.reset_metrics();
    assert!(p.timeline().points.is_empty());
}

fn rss_kib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmRSS:"))
                .and_then(|l| l.split_whitespace().nth(1)?.parse().ok())
        })
        .unwrap_or(0)
}

#[test]
#[ignore]
fn soak_fifty_epochs_of_persistent_pools_do_not_grow_memory() {
    let p = Pipeline::builder(FnSource::new(20_000, |i| Ok(vec![i as u8; 2048])))
        .map_with(
            "touch",
            StageOptions::new().workers(Parallelism::Fixed(2)),
            |v: Vec<u8>, _: &StageCtx| Ok(v.iter().map(|x| x.wrapping_add(1)).collect::<Vec<u8>>()),
        )
        .batch_size(64)
        .shuffle(true)
        .collate(StackCollate::new().column::<Vec<u8>>("v"))
        .build()
        .unwrap();
    let mut rss = Vec::new();
    let mut live = Vec::new();
    for e in 0..50 {
        let n: usize = p.epoch(e).map(|b| b.unwrap().len()).sum();
        assert_eq!(n, 20_000);
        rss.push(rss_kib());
        live.push(LIVE.load(Ordering::Relaxed));
    }
    println!("RSS per epoch (KiB): {rss:?}");
    println!("live heap bytes per epoch: {live:?}");
    let (second, last) = (live[1] as f64, live[49] as f64);
    let growth = (last - second) / second;
    println!(
        "live heap after epoch 2: {second} B, after epoch 50: {last} B ({:+.2}%); RSS {} -> {} KiB",
        growth * 100.0,
        rss[1],
        rss[49]
    );
    assert!(
        growth <= 0.02,
        "live heap grew {:.2}% from epoch 2 to 50",
        growth * 100.0
    );
}
