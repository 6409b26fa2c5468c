//! Files → fixed-length chunks, streamed: decode a packet, resample it, cut
//! chunks as soon as they are complete. Memory per open file is one chunk
//! plus a packet, whatever the file's length.
//!
//! [`AudioFiles`](crate::AudioFiles) is an iterable source whose shards are
//! the files (or segments of long ones): each is read front to back by one
//! worker per epoch, and its chunks flow into batches like any other samples
//! (one file's chunks may land in different batches; the pipeline's shuffle
//! buffer mixes files).
//!
//! Chunk `k` of a file starts at sample `k × (chunk − overlap)` (at the
//! target rate). The last chunk is zero-padded; [`AudioChunk::valid`] says how
//! many samples are real. A file shorter than one chunk gives one padded
//! chunk; a file with no samples is an error.
//!
//! ```
//! use ferrofeed_audio::{Chunker, ChunkSpec};
//! let mut c = Chunker::new(ChunkSpec { chunk: 4, overlap: 1 }, 8000);
//! let mut out = Vec::new();
//! c.push(&[1.0, 2.0, 3.0, 4.0, 5.0, 6.0], &mut out);
//! c.finish(&mut out).unwrap();
//! let starts: Vec<u64> = out.iter().map(|c| c.start).collect();
//! assert_eq!(starts, vec![0, 3]);
//! assert_eq!(out[1].samples, vec![4.0, 5.0, 6.0, 0.0]);
//! assert_eq!(out[1].valid, 3);
//! ```
use std::collections::VecDeque;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use ferrofeed_core::Component;

use crate::decode::{DecodeOptions, Decoded};
use crate::resample::StreamResampler;
use crate::AudioError;

/// A chunk of mono audio at the target rate.
#[derive(Clone, Debug, PartialEq)]
pub struct AudioChunk {
    /// `channels × chunk` samples, one plane per channel, each zero-padded
    /// after `valid`.
    pub samples: Vec<f32>,
    /// Planes in `samples` (1 unless channels are kept).
    pub channels: usize,
    /// Real samples at the front.
    pub valid: usize,
    /// Index of the first sample in its file (at the target rate).
    pub start: u64,
    /// Sample rate.
    pub sample_rate: u32,
}

impl Component for AudioChunk {
    fn nbytes(&self) -> usize {
        self.samples.len() * 4
    }
    fn describe(&self) -> String {
        let peak = self.samples.iter().fold(0f32, |m, x| m.max(x.abs()));
        format!(
            "{} × {} samples at {} Hz ({} real) from sample {}, peak {peak:.3}",
            self.channels,
            self.samples.len() / self.channels.max(1),
            self.sample_rate,
            self.valid,
            self.start
        )
    }
}

/// Chunk length and overlap, in samples.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ChunkSpec {
    /// Samples per chunk.
    pub chunk: usize,
    /// Samples shared by consecutive chunks (`< chunk`).
    pub overlap: usize,
}

/// The most samples one chunk may hold (64 Mi: 70 minutes at 16 kHz, 256 MiB
/// of `f32`).
pub const MAX_CHUNK_SAMPLES: usize = 1 << 26;

impl ChunkSpec {
    /// From seconds at `rate` (at most [`MAX_CHUNK_SAMPLES`] per chunk).
    pub fn from_seconds(chunk: f64, overlap: f64, rate: u32) -> Result<Self, AudioError> {
        let c = (chunk * f64::from(rate)).round();
        let o = (overlap * f64::from(rate)).round();
        if !(1.0..=MAX_CHUNK_SAMPLES as f64).contains(&c) {
            return Err(AudioError::Config(format!(
                "--chunk-seconds {chunk} at {rate} Hz must make 1 to {MAX_CHUNK_SAMPLES} samples per chunk"
            )));
        }
        if !(o >= 0.0 && o < c) {
            return Err(AudioError::Config(format!(
                "--overlap-seconds {overlap} must be at least 0 and less than --chunk-seconds {chunk}"
            )));
        }
        Ok(ChunkSpec {
            chunk: c as usize,
            overlap: o as usize,
        })
    }
    /// Samples between chunk starts (at least 1, also for a hand-made spec
    /// whose overlap is not below its chunk).
    pub fn step(&self) -> usize {
        self.chunk.saturating_sub(self.overlap).max(1)
    }
}

