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
//!         |x: i64, _: &StageCtx| Ok(x + 1))
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

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::budget::ByteBudget;
use crate::error::{BoxError, BuildError, SampleError};
use crate::metrics::EpochSummary;
use crate::sampler::{permutation, EpochPlan, PlanCtx, Shard};

use crate::engine::{
    monitor_main, pool_label, worker_main, Carry, EpochRun, ErasedSource, Job, Key, Out, Shared,
    TaskMsg, TaskOut, Work, Worker,
};
use crate::sync::LockExt;

mod inspect;
mod iter;
mod report;

pub use inspect::{InspectReport, InspectStep};
pub use iter::{EpochIter, SLOW_BATCH_FACTOR, SLOW_BATCH_FLOOR};

/// A built pipeline: worker pools that live across epochs.
pub struct Pipeline {
    pub(crate) shared: Arc<Shared>,
    pub(crate) ctrl: Vec<flume::Sender<Job>>,
    pub(crate) handles: Vec<JoinHandle<()>>,
    pub(crate) last_run: Mutex<Option<Arc<EpochRun>>>,
    pub(crate) poisoned: Mutex<Option<String>>,
    pub(crate) last_summary: Mutex<Option<EpochSummary>>,
    /// The last `(epoch, plan digest)` a state was made for (map-style).
    pub(crate) plan_digest: Mutex<Option<(u64, Option<String>)>>,
    /// What the front end says of its dataset's identity, saved in states.
    pub(crate) dataset_id: Mutex<Option<String>>,
    /// Dropping it stops the monitor thread (timeline, autotune).
    pub(crate) monitor_stop: Option<flume::Sender<()>>,
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
        if shared.cfg.recording.metrics || shared.segments.iter().any(|s| s.tuned) {
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
            plan_digest: Mutex::new(None),
            dataset_id: Mutex::new(None),
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

    /// This pipeline's report since its last metrics reset, with `summary`'s
    /// epoch figures, as one self-contained HTML page (see
    /// [`ReportPage`](crate::ReportPage), which front ends fill further).
    pub fn report_html(&self, summary: &crate::EpochSummary) -> String {
        crate::ReportPage::from_pipeline(self, summary, "ferrofeed pipeline").render()
    }

    /// The settings this pipeline runs with, resolved: CPUs and the tuner's
    /// cap as counted at build time, minimums applied.
    pub fn options(&self) -> crate::Options {
        self.shared.cfg.options()
    }

    /// The handle that stops this pipeline's epochs at the next batch, from
    /// any thread or a signal handler (see [`StopHandle`](crate::StopHandle)).
    pub fn stop_handle(&self) -> crate::stop::StopHandle {
        self.shared.stop.clone()
    }

    /// The byte budget (its `peak()` is the high-water mark).
    pub fn budget(&self) -> &ByteBudget {
        &self.shared.budget
    }

    /// The seed.
    pub fn seed(&self) -> u64 {
        self.shared.cfg.shuffling.seed
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
            .lock_unpoisoned()
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
                seed: self.shared.cfg.shuffling.seed,
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
        let all: Vec<usize> = if cfg.shuffling.shuffle {
            permutation(*shards as u64, cfg.shuffling.seed, epoch)
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
        state.check_against(&self.state_at(state.epoch, Key::default()))?;
        if !state.carry.is_empty() && matches!(self.shared.source, ErasedSource::Map { .. }) {
            return Err(crate::state::ResumeError::Parse(
                "field `carry` is for iterable sources; this one is map-style".into(),
            ));
        }
        let past = |end: String| crate::state::ResumeError::PastEnd {
            epoch: state.epoch,
            position: format!("[{}, {}]", state.position.major, state.position.minor),
            end,
        };
        match &self.shared.source {
            ErasedSource::Map { .. } => {
                let batches = self
                    .plan(state.epoch)
                    .and_then(Result::ok)
                    .map_or(0, |p| p.num_batches() as u64);
                if state.position.major > batches || state.position.minor != 0 {
                    return Err(past(format!("{batches} batches")));
                }
            }
            ErasedSource::Iter { .. } => {
                let shards = self.shard_order(state.epoch).map_or(0, |o| o.len()) as u64;
                let per = self.shared.cfg.shuffling.interleave.max(1) as u64;
                let groups = shards.div_ceil(per);
                if state.position.major > groups {
                    return Err(past(format!("{groups} shard groups")));
                }
            }
        }
        Ok(self.epoch_at(state.epoch, state.position.into(), &state.carry))
    }

    /// Cancels the epoch in progress, if any, and waits up to `timeout` for
    /// its workers to leave their stages; whether they all did. For hosts
    /// whose stage code must not run past a point (an interpreter about to
    /// shut down): an abandoned epoch's workers otherwise finish their
    /// current step in the background.
    pub fn stop_and_wait(&self, timeout: Duration) -> bool {
        let run = self.last_run.lock_unpoisoned().clone();
        match run {
            Some(run) => {
                run.cancel.store(true, Ordering::Release);
                self.shared.budget.notify();
                run.wait_finished(timeout)
            }
            None => true,
        }
    }

    /// The state at the start of `epoch` (what a run that stops before
    /// delivering anything saves).
    pub fn epoch_state_start(&self, epoch: u64) -> crate::state::PipelineState {
        self.state_at(epoch, Key::default())
    }

    /// The state of this pipeline at `(epoch, position)`.
    pub(crate) fn state_at(&self, epoch: u64, position: Key) -> crate::state::PipelineState {
        let (dataset_len, dataset_shards) = match &self.shared.source {
            ErasedSource::Map { len, .. } => (Some(*len), None),
            ErasedSource::Iter { shards, .. } => (None, Some(*shards as u64)),
        };
        let cfg = &self.shared.cfg;
        let iterable = dataset_shards.is_some();
        crate::state::PipelineState {
            format: crate::PipelineState::FORMAT.to_string(),
            seed: cfg.shuffling.seed,
            epoch,
            position,
            dataset_len,
            dataset_shards,
            rank: cfg.shard.rank,
            world_size: cfg.shard.world_size,
            pad: cfg.shard.pad,
            carry: Vec::new(),
            batch_size: Some(cfg.batching.size as u64),
            shuffle: Some(cfg.shuffling.shuffle),
            drop_last: Some(cfg.batching.drop_last),
            shuffle_buffer: iterable.then_some(cfg.shuffling.shuffle_buffer as u64),
            interleave: iterable.then_some(cfg.shuffling.interleave.max(1) as u64),
            plan: if iterable {
                None
            } else {
                self.plan_digest(epoch)
            },
            dataset: self.dataset_id.lock_unpoisoned().clone(),
        }
    }

    /// [`EpochPlan::digest`] of `epoch`'s plan, kept for the last epoch
    /// asked (states are taken after every batch).
    fn plan_digest(&self, epoch: u64) -> Option<String> {
        let mut cached = self.plan_digest.lock_unpoisoned();
        if let Some((e, d)) = &*cached {
            if *e == epoch {
                return d.clone();
            }
        }
        let d = self.plan(epoch).and_then(Result::ok).map(|p| p.digest());
        *cached = Some((epoch, d.clone()));
        d
    }

    /// Names this pipeline's dataset in the states it saves (e.g. a digest
    /// of its paths and sizes, made by the front end): [`resume`](Self::resume)
    /// refuses a state whose dataset differs. Without it (or in a state
    /// saved without it) only the length is compared.
    pub fn set_dataset_id(&self, id: impl Into<String>) {
        *self.dataset_id.lock_unpoisoned() = Some(id.into());
    }

    /// Number of batches epoch `epoch` will hold before any skip: for
    /// map-style sources from the plan, for iterable ones when every shard
    /// of this rank knows its length ([`IterableSource::shard_len`](crate::IterableSource::shard_len)).
    pub fn epoch_hint(&self, epoch: u64) -> Option<usize> {
        if let ErasedSource::Iter { len, .. } = &self.shared.source {
            // Full batches across shard groups: only the epoch's last batch
            // may be short (or dropped).
            let at = crate::ShardEpoch {
                seed: self.shared.cfg.shuffling.seed,
                epoch,
            };
            let items: u64 = self
                .shard_order(epoch)?
                .into_iter()
                .map(|s| len(s, at))
                .sum::<Option<u64>>()?;
            let b = self.shared.cfg.batching;
            let size = b.size.max(1) as u64;
            let n = if b.drop_last {
                items / size
            } else {
                items.div_ceil(size)
            };
            return usize::try_from(n).ok();
        }
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
    pub(crate) fn epoch_at(
        &self,
        epoch: u64,
        begin: (u64, u64),
        carry: &[(u64, u64, u64)],
    ) -> EpochIter<'_> {
        let start = Instant::now();
        // The previous run must be idle before its workers take new jobs.
        let previous = self.last_run.lock_unpoisoned().take();
        let poisoned = self.poisoned.lock_unpoisoned().clone();
        if let Some(msg) = poisoned {
            if let Some(prev) = previous {
                prev.cancel.store(true, Ordering::Release);
            }
            return EpochIter::failed(self, epoch, SampleError::pipeline(msg));
        }
        if let Some(prev) = previous {
            prev.cancel.store(true, Ordering::Release);
            if !prev.wait_finished(Duration::from_secs(30)) {
                self.poison("a worker did not stop after the previous epoch".into());
            }
        }
        if let Some(msg) = self.poisoned.lock_unpoisoned().clone() {
            return EpochIter::failed(self, epoch, SampleError::pipeline(msg));
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
                interleave: self.shared.cfg.shuffling.interleave.max(1),
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
        *self.last_run.lock_unpoisoned() = Some(Arc::clone(&run));
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
            position: begin.into(),
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

    pub(crate) fn poison(&self, msg: String) {
        let mut p = self.poisoned.lock_unpoisoned();
        if p.is_none() {
            *p = Some(msg);
        }
    }
}

impl Drop for Pipeline {
    fn drop(&mut self) {
        if let Some(run) = self.last_run.lock_unpoisoned().take() {
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
