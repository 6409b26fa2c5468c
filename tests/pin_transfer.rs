//! Pinned batch buffers and device transfer through a whole pipeline. On a
//! machine without CUDA (every CI run) this checks the fallbacks; the device
//! path is checked by `bench/gpu_check.sh`.
use ferrofeed::core::prelude::*;
use ferrofeed::stages::device::{device_count, PinMode, PinnedPool, Transfer, TransferMode};

#[derive(Clone)]
struct Row(Vec<u8>);
impl Component for Row {
    fn nbytes(&self) -> usize {
        self.0.len()
    }
}
impl Collatable for Row {
    type Elem = u8;
    fn shape(&self) -> Vec<usize> {
        vec![self.0.len()]
    }
    fn write(&self, out: &mut [u8]) {
        out.copy_from_slice(&self.0);
    }
}

fn pipeline(pool: &PinnedPool, transfer: Transfer) -> Pipeline {
    Pipeline::builder(FnSource::new(64, |i| Ok(Row(vec![i as u8; 16384]))))
        .batch_size(8)
        .collate(
            StackCollate::new()
                .column::<Row>("rows")
                .buffers(std::sync::Arc::new(pool.clone())),
        )
        .batch_stage("transfer", transfer)
        .build()
        .unwrap()
}

#[test]
fn batches_come_from_the_pool_and_it_stays_bounded() {
    let pool = PinnedPool::new(PinMode::Auto, 3).unwrap();
    let p = pipeline(&pool, Transfer::new(TransferMode::Auto).unwrap());
    for epoch in 0..3 {
        let mut n = 0;
        for b in p.epoch(epoch) {
            let b = b.unwrap();
            let rows = b.get("rows").unwrap();
            assert_eq!(rows.shape(), &[8, 16384]);
            for (r, &idx) in b.indices().iter().enumerate() {
                assert!(rows.as_bytes()[r * 16384..(r + 1) * 16384]
                    .iter()
                    .all(|&v| v == idx as u8));
            }
            assert_eq!(rows.is_pinned(), pool.is_pinned());
            n += b.len();
        }
        assert_eq!(n, 64);
    }
    assert!(pool.allocated() <= 3, "never more than the bound");
    assert!(pool.high_water() <= 3);
    assert_eq!(
        pool.lent(),
        0,
        "every buffer came back when its batch dropped"
    );
}

#[test]
fn holding_every_batch_is_not_a_deadlock() {
    let pool = PinnedPool::new(PinMode::Off, 2).unwrap();
    let p = pipeline(&pool, Transfer::new(TransferMode::Off).unwrap());
    let held: Vec<Batch> = p.epoch(0).map(|b| b.unwrap()).collect();
    assert_eq!(held.len(), 8);
    assert_eq!(pool.allocated(), 2);
    assert!(pool.fallbacks() >= 6, "the rest used unpooled memory");
}

#[test]
fn strict_modes_refuse_without_a_device() {
    if device_count().is_ok() {
        return;
    }
    let e = PinnedPool::new(PinMode::Strict, 2).unwrap_err().to_string();
    assert!(e.starts_with("no CUDA device"), "{e}");
    let e = Transfer::new(TransferMode::Strict)
        .err()
        .unwrap()
        .to_string();
    assert!(e.starts_with("no CUDA device"), "{e}");
}

#[test]
fn a_failing_batch_stage_is_named_and_follows_the_policy() {
    let p = Pipeline::builder(FnSource::new(20, |i| Ok(i as i64)))
        .batch_size(5)
        .on_error(ErrorPolicy::Skip)
        .collate(StackCollate::new().column::<i64>("x"))
        .batch_stage("to_device", |b: &mut Batch| {
            if b.indices().contains(&7) {
                Err("out of device memory copying a batch".into())
            } else {
                Ok(())
            }
        })
        .build()
        .unwrap();
    let n: usize = p.epoch(0).map(|b| b.unwrap().len()).sum();
    assert_eq!(n, 15);
    let s = p.last_summary().unwrap();
    assert_eq!(s.skipped.len(), 5);
    assert!(s.skipped.iter().all(|e| e.stage == "to_device"));
    // The pipeline stays usable: the next epoch runs.
    assert_eq!(p.epoch(1).count(), 3);
}
