//! `ferrofeed audio`, `inspect audio` and `make-dataset audio`.
//!
//! ```text
//! ferrofeed audio DIR --chunk-seconds 10 --overlap-seconds 1 --features logmel
//! ```
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::Arc;

use ferrofeed_audio::{
    synth, AudioFiles, Augment, CachedFeatures, DecodeOptions, FeatureCache, FeatureCollate,
    FeatureConfig, FeatureKind, FeatureStage, NonFinite, StreamOptions,
};
use ferrofeed_core::STREAM_POSITION_BITS;
use ferrofeed_core::{Batch, Parallelism, Pipeline, StageOptions};
use serde_json::json;

use crate::job::{IndexEntry, Job, JobError};

#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Deserialize)]
#[cfg_attr(feature = "cli", derive(clap::ValueEnum))]
#[serde(rename_all = "kebab-case")]
pub enum FeaturesArg {
    Waveform,
    Spectrogram,
    Mel,
    Logmel,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Deserialize)]
#[cfg_attr(feature = "cli", derive(clap::ValueEnum))]
#[serde(rename_all = "kebab-case")]
pub enum NonFiniteArg {
    /// A file with NaN or infinite samples fails (under --on-error).
    Error,
    /// NaN and infinite samples become 0 (counted).
    Zero,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Deserialize)]
#[cfg_attr(feature = "cli", derive(clap::ValueEnum))]
#[serde(rename_all = "kebab-case")]
pub enum ChannelsArg {
    /// Average the channels.
    Mono,
    /// Keep every channel.
    Keep,
}

