//! The built-in domain jobs: argument parsing (each domain's settings are
//! its flags, defined once here and read by both the command and the Python
//! package), the pipeline each domain builds, and the run loop.
//!
//! ```text
//! ferrofeed vision DIR --epochs 2 --report-json run.json --dump out/
//! ```
mod audio;
mod remote;
mod report;
mod run;
mod text;
mod vision;

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand, ValueEnum};
use ferrofeed_core::{ErrorPolicy, Parallelism};
use ferrofeed_stages::device::{PinMode, PinnedPool};

#[derive(Parser, Debug)]
#[command(
    name = "ferrofeed",
    version,
    about = "Run, inspect and benchmark ferrofeed input pipelines",
    long_about = "Run, inspect and benchmark ferrofeed input pipelines.\n\nWith no arguments: the vision training pipeline on the embedded default dataset."
)]
struct Cli {
    #[command(subcommand)]
    cmd: Option<Cmd>,
}

#[derive(Subcommand, Debug)]
enum Cmd {
    /// Vision pipeline: ImageFolder (DIR/<class>/<file>) or WebDataset shards (*.tar).
    Vision(Box<vision::VisionArgs>),
    /// Text pipeline: .txt/.jsonl lines → tokens → padded or packed batches.
    Text(Box<text::TextArgs>),
    /// Audio pipeline: files → streamed chunks → spectrogram / mel / log-mel.
    Audio(Box<audio::AudioArgs>),
    /// Pull one sample through every stage and print each stage's components.
    Inspect {
        #[command(subcommand)]
        domain: InspectDomain,
    },
    /// Write a deterministic synthetic dataset.
    MakeDataset {
        #[command(subcommand)]
        domain: MakeDomain,
    },
}

#[derive(Subcommand, Debug)]
enum InspectDomain {
    /// Inspect a vision sample.
    Vision(vision::InspectArgs),
    /// Inspect a text sample.
    Text(InspectArgs<text::TextOpts>),
    /// Inspect an audio chunk.
    Audio(InspectArgs<audio::AudioOpts>),
}

#[derive(Subcommand, Debug)]
enum MakeDomain {
    /// ImageNet-like folder: 10 classes of ~500×375 JPEGs (q90).
    Vision(vision::MakeVisionArgs),
    /// Lines of the embedded corpus in .txt and .jsonl files (1,000 lines each).
    Text(MakeArgs),
    /// Tones, chirps and noise as wav/flac files of varied lengths and rates (`--speech`: and three spoken sentences).
    Audio(audio::MakeArgs),
}

/// `inspect text|audio`: a path, a sample index and the domain's options.
#[derive(Args, Debug, Clone)]
pub struct InspectArgs<O: Args> {
    /// The dataset, as the domain's subcommand takes it; default: the
    /// embedded one.
    pub path: Option<PathBuf>,
    /// Dataset index of the sample (audio: `file × 2^40 + chunk`, as in
    /// `--dump`'s indices, or below 2^40 the N-th chunk in file order).
    #[arg(long)]
    pub index: u64,
    #[command(flatten)]
    pub opts: O,
}

/// Builds an `inspect` pipeline, pulls sample `index` through it and prints
/// every stage.
fn print_inspect(b: ferrofeed_core::PipelineBuilder, index: u64) -> Result<(), run::CliError> {
    let pipeline = b.build().map_err(|e| run::CliError::Usage(e.to_string()))?;
    print!("{}", pipeline.inspect(index, 0)?);
    Ok(())
}

/// `make-dataset`'s `--count`, at least 1.
fn check_count(count: u64) -> Result<(), run::CliError> {
    if count == 0 {
        return Err(run::CliError::Usage("--count must be at least 1".into()));
    }
    Ok(())
}

#[derive(Args, Debug)]
pub struct MakeArgs {
    /// Folder to write.
    pub dir: PathBuf,
    /// Number of samples.
    #[arg(long, default_value_t = 2048)]
    pub count: u64,
    /// Seed of the generator.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
}

/// Where batch buffers live (`--pin`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum PinArg {
    Off,
    Auto,
    Strict,
}

impl PinArg {
    /// Where collate builds batches of `tensors` pooled tensors each, for
    /// `workers` workers: page-locked buffers when pinning applies (a batch
    /// being built per worker, one waiting and two held by the consumer;
    /// past that a batch waits up to 50 ms for a buffer, then takes ordinary
    /// memory), else the heap's recycling pool, which never waits.
    pub fn pool(
        self,
        workers: usize,
        tensors: usize,
    ) -> Result<std::sync::Arc<dyn ferrofeed_core::BufferSource>, run::CliError> {
        let pool = PinnedPool::new(self.mode(), (workers + 3) * tensors.max(1))
            .map_err(|e| run::CliError::Usage(format!("--pin strict: {e}")))?;
        Ok(if pool.is_pinned() {
            std::sync::Arc::new(pool)
        } else {
            ferrofeed_core::BufferPool::for_collate()
        })
    }

