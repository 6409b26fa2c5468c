//! The first row alone: until a segment has been measured, the byte budget
//! admits only the task the consumer needs next (a task's bytes are unknown
//! until one has moved through every segment and collate), so a pipeline's
//! first task runs on one worker while the others wait. A worker whose
//! segment is not yet measured therefore runs the first row of its task
//! through the segment before the rest and records what it weighs (in the
//! last segment, also a provisional figure for its collated row: see
//! `Shared::estimate_batch_bytes`): the other workers are admitted after one
//! row's work instead of one task's. (An iterable part read in slices
//! measures its first item the same way, reading one item at a time until
//! the segment is measured: see [`slices`](super::feed::slices).)
//!
//! The task is unchanged: its rows are read in the same order (an iterable
//! part is read as one row and then the rest, which draws the same items
//! and the same shuffle), run through the same row-wise stages, and joined
//! back, first row first, into one part.
//!
//! ```text
//! unmeasured: read row 0 ─▶ segment ─▶ measure (+ collated row, estimated) ─▶ notify budget
//!             read rows 1.. ─▶ segment ─▶ join [row 0, rows 1..] ─▶ forward
//! ```

use std::sync::Arc;

use crate::budget::Lease;
use crate::engine::{EpochRun, ShardReader, TaskLog, Worker};
use crate::error::{BoxError, SampleError};
use crate::table::Table;

impl Worker {
    /// Whether this worker's tasks should send a first row ahead: its
    /// segment has not been measured yet (tuned pools size themselves from
    /// their own costs and are left alone).
    pub(crate) fn needs_probe(&self) -> bool {
        let seg = &self.shared.segments[self.seg];
        !seg.tuned && !self.shared.segment_measured(self.seg)
    }

    /// Runs the segment over `front` (a task's first row, already read)
    /// and records its bytes per row, and, when this segment collates, an
    /// estimate of a collated row's.
    pub(crate) fn probe_front(
        &mut self,
        run: &EpochRun,
        front: &mut Table,
        log: &mut TaskLog,
        lease: &mut Lease,
        collates: bool,
    ) {
        self.run_segment(run, front, log, lease);
        if front.is_empty() || log.fail.is_some() {
            return;
        }
        let shared = Arc::clone(&self.shared);
        shared.note_row_bytes(self.seg, front.nbytes(), front.len());
        if collates {
            shared.estimate_batch_bytes(front.nbytes(), front.len());
        }
    }

    /// Reads part of a shard group for a worker whose segment is not yet
    /// measured: its first row alone, run through the segment (returned as
    /// the part's processed front), then the rest of the part (returned
    /// raw). When the first read does not give exactly one clean row, both
    /// reads are returned raw and joined, as one read would give them.
    /// Also returns the nanoseconds spent reading.
    #[allow(clippy::type_complexity)]
    pub(crate) fn read_probed(
        &mut self,
        run: &EpochRun,
        reader: &mut dyn ShardReader,
        max: usize,
        log: &mut TaskLog,
        lease: &mut Lease,
        collates: bool,
    ) -> (Option<Table>, Table, Vec<(u64, BoxError)>, bool, u64) {
        let t0 = std::time::Instant::now();
        let (mut first, mut errs, done) = reader.next_part(1);
        let mut read_ns = t0.elapsed().as_nanos() as u64;
        if done || !errs.is_empty() || first.len() != 1 || max <= 1 {
            if !done && max > first.len() {
                let t1 = std::time::Instant::now();
                let (rest, more, done) = reader.next_part(max - first.len());
                read_ns += t1.elapsed().as_nanos() as u64;
                errs.extend(more);
                let table = join(first, rest, log);
                return (None, table, errs, done, read_ns);
            }
            return (None, first, errs, done, read_ns);
        }
        self.probe_front(run, &mut first, log, lease, collates);
        if log.fail.is_some() {
            // The part stops at its first row, as one read would have.
            first.truncate(0);
            return (Some(first), Table::new(), errs, done, read_ns);
        }
        let t1 = std::time::Instant::now();
        let (rest, more, done) = reader.next_part(max - 1);
        read_ns += t1.elapsed().as_nanos() as u64;
        errs.extend(more);
        (Some(first), rest, errs, done, read_ns)
    }
}

/// The rows of `front` followed by those of `rest`, as one batch. An empty
/// side (its rows skipped, so a later stage never added its column) gives
/// way to the other.
pub(crate) fn join(mut front: Table, rest: Table, log: &mut TaskLog) -> Table {
    if front.is_empty() {
        return rest;
    }
    if rest.is_empty() {
        return front;
    }
    if let Err(cols) = front.append(rest) {
        log.fail.get_or_insert_with(|| {
            SampleError::pipeline(format!(
                "the first row of a task and the rest hold different components: {cols}"
            ))
        });
        front.truncate(0);
    }
    front
}
