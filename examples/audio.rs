//! The log-mel audio pipeline written with the builder API:
//! `cargo run --release --example audio [DIR]` (default: a small synthetic
//! dataset written to a temporary folder). Files are decoded and resampled
//! to 16 kHz as they stream, cut into 4 s chunks with 1 s of overlap, and
//! turned into 80-band log-mel features, 8 files interleaved per batch.
use std::time::Instant;

use ferrofeed::audio::*;
use ferrofeed::core::prelude::*;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let dir = match std::env::args().nth(1) {
        Some(d) => d.into(),
        None => {
            let d = std::env::temp_dir().join("ferrofeed-example-audio");
            if !d.exists() {
                synth::write_dataset(&d, 12, 0, 2.0..12.0)?;
            }
            d
        }
    };
    let stream = StreamOptions {
        sample_rate: 16000,
        chunk_seconds: 4.0,
        overlap_seconds: 1.0,
        ..StreamOptions::default()
    };
    let files = AudioFiles::scan(&dir, stream)?;
    println!("{} files", files.files().len());
    let logmel = FeatureStage::new(FeatureConfig::default(), FeatureKind::LogMel)?;

    let pipeline = Pipeline::builder_iterable(files)
        .stage("logmel", logmel)
        .interleave(8)
        .shuffle_buffer(64)
        .batch_size(16)
        .seed(7)
        .on_error(ErrorPolicy::Skip)
        .collate(FeatureCollate::new())
        .build()?;

    let start = Instant::now();
    let (mut chunks, mut frames) = (0, 0);
    for batch in pipeline.epoch(0) {
        let batch = batch?;
        let f = batch.get("features").expect("features");
        assert_eq!(&f.shape()[1..], &[80, 401]);
        let lengths = batch.get("lengths").expect("lengths").as_slice::<i64>()?;
        frames += lengths.iter().sum::<i64>();
        chunks += batch.len();
    }
    let s = pipeline.last_summary().expect("the epoch ended");
    println!(
        "{chunks} chunks, {frames} valid frames in {:.2} s, {} skipped",
        start.elapsed().as_secs_f64(),
        s.skipped.len()
    );
    Ok(())
}
