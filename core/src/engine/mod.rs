//! The engine's plumbing, kept apart from the pipeline's public face
//! ([`crate::pipeline`]) as rayon keeps `iter::plumbing` apart.
//!
//! - **Segments.** Stages with equal worker counts are fused into one
//!   segment ([`plan`]); each segment has its own pool of threads
//!   ([`worker`]) that lives as long as the pipeline. Segments are linked by
//!   bounded `flume` queues; the last one collates ([`collate`]).
//! - **Tasks.** Work moves in tasks — runs of consecutive batches (map-style
//!   sources) or one part of a shard group (iterable sources), stored
//!   column-wise as a [`Table`](crate::Table). A task is admitted under the
//!   byte budget before it reads anything ([`worker`]'s `admit`), runs
//!   through a segment's stages under the error policy, and is forwarded.
//! - **Keys.** Every task carries a key `(major, minor)`: the plan batch it
//!   starts at (map) or the shard group and part (iterable). The consumer
//!   ([`crate::EpochIter`]) reorders tasks by key, and a resume position is
//!   a key.
//! - **Feeds.** The two source kinds are feeds the first segment's workers
//!   pull tasks from, one file each: [`feed::map`] claims runs of plan
//!   batches, [`feed::iterable`] claims shard groups and reads them part by
//!   part (handing parts to idle workers, holding short last parts back).
//! - **State.** What the threads share is [`shared::Shared`]; an epoch's
//!   run and the messages between threads are in [`messages`]; the monitor
//!   thread (timeline, autotuner) is [`monitor`].
//! - **First rows.** Until a segment is measured, a task's first row runs
//!   through it alone so the budget can admit the other workers' tasks
//!   early ([`probe`]).
//! - **One sample, one thread.** [`local`] runs the same plan — the feed's
//!   reader, every stage node under its policy, the collate — for one sample
//!   in the calling thread with the workers' row executor; `inspect` is
//!   built on it.
//!
//! ```text
//! source ─▶ [segment 0: read+decode ×N] ─queue─▶ [segment 1: collate ×M] ─▶ consumer (reorder by key)
//!              ▲ feed: map batches | shard-group parts        admission: byte budget, window
//! ```

pub(crate) mod collate;
pub(crate) mod counters;
pub(crate) mod feed;
pub(crate) mod local;
pub(crate) mod messages;
pub(crate) mod monitor;
pub(crate) mod plan;
pub(crate) mod probe;
pub(crate) mod shared;
pub(crate) mod source;
pub(crate) mod worker;

pub(crate) use self::counters::*;
pub(crate) use self::feed::iterable::*;
pub(crate) use self::local::Local;
pub(crate) use self::messages::*;
pub(crate) use self::monitor::*;
pub(crate) use self::plan::*;
pub(crate) use self::probe::join;
pub(crate) use self::shared::*;
pub(crate) use self::source::*;
pub(crate) use self::worker::*;