/// The audio job's own settings (chunks, features, augmentation, cache).
#[derive(Debug, Clone, PartialEq, serde::Deserialize)]
#[cfg_attr(feature = "cli", derive(clap::Args))]
#[serde(default, deny_unknown_fields)]
pub struct AudioOptions {
    /// Batch buffers in page-locked memory: `auto` when a CUDA device is
    /// there (else host memory, said once), `strict` (or an error), `off`.
    #[cfg_attr(feature = "cli", arg(long, value_enum, default_value_t = AudioOptions::default().pin))]
    pub pin: crate::Pin,
    /// Target sample rate; other rates are resampled.
    #[cfg_attr(feature = "cli", arg(long, default_value_t = AudioOptions::default().sample_rate))]
    pub sample_rate: u32,
    /// Chunk length in seconds; the last chunk is zero-padded.
    #[cfg_attr(feature = "cli", arg(long, default_value_t = AudioOptions::default().chunk_seconds))]
    pub chunk_seconds: f64,
    /// Seconds shared by consecutive chunks.
    #[cfg_attr(feature = "cli", arg(long, default_value_t = AudioOptions::default().overlap_seconds))]
    pub overlap_seconds: f64,
    /// Random chunk offsets: each epoch, each file's chunks start at one of
    /// K evenly spaced offsets within a chunk step, drawn from the seed, the
    /// epoch and the file (the samples before it are in no chunk that
    /// epoch); 1: every epoch the same chunks. With `--feature-cache` each
    /// offset has its own entry, so once all K are cached no epoch decodes.
    #[cfg_attr(feature = "cli", arg(long, default_value_t = AudioOptions::default().chunk_offsets, value_name = "K"))]
    pub chunk_offsets: u32,
    /// Long files across workers: a WAV or FLAC file of 1 MiB or more
    /// holding at least two segments is read as segments of about S seconds
    /// (whole chunks), each sought to and decoded by any worker; the chunks
    /// equal those of decoding the file whole. 0: each file by one worker.
    #[cfg_attr(feature = "cli", arg(long, default_value_t = AudioOptions::default().segment_seconds, value_name = "S"))]
    pub segment_seconds: f64,
    /// Features to compute.
    #[cfg_attr(feature = "cli", arg(long, value_enum, default_value_t = AudioOptions::default().features))]
    pub features: FeaturesArg,
    /// FFT size (and Hann window length).
    #[cfg_attr(feature = "cli", arg(long, default_value_t = AudioOptions::default().n_fft))]
    pub n_fft: usize,
    /// Samples between frames.
    #[cfg_attr(feature = "cli", arg(long, default_value_t = AudioOptions::default().hop))]
    pub hop: usize,
    /// Mel bands.
    #[cfg_attr(feature = "cli", arg(long, default_value_t = AudioOptions::default().n_mels))]
    pub n_mels: usize,
    /// NaN or infinite samples in a file.
    #[cfg_attr(feature = "cli", arg(long, value_enum, default_value_t = AudioOptions::default().non_finite))]
    pub non_finite: NonFiniteArg,
    /// Keep each file's chunk features on disk here, keyed by the file
    /// (path, size, mtime, a hash of its bytes) and every setting that shapes them; later epochs
    /// and runs read them instead of decoding.
    #[cfg_attr(feature = "cli", arg(long, value_name = "DIR"))]
    pub feature_cache: Option<PathBuf>,
    /// Cap on the feature cache folder; least recently used entries go.
    #[cfg_attr(feature = "cli", arg(long, value_parser = crate::parse_size, value_name = "SIZE", default_value_t = AudioOptions::default().feature_cache_size))]
    #[serde(deserialize_with = "crate::de::size")]
    pub feature_cache_size: usize,
    /// SpecAugment time masks per chunk (after the features, seeded per
    /// sample and epoch).
    #[cfg_attr(feature = "cli", arg(long, default_value_t = AudioOptions::default().time_masks))]
    pub time_masks: usize,
    /// Each time mask is up to this many frames wide (torchaudio's
    /// `time_mask_param`).
    #[cfg_attr(feature = "cli", arg(long, default_value_t = AudioOptions::default().time_mask_width))]
    pub time_mask_width: usize,
    /// SpecAugment frequency masks per chunk.
    #[cfg_attr(feature = "cli", arg(long, default_value_t = AudioOptions::default().freq_masks))]
    pub freq_masks: usize,
    /// Each frequency mask is up to this many bins wide.
    #[cfg_attr(feature = "cli", arg(long, default_value_t = AudioOptions::default().freq_mask_width))]
    pub freq_mask_width: usize,
    /// A random gain per chunk, uniform in ±DB decibels (0: off).
    #[cfg_attr(feature = "cli", arg(long, default_value_t = AudioOptions::default().gain_db, value_name = "DB"))]
    pub gain_db: f32,
    /// `mono`: mix channels (features [N, n_mels, frames]); `keep`: one
    /// plane per channel (features [N, channels, n_mels, frames]; a batch
    /// mixing channel counts fails naming the sample).
    #[cfg_attr(feature = "cli", arg(long, value_enum, default_value_t = AudioOptions::default().channels))]
    pub channels: ChannelsArg,
    /// Files read together, chunk by chunk, so batches mix files and do not
    /// end at every file. `auto`: up to 16, keeping at least eight groups of
    /// files per worker so every worker has files to decode.
    #[cfg_attr(feature = "cli", arg(long, default_value_t = AudioOptions::default().interleave, value_name = "auto|N"))]
    #[serde(deserialize_with = "crate::de::parallelism")]
    pub interleave: Parallelism,
}

impl Default for AudioOptions {
    fn default() -> Self {
        AudioOptions {
            pin: crate::Pin::Auto,
            sample_rate: 16000,
            chunk_seconds: 10.0,
            overlap_seconds: 0.0,
            chunk_offsets: 1,
            segment_seconds: ferrofeed_audio::DEFAULT_SEGMENT_SECONDS,
            features: FeaturesArg::Logmel,
            n_fft: 400,
            hop: 160,
            n_mels: 80,
            non_finite: NonFiniteArg::Error,
            feature_cache: None,
            feature_cache_size: 8 << 30,
            time_masks: 0,
            time_mask_width: 0,
            freq_masks: 0,
            freq_mask_width: 0,
            gain_db: 0.0,
            channels: ChannelsArg::Mono,
            interleave: Parallelism::Auto,
        }
    }
}

impl crate::settings::InspectOptions for AudioOptions {}

/// Everything the audio job is built from: the files, the audio settings
/// and the shared ones.
#[derive(Debug, Clone, Default, PartialEq)]
#[cfg_attr(feature = "cli", derive(clap::Args))]
pub struct AudioSettings {
    /// A folder of audio files (wav, flac, mp3, ogg), recursively; default: the embedded dataset.
    pub path: Option<PathBuf>,
    /// The audio settings.
    #[cfg_attr(feature = "cli", command(flatten))]
    pub audio: AudioOptions,
    /// The settings every domain shares.
    #[cfg_attr(feature = "cli", command(flatten))]
    pub common: crate::CommonSettings,
}

