//! `ferrofeed text`, `inspect text` and `make-dataset text`.
//!
//! ```text
//! ferrofeed text corpus/ --max-tokens 16384 --max-length 512
//! ```

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use ferrofeed_core::{Parallelism, Pipeline, PipelineBuilder, Source, StageOptions};
use ferrofeed_text::{
    CacheOptions, CorpusOptions, EmptyLines, PackCollate, PadCollate, PaddingStats, TextCorpus,
    TextTokenizer, TokenBudget, TokenCache, Tokenize, Utf8Policy, EMBEDDED_CORPUS,
};
use serde_json::json;

use crate::job::{IndexEntry, Job, JobError};
use crate::{CommonSettings, MakeArgs};

/// The text job's own settings (tokenizer, truncation, batching by
/// tokens, packing).
#[derive(Debug, Clone, PartialEq, serde::Deserialize)]
#[cfg_attr(feature = "cli", derive(clap::Args))]
#[serde(default, deny_unknown_fields)]
pub struct TextOptions {
    /// Batch buffers in page-locked memory: `auto` when a CUDA device is
    /// there (else host memory, said once), `strict` (or an error), `off`.
    #[cfg_attr(feature = "cli", arg(long, value_enum, default_value_t = TextOptions::default().pin))]
    pub pin: crate::Pin,
    /// A HuggingFace tokenizer.json; default: the embedded BERT WordPiece.
    #[cfg_attr(feature = "cli", arg(long, value_name = "FILE"))]
    pub tokenizer: Option<PathBuf>,
    /// Truncate to this many tokens (special tokens included).
    #[cfg_attr(feature = "cli", arg(long, default_value_t = TextOptions::default().max_length))]
    pub max_length: usize,
    /// Length bucketing: at most this many tokens per batch after padding
    /// (N×L ≤ T); replaces --batch-size.
    #[cfg_attr(feature = "cli", arg(long, value_name = "T"))]
    pub max_tokens: Option<usize>,
    /// Pack sequences into rows of --max-length instead of padding.
    #[cfg_attr(feature = "cli", arg(long))]
    pub pack: bool,
    /// Pad each batch to a multiple of this many tokens (e.g. 8).
    #[cfg_attr(feature = "cli", arg(long, default_value_t = TextOptions::default().pad_multiple))]
    pub pad_multiple: usize,
    /// The JSON field holding the text in .jsonl files.
    #[cfg_attr(feature = "cli", arg(long, default_value_t = TextOptions::default().field))]
    pub field: String,
    /// Replace invalid UTF-8 with U+FFFD instead of failing the sample.
    #[cfg_attr(feature = "cli", arg(long))]
    pub lossy_utf8: bool,
    /// Keep empty lines as (empty) samples instead of skipping and counting them.
    #[cfg_attr(feature = "cli", arg(long))]
    pub keep_empty: bool,
}

impl Default for TextOptions {
    fn default() -> Self {
        TextOptions {
            pin: crate::Pin::Auto,
            tokenizer: None,
            max_length: 512,
            max_tokens: None,
            pack: false,
            pad_multiple: 1,
            field: "text".into(),
            lossy_utf8: false,
            keep_empty: false,
        }
    }
}

impl crate::settings::InspectOptions for TextOptions {}

/// Everything the text job is built from: the corpus, the text settings
/// and the shared ones.
#[derive(Debug, Clone, Default, PartialEq)]
#[cfg_attr(feature = "cli", derive(clap::Args))]
pub struct TextSettings {
    /// A .txt/.jsonl file or folder of them; default: the embedded corpus.
    pub path: Option<PathBuf>,
    /// The text settings.
    #[cfg_attr(feature = "cli", command(flatten))]
    pub text: TextOptions,
    /// The settings every domain shares.
    #[cfg_attr(feature = "cli", command(flatten))]
    pub common: CommonSettings,
}

