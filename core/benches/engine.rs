//! Engine overhead: samples/s through three no-op stages at batch 1 and 64
//! (with per-stage timing on, the default, and off — the cost of metrics),
//! beside one raw `flume` hop of the same items and the Rust peer
//! `dataloader-rs`, all with 2 workers, in one run.
//!
//! `cargo bench -p ferrofeed-core --bench engine`
use std::hint::black_box;

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use ferrofeed_core::prelude::*;

const N: u64 = 200_000;
const WORKERS: usize = 2;

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
}

fn ferrofeed(batch: usize, metrics: bool) -> Pipeline {
    let w = StageOptions::new().workers(Parallelism::Fixed(WORKERS));
    Pipeline::builder(FnSource::new(N, |i| Ok(Val(i))))
        .map_with("a", w, |v: Val, _: &StageCtx| Ok(v))
        .map_with("b", w, |v: Val, _: &StageCtx| Ok(v))
        .map_with("c", w, |v: Val, _: &StageCtx| Ok(v))
        .batch_size(batch)
        .metrics(metrics)
        .collate(StackCollate::new().column::<Val>("v"))
        .build()
        .expect("valid plan")
}

struct Ints(usize);
impl dataloader_rs::Dataset for Ints {
    type Item = u64;
    fn get(&self, index: usize) -> dataloader_rs::error::Result<u64> {
        Ok(index as u64)
    }
    fn len(&self) -> usize {
        self.0
    }
}

fn bench(c: &mut Criterion) {
    let mut g = c.benchmark_group("engine");
    g.throughput(Throughput::Elements(N));
    g.sample_size(10);
    g.measurement_time(std::time::Duration::from_secs(4));
    g.bench_function("flume_bounded_1024_one_hop", |b| {
        b.iter(|| {
            let (tx, rx) = flume::bounded::<u64>(1024);
            let h = std::thread::spawn(move || {
                for i in 0..N {
                    if tx.send(i).is_err() {
                        break;
                    }
                }
            });
            let mut s = 0u64;
            for v in rx.iter() {
                s = s.wrapping_add(v);
            }
            h.join().expect("sender thread");
            black_box(s)
        })
    });
    for batch in [1usize, 64] {
        for (name, metrics) in [
            ("ferrofeed_3_noop_stages", true),
            ("ferrofeed_no_timing", false),
        ] {
            let p = ferrofeed(batch, metrics);
            let mut epoch = 0;
            g.bench_with_input(BenchmarkId::new(name, batch), &batch, |b, _| {
                b.iter(|| {
                    epoch += 1;
                    let mut n = 0usize;
                    for batch in p.epoch(epoch) {
                        n += batch.expect("no errors").len();
                    }
                    assert_eq!(n as u64, N);
                    black_box(n)
                })
            });
        }
        let mut loader = dataloader_rs::DataLoader::builder(Ints(N as usize))
            .batch_size(batch)
            .num_workers(WORKERS)
            .build();
        g.bench_with_input(BenchmarkId::new("dataloader_rs", batch), &batch, |b, _| {
            b.iter(|| {
                let mut n = 0usize;
                for batch in &mut loader {
                    n += batch.expect("no errors").len();
                }
                assert_eq!(n as u64, N);
                black_box(n)
            })
        });
    }
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
