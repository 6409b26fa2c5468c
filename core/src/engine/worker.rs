//! The worker loop: a thread of one segment's pool takes an epoch's job,
//! pulls tasks (from a feed in the first segment, from its input queue
//! otherwise), admits them under the byte budget, runs the segment's stages
//! under the error policy and forwards them.
//!
//! ```text
//! loop { job = ctrl.recv(); run_job(job) }   run_job: feed | input queue → run_segment → forward
//! ```

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::budget::Lease;
use crate::error::{ErrorKind, ErrorPolicy, SampleError, Verdict};
use crate::stage::{Exec, RowFate, RunEnv, RunFn};
use crate::table::Table;

use crate::engine::{EpochRun, Job, Out, Shared, TaskLog, TaskMsg, Work};
use crate::sync::LockExt;

/// Per-task counters, flushed to the shared metrics once per task.
pub(crate) struct LocalStats {
    pub(crate) samples: Vec<u64>,
    pub(crate) timed_ns: Vec<u64>,
    pub(crate) timed_n: Vec<u64>,
    pub(crate) errors: Vec<u64>,
    pub(crate) skipped: Vec<u64>,
    pub(crate) retries: Vec<u64>,
}

impl LocalStats {
    pub(crate) fn new(n: usize) -> Self {
        LocalStats {
            samples: vec![0; n],
            timed_ns: vec![0; n],
            timed_n: vec![0; n],
            errors: vec![0; n],
            skipped: vec![0; n],
            retries: vec![0; n],
        }
    }
    pub(crate) fn flush(&mut self, shared: &Shared) {
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
pub(crate) const SLOW_NS: u64 = 20_000;

/// The engine's [`Exec`] for one stage over one table.
pub(crate) struct RowExec<'a> {
    pub(crate) shared: &'a Shared,
    pub(crate) stats: &'a mut LocalStats,
    pub(crate) log: &'a mut TaskLog,
    /// Metrics index: 0 source, 1..=n stages, n+1 collate.
    pub(crate) m: usize,
    pub(crate) policy: ErrorPolicy,
    pub(crate) stage: &'a str,
    pub(crate) slot: usize,
    pub(crate) watch: bool,
    pub(crate) time_all: bool,
    pub(crate) started: Option<Instant>,
    /// Trace buffer when tracing (every row then gets a slice).
    pub(crate) trace: Option<&'a mut Vec<crate::trace::TraceEvent>>,
    pub(crate) index: u64,
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
    fn fail(&mut self, index: u64, kind: ErrorKind, attempts: u32, may_retry: bool) -> RowFate {
        let verdict = if may_retry {
            self.policy.verdict(attempts)
        } else {
            self.policy.final_verdict()
        };
        let err = || {
            SampleError::new(
                Some(index),
                self.shared.source.key_of(index),
                self.stage,
                kind,
                attempts,
            )
        };
        settle(self.stats, self.log, self.m, verdict, err)
    }
}

/// Carries out a [`Verdict`] on a failed step whose metrics index is `m`:
/// a retry is counted and its backoff waited; a skip or a stop records the
/// error (`err` is built only then). Every failure goes through here.
pub(crate) fn settle(
    stats: &mut LocalStats,
    log: &mut TaskLog,
    m: usize,
    verdict: Verdict,
    err: impl FnOnce() -> SampleError,
) -> RowFate {
    stats.errors[m] += 1;
    match verdict {
        Verdict::Retry(backoff) => {
            log.retries += 1;
            stats.retries[m] += 1;
            std::thread::sleep(backoff);
            RowFate::Retry
        }
        Verdict::Skip => {
            stats.skipped[m] += 1;
            log.skipped.push(err());
            RowFate::Skip
        }
        Verdict::Stop => {
            log.fail.get_or_insert_with(err);
            RowFate::Stop
        }
    }
}

pub(crate) struct Worker {
    pub(crate) shared: Arc<Shared>,
    pub(crate) seg: usize,
    pub(crate) slot: usize,
    pub(crate) stats: LocalStats,
    pub(crate) trace_buf: Vec<crate::trace::TraceEvent>,
    /// Batches this worker claims per task (map-style sources).
    pub(crate) chunk: usize,
    /// Measured cost of one batch through this segment, ns (EMA; 0 unknown).
    pub(crate) ns_per_batch: f64,
    /// Per-task CPU/blocked time, kept for the autotuner.
    pub(crate) meter: Option<crate::autotune::TaskMeter>,
}

/// Work a task should hold: long enough that its queue hop and wake-ups
/// are noise, short enough to keep batches flowing.
pub(crate) const TARGET_TASK_NS: f64 = 2e6;

/// Upper bound on batches per task.
pub(crate) const MAX_CHUNK: usize = 4096;

impl Worker {
    pub(crate) fn new(shared: Arc<Shared>, seg: usize, slot: usize) -> Worker {
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

    /// Waits while the tuner has this worker parked. False when the epoch
    /// is over for it (cancelled, or `done` says nothing is left).
    pub(crate) fn wait_active(&self, run: &EpochRun, done: impl Fn() -> bool) -> bool {
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
            let guard = shared.park.0.lock_unpoisoned();
            let _unused = shared
                .park
                .1
                .wait_timeout(guard, Duration::from_millis(5))
                .unwrap_or_else(|e| e.into_inner());
        }
    }

    pub(crate) fn meter_begin(&mut self) {
        if let Some(m) = &mut self.meter {
            m.begin();
        }
    }

    pub(crate) fn meter_end(&mut self, samples: usize) {
        if let Some(m) = &mut self.meter {
            m.end(&self.shared.meters[self.seg], samples as u64);
        }
    }

    pub(crate) fn run_job(&mut self, job: &Job) {
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
    pub(crate) fn admit(
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
            if need.is_none() && !shared.cfg.scheduling.ordered {
                // Unordered, the consumer takes whichever task ends first:
                // until one is measured each worker runs one task (as a
                // process pool runs one per worker), so a slow first sample
                // holds back no other worker.
                lease = Some(budget.lease(0));
                return true;
            }
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
            let (Some(need), Some(one_batch)) = (need, shared.task_bytes(shared.cfg.batching.size))
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
    pub(crate) fn run_one(
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
            seed: shared.cfg.shuffling.seed,
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
        let metrics = shared.cfg.recording.metrics;
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
                if let RowFate::Stop = exec.fail(index, kind.clone(), 1, false) {
                    break;
                }
            }
            table.truncate(0);
        }
        self.stats.samples[m] += table.len() as u64;
    }

    /// Runs this segment's stages over a table; the task's lease grows
    /// with what each stage makes of it.
    pub(crate) fn run_segment(
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
            let policy = node.policy(&shared.cfg);
            let watch = node.opts.timeout.is_some();
            self.run_one(run, table, log, &node.run, i + 1, &node.name, policy, watch);
            lease.grow_to(table.nbytes());
        }
    }

    /// Accounts the task's bytes and passes it on (collating it in the last
    /// segment). Returns false when the receiver is gone.
    pub(crate) fn forward(&mut self, job: &Job, mut msg: TaskMsg) -> bool {
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
}

pub(crate) fn worker_main(
    shared: Arc<Shared>,
    seg: usize,
    slot: usize,
    ctrl: flume::Receiver<Job>,
) {
    let mut worker = Worker::new(shared, seg, slot);
    if worker.shared.cfg.tuning.autotune || worker.shared.cfg.recording.metrics {
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
