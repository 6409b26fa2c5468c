//! Length bucketing: batches sized by tokens, not by samples.
//!
//! [`TokenBudget`] is a [`BatchSampler`]: it shuffles the epoch, cuts the
//! order into windows of about `window_batches` batches, sorts each window by
//! length and cuts it greedily into batches whose padded size
//! `N × pad(max length)` stays within `max_tokens` and whose longest sample
//! is at most `max_spread` (default 1.1) times its shortest — which bounds
//! the padding of every batch, also where lengths are sparse (the tails, a
//! small corpus); the batches are then shuffled. Samples of similar length meet (little padding) while each epoch
//! still mixes the data; every choice is a pure function of `(seed, epoch)`.
//! With `packing`, a batch is filled until its sequences, one end-of-sequence
//! token each, fill `max_tokens` (see [`PackCollate`](crate::PackCollate)).
//!
//! ```
//! use ferrofeed_core::{BatchSampler, PlanCtx, Shard};
//! use ferrofeed_text::TokenBudget;
//! let lengths: Vec<u32> = (0..1000).map(|i| 5 + (i * 37 % 120)).collect();
//! let s = TokenBudget::new(lengths.clone(), 512).unwrap();
//! let plan = s.plan(&PlanCtx { len: 1000, seed: 1, epoch: 0, shard: Shard::single() }).unwrap();
//! for b in 0..plan.num_batches() {
//!     let batch = plan.batch(b);
//!     let longest = batch.iter().map(|&i| lengths[i as usize]).max().unwrap() as usize;
//!     assert!(batch.len() * longest <= 512);
//! }
//! assert_eq!(plan.indices.len(), 1000, "every sample once");
//! ```
use std::sync::Arc;

use ferrofeed_core::rng::{derive_seed, sample_rng};
use ferrofeed_core::{BatchSampler, BoxError, EpochPlan, PlanCtx};
use rand::Rng;

use crate::TextError;

/// Token-budget batches over known lengths.
#[derive(Debug, Clone)]
pub struct TokenBudget {
    lengths: Arc<[u32]>,
    max_tokens: usize,
    pad_multiple: usize,
    window_batches: usize,
    max_spread: f64,
    shuffle: bool,
    drop_last: bool,
    packing: bool,
}

impl TokenBudget {
    /// Batches of at most `max_tokens` padded tokens over samples of the
    /// given lengths. An error when one sample alone exceeds the budget.
    pub fn new(lengths: impl Into<Arc<[u32]>>, max_tokens: usize) -> Result<Self, TextError> {
        let s = TokenBudget {
            lengths: lengths.into(),
            max_tokens,
            pad_multiple: 1,
            window_batches: 100,
            max_spread: 1.1,
            shuffle: true,
            drop_last: false,
            packing: false,
        };
        s.check()?;
        Ok(s)
    }

    fn check(&self) -> Result<(), TextError> {
        if let Some((i, &l)) = self.lengths.iter().enumerate().max_by_key(|(_, &l)| l) {
            let need = self.cost(1, l as usize);
            if need > self.max_tokens {
                return Err(TextError::Budget(format!(
                    "--max-tokens {} is smaller than one sequence: sample {i} needs {need} tokens",
                    self.max_tokens
                )));
            }
        }
        if self.max_tokens == 0 {
            return Err(TextError::Budget("--max-tokens must be at least 1".into()));
        }
        Ok(())
    }

