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
//! **Word cache.** When the tokenizer's normalizer and pre-tokenizer cannot
//! carry anything across ASCII whitespace (BERT-style: `BertNormalizer`,
//! `Lowercase`, the Unicode normal forms, `StripAccents` before
//! `BertPreTokenizer`, `Whitespace` or `WhitespaceSplit`, optionally with
//! `Punctuation`/`Digits`; no added token holding or stripping whitespace),
//! a text's ids are the concatenation of its whitespace-separated words'
//! ids. Each worker thread then keeps the ids of the words it has seen
//! (up to [`WORD_CACHE_BYTES`]) and runs the crate only on new words; the
//! special tokens and the truncation are applied as the crate's template
//! does. Any other tokenizer (byte-level BPE, Metaspace, `Replace`…) is
//! encoded whole by the crate. [`TextTokenizer::word_cache`] says which.
//!
//! ```
//! use ferrofeed_text::TextTokenizer;
//! let tok = TextTokenizer::embedded(8).unwrap();
//! let ids = tok.encode("Hello, world! This line is longer than eight tokens.").unwrap();
//! assert_eq!(ids.len(), 8, "truncated to max_length, special tokens included");
//! assert_eq!(ids[0], tok.token_id("[CLS]").unwrap());
//! assert_eq!(*ids.last().unwrap(), tok.token_id("[SEP]").unwrap());
//! ```
use std::cell::RefCell;
use std::hash::{Hash, Hasher};
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use ahash::AHashMap;

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

/// The most bytes of word ids one worker thread keeps (keys, ids and
/// table overhead counted); past it, new words are encoded but not kept.
pub const WORD_CACHE_BYTES: usize = 16 << 20;

/// A loaded tokenizer with its truncation length.
#[derive(Clone)]
pub struct TextTokenizer {
    inner: Arc<Tokenizer>,
    words: Option<Arc<WordPath>>,
    max_length: usize,
    hash: u64,
    pad_id: u32,
    eos_id: u32,
}

/// Encoding word by word: the crate (without truncation or special
/// tokens) for words not seen before, the ids around the sequence that the
/// post-processor adds, and how many sequence ids fit in `max_length`.
struct WordPath {
    words: Tokenizer,
    prefix: Vec<u32>,
    suffix: Vec<u32>,
    budget: usize,
    key: u64,
}

/// One text's ids, whether they were truncated, and how many of its words
/// the word cache held and how many the tokenizer ran on.
struct Encoded {
    ids: Vec<u32>,
    truncated: bool,
    word_hits: u64,
    new_words: u64,
}

/// One thread's word ids, for the `WordPath` whose key it holds.
#[derive(Default)]
struct WordCache {
    key: u64,
    bytes: usize,
    ids: AHashMap<Box<str>, Box<[u32]>>,
}

thread_local! {
    static WORD_CACHE: RefCell<WordCache> = RefCell::default();
}

/// Whether splitting at ASCII whitespace first leaves every id unchanged
/// for the tokenizer described by `json` (see the module docs).
fn splits_at_whitespace(json: &serde_json::Value) -> bool {
    fn kind(v: &serde_json::Value) -> &str {
        v.get("type").and_then(|t| t.as_str()).unwrap_or("")
    }
    fn local_normalizer(v: &serde_json::Value) -> bool {
        match kind(v) {
            "BertNormalizer" | "Lowercase" | "NFC" | "NFD" | "NFKC" | "NFKD" | "StripAccents" => {
                true
            }
            "Sequence" => v
                .get("normalizers")
                .and_then(|n| n.as_array())
                .is_some_and(|n| n.iter().all(local_normalizer)),
            _ => false,
        }
    }
    // (splits at and drops whitespace, splits only at fixed characters)
    fn pre_tokenizer(v: &serde_json::Value) -> (bool, bool) {
        match kind(v) {
            "BertPreTokenizer" | "Whitespace" | "WhitespaceSplit" => (true, true),
            "Punctuation" | "Digits" => (false, true),
            "Sequence" => {
                v.get("pretokenizers")
                    .and_then(|n| n.as_array())
                    .map_or((false, false), |n| {
                        n.iter()
                            .map(pre_tokenizer)
                            .fold((false, true), |a, b| (a.0 || b.0, a.1 && b.1))
                    })
            }
            _ => (false, false),
        }
    }
    let normal = match json.get("normalizer") {
        None | Some(serde_json::Value::Null) => true,
        Some(n) => local_normalizer(n),
    };
    let (splits, local) = json
        .get("pre_tokenizer")
        .map_or((false, false), pre_tokenizer);
    let added_ok = json
        .get("added_tokens")
        .and_then(|a| a.as_array())
        .is_some_and(|a| {
            a.iter().all(|t| {
                let flag = |k: &str| t.get(k).and_then(|f| f.as_bool()).unwrap_or(false);
                let content = t.get("content").and_then(|c| c.as_str()).unwrap_or(" ");
                !flag("lstrip")
                    && !flag("rstrip")
                    && !content.bytes().any(|b| b.is_ascii_whitespace())
            })
        });
    normal && splits && local && added_ok
}

