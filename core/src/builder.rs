//! The pipeline builder: a source, stages, batching, policies — checked by
//! [`PipelineBuilder::build`].
//!
//! `build()` walks the plan like a scheduler checks systems: every component
//! a stage (or the collate) reads must be written by the source or an
//! earlier stage and not consumed since; otherwise it is a [`BuildError`]
//! naming the stage and the component.
//!
//! ```
//! use ferrofeed_core::prelude::*;
//! let err = Pipeline::builder(FnSource::new(4, |i| Ok(i)))
//!     .map("parse", |s: String, _: &StageCtx| Ok(s.len() as i64))
//!     .batch_size(2)
//!     .collate(StackCollate::new().column::<i64>("len"))
//!     .build()
//!     .unwrap_err();
//! assert!(err.to_string().contains("stage `parse` reads component String"));
//! ```
use std::sync::Arc;
use std::time::Duration;

use crate::budget::ByteBudget;
use crate::collate::{BatchStage, Collate};
use crate::component::ComponentId;
use crate::component_set::ComponentSet;
use crate::engine::{check_flow, Config, ErasedSource, Shared, StageNode};
use crate::error::{BoxError, BuildError, ErrorPolicy};
use crate::options::{Batching, Options, Recording, Scheduling, Shuffling, Tuning};
use crate::pipeline::Pipeline;
use crate::sampler::{BatchSampler, FixedBatches, Order, Shard};
use crate::source::{IterableSource, Source};
use crate::stage::{erase, FnStage, Parallelism, Stage, StageCtx, StageOptions};

/// Builds a [`Pipeline`]: a source, stages, a collate, and [`Options`]
/// (given whole, by group, or one field at a time).
pub struct PipelineBuilder {
    source: ErasedSource,
    source_writes: Vec<ComponentId>,
    stages: Vec<StageNode>,
    collate: Option<Box<dyn Collate>>,
    sampler: Option<Box<dyn BatchSampler>>,
    /// Whether the source is iterable (settings for the other kind are
    /// refused by `build()`).
    iterable: bool,
    opts: Options,
    batch_stages: Vec<(String, Box<dyn BatchStage>)>,
}

impl Pipeline {
    /// Starts a pipeline over a map-style source.
    pub fn builder<S: Source>(source: S) -> PipelineBuilder {
        PipelineBuilder::new(ErasedSource::map(source), S::Output::ids(), false)
    }
    /// Starts a pipeline over an iterable (sharded, streamed) source.
    pub fn builder_iterable<S: IterableSource>(source: S) -> PipelineBuilder {
        PipelineBuilder::new(ErasedSource::iterable(source), S::Output::ids(), true)
    }
}

impl PipelineBuilder {
    fn new(source: ErasedSource, source_writes: Vec<ComponentId>, iterable: bool) -> Self {
        PipelineBuilder {
            source,
            source_writes,
            stages: Vec::new(),
            collate: None,
            sampler: None,
            iterable,
            opts: Options::default(),
            batch_stages: Vec::new(),
        }
    }

    /// Every plain setting at once (replaces what was set before).
    pub fn options(mut self, opts: Options) -> Self {
        self.opts = opts;
        self
    }
    /// Batch size and the short last batch.
    pub fn batching(mut self, b: Batching) -> Self {
        self.opts.batching = b;
        self
    }
    /// Order and seed.
    pub fn shuffling(mut self, s: Shuffling) -> Self {
        self.opts.shuffling = s;
        self
    }
    /// Byte budget, prefetch, CPUs, task size, fusion and ordering.
    pub fn scheduling(mut self, s: Scheduling) -> Self {
        self.opts.scheduling = s;
        self
    }
    /// The autotuner's settings.
    pub fn tuning(mut self, t: Tuning) -> Self {
        self.opts.tuning = t;
        self
    }
    /// Metrics and trace.
    pub fn recording(mut self, r: Recording) -> Self {
        self.opts.recording = r;
        self
    }

    /// Adds a stage with default options.
    pub fn stage<S: Stage>(self, name: &str, stage: S) -> Self {
        self.stage_with(name, StageOptions::default(), stage)
    }

    /// Adds a stage with options.
    pub fn stage_with<S: Stage>(mut self, name: &str, opts: StageOptions, stage: S) -> Self {
        self.stages.push(StageNode {
            name: name.to_string(),
            reads: S::In::ids(),
            writes: S::Out::ids(),
            opts,
            run: erase(stage, crate::rng::name_hash(name)),
        });
        self
    }

    /// Adds a closure stage: `|input: In, ctx: &StageCtx| -> Result<Out, BoxError>`
    /// (`Ok(x)` needs no annotation; `?` converts any error). For another
    /// error type, wrap the closure in [`FnStage`](crate::stage::FnStage).
    pub fn map<F, I, O>(self, name: &str, f: F) -> Self
    where
        F: Fn(I, &StageCtx) -> Result<O, BoxError> + Send + Sync + 'static,
        I: ComponentSet,
        O: ComponentSet,
    {
        self.stage(name, FnStage::new(f))
    }

