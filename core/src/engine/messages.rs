//! An epoch's run and the messages between its threads: the task key, the
//! work of the epoch, tasks in flight and their logs.
//!
//! ```text
//! TaskMsg { key: (major, minor), table, log, lease } ─segment─▶ TaskOut { batches | rest }
//! ```

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use crate::batch::Batch;
use crate::budget::Lease;
use crate::error::SampleError;
use crate::sampler::EpochPlan;
use crate::table::Table;

use crate::engine::Handoff;
use crate::sync::LockExt;

/// A task's key: the resume position it starts at.
pub(crate) use crate::state::Position as Key;

pub(crate) enum Work {
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
    pub(crate) fn majors(&self) -> u64 {
        match self {
            Work::Map { plan } => plan.num_batches() as u64,
            Work::Iter {
                order, interleave, ..
            } => order.len().div_ceil((*interleave).max(1)) as u64,
        }
    }
}

pub(crate) struct EpochRun {
    pub(crate) epoch: u64,
    pub(crate) work: Work,
    /// Where the epoch starts: `(major, minor)` of the first task (non-zero
    /// when resuming).
    pub(crate) start: (u64, u64),
    pub(crate) cancel: AtomicBool,
    pub(crate) next_claim: AtomicU64,
    pub(crate) consumer_next: AtomicU64,
    /// Parts of group `consumer_next` the consumer has received (iterable
    /// sources; stored before `consumer_next`, so a reader that sees a new
    /// group sees its count): the part it needs next.
    pub(crate) consumer_parts: AtomicU64,
    /// The consumer is blocked waiting for a batch: the task it needs next
    /// is then admitted even past the budget, since nothing else can free it.
    pub(crate) consumer_waiting: AtomicBool,
    pub(crate) finished: Mutex<usize>,
    pub(crate) finished_cv: Condvar,
    pub(crate) total_workers: usize,
    /// Iterable sources: parts a worker reading a shard group hands to
    /// workers that have no group left to claim (see `run_iter_source`).
    pub(crate) handoff: (flume::Sender<Handoff>, flume::Receiver<Handoff>),
    /// First-segment workers still claiming and reading shard groups.
    pub(crate) readers: AtomicUsize,
    /// Workers waiting for a handed-off part.
    pub(crate) idle_helpers: AtomicUsize,
}

impl EpochRun {
    pub(crate) fn cancelled(&self) -> bool {
        self.cancel.load(Ordering::Acquire)
    }
    pub(crate) fn worker_finished(&self) {
        let mut f = self.finished.lock_unpoisoned();
        *f += 1;
        self.finished_cv.notify_all();
    }
    pub(crate) fn wait_finished(&self, limit: Duration) -> bool {
        let deadline = Instant::now() + limit;
        let mut f = self.finished.lock_unpoisoned();
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
pub(crate) struct TaskLog {
    pub(crate) skipped: Vec<SampleError>,
    pub(crate) fail: Option<SampleError>,
    pub(crate) retries: u64,
}

pub(crate) struct TaskMsg {
    pub(crate) key: Key,
    /// The major key of the task that follows this one.
    pub(crate) next_major: u64,
    pub(crate) last: bool,
    pub(crate) table: Table,
    pub(crate) log: TaskLog,
    pub(crate) lease: Lease,
}

pub(crate) struct TaskOut {
    pub(crate) key: Key,
    pub(crate) next_major: u64,
    pub(crate) last: bool,
    pub(crate) batches: Vec<Batch>,
    pub(crate) log: TaskLog,
    /// The last part of an iterable source's shard group, short of a batch,
    /// not collated: the consumer merges such parts, in order, into full
    /// batches.
    pub(crate) rest: Option<(Table, Lease)>,
}

pub(crate) enum Out {
    Next(flume::Sender<TaskMsg>),
    Final(flume::Sender<TaskOut>),
}

pub(crate) struct Job {
    pub(crate) run: Arc<EpochRun>,
    pub(crate) input: Option<flume::Receiver<TaskMsg>>,
    pub(crate) out: Out,
}
