//! Autotune against a grid search, in one run: two deliberately unbalanced
//! pipelines, each run with every hand-tuned worker split in a grid, with
//! the default (`Auto` stages fused on one pool of as many workers as CPUs)
//! and with `autotune(true)`; samples/s of each and autotune's share of the
//! best split.
//!
//! - `io`: `fetch` (300 µs blocked, like a remote read, + 20 µs CPU) →
//!   `decode` (200 µs CPU) → `augment` (50 µs CPU).
//! - `cpu`: `heavy` (200 µs CPU) → `light` (50 µs CPU).
//!
//! Each setting: one warm-up epoch, then the best of 2 measured epochs.
//! Autotune starts from one worker per stage in a fresh pipeline; its first
//! epoch (tuning included) is printed too.
//!
//! `cargo bench -p ferrofeed-core --bench autotune`
use std::hint::black_box;
use std::time::{Duration, Instant};

use ferrofeed_core::prelude::*;

const N: u64 = 4000;

fn spin(d: Duration) {
    let t = Instant::now();
    while t.elapsed() < d {
        black_box(0);
    }
}

/// `(name, CPU µs, blocked µs)` per stage.
type Spec = &'static [(&'static str, u64, u64)];

const IO: Spec = &[("fetch", 20, 300), ("decode", 200, 0), ("augment", 50, 0)];
const CPU: Spec = &[("heavy", 200, 0), ("light", 50, 0)];

fn build(spec: Spec, workers: Option<&[usize]>, autotune: bool) -> Pipeline {
    let mut b = Pipeline::builder(FnSource::new(N, |i| Ok(i as i64))).batch_size(32);
    for (k, &(name, cpu, blocked)) in spec.iter().enumerate() {
        let p = match workers {
            Some(w) => Parallelism::Fixed(w[k]),
            None => Parallelism::Auto,
        };
        b = b.map_with(
            name,
            StageOptions::new().workers(p),
            move |x: i64, _: &StageCtx| {
                if blocked > 0 {
                    std::thread::sleep(Duration::from_micros(blocked));
                }
                spin(Duration::from_micros(cpu));
                Ok(x)
            },
        );
    }
    b.autotune(autotune)
        .collate(StackCollate::new().column::<i64>("x"))
        .build()
        .expect("valid plan")
}

fn epoch_rate(p: &Pipeline, epoch: u64) -> f64 {
    let t = Instant::now();
    let n: usize = p.epoch(epoch).map(|b| b.expect("no errors").len()).sum();
    assert_eq!(n as u64, N);
    n as f64 / t.elapsed().as_secs_f64()
}

fn measure(p: &Pipeline) -> f64 {
    epoch_rate(p, 0);
    epoch_rate(p, 1).max(epoch_rate(p, 2))
}

fn grid(spec: Spec, cpus: usize) -> Vec<Vec<usize>> {
    let choices: Vec<Vec<usize>> = spec
        .iter()
        .map(|&(_, _, blocked)| {
            if blocked > 0 {
                vec![1, 2, 3, 4, 6, 8]
            } else {
                (1..=cpus + 1).collect()
            }
        })
        .collect();
    let mut out = vec![Vec::new()];
    for c in choices {
        out = out
            .into_iter()
            .flat_map(|prefix| {
                c.iter().map(move |&w| {
                    let mut v = prefix.clone();
                    v.push(w);
                    v
                })
            })
            .collect();
    }
    out
}

fn scenario(name: &str, spec: Spec, cpus: usize) {
    println!("\n== {name}: {spec:?} (name, CPU µs, blocked µs), {cpus} CPUs, {N} samples");
    let mut best = (0.0, Vec::new());
    for w in grid(spec, cpus) {
        let r = measure(&build(spec, Some(&w), false));
        println!("  grid {w:?}: {r:8.0} samples/s");
        if r > best.0 {
            best = (r, w);
        }
    }
    let fused = measure(&build(spec, None, false));
    let tuned = build(spec, None, true);
    let first = epoch_rate(&tuned, 0);
    let steady = epoch_rate(&tuned, 1).max(epoch_rate(&tuned, 2));
    let chosen: Vec<usize> = tuned.workers().iter().skip(1).map(|w| w.1).collect();
    if std::env::var_os("AUTOTUNE_LOG").is_some() {
        for step in tuned.autotune_log() {
            println!("    {step:?}");
        }
    }
    println!("  default (fused on {cpus}):  {fused:8.0} samples/s");
    println!(
        "  autotune: first epoch {first:.0}, then {steady:.0} samples/s with {chosen:?} ({} changes)",
        tuned.autotune_log().len()
    );
    println!(
        "  {name}: best grid {:?} {:.0}/s; autotune {:.0}/s = {:.0}% of it (first epoch {:.0}%); default {:.0}%",
        best.1,
        best.0,
        steady,
        100.0 * steady / best.0,
        100.0 * first / best.0,
        100.0 * fused / best.0
    );
}

fn main() {
    // `cargo bench` passes `--bench`; a filter argument picks a scenario.
    let filter: Option<String> = std::env::args().skip(1).find(|a| !a.starts_with('-'));
    let cpus = ferrofeed_core::available_cpus();
    for (name, spec) in [("io", IO), ("cpu", CPU)] {
        if filter.as_deref().is_none_or(|f| name.contains(f)) {
            scenario(name, spec, cpus);
        }
    }
}
