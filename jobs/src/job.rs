//! A built domain job ([`Job`]): its pipeline, the settings it was built
//! from, what the report needs to know of its dataset, and the epoch loop
//! ([`Job::run_epoch`]) that the command and the Python loaders both run.
//!
//! ```no_run
//! use ferrofeed_jobs::{vision, VisionSettings};
//! let job = vision::build(VisionSettings::default())?;
//! let done = job.run_epoch(0, None, false, |batch, _| {
//!     let _ = batch?;
//!     Ok(std::ops::ControlFlow::Continue(()))
//! })?;
//! println!("{} samples", done.summary.samples);
//! # Ok::<(), ferrofeed_jobs::JobError>(())
//! ```
use std::collections::BTreeMap;
use std::ops::ControlFlow;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use ferrofeed_core::{Batch, EpochIter, EpochSummary, Pipeline, PipelineState, SampleError};

use crate::report::{EpochEntry, Report, SkippedEntry};
use crate::CommonSettings;

/// Why a job could not be built or run.
#[derive(Debug, thiserror::Error)]
pub enum JobError {
    /// A sample failed under the `fail` policy (or the pipeline broke).
    #[error("{0}")]
    Sample(#[from] SampleError),
    /// Unusable arguments or dataset.
    #[error("{0}")]
    Usage(String),
    /// A file could not be written or read.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The error.
        source: std::io::Error,
    },
    /// Every sample the run read failed and was skipped: nothing was
    /// delivered (a typo in a field name, the wrong folder).
    #[error("every sample failed: {skipped} skipped and none delivered; the first: {first}")]
    NothingDelivered {
        /// How many were skipped.
        skipped: usize,
        /// The first failure, with its sample and stage.
        first: String,
    },
}

/// What one sample of a domain is, for rates.
pub fn sample_unit(domain: &str) -> &'static str {
    match domain {
        "vision" => "images",
        "text" => "sequences",
        "audio" => "chunks",
        _ => "samples",
    }
}

impl JobError {
    /// An I/O error on `path`.
    pub fn io(path: &Path) -> impl FnOnce(std::io::Error) -> JobError + '_ {
        move |source| JobError::Io {
            path: path.to_path_buf(),
            source,
        }
    }
}

/// One line of `index.json`.
#[derive(Debug, Clone, serde::Serialize)]
pub struct IndexEntry {
    pub index: u64,
    pub path: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub label: Option<i64>,
    /// Audio: the chunk's first sample in its file.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub chunk_start: Option<i64>,
}

/// Sample images as they leave the stages, `(caption, PNG)`, for the HTML
/// report.
pub type StageImagesFn = dyn Fn() -> Vec<(String, Vec<u8>)> + Send + Sync;

/// The `index.json` entries of one delivered batch.
pub type BatchIndexFn = dyn Fn(&ferrofeed_core::Batch) -> Vec<IndexEntry> + Send + Sync;

/// A domain's built job: its pipeline, the settings it was built from, and
/// what the run loop and the report need to know of its dataset. The
/// command runs one with its run loop; the Python package iterates its
/// pipeline.
pub struct Job {
    pub domain: &'static str,
    pub pipeline: Pipeline,
    pub common: CommonSettings,
    /// The dataset's samples in index order, for `--dump`.
    pub index: Box<dyn Fn() -> Result<Vec<IndexEntry>, JobError> + Send + Sync>,
    /// For datasets whose samples are known only as they are made (audio
    /// chunks): the entries of one delivered batch. `--dump`'s `index.json`
    /// then lists every delivered sample, written at the end of the run.
    pub index_of_batch: Option<Box<BatchIndexFn>>,
    pub resources: ferrofeed_core::Resources,
    /// Called after each epoch (text prints its padding waste).
    pub epoch_end: Box<dyn Fn(u64) + Send + Sync>,
    /// Domain figures for the report, given the run's seconds.
    pub extra: Box<dyn Fn(f64) -> BTreeMap<String, serde_json::Value> + Send + Sync>,
    /// For the HTML report: a sample as it leaves each stage, `(stage, PNG)`.
    pub images: Option<Box<StageImagesFn>>,
    /// Called before each epoch runs, with whether another epoch follows
    /// (remote data starts its read-ahead there).
    pub epoch_start: Box<EpochStartFn>,
    /// A remote dataset's downloads, for the report.
    pub remote: Option<Arc<ferrofeed_stages::remote::Remote>>,
    /// Rewrites a local path into what the user gave (a remote dataset read
    /// through local links shows its object URLs).
    pub show_path: Option<Arc<ShowPathFn>>,
    /// For sources read as streams (audio files, streamed shards), what an
    /// item is called (`chunk`): their indices encode a stream position,
    /// so messages name the file and the item instead.
    pub item_name: Option<&'static str>,
}

