//! Datasets in object storage: S3 (and S3-compatible servers), GCS, Azure
//! and HTTP through `object_store`, on one small async runtime owned by the
//! reader (the engine stays threads).
//!
//! - [`RemoteUrl`] parses `s3://`, `gs://`, `az://`, `http(s)://` and builds
//!   the store from the usual environment (`AWS_ENDPOINT_URL`, …).
//! - [`ObjectCache`] is the local copy: atomic entries keyed by URL, size
//!   and ETag, shared by processes through lock files, LRU under a cap.
//! - [`Remote`] lists a prefix, downloads (parallel, retried with backoff,
//!   cut after a stall), reads ahead in the epoch's order
//!   ([`Remote::schedule`]), `climb`s to the number of parallel downloads
//!   that the measured rate rewards, and keeps the report's figures
//!   ([`RemoteStats`]).
//! - [`Download`] is the stage `ObjectKey → Bytes`; [`RemoteFiles`] the
//!   map-style source of `(ObjectKey, Label)` over listed objects.
//!
//! ```no_run
//! use std::sync::Arc;
//! use ferrofeed_stages::remote::{Remote, RemoteFiles, RemoteOptions};
//! let remote = Arc::new(Remote::open("s3://bucket/train", RemoteOptions::new("/tmp/c".into())).unwrap());
//! let items: Vec<(usize, i64)> = (0..remote.objects().len()).map(|i| (i, 0)).collect();
//! let source = RemoteFiles::new(Arc::clone(&remote), items);
//! ```
mod cache;
mod climb;
mod fetch;
mod source;
mod stream;
mod url;

pub use cache::ObjectCache;
pub use fetch::{Remote, RemoteObject, RemoteOptions, RemoteStats, View};
pub use source::{Download, ObjectKey, RemoteFiles};
pub use url::{is_remote, RemoteUrl, Scheme};

pub(crate) use ferrofeed_core::BoxError;

/// Why a remote dataset cannot be read.
#[derive(Debug, thiserror::Error)]
pub enum RemoteError {
    /// The URL or the store's configuration is unusable.
    #[error("{url}: {message}")]
    Url {
        /// The URL.
        url: String,
        /// What.
        message: String,
    },
    /// Listing failed after every retry.
    #[error("{url}: listing failed: {message}")]
    List {
        /// The URL.
        url: String,
        /// The last error.
        message: String,
    },
    /// Nothing under the prefix.
    #[error("{url}: no objects under this prefix")]
    Empty {
        /// The URL.
        url: String,
    },
    /// A download failed after every retry.
    #[error("{url}: download failed after {attempts} attempt(s): {message}")]
    Download {
        /// The object's URL.
        url: String,
        /// Attempts made.
        attempts: u32,
        /// The last error.
        message: String,
    },
    /// The cache folder cannot be used.
    #[error("{dir}: remote cache: {message}")]
    Cache {
        /// The folder.
        dir: std::path::PathBuf,
        /// What.
        message: String,
    },
}
