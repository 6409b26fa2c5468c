//! [`Remote`]: a listed prefix of an object store, its downloads (parallel,
//! retried, with a stall timeout), the cache they fill, read-ahead in epoch
//! order and the figures the report shows.
//!
//! ```no_run
//! use ferrofeed_stages::remote::{Remote, RemoteOptions};
//! let remote = Remote::open("s3://bucket/train", RemoteOptions::new("/tmp/cache".into())).unwrap();
//! println!("{} objects, {} bytes", remote.objects().len(), remote.total_bytes());
//! let first = remote.read(0).unwrap();
//! println!("{} bytes from {}", first.len(), remote.objects()[0].url);
//! ```
use std::io::{Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use futures::StreamExt;
use object_store::path::Path as ObjectPath;
use object_store::{ObjectStore, ObjectStoreExt};

use super::cache::ObjectCache;
use super::stream::{ChunkReader, Progress};
use super::url::RemoteUrl;
use super::{BoxError, RemoteError};
use crate::components::Bytes;
use crate::readers::files::ReadFile;

/// One object of a listed prefix.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RemoteObject {
    /// Its path inside the bucket.
    pub key: String,
    /// Its URL (`s3://bucket/key`).
    pub url: String,
    /// Its size in bytes, as listed.
    pub size: u64,
    /// Its ETag, when the store gives one.
    pub etag: Option<String>,
}

/// How a [`Remote`] downloads and caches.
#[derive(Debug, Clone)]
pub struct RemoteOptions {
    /// Folder of the local copy.
    pub cache_dir: PathBuf,
    /// Cap on that folder's bytes (least recently used entries go first).
    pub cache_bytes: Option<u64>,
    /// Parallel downloads; `None` starts at 1 (objects of 1 MiB or more on
    /// average) or 16 and adds one while that raises the measured rate.
    pub download_workers: Option<usize>,
    /// While an epoch runs, download what the next one reads first.
    pub prefetch: bool,
    /// Attempts after the first before a download is an error.
    pub retries: u32,
    /// A request that receives nothing for this long is cut and retried.
    pub stall_timeout: Duration,
    /// Limit on opening a connection.
    pub connect_timeout: Duration,
    /// First retry waits this long; each later one twice as long (at most 5 s).
    pub backoff: Duration,
}

impl RemoteOptions {
    /// Defaults: no cap, auto workers, prefetch on, 5 retries, 30 s stall
    /// timeout, 5 s connect timeout, 100 ms first backoff.
    pub fn new(cache_dir: PathBuf) -> Self {
        RemoteOptions {
            cache_dir,
            cache_bytes: None,
            download_workers: None,
            prefetch: true,
            retries: 5,
            stall_timeout: Duration::from_secs(30),
            connect_timeout: Duration::from_secs(5),
            backoff: Duration::from_millis(100),
        }
    }
}

/// What a [`Remote`] has done so far.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct RemoteStats {
    /// Bytes received from the store (retried partial bodies included:
    /// what egress is billed on).
    pub bytes_downloaded: u64,
    /// Bytes handed to the pipeline that this process did not download.
    pub bytes_from_cache: u64,
    /// Requests sent (listing, heads and gets).
    pub requests: u64,
    /// Downloads tried again after a failure.
    pub retries: u64,
    /// Wall-clock seconds with at least one download under way.
    pub download_seconds: f64,
    /// Parallel downloads allowed now.
    pub download_workers: usize,
}

#[derive(Default)]
struct Busy {
    in_flight: usize,
    since: Option<Instant>,
    total: Duration,
}

struct Counters {
    downloaded: Arc<AtomicU64>,
    from_cache: AtomicU64,
    requests: AtomicU64,
    retries: AtomicU64,
    busy: Mutex<Busy>,
}

/// The read-ahead queue: objects in the order the pipeline will ask for
/// them, a cursor, and how far the pipeline has got.
#[derive(Default)]
struct Queue {
    order: Vec<usize>,
    /// Position of each object in the current epoch's part of `order`.
    pos: Vec<u32>,
    next: usize,
    consumer: usize,
    /// Objects the queue may run ahead of the consumer.
    ahead: usize,
    allowed: usize,
    started: Option<Instant>,
    asked: u64,
    stop: bool,
    /// `--download-workers auto`: the climb that sets `allowed`.
    climb: Option<super::climb::Climb>,
    /// A download slot found nothing to start since the climb last looked.
    starved: bool,
    /// Read-ahead downloads under way, and how many of them are in their
    /// tail (see [`tail_bytes`]): those no longer count against `allowed`.
    active: usize,
    tails: usize,
}

