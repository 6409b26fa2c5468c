//! Collate in the last segment: a task's rows become batches, batch stages
//! run on them, and failures follow the error policy; an iterable source's
//! short last part is handed on uncollated.
//!
//! ```text
//! TaskMsg (table of k batches) ─collate─▶ TaskOut { batches: k × Batch, rest: None }
//! ```

use std::ops::Range;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Arc;
use std::time::Instant;

use crate::batch::Batch;
use crate::engine::{settle, ErasedSource, Shared, TaskMsg, TaskOut, Worker};
use crate::error::{ErrorKind, SampleError};
use crate::stage::RowFate;
use crate::table::BatchRows;

impl Worker {
    /// Collates a task's batches; with `hold_short`, the last part of an
    /// iterable source's shard group, when short of a batch, is handed on
    /// uncollated, for the consumer to merge with the next groups' into full
    /// batches. (A part short because a skip dropped rows stays a short
    /// batch, as a map-style batch does.)
    pub(crate) fn collate(&mut self, msg: TaskMsg, epoch: u64, hold_short: bool) -> TaskOut {
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
            && table.len() < shared.cfg.batching.size
        {
            shared.estimate_batch_bytes(table.nbytes(), table.len());
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
        // Collate and batch stages run once: the policy after retries.
        let verdict = shared.cfg.policy.final_verdict();
        let mut out = Vec::with_capacity(table.batches().count());
        let mut b = 0;
        let map_task = matches!(shared.source, ErasedSource::Map { .. });
        let rows_in = table.len() as u64;
        let t0 = shared.cfg.recording.metrics.then(Instant::now);
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
            // The sample at fault, or every sample of the batch.
            let culprits: Vec<usize> = match pos {
                Some(p) if p < range.len() => vec![range.start + p],
                _ => range.clone().collect(),
            };
            let mut stop = false;
            for &row in &culprits {
                let index = table.indices()[row];
                let err = || {
                    SampleError::new(
                        Some(index),
                        shared.source.key_of(index),
                        stage.as_str(),
                        kind.clone(),
                        1,
                    )
                };
                stop = settle(&mut self.stats, &mut log, m, verdict, err) == RowFate::Stop;
                if stop {
                    break;
                }
            }
            if stop {
                break;
            }
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
pub(crate) fn run_batch_stages(shared: &Shared, batch: &mut Batch) -> Option<(String, ErrorKind)> {
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
