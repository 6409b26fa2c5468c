//! Samplers: the order of an epoch, how it is cut into batches, and which
//! part of it each distributed rank reads.
//!
//! A [`BatchSampler`] turns a [`PlanCtx`] — dataset length, seed, epoch and
//! [`Shard`] — into an [`EpochPlan`]: this rank's dataset indices in order
//! and its batch boundaries. Every random choice is a pure function of
//! `(seed, epoch)`: there is no `set_epoch` to forget, and every rank draws
//! the same global order and takes its own slice of it.
//!
//! ```
//! use ferrofeed_core::{BatchSampler, FixedBatches, Order, PlanCtx, Shard};
//! let s = FixedBatches { order: Order::Shuffled, batch_size: 4, drop_last: false };
//! let ctx = |epoch, rank| PlanCtx { len: 10, seed: 7, epoch, shard: Shard::new(rank, 2).unwrap() };
//! let (a, b) = (s.plan(&ctx(0, 0)).unwrap(), s.plan(&ctx(0, 1)).unwrap());
//! let mut all: Vec<u64> = a.indices.iter().chain(&b.indices).copied().collect();
//! all.sort();
//! assert_eq!(all, (0..10).collect::<Vec<_>>(), "the ranks cover the epoch exactly once");
//! assert_ne!(a.indices, s.plan(&ctx(1, 0)).unwrap().indices, "a new epoch, a new order");
//! ```
use rand::Rng;
use serde::{Deserialize, Serialize};

use crate::error::BoxError;
use crate::rng::{derive_seed, sample_rng};

/// One epoch's order and batch boundaries, for one rank.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EpochPlan {
    /// Dataset indices in the order they are delivered.
    pub indices: Vec<u64>,
    /// Batch `b` is `indices[offsets[b]..offsets[b + 1]]`; `offsets[0] == 0`.
    pub offsets: Vec<usize>,
    /// Samples repeated from the start of the epoch so that every rank gets
    /// as many as the others (PyTorch's `DistributedSampler` padding).
    pub padded: usize,
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
        EpochPlan {
            indices,
            offsets,
            padded: 0,
        }
    }
    /// A plan from explicit batches.
    pub fn from_batches(batches: Vec<Vec<u64>>) -> EpochPlan {
        let mut indices = Vec::with_capacity(batches.iter().map(Vec::len).sum());
        let mut offsets = vec![0];
        for b in batches {
            indices.extend(b);
            offsets.push(indices.len());
        }
        EpochPlan {
            indices,
            offsets,
            padded: 0,
        }
    }
    /// Number of batches.
    pub fn num_batches(&self) -> usize {
        self.offsets.len().saturating_sub(1)
    }
    /// The dataset indices of batch `b`.
    pub fn batch(&self, b: usize) -> &[u64] {
        &self.indices[self.offsets[b]..self.offsets[b + 1]]
    }
    /// A digest of which samples the plan delivers in which batches (FNV-1a
    /// over the batch lengths and indices, as 16 hex digits): two plans
    /// with the same digest cut the epoch alike, so a saved position means
    /// the same samples in both.
    pub fn digest(&self) -> String {
        const PRIME: u64 = 0x0100_0000_01b3;
        let mut h: u64 = 0xcbf2_9ce4_8422_2325;
        let mut eat = |x: u64| h = (h ^ x).wrapping_mul(PRIME);
        for w in self.offsets.windows(2) {
            eat(u64::MAX - (w[1] - w[0]) as u64);
            for &i in &self.indices[w[0]..w[1]] {
                eat(i);
            }
        }
        format!("{h:016x}")
    }
}

/// This process's place among the ranks of a distributed job.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Shard {
    /// This rank, `0..world_size`.
    pub rank: usize,
    /// Number of ranks.
    pub world_size: usize,
    /// Whether ranks are evened out: without `drop_last`, samples (or
    /// batches) from the start of the epoch are repeated so every rank gets
    /// as many as the others, as PyTorch's `DistributedSampler` does (the
    /// default). `false`: each sample goes to exactly one rank, and counts
    /// may differ by one — for consumers that gather every rank's output,
    /// such as Ray read tasks.
    #[serde(default = "padded_by_default")]
    pub pad: bool,
}

