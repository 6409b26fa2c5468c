//! Line corpora: `.txt` files (one sample per line), `.jsonl` files (one JSON
//! object per line, the text in a chosen field) and folders of them.
//!
//! Files are memory-mapped, never read whole into memory: the OS pages in
//! what is touched. The line index (8 bytes per line) is built by several
//! threads, each scanning one byte range; a line belongs to the range its
//! first byte falls in, so ranges never share or lose a line
//! ([`line_starts_in`]). Samples are then addressed by index, so sharding
//! across workers and ranks is the engine's exact, duplicate-free split.
//!
//! ```
//! use ferrofeed_core::Source;
//! use ferrofeed_text::{CorpusOptions, TextCorpus};
//! let dir = tempfile::tempdir().unwrap();
//! std::fs::write(dir.path().join("a.txt"), "first line\n\nsecond line\n").unwrap();
//! let corpus = TextCorpus::open(dir.path(), &CorpusOptions::default()).unwrap();
//! assert_eq!(corpus.len(), 2, "the empty line is skipped and counted");
//! assert_eq!(corpus.empty_lines_skipped(), 1);
//! assert_eq!(corpus.get(1).unwrap().0, "second line");
//! assert!(corpus.key(1).unwrap().ends_with("a.txt:3"));
//! ```
use std::fs::File;
use std::hash::{Hash, Hasher};
use std::ops::Range;
use std::path::{Path, PathBuf};

use ferrofeed_core::{BoxError, Component, Source};
use memmap2::Mmap;

use crate::TextError;

/// The text of one sample.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Text(pub String);

impl Component for Text {
    fn nbytes(&self) -> usize {
        self.0.len()
    }
    fn describe(&self) -> String {
        let mut s: String = self.0.chars().take(60).collect();
        if s.len() < self.0.len() {
            s.push('…');
        }
        format!("{} bytes: {s:?}", self.0.len())
    }
}

/// What to do with bytes that are not valid UTF-8.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Utf8Policy {
    /// The sample fails with an error naming its file, line and byte (the
    /// pipeline's error policy then decides: fail, skip or retry).
    #[default]
    Strict,
    /// Invalid sequences become U+FFFD.
    Lossy,
}

/// What to do with empty (or whitespace-only) lines.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum EmptyLines {
    /// Not samples; counted in [`TextCorpus::empty_lines_skipped`].
    #[default]
    Skip,
    /// Samples like any other (an empty text).
    Keep,
}

/// How a corpus is read.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct CorpusOptions {
    /// The JSON field holding the text in `.jsonl` files.
    pub field: String,
    /// Invalid UTF-8.
    pub utf8: Utf8Policy,
    /// Empty lines.
    pub empty: EmptyLines,
    /// Threads (byte ranges) used to index each file.
    pub index_threads: usize,
    /// Longest line read; a longer one is an error naming its file and line
    /// (so a multi-gigabyte "line" is never allocated).
    pub max_line_bytes: usize,
}

impl Default for CorpusOptions {
    fn default() -> Self {
        CorpusOptions {
            field: "text".into(),
            utf8: Utf8Policy::Strict,
            empty: EmptyLines::Skip,
            index_threads: 2,
            max_line_bytes: 64 << 20,
        }
    }
}

/// The file extensions read as line corpora.
pub const TEXT_EXTENSIONS: &[&str] = &["txt", "jsonl"];

/// Lines between stored line-number checkpoints (see [`TextCorpus::key`]).
const LINE_CHECKPOINT: usize = 1024;

struct LineFile {
    path: PathBuf,
    map: Option<Mmap>,
    json: bool,
    /// Byte offset of each sample's first byte.
    starts: Vec<u64>,
    /// 1-based line number of every `LINE_CHECKPOINT`-th sample.
    checkpoints: Vec<u64>,
    size: u64,
    mtime: Option<std::time::SystemTime>,
}

