//! What every thread of a pipeline shares: the configuration, the stages
//! and segments, metrics, the byte budget and its per-row estimates, the
//! timeline and the queue fill counters.
//!
//! ```text
//! Arc<Shared> ── workers, monitor, consumer
//! ```

use std::collections::VecDeque;
use std::num::NonZeroUsize;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use crate::budget::ByteBudget;
use crate::collate::Collate;
use crate::error::ErrorPolicy;
use crate::options::{Batching, Options, Recording, Scheduling, Shuffling, Tuning};

use crate::sampler::{BatchSampler, Shard};

use crate::engine::{fuse, pool_label, ErasedSource, Segment, StageMetrics, StageNode};
use crate::sync::LockExt;

/// The settings the engine runs with: the builder's [`Options`], resolved
/// (CPUs and the tuner's cap counted, minimums applied), and the batch
/// stages.
pub(crate) struct Config {
    pub batching: Batching,
    pub shuffling: Shuffling,
    pub scheduling: Scheduling,
    pub tuning: Tuning,
    pub recording: Recording,
    pub policy: ErrorPolicy,
    pub shard: Shard,
    /// What `Parallelism::Auto` resolves to.
    pub cpus: usize,
    /// The most workers one tuned stage may have.
    pub max_workers: usize,
    pub batch_stages: Vec<(String, Box<dyn crate::collate::BatchStage>)>,
}

impl Config {
    /// The settings as given to the builder, resolved.
    pub(crate) fn options(&self) -> Options {
        Options {
            batching: self.batching,
            shuffling: self.shuffling,
            scheduling: Scheduling {
                cpus: Some(self.cpus),
                ..self.scheduling
            },
            tuning: Tuning {
                max_workers: Some(self.max_workers),
                ..self.tuning
            },
            recording: self.recording,
            on_error: self.policy,
            shard: self.shard,
        }
    }
}

#[derive(Default)]
pub(crate) struct WorkerSlot {
    pub(crate) since_ns: AtomicU64,
    pub(crate) stage: AtomicUsize,
    pub(crate) index: AtomicU64,
}

pub(crate) struct Shared {
    pub(crate) source: ErasedSource,
    pub(crate) stages: Vec<StageNode>,
    pub(crate) collate: Box<dyn Collate>,
    pub(crate) sampler: Box<dyn BatchSampler>,
    pub(crate) cfg: Config,
    pub(crate) budget: Arc<ByteBudget>,
    pub(crate) segments: Vec<Segment>,
    /// `[source, stages…, collate]`.
    pub(crate) metrics: Vec<StageMetrics>,
    pub(crate) slow: Vec<AtomicBool>,
    pub(crate) slots: Vec<WorkerSlot>,
    pub(crate) has_timeouts: bool,
    pub(crate) out_queue_permille: AtomicU64,
    pub(crate) out_queue_samples: AtomicU64,
    pub(crate) trace: Option<Arc<crate::trace::TraceSink>>,
    pub(crate) t0: Instant,
    pub(crate) window: u64,
    pub(crate) metrics_since: Mutex<Instant>,
    /// Workers of each segment that take work (the rest park).
    pub(crate) active: Vec<AtomicUsize>,
    /// Per-segment cost counters for the autotuner.
    pub(crate) meters: Vec<crate::autotune::SegMeter>,
    pub(crate) park: (Mutex<()>, Condvar),
    pub(crate) tune_log: Mutex<VecDeque<crate::autotune::TuneStep>>,
    pub(crate) timeline: Mutex<TimelineRec>,
    /// When the next timeline point is due, ns since `t0`.
    pub(crate) timeline_next_ns: AtomicU64,
    /// Tasks in (or being sent into) each segment's input queue, then
    /// (last entry) batches collated but not yet taken by the consumer, and
    /// their capacities (the admission window for the last): the running
    /// epoch's queue fill, read by the monitor.
    pub(crate) queue_len: Vec<AtomicUsize>,
    pub(crate) queue_cap: Vec<AtomicUsize>,
    /// Measured bytes per row: of the table each segment hands on, then
    /// (last entry) of the batches collate makes; 0 until measured. They
    /// outlive epochs, so a later epoch starts from what the last one saw.
    pub(crate) row_bytes: Vec<AtomicUsize>,
    /// The collated row's figure in `row_bytes` is an estimate.
    pub(crate) batch_estimated: AtomicBool,
    /// Set to end epochs at the next batch (see [`crate::stop`]).
    pub(crate) stop: crate::stop::StopHandle,
}