fn padded_by_default() -> bool {
    true
}

/// An impossible shard.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ShardError {
    /// `world_size` is 0.
    #[error("world size must be at least 1")]
    ZeroWorld,
    /// `rank >= world_size`.
    #[error("rank {rank} is not below the world size {world_size}")]
    RankOutOfRange {
        /// The rank.
        rank: usize,
        /// The world size.
        world_size: usize,
    },
    /// An environment variable is not a number.
    #[error("environment variable {name}={value:?} is not a whole number")]
    BadEnv {
        /// The variable.
        name: String,
        /// Its value.
        value: String,
    },
}

impl Default for Shard {
    fn default() -> Self {
        Shard::single()
    }
}

impl Shard {
    /// Rank `rank` of `world_size`.
    pub fn new(rank: usize, world_size: usize) -> Result<Shard, ShardError> {
        if world_size == 0 {
            return Err(ShardError::ZeroWorld);
        }
        if rank >= world_size {
            return Err(ShardError::RankOutOfRange { rank, world_size });
        }
        Ok(Shard {
            rank,
            world_size,
            pad: true,
        })
    }
    /// The same rank with padding on or off (see [`pad`](Self::pad)).
    pub fn padded(self, pad: bool) -> Shard {
        Shard { pad, ..self }
    }
    /// The only rank of a single-process job.
    pub fn single() -> Shard {
        Shard {
            rank: 0,
            world_size: 1,
            pad: true,
        }
    }
    /// From `RANK`/`WORLD_SIZE` (torchrun), else `SLURM_PROCID`/`SLURM_NTASKS`,
    /// else rank 0 of 1.
    pub fn from_env() -> Result<Shard, ShardError> {
        Shard::from_vars(|k| std::env::var(k).ok())
    }
    /// [`from_env`](Self::from_env) over any variable lookup.
    pub fn from_vars(get: impl Fn(&str) -> Option<String>) -> Result<Shard, ShardError> {
        let num = |name: &str| -> Result<Option<usize>, ShardError> {
            match get(name) {
                None => Ok(None),
                Some(v) => v.trim().parse().map(Some).map_err(|_| ShardError::BadEnv {
                    name: name.to_string(),
                    value: v,
                }),
            }
        };
        for (r, w) in [("RANK", "WORLD_SIZE"), ("SLURM_PROCID", "SLURM_NTASKS")] {
            if let (Some(rank), Some(world)) = (num(r)?, num(w)?) {
                return Shard::new(rank, world);
            }
        }
        Ok(Shard::single())
    }

    /// This rank's strided slice of a global order. Without `drop_last` the
    /// order is first padded by repeating from its start up to a multiple of
    /// the world size, so every rank gets the same count (unless
    /// [`pad`](Self::pad) is off: then nothing is repeated); with it, the tail
    /// that does not divide evenly is dropped. Returns the slice and how many
    /// of its samples are padding.
    pub fn slice_samples(&self, mut order: Vec<u64>, drop_last: bool) -> (Vec<u64>, usize) {
        let w = self.world_size;
        let n = order.len();
        if w == 1 {
            return (order, 0);
        }
        let total = if drop_last {
            n / w * w
        } else if self.pad {
            n.div_ceil(w) * w
        } else {
            n
        };
        if total <= n {
            order.truncate(total);
        } else if n > 0 {
            for i in 0..total - n {
                order.push(order[i % n]);
            }
        }
        let mine: Vec<u64> = order.iter().skip(self.rank).step_by(w).copied().collect();
        let padded = (self.rank..total).step_by(w).filter(|&p| p >= n).count();
        (mine, padded)
    }

