//! A feature cache on disk: each file's chunk features, keyed by the file
//! (path, size, modification time and an XXH3 hash of its bytes) and every
//! setting that shapes them, so later epochs and later runs read features
//! instead of decoding, and a file rewritten in place is never served stale.
//!
//! - One entry per audio file, written as the features are computed (never
//!   held whole in memory) to a temporary file that is renamed into place
//!   when complete: readers see a whole entry or none, and two processes
//!   filling the same entry both leave a valid one.
//! - An entry ends with a CRC-32 of everything before it and its record
//!   count; a truncated or corrupt entry, or one made for other settings,
//!   is a miss — recomputed and replaced, never served.
//! - Read through a memory map; a size cap evicts the least recently used
//!   entries (a [`CacheFolder`](ferrofeed_stages::CacheFolder), cut to 90%
//!   of its cap when full); a folder that cannot be written makes the run uncached (one
//!   warning), not failed.
//!
//! ```
//! use ferrofeed_audio::FeatureCache;
//! let dir = std::env::temp_dir().join(format!("ff-doc-cache-{}", std::process::id()));
//! let cache = FeatureCache::open(&dir, 1 << 30).unwrap();
//! assert_eq!((cache.folder().hits(), cache.folder().misses()), (0, 0));
//! # std::fs::remove_dir_all(&dir).ok();
//! ```
use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::SystemTime;

use ferrofeed_core::{BoxError, IterableSource, ShardEpoch, ShardIter};
use ferrofeed_stages::{cache_key, CacheFolder};

use crate::features::Features;
use crate::files::AudioFiles;
use crate::stage::{ChunkFeatures, FeatureStage};
use crate::stream::ChunkStream;

const MAGIC: &[u8; 4] = b"FFAC";
const END: &[u8; 4] = b"FEND";
const VERSION: u32 = 1;
/// magic, version, key (16), bins, frames, channels.
const HEADER: usize = 4 + 4 + 16 + 4 * 3;
/// chunks, total samples, crc, end magic.
const TRAILER: usize = 4 + 8 + 4 + 4;

/// Where entries live, and what was found there.
#[derive(Debug)]
pub struct FeatureCache {
    folder: CacheFolder,
    /// Each file's content hash, by (path, size, mtime): hashed once per
    /// process, not once per segment or epoch.
    digests: std::sync::Mutex<std::collections::HashMap<(PathBuf, u64, u128), u128>>,
}

impl FeatureCache {
    /// The cache in `dir` (created if missing), holding at most `max_bytes`.
    pub fn open(dir: &Path, max_bytes: u64) -> Result<Arc<FeatureCache>, std::io::Error> {
        Ok(Arc::new(FeatureCache {
            folder: CacheFolder::open(dir, "ffac", max_bytes)?,
            digests: std::sync::Mutex::default(),
        }))
    }

    /// The folder and its counts: a hit is a file (or segment) whose
    /// features were read from the cache, a miss one whose features were
    /// computed.
    pub fn folder(&self) -> &CacheFolder {
        &self.folder
    }

    /// The key of `path`'s features under `settings`; `None` when the file
    /// cannot be read (the decode then reports it).
    fn key(&self, path: &Path, settings: &str) -> Option<[u8; 16]> {
        use ferrofeed_core::sync::LockExt;
        let meta = std::fs::metadata(path).ok().filter(|m| m.is_file())?;
        let mtime = meta
            .modified()
            .ok()?
            .duration_since(SystemTime::UNIX_EPOCH)
            .ok()?
            .as_nanos();
        let canon = std::fs::canonicalize(path).unwrap_or_else(|_| path.to_path_buf());
        // The bytes too: a file rewritten with its size and time kept is
        // another entry.
        let id = (canon, meta.len(), mtime);
        let known = self.digests.lock_unpoisoned().get(&id).copied();
        let content = match known {
            Some(d) => d,
            None => {
                let d = ferrofeed_stages::content_digest(path).ok()?;
                self.digests.lock_unpoisoned().insert(id.clone(), d);
                d
            }
        };
        let (canon, len, mtime) = id;
        Some(cache_key(
            0x6666_6163,
            &(&canon, len, mtime, content, settings, VERSION),
        ))
    }

    /// The entry for `key`, checked whole; `None` when missing, truncated,
    /// corrupt or made for another key.
    fn read(&self, key: &[u8; 16]) -> Option<Entry> {
        let path = self.folder.entry(key);
        let file = File::open(&path).ok()?;
        // SAFETY: entries are only ever replaced by rename, never written in
        // place, so the mapped file does not change under the map.
        let map = unsafe { memmap2::Mmap::map(&file) }.ok()?;
        let e = Entry::parse(map, key)?;
        // Recently used: eviction removes the oldest first.
        let _ = file.set_modified(SystemTime::now());
        Some(e)
    }
}

/// A checked entry.
struct Entry {
    map: memmap2::Mmap,
    bins: usize,
    frames: usize,
    channels: usize,
    chunks: usize,
    total: u64,
}

