//! The run loop: epochs, progress bar, `--limit-batches`, `--dump`, the
//! end-of-run report, and stopping on SIGINT/SIGTERM (the first signal ends
//! the run at the next batch, writes `--save-state` and the report, and
//! exits 130 or 143; a second one exits at once).
//!
//! ```text
//! ferrofeed vision DIR --epochs 2 --limit-batches 10 --dump out/
//! ```
use std::collections::BTreeMap;
use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Instant;

use ferrofeed_core::{Pipeline, SampleError, StopHandle};

use super::report::{print_table, EpochEntry, Report, SkippedEntry};
use super::CommonArgs;

/// Why the command failed.
#[derive(Debug, thiserror::Error)]
pub enum CliError {
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
    /// SIGINT or SIGTERM stopped the run (state and report were written).
    #[error("{message}")]
    Interrupted {
        /// The signal's number (the exit status is 128 + it).
        signal: i32,
        /// What was stopped and what was written.
        message: String,
    },
}

impl CliError {
    /// The process's exit status for this error.
    pub fn exit_code(&self) -> i32 {
        match self {
            CliError::Interrupted { signal, .. } => 128 + signal,
            _ => 1,
        }
    }
}

/// SIGINT and SIGTERM handlers for the length of a run: the first signal
/// sets the pipeline's stop handle (and records which signal it was), a
/// second one exits at once with 128 + its number.
struct Signals {
    which: Arc<AtomicUsize>,
    ids: Vec<signal_hook::SigId>,
}

impl Signals {
    fn watch(stop: &StopHandle) -> Result<Signals, CliError> {
        use signal_hook::consts::{SIGINT, SIGTERM};
        let which = Arc::new(AtomicUsize::new(0));
        let mut ids = Vec::new();
        let err = |e: std::io::Error| CliError::Usage(format!("cannot watch for signals: {e}"));
        for sig in [SIGINT, SIGTERM] {
            // The exit goes first: it fires only once the flag is set, i.e.
            // on the second signal.
            ids.push(
                signal_hook::flag::register_conditional_shutdown(sig, 128 + sig, stop.flag())
                    .map_err(err)?,
            );
            ids.push(
                signal_hook::flag::register_usize(sig, Arc::clone(&which), sig as usize)
                    .map_err(err)?,
            );
            ids.push(signal_hook::flag::register(sig, stop.flag()).map_err(err)?);
        }
        Ok(Signals { which, ids })
    }

    /// The signal that stopped the run, if one did.
    fn received(&self) -> Option<i32> {
        match self.which.load(Ordering::SeqCst) {
            0 => None,
            s => i32::try_from(s).ok(),
        }
    }
}

impl Drop for Signals {
    fn drop(&mut self) {
        for id in self.ids.drain(..) {
            signal_hook::low_level::unregister(id);
        }
    }
}

/// Writes `DIR/index.json`.
fn write_index(dir: &Path, entries: &[IndexEntry]) -> Result<(), CliError> {
    let path = dir.join("index.json");
    let json = serde_json::to_vec_pretty(entries).map_err(|e| CliError::Usage(e.to_string()))?;
    std::fs::write(&path, json).map_err(CliError::io(&path))
}

/// What one sample of a domain is, for rates.
fn sample_unit(domain: &str) -> &'static str {
    match domain {
        "vision" => "images",
        "text" => "sequences",
        "audio" => "chunks",
        _ => "samples",
    }
}

/// A rate for the progress bar: `2,389 images/s`, `31.6 chunks/s`,
/// `0.42 sequences/s` (three significant figures, at most two decimals).
fn rate_text(samples: u64, seconds: f64, domain: &str) -> String {
    let r = samples as f64 / seconds.max(1e-9);
    let unit = sample_unit(domain);
    if r >= 100.0 {
        let n = r.round() as u64;
        let digits = n.to_string();
        let mut grouped = String::new();
        for (i, c) in digits.chars().enumerate() {
            if i > 0 && (digits.len() - i).is_multiple_of(3) {
                grouped.push(',');
            }
            grouped.push(c);
        }
        format!("{grouped} {unit}/s")
    } else if r >= 10.0 {
        format!("{r:.1} {unit}/s")
    } else {
        format!("{r:.2} {unit}/s")
    }
}