/// Cuts a stream of samples into overlapping chunks.
///
/// With an offset (see [`Chunker::with_offset`]) the chunk grid starts that
/// many samples into the stream: the samples before it are in no chunk. A
/// stream too short to fill one chunk after its offset gives one chunk from
/// its start, as without an offset.
#[derive(Debug)]
pub struct Chunker {
    spec: ChunkSpec,
    rate: u32,
    buf: Vec<f32>,
    next_start: u64,
    covered: u64,
    total: u64,
    offset: usize,
    /// Samples of the offset still to pass.
    skip: usize,
    /// The samples before the offset, kept until the first chunk is full.
    head: Vec<f32>,
    emitted: bool,
    /// Chunks still to hand out, for a segment that ends before its file.
    remaining: Option<u64>,
}

impl Chunker {
    /// A chunker for a stream at `rate`.
    /// A hand-made spec with a zero-length chunk gets one-sample chunks
    /// (`from_seconds` refuses it).
    pub fn new(spec: ChunkSpec, rate: u32) -> Self {
        Self::with_offset(spec, rate, 0)
    }

    /// A chunker whose first chunk starts `offset` samples into the stream
    /// (below one step: larger offsets are cut to `step - 1`).
    pub fn with_offset(spec: ChunkSpec, rate: u32, offset: usize) -> Self {
        let spec = ChunkSpec {
            chunk: spec.chunk.max(1),
            ..spec
        };
        let offset = offset.min(spec.step() - 1);
        Chunker {
            spec,
            rate,
            buf: Vec::with_capacity(spec.chunk),
            next_start: offset as u64,
            covered: offset as u64,
            total: 0,
            offset,
            skip: offset,
            head: Vec::with_capacity(offset),
            emitted: false,
            remaining: None,
        }
    }

    /// A chunker for a segment of a stream: chunks `first ..` of the grid
    /// at `offset` (`first + count` excluded when `count` is given), fed
    /// with the stream's samples from chunk `first`'s start on. Its chunks
    /// equal those a chunker fed the whole stream makes there, the padded
    /// last one included when the stream ends in the segment.
    pub fn segment(
        spec: ChunkSpec,
        rate: u32,
        offset: usize,
        first: u64,
        count: Option<u64>,
    ) -> Self {
        let mut c = Self::with_offset(spec, rate, offset);
        c.remaining = count;
        if first > 0 {
            let (chunk, step) = (c.spec.chunk as u64, c.spec.step() as u64);
            let start = c.offset as u64 + first * step;
            c.next_start = start;
            c.total = start;
            c.covered = start - step + chunk;
            c.skip = 0;
            c.head = Vec::new();
            c.emitted = true;
        }
        c
    }

    /// Where the first sample pushed must sit in the stream (see
    /// [`Chunker::segment`]).
    pub fn first_sample(&self) -> u64 {
        self.total
    }

    /// Whether a segment's last chunk is out: later samples are ignored.
    pub fn complete(&self) -> bool {
        self.remaining == Some(0)
    }

    /// Adds samples; complete chunks are appended to `out`.
    ///
    /// The buffer always holds the samples from the next chunk's start: a
    /// full buffer is handed out as the chunk itself (no copy), and the next
    /// one starts with its overlap.
    pub fn push(&mut self, mut samples: &[f32], out: &mut impl Extend<AudioChunk>) {
        if self.complete() {
            return;
        }
        self.total += samples.len() as u64;
        if self.skip > 0 {
            let take = self.skip.min(samples.len());
            self.head.extend_from_slice(&samples[..take]);
            samples = &samples[take..];
            self.skip -= take;
        }
        // `new` keeps the chunk at least 1, so 1 ≤ step ≤ chunk.
        let (c, step) = (self.spec.chunk, self.spec.step());
        while !samples.is_empty() {
            let take = (c - self.buf.len()).min(samples.len());
            self.buf.extend_from_slice(&samples[..take]);
            samples = &samples[take..];
            if self.buf.len() >= c {
                let mut next = Vec::with_capacity(c);
                next.extend_from_slice(&self.buf[step..]);
                let full = std::mem::replace(&mut self.buf, next);
                out.extend(std::iter::once(AudioChunk {
                    samples: full,
                    channels: 1,
                    valid: c,
                    start: self.next_start,
                    sample_rate: self.rate,
                }));
                if !self.emitted {
                    self.emitted = true;
                    self.head = Vec::new();
                }
                self.covered = self.next_start + c as u64;
                self.next_start += step as u64;
                if let Some(r) = &mut self.remaining {
                    *r -= 1;
                    if *r == 0 {
                        self.buf.clear();
                        return;
                    }
                }
            }
        }
    }

