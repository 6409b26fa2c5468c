//! A folder of cache entries under a byte cap, shared by the caches on disk
//! (decoded images, audio features): entry names from 128-bit keys,
//! temporary names for writes that are renamed whole, last use recorded as
//! the modification time, and eviction of the least recently used entries.
//!
//! Eviction has hysteresis: once the folder passes its cap it is scanned
//! (other processes' entries included) and cut to 90% of the cap, so a full
//! cache is scanned once per tenth of its cap written, not once per entry.
//! Several processes may share a folder; each also rescans after writing
//! 1/32 of the cap itself, so together they overshoot the cap by at most
//! that much each between scans.
//!
//! ```
//! use ferrofeed_stages::{cache_key, CacheFolder};
//! let dir = tempfile::tempdir().unwrap();
//! let folder = CacheFolder::open(dir.path(), "bin", 1000).unwrap();
//! for i in 0..20u32 {
//!     let key = cache_key(1, &i);
//!     let path = folder.entry(&key);
//!     std::fs::write(&path, [0u8; 100]).unwrap();
//!     folder.added(100, &path);
//! }
//! // Past the cap the folder was cut to 90% of it.
//! assert!(folder.scan().iter().map(|e| e.1).sum::<u64>() <= 1000);
//! ```
use std::hash::Hash;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::SystemTime;

/// A 128-bit key of `parts`, for entry names: XXH3-128 of `(domain,
/// parts)` (`domain` keeps one cache's keys apart from another's), fast
/// enough to key an image by its encoded bytes (tens of GB/s).
pub fn cache_key<T: Hash + ?Sized>(domain: u64, parts: &T) -> [u8; 16] {
    let mut h = xxhash_rust::xxh3::Xxh3::new();
    domain.hash(&mut h);
    parts.hash(&mut h);
    h.digest128().to_le_bytes()
}

/// XXH3-128 of a file's bytes, read in 1 MiB blocks: what a cache keyed by
/// a file puts beside its path, size and modification time, so that a file
/// rewritten at the same size with its time restored (`touch -r`, rsync,
/// an unpacked archive) is a miss rather than stale features. It reads the
/// file once at the page cache's pace — far less than decoding it.
///
/// ```
/// let dir = tempfile::tempdir().unwrap();
/// let p = dir.path().join("a.wav");
/// std::fs::write(&p, b"RIFF one").unwrap();
/// let a = ferrofeed_stages::content_digest(&p).unwrap();
/// std::fs::write(&p, b"RIFF two").unwrap();
/// assert_ne!(a, ferrofeed_stages::content_digest(&p).unwrap());
/// ```
pub fn content_digest(path: &Path) -> std::io::Result<u128> {
    use std::io::Read;
    let (mut f, _) = ferrofeed_core::open_regular(path)?;
    let mut h = xxhash_rust::xxh3::Xxh3::new();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = match f.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        h.update(&buf[..n]);
    }
    Ok(h.digest128())
}

/// The process id in a temporary file's name written by a cache of ours,
/// and only ours: `.tmp-<pid>-…` (entries), `.<name>.tmp-<pid>-ThreadId(…)`
/// (downloads) or `tokens-<key>[.meta].tmp<pid>` (token caches). Any other
/// name — a user's file in a folder given as a cache — is never touched.
fn temp_pid(name: &str) -> Option<u32> {
    fn digits(s: &str) -> Option<u32> {
        (!s.is_empty() && s.bytes().all(|b| b.is_ascii_digit()))
            .then(|| s.parse().ok())
            .flatten()
    }
    if let Some(rest) = name.strip_prefix(".tmp-") {
        return digits(rest.split('-').next()?);
    }
    if name.starts_with('.') && name.ends_with(')') && name.contains("-ThreadId(") {
        let at = name.rfind(".tmp-")?;
        return digits(name[at + 5..].split('-').next()?);
    }
    if name.starts_with("tokens-") {
        let at = name.rfind(".tmp")?;
        return digits(&name[at + 4..]);
    }
    None
}

