//! Metrics: what each stage did and what an epoch delivered.
//!
//! Counters are kept per worker and added to shared atomics once per task.
//! A slow stage (≥ 20 µs a sample) is timed on every sample; a fast one is
//! timed over the whole task and its per-sample mean recorded once per task,
//! so metrics stay on by default at negligible cost.
//!
//! ```
//! use ferrofeed_core::prelude::*;
//! let p = Pipeline::builder(FnSource::new(100, |i| Ok(i as i64)))
//!     .batch_size(10)
//!     .collate(StackCollate::new().column::<i64>("x"))
//!     .build()
//!     .unwrap();
//! let summary: usize = p.epoch(0).map(|b| b.unwrap().len()).sum();
//! assert_eq!(summary, 100);
//! let s = p.last_summary().unwrap();
//! assert!(s.completed && s.samples == 100 && s.skipped.is_empty());
//! ```
use serde::Serialize;

use crate::error::SampleError;

/// One stage's figures over a run.
#[derive(Debug, Clone, Serialize)]
pub struct StageReport {
    /// Stage name (`source`, user stages, `collate`).
    pub name: String,
    /// Worker threads.
    pub workers: usize,
    /// Samples processed.
    pub samples: u64,
    /// Fraction of the workers' wall time spent in this stage.
    pub busy_fraction: f64,
    /// Mean per-sample latency, ms.
    pub mean_ms: f64,
    /// Median latency, ms.
    pub p50_ms: f64,
    /// 99th-percentile latency, ms.
    pub p99_ms: f64,
    /// Failed runs.
    pub errors: u64,
    /// Samples skipped.
    pub skipped: u64,
    /// Retries.
    pub retries: u64,
    /// Share of its worker pool's working time spent on a CPU or waiting
    /// for one (0–1; the rest was blocked on I/O, locks or sleeps). Stages fused in one pool share
    /// the figure. `None` with metrics off or before any task.
    pub cpu_fraction: Option<f64>,
    /// Mean fill of the queue feeding this stage (0–1), where it has one
    /// (the first stage of each segment after the first).
    pub input_queue_fill: Option<f64>,
}

/// The stage that limits throughput, and what to change.
#[derive(Debug, Clone, Serialize)]
pub struct Bottleneck {
    /// The stage (or `consumer` when the pipeline outruns its consumer).
    pub stage: String,
    /// Its workers.
    pub workers: usize,
    /// Its busy fraction.
    pub busy_fraction: f64,
    /// Mean fill of the queue into the consumer (0–1).
    pub output_queue_fill: f64,
    /// What to change.
    pub advice: String,
}

/// What one epoch delivered; nothing is silently lost: `samples + skipped`
/// covers the epoch.
#[derive(Debug, Clone, Default)]
pub struct EpochSummary {
    /// The epoch.
    pub epoch: u64,
    /// Batches delivered.
    pub batches: u64,
    /// Samples delivered.
    pub samples: u64,
    /// Every skipped sample with its error, in delivery order.
    pub skipped: Vec<SampleError>,
    /// Retries that succeeded or not.
    pub retries: u64,
    /// Wall time of the epoch, s.
    pub seconds: f64,
    /// Time the consumer waited for batches ("data stall"), s.
    pub wait_seconds: f64,
    /// Whether the epoch ran to its end (not abandoned, not failed).
    pub completed: bool,
    /// Whether it ended early because a [`StopHandle`](crate::StopHandle)
    /// was set.
    pub stopped: bool,
}

/// Queue fill, bytes in flight, throughput and worker counts over time,
/// sampled by the consumer (one point per `interval_s` at most) since the
/// last [`Pipeline::reset_metrics`](crate::Pipeline::reset_metrics). At
/// [`Timeline::MAX_POINTS`] points, neighbours merge in pairs and the
/// interval doubles, so a run of any length keeps a bounded whole picture.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Timeline {
    /// Seconds between points (at least).
    pub interval_s: f64,
    /// The stage each entry of [`TimelinePoint::input_queue_fill`] feeds.
    pub queues: Vec<String>,
    /// Stage names of [`TimelinePoint::workers`] (one per worker pool).
    pub pools: Vec<String>,
    /// Names of [`TimelinePoint::meter_rates`]: the counters given to
    /// [`Pipeline::meter`](crate::Pipeline::meter), in the order given.
    pub meters: Vec<String>,
    /// The points, oldest first.
    pub points: Vec<TimelinePoint>,
}