/// [`Job::epoch_start`].
pub type EpochStartFn = dyn Fn(&Pipeline, u64, bool) + Send + Sync;
/// [`Job::show_path`].
pub type ShowPathFn = dyn Fn(&str) -> String + Send + Sync;

impl Job {
    /// A job with no per-epoch hook and no extra figures.
    pub fn new(
        domain: &'static str,
        pipeline: Pipeline,
        common: CommonSettings,
        index: impl Fn() -> Result<Vec<IndexEntry>, JobError> + Send + Sync + 'static,
        resources: ferrofeed_core::Resources,
    ) -> Self {
        Job {
            domain,
            pipeline,
            common,
            index: Box::new(index),
            index_of_batch: None,
            resources,
            epoch_end: Box::new(|_| {}),
            extra: Box::new(|_| BTreeMap::new()),
            images: None,
            epoch_start: Box::new(|_, _, _| {}),
            remote: None,
            show_path: None,
            item_name: None,
        }
    }

    /// Reports `remote`'s downloads: its figures in the report, its bytes
    /// downloaded per second on the timeline (and the HTML page's plot) and,
    /// with `--trace`, as a counter track.
    pub fn set_remote(&mut self, remote: Arc<ferrofeed_stages::remote::Remote>) {
        self.pipeline
            .meter("bytes downloaded", remote.downloaded_counter());
        self.remote = Some(remote);
    }

    /// Names the dataset in the states this job saves by a digest of
    /// `parts` (its samples' paths and labels, its files…), so that a
    /// state saved on another dataset of the same length is refused.
    pub fn identify<T: std::hash::Hash + ?Sized>(&self, parts: &T) {
        let key = ferrofeed_stages::cache_key(0x6964_6e74, parts);
        let hex: String = key.iter().map(|b| format!("{b:02x}")).collect();
        self.pipeline.set_dataset_id(hex);
    }

    /// `path` as the user should see it (see [`Job::show_path`]).
    pub fn show(&self, path: &str) -> String {
        match &self.show_path {
            Some(f) => f(path),
            None => path.to_string(),
        }
    }

    /// `e` with its path shown as the user gave it.
    pub fn shown_error(&self, mut e: SampleError) -> SampleError {
        e.path = e.path.map(|p| self.show(&p));
        // `file#7` with an encoded index: `file, chunk 7`.
        if let (Some(word), Some(path), Some(_)) = (self.item_name, &e.path, e.index) {
            if let Some((file, n)) = path.rsplit_once('#') {
                if !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()) {
                    e.path = Some(format!("{file}, {word} {n}"));
                    e.index = None;
                }
            }
        }
        e
    }

    /// The dataset's index with paths as the user gave them.
    pub fn shown_index(&self, mut entries: Vec<IndexEntry>) -> Vec<IndexEntry> {
        if self.show_path.is_some() {
            for e in &mut entries {
                e.path = self.show(&e.path);
            }
        }
        entries
    }

    /// The HTML report page of a run's report.
    pub fn report_page(&self, r: &Report) -> ferrofeed_core::ReportPage {
        let mut resources = vec![
            (
                "CPUs available".to_string(),
                format!("{} ({})", r.cpus_available, r.cpu_source),
            ),
            (
                "memory limit".to_string(),
                format!(
                    "{} ({})",
                    crate::report::mib(r.memory_bytes),
                    r.memory_source
                ),
            ),
        ];
        for (k, v) in &r.extra {
            resources.push((k.clone(), v.to_string()));
        }
        ferrofeed_core::ReportPage {
            title: format!("ferrofeed {}", r.domain),
            unit: sample_unit(self.domain).to_string(),
            samples: r.samples,
            batches: r.batches,
            seconds: r.seconds,
            data_stall_seconds: r.data_stall_seconds,
            stages: r.stages.clone(),
            bottleneck: r.bottleneck.clone(),
            timeline: r.timeline.clone(),
            max_bytes_in_flight: r.max_bytes_in_flight,
            peak_bytes_in_flight: r.peak_bytes_in_flight,
            epochs: r
                .epochs
                .iter()
                .map(|e| (e.epoch, e.samples_per_s))
                .collect(),
            skipped: r
                .skipped
                .iter()
                .map(|s| (s.index, s.path.clone(), s.stage.clone(), s.error.clone()))
                .collect(),
            resources,
            images: self.images.as_ref().map(|f| f()).unwrap_or_default(),
        }
    }

    /// The run report from what a run counted.
    pub fn report(&self, run: RunFigures) -> Report {
        let p = &self.pipeline;
        Report {
            domain: self.domain.to_string(),
            samples: run.samples,
            batches: run.batches,
            seconds: run.seconds,
            samples_per_s: run.samples as f64 / run.seconds.max(1e-9),
            skipped: run
                .skipped
                .iter()
                .map(|e| SkippedEntry {
                    index: e.index,
                    path: e.path.as_deref().map(|p| self.show(p)),
                    stage: e.stage.clone(),
                    error: e.kind.to_string(),
                })
                .collect(),
            workers: p
                .workers()
                .into_iter()
                .filter(|(n, _)| n != "source")
                .collect(),
            cpus_available: self.resources.cpus,
            cpu_source: self.resources.cpu_source.clone(),
            memory_bytes: self.resources.memory_bytes,
            memory_source: self.resources.memory_source.clone(),
            peak_bytes_in_flight: p.budget().peak() as u64,
            max_bytes_in_flight: p.budget().max() as u64,
            data_stall_seconds: run.stall_seconds,
            stages: p.stage_reports(),
            bottleneck: p.bottleneck(),
            timeline: p.timeline(),
            epochs: run.epochs,
            extra: {
                let mut m = (self.extra)(run.seconds);
                if let Some(r) = &self.remote {
                    m.insert("remote".to_string(), crate::remote::figures(&r.stats()));
                }
                m
            },
        }
    }
}