/// The last bytes of an object's download during which the read-ahead
/// starts the next one (a quarter of it, at most 4 MiB): the next
/// request's time to first byte then overlaps this one's end instead of
/// leaving the link idle between objects. (Measured through the bench's
/// server and proxy: curl fetching one shard at a time gets 91% of a
/// 100 MB/s link, two at a time 99%.)
fn tail_bytes(size: u64) -> u64 {
    (size / 4).min(4 << 20)
}

struct Inner {
    url: RemoteUrl,
    store: Arc<dyn ObjectStore>,
    rt: tokio::runtime::Runtime,
    cache: ObjectCache,
    opts: RemoteOptions,
    objects: Vec<RemoteObject>,
    ours: Vec<AtomicBool>,
    counters: Counters,
    queue: Mutex<Queue>,
    wake: Condvar,
    /// Downloads under way that readers follow chunk by chunk (see
    /// [`Remote::open_stream`]).
    streams: Mutex<std::collections::HashMap<usize, Arc<Progress>>>,
    read: ReadFile,
}

/// A listed prefix of an object store with its local cache; see the
/// [module docs](self).
pub struct Remote {
    inner: Arc<Inner>,
    threads: Mutex<Vec<std::thread::JoinHandle<()>>>,
    started: AtomicUsize,
}

impl std::fmt::Debug for Remote {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Remote")
            .field("url", &self.inner.url.text)
            .field("objects", &self.inner.objects.len())
            .finish()
    }
}

const MAX_AUTO_WORKERS: usize = 32;

impl Remote {
    /// Lists `url` (every object under the prefix, or the one object it
    /// names) and opens the cache. An empty or missing prefix is an error
    /// naming the URL.
    pub fn open(url: &str, opts: RemoteOptions) -> Result<Remote, RemoteError> {
        let parsed = RemoteUrl::parse(url)?;
        let store = parsed.store(opts.connect_timeout)?;
        Remote::with_store(parsed, store, opts)
    }

    /// As [`open`](Self::open), over a store built by the caller.
    pub fn with_store(
        url: RemoteUrl,
        store: Arc<dyn ObjectStore>,
        opts: RemoteOptions,
    ) -> Result<Remote, RemoteError> {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("ferrofeed-remote")
            .enable_all()
            .build()
            .map_err(|e| RemoteError::Url {
                url: url.text.clone(),
                message: format!("cannot start the download runtime: {e}"),
            })?;
        let cache = ObjectCache::open(&opts.cache_dir, opts.cache_bytes).map_err(|e| {
            RemoteError::Cache {
                dir: opts.cache_dir.clone(),
                message: e.to_string(),
            }
        })?;
        let counters = Counters {
            downloaded: Arc::new(AtomicU64::new(0)),
            from_cache: AtomicU64::new(0),
            requests: AtomicU64::new(0),
            retries: AtomicU64::new(0),
            busy: Mutex::new(Busy::default()),
        };
        let objects = list(&rt, &store, &url, &opts, &counters)?;
        let allowed = opts.download_workers.unwrap_or(8).max(1);
        Ok(Remote {
            inner: Arc::new(Inner {
                ours: objects.iter().map(|_| AtomicBool::new(false)).collect(),
                url,
                store,
                rt,
                cache,
                opts,
                objects,
                counters,
                queue: Mutex::new(Queue {
                    allowed,
                    ..Queue::default()
                }),
                wake: Condvar::new(),
                streams: Mutex::new(std::collections::HashMap::new()),
                read: ReadFile::default(),
            }),
            threads: Mutex::new(Vec::new()),
            started: AtomicUsize::new(0),
        })
    }

    /// The URL.
    pub fn url(&self) -> &RemoteUrl {
        &self.inner.url
    }

    /// The objects under the prefix, sorted by key path (segment by
    /// segment, as a local folder walk orders files).
    pub fn objects(&self) -> &[RemoteObject] {
        &self.inner.objects
    }

