//! The settings every domain shares ([`CommonSettings`]), where batch
//! buffers live ([`Pin`]), sizes with units ([`parse_size`]), and the
//! `inspect`/`make-dataset` settings. Each default is the struct's
//! `Default`; the command's flags (feature `cli`) show and use those same
//! values.
//!
//! ```
//! use ferrofeed_jobs::CommonSettings;
//! let c = CommonSettings { batch_size: 32, ..CommonSettings::default() };
//! assert!(c.shuffle && c.epochs == 1);
//! assert_eq!(ferrofeed_jobs::parse_size("256MiB"), Ok(256 << 20));
//! ```
use std::path::{Path, PathBuf};
use std::sync::Arc;

use ferrofeed_core::{ErrorPolicy, Parallelism};
use ferrofeed_stages::device::{PinMode, PinnedPool};
use serde::Deserialize;

use crate::de;
use crate::job::JobError;
use crate::remote::RemoteSettings;

/// Where batch buffers live (`--pin`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[cfg_attr(feature = "cli", derive(clap::ValueEnum))]
#[serde(rename_all = "kebab-case")]
pub enum Pin {
    /// Ordinary memory.
    Off,
    /// Page-locked when a CUDA device is there, else ordinary memory (said
    /// once).
    #[default]
    Auto,
    /// Page-locked, or an error.
    Strict,
}

impl Pin {
    /// Where collate builds batches of `tensors` pooled tensors each, for
    /// `workers` workers: page-locked buffers when pinning applies (a batch
    /// being built per worker, one waiting and two held by the consumer;
    /// past that a batch waits up to 50 ms for a buffer, then takes ordinary
    /// memory), else the heap's recycling pool, which never waits.
    pub fn pool(
        self,
        workers: usize,
        tensors: usize,
    ) -> Result<Arc<dyn ferrofeed_core::BufferSource>, JobError> {
        let pool = PinnedPool::new(self.mode(), (workers + 3) * tensors.max(1))
            .map_err(|e| JobError::Usage(format!("--pin strict: {e}")))?;
        Ok(if pool.is_pinned() {
            Arc::new(pool)
        } else {
            ferrofeed_core::BufferPool::for_collate()
        })
    }

    fn mode(self) -> PinMode {
        match self {
            Pin::Off => PinMode::Off,
            Pin::Auto => PinMode::Auto,
            Pin::Strict => PinMode::Strict,
        }
    }
}

/// Events kept in a `--trace` file (about 100 bytes each).
pub const TRACE_EVENTS: usize = 1_000_000;

