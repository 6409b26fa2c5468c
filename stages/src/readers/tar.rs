//! WebDataset tar shards: one sample = the members sharing a basename
//! (`key.jpg` + `key.cls`). Shards are memory-mapped and indexed once, so
//! samples are read by index with no copy.
//!
//! Entries with absolute paths or `..` components are refused with an error
//! naming the shard and the entry.
//!
//! ```
//! use ferrofeed_core::Source;
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
//! let shards = ferrofeed_stages::TarShards::open(&[path], &["jpg"]).unwrap();
//! let (bytes, label) = shards.get(0).unwrap();
//! assert_eq!((&bytes[..], label.0), (&b"JPEG"[..], 3));
//! assert!(shards.key(0).unwrap().ends_with("shard-000.tar#s0"));
//! ```
use std::collections::HashMap;
use std::io::Cursor;
use std::ops::Range;
use std::path::{Component as PathPart, Path, PathBuf};
use std::sync::Arc;

use ferrofeed_core::{BoxError, Source};

use crate::components::{Bytes, Label};

/// Why a shard cannot be indexed.
#[derive(Debug, thiserror::Error)]
pub enum TarError {
    /// Opening or mapping failed.
    #[error("{shard}: {message}")]
    Io {
        /// The shard.
        shard: PathBuf,
        /// What.
        message: String,
    },
    /// An entry escapes the archive (absolute path or `..`).
    #[error("{shard}: entry `{entry}` has an absolute path or `..`: refused")]
    UnsafeEntry {
        /// The shard.
        shard: PathBuf,
        /// The entry's path.
        entry: String,
    },
}

struct TarSample {
    shard: u32,
    key: String,
    data: Option<Range<usize>>,
    label: Option<Range<usize>>,
    /// A member whose key and extension came before in the shard: two
    /// samples share the key, and neither may be silently kept.
    repeated: Option<String>,
    /// Where and why the shard broke off (this is no sample of it).
    broken: Option<String>,
}

/// `text` with control characters and the replacement character escaped,
/// at most 120 characters: a garbage header's bytes in a message.
fn printable(text: &str) -> String {
    let mut out: String = text
        .chars()
        .flat_map(|c| {
            let plain = !c.is_control() && c != char::REPLACEMENT_CHARACTER;
            let esc: Vec<char> = if plain {
                vec![c]
            } else {
                c.escape_unicode().collect()
            };
            esc
        })
        .take(121)
        .collect();
    if out.chars().count() > 120 {
        out = out.chars().take(117).collect::<String>() + "...";
    }
    out
}

/// The label in sample `key`'s `.cls` member: an integer, as text.
pub(crate) fn parse_label(key: &str, cls: &[u8]) -> Result<i64, String> {
    let text = std::str::from_utf8(cls).map_err(|_| format!("`{key}.cls` is not text"))?;
    text.trim()
        .parse()
        .map_err(|_| format!("`{key}.cls` holds {:?}, not an integer label", text.trim()))
}

/// A member's WebDataset key and extension: the key is everything before
/// the first dot of the file name (with its folder), the extension the rest.
pub(crate) fn split_member(raw: &str) -> (String, &str) {
    let (dir, name) = match raw.rfind('/') {
        Some(i) => (&raw[..=i], &raw[i + 1..]),
        None => ("", raw),
    };
    let (stem, ext) = match name.find('.') {
        Some(i) => (&name[..i], &name[i + 1..]),
        None => (name, ""),
    };
    (format!("{dir}{stem}"), ext)
}

/// Whether a member's path is absolute or climbs out (`..`).
pub(crate) fn unsafe_member(raw: &str) -> bool {
    let p = Path::new(raw);
    p.is_absolute()
        || p.components().any(|c| {
            matches!(
                c,
                PathPart::ParentDir | PathPart::RootDir | PathPart::Prefix(_)
            )
        })
}

