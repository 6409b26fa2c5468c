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
use std::ops::ControlFlow;
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Instant;

use ferrofeed_core::{SampleError, StopHandle};
use ferrofeed_jobs::{print_table, IndexEntry, Job, JobError, RunFigures};

/// Why the command failed.
#[derive(Debug, thiserror::Error)]
pub enum CliError {
    /// The job could not be built or run.
    #[error(transparent)]
    Job(#[from] JobError),
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
    fn usage(message: String) -> CliError {
        CliError::Job(JobError::Usage(message))
    }
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
        let err = |e: std::io::Error| CliError::usage(format!("cannot watch for signals: {e}"));
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
    let json = serde_json::to_vec_pretty(entries).map_err(|e| CliError::usage(e.to_string()))?;
    Ok(std::fs::write(&path, json).map_err(JobError::io(&path))?)
}

/// A rate for the progress bar: `2,389 images/s`, `31.6 chunks/s`,
/// `0.42 sequences/s` (three significant figures, at most two decimals).
fn rate_text(samples: u64, seconds: f64, domain: &str) -> String {
    let r = samples as f64 / seconds.max(1e-9);
    let unit = ferrofeed_jobs::sample_unit(domain);
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

/// Runs the epochs and reports.
pub fn run(job: &Job) -> Result<(), CliError> {
    let c = &job.common;
    let p = &job.pipeline;
    if let Some(dir) = &c.dump {
        std::fs::create_dir_all(dir).map_err(JobError::io(dir))?;
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
                .map_err(|e| CliError::usage(format!("--resume: {e}")))?;
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
    let mut epochs = Vec::new();
    let mut last_state = resume
        .clone()
        .unwrap_or_else(|| p.epoch_state_start(first_epoch));
    for e in first_epoch..c.epochs {
        if c.limit_batches.is_some_and(|l| batches >= l) {
            break;
        }
        let resumed = resume.as_ref().filter(|_| e == first_epoch);
        let done = job.run_epoch(e, resumed, e + 1 < c.epochs, |item, _| {
            let batch = match item {
                Ok(b) => b,
                Err(err) => {
                    if let Some(pb) = &bar {
                        pb.abandon();
                    }
                    return Err(JobError::Sample(err));
                }
            };
            samples += batch.len() as u64;
            if let Some(dir) = &c.dump {
                for (name, t) in batch.columns() {
                    let path = dir.join(format!("{name}_{batches:06}.npy"));
                    std::fs::write(&path, t.to_npy()).map_err(JobError::io(&path))?;
                }
                let idx: Vec<i64> = batch.indices().iter().map(|&i| i as i64).collect();
                let path = dir.join(format!("indices_{batches:06}.npy"));
                let t = ferrofeed_core::Tensor::from_slice(&idx, &[idx.len()]);
                std::fs::write(&path, t.to_npy()).map_err(JobError::io(&path))?;
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
            Ok(if c.limit_batches.is_some_and(|l| batches >= l) {
                ControlFlow::Break(())
            } else {
                ControlFlow::Continue(())
            })
        })?;
        skipped.extend(done.summary.skipped.iter().cloned());
        stall += done.summary.wait_seconds;
        epochs.push(done.entry);
        last_state = done.state;
        if done.cut || done.summary.stopped {
            break;
        }
    }
    let interrupted = signals.received();
    drop(signals);
    let seconds = start.elapsed().as_secs_f64();
    if let (Some(dir), Some(_)) = (&c.dump, &job.index_of_batch) {
        write_index(dir, &job.shown_index(delivered.into_values().collect()))?;
    }
    if let Some(pb) = bar {
        pb.finish_and_clear();
    }
    let nothing_delivered = (samples == 0 && interrupted.is_none())
        .then(|| skipped.first().cloned())
        .flatten()
        .map(|first| JobError::NothingDelivered {
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
    job.write_outputs(&report, &last_state)?;
    if let Some(e) = nothing_delivered {
        return Err(e.into());
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