impl LineFile {
    fn data(&self) -> &[u8] {
        self.map.as_deref().unwrap_or(&[])
    }

    /// Bytes of sample `i` (without the line ending); `Err(())` when the
    /// line is longer than `limit` (found without reading past the limit).
    fn line(&self, i: usize, limit: usize) -> Result<&[u8], ()> {
        let data = self.data();
        let s = self.starts[i] as usize;
        let window = &data[s..data.len().min(s.saturating_add(limit).saturating_add(2))];
        match memchr::memchr(b'\n', window) {
            Some(e) => {
                let l = strip_cr(&window[..e]);
                if l.len() > limit {
                    Err(())
                } else {
                    Ok(l)
                }
            }
            None if s + window.len() == data.len() && strip_cr(window).len() <= limit => {
                Ok(strip_cr(window))
            }
            None => Err(()),
        }
    }

    /// 1-based line number of sample `i`.
    fn line_number(&self, i: usize) -> u64 {
        let c = i / LINE_CHECKPOINT;
        let from = self.starts[c * LINE_CHECKPOINT] as usize;
        let to = self.starts[i] as usize;
        self.checkpoints[c] + memchr::memchr_iter(b'\n', &self.data()[from..to]).count() as u64
    }
}

fn strip_cr(line: &[u8]) -> &[u8] {
    line.strip_suffix(b"\r").unwrap_or(line)
}

/// The first byte of every line that starts inside `range` of `data`: byte 0,
/// and every byte right after a `\n` (a final `\n` starts no line). Splitting
/// a file into any ranges and concatenating their results gives each line
/// exactly once.
///
/// ```
/// use ferrofeed_text::line_starts_in;
/// let data = b"ab\ncd\nef";
/// assert_eq!(line_starts_in(data, 0..8), vec![0, 3, 6]);
/// let split: Vec<u64> = [0..4, 4..8].into_iter().flat_map(|r| line_starts_in(data, r)).collect();
/// assert_eq!(split, vec![0, 3, 6]);
/// ```
pub fn line_starts_in(data: &[u8], range: Range<usize>) -> Vec<u64> {
    let (a, b) = (range.start.min(data.len()), range.end.min(data.len()));
    let mut out = Vec::new();
    if a >= b {
        return out;
    }
    if a == 0 {
        out.push(0);
    }
    // A line starts at p (a ≤ p < b) when data[p - 1] is a newline.
    // A newline at q starts a line at q + 1, inside the range when
    // a - 1 <= q < b - 1.
    let from = a.saturating_sub(1);
    out.extend(memchr::memchr_iter(b'\n', &data[from..b - 1]).map(|q| (from + q + 1) as u64));
    out
}

/// Line starts of a file, read with positioned reads in blocks by `threads`
/// threads on equal byte ranges (the same starts as [`line_starts_in`] over
/// all its bytes).
pub fn file_line_starts(file: &File, len: u64, threads: usize) -> std::io::Result<Vec<u64>> {
    use std::os::unix::fs::FileExt;
    const BLOCK: usize = 4 << 20;
    let threads = if len < (8 << 20) {
        1
    } else {
        threads.clamp(1, 64)
    };
    let step = len.div_ceil(threads as u64).max(1);
    // Range [a, b): a start p in it when p == 0 or byte p - 1 is a newline.
    let scan = |a: u64, b: u64| -> std::io::Result<Vec<u64>> {
        let mut out = Vec::new();
        if a >= b {
            return Ok(out);
        }
        if a == 0 {
            out.push(0);
        }
        let mut buf = vec![0u8; BLOCK];
        let (mut pos, end) = (a.saturating_sub(1), b - 1);
        while pos < end {
            // Holes of a sparse file read as zeros: no newline there.
            let (data, hole) = data_region(file, pos);
            if data >= end {
                break;
            }
            pos = pos.max(data);
            let stop = end.min(hole);
            while pos < stop {
                let n = ((stop - pos) as usize).min(BLOCK);
                file.read_exact_at(&mut buf[..n], pos)?;
                out.extend(memchr::memchr_iter(b'\n', &buf[..n]).map(|q| pos + q as u64 + 1));
                pos += n as u64;
            }
        }
        Ok(out)
    };
    if threads == 1 {
        return scan(0, len);
    }
    let parts: Vec<std::io::Result<Vec<u64>>> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..threads as u64)
            .map(|t| {
                let (a, b) = (t * step, ((t + 1) * step).min(len));
                s.spawn(move || scan(a, b))
            })
            .collect();
        handles
            .into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or_else(|_| Err(std::io::Error::other("an index thread panicked")))
            })
            .collect()
    });
    let mut all = Vec::new();
    for p in parts {
        all.extend(p?);
    }
    Ok(all)
}

