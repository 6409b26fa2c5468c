//! The plan: stage nodes and their fusion into segments (stages with equal
//! worker counts share one pool, tf.data's map fusion; a tuned stage gets
//! its own).
//!
//! ```text
//! read(Auto) decode(Auto) augment(Fixed 4) → [read+decode ×cpus] [augment ×4]
//! ```

use std::ops::Range;

use crate::component::ComponentId;
use crate::error::BuildError;
use crate::stage::{Parallelism, RunFn, StageOptions};

use super::Config;

pub(crate) struct StageNode {
    pub name: String,
    pub reads: Vec<ComponentId>,
    pub writes: Vec<ComponentId>,
    pub opts: StageOptions,
    pub run: RunFn,
}

impl StageNode {
    /// The policy this stage runs under: its own, else the pipeline's.
    pub(crate) fn policy(&self, cfg: &Config) -> crate::ErrorPolicy {
        self.opts.on_error.unwrap_or(cfg.policy)
    }
}

pub(crate) struct Segment {
    pub(crate) stages: Range<usize>,
    /// Threads in the pool (for a tuned pool: the most it may use).
    pub(crate) workers: usize,
    /// The autotuner sets how many of them work.
    pub(crate) tuned: bool,
    /// Slot of the pool's first worker.
    pub(crate) first_slot: usize,
}

/// A pool's name: its stages joined by `+` (`source` for a pool with none).
pub(crate) fn pool_label(stages: &[StageNode], seg: &Segment) -> String {
    let names: Vec<&str> = stages[seg.stages.clone()]
        .iter()
        .map(|n| n.name.as_str())
        .collect();
    if names.is_empty() {
        "source".to_string()
    } else {
        names.join("+")
    }
}

/// Fuses consecutive stages with equal worker counts into segments (not
/// tuned stages, nor with fusion off), numbering each pool's worker slots;
/// a plan with no stage gets one segment that reads and collates.
pub(crate) fn fuse(stages: &[StageNode], cfg: &Config) -> Vec<Segment> {
    let mut segments: Vec<Segment> = Vec::new();
    for (i, st) in stages.iter().enumerate() {
        let tuned = cfg.tuning.autotune && st.opts.workers == crate::stage::Parallelism::Auto;
        let w = if tuned {
            cfg.max_workers
        } else {
            st.opts.workers.resolve(cfg.cpus)
        };
        match segments.last_mut() {
            Some(seg) if cfg.scheduling.fuse && !tuned && !seg.tuned && seg.workers == w => {
                seg.stages.end = i + 1
            }
            _ => segments.push(Segment {
                stages: i..i + 1,
                workers: w,
                tuned,
                first_slot: 0,
            }),
        }
    }
    if segments.is_empty() {
        segments.push(Segment {
            stages: 0..0,
            workers: cfg.cpus,
            tuned: false,
            first_slot: 0,
        });
    }
    let mut slot = 0;
    for seg in &mut segments {
        seg.first_slot = slot;
        slot += seg.workers;
    }
    segments
}

/// The component-flow check `build()` runs, as a scheduler checks systems:
/// every component a stage (or the collate) reads must be written by the
/// source or an earlier stage and not consumed since; stage names are
/// unique and no stage has zero workers.
pub(crate) fn check_flow(
    source_writes: &[ComponentId],
    stages: &[StageNode],
    collate_reads: &[ComponentId],
) -> Result<(), BuildError> {
    // Component flow: what is available before each stage.
    let mut available: Vec<(ComponentId, String)> = source_writes
        .iter()
        .map(|c| (*c, "source".to_string()))
        .collect();
    let mut consumed: Vec<(ComponentId, String)> = Vec::new();
    let mut names: Vec<&str> = Vec::new();
    let check = |stage: &str,
                 reads: &[ComponentId],
                 available: &[(ComponentId, String)],
                 consumed: &[(ComponentId, String)]|
     -> Result<(), BuildError> {
        for r in reads {
            if !available.iter().any(|(c, _)| c == r) {
                let reason = match consumed.iter().rev().find(|(c, _)| c == r) {
                    Some((_, by)) => format!("stage `{by}` already consumed"),
                    None => "neither the source nor an earlier stage writes".to_string(),
                };
                return Err(BuildError::MissingComponent {
                    stage: stage.to_string(),
                    component: r.short_name().to_string(),
                    reason,
                });
            }
        }
        Ok(())
    };
    for st in stages {
        if names.contains(&st.name.as_str()) || st.name == "source" || st.name == "collate" {
            return Err(BuildError::DuplicateStage(st.name.clone()));
        }
        names.push(&st.name);
        if st.opts.workers == Parallelism::Fixed(0) {
            return Err(BuildError::ZeroWorkers(st.name.clone()));
        }
        check(&st.name, &st.reads, &available, &consumed)?;
        for r in &st.reads {
            available.retain(|(c, _)| c != r);
            consumed.push((*r, st.name.clone()));
        }
        for w in &st.writes {
            available.retain(|(c, _)| c != w);
            available.push((*w, st.name.clone()));
        }
    }
    check("collate", collate_reads, &available, &consumed)
}