/// The settings every domain takes (the command's shared flags; the
/// Python loaders' shared keywords).
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[cfg_attr(feature = "cli", derive(clap::Args))]
#[serde(default, deny_unknown_fields)]
pub struct CommonSettings {
    /// Samples per batch.
    #[cfg_attr(feature = "cli", arg(long, default_value_t = CommonSettings::default().batch_size))]
    pub batch_size: usize,
    /// Epochs to run (at least 1).
    #[cfg_attr(feature = "cli", arg(long, default_value_t = CommonSettings::default().epochs))]
    pub epochs: u64,
    /// Seed for shuffling and random transforms; same seed ⇒ bit-identical batches.
    #[cfg_attr(feature = "cli", arg(long, default_value_t = CommonSettings::default().seed))]
    pub seed: u64,
    /// Shuffle the order each epoch.
    #[cfg_attr(feature = "cli", arg(long, default_value_t = CommonSettings::default().shuffle, action = clap::ArgAction::Set, value_name = "true|false"))]
    pub shuffle: bool,
    /// Threads per CPU stage: `auto` sizes from the CPUs this process may use.
    #[cfg_attr(feature = "cli", arg(long, default_value_t = CommonSettings::default().workers, value_name = "auto|N"))]
    #[serde(deserialize_with = "de::parallelism")]
    pub workers: Parallelism,
    /// Tune worker counts while running (with `--workers auto`): each stage
    /// gets its own pool and a tuner moves threads between them from the
    /// measured CPU and blocked time per sample — for reads that wait on
    /// slow storage. The table shows the counts it ended with.
    #[cfg_attr(feature = "cli", arg(long))]
    pub autotune: bool,
    /// Byte budget for samples and batches in flight, e.g. 256MiB.
    #[cfg_attr(feature = "cli", arg(long, value_parser = parse_size, value_name = "SIZE"))]
    #[serde(deserialize_with = "de::opt_size")]
    pub max_bytes_in_flight: Option<usize>,
    /// Error policy: fail, skip, retry:N (then fail) or retry:N:skip.
    #[cfg_attr(feature = "cli", arg(long, default_value_t = CommonSettings::default().on_error, value_name = "fail|skip|retry:N"))]
    #[serde(deserialize_with = "de::policy")]
    pub on_error: ErrorPolicy,
    /// Drop a short last batch.
    #[cfg_attr(feature = "cli", arg(long, default_value_t = CommonSettings::default().drop_last, action = clap::ArgAction::Set, value_name = "true|false"))]
    pub drop_last: bool,
    /// Stop after N batches (over all epochs).
    #[cfg_attr(feature = "cli", arg(long))]
    pub limit_batches: Option<u64>,
    /// This process's rank (default: $RANK, else $SLURM_PROCID, else 0).
    #[cfg_attr(feature = "cli", arg(long))]
    pub rank: Option<usize>,
    /// Number of ranks (default: $WORLD_SIZE, else $SLURM_NTASKS, else 1).
    #[cfg_attr(feature = "cli", arg(long))]
    pub world_size: Option<usize>,
    /// With several ranks, repeat samples from the epoch's start so every
    /// rank gets as many batches as the others (as PyTorch's
    /// DistributedSampler); false: each sample is read by exactly one rank
    /// and counts may differ by one (for consumers that gather all ranks).
    #[cfg_attr(feature = "cli", arg(long, default_value_t = CommonSettings::default().pad_shards, action = clap::ArgAction::Set, value_name = "true|false"))]
    pub pad_shards: bool,
    /// At exit, write the resumable position (JSON).
    #[cfg_attr(feature = "cli", arg(long, value_name = "FILE"))]
    pub save_state: Option<PathBuf>,
    /// Continue exactly where a saved state stopped.
    #[cfg_attr(feature = "cli", arg(long, value_name = "FILE"))]
    pub resume: Option<PathBuf>,
    /// Write each batch as .npy files plus DIR/index.json.
    #[cfg_attr(feature = "cli", arg(long, value_name = "DIR"))]
    pub dump: Option<PathBuf>,
    /// Write a Chrome/Perfetto trace (JSON) of every stage's work.
    #[cfg_attr(feature = "cli", arg(long, value_name = "FILE"))]
    pub trace: Option<PathBuf>,
    /// Write a machine-readable run report (JSON).
    #[cfg_attr(feature = "cli", arg(long, value_name = "FILE"))]
    pub report_json: Option<PathBuf>,
    /// Write the run report as one self-contained HTML page (no network):
    /// per-stage table, bottleneck, skipped samples, plots over time.
    #[cfg_attr(feature = "cli", arg(long, value_name = "FILE"))]
    pub report_html: Option<PathBuf>,
    /// No progress bar.
    #[cfg_attr(feature = "cli", arg(long))]
    pub quiet: bool,
    /// The settings of datasets given as URLs.
    #[cfg_attr(feature = "cli", command(flatten))]
    #[serde(skip)]
    pub remote: RemoteSettings,
}

impl Default for CommonSettings {
    fn default() -> Self {
        CommonSettings {
            batch_size: 64,
            epochs: 1,
            seed: 0,
            shuffle: true,
            workers: Parallelism::Auto,
            autotune: false,
            max_bytes_in_flight: None,
            on_error: ErrorPolicy::Fail,
            drop_last: false,
            limit_batches: None,
            rank: None,
            world_size: None,
            pad_shards: true,
            save_state: None,
            resume: None,
            dump: None,
            trace: None,
            report_json: None,
            report_html: None,
            quiet: false,
            remote: RemoteSettings::default(),
        }
    }
}

impl CommonSettings {
    /// Refuses settings no run can use, naming the flag: no epochs, no
    /// workers, an empty batch.
    pub fn check(&self) -> Result<(), JobError> {
        if self.epochs == 0 {
            return Err(JobError::Usage("--epochs must be at least 1".into()));
        }
        if self.batch_size == 0 {
            return Err(JobError::Usage("--batch-size must be at least 1".into()));
        }
        check_workers("--workers", self.workers)?;
        self.remote.check()
    }