/// The data region at or after `pos`: `(start, end)`, from `SEEK_DATA` /
/// `SEEK_HOLE`; `(pos, u64::MAX)` where the file system cannot tell, and
/// `(u64::MAX, _)` when only a hole remains.
fn data_region(file: &File, pos: u64) -> (u64, u64) {
    use std::os::fd::AsRawFd;
    let fd = file.as_raw_fd();
    let Ok(at) = libc::off_t::try_from(pos) else {
        return (pos, u64::MAX);
    };
    // SAFETY: lseek on a file descriptor this `File` owns; only its return
    // value is used (reads are positioned), so the moved offset is harmless.
    let data = unsafe { libc::lseek(fd, at, libc::SEEK_DATA) };
    if data < 0 {
        return match std::io::Error::last_os_error().raw_os_error() {
            Some(libc::ENXIO) => (u64::MAX, u64::MAX),
            _ => (pos, u64::MAX),
        };
    }
    // SAFETY: as above.
    let hole = unsafe { libc::lseek(fd, data, libc::SEEK_HOLE) };
    (data as u64, if hole < 0 { u64::MAX } else { hole as u64 })
}

/// A map-style source over the lines of `.txt`/`.jsonl` files. Output: [`Text`].
pub struct TextCorpus {
    files: Vec<LineFile>,
    /// `offsets[f]` = index of file `f`'s first sample; last = total.
    offsets: Vec<u64>,
    empty_skipped: u64,
    options: CorpusOptions,
}

impl TextCorpus {
    /// Opens a `.txt`/`.jsonl` file, or every such file under a folder
    /// (recursively, in path order).
    pub fn open(path: &Path, options: &CorpusOptions) -> Result<TextCorpus, TextError> {
        let io = |e: std::io::Error| TextError::Io {
            path: path.to_path_buf(),
            source: e,
        };
        let meta = std::fs::metadata(path).map_err(io)?;
        let files = if meta.is_dir() {
            let files: Vec<PathBuf> = ferrofeed_stages::walk_files(path)
                .map_err(|e| io(std::io::Error::other(e.to_string())))?
                .into_iter()
                .filter(|p| {
                    p.extension()
                        .and_then(|e| e.to_str())
                        .is_some_and(|e| TEXT_EXTENSIONS.contains(&e))
                })
                .collect();
            if files.is_empty() {
                return Err(TextError::NoFiles(path.to_path_buf()));
            }
            files
        } else {
            vec![path.to_path_buf()]
        };
        Self::from_files(&files, options)
    }