#[derive(Debug)]
#[cfg_attr(feature = "cli", derive(clap::Args))]
pub struct MakeArgs {
    /// Folder to write.
    pub dir: PathBuf,
    /// Number of files.
    #[cfg_attr(feature = "cli", arg(long, default_value_t = 40))]
    pub count: u64,
    /// Seed of the generator.
    #[cfg_attr(feature = "cli", arg(long, default_value_t = 0))]
    pub seed: u64,
    /// Shortest file, seconds.
    #[cfg_attr(feature = "cli", arg(long, default_value_t = 3.0))]
    pub min_seconds: f64,
    /// Longest file, seconds.
    #[cfg_attr(feature = "cli", arg(long, default_value_t = 30.0))]
    pub max_seconds: f64,
    /// Also write the three embedded espeak-ng sentences (22.05 kHz mono
    /// FLAC, 4.5–6.7 s) beside the COUNT synthetic files.
    #[cfg_attr(feature = "cli", arg(long))]
    pub speech: bool,
    /// One sample rate for every file (default: 8, 16, 22.05, 44.1, 48 kHz in turn).
    #[cfg_attr(feature = "cli", arg(long))]
    pub rate: Option<u32>,
    /// File formats.
    #[cfg_attr(feature = "cli", arg(long, value_enum, default_value = "mixed"))]
    pub format: FormatArg,
    /// Channels of every file (default: every third file stereo).
    #[cfg_attr(feature = "cli", arg(long))]
    pub channels: Option<usize>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Deserialize)]
#[cfg_attr(feature = "cli", derive(clap::ValueEnum))]
#[serde(rename_all = "kebab-case")]
pub enum FormatArg {
    /// 16-bit WAV, FLAC and float WAV in turn.
    Mixed,
    /// 16-bit WAV.
    Wav,
    /// 16-bit FLAC.
    Flac,
}

/// Files in the embedded default dataset.
const DEFAULT_COUNT: usize = 40;

fn default_dataset(quiet: bool) -> Result<PathBuf, JobError> {
    let dir = crate::cache_dir().join(format!("audio-synth-v2-seed0-n{DEFAULT_COUNT}"));
    if !dir.join(".complete").exists() {
        if !quiet {
            eprintln!(
                "generating the default audio dataset ({DEFAULT_COUNT} synthetic files, 3–30 s, and {} spoken sentences) into {} …",
                synth::SPEECH.len(),
                dir.display()
            );
        }
        synth::write_dataset(&dir, DEFAULT_COUNT, 0, 3.0..30.0).map_err(JobError::io(&dir))?;
        synth::write_speech(&dir).map_err(JobError::io(&dir))?;
        let done = dir.join(".complete");
        std::fs::write(&done, b"").map_err(JobError::io(&done))?;
    }
    Ok(dir)
}

fn kind(f: FeaturesArg) -> FeatureKind {
    match f {
        FeaturesArg::Waveform => FeatureKind::Waveform,
        FeaturesArg::Spectrogram => FeatureKind::Spectrogram,
        FeaturesArg::Mel => FeatureKind::Mel,
        FeaturesArg::Logmel => FeatureKind::LogMel,
    }
}

/// `--interleave auto`: up to 16 shards per group, keeping at least eight
/// groups per worker so every worker has files to decode — but 1 when no
/// shard holds more than a batch's share of such a group (`longest`
/// chunks, see [`AudioFiles::longest_shard`]). A group that fits in one
/// batch adds no file to any batch: short groups are merged into batches
/// whole, so a batch spans about `batch / longest` files either way, while
/// one-file groups start the epoch sooner and end it more evenly (a group
/// is decoded in order, by one worker).
fn auto_interleave(shards: usize, longest: Option<u64>, batch: usize, workers: usize) -> usize {
    let cap = (shards / (8 * workers).max(1)).clamp(1, 16);
    match longest {
        Some(n) if (cap as u64).saturating_mul(n) <= batch as u64 => 1,
        _ => cap,
    }
}

