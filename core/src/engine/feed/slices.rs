//! A part read in slices: once the first segment has been measured, a
//! worker reads its part of a shard group a quarter of a batch at a time,
//! and runs the segment over the items as they are read from the shards,
//! before they enter the shuffle buffer: the buffer keeps their indices,
//! the rows through the segment wait in the group's [`Ready`] pool, and a
//! part takes the rows its draws name. A slice's items go to a worker with
//! no group left (an *assist*: it runs the segment and sends the rows back)
//! when one is idle; the part's last slice the reader runs itself.
//!
//! The part is unchanged: [`StreamReader::next_draws`](super::iterable::StreamReader)
//! reads and draws item by item as `next_part` does, so the same items
//! leave the buffer in the same order with the same shuffle; stages run row
//! by row. What changes is when rows run: with a streamed shard an item is
//! decoded once it has arrived, not once it leaves a buffer that lets one
//! item out per two that arrive while it grows (the rest leaving in a burst
//! after the shard's last byte), and the epoch's last part runs on every
//! idle worker, a slice each, instead of on one. A sample that fails is
//! reported with the part being read when it ran. The rows waiting in the
//! pool count in the byte budget: items run early only while it has room
//! for their rows and a task more, and otherwise wait unrun and run once
//! drawn.
//!
//! ```text
//! reader:  read s0 ─▶ segment s0 ─┐ read s1 ─▶ assist ──▶ read s2 ─▶ segment s2 ─┐ read s3 ─▶ segment s3
//! helper:                         │           segment s1 ─▶ reply ───────────────┤
//!                                 └─▶ ready pool ◀──────────────────────────────┴─▶ take the part's draws ─▶ forward
//! ```
//!
//! While it waits for an assisted slice the reader runs whatever waits in
//! the hand-off queue (its own slice first, when no helper has taken it),
//! so a wait never depends on a helper still being there.

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::budget::{ByteBudget, Lease};
use crate::error::SampleError;
use crate::table::Table;

use super::iterable::{Handoff, ShardReader};
use crate::engine::{Job, Out, TaskLog, Worker};

/// Rows per slice of a part of `bs` rows: a quarter of a batch. Parts of
/// fewer than 8 rows are read whole.
pub(crate) fn slice_rows(bs: usize) -> Option<usize> {
    (bs >= 8).then(|| bs.div_ceil(4))
}

/// Rows by dataset index, taken out in any order.
#[derive(Default)]
struct Rows {
    table: Table,
    /// The row of each index in `table`.
    at: HashMap<u64, usize>,
}

impl Rows {
    /// Adds `table`'s rows; why not, when its components differ from those
    /// held or an index is already here.
    fn put(&mut self, table: Table) -> Result<(), String> {
        let base = self.table.len();
        let idx = table.indices().to_vec();
        self.table
            .append(table)
            .map_err(|cols| format!("rows of one shard group hold different components: {cols}"))?;
        for (k, i) in idx.into_iter().enumerate() {
            if self.at.insert(i, base + k).is_some() {
                // Indices name (shard, position): one shard read twice.
                return Err(format!("sample {i} was read twice in one shard group"));
            }
        }
        Ok(())
    }

    /// The rows of `drawn` that are here, in that order.
    fn take(&mut self, drawn: &[u64]) -> Table {
        let mut out = Table::new();
        for i in drawn {
            let Some(row) = self.at.remove(i) else {
                continue;
            };
            let last = self.table.len() - 1;
            let moved = self.table.indices()[last];
            if self.table.swap_remove_into(row, &mut out) && row != last {
                self.at.insert(moved, row);
            }
        }
        out
    }
}

/// The items of a shard group read but not yet drawn from its shuffle
/// buffer: run through the segment as they were read (`ran`; their bytes
/// held by the part's lease while a part is read, by `carried` between
/// parts), or, when the byte budget had no room for them, waiting to run
/// once drawn (`raw`, before the budget's accounting, as items in a shuffle
/// buffer are).
pub(crate) struct Ready {
    ran: Rows,
    raw: Rows,
    /// Bytes of the rows in `ran`.
    bytes: usize,
    carried: Lease,
}

impl Ready {
    pub(crate) fn new(budget: &Arc<ByteBudget>) -> Self {
        Ready {
            ran: Rows::default(),
            raw: Rows::default(),
            bytes: 0,
            carried: budget.lease(0),
        }
    }