    /// The settings every domain shares, applied to a builder: shuffle,
    /// seed, drop-last, shard, error policy, CPUs, byte budget and tracing.
    pub fn configure(
        &self,
        b: ferrofeed_core::PipelineBuilder,
        resources: &ferrofeed_core::Resources,
        cpus: usize,
    ) -> Result<ferrofeed_core::PipelineBuilder, JobError> {
        let b = b
            .shuffle(self.shuffle)
            .seed(self.seed)
            .drop_last(self.drop_last)
            .shard(self.shard()?)
            .on_error(self.on_error)
            .cpus(cpus)
            .autotune(self.autotune)
            .max_bytes_in_flight(
                self.max_bytes_in_flight
                    .unwrap_or(resources.default_budget()),
            );
        Ok(if self.trace.is_some() {
            b.trace(TRACE_EVENTS)
        } else {
            b
        })
    }

    /// Refuses, before anything runs, an output file whose folder is
    /// missing or not writable, or that names a folder, and a `--dump`
    /// folder that already holds batches. Each domain's `build` calls it
    /// first, so the command and the Python loaders refuse alike.
    pub fn check_outputs(&self) -> Result<(), JobError> {
        let c = self;
        let files = [
            ("--save-state", &c.save_state),
            ("--trace", &c.trace),
            ("--report-json", &c.report_json),
            ("--report-html", &c.report_html),
        ];
        for (flag, path) in files {
            let Some(path) = path else { continue };
            if path.is_dir() {
                return Err(JobError::Usage(format!(
                    "{flag} {}: is a folder; name a file",
                    path.display()
                )));
            }
            let parent = path.parent().filter(|p| !p.as_os_str().is_empty());
            if let Some(parent) = parent {
                if !parent.is_dir() {
                    return Err(JobError::Usage(format!(
                        "{flag} {}: folder {} does not exist",
                        path.display(),
                        parent.display()
                    )));
                }
                if !writable(parent) {
                    return Err(JobError::Usage(format!(
                        "{flag} {}: folder {} is not writable",
                        path.display(),
                        parent.display()
                    )));
                }
            }
        }
        if let Some(dir) = &c.dump {
            if dir.exists() && !dir.is_dir() {
                return Err(JobError::Usage(format!(
                    "--dump {}: exists and is not a folder",
                    dir.display()
                )));
            }
            if let Ok(entries) = std::fs::read_dir(dir) {
                for e in entries.flatten() {
                    let name = e.file_name();
                    let name = name.to_string_lossy();
                    let file = e.file_type().is_ok_and(|t| t.is_file());
                    if file && (name == "index.json" || name.ends_with(".npy")) {
                        return Err(JobError::Usage(format!(
                            "--dump {}: already holds batches ({name}); name a new or empty folder \
                             so that old and new batches are not mixed",
                            dir.display()
                        )));
                    }
                }
            }
        }
        Ok(())
    }

    /// The shard from the settings, falling back to the environment.
    pub fn shard(&self) -> Result<ferrofeed_core::Shard, JobError> {
        let env = ferrofeed_core::Shard::from_env().map_err(|e| JobError::Usage(e.to_string()))?;
        ferrofeed_core::Shard::new(
            self.rank.unwrap_or(env.rank),
            self.world_size.unwrap_or(env.world_size),
        )
        .map(|s| s.padded(self.pad_shards))
        .map_err(|e| JobError::Usage(format!("--rank/--world-size: {e}")))
    }
}

/// Refuses a worker count of 0 for `flag`.
pub(crate) fn check_workers(flag: &str, p: Parallelism) -> Result<(), JobError> {
    match p {
        Parallelism::Fixed(0) => Err(JobError::Usage(format!("{flag} must be at least 1"))),
        _ => Ok(()),
    }
}

/// Whether this process may create files in `dir`.
fn writable(dir: &Path) -> bool {
    use std::os::unix::ffi::OsStrExt;
    let Ok(c) = std::ffi::CString::new(dir.as_os_str().as_bytes()) else {
        return false;
    };
    // SAFETY: `c` is a valid NUL-terminated path for the call's length.
    unsafe { libc::access(c.as_ptr(), libc::W_OK | libc::X_OK) == 0 }
}

/// Where embedded datasets and caches are written: `$FERROFEED_CACHE_DIR`,
/// else `$XDG_CACHE_HOME/ferrofeed`, else `~/.cache/ferrofeed`.
pub fn cache_dir() -> PathBuf {
    if let Some(d) = std::env::var_os("FERROFEED_CACHE_DIR") {
        return PathBuf::from(d);
    }
    if let Some(d) = std::env::var_os("XDG_CACHE_HOME") {
        return PathBuf::from(d).join("ferrofeed");
    }
    if let Some(h) = std::env::var_os("HOME") {
        return PathBuf::from(h).join(".cache").join("ferrofeed");
    }
    std::env::temp_dir().join("ferrofeed-cache")
}