    /// Sum of the objects' sizes.
    pub fn total_bytes(&self) -> u64 {
        self.inner.objects.iter().map(|o| o.size).sum()
    }

    /// `key` with the listed prefix and its `/` removed (the object's name
    /// for a URL that names one object).
    pub fn relative_key<'a>(&self, key: &'a str) -> &'a str {
        relative(&self.inner.url.prefix, key)
    }

    /// The local cache.
    pub fn cache(&self) -> &ObjectCache {
        &self.inner.cache
    }

    /// The bytes received so far, as a live counter (for
    /// `Pipeline::meter`: download MB/s on the timeline and in the trace).
    pub fn downloaded_counter(&self) -> Arc<AtomicU64> {
        Arc::clone(&self.inner.counters.downloaded)
    }

    /// Figures so far.
    pub fn stats(&self) -> RemoteStats {
        let c = &self.inner.counters;
        let busy = c.busy.lock().map_or(Duration::ZERO, |b| {
            b.total + b.since.map_or(Duration::ZERO, |s| s.elapsed())
        });
        RemoteStats {
            bytes_downloaded: c.downloaded.load(Ordering::Relaxed),
            bytes_from_cache: c.from_cache.load(Ordering::Relaxed),
            requests: c.requests.load(Ordering::Relaxed),
            retries: c.retries.load(Ordering::Relaxed),
            download_seconds: busy.as_secs_f64(),
            download_workers: self.inner.queue.lock().map_or(0, |q| q.allowed),
        }
    }

    /// The local path of object `i`, downloaded first when the cache lacks
    /// it (or waiting for the download another thread or process has under
    /// way).
    pub fn fetch(&self, i: usize) -> Result<PathBuf, RemoteError> {
        self.inner.fetch(i)
    }

    /// The local path of object `i`, for the pipeline (a streamed shard):
    /// [`fetch`](Self::fetch) counted against the read-ahead queue, as
    /// [`read`](Self::read) counts.
    pub fn fetch_in_order(&self, i: usize) -> Result<PathBuf, RemoteError> {
        self.inner.note_asked(i);
        let path = self.inner.fetch(i)?;
        if !self.inner.ours[i].load(Ordering::Relaxed) {
            let size = self.inner.objects[i].size;
            self.inner
                .counters
                .from_cache
                .fetch_add(size, Ordering::Relaxed);
        }
        Ok(path)
    }

    /// Object `i` for the pipeline (a streamed shard), counted against the
    /// read-ahead queue: its cache entry when it is there, else a stream of
    /// its download, followed chunk by chunk as the bytes arrive (the
    /// read-ahead's, or one started here), so its first bytes are read
    /// before its last ones arrive. A download that fails after its
    /// retries is an error of the read, naming the URL.
    pub fn open_stream(&self, i: usize) -> Result<crate::ShardData, RemoteError> {
        let inner = &self.inner;
        inner.note_asked(i);
        let obj = inner.objects.get(i).ok_or_else(|| RemoteError::Download {
            url: inner.url.text.clone(),
            attempts: 0,
            message: format!("object {i} is past the end of the listing"),
        })?;
        if let Some(p) = inner.cache.lookup(obj) {
            if !inner.ours[i].load(Ordering::Relaxed) {
                inner
                    .counters
                    .from_cache
                    .fetch_add(obj.size, Ordering::Relaxed);
            }
            return Ok(crate::ShardData::File(p));
        }
        let (progress, start) = {
            let mut streams = inner.streams.lock().map_err(|_| RemoteError::Download {
                url: obj.url.clone(),
                attempts: 0,
                message: "download registry poisoned".into(),
            })?;
            match streams.get(&i) {
                Some(p) => (Arc::clone(p), false),
                None => {
                    let p = Arc::new(Progress::new(obj.size));
                    streams.insert(i, Arc::clone(&p));
                    (p, true)
                }
            }
        };
        progress.follow();
        if start {
            let inner = Arc::clone(inner);
            std::thread::Builder::new()
                .name("ferrofeed-download-stream".into())
                .spawn(move || {
                    let _ = inner.fetch(i);
                })
                .map_err(|e| RemoteError::Download {
                    url: obj.url.clone(),
                    attempts: 0,
                    message: e.to_string(),
                })?;
        }
        Ok(crate::ShardData::Stream(Box::new(ChunkReader::new(
            progress,
        ))))
    }

    /// Object `i`'s bytes, for the pipeline: counts the read against the
    /// read-ahead queue.
    pub fn read(&self, i: usize) -> Result<Bytes, BoxError> {
        self.inner.note_asked(i);
        let path = self.inner.fetch(i)?;
        let obj = &self.inner.objects[i];
        if !self.inner.ours[i].load(Ordering::Relaxed) {
            self.inner
                .counters
                .from_cache
                .fetch_add(obj.size, Ordering::Relaxed);
        }
        match self.inner.read.read(&path) {
            Ok(b) => Ok(b),
            // Evicted between the download and the read: once more.
            Err(_) => {
                let path = self.inner.fetch(i)?;
                self.inner.read.read(&path)
            }
        }
    }

    /// Starts reading ahead: `order` is the object order of the epoch that
    /// starts now; `next` (with prefetch on) the next epoch's, of which the
    /// first objects are downloaded once this epoch's are under way.
    pub fn schedule(&self, order: Vec<usize>, next: Option<Vec<usize>>) {
        let inner = &self.inner;
        let n = inner.objects.len();
        let mean = (self.total_bytes() / n.max(1) as u64).max(1);
        let cap = inner.cache.cap().unwrap_or(u64::MAX);
        // Run ahead by at most half the cache (or 1 GiB), at least two
        // objects per worker.
        let ahead_bytes = (cap / 2).min(1 << 30);
        let workers = inner.opts.download_workers.unwrap_or(MAX_AUTO_WORKERS);
        let ahead = usize::try_from(ahead_bytes / mean)
            .unwrap_or(usize::MAX)
            .max(2 * workers.min(8));
        let mut pos = vec![u32::MAX; n];
        for (p, &i) in order.iter().enumerate() {
            if i < n && pos[i] == u32::MAX {
                pos[i] = p as u32;
            }
        }
        let mut full = order;
        if inner.opts.prefetch {
            if let Some(next) = next {
                full.extend(next.into_iter().filter(|&i| i < n).take(ahead));
            }
        }
        if let Ok(mut q) = inner.queue.lock() {
            q.order = full;
            q.pos = pos;
            q.next = 0;
            q.consumer = 0;
            q.ahead = ahead;
            q.started = Some(Instant::now());
            q.asked = 0;
            if inner.opts.download_workers.is_none() && q.climb.is_none() {
                // Large objects (shards) start at one download, which gets the
                // whole link (the first shard arrives soonest), small ones (files
                // of a tree) at sixteen.
                let start = if mean >= 1 << 20 { 1 } else { 16 };
                let bytes = inner.counters.downloaded.load(Ordering::Relaxed);
                q.climb = Some(super::climb::Climb::new(
                    start,
                    MAX_AUTO_WORKERS,
                    Instant::now(),
                    bytes,
                ));
                q.allowed = start;
            }
        }
        self.spawn(workers);
        inner.wake.notify_all();
    }

    fn spawn(&self, workers: usize) {
        let Ok(mut threads) = self.threads.lock() else {
            return;
        };
        while threads.len() < workers {
            let inner = Arc::clone(&self.inner);
            let id = threads.len();
            match std::thread::Builder::new()
                .name(format!("ferrofeed-download-{id}"))
                .spawn(move || inner.prefetch_loop(id))
            {
                Ok(h) => threads.push(h),
                Err(_) => break,
            }
        }
        self.started.store(threads.len(), Ordering::Relaxed);
    }

    /// Downloads every object of `which` into the cache (in parallel) and
    /// links them under a private folder with their relative keys, for
    /// readers that want local files. The folder goes with the [`View`].
    pub fn materialize(&self, which: &[usize]) -> Result<View, RemoteError> {
        let workers = self.inner.opts.download_workers.unwrap_or(8).clamp(1, 64);
        let next = AtomicUsize::new(0);
        let failed: Mutex<Option<RemoteError>> = Mutex::new(None);
        std::thread::scope(|s| {
            for _ in 0..workers.min(which.len()) {
                s.spawn(|| loop {
                    if failed.lock().map_or(true, |f| f.is_some()) {
                        return;
                    }
                    let k = next.fetch_add(1, Ordering::Relaxed);
                    let Some(&i) = which.get(k) else { return };
                    if let Err(e) = self.inner.fetch(i) {
                        if let Ok(mut f) = failed.lock() {
                            f.get_or_insert(e);
                        }
                        return;
                    }
                });
            }
        });
        if let Some(e) = failed.into_inner().ok().flatten() {
            return Err(e);
        }
        let root = self.view_root();
        let cache_err = |e: std::io::Error| RemoteError::Cache {
            dir: root.clone(),
            message: e.to_string(),
        };
        let mut paths = Vec::with_capacity(which.len());
        for &i in which {
            let obj = &self.inner.objects[i];
            let local = root.join(self.relative_key(&obj.key));
            if let Some(parent) = local.parent() {
                std::fs::create_dir_all(parent).map_err(cache_err)?;
            }
            let src = self.inner.fetch(i)?;
            // Linked beside the place and renamed over it, so that another
            // process reading the same view never sees a missing file.
            let tmp = local.with_file_name(format!(
                ".{}.link-{}",
                local
                    .file_name()
                    .map_or_else(Default::default, |n| n.to_string_lossy()),
                std::process::id()
            ));
            let _ = std::fs::remove_file(&tmp);
            if std::fs::hard_link(&src, &tmp).is_err() {
                std::fs::copy(&src, &tmp).map_err(cache_err)?;
            }
            std::fs::rename(&tmp, &local).map_err(cache_err)?;
            if !self.inner.ours[i].load(Ordering::Relaxed) {
                self.inner
                    .counters
                    .from_cache
                    .fetch_add(obj.size, Ordering::Relaxed);
            }
            paths.push(local);
        }
        Ok(View {
            root,
            url: self.inner.url.text.trim_end_matches('/').to_string(),
            paths,
        })
    }

    /// The folder [`materialize`](Self::materialize) links under: one per
    /// URL, the same every run, so that caches keyed by path (the audio
    /// feature cache) find their entries again.
    pub fn view_root(&self) -> PathBuf {
        let url = self.inner.url.text.trim_end_matches('/');
        let h = super::cache::fnv(0, &[url.as_bytes()]);
        self.inner
            .cache
            .dir()
            .join("views")
            .join(format!("{h:016x}"))
    }
}