/// The embedded corpus, written to the cache folder on first use.
fn default_corpus() -> Result<PathBuf, JobError> {
    let dir = crate::cache_dir().join("text-corpus-v1");
    let path = dir.join("corpus.txt");
    if std::fs::metadata(&path).ok().map(|m| m.len()) != Some(EMBEDDED_CORPUS.len() as u64) {
        std::fs::create_dir_all(&dir).map_err(JobError::io(&dir))?;
        let tmp = dir.join(format!("corpus.txt.tmp{}", std::process::id()));
        std::fs::write(&tmp, EMBEDDED_CORPUS).map_err(JobError::io(&tmp))?;
        std::fs::rename(&tmp, &path).map_err(JobError::io(&path))?;
    }
    Ok(path)
}

fn open(
    path: &Option<PathBuf>,
    o: &TextOptions,
    cpus: usize,
    r: &crate::remote::RemoteSettings,
) -> Result<(TextCorpus, Option<crate::remote::Localized>), JobError> {
    let path = match path {
        Some(p) => p.clone(),
        None => default_corpus()?,
    };
    let opts = CorpusOptions {
        field: o.field.clone(),
        utf8: if o.lossy_utf8 {
            Utf8Policy::Lossy
        } else {
            Utf8Policy::Strict
        },
        empty: if o.keep_empty {
            EmptyLines::Keep
        } else {
            EmptyLines::Skip
        },
        index_threads: cpus,
        ..CorpusOptions::default()
    };
    if crate::remote::is_url(&path) {
        let local = crate::remote::localize(
            &path,
            r,
            ferrofeed_text::TEXT_EXTENSIONS,
            ".txt or .jsonl objects",
        )?;
        let corpus = TextCorpus::from_files(local.view.paths(), &opts)
            .map_err(|e| JobError::Usage(local.view.to_url(&e.to_string())))?;
        if corpus.is_empty() {
            return Err(JobError::Usage(format!("{}: no samples", path.display())));
        }
        return Ok((corpus, Some(local)));
    }
    let corpus = TextCorpus::open(&path, &opts).map_err(|e| JobError::Usage(e.to_string()))?;
    if corpus.is_empty() {
        return Err(JobError::Usage(format!("{}: no samples", path.display())));
    }
    Ok((corpus, None))
}

fn tokenizer(o: &TextOptions) -> Result<TextTokenizer, JobError> {
    match &o.tokenizer {
        Some(p) => TextTokenizer::from_file(p, o.max_length),
        None => TextTokenizer::embedded(o.max_length),
    }
    .map_err(|e| JobError::Usage(e.to_string()))
}

/// The largest `--max-tokens` (tokens in one batch after padding).
const MAX_TOKENS: usize = 1 << 30;
/// The largest `--pad-multiple`.
const MAX_PAD_MULTIPLE: usize = 1 << 16;

/// What follows the token source in place of the text collate (stages of
/// a front end's own and its collate).
pub type Tail = Box<dyn FnOnce(PipelineBuilder) -> Result<PipelineBuilder, JobError> + Send>;

/// The text job `a` describes.
pub fn build(a: TextSettings) -> Result<Job, JobError> {
    build_with(a, None)
}