/// `256MiB`, `1.5GiB`, `100MB`, `4096` → bytes.
pub fn parse_size(s: &str) -> Result<usize, String> {
    let t = s.trim();
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let n: f64 = num
        .parse()
        .map_err(|_| format!("`{s}` is not a size (e.g. 256MiB)"))?;
    let mult: f64 = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1.0,
        "k" | "kb" => 1e3,
        "kib" => 1024.0,
        "m" | "mb" => 1e6,
        "mib" => 1024.0 * 1024.0,
        "g" | "gb" => 1e9,
        "gib" => 1024.0 * 1024.0 * 1024.0,
        "t" | "tb" => 1e12,
        "tib" => 1024f64.powi(4),
        u => return Err(format!("unknown size unit `{u}` in `{s}`")),
    };
    let bytes = n * mult;
    if !(1.0..=usize::MAX as f64).contains(&bytes) {
        return Err(format!("size `{s}` must be at least 1 byte"));
    }
    Ok(bytes as usize)
}

/// A size as [`parse_size`] reads it, or 0 for "off".
pub fn size_or_zero(s: &str) -> Result<usize, String> {
    if s.trim() == "0" {
        Ok(0)
    } else {
        parse_size(s)
    }
}

/// `make-dataset text`: a folder, a sample count and a seed.
#[derive(Debug, Clone)]
#[cfg_attr(feature = "cli", derive(clap::Args))]
pub struct MakeArgs {
    /// Folder to write.
    pub dir: PathBuf,
    /// Number of samples.
    #[cfg_attr(feature = "cli", arg(long, default_value_t = 2048))]
    pub count: u64,
    /// Seed of the generator.
    #[cfg_attr(feature = "cli", arg(long, default_value_t = 0))]
    pub seed: u64,
}

/// `inspect text|audio`: a path, a sample index and the domain's options.
#[derive(Debug, Clone)]
#[cfg_attr(feature = "cli", derive(clap::Args))]
pub struct InspectArgs<O: InspectOptions> {
    /// The dataset, as the domain's subcommand takes it; default: the
    /// embedded one.
    pub path: Option<PathBuf>,
    /// Dataset index of the sample (audio: `file × 2^40 + chunk`, as in
    /// `--dump`'s indices, or below 2^40 the N-th chunk in file order).
    #[cfg_attr(feature = "cli", arg(long))]
    pub index: u64,
    /// The domain's options.
    #[cfg_attr(feature = "cli", command(flatten))]
    pub opts: O,
}

/// A domain's options, as [`InspectArgs`] takes them.
#[cfg(feature = "cli")]
pub trait InspectOptions: clap::Args {}
/// A domain's options, as [`InspectArgs`] takes them.
#[cfg(not(feature = "cli"))]
pub trait InspectOptions {}

/// Builds an `inspect` pipeline, pulls sample `index` through it and
/// returns what each stage made.
pub(crate) fn inspect_text(
    b: ferrofeed_core::PipelineBuilder,
    index: u64,
) -> Result<String, JobError> {
    let pipeline = b.build().map_err(|e| JobError::Usage(e.to_string()))?;
    Ok(pipeline.inspect(index, 0)?.to_string())
}

/// `make-dataset`'s `--count`, at least 1.
pub(crate) fn check_count(count: u64) -> Result<(), JobError> {
    if count == 0 {
        return Err(JobError::Usage("--count must be at least 1".into()));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_parse() {
        assert_eq!(parse_size("256MiB"), Ok(256 << 20));
        assert_eq!(parse_size("1.5KiB"), Ok(1536));
        assert_eq!(parse_size("100MB"), Ok(100_000_000));
        assert_eq!(parse_size("4096"), Ok(4096));
        assert!(parse_size("lots").is_err());
        assert!(parse_size("0").is_err());
        assert!(parse_size("3XB").is_err());
    }

    #[test]
    fn bad_settings_are_refused_by_name() {
        let c = |f: fn(&mut CommonSettings)| {
            let mut c = CommonSettings::default();
            f(&mut c);
            c.check().unwrap_err().to_string()
        };
        assert!(c(|c| c.epochs = 0).contains("--epochs"));
        assert!(c(|c| c.batch_size = 0).contains("--batch-size"));
        assert!(c(|c| c.workers = Parallelism::Fixed(0)).contains("--workers"));
    }
}