    /// Adds rows run through the segment (or, `raw`, items to run once
    /// drawn); a failure goes to `log`.
    fn put(&mut self, table: Table, raw: bool, log: &mut TaskLog) {
        if table.is_empty() {
            return;
        }
        let bytes = table.nbytes();
        let put = if raw {
            self.raw.put(table)
        } else {
            self.ran.put(table).map(|()| self.bytes += bytes)
        };
        if let Err(why) = put {
            log.fail.get_or_insert_with(|| SampleError::pipeline(why));
        }
    }

    /// The rows of `drawn` run through the segment, in that order. An index
    /// with no row here was skipped when it ran (and reported then).
    fn take(&mut self, drawn: &[u64]) -> Table {
        let out = self.ran.take(drawn);
        self.bytes = self.bytes.saturating_sub(out.nbytes());
        out
    }
}

/// A slice run by a helper, sent back to its reader.
pub(crate) struct Assisted {
    pub(crate) table: Table,
    pub(crate) log: TaskLog,
    pub(crate) lease: Lease,
}

/// `lease` takes over `other`'s charge and then holds what it held or
/// `bytes`, the larger (so the bytes are never counted twice on the way).
fn take_over(lease: &mut Lease, other: Lease, bytes: usize) {
    let want = lease.bytes().max(bytes);
    lease.absorb(other);
    lease.resize(want);
}

/// `other`'s errors and retries after `log`'s; its failure only when `log`
/// has none.
fn absorb(log: &mut TaskLog, other: TaskLog) {
    log.skipped.extend(other.skipped);
    log.retries += other.retries;
    if log.fail.is_none() {
        log.fail = other.fail;
    }
}

impl Worker {
    /// Runs what a reader handed off: a part (run and forwarded; `None` when
    /// the receiver is gone, else whether it ended its group) or a slice
    /// (run and sent back to its reader).
    pub(crate) fn take_handoff(&mut self, job: &Job, mut h: Handoff) -> Option<bool> {
        self.meter_begin();
        let Some(reply) = h.reply.take() else {
            return self.finish_part(job, h);
        };
        let rows = h.table.len();
        if h.log.fail.is_none() {
            self.run_segment(&job.run, &mut h.table, &mut h.log, &mut h.lease);
        }
        self.meter_end(rows);
        self.stats.flush(&self.shared);
        if let Some(sink) = &self.shared.trace {
            sink.flush(&mut self.trace_buf);
        }
        // The reader may have stopped waiting (its epoch cancelled): the
        // slice is dropped with its lease.
        let _ = reply.send(Assisted {
            table: h.table,
            log: h.log,
            lease: h.lease,
        });
        Some(false)
    }