    /// Ends the stream: the zero-padded last chunk, if samples remain that no
    /// chunk holds. An error when the stream had no samples at all.
    pub fn finish(&mut self, out: &mut impl Extend<AudioChunk>) -> Result<(), AudioError> {
        if self.total == 0 {
            return Err(AudioError::Config("the file holds no audio samples".into()));
        }
        if self.complete() {
            return Ok(());
        }
        if !self.emitted && self.offset > 0 {
            // Too short for a chunk after the offset: one from the start.
            let mut samples = std::mem::take(&mut self.head);
            samples.append(&mut self.buf);
            samples.truncate(self.spec.chunk);
            let valid = samples.len();
            samples.resize(self.spec.chunk, 0.0);
            out.extend(std::iter::once(AudioChunk {
                samples,
                channels: 1,
                valid,
                start: 0,
                sample_rate: self.rate,
            }));
            self.emitted = true;
            self.covered = self.total;
        } else if self.total > self.covered || self.covered == 0 {
            let mut samples = std::mem::take(&mut self.buf);
            let valid = samples.len();
            samples.resize(self.spec.chunk, 0.0);
            out.extend(std::iter::once(AudioChunk {
                samples,
                channels: 1,
                valid,
                start: self.next_start,
                sample_rate: self.rate,
            }));
            self.emitted = true;
            self.covered = self.total;
        }
        self.buf.clear();
        Ok(())
    }

    /// Samples pushed so far.
    pub fn total(&self) -> u64 {
        self.total
    }
}

/// Default [`StreamOptions::segment_seconds`].
pub const DEFAULT_SEGMENT_SECONDS: f64 = 60.0;

/// Files smaller than this are never split into segments (their headers
/// are not read when the source is made).
pub const SEGMENT_MIN_BYTES: u64 = 1 << 20;

/// How files become chunks.
#[derive(Debug, Clone, Copy)]
pub struct StreamOptions {
    /// Target sample rate; other rates are resampled.
    pub sample_rate: u32,
    /// Chunk length, seconds.
    pub chunk_seconds: f64,
    /// Overlap between consecutive chunks, seconds.
    pub overlap_seconds: f64,
    /// Keep every channel (chunks hold `channels` planes) instead of mixing
    /// to mono.
    pub keep_channels: bool,
    /// Random chunk offsets: each epoch, each file's chunk grid starts at
    /// one of this many evenly spaced offsets within a step, drawn from
    /// the seed, the epoch and the file ([`AudioFiles::offset_at`](crate::AudioFiles::offset_at)); 1: at
    /// the file's start, every epoch the same chunks.
    pub chunk_offsets: u32,
    /// Long files across workers: a WAV or FLAC file of at least 1 MiB
    /// whose header gives at least two segments' worth of chunks is read as
    /// segments of about this many seconds (whole chunks, at least two),
    /// each its own shard, sought to and decoded by whichever worker takes
    /// it; the chunks are those of decoding the file whole. 0: every file
    /// is one shard.
    pub segment_seconds: f64,
    /// Decoding options.
    pub decode: DecodeOptions,
}

impl Default for StreamOptions {
    fn default() -> Self {
        StreamOptions {
            sample_rate: 16000,
            chunk_seconds: 10.0,
            overlap_seconds: 0.0,
            keep_channels: false,
            chunk_offsets: 1,
            segment_seconds: DEFAULT_SEGMENT_SECONDS,
            decode: DecodeOptions::default(),
        }
    }
}

/// One channel's way from decoded blocks to chunks.
struct Lane {
    resampler: Option<StreamResampler>,
    chunker: Chunker,
    ready: VecDeque<AudioChunk>,
}

