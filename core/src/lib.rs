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

pub mod autotune;
pub mod batch;
pub mod budget;
pub mod builder;
pub mod collate;
pub mod component;
mod component_set;
mod engine;
pub mod error;
pub mod metrics;
pub mod pipeline;
pub mod resources;
pub mod rng;
pub mod sampler;
pub mod source;
pub mod stage;
pub mod state;
pub mod stop;
pub mod sync;
pub mod table;
pub mod trace;

pub use autotune::TuneStep;
pub use batch::{Batch, BufferPool, BufferSource, DType, Element, HostBuffer, Tensor};
pub use budget::ByteBudget;
pub use builder::PipelineBuilder;
pub use collate::{BatchStage, Collatable, Collate, CollateError, StackCollate};
pub use component::{Component, ComponentId};
pub use component_set::ComponentSet;
pub use error::{BoxError, BuildError, ErrorKind, ErrorPolicy, SampleError};
pub use metrics::{Bottleneck, EpochSummary, StageReport, Timeline, TimelinePoint};
pub use pipeline::{EpochIter, InspectReport, Pipeline};
pub use sampler::{
    BatchSampler, Batched, ClassBalanced, ContiguousWindows, Curriculum, EpochPlan, FixedBatches,
    Order, PlanCtx, Sampler, Shard, ShardError, WeightError, Weighted,
};
pub use source::{FnSource, IterableSource, Source};
pub use stage::{Parallelism, Stage, StageCtx, StageOptions};
pub use state::{PipelineState, Position, ResumeError};
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
