//! Online worker tuning (tf.data's AUTOTUNE, bounded): with
//! [`PipelineBuilder::autotune`](crate::PipelineBuilder::autotune), every
//! stage left at [`Parallelism::Auto`](crate::Parallelism::Auto) runs in its
//! own pool whose *active* worker count a tuner thread sets while the
//! pipeline runs.
//!
//! Each worker measures, per task, its wall time and — from the kernel's
//! per-thread `schedstat` — the time it spent on a CPU and waiting for one.
//! What is left is time blocked (I/O, sleeps, locks). Per stage that gives a
//! CPU cost and a blocked cost per sample; the model is
//!
//! ```text
//! samples/s = min( CPUs / Σ cpu_cost ,  min over stages of workers / (cpu_cost + blocked_cost) )
//! ```
//!
//! and the tuner gives workers, one at a time, to the stage that limits this
//! rate until another worker would not raise it (the CPUs are the limit) or
//! the thread cap is reached. It re-measures every interval and applies a new
//! split only when the model predicts ≥ 3% more throughput, or the same with
//! fewer threads — so costs that drift are followed and noise is not.
//! Workers taken away park (they finish the task in hand first); the byte
//! budget still bounds what is in flight, whatever the split.
//!
//! ```
//! use ferrofeed_core::prelude::*;
//! let p = Pipeline::builder(FnSource::new(2000, |i| Ok(i as i64)))
//!     .map("fetch", |x: i64, _: &StageCtx| {
//!         std::thread::sleep(std::time::Duration::from_micros(50)); // I/O-like
//!         Ok(x)
//!     })
//!     .map("work", |x: i64, _: &StageCtx| Ok(x * 2))
//!     .batch_size(16)
//!     .autotune(true)
//!     .collate(StackCollate::new().column::<i64>("x"))
//!     .build()
//!     .unwrap();
//! let n: usize = p.epoch(0).map(|b| b.unwrap().len()).sum();
//! assert_eq!(n, 2000);
//! // The split the tuner chose, per stage.
//! assert!(p.workers().iter().all(|(_, w)| *w >= 1));
//! ```
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

/// One stage pool as the tuner models it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct SegModel {
    /// CPU time per sample, ns.
    pub cpu_ns: f64,
    /// Blocked (off-CPU, not runnable) time per sample, ns.
    pub blocked_ns: f64,
    /// Threads the pool has (the most it may use).
    pub max: usize,
    /// Whether the tuner may change its count.
    pub tuned: bool,
}

/// Safety margin on measured blocked time when sizing (blocked time varies
/// more than CPU time, and CPU-bound pools are held back by the CPU limit
/// anyway, so they are not oversubscribed).
const MARGIN: f64 = 1.1;

/// Samples/s the CPUs allow: all of them on the pools' CPU work.
fn cpu_limit(cpus: f64, segs: &[SegModel]) -> f64 {
    let total_cpu: f64 = segs.iter().map(|s| s.cpu_ns).sum();
    if total_cpu > 0.0 {
        cpus * 1e9 / total_cpu
    } else {
        f64::INFINITY
    }
}

/// Samples/s one pool's `n` workers allow, with `margin` on blocked time.
fn pool_rate(s: &SegModel, n: usize, margin: f64) -> f64 {
    let per = s.cpu_ns + s.blocked_ns * margin;
    if per > 0.0 {
        n as f64 * 1e9 / per
    } else {
        f64::INFINITY
    }
}

/// Samples/s the model predicts for worker counts `w`.
pub(crate) fn predicted_rate(cpus: f64, segs: &[SegModel], w: &[usize], margin: f64) -> f64 {
    segs.iter()
        .zip(w)
        .map(|(s, &n)| pool_rate(s, n, margin))
        .fold(cpu_limit(cpus, segs), f64::min)
}

