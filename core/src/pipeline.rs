//! The running pipeline: persistent worker pools, bounded queues, ordering,
//! the byte budget and the error policy at work.
//!
//! Stages with equal worker counts are fused into one *segment* (tf.data's
//! map fusion); each segment has its own pool of threads that lives as long
//! as the [`Pipeline`]. Work moves in *tasks* — runs of consecutive batches
//! whose length each worker sizes from its measured cost (about 2 ms of work,
//! at least `min_task_samples` samples), stored column-wise as a [`Table`] —
//! so queue hops and wake-ups are paid per task, not per sample. Segments are linked by bounded `flume` queues; the consumer
//! reorders tasks into sampler order (unless `unordered`).
//! An iterable source's shard groups are each read by one worker, part by
//! part; a worker with no group left takes parts from the readers (when the
//! byte budget has room), so one long shard or an epoch's last groups still
//! use every worker.
//! With [`autotune`](crate::PipelineBuilder::autotune), `Auto` stages are
//! not fused: each has a pool of up to `autotune_max_workers` threads, of
//! which the tuner ([`crate::autotune`]) sets how many work; the others park.
//!
//! ```
//! use ferrofeed_core::prelude::*;
//! let p = Pipeline::builder(FnSource::new(1000, |i| Ok(i as i64)))
//!     .map_with("slow", StageOptions::new().workers(Parallelism::Fixed(3)),
//!         |x: i64, _: &StageCtx| Ok::<_, BoxError>(x + 1))
//!     .batch_size(32)
//!     .shuffle(true)
//!     .seed(1)
//!     .collate(StackCollate::new().column::<i64>("x"))
//!     .build()
//!     .unwrap();
//! for epoch in 0..3 {
//!     let n: usize = p.epoch(epoch).map(|b| b.unwrap().len()).sum();
//!     assert_eq!(n, 1000);
//! }
//! ```
use std::collections::{BTreeMap, HashMap, VecDeque};
use std::num::NonZeroUsize;
use std::ops::Range;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::batch::Batch;
use crate::budget::{ByteBudget, Lease};
use crate::builder::StageOptions;
use crate::collate::Collate;
use crate::component::{ComponentId, ComponentSet};
use crate::error::{BoxError, BuildError, ErrorKind, ErrorPolicy, RetryThen, SampleError};
use crate::metrics::{EpochSummary, StageMetrics, StageReport};
use crate::sampler::{permutation, BatchSampler, EpochPlan, PlanCtx, Shard};
use crate::source::{stream_index, IterableSource, Source};
use crate::stage::{erase, Exec, RowFate, RunEnv, RunFn, Stage, StageCtx};
use crate::table::{BatchRows, Table};

pub(crate) struct StageNode {
    pub name: String,
    pub reads: Vec<ComponentId>,
    pub writes: Vec<ComponentId>,
    pub opts: StageOptions,
    pub run: RunFn,
}

type KeyFn = Box<dyn Fn(u64) -> Option<String> + Send + Sync>;

/// Reads a shard of an iterable source a part (at most one batch) at a time.
pub(crate) trait ShardReader: Send + 'static {
    /// Up to `max` items as a table, the items that failed, and whether the
    /// shard is exhausted.
    fn next_part(&mut self, max: usize) -> (Table, Vec<(u64, BoxError)>, bool);
    /// Takes over the streams of `other` (a reader of the same source,
    /// from [`into_any`](Self::into_any)), to read them interleaved.
    fn merge(&mut self, other: Box<dyn std::any::Any + Send>);
    /// This reader, type-erased, for [`merge`](Self::merge).
    fn into_any(self: Box<Self>) -> Box<dyn std::any::Any + Send>;
}

/// One open shard of a [`StreamReader`].
struct Stream<O> {
    it: crate::source::ShardIter<O>,
    shard: usize,
    pos: u64,
    exhausted: bool,
}

/// Reads one shard, or several interleaved item by item (round robin), so
/// that a part holds items of every shard of its group.
struct StreamReader<O> {
    streams: Vec<Stream<O>>,
    /// The stream the next item is read from.
    turn: usize,
    /// Bounded shuffle buffer: items wait here and leave in a random order
    /// drawn from `(seed, epoch, first shard)`, whichever worker reads them.
    buffer: Vec<(u64, O)>,
    capacity: usize,
    rng: crate::rng::SampleRng,
    exhausted: bool,
}

impl<O> StreamReader<O> {
    /// The next item of the next live stream (`None` once all are done).
    fn pull(&mut self) -> Option<(u64, Result<O, BoxError>)> {
        let n = self.streams.len();
        for _ in 0..n {
            let k = self.turn % n;
            self.turn = (k + 1) % n;
            let s = &mut self.streams[k];
            if s.exhausted {
                continue;
            }
            let i = stream_index(s.shard, s.pos);
            match s.it.next() {
                None => s.exhausted = true,
                Some(r) => {
                    s.pos += 1;
                    return Some((i, r));
                }
            }
        }
        None
    }
}

impl<O: ComponentSet> ShardReader for StreamReader<O> {
    fn merge(&mut self, other: Box<dyn std::any::Any + Send>) {
        if let Ok(o) = other.downcast::<StreamReader<O>>() {
            self.streams.extend(o.streams);
        }
    }
    fn into_any(self: Box<Self>) -> Box<dyn std::any::Any + Send> {
        self
    }
    fn next_part(&mut self, max: usize) -> (Table, Vec<(u64, BoxError)>, bool) {
        use rand::Rng;
        let mut idx = Vec::with_capacity(max);
        let mut vals = Vec::with_capacity(max);
        let mut errs = Vec::new();
        while idx.len() < max {
            // Fill the buffer (errors pass straight through).
            while !self.exhausted && self.buffer.len() < self.capacity.max(1) {
                match self.pull() {
                    None => self.exhausted = true,
                    Some((i, Ok(o))) => self.buffer.push((i, o)),
                    Some((i, Err(e))) => errs.push((i, e)),
                }
            }
            if self.buffer.is_empty() {
                break;
            }
            let k = if self.capacity > 1 {
                self.rng.random_range(0..self.buffer.len())
            } else {
                0
            };
            let (i, o) = self.buffer.swap_remove(k);
            idx.push(i);
            vals.push(o);
        }
        let done = self.exhausted && self.buffer.is_empty();
        let mut t = Table::with_indices(idx);
        O::put_rows(vals, &mut t);
        (t, errs, done)
    }
}

/// Opens shard `shard` with a shuffle buffer of `capacity` items (≤ 1: off)
/// seeded by `seed`.
type OpenFn =
    Box<dyn Fn(usize, usize, u64) -> Result<Box<dyn ShardReader>, BoxError> + Send + Sync>;

pub(crate) enum ErasedSource {
    Map {
        len: u64,
        read: RunFn,
        key: KeyFn,
    },
    Iter {
        shards: usize,
        key: Box<dyn Fn(usize) -> String + Send + Sync>,
        open: OpenFn,
    },
}

/// A map-style source as a stage with no input: row `i` is `source.get(i)`.
struct SourceStage<S>(Arc<S>);

impl<S: Source> Stage for SourceStage<S> {
    type In = ();
    type Out = S::Output;
    fn process(&self, _: (), ctx: &StageCtx) -> Result<S::Output, BoxError> {
        let len = self.0.len();
        if ctx.index() >= len {
            return Err(format!("index {} is past the end (length {len})", ctx.index()).into());
        }
        self.0.get(ctx.index())
    }
}

impl ErasedSource {
    pub(crate) fn map<S: Source>(source: S) -> Self {
        let source = Arc::new(source);
        let s2 = Arc::clone(&source);
        ErasedSource::Map {
            len: source.len(),
            read: erase(SourceStage(source), 0),
            key: Box::new(move |i| s2.key(i)),
        }
    }
    pub(crate) fn iterable<S: IterableSource>(source: S) -> Self {
        let source = Arc::new(source);
        let s2 = Arc::clone(&source);
        ErasedSource::Iter {
            shards: source.num_shards(),
            key: Box::new(move |s| s2.shard_key(s)),
            open: Box::new(move |shard, capacity, seed| {
                let it = source.open(shard)?;
                Ok(Box::new(StreamReader {
                    streams: vec![Stream {
                        it,
                        shard,
                        pos: 0,
                        exhausted: false,
                    }],
                    turn: 0,
                    buffer: Vec::with_capacity(capacity.min(1 << 16)),
                    capacity,
                    rng: crate::rng::sample_rng(seed),
                    exhausted: false,
                }) as Box<dyn ShardReader>)
            }),
        }
    }
    fn key_of(&self, index: u64) -> Option<String> {
        match self {
            ErasedSource::Map { key, .. } => key(index),
            ErasedSource::Iter { key, .. } => {
                let shard = (index >> crate::source::STREAM_POSITION_BITS) as usize;
                let pos = index & ((1u64 << crate::source::STREAM_POSITION_BITS) - 1);
                Some(format!("{}#{pos}", key(shard)))
            }
        }
    }
}

pub(crate) struct Config {
    pub batch_stages: Vec<(String, Box<dyn crate::collate::BatchStage>)>,
    pub shard: Shard,
    pub shuffle_buffer: usize,
    /// Shards of an iterable source read together, item by item, into the
    /// same parts (1: one shard at a time).
    pub interleave: usize,
    pub seed: u64,
    pub policy: ErrorPolicy,
    pub ordered: bool,
    pub prefetch: Option<usize>,
    pub cpus: usize,
    pub min_task_samples: usize,
    pub fuse: bool,
    pub autotune: bool,
    pub autotune_max_workers: usize,
    pub autotune_interval: Duration,
    pub metrics: bool,
    pub trace_max: Option<usize>,
    pub batch_size: usize,
    pub drop_last: bool,
    pub shuffle: bool,
}

struct Segment {
    stages: Range<usize>,
    /// Threads in the pool (for a tuned pool: the most it may use).
    workers: usize,
    /// The autotuner sets how many of them work.
    tuned: bool,
    /// Slot of the pool's first worker.
    first_slot: usize,
}

/// A pool's name: its stages joined by `+` (`source` for a pool with none).
fn pool_label(stages: &[StageNode], seg: &Segment) -> String {
    let names: Vec<&str> = stages[seg.stages.clone()]
        .iter()
        .map(|n| n.name.as_str())
        .collect();
    if names.is_empty() {
        "source".to_string()
    } else {
        names.join("+")
    }
}

#[derive(Default)]
struct WorkerSlot {
    since_ns: AtomicU64,
    stage: AtomicUsize,
    index: AtomicU64,
}

pub(crate) struct Shared {
    source: ErasedSource,
    stages: Vec<StageNode>,
    collate: Box<dyn Collate>,
    sampler: Box<dyn BatchSampler>,
    cfg: Config,
    budget: Arc<ByteBudget>,
    segments: Vec<Segment>,
    /// `[source, stages…, collate]`.
    metrics: Vec<StageMetrics>,
    slow: Vec<AtomicBool>,
    slots: Vec<WorkerSlot>,
    has_timeouts: bool,
    out_queue_permille: AtomicU64,
    out_queue_samples: AtomicU64,
    pub(crate) trace: Option<Arc<crate::trace::TraceSink>>,
    t0: Instant,
    window: u64,
    metrics_since: Mutex<Instant>,
    /// Workers of each segment that take work (the rest park).
    active: Vec<AtomicUsize>,
    /// Per-segment cost counters for the autotuner.
    meters: Vec<crate::autotune::SegMeter>,
    park: (Mutex<()>, Condvar),
    tune_log: Mutex<VecDeque<crate::autotune::TuneStep>>,
    timeline: Mutex<TimelineRec>,
    /// When the next timeline point is due, ns since `t0`.
    timeline_next_ns: AtomicU64,
    /// Tasks in (or being sent into) each segment's input queue, then
    /// (last entry) batches collated but not yet taken by the consumer, and
    /// their capacities (the admission window for the last): the running
    /// epoch's queue fill, read by the monitor.
    queue_len: Vec<AtomicUsize>,
    queue_cap: Vec<AtomicUsize>,
    /// Measured bytes per row: of the table each segment hands on, then
    /// (last entry) of the batches collate makes; 0 until measured. They
    /// outlive epochs, so a later epoch starts from what the last one saw.
    row_bytes: Vec<AtomicUsize>,
    /// Set to end epochs at the next batch (see [`crate::stop`]).
    stop: crate::stop::StopHandle,
}

