//! The pipeline's reports: per-stage figures, the bottleneck and its advice,
//! the timeline, the trace, and the last epoch's summary.
//!
//! ```
//! use ferrofeed_core::prelude::*;
//! let p = Pipeline::builder(FnSource::new(64, |i| Ok(i as i64)))
//!     .batch_size(8)
//!     .collate(StackCollate::new().column::<i64>("x"))
//!     .build()
//!     .unwrap();
//! assert_eq!(p.epoch(0).count(), 8);
//! let reports = p.stage_reports();
//! assert!(reports.iter().any(|r| r.name == "collate" && r.samples == 64));
//! ```

use std::sync::atomic::Ordering;
use std::time::Instant;

use crate::metrics::{EpochSummary, StageReport};

use super::Pipeline;
use crate::sync::LockExt;

impl Pipeline {
    /// The trace recorded so far (Chrome trace-event JSON), when the
    /// pipeline was built with [`trace`](crate::PipelineBuilder::trace).
    pub fn trace_json(&self) -> Option<String> {
        self.shared.trace.as_ref().map(|t| t.to_json())
    }

    /// The summary of the last epoch that finished or was abandoned.
    pub fn last_summary(&self) -> Option<EpochSummary> {
        self.last_summary.lock_unpoisoned().clone()
    }

    /// Per-stage figures since the pipeline started or since
    /// [`reset_metrics`](Self::reset_metrics).
    pub fn stage_reports(&self) -> Vec<StageReport> {
        let since = *self.metrics_since();
        let wall = since.elapsed().as_nanos().max(1) as f64;
        (0..self.shared.metrics.len())
            .map(|i| {
                let m = &self.shared.metrics[i];
                let seg = self.shared.segment_of(i);
                let w = self.shared.active(seg);
                let busy = m.busy_ns.load(Ordering::Relaxed) as f64;
                StageReport {
                    name: self.shared.stage_name(i).to_string(),
                    workers: w,
                    samples: m.samples.load(Ordering::Relaxed),
                    busy_fraction: (busy / (wall * w as f64)).min(1.0),
                    mean_ms: m.latency.mean() / 1e6,
                    p50_ms: m.latency.quantile(0.5) as f64 / 1e6,
                    p99_ms: m.latency.quantile(0.99) as f64 / 1e6,
                    errors: m.errors.load(Ordering::Relaxed),
                    skipped: m.skipped.load(Ordering::Relaxed),
                    retries: m.retries.load(Ordering::Relaxed),
                    cpu_fraction: self.shared.meters[seg].cpu_share(),
                    input_queue_fill: {
                        let n = m.queue_samples.load(Ordering::Relaxed);
                        (n > 0).then(|| {
                            m.queue_fill_permille.load(Ordering::Relaxed) as f64 / n as f64 / 1000.0
                        })
                    },
                }
            })
            .collect()
    }

    /// Mean fill (0–1) of the queue into the consumer, sampled each time the
    /// consumer asked for a batch: near 1, the pipeline outruns the consumer.
    pub fn output_queue_fill(&self) -> f64 {
        let n = self.shared.out_queue_samples.load(Ordering::Relaxed);
        if n == 0 {
            0.0
        } else {
            self.shared.out_queue_permille.load(Ordering::Relaxed) as f64 / n as f64 / 1000.0
        }
    }

    /// The stage that limits throughput since the last
    /// [`reset_metrics`](Self::reset_metrics), and what to change.
    pub fn bottleneck(&self) -> Option<crate::metrics::Bottleneck> {
        let reports = self.stage_reports();
        let out_fill = self.output_queue_fill();
        let s = reports
            .iter()
            .filter(|s| s.samples > 0)
            .max_by(|a, b| a.busy_fraction.total_cmp(&b.busy_fraction))?;
        let pct = s.busy_fraction * 100.0;
        // The share of the last epoch the consumer spent waiting for data.
        let stall = self
            .last_summary()
            .filter(|e| e.seconds > 0.0)
            .map_or(1.0, |e| e.wait_seconds / e.seconds);
        let (stage, workers, advice) = if stall < 0.1 || (out_fill > 0.8 && s.busy_fraction < 0.8) {
            (
                "consumer".to_string(),
                0,
                format!(
                    "the consumer waited {:.0}% of the time for data: the pipeline outruns it (busiest stage {} at {pct:.0}%)",
                    stall * 100.0,
                    s.name
                ),
            )
        } else if s.busy_fraction >= 0.5 && s.cpu_fraction.is_some_and(|c| c < 0.5) {
            let cpu = s.cpu_fraction.unwrap_or(0.0) * 100.0;
            (
                s.name.clone(),
                s.workers,
                format!(
                    "{}: {} worker{} at {pct:.0}% busy but only {cpu:.0}% of that on (or waiting for) a CPU — it is blocked (I/O, locks, sleeps): give it more workers, not CPUs (`--autotune` sizes pools from their blocked time)",
                    s.name,
                    s.workers,
                    if s.workers == 1 { "" } else { "s" }
                ),
            )
        } else if s.busy_fraction >= 0.5 {
            (
                s.name.clone(),
                s.workers,
                format!(
                    "{}: {} worker{} at {pct:.0}% busy — give it more CPUs or make it cheaper",
                    s.name,
                    s.workers,
                    if s.workers == 1 { "" } else { "s" }
                ),
            )
        } else {
            (
                s.name.clone(),
                s.workers,
                format!(
                    "no stage is busy (highest: {} at {pct:.0}%): waiting on I/O or too little prefetch — raise the read stage's workers or the prefetch, or turn on autotune (`--autotune`), which sizes pools from their blocked time",
                    s.name
                ),
            )
        };
        Some(crate::metrics::Bottleneck {
            stage,
            workers,
            busy_fraction: s.busy_fraction,
            output_queue_fill: out_fill,
            advice,
        })
    }

