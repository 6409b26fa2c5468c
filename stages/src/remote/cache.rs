//! The local copy of downloaded objects: one file per object version, named
//! by a hash of its URL, size and ETag; written to a temporary file and
//! renamed whole; a per-entry lock file so that several processes (and
//! threads) sharing the folder download an object once; least recently used
//! entries evicted under a byte cap.
//!
//! ```
//! use ferrofeed_stages::remote::{ObjectCache, RemoteObject};
//! let dir = tempfile::tempdir().unwrap();
//! let cache = ObjectCache::open(dir.path(), Some(1 << 20)).unwrap();
//! let obj = RemoteObject { key: "k/a.bin".into(), url: "s3://b/k/a.bin".into(), size: 3, etag: Some("e1".into()) };
//! assert!(cache.lookup(&obj).is_none());
//! let (path, fresh) = cache.fill(&obj, |f| { use std::io::Write; f.write_all(b"abc")?; Ok(()) }).unwrap();
//! assert!(fresh);
//! assert_eq!(std::fs::read(&path).unwrap(), b"abc");
//! assert_eq!(cache.lookup(&obj), Some(path));
//! ```
use std::fs::File;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::SystemTime;

use super::RemoteObject;

/// A folder of downloaded objects with an optional byte cap.
#[derive(Debug)]
pub struct ObjectCache {
    dir: PathBuf,
    cap: Option<u64>,
    /// This process's estimate of the folder's bytes (other processes add
    /// their own; a rescan before evicting finds the truth).
    bytes: AtomicU64,
}

/// FNV-1a over `parts` (each followed by a separator), from `seed`.
pub(crate) fn fnv(seed: u64, parts: &[&[u8]]) -> u64 {
    let mut h = 0xcbf2_9ce4_8422_2325u64 ^ seed;
    for p in parts {
        for b in p.iter().chain(&[0xff]) {
            h ^= u64::from(*b);
            h = h.wrapping_mul(0x0100_0000_01b3);
        }
    }
    h
}

impl ObjectCache {
    /// Opens (creating) `dir`; `cap` bounds the bytes kept there.
    pub fn open(dir: &Path, cap: Option<u64>) -> io::Result<ObjectCache> {
        std::fs::create_dir_all(dir.join("objects"))?;
        std::fs::create_dir_all(dir.join("locks"))?;
        crate::sweep_temporaries(&dir.join("objects"));
        let c = ObjectCache {
            dir: dir.to_path_buf(),
            cap,
            bytes: AtomicU64::new(0),
        };
        let total = c.entries()?.iter().map(|e| e.1).sum();
        c.bytes.store(total, Ordering::Relaxed);
        Ok(c)
    }

    /// The folder.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The byte cap.
    pub fn cap(&self) -> Option<u64> {
        self.cap
    }

