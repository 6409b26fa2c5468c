//! The bucketed text pipeline written with the builder API:
//! `cargo run --release --example text [FILE_OR_DIR]` (default: the
//! embedded corpus). Lines are tokenized once into a token cache, batched by
//! a 16k-token budget and padded per batch.
use std::sync::Arc;
use std::time::Instant;

use ferrofeed::core::prelude::*;
use ferrofeed::text::*;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let path = match std::env::args().nth(1) {
        Some(p) => p.into(),
        None => {
            let p = std::env::temp_dir().join("ferrofeed-example-corpus.txt");
            std::fs::write(&p, EMBEDDED_CORPUS)?;
            p
        }
    };
    let corpus = Arc::new(TextCorpus::open(&path, &CorpusOptions::default())?);
    let tokenizer = TextTokenizer::embedded(512)?;
    let start = Instant::now();
    let cache = TokenCache::build(&corpus, &tokenizer, &CacheOptions::default())?;
    println!(
        "{} lines → {} tokens in {:.2} s",
        cache.len(),
        cache.total_tokens(),
        start.elapsed().as_secs_f64()
    );

    let sampler = TokenBudget::new(cache.lengths(), 16384)?;
    let collate = PadCollate::new(tokenizer.pad_id());
    let padding = collate.stats();
    let pipeline = Pipeline::builder(cache)
        .batch_sampler(sampler)
        .seed(42)
        .on_error(ErrorPolicy::Skip)
        .collate(collate)
        .build()?;

    for epoch in 0..2 {
        padding.reset();
        let mut rows = 0;
        for batch in pipeline.epoch(epoch) {
            let ids = batch?.get("input_ids").expect("input_ids").shape().to_vec();
            assert!(ids[0] * ids[1] <= 16384);
            rows += ids[0];
        }
        println!(
            "epoch {epoch}: {rows} sequences, padding waste {:.1}%",
            100.0 * padding.waste()
        );
    }
    Ok(())
}
