//! WebDataset tar shards read as a stream: an iterable source whose shards
//! are opened when a worker reaches them, in the epoch's seeded shard
//! order, and read member by member. A shard's file comes from a fetch
//! function, so a remote shard is downloaded when its turn comes (or ahead
//! of it, by a read-ahead that follows the same order) and its samples are
//! decoded while later shards still download; nothing waits for the whole
//! dataset. A shard is parsed as a stream (a remote one as its bytes
//! arrive: see `Remote::open_stream`), so its first samples are decoded
//! before its last ones are downloaded. Samples are mixed through the
//! pipeline's shuffle buffer, as WebDataset readers do, rather than by a
//! global shuffle.
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
use std::io::Read;
use std::path::PathBuf;
use std::sync::mpsc::{sync_channel, SyncSender};
use std::sync::Arc;

use ferrofeed_core::{BoxError, IterableSource, ShardIter, Source};

use crate::components::{Bytes, Label};
use crate::readers::tar::{parse_label, split_member, unsafe_member, TarShards};

/// A shard to read: a whole file (memory-mapped and indexed, its members
/// read without a copy), or a byte stream (a remote shard as its download
/// arrives).
pub enum ShardData {
    /// A complete local file.
    File(PathBuf),
    /// Bytes as they arrive.
    Stream(Box<dyn Read + Send>),
}

/// Opens shard `s`.
pub type ShardOpen = Arc<dyn Fn(usize) -> Result<ShardData, BoxError> + Send + Sync>;

/// A sample read from a shard: its key (`<shard name>#<member key>`) and
/// its bytes and label, or why it has none.
type Sample = (String, Result<(Bytes, Label), String>);

/// An iterable source over WebDataset shards; samples start with
/// `(Bytes, Label)`. A sample's members must be adjacent in its shard, as
/// WebDataset writers put them.
#[derive(Clone)]
pub struct StreamedShards {
    names: Vec<String>,
    open: ShardOpen,
    data_exts: Vec<String>,
}

impl StreamedShards {
    /// Local shards at `paths`, named by their paths.
    pub fn local(paths: Vec<PathBuf>, data_exts: &[&str]) -> StreamedShards {
        let names = paths.iter().map(|p| p.display().to_string()).collect();
        let paths = Arc::new(paths);
        let open: ShardOpen = Arc::new(move |s| {
            let p = paths
                .get(s)
                .ok_or_else(|| BoxError::from(format!("no shard {s}")))?;
            Ok(ShardData::File(p.clone()))
        });
        StreamedShards::new(names, open, data_exts)
    }

    /// Shards named `names` (their URLs, say), which `open` streams.
    pub fn new(names: Vec<String>, open: ShardOpen, data_exts: &[&str]) -> StreamedShards {
        StreamedShards {
            names,
            open,
            data_exts: data_exts.iter().map(|s| s.to_string()).collect(),
        }
    }

    /// The shards' names, in shard order.
    pub fn names(&self) -> &[String] {
        &self.names
    }

    /// Shard `s`'s samples as they are read: a thread parses the stream
    /// and hands them over a small queue (it ends when the receiver goes).
    fn samples(&self, s: usize) -> Result<Box<dyn Iterator<Item = Sample> + Send>, BoxError> {
        let name = self
            .names
            .get(s)
            .ok_or_else(|| BoxError::from(format!("no shard {s}")))?
            .clone();
        let stream = match (self.open)(s).map_err(|e| format!("{name}: {e}"))? {
            ShardData::File(path) => {
                // Indexed in place: the same samples, in the same order, as
                // parsing the stream gives (members of a sample adjacent).
                let exts: Vec<&str> = self.data_exts.iter().map(String::as_str).collect();
                let t = Arc::new(TarShards::open(&[path], &exts)?.with_names(vec![name]));
                return Ok(Box::new((0..t.len()).map(move |i| {
                    let key = t.key(i).unwrap_or_default();
                    (key, t.get(i).map_err(|e| e.to_string()))
                })));
            }
            ShardData::Stream(r) => r,
        };
        let (tx, rx) = sync_channel(16);
        let exts = self.data_exts.clone();
        std::thread::Builder::new()
            .name("ferrofeed-shard".into())
            .spawn(move || parse(stream, &name, &exts, &tx))?;
        Ok(Box::new(rx.into_iter()))
    }

    /// Shard `s`'s samples: each key (`<name>#<member key>`) and label (when
    /// it has a valid one), in shard order.
    pub fn entries(&self, s: usize) -> Result<Vec<(String, Option<i64>)>, BoxError> {
        let mut out = Vec::new();
        for (key, r) in self.samples(s)? {
            match r {
                Ok((_, l)) => out.push((key, Some(l.0))),
                Err(e) if key.is_empty() => return Err(e.into()),
                Err(_) => out.push((key, None)),
            }
        }
        Ok(out)
    }
}