fn open(
    path: &Option<PathBuf>,
    o: &AudioOptions,
    quiet: bool,
    r: &crate::remote::RemoteSettings,
) -> Result<(AudioFiles, Option<crate::remote::Localized>), JobError> {
    let dir = match path {
        Some(p) => p.clone(),
        None => default_dataset(quiet)?,
    };
    let opts = StreamOptions {
        sample_rate: o.sample_rate,
        chunk_seconds: o.chunk_seconds,
        overlap_seconds: o.overlap_seconds,
        chunk_offsets: o.chunk_offsets,
        segment_seconds: o.segment_seconds,
        keep_channels: o.channels == ChannelsArg::Keep,
        decode: DecodeOptions {
            non_finite: match o.non_finite {
                NonFiniteArg::Error => NonFinite::Error,
                NonFiniteArg::Zero => NonFinite::Zero,
            },
        },
    };
    if crate::remote::is_url(&dir) {
        let local =
            crate::remote::localize(&dir, r, ferrofeed_audio::AUDIO_EXTENSIONS, "audio objects")?;
        let files = AudioFiles::from_files(local.view.paths().to_vec(), opts)
            .map_err(|e| JobError::Usage(e.to_string()))?;
        return Ok((files, Some(local)));
    }
    AudioFiles::scan(&dir, opts)
        .map(|f| (f, None))
        .map_err(|e| JobError::Usage(e.to_string()))
}

/// The augmentation the flags ask for, or `None` when they ask for none.
fn augment(o: &AudioOptions) -> Result<Option<Augment>, JobError> {
    let a = Augment {
        time_masks: o.time_masks,
        time_mask_width: o.time_mask_width,
        freq_masks: o.freq_masks,
        freq_mask_width: o.freq_mask_width,
        gain_db: o.gain_db,
        kind: kind(o.features),
    };
    a.validate().map_err(JobError::Usage)?;
    Ok((!a.is_off()).then_some(a))
}

/// The features — computed by a stage, or through the feature cache by the
/// source — then the augmentation when one is asked for.
fn with_stages(
    files: AudioFiles,
    (features, aug): (FeatureStage, Option<Augment>),
    opts: StageOptions,
    cache: Option<&Arc<FeatureCache>>,
) -> ferrofeed_core::PipelineBuilder {
    let b = match cache {
        Some(c) => Pipeline::builder_iterable(CachedFeatures::new(files, features, Arc::clone(c))),
        None => Pipeline::builder_iterable(files).stage_with("features", opts, features),
    };
    match aug {
        Some(a) => b.stage_with("augment", opts, a),
        None => b,
    }
}

/// The feature cache the flags ask for.
fn feature_cache(o: &AudioOptions) -> Result<Option<Arc<FeatureCache>>, JobError> {
    match &o.feature_cache {
        None => Ok(None),
        Some(dir) => FeatureCache::open(dir, o.feature_cache_size as u64)
            .map(Some)
            .map_err(|e| JobError::Usage(format!("--feature-cache {}: {e}", dir.display()))),
    }
}

fn stage(o: &AudioOptions) -> Result<FeatureStage, JobError> {
    let cfg = FeatureConfig {
        sample_rate: o.sample_rate,
        n_fft: o.n_fft,
        hop: o.hop,
        n_mels: o.n_mels,
        ..FeatureConfig::default()
    };
    FeatureStage::new(cfg, kind(o.features)).map_err(|e| JobError::Usage(e.to_string()))
}

/// `index.json` entries of a delivered batch: one per chunk, with its
/// file's path and its first sample there (`files`: each shard's file).
fn chunk_entries(files: &[PathBuf], batch: &Batch) -> Vec<IndexEntry> {
    let starts = batch
        .get("chunk_starts")
        .and_then(|t| t.as_slice::<i64>().ok())
        .unwrap_or(&[]);
    batch
        .indices()
        .iter()
        .enumerate()
        .map(|(row, &index)| {
            let shard = (index >> STREAM_POSITION_BITS) as usize;
            IndexEntry {
                index,
                path: files
                    .get(shard)
                    .map(|p| p.display().to_string())
                    .unwrap_or_default(),
                label: None,
                chunk_start: starts.get(row).copied(),
            }
        })
        .collect()
}

