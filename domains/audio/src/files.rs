//! Audio files as an iterable source: one shard per file, or per segment
//! of a long WAV or FLAC file, so that one long file is decoded by several
//! workers (see [`StreamOptions::segment_seconds`]).
//!
//! ```no_run
//! use ferrofeed_audio::{AudioFiles, StreamOptions};
//! let files = AudioFiles::scan("speech/".as_ref(), StreamOptions::default()).unwrap();
//! println!("{} files in {} shards", files.files().len(), files.segments().len());
//! ```
use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicU64;
use std::sync::Arc;

use ferrofeed_core::{BoxError, IterableSource, ShardEpoch, ShardIter};

use crate::stream::{AudioChunk, ChunkSpec, ChunkStream, StreamOptions, SEGMENT_MIN_BYTES};
use crate::AudioError;

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
    /// About the most chunks each file holds, as planning found (segments
    /// on): from its header, or one segment's for a file under
    /// `SEGMENT_MIN_BYTES` (whose header is not read); `None`: unknown.
    planned: Vec<Option<u64>>,
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
            planned: vec![None; files.len()],
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
        let path = per.and_then(|_| self.files.get(file));
        let bytes = path
            .and_then(|p| std::fs::metadata(p).ok())
            .map(|m| m.len());
        let chunks = path
            .filter(|_| bytes.is_some_and(|n| n >= SEGMENT_MIN_BYTES))
            .and_then(|p| self.header_samples(p))
            .and_then(|n| Some(self.spec()?.chunks_at(n, 0)));
        self.planned[file] = match bytes {
            Some(n) if n < SEGMENT_MIN_BYTES => per,
            _ => chunks,
        };
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

    /// About the most chunks one shard holds, as planned: a segment's
    /// count, or a long file's from its header; a file under
    /// [`SEGMENT_MIN_BYTES`] (about a minute of 16 kHz FLAC or 128 kbit/s
    /// MP3; its header is not read) counts as one segment. `None` when files
    /// are not split, or a long file's header gives no exact length (MP3,
    /// Ogg): its shard may be any length.
    pub fn longest_shard(&self) -> Option<u64> {
        let mut longest = 0;
        for seg in &self.segments {
            let n = match (seg.count, self.planned[seg.file]) {
                (Some(c), _) => c,
                (None, Some(all)) => all.saturating_sub(seg.first),
                (None, None) => return None,
            };
            longest = longest.max(n);
        }
        Some(longest)
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

    /// The file each shard reads, by shard (a long file's segments share
    /// it).
    pub fn shard_paths(&self) -> Vec<PathBuf> {
        self.segments
            .iter()
            .map(|s| self.files[s.file].clone())
            .collect()
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