    /// This rank's strided slice of a global list of batches, padded (or
    /// trimmed with `drop_last`) so every rank gets the same count; with
    /// [`pad`](Self::pad) off and no `drop_last`, each batch goes to one rank.
    pub fn slice_batches(&self, plan: EpochPlan, drop_last: bool) -> EpochPlan {
        let w = self.world_size;
        if w == 1 {
            return plan;
        }
        let nb = plan.num_batches();
        let total = if drop_last {
            nb / w * w
        } else if self.pad {
            nb.div_ceil(w) * w
        } else {
            nb
        };
        let mut batches = Vec::with_capacity(total / w);
        let mut padded = 0;
        for pos in (self.rank..total).step_by(w) {
            let b = if nb == 0 { break } else { pos % nb };
            if pos >= nb {
                padded += plan.batch(b).len();
            }
            batches.push(plan.batch(b).to_vec());
        }
        let mut out = EpochPlan::from_batches(batches);
        out.padded = padded;
        out
    }
}

/// What a sampler plans for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PlanCtx {
    /// Dataset length.
    pub len: u64,
    /// The pipeline's seed.
    pub seed: u64,
    /// The epoch.
    pub epoch: u64,
    /// This rank.
    pub shard: Shard,
}

/// Decides the order and batching of each epoch, for one rank.
pub trait BatchSampler: Send + Sync + 'static {
    /// The plan of `ctx.epoch` for `ctx.shard`.
    fn plan(&self, ctx: &PlanCtx) -> Result<EpochPlan, BoxError>;
}

/// Decides only the order of each epoch (the global order, before
/// sharding); [`Batched`] cuts it into batches.
pub trait Sampler: Send + Sync + 'static {
    /// The global order of epoch `epoch` over `len` samples.
    fn order(&self, len: u64, seed: u64, epoch: u64) -> Result<Vec<u64>, BoxError>;
}

/// Sequential or shuffled order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Order {
    /// `0, 1, 2, …`
    Sequential,
    /// A permutation drawn from `(seed, epoch)`.
    Shuffled,
}

impl Sampler for Order {
    fn order(&self, len: u64, seed: u64, epoch: u64) -> Result<Vec<u64>, BoxError> {
        Ok(match self {
            Order::Sequential => (0..len).collect(),
            Order::Shuffled => permutation(len, seed, epoch),
        })
    }
}

/// An RNG for a sampler's draws in an epoch.
fn epoch_rng(seed: u64, epoch: u64, salt: u64) -> crate::rng::SampleRng {
    sample_rng(derive_seed(&[seed, epoch, salt]))
}

/// A seeded permutation of `0..len`, a pure function of `(seed, epoch)`.
pub fn permutation(len: u64, seed: u64, epoch: u64) -> Vec<u64> {
    let mut v: Vec<u64> = (0..len).collect();
    shuffle(&mut v, &mut epoch_rng(seed, epoch, 0x5348_5546));
    v
}

fn shuffle<T>(v: &mut [T], rng: &mut impl Rng) {
    for i in (1..v.len()).rev() {
        let j = rng.random_range(0..=i);
        v.swap(i, j);
    }
}

/// Any [`Sampler`]'s order, sharded by sample, in fixed-size batches.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Batched<S> {
    /// The order.
    pub sampler: S,
    /// Samples per batch.
    pub batch_size: usize,
    /// Drop the last batch when it is short (and the tail that does not
    /// divide evenly among ranks).
    pub drop_last: bool,
}

impl<S: Sampler> BatchSampler for Batched<S> {
    fn plan(&self, ctx: &PlanCtx) -> Result<EpochPlan, BoxError> {
        let order = self.sampler.order(ctx.len, ctx.seed, ctx.epoch)?;
        let (mine, padded) = ctx.shard.slice_samples(order, self.drop_last);
        let mut plan = EpochPlan::fixed(mine, self.batch_size, self.drop_last);
        plan.padded = padded;
        Ok(plan)
    }
}

