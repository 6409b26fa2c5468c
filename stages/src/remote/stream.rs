//! An object read while it downloads: the download publishes each chunk it
//! writes to the cache's temporary file, and a reader takes them in order,
//! so a streamed shard's first members are decoded while its last ones are
//! still on the wire. A retried download publishes from byte 0 again and
//! the reader skips what it already has. Chunks are held in memory only up
//! to [`HOLD_BYTES`] ahead of the reader; past that the reader waits for the
//! finished entry and reads on from the file at its offset.
//!
//! Every download publishes how much of its temporary file is written, so
//! a reader that comes after its first chunks (a worker reaching a shard
//! the read-ahead is downloading) reads those from the file and follows
//! the rest as chunks, instead of waiting for the whole object; chunks are
//! held only once a reader follows.
//!
//! A reader that has caught up with the download sleeps until
//! [`WAKE_BYTES`] more have arrived (or the object's end, or the
//! download's), not at every chunk: a link delivers a shard in thousands of
//! small chunks, and a wake-up per chunk cost more CPU than the parsing.
//!
//! ```text
//! get_into: chunk ─▶ file ─▶ Progress (≤ HOLD_BYTES) ─▶ ChunkReader ─▶ tar members
//!                     └── written up to ───────────▶ ChunkReader reads the temporary file below it
//!                                done(path) ─────────▶ ChunkReader reads the entry from its offset
//! ```

use std::collections::{HashMap, VecDeque};
use std::io::{Read, Seek, SeekFrom};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex};

use bytes::Bytes;

/// Bytes a download holds for a reader that lags behind.
pub(crate) const HOLD_BYTES: u64 = 16 << 20;

/// Bytes a waiting reader lets arrive before it is woken (fewer at the
/// object's end): at 100 MB/s, 0.6 ms of the link.
pub(crate) const WAKE_BYTES: u64 = 64 << 10;

struct State {
    /// Chunks not yet read, each with its offset in the object.
    chunks: VecDeque<(u64, Bytes)>,
    held: u64,
    /// Chunks were dropped for want of room: the reader reads the entry.
    overflow: bool,
    done: Option<Result<PathBuf, String>>,
    /// The lowest offset a sleeping reader waits to see published up to
    /// (`u64::MAX`: none sleeps).
    want: u64,
    /// The download's temporary file, and the bytes of it written from 0.
    file: Option<Arc<std::fs::File>>,
    written: u64,
}

/// One download's chunks, for the readers of the object.
pub(crate) struct Progress {
    state: Mutex<State>,
    cv: Condvar,
    /// The object's size, where a reader stops waiting for more.
    size: u64,
    /// A reader follows: chunks are held for it.
    followed: AtomicBool,
}

/// The progress of object `i`'s download in `streams`: the one registered,
/// or a new one.
pub(crate) fn register(
    streams: &Mutex<HashMap<usize, Arc<Progress>>>,
    i: usize,
    size: u64,
) -> Option<Arc<Progress>> {
    let mut s = streams.lock().ok()?;
    Some(Arc::clone(
        s.entry(i).or_insert_with(|| Arc::new(Progress::new(size))),
    ))
}

impl Progress {
    /// The download of an object of `size` bytes.
    pub(crate) fn new(size: u64) -> Progress {
        Progress {
            state: Mutex::new(State {
                chunks: VecDeque::new(),
                held: 0,
                overflow: false,
                done: None,
                want: u64::MAX,
                file: None,
                written: 0,
            }),
            cv: Condvar::new(),
            size,
            followed: AtomicBool::new(false),
        }
    }

    /// A reader follows from now on.
    pub(crate) fn follow(&self) {
        self.followed.store(true, Ordering::Release);
    }

    /// A new attempt starts at byte 0.
    pub(crate) fn restart(&self) {
        if let Ok(mut s) = self.state.lock() {
            s.chunks.clear();
            s.held = 0;
            s.written = 0;
        }
    }

    /// An attempt writes into `file` (a handle of the temporary file) from
    /// byte `from`, all bytes before it being there.
    pub(crate) fn attach(&self, file: &std::fs::File, from: u64) {
        let file = file.try_clone().ok().map(Arc::new);
        if let Ok(mut s) = self.state.lock() {
            s.written = if file.is_some() { from } else { 0 };
            s.file = file;
        }
    }