impl Drop for Remote {
    fn drop(&mut self) {
        if let Ok(mut q) = self.inner.queue.lock() {
            q.stop = true;
        }
        self.inner.wake.notify_all();
        if let Ok(mut threads) = self.threads.lock() {
            for t in threads.drain(..) {
                let _ = t.join();
            }
        }
    }
}

/// Local links to downloaded objects under [`Remote::view_root`]. The
/// folder is kept between runs (links are replaced by each one); read the
/// objects through [`paths`](Self::paths), not by walking the folder, which
/// may hold links to objects no longer listed.
#[derive(Debug)]
pub struct View {
    root: PathBuf,
    url: String,
    paths: Vec<PathBuf>,
}

impl View {
    /// The folder holding the links (the dataset's local root).
    pub fn root(&self) -> &Path {
        &self.root
    }
    /// The local path of each materialized object, in the order asked.
    pub fn paths(&self) -> &[PathBuf] {
        &self.paths
    }
    /// `text` with the view's root replaced by the dataset URL, so that
    /// paths in errors and indexes name the objects.
    pub fn to_url(&self, text: &str) -> String {
        text.replace(&self.root.display().to_string(), &self.url)
    }
}

fn relative<'a>(prefix: &str, key: &'a str) -> &'a str {
    if prefix.is_empty() {
        return key;
    }
    match key.strip_prefix(prefix) {
        Some("") => key.rsplit('/').next().unwrap_or(key),
        Some(rest) => rest.strip_prefix('/').unwrap_or(rest),
        None => key,
    }
}

