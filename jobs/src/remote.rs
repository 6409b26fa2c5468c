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

use ferrofeed_core::Parallelism;
use ferrofeed_stages::remote::{is_remote, Remote, RemoteOptions, RemoteStats, View};
use serde_json::json;

use crate::job::JobError;

/// Settings for datasets given as URLs.
#[derive(Debug, Clone, PartialEq, serde::Deserialize)]
#[cfg_attr(feature = "cli", derive(clap::Args))]
#[serde(default, deny_unknown_fields)]
pub struct RemoteSettings {
    /// Local copy of what was downloaded from a URL dataset (default:
    /// `<cache dir>/remote`); several processes may share it.
    #[cfg_attr(feature = "cli", arg(long, value_name = "DIR"))]
    pub remote_cache: Option<PathBuf>,
    /// Cap on the --remote-cache folder; least recently used objects are
    /// evicted.
    #[cfg_attr(feature = "cli", arg(long, value_parser = crate::parse_size, value_name = "SIZE"))]
    #[serde(deserialize_with = "crate::de::opt_size")]
    pub remote_cache_size: Option<usize>,
    /// While epoch e runs, download what epoch e+1 reads first.
    #[cfg_attr(feature = "cli", arg(long, default_value_t = RemoteSettings::default().prefetch, action = clap::ArgAction::Set, value_name = "true|false"))]
    pub prefetch: bool,
    /// Parallel downloads: `auto` follows the measured download time and
    /// the rate the pipeline reads objects.
    #[cfg_attr(feature = "cli", arg(long, default_value_t = RemoteSettings::default().download_workers, value_name = "auto|N"))]
    #[serde(deserialize_with = "crate::de::parallelism")]
    pub download_workers: Parallelism,
    /// Attempts after the first before a download is an error.
    #[cfg_attr(feature = "cli", arg(long, default_value_t = RemoteSettings::default().remote_retries, value_name = "N"))]
    pub remote_retries: u32,
    /// Seconds a request may receive nothing before it is cut and retried.
    #[cfg_attr(feature = "cli", arg(long, default_value_t = RemoteSettings::default().remote_timeout, value_name = "SECONDS"))]
    pub remote_timeout: f64,
}

impl Default for RemoteSettings {
    fn default() -> Self {
        RemoteSettings {
            remote_cache: None,
            remote_cache_size: None,
            prefetch: true,
            download_workers: Parallelism::Auto,
            remote_retries: 5,
            remote_timeout: 30.0,
        }
    }
}

impl RemoteSettings {
    /// Refuses a download worker count of 0 and a timeout that is not a
    /// positive number of seconds.
    pub fn check(&self) -> Result<(), JobError> {
        crate::settings::check_workers("--download-workers", self.download_workers)?;
        if !(self.remote_timeout > 0.0 && self.remote_timeout.is_finite()) {
            return Err(JobError::Usage(format!(
                "--remote-timeout {}: must be a positive number of seconds",
                self.remote_timeout
            )));
        }
        Ok(())
    }
}

/// Whether `path` names a remote dataset.
pub fn is_url(path: &Path) -> bool {
    path.to_str().is_some_and(is_remote)
}

/// Lists the remote dataset at `path` under the flags' settings.
pub fn open(path: &Path, a: &RemoteSettings) -> Result<Arc<Remote>, JobError> {
    let url = path.to_str().unwrap_or_default();
    if !(a.remote_timeout > 0.0 && a.remote_timeout.is_finite()) {
        return Err(JobError::Usage(format!(
            "--remote-timeout {}: must be a positive number of seconds",
            a.remote_timeout
        )));
    }
    let mut opts = RemoteOptions::new(
        a.remote_cache
            .clone()
            .unwrap_or_else(|| crate::cache_dir().join("remote")),
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
        .map_err(|e| JobError::Usage(e.to_string()))
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
pub fn materialize(remote: &Remote, which: &[usize], what: &str) -> Result<Arc<View>, JobError> {
    if which.is_empty() {
        return Err(JobError::Usage(format!(
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
        .map_err(|e| JobError::Usage(e.to_string()))
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
    r: &RemoteSettings,
    exts: &[&str],
    what: &str,
) -> Result<Localized, JobError> {
    let remote = open(path, r)?;
    let which = with_extension(&remote, exts);
    let view = materialize(&remote, &which, what)?;
    Ok(Localized { remote, view })
}

impl Localized {
    /// Gives `job` the report's `remote` figures and shows object URLs in
    /// its paths.
    pub fn attach(self, job: &mut crate::Job) {
        job.set_remote(self.remote);
        let view = self.view;
        job.show_path = Some(Arc::new(move |p: &str| view.to_url(p)));
    }
}
