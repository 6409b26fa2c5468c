//! Files → fixed-length chunks, streamed: decode a packet, resample it, cut
//! chunks as soon as they are complete. Memory per open file is one chunk
//! plus a packet, whatever the file's length.
//!
//! [`AudioFiles`] is an iterable source whose shards are the files: each
//! file is read front to back by one worker per epoch, and its chunks flow
//! into batches like any other samples (one file's chunks may land in
//! different batches; the pipeline's shuffle buffer mixes files).
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
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use ferrofeed_core::ShardIter;
use ferrofeed_core::{BoxError, Component, IterableSource, ShardEpoch};
use rubato::{FftFixedIn, Resampler};

use crate::decode::{DecodeOptions, Decoded};
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

impl ChunkSpec {
    /// From seconds at `rate`.
    pub fn from_seconds(chunk: f64, overlap: f64, rate: u32) -> Result<Self, AudioError> {
        let c = (chunk * f64::from(rate)).round();
        let o = (overlap * f64::from(rate)).round();
        if !(1.0..1e10).contains(&c) {
            return Err(AudioError::Config(format!(
                "--chunk-seconds {chunk} gives no whole sample at {rate} Hz"
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

/// A streaming resampler (rubato's FFT resampler) that trims its delay and
/// returns exactly `ceil(n × out / in)` samples for `n` in.
///
/// The FFT resampler works in units of a fixed number of input frames,
/// counted from the stream's start; a unit's output depends on that unit and
/// the one before. So [`StreamResampler::starting_at`] can begin mid-stream,
/// one unit early, and hand out exactly what resampling the whole stream
/// gives from there on.
pub struct StreamResampler {
    r: FftFixedIn<f32>,
    pending: Vec<f32>,
    /// Raw output frames (before trimming the delay) produced so far,
    /// counted from the stream's start.
    raw_out: u64,
    /// Raw output frames below this are not handed out: the delay, plus
    /// for a resampler started mid-stream everything before its start.
    skip_until: u64,
    rate_in: u64,
    rate_out: u64,
    /// Input frames counted from the stream's start.
    n_in: u64,
    /// Output frames counted from the stream's start.
    n_out: u64,
}

/// Input chunk and sub-chunks the resampler is built with.
const RESAMPLE_CHUNK: usize = 8192;
const RESAMPLE_SUB_CHUNKS: usize = 8;

impl StreamResampler {
    /// From `rate_in` to `rate_out` Hz.
    pub fn new(rate_in: u32, rate_out: u32) -> Result<Self, AudioError> {
        let r = FftFixedIn::<f32>::new(
            rate_in as usize,
            rate_out as usize,
            RESAMPLE_CHUNK,
            RESAMPLE_SUB_CHUNKS,
            1,
        )
        .map_err(|e| AudioError::Config(format!("resampler {rate_in} → {rate_out} Hz: {e}")))?;
        let skip_until = r.output_delay() as u64;
        Ok(StreamResampler {
            r,
            pending: Vec::new(),
            raw_out: 0,
            skip_until,
            rate_in: u64::from(rate_in),
            rate_out: u64::from(rate_out),
            n_in: 0,
            n_out: 0,
        })
    }

    /// Input and output frames per FFT unit (rubato's `FftFixedIn` sizing).
    fn units(rate_in: u32, rate_out: u32) -> (u64, u64) {
        let (a, b) = (u64::from(rate_in), u64::from(rate_out));
        let g = gcd(a, b).max(1);
        let min_in = (a / g).max(1);
        let wanted = (RESAMPLE_CHUNK / RESAMPLE_SUB_CHUNKS) as u64;
        let n = wanted.div_ceil(min_in);
        (n * a / g, n * b / g)
    }

    /// A resampler whose first output frame is frame `out_start` of the
    /// whole stream's output, and the input frame it must be fed from (its
    /// first input is that frame of the stream): one FFT unit before the
    /// unit holding `out_start`, or the stream's start.
    pub fn starting_at(
        rate_in: u32,
        rate_out: u32,
        out_start: u64,
    ) -> Result<(Self, u64), AudioError> {
        let mut r = Self::new(rate_in, rate_out)?;
        let (unit_in, unit_out) = Self::units(rate_in, rate_out);
        // The unit holding the first frame wanted, after the delay; when the
        // sizing is not the one expected, the stream's start.
        let known = unit_in > 0 && unit_out > 0 && unit_out / 2 == r.skip_until;
        let unit = if known {
            (out_start + r.skip_until) / unit_out
        } else {
            0
        };
        let first = unit.saturating_sub(1);
        r.raw_out = first * unit_out;
        r.skip_until += out_start;
        r.n_in = first * unit_in;
        r.n_out = out_start;
        let from = r.n_in;
        Ok((r, from))
    }

    /// Appends `block` once the resampler's delay is trimmed off the front
    /// of the stream; at its end (`tail`), no further than the expected total.
    fn emit(&mut self, mut block: Vec<f32>, out: &mut Vec<f32>, tail: bool) {
        let begin = self.raw_out;
        self.raw_out += block.len() as u64;
        let s = (self.skip_until.saturating_sub(begin) as usize).min(block.len());
        block.drain(..s);
        let take = if tail {
            let want = self.expected().saturating_sub(self.n_out);
            (block.len() as u64).min(want) as usize
        } else {
            block.len()
        };
        out.extend_from_slice(&block[..take]);
        self.n_out += take as u64;
    }

    fn expected(&self) -> u64 {
        (self.n_in * self.rate_out).div_ceil(self.rate_in)
    }

    /// Resamples `input`, appending what is ready to `out`.
    pub fn push(&mut self, input: &[f32], out: &mut Vec<f32>) -> Result<(), AudioError> {
        self.n_in += input.len() as u64;
        self.pending.extend_from_slice(input);
        let mut used = 0;
        loop {
            let need = self.r.input_frames_next();
            if self.pending.len() - used < need {
                break;
            }
            let block = self
                .r
                .process(&[&self.pending[used..used + need]], None)
                .map_err(|e| AudioError::Config(format!("resampling: {e}")))?;
            used += need;
            let b = block.into_iter().next().unwrap_or_default();
            // Output lags input by the delay: nothing here passes `expected`.
            self.emit(b, out, false);
        }
        self.pending.drain(..used);
        Ok(())
    }

    /// Flushes the tail; afterwards `out` has received exactly
    /// `ceil(n_in × rate_out / rate_in)` samples in all.
    pub fn finish(&mut self, out: &mut Vec<f32>) -> Result<(), AudioError> {
        let err = |e: rubato::ResampleError| AudioError::Config(format!("resampling: {e}"));
        let rest = std::mem::take(&mut self.pending);
        if !rest.is_empty() {
            let block = self
                .r
                .process_partial(Some(&[&rest[..]]), None)
                .map_err(err)?;
            self.emit(block.into_iter().next().unwrap_or_default(), out, true);
        }
        let mut guard = 0;
        while self.n_out < self.expected() && guard < 64 {
            let block = self
                .r
                .process_partial(None::<&[&[f32]]>, None)
                .map_err(err)?;
            self.emit(block.into_iter().next().unwrap_or_default(), out, true);
            guard += 1;
        }
        // Round-off can leave a sample or two short: pad with silence.
        while self.n_out < self.expected() {
            out.push(0.0);
            self.n_out += 1;
        }
        Ok(())
    }
}

fn gcd(mut a: u64, mut b: u64) -> u64 {
    while b != 0 {
        (a, b) = (b, a % b);
    }
    a
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
    /// the seed, the epoch and the file ([`AudioFiles::offset_at`]); 1: at
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

/// The audio file extensions read.
pub const AUDIO_EXTENSIONS: &[&str] = &["wav", "flac", "mp3", "ogg", "oga"];

/// Audio files as an iterable source of [`AudioChunk`]s, one shard per file.
#[derive(Debug, Clone)]
pub struct AudioFiles {
    files: Vec<PathBuf>,
    opts: StreamOptions,
    samples: Arc<AtomicU64>,
    /// Each file's sample count (at the target rate) from its header,
    /// looked up once.
    lens: Vec<std::sync::OnceLock<Option<u64>>>,
    /// The shards: whole files, or runs of a long file's chunks.
    segments: Vec<Segment>,
}

/// A shard of [`AudioFiles`]: chunks `first ..` of file `file`, up to
/// `first + count` (to the file's end when `count` is `None`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Segment {
    /// The file, by its place in [`AudioFiles::files`].
    pub file: usize,
    /// The first chunk.
    pub first: u64,
    /// Chunks in the segment; `None`: to the end of the file.
    pub count: Option<u64>,
}

impl Segment {
    /// Whether the segment is its whole file.
    pub fn is_whole(&self) -> bool {
        self.first == 0 && self.count.is_none()
    }
}

impl AudioFiles {
    /// Every audio file under `dir` (recursively, in path order), or `dir`
    /// itself when it is a file.
    pub fn scan(dir: &Path, opts: StreamOptions) -> Result<AudioFiles, AudioError> {
        Self::check(&opts)?;
        let mut files = Vec::new();
        if dir.is_file() {
            files.push(dir.to_path_buf());
        } else {
            files = ferrofeed_stages::walk_files(dir)
                .map_err(|e| AudioError::Decode {
                    path: dir.to_path_buf(),
                    message: e.to_string(),
                })?
                .into_iter()
                .filter(|p| {
                    p.extension().and_then(|e| e.to_str()).is_some_and(|e| {
                        AUDIO_EXTENSIONS.contains(&e.to_ascii_lowercase().as_str())
                    })
                })
                .collect();
        }
        if files.is_empty() {
            return Err(AudioError::Decode {
                path: dir.to_path_buf(),
                message: format!("no audio files ({})", AUDIO_EXTENSIONS.join(", ")),
            });
        }
        Self::from_files(files, opts)
    }

    fn check(opts: &StreamOptions) -> Result<(), AudioError> {
        let spec =
            ChunkSpec::from_seconds(opts.chunk_seconds, opts.overlap_seconds, opts.sample_rate)?;
        if opts.chunk_offsets == 0 || opts.chunk_offsets as usize > spec.step() {
            return Err(AudioError::Config(format!(
                "--chunk-offsets {} must be at least 1 and at most the {} samples between chunk starts",
                opts.chunk_offsets,
                spec.step()
            )));
        }
        if !(opts.segment_seconds.is_finite() && opts.segment_seconds >= 0.0) {
            return Err(AudioError::Config(format!(
                "--segment-seconds {} must be a number of seconds, 0 or more",
                opts.segment_seconds
            )));
        }
        if opts.sample_rate == 0 || opts.sample_rate > crate::decode::MAX_SAMPLE_RATE {
            return Err(AudioError::Config(format!(
                "--sample-rate {} is outside 1 Hz–768 kHz",
                opts.sample_rate
            )));
        }
        Ok(())
    }

    /// Exactly `files`, in this order (each one a shard).
    pub fn from_files(files: Vec<PathBuf>, opts: StreamOptions) -> Result<AudioFiles, AudioError> {
        Self::check(&opts)?;
        let mut s = AudioFiles {
            lens: files.iter().map(|_| std::sync::OnceLock::new()).collect(),
            segments: Vec::with_capacity(files.len()),
            files,
            opts,
            samples: Arc::default(),
        };
        for file in 0..s.files.len() {
            s.plan(file);
        }
        Ok(s)
    }

    /// Appends file `file`'s shards: whole, or segments when it is long
    /// (see [`StreamOptions::segment_seconds`]).
    fn plan(&mut self, file: usize) {
        let whole = Segment {
            file,
            first: 0,
            count: None,
        };
        let per = self.segment_chunks();
        let chunks = per
            .and_then(|_| self.files.get(file))
            .filter(|p| std::fs::metadata(p).is_ok_and(|m| m.len() >= SEGMENT_MIN_BYTES))
            .and_then(|p| self.header_samples(p))
            .and_then(|n| Some(self.spec()?.chunks_at(n, 0)));
        match (per, chunks) {
            (Some(per), Some(chunks)) if chunks / per >= 2 => {
                // The last segment runs to the end: at least `per - 1`
                // chunks whatever the offset, and whatever the header says.
                let n = chunks / per;
                self.segments.extend((0..n).map(|j| Segment {
                    file,
                    first: j * per,
                    count: (j + 1 < n).then_some(per),
                }));
            }
            _ => self.segments.push(whole),
        }
    }

    /// Chunks per segment, or `None` when files are not split.
    fn segment_chunks(&self) -> Option<u64> {
        let spec = self.spec()?;
        let secs = self.opts.segment_seconds;
        if secs <= 0.0 {
            return None;
        }
        let step = spec.step() as f64 / f64::from(self.opts.sample_rate);
        Some(((secs / step).round() as u64).max(2))
    }

    /// A WAV or FLAC file's length at the target rate from its header.
    fn header_samples(&self, path: &Path) -> Option<u64> {
        let d = crate::decode::Decoded::open(path, &self.opts.decode).ok()?;
        if !d.seeks_exactly() {
            return None;
        }
        let frames = d.frames_hint().filter(|&f| f > 0)?;
        let (rin, rout) = (u64::from(d.sample_rate()), u64::from(self.opts.sample_rate));
        Some((frames * rout).div_ceil(rin.max(1)))
    }

    /// The shards, in order: whole files and segments of long ones.
    pub fn segments(&self) -> &[Segment] {
        &self.segments
    }

    /// The file shard `shard` reads, by its place in [`files`](Self::files).
    pub fn file_of(&self, shard: usize) -> Option<usize> {
        self.segments.get(shard).map(|s| s.file)
    }

    /// The files, in shard order.
    pub fn files(&self) -> &[PathBuf] {
        &self.files
    }

    /// The options.
    pub fn options(&self) -> &StreamOptions {
        &self.opts
    }

    /// A counter of the samples (at the target rate) of every file read to
    /// its end; keep a clone to read it while the pipeline runs.
    pub fn samples_read(&self) -> Arc<AtomicU64> {
        Arc::clone(&self.samples)
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

impl AudioFiles {
    /// Samples (at the target rate) file `file` makes, from its header's
    /// frame count: WAV only, whose header states the sample count exactly
    /// (`None` for other formats, whose headers can disagree with the
    /// decoded length, or a file that cannot be opened; a truncated WAV
    /// makes it an overestimate).
    fn samples_of(&self, file: usize) -> Option<u64> {
        let path = self.files.get(file)?;
        let wav = path
            .extension()
            .and_then(|e| e.to_str())
            .is_some_and(|e| e.eq_ignore_ascii_case("wav"));
        if !wav {
            return None;
        }
        let d = crate::decode::Decoded::open(path, &self.opts.decode).ok()?;
        let frames = d.frames_hint()?;
        let (rin, rout) = (u64::from(d.sample_rate()), u64::from(self.opts.sample_rate));
        Some(if rin == rout || rin == 0 {
            frames
        } else {
            (frames * rout).div_ceil(rin)
        })
    }

    fn spec(&self) -> Option<ChunkSpec> {
        ChunkSpec::from_seconds(
            self.opts.chunk_seconds,
            self.opts.overlap_seconds,
            self.opts.sample_rate,
        )
        .ok()
    }

    /// Where shard `shard`'s chunk grid starts in the epoch `at`, in samples
    /// at the target rate: `j × step / K` for `K` = `chunk_offsets` and `j`
    /// drawn from the seed, the epoch and the shard's file (0 when `K` is 1).
    pub fn offset_at(&self, shard: usize, at: ShardEpoch) -> usize {
        let k = u64::from(self.opts.chunk_offsets.max(1));
        let (Some(spec), Some(file)) = (self.spec().filter(|_| k > 1), self.file_of(shard)) else {
            return 0;
        };
        // Drawn per file: every segment of a file shares its grid.
        let j =
            ferrofeed_core::rng::derive_seed(&[at.seed, at.epoch, file as u64, 0x4f46_4653]) % k;
        (j * spec.step() as u64 / k) as usize
    }
}

impl IterableSource for AudioFiles {
    type Output = AudioChunk;
    fn shard_len(&self, shard: usize) -> Option<u64> {
        self.shard_len_at(shard, ShardEpoch::default())
    }
    fn shard_len_at(&self, shard: usize, at: ShardEpoch) -> Option<u64> {
        let seg = *self.segments.get(shard)?;
        let cell = self.lens.get(seg.file)?;
        let samples = (*cell.get_or_init(|| self.samples_of(seg.file)))?;
        let all = self.spec()?.chunks_at(samples, self.offset_at(shard, at));
        let rest = all.saturating_sub(seg.first);
        Some(seg.count.map_or(rest, |c| rest.min(c)))
    }
    fn num_shards(&self) -> usize {
        self.segments.len()
    }
    fn shard_key(&self, shard: usize) -> String {
        self.file_of(shard)
            .and_then(|f| self.files.get(f))
            .map_or_else(String::new, |p| p.display().to_string())
    }
    fn open(&self, shard: usize) -> Result<ShardIter<AudioChunk>, BoxError> {
        self.open_at(shard, ShardEpoch::default())
    }
    fn open_at(&self, shard: usize, at: ShardEpoch) -> Result<ShardIter<AudioChunk>, BoxError> {
        let seg = *self
            .segments
            .get(shard)
            .ok_or_else(|| BoxError::from(format!("no shard {shard}")))?;
        let path = &self.files[seg.file];
        let offset = self.offset_at(shard, at);
        let mut s = ChunkStream::open_segment(path, &self.opts, offset, seg.first, seg.count)?;
        s.counter = Some(Arc::clone(&self.samples));
        Ok(Box::new(s.map(|r| r.map_err(BoxError::from))))
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

    #[test]
    fn resampling_keeps_length_and_pitch() {
        for (a, b) in [
            (44100, 16000),
            (8000, 16000),
            (22050, 16000),
            (48000, 16000),
        ] {
            let n = a as usize * 3 / 2 + 17;
            let x: Vec<f32> = (0..n)
                .map(|i| (2.0 * std::f64::consts::PI * 440.0 * i as f64 / a as f64).sin() as f32)
                .collect();
            let mut r = StreamResampler::new(a, b).unwrap();
            let mut out = Vec::new();
            for p in x.chunks(777) {
                r.push(p, &mut out).unwrap();
            }
            r.finish(&mut out).unwrap();
            assert_eq!(
                out.len(),
                (n * b as usize).div_ceil(a as usize),
                "{a} → {b}"
            );
            // In the middle, the output is the same sine at the new rate.
            let mid = out.len() / 2;
            let err: f64 = (mid..mid + 200)
                .map(|i| {
                    let want = (2.0 * std::f64::consts::PI * 440.0 * i as f64 / b as f64).sin();
                    (f64::from(out[i]) - want).abs()
                })
                .fold(0.0, f64::max);
            // rubato's delay is a whole number of output samples; what is
            // left is a sub-sample offset (a third of a sample at 48 → 16 kHz).
            assert!(err < 0.1, "{a} → {b}: max error {err}");
        }
    }
}
