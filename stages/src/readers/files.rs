//! File lists and the [`ReadFile`] stage.
//!
//! ```
//! use ferrofeed_core::Source;
//! use ferrofeed_stages::{Files, FilePath};
//! let files = Files::new(vec!["a.jpg".into(), "b.jpg".into()]);
//! assert_eq!(files.len(), 2);
//! assert_eq!(files.get(1).unwrap(), FilePath("b.jpg".into()));
//! assert_eq!(files.key(0).as_deref(), Some("a.jpg"));
//! ```
use std::io::Read;
use std::path::PathBuf;

use ferrofeed_core::{BoxError, Source, Stage, StageCtx};

use crate::components::{Bytes, FilePath, Label};

/// A list of files; each sample starts with its [`FilePath`].
#[derive(Debug, Clone)]
pub struct Files {
    paths: Vec<PathBuf>,
}

impl Files {
    /// Samples are `paths` in order.
    pub fn new(paths: Vec<PathBuf>) -> Self {
        Files { paths }
    }
    /// The paths.
    pub fn paths(&self) -> &[PathBuf] {
        &self.paths
    }
}

impl Source for Files {
    type Output = FilePath;
    fn len(&self) -> u64 {
        self.paths.len() as u64
    }
    fn get(&self, index: u64) -> Result<FilePath, BoxError> {
        let p = self
            .paths
            .get(index as usize)
            .ok_or_else(|| format!("index {index} is past the end"))?;
        Ok(FilePath(p.clone()))
    }
    fn key(&self, index: u64) -> Option<String> {
        self.paths
            .get(index as usize)
            .map(|p| p.display().to_string())
    }
}

/// A list of `(file, label)` pairs; each sample starts with its
/// [`FilePath`] and [`Label`].
#[derive(Debug, Clone)]
pub struct LabeledFiles {
    items: Vec<(PathBuf, i64)>,
}

impl LabeledFiles {
    /// Samples are `items` in order.
    pub fn new(items: Vec<(PathBuf, i64)>) -> Self {
        LabeledFiles { items }
    }
    /// The `(path, label)` pairs.
    pub fn items(&self) -> &[(PathBuf, i64)] {
        &self.items
    }
}

impl Source for LabeledFiles {
    type Output = (FilePath, Label);
    fn len(&self) -> u64 {
        self.items.len() as u64
    }
    fn get(&self, index: u64) -> Result<(FilePath, Label), BoxError> {
        let (p, l) = self
            .items
            .get(index as usize)
            .ok_or_else(|| format!("index {index} is past the end"))?;
        Ok((FilePath(p.clone()), Label(*l)))
    }
    fn key(&self, index: u64) -> Option<String> {
        self.items
            .get(index as usize)
            .map(|(p, _)| p.display().to_string())
    }
}

/// Reads a file's bytes (`FilePath → Bytes`). Files at or above
/// `mmap_threshold` are memory-mapped instead of copied; files larger than
/// `max_bytes` are refused before reading.
#[derive(Debug, Clone, Copy)]
pub struct ReadFile {
    /// Largest file accepted.
    pub max_bytes: u64,
    /// Files this large or larger are memory-mapped.
    pub mmap_threshold: u64,
}

impl Default for ReadFile {
    fn default() -> Self {
        ReadFile {
            max_bytes: 1 << 30,
            mmap_threshold: 4 << 20,
        }
    }
}

impl ReadFile {
    /// Reads `path` under this stage's limits.
    pub fn read(&self, path: &std::path::Path) -> Result<Bytes, BoxError> {
        let (mut f, meta) = ferrofeed_core::open_regular(path)?;
        let len = meta.len();
        if len > self.max_bytes {
            return Err(format!(
                "file is {len} bytes, over the {} byte limit",
                self.max_bytes
            )
            .into());
        }
        if len >= self.mmap_threshold {
            // SAFETY: the map is read-only; a file truncated underneath us
            // is the same hazard every mmap reader accepts.
            let map = unsafe { memmap2::Mmap::map(&f)? };
            let n = map.len();
            return Ok(Bytes::Mapped {
                map: std::sync::Arc::new(map),
                range: 0..n,
            });
        }
        // `read_to_end` fills the vector's spare capacity without zeroing
        // it first; the `Vec` becomes the shared buffer without a copy. A
        // file that grew since its metadata was read is still held to the
        // limit.
        let mut v = Vec::with_capacity(len as usize + 1);
        (&mut f).take(self.max_bytes + 1).read_to_end(&mut v)?;
        if v.len() as u64 > self.max_bytes {
            return Err(format!(
                "file grew past the {} byte limit while being read",
                self.max_bytes
            )
            .into());
        }
        Ok(Bytes::from(v))
    }
}

impl Stage for ReadFile {
    type In = FilePath;
    type Out = Bytes;
    fn process(&self, path: FilePath, _ctx: &StageCtx) -> Result<Bytes, BoxError> {
        self.read(&path.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_small_and_mapped_files_and_refuses_huge_ones() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("x.bin");
        std::fs::write(&p, vec![7u8; 5000]).unwrap();
        let small = ReadFile::default().read(&p).unwrap();
        assert!(matches!(small, Bytes::Owned(_)));
        let mapped = ReadFile {
            mmap_threshold: 100,
            ..Default::default()
        }
        .read(&p)
        .unwrap();
        assert!(matches!(mapped, Bytes::Mapped { .. }));
        assert_eq!(&small[..], &mapped[..]);
        let err = ReadFile {
            max_bytes: 100,
            ..Default::default()
        }
        .read(&p)
        .unwrap_err();
        assert!(err.to_string().contains("over the 100 byte limit"));
        assert!(
            ReadFile::default().read(dir.path()).is_err(),
            "a folder is refused"
        );
        assert!(ReadFile::default()
            .read(&dir.path().join("missing"))
            .is_err());
    }
}