fn list(
    rt: &tokio::runtime::Runtime,
    store: &Arc<dyn ObjectStore>,
    url: &RemoteUrl,
    opts: &RemoteOptions,
    counters: &Counters,
) -> Result<Vec<RemoteObject>, RemoteError> {
    let prefix = (!url.prefix.is_empty()).then(|| ObjectPath::from(url.prefix.as_str()));
    // A plain HTTP server cannot list (WebDAV's PROPFIND): a URL there
    // names one object.
    let head_one = |p: &ObjectPath| {
        counters.requests.fetch_add(1, Ordering::Relaxed);
        let head =
            rt.block_on(async { tokio::time::timeout(opts.stall_timeout, store.head(p)).await });
        head.ok()
            .and_then(Result::ok)
            .map(|meta| sorted(url, vec![meta]))
    };
    if let (Some(p), super::url::Scheme::Http) = (&prefix, url.scheme) {
        if let Some(one) = head_one(p) {
            return Ok(one);
        }
    }
    let mut last_err = None;
    for attempt in 0..=opts.retries {
        counters.requests.fetch_add(1, Ordering::Relaxed);
        let listed: Result<Vec<object_store::ObjectMeta>, String> = rt.block_on(async {
            let mut out = Vec::new();
            let mut s = store.list(prefix.as_ref());
            loop {
                match tokio::time::timeout(opts.stall_timeout, s.next()).await {
                    Err(_) => return Err(format!("no answer in {:?}", opts.stall_timeout)),
                    Ok(None) => return Ok(out),
                    Ok(Some(Err(e))) => return Err(e.to_string()),
                    Ok(Some(Ok(m))) => out.push(m),
                }
            }
        });
        match listed {
            Ok(v) if !v.is_empty() => return Ok(sorted(url, v)),
            Ok(_) => {
                last_err = None;
                break;
            }
            Err(e) => {
                last_err = Some(e);
                if attempt < opts.retries {
                    counters.retries.fetch_add(1, Ordering::Relaxed);
                    std::thread::sleep(backoff(opts.backoff, attempt));
                }
            }
        }
    }
    // The URL may name one object (or the store may not list, as plain
    // HTTP servers do not).
    if let Some(one) = prefix.as_ref().and_then(head_one) {
        return Ok(one);
    }
    Err(match last_err {
        Some(message) => RemoteError::List {
            url: url.text.clone(),
            message,
        },
        None => RemoteError::Empty {
            url: url.text.clone(),
        },
    })
}

