//! An unbalanced pipeline (stage `heavy` costs 4× stage `light`), run with
//! every hand-tuned split of workers between the two stages and with
//! `Parallelism::Auto`, in one run: samples/s of each.
//! `cargo run --release -p ferrofeed-core --example autotune_grid`
use std::hint::black_box;
use std::time::{Duration, Instant};

use ferrofeed_core::prelude::*;

fn spin(d: Duration) {
    let t = Instant::now();
    while t.elapsed() < d {
        black_box(0);
    }
}

fn run(heavy: Parallelism, light: Parallelism) -> f64 {
    let p = Pipeline::builder(FnSource::new(4000, |i| Ok(i as i64)))
        .map_with(
            "heavy",
            StageOptions::new().workers(heavy),
            |x: i64, _: &StageCtx| {
                spin(Duration::from_micros(200));
                Ok::<_, BoxError>(x)
            },
        )
        .map_with(
            "light",
            StageOptions::new().workers(light),
            |x: i64, _: &StageCtx| {
                spin(Duration::from_micros(50));
                Ok::<_, BoxError>(x)
            },
        )
        .batch_size(32)
        .collate(StackCollate::new().column::<i64>("x"))
        .build()
        .expect("valid plan");
    let _ = p.epoch(0).count();
    let t = Instant::now();
    let n: usize = p.epoch(1).map(|b| b.expect("no errors").len()).sum();
    n as f64 / t.elapsed().as_secs_f64()
}

fn main() {
    let cpus = ferrofeed_core::builder::available_cpus();
    let mut best = (0.0, 0, 0);
    for h in 1..=cpus {
        for l in 1..=cpus {
            let r = run(Parallelism::Fixed(h), Parallelism::Fixed(l));
            println!("heavy {h} workers, light {l} workers: {r:8.0} samples/s");
            if r > best.0 {
                best = (r, h, l);
            }
        }
    }
    let auto = run(Parallelism::Auto, Parallelism::Auto);
    println!("Auto (both stages fused on {cpus} workers): {auto:8.0} samples/s");
    println!(
        "best hand-tuned: heavy {} / light {} at {:.0} samples/s; Auto reaches {:.0}% of it",
        best.1,
        best.2,
        best.0,
        100.0 * auto / best.0
    );
}