    /// Opens the given files in this order.
    pub fn from_files(paths: &[PathBuf], options: &CorpusOptions) -> Result<TextCorpus, TextError> {
        let mut files = Vec::with_capacity(paths.len());
        let mut offsets = vec![0u64];
        let mut empty_skipped = 0;
        for path in paths {
            let io = |e: std::io::Error| TextError::Io {
                path: path.clone(),
                source: e,
            };
            let (f, meta) = ferrofeed_core::open_regular(path).map_err(io)?;
            // SAFETY: the map is read-only; a file truncated by another
            // process while mapped is outside what this reader supports.
            let map = if meta.len() == 0 {
                None
            } else {
                Some(unsafe { Mmap::map(&f) }.map_err(io)?)
            };
            let data: &[u8] = map.as_deref().unwrap_or(&[]);
            // Indexed with reads, not through the map, so that scanning a
            // huge file does not leave it all mapped in (resident) memory.
            let all = file_line_starts(&f, meta.len(), options.index_threads).map_err(io)?;
            let mut starts = Vec::with_capacity(all.len());
            let mut checkpoints = Vec::with_capacity(all.len() / LINE_CHECKPOINT + 1);
            for (line, &s) in all.iter().enumerate() {
                let keep = options.empty == EmptyLines::Keep || {
                    // Only a line's first non-blank byte is looked at.
                    let s = s as usize;
                    data[s..]
                        .iter()
                        .take_while(|&&b| b != b'\n')
                        .any(|b| !b.is_ascii_whitespace())
                };
                if keep {
                    if starts.len() % LINE_CHECKPOINT == 0 {
                        checkpoints.push(line as u64 + 1);
                    }
                    starts.push(s);
                } else {
                    empty_skipped += 1;
                }
            }
            offsets.push(offsets[offsets.len() - 1] + starts.len() as u64);
            files.push(LineFile {
                path: path.clone(),
                json: path.extension().is_some_and(|e| e == "jsonl"),
                map,
                starts,
                checkpoints,
                size: meta.len(),
                mtime: meta.modified().ok(),
            });
        }
        Ok(TextCorpus {
            files,
            offsets,
            empty_skipped,
            options: options.clone(),
        })
    }

    /// Empty or whitespace-only lines left out (with [`EmptyLines::Skip`]).
    pub fn empty_lines_skipped(&self) -> u64 {
        self.empty_skipped
    }

    /// The files, in index order.
    pub fn paths(&self) -> impl Iterator<Item = &Path> {
        self.files.iter().map(|f| f.path.as_path())
    }

    /// Total bytes of the files.
    pub fn total_bytes(&self) -> u64 {
        self.files.iter().map(|f| f.size).sum()
    }

    /// A hash of what the samples are: each file's path, size,
    /// modification time and bytes, and the reading options. Keys the
    /// token cache.
    pub fn fingerprint(&self) -> u64 {
        let mut h = std::collections::hash_map::DefaultHasher::new();
        for f in &self.files {
            f.path.hash(&mut h);
            f.size.hash(&mut h);
            f.mtime.hash(&mut h);
            // The bytes too (XXH3, tens of GB/s over the map): a file
            // rewritten with its size and time kept is another corpus.
            xxhash_rust::xxh3::xxh3_128(f.data()).hash(&mut h);
        }
        self.options.field.hash(&mut h);
        self.options.utf8.hash(&mut h);
        self.options.empty.hash(&mut h);
        h.finish()
    }

    fn locate(&self, index: u64) -> Option<(&LineFile, usize)> {
        if index >= *self.offsets.last()? {
            return None;
        }
        let f = self.offsets.partition_point(|&o| o <= index) - 1;
        Some((&self.files[f], (index - self.offsets[f]) as usize))
    }

    /// The raw bytes of sample `index`'s line (`None` past the end or
    /// beyond `max_line_bytes`).
    pub fn raw(&self, index: u64) -> Option<&[u8]> {
        self.locate(index)
            .and_then(|(f, i)| f.line(i, self.options.max_line_bytes).ok())
    }

    /// `path` and 1-based line number of sample `index`.
    pub fn position(&self, index: u64) -> Option<(&Path, u64)> {
        self.locate(index)
            .map(|(f, i)| (f.path.as_path(), f.line_number(i)))
    }
}

