//! Components produced by the readers.
//!
//! ```
//! use ferrofeed_core::Component;
//! use ferrofeed_stages::Bytes;
//! let b = Bytes::from(vec![0u8; 10]);
//! assert_eq!(b.nbytes(), 10);
//! ```
use std::fmt;
use std::ops::{Deref, Range};
use std::path::PathBuf;
use std::sync::Arc;

use ferrofeed_core::{Collatable, Component};

/// A file's path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FilePath(pub PathBuf);

impl Component for FilePath {
    fn nbytes(&self) -> usize {
        self.0.as_os_str().len()
    }
    fn describe(&self) -> String {
        self.0.display().to_string()
    }
}

/// An integer class label.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Label(pub i64);

impl Component for Label {
    fn nbytes(&self) -> usize {
        8
    }
    fn describe(&self) -> String {
        self.0.to_string()
    }
}

impl Collatable for Label {
    type Elem = i64;
    fn shape(&self) -> Vec<usize> {
        Vec::new()
    }
    fn write(&self, out: &mut [i64]) {
        out[0] = self.0;
    }
}

/// Encoded bytes of a sample (a JPEG, a text line, a WAV file…), owned or
/// a range of a memory-mapped file. Cloning is cheap.
#[derive(Clone)]
pub enum Bytes {
    /// Heap bytes (the reader's own vector, shared without a copy).
    Owned(Arc<Vec<u8>>),
    /// A slice of a memory map.
    Mapped {
        /// The map.
        map: Arc<memmap2::Mmap>,
        /// The slice.
        range: Range<usize>,
    },
}

impl From<Vec<u8>> for Bytes {
    fn from(v: Vec<u8>) -> Self {
        Bytes::Owned(Arc::new(v))
    }
}

impl Deref for Bytes {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        match self {
            Bytes::Owned(b) => b,
            Bytes::Mapped { map, range } => &map[range.clone()],
        }
    }
}

impl fmt::Debug for Bytes {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Bytes({} bytes)", self.len())
    }
}

impl Component for Bytes {
    fn nbytes(&self) -> usize {
        self.len()
    }
    fn describe(&self) -> String {
        let head: Vec<String> = self.iter().take(8).map(|b| format!("{b:02x}")).collect();
        format!(
            "{} bytes [{}{}]",
            self.len(),
            head.join(" "),
            if self.len() > 8 { " …" } else { "" }
        )
    }
}