/// Interval of a fresh timeline.
const TIMELINE_EVERY: Duration = Duration::from_millis(100);

/// The timeline and the counters it last read.
struct TimelineRec {
    tl: crate::metrics::Timeline,
    start_ns: u64,
    last_ns: u64,
    last_samples: u64,
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
        let mut segments: Vec<Segment> = Vec::new();
        for (i, st) in stages.iter().enumerate() {
            let tuned = cfg.autotune && st.opts.workers == crate::stage::Parallelism::Auto;
            let w = if tuned {
                cfg.autotune_max_workers
            } else {
                st.opts.workers.resolve(cfg.cpus)
            };
            match segments.last_mut() {
                Some(seg) if cfg.fuse && !tuned && !seg.tuned && seg.workers == w => {
                    seg.stages.end = i + 1
                }
                _ => segments.push(Segment {
                    stages: i..i + 1,
                    workers: w,
                    tuned,
                    first_slot: 0,
                }),
            }
        }
        if segments.is_empty() {
            segments.push(Segment {
                stages: 0..0,
                workers: cfg.cpus,
                tuned: false,
                first_slot: 0,
            });
        }
        let mut slot = 0;
        for seg in &mut segments {
            seg.first_slot = slot;
            slot += seg.workers;
        }
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
                points: Vec::new(),
            },
            start_ns: 0,
            last_ns: 0,
            last_samples: 0,
        };
        let total_workers: usize = segments.iter().map(|s| s.workers).sum();
        let max_workers = segments.iter().map(|s| s.workers).max().unwrap_or(1);
        let window = cfg.prefetch.unwrap_or((2 * max_workers).max(4)) as u64;
        let n = stages.len() + 2;
        let trace = cfg.trace_max.map(|max| {
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
            stop: crate::stop::StopHandle::new(),
        }
    }

    /// The expected peak bytes of a task of `rows` rows: its largest table
    /// plus the batches collate makes of it (both exist while it collates).
    /// `None` until a task has been measured in every segment and collate:
    /// until then only the task the consumer needs next is admitted.
    fn task_bytes(&self, rows: usize) -> Option<usize> {
        let (tables, batch) = self.row_bytes.split_at(self.row_bytes.len() - 1);
        let mut table = 0;
        for b in tables {
            // A segment not yet measured may be where the task grows most.
            table = table.max(NonZeroUsize::new(b.load(Ordering::Relaxed))?.get());
        }
        let batch = NonZeroUsize::new(batch[0].load(Ordering::Relaxed))?.get();
        Some(rows.saturating_mul(table.saturating_add(batch)))
    }

    /// Records the bytes per row of a table leaving segment `at` (or, at
    /// `segments.len()`, of collated batches): a larger value is taken at
    /// once, a smaller one decays in slowly.
    fn note_row_bytes(&self, at: usize, bytes: usize, rows: usize) {
        if rows == 0 {
            return;
        }
        let per_row = bytes.div_ceil(rows);
        let slot = &self.row_bytes[at];
        let old = slot.load(Ordering::Relaxed);
        let new = if per_row >= old {
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
    fn sample_timeline(&self) {
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
        }
        rec.last_ns = now;
        rec.last_samples = collated;
        rec.tl.push(point);
    }

    /// Starts the timeline afresh from the counters as they are now.
    fn reset_timeline(&self) {
        let now = self.t0.elapsed().as_nanos() as u64;
        let mut rec = self.timeline.lock().unwrap_or_else(|e| e.into_inner());
        rec.tl.points.clear();
        rec.tl.interval_s = TIMELINE_EVERY.as_secs_f64();
        rec.start_ns = now;
        rec.last_ns = now;
        rec.last_samples = self.metrics[self.metrics.len() - 1]
            .samples
            .load(Ordering::Relaxed);
        self.timeline_next_ns
            .store(now + TIMELINE_EVERY.as_nanos() as u64, Ordering::Relaxed);
    }

    fn active(&self, seg: usize) -> usize {
        self.active[seg].load(Ordering::Acquire)
    }

    /// `(stage name, count(pool))` for the source and every stage.
    fn stage_workers(&self, count: impl Fn(usize) -> usize) -> Vec<(String, usize)> {
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
    fn segment_of(&self, metric_index: usize) -> usize {
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

    fn stage_name(&self, metric_index: usize) -> &str {
        if metric_index == 0 {
            "source"
        } else if metric_index <= self.stages.len() {
            &self.stages[metric_index - 1].name
        } else {
            "collate"
        }
    }
}

// ---------------------------------------------------------------------------
// Epoch runs and messages

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
struct Key {
    major: u64,
    minor: u64,
}

enum Work {
    Map {
        plan: EpochPlan,
    },
    Iter {
        /// Shard read at each position of this rank's epoch; position group
        /// `t` is `order[t × interleave ..][.. interleave]`.
        order: Vec<usize>,
        /// Shards per group.
        interleave: usize,
        /// Parts of the first group already delivered (resume).
        skip_parts: u64,
    },
}

impl Work {
    fn majors(&self) -> u64 {
        match self {
            Work::Map { plan } => plan.num_batches() as u64,
            Work::Iter {
                order, interleave, ..
            } => order.len().div_ceil((*interleave).max(1)) as u64,
        }
    }
}

struct EpochRun {
    epoch: u64,
    work: Work,
    /// Where the epoch starts: `(major, minor)` of the first task (non-zero
    /// when resuming).
    start: (u64, u64),
    cancel: AtomicBool,
    next_claim: AtomicU64,
    consumer_next: AtomicU64,
    /// Parts of group `consumer_next` the consumer has received (iterable
    /// sources; stored before `consumer_next`, so a reader that sees a new
    /// group sees its count): the part it needs next.
    consumer_parts: AtomicU64,
    /// The consumer is blocked waiting for a batch: the task it needs next
    /// is then admitted even past the budget, since nothing else can free it.
    consumer_waiting: AtomicBool,
    finished: Mutex<usize>,
    finished_cv: Condvar,
    total_workers: usize,
    /// Iterable sources: parts a worker reading a shard group hands to
    /// workers that have no group left to claim (see `run_iter_source`).
    handoff: (flume::Sender<Handoff>, flume::Receiver<Handoff>),
    /// First-segment workers still claiming and reading shard groups.
    readers: AtomicUsize,
    /// Workers waiting for a handed-off part.
    idle_helpers: AtomicUsize,
}

/// A part read from shard group `major`, to be run through the first
/// segment by another worker.
struct Handoff {
    major: u64,
    part: u64,
    table: Table,
    log: TaskLog,
    /// The group's last part.
    done: bool,
    /// The part's bytes, counted in the byte budget from the hand-off on
    /// (a part a reader runs itself is counted once it is forwarded).
    lease: Lease,
}

/// A short part held back: `(shard group position, part, first row held)`.
type CarryId = (u64, u64, u64);

/// Short parts of an iterable source waiting to fill a batch, in the order
/// the consumer received them.
#[derive(Default)]
struct Carry {
    table: Table,
    lease: Option<Lease>,
    /// Each part held: `(group, part, first row held)` and its rows held.
    segs: Vec<((u64, u64, u64), usize)>,
}

impl Carry {
    /// The parts held, as a saved state names them.
    fn segments(&self) -> Vec<(u64, u64, u64)> {
        self.segs.iter().map(|s| s.0).collect()
    }

    fn push(
        &mut self,
        id: (u64, u64, u64),
        table: Table,
        lease: Option<Lease>,
    ) -> Result<(), SampleError> {
        let n = table.len();
        if n == 0 {
            return Ok(());
        }
        self.table.append(table).map_err(|cols| {
            pipeline_error(format!(
                "parts of one epoch hold different components: {cols}"
            ))
        })?;
        self.segs.push((id, n));
        match (&mut self.lease, lease) {
            (Some(held), Some(more)) => held.absorb(more),
            (None, more) => self.lease = more,
            (Some(_), None) => {}
        }
        Ok(())
    }

    /// The first `n` rows held, and their share of the lease.
    fn take_front(&mut self, n: usize) -> (Table, Option<Lease>) {
        let front = self.table.split_front(n);
        let mut left = front.len();
        while left > 0 && !self.segs.is_empty() {
            let seg = &mut self.segs[0];
            if seg.1 <= left {
                left -= seg.1;
                self.segs.remove(0);
            } else {
                seg.0 .2 += left as u64;
                seg.1 -= left;
                left = 0;
            }
        }
        let lease = self.lease.as_mut().map(|l| l.split(front.nbytes()));
        (front, lease)
    }
}

/// The seed of a shard group's shuffle buffer: drawn from its first shard.
fn group_seed(seed: u64, epoch: u64, first_shard: usize) -> u64 {
    crate::rng::derive_seed(&[seed, epoch, first_shard as u64, 0x5342_5546])
}

/// Counts a worker out of [`EpochRun::readers`] when it stops reading,
/// also by a panic.
struct ReaderGuard<'a>(&'a AtomicUsize);

impl Drop for ReaderGuard<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

impl EpochRun {
    fn cancelled(&self) -> bool {
        self.cancel.load(Ordering::Acquire)
    }
    fn worker_finished(&self) {
        let mut f = self.finished.lock().unwrap_or_else(|e| e.into_inner());
        *f += 1;
        self.finished_cv.notify_all();
    }
    fn wait_finished(&self, limit: Duration) -> bool {
        let deadline = Instant::now() + limit;
        let mut f = self.finished.lock().unwrap_or_else(|e| e.into_inner());
        while *f < self.total_workers {
            let now = Instant::now();
            if now >= deadline {
                return false;
            }
            f = match self.finished_cv.wait_timeout(f, deadline - now) {
                Ok((g, _)) => g,
                Err(e) => e.into_inner().0,
            };
        }
        true
    }
}

#[derive(Default)]
struct TaskLog {
    skipped: Vec<SampleError>,
    fail: Option<SampleError>,
    retries: u64,
}

struct TaskMsg {
    key: Key,
    /// The major key of the task that follows this one.
    next_major: u64,
    last: bool,
    table: Table,
    log: TaskLog,
    lease: Lease,
}

struct TaskOut {
    key: Key,
    next_major: u64,
    last: bool,
    batches: Vec<Batch>,
    log: TaskLog,
    /// The last part of an iterable source's shard group, short of a batch,
    /// not collated: the consumer merges such parts, in order, into full
    /// batches.
    rest: Option<(Table, Lease)>,
}

enum Out {
    Next(flume::Sender<TaskMsg>),
    Final(flume::Sender<TaskOut>),
}

struct Job {
    run: Arc<EpochRun>,
    input: Option<flume::Receiver<TaskMsg>>,
    out: Out,
}

/// Per-task counters, flushed to the shared metrics once per task.
struct LocalStats {
    samples: Vec<u64>,
    timed_ns: Vec<u64>,
    timed_n: Vec<u64>,
    errors: Vec<u64>,
    skipped: Vec<u64>,
    retries: Vec<u64>,
}

impl LocalStats {
    fn new(n: usize) -> Self {
        LocalStats {
            samples: vec![0; n],
            timed_ns: vec![0; n],
            timed_n: vec![0; n],
            errors: vec![0; n],
            skipped: vec![0; n],
            retries: vec![0; n],
        }
    }
    fn flush(&mut self, shared: &Shared) {
        for i in 0..self.samples.len() {
            let m = &shared.metrics[i];
            if self.samples[i] > 0 {
                m.samples.fetch_add(self.samples[i], Ordering::Relaxed);
            }
            if self.timed_n[i] > 0 {
                let est = self.timed_ns[i] as u128
                    * u128::from(self.samples[i].max(self.timed_n[i]))
                    / u128::from(self.timed_n[i]);
                m.busy_ns.fetch_add(est as u64, Ordering::Relaxed);
            }
            for (a, v) in [
                (&m.errors, self.errors[i]),
                (&m.skipped, self.skipped[i]),
                (&m.retries, self.retries[i]),
            ] {
                if v > 0 {
                    a.fetch_add(v, Ordering::Relaxed);
                }
            }
            self.samples[i] = 0;
            self.timed_ns[i] = 0;
            self.timed_n[i] = 0;
            self.errors[i] = 0;
            self.skipped[i] = 0;
            self.retries[i] = 0;
        }
    }
}

/// Stages slower than this per sample are timed on every sample.
const SLOW_NS: u64 = 20_000;

/// The engine's [`Exec`] for one stage over one table.
struct RowExec<'a> {
    shared: &'a Shared,
    stats: &'a mut LocalStats,
    log: &'a mut TaskLog,
    /// Metrics index: 0 source, 1..=n stages, n+1 collate.
    m: usize,
    policy: ErrorPolicy,
    stage: &'a str,
    slot: usize,
    watch: bool,
    time_all: bool,
    started: Option<Instant>,
    /// Trace buffer when tracing (every row then gets a slice).
    trace: Option<&'a mut Vec<crate::trace::TraceEvent>>,
    index: u64,
}

