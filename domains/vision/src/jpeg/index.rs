//! The scan index: marks per dataset sample, shared by a stage's workers
//! and bounded in bytes.

use super::layout::{Layout, Mark};
use ferrofeed_core::sync::LockExt;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

/// MCU marks per dataset sample, shared by a stage's workers, bounded in
/// bytes (once full, new images are not indexed; their decodes take the
/// ordinary path). An entry reserves room for every MCU of its image.
pub struct ScanIndex {
    max_bytes: usize,
    bytes: AtomicUsize,
    inner: Mutex<HashMap<u64, Entry>>,
    hits: AtomicU64,
    misses: AtomicU64,
}

#[derive(Clone)]
struct Entry {
    /// Identifies the file: its length and a hash of its headers and end.
    check: (usize, u64),
    marks: Arc<Vec<Mark>>,
    /// Bytes counted against the cap.
    size: usize,
}

impl std::fmt::Debug for ScanIndex {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ScanIndex")
            .field("max_bytes", &self.max_bytes)
            .field("bytes", &self.bytes())
            .field("hits", &self.hits.load(Ordering::Relaxed))
            .field("misses", &self.misses.load(Ordering::Relaxed))
            .finish()
    }
}

/// Bytes an entry costs besides its marks (key, length, hash, table slot).
pub(super) const ENTRY_OVERHEAD: usize = 64;

impl ScanIndex {
    /// An index holding at most `max_bytes` of marks.
    pub fn new(max_bytes: usize) -> Arc<ScanIndex> {
        Arc::new(ScanIndex {
            max_bytes,
            bytes: AtomicUsize::new(0),
            inner: Mutex::new(HashMap::new()),
            hits: AtomicU64::new(0),
            misses: AtomicU64::new(0),
        })
    }

    /// Bytes held.
    pub fn bytes(&self) -> usize {
        self.bytes.load(Ordering::Relaxed)
    }

    /// Images with marks.
    pub fn images(&self) -> usize {
        self.inner.lock_unpoisoned().len()
    }

    /// Lookups that found every mark they needed.
    pub fn hits(&self) -> u64 {
        self.hits.load(Ordering::Relaxed)
    }

    /// Lookups that had to parse MCUs.
    pub fn misses(&self) -> u64 {
        self.misses.load(Ordering::Relaxed)
    }

    /// The marks of sample `key` through mark `upto` (see
    /// [`Layout::scan`]), parsing (and remembering) what is not yet
    /// marked; `None` when the data is bad or the image's marks would not
    /// fit in the byte cap.
    pub fn marks(
        &self,
        key: u64,
        bytes: &[u8],
        layout: &Layout,
        upto: usize,
    ) -> Option<Arc<Vec<Mark>>> {
        let upto = upto.min(layout.mcus());
        let check = (bytes.len(), file_hash(bytes, layout.data_start));
        // Room for the whole image's marks, so an entry grows in place.
        let full = ENTRY_OVERHEAD + (layout.mcus() + 1) * std::mem::size_of::<Mark>();
        // An entry that must grow is taken out while it does: a sample is
        // decoded by one worker at a time, and an entry held alone grows
        // without a copy.
        let taken = {
            let mut inner = self.inner.lock_unpoisoned();
            match inner.get(&key) {
                Some(e) if e.check == check && e.marks.len() > upto => {
                    self.hits.fetch_add(1, Ordering::Relaxed);
                    return Some(Arc::clone(&e.marks));
                }
                Some(e) if e.check == check => inner.remove(&key),
                Some(_) => {
                    // Another file under this key: forget the old one.
                    if let Some(old) = inner.remove(&key) {
                        self.bytes.fetch_sub(old.size, Ordering::Relaxed);
                    }
                    None
                }
                None => None,
            }
        };
        self.misses.fetch_add(1, Ordering::Relaxed);
        let (mut marks, size) = match taken {
            Some(e) => {
                let marks = Arc::try_unwrap(e.marks).unwrap_or_else(|shared| {
                    let mut v = Vec::with_capacity(layout.mcus() + 1);
                    v.extend_from_slice(&shared);
                    v
                });
                (marks, e.size)
            }
            None => {
                if self.bytes() + full > self.max_bytes {
                    return None;
                }
                self.bytes.fetch_add(full, Ordering::Relaxed);
                let mut v = Vec::with_capacity(layout.mcus() + 1);
                v.push(Mark::start(layout));
                (v, full)
            }
        };
        let scanned = layout.scan(bytes, &mut marks, upto);
        let marks = Arc::new(marks);
        // Marks found before a failure are still right: kept either way.
        let mut inner = self.inner.lock_unpoisoned();
        let entry = Entry {
            check,
            marks: Arc::clone(&marks),
            size,
        };
        if let Some(raced) = inner.insert(key, entry) {
            self.bytes.fetch_sub(raced.size, Ordering::Relaxed);
        }
        scanned?;
        Some(marks)
    }
}

/// A 64-bit hash of the headers (tables, size) and the last 32 bytes.
fn file_hash(bytes: &[u8], header_end: usize) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    let end = &bytes[bytes.len().saturating_sub(32)..];
    for chunk in bytes[..header_end.min(bytes.len())]
        .chunks(8)
        .chain(end.chunks(8))
    {
        let mut w = [0u8; 8];
        w[..chunk.len()].copy_from_slice(chunk);
        h = (h ^ u64::from_le_bytes(w))
            .wrapping_mul(0x0000_0100_0000_01b3)
            .rotate_left(29);
    }
    h
}
