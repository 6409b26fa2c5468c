//! Stress: 8 pipelines sharing one source, run concurrently on however few
//! cores there are, for `FERROFEED_STRESS_SECONDS` (default 120). A watchdog
//! fails the test if no pipeline delivers a batch for 30 s (a deadlock);
//! every pipeline's peak bytes in flight must stay within its budget plus
//! one task (the task the consumer needs next is always admitted).
//! Ignored by default: `bash bench/stress.sh` runs it.
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use ferrofeed::core::prelude::*;

/// A sample of `n` bytes (its size drives the byte budget).
#[derive(Clone)]
struct Blob(Vec<u8>);
impl Component for Blob {
    fn nbytes(&self) -> usize {
        self.0.len()
    }
}
impl Collatable for Blob {
    type Elem = u8;
    fn shape(&self) -> Vec<usize> {
        vec![self.0.len()]
    }
    fn write(&self, out: &mut [u8]) {
        out.copy_from_slice(&self.0);
    }
}

#[test]
#[ignore = "minutes long; run by bench/stress.sh"]
fn eight_pipelines_share_a_source_without_deadlock_within_budget() {
    let seconds: u64 = std::env::var("FERROFEED_STRESS_SECONDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(120);
    const SAMPLE: usize = 16 << 10;
    let source = Arc::new(FnSource::new(20_000, |i| {
        Ok(Blob(vec![(i % 251) as u8; SAMPLE]))
    }));
    let progress = Arc::new(AtomicU64::new(0));
    let deadline = Instant::now() + Duration::from_secs(seconds);
    let mut handles = Vec::new();
    for k in 0..8u64 {
        let source = Arc::clone(&source);
        let progress = Arc::clone(&progress);
        handles.push(std::thread::spawn(move || {
            let budget = (2 + k as usize % 3) << 20;
            let p = Pipeline::builder(source)
                .map_with(
                    "work",
                    StageOptions::new().workers(Parallelism::Fixed(1 + k as usize % 3)),
                    move |b: Blob, ctx: &StageCtx| {
                        // Uneven work, some of it slow.
                        if ctx.index() % 97 == k {
                            std::thread::sleep(Duration::from_millis(2));
                        }
                        Ok(Blob(b.0.iter().map(|x| x.wrapping_add(1)).collect()))
                    },
                )
                .batch_size(16 + 8 * k as usize)
                .seed(k)
                .max_bytes_in_flight(budget)
                .unordered()
                .collate(StackCollate::new().column::<Blob>("x"))
                .build()
                .expect("pipeline");
            let mut epoch = 0;
            let mut max_task = 0usize;
            while Instant::now() < deadline {
                for b in p.epoch(epoch) {
                    let b = b.expect("no errors");
                    max_task = max_task.max(b.nbytes());
                    progress.fetch_add(1, Ordering::Relaxed);
                    if Instant::now() >= deadline {
                        break;
                    }
                }
                epoch += 1;
            }
            let peak = p.budget().peak();
            // Tasks span a few batches: allow the budget plus a few batches.
            assert!(
                peak <= budget + 8 * max_task,
                "pipeline {k}: peak {peak} bytes over budget {budget} (+{max_task} per batch)"
            );
            (k, epoch, peak, budget)
        }));
    }
    let mut last = 0;
    let mut still = Instant::now();
    while handles.iter().any(|h| !h.is_finished()) {
        std::thread::sleep(Duration::from_millis(200));
        let now = progress.load(Ordering::Relaxed);
        if now != last {
            last = now;
            still = Instant::now();
        }
        assert!(
            still.elapsed() < Duration::from_secs(30),
            "no batch for 30 s: deadlock ({now} batches so far)"
        );
    }
    for h in handles {
        let (k, epochs, peak, budget) = h.join().expect("a pipeline thread panicked");
        eprintln!(
            "pipeline {k}: {epochs} epochs, peak {:.1} MiB of a {:.0} MiB budget",
            peak as f64 / 1048576.0,
            budget as f64 / 1048576.0
        );
    }
    eprintln!("{last} batches in {seconds} s");
}