/// The smallest split that reaches the model's best rate: start at one
/// worker per tuned pool, then give one more to every pool that limits the
/// rate (several may tie) until the CPUs are the limit, a limiting pool is
/// untuned or full, or the thread cap is reached. `fixed` holds the counts
/// of untuned pools.
pub(crate) fn propose(
    cpus: f64,
    segs: &[SegModel],
    fixed: &[usize],
    max_total: usize,
) -> Vec<usize> {
    let mut w: Vec<usize> = segs
        .iter()
        .zip(fixed)
        .map(|(s, &f)| if s.tuned { 1 } else { f })
        .collect();
    let cpu_limit = cpu_limit(cpus, segs);
    loop {
        let x = predicted_rate(cpus, segs, &w, MARGIN);
        if !x.is_finite() || x >= cpu_limit * (1.0 - 1e-9) {
            break;
        }
        let limiting: Vec<usize> = (0..segs.len())
            .filter(|&i| pool_rate(&segs[i], w[i], MARGIN) <= x * (1.0 + 1e-9))
            .collect();
        let stuck = limiting
            .iter()
            .any(|&i| !segs[i].tuned || w[i] >= segs[i].max);
        if limiting.is_empty() || stuck || w.iter().sum::<usize>() + limiting.len() > max_total {
            break;
        }
        for i in limiting {
            w[i] += 1;
        }
    }
    w
}

/// Whether to move from `current` to `proposal`: ≥ 3% more predicted
/// throughput, or as much with fewer threads.
pub(crate) fn worth_applying(
    cpus: f64,
    segs: &[SegModel],
    current: &[usize],
    proposal: &[usize],
) -> bool {
    if current == proposal {
        return false;
    }
    let now = predicted_rate(cpus, segs, current, 1.0);
    let next = predicted_rate(cpus, segs, proposal, 1.0);
    let fewer = proposal.iter().sum::<usize>() < current.iter().sum::<usize>();
    next > now * 1.03 || (fewer && next >= now * 0.99)
}

/// Per-pool counters the workers add to and the tuner drains, plus running
/// totals for the reports (cleared by `reset`).
#[derive(Debug, Default)]
pub(crate) struct SegMeter {
    pub samples: AtomicU64,
    pub wall_ns: AtomicU64,
    pub cpu_ns: AtomicU64,
    pub runq_ns: AtomicU64,
    pub total_wall_ns: AtomicU64,
    /// On a CPU or runnable (waiting for one).
    pub total_cpu_ns: AtomicU64,
}

impl SegMeter {
    /// Share of the pool's working time spent on a CPU or waiting for one
    /// (not blocked) since the last reset (`None` before any task).
    pub(crate) fn cpu_share(&self) -> Option<f64> {
        let wall = self.total_wall_ns.load(Ordering::Relaxed);
        (wall > 0).then(|| self.total_cpu_ns.load(Ordering::Relaxed) as f64 / wall as f64)
    }
    pub(crate) fn reset_totals(&self) {
        self.total_wall_ns.store(0, Ordering::Relaxed);
        self.total_cpu_ns.store(0, Ordering::Relaxed);
    }

    /// Takes the counts since the last call: `(samples, wall, cpu, runq)`.
    pub(crate) fn drain(&self) -> (u64, u64, u64, u64) {
        (
            self.samples.swap(0, Ordering::Relaxed),
            self.wall_ns.swap(0, Ordering::Relaxed),
            self.cpu_ns.swap(0, Ordering::Relaxed),
            self.runq_ns.swap(0, Ordering::Relaxed),
        )
    }
}

/// The calling thread's CPU and run-queue time, from
/// `/proc/thread-self/schedstat`. Open it on the thread it measures.
pub(crate) struct ThreadClock {
    file: Option<File>,
}

impl ThreadClock {
    pub(crate) fn open() -> ThreadClock {
        ThreadClock {
            file: File::open("/proc/thread-self/schedstat").ok(),
        }
    }

