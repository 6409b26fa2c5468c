//! Pulling one sample through every stage in the calling thread, recording
//! what each stage made of it.
//!
//! ```
//! use ferrofeed_core::prelude::*;
//! let p = Pipeline::builder(FnSource::new(10, |i| Ok(i as i64)))
//!     .map("double", |x: i64, _: &StageCtx| Ok(x * 2))
//!     .collate(StackCollate::new().column::<i64>("x"))
//!     .build()
//!     .unwrap();
//! let r = p.inspect(4, 0).unwrap();
//! assert_eq!(r.steps[1].stage, "double");
//! ```

use std::sync::atomic::AtomicBool;
use std::time::Instant;

use crate::error::{ErrorKind, SampleError};
use crate::stage::{Exec, RowFate, RunEnv, RunFn};
use crate::table::{BatchRows, Table};

use super::Pipeline;
use crate::engine::ErasedSource;

impl Pipeline {
    /// Pulls sample `index` through the source and every stage in the
    /// calling thread, recording each stage's components and time.
    pub fn inspect(&self, index: u64, epoch: u64) -> Result<InspectReport, SampleError> {
        self.inspect_with(index, epoch, |_, _| {})
    }

    /// Like [`inspect`](Self::inspect), calling `hook(stage, table)` (a
    /// one-row table) after the source and after each stage.
    pub fn inspect_with(
        &self,
        index: u64,
        epoch: u64,
        mut hook: impl FnMut(&str, &Table),
    ) -> Result<InspectReport, SampleError> {
        let cancel = AtomicBool::new(false);
        let env = RunEnv {
            epoch,
            seed: self.shared.cfg.seed,
            cancel: &cancel,
            retries: self.shared.cfg.policy.attempts(),
            every_row: false,
        };
        let run_stage = |table: &mut Table, f: &RunFn, stage: &str| -> Result<(), SampleError> {
            let mut exec = InspectExec {
                source: &self.shared.source,
                policy: self.shared.cfg.policy,
                stage,
                error: None,
            };
            if let Err(c) = f(table, &env, &mut exec) {
                exec.error.get_or_insert(SampleError::new(
                    Some(index),
                    self.shared.source.key_of(index),
                    stage,
                    ErrorKind::MissingComponent(c.short_name()),
                    1,
                ));
            }
            exec.error.map_or(Ok(()), Err)
        };
        let t0 = Instant::now();
        let mut table = match &self.shared.source {
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
                run_stage(&mut t, read, "source")?;
                t
            }
            ErasedSource::Iter {
                shards, open, key, ..
            } => {
                let mut seen = 0u64;
                let mut found = None;
                'shards: for shard in 0..*shards {
                    let mut reader = open(shard, 0, 0)
                        .map_err(|e| SampleError::from_box(None, Some(key(shard)), "source", &e))?;
                    loop {
                        let (t, errs, done) = reader.next_part(1);
                        if let Some((idx, e)) = errs.into_iter().next() {
                            if seen == index {
                                return Err(SampleError::from_box(
                                    Some(idx),
                                    self.shared.source.key_of(idx),
                                    "source",
                                    &e,
                                ));
                            }
                            seen += 1;
                        } else if !t.is_empty() {
                            if seen == index {
                                found = Some(t);
                                break 'shards;
                            }
                            seen += 1;
                        }
                        if done {
                            break;
                        }
                    }
                }
                found.ok_or_else(|| {
                    SampleError::new(
                        Some(index),
                        None,
                        "source",
                        ErrorKind::Failed(format!(
                            "index {index} is past the end: the stream has {seen} samples"
                        )),
                        1,
                    )
                })?
            }
        };
        let idx = table.indices()[0];
        let mut steps = vec![InspectStep {
            stage: "source".into(),
            seconds: t0.elapsed().as_secs_f64(),
            components: describe(&table),
        }];
        hook("source", &table);
        for node in &self.shared.stages {
            let t = Instant::now();
            run_stage(&mut table, &node.run, &node.name)?;
            steps.push(InspectStep {
                stage: node.name.clone(),
                seconds: t.elapsed().as_secs_f64(),
                components: describe(&table),
            });
            hook(&node.name, &table);
        }
        let t = Instant::now();
        let rows = BatchRows::new(&table, 0..1);
        let batch = self.shared.collate.collate(&rows).map_err(|e| {
            SampleError::new(
                Some(idx),
                self.shared.source.key_of(idx),
                "collate",
                ErrorKind::Failed(e.message),
                1,
            )
        })?;
        steps.push(InspectStep {
            stage: "collate".into(),
            seconds: t.elapsed().as_secs_f64(),
            components: batch
                .columns()
                .map(|(n, t)| (n.to_string(), format!("{} {:?}", t.dtype(), t.shape())))
                .collect(),
        });
        Ok(InspectReport {
            index: idx,
            path: self.shared.source.key_of(idx),
            steps,
        })
    }
}

/// Records the first failure of an inspected sample.
struct InspectExec<'a> {
    pub(crate) source: &'a ErasedSource,
    pub(crate) policy: crate::error::ErrorPolicy,
    pub(crate) stage: &'a str,
    pub(crate) error: Option<SampleError>,
}

impl Exec for InspectExec<'_> {
    fn begin(&mut self, _: usize, _: u64) {}
    fn end(&mut self) {}
    /// The policy's verdict, as in a run: a transient failure is retried;
    /// a skip or a stop is the inspected sample's error.
    fn fail(&mut self, index: u64, kind: ErrorKind, attempts: u32, may_retry: bool) -> RowFate {
        let verdict = if may_retry {
            self.policy.verdict(attempts)
        } else {
            self.policy.final_verdict()
        };
        if let crate::error::Verdict::Retry(backoff) = verdict {
            std::thread::sleep(backoff);
            return RowFate::Retry;
        }
        self.error.get_or_insert(SampleError::new(
            Some(index),
            self.source.key_of(index),
            self.stage,
            kind,
            attempts,
        ));
        RowFate::Stop
    }
}

fn describe(t: &Table) -> Vec<(String, String)> {
    t.describe(0)
        .into_iter()
        .map(|(n, d)| (n.to_string(), d))
        .collect()
}

/// One stage's view in an [`InspectReport`].
#[derive(Debug, Clone)]
pub struct InspectStep {
    /// `source`, a stage name, or `collate`.
    pub stage: String,
    /// Time the stage took, s.
    pub seconds: f64,
    /// `(component, summary)` after the stage (for `collate`: the columns).
    pub components: Vec<(String, String)>,
}

/// One sample pulled through the pipeline by [`Pipeline::inspect`].
#[derive(Debug, Clone)]
pub struct InspectReport {
    /// Dataset index.
    pub index: u64,
    /// Path or key.
    pub path: Option<String>,
    /// Source, each stage, collate.
    pub steps: Vec<InspectStep>,
}

impl std::fmt::Display for InspectReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "sample {}", self.index)?;
        if let Some(p) = &self.path {
            write!(f, " ({p})")?;
        }
        writeln!(f)?;
        for s in &self.steps {
            writeln!(f, "  [{}] {:.3} ms", s.stage, s.seconds * 1e3)?;
            for (n, d) in &s.components {
                writeln!(f, "      {n}: {d}")?;
            }
        }
        Ok(())
    }
}