/// Fixed-size batches over a sequential or shuffled order (the default).
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
    fn plan(&self, ctx: &PlanCtx) -> Result<EpochPlan, BoxError> {
        Batched {
            sampler: self.order,
            batch_size: self.batch_size,
            drop_last: self.drop_last,
        }
        .plan(ctx)
    }
}

/// Draws samples with probability proportional to a weight, with or without
/// replacement.
#[derive(Debug, Clone, PartialEq)]
pub struct Weighted {
    cumulative: Vec<f64>,
    weights: Vec<f64>,
    num_samples: u64,
    replacement: bool,
}

/// Weights that cannot be sampled from.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum WeightError {
    /// A weight is negative, NaN or infinite.
    #[error("weight {index} is {value}: weights must be finite and non-negative")]
    Invalid {
        /// Position of the weight.
        index: usize,
        /// Its value.
        value: f64,
    },
    /// Every weight is zero (or there are none).
    #[error("all weights are zero: nothing can be drawn")]
    AllZero,
    /// More samples without replacement than non-zero weights.
    #[error("{wanted} samples without replacement, but only {available} have a non-zero weight")]
    TooFew {
        /// Samples asked for.
        wanted: u64,
        /// Non-zero weights.
        available: u64,
    },
}

impl Weighted {
    /// `num_samples` draws per epoch over `weights` (one per dataset index).
    pub fn new(
        weights: Vec<f64>,
        num_samples: u64,
        replacement: bool,
    ) -> Result<Self, WeightError> {
        for (i, &w) in weights.iter().enumerate() {
            if !w.is_finite() || w < 0.0 {
                return Err(WeightError::Invalid { index: i, value: w });
            }
        }
        let available = weights.iter().filter(|&&w| w > 0.0).count() as u64;
        if available == 0 {
            return Err(WeightError::AllZero);
        }
        if !replacement && num_samples > available {
            return Err(WeightError::TooFew {
                wanted: num_samples,
                available,
            });
        }
        let mut acc = 0.0;
        let cumulative = weights
            .iter()
            .map(|w| {
                acc += w;
                acc
            })
            .collect();
        Ok(Weighted {
            cumulative,
            weights,
            num_samples,
            replacement,
        })
    }
}

impl Sampler for Weighted {
    fn order(&self, len: u64, seed: u64, epoch: u64) -> Result<Vec<u64>, BoxError> {
        if len != self.weights.len() as u64 {
            return Err(format!(
                "{} weights for a dataset of {len} samples",
                self.weights.len()
            )
            .into());
        }
        let mut rng = epoch_rng(seed, epoch, 0x5745_4947);
        if self.replacement {
            let total = *self.cumulative.last().unwrap_or(&0.0);
            Ok((0..self.num_samples)
                .map(|_| {
                    let x = rng.random::<f64>() * total;
                    let i = self.cumulative.partition_point(|&c| c <= x);
                    i.min(self.weights.len() - 1) as u64
                })
                .collect())
        } else {
            // Efraimidis–Spirakis: the largest u^(1/w) keys win.
            let mut keys: Vec<(f64, u64)> = self
                .weights
                .iter()
                .enumerate()
                .filter(|(_, &w)| w > 0.0)
                .map(|(i, &w)| (rng.random::<f64>().ln() / w, i as u64))
                .collect();
            keys.sort_by(|a, b| b.0.total_cmp(&a.0));
            Ok(keys
                .into_iter()
                .take(self.num_samples as usize)
                .map(|(_, i)| i)
                .collect())
        }
    }
}

/// Batches holding about equal counts of every class (within one), for
/// datasets where some classes have far more samples than others: classes
/// with fewer samples are cycled through again.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClassBalanced {
    by_class: Vec<Vec<u64>>,
    len: u64,
    batch_size: usize,
}