fn sorted(url: &RemoteUrl, metas: Vec<object_store::ObjectMeta>) -> Vec<RemoteObject> {
    let mut v: Vec<RemoteObject> = metas
        .into_iter()
        .map(|m| {
            let key = m.location.to_string();
            RemoteObject {
                url: url.object_url(&key),
                key,
                size: m.size,
                etag: m.e_tag,
            }
        })
        .collect();
    v.sort_by(|a, b| a.key.split('/').cmp(b.key.split('/')));
    v
}

fn backoff(base: Duration, attempt: u32) -> Duration {
    base.saturating_mul(1 << attempt.min(10))
        .min(Duration::from_secs(5))
}

/// Whether a failed download may succeed when tried again.
fn retryable(e: &BoxError) -> bool {
    !matches!(
        e.downcast_ref::<object_store::Error>(),
        Some(
            object_store::Error::NotFound { .. }
                | object_store::Error::PermissionDenied { .. }
                | object_store::Error::Unauthenticated { .. }
        )
    )
}

impl Inner {
    /// [`fetch_entry`](Self::fetch_entry), and the end of any stream that
    /// follows the download.
    fn fetch(self: &Arc<Self>, i: usize) -> Result<PathBuf, RemoteError> {
        self.fetch_as(i, false)
    }

    /// [`fetch`](Self::fetch); `queued`: for the read-ahead queue, whose
    /// count of downloads in their tail this one joins near its end.
    fn fetch_as(self: &Arc<Self>, i: usize, queued: bool) -> Result<PathBuf, RemoteError> {
        let r = self.fetch_entry(i, queued);
        let followed = self.streams.lock().ok().and_then(|mut s| s.remove(&i));
        if let Some(p) = followed {
            p.finish(r.as_ref().map(Clone::clone).map_err(ToString::to_string));
        }
        r
    }