    /// The download wrote `chunk` at `offset`, all but the last `buffered`
    /// bytes of what it wrote so far reaching the file: the chunk is held
    /// if a reader follows.
    pub(crate) fn wrote(&self, offset: u64, chunk: Bytes, buffered: usize) {
        let end = offset + chunk.len() as u64;
        if let Ok(mut s) = self.state.lock() {
            s.written = s.written.max(end.saturating_sub(buffered as u64));
            if s.written >= s.want {
                s.want = u64::MAX;
                drop(s);
                self.cv.notify_all();
            }
        }
        if self.followed.load(Ordering::Acquire) {
            self.push(offset, chunk);
        }
    }

    /// The download wrote `chunk` at `offset`.
    pub(crate) fn push(&self, offset: u64, chunk: Bytes) {
        let Ok(mut s) = self.state.lock() else { return };
        if s.overflow {
            return;
        }
        let end = offset + chunk.len() as u64;
        if s.held + chunk.len() as u64 > HOLD_BYTES {
            s.overflow = true;
            s.chunks.clear();
            s.held = 0;
        } else {
            s.held += chunk.len() as u64;
            s.chunks.push_back((offset, chunk));
            if end < s.want {
                return;
            }
        }
        s.want = u64::MAX;
        drop(s);
        self.cv.notify_all();
    }

    /// The download ended: its entry, or why not.
    pub(crate) fn finish(&self, result: Result<PathBuf, String>) {
        if let Ok(mut s) = self.state.lock() {
            s.done = Some(result);
            s.want = u64::MAX;
        }
        self.cv.notify_all();
    }
}

/// Reads an object from its download's chunks, then from its entry.
pub(crate) struct ChunkReader {
    progress: Arc<Progress>,
    offset: u64,
    file: Option<std::fs::File>,
}

impl ChunkReader {
    pub(crate) fn new(progress: Arc<Progress>) -> ChunkReader {
        ChunkReader {
            progress,
            offset: 0,
            file: None,
        }
    }
}

impl Read for ChunkReader {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        if buf.is_empty() {
            return Ok(0);
        }
        if let Some(f) = &mut self.file {
            let n = f.read(buf)?;
            self.offset += n as u64;
            return Ok(n);
        }
        let progress = &*self.progress;
        let mut s = progress
            .state
            .lock()
            .map_err(|_| std::io::Error::other("download state poisoned"))?;
        loop {
            // Chunks wholly before the offset are done with (or repeats of
            // an earlier attempt).
            while s
                .chunks
                .front()
                .is_some_and(|(at, c)| at + c.len() as u64 <= self.offset)
            {
                if let Some((_, c)) = s.chunks.pop_front() {
                    s.held -= c.len() as u64;
                }
            }
            // As much as the chunks in hand give, in order.
            let mut n = 0;
            for (at, c) in &s.chunks {
                let pos = self.offset + n as u64;
                if *at > pos || n == buf.len() {
                    break;
                }
                if at + c.len() as u64 <= pos {
                    continue;
                }
                let from = (pos - at) as usize;
                let k = (c.len() - from).min(buf.len() - n);
                buf[n..n + k].copy_from_slice(&c[from..from + k]);
                n += k;
            }
            if n > 0 {
                self.offset += n as u64;
                return Ok(n);
            }
            // Below what the temporary file holds (bytes written before
            // this reader came, or not yet in a chunk): from the file.
            #[cfg(unix)]
            if let (Some(f), None) = (&s.file, &s.done) {
                if self.offset < s.written {
                    use std::os::unix::fs::FileExt;
                    let (f, k) = (
                        Arc::clone(f),
                        (s.written - self.offset).min(buf.len() as u64),
                    );
                    drop(s);
                    let n = f.read_at(&mut buf[..k as usize], self.offset)?;
                    if n > 0 {
                        self.offset += n as u64;
                        return Ok(n);
                    }
                    s = progress
                        .state
                        .lock()
                        .map_err(|_| std::io::Error::other("download state poisoned"))?;
                    // (A new attempt truncated the file: wait for it.)
                    s.written = s.written.min(self.offset);
                    continue;
                }
            }
            match &s.done {
                Some(Ok(path)) => {
                    let mut f = std::fs::File::open(path)?;
                    f.seek(SeekFrom::Start(self.offset))?;
                    self.file = Some(f);
                    drop(s);
                    return self.read(buf);
                }
                Some(Err(e)) => return Err(std::io::Error::other(e.clone())),
                None => {}
            }
            // Woken once WAKE_BYTES (or what this read asks for, when more)
            // have arrived, or the object's end; a download that overflowed
            // publishes nothing more and wakes the reader when it ends.
            let need = (buf.len() as u64).max(WAKE_BYTES);
            let want = self
                .offset
                .saturating_add(need)
                .min(progress.size)
                .max(self.offset + 1);
            s.want = s.want.min(want);
            s = progress
                .cv
                .wait(s)
                .map_err(|_| std::io::Error::other("download state poisoned"))?;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_reader_gets_every_byte_once_across_a_retry_and_the_switch_to_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("entry");
        let data: Vec<u8> = (0..100_000u32).map(|i| (i % 251) as u8).collect();
        std::fs::write(&path, &data).unwrap();
        let p = Arc::new(Progress::new(data.len() as u64));
        let writer = {
            let (p, data, path) = (Arc::clone(&p), data.clone(), path.clone());
            std::thread::spawn(move || {
                // A first attempt cut after 30 kB, then a whole one; the
                // last 10 kB only in the entry.
                for (i, c) in data[..30_000].chunks(7_000).enumerate() {
                    p.push((i * 7_000) as u64, Bytes::copy_from_slice(c));
                    std::thread::sleep(std::time::Duration::from_millis(2));
                }
                p.restart();
                for (i, c) in data[..90_000].chunks(9_000).enumerate() {
                    p.push((i * 9_000) as u64, Bytes::copy_from_slice(c));
                }
                p.finish(Ok(path));
            })
        };
        let mut got = Vec::new();
        ChunkReader::new(Arc::clone(&p))
            .read_to_end(&mut got)
            .unwrap();
        writer.join().unwrap();
        assert_eq!(got, data);
    }