/// Removes the temporaries a killed process left in `dir` (`kill -9`
/// mid-write): those of a process no longer running here that are at
/// least a minute old, and any a day old. Returns how many were removed.
///
/// ```
/// let dir = tempfile::tempdir().unwrap();
/// let stale = dir.path().join(".tmp-4000000000-0-ThreadId(2)");
/// std::fs::write(&stale, b"half an entry").unwrap();
/// let f = std::fs::File::options().write(true).open(&stale).unwrap();
/// f.set_modified(std::time::SystemTime::now() - std::time::Duration::from_secs(120)).unwrap();
/// std::fs::write(dir.path().join("entry.bin"), b"kept").unwrap();
/// assert_eq!(ferrofeed_stages::sweep_temporaries(dir.path()), 1);
/// assert!(!stale.exists() && dir.path().join("entry.bin").exists());
/// // A user's file that merely looks like one is left alone.
/// let theirs = dir.path().join("notes.tmp123");
/// std::fs::write(&theirs, b"mine").unwrap();
/// let f = std::fs::File::options().write(true).open(&theirs).unwrap();
/// f.set_modified(std::time::SystemTime::now() - std::time::Duration::from_secs(86_400 * 2)).unwrap();
/// assert_eq!(ferrofeed_stages::sweep_temporaries(dir.path()), 0);
/// ```
pub fn sweep_temporaries(dir: &Path) -> usize {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return 0;
    };
    let now = SystemTime::now();
    let mut removed = 0;
    for e in entries.flatten() {
        let name = e.file_name();
        let Some(pid) = name.to_str().and_then(temp_pid) else {
            continue;
        };
        let Ok(meta) = e.metadata() else { continue };
        if !meta.is_file() {
            continue;
        }
        let age = meta
            .modified()
            .ok()
            .and_then(|m| now.duration_since(m).ok())
            .unwrap_or_default();
        let running = Path::new("/proc").join(pid.to_string()).exists();
        let stale = age >= std::time::Duration::from_secs(86_400)
            || (!running && age >= std::time::Duration::from_secs(60));
        if stale && std::fs::remove_file(e.path()).is_ok() {
            removed += 1;
        }
    }
    removed
}

/// An entry found by a scan: its path, bytes and last use.
pub type CacheEntry = (PathBuf, u64, SystemTime);

/// A folder of entries named `<hex key>.<ext>`, capped at `cap` bytes.
#[derive(Debug)]
pub struct CacheFolder {
    dir: PathBuf,
    ext: &'static str,
    cap: u64,
    /// This process's estimate of the folder's bytes: the last scan's
    /// total plus what this process added since.
    bytes: AtomicU64,
    /// Bytes this process added since its last scan.
    since_scan: AtomicU64,
    scans: AtomicU64,
    seq: AtomicU64,
    unwritable: AtomicBool,
    scanning: Mutex<()>,
    /// What the cache over this folder found: lookups served and not,
    /// bytes of entries read and written.
    hits: AtomicU64,
    misses: AtomicU64,
    bytes_read: AtomicU64,
    bytes_written: AtomicU64,
}

impl CacheFolder {
    /// Opens (creating) `dir`, holding entries with extension `ext`, capped
    /// at `cap` bytes; its entries are counted once.
    pub fn open(dir: &Path, ext: &'static str, cap: u64) -> std::io::Result<CacheFolder> {
        std::fs::create_dir_all(dir)?;
        if !dir.is_dir() {
            return Err(std::io::Error::other("not a folder"));
        }
        sweep_temporaries(dir);
        let f = CacheFolder {
            dir: dir.to_path_buf(),
            ext,
            cap,
            bytes: AtomicU64::new(0),
            since_scan: AtomicU64::new(0),
            scans: AtomicU64::new(0),
            seq: AtomicU64::new(0),
            unwritable: AtomicBool::new(false),
            scanning: Mutex::new(()),
            hits: AtomicU64::new(0),
            misses: AtomicU64::new(0),
            bytes_read: AtomicU64::new(0),
            bytes_written: AtomicU64::new(0),
        };
        let now: u64 = f.scan().iter().map(|e| e.1).sum();
        f.bytes.store(now, Ordering::Relaxed);
        Ok(f)
    }

