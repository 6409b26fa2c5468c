//! The vision pipeline through the library API: unreadable files, skip
//! reports, determinism across worker counts.
use ferrofeed::core::prelude::*;
use ferrofeed::stages::{ImageFolder, ReadFile};
use ferrofeed::vision::{collate, synth, DecodeTransform, Transform, IMAGE_EXTENSIONS};

fn pipeline(folder: &ImageFolder, workers: usize, policy: ErrorPolicy) -> Pipeline {
    let opts = StageOptions::new().workers(Parallelism::Fixed(workers));
    Pipeline::builder(folder.clone().into_source())
        .stage_with("read", opts, ReadFile::default())
        .stage_with("decode", opts, DecodeTransform::new(Transform::train(32)))
        .batch_size(5)
        .shuffle(true)
        .seed(3)
        .on_error(policy)
        .collate(collate())
        .build()
        .unwrap()
}

#[test]
fn a_file_that_vanished_after_the_scan_is_reported_by_the_read_stage() {
    let d = tempfile::tempdir().unwrap();
    synth::write_dataset(d.path(), 12, 4, 2).unwrap();
    let folder = ImageFolder::scan(d.path(), IMAGE_EXTENSIONS).unwrap();
    let gone = folder.files()[4].0.clone();
    std::fs::remove_file(&gone).unwrap();
    let p = pipeline(&folder, 2, ErrorPolicy::Skip);
    let n: usize = p.epoch(0).map(|b| b.unwrap().len()).sum();
    assert_eq!(n, 11);
    let s = p.last_summary().unwrap();
    assert_eq!(s.skipped.len(), 1);
    assert_eq!(s.skipped[0].index, Some(4));
    assert_eq!(s.skipped[0].stage, "read");
    assert_eq!(s.skipped[0].path.as_deref(), Some(gone.to_str().unwrap()));

    let strict = pipeline(&folder, 2, ErrorPolicy::Fail);
    let err = strict.epoch(0).find_map(|b| b.err()).unwrap();
    assert_eq!((err.index, err.stage.as_str()), (Some(4), "read"));
}

#[test]
fn batches_are_bit_identical_across_worker_counts_and_runs() {
    let d = tempfile::tempdir().unwrap();
    synth::write_dataset(d.path(), 23, 5, 2).unwrap();
    let folder = ImageFolder::scan(d.path(), IMAGE_EXTENSIONS).unwrap();
    let grab = |workers| -> Vec<(Vec<u64>, Vec<u8>, Vec<i64>)> {
        pipeline(&folder, workers, ErrorPolicy::Fail)
            .epoch(1)
            .map(|b| {
                let b = b.unwrap();
                (
                    b.indices().to_vec(),
                    b.get("images").unwrap().as_slice::<u8>().unwrap().to_vec(),
                    b.get("labels").unwrap().as_slice::<i64>().unwrap().to_vec(),
                )
            })
            .collect()
    };
    let a = grab(1);
    assert_eq!(a.len(), 5);
    assert_eq!(a, grab(3));
    assert_eq!(a, grab(2));
    // Labels follow the files' class folders.
    for (idx, _, labels) in &a {
        for (i, l) in idx.iter().zip(labels) {
            assert_eq!(folder.files()[*i as usize].1, *l);
        }
    }
}

#[test]
fn the_decoded_image_cache_changes_nothing_but_the_work_done() {
    use ferrofeed::vision::ImageCache;
    let d = tempfile::tempdir().unwrap();
    synth::write_dataset(d.path(), 9, 6, 2).unwrap();
    let folder = ImageFolder::scan(d.path(), IMAGE_EXTENSIONS).unwrap();
    let build = |cache: Option<std::sync::Arc<ImageCache>>| {
        let mut stage = DecodeTransform::new(Transform::train(48));
        if let Some(c) = cache {
            stage = stage.with_cache(c);
        }
        Pipeline::builder(folder.clone().into_source())
            .stage("read", ReadFile::default())
            .stage("decode", stage)
            .batch_size(4)
            .shuffle(true)
            .seed(1)
            .collate(collate())
            .build()
            .unwrap()
    };
    let grab = |p: &Pipeline, e| -> Vec<Vec<u8>> {
        p.epoch(e)
            .map(|b| {
                b.unwrap()
                    .get("images")
                    .unwrap()
                    .as_slice::<u8>()
                    .unwrap()
                    .to_vec()
            })
            .collect()
    };
    let big = ImageCache::new(1 << 30);
    let cached = build(Some(big.clone()));
    let plain = build(None);
    for e in 0..3 {
        let (a, b) = (grab(&cached, e), grab(&plain, e));
        assert_eq!(a.len(), b.len());
        for (x, y) in a.iter().zip(&b) {
            // The cached path decodes whole images; the plain one decodes
            // only the crop: the pixels agree closely, not bit for bit.
            let mse: f64 = x
                .iter()
                .zip(y)
                .map(|(p, q)| (f64::from(*p) - f64::from(*q)).powi(2))
                .sum::<f64>()
                / x.len() as f64;
            assert!(mse < 10.0, "epoch {e}: mse {mse}");
        }
    }
    assert_eq!(big.len(), 9);
    assert_eq!(big.misses(), 9, "each image decoded once");
    assert_eq!(big.hits(), 18, "later epochs hit");
    // A cache smaller than the dataset stays under its cap.
    let small = ImageCache::new(1_000_000);
    let p = build(Some(small.clone()));
    for e in 0..2 {
        assert_eq!(grab(&p, e).len(), 3);
    }
    assert!(small.bytes() <= 1_000_000 && small.len() < 9);
}
