//! The map-style feed: workers claim runs of consecutive plan batches
//! (sized to about 2 ms of work and a share of the byte budget), read them
//! through the source and run their segment over them.
//!
//! ```text
//! next_claim: 0 ──k──▶ task (batches b0..b1) ──▶ admit ──▶ source.get ─▶ stages ─▶ forward
//! ```

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;

use crate::engine::{
    join, ErasedSource, Job, Key, Out, TaskLog, TaskMsg, Worker, MAX_CHUNK, TARGET_TASK_NS,
};
use crate::sampler::EpochPlan;
use crate::table::Table;

impl Worker {
    /// Batches to claim next: about [`TARGET_TASK_NS`] of work, at least
    /// `min_task_samples` samples, and at most a quarter of the byte budget
    /// per worker. Unordered, one: each batch is yielded when it is ready,
    /// so a slow sample holds back no other batch.
    pub(crate) fn next_chunk(&mut self, plan: &EpochPlan) -> usize {
        let cfg = &self.shared.cfg;
        if !cfg.scheduling.ordered {
            self.chunk = 1;
            return 1;
        }
        let nb = plan.num_batches().max(1);
        let mean_batch = (plan.indices.len() / nb).max(1);
        let floor = cfg.scheduling.min_task_samples.div_ceil(mean_batch).max(1);
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

    pub(crate) fn run_map_source(&mut self, job: &Job, plan: &EpochPlan) {
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
            // Unordered, no batch waits for an earlier one, so none is kept
            // within a window of the lowest unfinished one.
            let window = shared.cfg.scheduling.ordered.then_some(shared.window * k);
            let Some(mut lease) = self.admit(run, (b0, 0), window, rows) else {
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
            if table.len() > 1 && table.batches().count() == 1 && self.needs_probe() {
                // The first row ahead of the rest (see `probe`).
                let mut front = table.split_front(1);
                let collates = matches!(job.out, Out::Final(_));
                self.probe_front(run, &mut front, &mut log, &mut lease, collates);
                if log.fail.is_none() {
                    self.run_segment(run, &mut table, &mut log, &mut lease);
                }
                table = join(front, table, &mut log);
                if log.fail.is_some() {
                    // Under the stop policy the task (one batch) is cut whole.
                    table.truncate(0);
                }
            } else {
                self.run_segment(run, &mut table, &mut log, &mut lease);
            }
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
}
