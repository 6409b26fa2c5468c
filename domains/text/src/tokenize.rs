//! Tokenization with a HuggingFace `tokenizer.json`, loaded offline.
//!
//! [`TextTokenizer`] wraps the `tokenizers` crate: it refuses a missing or
//! malformed file when the pipeline is built (not at the first batch),
//! truncates to `max_length` with the tokenizer's own special tokens kept,
//! and turns off any fixed padding the file asks for (collate pads per
//! batch). [`Tokenize`] is the stage `Text → Tokens`; each worker encodes
//! its samples one by one — the pipeline's workers are the parallelism, so
//! the crate's own thread pool is not used.
//!
//! ```
//! use ferrofeed_text::TextTokenizer;
//! let tok = TextTokenizer::embedded(8).unwrap();
//! let ids = tok.encode("Hello, world! This line is longer than eight tokens.").unwrap();
//! assert_eq!(ids.len(), 8, "truncated to max_length, special tokens included");
//! assert_eq!(ids[0], tok.token_id("[CLS]").unwrap());
//! assert_eq!(*ids.last().unwrap(), tok.token_id("[SEP]").unwrap());
//! ```
use std::hash::{Hash, Hasher};
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use ferrofeed_core::{BoxError, Component, Stage, StageCtx};
use tokenizers::{Tokenizer, TruncationParams};

use crate::corpus::Text;
use crate::TextError;

/// The embedded default tokenizer: BERT's uncased WordPiece vocabulary
/// (30,522 tokens) from `sentence-transformers/all-MiniLM-L6-v2`
/// (Apache-2.0, see `data/NOTICE`).
pub const EMBEDDED_TOKENIZER: &[u8] = include_bytes!("../data/tokenizer.json");

/// The token ids of one sample.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct Tokens(pub Vec<u32>);

impl Component for Tokens {
    fn nbytes(&self) -> usize {
        self.0.len() * 4
    }
    fn describe(&self) -> String {
        let head: Vec<String> = self.0.iter().take(12).map(u32::to_string).collect();
        let more = if self.0.len() > 12 { ", …" } else { "" };
        format!("{} tokens [{}{more}]", self.0.len(), head.join(", "))
    }
}

/// A loaded tokenizer with its truncation length.
#[derive(Clone)]
pub struct TextTokenizer {
    inner: Arc<Tokenizer>,
    max_length: usize,
    hash: u64,
    pad_id: u32,
    eos_id: u32,
}

impl std::fmt::Debug for TextTokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TextTokenizer")
            .field("max_length", &self.max_length)
            .field("vocab", &self.inner.get_vocab_size(true))
            .field("pad_id", &self.pad_id)
            .field("eos_id", &self.eos_id)
            .finish()
    }
}

impl TextTokenizer {
    /// Loads a `tokenizer.json`.
    pub fn from_file(path: &Path, max_length: usize) -> Result<Self, TextError> {
        let bytes = std::fs::read(path).map_err(|e| TextError::Tokenizer {
            path: path.display().to_string(),
            message: e.to_string(),
        })?;
        Self::from_bytes(&bytes, max_length, &path.display().to_string())
    }

    /// The embedded default (see [`EMBEDDED_TOKENIZER`]).
    pub fn embedded(max_length: usize) -> Result<Self, TextError> {
        Self::from_bytes(EMBEDDED_TOKENIZER, max_length, "<embedded tokenizer.json>")
    }

    /// Parses a `tokenizer.json` held in memory; `name` names it in errors.
    pub fn from_bytes(json: &[u8], max_length: usize, name: &str) -> Result<Self, TextError> {
        let err = |message: String| TextError::Tokenizer {
            path: name.to_string(),
            message,
        };
        if max_length == 0 {
            return Err(err("max_length must be at least 1".into()));
        }
        let mut tok = Tokenizer::from_bytes(json).map_err(|e| err(e.to_string()))?;
        tok.with_padding(None);
        tok.with_truncation(Some(TruncationParams {
            max_length,
            ..TruncationParams::default()
        }))
        .map_err(|e| err(e.to_string()))?;
        let find = |names: &[&str]| names.iter().find_map(|n| tok.token_to_id(n));
        let pad_id = find(&["[PAD]", "<pad>", "<|padding|>", "<|endoftext|>"]).unwrap_or(0);
        let eos_id = find(&["[SEP]", "</s>", "<|endoftext|>", "<eos>"]).unwrap_or(pad_id);
        let mut h = std::collections::hash_map::DefaultHasher::new();
        json.hash(&mut h);
        max_length.hash(&mut h);
        let t = TextTokenizer {
            inner: Arc::new(tok),
            max_length,
            hash: h.finish(),
            pad_id,
            eos_id,
        };
        // A tokenizer that cannot encode plain text is unusable: say so now.
        t.encode("probe").map_err(|e| err(e.to_string()))?;
        Ok(t)
    }

    /// Encodes `text` (special tokens added, truncated to `max_length`).
    pub fn encode(&self, text: &str) -> Result<Vec<u32>, BoxError> {
        Ok(self.encode_counted(text)?.0)
    }