impl ClassBalanced {
    /// `labels[i]` is the class of dataset index `i`; an epoch has as many
    /// batches as plain batching would.
    pub fn new(labels: &[usize], batch_size: usize) -> Result<Self, BoxError> {
        if batch_size == 0 {
            return Err("batch size must be at least 1".into());
        }
        let classes = labels.iter().copied().max().map_or(0, |m| m + 1);
        let mut by_class = vec![Vec::new(); classes];
        for (i, &c) in labels.iter().enumerate() {
            by_class[c].push(i as u64);
        }
        by_class.retain(|v| !v.is_empty());
        if by_class.is_empty() {
            return Err("no labels: nothing to balance".into());
        }
        Ok(ClassBalanced {
            by_class,
            len: labels.len() as u64,
            batch_size,
        })
    }
}

impl BatchSampler for ClassBalanced {
    fn plan(&self, ctx: &PlanCtx) -> Result<EpochPlan, BoxError> {
        if ctx.len != self.len {
            return Err(format!("labels for {} samples, dataset of {}", self.len, ctx.len).into());
        }
        let mut rng = epoch_rng(ctx.seed, ctx.epoch, 0x4241_4C41);
        let mut pools: Vec<Vec<u64>> = self.by_class.clone();
        for p in &mut pools {
            shuffle(p, &mut rng);
        }
        let mut cursor = vec![0usize; pools.len()];
        let nb = (self.len as usize).div_ceil(self.batch_size);
        let mut batches = Vec::with_capacity(nb);
        let mut classes: Vec<usize> = (0..pools.len()).collect();
        for _ in 0..nb {
            let mut batch = Vec::with_capacity(self.batch_size);
            while batch.len() < self.batch_size {
                // Each round takes one sample of every class, in a fresh
                // order, so counts differ by at most one.
                shuffle(&mut classes, &mut rng);
                for &c in &classes {
                    if batch.len() == self.batch_size {
                        break;
                    }
                    let pool = &mut pools[c];
                    if cursor[c] == pool.len() {
                        shuffle(pool, &mut rng);
                        cursor[c] = 0;
                    }
                    batch.push(pool[cursor[c]]);
                    cursor[c] += 1;
                }
            }
            batches.push(batch);
        }
        Ok(ctx
            .shard
            .slice_batches(EpochPlan::from_batches(batches), false))
    }
}

/// Time series: each batch is a window of consecutive indices; the windows'
/// order is shuffled per epoch when `shuffle` is set.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ContiguousWindows {
    /// Indices per window (= batch).
    pub window: usize,
    /// Shuffle the order of the windows.
    pub shuffle: bool,
    /// Drop a short last window.
    pub drop_last: bool,
}

impl BatchSampler for ContiguousWindows {
    fn plan(&self, ctx: &PlanCtx) -> Result<EpochPlan, BoxError> {
        if self.window == 0 {
            return Err("window must be at least 1".into());
        }
        let mut batches: Vec<Vec<u64>> = (0..ctx.len)
            .step_by(self.window)
            .map(|s| (s..(s + self.window as u64).min(ctx.len)).collect::<Vec<u64>>())
            .filter(|w| !self.drop_last || w.len() == self.window)
            .collect();
        if self.shuffle {
            shuffle(
                &mut batches,
                &mut epoch_rng(ctx.seed, ctx.epoch, 0x5749_4E44),
            );
        }
        Ok(ctx
            .shard
            .slice_batches(EpochPlan::from_batches(batches), self.drop_last))
    }
}

/// Curriculum learning: a score per sample (low = easy); epoch 0 draws from
/// the easiest `start_fraction`, and the pool widens linearly to every sample
/// by `full_at_epoch`. Each epoch's pool is shuffled.
#[derive(Debug, Clone, PartialEq)]
pub struct Curriculum {
    by_difficulty: Vec<u64>,
    /// Share of the dataset used at epoch 0, in (0, 1].
    pub start_fraction: f64,
    /// First epoch that uses every sample.
    pub full_at_epoch: u64,
}