/// The text job `a` describes, with `tail` (when given) after the token
/// source instead of the pad or pack collate: the same tokens, sampler and
/// length buckets.
pub fn build_with(a: TextSettings, tail: Option<Tail>) -> Result<Job, JobError> {
    let c = &a.common;
    c.check()?;
    let o = &a.text;
    let resources = ferrofeed_core::Resources::detect();
    for w in &resources.warnings {
        tracing::warn!("{w}: falling back");
    }
    let cpus = resources.workers();
    // Everything that can be refused is checked before any tokenization.
    if o.max_tokens == Some(0) {
        return Err(JobError::Usage("--max-tokens must be at least 1".into()));
    }
    if o.max_tokens.is_some_and(|t| t > MAX_TOKENS) {
        return Err(JobError::Usage(format!(
            "--max-tokens must be at most {MAX_TOKENS}"
        )));
    }
    if o.pad_multiple > MAX_PAD_MULTIPLE {
        return Err(JobError::Usage(format!(
            "--pad-multiple must be at most {MAX_PAD_MULTIPLE}, not {}",
            o.pad_multiple
        )));
    }
    let tok = tokenizer(o)?;
    c.check_outputs()?;
    let (corpus, local) = open(&a.path, o, cpus, &c.remote)?;
    let corpus = Arc::new(corpus);
    let t0 = Instant::now();
    let cache = TokenCache::build(
        &corpus,
        &tok,
        &CacheOptions {
            dir: Some(crate::cache_dir().join("tokens")),
            workers: c.workers,
            cpus: Some(cpus),
            on_error: c.on_error,
        },
    )
    .map_err(|e| JobError::Usage(e.to_string()))?;
    let tokenize_seconds = t0.elapsed().as_secs_f64();
    if !c.quiet {
        eprintln!(
            "{} {} samples ({} tokens) in {:.2} s{}",
            if cache.was_loaded() {
                "token cache loaded:"
            } else {
                "tokenized"
            },
            cache.len(),
            cache.total_tokens(),
            tokenize_seconds,
            match cache.truncated() {
                0 => String::new(),
                n => format!(", {n} truncated to {} tokens", o.max_length),
            } + &cache.word_hit_rate().map_or(String::new(), |r| format!(
                ", {:.1}% of words from the word cache",
                r * 100.0
            ))
        );
    }
    let cache_state = if cache.was_loaded() {
        "loaded"
    } else {
        "built"
    };
    let truncated = cache.truncated();
    let corpus_id = cache.corpus_fingerprint();
    let word_hit_rate = cache.word_hit_rate();
    let lengths = cache.lengths();
    let mut b = c.configure(Pipeline::builder(cache), &resources, cpus)?;
    let mut expected_waste = None;
    if let Some(t) = o.max_tokens {
        let sampler = TokenBudget::new(lengths, t)
            .and_then(|s| s.pad_multiple(o.pad_multiple))
            .and_then(|s| s.packing(o.pack))
            .map_err(|e| JobError::Usage(e.to_string()))?
            .shuffle(c.shuffle)
            .drop_last(c.drop_last);
        expected_waste = Some(sampler.padding_waste(c.seed, 0));
        b = b.batch_sampler(sampler);
    } else {
        b = b.batch_size(c.batch_size);
    }
    let pool: Arc<dyn ferrofeed_core::BufferSource> = o.pin.pool(c.workers.resolve(cpus), 3)?;
    let stats: Arc<PaddingStats> = if let Some(tail) = tail {
        b = tail(b)?;
        Arc::new(PaddingStats::default())
    } else if o.pack {
        let col = PackCollate::new(o.max_length, tok.eos_id(), tok.pad_id()).buffers(pool);
        let s = col.stats();
        b = b.collate(col);
        s
    } else {
        let col = PadCollate::new(tok.pad_id())
            .pad_to_multiple_of(o.pad_multiple)
            .buffers(pool);
        let s = col.stats();
        b = b.collate(col);
        s
    };
    let pipeline = b.build().map_err(|e| JobError::Usage(e.to_string()))?;
    let index_corpus = Arc::clone(&corpus);
    let index = move || {
        let corpus = &index_corpus;
        Ok((0..corpus.len())
            .map(|i| IndexEntry {
                index: i,
                path: corpus.key(i).unwrap_or_default(),
                label: None,
                chunk_start: None,
            })
            .collect())
    };
    let seen = std::sync::Mutex::new((0u64, 0u64));
    let quiet = c.quiet;
    let epoch_stats = Arc::clone(&stats);
    let epoch_end = move |e: u64| {
        let stats = &epoch_stats;
        let mut seen = seen.lock().unwrap_or_else(|p| p.into_inner());
        let (r0, p0) = *seen;
        let (r, p) = (stats.real_tokens(), stats.pad_tokens());
        *seen = (r, p);
        let (dr, dp) = (r - r0, p - p0);
        if !quiet && dr + dp > 0 {
            eprintln!(
                "epoch {e}: {dr} tokens, {dp} padding — padding waste {:.2}%",
                100.0 * dp as f64 / (dr + dp) as f64
            );
        }
    };
    let extra = move |seconds: f64| {
        let mut m = BTreeMap::new();
        m.insert("tokens".to_string(), json!(stats.real_tokens()));
        m.insert("pad_tokens".to_string(), json!(stats.pad_tokens()));
        m.insert("padding_waste".to_string(), json!(stats.waste()));
        if let Some(w) = expected_waste {
            m.insert("planned_padding_waste_epoch0".to_string(), json!(w));
        }
        m.insert("tokenize_seconds".to_string(), json!(tokenize_seconds));
        m.insert(
            "tokens_per_s".to_string(),
            json!(stats.real_tokens() as f64 / (seconds + tokenize_seconds).max(1e-9)),
        );
        m.insert("token_cache".to_string(), json!(cache_state));
        m.insert("truncated".to_string(), json!(truncated));
        m.insert("word_cache_hit_rate".to_string(), json!(word_hit_rate));
        m.insert(
            "empty_lines_skipped".to_string(),
            json!(corpus.empty_lines_skipped()),
        );
        m
    };
    let mut job = Job::new("text", pipeline, a.common.clone(), index, resources);
    job.identify(&corpus_id);
    job.epoch_end = Box::new(epoch_end);
    job.extra = Box::new(extra);
    if let Some(l) = local {
        l.attach(&mut job);
    }
    Ok(job)
}

