//! The vision training pipeline written with the builder API:
//! `cargo run --release --example vision [DIR]` (default: a small synthetic
//! dataset written to a temporary folder).
use std::time::Instant;

use ferrofeed::core::prelude::*;
use ferrofeed::stages::{ImageFolder, ReadFile};
use ferrofeed::vision::{collate, synth, DecodeTransform, Transform, IMAGE_EXTENSIONS};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let tmp = std::env::temp_dir().join("ferrofeed-example-vision");
    let root = match std::env::args().nth(1) {
        Some(dir) => dir.into(),
        None => {
            if !tmp.exists() {
                synth::write_dataset(&tmp, 512, 0, 2)?;
            }
            tmp
        }
    };
    let folder = ImageFolder::scan(&root, IMAGE_EXTENSIONS)?;
    println!(
        "{} images, {} classes",
        folder.files().len(),
        folder.classes().len()
    );

    let pipeline = Pipeline::builder(folder.into_source())
        .stage("read", ReadFile::default())
        .stage("decode", DecodeTransform::new(Transform::train(224)))
        .batch_size(64)
        .shuffle(true)
        .seed(42)
        .on_error(ErrorPolicy::Skip)
        .max_bytes_in_flight(128 << 20)
        .collate(collate())
        .build()?;

    for epoch in 0..2 {
        let start = Instant::now();
        let mut images = 0;
        for batch in pipeline.epoch(epoch) {
            let batch = batch?;
            let pixels = batch.get("images").expect("images column");
            assert_eq!(&pixels.shape()[1..], &[3, 224, 224]);
            images += batch.len();
        }
        let s = pipeline.last_summary().expect("the epoch ended");
        println!(
            "epoch {epoch}: {images} images in {:.2} s ({:.0} img/s), {} skipped",
            start.elapsed().as_secs_f64(),
            images as f64 / start.elapsed().as_secs_f64(),
            s.skipped.len()
        );
    }
    Ok(())
}