/// What a run counted, for [`Job::report`].
#[derive(Debug, Default)]
pub struct RunFigures {
    pub samples: u64,
    pub batches: u64,
    pub seconds: f64,
    pub skipped: Vec<SampleError>,
    pub stall_seconds: f64,
    pub epochs: Vec<EpochEntry>,
}

/// What one epoch of [`Job::run_epoch`] did.
#[derive(Debug, Clone)]
pub struct EpochOutcome {
    /// The epoch, its samples and their rate.
    pub entry: EpochEntry,
    /// The engine's summary (skipped samples, the consumer's wait, …).
    pub summary: EpochSummary,
    /// The state after the last batch handed on.
    pub state: PipelineState,
    /// Whether the caller cut the epoch short.
    pub cut: bool,
}

impl Job {
    /// Runs epoch `epoch` — or, given `resume`, the rest of the epoch it
    /// was saved in — and hands each batch (or the error that ends the
    /// epoch) to `on_batch` with the epoch's iterator (for its
    /// [`state`](EpochIter::state)); `on_batch` says whether to go on.
    /// [`Job::epoch_start`] runs first (`more`: whether another epoch
    /// follows) and [`Job::epoch_end`] after. The command's run loop and
    /// the Python loaders both drive their epochs with it.
    pub fn run_epoch(
        &self,
        epoch: u64,
        resume: Option<&PipelineState>,
        more: bool,
        mut on_batch: impl FnMut(
            Result<Batch, SampleError>,
            &EpochIter<'_>,
        ) -> Result<ControlFlow<()>, JobError>,
    ) -> Result<EpochOutcome, JobError> {
        let p = &self.pipeline;
        let started = Instant::now();
        (self.epoch_start)(p, resume.map_or(epoch, |s| s.epoch), more);
        let mut it = match resume {
            Some(state) => p
                .resume(state)
                .map_err(|err| JobError::Usage(format!("--resume: {err}")))?,
            None => p.epoch(epoch),
        };
        let epoch = resume.map_or(epoch, |s| s.epoch);
        let mut cut = false;
        while let Some(item) = it.next() {
            let item = item.map_err(|e| self.shown_error(e));
            if on_batch(item, &it)?.is_break() {
                cut = true;
                break;
            }
        }
        let seconds = started.elapsed().as_secs_f64();
        let summary = it.summary().clone();
        let state = it.state();
        drop(it);
        (self.epoch_end)(epoch);
        Ok(EpochOutcome {
            entry: EpochEntry {
                epoch,
                samples: summary.samples,
                seconds,
                samples_per_s: summary.samples as f64 / seconds.max(1e-9),
            },
            summary,
            state,
            cut,
        })
    }

    /// Writes the files the settings ask for at a run's end (or, for a
    /// loader, after each epoch): `--save-state` (`state`),
    /// `--report-json`, `--report-html` and `--trace`.
    pub fn write_outputs(&self, report: &Report, state: &PipelineState) -> Result<(), JobError> {
        let c = &self.common;
        if let Some(path) = &c.save_state {
            std::fs::write(path, state.to_json()).map_err(JobError::io(path))?;
        }
        if let (Some(path), Some(json)) = (&c.trace, self.pipeline.trace_json()) {
            std::fs::write(path, json).map_err(JobError::io(path))?;
        }
        if let Some(path) = &c.report_json {
            let json =
                serde_json::to_vec_pretty(report).map_err(|e| JobError::Usage(e.to_string()))?;
            std::fs::write(path, json).map_err(JobError::io(path))?;
        }
        if let Some(path) = &c.report_html {
            std::fs::write(path, self.report_page(report).render()).map_err(JobError::io(path))?;
        }
        Ok(())
    }
}
