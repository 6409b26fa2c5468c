//! Exact resume: a small JSON position that lets a crashed or stopped run
//! continue so that "before" followed by "after" equals the uninterrupted
//! stream.
//!
//! The order of an epoch is a pure function of `(seed, epoch, shard)`, so
//! the position is just the epoch and the next batch (or, for an iterable
//! source, the next shard group position and part) — nothing else has to be saved.
//!
//! ```
//! use ferrofeed_core::prelude::*;
//! let p = Pipeline::builder(FnSource::new(20, |i| Ok(i as i64)))
//!     .batch_size(4)
//!     .shuffle(true)
//!     .collate(StackCollate::new().column::<i64>("x"))
//!     .build()
//!     .unwrap();
//! let mut it = p.epoch(0);
//! let first = it.next().unwrap().unwrap();
//! let saved = it.state().to_json();
//! drop(it);
//! let state = ferrofeed_core::PipelineState::from_json(&saved).unwrap();
//! let rest: Vec<Batch> = p.resume(&state).unwrap().map(|b| b.unwrap()).collect();
//! let whole: Vec<Batch> = p.epoch(0).map(|b| b.unwrap()).collect();
//! assert_eq!(first.indices(), whole[0].indices());
//! assert_eq!(rest[0].indices(), whole[1].indices());
//! assert_eq!(rest.len(), 4);
//! ```
use serde::{Deserialize, Serialize};

/// Where an epoch goes on: `major` is the next plan batch (map-style
/// sources) or shard group position (iterable), `minor` the next part of
/// that group (0 for map-style). Saved as `[major, minor]`.
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize,
)]
#[serde(from = "(u64, u64)", into = "(u64, u64)")]
pub struct Position {
    /// Plan batch, or shard group position.
    pub major: u64,
    /// Part of the shard group (iterable sources).
    pub minor: u64,
}

impl Position {
    /// `(major, minor)`.
    pub const fn new(major: u64, minor: u64) -> Self {
        Position { major, minor }
    }
}

impl From<(u64, u64)> for Position {
    fn from((major, minor): (u64, u64)) -> Self {
        Position { major, minor }
    }
}

impl From<Position> for (u64, u64) {
    fn from(p: Position) -> Self {
        (p.major, p.minor)
    }
}

impl PartialEq<(u64, u64)> for Position {
    fn eq(&self, other: &(u64, u64)) -> bool {
        (self.major, self.minor) == *other
    }
}

/// A resumable position.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PipelineState {
    /// Always [`PipelineState::FORMAT`].
    pub format: String,
    /// The seed of the run.
    pub seed: u64,
    /// The epoch to continue.
    pub epoch: u64,
    /// `[next plan batch, 0]` (map-style) or `[shard group position, next part]`
    /// (iterable).
    pub position: Position,
    /// Length of a map-style dataset.
    pub dataset_len: Option<u64>,
    /// Shard count of an iterable dataset.
    pub dataset_shards: Option<u64>,
    /// The rank that saved it.
    pub rank: usize,
    /// The world size it was saved under.
    pub world_size: usize,
    /// Whether ranks were padded to equal counts ([`Shard::pad`](crate::Shard::pad));
    /// written only when off.
    #[serde(default = "yes", skip_serializing_if = "is_yes")]
    pub pad: bool,
    /// Iterable sources: parts short of a batch (a shard group's last) that
    /// were received but not yet delivered, each `[group position, part,
    /// first row]` — they fill the next batch together with the parts that
    /// follow, so resuming reads them again first.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub carry: Vec<(u64, u64, u64)>,
    /// Samples per batch. A position counts batches, so it means other
    /// samples under another batch size. (Absent in states written before
    /// it was recorded: then not checked.)
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub batch_size: Option<u64>,
    /// Whether the run shuffled.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shuffle: Option<bool>,
    /// Whether a short last batch was dropped.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub drop_last: Option<bool>,
    /// Iterable sources: the shuffle buffer's capacity.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shuffle_buffer: Option<u64>,
    /// Iterable sources: shards read together.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub interleave: Option<u64>,
    /// Map-style sources: [`EpochPlan::digest`](crate::sampler::EpochPlan::digest)
    /// of the saved epoch's plan, which any other sampler setting (e.g. a
    /// token budget per batch) changes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub plan: Option<String>,
    /// What the front end that saved the state knows of its dataset's
    /// identity (e.g. a digest of its paths and sizes), checked when both
    /// the state and the resuming pipeline have one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dataset: Option<String>,
}

fn yes() -> bool {
    true
}

fn is_yes(b: &bool) -> bool {
    *b
}