    /// Pads lengths up to a multiple of `m` when sizing batches (match the
    /// collate's `pad_to_multiple_of`).
    pub fn pad_multiple(mut self, m: usize) -> Result<Self, TextError> {
        self.pad_multiple = m.max(1);
        self.check()?;
        Ok(self)
    }
    /// Batches per sorted window (default 100).
    pub fn window_batches(mut self, w: usize) -> Self {
        self.window_batches = w.max(1);
        self
    }
    /// Longest / shortest length allowed in one batch (default 1.1; at
    /// least 1). Larger values give fewer, fuller batches and more padding.
    pub fn max_spread(mut self, spread: f64) -> Self {
        self.max_spread = if spread.is_nan() {
            1.1
        } else {
            spread.max(1.0)
        };
        self
    }
    /// Shuffle the order and the batches (default true); else sequential
    /// order cut greedily, no sorting.
    pub fn shuffle(mut self, on: bool) -> Self {
        self.shuffle = on;
        self
    }
    /// Drop batches that do not divide evenly among ranks.
    pub fn drop_last(mut self, on: bool) -> Self {
        self.drop_last = on;
        self
    }
    /// Size batches for packing: the sum of lengths (plus one separator
    /// each) within `max_tokens`, no sorting needed.
    pub fn packing(mut self, on: bool) -> Result<Self, TextError> {
        self.packing = on;
        self.check()?;
        Ok(self)
    }

    fn padded(&self, len: usize) -> usize {
        len.div_ceil(self.pad_multiple) * self.pad_multiple
    }

    /// Tokens a batch of `n` samples whose longest has `longest` tokens costs.
    fn cost(&self, n: usize, longest: usize) -> usize {
        if self.packing {
            longest + 1
        } else {
            n * self.padded(longest)
        }
    }

    /// Cuts `order` greedily; `sorted` (ascending lengths) also closes a
    /// batch when the next length exceeds `max_spread` × its first.
    fn cut(&self, order: &[u64], sorted: bool, out: &mut Vec<Vec<u64>>) {
        let mut cur: Vec<u64> = Vec::new();
        let mut longest = 0usize;
        let mut shortest = 0usize;
        let mut sum = 0usize;
        for &i in order {
            let l = self.lengths[i as usize] as usize;
            let fits = if self.packing {
                sum + l < self.max_tokens
            } else {
                (cur.len() + 1) * self.padded(longest.max(l)) <= self.max_tokens
                    && !(sorted && l as f64 > shortest as f64 * self.max_spread)
            };
            if !fits && !cur.is_empty() {
                out.push(std::mem::take(&mut cur));
                longest = 0;
                sum = 0;
            }
            if cur.is_empty() {
                shortest = l;
            }
            cur.push(i);
            longest = longest.max(l);
            sum += l + 1;
        }
        if !cur.is_empty() {
            out.push(cur);
        }
    }

    /// The global batches of an epoch (before sharding).
    pub fn batches(&self, seed: u64, epoch: u64) -> Vec<Vec<u64>> {
        let n = self.lengths.len() as u64;
        let mut out = Vec::new();
        if !self.shuffle {
            let order: Vec<u64> = (0..n).collect();
            self.cut(&order, false, &mut out);
            return out;
        }
        let order = ferrofeed_core::permutation(n, seed, epoch);
        if self.packing {
            self.cut(&order, false, &mut out);
        } else {
            let mean = self.lengths.iter().map(|&l| l as f64).sum::<f64>() / n.max(1) as f64;
            let per_batch = (self.max_tokens as f64
                / self.padded(mean.ceil() as usize).max(1) as f64)
                .max(1.0) as usize;
            let window = (per_batch * self.window_batches).max(1);
            for chunk in order.chunks(window) {
                let mut w = chunk.to_vec();
                w.sort_by_key(|&i| (self.lengths[i as usize], i));
                self.cut(&w, true, &mut out);
            }
        }
        let mut rng = sample_rng(derive_seed(&[seed, epoch, 0x4255_434b]));
        for i in (1..out.len()).rev() {
            out.swap(i, rng.random_range(0..=i));
        }
        out
    }

    /// Expected padding waste of an epoch: pad tokens / all tokens.
    pub fn padding_waste(&self, seed: u64, epoch: u64) -> f64 {
        if self.packing {
            return 0.0;
        }
        let (mut real, mut all) = (0usize, 0usize);
        for b in self.batches(seed, epoch) {
            let longest = b
                .iter()
                .map(|&i| self.lengths[i as usize])
                .max()
                .unwrap_or(0);
            real += b
                .iter()
                .map(|&i| self.lengths[i as usize] as usize)
                .sum::<usize>();
            all += b.len() * self.padded(longest as usize);
        }
        if all == 0 {
            0.0
        } else {
            1.0 - real as f64 / all as f64
        }
    }
}

