//! An object read while it downloads: the download publishes each chunk it
//! writes to the cache's temporary file, and a reader takes them in order,
//! so a streamed shard's first members are decoded while its last ones are
//! still on the wire. A retried download publishes from byte 0 again and
//! the reader skips what it already has. Chunks are held in memory only up
//! to [`HOLD_BYTES`] ahead of the reader; past that the reader waits for the
//! finished entry and reads on from the file at its offset.
//!
//! ```text
//! get_into: chunk ─▶ file ─▶ Progress (≤ HOLD_BYTES) ─▶ ChunkReader ─▶ tar members
//!                                done(path) ─────────▶ ChunkReader reads the entry from its offset
//! ```

use std::collections::VecDeque;
use std::io::{Read, Seek, SeekFrom};
use std::path::PathBuf;
use std::sync::{Arc, Condvar, Mutex};

/// Bytes a download holds for a reader that lags behind.
pub(crate) const HOLD_BYTES: u64 = 16 << 20;

#[derive(Default)]
struct State {
    /// Chunks not yet read, each with its offset in the object.
    chunks: VecDeque<(u64, Vec<u8>)>,
    held: u64,
    /// Chunks were dropped for want of room: the reader reads the entry.
    overflow: bool,
    done: Option<Result<PathBuf, String>>,
}

/// One download's chunks, for the readers of the object.
#[derive(Default)]
pub(crate) struct Progress {
    state: Mutex<State>,
    cv: Condvar,
}

impl Progress {
    /// A new attempt starts at byte 0.
    pub(crate) fn restart(&self) {
        if let Ok(mut s) = self.state.lock() {
            s.chunks.clear();
            s.held = 0;
        }
    }

    /// The download wrote `chunk` at `offset`.
    pub(crate) fn push(&self, offset: u64, chunk: &[u8]) {
        let Ok(mut s) = self.state.lock() else { return };
        if s.overflow {
            return;
        }
        if s.held + chunk.len() as u64 > HOLD_BYTES {
            s.overflow = true;
            s.chunks.clear();
            s.held = 0;
        } else {
            s.held += chunk.len() as u64;
            s.chunks.push_back((offset, chunk.to_vec()));
        }
        drop(s);
        self.cv.notify_all();
    }

    /// The download ended: its entry, or why not.
    pub(crate) fn finish(&self, result: Result<PathBuf, String>) {
        if let Ok(mut s) = self.state.lock() {
            s.done = Some(result);
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
        let mut s = self
            .progress
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
            if let Some((at, c)) = s.chunks.front() {
                if *at <= self.offset {
                    let from = (self.offset - at) as usize;
                    let n = (c.len() - from).min(buf.len());
                    buf[..n].copy_from_slice(&c[from..from + n]);
                    self.offset += n as u64;
                    return Ok(n);
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
            s = self
                .progress
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
        let p = Arc::new(Progress::default());
        let writer = {
            let (p, data, path) = (Arc::clone(&p), data.clone(), path.clone());
            std::thread::spawn(move || {
                // A first attempt cut after 30 kB, then a whole one; the
                // last 10 kB only in the entry.
                for (i, c) in data[..30_000].chunks(7_000).enumerate() {
                    p.push((i * 7_000) as u64, c);
                    std::thread::sleep(std::time::Duration::from_millis(2));
                }
                p.restart();
                for (i, c) in data[..90_000].chunks(9_000).enumerate() {
                    p.push((i * 9_000) as u64, c);
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

    #[test]
    fn a_failed_download_is_an_error_and_overflow_falls_back_to_the_entry() {
        let p = Arc::new(Progress::default());
        p.push(0, b"abc");
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
        let p = Arc::new(Progress::default());
        for (i, c) in big.chunks(1 << 20).enumerate() {
            p.push((i << 20) as u64, c);
        }
        p.finish(Ok(path));
        let mut got = Vec::new();
        ChunkReader::new(p).read_to_end(&mut got).unwrap();
        assert_eq!(got.len(), big.len());
    }
}