/// The chunks of one file, produced as it decodes.
pub struct ChunkStream {
    decoded: Decoded,
    keep: bool,
    lanes: Vec<Lane>,
    spec: ChunkSpec,
    rate: u32,
    offset: usize,
    scratch: Vec<f32>,
    done: bool,
    pub(crate) counter: Option<Arc<AtomicU64>>,
    /// The samples this stream counts as read: from its segment's start to
    /// the next segment's (the whole file for a whole file).
    counted: (u64, u64),
}

impl ChunkStream {
    /// Opens `path` (the header is read now; bad files fail here).
    pub fn open(path: &Path, opts: &StreamOptions) -> Result<ChunkStream, AudioError> {
        Self::open_at(path, opts, 0)
    }

    /// Opens `path` with its chunk grid `offset` samples (at the target
    /// rate) into the stream; see [`Chunker::with_offset`].
    pub fn open_at(
        path: &Path,
        opts: &StreamOptions,
        offset: usize,
    ) -> Result<ChunkStream, AudioError> {
        Self::open_segment(path, opts, offset, 0, None)
    }

    /// Chunks `first ..` of `path` (`first + count` excluded when `count` is
    /// given) on the grid at `offset`: the file is sought near chunk
    /// `first` and decoded from there, and the chunks equal those of
    /// decoding it whole (for WAV and FLAC, see [`Decoded::seeks_exactly`];
    /// other formats are decoded from their start).
    pub fn open_segment(
        path: &Path,
        opts: &StreamOptions,
        offset: usize,
        first: u64,
        count: Option<u64>,
    ) -> Result<ChunkStream, AudioError> {
        let spec =
            ChunkSpec::from_seconds(opts.chunk_seconds, opts.overlap_seconds, opts.sample_rate)?;
        let decoded = Decoded::open(path, &opts.decode)?;
        let mut s = ChunkStream {
            decoded,
            keep: opts.keep_channels,
            lanes: Vec::new(),
            spec,
            rate: opts.sample_rate,
            offset,
            scratch: Vec::new(),
            done: false,
            counter: None,
            counted: (0, u64::MAX),
        };
        let n = if s.keep { s.decoded.channels() } else { 1 };
        let mut from = 0;
        for _ in 0..n {
            from = s.add_lane(first, count)?;
        }
        if first > 0 {
            let step = spec.step() as u64;
            let start = s.lanes.first().map_or(0, |l| l.chunker.first_sample());
            s.counted = (start, count.map_or(u64::MAX, |c| start + c * step));
            if s.decoded.seeks_exactly() {
                s.decoded.seek_to(from).map_err(|e| s.named(e))?;
            } else {
                s.decoded.discard_before(from);
            }
        } else if let Some(c) = count {
            s.counted = (0, offset as u64 + c * spec.step() as u64);
        }
        Ok(s)
    }

    /// A lane for chunks `first ..`; returns the input frame it must be fed
    /// from.
    fn add_lane(&mut self, first: u64, count: Option<u64>) -> Result<u64, AudioError> {
        let chunker = Chunker::segment(self.spec, self.rate, self.offset, first, count);
        let start = chunker.first_sample();
        let (resampler, from) = if self.decoded.sample_rate() == self.rate {
            (None, start)
        } else {
            let (r, from) =
                StreamResampler::starting_at(self.decoded.sample_rate(), self.rate, start)?;
            (Some(r), from)
        };
        self.lanes.push(Lane {
            resampler,
            chunker,
            ready: VecDeque::new(),
        });
        Ok(from)
    }

    fn named(&self, e: AudioError) -> AudioError {
        match e {
            AudioError::Config(m) => AudioError::Decode {
                path: self.decoded.path().to_path_buf(),
                message: m,
            },
            e => e,
        }
    }

    /// One decoded block through the lanes; errors name the file.
    fn step(&mut self) -> Result<(), AudioError> {
        self.advance().map_err(|e| self.named(e))
    }