    /// Reads part `part` of shard group `major` (at most `bs` rows) in
    /// slices of `slice` draws, running the segment over the items as they
    /// are read into `ready` (see the [module docs](self)). Returns the
    /// part through the segment, as a [`Handoff`] whose `front` holds it
    /// (so [`finish_part`](Self::finish_part) forwards it as a part read
    /// whole would be), or `None` when the epoch is cancelled or the
    /// receiver is gone.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn read_sliced(
        &mut self,
        job: &Job,
        reader: &mut dyn ShardReader,
        ready: &mut Ready,
        (major, part): (u64, u64),
        (bs, slice): (usize, usize),
        mut log: TaskLog,
        mut lease: Lease,
    ) -> Option<Handoff> {
        let run = &job.run;
        let shared = Arc::clone(&self.shared);
        let mut drawn: Vec<u64> = Vec::with_capacity(bs);
        let mut away: Vec<flume::Receiver<Assisted>> = Vec::new();
        let mut done = false;
        // The part's lease holds the rows carried from the parts before.
        let carried = std::mem::replace(&mut ready.carried, shared.budget.lease(0));
        let held = carried.bytes();
        take_over(&mut lease, carried, held);
        while drawn.len() < bs && !done {
            if run.cancelled() {
                return None;
            }
            // Until the segment is measured, one item at a time: the
            // first row's figures admit the other workers (as a probe's do).
            let unmeasured = self.needs_probe();
            let want = if unmeasured {
                1
            } else {
                slice.min(bs - drawn.len())
            };
            let started = Instant::now();
            let d = reader.next_draws(want);
            let dt = started.elapsed().as_nanos() as u64;
            done = d.done;
            drawn.extend_from_slice(&d.drawn);
            let read = d.arrived.len() as u64;
            self.stats.timed_ns[0] += dt;
            self.stats.timed_n[0] += read;
            self.stats.samples[0] += read;
            if self.settle_source_errors(d.errs, &mut log) {
                break;
            }
            let mut table = d.arrived;
            if table.is_empty() {
                continue;
            }
            // Run now only while the budget has room for the rows (as the
            // segment last measured them) and a task more: otherwise once
            // drawn.
            let per_row = shared.row_bytes[self.seg].load(Ordering::Relaxed);
            let grow =
                (ready.bytes + per_row.saturating_mul(table.len())).saturating_sub(lease.bytes());
            let headroom = shared.task_bytes(bs).unwrap_or(0);
            if !unmeasured && !shared.budget.fits(grow.saturating_add(headroom)) {
                ready.put(table, true, &mut log);
                continue;
            }
            lease.grow_to(ready.bytes + table.nbytes());
            // (A short read is the group's end: `done` is set.)
            let last = done || drawn.len() >= bs;
            if !last
                && !unmeasured
                && run.idle_helpers.load(Ordering::Acquire) > run.handoff.0.len()
            {
                let (tx, rx) = flume::bounded(1);
                let h = Handoff {
                    major,
                    part,
                    front: None,
                    table,
                    log: TaskLog::default(),
                    done: false,
                    lease: shared.budget.lease(0),
                    reply: Some(tx),
                };
                match run.handoff.0.try_send(h) {
                    Ok(()) => {
                        away.push(rx);
                        continue;
                    }
                    Err(flume::TrySendError::Full(back))
                    | Err(flume::TrySendError::Disconnected(back)) => table = back.table,
                }
            }
            let mut sl = shared.budget.lease(0);
            let mut slog = TaskLog::default();
            self.run_segment(run, &mut table, &mut slog, &mut sl);
            let stop = slog.fail.is_some();
            if unmeasured && !stop && !table.is_empty() {
                shared.note_row_bytes(self.seg, table.nbytes(), table.len());
                if matches!(job.out, Out::Final(_)) {
                    shared.estimate_batch_bytes(table.nbytes(), table.len());
                }
            }
            absorb(&mut log, slog);
            ready.put(table, false, &mut log);
            take_over(&mut lease, sl, ready.bytes);
            if stop {
                // Under the stop policy the part is cut whole: read no more.
                break;
            }
        }
        for rx in away {
            let Assisted {
                table,
                log: slog,
                lease: held,
            } = self.await_slice(job, &rx)?;
            absorb(&mut log, slog);
            ready.put(table, false, &mut log);
            take_over(&mut lease, held, ready.bytes);
        }
        // Drawn items that waited unrun run now.
        let mut late = ready.raw.take(&drawn);
        if !late.is_empty() && log.fail.is_none() {
            lease.grow_to(ready.bytes + late.nbytes());
            let mut slog = TaskLog::default();
            self.run_segment(run, &mut late, &mut slog, &mut lease);
            absorb(&mut log, slog);
            ready.put(late, false, &mut log);
            lease.grow_to(ready.bytes);
        }
        let out = ready.take(&drawn);
        // The rows left for later parts keep their share of the lease.
        ready.carried = lease.split(ready.bytes);
        lease.grow_to(out.nbytes());
        Some(Handoff {
            major,
            part,
            front: Some(out),
            table: Table::new(),
            log,
            done,
            lease,
            reply: None,
        })
    }

    /// Waits for a slice a helper runs, running what waits in the hand-off
    /// queue meanwhile. `None` when the epoch is cancelled or the receiver
    /// is gone.
    fn await_slice(&mut self, job: &Job, rx: &flume::Receiver<Assisted>) -> Option<Assisted> {
        let run = &job.run;
        loop {
            match rx.recv_timeout(Duration::from_millis(1)) {
                Ok(a) => return Some(a),
                Err(flume::RecvTimeoutError::Timeout) => {
                    if run.cancelled() {
                        return None;
                    }
                    if let Ok(h) = run.handoff.1.try_recv() {
                        self.take_handoff(job, h)?;
                    }
                }
                Err(flume::RecvTimeoutError::Disconnected) => {
                    // The helper dropped the slice unrun: only when its
                    // worker panicked, which cancels the epoch.
                    let mut log = TaskLog::default();
                    if !run.cancelled() {
                        log.fail = Some(SampleError::pipeline(
                            "a worker stopped while it ran a slice of a part".into(),
                        ));
                    }
                    return Some(Assisted {
                        table: Table::new(),
                        log,
                        lease: self.shared.budget.lease(0),
                    });
                }
            }
        }
    }
}