/// Interval of a fresh timeline.
pub(crate) const TIMELINE_EVERY: Duration = Duration::from_millis(100);

/// The timeline and the counters it last read.
pub(crate) struct TimelineRec {
    pub(crate) tl: crate::metrics::Timeline,
    pub(crate) start_ns: u64,
    pub(crate) last_ns: u64,
    pub(crate) last_samples: u64,
    /// The counters of [`crate::Pipeline::meter`] and what each read at the
    /// last point.
    pub(crate) meters: Vec<(std::sync::Arc<AtomicU64>, u64)>,
}

impl Shared {
    pub(crate) fn new(
        source: ErasedSource,
        stages: Vec<StageNode>,
        collate: Box<dyn Collate>,
        sampler: Box<dyn BatchSampler>,
        cfg: Config,
        budget: Arc<ByteBudget>,
    ) -> Shared {
        let segments = fuse(&stages, &cfg);
        // A tuned pool starts with one worker; the tuner sizes it within
        // its first interval.
        let active = segments
            .iter()
            .map(|s| AtomicUsize::new(if s.tuned { 1 } else { s.workers }))
            .collect();
        let meters = segments.iter().map(|_| Default::default()).collect();
        let n_segments = segments.len();
        let timeline = TimelineRec {
            tl: crate::metrics::Timeline {
                interval_s: TIMELINE_EVERY.as_secs_f64(),
                // Each pool after the first is fed by a queue.
                queues: segments
                    .iter()
                    .skip(1)
                    .map(|s| stages[s.stages.start].name.clone())
                    .collect(),
                pools: segments
                    .iter()
                    .map(|seg| pool_label(&stages, seg))
                    .collect(),
                meters: Vec::new(),
                points: Vec::new(),
            },
            start_ns: 0,
            last_ns: 0,
            last_samples: 0,
            meters: Vec::new(),
        };
        let total_workers: usize = segments.iter().map(|s| s.workers).sum();
        let max_workers = segments.iter().map(|s| s.workers).max().unwrap_or(1);
        let window = cfg.scheduling.prefetch.unwrap_or((2 * max_workers).max(4)) as u64;
        let n = stages.len() + 2;
        let trace = cfg.recording.trace_events.map(|max| {
            let mut names = vec!["source".to_string()];
            names.extend(stages.iter().map(|s| s.name.clone()));
            names.push("collate".to_string());
            Arc::new(crate::trace::TraceSink::new(max, names))
        });
        Shared {
            out_queue_permille: AtomicU64::new(0),
            out_queue_samples: AtomicU64::new(0),
            trace,
            has_timeouts: stages.iter().any(|s| s.opts.timeout.is_some()),
            source,
            metrics: (0..n).map(|_| StageMetrics::default()).collect(),
            slow: (0..n).map(|_| AtomicBool::new(false)).collect(),
            // One slot per worker, and the consumer's (its merged batches
            // and a resume's re-read parts).
            slots: (0..=total_workers).map(|_| WorkerSlot::default()).collect(),
            stages,
            collate,
            sampler,
            cfg,
            budget,
            segments,
            t0: Instant::now(),
            window,
            metrics_since: Mutex::new(Instant::now()),
            active,
            meters,
            park: (Mutex::new(()), Condvar::new()),
            tune_log: Mutex::new(VecDeque::new()),
            timeline: Mutex::new(timeline),
            timeline_next_ns: AtomicU64::new(TIMELINE_EVERY.as_nanos() as u64),
            queue_len: (0..=n_segments).map(|_| AtomicUsize::new(0)).collect(),
            queue_cap: (0..=n_segments).map(|_| AtomicUsize::new(1)).collect(),
            row_bytes: (0..=n_segments).map(|_| AtomicUsize::new(0)).collect(),
            batch_estimated: AtomicBool::new(false),
            stop: crate::stop::StopHandle::new(),
        }
    }