impl Curriculum {
    /// From one score per dataset index.
    pub fn new(scores: &[f64], start_fraction: f64, full_at_epoch: u64) -> Result<Self, BoxError> {
        if let Some((i, s)) = scores.iter().enumerate().find(|(_, s)| !s.is_finite()) {
            return Err(format!("score {i} is {s}: scores must be finite").into());
        }
        if !(start_fraction > 0.0 && start_fraction <= 1.0) {
            return Err(format!("start fraction {start_fraction} is not in (0, 1]").into());
        }
        let mut by_difficulty: Vec<u64> = (0..scores.len() as u64).collect();
        by_difficulty.sort_by(|&a, &b| scores[a as usize].total_cmp(&scores[b as usize]));
        Ok(Curriculum {
            by_difficulty,
            start_fraction,
            full_at_epoch,
        })
    }
    /// Share of the dataset drawn from at `epoch`.
    pub fn fraction(&self, epoch: u64) -> f64 {
        if self.full_at_epoch == 0 || epoch >= self.full_at_epoch {
            return 1.0;
        }
        self.start_fraction + (1.0 - self.start_fraction) * epoch as f64 / self.full_at_epoch as f64
    }
}

impl Sampler for Curriculum {
    fn order(&self, len: u64, seed: u64, epoch: u64) -> Result<Vec<u64>, BoxError> {
        if len != self.by_difficulty.len() as u64 {
            return Err(format!(
                "{} scores for a dataset of {len} samples",
                self.by_difficulty.len()
            )
            .into());
        }
        let n = ((len as f64 * self.fraction(epoch) - 1e-9).ceil() as usize)
            .clamp(1.min(len as usize), len as usize);
        let mut pool = self.by_difficulty[..n].to_vec();
        shuffle(&mut pool, &mut epoch_rng(seed, epoch, 0x4355_5252));
        Ok(pool)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ctx(len: u64, epoch: u64, rank: usize, world: usize) -> PlanCtx {
        PlanCtx {
            len,
            seed: 3,
            epoch,
            shard: Shard::new(rank, world).unwrap(),
        }
    }

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

    #[test]
    fn short_ranks_are_padded_from_the_start_and_it_is_reported() {
        let s = FixedBatches {
            order: Order::Sequential,
            batch_size: 2,
            drop_last: false,
        };
        let plans: Vec<EpochPlan> = (0..3).map(|r| s.plan(&ctx(10, 0, r, 3)).unwrap()).collect();
        assert_eq!(plans[0].indices, vec![0, 3, 6, 9]);
        assert_eq!(plans[1].indices, vec![1, 4, 7, 0]);
        assert_eq!(plans[2].indices, vec![2, 5, 8, 1]);
        assert_eq!(
            plans.iter().map(|p| p.padded).collect::<Vec<_>>(),
            vec![0, 1, 1]
        );
        let dl = FixedBatches {
            drop_last: true,
            ..s
        };
        assert_eq!(dl.plan(&ctx(10, 0, 2, 3)).unwrap().indices, vec![2, 5]);
    }

    #[test]
    fn unpadded_ranks_cover_the_epoch_exactly_once() {
        let s = FixedBatches {
            order: Order::Shuffled,
            batch_size: 2,
            drop_last: false,
        };
        let plans: Vec<EpochPlan> = (0..3)
            .map(|r| {
                let mut c = ctx(10, 4, r, 3);
                c.shard = c.shard.padded(false);
                s.plan(&c).unwrap()
            })
            .collect();
        assert_eq!(
            plans.iter().map(|p| p.indices.len()).collect::<Vec<_>>(),
            vec![4, 3, 3]
        );
        assert!(plans.iter().all(|p| p.padded == 0));
        let mut all: Vec<u64> = plans.iter().flat_map(|p| p.indices.clone()).collect();
        all.sort_unstable();
        assert_eq!(all, (0..10).collect::<Vec<_>>());
        // Batches: 5 batches over 3 ranks go 2, 2, 1 without repeats.
        let five = EpochPlan::fixed((0..10).collect(), 2, false);
        let counts: Vec<usize> = (0..3)
            .map(|r| {
                Shard::new(r, 3)
                    .unwrap()
                    .padded(false)
                    .slice_batches(five.clone(), false)
                    .num_batches()
            })
            .collect();
        assert_eq!(counts, vec![2, 2, 1]);
        // Padded (the default), rank 2 repeats batch 0.
        let padded = Shard::new(2, 3).unwrap().slice_batches(five, false);
        assert_eq!((padded.num_batches(), padded.padded), (2, 2));
    }

    #[test]
    fn bad_shards_and_env() {
        assert_eq!(Shard::new(0, 0), Err(ShardError::ZeroWorld));
        assert!(matches!(
            Shard::new(4, 4),
            Err(ShardError::RankOutOfRange { .. })
        ));
        let env = |pairs: &'static [(&'static str, &'static str)]| {
            move |k: &str| {
                pairs
                    .iter()
                    .find(|(n, _)| *n == k)
                    .map(|(_, v)| v.to_string())
            }
        };
        assert_eq!(
            Shard::from_vars(env(&[("RANK", "2"), ("WORLD_SIZE", "4")])),
            Shard::new(2, 4)
        );
        assert_eq!(
            Shard::from_vars(env(&[("SLURM_PROCID", "1"), ("SLURM_NTASKS", "3")])),
            Shard::new(1, 3)
        );
        assert_eq!(Shard::from_vars(env(&[])), Ok(Shard::single()));
        assert!(Shard::from_vars(env(&[("RANK", "x"), ("WORLD_SIZE", "2")])).is_err());
        assert!(Shard::from_vars(env(&[("RANK", "5"), ("WORLD_SIZE", "2")])).is_err());
    }