    /// Adds a closure stage with options.
    pub fn map_with<F, I, O>(self, name: &str, opts: StageOptions, f: F) -> Self
    where
        F: Fn(I, &StageCtx) -> Result<O, BoxError> + Send + Sync + 'static,
        I: ComponentSet,
        O: ComponentSet,
    {
        self.stage_with(name, opts, FnStage::new(f))
    }

    /// Samples per batch (default 1).
    pub fn batch_size(mut self, n: usize) -> Self {
        self.opts.batching.size = n;
        self
    }
    /// Drop a short last batch (default false).
    pub fn drop_last(mut self, yes: bool) -> Self {
        self.opts.batching.drop_last = yes;
        self
    }
    /// Shuffle with a permutation drawn from `(seed, epoch)` (default false).
    pub fn shuffle(mut self, yes: bool) -> Self {
        self.opts.shuffling.shuffle = yes;
        self
    }
    /// Seed for shuffling and for every stage's RNG (default 0).
    pub fn seed(mut self, seed: u64) -> Self {
        self.opts.shuffling.seed = seed;
        self
    }
    /// A custom batch sampler; replaces batch size, shuffle and drop_last.
    pub fn batch_sampler<B: BatchSampler>(mut self, sampler: B) -> Self {
        self.sampler = Some(Box::new(sampler));
        self
    }
    /// How samples become a batch.
    pub fn collate<C: Collate>(mut self, c: C) -> Self {
        self.collate = Some(Box::new(c));
        self
    }
    /// Pipeline-wide error policy (default `Fail`).
    pub fn on_error(mut self, p: ErrorPolicy) -> Self {
        self.opts.on_error = p;
        self
    }
    /// Yield batches as soon as they are ready instead of in sampler order.
    pub fn unordered(mut self) -> Self {
        self.opts.scheduling.ordered = false;
        self
    }
    /// Cap on bytes held by samples and batches in flight (default 256 MiB).
    pub fn max_bytes_in_flight(mut self, bytes: usize) -> Self {
        self.opts.scheduling.max_bytes_in_flight = bytes;
        self
    }
    /// Tasks (groups of batches) allowed ahead of the consumer (default:
    /// twice the largest stage's workers, at least 4).
    pub fn prefetch(mut self, tasks: usize) -> Self {
        self.opts.scheduling.prefetch = Some(tasks);
        self
    }
    /// The CPU count `Parallelism::Auto` resolves to (default: the CPUs this
    /// process may use).
    pub fn cpus(mut self, n: usize) -> Self {
        self.opts.scheduling.cpus = Some(n);
        self
    }
    /// Smallest number of samples a worker handles per task: small batches
    /// are grouped so queue hops are paid per group, not per sample
    /// (default 64).
    pub fn min_task_samples(mut self, n: usize) -> Self {
        self.opts.scheduling.min_task_samples = n;
        self
    }
    /// Run adjacent stages with equal worker counts in the same worker
    /// (default true).
    pub fn fuse(mut self, yes: bool) -> Self {
        self.opts.scheduling.fuse = yes;
        self
    }

    /// Tune worker counts online (see [`crate::autotune`]): every stage
    /// left at [`Parallelism::Auto`](crate::Parallelism::Auto) gets its own pool, and a tuner thread
    /// moves workers between the pools to maximise samples/s from the
    /// measured per-stage CPU and blocked time (default off: `Auto` stages
    /// are then fused on one pool of as many workers as CPUs, which is best
    /// when every stage is CPU-bound).
    pub fn autotune(mut self, yes: bool) -> Self {
        self.opts.tuning.autotune = yes;
        self
    }
    /// The most threads one tuned stage may use (default 4 × CPUs, at least
    /// 4, at most 64): stages blocked on I/O may need more than the CPUs.
    pub fn autotune_max_workers(mut self, n: usize) -> Self {
        self.opts.tuning.max_workers = Some(n);
        self
    }
    /// How often the tuner re-reads the stage costs (default 100 ms).
    pub fn autotune_interval(mut self, every: Duration) -> Self {
        self.opts.tuning.interval = every;
        self
    }

    /// Adds a stage that runs on each whole batch after collate, in the
    /// worker that built it (pinning, device copies…). A failure drops the
    /// batch's samples under the pipeline's policy, named by this stage.
    pub fn batch_stage<B: BatchStage>(mut self, name: &str, stage: B) -> Self {
        self.batch_stages.push((name.to_string(), Box::new(stage)));
        self
    }

    /// Per-stage timing (latency histograms, busy time; default on). Off,
    /// only counters are kept — for measuring what the timing costs.
    pub fn metrics(mut self, yes: bool) -> Self {
        self.opts.recording.metrics = yes;
        self
    }

    /// Records a Chrome/Perfetto trace of every stage's work, keeping at
    /// most `max_events` events (see [`Pipeline::trace_json`]).
    pub fn trace(mut self, max_events: usize) -> Self {
        self.opts.recording.trace_events = Some(max_events);
        self
    }

