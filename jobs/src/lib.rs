//! # ferrofeed-jobs
//!
//! The built-in domain jobs as library code: each domain's settings are one
//! typed struct ([`VisionSettings`], [`TextSettings`], [`AudioSettings`],
//! sharing [`CommonSettings`]) with its defaults and checks; `build` makes
//! the pipeline from it and returns a [`JobError`]; [`Job::run_epoch`] is
//! the epoch loop. The `ferrofeed` command turns its flags into these
//! structs (feature `cli` derives them as clap arguments), the Python
//! package its keywords ([`keywords`]), and a Rust program builds them
//! directly:
//!
//! ```no_run
//! use ferrofeed_jobs::{vision, CommonSettings, VisionSettings};
//! let settings = VisionSettings {
//!     path: Some("train/".into()),
//!     common: CommonSettings { batch_size: 128, ..Default::default() },
//!     ..Default::default()
//! };
//! let job = vision::build(settings)?;
//! for batch in job.pipeline.epoch(0) {
//!     let batch = batch?;
//!     assert!(batch.get("images").is_some());
//! }
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
pub mod audio;
mod de;
mod job;
pub mod keywords;
mod remote;
mod report;
mod settings;
pub mod text;
pub mod vision;

pub use job::{
    BatchIndexFn, EpochOutcome, EpochStartFn, IndexEntry, Job, JobError, RunFigures, ShowPathFn,
    StageImagesFn,
};
pub use remote::RemoteSettings;

/// What names a sample, for a front end's own stages: the component it
/// goes in (`path`, `key`) and the name of the sample at a dataset index.
#[derive(Clone)]
pub struct SampleName {
    /// The component (`"path"` for files, `"key"` for shard members).
    pub component: &'static str,
    /// The name of the sample at an index, when there is one.
    pub of: std::sync::Arc<dyn Fn(u64) -> Option<String> + Send + Sync>,
}
pub use report::{print_table, EpochEntry, Report, SkippedEntry};
pub use settings::{
    cache_dir, parse_size, size_or_zero, CommonSettings, InspectArgs, InspectOptions, MakeArgs,
    Pin, TRACE_EVENTS,
};

pub use job::sample_unit;

pub use audio::AudioSettings;
pub use text::TextSettings;
pub use vision::VisionSettings;