impl WordPath {
    /// Builds the word path for `tok` (already set to truncate at
    /// `max_length`), or `None` when the template is not "ids before, the
    /// sequence, ids after" or leaves no room for the sequence.
    fn new(tok: &Tokenizer, max_length: usize) -> Option<WordPath> {
        let mut words = tok.clone();
        words.with_truncation(None).ok()?;
        let probe = |text: &str| -> Option<(Vec<u32>, Vec<u32>)> {
            let whole = words.encode_fast(text, true).ok()?.get_ids().to_vec();
            let seq = words.encode_fast(text, false).ok()?.get_ids().to_vec();
            Some((whole, seq))
        };
        let (empty, _) = probe("")?;
        let (whole, seq) = probe("probe words")?;
        if seq.is_empty() || whole.len() != empty.len() + seq.len() {
            return None;
        }
        let at = whole.windows(seq.len()).position(|w| w == seq.as_slice())?;
        let (prefix, suffix) = (whole[..at].to_vec(), whole[at + seq.len()..].to_vec());
        if [prefix.as_slice(), suffix.as_slice()].concat() != empty {
            return None;
        }
        let budget = max_length.checked_sub(prefix.len() + suffix.len())?;
        static KEYS: AtomicU64 = AtomicU64::new(1);
        Some(WordPath {
            words,
            prefix,
            suffix,
            budget,
            key: KEYS.fetch_add(1, Ordering::Relaxed),
        })
    }

    /// Encodes `text` word by word.
    fn encode(&self, text: &str) -> Result<Encoded, BoxError> {
        WORD_CACHE.with(|cache| {
            let mut cache = cache.borrow_mut();
            if cache.key != self.key {
                *cache = WordCache {
                    key: self.key,
                    ..WordCache::default()
                };
            }
            let mut ids = Vec::with_capacity(self.prefix.len() + text.len() / 3 + 4);
            ids.extend_from_slice(&self.prefix);
            let start = ids.len();
            let (mut word_hits, mut new_words) = (0, 0);
            for word in text
                .split([' ', '\t', '\n', '\r'])
                .filter(|w| !w.is_empty())
            {
                match cache.ids.get(word) {
                    Some(w) => {
                        ids.extend_from_slice(w);
                        word_hits += 1;
                    }
                    None => {
                        new_words += 1;
                        let enc = self.words.encode_fast(word, false)?;
                        let w = enc.get_ids();
                        ids.extend_from_slice(w);
                        let cost = word.len() + 4 * w.len() + 48;
                        if cache.bytes + cost <= WORD_CACHE_BYTES {
                            cache.bytes += cost;
                            cache.ids.insert(word.into(), w.into());
                        }
                    }
                }
                if ids.len() - start > self.budget {
                    break;
                }
            }
            let truncated = ids.len() - start > self.budget;
            ids.truncate(start + self.budget);
            ids.extend_from_slice(&self.suffix);
            Ok(Encoded {
                ids,
                truncated,
                word_hits,
                new_words,
            })
        })
    }
}

impl std::fmt::Debug for TextTokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TextTokenizer")
            .field("max_length", &self.max_length)
            .field("word_cache", &self.words.is_some())
            .field("vocab", &self.inner.get_vocab_size(true))
            .field("pad_id", &self.pad_id)
            .field("eos_id", &self.eos_id)
            .finish()
    }
}

/// The longest sequence a tokenizer truncates to (`max_length`, also the
/// packed row length): 1 Mi tokens.
pub const MAX_LENGTH: usize = 1 << 20;