impl Source for TextCorpus {
    type Output = Text;
    fn len(&self) -> u64 {
        self.offsets.last().copied().unwrap_or(0)
    }
    fn get(&self, index: u64) -> Result<Text, BoxError> {
        let (f, i) = self.locate(index).ok_or_else(|| {
            BoxError::from(format!("index {index} is out of range ({})", self.len()))
        })?;
        let limit = self.options.max_line_bytes;
        let raw = f.line(i, limit).map_err(|()| {
            format!(
                "{}:{}: the line is longer than {limit} bytes (the reader's max_line_bytes)",
                f.path.display(),
                f.line_number(i)
            )
        })?;
        parse_line(raw, f.json, &self.options)
            .map(Text)
            .map_err(|e| format!("{}:{}: {e}", f.path.display(), f.line_number(i)).into())
    }
    fn key(&self, index: u64) -> Option<String> {
        self.position(index)
            .map(|(p, l)| format!("{}:{l}", p.display()))
    }
}

/// The text of one raw line: UTF-8 checked (or replaced) per
/// `options.utf8`, and for a JSON line, its `options.field` string. The
/// error says what is wrong, without the file and line (the caller adds them).
pub fn parse_line(raw: &[u8], json: bool, options: &CorpusOptions) -> Result<String, String> {
    let text = match std::str::from_utf8(raw) {
        Ok(s) => std::borrow::Cow::Borrowed(s),
        Err(e) if options.utf8 == Utf8Policy::Strict => {
            return Err(format!(
            "invalid UTF-8 at byte {} of the line (lossy decoding, `--lossy-utf8`, replaces it)",
            e.valid_up_to()
        ))
        }
        Err(_) => String::from_utf8_lossy(raw),
    };
    if !json {
        return Ok(text.into_owned());
    }
    let value: serde_json::Value =
        serde_json::from_str(&text).map_err(|e| format!("not a JSON object: {e}"))?;
    match value.get(&options.field) {
        Some(serde_json::Value::String(s)) => Ok(s.clone()),
        Some(other) => Err(format!(
            "field `{}` is {}, not a string",
            options.field,
            json_kind(other)
        )),
        None => Err(format!("no field `{}`", options.field)),
    }
}