impl Exec for RowExec<'_> {
    fn begin(&mut self, _row: usize, index: u64) {
        self.index = index;
        let timed = self.time_all || self.trace.is_some();
        let now = (timed || self.watch).then(Instant::now);
        if self.watch {
            let slot = &self.shared.slots[self.slot];
            slot.stage.store(self.m - 1, Ordering::Relaxed);
            slot.index.store(index, Ordering::Relaxed);
            let since = now.map_or(1, |t| {
                t.duration_since(self.shared.t0).as_nanos() as u64 + 1
            });
            slot.since_ns.store(since, Ordering::Release);
        }
        self.started = if timed { now } else { None };
    }
    fn end(&mut self) {
        if self.watch {
            self.shared.slots[self.slot]
                .since_ns
                .store(0, Ordering::Release);
        }
        if let Some(t0) = self.started.take() {
            let dt = t0.elapsed().as_nanos() as u64;
            if let (Some(buf), Some(sink)) = (self.trace.as_deref_mut(), &self.shared.trace) {
                buf.push(crate::trace::TraceEvent {
                    name: self.m as u32,
                    tid: self.slot as u32 + 1,
                    ts_ns: sink.ns(t0),
                    dur_ns: dt,
                    index: self.index,
                    kind: crate::trace::Kind::Sample,
                });
            }
            if !self.time_all {
                return;
            }
            self.stats.timed_ns[self.m] += dt;
            self.stats.timed_n[self.m] += 1;
            self.shared.metrics[self.m].latency.record(dt);
            let slow = dt >= SLOW_NS;
            if slow != self.shared.slow[self.m].load(Ordering::Relaxed) {
                self.shared.slow[self.m].store(slow, Ordering::Relaxed);
            }
        }
    }
    fn retry(&mut self, attempt: u32) {
        self.log.retries += 1;
        self.stats.retries[self.m] += 1;
        self.stats.errors[self.m] += 1;
        std::thread::sleep(self.policy.backoff(attempt));
    }
    fn fail(&mut self, index: u64, kind: ErrorKind, attempts: u32) -> RowFate {
        self.stats.errors[self.m] += 1;
        let err = SampleError {
            index: Some(index),
            path: self.shared.source.key_of(index),
            stage: self.stage.to_string(),
            kind,
            attempts,
        };
        if self.policy.skips() {
            self.stats.skipped[self.m] += 1;
            self.log.skipped.push(err);
            RowFate::Skip
        } else {
            self.log.fail = Some(err);
            RowFate::Stop
        }
    }
}

struct Worker {
    shared: Arc<Shared>,
    seg: usize,
    slot: usize,
    stats: LocalStats,
    trace_buf: Vec<crate::trace::TraceEvent>,
    /// Batches this worker claims per task (map-style sources).
    chunk: usize,
    /// Measured cost of one batch through this segment, ns (EMA; 0 unknown).
    ns_per_batch: f64,
    /// Per-task CPU/blocked time, kept for the autotuner.
    meter: Option<crate::autotune::TaskMeter>,
}

/// Work a task should hold: long enough that its queue hop and wake-ups
/// are noise, short enough to keep batches flowing.
const TARGET_TASK_NS: f64 = 2e6;
/// Upper bound on batches per task.
const MAX_CHUNK: usize = 4096;

impl Worker {
    /// Waits while the tuner has this worker parked. False when the epoch
    /// is over for it (cancelled, or `done` says nothing is left).
    fn wait_active(&self, run: &EpochRun, done: impl Fn() -> bool) -> bool {
        let shared = &self.shared;
        let index = self.slot - shared.segments[self.seg].first_slot;
        loop {
            if run.cancelled() {
                return false;
            }
            if index < shared.active(self.seg) {
                return true;
            }
            if done() {
                return false;
            }
            let guard = shared.park.0.lock().unwrap_or_else(|e| e.into_inner());
            let _unused = shared
                .park
                .1
                .wait_timeout(guard, Duration::from_millis(5))
                .unwrap_or_else(|e| e.into_inner());
        }
    }

    fn meter_begin(&mut self) {
        if let Some(m) = &mut self.meter {
            m.begin();
        }
    }

    fn meter_end(&mut self, samples: usize) {
        if let Some(m) = &mut self.meter {
            m.end(&self.shared.meters[self.seg], samples as u64);
        }
    }