    fn advance(&mut self) -> Result<(), AudioError> {
        let block = if self.keep {
            self.decoded.next_channels()?
        } else {
            self.decoded.next_block()?.map(|b| vec![b])
        };
        match block {
            Some(planes) => {
                if planes.len() != self.lanes.len() {
                    return Err(AudioError::Config(format!(
                        "the stream changed from {} to {} channels",
                        self.lanes.len(),
                        planes.len()
                    )));
                }
                for (lane, plane) in self.lanes.iter_mut().zip(&planes) {
                    match &mut lane.resampler {
                        Some(r) => {
                            self.scratch.clear();
                            r.push(plane, &mut self.scratch)?;
                            lane.chunker.push(&self.scratch, &mut lane.ready);
                        }
                        None => lane.chunker.push(plane, &mut lane.ready),
                    }
                }
                if self.lanes.iter().all(|l| l.chunker.complete()) {
                    // A segment's last chunk is out: the rest is another's.
                    self.done = true;
                    self.count_read();
                }
            }
            None => {
                self.done = true;
                for lane in &mut self.lanes {
                    if let Some(r) = &mut lane.resampler {
                        self.scratch.clear();
                        r.finish(&mut self.scratch)?;
                        lane.chunker.push(&self.scratch, &mut lane.ready);
                    }
                    lane.chunker.finish(&mut lane.ready)?;
                }
                self.count_read();
            }
        }
        Ok(())
    }

    fn count_read(&self) {
        if let (Some(c), Some(lane)) = (&self.counter, self.lanes.first()) {
            let (from, to) = self.counted;
            let n = lane.chunker.total().min(to).saturating_sub(from);
            c.fetch_add(n, Ordering::Relaxed);
        }
    }

    /// The next chunk when every lane has one (lanes advance in step).
    fn pop(&mut self) -> Option<AudioChunk> {
        if self.lanes.iter().any(|l| l.ready.is_empty()) {
            return None;
        }
        let mut parts = self.lanes.iter_mut().filter_map(|l| l.ready.pop_front());
        let mut first = parts.next()?;
        let mut channels = 1;
        for p in parts {
            first.samples.extend_from_slice(&p.samples);
            channels += 1;
        }
        first.channels = channels;
        Some(first)
    }
}

impl Iterator for ChunkStream {
    type Item = Result<AudioChunk, AudioError>;
    fn next(&mut self) -> Option<Self::Item> {
        loop {
            if let Some(c) = self.pop() {
                return Some(Ok(c));
            }
            if self.done {
                return None;
            }
            if let Err(e) = self.step() {
                self.done = true;
                return Some(Err(e));
            }
        }
    }
}

impl ChunkSpec {
    /// Chunks a stream of `samples` samples makes: every full chunk, then
    /// a zero-padded last one for samples no chunk holds.
    pub fn chunks_for(&self, samples: u64) -> u64 {
        let (c, step) = (self.chunk.max(1) as u64, self.step().max(1) as u64);
        if samples == 0 {
            return 0;
        }
        let full = if samples >= c {
            (samples - c) / step + 1
        } else {
            0
        };
        let covered = if full > 0 { (full - 1) * step + c } else { 0 };
        full + u64::from(samples > covered || full == 0)
    }

