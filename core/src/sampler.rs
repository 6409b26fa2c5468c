//! Samplers: the order of an epoch and how it is cut into batches.
//!
//! A [`BatchSampler`] turns `(dataset length, seed, epoch)` into an
//! [`EpochPlan`]: the dataset indices of the epoch in order and the batch
//! boundaries. The shuffled order is a pure function of `(seed, epoch)`:
//! there is no `set_epoch` to forget.
//!
//! ```
//! use ferrofeed_core::{BatchSampler, FixedBatches, Order};
//! let s = FixedBatches { order: Order::Shuffled, batch_size: 4, drop_last: false };
//! let a = s.plan(10, 7, 0).unwrap();
//! assert_eq!(a.num_batches(), 3);
//! assert_eq!(a.batch(2).len(), 2);
//! assert_eq!(a.indices, s.plan(10, 7, 0).unwrap().indices, "same seed and epoch, same order");
//! assert_ne!(a.indices, s.plan(10, 7, 1).unwrap().indices, "a new epoch, a new order");
//! ```
use rand::Rng;

use crate::error::BoxError;
use crate::rng::{derive_seed, sample_rng};

/// One epoch's order and batch boundaries.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EpochPlan {
    /// Dataset indices in the order they are delivered.
    pub indices: Vec<u64>,
    /// Batch `b` is `indices[offsets[b]..offsets[b + 1]]`; `offsets[0] == 0`.
    pub offsets: Vec<usize>,
}

impl EpochPlan {
    /// Cuts `indices` into batches of `batch_size` (the last one short unless
    /// `drop_last`).
    pub fn fixed(mut indices: Vec<u64>, batch_size: usize, drop_last: bool) -> EpochPlan {
        let batch_size = batch_size.max(1);
        if drop_last {
            indices.truncate(indices.len() / batch_size * batch_size);
        }
        let mut offsets: Vec<usize> = (0..indices.len()).step_by(batch_size).collect();
        offsets.push(indices.len());
        EpochPlan { indices, offsets }
    }
    /// Number of batches.
    pub fn num_batches(&self) -> usize {
        self.offsets.len().saturating_sub(1)
    }
    /// The dataset indices of batch `b`.
    pub fn batch(&self, b: usize) -> &[u64] {
        &self.indices[self.offsets[b]..self.offsets[b + 1]]
    }
}

/// Decides the order and batching of each epoch.
pub trait BatchSampler: Send + Sync + 'static {
    /// The plan of epoch `epoch` over a dataset of `len` samples.
    fn plan(&self, len: u64, seed: u64, epoch: u64) -> Result<EpochPlan, BoxError>;
}

/// Sequential or shuffled order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Order {
    /// `0, 1, 2, …`
    Sequential,
    /// A permutation drawn from `(seed, epoch)`.
    Shuffled,
}

/// A seeded permutation of `0..len`, a pure function of `(seed, epoch)`.
pub fn permutation(len: u64, seed: u64, epoch: u64) -> Vec<u64> {
    let mut v: Vec<u64> = (0..len).collect();
    let mut rng = sample_rng(derive_seed(&[seed, epoch, 0x5348_5546]));
    for i in (1..v.len()).rev() {
        let j = rng.random_range(0..=i);
        v.swap(i, j);
    }
    v
}

/// Fixed-size batches over a sequential or shuffled order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FixedBatches {
    /// Sample order.
    pub order: Order,
    /// Samples per batch.
    pub batch_size: usize,
    /// Drop the last batch when it is short.
    pub drop_last: bool,
}

impl BatchSampler for FixedBatches {
    fn plan(&self, len: u64, seed: u64, epoch: u64) -> Result<EpochPlan, BoxError> {
        let indices = match self.order {
            Order::Sequential => (0..len).collect(),
            Order::Shuffled => permutation(len, seed, epoch),
        };
        Ok(EpochPlan::fixed(indices, self.batch_size, self.drop_last))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn permutation_is_a_permutation() {
        let mut p = permutation(1000, 3, 9);
        assert_ne!(p, (0..1000).collect::<Vec<_>>());
        p.sort_unstable();
        assert_eq!(p, (0..1000).collect::<Vec<_>>());
    }

    #[test]
    fn drop_last_drops_the_short_batch() {
        let p = EpochPlan::fixed((0..10).collect(), 4, true);
        assert_eq!(p.num_batches(), 2);
        assert_eq!(p.indices.len(), 8);
        let e = EpochPlan::fixed(Vec::new(), 4, false);
        assert_eq!(e.num_batches(), 0);
    }
}
