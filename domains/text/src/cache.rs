//! The token cache: every sample tokenized once, the ids kept in a
//! memory-mapped file so later epochs (and later runs) skip tokenization.
//!
//! Building the cache is itself a pipeline — the corpus, the [`Tokenize`]
//! stage on its worker pool, a collate that gathers the ids — so it gets the
//! engine's error policy: a sample that fails (invalid UTF-8, a JSON line
//! without the field) is reported with its index, path and stage, and under
//! `skip` it is remembered as failed, so the cache's own source reports it
//! again instead of dropping it silently. Files are keyed by the tokenizer's
//! hash and each corpus file's path, size and modification time:
//! `<dir>/tokens-<key>.ids` (u32 little-endian) and `.offsets` (u64).
//!
//! ```
//! use std::sync::Arc;
//! use ferrofeed_core::Source;
//! use ferrofeed_text::{CacheOptions, CorpusOptions, TextCorpus, TextTokenizer, TokenCache};
//! let dir = tempfile::tempdir().unwrap();
//! std::fs::write(dir.path().join("a.txt"), "hello world\nsecond line here\n").unwrap();
//! let corpus = Arc::new(TextCorpus::open(dir.path(), &CorpusOptions::default()).unwrap());
//! let tok = TextTokenizer::embedded(32).unwrap();
//! let opts = CacheOptions { dir: Some(dir.path().join("cache")), ..CacheOptions::default() };
//! let cache = TokenCache::build(&corpus, &tok, &opts).unwrap();
//! assert!(!cache.was_loaded());
//! assert_eq!(cache.lengths(), vec![4, 5]);
//! assert_eq!(cache.get(0).unwrap().0, tok.encode("hello world").unwrap());
//! let again = TokenCache::build(&corpus, &tok, &opts).unwrap();
//! assert!(again.was_loaded(), "the second build maps the files");
//! ```
use std::collections::HashMap;
use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use ferrofeed_core::BatchRows;
use ferrofeed_core::{
    Batch, BoxError, Collate, CollateError, ComponentId, ErrorPolicy, Parallelism, Pipeline,
    Source, StageOptions, Tensor,
};
use memmap2::Mmap;

use crate::corpus::TextCorpus;
use crate::tokenize::{TextTokenizer, TokenStats, Tokenize, Tokens};
use crate::TextError;

/// Bumped when the file layout changes.
const FORMAT: u64 = 2;

/// How the cache is built.
#[derive(Debug, Clone)]
pub struct CacheOptions {
    /// Folder for the cache files; `None` keeps the ids in memory only.
    pub dir: Option<PathBuf>,
    /// Tokenizer workers.
    pub workers: Parallelism,
    /// CPUs `Parallelism::Auto` resolves to (default: what this process may use).
    pub cpus: Option<usize>,
    /// What a failing sample does.
    pub on_error: ErrorPolicy,
}

impl Default for CacheOptions {
    fn default() -> Self {
        CacheOptions {
            dir: None,
            workers: Parallelism::Auto,
            cpus: None,
            on_error: ErrorPolicy::Fail,
        }
    }
}

enum Ids {
    Mapped(Mmap),
    Owned(Vec<u32>),
    Empty,
}

/// Every sample's token ids; a map-style [`Source`] of [`Tokens`].
pub struct TokenCache {
    corpus: Arc<TextCorpus>,
    ids: Ids,
    offsets: Vec<u64>,
    failed: HashMap<u64, String>,
    loaded: bool,
    truncated: u64,
    word_hit_rate: Option<f64>,
    corpus_id: u64,
}

