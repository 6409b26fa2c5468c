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
}