/// `inspect text`: pulls sample `a.index` through every stage and returns
/// what each made.
pub fn inspect(a: crate::InspectArgs<TextOptions>) -> Result<String, JobError> {
    let o = &a.opts;
    let tok = tokenizer(o)?;
    let (corpus, _local) = open(&a.path, o, 1, &crate::remote::RemoteSettings::default())?;
    let collate = if o.pack {
        None
    } else {
        Some(PadCollate::new(tok.pad_id()).pad_to_multiple_of(o.pad_multiple))
    };
    let b = Pipeline::builder(corpus).stage_with(
        "tokenize",
        StageOptions::new().workers(Parallelism::Fixed(1)),
        Tokenize::new(tok.clone()),
    );
    let b = match collate {
        Some(col) => b.collate(col),
        None => b.collate(PackCollate::new(o.max_length, tok.eos_id(), tok.pad_id())),
    };
    crate::settings::inspect_text(b, a.index)
}

/// `make-dataset text`: writes lines of the embedded corpus; returns what
/// it wrote.
pub fn make_dataset(a: &MakeArgs) -> Result<String, JobError> {
    crate::settings::check_count(a.count)?;
    let lines: Vec<&str> = std::str::from_utf8(EMBEDDED_CORPUS)
        .map_err(|e| JobError::Usage(e.to_string()))?
        .lines()
        .filter(|l| !l.trim().is_empty())
        .collect();
    std::fs::create_dir_all(&a.dir).map_err(JobError::io(&a.dir))?;
    let mut rng =
        ferrofeed_core::rng::sample_rng(ferrofeed_core::rng::derive_seed(&[a.seed, 0x54]));
    const PER_FILE: u64 = 1000;
    let files = a.count.div_ceil(PER_FILE);
    for f in 0..files {
        let n = PER_FILE.min(a.count - f * PER_FILE);
        let jsonl = f % 2 == 1;
        let mut out = String::new();
        for _ in 0..n {
            use rand::Rng;
            let line = lines[rng.random_range(0..lines.len())];
            if jsonl {
                out.push_str(&json!({ "text": line }).to_string());
            } else {
                out.push_str(line);
            }
            out.push('\n');
        }
        let path = a.dir.join(format!(
            "part-{f:05}.{}",
            if jsonl { "jsonl" } else { "txt" }
        ));
        std::fs::write(&path, out).map_err(JobError::io(&path))?;
    }
    Ok(format!(
        "wrote {} lines in {files} files (.txt and .jsonl, field `text`) to {}",
        a.count,
        a.dir.display()
    ))
}