    fn mode(self) -> PinMode {
        match self {
            PinArg::Off => PinMode::Off,
            PinArg::Auto => PinMode::Auto,
            PinArg::Strict => PinMode::Strict,
        }
    }
}

/// Events kept in a `--trace` file (about 100 bytes each).
pub const TRACE_EVENTS: usize = 1_000_000;

/// Flags every domain subcommand takes.
#[derive(Args, Debug, Clone)]
pub struct CommonArgs {
    /// Samples per batch.
    #[arg(long, default_value_t = 64)]
    pub batch_size: usize,
    /// Epochs to run (at least 1).
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u64).range(1..))]
    pub epochs: u64,
    /// Seed for shuffling and random transforms; same seed ⇒ bit-identical batches.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Shuffle the order each epoch.
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set, value_name = "true|false")]
    pub shuffle: bool,
    /// Threads per CPU stage: `auto` sizes from the CPUs this process may use.
    #[arg(long, default_value = "auto", value_parser = parse_workers, value_name = "auto|N")]
    pub workers: Parallelism,
    /// Tune worker counts while running (with `--workers auto`): each stage
    /// gets its own pool and a tuner moves threads between them from the
    /// measured CPU and blocked time per sample — for reads that wait on
    /// slow storage. The table shows the counts it ended with.
    #[arg(long)]
    pub autotune: bool,
    /// Byte budget for samples and batches in flight, e.g. 256MiB.
    #[arg(long, value_parser = parse_size, value_name = "SIZE")]
    pub max_bytes_in_flight: Option<usize>,
    /// Error policy: fail, skip, retry:N (then fail) or retry:N:skip.
    #[arg(long, default_value = "fail", value_parser = parse_policy, value_name = "fail|skip|retry:N")]
    pub on_error: ErrorPolicy,
    /// Drop a short last batch.
    #[arg(long, default_value_t = false, action = clap::ArgAction::Set, value_name = "true|false")]
    pub drop_last: bool,
    /// Stop after N batches (over all epochs).
    #[arg(long)]
    pub limit_batches: Option<u64>,
    /// This process's rank (default: $RANK, else $SLURM_PROCID, else 0).
    #[arg(long)]
    pub rank: Option<usize>,
    /// Number of ranks (default: $WORLD_SIZE, else $SLURM_NTASKS, else 1).
    #[arg(long)]
    pub world_size: Option<usize>,
    /// With several ranks, repeat samples from the epoch's start so every
    /// rank gets as many batches as the others (as PyTorch's
    /// DistributedSampler); false: each sample is read by exactly one rank
    /// and counts may differ by one (for consumers that gather all ranks).
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set, value_name = "true|false")]
    pub pad_shards: bool,
    /// At exit, write the resumable position (JSON).
    #[arg(long, value_name = "FILE")]
    pub save_state: Option<PathBuf>,
    /// Continue exactly where a saved state stopped.
    #[arg(long, value_name = "FILE")]
    pub resume: Option<PathBuf>,
    /// Write each batch as .npy files plus DIR/index.json.
    #[arg(long, value_name = "DIR")]
    pub dump: Option<PathBuf>,
    /// Write a Chrome/Perfetto trace (JSON) of every stage's work.
    #[arg(long, value_name = "FILE")]
    pub trace: Option<PathBuf>,
    /// Write a machine-readable run report (JSON).
    #[arg(long, value_name = "FILE")]
    pub report_json: Option<PathBuf>,
    /// Write the run report as one self-contained HTML page (no network):
    /// per-stage table, bottleneck, skipped samples, plots over time.
    #[arg(long, value_name = "FILE")]
    pub report_html: Option<PathBuf>,
    /// No progress bar.
    #[arg(long)]
    pub quiet: bool,
    #[command(flatten)]
    pub remote: remote::RemoteArgs,
}

