//! Tokens per second: the `tokenizers` crate's batch encoder on its own, one
//! thread encoding sample by sample (the crate whole, and through a warm word
//! cache), and the full text pipeline (token cache built on the pipeline's
//! fresh workers, so their word caches start empty; bucketed, padded) on the
//! embedded corpus.
//!
//! `cargo bench -p ferrofeed-text --bench text`
use std::sync::Arc;
use std::time::Duration;

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use ferrofeed_core::Pipeline;
use ferrofeed_text::*;

fn bench(c: &mut Criterion) {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("corpus.txt");
    std::fs::write(&path, EMBEDDED_CORPUS).expect("write corpus");
    let corpus = Arc::new(TextCorpus::open(&path, &CorpusOptions::default()).expect("corpus"));
    let tok = TextTokenizer::embedded(512).expect("tokenizer");
    let text = std::str::from_utf8(EMBEDDED_CORPUS).expect("utf-8");
    let lines: Vec<&str> = text.lines().filter(|l| !l.trim().is_empty()).collect();
    let tokens: u64 = lines
        .iter()
        .map(|l| tok.encode(l).map_or(0, |v| v.len() as u64))
        .sum();

    let mut g = c.benchmark_group("text");
    g.sample_size(10)
        .measurement_time(Duration::from_secs(8))
        .throughput(Throughput::Elements(tokens));
    g.bench_function("raw_encode_batch", |b| {
        b.iter(|| tok.encode_batch(&lines).expect("encode"))
    });
    g.bench_function("raw_encode_per_sample_1_thread", |b| {
        b.iter(|| {
            lines
                .iter()
                .map(|l| tok.encode_whole(l).expect("encode").0.len())
                .sum::<usize>()
        })
    });
    // After the first pass every word is in this thread's word cache.
    g.bench_function("word_cache_warm_1_thread", |b| {
        b.iter(|| {
            lines
                .iter()
                .map(|l| tok.encode(l).expect("encode").len())
                .sum::<usize>()
        })
    });
    let run = |cache: TokenCache| {
        let sampler = TokenBudget::new(cache.lengths(), 16384).expect("budget");
        let p = Pipeline::builder(cache)
            .batch_sampler(sampler)
            .collate(PadCollate::new(tok.pad_id()))
            .build()
            .expect("pipeline");
        p.epoch(0).map(|b| b.expect("batch").len()).sum::<usize>()
    };
    g.bench_function("pipeline_cold", |b| {
        b.iter(|| {
            let cache =
                TokenCache::build(&corpus, &tok, &CacheOptions::default()).expect("tokenize");
            run(cache)
        })
    });
    g.bench_function("pipeline_from_cache", |b| {
        let cdir = dir.path().join("cache");
        let opts = CacheOptions {
            dir: Some(cdir),
            ..CacheOptions::default()
        };
        TokenCache::build(&corpus, &tok, &opts).expect("tokenize");
        b.iter(|| run(TokenCache::build(&corpus, &tok, &opts).expect("load")))
    });
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
