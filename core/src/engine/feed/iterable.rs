//! The iterable feed: workers claim shard groups (`interleave` shards read
//! together, item by item, through a seeded shuffle buffer) and read them
//! part by part; a worker with no group left takes parts from the readers,
//! and a group's short last part is held back for the consumer to merge.
//! Unless the pool is autotuned (or batches hold under 8 rows), a part is
//! read in slices (see [`slices`](super::slices)): its items run through
//! the segment as they are read, before the shuffle buffer.
//!
//! ```text
//! group t: shards order[t·g..] ─▶ part 0, part 1, … (≤ batch_size each; the last may be short → rest)
//! ```

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::budget::Lease;
use crate::component_set::ComponentSet;
use crate::engine::{
    join, settle, EpochRun, ErasedSource, Job, Key, LocalStats, Out, Shared, TaskLog, TaskMsg,
    Work, Worker,
};
use crate::error::{BoxError, ErrorKind, SampleError, Verdict};
use crate::source::{stream_index, ShardEpoch};
use crate::stage::RowFate;
use crate::table::Table;

/// Reads a shard of an iterable source a part (at most one batch) at a time.
pub(crate) trait ShardReader: Send + 'static {
    /// Up to `max` items as a table, the items that failed, and whether the
    /// shard is exhausted.
    fn next_part(&mut self, max: usize) -> (Table, Vec<(u64, BoxError)>, bool);
    /// Reads ahead what the next part's first item waits for (the shuffle
    /// buffer filled, or the group's end), so that this reading can run
    /// before the part is admitted; the items, their order and the errors
    /// [`next_part`](Self::next_part) returns are unchanged. (Nothing, once
    /// [`next_draws`](Self::next_draws) has been called.)
    fn fill(&mut self);
    /// As [`next_part`](Self::next_part), with the items handed out as they
    /// are read from the shards instead of as they leave the shuffle
    /// buffer, which keeps only their indices from then on: the items read
    /// (in shard order; a first call also hands out those read before),
    /// the items that failed, the indices drawn (the same, in the same
    /// order, as `next_part` would give) and whether the shard is
    /// exhausted. It reads at most `max` items, so it may draw fewer than
    /// `max`, or none. Once called, only this reads the reader's items.
    fn next_draws(&mut self, max: usize) -> Draws;
    /// Takes over the streams of `other` (a reader of the same source,
    /// from [`into_any`](Self::into_any)), to read them interleaved.
    fn merge(&mut self, other: Box<dyn std::any::Any + Send>);
    /// This reader, type-erased, for [`merge`](Self::merge).
    fn into_any(self: Box<Self>) -> Box<dyn std::any::Any + Send>;
}

/// What [`ShardReader::next_draws`] read and drew.
pub(crate) struct Draws {
    /// The items read from the shards, in the order read.
    pub(crate) arrived: Table,
    /// Items that failed to read.
    pub(crate) errs: Vec<(u64, BoxError)>,
    /// The indices that left the shuffle buffer, in order.
    pub(crate) drawn: Vec<u64>,
    /// Whether the shard group is exhausted.
    pub(crate) done: bool,
}

/// One open shard of a [`StreamReader`].
pub(crate) struct Stream<O> {
    pub(crate) it: crate::source::ShardIter<O>,
    pub(crate) shard: usize,
    pub(crate) pos: u64,
    pub(crate) exhausted: bool,
}

/// Items a shuffle buffer holds before its first leaves (fewer when its
/// capacity is smaller). From there it must hold one more before each next
/// item leaves, up to its capacity, as WebDataset's `initial` does: a
/// streamed shard's first items leave once this many have arrived, not once
/// the whole buffer (often the whole shard) has; the buffer still grows to
/// its capacity. Which items leave, and when, depends only on the items and
/// the seed. (Read in slices, items run before the buffer, so when they
/// leave does not hold back their decoding.)
pub(crate) const SHUFFLE_START: usize = 32;