impl TokenCache {
    /// Loads the cache for `corpus` and `tokenizer` from `opts.dir`, or
    /// tokenizes the corpus (and writes the files there).
    pub fn build(
        corpus: &Arc<TextCorpus>,
        tokenizer: &TextTokenizer,
        opts: &CacheOptions,
    ) -> Result<TokenCache, TextError> {
        let corpus_id = corpus.fingerprint();
        let key = {
            use std::hash::{Hash, Hasher};
            let mut h = std::collections::hash_map::DefaultHasher::new();
            (FORMAT, corpus_id, tokenizer.fingerprint()).hash(&mut h);
            h.finish()
        };
        let files = opts.dir.as_ref().map(|d| {
            // What a killed build left half written.
            ferrofeed_stages::sweep_temporaries(d);
            CacheFiles::new(d, key)
        });
        if let Some(f) = &files {
            if let Some(mut c) = f.load(corpus)? {
                c.corpus_id = corpus_id;
                return Ok(c);
            }
        }
        let built = tokenize_all(corpus, tokenizer, opts)?;
        match &files {
            Some(f) => {
                f.write(&built)?;
                match f.load(corpus)? {
                    Some(mut c) => {
                        c.loaded = false;
                        c.corpus_id = corpus_id;
                        c.truncated = built.truncated;
                        c.word_hit_rate = built.word_hit_rate;
                        Ok(c)
                    }
                    None => Err(TextError::Io {
                        path: f.offsets.clone(),
                        source: std::io::Error::other("the cache just written could not be read"),
                    }),
                }
            }
            None => Ok(TokenCache {
                corpus: Arc::clone(corpus),
                ids: Ids::Owned(built.ids),
                offsets: built.offsets,
                failed: built.failed,
                loaded: false,
                truncated: built.truncated,
                word_hit_rate: built.word_hit_rate,
                corpus_id,
            }),
        }
    }

    /// [`TextCorpus::fingerprint`] of the corpus: its files' paths, sizes,
    /// times and bytes, and the reading options.
    pub fn corpus_fingerprint(&self) -> u64 {
        self.corpus_id
    }

    /// Whether the ids came from existing files (no tokenization ran).
    pub fn was_loaded(&self) -> bool {
        self.loaded
    }

    /// Samples cut to `max_length` (counted while building, and kept in
    /// the cache's files for the runs it serves).
    pub fn truncated(&self) -> u64 {
        self.truncated
    }

    /// The share of words the tokenize workers found in their word caches
    /// while building (`None` when loaded, or for a tokenizer encoded whole).
    pub fn word_hit_rate(&self) -> Option<f64> {
        self.word_hit_rate
    }

    /// Samples that failed to tokenize, with their errors.
    pub fn failed(&self) -> &HashMap<u64, String> {
        &self.failed
    }

    /// Token count of every sample (0 for a failed one).
    pub fn lengths(&self) -> Vec<u32> {
        self.offsets
            .windows(2)
            .map(|w| (w[1] - w[0]) as u32)
            .collect()
    }

    /// All ids held.
    pub fn total_tokens(&self) -> u64 {
        self.offsets.last().copied().unwrap_or(0)
    }

    fn ids(&self, index: u64) -> Vec<u32> {
        let (a, b) = (
            self.offsets[index as usize] as usize,
            self.offsets[index as usize + 1] as usize,
        );
        match &self.ids {
            Ids::Mapped(m) => m[a * 4..b * 4]
                .chunks_exact(4)
                .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                .collect(),
            Ids::Owned(v) => v[a..b].to_vec(),
            Ids::Empty => Vec::new(),
        }
    }
}

impl Source for TokenCache {
    type Output = Tokens;
    fn len(&self) -> u64 {
        self.offsets.len().saturating_sub(1) as u64
    }
    fn get(&self, index: u64) -> Result<Tokens, BoxError> {
        if index >= self.len() {
            return Err(format!("index {index} is out of range ({})", self.len()).into());
        }
        if let Some(e) = self.failed.get(&index) {
            return Err(format!("tokenizing failed: {e}").into());
        }
        Ok(Tokens(self.ids(index)))
    }
    fn key(&self, index: u64) -> Option<String> {
        self.corpus.key(index)
    }
}

struct Built {
    ids: Vec<u32>,
    offsets: Vec<u64>,
    failed: HashMap<u64, String>,
    truncated: u64,
    word_hit_rate: Option<f64>,
}

/// Gathers a batch's token ids into `ids` (i32, concatenated) and `lengths`.
struct RaggedCollate;

impl Collate for RaggedCollate {
    fn reads(&self) -> Vec<ComponentId> {
        vec![ComponentId::of::<Tokens>()]
    }
    fn collate(&self, rows: &BatchRows<'_>) -> Result<Batch, CollateError> {
        let toks = rows.column::<Tokens>().ok_or_else(|| CollateError {
            sample: None,
            message: "no Tokens column".into(),
        })?;
        let ids: Vec<i32> = toks
            .iter()
            .flat_map(|t| t.0.iter().map(|&i| i as i32))
            .collect();
        let lengths: Vec<i64> = toks.iter().map(|t| t.0.len() as i64).collect();
        let mut b = Batch::new(Vec::new());
        b.insert("ids", Tensor::from_slice(&ids, &[ids.len()]));
        b.insert("lengths", Tensor::from_slice(&lengths, &[lengths.len()]));
        Ok(b)
    }
}