    pub(crate) fn metrics_since(&self) -> std::sync::MutexGuard<'_, Instant> {
        self.shared.metrics_since.lock_unpoisoned()
    }

    /// Clears the per-stage metrics and the budget's high-water mark.
    pub fn reset_metrics(&self) {
        for m in &self.shared.metrics {
            m.reset();
        }
        self.shared.out_queue_permille.store(0, Ordering::Relaxed);
        self.shared.out_queue_samples.store(0, Ordering::Relaxed);
        self.shared.budget.reset_peak();
        *self.metrics_since() = Instant::now();
        self.shared.reset_timeline();
        for m in &self.shared.meters {
            m.reset_totals();
        }
    }

    /// Queue fill, bytes in flight, throughput and worker counts over time
    /// since the last [`reset_metrics`](Self::reset_metrics) (with
    /// [`trace`](crate::PipelineBuilder::trace) on, the same points are
    /// counter tracks in the trace).
    pub fn timeline(&self) -> crate::metrics::Timeline {
        self.shared.timeline.lock_unpoisoned().tl.clone()
    }

    /// Adds `counter` to the timeline: each point records how fast it grew
    /// over its interval, per second ([`TimelinePoint::meter_rates`](crate::metrics::TimelinePoint::meter_rates),
    /// named `name` in [`Timeline::meters`](crate::metrics::Timeline::meters)),
    /// and with tracing on the trace gains a counter track `name`. For
    /// figures that live outside the engine, e.g. a reader's bytes
    /// downloaded.
    ///
    /// ```
    /// use ferrofeed_core::prelude::*;
    /// use std::sync::{atomic::{AtomicU64, Ordering}, Arc};
    /// let bytes = Arc::new(AtomicU64::new(0));
    /// let counted = bytes.clone();
    /// let p = Pipeline::builder(FnSource::new(64, move |i| {
    ///         counted.fetch_add(1000, Ordering::Relaxed);
    ///         Ok(i as i64)
    ///     }))
    ///     .batch_size(8)
    ///     .collate(StackCollate::new().column::<i64>("x"))
    ///     .build()
    ///     .unwrap();
    /// p.meter("bytes read", bytes);
    /// assert_eq!(p.epoch(0).count(), 8);
    /// let tl = p.timeline();
    /// assert_eq!(tl.meters, ["bytes read"]);
    /// assert!(tl.points.iter().all(|pt| pt.meter_rates.len() == 1));
    /// ```
    pub fn meter(
        &self,
        name: impl Into<String>,
        counter: std::sync::Arc<std::sync::atomic::AtomicU64>,
    ) {
        self.shared.add_meter(name.into(), counter);
    }
}

#[cfg(test)]
mod tests {
    use crate::prelude::*;
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::sync::Arc;

    #[test]
    fn a_meter_s_rates_add_up_to_what_it_counted() {
        let p = Pipeline::builder(FnSource::new(8, |i| Ok(i as i64)))
            .batch_size(4)
            .trace(1000)
            .collate(StackCollate::new().column::<i64>("x"))
            .build()
            .unwrap();
        let bytes = Arc::new(AtomicU64::new(5_000));
        p.meter("downloaded", bytes.clone());
        for step in [1_000_000u64, 0, 2_000_000] {
            bytes.fetch_add(step, Ordering::Relaxed);
            std::thread::sleep(std::time::Duration::from_millis(2));
            p.shared.sample_timeline();
        }
        let tl = p.timeline();
        assert_eq!(tl.meters, ["downloaded"]);
        // The monitor thread may add points in between: each interval's
        // rate × its length, summed, is what was counted since the meter
        // was added (the 5,000 before it are not).
        let mut t = 0.0;
        let mut total = 0.0;
        for pt in &tl.points {
            total += pt.meter_rates[0] * (pt.t_s - t);
            t = pt.t_s;
        }
        assert!((total - 3e6).abs() < 1.0, "{total}");
        let trace = p.trace_json().unwrap();
        assert!(trace.contains("\"downloaded\""), "a counter track");
    }
}