    /// The expected peak bytes of a task of `rows` rows: its largest table
    /// plus the batches collate makes of it (both exist while it collates).
    /// `None` until a task has been measured in every segment and collate:
    /// until then only the task the consumer needs next is admitted.
    pub(crate) fn task_bytes(&self, rows: usize) -> Option<usize> {
        let (tables, batch) = self.row_bytes.split_at(self.row_bytes.len() - 1);
        let mut table = 0;
        for b in tables {
            // A segment not yet measured may be where the task grows most.
            table = table.max(NonZeroUsize::new(b.load(Ordering::Relaxed))?.get());
        }
        let batch = NonZeroUsize::new(batch[0].load(Ordering::Relaxed))?.get();
        Some(rows.saturating_mul(table.saturating_add(batch)))
    }

    /// Whether tables leaving segment `seg` have been measured.
    pub(crate) fn segment_measured(&self, seg: usize) -> bool {
        self.row_bytes
            .get(seg)
            .is_some_and(|b| b.load(Ordering::Relaxed) != 0)
    }

    /// A provisional figure for a collated row, while none is measured:
    /// until collate has been measured, the byte budget admits only the
    /// task the consumer needs next, and where every part is short (shard
    /// groups smaller than a batch) the consumer collates a first batch
    /// only once it has merged a batch's worth of parts, all of them read
    /// one at a time. A held part (or a probed first row) therefore sets
    /// what its rows weigh in their table (a collate copies them); the
    /// first real collate's figure replaces it. (The collate itself is not
    /// run for this: it may count what it sees.)
    pub(crate) fn estimate_batch_bytes(&self, bytes: usize, rows: usize) {
        if rows == 0 || self.segment_measured(self.row_bytes.len() - 1) {
            return;
        }
        self.note_row_bytes(self.row_bytes.len() - 1, bytes, rows);
        self.batch_estimated.store(true, Ordering::Relaxed);
    }

    /// Records the bytes per row of a table leaving segment `at` (or, at
    /// `segments.len()`, of collated batches): a larger value is taken at
    /// once, a smaller one decays in slowly.
    pub(crate) fn note_row_bytes(&self, at: usize, bytes: usize, rows: usize) {
        if rows == 0 {
            return;
        }
        let per_row = bytes.div_ceil(rows);
        let slot = &self.row_bytes[at];
        let old = slot.load(Ordering::Relaxed);
        let new = if per_row >= old
            || (at + 1 == self.row_bytes.len()
                && self.batch_estimated.swap(false, Ordering::Relaxed))
        {
            per_row
        } else {
            (old * 3 + per_row) / 4
        };
        slot.store(new, Ordering::Relaxed);
        if old == 0 {
            // Workers waiting for a first measurement may be admitted now.
            self.budget.notify();
        }
    }

    /// Adds a timeline point for the interval ending now (called by the
    /// monitor thread when one is due).
    pub(crate) fn sample_timeline(&self) {
        let now = self.t0.elapsed().as_nanos() as u64;
        let Ok(mut rec) = self.timeline.try_lock() else {
            return;
        };
        let dt = now.saturating_sub(rec.last_ns).max(1);
        let interval_ns = (rec.tl.interval_s * 1e9) as u64;
        self.timeline_next_ns
            .store(now + interval_ns, Ordering::Relaxed);
        let collated = self.metrics[self.metrics.len() - 1]
            .samples
            .load(Ordering::Relaxed);
        let fill = |q: usize| {
            let cap = self.queue_cap[q].load(Ordering::Relaxed).max(1);
            (self.queue_len[q].load(Ordering::Relaxed) as f64 / cap as f64).min(1.0)
        };
        let segs = self.segments.len();
        let fills = (1..segs).map(fill).collect();
        let out_fill = fill(segs);
        let point = crate::metrics::TimelinePoint {
            t_s: now.saturating_sub(rec.start_ns) as f64 / 1e9,
            samples_per_s: collated.saturating_sub(rec.last_samples) as f64 * 1e9 / dt as f64,
            bytes_in_flight: self.budget.used() as u64,
            output_queue_fill: out_fill,
            input_queue_fill: fills,
            workers: (0..self.segments.len()).map(|s| self.active(s)).collect(),
            meter_rates: rec
                .meters
                .iter_mut()
                .map(|(counter, last)| {
                    let v = counter.load(Ordering::Relaxed);
                    let rate = v.saturating_sub(*last) as f64 * 1e9 / dt as f64;
                    *last = v;
                    rate
                })
                .collect(),
        };
        if let Some(sink) = &self.trace {
            let mut fill = serde_json::Map::new();
            fill.insert("output".into(), point.output_queue_fill.into());
            for (name, f) in rec.tl.queues.iter().zip(&point.input_queue_fill) {
                fill.insert(name.clone(), (*f).into());
            }
            let ts = sink.ns(self.t0) + now;
            sink.counter(ts, "queue fill", serde_json::Value::Object(fill));
            sink.counter(
                ts,
                "bytes in flight",
                serde_json::json!({"bytes": point.bytes_in_flight}),
            );
            for (name, rate) in rec.tl.meters.iter().zip(&point.meter_rates) {
                sink.counter(ts, name, serde_json::json!({"per_s": rate}));
            }
        }
        rec.last_ns = now;
        rec.last_samples = collated;
        rec.tl.push(point);
    }