impl BatchSampler for TokenBudget {
    fn plan(&self, ctx: &PlanCtx) -> Result<EpochPlan, BoxError> {
        if ctx.len != self.lengths.len() as u64 {
            return Err(format!(
                "the sampler knows {} lengths but the dataset has {} samples",
                self.lengths.len(),
                ctx.len
            )
            .into());
        }
        let plan = EpochPlan::from_batches(self.batches(ctx.seed, ctx.epoch));
        Ok(ctx.shard.slice_batches(plan, self.drop_last))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ferrofeed_core::Shard;

    fn lengths(n: u32) -> Vec<u32> {
        (0..n)
            .map(|i| 3 + (i.wrapping_mul(2654435761) % 200))
            .collect()
    }

    #[test]
    fn budget_respected_every_sample_once_and_deterministic() {
        let l = lengths(5000);
        for (max, mult) in [(256, 1), (1000, 8), (4096, 1)] {
            let s = TokenBudget::new(l.clone(), max)
                .unwrap()
                .pad_multiple(mult)
                .unwrap();
            let b = s.batches(3, 1);
            let mut seen: Vec<u64> = b.iter().flatten().copied().collect();
            seen.sort();
            assert_eq!(seen, (0..5000).collect::<Vec<_>>());
            for batch in &b {
                let longest = batch.iter().map(|&i| l[i as usize]).max().unwrap() as usize;
                assert!(batch.len() * longest.div_ceil(mult) * mult <= max);
            }
            assert_eq!(b, s.batches(3, 1));
            assert_ne!(b, s.batches(3, 2), "a new epoch, a new order");
            assert_ne!(b, s.batches(4, 1), "a new seed, a new order");
        }
    }

    #[test]
    fn bucketing_cuts_padding_waste() {
        let l = lengths(20000);
        let s = TokenBudget::new(l.clone(), 8192).unwrap();
        let bucketed = s.padding_waste(0, 0);
        // The naive plan: shuffled, fixed 64 per batch.
        let order = ferrofeed_core::permutation(l.len() as u64, 0, 0);
        let (mut real, mut all) = (0usize, 0usize);
        for b in order.chunks(64) {
            let longest = b.iter().map(|&i| l[i as usize]).max().unwrap() as usize;
            real += b.iter().map(|&i| l[i as usize] as usize).sum::<usize>();
            all += b.len() * longest;
        }
        let naive = 1.0 - real as f64 / all as f64;
        assert!(bucketed < 0.05, "bucketed waste {bucketed}");
        assert!(naive > 0.3, "naive waste {naive}");
    }

    #[test]
    fn ranks_split_the_batches() {
        let l = lengths(3000);
        let s = TokenBudget::new(l, 2048).unwrap();
        let mut all = Vec::new();
        let mut counts = Vec::new();
        for rank in 0..3 {
            let ctx = PlanCtx {
                len: 3000,
                seed: 9,
                epoch: 0,
                shard: Shard::new(rank, 3).unwrap(),
            };
            let p = s.plan(&ctx).unwrap();
            counts.push(p.num_batches());
            all.extend(p.indices.iter().copied().take(p.indices.len() - p.padded));
        }
        assert!(counts.iter().all(|&c| c == counts[0]), "{counts:?}");
        all.sort();
        all.dedup();
        assert_eq!(all.len(), 3000, "the ranks together cover every sample");
    }

    #[test]
    fn too_small_budgets_and_packing() {
        let e = TokenBudget::new(vec![10, 600, 20], 512).unwrap_err();
        assert!(e.to_string().contains("sample 1 needs 600"), "{e}");
        assert!(TokenBudget::new(vec![10, 509], 510)
            .unwrap()
            .pad_multiple(8)
            .is_err());
        let l = lengths(1000);
        let s = TokenBudget::new(l.clone(), 1024)
            .unwrap()
            .packing(true)
            .unwrap();
        for b in s.batches(0, 0) {
            assert!(b.iter().map(|&i| l[i as usize] as usize + 1).sum::<usize>() <= 1024);
        }
    }
}