    fn run_job(&mut self, job: &Job) {
        let run = &job.run;
        if self.seg == 0 {
            match &run.work {
                Work::Map { plan } => self.run_map_source(job, plan),
                Work::Iter {
                    order,
                    interleave,
                    skip_parts,
                } => self.run_iter_source(job, order, *interleave, *skip_parts),
            }
        } else if let Some(input) = &job.input {
            let first = self.shared.segments[self.seg].stages.start + 1;
            let cap = input.capacity().unwrap_or(1).max(1) as u64;
            let tuned = self.shared.segments[self.seg].tuned;
            loop {
                if tuned && !self.wait_active(run, || input.is_disconnected() && input.is_empty()) {
                    break;
                }
                let m = &self.shared.metrics[first];
                m.queue_fill_permille
                    .fetch_add(input.len() as u64 * 1000 / cap, Ordering::Relaxed);
                m.queue_samples.fetch_add(1, Ordering::Relaxed);
                let Ok(mut msg) = input.recv() else { break };
                let q = &self.shared.queue_len[self.seg];
                let _ = q.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| n.checked_sub(1));
                if run.cancelled() {
                    break;
                }
                self.meter_begin();
                self.run_segment(run, &mut msg.table, &mut msg.log, &mut msg.lease);
                if !self.forward(job, msg) {
                    break;
                }
            }
        }
    }

    /// Waits until a task of `rows` rows at `(major, part)` may run (map
    /// tasks: part 0), and returns its lease: the bytes it is expected to
    /// reach, charged before it reads anything (a task's bytes grow as it
    /// moves: file bytes, pixels, batch). The task the consumer needs next
    /// is admitted when it fits, or once the consumer waits for it (the
    /// batches the consumer holds can free nothing else), so a budget
    /// smaller than a batch slows the pipeline down instead of deadlocking
    /// it; any other task only within `window` majors of it (none: no
    /// limit), once a task has been measured, and while its bytes plus one
    /// batch's (room kept for the consumer's task) fit. `None` when the
    /// epoch is cancelled first.
    fn admit(
        &self,
        run: &EpochRun,
        (major, part): (u64, u64),
        window: Option<u64>,
        rows: usize,
    ) -> Option<Lease> {
        let shared = &self.shared;
        let budget = &shared.budget;
        let mut lease = None;
        let admitted = budget.wait_until(&run.cancel, || {
            let next = run.consumer_next.load(Ordering::Acquire);
            let next_part = run.consumer_parts.load(Ordering::Acquire);
            let need = shared.task_bytes(rows);
            if major < next || (major == next && part <= next_part) {
                let go = match need {
                    None => true,
                    Some(n) => run.consumer_waiting.load(Ordering::Acquire) || budget.fits(n),
                };
                if go {
                    lease = Some(budget.lease(need.unwrap_or(0)));
                }
                return go;
            }
            if window.is_some_and(|w| major >= next + w) {
                return false;
            }
            let (Some(need), Some(one_batch)) = (need, shared.task_bytes(shared.cfg.batch_size))
            else {
                return false;
            };
            lease = budget.lease_if(need, one_batch);
            lease.is_some()
        });
        if admitted {
            lease
        } else {
            None
        }
    }

    /// Runs one erased stage over a table under its policy.
    #[allow(clippy::too_many_arguments)]
    fn run_one(
        &mut self,
        run: &EpochRun,
        table: &mut Table,
        log: &mut TaskLog,
        stage_run: &RunFn,
        m: usize,
        name: &str,
        policy: ErrorPolicy,
        watch: bool,
    ) {
        if table.is_empty() {
            return;
        }
        let shared = Arc::clone(&self.shared);
        let time_all = shared.slow[m].load(Ordering::Relaxed);
        let tracing = shared.trace.is_some();
        let env = RunEnv {
            epoch: run.epoch,
            seed: shared.cfg.seed,
            cancel: &run.cancel,
            retries: policy.attempts(),
            every_row: time_all || watch || tracing,
        };
        let mut exec = RowExec {
            shared: &shared,
            stats: &mut self.stats,
            log,
            m,
            policy,
            stage: name,
            slot: self.slot,
            watch,
            time_all,
            started: None,
            trace: tracing.then_some(&mut self.trace_buf),
            index: 0,
        };
        let rows_in = table.len() as u64;
        let _span = tracing::trace_span!("stage", name, rows = rows_in).entered();
        let metrics = shared.cfg.metrics;
        let t0 = metrics.then(Instant::now);
        let result = stage_run(table, &env, &mut exec);
        if let (false, Some(t0)) = (time_all, t0) {
            // A fast stage: time the whole task, record the per-row mean.
            let dt = t0.elapsed().as_nanos() as u64;
            let per_row = dt / rows_in.max(1);
            exec.stats.timed_ns[m] += dt;
            exec.stats.timed_n[m] += rows_in;
            shared.metrics[m].latency.record_n(per_row, rows_in);
            if per_row >= SLOW_NS {
                shared.slow[m].store(true, Ordering::Relaxed);
            }
        }
        if let Err(missing) = result {
            // Only reachable when a custom source or stage breaks the plan
            // `build()` checked: every row lacks the component.
            let kind = ErrorKind::MissingComponent(missing.short_name());
            for &index in table.indices() {
                if let RowFate::Stop = exec.fail(index, kind.clone(), 1) {
                    break;
                }
            }
            table.truncate(0);
        }
        self.stats.samples[m] += table.len() as u64;
    }

    /// Runs this segment's stages over a table; the task's lease grows
    /// with what each stage makes of it.
    fn run_segment(
        &mut self,
        run: &EpochRun,
        table: &mut Table,
        log: &mut TaskLog,
        lease: &mut Lease,
    ) {
        let shared = Arc::clone(&self.shared);
        for i in shared.segments[self.seg].stages.clone() {
            if run.cancelled() {
                return;
            }
            let node = &shared.stages[i];
            let policy = node.opts.on_error.unwrap_or(shared.cfg.policy);
            let watch = node.opts.timeout.is_some();
            self.run_one(run, table, log, &node.run, i + 1, &node.name, policy, watch);
            lease.grow_to(table.nbytes());
        }
    }

    /// Batches to claim next: about [`TARGET_TASK_NS`] of work, at least
    /// `min_task_samples` samples, and at most a quarter of the byte budget
    /// per worker.
    fn next_chunk(&mut self, plan: &EpochPlan) -> usize {
        let cfg = &self.shared.cfg;
        let nb = plan.num_batches().max(1);
        let mean_batch = (plan.indices.len() / nb).max(1);
        let floor = cfg.min_task_samples.div_ceil(mean_batch).max(1);
        let mut k = if self.ns_per_batch > 0.0 {
            ((TARGET_TASK_NS / self.ns_per_batch) as usize).max(floor)
        } else {
            floor
        };
        match self.shared.task_bytes(mean_batch) {
            // Nothing measured yet: one batch, whatever its samples weigh.
            None => k = 1,
            Some(per_batch) => {
                let workers = self.shared.active(0).max(1);
                k = k.min((self.shared.budget.max() / (4 * workers * per_batch.max(1))).max(1));
            }
        }
        self.chunk = k.clamp(1, MAX_CHUNK);
        self.chunk
    }

    fn run_map_source(&mut self, job: &Job, plan: &EpochPlan) {
        let run = &job.run;
        let shared = Arc::clone(&self.shared);
        let ErasedSource::Map { read, .. } = &shared.source else {
            return;
        };
        let nb = plan.num_batches() as u64;
        let tuned = shared.segments[0].tuned;
        loop {
            if run.cancelled() {
                return;
            }
            if tuned && !self.wait_active(run, || run.next_claim.load(Ordering::Acquire) >= nb) {
                return;
            }
            let k = self.next_chunk(plan) as u64;
            let b0 = run.next_claim.fetch_add(k, Ordering::AcqRel);
            if b0 >= nb {
                return;
            }
            let b1 = (b0 + k).min(nb);
            let rows = plan.offsets[b1 as usize] - plan.offsets[b0 as usize];
            let Some(mut lease) = self.admit(run, (b0, 0), Some(shared.window * k), rows) else {
                return;
            };
            self.meter_begin();
            let started = Instant::now();
            let (lo, hi) = (plan.offsets[b0 as usize], plan.offsets[b1 as usize]);
            let ends = plan.offsets[b0 as usize + 1..=b1 as usize]
                .iter()
                .map(|&e| e - lo)
                .collect();
            let mut table = Table::with_batches(plan.indices[lo..hi].to_vec(), ends);
            let mut log = TaskLog::default();
            self.run_one(
                run,
                &mut table,
                &mut log,
                read,
                0,
                "source",
                shared.cfg.policy,
                false,
            );
            lease.grow_to(table.nbytes());
            self.run_segment(run, &mut table, &mut log, &mut lease);
            if run.cancelled() {
                return;
            }
            let msg = TaskMsg {
                key: Key {
                    major: b0,
                    minor: 0,
                },
                next_major: b1,
                last: true,
                table,
                log,
                lease,
            };
            if !self.forward(job, msg) {
                return;
            }
            let per_batch = started.elapsed().as_nanos() as f64 / (b1 - b0) as f64;
            self.ns_per_batch = if self.ns_per_batch > 0.0 {
                0.7 * self.ns_per_batch + 0.3 * per_batch
            } else {
                per_batch
            };
        }
    }

    /// Reads shard groups (each claimed by one worker, its shards opened and
    /// read part by part in order) and runs the first segment over the parts.
    /// A reader hands a part to a worker that has no group left, when one is
    /// waiting, instead of running the segment itself — so a single long
    /// shard, or the last groups of an epoch, still keep every worker busy.
    /// Parts keep their keys, so the consumer's order is unchanged. (Not
    /// with autotune, whose pool sizes follow each worker's own costs.)
    fn run_iter_source(&mut self, job: &Job, order: &[usize], group: usize, skip_parts: u64) {
        {
            let _reading = ReaderGuard(&job.run.readers);
            self.read_groups(job, order, group, skip_parts);
        }
        if !self.shared.segments[0].tuned {
            self.help_readers(job, order.len().div_ceil(group.max(1)) as u64);
        }
    }

    /// Runs handed-off parts until no worker is reading any more (or the
    /// consumer has every one of the epoch's `groups`).
    fn help_readers(&mut self, job: &Job, groups: u64) {
        let run = &job.run;
        let rx = &run.handoff.1;
        loop {
            if run.cancelled() || run.consumer_next.load(Ordering::Acquire) >= groups {
                return;
            }
            run.idle_helpers.fetch_add(1, Ordering::AcqRel);
            let got = rx.recv_timeout(Duration::from_millis(2));
            run.idle_helpers.fetch_sub(1, Ordering::AcqRel);
            match got {
                Ok(h) => {
                    self.meter_begin();
                    if self.finish_part(job, h).is_none() {
                        return;
                    }
                }
                Err(flume::RecvTimeoutError::Timeout) => {
                    if run.readers.load(Ordering::Acquire) == 0 && rx.is_empty() {
                        return;
                    }
                }
                Err(flume::RecvTimeoutError::Disconnected) => return,
            }
        }
    }

    /// Runs the first segment over a part and forwards it: `None` when the
    /// receiver is gone, else whether the part ended its group.
    fn finish_part(&mut self, job: &Job, h: Handoff) -> Option<bool> {
        let Handoff {
            major,
            part,
            mut table,
            mut log,
            done,
            mut lease,
        } = h;
        self.run_segment(&job.run, &mut table, &mut log, &mut lease);
        let last = done || log.fail.is_some();
        // A short part is merged with others by the consumer; `drop_last`
        // drops only what is left at the epoch's end.
        let msg = TaskMsg {
            key: Key { major, minor: part },
            next_major: if last { major + 1 } else { major },
            last,
            table,
            log,
            lease,
        };
        self.forward(job, msg).then_some(last)
    }

    /// Reads part `part` of shard group `t` again (a saved state holds it
    /// back): the group's shards opened as [`read_groups`](Self::read_groups)
    /// opens them, under the same policy, and the parts before it read and
    /// dropped.
    fn read_part(
        &mut self,
        run: &EpochRun,
        t: u64,
        part: u64,
    ) -> Result<(Table, Lease), SampleError> {
        let shared = Arc::clone(&self.shared);
        let (
            ErasedSource::Iter { key, open, .. },
            Work::Iter {
                order, interleave, ..
            },
        ) = (&shared.source, &run.work)
        else {
            return Err(pipeline_error(
                "only iterable sources hold parts back".into(),
            ));
        };
        let g = (*interleave).max(1);
        let lo = usize::try_from(t).unwrap_or(usize::MAX).saturating_mul(g);
        if lo >= order.len() {
            return Err(pipeline_error(format!(
                "the saved state holds back a part of shard group {t}, but this epoch has {} groups",
                order.len().div_ceil(g)
            )));
        }
        let shards = &order[lo..(lo + g).min(order.len())];
        let seed = group_seed(shared.cfg.seed, run.epoch, shards[0]);
        let policy = shared.cfg.policy;
        let mut reader: Option<Box<dyn ShardReader>> = None;
        for &shard in shards {
            let mut attempt = 0;
            let opened = loop {
                match open(shard, shared.cfg.shuffle_buffer, seed) {
                    Ok(r) => break Some(r),
                    Err(_) if attempt < policy.attempts() => {
                        attempt += 1;
                        std::thread::sleep(policy.backoff(attempt));
                    }
                    // Skipped in the run that saved the state, too.
                    Err(_) if policy.skips() => break None,
                    Err(e) => {
                        return Err(SampleError::from_box(
                            Some(stream_index(shard, 0)),
                            Some(key(shard)),
                            "source",
                            &e,
                        ))
                    }
                }
            };
            if let Some(r) = opened {
                match &mut reader {
                    Some(base) => base.merge(r.into_any()),
                    None => reader = Some(r),
                }
            }
        }
        let bs = shared.cfg.batch_size;
        let Some(mut reader) = reader else {
            return Ok((Table::new(), shared.budget.lease(0)));
        };
        for _ in 0..part {
            let (_, _, done) = reader.next_part(bs);
            if done {
                return Err(pipeline_error(format!(
                    "the saved state holds back part {part} of shard group {t}, which has fewer parts"
                )));
            }
        }
        let (table, errs, _) = reader.next_part(bs);
        if !policy.skips() {
            if let Some((idx, e)) = errs.into_iter().next() {
                return Err(SampleError::from_box(
                    Some(idx),
                    shared.source.key_of(idx),
                    "source",
                    &e,
                ));
            }
        }
        let lease = shared.budget.lease(table.nbytes());
        Ok((table, lease))
    }

    fn read_groups(&mut self, job: &Job, order: &[usize], group: usize, skip_parts: u64) {
        let first = job.run.start.0;
        let run = &job.run;
        let shared = Arc::clone(&self.shared);
        let ErasedSource::Iter { key, open, .. } = &shared.source else {
            return;
        };
        let bs = shared.cfg.batch_size;
        let policy = shared.cfg.policy;
        let tuned = shared.segments[0].tuned;
        let g = group.max(1);
        let groups = order.len().div_ceil(g) as u64;
        loop {
            if run.cancelled() {
                return;
            }
            if tuned && !self.wait_active(run, || run.next_claim.load(Ordering::Acquire) >= groups)
            {
                return;
            }
            let t = run.next_claim.fetch_add(1, Ordering::AcqRel);
            if t >= groups {
                return;
            }
            // The lease of the group's first part.
            let first_part = if t == first { skip_parts } else { 0 };
            let Some(lease) = self.admit(run, (t, first_part), Some(shared.window), bs) else {
                return;
            };
            let mut first_lease = Some(lease);
            self.meter_begin();
            let shards = &order[t as usize * g..((t as usize + 1) * g).min(order.len())];
            let mut log = TaskLog::default();
            let mut reader: Option<Box<dyn ShardReader>> = None;
            let seed = group_seed(shared.cfg.seed, run.epoch, shards[0]);
            for &shard in shards {
                for attempt in 0..=policy.attempts() {
                    match open(shard, shared.cfg.shuffle_buffer, seed) {
                        Ok(r) => {
                            match &mut reader {
                                Some(base) => base.merge(r.into_any()),
                                None => reader = Some(r),
                            }
                            break;
                        }
                        Err(e) => {
                            self.stats.errors[0] += 1;
                            if attempt < policy.attempts() {
                                log.retries += 1;
                                self.stats.retries[0] += 1;
                                std::thread::sleep(policy.backoff(attempt + 1));
                                continue;
                            }
                            // A shard that cannot be opened is named by its
                            // first item's index and its path.
                            let mut err = SampleError::from_box(
                                Some(stream_index(shard, 0)),
                                Some(key(shard)),
                                "source",
                                &e,
                            );
                            err.attempts = attempt + 1;
                            if policy.skips() {
                                self.stats.skipped[0] += 1;
                                log.skipped.push(err);
                            } else {
                                log.fail = Some(err);
                            }
                        }
                    }
                }
                if log.fail.is_some() {
                    break;
                }
            }
            let Some(mut reader) = reader.filter(|_| log.fail.is_none()) else {
                let msg = TaskMsg {
                    key: Key { major: t, minor: 0 },
                    next_major: t + 1,
                    last: true,
                    table: Table::new(),
                    log,
                    lease: first_lease.take().unwrap_or_else(|| shared.budget.lease(0)),
                };
                if !self.forward(job, msg) {
                    return;
                }
                continue;
            };
            let mut part = 0u64;
            if t == first {
                // Resuming: re-read the parts already delivered, unsent.
                while part < skip_parts {
                    let (_, _, done) = reader.next_part(bs);
                    part += 1;
                    if done {
                        break;
                    }
                }
            }
            loop {
                if run.cancelled() {
                    return;
                }
                let mut lease = match first_lease.take() {
                    Some(lease) => lease,
                    None => {
                        let Some(lease) = self.admit(run, (t, part), None, bs) else {
                            return;
                        };
                        self.meter_begin();
                        lease
                    }
                };
                let started = Instant::now();
                let (mut table, errs, done) = reader.next_part(bs);
                lease.grow_to(table.nbytes());
                let dt = started.elapsed().as_nanos() as u64;
                self.stats.timed_ns[0] += dt;
                self.stats.timed_n[0] += table.len() as u64;
                self.stats.samples[0] += table.len() as u64;
                let mut failed = false;
                for (idx, e) in errs {
                    self.stats.errors[0] += 1;
                    let err =
                        SampleError::from_box(Some(idx), shared.source.key_of(idx), "source", &e);
                    if policy.skips() {
                        self.stats.skipped[0] += 1;
                        log.skipped.push(err);
                    } else {
                        log.fail.get_or_insert(err);
                        failed = true;
                    }
                }
                if failed {
                    table.truncate(0);
                }
                let mut h = Handoff {
                    major: t,
                    part,
                    table,
                    log: std::mem::take(&mut log),
                    done,
                    lease,
                };
                // A waiting worker takes the part (with its lease), if one
                // is free and the byte budget has room for the part this
                // worker reads next — also when that one is the consumer's
                // and would be admitted anyway, so the consumer's group
                // never has more than one part at work beyond the budget.
                if !tuned
                    && !failed
                    && run.idle_helpers.load(Ordering::Acquire) > run.handoff.0.len()
                    && shared
                        .task_bytes(bs)
                        .is_some_and(|part| shared.budget.fits(part.saturating_mul(2)))
                {
                    match run.handoff.0.try_send(h) {
                        Ok(()) => {
                            self.stats.flush(&self.shared);
                            if done {
                                break;
                            }
                            part += 1;
                            continue;
                        }
                        Err(flume::TrySendError::Full(back))
                        | Err(flume::TrySendError::Disconnected(back)) => h = back,
                    }
                }
                match self.finish_part(job, h) {
                    None => return,
                    Some(true) => break,
                    Some(false) => part += 1,
                }
            }
        }
    }

    /// Accounts the task's bytes and passes it on (collating it in the last
    /// segment). Returns false when the receiver is gone.
    fn forward(&mut self, job: &Job, mut msg: TaskMsg) -> bool {
        let bytes = msg.table.nbytes();
        let rows = msg.table.len();
        // The lease keeps what admission reserved (the task may still grow
        // in later segments and collate) or more.
        msg.lease.grow_to(bytes);
        self.shared.note_row_bytes(self.seg, bytes, rows);
        match &job.out {
            Out::Next(tx) => {
                self.meter_end(rows);
                self.stats.flush(&self.shared);
                if let Some(sink) = &self.shared.trace {
                    sink.flush(&mut self.trace_buf);
                }
                self.shared.queue_len[self.seg + 1].fetch_add(1, Ordering::Relaxed);
                tx.send(msg).is_ok()
            }
            Out::Final(tx) => {
                let out = self.collate(msg, job.run.epoch, true);
                self.meter_end(rows);
                self.stats.flush(&self.shared);
                if let Some(sink) = &self.shared.trace {
                    sink.flush(&mut self.trace_buf);
                }
                // Batches ahead of the consumer (it takes them off one by
                // one as it receives them).
                let ahead = &self.shared.queue_len[self.shared.segments.len()];
                ahead.fetch_add(out.batches.len(), Ordering::Relaxed);
                tx.send(out).is_ok()
            }
        }
    }

    /// Collates a task's batches; with `hold_short`, the last part of an
    /// iterable source's shard group, when short of a batch, is handed on
    /// uncollated, for the consumer to merge with the next groups' into full
    /// batches. (A part short because a skip dropped rows stays a short
    /// batch, as a map-style batch does.)
    fn collate(&mut self, msg: TaskMsg, epoch: u64, hold_short: bool) -> TaskOut {
        let shared = Arc::clone(&self.shared);
        let TaskMsg {
            key,
            next_major,
            last,
            mut table,
            mut log,
            lease,
        } = msg;
        if hold_short
            && last
            && log.fail.is_none()
            && matches!(shared.source, ErasedSource::Iter { .. })
            && !table.is_empty()
            && table.len() < shared.cfg.batch_size
        {
            // Held, it weighs what it holds (not what admission reserved).
            let mut lease = lease;
            lease.resize(table.nbytes());
            return TaskOut {
                key,
                next_major,
                last,
                batches: Vec::new(),
                log,
                rest: Some((table, lease)),
            };
        }
        let m = shared.stages.len() + 1;
        let policy = match shared.cfg.policy {
            ErrorPolicy::Retry {
                then: RetryThen::Skip,
                ..
            } => ErrorPolicy::Skip,
            ErrorPolicy::Retry { .. } => ErrorPolicy::Fail,
            p => p,
        };
        let mut out = Vec::with_capacity(table.batches().count());
        let mut b = 0;
        let map_task = matches!(shared.source, ErasedSource::Map { .. });
        let rows_in = table.len() as u64;
        let t0 = shared.cfg.metrics.then(Instant::now);
        // Batch row ranges, recomputed only when a skip removes rows.
        let mut ranges: Vec<Range<usize>> = table.batches().collect();
        while let Some(range) = ranges.get(b).cloned() {
            if range.is_empty() {
                b += 1;
                continue;
            }
            let rows = BatchRows::new(&table, range.clone());
            let tb = shared.trace.is_some().then(Instant::now);
            let r = catch_unwind(AssertUnwindSafe(|| shared.collate.collate(&rows)));
            let n = range.len() as u64;
            // Then the batch stages, on the finished batch: a failure there is
            // the failure of every sample in it.
            let (pos, kind, stage) = match r {
                Ok(Ok(mut batch)) => {
                    batch.set_indices(rows.indices());
                    // Map tasks hold plan batches key.major..next_major;
                    // an iterable part is one batch of its shard.
                    batch.pos = if map_task {
                        (key.major + b as u64, 0)
                    } else {
                        (key.major, key.minor)
                    };
                    match run_batch_stages(&shared, &mut batch) {
                        None => {
                            if let (Some(sink), Some(tb)) = (&shared.trace, tb) {
                                self.trace_buf.push(crate::trace::TraceEvent {
                                    name: m as u32,
                                    tid: self.slot as u32 + 1,
                                    ts_ns: sink.ns(tb),
                                    dur_ns: tb.elapsed().as_nanos() as u64,
                                    index: crate::trace::flow_id(epoch, batch.pos),
                                    kind: crate::trace::Kind::Batch,
                                });
                            }
                            self.stats.samples[m] += n;
                            out.push(batch);
                            b += 1;
                            continue;
                        }
                        Some((name, kind)) => (None, kind, name),
                    }
                }
                Ok(Err(e)) => (
                    e.sample,
                    ErrorKind::Failed(e.message),
                    "collate".to_string(),
                ),
                Err(p) => (
                    None,
                    ErrorKind::Panicked(crate::stage::panic_message(p.as_ref())),
                    "collate".to_string(),
                ),
            };
            self.stats.errors[m] += 1;
            let culprits: Vec<usize> = match pos {
                Some(p) if p < range.len() => vec![range.start + p],
                _ => range.clone().collect(),
            };
            let errs: Vec<SampleError> = culprits
                .iter()
                .map(|&row| {
                    let index = table.indices()[row];
                    SampleError {
                        index: Some(index),
                        path: shared.source.key_of(index),
                        stage: stage.clone(),
                        kind: kind.clone(),
                        attempts: 1,
                    }
                })
                .collect();
            if !policy.skips() {
                log.fail = errs.into_iter().next();
                break;
            }
            self.stats.skipped[m] += errs.len() as u64;
            log.skipped.extend(errs);
            let mut keep = vec![true; table.len()];
            for row in culprits {
                keep[row] = false;
            }
            table.retain(&keep);
            ranges = table.batches().collect();
        }
        if let Some(t0) = t0 {
            let dt = t0.elapsed().as_nanos() as u64;
            self.stats.timed_ns[m] += dt;
            self.stats.timed_n[m] += rows_in;
            shared.metrics[m]
                .latency
                .record_n(dt / rows_in.max(1), rows_in);
        }
        // One lease for the task's batches, released when the last drops:
        // taken out of the task's lease, whose rest (the table's share) is
        // released with the table.
        let bytes: usize = out.iter().map(Batch::nbytes).sum();
        let rows: usize = out.iter().map(Batch::len).sum();
        shared.note_row_bytes(shared.segments.len(), bytes, rows);
        let mut lease = lease;
        lease.grow_to(bytes);
        let shared_lease = Arc::new(lease.split(bytes));
        drop(lease);
        drop(table);
        for b in &mut out {
            b.lease = Some(Arc::clone(&shared_lease));
        }
        TaskOut {
            key,
            next_major,
            last,
            batches: out,
            log,
            rest: None,
        }
    }
}

