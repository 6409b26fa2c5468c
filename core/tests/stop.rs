//! A stop handle ends an epoch at the next batch — from another thread,
//! also while the consumer waits — and the saved position resumes exactly.
use std::time::{Duration, Instant};

use ferrofeed_core::prelude::*;
use ferrofeed_core::ShardIter;

struct Shards;
impl IterableSource for Shards {
    type Output = i64;
    fn num_shards(&self) -> usize {
        4
    }
    fn shard_key(&self, s: usize) -> String {
        format!("shard-{s}")
    }
    fn open(&self, s: usize) -> Result<ShardIter<i64>, BoxError> {
        Ok(Box::new((0..60).map(move |i| Ok((s * 60 + i) as i64))))
    }
}

fn pipeline(iterable: bool, slow: Duration) -> Pipeline {
    let b = if iterable {
        Pipeline::builder_iterable(Shards)
    } else {
        Pipeline::builder(FnSource::new(240, |i| Ok(i as i64)))
    };
    b.map("slow", move |x: i64, _: &StageCtx| {
        std::thread::sleep(slow);
        Ok(x)
    })
    .batch_size(8)
    .shuffle(true)
    .seed(3)
    .collate(StackCollate::new().column::<i64>("x"))
    .build()
    .unwrap()
}

fn values(b: &Batch) -> Vec<i64> {
    b.get("x").unwrap().as_slice::<i64>().unwrap().to_vec()
}

#[test]
fn a_stop_from_another_thread_ends_the_epoch_at_a_batch_and_resumes_exactly() {
    for iterable in [false, true] {
        let p = pipeline(iterable, Duration::from_millis(2));
        let full: Vec<i64> = p.epoch(0).flat_map(|b| values(&b.unwrap())).collect();
        let stop = p.stop_handle();
        let mut it = p.epoch(0);
        let mut before = Vec::new();
        let mut asked = None;
        std::thread::scope(|s| {
            for b in it.by_ref() {
                before.extend(values(&b.unwrap()));
                if before.len() == 40 {
                    // Another thread (a signal handler's stand-in) stops the
                    // epoch while the consumer goes on waiting for batches.
                    let stop = stop.clone();
                    s.spawn(move || {
                        std::thread::sleep(Duration::from_millis(30));
                        stop.stop();
                    });
                    asked = Some(Instant::now());
                }
            }
        });
        let took = asked.unwrap().elapsed();
        assert!(it.summary().stopped, "iterable {iterable}");
        assert!(!it.summary().completed);
        assert!(before.len() < full.len(), "it stopped early");
        assert_eq!(before.len() % 8, 0, "whole batches only");
        eprintln!(
            "iterable {iterable}: stopped {:.0} ms after the request was scheduled",
            took.as_secs_f64() * 1e3
        );
        let state = it.state();
        drop(it);
        // Later epochs end at once until the handle is reset.
        assert_eq!(p.epoch(1).count(), 0);
        stop.reset();
        let after: Vec<i64> = p
            .resume(&state)
            .unwrap()
            .flat_map(|b| values(&b.unwrap()))
            .collect();
        let joined: Vec<i64> = before.into_iter().chain(after).collect();
        assert_eq!(
            joined, full,
            "iterable {iterable}: before + after = the whole epoch"
        );
    }
}

#[test]
fn a_consumer_waiting_on_a_stuck_stage_is_released_by_a_stop() {
    // One batch takes far longer than the stop may: the waiting consumer
    // returns without it.
    let p = pipeline(false, Duration::from_millis(400));
    let stop = p.stop_handle();
    let mut it = p.epoch(0);
    let t = Instant::now();
    std::thread::scope(|s| {
        s.spawn(|| {
            std::thread::sleep(Duration::from_millis(50));
            stop.stop();
        });
        assert!(it.next().is_none(), "no batch: the stop came first");
    });
    assert!(
        t.elapsed() < Duration::from_millis(2000),
        "released in {:?}",
        t.elapsed()
    );
    assert!(it.summary().stopped);
    assert_eq!(it.state().position, (0, 0));
}