    fn fetch_entry(self: &Arc<Self>, i: usize, queued: bool) -> Result<PathBuf, RemoteError> {
        let obj = self.objects.get(i).ok_or_else(|| RemoteError::Download {
            url: self.url.text.clone(),
            attempts: 0,
            message: format!("object {i} is past the end of the listing"),
        })?;
        if let Some(p) = self.cache.lookup(obj) {
            return Ok(p);
        }
        // One count over every attempt: a body cut short is asked again
        // from where it stopped (a ranged GET into the same temporary
        // file); a failed fill (say, a short object) starts a new file.
        let attempt = std::cell::Cell::new(0u32);
        let may_retry = |e: &BoxError| {
            if attempt.get() >= self.opts.retries || !retryable(e) {
                return false;
            }
            tracing::debug!("{}: {e}; trying again", obj.url);
            self.counters.retries.fetch_add(1, Ordering::Relaxed);
            std::thread::sleep(backoff(self.opts.backoff, attempt.get()));
            attempt.set(attempt.get() + 1);
            true
        };
        loop {
            let fill = self.cache.fill(obj, |f| {
                let mut from = 0u64;
                loop {
                    let Err(e) = self.get_into(i, obj, f, from, queued) else {
                        break;
                    };
                    if !may_retry(&e) {
                        return Err(e);
                    }
                    // What reached the file stays. A resumed request that
                    // failed before its first byte (the server ignores
                    // ranges, or the object changed) is asked whole next.
                    let at = f.stream_position()?;
                    from = if from > 0 && at == from { 0 } else { at };
                    f.set_len(from)?;
                    f.seek(SeekFrom::Start(from))?;
                }
                // Marked before the entry appears, so that a reader waiting
                // on this download never counts it as a cache hit.
                self.ours[i].store(true, Ordering::Relaxed);
                Ok(())
            });
            match fill {
                Ok((p, fresh)) => {
                    if fresh {
                        self.cache.evict();
                    }
                    return Ok(p);
                }
                Err(e) if may_retry(&e) => {}
                Err(e) => {
                    return Err(RemoteError::Download {
                        url: obj.url.clone(),
                        attempts: attempt.get() + 1,
                        message: e.to_string(),
                    })
                }
            }
        }
    }

    /// One GET of `obj` from byte `from` on, streamed into `f` (positioned
    /// at `from`); after a failure `f`'s position is past what it wrote.
    /// The body is read, written and published by a task on the download
    /// runtime, where the connection's own task runs: a chunk goes from the
    /// socket to the file and to its readers on one thread, and this one
    /// sleeps until the GET ends, instead of waking at every chunk.
    fn get_into(
        self: &Arc<Self>,
        i: usize,
        obj: &RemoteObject,
        f: &mut std::fs::File,
        from: u64,
        queued: bool,
    ) -> Result<(), BoxError> {
        self.counters.requests.fetch_add(1, Ordering::Relaxed);
        // The same open file: its position moves with what the task writes.
        let file = f.try_clone()?;
        let me = Arc::clone(self);
        let obj = obj.clone();
        let task = self
            .rt
            .spawn(async move { me.stream_into(i, &obj, file, from, queued).await });
        match self.rt.block_on(task) {
            Ok(r) => r,
            Err(e) => Err(format!("the download task ended: {e}").into()),
        }
    }