fn tokenize_all(
    corpus: &Arc<TextCorpus>,
    tokenizer: &TextTokenizer,
    opts: &CacheOptions,
) -> Result<Built, TextError> {
    let stage = Tokenize::new(tokenizer.clone());
    let stats: Arc<TokenStats> = stage.stats();
    let mut b = Pipeline::builder(Arc::clone(corpus))
        .stage_with("tokenize", StageOptions::new().workers(opts.workers), stage)
        .batch_size(1024)
        .shuffle(false)
        .on_error(opts.on_error)
        .collate(RaggedCollate);
    if let Some(c) = opts.cpus {
        b = b.cpus(c);
    }
    let pipeline = b.build().map_err(|e| TextError::Build(e.to_string()))?;
    let n = corpus.len() as usize;
    let mut ids: Vec<u32> = Vec::new();
    let mut lengths = vec![0u64; n];
    let mut it = pipeline.epoch(0);
    for batch in it.by_ref() {
        let batch = batch.map_err(TextError::Sample)?;
        let (Some(flat), Some(lens)) = (batch.get("ids"), batch.get("lengths")) else {
            return Err(TextError::Build("a cache batch lacks its columns".into()));
        };
        let (flat, lens) = (
            flat.as_slice::<i32>()
                .map_err(|e| TextError::Build(e.to_string()))?,
            lens.as_slice::<i64>()
                .map_err(|e| TextError::Build(e.to_string()))?,
        );
        ids.extend(flat.iter().map(|&i| i as u32));
        for (&i, &l) in batch.indices().iter().zip(lens) {
            lengths[i as usize] = l as u64;
        }
    }
    let failed = it
        .summary()
        .skipped
        .iter()
        .filter_map(|e| Some((e.index?, format!("{} (stage {})", e.kind, e.stage))))
        .collect();
    drop(it);
    let mut offsets = Vec::with_capacity(n + 1);
    offsets.push(0u64);
    for l in lengths {
        offsets.push(offsets[offsets.len() - 1] + l);
    }
    Ok(Built {
        ids,
        offsets,
        failed,
        truncated: stats.snapshot().2,
        word_hit_rate: stats.word_hit_rate(),
    })
}

/// What a cache keeps beside the ids: the samples that failed, and how
/// many were truncated (so a run served from the cache reports as the run
/// that built it).
#[derive(serde::Serialize, serde::Deserialize)]
struct Meta {
    failed: HashMap<u64, String>,
    truncated: u64,
}

struct CacheFiles {
    ids: PathBuf,
    offsets: PathBuf,
    failed: PathBuf,
}

impl CacheFiles {
    fn new(dir: &Path, key: u64) -> Self {
        let base = dir.join(format!("tokens-{key:016x}"));
        let with = |ext: &str| base.with_extension(ext);
        CacheFiles {
            ids: with("ids"),
            offsets: with("offsets"),
            failed: with("meta.json"),
        }
    }