/// Reads one shard, or several interleaved item by item (round robin), so
/// that a part holds items of every shard of its group.
pub(crate) struct StreamReader<O> {
    pub(crate) streams: Vec<Stream<O>>,
    /// The stream the next item is read from.
    pub(crate) turn: usize,
    /// Bounded shuffle buffer: items wait here and leave in a random order
    /// drawn from `(seed, epoch, first shard)`, whichever worker reads them
    /// (only their indices once [`next_draws`](ShardReader::next_draws)
    /// has handed the items out).
    pub(crate) buffer: Vec<(u64, Option<O>)>,
    pub(crate) capacity: usize,
    pub(crate) rng: crate::rng::SampleRng,
    pub(crate) exhausted: bool,
    /// Items that have left the buffer (see [`SHUFFLE_START`]).
    pub(crate) emitted: usize,
    /// Items that failed while [`fill`](ShardReader::fill) read ahead, for
    /// the next part.
    pub(crate) failed: Vec<(u64, BoxError)>,
    /// Whether [`next_draws`](ShardReader::next_draws) has handed the
    /// buffer's items out.
    pub(crate) detached: bool,
}

impl<O> StreamReader<O> {
    /// The next item of the next live stream (`None` once all are done).
    pub(crate) fn pull(&mut self) -> Option<(u64, Result<O, BoxError>)> {
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

    /// Fills the shuffle buffer as far as its next item needs (see
    /// [`SHUFFLE_START`]), or to the streams' end; items that fail pass
    /// straight through into `errs`.
    fn top_up(&mut self, errs: &mut Vec<(u64, BoxError)>) {
        let cap = self.capacity.max(1);
        let need = cap.min(SHUFFLE_START.saturating_add(self.emitted));
        while !self.exhausted && self.buffer.len() < need {
            match self.pull() {
                None => self.exhausted = true,
                Some((i, Ok(o))) => self.buffer.push((i, Some(o))),
                Some((i, Err(e))) => errs.push((i, e)),
            }
        }
    }

    /// The buffer's next item out (see [`SHUFFLE_START`]).
    fn draw(&mut self) -> (u64, Option<O>) {
        use rand::Rng;
        let k = if self.capacity > 1 {
            self.rng.random_range(0..self.buffer.len())
        } else {
            0
        };
        self.emitted += 1;
        self.buffer.swap_remove(k)
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
    fn fill(&mut self) {
        let mut errs = std::mem::take(&mut self.failed);
        if self.detached {
            // Only `next_draws` reads a detached buffer's items.
            self.failed = errs;
            return;
        }
        self.top_up(&mut errs);
        self.failed = errs;
    }
    fn next_part(&mut self, max: usize) -> (Table, Vec<(u64, BoxError)>, bool) {
        let mut idx = Vec::with_capacity(max);
        let mut vals = Vec::with_capacity(max);
        let mut errs = std::mem::take(&mut self.failed);
        while idx.len() < max {
            self.top_up(&mut errs);
            if self.buffer.is_empty() {
                break;
            }
            match self.draw() {
                (i, Some(o)) => {
                    idx.push(i);
                    vals.push(o);
                }
                // Handed out by `next_draws`: never dropped unreported.
                (i, None) => errs.push((i, "the item was handed out before it was drawn".into())),
            }
        }
        let done = self.exhausted && self.buffer.is_empty();
        let mut t = Table::with_indices(idx);
        O::put_rows(vals, &mut t);
        (t, errs, done)
    }
    fn next_draws(&mut self, max: usize) -> Draws {
        let mut arrived = Vec::new();
        if !self.detached {
            self.detached = true;
            for (i, o) in &mut self.buffer {
                if let Some(o) = o.take() {
                    arrived.push((*i, o));
                }
            }
        }
        let mut errs = std::mem::take(&mut self.failed);
        let mut drawn = Vec::with_capacity(max);
        // At most `max` items are read per call, so that they run as they
        // arrive: a call may return having drawn fewer, or none.
        let cap = self.capacity.max(1);
        while drawn.len() < max {
            let need = cap.min(SHUFFLE_START.saturating_add(self.emitted));
            if !self.exhausted && self.buffer.len() < need {
                if arrived.len() >= max {
                    break;
                }
                match self.pull() {
                    None => self.exhausted = true,
                    Some((i, Ok(o))) => {
                        arrived.push((i, o));
                        self.buffer.push((i, None));
                    }
                    Some((i, Err(e))) => errs.push((i, e)),
                }
                continue;
            }
            if self.buffer.is_empty() {
                break;
            }
            drawn.push(self.draw().0);
        }
        let done = self.exhausted && self.buffer.is_empty();
        let (idx, vals): (Vec<u64>, Vec<O>) = arrived.into_iter().unzip();
        let mut t = Table::with_indices(idx);
        O::put_rows(vals, &mut t);
        Draws {
            arrived: t,
            errs,
            drawn,
            done,
        }
    }
}

/// A part read from shard group `major`, to be run through the first
/// segment by another worker.
pub(crate) struct Handoff {
    pub(crate) major: u64,
    pub(crate) part: u64,
    /// The part's first row, already through the segment (see
    /// [`probe`](crate::engine::probe)): joined in front of `table` once
    /// the segment has run over it.
    pub(crate) front: Option<Table>,
    pub(crate) table: Table,
    pub(crate) log: TaskLog,
    /// The group's last part.
    pub(crate) done: bool,
    /// The part's bytes, counted in the byte budget from the hand-off on
    /// (a part a reader runs itself is counted once it is forwarded).
    pub(crate) lease: Lease,
    /// A slice of a part its reader is still reading (see
    /// [`slices`](super::slices)): run and sent back there, not forwarded.
    pub(crate) reply: Option<flume::Sender<super::slices::Assisted>>,
}

/// A short part held back: `(shard group position, part, first row held)`.
pub(crate) type CarryId = (u64, u64, u64);

/// Short parts of an iterable source waiting to fill a batch, in the order
/// the consumer received them.
#[derive(Default)]
pub(crate) struct Carry {
    pub(crate) table: Table,
    pub(crate) lease: Option<Lease>,
    /// Each part held: `(group, part, first row held)` and its rows held.
    pub(crate) segs: Vec<((u64, u64, u64), usize)>,
}

impl Carry {
    /// The parts held, as a saved state names them.
    pub(crate) fn segments(&self) -> Vec<(u64, u64, u64)> {
        self.segs.iter().map(|s| s.0).collect()
    }

    pub(crate) fn push(
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
            SampleError::pipeline(format!(
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
    pub(crate) fn take_front(&mut self, n: usize) -> (Table, Option<Lease>) {
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

/// Opens `shards` as one reader that interleaves them, each open under the
/// policy (retried, then skipped or stopping the group; a shard that cannot
/// be opened is named by its first item's index and its path). `None` when
/// none opened or the group must stop (`log.fail`).
pub(crate) fn open_group(
    shared: &Shared,
    shards: &[usize],
    buffer: usize,
    seed: u64,
    at: ShardEpoch,
    stats: &mut LocalStats,
    log: &mut TaskLog,
) -> Option<Box<dyn ShardReader>> {
    let ErasedSource::Iter { key, open, .. } = &shared.source else {
        return None;
    };
    let policy = shared.cfg.policy;
    let mut reader: Option<Box<dyn ShardReader>> = None;
    for &shard in shards {
        let mut failures = 0;
        loop {
            match open(shard, buffer, seed, at) {
                Ok(r) => {
                    match &mut reader {
                        Some(base) => base.merge(r.into_any()),
                        None => reader = Some(r),
                    }
                    break;
                }
                Err(e) => {
                    failures += 1;
                    let err = || {
                        SampleError::new(
                            Some(stream_index(shard, 0)),
                            Some(key(shard)),
                            "source",
                            ErrorKind::Failed(crate::error::error_chain(e.as_ref())),
                            failures,
                        )
                    };
                    match settle(stats, log, 0, policy.verdict(failures), err) {
                        RowFate::Retry => continue,
                        RowFate::Skip => break,
                        RowFate::Stop => return None,
                    }
                }
            }
        }
    }
    reader
}

/// The `n`-th item of the stream in shard order, unshuffled (what
/// [`crate::Pipeline::inspect`] reads): each shard opened under the policy
/// as a worker opens it, an item that fails to read counted as an item.
/// `Ok(None)` when the stream is shorter, with its length; an open that
/// must stop the epoch leaves its error in `log`.
pub(crate) fn nth_item(
    shared: &Shared,
    n: u64,
    stats: &mut LocalStats,
    log: &mut TaskLog,
) -> Result<Table, (Option<u64>, BoxError)> {
    let ErasedSource::Iter { shards, .. } = &shared.source else {
        return Err((None, "not an iterable source".into()));
    };
    let mut seen = 0u64;
    for shard in 0..*shards {
        let at = ShardEpoch {
            seed: shared.cfg.shuffling.seed,
            epoch: 0,
        };
        let Some(mut reader) = open_group(shared, &[shard], 0, 0, at, stats, log) else {
            if log.fail.is_some() {
                return Err((None, "the shard could not be opened".into()));
            }
            continue;
        };
        loop {
            let (t, errs, done) = reader.next_part(1);
            if let Some((idx, e)) = errs.into_iter().next() {
                if seen == n {
                    return Err((Some(idx), e));
                }
                seen += 1;
            } else if !t.is_empty() {
                if seen == n {
                    return Ok(t);
                }
                seen += 1;
            }
            if done {
                break;
            }
        }
    }
    Err((
        None,
        format!("index {n} is past the end: the stream has {seen} samples").into(),
    ))
}

/// The seed of a shard group's shuffle buffer: drawn from its first shard.
pub(crate) fn group_seed(seed: u64, epoch: u64, first_shard: usize) -> u64 {
    crate::rng::derive_seed(&[seed, epoch, first_shard as u64, 0x5342_5546])
}

/// Counts a worker out of [`EpochRun::readers`] when it stops reading,
/// also by a panic.
pub(crate) struct ReaderGuard<'a>(pub(crate) &'a AtomicUsize);

impl Drop for ReaderGuard<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

impl Worker {
    /// Opens an epoch's shard group as [`open_group`] does, with the
    /// pipeline's shuffle buffer seeded for the group.
    fn open_epoch_group(
        &mut self,
        epoch: u64,
        shards: &[usize],
        log: &mut TaskLog,
    ) -> Option<Box<dyn ShardReader>> {
        let shared = Arc::clone(&self.shared);
        let seed = group_seed(shared.cfg.shuffling.seed, epoch, shards[0]);
        let buffer = shared.cfg.shuffling.shuffle_buffer;
        let at = ShardEpoch {
            seed: shared.cfg.shuffling.seed,
            epoch,
        };
        open_group(&shared, shards, buffer, seed, at, &mut self.stats, log)
    }

    /// Reads shard groups (each claimed by one worker, its shards opened and
    /// read part by part in order) and runs the first segment over the parts.
    /// A reader hands a part to a worker that has no group left, when one is
    /// waiting, instead of running the segment itself — so a single long
    /// shard, or the last groups of an epoch, still keep every worker busy.
    /// Parts keep their keys, so the consumer's order is unchanged. (Not
    /// with autotune, whose pool sizes follow each worker's own costs.)
    pub(crate) fn run_iter_source(
        &mut self,
        job: &Job,
        order: &[usize],
        group: usize,
        skip_parts: u64,
    ) {
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
    pub(crate) fn help_readers(&mut self, job: &Job, groups: u64) {
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
                    if self.take_handoff(job, h).is_none() {
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
    pub(crate) fn finish_part(&mut self, job: &Job, h: Handoff) -> Option<bool> {
        let Handoff {
            major,
            part,
            front,
            mut table,
            mut log,
            done,
            mut lease,
            reply: _,
        } = h;
        if log.fail.is_none() {
            self.run_segment(&job.run, &mut table, &mut log, &mut lease);
        }
        if let Some(front) = front {
            table = join(front, table, &mut log);
        }
        if log.fail.is_some() {
            // Under the stop policy a part (one batch) is cut whole.
            table.truncate(0);
        }
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
    pub(crate) fn read_part(
        &mut self,
        run: &EpochRun,
        t: u64,
        part: u64,
    ) -> Result<(Table, Lease), SampleError> {
        let shared = Arc::clone(&self.shared);
        let (
            ErasedSource::Iter { .. },
            Work::Iter {
                order, interleave, ..
            },
        ) = (&shared.source, &run.work)
        else {
            return Err(SampleError::pipeline(
                "only iterable sources hold parts back".into(),
            ));
        };
        let g = (*interleave).max(1);
        let lo = usize::try_from(t).unwrap_or(usize::MAX).saturating_mul(g);
        if lo >= order.len() {
            return Err(SampleError::pipeline(format!(
                "the saved state holds back a part of shard group {t}, but this epoch has {} groups",
                order.len().div_ceil(g)
            )));
        }
        let shards = &order[lo..(lo + g).min(order.len())];
        let policy = shared.cfg.policy;
        // A shard skipped here was skipped (and reported) in the run that
        // saved the state, too: this log is not reported again.
        let mut log = TaskLog::default();
        let reader = self.open_epoch_group(run.epoch, shards, &mut log);
        if let Some(e) = log.fail {
            return Err(e);
        }
        let bs = shared.cfg.batching.size;
        let Some(mut reader) = reader else {
            return Ok((Table::new(), shared.budget.lease(0)));
        };
        for _ in 0..part {
            let (_, _, done) = reader.next_part(bs);
            if done {
                return Err(SampleError::pipeline(format!(
                    "the saved state holds back part {part} of shard group {t}, which has fewer parts"
                )));
            }
        }
        let (table, errs, _) = reader.next_part(bs);
        if policy.final_verdict() == Verdict::Stop {
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

    /// Settles the items a shard could not yield under the policy's final
    /// verdict (such an item cannot be retried), named by index, key and
    /// the `source` stage; whether one stops the part.
    pub(crate) fn settle_source_errors(
        &mut self,
        errs: Vec<(u64, BoxError)>,
        log: &mut TaskLog,
    ) -> bool {
        let shared = Arc::clone(&self.shared);
        let verdict = shared.cfg.policy.final_verdict();
        let mut failed = false;
        for (idx, e) in errs {
            let err = || SampleError::from_box(Some(idx), shared.source.key_of(idx), "source", &e);
            failed |= matches!(settle(&mut self.stats, log, 0, verdict, err), RowFate::Stop);
        }
        failed
    }

    pub(crate) fn read_groups(
        &mut self,
        job: &Job,
        order: &[usize],
        group: usize,
        skip_parts: u64,
    ) {
        let first = job.run.start.0;
        let run = &job.run;
        let shared = Arc::clone(&self.shared);
        let ErasedSource::Iter { .. } = &shared.source else {
            return;
        };
        let bs = shared.cfg.batching.size;
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
            // The group is opened, and while the segment is unmeasured its
            // shuffle buffer filled, before its first part is admitted: what
            // the part's first item waits for is read while the budget still
            // waits for a first measurement (the buffer sits before the
            // budget's accounting), not after it. A part read in slices runs
            // its items as they are read instead (see `slices`).
            let shards = &order[t as usize * g..((t as usize + 1) * g).min(order.len())];
            let mut log = TaskLog::default();
            let started = Instant::now();
            let slices_next = !tuned && super::slices::slice_rows(bs).is_some();
            let reader = self
                .open_epoch_group(run.epoch, shards, &mut log)
                .map(|mut r| {
                    if !slices_next {
                        r.fill();
                    }
                    r
                });
            self.stats.timed_ns[0] += started.elapsed().as_nanos() as u64;
            // The lease of the group's first part.
            let first_part = if t == first { skip_parts } else { 0 };
            let Some(lease) = self.admit(run, (t, first_part), Some(shared.window), bs) else {
                return;
            };
            let mut first_lease = Some(lease);
            self.meter_begin();
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
            // A group read in slices runs its items as they are read; they
            // wait here (see `slices`).
            let mut ready = super::slices::Ready::new(&shared.budget);
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
                if let (false, Some(slice)) = (tuned, super::slices::slice_rows(bs)) {
                    let log = std::mem::take(&mut log);
                    let Some(h) = self.read_sliced(
                        job,
                        reader.as_mut(),
                        &mut ready,
                        (t, part),
                        (bs, slice),
                        log,
                        lease,
                    ) else {
                        return;
                    };
                    match self.finish_part(job, h) {
                        None => return,
                        Some(true) => break,
                        Some(false) => part += 1,
                    }
                    continue;
                }
                let probe = bs > 1 && self.needs_probe();
                let (front, mut table, errs, done, dt) = if probe {
                    let collates = matches!(job.out, Out::Final(_));
                    self.read_probed(run, reader.as_mut(), bs, &mut log, &mut lease, collates)
                } else {
                    let started = Instant::now();
                    let (table, errs, done) = reader.next_part(bs);
                    (None, table, errs, done, started.elapsed().as_nanos() as u64)
                };
                lease.grow_to(table.nbytes());
                let read = (table.len() + usize::from(front.is_some())) as u64;
                self.stats.timed_ns[0] += dt;
                self.stats.timed_n[0] += read;
                self.stats.samples[0] += read;
                let failed = self.settle_source_errors(errs, &mut log);
                if failed {
                    table.truncate(0);
                }
                let mut h = Handoff {
                    major: t,
                    part,
                    front,
                    table,
                    log: std::mem::take(&mut log),
                    done,
                    lease,
                    reply: None,
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
}