    /// `(cpu ns, runqueue ns)`; `None` where the kernel does not say (the
    /// tuner then counts the whole wall time as CPU time).
    pub(crate) fn read(&self) -> Option<(u64, u64)> {
        let f = self.file.as_ref()?;
        let mut buf = [0u8; 96];
        let n = f.read_at(&mut buf, 0).ok()?;
        let text = std::str::from_utf8(&buf[..n]).ok()?;
        let mut it = text.split_ascii_whitespace();
        let cpu = it.next()?.parse().ok()?;
        let runq = it.next()?.parse().ok()?;
        Some((cpu, runq))
    }
}

/// A worker's open measurement of one task.
pub(crate) struct TaskMeter {
    clock: ThreadClock,
    start: Option<(Instant, Option<(u64, u64)>)>,
}

impl TaskMeter {
    pub(crate) fn new() -> TaskMeter {
        TaskMeter {
            clock: ThreadClock::open(),
            start: None,
        }
    }
    pub(crate) fn begin(&mut self) {
        self.start = Some((Instant::now(), self.clock.read()));
    }
    /// Closes the measurement begun last, adding it to `meter`.
    pub(crate) fn end(&mut self, meter: &SegMeter, samples: u64) {
        let Some((t0, c0)) = self.start.take() else {
            return;
        };
        let wall = t0.elapsed().as_nanos() as u64;
        let (cpu, runq) = match (c0, self.clock.read()) {
            (Some((c0, r0)), Some((c1, r1))) => (c1.saturating_sub(c0), r1.saturating_sub(r0)),
            _ => (wall, 0),
        };
        meter.samples.fetch_add(samples, Ordering::Relaxed);
        meter.wall_ns.fetch_add(wall, Ordering::Relaxed);
        meter.cpu_ns.fetch_add(cpu.min(wall), Ordering::Relaxed);
        meter.runq_ns.fetch_add(runq.min(wall), Ordering::Relaxed);
        meter.total_wall_ns.fetch_add(wall, Ordering::Relaxed);
        meter
            .total_cpu_ns
            .fetch_add((cpu + runq).min(wall), Ordering::Relaxed);
    }
}

/// One change the tuner made.
#[derive(Debug, Clone, PartialEq)]
pub struct TuneStep {
    /// Seconds since the pipeline was built.
    pub at_s: f64,
    /// `(stage name, active workers)` after the change.
    pub workers: Vec<(String, usize)>,
    /// What the model predicts for the new split, samples/s.
    pub predicted_per_s: f64,
    /// The measured costs behind it, per pool: `(stages, CPU µs per sample,
    /// blocked µs per sample)`.
    pub costs: Vec<(String, f64, f64)>,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cpu(ns: f64, max: usize) -> SegModel {
        blocked(ns, 0.0, max)
    }

    fn blocked(cpu_ns: f64, blocked_ns: f64, max: usize) -> SegModel {
        SegModel {
            cpu_ns,
            blocked_ns,
            max,
            tuned: true,
        }
    }

    #[test]
    fn cpu_bound_stages_get_the_cpus_in_proportion() {
        // 200 µs + 50 µs of CPU on 2 CPUs: 8,000/s at best; the heavy stage
        // needs 2 workers for it, the light one 1.
        let segs = [cpu(200e3, 8), cpu(50e3, 8)];
        let w = propose(2.0, &segs, &[0, 0], 64);
        assert_eq!(w, vec![2, 1]);
        let x = predicted_rate(2.0, &segs, &w, 1.0);
        assert!((x - 8000.0).abs() < 1.0, "{x}");
    }

    #[test]
    fn a_blocked_stage_gets_threads_beyond_the_cpus() {
        // 20 µs CPU + 400 µs blocked per sample, then 200 + 50 µs of CPU:
        // 2 CPUs give 7,407/s, which needs ≥ 3.1 fetch workers (4 with margin).
        let fetch = blocked(20e3, 400e3, 16);
        let segs = [fetch, cpu(200e3, 8), cpu(50e3, 8)];
        let w = propose(2.0, &segs, &[0, 0, 0], 64);
        assert_eq!(w, vec![4, 2, 1]);
    }