fn u32_at(b: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_le_bytes(b.get(at..at + 4)?.try_into().ok()?))
}
fn u64_at(b: &[u8], at: usize) -> Option<u64> {
    Some(u64::from_le_bytes(b.get(at..at + 8)?.try_into().ok()?))
}

impl Entry {
    fn record_len(bins: usize, frames: usize, channels: usize) -> Option<usize> {
        12usize.checked_add(
            bins.checked_mul(frames)?
                .checked_mul(channels)?
                .checked_mul(4)?,
        )
    }

    fn parse(map: memmap2::Mmap, key: &[u8; 16]) -> Option<Entry> {
        let b = &map[..];
        if b.len() < HEADER + TRAILER
            || &b[..4] != MAGIC
            || u32_at(b, 4)? != VERSION
            || &b[8..24] != key
        {
            return None;
        }
        let (bins, frames, channels) = (
            u32_at(b, 24)? as usize,
            u32_at(b, 28)? as usize,
            u32_at(b, 32)? as usize,
        );
        let t = b.len() - TRAILER;
        let chunks = u32_at(b, t)? as usize;
        let total = u64_at(b, t + 4)?;
        let crc = u32_at(b, t + 12)?;
        if &b[t + 16..] != END {
            return None;
        }
        let rec = Self::record_len(bins, frames, channels)?;
        if HEADER.checked_add(chunks.checked_mul(rec)?)? != t {
            return None;
        }
        if crc32fast::hash(&b[..t + 12]) != crc {
            return None;
        }
        Some(Entry {
            map,
            bins,
            frames,
            channels,
            chunks,
            total,
        })
    }

    fn chunk(&self, i: usize) -> Option<ChunkFeatures> {
        let rec = Self::record_len(self.bins, self.frames, self.channels)?;
        let at = HEADER + i * rec;
        let b = self.map.get(at..at + rec)?;
        let valid = u32_at(b, 0)? as usize;
        let start = u64_at(b, 4)?;
        let data: Vec<f32> = b[12..]
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect();
        Some(ChunkFeatures {
            features: Features {
                data,
                bins: self.bins,
                frames: self.frames,
            },
            channels: self.channels,
            valid,
            start,
        })
    }
}

/// Writes an entry as its chunks are computed; renamed into place only when
/// finished whole.
struct Writer {
    tmp: PathBuf,
    out: BufWriter<File>,
    crc: crc32fast::Hasher,
    key: [u8; 16],
    dims: Option<(usize, usize, usize)>,
    chunks: u32,
    bytes: u64,
}

impl Writer {
    fn new(cache: &FeatureCache, key: [u8; 16]) -> std::io::Result<Writer> {
        let tmp = cache.folder.temp();
        Ok(Writer {
            out: BufWriter::new(File::create(&tmp)?),
            tmp,
            crc: crc32fast::Hasher::new(),
            key,
            dims: None,
            chunks: 0,
            bytes: 0,
        })
    }

    fn put(&mut self, bytes: &[u8]) -> std::io::Result<()> {
        self.crc.update(bytes);
        self.bytes += bytes.len() as u64;
        self.out.write_all(bytes)
    }

    fn header(&mut self, bins: usize, frames: usize, channels: usize) -> std::io::Result<()> {
        let mut h = Vec::with_capacity(HEADER);
        h.extend_from_slice(MAGIC);
        h.extend_from_slice(&VERSION.to_le_bytes());
        h.extend_from_slice(&self.key);
        for v in [bins, frames, channels] {
            h.extend_from_slice(&u32::try_from(v).unwrap_or(u32::MAX).to_le_bytes());
        }
        self.dims = Some((bins, frames, channels));
        self.put(&h)
    }

    fn chunk(&mut self, c: &ChunkFeatures) -> std::io::Result<()> {
        let dims = (c.features.bins, c.features.frames, c.channels.max(1));
        match self.dims {
            None => self.header(dims.0, dims.1, dims.2)?,
            Some(d) if d != dims => {
                return Err(std::io::Error::other("chunks of one file differ in shape"))
            }
            Some(_) => {}
        }
        let mut r = Vec::with_capacity(12 + c.features.data.len() * 4);
        r.extend_from_slice(&u32::try_from(c.valid).unwrap_or(u32::MAX).to_le_bytes());
        r.extend_from_slice(&c.start.to_le_bytes());
        for v in &c.features.data {
            r.extend_from_slice(&v.to_le_bytes());
        }
        self.chunks += 1;
        self.put(&r)
    }

    fn finish(mut self, cache: &FeatureCache, total: u64) -> std::io::Result<PathBuf> {
        if self.dims.is_none() {
            self.header(0, 0, 1)?;
        }
        let mut t = Vec::with_capacity(TRAILER);
        t.extend_from_slice(&self.chunks.to_le_bytes());
        t.extend_from_slice(&total.to_le_bytes());
        self.put(&t)?;
        let crc = self.crc.clone().finalize();
        self.out.write_all(&crc.to_le_bytes())?;
        self.out.write_all(END)?;
        self.out.flush()?;
        self.out.get_ref().sync_data()?;
        let dest = cache.folder.entry(&self.key);
        std::fs::rename(&self.tmp, &dest)?;
        cache.folder.added(self.bytes + 8, &dest);
        Ok(dest)
    }
}