    /// This process's rank in a distributed job (default: rank 0 of 1; see
    /// [`Shard::from_env`]). Every rank sees the same global order and reads
    /// its own slice.
    pub fn shard(mut self, shard: Shard) -> Self {
        self.opts.shard = shard;
        self
    }
    /// For iterable sources: a per-shard shuffle buffer of this many items,
    /// seeded by `(seed, epoch, shard)` (default 0: stream order). Its
    /// first item leaves once it holds 32, and it holds one more before each
    /// next one, up to `items`: a streamed shard starts before the buffer
    /// is full.
    pub fn shuffle_buffer(mut self, items: usize) -> Self {
        self.opts.shuffling.shuffle_buffer = items;
        self
    }
    /// For iterable sources: read `shards` shards together, one item from
    /// each in turn, so a batch mixes them (tf.data's `interleave`; default
    /// 1). Groups are consecutive runs of the epoch's shard order, so they
    /// change from epoch to epoch when shuffling; a group's shuffle buffer
    /// holds items of all its shards. Use it when shards are small (audio
    /// files of a few chunks) and batches should not end at every shard.
    pub fn interleave(mut self, shards: usize) -> Self {
        self.opts.shuffling.interleave = shards;
        self
    }

    /// Checks the plan and starts the worker pools.
    pub fn build(self) -> Result<Pipeline, BuildError> {
        let Options {
            batching,
            shuffling,
            scheduling,
            tuning,
            recording,
            on_error,
            shard,
        } = self.opts;
        if batching.size == 0 {
            return Err(BuildError::ZeroBatchSize);
        }
        if scheduling.max_bytes_in_flight == 0 {
            return Err(BuildError::ZeroBudget);
        }
        Shard::new(shard.rank, shard.world_size).map_err(|e| BuildError::Invalid(e.to_string()))?;
        if scheduling.prefetch == Some(0) {
            return Err(BuildError::Invalid("prefetch must be at least 1".into()));
        }
        // A setting the source kind cannot use is an error, not ignored.
        let misplaced = if self.iterable {
            self.sampler.is_some().then_some((
                "batch_sampler",
                "iterable",
                "an iterable source's order comes from its shards: use shuffle_buffer and interleave",
            ))
        } else if shuffling.shuffle_buffer > 0 || shuffling.interleave > 1 {
            Some((
                if shuffling.shuffle_buffer > 0 {
                    "shuffle_buffer"
                } else {
                    "interleave"
                },
                "map-style",
                "a map-style source is shuffled by its batch sampler (shuffle, batch_sampler)",
            ))
        } else {
            None
        };
        if let Some((setting, kind, hint)) = misplaced {
            return Err(BuildError::NotForSource {
                setting,
                kind,
                hint,
            });
        }
        for st in &self.stages {
            if let Parallelism::Fixed(n) = st.opts.workers {
                if n > crate::stage::MAX_WORKERS {
                    return Err(BuildError::Invalid(format!(
                        "stage {:?}: {n} workers is more than the {} a stage may have",
                        st.name,
                        crate::stage::MAX_WORKERS
                    )));
                }
            }
        }
        if scheduling
            .cpus
            .is_some_and(|c| c > crate::stage::MAX_WORKERS)
        {
            return Err(BuildError::Invalid(format!(
                "cpus: at most {}",
                crate::stage::MAX_WORKERS
            )));
        }
        let collate = self.collate.ok_or(BuildError::NoCollate)?;
        check_flow(&self.source_writes, &self.stages, &collate.reads())?;

        let cpus = scheduling.cpus.unwrap_or_else(available_cpus).max(1);
        let sampler: Box<dyn BatchSampler> = match self.sampler {
            Some(s) => s,
            None => Box::new(FixedBatches {
                order: if shuffling.shuffle {
                    Order::Shuffled
                } else {
                    Order::Sequential
                },
                batch_size: batching.size,
                drop_last: batching.drop_last,
            }),
        };
        let shared = Shared::new(
            self.source,
            self.stages,
            collate,
            sampler,
            Config {
                batching,
                shuffling: Shuffling {
                    interleave: shuffling.interleave.max(1),
                    ..shuffling
                },
                scheduling: Scheduling {
                    cpus: Some(cpus),
                    min_task_samples: scheduling.min_task_samples.max(1),
                    ..scheduling
                },
                tuning: Tuning {
                    interval: tuning.interval.max(Duration::from_millis(1)),
                    ..tuning
                },
                recording,
                policy: on_error,
                shard,
                cpus,
                max_workers: tuning.max_workers.unwrap_or((4 * cpus).clamp(4, 64)).max(1),
                batch_stages: self.batch_stages,
            },
            ByteBudget::new(scheduling.max_bytes_in_flight),
        );
        Pipeline::start(Arc::new(shared))
    }
}

/// Workers a CPU stage gets with `Parallelism::Auto`: the whole CPUs this
/// rank may use (affinity, cgroup quota, shared among local ranks; see
/// [`Resources`](crate::resources::Resources)), at least one.
pub fn available_cpus() -> usize {
    crate::resources::Resources::detect().workers()
}