/// What follows the features (and augmentation) in place of the feature
/// collate (stages of a front end's own and its collate).
pub type Tail = Box<
    dyn FnOnce(
            ferrofeed_core::PipelineBuilder,
            crate::SampleName,
        ) -> Result<ferrofeed_core::PipelineBuilder, JobError>
        + Send,
>;

/// The audio job `a` describes.
pub fn build(a: AudioSettings) -> Result<Job, JobError> {
    build_with(a, None)
}

/// The audio job `a` describes, with `tail` (when given) after the
/// features and augmentation instead of the feature collate: the same
/// chunks, order and features reach it.
pub fn build_with(a: AudioSettings, tail: Option<Tail>) -> Result<Job, JobError> {
    let c = &a.common;
    c.check()?;
    crate::settings::check_workers("--interleave", a.audio.interleave)?;
    let resources = ferrofeed_core::Resources::detect();
    for w in &resources.warnings {
        tracing::warn!("{w}: falling back");
    }
    let cpus = resources.workers();
    // Everything the flags can get wrong is refused before any file is read.
    let stages = (stage(&a.audio)?, augment(&a.audio)?);
    c.check_outputs()?;
    let (files, local) = open(&a.path, &a.audio, c.quiet, &c.remote)?;
    // Each shard's file (a long file's segments share it).
    let paths: Vec<PathBuf> = files.shard_paths();
    let file_count = files.files().len();
    let read = files.samples_read();
    let interleave = match a.audio.interleave {
        Parallelism::Fixed(n) => n,
        Parallelism::Auto => auto_interleave(
            paths.len(),
            files.longest_shard(),
            c.batch_size,
            c.workers.resolve(cpus),
        ),
    };
    let opts = StageOptions::new().workers(c.workers);
    let cache = feature_cache(&a.audio)?;
    let b = with_stages(files, stages, opts, cache.as_ref())
        .batch_size(c.batch_size)
        .interleave(interleave);
    let b = match tail {
        None => {
            b.collate(FeatureCollate::new().buffers(a.audio.pin.pool(c.workers.resolve(cpus), 1)?))
        }
        Some(tail) => {
            // Each chunk's file, from the shard its index encodes.
            let files = Arc::new(paths.clone());
            let name = crate::SampleName {
                component: "path",
                of: Arc::new(move |i| {
                    let shard = usize::try_from(i >> STREAM_POSITION_BITS).ok()?;
                    Some(files.get(shard)?.display().to_string())
                }),
            };
            tail(b, name)?
        }
    };
    let mut b = c.configure(b, &resources, cpus)?;
    let budget = c.max_bytes_in_flight.unwrap_or(resources.default_budget());
    if c.shuffle {
        // Mixes the chunks of the files open at once. The buffer sits before
        // the byte budget's accounting, so it gets at most a quarter of it.
        let chunk_bytes = (a.audio.chunk_seconds * f64::from(a.audio.sample_rate) * 4.0).max(1.0);
        let items = ((budget as f64 / 4.0) / chunk_bytes).clamp(1.0, 256.0) as usize;
        b = b.shuffle_buffer(items);
    }
    let pipeline = b.build().map_err(|e| JobError::Usage(e.to_string()))?;
    let index = || Ok(Vec::new());
    let paths = Arc::new(paths);
    let batch_paths = Arc::clone(&paths);
    let of_batch = move |b: &Batch| chunk_entries(&batch_paths, b);
    let rate = f64::from(a.audio.sample_rate);
    let extra = move |seconds: f64| {
        let audio_s = read.load(Ordering::Relaxed) as f64 / rate;
        let mut m = BTreeMap::new();
        m.insert("audio_seconds".to_string(), json!(audio_s));
        m.insert(
            "audio_seconds_per_s".to_string(),
            json!(audio_s / seconds.max(1e-9)),
        );
        m.insert("files".to_string(), json!(file_count));
        if let Some(fc) = &cache {
            m.insert("feature_cache_hits".to_string(), json!(fc.folder().hits()));
            m.insert(
                "feature_cache_misses".to_string(),
                json!(fc.folder().misses()),
            );
            m.insert(
                "feature_cache_bytes_read".to_string(),
                json!(fc.folder().bytes_read()),
            );
            m.insert(
                "feature_cache_bytes_written".to_string(),
                json!(fc.folder().bytes_written()),
            );
        }
        m
    };
    let mut job = Job::new("audio", pipeline, a.common.clone(), index, resources);
    job.identify(&*paths);
    job.item_name = Some("chunk");
    job.extra = Box::new(extra);
    job.index_of_batch = Some(Box::new(of_batch));
    if let Some(l) = local {
        l.attach(&mut job);
    }
    Ok(job)
}

