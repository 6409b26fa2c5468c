//! Property: for any stage delays and worker counts, the ordered output
//! equals the sequential run.
use std::time::Duration;

use ferrofeed_core::prelude::*;
use proptest::prelude::*;

fn run(
    n: u64,
    batch: usize,
    workers: (usize, usize),
    delays: Vec<u8>,
    seed: u64,
) -> Vec<(Vec<u64>, Vec<i64>)> {
    let d1 = delays.clone();
    let p = Pipeline::builder(FnSource::new(n, |i| Ok(i as i64)))
        .map_with(
            "a",
            StageOptions::new().workers(Parallelism::Fixed(workers.0)),
            move |x: i64, _: &StageCtx| {
                let d = d1[x as usize % d1.len()];
                std::thread::sleep(Duration::from_micros(u64::from(d)));
                Ok(x * 10)
            },
        )
        .map_with(
            "b",
            StageOptions::new().workers(Parallelism::Fixed(workers.1)),
            move |x: i64, ctx: &StageCtx| {
                use rand::Rng;
                Ok(x + ctx.rng().random_range(0..5))
            },
        )
        .batch_size(batch)
        .min_task_samples(1 + (seed % 9) as usize)
        .shuffle(true)
        .seed(seed)
        .collate(StackCollate::new().column::<i64>("x"))
        .build()
        .unwrap();
    p.epoch(seed % 3)
        .map(|b| {
            let b = b.unwrap();
            (
                b.indices().to_vec(),
                b.get("x").unwrap().as_slice::<i64>().unwrap().to_vec(),
            )
        })
        .collect()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(24))]
    #[test]
    fn output_equals_the_sequential_run(
        n in 0u64..120,
        batch in 1usize..9,
        w1 in 1usize..5,
        w2 in 1usize..5,
        delays in proptest::collection::vec(0u8..100, 1..8),
        seed in 0u64..1000,
    ) {
        let sequential = run(n, batch, (1, 1), vec![0], seed);
        let parallel = run(n, batch, (w1, w2), delays, seed);
        prop_assert_eq!(sequential, parallel);
    }
}