    /// At the end of an epoch: a point for the interval under way when it
    /// is at least half an interval long, or when the timeline has none
    /// (a run shorter than one interval still gets its point).
    pub(crate) fn close_timeline_interval(&self) {
        let now = self.t0.elapsed().as_nanos() as u64;
        let due = {
            let rec = self.timeline.lock_unpoisoned();
            let half = (rec.tl.interval_s * 0.5e9) as u64;
            rec.tl.points.is_empty() || now.saturating_sub(rec.last_ns) >= half
        };
        if due {
            self.sample_timeline();
        }
    }

    /// Starts the timeline afresh from the counters as they are now.
    pub(crate) fn reset_timeline(&self) {
        let now = self.t0.elapsed().as_nanos() as u64;
        let mut rec = self.timeline.lock_unpoisoned();
        rec.tl.points.clear();
        rec.tl.interval_s = TIMELINE_EVERY.as_secs_f64();
        rec.start_ns = now;
        rec.last_ns = now;
        rec.last_samples = self.metrics[self.metrics.len() - 1]
            .samples
            .load(Ordering::Relaxed);
        for (counter, last) in &mut rec.meters {
            *last = counter.load(Ordering::Relaxed);
        }
        self.timeline_next_ns
            .store(now + TIMELINE_EVERY.as_nanos() as u64, Ordering::Relaxed);
    }

    /// Adds a counter to the timeline (see [`crate::Pipeline::meter`]).
    pub(crate) fn add_meter(&self, name: String, counter: std::sync::Arc<AtomicU64>) {
        let mut rec = self.timeline.lock_unpoisoned();
        let now = counter.load(Ordering::Relaxed);
        rec.tl.meters.push(name);
        rec.meters.push((counter, now));
    }

    pub(crate) fn active(&self, seg: usize) -> usize {
        self.active[seg].load(Ordering::Acquire)
    }

    /// `(stage name, count(pool))` for the source and every stage.
    pub(crate) fn stage_workers(&self, count: impl Fn(usize) -> usize) -> Vec<(String, usize)> {
        let mut v = vec![("source".to_string(), count(0))];
        for (si, seg) in self.segments.iter().enumerate() {
            for i in seg.stages.clone() {
                v.push((self.stages[i].name.clone(), count(si)));
            }
        }
        v
    }

    /// The pool that runs metric `metric_index` (`[source, stages…,
    /// collate]`): the source runs in the first pool, collate in the last.
    pub(crate) fn segment_of(&self, metric_index: usize) -> usize {
        if metric_index == 0 {
            0
        } else if metric_index > self.stages.len() {
            self.segments.len() - 1
        } else {
            self.segments
                .iter()
                .position(|s| s.stages.contains(&(metric_index - 1)))
                .unwrap_or(0)
        }
    }

    pub(crate) fn stage_name(&self, metric_index: usize) -> &str {
        if metric_index == 0 {
            "source"
        } else if metric_index <= self.stages.len() {
            &self.stages[metric_index - 1].name
        } else {
            "collate"
        }
    }
}