/// `inspect audio`: pulls chunk `a.index` through every stage and returns
/// what each made.
pub fn inspect(a: crate::InspectArgs<AudioOptions>) -> Result<String, JobError> {
    let (files, _local) = open(
        &a.path,
        &a.opts,
        false,
        &crate::remote::RemoteSettings::default(),
    )?;
    let stages = (stage(&a.opts)?, augment(&a.opts)?);
    let pipeline = with_stages(
        files,
        stages,
        StageOptions::new().workers(Parallelism::Fixed(1)),
        None,
    )
    .shuffle(false)
    .collate(FeatureCollate::new());
    crate::settings::inspect_text(pipeline, a.index)
}

/// `make-dataset audio`: writes the synthetic audio files; returns what it
/// wrote.
pub fn make_dataset(a: &MakeArgs) -> Result<String, JobError> {
    crate::settings::check_count(a.count)?;
    if !(a.min_seconds > 0.0 && a.max_seconds >= a.min_seconds) {
        return Err(JobError::Usage(
            "need 0 < --min-seconds ≤ --max-seconds".into(),
        ));
    }
    let t = std::time::Instant::now();
    if a.rate.is_some_and(|r| !(1000..=192_000).contains(&r)) {
        return Err(JobError::Usage("--rate must be within 1–192 kHz".into()));
    }
    if a.channels.is_some_and(|c| !(1..=8).contains(&c)) {
        return Err(JobError::Usage("--channels must be 1 to 8".into()));
    }
    let opts = synth::SynthOptions {
        seconds: a.min_seconds..a.max_seconds,
        rate: a.rate,
        format: match a.format {
            FormatArg::Mixed => synth::Format::Mixed,
            FormatArg::Wav => synth::Format::Wav,
            FormatArg::Flac => synth::Format::Flac,
        },
        channels: a.channels,
    };
    let mut files = synth::write_dataset_with(&a.dir, a.count as usize, a.seed, &opts)
        .map_err(JobError::io(&a.dir))?;
    if a.speech {
        files.extend(synth::write_speech(&a.dir).map_err(JobError::io(&a.dir))?);
    }
    let bytes: u64 = files
        .iter()
        .filter_map(|p: &PathBuf| std::fs::metadata(Path::new(p)).ok())
        .map(|m| m.len())
        .sum();
    Ok(format!(
        "wrote {} files ({:.1} MiB: wav 16-bit and float, flac; 8–48 kHz; mono and stereo{}) to {} in {:.1} s",
        files.len(),
        bytes as f64 / (1024.0 * 1024.0),
        if a.speech { "; speech" } else { "" },
        a.dir.display(),
        t.elapsed().as_secs_f64()
    ))
}

#[cfg(test)]
mod tests {
    use super::auto_interleave;

    #[test]
    fn auto_interleave_groups_files_only_where_a_group_outgrows_a_batch() {
        // 40 files of at most 6 chunks, 2 workers, batch 64: groups of 2
        // would still fit a batch, so one file per group.
        assert_eq!(auto_interleave(40, Some(6), 64, 2), 1);
        // Long shards: a group of 2 holds more than a batch, and mixes.
        assert_eq!(auto_interleave(40, Some(40), 64, 2), 2);
        // Lengths unknown (files not split, or MP3s): as before.
        assert_eq!(auto_interleave(40, None, 64, 2), 2);
        assert_eq!(auto_interleave(4_000, Some(6), 64, 2), 16);
        assert_eq!(auto_interleave(4_000, Some(4), 64, 2), 1);
        assert_eq!(auto_interleave(3, Some(100), 64, 8), 1);
    }
}
