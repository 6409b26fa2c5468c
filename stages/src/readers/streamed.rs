//! WebDataset tar shards read as a stream: an iterable source whose shards
//! are opened when a worker reaches them, in the epoch's seeded shard
//! order, and read member by member. A shard's file comes from a fetch
//! function, so a remote shard is downloaded when its turn comes (or ahead
//! of it, by a read-ahead that follows the same order) and its samples are
//! decoded while later shards still download; nothing waits for the whole
//! dataset. Samples are mixed through the pipeline's shuffle buffer, as
//! WebDataset readers do, rather than by a global shuffle.
//!
//! ```
//! use ferrofeed_core::IterableSource;
//! let dir = tempfile::tempdir().unwrap();
//! let path = dir.path().join("shard-000.tar");
//! let mut b = tar::Builder::new(std::fs::File::create(&path).unwrap());
//! for (name, data) in [("s0.jpg", &b"JPEG"[..]), ("s0.cls", b"3\n")] {
//!     let mut h = tar::Header::new_gnu();
//!     h.set_size(data.len() as u64);
//!     h.set_cksum();
//!     b.append_data(&mut h, name, data).unwrap();
//! }
//! b.finish().unwrap();
//! drop(b);
//! let shards = ferrofeed_stages::StreamedShards::local(vec![path], &["jpg"]);
//! let (bytes, label) = shards.open(0).unwrap().next().unwrap().unwrap();
//! assert_eq!((&bytes[..], label.0), (&b"JPEG"[..], 3));
//! ```
use std::path::PathBuf;
use std::sync::Arc;

use ferrofeed_core::{BoxError, IterableSource, ShardIter, Source};

use crate::components::{Bytes, Label};
use crate::readers::tar::TarShards;

/// Gives the local path of shard `s` (downloading it first where it is
/// remote).
pub type ShardFetch = Arc<dyn Fn(usize) -> Result<PathBuf, BoxError> + Send + Sync>;

/// An iterable source over WebDataset shards; samples start with
/// `(Bytes, Label)`.
#[derive(Clone)]
pub struct StreamedShards {
    names: Vec<String>,
    fetch: ShardFetch,
    data_exts: Vec<String>,
}

impl StreamedShards {
    /// Local shards at `paths`, named by their paths.
    pub fn local(paths: Vec<PathBuf>, data_exts: &[&str]) -> StreamedShards {
        let names = paths.iter().map(|p| p.display().to_string()).collect();
        let paths = Arc::new(paths);
        let fetch: ShardFetch = Arc::new(move |s| {
            paths
                .get(s)
                .cloned()
                .ok_or_else(|| BoxError::from(format!("no shard {s}")))
        });
        StreamedShards::new(names, fetch, data_exts)
    }

    /// Shards named `names` (their URLs, say), whose files `fetch` gives.
    pub fn new(names: Vec<String>, fetch: ShardFetch, data_exts: &[&str]) -> StreamedShards {
        StreamedShards {
            names,
            fetch,
            data_exts: data_exts.iter().map(|s| s.to_string()).collect(),
        }
    }

    /// The shards' names, in shard order.
    pub fn names(&self) -> &[String] {
        &self.names
    }

    /// Shard `s` indexed: its samples by position (each sample's key is
    /// `<name>#<member key>`).
    pub fn index(&self, s: usize) -> Result<TarShards, BoxError> {
        let name = self
            .names
            .get(s)
            .ok_or_else(|| BoxError::from(format!("no shard {s}")))?;
        let path = (self.fetch)(s).map_err(|e| format!("{name}: {e}"))?;
        let exts: Vec<&str> = self.data_exts.iter().map(String::as_str).collect();
        let t = TarShards::open(&[path], &exts)?.with_names(vec![name.clone()]);
        Ok(t)
    }
}

impl IterableSource for StreamedShards {
    type Output = (Bytes, Label);
    fn num_shards(&self) -> usize {
        self.names.len()
    }
    fn shard_key(&self, shard: usize) -> String {
        self.names.get(shard).cloned().unwrap_or_default()
    }
    fn open(&self, shard: usize) -> Result<ShardIter<(Bytes, Label)>, BoxError> {
        let t = Arc::new(self.index(shard)?);
        Ok(Box::new((0..t.len()).map(move |i| {
            t.get(i).map_err(|e| match t.key(i) {
                Some(k) => BoxError::from(format!("{k}: {e}")),
                None => e,
            })
        })))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shard(path: &std::path::Path, members: &[(&str, &[u8])]) {
        let mut b = tar::Builder::new(std::fs::File::create(path).unwrap());
        for (name, data) in members {
            let mut h = tar::Header::new_gnu();
            h.set_size(data.len() as u64);
            h.set_cksum();
            b.append_data(&mut h, name, *data).unwrap();
        }
        b.finish().unwrap();
    }

    #[test]
    fn each_shard_yields_its_samples_in_order_and_bad_ones_name_themselves() {
        let dir = tempfile::tempdir().unwrap();
        let (a, b) = (dir.path().join("a.tar"), dir.path().join("b.tar"));
        shard(
            &a,
            &[
                ("x.jpg", b"X"),
                ("x.cls", b"1"),
                ("y.jpg", b"Y"),
                ("y.cls", b"2"),
            ],
        );
        shard(&b, &[("z.jpg", b"Z"), ("z.cls", b"nine")]);
        let s = StreamedShards::local(vec![a, b], &["jpg"]);
        assert_eq!(s.num_shards(), 2);
        let got: Vec<(Vec<u8>, i64)> = s
            .open(0)
            .unwrap()
            .map(|r| r.map(|(b, l)| (b.to_vec(), l.0)).unwrap())
            .collect();
        assert_eq!(got, vec![(b"X".to_vec(), 1), (b"Y".to_vec(), 2)]);
        let err = s
            .open(1)
            .unwrap()
            .next()
            .unwrap()
            .err()
            .unwrap()
            .to_string();
        assert!(
            err.contains("b.tar#z") && err.contains("not an integer"),
            "{err}"
        );
        // A shard that cannot be fetched or read is an error naming it.
        std::fs::write(dir.path().join("a.tar"), b"not a tar at all, and too short").unwrap();
        let err = s.open(0).err().unwrap().to_string();
        assert!(err.contains("a.tar"), "{err}");
        assert!(s.open(5).is_err());
    }
}