fn signal_name(sig: i32) -> &'static str {
    match sig {
        signal_hook::consts::SIGINT => "SIGINT",
        signal_hook::consts::SIGTERM => "SIGTERM",
        _ => "a signal",
    }
}

impl CliError {
    pub fn io(path: &Path) -> impl FnOnce(std::io::Error) -> CliError + '_ {
        move |source| CliError::Io {
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
    pub common: CommonArgs,
    /// The dataset's samples in index order, for `--dump`.
    pub index: Box<dyn Fn() -> Result<Vec<IndexEntry>, CliError> + Send + Sync>,
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
        common: CommonArgs,
        index: impl Fn() -> Result<Vec<IndexEntry>, CliError> + Send + Sync + 'static,
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
                    super::report::mib(r.memory_bytes),
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
                    m.insert("remote".to_string(), super::remote::figures(&r.stats()));
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

/// Runs the epochs and reports.
pub fn run(job: &Job) -> Result<(), CliError> {
    let c = &job.common;
    let p = &job.pipeline;
    if let Some(dir) = &c.dump {
        std::fs::create_dir_all(dir).map_err(CliError::io(dir))?;
        if job.index_of_batch.is_none() {
            write_index(dir, &job.shown_index((job.index)()?))?;
        }
    }
    // Delivered samples by index, when the index is made from the batches.
    let mut delivered: BTreeMap<u64, IndexEntry> = BTreeMap::new();
    let per_epoch = p.epoch_hint(0);
    let mut total = per_epoch.map(|n| n as u64 * c.epochs);
    if let (Some(t), Some(l)) = (total, c.limit_batches) {
        total = Some(t.min(l));
    }
    let bar = if !c.quiet && std::io::stderr().is_terminal() {
        let pb = match total {
            Some(t) => indicatif::ProgressBar::new(t),
            None => indicatif::ProgressBar::new_spinner(),
        };
        pb.set_style(
            indicatif::ProgressStyle::with_template(
                "{spinner} {prefix} [{bar:30}] {pos}/{len} batches  {msg}  eta {eta}",
            )
            .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar())
            .progress_chars("=> "),
        );
        pb.set_prefix(job.domain);
        Some(pb)
    } else {
        None
    };

    let resume = match &c.resume {
        Some(path) => {
            let state = ferrofeed_core::PipelineState::read(path)
                .map_err(|e| CliError::Usage(format!("--resume: {e}")))?;
            Some(state)
        }
        None => None,
    };
    let first_epoch = resume.as_ref().map_or(0, |s| s.epoch);
    let signals = Signals::watch(&p.stop_handle())?;
    p.reset_metrics();
    let start = Instant::now();
    let mut batches = 0u64;
    let mut samples = 0u64;
    let mut skipped: Vec<SampleError> = Vec::new();
    let mut stall = 0.0;
    let mut epochs: Vec<EpochEntry> = Vec::new();
    let mut last_state = resume
        .clone()
        .unwrap_or_else(|| p.epoch_state_start(first_epoch));
    'epochs: for e in first_epoch..c.epochs {
        if c.limit_batches.is_some_and(|l| batches >= l) {
            break 'epochs;
        }
        let epoch_start = Instant::now();
        (job.epoch_start)(p, e, e + 1 < c.epochs);
        let mut it = match (&resume, e == first_epoch) {
            (Some(state), true) => p
                .resume(state)
                .map_err(|err| CliError::Usage(format!("--resume: {err}")))?,
            _ => p.epoch(e),
        };
        let mut stop = false;
        for item in it.by_ref() {
            let batch = match item {
                Ok(b) => b,
                Err(err) => {
                    if let Some(pb) = &bar {
                        pb.abandon();
                    }
                    return Err(CliError::Sample(job.shown_error(err)));
                }
            };
            samples += batch.len() as u64;
            if let Some(dir) = &c.dump {
                for (name, t) in batch.columns() {
                    let path = dir.join(format!("{name}_{batches:06}.npy"));
                    std::fs::write(&path, t.to_npy()).map_err(CliError::io(&path))?;
                }
                let idx: Vec<i64> = batch.indices().iter().map(|&i| i as i64).collect();
                let path = dir.join(format!("indices_{batches:06}.npy"));
                let t = ferrofeed_core::Tensor::from_slice(&idx, &[idx.len()]);
                std::fs::write(&path, t.to_npy()).map_err(CliError::io(&path))?;
                if let Some(of_batch) = &job.index_of_batch {
                    delivered.extend(of_batch(&batch).into_iter().map(|e| (e.index, e)));
                }
            }
            batches += 1;
            if let Some(pb) = &bar {
                pb.set_message(rate_text(
                    samples,
                    start.elapsed().as_secs_f64(),
                    job.domain,
                ));
                pb.inc(1);
            }
            if c.limit_batches.is_some_and(|l| batches >= l) {
                stop = true;
                break;
            }
        }
        skipped.extend(it.summary().skipped.iter().cloned());
        stall += it.summary().wait_seconds;
        let epoch_seconds = epoch_start.elapsed().as_secs_f64();
        epochs.push(EpochEntry {
            epoch: e,
            samples: it.summary().samples,
            seconds: epoch_seconds,
            samples_per_s: it.summary().samples as f64 / epoch_seconds.max(1e-9),
        });
        last_state = it.state();
        let stopped = it.summary().stopped;
        drop(it);
        (job.epoch_end)(e);
        if stop || stopped {
            break 'epochs;
        }
    }
    let interrupted = signals.received();
    drop(signals);
    let seconds = start.elapsed().as_secs_f64();
    if let (Some(dir), Some(_)) = (&c.dump, &job.index_of_batch) {
        write_index(dir, &job.shown_index(delivered.into_values().collect()))?;
    }
    if let Some(path) = &c.save_state {
        std::fs::write(path, last_state.to_json()).map_err(CliError::io(path))?;
    }
    if let (Some(path), Some(json)) = (&c.trace, p.trace_json()) {
        std::fs::write(path, json).map_err(CliError::io(path))?;
    }
    if let Some(pb) = bar {
        pb.finish_and_clear();
    }
    let nothing_delivered = (samples == 0 && interrupted.is_none())
        .then(|| skipped.first().cloned())
        .flatten()
        .map(|first| CliError::NothingDelivered {
            skipped: skipped.len(),
            first: job.shown_error(first).to_string(),
        });
    let report = job.report(RunFigures {
        samples,
        batches,
        seconds,
        skipped,
        stall_seconds: stall,
        epochs,
    });
    print_table(&report);
    if let Some(path) = &c.report_json {
        let json =
            serde_json::to_vec_pretty(&report).map_err(|e| CliError::Usage(e.to_string()))?;
        std::fs::write(path, json).map_err(CliError::io(path))?;
    }
    if let Some(path) = &c.report_html {
        std::fs::write(path, job.report_page(&report).render()).map_err(CliError::io(path))?;
    }
    if let Some(e) = nothing_delivered {
        return Err(e);
    }
    if let Some(signal) = interrupted {
        let saved = match &c.save_state {
            Some(path) => format!(
                "; state saved to {} (--resume it to continue)",
                path.display()
            ),
            None => "; no --save-state given".to_string(),
        };
        return Err(CliError::Interrupted {
            signal,
            message: format!(
                "interrupted by {} after {batches} batches (epoch {}, position [{}, {}]){saved}",
                signal_name(signal),
                last_state.epoch,
                last_state.position.major,
                last_state.position.minor
            ),
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::rate_text;

    #[test]
    fn rates_have_a_unit_and_sensible_precision() {
        assert_eq!(rate_text(316_426, 10_000.0, "audio"), "31.6 chunks/s");
        assert_eq!(rate_text(2_389, 1.0, "vision"), "2,389 images/s");
        assert_eq!(rate_text(1_234_567, 1.0, "text"), "1,234,567 sequences/s");
        assert_eq!(rate_text(42, 100.0, "vision"), "0.42 images/s");
        assert_eq!(rate_text(150, 1.0, "vision"), "150 images/s");
        assert_eq!(rate_text(0, 0.0, "vision"), "0.00 images/s");
    }
}