    /// [`get_into`](Self::get_into)'s GET, on the runtime.
    async fn stream_into(
        self: Arc<Self>,
        i: usize,
        obj: &RemoteObject,
        file: std::fs::File,
        from: u64,
        queued: bool,
    ) -> Result<(), BoxError> {
        // A reader following this download (one registered before its
        // first chunk is written): a whole attempt publishes from byte 0,
        // a resumed one from where the last one stopped.
        let followed = || self.streams.lock().ok().and_then(|s| s.get(&i).cloned());
        let progress = match from {
            0 => super::stream::register(&self.streams, i, obj.size),
            _ => followed(),
        };
        if let Some(p) = &progress {
            if from == 0 {
                p.restart();
            }
            p.attach(&file, from);
        }
        let mut offset = from;
        let tail_at = obj.size.saturating_sub(tail_bytes(obj.size));
        let mut in_tail = false;
        self.busy(true);
        let stall = self.opts.stall_timeout;
        let path = ObjectPath::from(obj.key.as_str());
        let result: Result<(), BoxError> = async {
            let request = async {
                if from == 0 {
                    return self.store.get(&path).await;
                }
                let opts = object_store::GetOptions {
                    range: Some(object_store::GetRange::Offset(from)),
                    if_match: obj.etag.clone(),
                    ..Default::default()
                };
                self.store.get_opts(&path, opts).await
            };
            let got = tokio::time::timeout(stall, request)
                .await
                .map_err(|_| format!("no answer in {stall:?}"))??;
            if got.range.start != from {
                return Err(format!(
                    "asked for bytes from {from}, got them from {}",
                    got.range.start
                )
                .into());
            }
            let mut body = got.into_stream();
            let mut w = std::io::BufWriter::with_capacity(1 << 16, file);
            let streamed: Result<(), BoxError> = async {
                loop {
                    match tokio::time::timeout(stall, body.next()).await {
                        Err(_) => return Err(format!("body stalled for {stall:?}").into()),
                        Ok(None) => return Ok(()),
                        Ok(Some(chunk)) => {
                            let chunk = chunk?;
                            self.counters
                                .downloaded
                                .fetch_add(chunk.len() as u64, Ordering::Relaxed);
                            w.write_all(&chunk)?;
                            let n = chunk.len() as u64;
                            if let Some(p) = &progress {
                                p.wrote(offset, chunk, w.buffer().len());
                            }
                            offset += n;
                            if queued && !in_tail && offset >= tail_at {
                                in_tail = true;
                                self.tail(true);
                            }
                        }
                    }
                }
            }
            .await;
            // What arrived before a break goes to the file too.
            w.flush()?;
            streamed
        }
        .await;
        self.busy(false);
        if in_tail {
            self.tail(false);
        }
        result
    }

    /// A read-ahead download entered (or left) its tail.
    fn tail(&self, entering: bool) {
        let Ok(mut q) = self.queue.lock() else { return };
        if entering {
            q.tails += 1;
            drop(q);
            self.wake.notify_all();
        } else {
            q.tails = q.tails.saturating_sub(1);
        }
    }

    fn busy(&self, start: bool) {
        let Ok(mut b) = self.counters.busy.lock() else {
            return;
        };
        if start {
            if b.in_flight == 0 {
                b.since = Some(Instant::now());
            }
            b.in_flight += 1;
        } else {
            b.in_flight = b.in_flight.saturating_sub(1);
            if b.in_flight == 0 {
                if let Some(s) = b.since.take() {
                    b.total += s.elapsed();
                }
            }
        }
    }

    fn note_asked(&self, i: usize) {
        let Ok(mut q) = self.queue.lock() else { return };
        q.asked += 1;
        if let Some(&p) = q.pos.get(i) {
            if p != u32::MAX && p as usize + 1 > q.consumer {
                q.consumer = p as usize + 1;
                drop(q);
                self.wake.notify_all();
            }
        }
    }

    fn prefetch_loop(self: Arc<Self>, id: usize) {
        loop {
            let i = {
                let Ok(mut q) = self.queue.lock() else { return };
                loop {
                    if q.stop {
                        return;
                    }
                    if id == 0 {
                        let bytes = self.counters.downloaded.load(Ordering::Relaxed);
                        let starved = std::mem::take(&mut q.starved);
                        if let Some(c) = q.climb.as_mut() {
                            let want = c.step(Instant::now(), bytes, starved);
                            q.allowed = want;
                        }
                    }
                    let room = q.next < q.order.len() && q.next < q.consumer + q.ahead;
                    // A download in its tail makes room for one more, up
                    // to twice the downloads allowed.
                    let free = q.active.saturating_sub(q.tails.min(q.allowed)) < q.allowed;
                    if room && free {
                        q.active += 1;
                        break;
                    }
                    if free {
                        q.starved = true;
                    }
                    q = match self.wake.wait_timeout(q, Duration::from_millis(50)) {
                        Ok((g, _)) => g,
                        Err(_) => return,
                    };
                }
                let i = q.order[q.next];
                q.next += 1;
                i
            };
            // A failure here is left to the pipeline's own read, which
            // retries and reports it under the error policy.
            let _ = self.fetch_as(i, true);
            if let Ok(mut q) = self.queue.lock() {
                q.active = q.active.saturating_sub(1);
            }
            self.wake.notify_all();
        }
    }
}
