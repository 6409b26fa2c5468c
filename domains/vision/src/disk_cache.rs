//! Decoded images on disk, for datasets larger than RAM: later epochs and
//! later runs read pixels instead of decoding JPEGs.
//!
//! An entry is keyed by a 128-bit hash of the encoded bytes and the decode
//! settings, so a file that changes (or a different setting) is a new
//! entry, whatever its path, and tar members and downloaded objects are
//! keyed alike. Entries are written to a temporary file and renamed whole,
//! so several processes sharing the folder never read a half-written entry
//! (two filling the same entry write the same bytes; the last rename
//! wins). Each entry carries its key and a CRC of its pixels: a truncated,
//! corrupt or foreign entry is removed and the image decoded again, never
//! served. Least recently used entries go first once the folder passes its
//! cap (a [`CacheFolder`](ferrofeed_stages::CacheFolder): cut to 90% of it,
//! so a full cache is not rescanned per image). A folder that cannot be written leaves the cache off, said once.
//!
//! ```
//! use ferrofeed_vision::{Image, ImageDiskCache};
//! let dir = tempfile::tempdir().unwrap();
//! let cache = ImageDiskCache::open(dir.path(), 1 << 20).unwrap();
//! let key = cache.key(b"the encoded bytes", "settings");
//! assert!(cache.get(&key).is_none());
//! let img = Image::new(2, 1, vec![1, 2, 3, 4, 5, 6]).unwrap();
//! cache.put(&key, &img);
//! assert_eq!(cache.get(&key).unwrap().data, img.data);
//! assert_eq!((cache.folder().hits(), cache.folder().misses()), (1, 1));
//! ```
use std::io::Write;
use std::path::Path;
use std::sync::Arc;

use ferrofeed_stages::{cache_key, CacheFolder};

use crate::image::Image;

const MAGIC: &[u8; 4] = b"FFIC";
const VERSION: u32 = 1;
/// Magic, version, key, width, height, CRC.
const HEADER: usize = 4 + 4 + 16 + 4 + 4 + 4;

/// A folder of decoded images with a byte cap.
#[derive(Debug)]
pub struct ImageDiskCache {
    folder: CacheFolder,
}

impl ImageDiskCache {
    /// Opens (creating) `dir`, capped at `max_bytes`.
    pub fn open(dir: &Path, max_bytes: u64) -> std::io::Result<Arc<ImageDiskCache>> {
        Ok(Arc::new(ImageDiskCache {
            folder: CacheFolder::open(dir, "ffic", max_bytes)?,
        }))
    }

    /// The key of an image encoded as `encoded`, decoded under `settings`
    /// (anything that hashes, such as the [`DecodeOptions`](crate::DecodeOptions)).
    pub fn key<S: std::hash::Hash + ?Sized>(&self, encoded: &[u8], settings: &S) -> [u8; 16] {
        cache_key(0x6966_6361, &(encoded, settings, VERSION))
    }

    /// The image stored under `key`, checked whole; `None` (a miss) when
    /// missing, truncated, corrupt or made for another key — such an entry
    /// is removed.
    pub fn get(&self, key: &[u8; 16]) -> Option<Image> {
        let path = self.folder.entry(key);
        let got = std::fs::read(&path).ok().and_then(|b| {
            let img = parse(&b, key);
            if img.is_none() {
                let _ = std::fs::remove_file(&path);
            }
            img.map(|i| (i, b.len()))
        });
        match got {
            Some((img, n)) => {
                self.folder.hit(n as u64);
                CacheFolder::touch(&path);
                Some(img)
            }
            None => {
                self.folder.miss();
                None
            }
        }
    }

    /// Stores `img` under `key` (temporary file, then rename); then evicts
    /// least recently used entries when the folder passes its cap. An image
    /// larger than the cap is not stored. A write that fails turns the
    /// cache off, said once.
    pub fn put(&self, key: &[u8; 16], img: &Image) {
        let size = (HEADER + img.data.len()) as u64;
        if !self.folder.writable() || size > self.folder.cap() {
            return;
        }
        let dest = self.folder.entry(key);
        let tmp = self.folder.temp();
        let write = || -> std::io::Result<()> {
            let mut f = std::io::BufWriter::new(std::fs::File::create(&tmp)?);
            f.write_all(MAGIC)?;
            f.write_all(&VERSION.to_le_bytes())?;
            f.write_all(key)?;
            f.write_all(&img.width.to_le_bytes())?;
            f.write_all(&img.height.to_le_bytes())?;
            f.write_all(&crc32fast::hash(&img.data).to_le_bytes())?;
            f.write_all(&img.data)?;
            f.flush()?;
            drop(f);
            std::fs::rename(&tmp, &dest)
        };
        if let Err(e) = write() {
            let _ = std::fs::remove_file(&tmp);
            if self.folder.write_failed() {
                tracing::warn!(
                    "image cache {}: {e}; running without it",
                    self.folder.dir().display()
                );
            }
            return;
        }
        self.folder.added(size, &dest);
    }