/// One point of a [`Timeline`]: throughput over the interval that ends at
/// `t_s`, queue fills and bytes as they stood then (merged points: means).
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct TimelinePoint {
    /// Seconds since the timeline started.
    pub t_s: f64,
    /// Samples collated per second.
    pub samples_per_s: f64,
    /// Bytes held by samples and batches at the end of the interval.
    pub bytes_in_flight: u64,
    /// Batches ready ahead of the consumer, as a fraction of the prefetch
    /// window (0–1; near 1 the pipeline outruns the consumer).
    pub output_queue_fill: f64,
    /// Fill of each inter-stage queue (0–1): tasks queued or being sent
    /// over its capacity.
    pub input_queue_fill: Vec<f64>,
    /// Active workers per pool at the end of the interval.
    pub workers: Vec<usize>,
    /// How fast each of [`Timeline::meters`] grew over the interval, per
    /// second (a meter added later is missing from earlier points).
    pub meter_rates: Vec<f64>,
}

impl Timeline {
    /// Points kept before neighbours merge.
    pub const MAX_POINTS: usize = 1024;

    pub(crate) fn push(&mut self, p: TimelinePoint) {
        self.points.push(p);
        if self.points.len() < Self::MAX_POINTS {
            return;
        }
        let merged = self
            .points
            .chunks(2)
            .map(|pair| {
                let (a, b) = (&pair[0], pair.last().unwrap_or(&pair[0]));
                let mean = |x: f64, y: f64| (x + y) / 2.0;
                TimelinePoint {
                    t_s: b.t_s,
                    samples_per_s: mean(a.samples_per_s, b.samples_per_s),
                    bytes_in_flight: b.bytes_in_flight,
                    output_queue_fill: mean(a.output_queue_fill, b.output_queue_fill),
                    input_queue_fill: a
                        .input_queue_fill
                        .iter()
                        .zip(&b.input_queue_fill)
                        .map(|(x, y)| mean(*x, *y))
                        .collect(),
                    workers: b.workers.clone(),
                    meter_rates: b
                        .meter_rates
                        .iter()
                        .enumerate()
                        .map(|(i, y)| a.meter_rates.get(i).map_or(*y, |x| mean(*x, *y)))
                        .collect(),
                }
            })
            .collect();
        self.points = merged;
        self.interval_s *= 2.0;
    }
}

#[cfg(test)]
mod timeline_tests {
    use super::*;

    fn point(t: f64, fill: f64) -> TimelinePoint {
        TimelinePoint {
            t_s: t,
            samples_per_s: t,
            bytes_in_flight: t as u64,
            output_queue_fill: fill,
            input_queue_fill: vec![fill, 1.0 - fill],
            workers: vec![2],
            meter_rates: vec![t],
        }
    }

    #[test]
    fn a_full_timeline_halves_and_keeps_the_whole_run() {
        let mut tl = Timeline {
            interval_s: 0.1,
            ..Default::default()
        };
        for i in 0..Timeline::MAX_POINTS {
            tl.push(point(i as f64, (i % 2) as f64));
        }
        assert_eq!(tl.points.len(), Timeline::MAX_POINTS / 2);
        assert!((tl.interval_s - 0.2).abs() < 1e-12);
        // Pairs (0, 1) → one point at t = 1 with the mean fill.
        assert_eq!(tl.points[0].t_s, 1.0);
        assert_eq!(tl.points[0].output_queue_fill, 0.5);
        assert_eq!(tl.points[0].input_queue_fill, vec![0.5, 0.5]);
        assert_eq!(tl.points[0].meter_rates, vec![0.5]);
        assert_eq!(
            tl.points.last().map(|p| p.t_s),
            Some((Timeline::MAX_POINTS - 1) as f64)
        );
    }
}