    /// Encodes `text`; the flag says whether it was truncated.
    pub fn encode_counted(&self, text: &str) -> Result<(Vec<u32>, bool), BoxError> {
        let enc = self.inner.encode_fast(text, true)?;
        let truncated = !enc.get_overflowing().is_empty();
        Ok((enc.get_ids().to_vec(), truncated))
    }

    /// Encodes many texts with the crate's batch encoder (its own thread
    /// pool); for comparison with per-sample encoding in the benchmarks.
    pub fn encode_batch(&self, texts: &[&str]) -> Result<Vec<Vec<u32>>, BoxError> {
        let encs = self.inner.encode_batch_fast(texts.to_vec(), true)?;
        Ok(encs.into_iter().map(|e| e.get_ids().to_vec()).collect())
    }

    /// The truncation length.
    pub fn max_length(&self) -> usize {
        self.max_length
    }
    /// The padding token's id (`[PAD]`, `<pad>`…, else 0).
    pub fn pad_id(&self) -> u32 {
        self.pad_id
    }
    /// The end-of-sequence token used between packed documents (`[SEP]`,
    /// `</s>`, `<|endoftext|>`…).
    pub fn eos_id(&self) -> u32 {
        self.eos_id
    }
    /// The id of a token.
    pub fn token_id(&self, token: &str) -> Option<u32> {
        self.inner.token_to_id(token)
    }
    /// Vocabulary size, added tokens included.
    pub fn vocab_size(&self) -> usize {
        self.inner.get_vocab_size(true)
    }
    /// A hash of the tokenizer file and `max_length` (keys the token cache).
    pub fn fingerprint(&self) -> u64 {
        self.hash
    }
}

/// Counters a [`Tokenize`] stage (and the token cache) keep.
#[derive(Debug, Default)]
pub struct TokenStats {
    /// Samples encoded.
    pub samples: AtomicU64,
    /// Tokens produced.
    pub tokens: AtomicU64,
    /// Samples cut to `max_length`.
    pub truncated: AtomicU64,
}

impl TokenStats {
    /// `(samples, tokens, truncated)` now.
    pub fn snapshot(&self) -> (u64, u64, u64) {
        (
            self.samples.load(Ordering::Relaxed),
            self.tokens.load(Ordering::Relaxed),
            self.truncated.load(Ordering::Relaxed),
        )
    }
}

/// The stage `Text → Tokens`.
pub struct Tokenize {
    tokenizer: TextTokenizer,
    stats: Arc<TokenStats>,
}

impl Tokenize {
    /// A tokenize stage.
    pub fn new(tokenizer: TextTokenizer) -> Self {
        Tokenize {
            tokenizer,
            stats: Arc::default(),
        }
    }
    /// Its counters (shared; read them while the pipeline runs).
    pub fn stats(&self) -> Arc<TokenStats> {
        Arc::clone(&self.stats)
    }
}

impl Stage for Tokenize {
    type In = Text;
    type Out = Tokens;
    fn process(&self, text: Text, _ctx: &StageCtx) -> Result<Tokens, BoxError> {
        let (ids, truncated) = self.tokenizer.encode_counted(&text.0)?;
        self.stats.samples.fetch_add(1, Ordering::Relaxed);
        self.stats
            .tokens
            .fetch_add(ids.len() as u64, Ordering::Relaxed);
        if truncated {
            self.stats.truncated.fetch_add(1, Ordering::Relaxed);
        }
        Ok(Tokens(ids))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn malformed_and_missing_files_fail_at_load() {
        let e =
            TextTokenizer::from_bytes(b"{\"not\": \"a tokenizer\"}", 16, "bad.json").unwrap_err();
        assert!(e.to_string().contains("bad.json"), "{e}");
        let e = TextTokenizer::from_file(Path::new("/nonexistent/tokenizer.json"), 16).unwrap_err();
        assert!(e.to_string().contains("/nonexistent/tokenizer.json"), "{e}");
        assert!(TextTokenizer::embedded(0).is_err());
    }

    #[test]
    fn truncation_is_counted_and_keeps_special_tokens() {
        let tok = TextTokenizer::embedded(6).unwrap();
        let stage = Tokenize::new(tok.clone());
        let stop = std::sync::atomic::AtomicBool::new(false);
        let ctx = StageCtx::detached(0, 0, 0, &stop);
        let short = stage.process(Text("hi".into()), &ctx).unwrap();
        assert_eq!(short.0.len(), 3);
        let long = stage
            .process(Text("one two three four five six seven".into()), &ctx)
            .unwrap();
        assert_eq!(long.0.len(), 6);
        assert_eq!(long.0[5], tok.eos_id());
        assert_eq!(stage.stats().snapshot(), (2, 9, 1));
        assert_eq!(tok.pad_id(), 0);
        assert_eq!(tok.vocab_size(), 30522);
    }

    #[test]
    fn batch_and_single_encoding_agree() {
        let tok = TextTokenizer::embedded(64).unwrap();
        let lines = [
            "The quick brown fox.",
            "",
            "Ünïcödé text, with punctuation!",
        ];
        let batch = tok.encode_batch(&lines).unwrap();
        for (l, b) in lines.iter().zip(&batch) {
            assert_eq!(&tok.encode(l).unwrap(), b);
        }
    }
}
