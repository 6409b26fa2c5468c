//! Sources with their types erased: a map-style source becomes a stage with
//! no input (row `i` is `get(i)`), an iterable source a function that opens
//! shard `s` as a [`ShardReader`](super::feed::iterable::ShardReader).
//!
//! ```text
//! ErasedSource::Map { len, read: RunFn, key }   ErasedSource::Iter { shards, key, open }
//! ```

use std::sync::Arc;

use crate::engine::{ShardReader, Stream, StreamReader};
use crate::error::BoxError;
use crate::source::{IterableSource, ShardEpoch, Source};
use crate::stage::{erase, RunFn, Stage, StageCtx};

pub(crate) type KeyFn = Box<dyn Fn(u64) -> Option<String> + Send + Sync>;

/// Opens shard `shard` for the epoch `at` with a shuffle buffer of
/// `capacity` items (≤ 1: off) seeded by `seed`.
pub(crate) type OpenFn = Box<
    dyn Fn(usize, usize, u64, ShardEpoch) -> Result<Box<dyn ShardReader>, BoxError> + Send + Sync,
>;

pub(crate) enum ErasedSource {
    Map {
        len: u64,
        read: RunFn,
        key: KeyFn,
    },
    Iter {
        shards: usize,
        key: Box<dyn Fn(usize) -> String + Send + Sync>,
        open: OpenFn,
        /// Items in a shard in an epoch, when known without reading it.
        len: Box<dyn Fn(usize, ShardEpoch) -> Option<u64> + Send + Sync>,
    },
}

/// A map-style source as a stage with no input: row `i` is `source.get(i)`.
pub(crate) struct SourceStage<S>(pub(crate) Arc<S>);

impl<S: Source> Stage for SourceStage<S> {
    type In = ();
    type Out = S::Output;
    fn process(&self, _: (), ctx: &StageCtx) -> Result<S::Output, BoxError> {
        let len = self.0.len();
        if ctx.index() >= len {
            return Err(format!("index {} is past the end (length {len})", ctx.index()).into());
        }
        self.0.get(ctx.index())
    }
}

impl ErasedSource {
    pub(crate) fn map<S: Source>(source: S) -> Self {
        let source = Arc::new(source);
        let s2 = Arc::clone(&source);
        ErasedSource::Map {
            len: source.len(),
            read: erase(SourceStage(source), 0),
            key: Box::new(move |i| s2.key(i)),
        }
    }
    pub(crate) fn iterable<S: IterableSource>(source: S) -> Self {
        let source = Arc::new(source);
        let s2 = Arc::clone(&source);
        let s3 = Arc::clone(&source);
        ErasedSource::Iter {
            shards: source.num_shards(),
            key: Box::new(move |s| s2.shard_key(s)),
            len: Box::new(move |s, at| s3.shard_len_at(s, at)),
            open: Box::new(move |shard, capacity, seed, at| {
                let it = source.open_at(shard, at)?;
                Ok(Box::new(StreamReader {
                    streams: vec![Stream {
                        it,
                        shard,
                        pos: 0,
                        exhausted: false,
                    }],
                    turn: 0,
                    buffer: Vec::with_capacity(capacity.min(1 << 16)),
                    capacity,
                    rng: crate::rng::sample_rng(seed),
                    exhausted: false,
                    emitted: 0,
                    failed: Vec::new(),
                    detached: false,
                }) as Box<dyn ShardReader>)
            }),
        }
    }
    pub(crate) fn key_of(&self, index: u64) -> Option<String> {
        match self {
            ErasedSource::Map { key, .. } => key(index),
            ErasedSource::Iter { key, .. } => {
                let shard = (index >> crate::source::STREAM_POSITION_BITS) as usize;
                let pos = index & ((1u64 << crate::source::STREAM_POSITION_BITS) - 1);
                Some(format!("{}#{pos}", key(shard)))
            }
        }
    }
}