    fn name(obj: &RemoteObject) -> String {
        let size = obj.size.to_le_bytes();
        let etag = obj.etag.as_deref().unwrap_or("").as_bytes();
        let parts: [&[u8]; 3] = [obj.url.as_bytes(), &size, etag];
        let base: String = obj
            .key
            .rsplit('/')
            .next()
            .unwrap_or("")
            .chars()
            .filter(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_'))
            .take(48)
            .collect();
        format!("{:016x}{:016x}-{base}", fnv(1, &parts), fnv(2, &parts))
    }

    /// Where `obj`'s entry lives (whether or not it is there).
    pub fn path_of(&self, obj: &RemoteObject) -> PathBuf {
        self.dir.join("objects").join(Self::name(obj))
    }

    /// The entry of `obj` when it is complete (its size matches), marked as
    /// just used.
    pub fn lookup(&self, obj: &RemoteObject) -> Option<PathBuf> {
        let p = self.path_of(obj);
        let meta = std::fs::metadata(&p).ok()?;
        if meta.len() != obj.size {
            // A foreign or damaged file under our name: never served.
            let _ = std::fs::remove_file(&p);
            return None;
        }
        if let Ok(f) = File::options().write(true).open(&p) {
            let _ = f.set_modified(SystemTime::now());
        }
        Some(p)
    }

    /// The entry of `obj`, made by `write` when missing. `write` fills a
    /// temporary file that is renamed into place only when it holds exactly
    /// `obj.size` bytes; an exclusive lock on the entry's lock file makes a
    /// second process or thread wait for the first and use its copy.
    /// Returns the path and whether this call wrote it.
    pub fn fill(
        &self,
        obj: &RemoteObject,
        write: impl FnOnce(&mut File) -> Result<(), super::BoxError>,
    ) -> Result<(PathBuf, bool), super::BoxError> {
        if let Some(p) = self.lookup(obj) {
            return Ok((p, false));
        }
        let name = Self::name(obj);
        let lock = File::options()
            .create(true)
            .truncate(false)
            .write(true)
            .open(self.dir.join("locks").join(&name))?;
        lock.lock()?;
        if let Some(p) = self.lookup(obj) {
            return Ok((p, false));
        }
        let final_path = self.dir.join("objects").join(&name);
        let tmp = self.dir.join("objects").join(format!(
            ".{name}.tmp-{}-{:?}",
            std::process::id(),
            std::thread::current().id()
        ));
        let result = (|| -> Result<(), super::BoxError> {
            // Readable too: a stream of the download reads what it wrote.
            let mut f = File::options()
                .read(true)
                .write(true)
                .create(true)
                .truncate(true)
                .open(&tmp)?;
            write(&mut f)?;
            let len = f.metadata()?.len();
            if len != obj.size {
                return Err(format!("{}: received {len} of {} bytes", obj.url, obj.size).into());
            }
            drop(f);
            std::fs::rename(&tmp, &final_path)?;
            Ok(())
        })();
        if result.is_err() {
            let _ = std::fs::remove_file(&tmp);
        }
        result?;
        self.bytes.fetch_add(obj.size, Ordering::Relaxed);
        Ok((final_path, true))
    }

    /// `(path, bytes, last use)` of every complete entry.
    fn entries(&self) -> io::Result<Vec<(PathBuf, u64, SystemTime)>> {
        let mut out = Vec::new();
        for e in std::fs::read_dir(self.dir.join("objects"))? {
            let e = e?;
            if e.file_name().to_string_lossy().starts_with('.') {
                continue;
            }
            if let Ok(m) = e.metadata() {
                if m.is_file() {
                    out.push((
                        e.path(),
                        m.len(),
                        m.modified().unwrap_or(SystemTime::UNIX_EPOCH),
                    ));
                }
            }
        }
        Ok(out)
    }

    /// Bytes held now (a scan of the folder).
    pub fn bytes(&self) -> u64 {
        self.entries().map_or(0, |e| e.iter().map(|x| x.1).sum())
    }

    /// Once the folder is past its cap, removes least recently used
    /// entries until it holds 90% of the cap (so a full cache is rescanned
    /// once per tenth of its cap downloaded, not per object); returns how
    /// many were removed. Readers that already opened or mapped an entry
    /// keep their copy.
    pub fn evict(&self) -> usize {
        let Some(cap) = self.cap else { return 0 };
        if self.bytes.load(Ordering::Relaxed) <= cap {
            return 0;
        }
        let Ok(mut entries) = self.entries() else {
            return 0;
        };
        entries.sort_by_key(|e| e.2);
        let mut total: u64 = entries.iter().map(|e| e.1).sum();
        let mut removed = 0;
        let low = if total > cap { cap - cap / 10 } else { cap };
        for (p, len, _) in entries {
            if total <= low {
                break;
            }
            if std::fs::remove_file(&p).is_ok() {
                total -= len;
                removed += 1;
            }
        }
        self.bytes.store(total, Ordering::Relaxed);
        removed
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;
    use std::sync::atomic::AtomicUsize;
    use std::sync::Arc;

    fn obj(name: &str, size: u64, etag: &str) -> RemoteObject {
        RemoteObject {
            key: name.into(),
            url: format!("s3://b/{name}"),
            size,
            etag: Some(etag.into()),
        }
    }

    #[test]
    fn a_short_write_is_never_served_and_leaves_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let c = ObjectCache::open(dir.path(), None).unwrap();
        let o = obj("a", 10, "e");
        let e = c.fill(&o, |f| Ok(f.write_all(b"12345")?)).unwrap_err();
        assert!(e.to_string().contains("received 5 of 10 bytes"), "{e}");
        assert!(c.lookup(&o).is_none());
        let e = c.fill(&o, |_| Err("connection reset".into())).unwrap_err();
        assert!(e.to_string().contains("reset"));
        assert_eq!(
            std::fs::read_dir(dir.path().join("objects"))
                .unwrap()
                .count(),
            0
        );
        // A damaged entry under the right name (truncated by hand) is dropped.
        let (p, _) = c.fill(&o, |f| Ok(f.write_all(b"0123456789")?)).unwrap();
        std::fs::write(&p, b"0123").unwrap();
        assert!(c.lookup(&o).is_none());
        assert!(!p.exists());
    }

    #[test]
    fn a_new_etag_or_size_is_a_new_entry() {
        let dir = tempfile::tempdir().unwrap();
        let c = ObjectCache::open(dir.path(), None).unwrap();
        c.fill(&obj("a", 1, "e1"), |f| Ok(f.write_all(b"x")?))
            .unwrap();
        assert!(c.lookup(&obj("a", 1, "e2")).is_none());
        assert!(c.lookup(&obj("a", 2, "e1")).is_none());
        assert!(c.lookup(&obj("a", 1, "e1")).is_some());
    }

    #[test]
    fn eviction_keeps_the_cap_and_the_recently_used() {
        let dir = tempfile::tempdir().unwrap();
        let c = ObjectCache::open(dir.path(), Some(3000)).unwrap();
        let objs: Vec<_> = (0..5).map(|i| obj(&format!("o{i}"), 1000, "e")).collect();
        for (i, o) in objs.iter().enumerate() {
            c.fill(o, |f| Ok(f.write_all(&[0u8; 1000])?)).unwrap();
            // Distinct mtimes; o0 is used again just before the last fill.
            std::thread::sleep(std::time::Duration::from_millis(15));
            if i == 3 {
                assert!(c.lookup(&objs[0]).is_some());
            }
            c.evict();
        }
        assert!(c.bytes() <= 3000, "{}", c.bytes());
        assert!(c.lookup(&objs[0]).is_some(), "recently used kept");
        assert!(c.lookup(&objs[4]).is_some());
        assert!(c.lookup(&objs[1]).is_none() && c.lookup(&objs[2]).is_none());
    }

    #[test]
    fn concurrent_fillers_write_once() {
        let dir = tempfile::tempdir().unwrap();
        let c = Arc::new(ObjectCache::open(dir.path(), None).unwrap());
        let writes = Arc::new(AtomicUsize::new(0));
        let o = obj("shared", 100_000, "e");
        let handles: Vec<_> = (0..8)
            .map(|_| {
                let (c, w, o) = (Arc::clone(&c), Arc::clone(&writes), o.clone());
                std::thread::spawn(move || {
                    let (p, _) = c
                        .fill(&o, |f| {
                            w.fetch_add(1, Ordering::SeqCst);
                            for _ in 0..100 {
                                f.write_all(&[7u8; 1000])?;
                                std::thread::sleep(std::time::Duration::from_micros(200));
                            }
                            Ok(())
                        })
                        .unwrap();
                    std::fs::read(p).unwrap()
                })
            })
            .collect();
        for h in handles {
            assert_eq!(h.join().unwrap(), vec![7u8; 100_000]);
        }
        assert_eq!(writes.load(Ordering::SeqCst), 1);
    }
}