/// Why a state cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ResumeError {
    /// Not JSON, not a state, or a field is missing or of the wrong type.
    #[error("not a ferrofeed state file: {0}")]
    Parse(String),
    /// A field differs from this pipeline's.
    #[error(
        "the state was saved with {field} = {saved}, this run has {current}: refusing to resume \
         (the saved position would mean other samples)"
    )]
    Mismatch {
        /// The field.
        field: &'static str,
        /// Its value in the state.
        saved: String,
        /// This pipeline's value.
        current: String,
    },
    /// The saved position is past the end of its epoch.
    #[error("the state's position {position} is past the end of epoch {epoch} ({end}): refusing to resume")]
    PastEnd {
        /// The epoch.
        epoch: u64,
        /// `[major, minor]` as saved.
        position: String,
        /// What the epoch holds.
        end: String,
    },
}

impl PipelineState {
    /// The format tag written into every state.
    pub const FORMAT: &'static str = "ferrofeed-state-v1";

    /// The state as JSON.
    pub fn to_json(&self) -> String {
        serde_json::to_string_pretty(self).unwrap_or_default()
    }

    /// Parses a state, naming the field at fault.
    pub fn from_json(text: &str) -> Result<PipelineState, ResumeError> {
        let s: PipelineState =
            serde_json::from_str(text).map_err(|e| ResumeError::Parse(e.to_string()))?;
        if s.format != Self::FORMAT {
            return Err(ResumeError::Parse(format!(
                "field `format` is {:?}, expected {:?}",
                s.format,
                Self::FORMAT
            )));
        }
        Ok(s)
    }

    /// Refuses a state whose seed, dataset, shard or batching differ from
    /// `current`, naming the first field that does. Fields the state lacks
    /// (older files) are not checked.
    pub fn check_against(&self, current: &PipelineState) -> Result<(), ResumeError> {
        fn fmt<T: std::fmt::Debug>(v: &T) -> String {
            format!("{v:?}")
        }
        fn opt<T: std::fmt::Display>(v: &Option<T>) -> String {
            v.as_ref().map_or_else(|| "none".to_string(), T::to_string)
        }
        fn saved<T: std::fmt::Display>(
            field: &'static str,
            saved: &Option<T>,
            now: &Option<T>,
        ) -> (&'static str, String, String) {
            if saved.is_none() {
                (field, String::new(), String::new())
            } else {
                (field, opt(saved), opt(now))
            }
        }
        let dataset = if self.dataset.is_some() && current.dataset.is_some() {
            saved("dataset", &self.dataset, &current.dataset)
        } else {
            ("dataset", String::new(), String::new())
        };
        let checks: [(&'static str, String, String); 13] = [
            ("seed", fmt(&self.seed), fmt(&current.seed)),
            (
                "dataset_len",
                opt(&self.dataset_len),
                opt(&current.dataset_len),
            ),
            (
                "dataset_shards",
                opt(&self.dataset_shards),
                opt(&current.dataset_shards),
            ),
            dataset,
            (
                "world_size",
                fmt(&self.world_size),
                fmt(&current.world_size),
            ),
            ("rank", fmt(&self.rank), fmt(&current.rank)),
            ("pad_shards", fmt(&self.pad), fmt(&current.pad)),
            saved("batch_size", &self.batch_size, &current.batch_size),
            saved("shuffle", &self.shuffle, &current.shuffle),
            saved("drop_last", &self.drop_last, &current.drop_last),
            saved(
                "shuffle_buffer",
                &self.shuffle_buffer,
                &current.shuffle_buffer,
            ),
            saved("interleave", &self.interleave, &current.interleave),
            saved("plan", &self.plan, &current.plan),
        ];
        for (field, saved, now) in checks {
            if saved != now {
                return Err(ResumeError::Mismatch {
                    field,
                    saved,
                    current: now,
                });
            }
        }
        Ok(())
    }
}

/// The most bytes [`PipelineState::read`] takes from a state file (a state
/// is a few hundred bytes).
pub const MAX_STATE_BYTES: u64 = 16 << 20;

impl PipelineState {
    /// Reads and parses a state file (at most [`MAX_STATE_BYTES`], a regular
    /// file only), naming the file in the error.
    pub fn read(path: &std::path::Path) -> Result<PipelineState, ResumeError> {
        let bytes = crate::files::read_settings_file(path, MAX_STATE_BYTES)
            .map_err(|e| ResumeError::Parse(format!("{}: {e}", path.display())))?;
        let text = std::str::from_utf8(&bytes)
            .map_err(|e| ResumeError::Parse(format!("{}: not UTF-8 ({e})", path.display())))?;
        PipelineState::from_json(text)
    }
}
