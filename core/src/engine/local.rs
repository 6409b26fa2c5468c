//! The single-threaded executor: one sample through the same plan the
//! worker pools run — the source kind's reader, every stage node under its
//! own policy, the collate — in the calling thread, with the workers' row
//! executor ([`RowExec`]) and verdicts ([`settle`]), so a retry, a skip or
//! a stop means the same here as in an epoch. Building the plan stays in
//! [`plan`](super::plan); only the executor differs (bevy_ecs keeps its
//! schedule apart from its single- and multi-threaded executors).
//!
//! ```text
//! Local::read(index) ─▶ Local::stage(0) ─▶ … ─▶ Local::stage(n-1) ─▶ Local::collate
//! ```

use std::sync::atomic::AtomicBool;

use crate::batch::Batch;
use crate::engine::{nth_item, ErasedSource, LocalStats, RowExec, Shared, TaskLog};
use crate::error::{ErrorKind, ErrorPolicy, SampleError};
use crate::stage::{Exec, RowFate, RunEnv, RunFn};
use crate::table::{BatchRows, Table};

/// One sample's run in the calling thread.
pub(crate) struct Local<'a> {
    shared: &'a Shared,
    epoch: u64,
    cancel: AtomicBool,
    stats: LocalStats,
    log: TaskLog,
}

impl<'a> Local<'a> {
    pub(crate) fn new(shared: &'a Shared, epoch: u64) -> Self {
        Local {
            shared,
            epoch,
            cancel: AtomicBool::new(false),
            stats: LocalStats::new(shared.stages.len() + 2),
            log: TaskLog::default(),
        }
    }

    /// Reads sample `index` as a one-row table: row `index` of a map-style
    /// source, the `index`-th item in shard order of an iterable one.
    pub(crate) fn read(&mut self, index: u64) -> Result<Table, SampleError> {
        let shared = self.shared;
        match &shared.source {
            ErasedSource::Map { len, read, .. } => {
                if index >= *len {
                    return Err(SampleError::new(
                        Some(index),
                        None,
                        "source",
                        ErrorKind::Failed(format!(
                            "index {index} is past the end: the dataset has {len} samples"
                        )),
                        1,
                    ));
                }
                let mut t = Table::with_indices(vec![index]);
                self.run(&mut t, read, 0, "source", shared.cfg.policy)?;
                Ok(t)
            }
            ErasedSource::Iter { .. } => {
                match nth_item(shared, index, &mut self.stats, &mut self.log) {
                    Ok(t) => Ok(t),
                    Err((idx, e)) => {
                        self.take_error()?;
                        Err(match idx {
                            Some(i) => SampleError::from_box(
                                Some(i),
                                shared.source.key_of(i),
                                "source",
                                &e,
                            ),
                            None => SampleError::new(
                                Some(index),
                                None,
                                "source",
                                ErrorKind::Failed(crate::error::error_chain(e.as_ref())),
                                1,
                            ),
                        })
                    }
                }
            }
        }
    }

    /// Runs stage node `i` over the table.
    pub(crate) fn stage(&mut self, table: &mut Table, i: usize) -> Result<(), SampleError> {
        let node = &self.shared.stages[i];
        self.run(
            table,
            &node.run,
            i + 1,
            &node.name,
            node.policy(&self.shared.cfg),
        )
    }

    /// Collates the table into a batch.
    pub(crate) fn collate(&mut self, table: &Table) -> Result<Batch, SampleError> {
        let rows = BatchRows::new(table, 0..table.len());
        self.shared.collate.collate(&rows).map_err(|e| {
            let idx = table.indices().first().copied();
            SampleError::new(
                idx,
                idx.and_then(|i| self.shared.source.key_of(i)),
                "collate",
                ErrorKind::Failed(e.message),
                1,
            )
        })
    }

    /// Runs one erased step (metrics index `m`) with the workers' row
    /// executor; a failure that skips or stops is this sample's error.
    fn run(
        &mut self,
        table: &mut Table,
        f: &RunFn,
        m: usize,
        name: &str,
        policy: ErrorPolicy,
    ) -> Result<(), SampleError> {
        let env = RunEnv {
            epoch: self.epoch,
            seed: self.shared.cfg.shuffling.seed,
            cancel: &self.cancel,
            retries: policy.attempts(),
            every_row: false,
        };
        let mut exec = RowExec {
            shared: self.shared,
            stats: &mut self.stats,
            log: &mut self.log,
            m,
            policy,
            stage: name,
            slot: 0,
            watch: false,
            time_all: false,
            started: None,
            trace: None,
            index: 0,
        };
        if let Err(missing) = f(table, &env, &mut exec) {
            let kind = ErrorKind::MissingComponent(missing.short_name());
            for &index in table.indices() {
                if let RowFate::Stop = exec.fail(index, kind.clone(), 1, false) {
                    break;
                }
            }
            table.truncate(0);
        }
        self.take_error()
    }

    /// The error a skip or a stop recorded, if any.
    fn take_error(&mut self) -> Result<(), SampleError> {
        match self.log.fail.take().or_else(|| self.log.skipped.pop()) {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }
}