    /// The folder.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The cap in bytes.
    pub fn cap(&self) -> u64 {
        self.cap
    }

    /// The path of the entry for `key`.
    pub fn entry(&self, key: &[u8; 16]) -> PathBuf {
        use std::fmt::Write;
        let mut name = String::with_capacity(33 + self.ext.len());
        for b in key {
            let _ = write!(name, "{b:02x}");
        }
        name.push('.');
        name.push_str(self.ext);
        self.dir.join(name)
    }

    /// A fresh temporary path in the folder (never an entry's name), for a
    /// write that is renamed into place when whole.
    pub fn temp(&self) -> PathBuf {
        let n = self.seq.fetch_add(1, Ordering::Relaxed);
        self.dir.join(format!(
            ".tmp-{}-{n}-{:?}",
            std::process::id(),
            std::thread::current().id()
        ))
    }

    /// Records that `path` was just used (eviction removes the oldest
    /// first).
    pub fn touch(path: &Path) {
        if let Ok(f) = std::fs::File::options().append(true).open(path) {
            let _ = f.set_modified(SystemTime::now());
        }
    }

    /// Whether writes are still tried (see [`write_failed`](Self::write_failed)).
    pub fn writable(&self) -> bool {
        !self.unwritable.load(Ordering::Relaxed)
    }

    /// Turns writes off after `err`; true the first time (the caller says
    /// so once).
    pub fn write_failed(&self) -> bool {
        !self.unwritable.swap(true, Ordering::Relaxed)
    }

    /// Accounts an entry of `bytes` just written at `keep`, and evicts when
    /// due: past the cap, or after 1/32 of the cap written since this
    /// process last scanned. Returns the entries removed.
    pub fn added(&self, bytes: u64, keep: &Path) -> usize {
        self.bytes_written.fetch_add(bytes, Ordering::Relaxed);
        let total = self.bytes.fetch_add(bytes, Ordering::Relaxed) + bytes;
        let since = self.since_scan.fetch_add(bytes, Ordering::Relaxed) + bytes;
        if total > self.cap || since > self.cap / 32 {
            self.evict(Some(keep))
        } else {
            0
        }
    }

    /// Scans the folder and, when it is past its cap, removes the least
    /// recently used entries (never `keep`) until it holds at most 90% of
    /// the cap. Returns the entries removed. A scan already running in this
    /// process is not repeated.
    pub fn evict(&self, keep: Option<&Path>) -> usize {
        let Ok(_one) = self.scanning.try_lock() else {
            return 0;
        };
        self.since_scan.store(0, Ordering::Relaxed);
        let mut all = self.scan();
        let mut total: u64 = all.iter().map(|e| e.1).sum();
        let mut removed = 0;
        if total > self.cap {
            let low = self.cap - self.cap / 10;
            all.sort_by_key(|e| e.2);
            for (path, len, _) in all {
                if total <= low {
                    break;
                }
                if Some(path.as_path()) != keep && std::fs::remove_file(&path).is_ok() {
                    total -= len;
                    removed += 1;
                }
            }
        }
        self.bytes.store(total, Ordering::Relaxed);
        removed
    }

    /// The entries now in the folder (temporary files excluded).
    pub fn scan(&self) -> Vec<CacheEntry> {
        self.scans.fetch_add(1, Ordering::Relaxed);
        let Ok(rd) = std::fs::read_dir(&self.dir) else {
            return Vec::new();
        };
        rd.filter_map(Result::ok)
            .filter(|e| e.path().extension().is_some_and(|x| x == self.ext))
            .filter_map(|e| {
                let m = e.metadata().ok()?;
                Some((e.path(), m.len(), m.modified().ok()?))
            })
            .collect()
    }

    /// The folder's bytes: this process's estimate.
    pub fn bytes(&self) -> u64 {
        self.bytes.load(Ordering::Relaxed)
    }

    /// Scans of the folder so far (opening counts one).
    pub fn scans(&self) -> u64 {
        self.scans.load(Ordering::Relaxed)
    }