/// A map-style source over WebDataset shards; samples start with
/// `(Bytes, Label)`.
pub struct TarShards {
    shards: Vec<(PathBuf, Arc<memmap2::Mmap>)>,
    samples: Vec<TarSample>,
    data_exts: Vec<String>,
    /// How each shard is named in keys (its path unless renamed).
    names: Vec<String>,
}

impl TarShards {
    /// Indexes `paths` (in order); the data member of a sample is the first
    /// whose extension is in `data_exts`, its label the `.cls` member.
    pub fn open(paths: &[PathBuf], data_exts: &[&str]) -> Result<TarShards, TarError> {
        let mut shards = Vec::new();
        let mut samples = Vec::new();
        for (si, path) in paths.iter().enumerate() {
            let io = |e: std::io::Error| TarError::Io {
                shard: path.clone(),
                message: e.to_string(),
            };
            let file = std::fs::File::open(path).map_err(io)?;
            // SAFETY: read-only map of a file we do not modify.
            let map = Arc::new(unsafe { memmap2::Mmap::map(&file) }.map_err(io)?);
            let mut by_key: HashMap<String, usize> = HashMap::new();
            let mut seen: std::collections::HashSet<(usize, String)> = Default::default();
            let mut archive = tar::Archive::new(Cursor::new(&map[..]));
            let entries = archive.entries_with_seek().map_err(io)?;
            // A shard that breaks off (truncated, or garbage where a header
            // should be) keeps the samples before the break; the break is
            // one more sample that fails naming the shard and where, under
            // the error policy, instead of failing the whole run unnamed.
            let broken = |samples: &mut Vec<TarSample>, after: &str, why: String| {
                samples.push(TarSample {
                    shard: si as u32,
                    key: format!("<after {after}>"),
                    data: None,
                    label: None,
                    repeated: None,
                    broken: Some(why),
                });
            };
            let mut last = String::from("the start");
            for entry in entries {
                let entry = match entry {
                    Ok(e) => e,
                    Err(e) => {
                        let why = format!(
                            "the shard breaks off after {last}: {}",
                            printable(&e.to_string())
                        );
                        broken(&mut samples, &last, why);
                        break;
                    }
                };
                let raw = String::from_utf8_lossy(&entry.path_bytes()).into_owned();
                if unsafe_member(&raw) {
                    return Err(TarError::UnsafeEntry {
                        shard: path.clone(),
                        entry: raw,
                    });
                }
                if !entry.header().entry_type().is_file() {
                    continue;
                }
                let start = entry.raw_file_position() as usize;
                let len = entry.size() as usize;
                let Some(end) = start.checked_add(len).filter(|&e| e <= map.len()) else {
                    let why = format!(
                        "the shard is truncated: member `{}` runs past the end of the file",
                        printable(&raw)
                    );
                    broken(&mut samples, &last, why);
                    break;
                };
                last = format!("`{}`", printable(&raw));
                let (key, ext) = split_member(&raw);
                let slot = *by_key.entry(key.clone()).or_insert_with(|| {
                    samples.push(TarSample {
                        shard: si as u32,
                        key,
                        data: None,
                        label: None,
                        repeated: None,
                        broken: None,
                    });
                    samples.len() - 1
                });
                let s = &mut samples[slot];
                let ext_l = ext.to_ascii_lowercase();
                if !seen.insert((slot, ext_l.clone())) && s.repeated.is_none() {
                    s.repeated = Some(raw.clone());
                }
                if ext_l == "cls" {
                    s.label = Some(start..end);
                } else if s.data.is_none()
                    && data_exts.iter().any(|d| d.eq_ignore_ascii_case(&ext_l))
                {
                    s.data = Some(start..end);
                }
            }
            shards.push((path.clone(), map));
        }
        Ok(TarShards {
            names: shards
                .iter()
                .map(|(p, _)| p.display().to_string())
                .collect(),
            shards,
            samples,
            data_exts: data_exts.iter().map(|s| s.to_string()).collect(),
        })
    }

