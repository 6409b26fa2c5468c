//! Sampling, sharding, determinism and exact resume.
use std::collections::BTreeSet;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use ferrofeed_core::prelude::*;
use ferrofeed_core::ShardIter;
use ferrofeed_core::{
    BatchSampler, ClassBalanced, ContiguousWindows, FixedBatches, PipelineState, PlanCtx, Shard,
};
use proptest::prelude::*;

fn pipeline(
    n: u64,
    batch: usize,
    shard: Shard,
    workers: usize,
    seed: u64,
    drop_last: bool,
) -> Pipeline {
    Pipeline::builder(FnSource::new(n, |i| Ok(i as i64)))
        .map_with(
            "id",
            StageOptions::new().workers(Parallelism::Fixed(workers)),
            |x: i64, _: &StageCtx| Ok(x),
        )
        .batch_size(batch)
        .min_task_samples(1)
        .shuffle(true)
        .seed(seed)
        .drop_last(drop_last)
        .shard(shard)
        .collate(StackCollate::new().column::<i64>("x"))
        .build()
        .unwrap()
}

fn batches(p: &Pipeline, epoch: u64) -> Vec<Vec<u64>> {
    p.epoch(epoch)
        .map(|b| b.unwrap().indices().to_vec())
        .collect()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(32))]

    #[test]
    fn ranks_cover_the_epoch_once_with_equal_batch_counts(
        n in 0u64..200, batch in 1usize..9, world in 1usize..6, seed in 0u64..1000, epoch in 0u64..4,
    ) {
        let sampler = FixedBatches { order: Order::Shuffled, batch_size: batch, drop_last: false };
        let plans: Vec<_> = (0..world)
            .map(|r| sampler.plan(&PlanCtx { len: n, seed, epoch, shard: Shard::new(r, world).unwrap() }).unwrap())
            .collect();
        let counts: BTreeSet<usize> = plans.iter().map(|p| p.num_batches()).collect();
        prop_assert!(counts.len() <= 1, "unequal batch counts {counts:?}");
        let padded: usize = plans.iter().map(|p| p.padded).sum();
        let mut all: Vec<u64> = plans.iter().flat_map(|p| p.indices.iter().copied()).collect();
        prop_assert_eq!(all.len() as u64, n + padded as u64);
        all.sort_unstable();
        all.dedup();
        prop_assert_eq!(all, (0..n).collect::<Vec<_>>());
        prop_assert!(padded < world);
    }

    #[test]
    fn epochs_differ_and_runs_repeat(n in 20u64..200, seed in 0u64..1000) {
        let s = FixedBatches { order: Order::Shuffled, batch_size: 4, drop_last: false };
        let plan = |epoch| s.plan(&PlanCtx { len: n, seed, epoch, shard: Shard::single() }).unwrap().indices;
        prop_assert_ne!(plan(0), plan(1));
        prop_assert_eq!(plan(3), plan(3));
    }

    #[test]
    fn class_balanced_batches_are_within_one_of_balance(
        sizes in proptest::collection::vec(1usize..300, 2..6), batch in 2usize..40, epoch in 0u64..3,
    ) {
        let labels: Vec<usize> = sizes.iter().enumerate().flat_map(|(c, &k)| std::iter::repeat_n(c, k)).collect();
        let s = ClassBalanced::new(&labels, batch).unwrap();
        let plan = s.plan(&PlanCtx { len: labels.len() as u64, seed: 1, epoch, shard: Shard::single() }).unwrap();
        for b in 0..plan.num_batches() {
            let mut counts = vec![0usize; sizes.len()];
            for &i in plan.batch(b) {
                counts[labels[i as usize]] += 1;
            }
            let (lo, hi) = (counts.iter().min().unwrap(), counts.iter().max().unwrap());
            if plan.batch(b).len() >= sizes.len() {
                prop_assert!(hi - lo <= 1, "batch {b}: {counts:?}");
            }
        }
    }

    #[test]
    fn windows_are_contiguous(n in 1u64..300, window in 1usize..20, world in 1usize..4, seed in 0u64..100) {
        let s = ContiguousWindows { window, shuffle: true, drop_last: false };
        let mut seen = Vec::new();
        for r in 0..world {
            let plan = s.plan(&PlanCtx { len: n, seed, epoch: 0, shard: Shard::new(r, world).unwrap() }).unwrap();
            for b in 0..plan.num_batches() {
                let w = plan.batch(b);
                prop_assert!(w.windows(2).all(|p| p[1] == p[0] + 1), "{w:?}");
                prop_assert!(w.len() <= window);
            }
            seen.extend(plan.indices.iter().copied());
        }
        let set: BTreeSet<u64> = seen.into_iter().collect();
        prop_assert_eq!(set.len() as u64, n);
    }
}

