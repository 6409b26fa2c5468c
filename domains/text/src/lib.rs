//! # ferrofeed-text
//!
//! The text pack: line corpora (`.txt`, `.jsonl`, folders; memory-mapped and
//! indexed by byte ranges), tokenization with a HuggingFace
//! `tokenizer.json` (offline; a BERT WordPiece tokenizer is embedded), a
//! token cache so later epochs skip tokenization, length bucketing by a token
//! budget, and collates that pad per batch or pack sequences into full rows.
//!
//! ```
//! use std::sync::Arc;
//! use ferrofeed_core::prelude::*;
//! use ferrofeed_text::*;
//!
//! let dir = tempfile::tempdir().unwrap();
//! let lines: String = (0..200).map(|i| format!("sample {i} {}\n", "word ".repeat(i % 30))).collect();
//! std::fs::write(dir.path().join("corpus.txt"), lines).unwrap();
//! let corpus = Arc::new(TextCorpus::open(dir.path(), &CorpusOptions::default()).unwrap());
//! let tok = TextTokenizer::embedded(64).unwrap();
//! let cache = TokenCache::build(&corpus, &tok, &CacheOptions::default()).unwrap();
//! let sampler = TokenBudget::new(cache.lengths(), 512).unwrap();
//! let pipeline = Pipeline::builder(cache)
//!     .batch_sampler(sampler)
//!     .collate(PadCollate::new(tok.pad_id()))
//!     .build()
//!     .unwrap();
//! let mut seen = 0;
//! for batch in pipeline.epoch(0) {
//!     let ids = batch.unwrap().get("input_ids").unwrap().clone();
//!     assert!(ids.shape()[0] * ids.shape()[1] <= 512);
//!     seen += ids.shape()[0];
//! }
//! assert_eq!(seen, 200);
//! ```
#![warn(missing_docs)]
#![warn(unreachable_pub)]

mod bucket;
mod cache;
mod collate;
mod corpus;
mod tokenize;

pub use bucket::TokenBudget;
pub use cache::{CacheOptions, TokenCache};
pub use collate::{PackCollate, PadCollate, PaddingStats};
pub use corpus::{
    file_line_starts, line_starts_in, parse_line, CorpusOptions, EmptyLines, Text, TextCorpus,
    Utf8Policy, TEXT_EXTENSIONS,
};
pub use tokenize::{
    TextTokenizer, TokenStats, Tokenize, Tokens, EMBEDDED_TOKENIZER, MAX_LENGTH,
    MAX_TOKENIZER_BYTES, WORD_CACHE_BYTES,
};

use std::path::PathBuf;

/// The embedded default corpus: the Python Language Reference topics
/// (PSF License, see `data/NOTICE`), one paragraph per line.
pub const EMBEDDED_CORPUS: &[u8] = include_bytes!("../data/corpus.txt");

/// Text pack errors.
#[derive(Debug, thiserror::Error)]
pub enum TextError {
    /// A file could not be read.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// A folder holds no `.txt`/`.jsonl` file.
    #[error("{0}: no .txt or .jsonl files")]
    NoFiles(PathBuf),
    /// A missing or malformed `tokenizer.json`.
    #[error("tokenizer {path}: {message}")]
    Tokenizer {
        /// The file.
        path: String,
        /// Why.
        message: String,
    },
    /// A token budget that cannot be met.
    #[error("{0}")]
    Budget(String),
    /// A pipeline could not be built.
    #[error("{0}")]
    Build(String),
    /// A sample failed (under the `fail` policy).
    #[error("{0}")]
    Sample(#[from] ferrofeed_core::SampleError),
}