    /// The folder and its counts (hits: entries found valid).
    pub fn folder(&self) -> &CacheFolder {
        &self.folder
    }
}

fn u32_at(b: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_le_bytes(b.get(at..at + 4)?.try_into().ok()?))
}

/// The image in entry bytes `b`, if they are whole and made for `key`.
fn parse(b: &[u8], key: &[u8; 16]) -> Option<Image> {
    if b.get(..4)? != MAGIC || u32_at(b, 4)? != VERSION || b.get(8..24)? != key {
        return None;
    }
    let (w, h, crc) = (u32_at(b, 24)?, u32_at(b, 28)?, u32_at(b, 32)?);
    let n = (w as usize).checked_mul(h as usize)?.checked_mul(3)?;
    let pixels = b.get(HEADER..)?;
    if pixels.len() != n || crc32fast::hash(pixels) != crc {
        return None;
    }
    Image::new(w, h, pixels.to_vec()).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn img(seed: u8, w: u32, h: u32) -> Image {
        let data = (0..w * h * 3)
            .map(|i| (i as u8).wrapping_mul(seed))
            .collect();
        Image::new(w, h, data).unwrap()
    }

    #[test]
    fn a_damaged_or_foreign_entry_is_a_miss_and_goes() {
        let dir = tempfile::tempdir().unwrap();
        let c = ImageDiskCache::open(dir.path(), 1 << 20).unwrap();
        let (k1, k2) = (c.key(b"one", "s"), c.key(b"two", "s"));
        assert_ne!(k1, c.key(b"one", "other settings"));
        let a = img(3, 8, 5);
        c.put(&k1, &a);
        assert_eq!(c.get(&k1).unwrap().data, a.data);
        let path = c.folder.entry(&k1);
        let whole = std::fs::read(&path).unwrap();
        // Truncated, a flipped pixel, another key's entry under this name.
        let mut flipped = whole.clone();
        *flipped.last_mut().unwrap() ^= 1;
        let mut foreign = whole.clone();
        foreign[8..24].copy_from_slice(&k2);
        for bad in [
            whole[..whole.len() - 1].to_vec(),
            flipped,
            foreign,
            Vec::new(),
        ] {
            std::fs::write(&path, &bad).unwrap();
            assert!(c.get(&k1).is_none());
            assert!(!path.exists(), "a bad entry is removed");
        }
        // Nothing half-written is left behind.
        c.put(&k1, &a);
        let names: Vec<_> = std::fs::read_dir(dir.path()).unwrap().collect();
        assert_eq!(names.len(), 1);
    }

    #[test]
    fn eviction_keeps_the_cap_and_the_recently_used() {
        let dir = tempfile::tempdir().unwrap();
        let one = (HEADER + 10 * 10 * 3) as u64;
        let c = ImageDiskCache::open(dir.path(), 3 * one).unwrap();
        let keys: Vec<[u8; 16]> = (0..5u8).map(|i| c.key(&[i], "s")).collect();
        for (i, k) in keys.iter().enumerate().take(3) {
            c.put(k, &img(i as u8 + 1, 10, 10));
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        assert!(c.get(&keys[0]).is_some(), "0 is now the most recent");
        std::thread::sleep(std::time::Duration::from_millis(20));
        c.put(&keys[3], &img(9, 10, 10));
        let total: u64 = c.folder.scan().iter().map(|e| e.1).sum();
        assert!(total <= 3 * one);
        assert!(c.get(&keys[1]).is_none(), "the least recently used went");
        assert!(c.get(&keys[0]).is_some() && c.get(&keys[3]).is_some());
        // Larger than the whole cap: not stored.
        c.put(&keys[4], &img(1, 40, 40));
        assert!(c.get(&keys[4]).is_none());
    }

    #[test]
    fn a_folder_that_cannot_be_written_leaves_the_cache_off() {
        let dir = tempfile::tempdir().unwrap();
        let at = dir.path().join("cache");
        let c = ImageDiskCache::open(&at, 1 << 20).unwrap();
        // The folder is replaced by a file: every write fails.
        std::fs::remove_dir(&at).unwrap();
        std::fs::write(&at, b"not a folder").unwrap();
        let k = c.key(b"x", "s");
        c.put(&k, &img(1, 4, 4));
        assert!(!c.folder.writable());
        assert!(c.get(&k).is_none());
        assert_eq!(c.folder().bytes_written(), 0);
        assert!(
            ImageDiskCache::open(&at, 1 << 20).is_err(),
            "a file is no folder"
        );
    }
}
