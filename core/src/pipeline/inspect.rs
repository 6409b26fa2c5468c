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

use std::time::Instant;

use crate::engine::Local;
use crate::error::SampleError;
use crate::table::Table;

use super::Pipeline;

impl Pipeline {
    /// Pulls sample `index` through the source and every stage in the
    /// calling thread, recording each stage's components and time. It runs
    /// the pipeline's own plan (each stage under its error policy, retries
    /// included) on one thread; for an iterable source, `index` counts items
    /// in shard order, unshuffled.
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
        let mut local = Local::new(&self.shared, epoch);
        let t0 = Instant::now();
        let mut table = local.read(index)?;
        let idx = table.indices()[0];
        let mut steps = vec![InspectStep {
            stage: "source".into(),
            seconds: t0.elapsed().as_secs_f64(),
            components: describe(&table),
        }];
        hook("source", &table);
        for (i, node) in self.shared.stages.iter().enumerate() {
            let t = Instant::now();
            local.stage(&mut table, i)?;
            steps.push(InspectStep {
                stage: node.name.clone(),
                seconds: t.elapsed().as_secs_f64(),
                components: describe(&table),
            });
            hook(&node.name, &table);
        }
        let t = Instant::now();
        let batch = local.collate(&table)?;
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