    fn io(path: &Path) -> impl FnOnce(std::io::Error) -> TextError + '_ {
        move |source| TextError::Io {
            path: path.to_path_buf(),
            source,
        }
    }

    /// The cache, when complete files exist (the offsets file is written last).
    fn load(&self, corpus: &Arc<TextCorpus>) -> Result<Option<TokenCache>, TextError> {
        let Ok(raw) = std::fs::read(&self.offsets) else {
            return Ok(None);
        };
        if raw.len() % 8 != 0 {
            return Ok(None);
        }
        let offsets: Vec<u64> = raw
            .chunks_exact(8)
            .map(|c| u64::from_le_bytes(c.try_into().unwrap_or([0; 8])))
            .collect();
        if offsets.len() as u64 != corpus.len() + 1 || offsets.windows(2).any(|w| w[1] < w[0]) {
            return Ok(None);
        }
        let total = offsets.last().copied().unwrap_or(0);
        let f = File::open(&self.ids).map_err(Self::io(&self.ids))?;
        if f.metadata().map_err(Self::io(&self.ids))?.len() != total * 4 {
            return Ok(None);
        }
        let ids = if total == 0 {
            Ids::Empty
        } else {
            // SAFETY: read-only map of a file this cache wrote and renamed
            // into place; it is never written again.
            Ids::Mapped(unsafe { Mmap::map(&f) }.map_err(Self::io(&self.ids))?)
        };
        // Written before the offsets: a complete cache has it.
        let Some(meta) = std::fs::read(&self.failed)
            .ok()
            .and_then(|b| serde_json::from_slice::<Meta>(&b).ok())
        else {
            return Ok(None);
        };
        Ok(Some(TokenCache {
            corpus: Arc::clone(corpus),
            ids,
            offsets,
            failed: meta.failed,
            loaded: true,
            truncated: meta.truncated,
            word_hit_rate: None,
            corpus_id: 0,
        }))
    }

    fn write(&self, b: &Built) -> Result<(), TextError> {
        if let Some(dir) = self.ids.parent() {
            std::fs::create_dir_all(dir).map_err(Self::io(dir))?;
        }
        let put = |path: &Path, bytes: &mut dyn FnMut(&mut dyn Write) -> std::io::Result<()>| {
            let tmp = path.with_extension(format!("tmp{}", std::process::id()));
            let mut w = BufWriter::new(File::create(&tmp).map_err(Self::io(&tmp))?);
            bytes(&mut w)
                .and_then(|()| w.flush())
                .map_err(Self::io(&tmp))?;
            std::fs::rename(&tmp, path).map_err(Self::io(path))
        };
        put(&self.ids, &mut |w| {
            b.ids.iter().try_for_each(|i| w.write_all(&i.to_le_bytes()))
        })?;
        let meta = Meta {
            failed: b.failed.clone(),
            truncated: b.truncated,
        };
        let failed = serde_json::to_vec(&meta).map_err(|e| TextError::Build(e.to_string()))?;
        put(&self.failed, &mut |w| w.write_all(&failed))?;
        put(&self.offsets, &mut |w| {
            b.offsets
                .iter()
                .try_for_each(|o| w.write_all(&o.to_le_bytes()))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::corpus::CorpusOptions;

    #[test]
    fn failed_samples_are_kept_as_failures_not_dropped() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("a.txt");
        std::fs::write(&p, b"good one\nbad \xff byte\nlast one\n").unwrap();
        let corpus = Arc::new(TextCorpus::open(&p, &CorpusOptions::default()).unwrap());
        let tok = TextTokenizer::embedded(16).unwrap();
        let fail = CacheOptions::default();
        let e = TokenCache::build(&corpus, &tok, &fail).err().unwrap();
        assert!(e.to_string().contains("a.txt:2"), "{e}");
        let skip = CacheOptions {
            on_error: ErrorPolicy::Skip,
            dir: Some(dir.path().join("c")),
            ..CacheOptions::default()
        };
        for round in 0..2 {
            let c = TokenCache::build(&corpus, &tok, &skip).unwrap();
            assert_eq!(c.was_loaded(), round == 1);
            assert_eq!(c.len(), 3);
            assert_eq!(c.lengths()[1], 0);
            let e = c.get(1).unwrap_err().to_string();
            assert!(e.contains("invalid UTF-8") && e.contains("a.txt:2"), "{e}");
            assert_eq!(c.get(2).unwrap().0, tok.encode("last one").unwrap());
        }
    }

    #[test]
    fn a_changed_file_or_tokenizer_gets_a_new_cache() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("a.txt");
        std::fs::write(&p, "one\ntwo\n").unwrap();
        let opts = CacheOptions {
            dir: Some(dir.path().join("c")),
            ..CacheOptions::default()
        };
        let tok = TextTokenizer::embedded(16).unwrap();
        let corpus = Arc::new(TextCorpus::open(&p, &CorpusOptions::default()).unwrap());
        TokenCache::build(&corpus, &tok, &opts).unwrap();
        let short = TextTokenizer::embedded(2).unwrap();
        assert!(!TokenCache::build(&corpus, &short, &opts)
            .unwrap()
            .was_loaded());
        std::fs::write(&p, "one\ntwo\nthree\n").unwrap();
        let corpus = Arc::new(TextCorpus::open(&p, &CorpusOptions::default()).unwrap());
        let c = TokenCache::build(&corpus, &tok, &opts).unwrap();
        assert!(!c.was_loaded());
        assert_eq!(c.len(), 3);
    }
}