/// Runs the batch stages on a collated batch; the failing stage's name and
/// error, if one fails.
fn run_batch_stages(shared: &Shared, batch: &mut Batch) -> Option<(String, ErrorKind)> {
    for (name, st) in &shared.cfg.batch_stages {
        let kind = match catch_unwind(AssertUnwindSafe(|| st.process(batch))) {
            Ok(Ok(())) => continue,
            Ok(Err(e)) => ErrorKind::Failed(crate::error::error_chain(e.as_ref())),
            Err(p) => ErrorKind::Panicked(crate::stage::panic_message(p.as_ref())),
        };
        return Some((name.clone(), kind));
    }
    None
}

impl Worker {
    fn new(shared: Arc<Shared>, seg: usize, slot: usize) -> Worker {
        let n = shared.stages.len() + 2;
        Worker {
            shared,
            seg,
            slot,
            stats: LocalStats::new(n),
            trace_buf: Vec::new(),
            chunk: 1,
            ns_per_batch: 0.0,
            meter: None,
        }
    }
}

fn worker_main(shared: Arc<Shared>, seg: usize, slot: usize, ctrl: flume::Receiver<Job>) {
    let mut worker = Worker::new(shared, seg, slot);
    if worker.shared.cfg.autotune || worker.shared.cfg.metrics {
        // CPU vs blocked time per task: the tuner's input, and the reports'
        // `cpu_fraction` (two reads of the thread's schedstat per task).
        worker.meter = Some(crate::autotune::TaskMeter::new());
    }
    if let Some(sink) = &worker.shared.trace {
        let name = std::thread::current()
            .name()
            .unwrap_or("worker")
            .to_string();
        sink.name_thread(slot as u32 + 1, name);
    }
    while let Ok(job) = ctrl.recv() {
        let run = Arc::clone(&job.run);
        let result = catch_unwind(AssertUnwindSafe(|| worker.run_job(&job)));
        if let Some(sink) = &worker.shared.trace {
            sink.flush(&mut worker.trace_buf);
        }
        worker.stats.flush(&worker.shared);
        drop(job);
        if result.is_err() {
            // An engine bug: stop the epoch; the consumer reports it.
            run.cancel.store(true, Ordering::Release);
        }
        run.worker_finished();
    }
}

/// The pipeline's monitor thread: adds a timeline point when one is due and,
/// under autotune, runs the tuner every interval.
fn monitor_main(shared: Arc<Shared>, stop: flume::Receiver<()>) {
    let tuned = shared.segments.iter().any(|s| s.tuned);
    let mut est: Vec<Option<(f64, f64)>> = vec![None; shared.segments.len()];
    // The tuner's first look comes early so a fresh pool leaves its single
    // worker soon.
    let mut next_tune =
        Instant::now() + shared.cfg.autotune_interval.min(Duration::from_millis(20));
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
        if shared.cfg.metrics
            && shared.t0.elapsed().as_nanos() as u64
                >= shared.timeline_next_ns.load(Ordering::Relaxed)
        {
            shared.sample_timeline();
        }
        if tuned && Instant::now() >= next_tune {
            next_tune = Instant::now() + shared.cfg.autotune_interval;
            tune_step(&shared, &mut est);
        }
    }
}

/// One look of the autotuner: turns each pool's measured costs into a model
/// and applies the split it proposes (see [`crate::autotune`]).
fn tune_step(shared: &Shared, est: &mut [Option<(f64, f64)>]) {
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
        let _guard = shared.park.0.lock().unwrap_or_else(|e| e.into_inner());
        shared.park.1.notify_all();
    }
    let workers = shared.stage_workers(|s| proposal[s]);
    let predicted = crate::autotune::predicted_rate(cpus, &segs, &proposal, 1.0);
    tracing::debug!(?workers, predicted, "ferrofeed: autotune");
    let mut log = shared.tune_log.lock().unwrap_or_else(|e| e.into_inner());
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

// ---------------------------------------------------------------------------
// The pipeline