    #[test]
    fn a_pool_that_ties_with_the_limit_grows_with_it() {
        // Measured in a run: fetch 34 µs CPU + 357 µs blocked, decode 187 µs,
        // augment 43 µs, on 2 CPUs (7,575/s at best). At [2, 1, 1] fetch
        // (with its margin) and decode both sit near 5,000/s.
        let fetch = blocked(34e3, 357e3, 16);
        let segs = [fetch, cpu(187e3, 8), cpu(43e3, 8)];
        let w = propose(2.0, &segs, &[0, 0, 0], 64);
        assert_eq!(w, vec![4, 2, 1]);
        let x = predicted_rate(2.0, &segs, &w, 1.0);
        assert!(x > 7500.0, "{x}");
    }

    #[test]
    fn caps_hold() {
        let fetch = blocked(1e3, 1e6, 3);
        assert_eq!(propose(2.0, &[fetch], &[0], 64), vec![3]);
        let fetch = SegModel { max: 100, ..fetch };
        assert_eq!(propose(2.0, &[fetch, cpu(1e3, 4)], &[0, 0], 10), vec![9, 1]);
    }

    #[test]
    fn an_untuned_pool_keeps_its_count_and_can_be_the_limit() {
        let fixed = SegModel {
            tuned: false,
            ..cpu(100e3, 1)
        };
        // The fixed single worker caps the rate at 10,000/s; the tuned
        // stage gets no more workers than that needs.
        let w = propose(4.0, &[cpu(150e3, 8), fixed], &[0, 1], 64);
        assert_eq!(w, vec![2, 1]);
        // Already as fast as the fixed pool: nothing to add.
        let w = propose(4.0, &[cpu(80e3, 8), fixed], &[0, 1], 64);
        assert_eq!(w, vec![1, 1]);
    }

    #[test]
    fn hysteresis() {
        let segs = [cpu(200e3, 8), cpu(50e3, 8)];
        assert!(!worth_applying(2.0, &segs, &[2, 1], &[2, 1]));
        // Fewer threads for the same rate: yes.
        assert!(worth_applying(2.0, &segs, &[3, 2], &[2, 1]));
        // From a starved split: yes.
        assert!(worth_applying(2.0, &segs, &[1, 1], &[2, 1]));
        // More threads for < 3%: no.
        let segs = [cpu(100e3, 8), cpu(101e3, 8)];
        assert!(!worth_applying(1.0, &segs, &[1, 1], &[2, 2]));
    }

    #[test]
    fn the_thread_clock_counts_cpu_time() {
        let meter = SegMeter::default();
        let mut t = TaskMeter::new();
        t.begin();
        let start = Instant::now();
        let c0 = t.clock.read();
        // Busy until the thread has run 20 ms (by its own clock, so a
        // loaded machine only makes it take longer), then asleep 20 ms.
        let ran = |t: &TaskMeter| match (c0, t.clock.read()) {
            (Some((a, _)), Some((b, _))) => b.saturating_sub(a),
            _ => start.elapsed().as_nanos() as u64,
        };
        let mut x = 0u64;
        while ran(&t) < 20_000_000 {
            x = std::hint::black_box(x.wrapping_add(1));
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
        t.end(&meter, 5);
        let (n, wall, cpu, _) = meter.drain();
        assert_eq!(n, 5);
        assert!(wall >= 40_000_000, "{wall}");
        if c0.is_some() {
            // The 20 ms run count, the 20 ms asleep do not.
            assert!(
                cpu >= 20_000_000 && cpu < wall - 15_000_000,
                "{cpu} of {wall}"
            );
        }
        assert_eq!(meter.drain(), (0, 0, 0, 0));
    }
}