impl CommonArgs {
    /// The flags every domain shares, applied to a builder: shuffle, seed,
    /// drop-last, shard, error policy, CPUs, byte budget and tracing.
    pub fn configure(
        &self,
        b: ferrofeed_core::PipelineBuilder,
        resources: &ferrofeed_core::Resources,
        cpus: usize,
    ) -> Result<ferrofeed_core::PipelineBuilder, run::CliError> {
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
    pub fn check_outputs(&self) -> Result<(), run::CliError> {
        use run::CliError;
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
                return Err(CliError::Usage(format!(
                    "{flag} {}: is a folder; name a file",
                    path.display()
                )));
            }
            let parent = path.parent().filter(|p| !p.as_os_str().is_empty());
            if let Some(parent) = parent {
                if !parent.is_dir() {
                    return Err(CliError::Usage(format!(
                        "{flag} {}: folder {} does not exist",
                        path.display(),
                        parent.display()
                    )));
                }
                if !writable(parent) {
                    return Err(CliError::Usage(format!(
                        "{flag} {}: folder {} is not writable",
                        path.display(),
                        parent.display()
                    )));
                }
            }
        }
        if let Some(dir) = &c.dump {
            if dir.exists() && !dir.is_dir() {
                return Err(CliError::Usage(format!(
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
                        return Err(CliError::Usage(format!(
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

    /// The shard from the flags, falling back to the environment.
    pub fn shard(&self) -> Result<ferrofeed_core::Shard, run::CliError> {
        let env =
            ferrofeed_core::Shard::from_env().map_err(|e| run::CliError::Usage(e.to_string()))?;
        ferrofeed_core::Shard::new(
            self.rank.unwrap_or(env.rank),
            self.world_size.unwrap_or(env.world_size),
        )
        .map(|s| s.padded(self.pad_shards))
        .map_err(|e| run::CliError::Usage(format!("--rank/--world-size: {e}")))
    }
}

/// Whether this process may create files in `dir`.
fn writable(dir: &std::path::Path) -> bool {
    use std::os::unix::ffi::OsStrExt;
    let Ok(c) = std::ffi::CString::new(dir.as_os_str().as_bytes()) else {
        return false;
    };
    // SAFETY: `c` is a valid NUL-terminated path for the call's length.
    unsafe { libc::access(c.as_ptr(), libc::W_OK | libc::X_OK) == 0 }
}

pub use report::{EpochEntry, Report};
pub use run::{CliError, IndexEntry, Job, RunFigures};

/// How a flag takes its value, for front ends that set flags by name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FlagKind {
    /// Present or absent (`--quiet`).
    Switch,
    /// Takes a value (`--batch-size 64`, `--shuffle false`).
    Value,
}

/// The domains a job can be built for.
pub const DOMAINS: [&str; 3] = ["vision", "text", "audio"];

fn domain_command(domain: &str) -> Option<clap::Command> {
    use clap::CommandFactory;
    let sub = Cli::command()
        .find_subcommand(domain)
        .filter(|_| DOMAINS.contains(&domain))?
        .clone();
    Some(sub)
}

/// The long flags of `domain`'s subcommand and how each takes its value;
/// `None` for an unknown domain.
///
/// ```
/// use ferrofeed::jobs::{flags, FlagKind};
/// let f = flags("vision").unwrap();
/// assert!(f.contains(&("batch-size".to_string(), FlagKind::Value)));
/// assert!(f.contains(&("quiet".to_string(), FlagKind::Switch)));
/// ```
pub fn flags(domain: &str) -> Option<Vec<(String, FlagKind)>> {
    let cmd = domain_command(domain)?;
    Some(
        cmd.get_arguments()
            .filter_map(|a| {
                let long = a.get_long()?.to_string();
                let kind = match a.get_action() {
                    clap::ArgAction::SetTrue | clap::ArgAction::SetFalse => FlagKind::Switch,
                    _ => FlagKind::Value,
                };
                Some((long, kind))
            })
            .filter(|(l, _)| l != "help")
            .collect(),
    )
}

/// The long flags of `domain`'s subcommand whose value is a number (a
/// count, a size in samples, seconds): front ends that take typed values
/// refuse text for them. `None` for an unknown domain.
///
/// ```
/// let n = ferrofeed::jobs::numeric_flags("vision").unwrap();
/// assert!(n.contains(&"batch-size".to_string()));
/// assert!(!n.contains(&"transform".to_string()));
/// assert!(!n.contains(&"max-bytes-in-flight".to_string()), "256MiB is a size");
/// ```
pub fn numeric_flags(domain: &str) -> Option<Vec<String>> {
    use std::any::TypeId;
    let numbers = [
        TypeId::of::<usize>(),
        TypeId::of::<u64>(),
        TypeId::of::<u32>(),
        TypeId::of::<u16>(),
        TypeId::of::<u8>(),
        TypeId::of::<i64>(),
        TypeId::of::<i32>(),
        TypeId::of::<f64>(),
        TypeId::of::<f32>(),
    ];
    let cmd = domain_command(domain)?;
    Some(
        cmd.get_arguments()
            .filter(|a| {
                let id = a.get_value_parser().type_id();
                // Sizes are numbers with units (`256MiB`): text is theirs.
                let size = a
                    .get_value_names()
                    .is_some_and(|n| n.iter().any(|v| v == "SIZE"));
                !size && numbers.iter().any(|n| id == *n)
            })
            .filter_map(|a| a.get_long().map(str::to_string))
            .collect(),
    )
}

/// Why [`build`] made no job.
#[derive(Debug, thiserror::Error)]
pub enum BuildError {
    /// No such domain.
    #[error("unknown domain {0:?}: expected vision, text or audio")]
    Domain(String),
    /// A flag that the domain does not take.
    #[error("{flag}: not a setting of {domain}")]
    Unknown {
        /// The domain.
        domain: String,
        /// The flag as given.
        flag: String,
    },
    /// A flag's value was refused by its parser.
    #[error("{flag}: {message}")]
    Value {
        /// The flag (`--batch-size`).
        flag: String,
        /// Why.
        message: String,
    },
    /// The settings parsed but the job could not be made from them (a
    /// missing path, settings that contradict each other).
    #[error(transparent)]
    Job(#[from] CliError),
}

/// Builds `domain`'s job from its flags, exactly as `ferrofeed DOMAIN
/// [PATH] ARGS…` does (same parsers, defaults and checks).
pub fn build(domain: &str, path: Option<&str>, args: &[String]) -> Result<Job, BuildError> {
    use clap::error::{ContextKind, ContextValue, ErrorKind};
    if !DOMAINS.contains(&domain) {
        return Err(BuildError::Domain(domain.to_string()));
    }
    let mut argv = vec!["ferrofeed".to_string(), domain.to_string()];
    if let Some(p) = path {
        argv.push(p.to_string());
    }
    argv.extend(args.iter().cloned());
    let cli = <Cli as clap::Parser>::try_parse_from(&argv).map_err(|e| {
        let flag = match e.get(ContextKind::InvalidArg) {
            Some(ContextValue::String(s)) => s.split(' ').next().unwrap_or(s).to_string(),
            _ => String::new(),
        };
        let message = e
            .to_string()
            .lines()
            .next()
            .unwrap_or_default()
            .trim_start_matches("error: ")
            .to_string();
        match e.kind() {
            ErrorKind::UnknownArgument => BuildError::Unknown {
                domain: domain.to_string(),
                flag,
            },
            _ => BuildError::Value { flag, message },
        }
    })?;
    Ok(match cli.cmd {
        Some(Cmd::Vision(a)) => vision::build(*a)?,
        Some(Cmd::Text(a)) => text::build(*a)?,
        Some(Cmd::Audio(a)) => audio::build(*a)?,
        _ => return Err(BuildError::Domain(domain.to_string())),
    })
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

fn parse_workers(s: &str) -> Result<Parallelism, String> {
    match s.parse::<Parallelism>()? {
        Parallelism::Fixed(0) => Err("--workers must be at least 1".into()),
        p => Ok(p),
    }
}

fn parse_policy(s: &str) -> Result<ErrorPolicy, String> {
    s.parse()
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

/// Runs the command line; returns the exit status.
pub fn main() -> i32 {
    // Warnings (a fallback, a stuck worker) go to stderr, one line each;
    // --quiet keeps stderr to errors.
    let quiet = std::env::args().any(|a| a == "--quiet");
    let level = if quiet { "error" } else { "warn" };
    let _ = tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_target(false)
        .without_time()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(level)),
        )
        .try_init();
    let cli = Cli::parse();
    let result = match cli.cmd {
        None => vision::run(vision::VisionArgs::default_run()),
        Some(Cmd::Vision(a)) => vision::run(*a),
        Some(Cmd::Text(a)) => text::run(*a),
        Some(Cmd::Audio(a)) => audio::run(*a),
        Some(Cmd::Inspect {
            domain: InspectDomain::Audio(a),
        }) => audio::inspect(a),
        Some(Cmd::MakeDataset {
            domain: MakeDomain::Audio(a),
        }) => audio::make_dataset(&a),
        Some(Cmd::Inspect {
            domain: InspectDomain::Text(a),
        }) => text::inspect(a),
        Some(Cmd::MakeDataset {
            domain: MakeDomain::Text(a),
        }) => text::make_dataset(&a),
        Some(Cmd::Inspect {
            domain: InspectDomain::Vision(a),
        }) => vision::inspect(a),
        Some(Cmd::MakeDataset {
            domain: MakeDomain::Vision(a),
        }) => vision::make_dataset(&a),
    };
    match result {
        Ok(()) => 0,
        Err(e @ run::CliError::Interrupted { .. }) => {
            eprintln!("ferrofeed: {e}");
            e.exit_code()
        }
        Err(e) => {
            eprintln!("error: {e}");
            e.exit_code()
        }
    }
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
    fn the_command_line_is_well_formed() {
        use clap::CommandFactory;
        Cli::command().debug_assert();
    }
}