/// A built pipeline: worker pools that live across epochs.
pub struct Pipeline {
    shared: Arc<Shared>,
    ctrl: Vec<flume::Sender<Job>>,
    handles: Vec<JoinHandle<()>>,
    last_run: Mutex<Option<Arc<EpochRun>>>,
    poisoned: Mutex<Option<String>>,
    last_summary: Mutex<Option<EpochSummary>>,
    /// Dropping it stops the monitor thread (timeline, autotune).
    monitor_stop: Option<flume::Sender<()>>,
}

impl std::fmt::Debug for Pipeline {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pipeline")
            .field("workers", &self.workers())
            .finish()
    }
}

impl Pipeline {
    pub(crate) fn start(shared: Arc<Shared>) -> Result<Pipeline, BuildError> {
        let mut ctrl = Vec::new();
        let mut handles = Vec::new();
        let mut slot = 0;
        for (seg, s) in shared.segments.iter().enumerate() {
            let label = pool_label(&shared.stages, s);
            for w in 0..s.workers {
                let (tx, rx) = flume::unbounded();
                let sh = Arc::clone(&shared);
                let h = std::thread::Builder::new()
                    .name(format!("ff-{label}-{w}"))
                    .spawn(move || worker_main(sh, seg, slot, rx))
                    .map_err(|e| {
                        BuildError::Invalid(format!("cannot start a worker thread: {e}"))
                    })?;
                ctrl.push(tx);
                handles.push(h);
                slot += 1;
            }
        }
        let mut monitor_stop = None;
        if shared.cfg.metrics || shared.segments.iter().any(|s| s.tuned) {
            let (tx, rx) = flume::bounded::<()>(1);
            let sh = Arc::clone(&shared);
            let h = std::thread::Builder::new()
                .name("ff-monitor".into())
                .spawn(move || monitor_main(sh, rx))
                .map_err(|e| BuildError::Invalid(format!("cannot start the monitor: {e}")))?;
            handles.push(h);
            monitor_stop = Some(tx);
        }
        Ok(Pipeline {
            shared,
            ctrl,
            handles,
            last_run: Mutex::new(None),
            poisoned: Mutex::new(None),
            last_summary: Mutex::new(None),
            monitor_stop,
        })
    }

    /// Dataset length for a map-style source.
    pub fn len(&self) -> Option<u64> {
        match &self.shared.source {
            ErasedSource::Map { len, .. } => Some(*len),
            ErasedSource::Iter { .. } => None,
        }
    }

    /// Whether a map-style source is empty.
    pub fn is_empty(&self) -> bool {
        self.len() == Some(0)
    }

    /// The handle that stops this pipeline's epochs at the next batch, from
    /// any thread or a signal handler (see [`crate::stop`]).
    pub fn stop_handle(&self) -> crate::stop::StopHandle {
        self.shared.stop.clone()
    }

    /// The byte budget (its `peak()` is the high-water mark).
    pub fn budget(&self) -> &ByteBudget {
        &self.shared.budget
    }

    /// The seed.
    pub fn seed(&self) -> u64 {
        self.shared.cfg.seed
    }

    /// `(stage name, workers)` for the source and every stage (for a stage
    /// under [`autotune`](crate::PipelineBuilder::autotune): the workers
    /// active now).
    pub fn workers(&self) -> Vec<(String, usize)> {
        self.shared.stage_workers(|s| self.shared.active(s))
    }

    /// The changes the autotuner made, oldest first (the last 256).
    pub fn autotune_log(&self) -> Vec<crate::autotune::TuneStep> {
        self.shared
            .tune_log
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .cloned()
            .collect()
    }

    /// The plan of `epoch` for this rank (map-style sources), as the
    /// sampler makes it.
    pub fn plan(&self, epoch: u64) -> Option<Result<EpochPlan, BoxError>> {
        match &self.shared.source {
            ErasedSource::Map { len, .. } => Some(self.shared.sampler.plan(&PlanCtx {
                len: *len,
                seed: self.shared.cfg.seed,
                epoch,
                shard: self.shared.cfg.shard,
            })),
            ErasedSource::Iter { .. } => None,
        }
    }

    /// This rank's shards of an iterable source in epoch `epoch`: the
    /// shard order is a permutation drawn from `(seed, epoch)` when
    /// shuffling, and rank `r` of `W` reads positions `r, r + W, …`.
    pub fn shard_order(&self, epoch: u64) -> Option<Vec<usize>> {
        let ErasedSource::Iter { shards, .. } = &self.shared.source else {
            return None;
        };
        let cfg = &self.shared.cfg;
        let all: Vec<usize> = if cfg.shuffle {
            permutation(*shards as u64, cfg.seed, epoch)
                .into_iter()
                .map(|s| s as usize)
                .collect()
        } else {
            (0..*shards).collect()
        };
        Some(
            all.into_iter()
                .skip(cfg.shard.rank)
                .step_by(cfg.shard.world_size)
                .collect(),
        )
    }

    /// This rank's place in a distributed job.
    pub fn shard(&self) -> Shard {
        self.shared.cfg.shard
    }

    /// Continues the epoch `state` was saved in, from the batch after the
    /// last one it had delivered; later epochs follow with
    /// [`epoch`](Self::epoch). Refuses a state saved by a different seed,
    /// dataset or shard, saying what differs.
    pub fn resume(
        &self,
        state: &crate::state::PipelineState,
    ) -> Result<EpochIter<'_>, crate::state::ResumeError> {
        state.check_against(&self.state_at(state.epoch, (0, 0)))?;
        if !state.carry.is_empty() && matches!(self.shared.source, ErasedSource::Map { .. }) {
            return Err(crate::state::ResumeError::Parse(
                "field `carry` is for iterable sources; this one is map-style".into(),
            ));
        }
        Ok(self.epoch_at(state.epoch, state.position, &state.carry))
    }

    /// The state at the start of `epoch` (what a run that stops before
    /// delivering anything saves).
    pub fn epoch_state_start(&self, epoch: u64) -> crate::state::PipelineState {
        self.state_at(epoch, (0, 0))
    }

    /// The state of this pipeline at `(epoch, position)`.
    pub(crate) fn state_at(&self, epoch: u64, position: (u64, u64)) -> crate::state::PipelineState {
        let (dataset_len, dataset_shards) = match &self.shared.source {
            ErasedSource::Map { len, .. } => (Some(*len), None),
            ErasedSource::Iter { shards, .. } => (None, Some(*shards as u64)),
        };
        crate::state::PipelineState {
            format: crate::state::FORMAT.to_string(),
            seed: self.shared.cfg.seed,
            epoch,
            position,
            dataset_len,
            dataset_shards,
            rank: self.shared.cfg.shard.rank,
            world_size: self.shared.cfg.shard.world_size,
            carry: Vec::new(),
        }
    }

    /// Number of batches epoch `epoch` will hold before any skip
    /// (map-style sources).
    pub fn epoch_hint(&self, epoch: u64) -> Option<usize> {
        self.plan(epoch)?.ok().map(|p| p.num_batches())
    }

    /// Runs epoch `epoch`: an iterator over its batches. Dropping the
    /// iterator abandons the epoch; the next one starts clean.
    pub fn epoch(&self, epoch: u64) -> EpochIter<'_> {
        self.epoch_at(epoch, (0, 0), &[])
    }

    /// Runs `epoch` from `begin`, with the short parts `carry` (`(group,
    /// part, first row)`, see [`PipelineState::carry`]) read again first.
    ///
    /// [`PipelineState::carry`]: crate::state::PipelineState::carry
    fn epoch_at(&self, epoch: u64, begin: (u64, u64), carry: &[(u64, u64, u64)]) -> EpochIter<'_> {
        let start = Instant::now();
        // The previous run must be idle before its workers take new jobs.
        let previous = self
            .last_run
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take();
        let poisoned = self
            .poisoned
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        if let Some(msg) = poisoned {
            if let Some(prev) = previous {
                prev.cancel.store(true, Ordering::Release);
            }
            return EpochIter::failed(self, epoch, pipeline_error(msg));
        }
        if let Some(prev) = previous {
            prev.cancel.store(true, Ordering::Release);
            if !prev.wait_finished(Duration::from_secs(30)) {
                self.poison("a worker did not stop after the previous epoch".into());
            }
        }
        if let Some(msg) = self
            .poisoned
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
        {
            return EpochIter::failed(self, epoch, pipeline_error(msg));
        }
        let work = match &self.shared.source {
            ErasedSource::Map { .. } => {
                match self
                    .plan(epoch)
                    .unwrap_or_else(|| Err("not a map-style source".into()))
                {
                    Ok(plan) => Work::Map { plan },
                    Err(e) => {
                        return EpochIter::failed(
                            self,
                            epoch,
                            SampleError::from_box(None, None, "sampler", &e),
                        )
                    }
                }
            }
            ErasedSource::Iter { .. } => Work::Iter {
                order: self.shard_order(epoch).unwrap_or_default(),
                interleave: self.shared.cfg.interleave.max(1),
                skip_parts: begin.1,
            },
        };
        let begin = match &work {
            Work::Map { .. } => (begin.0, 0),
            Work::Iter { .. } => begin,
        };
        let run = Arc::new(EpochRun {
            epoch,
            work,
            start: begin,
            cancel: AtomicBool::new(false),
            next_claim: AtomicU64::new(begin.0),
            consumer_next: AtomicU64::new(begin.0),
            consumer_parts: AtomicU64::new(begin.1),
            consumer_waiting: AtomicBool::new(false),
            finished: Mutex::new(0),
            finished_cv: Condvar::new(),
            total_workers: self.ctrl.len(),
            handoff: flume::bounded(self.shared.segments[0].workers.max(1)),
            readers: AtomicUsize::new(self.shared.segments[0].workers),
            idle_helpers: AtomicUsize::new(0),
        });
        let segs = &self.shared.segments;
        let (final_tx, final_rx) = flume::bounded::<TaskOut>(self.shared.window as usize);
        let mut links = Vec::new();
        for s in segs.iter().skip(1) {
            links.push(flume::bounded::<TaskMsg>((2 * s.workers).max(2)));
        }
        for (q, cap) in std::iter::once(0)
            .chain(links.iter().map(|(tx, _)| tx.capacity().unwrap_or(1)))
            .chain(std::iter::once(self.shared.window as usize))
            .enumerate()
        {
            self.shared.queue_len[q].store(0, Ordering::Relaxed);
            self.shared.queue_cap[q].store(cap.max(1), Ordering::Relaxed);
        }
        let mut w = 0;
        for (si, s) in segs.iter().enumerate() {
            for _ in 0..s.workers {
                let out = if si + 1 < segs.len() {
                    Out::Next(links[si].0.clone())
                } else {
                    Out::Final(final_tx.clone())
                };
                let input = (si > 0).then(|| links[si - 1].1.clone());
                let job = Job {
                    run: Arc::clone(&run),
                    input,
                    out,
                };
                if self.ctrl[w].send(job).is_err() {
                    self.poison("a worker thread has exited".into());
                    run.cancel.store(true, Ordering::Release);
                }
                w += 1;
            }
        }
        drop(final_tx);
        drop(links);
        *self.last_run.lock().unwrap_or_else(|e| e.into_inner()) = Some(Arc::clone(&run));
        let majors = run.work.majors();
        let batches_hint = match &run.work {
            Work::Map { plan, .. } => Some(plan.num_batches()),
            Work::Iter { .. } => None,
        };
        let mut it = EpochIter {
            pipeline: self,
            run: Some(run),
            rx: Some(final_rx),
            ready: VecDeque::new(),
            pending_err: None,
            reorder: BTreeMap::new(),
            next_key: Key {
                major: begin.0,
                minor: begin.1,
            },
            parts: if begin.1 > 0 {
                HashMap::from([(begin.0, (begin.1, None, begin.0))])
            } else {
                HashMap::new()
            },
            complete: BTreeMap::new(),
            low: begin.0,
            majors,
            finished: false,
            summary: EpochSummary {
                epoch,
                ..Default::default()
            },
            start,
            batches_hint,
            epoch,
            position: begin,
            position_carry: carry.to_vec(),
            carry: Carry::default(),
            local: Worker::new(Arc::clone(&self.shared), 0, self.shared.slots.len() - 1),
            recent_waits: VecDeque::new(),
            last_summary_line: Instant::now(),
            yielded: 0,
        };
        if let Err(e) = it.read_carry(carry) {
            it.pending_err = Some(e);
        }
        it
    }

    fn poison(&self, msg: String) {
        let mut p = self.poisoned.lock().unwrap_or_else(|e| e.into_inner());
        if p.is_none() {
            *p = Some(msg);
        }
    }

    /// The trace recorded so far (Chrome trace-event JSON), when the
    /// pipeline was built with [`trace`](crate::PipelineBuilder::trace).
    pub fn trace_json(&self) -> Option<String> {
        self.shared.trace.as_ref().map(|t| t.to_json())
    }

    /// The summary of the last epoch that finished or was abandoned.
    pub fn last_summary(&self) -> Option<EpochSummary> {
        self.last_summary
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
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

    fn metrics_since(&self) -> std::sync::MutexGuard<'_, Instant> {
        self.shared
            .metrics_since
            .lock()
            .unwrap_or_else(|e| e.into_inner())
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
        self.shared
            .timeline
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .tl
            .clone()
    }

    /// Pulls sample `index` through the source and every stage in the
    /// calling thread, recording each stage's components and time.
    pub fn inspect(&self, index: u64, epoch: u64) -> Result<InspectReport, SampleError> {
        self.inspect_with(index, epoch, |_, _| {})
    }

    /// Like [`inspect`](Self::inspect), calling `hook(stage, table)` (a
    /// one-row table) after the source and after each stage.
    pub fn inspect_with(
        &self,
        index: u64,
        epoch: u64,
        mut hook: impl FnMut(&str, &Table),
    ) -> Result<InspectReport, SampleError> {
        let cancel = AtomicBool::new(false);
        let env = RunEnv {
            epoch,
            seed: self.shared.cfg.seed,
            cancel: &cancel,
            retries: 0,
            every_row: false,
        };
        let run_stage = |table: &mut Table, f: &RunFn, stage: &str| -> Result<(), SampleError> {
            let mut exec = InspectExec {
                source: &self.shared.source,
                stage,
                error: None,
            };
            if let Err(c) = f(table, &env, &mut exec) {
                exec.error.get_or_insert(SampleError {
                    index: Some(index),
                    path: self.shared.source.key_of(index),
                    stage: stage.to_string(),
                    kind: ErrorKind::MissingComponent(c.short_name()),
                    attempts: 1,
                });
            }
            exec.error.map_or(Ok(()), Err)
        };
        let t0 = Instant::now();
        let mut table = match &self.shared.source {
            ErasedSource::Map { len, read, .. } => {
                if index >= *len {
                    return Err(SampleError {
                        index: Some(index),
                        path: None,
                        stage: "source".into(),
                        kind: ErrorKind::Failed(format!(
                            "index {index} is past the end: the dataset has {len} samples"
                        )),
                        attempts: 1,
                    });
                }
                let mut t = Table::with_indices(vec![index]);
                run_stage(&mut t, read, "source")?;
                t
            }
            ErasedSource::Iter {
                shards, open, key, ..
            } => {
                let mut seen = 0u64;
                let mut found = None;
                'shards: for shard in 0..*shards {
                    let mut reader = open(shard, 0, 0)
                        .map_err(|e| SampleError::from_box(None, Some(key(shard)), "source", &e))?;
                    loop {
                        let (t, errs, done) = reader.next_part(1);
                        if let Some((idx, e)) = errs.into_iter().next() {
                            if seen == index {
                                return Err(SampleError::from_box(
                                    Some(idx),
                                    self.shared.source.key_of(idx),
                                    "source",
                                    &e,
                                ));
                            }
                            seen += 1;
                        } else if !t.is_empty() {
                            if seen == index {
                                found = Some(t);
                                break 'shards;
                            }
                            seen += 1;
                        }
                        if done {
                            break;
                        }
                    }
                }
                found.ok_or_else(|| SampleError {
                    index: Some(index),
                    path: None,
                    stage: "source".into(),
                    kind: ErrorKind::Failed(format!(
                        "index {index} is past the end: the stream has {seen} samples"
                    )),
                    attempts: 1,
                })?
            }
        };
        let idx = table.indices()[0];
        let mut steps = vec![InspectStep {
            stage: "source".into(),
            seconds: t0.elapsed().as_secs_f64(),
            components: describe(&table),
        }];
        hook("source", &table);
        for node in &self.shared.stages {
            let t = Instant::now();
            run_stage(&mut table, &node.run, &node.name)?;
            steps.push(InspectStep {
                stage: node.name.clone(),
                seconds: t.elapsed().as_secs_f64(),
                components: describe(&table),
            });
            hook(&node.name, &table);
        }
        let t = Instant::now();
        let rows = BatchRows::new(&table, 0..1);
        let batch = self
            .shared
            .collate
            .collate(&rows)
            .map_err(|e| SampleError {
                index: Some(idx),
                path: self.shared.source.key_of(idx),
                stage: "collate".into(),
                kind: ErrorKind::Failed(e.message),
                attempts: 1,
            })?;
        steps.push(InspectStep {
            stage: "collate".into(),
            seconds: t.elapsed().as_secs_f64(),
            components: batch
                .columns()
                .map(|(n, t)| (n.to_string(), format!("{} {:?}", t.dtype(), t.shape())))
                .collect(),
        });
        Ok(InspectReport {
            index: idx,
            path: self.shared.source.key_of(idx),
            steps,
        })
    }
}