    /// Counts a lookup served by an entry of `bytes`.
    pub fn hit(&self, bytes: u64) {
        self.hits.fetch_add(1, Ordering::Relaxed);
        self.bytes_read.fetch_add(bytes, Ordering::Relaxed);
    }
    /// Counts a lookup that found no valid entry.
    pub fn miss(&self) {
        self.misses.fetch_add(1, Ordering::Relaxed);
    }
    /// Lookups served by an entry.
    pub fn hits(&self) -> u64 {
        self.hits.load(Ordering::Relaxed)
    }
    /// Lookups that found no valid entry.
    pub fn misses(&self) -> u64 {
        self.misses.load(Ordering::Relaxed)
    }
    /// Bytes of entries read by lookups.
    pub fn bytes_read(&self) -> u64 {
        self.bytes_read.load(Ordering::Relaxed)
    }
    /// Bytes of entries this process wrote ([`added`](Self::added)).
    pub fn bytes_written(&self) -> u64 {
        self.bytes_written.load(Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn put(f: &CacheFolder, i: u32, len: usize) -> PathBuf {
        let p = f.entry(&cache_key(7, &i));
        std::fs::write(&p, vec![0u8; len]).unwrap();
        f.added(len as u64, &p);
        p
    }

    #[test]
    fn a_full_folder_is_cut_to_nine_tenths_and_scanned_rarely() {
        let dir = tempfile::tempdir().unwrap();
        let f = CacheFolder::open(dir.path(), "e", 100 * 100).unwrap();
        let mut last = PathBuf::new();
        for i in 0..1000 {
            last = put(&f, i, 100);
            let now: u64 = f.scan().iter().map(|e| e.1).sum();
            assert!(now <= 100 * 100, "entry {i}: {now} bytes");
        }
        // One scan per entry above was the test's own; the folder's are
        // the rest: a cut to 90% leaves room for 10 entries, and the 1/32
        // rescan comes every 4.
        let own = f.scans() - 1000;
        assert!(own <= 1000 / 3, "{own} scans for 1000 entries");
        assert!(last.exists(), "the entry just written is never evicted");
    }

    #[test]
    fn the_least_recently_used_go_first() {
        let dir = tempfile::tempdir().unwrap();
        let f = CacheFolder::open(dir.path(), "e", 1000).unwrap();
        let old = SystemTime::now() - std::time::Duration::from_secs(100);
        let first = put(&f, 0, 200);
        let second = put(&f, 1, 200);
        for p in [&first, &second] {
            std::fs::File::options()
                .append(true)
                .open(p)
                .unwrap()
                .set_modified(old)
                .unwrap();
        }
        CacheFolder::touch(&first);
        // Entries 2–4 last used between the two (set, not written now: a
        // write's time comes from a coarser clock than `touch`'s, so one
        // written just after the touch may read as older).
        let between = old + std::time::Duration::from_secs(50);
        for i in 2..6 {
            let p = put(&f, i, 200);
            if i < 5 {
                std::fs::File::options()
                    .append(true)
                    .open(&p)
                    .unwrap()
                    .set_modified(between)
                    .unwrap();
            }
        }
        assert!(first.exists(), "used recently: kept");
        assert!(!second.exists(), "oldest use: evicted");
        let total: u64 = f.scan().iter().map(|e| e.1).sum();
        assert!(total <= 900, "{total}");
    }

    #[test]
    fn keys_differ_by_domain_and_parts_and_temporaries_are_no_entries() {
        assert_ne!(cache_key(1, "a"), cache_key(2, "a"));
        assert_ne!(cache_key(1, "a"), cache_key(1, "b"));
        assert_eq!(cache_key(1, &("a", 3u8)), cache_key(1, &("a", 3u8)));
        let dir = tempfile::tempdir().unwrap();
        let f = CacheFolder::open(dir.path(), "e", 1000).unwrap();
        std::fs::write(f.temp(), b"half").unwrap();
        assert!(f.scan().is_empty());
        let file = dir.path().join("plain");
        std::fs::write(&file, b"x").unwrap();
        assert!(CacheFolder::open(&file, "e", 10).is_err());
    }
}
