//! The plan: stage nodes and their fusion into segments (stages with equal
//! worker counts share one pool, tf.data's map fusion; a tuned stage gets
//! its own).
//!
//! ```text
//! read(Auto) decode(Auto) augment(Fixed 4) → [read+decode ×cpus] [augment ×4]
//! ```

use std::ops::Range;

use crate::component::ComponentId;
use crate::stage::RunFn;
use crate::stage::StageOptions;

pub(crate) struct StageNode {
    pub name: String,
    pub reads: Vec<ComponentId>,
    pub writes: Vec<ComponentId>,
    pub opts: StageOptions,
    pub run: RunFn,
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
