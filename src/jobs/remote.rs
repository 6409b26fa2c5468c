//! Remote datasets for the jobs: the `--remote-*` flags, opening a URL
//! given where a PATH is taken, and the report's `remote` figures.
//!
//! ```text
//! AWS_ENDPOINT_URL=http://127.0.0.1:9000 AWS_ALLOW_HTTP=true \
//!   ferrofeed vision s3://bucket/train --remote-cache-size 20GiB --epochs 3
//! ```
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use clap::Args;
use ferrofeed_core::Parallelism;
use ferrofeed_stages::remote::{is_remote, Remote, RemoteOptions, RemoteStats, View};
use serde_json::json;

use super::run::CliError;

/// Flags for datasets given as URLs.
#[derive(Args, Debug, Clone)]
pub struct RemoteArgs {
    /// Local copy of what was downloaded from a URL dataset (default:
    /// `<cache dir>/remote`); several processes may share it.
    #[arg(long, value_name = "DIR")]
    pub remote_cache: Option<PathBuf>,
    /// Cap on the --remote-cache folder; least recently used objects are
    /// evicted.
    #[arg(long, value_parser = super::parse_size, value_name = "SIZE")]
    pub remote_cache_size: Option<usize>,
    /// While epoch e runs, download what epoch e+1 reads first.
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set, value_name = "true|false")]
    pub prefetch: bool,
    /// Parallel downloads: `auto` follows the measured download time and
    /// the rate the pipeline reads objects.
    #[arg(long, default_value = "auto", value_parser = super::parse_workers, value_name = "auto|N")]
    pub download_workers: Parallelism,
    /// Attempts after the first before a download is an error.
    #[arg(long, default_value_t = 5, value_name = "N")]
    pub remote_retries: u32,
    /// Seconds a request may receive nothing before it is cut and retried.
    #[arg(long, default_value_t = 30.0, value_name = "SECONDS")]
    pub remote_timeout: f64,
}

impl RemoteArgs {
    /// The flags' defaults (for `inspect`, which does not take them).
    pub fn defaults() -> Self {
        use clap::Parser;
        #[derive(Parser)]
        struct Wrap {
            #[command(flatten)]
            a: RemoteArgs,
        }
        Wrap::parse_from(["ferrofeed"]).a
    }
}

/// Whether `path` names a remote dataset.
pub fn is_url(path: &Path) -> bool {
    path.to_str().is_some_and(is_remote)
}

/// Lists the remote dataset at `path` under the flags' settings.
pub fn open(path: &Path, a: &RemoteArgs) -> Result<Arc<Remote>, CliError> {
    let url = path.to_str().unwrap_or_default();
    if !(a.remote_timeout > 0.0 && a.remote_timeout.is_finite()) {
        return Err(CliError::Usage(format!(
            "--remote-timeout {}: must be a positive number of seconds",
            a.remote_timeout
        )));
    }
    let mut opts = RemoteOptions::new(
        a.remote_cache
            .clone()
            .unwrap_or_else(|| super::cache_dir().join("remote")),
    );
    opts.cache_bytes = a.remote_cache_size.map(|s| s as u64);
    opts.prefetch = a.prefetch;
    opts.download_workers = match a.download_workers {
        Parallelism::Fixed(n) => Some(n),
        _ => None,
    };
    opts.retries = a.remote_retries;
    opts.stall_timeout = Duration::from_secs_f64(a.remote_timeout);
    Remote::open(url, opts)
        .map(Arc::new)
        .map_err(|e| CliError::Usage(e.to_string()))
}

/// The objects of `remote` whose names end in one of `exts`.
pub fn with_extension(remote: &Remote, exts: &[&str]) -> Vec<usize> {
    remote
        .objects()
        .iter()
        .enumerate()
        .filter(|(_, o)| {
            o.key
                .rsplit_once('.')
                .is_some_and(|(_, x)| exts.iter().any(|e| e.eq_ignore_ascii_case(x)))
        })
        .map(|(i, _)| i)
        .collect()
}

/// Downloads the objects `which` of `remote` and links them under a local
/// folder for readers of local files; an empty selection is an error
/// saying what was looked for.
pub fn materialize(remote: &Remote, which: &[usize], what: &str) -> Result<Arc<View>, CliError> {
    if which.is_empty() {
        return Err(CliError::Usage(format!(
            "{}: no {what} under this prefix",
            remote.url().text
        )));
    }
    let total: u64 = which.iter().map(|&i| remote.objects()[i].size).sum();
    if let Some(cap) = remote.cache().cap() {
        if total > cap {
            tracing::warn!(
                "{}: {total} bytes of objects are larger than --remote-cache-size ({cap} bytes); \
                 this run keeps its own copy of all of them until it ends",
                remote.url().text
            );
        }
    }
    remote
        .materialize(which)
        .map(Arc::new)
        .map_err(|e| CliError::Usage(e.to_string()))
}

/// The report's `remote` object.
pub fn figures(s: &RemoteStats) -> serde_json::Value {
    json!({
        "bytes_downloaded": s.bytes_downloaded,
        "bytes_from_cache": s.bytes_from_cache,
        "requests": s.requests,
        "retries": s.retries,
        "download_seconds": s.download_seconds,
        "download_workers": s.download_workers,
        "download_mb_per_s": if s.download_seconds > 0.0 {
            s.bytes_downloaded as f64 / 1e6 / s.download_seconds
        } else {
            0.0
        },
    })
}

/// A remote dataset read through local links: its downloads and the links.
pub struct Localized {
    pub remote: Arc<Remote>,
    pub view: Arc<View>,
}

/// Lists `path`, downloads every object ending in one of `exts` (what the
/// domain reads, named `what` in errors) and links them locally.
pub fn localize(
    path: &Path,
    r: &RemoteArgs,
    exts: &[&str],
    what: &str,
) -> Result<Localized, CliError> {
    let remote = open(path, r)?;
    let which = with_extension(&remote, exts);
    let view = materialize(&remote, &which, what)?;
    Ok(Localized { remote, view })
}

impl Localized {
    /// Gives `job` the report's `remote` figures and shows object URLs in
    /// its paths.
    pub fn attach(self, job: &mut super::Job) {
        job.set_remote(self.remote);
        let view = self.view;
        job.show_path = Some(Arc::new(move |p: &str| view.to_url(p)));
    }
}