    /// Names the shards in keys by `names` (e.g. the URLs local copies came
    /// from) instead of their paths; a missing name keeps the path.
    pub fn with_names(mut self, names: Vec<String>) -> TarShards {
        for (slot, name) in self.names.iter_mut().zip(names) {
            *slot = name;
        }
        self
    }

    /// Number of shards.
    pub fn num_shards(&self) -> usize {
        self.shards.len()
    }
}

impl Source for TarShards {
    type Output = (Bytes, Label);
    fn len(&self) -> u64 {
        self.samples.len() as u64
    }
    fn get(&self, index: u64) -> Result<(Bytes, Label), BoxError> {
        let s = self
            .samples
            .get(index as usize)
            .ok_or_else(|| format!("index {index} is past the end"))?;
        if let Some(why) = &s.broken {
            return Err(why.clone().into());
        }
        if let Some(member) = &s.repeated {
            return Err(format!(
                "key `{}` appears twice in shard {} (member `{member}` again): \
                 the samples sharing it cannot be told apart",
                s.key, self.names[s.shard as usize]
            )
            .into());
        }
        let map = &self.shards[s.shard as usize].1;
        let data = s.data.clone().ok_or_else(|| {
            format!(
                "sample `{}` has no data member (.{})",
                s.key,
                self.data_exts.join("/.")
            )
        })?;
        let label = s
            .label
            .clone()
            .ok_or_else(|| format!("sample `{}` has no .cls member", s.key))?;
        let label = parse_label(&s.key, &map[label])?;
        Ok((
            Bytes::Mapped {
                map: Arc::clone(map),
                range: data,
            },
            Label(label),
        ))
    }
    fn key(&self, index: u64) -> Option<String> {
        let s = self.samples.get(index as usize)?;
        Some(format!("{}#{}", self.names[s.shard as usize], s.key))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn raw_tar(path: &Path, name: &str) {
        // Build a header by hand so the name can be hostile.
        let mut h = tar::Header::new_old();
        let data = b"evil";
        {
            let bytes = h.as_mut_bytes();
            bytes[..name.len()].copy_from_slice(name.as_bytes());
        }
        h.set_size(data.len() as u64);
        h.set_mode(0o644);
        h.set_entry_type(tar::EntryType::Regular);
        h.set_cksum();
        let mut out = h.as_bytes().to_vec();
        out.extend_from_slice(data);
        out.resize(out.len().next_multiple_of(512) + 1024, 0);
        std::fs::write(path, out).unwrap();
    }

    #[test]
    fn hostile_entries_are_refused_by_name() {
        let dir = tempfile::tempdir().unwrap();
        for name in ["../escape.jpg", "/etc/passwd.jpg", "a/../../b.jpg"] {
            let p = dir.path().join("bad.tar");
            raw_tar(&p, name);
            let e = TarShards::open(std::slice::from_ref(&p), &["jpg"])
                .err()
                .unwrap();
            let msg = e.to_string();
            assert!(msg.contains("bad.tar") && msg.contains(name), "{msg}");
        }
    }

    #[test]
    fn missing_members_are_errors_at_read_time() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("s.tar");
        let mut b = tar::Builder::new(std::fs::File::create(&p).unwrap());
        for (name, data) in [
            ("a.jpg", &b"x"[..]),
            ("b.cls", b"1"),
            ("c.jpg", b"y"),
            ("c.cls", b"zz"),
        ] {
            let mut h = tar::Header::new_gnu();
            h.set_size(data.len() as u64);
            h.set_cksum();
            b.append_data(&mut h, name, data).unwrap();
        }
        b.into_inner().unwrap();
        let s = TarShards::open(&[p], &["jpg"]).unwrap();
        assert_eq!(s.len(), 3);
        assert!(s.get(0).unwrap_err().to_string().contains("no .cls"));
        assert!(s.get(1).unwrap_err().to_string().contains("no data member"));
        assert!(s
            .get(2)
            .unwrap_err()
            .to_string()
            .contains("not an integer label"));
    }
}