    /// Chunks a stream of `samples` samples makes with its grid `offset`
    /// samples in (see [`Chunker::with_offset`]).
    pub fn chunks_at(&self, samples: u64, offset: usize) -> u64 {
        let offset = offset.min(self.step() - 1) as u64;
        if offset > 0 && samples < offset + self.chunk.max(1) as u64 {
            return u64::from(samples > 0);
        }
        self.chunks_for(samples - offset)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn chunks(n: usize, spec: ChunkSpec, pieces: usize) -> Vec<AudioChunk> {
        chunks_at(n, spec, pieces, 0)
    }

    fn chunks_at(n: usize, spec: ChunkSpec, pieces: usize, offset: usize) -> Vec<AudioChunk> {
        let x: Vec<f32> = (0..n).map(|i| i as f32 + 1.0).collect();
        let mut c = Chunker::with_offset(spec, 100, offset);
        let mut out = Vec::new();
        for p in x.chunks(pieces.max(1)) {
            c.push(p, &mut out);
        }
        c.finish(&mut out).unwrap();
        out
    }

    #[test]
    fn an_offset_shifts_the_grid_and_a_short_stream_keeps_its_start() {
        for n in [1, 5, 9, 10, 13, 14, 30, 97] {
            for (chunk, overlap) in [(10, 0), (10, 3), (4, 0)] {
                let spec = ChunkSpec { chunk, overlap };
                for offset in 0..spec.step() {
                    let want = chunks_at(n, spec, n, offset);
                    for pieces in [1, 3, 7] {
                        assert_eq!(chunks_at(n, spec, pieces, offset), want);
                    }
                    assert_eq!(
                        want.len() as u64,
                        spec.chunks_at(n as u64, offset),
                        "n {n} {spec:?} offset {offset}"
                    );
                    if n >= offset + chunk {
                        for (k, c) in want.iter().enumerate() {
                            let start = offset + k * spec.step();
                            assert_eq!(c.start, start as u64);
                            let real = (n - start).min(chunk);
                            assert_eq!(c.valid, real);
                            assert_eq!(c.samples[0], (start + 1) as f32);
                            assert!(c.samples[real..].iter().all(|&v| v == 0.0));
                        }
                        let last = want.last().unwrap();
                        assert!(
                            last.start as usize + last.valid == n,
                            "the end is in no chunk"
                        );
                    } else {
                        assert_eq!(want.len(), 1);
                        assert_eq!((want[0].start, want[0].valid), (0, n.min(chunk)));
                        assert_eq!(want[0].samples[0], 1.0);
                    }
                }
            }
        }
    }

    #[test]
    fn chunks_cover_every_sample_whatever_the_packet_sizes() {
        for n in [1, 5, 9, 10, 11, 30, 97] {
            for (chunk, overlap) in [(10, 0), (10, 3), (10, 9), (1, 0)] {
                let spec = ChunkSpec { chunk, overlap };
                let want = chunks(n, spec, n);
                for pieces in [1, 2, 3, 7, 64] {
                    assert_eq!(
                        chunks(n, spec, pieces),
                        want,
                        "n {n} {spec:?} pieces {pieces}"
                    );
                }
                for (k, c) in want.iter().enumerate() {
                    assert_eq!(c.start, (k * spec.step()) as u64);
                    assert_eq!(c.samples.len(), chunk);
                    for (i, &s) in c.samples.iter().enumerate() {
                        let abs = c.start as usize + i;
                        let expect = if i < c.valid { abs as f32 + 1.0 } else { 0.0 };
                        assert_eq!(s, expect);
                    }
                    if k + 1 < want.len() {
                        assert_eq!(c.valid, chunk, "only the last chunk is short");
                    }
                }
                let last = want.last().unwrap();
                assert_eq!(
                    last.start as usize + last.valid,
                    n,
                    "the last sample is in the last chunk"
                );
                if want.len() > 1 {
                    assert!(last.valid > overlap, "no chunk holds only overlap");
                }
            }
        }
        let mut c = Chunker::new(
            ChunkSpec {
                chunk: 4,
                overlap: 0,
            },
            100,
        );
        assert!(c.finish(&mut Vec::new()).is_err());
        // A hand-made spec with the overlap past the chunk steps one sample.
        let odd = ChunkSpec {
            chunk: 4,
            overlap: 6,
        };
        assert_eq!(odd.step(), 1);
        let starts: Vec<u64> = chunks(7, odd, 3).iter().map(|c| c.start).collect();
        assert_eq!(
            starts,
            [0, 1, 2, 3],
            "full chunks only: the last one ends at sample 7"
        );
        // A zero-length chunk neither loops nor loses samples: one per chunk.
        let zero = ChunkSpec {
            chunk: 0,
            overlap: 0,
        };
        let got = chunks(5, zero, 2);
        assert_eq!(got.len(), 5);
        assert!(got.iter().all(|c| c.samples.len() == 1 && c.valid == 1));
    }

    /// Chunks of `path` read as segments of `per` chunks (the last one to
    /// the end), and the samples they count as read.
    fn by_segments(
        path: &Path,
        opts: &StreamOptions,
        offset: usize,
        per: u64,
        segments: u64,
    ) -> (Vec<AudioChunk>, u64) {
        let counter = Arc::new(AtomicU64::new(0));
        let mut out = Vec::new();
        for j in 0..segments {
            let count = (j + 1 < segments).then_some(per);
            let mut s = ChunkStream::open_segment(path, opts, offset, j * per, count).unwrap();
            s.counter = Some(Arc::clone(&counter));
            let got: Vec<AudioChunk> = s.map(Result::unwrap).collect();
            if let Some(c) = count {
                assert!(got.len() as u64 <= c);
            }
            out.extend(got);
        }
        (out, counter.load(Ordering::Relaxed))
    }

    #[test]
    fn segments_of_a_file_give_the_chunks_of_decoding_it_whole() {
        use crate::synth::{write_flac, write_wav};
        let dir = tempfile::tempdir().unwrap();
        let tone = |n: usize, rate: u32, f: f64| -> Vec<f32> {
            (0..n)
                .map(|i| {
                    let t = i as f64 / f64::from(rate);
                    (0.6 * (2.0 * std::f64::consts::PI * f * t).sin()
                        + 0.2 * (2.0 * std::f64::consts::PI * 3.1 * f * t * t).sin())
                        as f32
                })
                .collect()
        };
        let cases: Vec<(&str, u32, usize, bool)> = vec![
            ("mono16k.wav", 16_000, 1, false),
            ("mono44k.flac", 44_100, 1, false),
            ("stereo48k.flac", 48_000, 2, true),
            ("float22k.wav", 22_050, 1, false),
        ];
        for (name, rate, channels, keep) in cases {
            let path = dir.path().join(name);
            let n = rate as usize * 23 + 777;
            let chans: Vec<Vec<f32>> = (0..channels)
                .map(|c| tone(n, rate, 220.0 * (c + 1) as f64))
                .collect();
            if name.ends_with(".flac") {
                write_flac(&path, &chans, rate).unwrap();
            } else {
                write_wav(&path, &chans, rate, name.starts_with("float")).unwrap();
            }
            for (chunk, overlap, offset) in [(1.0, 0.0, 0), (1.5, 0.25, 0), (1.0, 0.0, 4321)] {
                let opts = StreamOptions {
                    chunk_seconds: chunk,
                    overlap_seconds: overlap,
                    keep_channels: keep,
                    ..StreamOptions::default()
                };
                let whole_counter = Arc::new(AtomicU64::new(0));
                let mut w = ChunkStream::open_at(&path, &opts, offset).unwrap();
                w.counter = Some(Arc::clone(&whole_counter));
                let whole: Vec<AudioChunk> = w.map(Result::unwrap).collect();
                let read = whole_counter.load(Ordering::Relaxed);
                assert!(whole.len() > 10, "{name}");
                for per in [1u64, 3, 7] {
                    let segments = (whole.len() as u64 / per).max(1);
                    let (got, counted) = by_segments(&path, &opts, offset, per, segments);
                    assert_eq!(
                        got.len(),
                        whole.len(),
                        "{name} {chunk} {overlap} {offset} per {per}"
                    );
                    for (k, (g, w)) in got.iter().zip(&whole).enumerate() {
                        assert!(
                            g == w,
                            "{name} chunk {k} differs (per {per}, chunk {chunk} s, overlap {overlap} s, offset {offset})"
                        );
                    }
                    assert_eq!(counted, read, "{name}: every sample counted once");
                }
                // A segment past the end is empty, not an error.
                let past =
                    ChunkStream::open_segment(&path, &opts, offset, whole.len() as u64 + 5, None)
                        .unwrap()
                        .count();
                assert_eq!(past, 0, "{name}");
            }
        }
    }

    #[test]
    fn chunk_specs_from_seconds() {
        let s = ChunkSpec::from_seconds(10.0, 2.5, 16000).unwrap();
        assert_eq!((s.chunk, s.overlap, s.step()), (160000, 40000, 120000));
        assert!(ChunkSpec::from_seconds(0.0, 0.0, 16000).is_err());
        assert!(ChunkSpec::from_seconds(1.0, 1.0, 16000).is_err());
        assert!(ChunkSpec::from_seconds(1.0, -1.0, 16000).is_err());
        assert!(ChunkSpec::from_seconds(f64::NAN, 0.0, 16000).is_err());
    }
}
