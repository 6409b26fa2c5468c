//! The text pack against the Python `tokenizers` package, and the bucketed
//! pipeline's guarantees, through the library API.
#![cfg(feature = "text")]
use std::path::Path;
use std::sync::Arc;

use ferrofeed::core::prelude::*;
use ferrofeed::text::*;

fn npy<T: Copy>(path: &Path, size: usize, conv: fn(&[u8]) -> T) -> Vec<T> {
    let bytes = std::fs::read(path).unwrap();
    let hlen = u16::from_le_bytes([bytes[8], bytes[9]]) as usize;
    bytes[10 + hlen..].chunks_exact(size).map(conv).collect()
}

fn reference() -> (Vec<i32>, Vec<i64>) {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/text");
    let ids = npy(&dir.join("corpus_ids.npy"), 4, |c| {
        i32::from_le_bytes(c.try_into().unwrap())
    });
    let offsets = npy(&dir.join("corpus_offsets.npy"), 8, |c| {
        i64::from_le_bytes(c.try_into().unwrap())
    });
    (ids, offsets)
}

fn embedded_corpus(dir: &Path) -> Arc<TextCorpus> {
    let p = dir.join("corpus.txt");
    std::fs::write(&p, EMBEDDED_CORPUS).unwrap();
    Arc::new(TextCorpus::open(&p, &CorpusOptions::default()).unwrap())
}

#[test]
fn ids_equal_python_tokenizers_on_the_embedded_corpus() {
    let (ids, offsets) = reference();
    let dir = tempfile::tempdir().unwrap();
    let corpus = embedded_corpus(dir.path());
    assert_eq!(corpus.len() as usize + 1, offsets.len());
    let tok = TextTokenizer::embedded(512).unwrap();
    let cache = TokenCache::build(&corpus, &tok, &CacheOptions::default()).unwrap();
    assert_eq!(cache.total_tokens() as usize, ids.len());
    let mut truncated = 0;
    for i in 0..corpus.len() {
        let want: Vec<u32> = ids[offsets[i as usize] as usize..offsets[i as usize + 1] as usize]
            .iter()
            .map(|&x| x as u32)
            .collect();
        assert_eq!(
            cache.get(i).unwrap().0,
            want,
            "line {i}: {:?}",
            corpus.key(i)
        );
        truncated += usize::from(want.len() == 512);
    }
    assert!(truncated > 0, "the corpus exercises truncation");
    assert_eq!(cache.truncated() as usize, truncated);
}

#[test]
fn bucketed_batches_respect_the_budget_and_waste_little() {
    let dir = tempfile::tempdir().unwrap();
    let corpus = embedded_corpus(dir.path());
    let tok = TextTokenizer::embedded(512).unwrap();
    let cache = TokenCache::build(&corpus, &tok, &CacheOptions::default()).unwrap();
    let lengths = cache.lengths();
    let n = cache.len();
    let max_tokens = 16384;
    let collate = PadCollate::new(tok.pad_id());
    let stats = collate.stats();
    let pipeline = Pipeline::builder(cache)
        .batch_sampler(TokenBudget::new(lengths.clone(), max_tokens).unwrap())
        .seed(3)
        .collate(collate)
        .build()
        .unwrap();
    let mut seen = Vec::new();
    for batch in pipeline.epoch(0) {
        let b = batch.unwrap();
        let ids = b.get("input_ids").unwrap();
        let mask = b.get("attention_mask").unwrap();
        assert_eq!(ids.shape(), mask.shape());
        assert!(ids.shape()[0] * ids.shape()[1] <= max_tokens);
        let m = mask.as_slice::<i64>().unwrap();
        let l = ids.shape()[1];
        for (r, &i) in b.indices().iter().enumerate() {
            let ones = m[r * l..(r + 1) * l].iter().filter(|&&x| x == 1).count();
            assert_eq!(ones, lengths[i as usize] as usize, "mask of sample {i}");
        }
        seen.extend_from_slice(b.indices());
    }
    seen.sort();
    assert_eq!(seen, (0..n).collect::<Vec<_>>());
    assert!(
        stats.waste() <= 0.05,
        "bucketed padding waste {}",
        stats.waste()
    );

    // The naive plan on the same data: shuffled batches of 64.
    let cache = TokenCache::build(&corpus, &tok, &CacheOptions::default()).unwrap();
    let naive = PadCollate::new(tok.pad_id());
    let naive_stats = naive.stats();
    let p = Pipeline::builder(cache)
        .batch_size(64)
        .seed(3)
        .collate(naive)
        .build()
        .unwrap();
    assert_eq!(
        p.epoch(0).filter(|b| b.is_ok()).count(),
        (n as usize).div_ceil(64)
    );
    assert!(
        naive_stats.waste() > 0.5,
        "naive waste {}",
        naive_stats.waste()
    );
}

#[test]
fn tokenizing_in_the_pipeline_equals_the_cache_and_packs_rows() {
    let dir = tempfile::tempdir().unwrap();
    let corpus = embedded_corpus(dir.path());
    let tok = TextTokenizer::embedded(128).unwrap();
    let cache = TokenCache::build(&corpus, &tok, &CacheOptions::default()).unwrap();
    let pack = PackCollate::new(128, tok.eos_id(), tok.pad_id());
    let stats = pack.stats();
    let p = Pipeline::builder(Arc::clone(&corpus))
        .stage("tokenize", Tokenize::new(tok.clone()))
        .batch_size(32)
        .shuffle(false)
        .collate(pack)
        .build()
        .unwrap();
    let mut real = 0u64;
    for batch in p.epoch(0) {
        let b = batch.unwrap();
        let ids = b.get("input_ids").unwrap();
        assert_eq!(ids.shape()[1], 128);
        let docs = b.get("document_ids").unwrap().as_slice::<i64>().unwrap();
        let flat = ids.as_slice::<i64>().unwrap();
        // Document d's tokens, in order, are its cached ids (its [SEP] ends it).
        for (d, &i) in b.indices().iter().enumerate() {
            let got: Vec<u32> = flat
                .iter()
                .zip(docs)
                .filter(|(_, &dd)| dd == d as i64)
                .map(|(&t, _)| t as u32)
                .collect();
            assert_eq!(got, cache.get(i).unwrap().0, "document {i}");
            real += got.len() as u64;
        }
        // Only the last row has padding.
        let rows = ids.shape()[0];
        assert!(docs[..(rows - 1) * 128].iter().all(|&d| d >= 0));
    }
    assert_eq!(real, cache.total_tokens());
    assert_eq!(stats.real_tokens(), cache.total_tokens());
    assert!(stats.waste() < 0.05, "packing waste {}", stats.waste());
}