#[test]
fn output_is_identical_for_one_and_four_workers_on_every_rank() {
    for world in [1, 3] {
        for r in 0..world {
            let shard = Shard::new(r, world).unwrap();
            assert_eq!(
                batches(&pipeline(101, 5, shard, 1, 9, false), 2),
                batches(&pipeline(101, 5, shard, 4, 9, false), 2)
            );
        }
    }
}

#[test]
fn rank_slices_change_only_by_the_slicing_when_the_world_grows() {
    // The global order of an epoch is the same for every world size: rank r
    // of W holds positions r, r + W, … of it.
    let global: Vec<u64> = batches(&pipeline(60, 1, Shard::single(), 2, 4, true), 1)
        .into_iter()
        .flatten()
        .collect();
    for world in [2, 3, 4, 6] {
        for r in 0..world {
            let mine: Vec<u64> = batches(
                &pipeline(60, 1, Shard::new(r, world).unwrap(), 2, 4, true),
                1,
            )
            .into_iter()
            .flatten()
            .collect();
            let want: Vec<u64> = global.iter().copied().skip(r).step_by(world).collect();
            assert_eq!(mine, want, "rank {r} of {world}");
        }
    }
}

#[test]
fn resuming_at_every_batch_equals_the_uninterrupted_run() {
    for workers in [1, 3] {
        let p = pipeline(53, 4, Shard::new(1, 2).unwrap(), workers, 5, false);
        let whole = batches(&p, 1);
        for k in 0..=whole.len() {
            let mut it = p.epoch(1);
            let before: Vec<Vec<u64>> = it
                .by_ref()
                .take(k)
                .map(|b| b.unwrap().indices().to_vec())
                .collect();
            let json = it.state().to_json();
            drop(it);
            let state = PipelineState::from_json(&json).unwrap();
            let after: Vec<Vec<u64>> = p
                .resume(&state)
                .unwrap()
                .map(|b| b.unwrap().indices().to_vec())
                .collect();
            let joined: Vec<Vec<u64>> = before.into_iter().chain(after).collect();
            assert_eq!(joined, whole, "workers {workers}, stopped after {k}");
        }
    }
    // After a whole epoch the state points at the next one.
    let p = pipeline(10, 4, Shard::single(), 2, 5, false);
    let mut it = p.epoch(0);
    for b in it.by_ref() {
        b.unwrap();
    }
    assert_eq!(it.state().epoch, 1);
    assert_eq!(it.state().position, (0, 0));
}

#[test]
fn foreign_or_mismatched_states_are_refused_with_the_field_named() {
    let p = pipeline(30, 4, Shard::single(), 2, 5, false);
    let state = p.epoch(0).state();
    let e =
        PipelineState::from_json("{\"format\": \"ferrofeed-state-v1\", \"seed\": 1}").unwrap_err();
    assert!(e.to_string().contains("missing field"), "{e}");
    let e = PipelineState::from_json("[1, 2, 3]").unwrap_err();
    assert!(e.to_string().contains("not a ferrofeed state file"), "{e}");
    let foreign = state.to_json().replace("ferrofeed-state-v1", "other-v9");
    assert!(PipelineState::from_json(&foreign)
        .unwrap_err()
        .to_string()
        .contains("format"));
    let other_seed = pipeline(30, 4, Shard::single(), 2, 6, false);
    let e = other_seed.resume(&state).err().unwrap();
    assert!(
        e.to_string().contains("seed = 5") && e.to_string().contains("this run has 6"),
        "{e}"
    );
    let other_len = pipeline(31, 4, Shard::single(), 2, 5, false);
    let e = other_len.resume(&state).err().unwrap();
    assert!(e.to_string().contains("dataset_len"), "{e}");
}

#[test]
fn impossible_shards_are_build_errors() {
    let e = Pipeline::builder(FnSource::new(4, |i| Ok(i as i64)))
        .shard(Shard {
            rank: 2,
            world_size: 2,
            pad: true,
        })
        .collate(StackCollate::new().column::<i64>("x"))
        .build()
        .unwrap_err();
    assert!(
        e.to_string()
            .contains("rank 2 is not below the world size 2"),
        "{e}"
    );
    let e = Pipeline::builder(FnSource::new(4, |i| Ok(i as i64)))
        .shard(Shard {
            rank: 0,
            world_size: 0,
            pad: true,
        })
        .collate(StackCollate::new().column::<i64>("x"))
        .build()
        .unwrap_err();
    assert!(
        e.to_string().contains("world size must be at least 1"),
        "{e}"
    );
}