impl Drop for Writer {
    fn drop(&mut self) {
        // Unfinished: nothing is renamed into place; a finished one was
        // renamed and this removes nothing.
        let _ = std::fs::remove_file(&self.tmp);
    }
}

/// Audio files as chunk features, through a [`FeatureCache`]: a file with a
/// valid entry is read from it; any other is decoded, its features computed
/// and its entry written as they are streamed out.
pub struct CachedFeatures {
    files: AudioFiles,
    features: FeatureStage,
    cache: Arc<FeatureCache>,
    settings: String,
}

impl CachedFeatures {
    /// `files` → `features`, cached in `cache`.
    pub fn new(files: AudioFiles, features: FeatureStage, cache: Arc<FeatureCache>) -> Self {
        let settings = format!("{:?} {}", files.options(), features.settings());
        CachedFeatures {
            files,
            features,
            cache,
            settings,
        }
    }

    /// The files, in shard order.
    pub fn files(&self) -> &[PathBuf] {
        self.files.files()
    }

    /// The counter of samples read (decoded or from entries).
    pub fn samples_read(&self) -> Arc<AtomicU64> {
        self.files.samples_read()
    }
}

impl IterableSource for CachedFeatures {
    type Output = ChunkFeatures;
    fn shard_len(&self, shard: usize) -> Option<u64> {
        self.files.shard_len(shard)
    }
    fn shard_len_at(&self, shard: usize, at: ShardEpoch) -> Option<u64> {
        self.files.shard_len_at(shard, at)
    }
    fn num_shards(&self) -> usize {
        self.files.num_shards()
    }
    fn shard_key(&self, shard: usize) -> String {
        self.files.shard_key(shard)
    }
    fn open(&self, shard: usize) -> Result<ShardIter<ChunkFeatures>, BoxError> {
        self.open_at(shard, ShardEpoch::default())
    }
    /// With random chunk offsets each offset is an entry of its own: after
    /// the first epochs every offset of a file is cached.
    fn open_at(&self, shard: usize, at: ShardEpoch) -> Result<ShardIter<ChunkFeatures>, BoxError> {
        let offset = self.files.offset_at(shard, at);
        let seg = *self
            .files
            .segments()
            .get(shard)
            .ok_or_else(|| BoxError::from(format!("no shard {shard}")))?;
        let path = self.files.files()[seg.file].clone();
        let mut settings = self.settings.clone();
        if offset != 0 {
            settings.push_str(&format!(" offset {offset}"));
        }
        if !seg.is_whole() {
            // A segment is an entry of its own.
            settings.push_str(&format!(" chunks {}+{:?}", seg.first, seg.count));
        }
        let key = self.cache.key(&path, &settings);
        let cache = Arc::clone(&self.cache);
        if let Some(e) = key.as_ref().and_then(|k| cache.read(k)) {
            cache.folder.hit(e.map.len() as u64);
            self.files
                .samples_read()
                .fetch_add(e.total, Ordering::Relaxed);
            let n = e.chunks;
            return Ok(Box::new((0..n).map(move |i| {
                e.chunk(i)
                    .ok_or_else(|| BoxError::from("feature cache entry changed while read"))
            })));
        }
        cache.folder.miss();
        let mut stream =
            ChunkStream::open_segment(&path, self.files.options(), offset, seg.first, seg.count)?;
        let counter = self.files.samples_read();
        let before = Arc::new(AtomicU64::new(0));
        stream.counter = Some(Arc::clone(&before));
        let features = self.features.clone();
        let mut writer = match key {
            Some(k) if cache.folder.writable() => match Writer::new(&cache, k) {
                Ok(w) => Some(w),
                Err(e) => {
                    if cache.folder.write_failed() {
                        tracing::warn!(
                            "feature cache {}: {e}; running uncached",
                            cache.folder.dir().display()
                        );
                    }
                    None
                }
            },
            _ => None,
        };
        let mut done = false;
        Ok(Box::new(std::iter::from_fn(move || {
            if done {
                return None;
            }
            match stream.next() {
                Some(Ok(chunk)) => {
                    let f = features.features_of(chunk);
                    // A chunk that fails, or an entry that cannot be
                    // written, leaves this file uncached.
                    let kept = match (&f, writer.as_mut()) {
                        (Ok(c), Some(w)) => w.chunk(c).is_ok(),
                        _ => false,
                    };
                    if !kept {
                        writer = None;
                    }
                    Some(f)
                }
                Some(Err(e)) => {
                    writer = None;
                    done = true;
                    Some(Err(BoxError::from(e)))
                }
                None => {
                    done = true;
                    let total = before.load(Ordering::Relaxed);
                    counter.fetch_add(total, Ordering::Relaxed);
                    if let Some(w) = writer.take() {
                        // Accounted in the folder, which evicts when due.
                        let _ = w.finish(&cache, total);
                    }
                    None
                }
            }
        })))
    }
}
