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
        let mut f = std::fs::File::open(path)?;
        let meta = f.metadata()?;
        if !meta.is_file() {
            return Err("not a regular file".into());
        }
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
        // Read straight into the shared buffer (`Bytes::from(Vec)` would
        // allocate and copy once more).
        let mut shared: std::sync::Arc<[u8]> = std::iter::repeat_n(0u8, len as usize).collect();
        let buf = std::sync::Arc::get_mut(&mut shared).ok_or("buffer is shared")?;
        let mut got = 0;
        while got < buf.len() {
            match f.read(&mut buf[got..]) {
                Ok(0) => break,
                Ok(n) => got += n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e.into()),
            }
        }
        let mut more = Vec::new();
        if got == buf.len() {
            f.read_to_end(&mut more)?;
        }
        if got < buf.len() || !more.is_empty() {
            // The file changed size since its metadata was read: take what
            // it holds now.
            let mut v = buf[..got].to_vec();
            v.extend_from_slice(&more);
            return Ok(Bytes::from(v));
        }
        Ok(Bytes::Owned(shared))
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
