//! A part read in slices: once the first segment has been measured, a
//! worker reads its part of a shard group a quarter of a batch at a time
//! and runs the segment over each slice as it arrives, instead of waiting
//! for the whole part. A slice goes to a worker with no group left
//! (an *assist*: it runs the segment and sends the slice back) when one is
//! idle; the part's last slice the reader runs itself. The slices are joined
//! in order into one part, forwarded as before.
//!
//! The part is unchanged: [`StreamReader::next_part`](super::iterable::StreamReader)
//! reads item by item, so reading `bs` items as slices draws the same items,
//! in the same order and with the same shuffle, as one read; stages run
//! row by row. What changes is when rows start: with a streamed shard a
//! part's first rows are decoded while its last bytes are still on the
//! wire, and the epoch's last part runs on every idle worker, a slice each,
//! instead of on one.
//!
//! ```text
//! reader:  read s0 ─▶ segment s0 ─┐ read s1 ─▶ assist ──▶ read s2 ─▶ segment s2 ─┐ read s3 ─▶ segment s3
//! helper:                         │           segment s1 ─▶ reply ───────────────┤
//!                                 └──────────── join [s0, s1, s2, s3] ◀──────────┴─▶ forward (one part)
//! ```
//!
//! While it waits for an assisted slice the reader runs whatever waits in
//! the hand-off queue (its own slice first, when no helper has taken it),
//! so a wait never depends on a helper still being there.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::budget::Lease;
use crate::error::SampleError;
use crate::table::Table;

use super::iterable::{Handoff, ShardReader};
use crate::engine::probe::join;
use crate::engine::*;

/// Rows per slice of a part of `bs` rows: a quarter of a batch. Parts of
/// fewer than 8 rows are read whole.
pub(crate) fn slice_rows(bs: usize) -> Option<usize> {
    (bs >= 8).then(|| bs.div_ceil(4))
}

/// A slice run by a helper, sent back to its reader.
pub(crate) struct Assisted {
    pub(crate) table: Table,
    pub(crate) log: TaskLog,
    pub(crate) lease: Lease,
}

/// A slice of the part being read: run, or away at a helper.
enum Slice {
    Ran(Table, TaskLog),
    Away(flume::Receiver<Assisted>),
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
    /// slices of `slice` rows and runs the segment over each as it arrives
    /// (see the [module docs](self)). Returns the part through the segment,
    /// as a [`Handoff`] whose `front` holds it (so
    /// [`finish_part`](Self::finish_part) forwards it as a part read whole
    /// would be), or `None` when the epoch is cancelled or the receiver is
    /// gone.
    pub(crate) fn read_sliced(
        &mut self,
        job: &Job,
        reader: &mut dyn ShardReader,
        (major, part): (u64, u64),
        (bs, slice): (usize, usize),
        mut log: TaskLog,
        mut lease: Lease,
    ) -> Option<Handoff> {
        let run = &job.run;
        let shared = Arc::clone(&self.shared);
        let mut slices: Vec<Slice> = Vec::with_capacity(bs.div_ceil(slice));
        let mut got = 0usize;
        // Bytes of the slices run so far (an assisted one once it is back).
        let mut ran_bytes = 0usize;
        let mut done = false;
        while got < bs && !done {
            if run.cancelled() {
                return None;
            }
            let want = slice.min(bs - got);
            let started = Instant::now();
            let (mut table, errs, end) = reader.next_part(want);
            let dt = started.elapsed().as_nanos() as u64;
            done = end;
            got += table.len();
            let read = table.len() as u64;
            self.stats.timed_ns[0] += dt;
            self.stats.timed_n[0] += read;
            self.stats.samples[0] += read;
            let mut slog = TaskLog::default();
            let failed = self.settle_source_errors(errs, &mut slog);
            // (A short read is the group's end: `done` is set.)
            let last = done || got >= bs;
            lease.grow_to(ran_bytes + table.nbytes());
            if failed {
                table.truncate(0);
                slices.push(Slice::Ran(table, slog));
                break;
            }
            if !last && run.idle_helpers.load(Ordering::Acquire) > run.handoff.0.len() {
                let (tx, rx) = flume::bounded(1);
                let h = Handoff {
                    major,
                    part,
                    front: None,
                    table,
                    log: slog,
                    done: false,
                    lease: shared.budget.lease(0),
                    reply: Some(tx),
                };
                match run.handoff.0.try_send(h) {
                    Ok(()) => {
                        slices.push(Slice::Away(rx));
                        continue;
                    }
                    Err(flume::TrySendError::Full(back))
                    | Err(flume::TrySendError::Disconnected(back)) => {
                        table = back.table;
                        slog = back.log;
                    }
                }
            }
            let mut sl = shared.budget.lease(0);
            self.run_segment(run, &mut table, &mut slog, &mut sl);
            ran_bytes += table.nbytes();
            lease.grow_to(ran_bytes);
            let stop = slog.fail.is_some();
            slices.push(Slice::Ran(table, slog));
            if stop {
                // Under the stop policy the part is cut whole: read no more.
                break;
            }
        }
        let mut out = Table::new();
        for s in slices {
            let (table, slog) = match s {
                Slice::Ran(t, l) => (t, l),
                Slice::Away(rx) => {
                    let Assisted {
                        table,
                        log: slog,
                        lease: held,
                    } = self.await_slice(job, &rx)?;
                    // The part's lease takes over the slice's bytes.
                    ran_bytes += table.nbytes();
                    lease.grow_to(ran_bytes);
                    drop(held);
                    (table, slog)
                }
            };
            absorb(&mut log, slog);
            out = join(out, table, &mut log);
        }
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
