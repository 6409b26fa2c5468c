//! A byte-bounded LRU cache of decoded images, for datasets that fit in RAM:
//! later epochs skip decoding and only crop and resize.
//!
//! The cache holds full decoded images keyed by dataset index, so random
//! crops still differ per epoch; it is shared by every worker of the stage.
//!
//! ```
//! use std::sync::Arc;
//! use ferrofeed_vision::{Image, ImageCache};
//! let cache = ImageCache::new(100);
//! cache.insert(7, Arc::new(Image::new(4, 4, vec![0; 48]).unwrap()));
//! cache.insert(8, Arc::new(Image::new(4, 4, vec![1; 48]).unwrap()));
//! assert!(cache.get(7).is_some()); // 7 is now more recent than 8
//! cache.insert(9, Arc::new(Image::new(4, 4, vec![2; 48]).unwrap()));
//! assert!(cache.get(8).is_none(), "the least recently used entry was evicted");
//! assert!(cache.bytes() <= 100);
//! ```
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use crate::image::Image;
use ferrofeed_core::sync::LockExt;

/// Decoded images by dataset index, evicted least-recently-used first so
/// their bytes stay under a cap.
pub struct ImageCache {
    max_bytes: usize,
    inner: Mutex<Inner>,
    hits: AtomicU64,
    misses: AtomicU64,
}

struct Inner {
    lru: lru::LruCache<u64, Arc<Image>>,
    bytes: usize,
}

impl std::fmt::Debug for ImageCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ImageCache")
            .field("max_bytes", &self.max_bytes)
            .field("bytes", &self.bytes())
            .field("hits", &self.hits())
            .field("misses", &self.misses())
            .finish()
    }
}

impl ImageCache {
    /// A cache holding at most `max_bytes` of pixels.
    pub fn new(max_bytes: usize) -> Arc<ImageCache> {
        Arc::new(ImageCache {
            max_bytes,
            inner: Mutex::new(Inner {
                lru: lru::LruCache::unbounded(),
                bytes: 0,
            }),
            hits: AtomicU64::new(0),
            misses: AtomicU64::new(0),
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock_unpoisoned()
    }

    /// The image of `index`, marking it recently used.
    pub fn get(&self, index: u64) -> Option<Arc<Image>> {
        let hit = self.lock().lru.get(&index).cloned();
        let counter = if hit.is_some() {
            &self.hits
        } else {
            &self.misses
        };
        counter.fetch_add(1, Ordering::Relaxed);
        hit
    }

    /// Stores the image of `index`, evicting the least recently used until
    /// it fits; an image larger than the whole cache is not stored.
    pub fn insert(&self, index: u64, img: Arc<Image>) {
        let size = img.data.len();
        if size > self.max_bytes {
            return;
        }
        let mut inner = self.lock();
        if let Some(old) = inner.lru.put(index, img) {
            inner.bytes -= old.data.len();
        }
        inner.bytes += size;
        while inner.bytes > self.max_bytes {
            match inner.lru.pop_lru() {
                Some((_, old)) => inner.bytes -= old.data.len(),
                None => break,
            }
        }
    }

    /// Bytes of pixels held.
    pub fn bytes(&self) -> usize {
        self.lock().bytes
    }
    /// Images held.
    pub fn len(&self) -> usize {
        self.lock().lru.len()
    }
    /// Whether the cache is empty.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// Lookups that found their image.
    pub fn hits(&self) -> u64 {
        self.hits.load(Ordering::Relaxed)
    }
    /// Lookups that did not.
    pub fn misses(&self) -> u64 {
        self.misses.load(Ordering::Relaxed)
    }
}
