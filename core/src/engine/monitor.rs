//! The monitor thread: every 100 ms a timeline point (queue fill, bytes in
//! flight, throughput, workers) and, with autotune, a tuner step that moves
//! workers between pools by their measured CPU and blocked time.
//!
//! ```text
//! monitor: sample_timeline() every 100 ms; tune_step() every autotune_interval
//! ```

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::engine::{pool_label, Shared};
use crate::sync::LockExt;

/// The pipeline's monitor thread: adds a timeline point when one is due and,
/// under autotune, runs the tuner every interval.
pub(crate) fn monitor_main(shared: Arc<Shared>, stop: flume::Receiver<()>) {
    let tuned = shared.segments.iter().any(|s| s.tuned);
    let mut est: Vec<Option<(f64, f64)>> = vec![None; shared.segments.len()];
    // The tuner's first look comes early so a fresh pool leaves its single
    // worker soon.
    let mut next_tune = Instant::now() + shared.cfg.tuning.interval.min(Duration::from_millis(20));
    loop {
        let now_ns = shared.t0.elapsed().as_nanos() as u64;
        let due_ns = shared.timeline_next_ns.load(Ordering::Relaxed);
        let mut wait = Duration::from_nanos(due_ns.saturating_sub(now_ns));
        if tuned {
            wait = wait.min(next_tune.saturating_duration_since(Instant::now()));
        }
        if !matches!(
            stop.recv_timeout(wait),
            Err(flume::RecvTimeoutError::Timeout)
        ) {
            return;
        }
        if shared.cfg.recording.metrics
            && shared.t0.elapsed().as_nanos() as u64
                >= shared.timeline_next_ns.load(Ordering::Relaxed)
        {
            shared.sample_timeline();
        }
        if tuned && Instant::now() >= next_tune {
            next_tune = Instant::now() + shared.cfg.tuning.interval;
            tune_step(&shared, &mut est);
        }
    }
}

/// One look of the autotuner: turns each pool's measured costs into a model
/// and applies the split it proposes (see [`crate::autotune`]).
pub(crate) fn tune_step(shared: &Shared, est: &mut [Option<(f64, f64)>]) {
    use crate::autotune::{propose, worth_applying, SegModel, TuneStep};
    let n = shared.segments.len();
    for (s, e) in est.iter_mut().enumerate() {
        let meter = &shared.meters[s];
        // Too little seen yet: keep counting.
        if meter.samples.load(Ordering::Relaxed) < 4
            && meter.wall_ns.load(Ordering::Relaxed) < 2_000_000
        {
            continue;
        }
        let (k, wall, cpu, runq) = meter.drain();
        if k == 0 {
            continue;
        }
        let c = cpu as f64 / k as f64;
        let b = wall.saturating_sub(cpu + runq) as f64 / k as f64;
        *e = Some(match *e {
            Some((c0, b0)) => (0.5 * c0 + 0.5 * c, 0.5 * b0 + 0.5 * b),
            None => (c, b),
        });
    }
    let segs: Vec<SegModel> = shared
        .segments
        .iter()
        .zip(est.iter())
        .map(|(seg, e)| {
            let (cpu_ns, blocked_ns) = e.unwrap_or((0.0, 0.0));
            SegModel {
                cpu_ns,
                blocked_ns,
                max: seg.workers,
                tuned: seg.tuned,
            }
        })
        .collect();
    if shared
        .segments
        .iter()
        .zip(est.iter())
        .any(|(seg, e)| seg.tuned && e.is_none())
    {
        return;
    }
    let current: Vec<usize> = (0..n).map(|s| shared.active(s)).collect();
    let cpus = shared.cfg.cpus as f64;
    let max_total = shared.segments.iter().map(|s| s.workers).sum();
    let proposal = propose(cpus, &segs, &current, max_total);
    if !worth_applying(cpus, &segs, &current, &proposal) {
        return;
    }
    for (s, &w) in proposal.iter().enumerate() {
        shared.active[s].store(w, Ordering::Release);
    }
    {
        let _guard = shared.park.0.lock_unpoisoned();
        shared.park.1.notify_all();
    }
    let workers = shared.stage_workers(|s| proposal[s]);
    let predicted = crate::autotune::predicted_rate(cpus, &segs, &proposal, 1.0);
    tracing::debug!(?workers, predicted, "ferrofeed: autotune");
    let mut log = shared.tune_log.lock_unpoisoned();
    if log.len() == 256 {
        log.pop_front();
    }
    log.push_back(TuneStep {
        at_s: shared.t0.elapsed().as_secs_f64(),
        workers,
        predicted_per_s: predicted,
        costs: shared
            .segments
            .iter()
            .zip(&segs)
            .map(|(seg, m)| {
                (
                    pool_label(&shared.stages, seg),
                    m.cpu_ns / 1e3,
                    m.blocked_ns / 1e3,
                )
            })
            .collect(),
    });
}