/// The largest `tokenizer.json` [`TextTokenizer::from_file`] reads (the
/// largest published ones are tens of MB).
pub const MAX_TOKENIZER_BYTES: u64 = 512 << 20;

impl TextTokenizer {
    /// Loads a `tokenizer.json` (a regular file of at most
    /// [`MAX_TOKENIZER_BYTES`]: a device or FIFO is refused unread).
    pub fn from_file(path: &Path, max_length: usize) -> Result<Self, TextError> {
        let bytes = ferrofeed_core::read_settings_file(path, MAX_TOKENIZER_BYTES).map_err(|e| {
            TextError::Tokenizer {
                path: path.display().to_string(),
                message: e.to_string(),
            }
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
        if max_length == 0 || max_length > MAX_LENGTH {
            return Err(err(format!(
                "max_length must be 1 to {MAX_LENGTH}, not {max_length}"
            )));
        }
        let mut tok = Tokenizer::from_bytes(json).map_err(|e| err(e.to_string()))?;
        // The length includes the special tokens (as HF truncation): a
        // length they alone exceed cannot be met.
        let special = tok
            .get_post_processor()
            .map_or(0, |p| tokenizers::PostProcessor::added_tokens(p, false));
        if max_length < special {
            return Err(err(format!(
                "max_length {max_length} is shorter than the {special} special tokens this \
                 tokenizer adds to every sequence (the length includes them): use at least {}",
                special + 1
            )));
        }
        tok.with_padding(None);
        tok.with_truncation(Some(TruncationParams {
            max_length,
            ..TruncationParams::default()
        }))
        .map_err(|e| err(e.to_string()))?;
        let words = serde_json::from_slice::<serde_json::Value>(json)
            .ok()
            .filter(splits_at_whitespace)
            .and_then(|_| WordPath::new(&tok, max_length))
            .map(Arc::new);
        let find = |names: &[&str]| names.iter().find_map(|n| tok.token_to_id(n));
        let pad_id = find(&["[PAD]", "<pad>", "<|padding|>", "<|endoftext|>"]).unwrap_or(0);
        let eos_id = find(&["[SEP]", "</s>", "<|endoftext|>", "<eos>"]).unwrap_or(pad_id);
        let mut h = std::collections::hash_map::DefaultHasher::new();
        json.hash(&mut h);
        max_length.hash(&mut h);
        let t = TextTokenizer {
            inner: Arc::new(tok),
            words,
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
        let e = self.encode_words(text)?;
        Ok((e.ids, e.truncated))
    }

    /// Encodes `text` with the word cache's counts (zeros when texts are
    /// encoded whole).
    fn encode_words(&self, text: &str) -> Result<Encoded, BoxError> {
        match &self.words {
            Some(words) => words.encode(text),
            None => {
                let (ids, truncated) = self.encode_whole(text)?;
                Ok(Encoded {
                    ids,
                    truncated,
                    word_hits: 0,
                    new_words: 0,
                })
            }
        }
    }

    /// Encodes `text` in one call to the crate, without the word cache
    /// (the reference the word path is tested against).
    pub fn encode_whole(&self, text: &str) -> Result<(Vec<u32>, bool), BoxError> {
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

    /// Whether texts are encoded word by word through the per-thread word
    /// cache (see the module docs), rather than whole.
    pub fn word_cache(&self) -> bool {
        self.words.is_some()
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
    /// Words found in a worker's word cache (see the module docs).
    pub word_hits: AtomicU64,
    /// Words the tokenizer ran on, through the word cache's misses.
    pub new_words: AtomicU64,
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

    /// The share of words found in a word cache, `None` when no text went
    /// through one.
    pub fn word_hit_rate(&self) -> Option<f64> {
        let hits = self.word_hits.load(Ordering::Relaxed);
        let total = hits + self.new_words.load(Ordering::Relaxed);
        (total > 0).then(|| hits as f64 / total as f64)
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
        let Encoded {
            ids,
            truncated,
            word_hits,
            new_words,
        } = self.tokenizer.encode_words(&text.0)?;
        self.stats.word_hits.fetch_add(word_hits, Ordering::Relaxed);
        self.stats.new_words.fetch_add(new_words, Ordering::Relaxed);
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
        // "hi", then "one" … "six" before the budget ran out: all new.
        assert_eq!(stage.stats().word_hit_rate(), Some(0.0));
        stage.process(Text("hi one two".into()), &ctx).unwrap();
        assert_eq!(stage.stats().word_hit_rate(), Some(3.0 / 9.0));
        assert_eq!(tok.pad_id(), 0);
        assert_eq!(tok.vocab_size(), 30522);
    }

    /// Texts where a word-by-word encoding could go wrong: whitespace the
    /// normalizer removes or keeps (NEL, VT, FF, NBSP, ideographic space),
    /// format characters, CJK padding, combining accents, special tokens in
    /// the text, over-long words, truncation at every length.
    const TRICKY: &[&str] = &[
        "",
        " ",
        "\t\n\r ",
        "  leading and trailing  ",
        "a\u{85}b c\u{b}d e\u{c}f",
        "non\u{a0}breaking and ideographic\u{3000}space",
        "zero\u{200b}width join\u{200d}er",
        "中文字符 mixed中文 text",
        "Ünïcödé café, e\u{301}te\u{301}",
        "[MASK]x y[SEP] [CLS][PAD]",
        "nul\0char and \u{fffd} replacement",
        "emoji 🦀🦀 and don't U.S.A. 3.14159 $100",
        "\r\nwindows\r\nlines\r\n",
        "supercalifragilisticexpialidocioussupercalifragilisticexpialidocioussupercalifragilisticexpialidocious!",
    ];

    #[test]
    fn word_path_equals_whole_text_encoding() {
        let text = std::str::from_utf8(crate::EMBEDDED_CORPUS).unwrap();
        let mut samples: Vec<String> = TRICKY.iter().map(|s| s.to_string()).collect();
        samples.extend(text.lines().take(400).map(str::to_string));
        // Lines spliced with the tricky pieces, from a fixed seed.
        let mut x = 0x9e37_79b9_7f4a_7c15_u64;
        for line in text.lines().take(300) {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let piece = TRICKY[(x % TRICKY.len() as u64) as usize];
            let cut = line
                .char_indices()
                .nth((x >> 20) as usize % (line.chars().count() + 1));
            let at = cut.map_or(line.len(), |c| c.0);
            samples.push(format!("{}{piece}{}", &line[..at], &line[at..]));
        }
        for max_length in [2, 3, 7, 16, 512] {
            let tok = TextTokenizer::embedded(max_length).unwrap();
            assert!(tok.word_cache());
            // Twice: the second pass reads the words from the cache.
            for _ in 0..2 {
                for s in &samples {
                    assert_eq!(
                        tok.encode_counted(s).unwrap(),
                        tok.encode_whole(s).unwrap(),
                        "max_length {max_length}: {s:?}"
                    );
                }
            }
        }
    }

    #[test]
    fn tokenizers_that_carry_across_whitespace_are_encoded_whole() {
        let base: serde_json::Value = serde_json::from_slice(EMBEDDED_TOKENIZER).unwrap();
        let with = |key: &str, v: serde_json::Value| {
            let mut j = base.clone();
            j[key] = v;
            let bytes = serde_json::to_vec(&j).unwrap();
            TextTokenizer::from_bytes(&bytes, 64, "test").unwrap()
        };
        let meta = serde_json::json!({"type": "Metaspace", "replacement": "▁",
            "prepend_scheme": "always", "split": true});
        let punct = serde_json::json!({"type": "Punctuation", "behavior": "Isolated"});
        let strip = serde_json::json!({"type": "Strip", "strip_left": true, "strip_right": true});
        let seq = serde_json::json!({"type": "Sequence", "pretokenizers": [
            {"type": "WhitespaceSplit"}, {"type": "Digits", "individual_digits": true}]});
        for (tok, word_cache) in [
            (with("pre_tokenizer", meta), false),
            (with("pre_tokenizer", punct), false),
            (with("normalizer", strip), false),
            (with("pre_tokenizer", seq), true),
        ] {
            assert_eq!(tok.word_cache(), word_cache, "{tok:?}");
            for s in TRICKY {
                assert_eq!(tok.encode_counted(s).unwrap(), tok.encode_whole(s).unwrap());
            }
        }
        let mut j = base.clone();
        j["added_tokens"][4]["lstrip"] = serde_json::Value::Bool(true);
        let lstrip = TextTokenizer::from_bytes(&serde_json::to_vec(&j).unwrap(), 64, "t").unwrap();
        assert!(!lstrip.word_cache());
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