/// Records the first failure of an inspected sample.
struct InspectExec<'a> {
    source: &'a ErasedSource,
    stage: &'a str,
    error: Option<SampleError>,
}

impl Exec for InspectExec<'_> {
    fn begin(&mut self, _: usize, _: u64) {}
    fn end(&mut self) {}
    fn retry(&mut self, _: u32) {}
    fn fail(&mut self, index: u64, kind: ErrorKind, attempts: u32) -> RowFate {
        self.error.get_or_insert(SampleError {
            index: Some(index),
            path: self.source.key_of(index),
            stage: self.stage.to_string(),
            kind,
            attempts,
        });
        RowFate::Stop
    }
}

fn describe(t: &Table) -> Vec<(String, String)> {
    t.describe(0)
        .into_iter()
        .map(|(n, d)| (n.to_string(), d))
        .collect()
}

fn pipeline_error(msg: String) -> SampleError {
    SampleError {
        index: None,
        path: None,
        stage: "pipeline".into(),
        kind: ErrorKind::Pipeline(msg),
        attempts: 1,
    }
}

impl Drop for Pipeline {
    fn drop(&mut self) {
        if let Some(run) = self
            .last_run
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take()
        {
            run.cancel.store(true, Ordering::Release);
        }
        self.shared.budget.notify();
        self.ctrl.clear();
        self.monitor_stop = None;
        let deadline = Instant::now() + Duration::from_secs(2);
        let mut handles = std::mem::take(&mut self.handles);
        while !handles.is_empty() && Instant::now() < deadline {
            let (done, rest): (Vec<_>, Vec<_>) = handles.into_iter().partition(|h| h.is_finished());
            for h in done {
                let _ = h.join();
            }
            handles = rest;
            if !handles.is_empty() {
                std::thread::sleep(Duration::from_millis(1));
            }
        }
        if !handles.is_empty() {
            tracing::warn!(
                stuck = handles.len(),
                "ferrofeed: worker threads stuck inside a stage were left running"
            );
        }
    }
}

/// One stage's view in an [`InspectReport`].
#[derive(Debug, Clone)]
pub struct InspectStep {
    /// `source`, a stage name, or `collate`.
    pub stage: String,
    /// Time the stage took, s.
    pub seconds: f64,
    /// `(component, summary)` after the stage (for `collate`: the columns).
    pub components: Vec<(String, String)>,
}

/// One sample pulled through the pipeline by [`Pipeline::inspect`].
#[derive(Debug, Clone)]
pub struct InspectReport {
    /// Dataset index.
    pub index: u64,
    /// Path or key.
    pub path: Option<String>,
    /// Source, each stage, collate.
    pub steps: Vec<InspectStep>,
}

impl std::fmt::Display for InspectReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "sample {}", self.index)?;
        if let Some(p) = &self.path {
            write!(f, " ({p})")?;
        }
        writeln!(f)?;
        for s in &self.steps {
            writeln!(f, "  [{}] {:.3} ms", s.stage, s.seconds * 1e3)?;
            for (n, d) in &s.components {
                writeln!(f, "      {n}: {d}")?;
            }
        }
        Ok(())
    }
}

// ---------------------------------------------------------------------------
// The consumer side

/// The batches of one epoch, in sampler order unless the pipeline is
/// `unordered`. Yields `Err` once for a failing sample under `Fail`, then ends.
pub struct EpochIter<'p> {
    pipeline: &'p Pipeline,
    run: Option<Arc<EpochRun>>,
    rx: Option<flume::Receiver<TaskOut>>,
    /// Batches to yield, each with the carry as it stands once it is yielded.
    ready: VecDeque<(Batch, Vec<CarryId>)>,
    pending_err: Option<SampleError>,
    reorder: BTreeMap<Key, TaskOut>,
    next_key: Key,
    /// Per major: parts received, parts in all (once the last arrived), and
    /// the major that follows it.
    parts: HashMap<u64, (u64, Option<u64>, u64)>,
    /// Complete majors not yet contiguous with `low`: start → next.
    complete: BTreeMap<u64, u64>,
    /// Every major below this one has been received in full.
    low: u64,
    majors: u64,
    finished: bool,
    summary: EpochSummary,
    start: Instant,
    batches_hint: Option<usize>,
    epoch: u64,
    /// Where the next batch starts: `(plan batch, 0)` or `(shard group position,
    /// part)`.
    position: (u64, u64),
    /// With `position`: the short parts received but not yet delivered
    /// (iterable sources; see [`PipelineState::carry`]).
    ///
    /// [`PipelineState::carry`]: crate::state::PipelineState::carry
    position_carry: Vec<(u64, u64, u64)>,
    /// Short parts waiting to fill a batch.
    carry: Carry,
    /// Runs the consumer's own work: merged batches' collate, re-read parts.
    local: Worker,
    /// Recent per-batch waits, for the slow-batch warning.
    recent_waits: VecDeque<Duration>,
    last_summary_line: Instant,
    /// Batches yielded since the last receive (see `Shared::queue_len`).
    yielded: usize,
}

/// A batch the consumer waited for this many times the running median (and
/// at least [`SLOW_BATCH_FLOOR`]) is reported as slow.
pub const SLOW_BATCH_FACTOR: u32 = 5;
/// Waits shorter than this are never reported.
pub const SLOW_BATCH_FLOOR: Duration = Duration::from_millis(20);
/// Seconds between progress summary lines (`tracing` info).
const SUMMARY_EVERY: Duration = Duration::from_secs(30);

enum Recv {
    Msg(TaskOut),
    Closed,
    Error(SampleError),
    /// The stop handle was set while waiting.
    Stopped,
}

/// How often a waiting consumer looks at the stop handle.
const STOP_POLL: Duration = Duration::from_millis(20);

impl<'p> EpochIter<'p> {
    fn failed(pipeline: &'p Pipeline, epoch: u64, err: SampleError) -> Self {
        EpochIter {
            pipeline,
            run: None,
            rx: None,
            ready: VecDeque::new(),
            pending_err: Some(err),
            reorder: BTreeMap::new(),
            next_key: Key { major: 0, minor: 0 },
            parts: HashMap::new(),
            complete: BTreeMap::new(),
            low: 0,
            majors: 0,
            finished: false,
            summary: EpochSummary {
                epoch,
                ..Default::default()
            },
            start: Instant::now(),
            batches_hint: None,
            epoch,
            position: (0, 0),
            position_carry: Vec::new(),
            carry: Carry::default(),
            local: Worker::new(
                Arc::clone(&pipeline.shared),
                0,
                pipeline.shared.slots.len() - 1,
            ),
            recent_waits: VecDeque::new(),
            last_summary_line: Instant::now(),
            yielded: 0,
        }
    }