    /// A reader that comes after the first chunks reads them from the
    /// temporary file and follows the rest, while the download runs.
    #[test]
    fn a_late_reader_reads_what_was_written_before_it_from_the_file() {
        use std::io::Write;
        let dir = tempfile::tempdir().unwrap();
        let (tmp, entry) = (dir.path().join("tmp"), dir.path().join("entry"));
        let data: Vec<u8> = (0..200_000u32).map(|i| (i % 253) as u8).collect();
        let p = Arc::new(Progress::new(data.len() as u64));
        let (half_read, got_half) = std::sync::mpsc::channel::<()>();
        let writer = {
            let (p, data, tmp, entry) = (Arc::clone(&p), data.clone(), tmp.clone(), entry.clone());
            std::thread::spawn(move || {
                let file = std::fs::File::options()
                    .read(true)
                    .write(true)
                    .create(true)
                    .truncate(true)
                    .open(&tmp)
                    .unwrap();
                p.attach(&file, 0);
                let mut w = std::io::BufWriter::with_capacity(16 << 10, file);
                let mut waited = true;
                for (i, c) in data.chunks(10_000).enumerate() {
                    if i == 19 {
                        // The last chunk waits until the reader has more
                        // than half: it cannot get that from the entry.
                        waited = got_half
                            .recv_timeout(std::time::Duration::from_secs(10))
                            .is_ok();
                    }
                    w.write_all(c).unwrap();
                    p.wrote(
                        (i * 10_000) as u64,
                        Bytes::copy_from_slice(c),
                        w.buffer().len(),
                    );
                }
                w.flush().unwrap();
                std::fs::rename(&tmp, &entry).unwrap();
                p.finish(Ok(entry));
                waited
            })
        };
        // Arrives once the first 100 kB are written.
        while p.state.lock().unwrap().written < 100_000 {
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        p.follow();
        let mut r = ChunkReader::new(Arc::clone(&p));
        let mut got = vec![0u8; 150_000];
        r.read_exact(&mut got).unwrap();
        half_read.send(()).unwrap();
        r.read_to_end(&mut got).unwrap();
        assert!(
            writer.join().unwrap(),
            "read past half before the download ended"
        );
        assert_eq!(got, data);
    }

    #[test]
    fn a_failed_download_is_an_error_and_overflow_falls_back_to_the_entry() {
        let p = Arc::new(Progress::new(100));
        p.push(0, Bytes::from_static(b"abc"));
        p.finish(Err("s3://b/k: 503 after 5 attempts".into()));
        let mut r = ChunkReader::new(Arc::clone(&p));
        let mut buf = [0u8; 8];
        assert_eq!(r.read(&mut buf).unwrap(), 3);
        let e = r.read(&mut buf).unwrap_err().to_string();
        assert!(e.contains("503"), "{e}");

        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("entry");
        let big = vec![7u8; (HOLD_BYTES + (1 << 20)) as usize];
        std::fs::write(&path, &big).unwrap();
        let p = Arc::new(Progress::new(big.len() as u64));
        for (i, c) in big.chunks(1 << 20).enumerate() {
            p.push((i << 20) as u64, Bytes::copy_from_slice(c));
        }
        p.finish(Ok(path));
        let mut got = Vec::new();
        ChunkReader::new(p).read_to_end(&mut got).unwrap();
        assert_eq!(got.len(), big.len());
    }
}
