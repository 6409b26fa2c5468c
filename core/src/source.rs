//! Sources: where samples come from.
//!
//! A map-style [`Source`] has a known length and random access
//! (`source.get(42)`); an [`IterableSource`] is a set of shards, each read as
//! a stream. Either is shared read-only (behind an `Arc`) by every worker —
//! never copied per worker.
//!
//! ```
//! use ferrofeed_core::{FnSource, Source};
//! let squares = FnSource::new(5, |i| Ok(i * i));
//! assert_eq!(squares.len(), 5);
//! assert_eq!(squares.get(3).unwrap(), 9);
//! ```
use crate::component_set::ComponentSet;
use crate::error::BoxError;

/// A map-style dataset: a known length and random access by index.
pub trait Source: Send + Sync + 'static {
    /// The components a fresh sample starts with.
    type Output: ComponentSet;
    /// Number of samples.
    fn len(&self) -> u64;
    /// Whether there are no samples.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// Reads sample `index` (`index < len()`).
    fn get(&self, index: u64) -> Result<Self::Output, BoxError>;
    /// The sample's path or key, used to name it in errors and reports.
    fn key(&self, _index: u64) -> Option<String> {
        None
    }
}

impl<S: Source> Source for std::sync::Arc<S> {
    type Output = S::Output;
    fn len(&self) -> u64 {
        (**self).len()
    }
    fn get(&self, index: u64) -> Result<Self::Output, BoxError> {
        (**self).get(index)
    }
    fn key(&self, index: u64) -> Option<String> {
        (**self).key(index)
    }
}

/// A map-style source from a length and a function.
pub struct FnSource<F> {
    len: u64,
    f: F,
}

impl<F> FnSource<F> {
    /// `len` samples, sample `i` being `f(i)`.
    pub fn new(len: u64, f: F) -> Self {
        FnSource { len, f }
    }
}

impl<F, O> Source for FnSource<F>
where
    F: Fn(u64) -> Result<O, BoxError> + Send + Sync + 'static,
    O: ComponentSet,
{
    type Output = O;
    fn len(&self) -> u64 {
        self.len
    }
    fn get(&self, index: u64) -> Result<O, BoxError> {
        (self.f)(index)
    }
}

/// The items of one shard, as a stream.
pub type ShardIter<O> = Box<dyn Iterator<Item = Result<O, BoxError>> + Send + 'static>;

/// A streamed dataset: a list of shards (files, tar archives, byte ranges),
/// each read front to back. Each shard is read by exactly one worker per
/// epoch, so no element is read twice.
pub trait IterableSource: Send + Sync + 'static {
    /// The components a fresh sample starts with.
    type Output: ComponentSet;
    /// Number of shards.
    fn num_shards(&self) -> usize;
    /// A readable name for shard `shard` (its path).
    fn shard_key(&self, shard: usize) -> String;
    /// Opens shard `shard` for streaming.
    fn open(&self, shard: usize) -> Result<ShardIter<Self::Output>, BoxError>;
    /// How many items shard `shard` will yield, when that is known without
    /// reading it (from headers, an index); `None` (the default) when not.
    /// With every shard's length known, the pipeline knows its epoch length
    /// ([`Pipeline::epoch_hint`](crate::Pipeline::epoch_hint)).
    fn shard_len(&self, shard: usize) -> Option<u64> {
        let _ = shard;
        None
    }
    /// Opens shard `shard` for the epoch `at`. A source whose items vary by
    /// epoch (audio's random chunk offsets) overrides this with a pure
    /// function of `(at.seed, at.epoch, shard)`, so runs, worker counts and
    /// resumes see the same items; the default is [`open`](Self::open), the
    /// same items every epoch. The engine opens shards through this.
    fn open_at(&self, shard: usize, at: ShardEpoch) -> Result<ShardIter<Self::Output>, BoxError> {
        let _ = at;
        self.open(shard)
    }
    /// [`shard_len`](Self::shard_len) for the epoch `at`, for a source that
    /// overrides [`open_at`](Self::open_at).
    fn shard_len_at(&self, shard: usize, at: ShardEpoch) -> Option<u64> {
        let _ = at;
        self.shard_len(shard)
    }
}

/// The epoch a shard is opened for: the pipeline's seed and the epoch
/// number (see [`IterableSource::open_at`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct ShardEpoch {
    /// The pipeline's seed.
    pub seed: u64,
    /// The epoch.
    pub epoch: u64,
}

/// Bits of a streamed sample's index that hold its position in its shard;
/// the shard number is in the bits above. See [`stream_index`].
pub const STREAM_POSITION_BITS: u32 = 40;

/// The index given to item `position` of shard `shard` of an iterable source.
pub const fn stream_index(shard: usize, position: u64) -> u64 {
    ((shard as u64) << STREAM_POSITION_BITS) | position
}