    /// Warns (a `tracing` event) when the consumer waited much longer than
    /// usual for the next task's batches, and logs a summary line now and
    /// then. Called once per received task, not per batch.
    fn watch_wait(&mut self, wait: Duration) {
        if self.recent_waits.len() >= 16 && wait >= SLOW_BATCH_FLOOR {
            let mut sorted: Vec<Duration> = self.recent_waits.iter().copied().collect();
            sorted.sort_unstable();
            let median = sorted[sorted.len() / 2];
            if wait > median * SLOW_BATCH_FACTOR {
                tracing::warn!(
                    epoch = self.epoch,
                    batch = self.summary.batches,
                    wait_ms = wait.as_secs_f64() * 1e3,
                    median_ms = median.as_secs_f64() * 1e3,
                    "slow batch: the consumer waited {:.1} ms, {:.0}x the running median",
                    wait.as_secs_f64() * 1e3,
                    wait.as_secs_f64() / median.as_secs_f64().max(1e-9)
                );
            }
        }
        if self.recent_waits.len() == 64 {
            self.recent_waits.pop_front();
        }
        self.recent_waits.push_back(wait);
        if self.last_summary_line.elapsed() >= SUMMARY_EVERY {
            self.last_summary_line = Instant::now();
            let secs = self.start.elapsed().as_secs_f64();
            tracing::info!(
                "epoch {}: {} batches, {:.1} samples/s, consumer waited {:.0}% of the time",
                self.epoch,
                self.summary.batches,
                self.summary.samples as f64 / secs.max(1e-9),
                100.0 * self.summary.wait_seconds / secs.max(1e-9)
            );
        }
    }

    /// Where this epoch stands: saved, it lets [`Pipeline::resume`] continue
    /// exactly after the last batch this iterator yielded (the next epoch's
    /// start once this one is complete).
    pub fn state(&self) -> crate::state::PipelineState {
        if self.finished && self.summary.completed {
            return self.pipeline.state_at(self.epoch + 1, (0, 0));
        }
        let mut state = self.pipeline.state_at(self.epoch, self.position);
        state.carry = self.position_carry.clone();
        state
    }

    /// Number of batches the plan holds (map-style sources), before skips.
    pub fn batches_hint(&self) -> Option<usize> {
        self.batches_hint
    }

    /// What has been delivered and skipped so far.
    pub fn summary(&self) -> &EpochSummary {
        &self.summary
    }

    fn recv(&mut self) -> Recv {
        let Some(rx) = &self.rx else {
            return Recv::Closed;
        };
        let shared = &self.pipeline.shared;
        let cap = rx.capacity().unwrap_or(1).max(1) as u64;
        shared
            .out_queue_permille
            .fetch_add(rx.len() as u64 * 1000 / cap, Ordering::Relaxed);
        shared.out_queue_samples.fetch_add(1, Ordering::Relaxed);
        if self.yielded > 0 {
            // The batches taken since the last receive are no longer ahead.
            let taken = std::mem::take(&mut self.yielded);
            let ahead = &shared.queue_len[shared.segments.len()];
            let _ = ahead.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| {
                Some(n.saturating_sub(taken))
            });
        }
        loop {
            match rx.recv_timeout(STOP_POLL) {
                Ok(m) => return Recv::Msg(m),
                Err(flume::RecvTimeoutError::Disconnected) => return Recv::Closed,
                Err(flume::RecvTimeoutError::Timeout) => {
                    if shared.stop.is_stopped() {
                        return Recv::Stopped;
                    }
                    if !shared.has_timeouts {
                        continue;
                    }
                    let now = shared.t0.elapsed().as_nanos() as u64;
                    for slot in &shared.slots {
                        let since = slot.since_ns.load(Ordering::Acquire);
                        if since == 0 {
                            continue;
                        }
                        let i = slot.stage.load(Ordering::Relaxed);
                        let Some(node) = shared.stages.get(i) else {
                            continue;
                        };
                        let Some(limit) = node.opts.timeout else {
                            continue;
                        };
                        let ran = Duration::from_nanos(now.saturating_sub(since - 1));
                        if ran > limit {
                            let index = slot.index.load(Ordering::Relaxed);
                            self.pipeline.poison(format!(
                                "a worker is stuck in stage `{}` (sample {index})",
                                node.name
                            ));
                            return Recv::Error(SampleError {
                                index: Some(index),
                                path: shared.source.key_of(index),
                                stage: node.name.clone(),
                                kind: ErrorKind::TimedOut(limit),
                                attempts: 1,
                            });
                        }
                    }
                }
            }
        }
    }

    fn absorb(&mut self, out: TaskOut) {
        let major = out.key.major;
        // Progress bookkeeping (drives admission and completion).
        let entry = self.parts.entry(major).or_insert((0, None, major));
        entry.0 += 1;
        if out.last {
            entry.1 = Some(out.key.minor + 1);
            entry.2 = out.next_major;
        }
        if entry.1 == Some(entry.0) {
            let next = entry.2;
            self.parts.remove(&major);
            self.complete.insert(major, next);
            while let Some(next) = self.complete.remove(&self.low) {
                self.low = next;
            }
        }
        if self.pipeline.shared.cfg.ordered {
            self.next_key = if out.last {
                Key {
                    major: out.next_major,
                    minor: 0,
                }
            } else {
                Key {
                    major,
                    minor: out.key.minor + 1,
                }
            };
        }
        let low = self.low;
        if let Some(run) = &self.run {
            let parts = self.parts.get(&low).map_or(0, |e| e.0);
            run.consumer_parts.store(parts, Ordering::Release);
            run.consumer_next.store(low, Ordering::Release);
        }
        self.pipeline.shared.budget.notify();
        self.summary.retries += out.log.retries;
        self.summary.skipped.extend(out.log.skipped);
        for b in out.batches {
            self.ready.push_back((b, self.carry.segments()));
        }
        if let Some(e) = out.log.fail {
            self.pending_err = Some(e);
        }
        if let Some((table, lease)) = out.rest {
            let bs = self.pipeline.shared.cfg.batch_size;
            let key = out.key;
            if let Err(e) = self
                .carry
                .push((key.major, key.minor, 0), table, Some(lease))
            {
                self.pending_err.get_or_insert(e);
            }
            while self.carry.table.len() >= bs {
                let (front, lease) = self.carry.take_front(bs);
                self.collate_merged(front, lease, key);
            }
        }
    }

    /// Collates merged short parts on this thread into batches that resume
    /// after part `key` (and the carry as it now stands).
    fn collate_merged(&mut self, table: Table, lease: Option<Lease>, key: Key) {
        let shared = &self.pipeline.shared;
        let msg = TaskMsg {
            key,
            next_major: key.major,
            last: false,
            table,
            log: TaskLog::default(),
            lease: lease.unwrap_or_else(|| shared.budget.lease(0)),
        };
        self.local.seg = shared.segments.len() - 1;
        let out = self.local.collate(msg, self.epoch, false);
        self.local.stats.flush(shared);
        self.summary.retries += out.log.retries;
        self.summary.skipped.extend(out.log.skipped);
        for mut b in out.batches {
            b.pos = (key.major, key.minor);
            self.ready.push_back((b, self.carry.segments()));
        }
        if let Some(e) = out.log.fail {
            self.pending_err.get_or_insert(e);
        }
    }

    /// Reads the short parts a saved state holds back again (`(group,
    /// part, first row)` each): the shards of the group opened as the
    /// reader did, the parts before skipped, the part run through every
    /// stage, its rows from `first row` on put back in the carry.
    fn read_carry(&mut self, carry: &[(u64, u64, u64)]) -> Result<(), SampleError> {
        let Some(run) = self.run.clone() else {
            return Ok(());
        };
        for &(group, part, first) in carry {
            let (mut table, mut lease) = self.local.read_part(&run, group, part)?;
            let mut log = TaskLog::default();
            for seg in 0..self.pipeline.shared.segments.len() {
                self.local.seg = seg;
                self.local
                    .run_segment(&run, &mut table, &mut log, &mut lease);
            }
            self.local.stats.flush(&self.pipeline.shared);
            if let Some(e) = log.fail {
                return Err(e);
            }
            let _before = table.split_front(first as usize);
            lease.resize(table.nbytes());
            self.carry.push((group, part, first), table, Some(lease))?;
        }
        Ok(())
    }

    fn finish(&mut self, completed: bool) {
        if self.finished {
            return;
        }
        self.finished = true;
        self.summary.completed = completed;
        self.summary.seconds = self.start.elapsed().as_secs_f64();
        if let Some(run) = &self.run {
            if !completed {
                run.cancel.store(true, Ordering::Release);
                self.pipeline.shared.budget.notify();
            }
        }
        self.rx = None;
        self.reorder.clear();
        *self
            .pipeline
            .last_summary
            .lock()
            .unwrap_or_else(|e| e.into_inner()) = Some(self.summary.clone());
    }
}

impl Iterator for EpochIter<'_> {
    type Item = Result<Batch, SampleError>;

    fn next(&mut self) -> Option<Self::Item> {
        loop {
            if !self.finished && self.pipeline.shared.stop.is_stopped() {
                // Only whole batches were yielded: the position is exact.
                self.summary.stopped = true;
                self.ready.clear();
                self.pending_err = None;
                self.finish(false);
                return None;
            }
            if let Some((b, carry_after)) = self.ready.pop_front() {
                if let Some(sink) = &self.pipeline.shared.trace {
                    let mut ev = vec![crate::trace::TraceEvent {
                        name: 0,
                        tid: 0,
                        ts_ns: sink.ns(Instant::now()),
                        dur_ns: 0,
                        index: crate::trace::flow_id(self.epoch, b.pos),
                        kind: crate::trace::Kind::Received,
                    }];
                    sink.flush(&mut ev);
                }
                self.position = if matches!(self.pipeline.shared.source, ErasedSource::Map { .. }) {
                    (b.pos.0 + 1, 0)
                } else {
                    (b.pos.0, b.pos.1 + 1)
                };
                self.position_carry = carry_after;
                self.summary.batches += 1;
                self.summary.samples += b.len() as u64;
                self.yielded += 1;
                return Some(Ok(b));
            }
            if let Some(e) = self.pending_err.take() {
                self.finish(false);
                return Some(Err(e));
            }
            if self.finished {
                return None;
            }
            if self.low >= self.majors {
                if !self.carry.table.is_empty() {
                    // What is left of the short parts: the epoch's last batch
                    // (dropped with `drop_last`).
                    let rest = std::mem::take(&mut self.carry);
                    if !self.pipeline.shared.cfg.drop_last {
                        let end = Key {
                            major: self.majors,
                            minor: 0,
                        };
                        self.collate_merged(rest.table, rest.lease, end);
                    }
                    continue;
                }
                self.finish(true);
                return None;
            }
            if self.pipeline.shared.cfg.ordered {
                if let Some(out) = self.reorder.remove(&self.next_key) {
                    self.absorb(out);
                    continue;
                }
            }
            let waited = Instant::now();
            if let Some(run) = &self.run {
                run.consumer_waiting.store(true, Ordering::Release);
                self.pipeline.shared.budget.notify();
            }
            let r = self.recv();
            if let Some(run) = &self.run {
                run.consumer_waiting.store(false, Ordering::Release);
            }
            let w = waited.elapsed();
            self.summary.wait_seconds += w.as_secs_f64();
            self.watch_wait(w);
            match r {
                Recv::Msg(out) => {
                    if self.pipeline.shared.cfg.ordered && out.key != self.next_key {
                        self.reorder.insert(out.key, out);
                    } else {
                        self.absorb(out);
                    }
                }
                Recv::Error(e) => self.pending_err = Some(e),
                Recv::Stopped => continue,
                Recv::Closed => {
                    let cancelled = self.run.as_ref().is_some_and(|r| r.cancelled());
                    let msg = if cancelled {
                        "the epoch was cancelled".to_string()
                    } else {
                        "a worker thread exited before the epoch ended".to_string()
                    };
                    if !cancelled {
                        self.pipeline.poison(msg.clone());
                    }
                    self.pending_err = Some(pipeline_error(msg));
                }
            }
        }
    }
}

impl Drop for EpochIter<'_> {
    fn drop(&mut self) {
        self.finish(false);
    }
}
