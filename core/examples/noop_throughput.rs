//! Samples/s through three no-op stages, for profiling the engine:
//! `cargo run --release -p ferrofeed-core --example noop_throughput -- BATCH`.
use std::time::Instant;

use ferrofeed_core::prelude::*;

#[derive(Clone, Copy)]
struct Val(u64);
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
        out[0] = self.0 as i64;
    }
    fn same_shape(&self, _: &Self) -> bool {
        true
    }
}

fn main() {
    let batch: usize = std::env::args()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(64);
    let n: u64 = 2_000_000;
    let w = StageOptions::new().workers(Parallelism::Fixed(2));
    let p = Pipeline::builder(FnSource::new(n, |i| Ok(Val(i))))
        .map_with("a", w, |v: Val, _: &StageCtx| Ok(v))
        .map_with("b", w, |v: Val, _: &StageCtx| Ok(v))
        .map_with("c", w, |v: Val, _: &StageCtx| Ok(v))
        .batch_size(batch)
        .collate(StackCollate::new().column::<Val>("v"))
        .build()
        .expect("valid plan");
    for e in 0..3 {
        let t = Instant::now();
        let got: usize = p.epoch(e).map(|b| b.expect("no errors").len()).sum();
        let dt = t.elapsed().as_secs_f64();
        println!(
            "batch {batch}: {got} samples in {dt:.3} s = {:.2} M samples/s",
            got as f64 / dt / 1e6
        );
    }
}
