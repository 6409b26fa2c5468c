//! The consumer side: [`EpochIter`] receives tasks, puts them back in key
//! order, merges iterable sources' short parts into full batches, and keeps
//! the exact position a saved state resumes from.
//!
//! ```
//! use ferrofeed_core::prelude::*;
//! let p = Pipeline::builder(FnSource::new(100, |i| Ok(i as i64)))
//!     .batch_size(10)
//!     .collate(StackCollate::new().column::<i64>("x"))
//!     .build()
//!     .unwrap();
//! let mut it = p.epoch(0);
//! it.next().unwrap().unwrap();
//! let rest: usize = p.resume(&it.state()).unwrap().map(|b| b.unwrap().len()).sum();
//! assert_eq!(rest, 90);
//! ```

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::batch::Batch;
use crate::budget::Lease;
use crate::error::{ErrorKind, SampleError};
use crate::metrics::EpochSummary;
use crate::table::Table;

use super::Pipeline;

use crate::engine::{
    Carry, CarryId, EpochRun, ErasedSource, Key, TaskLog, TaskMsg, TaskOut, Worker,
};
use crate::sync::LockExt;

/// The batches of one epoch, in sampler order unless the pipeline is
/// `unordered`. Yields `Err` once for a failing sample under `Fail`, then ends.
pub struct EpochIter<'p> {
    pub(crate) pipeline: &'p Pipeline,
    pub(crate) run: Option<Arc<EpochRun>>,
    pub(crate) rx: Option<flume::Receiver<TaskOut>>,
    /// Batches to yield, each with the carry as it stands once it is yielded.
    pub(crate) ready: VecDeque<(Batch, Vec<CarryId>)>,
    pub(crate) pending_err: Option<SampleError>,
    pub(crate) reorder: BTreeMap<Key, TaskOut>,
    pub(crate) next_key: Key,
    /// Per major: parts received, parts in all (once the last arrived), and
    /// the major that follows it.
    pub(crate) parts: HashMap<u64, (u64, Option<u64>, u64)>,
    /// Complete majors not yet contiguous with `low`: start → next.
    pub(crate) complete: BTreeMap<u64, u64>,
    /// Every major below this one has been received in full.
    pub(crate) low: u64,
    pub(crate) majors: u64,
    pub(crate) finished: bool,
    pub(crate) summary: EpochSummary,
    pub(crate) start: Instant,
    pub(crate) batches_hint: Option<usize>,
    pub(crate) epoch: u64,
    /// Where the next batch starts: `(plan batch, 0)` or `(shard group position,
    /// part)`.
    pub(crate) position: Key,
    /// With `position`: the short parts received but not yet delivered
    /// (iterable sources; see [`PipelineState::carry`]).
    ///
    /// [`PipelineState::carry`]: crate::state::PipelineState::carry
    pub(crate) position_carry: Vec<(u64, u64, u64)>,
    /// Short parts waiting to fill a batch.
    pub(crate) carry: Carry,
    /// Runs the consumer's own work: merged batches' collate, re-read parts.
    pub(crate) local: Worker,
    /// Recent per-batch waits, for the slow-batch warning.
    pub(crate) recent_waits: VecDeque<Duration>,
    pub(crate) last_summary_line: Instant,
    /// Batches yielded since the last receive (see `Shared::queue_len`).
    pub(crate) yielded: usize,
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
    pub(crate) fn failed(pipeline: &'p Pipeline, epoch: u64, err: SampleError) -> Self {
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
            position: Key::new(0, 0),
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
    pub(crate) fn watch_wait(&mut self, wait: Duration) {
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
            return self.pipeline.state_at(self.epoch + 1, Key::default());
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
                            return Recv::Error(SampleError::new(
                                Some(index),
                                shared.source.key_of(index),
                                node.name.as_str(),
                                ErrorKind::TimedOut(limit),
                                1,
                            ));
                        }
                    }
                }
            }
        }
    }

    pub(crate) fn absorb(&mut self, out: TaskOut) {
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
        if self.pipeline.shared.cfg.scheduling.ordered {
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
            let bs = self.pipeline.shared.cfg.batching.size;
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
    pub(crate) fn collate_merged(&mut self, table: Table, lease: Option<Lease>, key: Key) {
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
        if let Some(sink) = &shared.trace {
            // This thread's collate slices, on the consumer's track.
            for e in &mut self.local.trace_buf {
                e.tid = 0;
            }
            sink.flush(&mut self.local.trace_buf);
        }
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
    pub(crate) fn read_carry(&mut self, carry: &[(u64, u64, u64)]) -> Result<(), SampleError> {
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

    pub(crate) fn finish(&mut self, completed: bool) {
        if self.finished {
            return;
        }
        self.finished = true;
        self.summary.completed = completed;
        self.summary.seconds = self.start.elapsed().as_secs_f64();
        if self.pipeline.shared.cfg.recording.metrics {
            self.pipeline.shared.close_timeline_interval();
        }
        if let Some(run) = &self.run {
            if !completed {
                run.cancel.store(true, Ordering::Release);
                self.pipeline.shared.budget.notify();
            }
        }
        self.rx = None;
        self.reorder.clear();
        *self.pipeline.last_summary.lock_unpoisoned() = Some(self.summary.clone());
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
                    Key::new(b.pos.0 + 1, 0)
                } else {
                    Key::new(b.pos.0, b.pos.1 + 1)
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
                    if !self.pipeline.shared.cfg.batching.drop_last {
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
            if self.pipeline.shared.cfg.scheduling.ordered {
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
                    if self.pipeline.shared.cfg.scheduling.ordered && out.key != self.next_key {
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
                    self.pending_err = Some(SampleError::pipeline(msg));
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