fn json_kind(v: &serde_json::Value) -> &'static str {
    match v {
        serde_json::Value::Null => "null",
        serde_json::Value::Bool(_) => "a boolean",
        serde_json::Value::Number(_) => "a number",
        serde_json::Value::String(_) => "a string",
        serde_json::Value::Array(_) => "an array",
        serde_json::Value::Object(_) => "an object",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn split_all(data: &[u8], cuts: &[usize]) -> Vec<u64> {
        let mut bounds = vec![0];
        bounds.extend(cuts.iter().map(|&c| c.min(data.len())));
        bounds.push(data.len());
        bounds.sort();
        bounds
            .windows(2)
            .flat_map(|w| line_starts_in(data, w[0]..w[1]))
            .collect()
    }

    #[test]
    fn any_byte_ranges_give_each_line_once() {
        let data = b"alpha\nbeta\r\n\ngamma delta\nx\n";
        let whole = line_starts_in(data, 0..data.len());
        assert_eq!(whole, vec![0, 6, 12, 13, 25]);
        for a in 0..=data.len() {
            for b in a..=data.len() {
                assert_eq!(split_all(data, &[a, b]), whole, "cuts at {a} and {b}");
            }
        }
        assert!(line_starts_in(b"", 0..0).is_empty());
        assert_eq!(line_starts_in(b"\n", 0..1), vec![0]);
    }

    #[test]
    fn file_index_by_reads_equals_the_in_memory_one() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("big.txt");
        let mut data = Vec::new();
        for i in 0..700_000u32 {
            data.extend_from_slice(format!("{i} {}\n", "x".repeat((i % 23) as usize)).as_bytes());
        }
        data.extend_from_slice(b"no final newline");
        assert!(data.len() > 8 << 20);
        std::fs::write(&p, &data).unwrap();
        let f = File::open(&p).unwrap();
        let want = line_starts_in(&data, 0..data.len());
        for threads in [1, 2, 5] {
            assert_eq!(
                file_line_starts(&f, data.len() as u64, threads).unwrap(),
                want
            );
        }
    }

    #[test]
    fn jsonl_fields_utf8_and_line_numbers() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("d.jsonl");
        let mut bytes =
            b"{\"text\": \"one\"}\n\n{\"body\": \"x\"}\n{\"text\": 3}\nnot json\n".to_vec();
        bytes.extend_from_slice(b"{\"text\": \"caf\xff\"}\n");
        std::fs::write(&p, &bytes).unwrap();
        let c = TextCorpus::open(&p, &CorpusOptions::default()).unwrap();
        assert_eq!(c.len(), 5);
        assert_eq!(c.get(0).unwrap(), Text("one".into()));
        let e = c.get(1).unwrap_err().to_string();
        assert!(
            e.contains("d.jsonl:3") && e.contains("no field `text`"),
            "{e}"
        );
        let e = c.get(2).unwrap_err().to_string();
        assert!(e.contains(":4") && e.contains("a number"), "{e}");
        let e = c.get(3).unwrap_err().to_string();
        assert!(e.contains(":5") && e.contains("not a JSON object"), "{e}");
        let e = c.get(4).unwrap_err().to_string();
        assert!(
            e.contains(":6") && e.contains("invalid UTF-8 at byte"),
            "{e}"
        );
        let lossy = CorpusOptions {
            utf8: Utf8Policy::Lossy,
            ..CorpusOptions::default()
        };
        let c = TextCorpus::open(&p, &lossy).unwrap();
        // The line is replaced before JSON parsing, so the value keeps U+FFFD.
        assert_eq!(c.get(4).unwrap(), Text("caf\u{fffd}".into()));
    }

    #[test]
    fn empty_lines_kept_or_skipped_and_crlf_stripped() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("a.txt");
        std::fs::write(&p, "a\r\n  \r\n\nb").unwrap();
        let keep = CorpusOptions {
            empty: EmptyLines::Keep,
            ..CorpusOptions::default()
        };
        let c = TextCorpus::open(&p, &keep).unwrap();
        assert_eq!(c.len(), 4);
        assert_eq!(c.get(1).unwrap(), Text("  ".into()));
        let c = TextCorpus::open(&p, &CorpusOptions::default()).unwrap();
        assert_eq!(c.len(), 2);
        assert_eq!(c.get(0).unwrap(), Text("a".into()));
        assert_eq!(c.get(1).unwrap(), Text("b".into()));
        assert_eq!(c.key(1).unwrap(), format!("{}:4", p.display()));
        assert_eq!(c.empty_lines_skipped(), 2);
    }

    #[test]
    fn folders_and_line_numbers_past_checkpoints() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("sub")).unwrap();
        let lines: String = (0..3000).map(|i| format!("l{i}\n\n")).collect();
        std::fs::write(dir.path().join("sub/b.txt"), &lines).unwrap();
        std::fs::write(dir.path().join("a.txt"), "first\n").unwrap();
        std::fs::write(dir.path().join("skip.bin"), "x\n").unwrap();
        let c = TextCorpus::open(dir.path(), &CorpusOptions::default()).unwrap();
        assert_eq!(c.len(), 3001);
        assert_eq!(c.get(0).unwrap().0, "first");
        assert_eq!(c.get(2500).unwrap().0, "l2499");
        let (p, line) = c.position(2500).unwrap();
        assert!(p.ends_with("sub/b.txt"));
        assert_eq!(line, 2 * 2499 + 1);
        assert!(c.get(3001).is_err());
        let empty = tempfile::tempdir().unwrap();
        assert!(matches!(
            TextCorpus::open(empty.path(), &CorpusOptions::default()),
            Err(TextError::NoFiles(_))
        ));
    }
}
