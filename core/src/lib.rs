//! # ferrofeed-core
//!
//! The engine behind ferrofeed: a sample is an entity carrying typed
//! [`Component`]s; a [`Stage`] is a system that declares the components it
//! reads and writes and runs on its own worker pool; stages are linked by
//! bounded queues, a byte budget caps what is in flight, and batches come out
//! in sampler order as columnar [`Batch`]es of [`Tensor`]s.
//!
//! ```
//! use ferrofeed_core::prelude::*;
//!
//! #[derive(Clone, Debug)]
//! struct Value(u64);
//! impl Component for Value {
//!     fn nbytes(&self) -> usize { 8 }
//! }
//! impl Collatable for Value {
//!     type Elem = i64;
//!     fn shape(&self) -> Vec<usize> { vec![] }
//!     fn write(&self, out: &mut [i64]) { out[0] = self.0 as i64 }
//! }
//!
//! let source = FnSource::new(100, |i| Ok(Value(i)));
//! let pipeline = Pipeline::builder(source)
//!     .map("double", |v: Value, _ctx: &StageCtx| Ok(Value(v.0 * 2)))
//!     .batch_size(10)
//!     .collate(StackCollate::new().column::<Value>("values"))
//!     .build()
//!     .unwrap();
//! let batches: Vec<Batch> = pipeline.epoch(0).map(|b| b.unwrap()).collect();
//! assert_eq!(batches.len(), 10);
//! assert_eq!(batches[0].get("values").unwrap().as_slice::<i64>().unwrap()[3], 6);
//! ```
#![warn(missing_docs)]
#![warn(unnameable_types, unreachable_pub)]

pub mod autotune;
mod batch;
mod budget;
mod builder;
mod collate;
mod component;
mod component_set;
mod engine;
mod error;
mod files;
mod html;
mod metrics;
mod options;
mod pipeline;
mod resources;
pub mod rng;
mod sampler;
mod source;
mod stage;
mod state;
mod stop;
pub mod sync;
mod table;
mod trace;

pub use batch::{
    Batch, BufferPool, BufferSource, DType, DTypeMismatch, Element, HostBuffer, Tensor, MAX_DIMS,
};
pub use budget::{ByteBudget, Lease};
pub use builder::{available_cpus, PipelineBuilder};
pub use collate::{BatchStage, Collatable, Collate, CollateError, StackCollate};
pub use component::{Component, ComponentId};
pub use component_set::ComponentSet;
pub use error::{
    error_chain, is_permanent, BoxError, BuildError, ErrorKind, ErrorPolicy, Permanent, RetryThen,
    SampleError, MAX_RETRIES,
};
pub use files::{open_regular, read_settings_file};
pub use html::{ReportPage, MAX_SKIPPED_SHOWN};
pub use metrics::{Bottleneck, EpochSummary, StageReport, Timeline, TimelinePoint};
pub use options::{
    Batching, Options, Recording, Scheduling, Shuffling, Tuning, DEFAULT_MAX_BYTES_IN_FLIGHT,
};
pub use pipeline::{
    EpochIter, InspectReport, InspectStep, Pipeline, SLOW_BATCH_FACTOR, SLOW_BATCH_FLOOR,
};
pub use resources::Resources;
pub use sampler::{
    permutation, BatchSampler, Batched, ClassBalanced, ContiguousWindows, Curriculum, EpochPlan,
    FixedBatches, Order, PlanCtx, Sampler, Shard, ShardError, WeightError, Weighted,
};
pub use source::{
    stream_index, FnSource, IterableSource, ShardEpoch, ShardIter, Source, STREAM_POSITION_BITS,
};
pub use stage::{FnStage, Parallelism, Stage, StageCtx, StageOptions, MAX_WORKERS};
pub use state::{PipelineState, Position, ResumeError, MAX_STATE_BYTES};
pub use stop::StopHandle;
pub use table::{BatchRows, Table};

/// Everything a pipeline author usually needs, in one import.
pub mod prelude {
    pub use crate::{
        Batch, BoxError, BuildError, Collatable, Collate, Component, ComponentSet, DType,
        ErrorPolicy, FnSource, IterableSource, Order, Parallelism, Pipeline, SampleError, Shard,
        Source, StackCollate, Stage, StageCtx, StageOptions, Table, Tensor,
    };
}