/// Shards of varied sizes that count every read.
struct Counted {
    sizes: Vec<u64>,
    reads: Arc<Vec<AtomicUsize>>,
}

impl IterableSource for Counted {
    type Output = i64;
    fn num_shards(&self) -> usize {
        self.sizes.len()
    }
    fn shard_key(&self, s: usize) -> String {
        format!("shard-{s}")
    }
    fn open(&self, s: usize) -> Result<ShardIter<i64>, BoxError> {
        let base: u64 = self.sizes[..s].iter().sum();
        let reads = Arc::clone(&self.reads);
        Ok(Box::new((0..self.sizes[s]).map(move |i| {
            let id = base + i;
            reads[id as usize].fetch_add(1, Ordering::Relaxed);
            Ok(id as i64)
        })))
    }
}

fn iterable(
    sizes: &[u64],
    shard: Shard,
    workers: usize,
    buffer: usize,
) -> (Pipeline, Arc<Vec<AtomicUsize>>) {
    let total: u64 = sizes.iter().sum();
    let reads: Arc<Vec<AtomicUsize>> = Arc::new((0..total).map(|_| AtomicUsize::new(0)).collect());
    let p = Pipeline::builder_iterable(Counted {
        sizes: sizes.to_vec(),
        reads: Arc::clone(&reads),
    })
    .map_with(
        "id",
        StageOptions::new().workers(Parallelism::Fixed(workers)),
        |x: i64, _: &StageCtx| Ok(x),
    )
    .batch_size(3)
    .shuffle(true)
    .seed(11)
    .shuffle_buffer(buffer)
    .shard(shard)
    .collate(StackCollate::new().column::<i64>("x"))
    .build()
    .unwrap();
    (p, reads)
}

#[test]
fn iterable_shards_split_across_ranks_and_workers_without_rereads() {
    let sizes = [7, 1, 12, 5, 9, 3, 10, 6, 4, 8, 2, 11, 5];
    let total: u64 = sizes.iter().sum();
    for world in 1..=8 {
        for workers in 1..=8 {
            let mut delivered = Vec::new();
            let mut all_reads = vec![0usize; total as usize];
            for r in 0..world {
                let (p, reads) = iterable(&sizes, Shard::new(r, world).unwrap(), workers, 0);
                for b in p.epoch(2) {
                    delivered.extend(
                        b.unwrap()
                            .get("x")
                            .unwrap()
                            .as_slice::<i64>()
                            .unwrap()
                            .to_vec(),
                    );
                }
                for (a, c) in all_reads.iter_mut().zip(reads.iter()) {
                    *a += c.load(Ordering::Relaxed);
                }
            }
            assert!(
                all_reads.iter().all(|&c| c == 1),
                "world {world}, workers {workers}: {all_reads:?}"
            );
            delivered.sort_unstable();
            assert_eq!(
                delivered,
                (0..total as i64).collect::<Vec<_>>(),
                "world {world}, workers {workers}"
            );
        }
    }
}

#[test]
fn iterable_shuffle_is_deterministic_and_resumable() {
    let sizes = [10, 4, 9, 7];
    let run = |workers| {
        let (p, _) = iterable(&sizes, Shard::new(1, 2).unwrap(), workers, 5);
        batches(&p, 3)
    };
    let a = run(1);
    assert_eq!(a, run(4), "the same order whatever the worker count");
    let flat: Vec<u64> = a.iter().flatten().copied().collect();
    let mut sorted = flat.clone();
    sorted.sort_unstable();
    assert_ne!(flat, sorted, "the buffer shuffles");
    let (p, _) = iterable(&sizes, Shard::new(1, 2).unwrap(), 2, 5);
    for k in 0..=a.len() {
        let mut it = p.epoch(3);
        let before: Vec<Vec<u64>> = it
            .by_ref()
            .take(k)
            .map(|b| b.unwrap().indices().to_vec())
            .collect();
        let state = it.state();
        drop(it);
        let after: Vec<Vec<u64>> = p
            .resume(&state)
            .unwrap()
            .map(|b| b.unwrap().indices().to_vec())
            .collect();
        let joined: Vec<Vec<u64>> = before.into_iter().chain(after).collect();
        assert_eq!(joined, a, "stopped after {k}");
    }
}