    #[test]
    fn weighted_sampling_follows_the_weights_and_refuses_bad_ones() {
        let w = Weighted::new(vec![0.0, 1.0, 3.0], 4000, true).unwrap();
        let o = w.order(3, 1, 0).unwrap();
        assert!(!o.contains(&0));
        let threes = o.iter().filter(|&&i| i == 2).count() as f64 / o.len() as f64;
        assert!((0.7..0.8).contains(&threes), "{threes}");
        let nr = Weighted::new(vec![1.0, 5.0, 0.5, 2.0], 3, false).unwrap();
        let mut o = nr.order(4, 1, 2).unwrap();
        o.sort();
        o.dedup();
        assert_eq!(o.len(), 3, "no repeats without replacement");
        assert!(matches!(
            Weighted::new(vec![1.0, -1.0], 1, true),
            Err(WeightError::Invalid { index: 1, .. })
        ));
        assert!(matches!(
            Weighted::new(vec![f64::NAN], 1, true),
            Err(WeightError::Invalid { .. })
        ));
        assert_eq!(
            Weighted::new(vec![0.0, 0.0], 1, true),
            Err(WeightError::AllZero)
        );
        assert!(matches!(
            Weighted::new(vec![1.0, 0.0], 2, false),
            Err(WeightError::TooFew { .. })
        ));
    }

    #[test]
    fn curriculum_widens_from_easy_to_all() {
        let scores: Vec<f64> = (0..100).map(|i| i as f64).collect();
        let c = Curriculum::new(&scores, 0.2, 4).unwrap();
        let e0 = c.order(100, 1, 0).unwrap();
        assert_eq!(e0.len(), 20);
        assert!(
            e0.iter().all(|&i| i < 20),
            "epoch 0 holds the easiest fifth"
        );
        assert_eq!(c.order(100, 1, 2).unwrap().len(), 60);
        assert_eq!(c.order(100, 1, 9).unwrap().len(), 100);
        assert!(Curriculum::new(&[f64::NAN], 0.5, 1).is_err());
    }
}
