//! A pipeline's settings, grouped by concern into small typed values that
//! the builder takes whole ([`PipelineBuilder::options`] and one setter
//! per group) or one field at a time (its shortcuts, such as
//! [`PipelineBuilder::batch_size`]). The engine keeps the same values, so a
//! setting is defined once, with its default, here.
//!
//! ```
//! use ferrofeed_core::prelude::*;
//! use ferrofeed_core::{Batching, Scheduling};
//! let p = Pipeline::builder(FnSource::new(10, |i| Ok(i as i64)))
//!     .batching(Batching { size: 4, drop_last: true })
//!     .scheduling(Scheduling { max_bytes_in_flight: 1 << 20, ..Scheduling::default() })
//!     .collate(StackCollate::new().column::<i64>("x"))
//!     .build()
//!     .unwrap();
//! assert_eq!(p.options().batching.size, 4);
//! assert_eq!(p.epoch(0).count(), 2); // 10 samples, the short last batch dropped
//! ```
//!
//! [`PipelineBuilder::options`]: crate::PipelineBuilder::options
//! [`PipelineBuilder::batch_size`]: crate::PipelineBuilder::batch_size
use std::time::Duration;

use crate::error::ErrorPolicy;
use crate::sampler::Shard;

/// Default byte budget: 256 MiB.
pub const DEFAULT_MAX_BYTES_IN_FLIGHT: usize = 256 << 20;

/// How samples are grouped into batches.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Batching {
    /// Samples per batch (default 1).
    pub size: usize,
    /// Drop a short last batch (default false).
    pub drop_last: bool,
}

impl Default for Batching {
    fn default() -> Self {
        Batching {
            size: 1,
            drop_last: false,
        }
    }
}

/// The order samples come in, and the seed of every random draw.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Shuffling {
    /// Map-style sources: shuffle with a permutation drawn from
    /// `(seed, epoch)` (default false).
    pub shuffle: bool,
    /// Seed for shuffling and for every stage's RNG (default 0).
    pub seed: u64,
    /// Iterable sources: a per-shard shuffle buffer of this many items,
    /// seeded by `(seed, epoch, shard)` (default 0: stream order).
    pub shuffle_buffer: usize,
    /// Iterable sources: shards read together, one item from each in turn,
    /// so a batch mixes them (tf.data's `interleave`; default 0 or 1: one
    /// shard at a time). Groups are consecutive runs of the epoch's shard
    /// order; a group's shuffle buffer holds items of all its shards.
    pub interleave: usize,
}

/// How much work is in flight and how it is split among threads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Scheduling {
    /// Cap on bytes held by samples and batches in flight (default
    /// [`DEFAULT_MAX_BYTES_IN_FLIGHT`]).
    pub max_bytes_in_flight: usize,
    /// Tasks (groups of batches) allowed ahead of the consumer (default
    /// `None`: twice the largest stage's workers, at least 4).
    pub prefetch: Option<usize>,
    /// The CPU count `Parallelism::Auto` resolves to (default `None`: the
    /// CPUs this process may use, see [`crate::available_cpus`]).
    pub cpus: Option<usize>,
    /// Smallest number of samples a worker handles per task: small batches
    /// are grouped so queue hops are paid per group (default 64).
    pub min_task_samples: usize,
    /// Run adjacent stages with equal worker counts in the same worker
    /// (default true).
    pub fuse: bool,
    /// Yield batches in sampler order (default true); false yields each as
    /// soon as it is ready.
    pub ordered: bool,
}

impl Default for Scheduling {
    fn default() -> Self {
        Scheduling {
            max_bytes_in_flight: DEFAULT_MAX_BYTES_IN_FLIGHT,
            prefetch: None,
            cpus: None,
            min_task_samples: 64,
            fuse: true,
            ordered: true,
        }
    }
}

/// Online tuning of worker counts (see [`crate::autotune`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Tuning {
    /// Tune (default false): every stage left at `Parallelism::Auto` gets
    /// its own pool, and a tuner thread moves workers between the pools to
    /// maximise samples/s. Off, `Auto` stages are fused on one pool of as
    /// many workers as CPUs, which is best when every stage is CPU-bound.
    pub autotune: bool,
    /// The most threads one tuned stage may use (default `None`: 4 × CPUs,
    /// at least 4, at most 64).
    pub max_workers: Option<usize>,
    /// How often the tuner re-reads the stage costs (default 100 ms).
    pub interval: Duration,
}

impl Default for Tuning {
    fn default() -> Self {
        Tuning {
            autotune: false,
            max_workers: None,
            interval: Duration::from_millis(100),
        }
    }
}

/// What the pipeline records about itself.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Recording {
    /// Per-stage timing: latency histograms, busy time (default true). Off,
    /// only counters are kept.
    pub metrics: bool,
    /// A Chrome/Perfetto trace of every stage's work, of at most this many
    /// events (default `None`: no trace).
    pub trace_events: Option<usize>,
}

impl Default for Recording {
    fn default() -> Self {
        Recording {
            metrics: true,
            trace_events: None,
        }
    }
}

/// Every setting of a pipeline that is a plain value (stages, the collate,
/// a custom batch sampler and batch stages are given to the builder apart).
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Options {
    /// Batch size and the short last batch.
    pub batching: Batching,
    /// Order and seed.
    pub shuffling: Shuffling,
    /// Budget, prefetch, CPUs, task size, fusion, ordering.
    pub scheduling: Scheduling,
    /// The autotuner.
    pub tuning: Tuning,
    /// Metrics and trace.
    pub recording: Recording,
    /// What a failing sample does (default [`ErrorPolicy::Fail`]).
    pub on_error: ErrorPolicy,
    /// This process's slice of a distributed job (default rank 0 of 1).
    pub shard: Shard,
}