/// Reads a tar stream member by member and sends each sample when its last
/// member has gone by; a stream that breaks off ends with an error (its key
/// empty).
fn parse(stream: Box<dyn Read + Send>, name: &str, exts: &[String], tx: &SyncSender<Sample>) {
    struct Open {
        key: String,
        data: Option<Vec<u8>>,
        cls: Option<Vec<u8>>,
        exts: Vec<String>,
        /// A member of this key and extension came before in the shard.
        repeated: Option<String>,
    }
    let emit = |o: Open| -> bool {
        let full = format!("{name}#{}", o.key);
        if let Some(member) = o.repeated {
            let e = format!(
                "key `{}` appears twice in shard {name} (member `{member}` again): \
                 the samples sharing it cannot be told apart",
                o.key
            );
            return tx.send((full, Err(e))).is_ok();
        }
        let r = match (o.data, o.cls) {
            (None, _) => Err(format!(
                "sample `{}` has no data member (.{})",
                o.key,
                exts.join("/.")
            )),
            (_, None) => Err(format!("sample `{}` has no .cls member", o.key)),
            (Some(d), Some(c)) => parse_label(&o.key, &c).map(|l| (Bytes::from(d), Label(l))),
        };
        tx.send((full, r)).is_ok()
    };
    let fail = |e: String| {
        let _ = tx.send((String::new(), Err(format!("{name}: {e}"))));
    };
    let mut archive = tar::Archive::new(stream);
    let entries = match archive.entries() {
        Ok(e) => e,
        Err(e) => return fail(e.to_string()),
    };
    let mut open: Option<Open> = None;
    let mut done_keys: std::collections::HashSet<String> = Default::default();
    for entry in entries {
        let mut entry = match entry {
            Ok(e) => e,
            Err(e) => return fail(e.to_string()),
        };
        let raw = String::from_utf8_lossy(&entry.path_bytes()).into_owned();
        if unsafe_member(&raw) {
            return fail(format!("unsafe entry `{raw}` (absolute, or with ..)"));
        }
        if !entry.header().entry_type().is_file() {
            continue;
        }
        let (key, ext) = split_member(&raw);
        let ext = ext.to_ascii_lowercase();
        if open.as_ref().is_some_and(|o| o.key != key) {
            if let Some(o) = open.take() {
                done_keys.insert(o.key.clone());
                if !emit(o) {
                    return;
                }
            }
        }
        let again = done_keys.contains(&key);
        let o = open.get_or_insert(Open {
            key,
            data: None,
            cls: None,
            exts: Vec::new(),
            repeated: None,
        });
        if (again || o.exts.contains(&ext)) && o.repeated.is_none() {
            o.repeated = Some(raw.clone());
        }
        o.exts.push(ext.clone());
        let wanted =
            ext == "cls" || (o.data.is_none() && exts.iter().any(|d| d.eq_ignore_ascii_case(&ext)));
        if wanted {
            // The header's size is a claim: reserve at most 64 MiB ahead.
            let mut buf = Vec::with_capacity(entry.size().min(64 << 20) as usize);
            if let Err(e) = entry.read_to_end(&mut buf) {
                return fail(e.to_string());
            }
            if ext == "cls" {
                o.cls = Some(buf);
            } else {
                o.data = Some(buf);
            }
        }
    }
    if let Some(o) = open {
        emit(o);
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
        Ok(Box::new(self.samples(shard)?.map(|(key, r)| {
            r.map_err(|e| {
                if key.is_empty() {
                    BoxError::from(e)
                } else {
                    BoxError::from(format!("{key}: {e}"))
                }
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
        // (A local shard is indexed in place: the break is its one item.)
        std::fs::write(dir.path().join("a.tar"), b"not a tar at all, and too short").unwrap();
        let err = match s.open(0) {
            Err(e) => e.to_string(),
            Ok(mut items) => items.next().unwrap().err().unwrap().to_string(),
        };
        assert!(err.contains("a.tar"), "{err}");
        assert!(s.open(5).is_err());
        // Cut inside a member: the samples before it, then an error.
        let c = dir.path().join("c.tar");
        shard(
            &c,
            &[
                ("p.jpg", &[1u8; 600]),
                ("p.cls", b"1"),
                ("q.jpg", &[2u8; 600]),
                ("q.cls", b"2"),
            ],
        );
        let full = std::fs::read(&c).unwrap();
        std::fs::write(&c, &full[..full.len() - 1024 - 700]).unwrap();
        // Read as a stream (a download): parsed member by member.
        let open: ShardOpen =
            Arc::new(move |_| Ok(ShardData::Stream(Box::new(std::fs::File::open(&c)?))));
        let s = StreamedShards::new(vec!["c.tar".into()], open, &["jpg"]);
        let got: Vec<Result<i64, String>> = s
            .open(0)
            .unwrap()
            .map(|r| r.map(|(_, l)| l.0).map_err(|e| e.to_string()))
            .collect();
        assert_eq!(got[0], Ok(1), "{got:?}");
        assert!(got.last().unwrap().is_err(), "{got:?}");
    }
}
