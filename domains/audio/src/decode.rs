//! Streaming decode with `symphonia`: packets become mono `f32` blocks as
//! they are read, so a file is never held whole in memory.
//!
//! Channels are mixed to mono by their mean. Refused with an error naming the
//! file: an empty file, an unknown container or codec, a missing or absurd
//! sample rate (outside 1 Hz–768 kHz), a corrupt packet, and — unless
//! [`NonFinite::Zero`] is chosen — NaN or infinite samples (possible in
//! float WAV).
//!
//! ```no_run
//! use ferrofeed_audio::{DecodeOptions, Decoded};
//! let mut d = Decoded::open("speech.flac".as_ref(), &DecodeOptions::default()).unwrap();
//! println!("{} Hz", d.sample_rate());
//! while let Some(block) = d.next_block().unwrap() {
//!     println!("{} samples", block.len());
//! }
//! ```
use std::path::{Path, PathBuf};

use symphonia::core::audio::GenericAudioBufferRef;
use symphonia::core::codecs::audio::well_known::{CODEC_ID_PCM_F32LE, CODEC_ID_PCM_S16LE};
use symphonia::core::codecs::audio::{AudioCodecParameters, AudioDecoder, AudioDecoderOptions};
use symphonia::core::errors::Error as SymError;
use symphonia::core::errors::SeekErrorKind;
use symphonia::core::formats::probe::Hint;
use symphonia::core::formats::{FormatOptions, FormatReader, SeekMode, SeekTo, TrackType};
use symphonia::core::io::MediaSourceStream;
use symphonia::core::meta::MetadataOptions;

use crate::AudioError;

/// Highest sample rate accepted from a header.
pub const MAX_SAMPLE_RATE: u32 = 768_000;

/// What to do with NaN or infinite samples.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum NonFinite {
    /// The file fails with an error naming the sample's position.
    #[default]
    Error,
    /// They become 0.0 (counted in [`Decoded::sanitized`]).
    Zero,
}

/// Decoding options.
#[derive(Debug, Clone, Copy, Default)]
pub struct DecodeOptions {
    /// NaN/Inf handling.
    pub non_finite: NonFinite,
}

/// Interleaved little-endian PCM of the two layouts WAV files nearly always
/// hold, converted straight from a packet's bytes in one loop the compiler
/// vectorises, where the decoder reads sample by sample. The values are the
/// decoder's (`i16 / 32768`, `f32` as stored).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Pcm {
    S16,
    F32,
}

impl Pcm {
    fn of(params: &AudioCodecParameters) -> Option<Pcm> {
        let width = |w: u32| {
            params.bits_per_sample.unwrap_or(w) == w
                && params.bits_per_coded_sample.unwrap_or(w) == w
        };
        match params.codec {
            CODEC_ID_PCM_S16LE if width(16) => Some(Pcm::S16),
            CODEC_ID_PCM_F32LE if width(32) => Some(Pcm::F32),
            _ => None,
        }
    }

    /// Replaces `out` with the samples of the whole frames in `data`.
    fn convert(self, data: &[u8], channels: usize, out: &mut Vec<f32>) {
        let width = match self {
            Pcm::S16 => 2,
            Pcm::F32 => 4,
        };
        let frame = width * channels;
        let data = &data[..data.len() / frame * frame];
        out.clear();
        match self {
            Pcm::S16 => out.extend(
                data.chunks_exact(2)
                    .map(|b| f32::from(i16::from_le_bytes([b[0], b[1]])) / 32_768.0),
            ),
            Pcm::F32 => out.extend(
                data.chunks_exact(4)
                    .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])),
            ),
        }
    }
}

/// An open file, decoded packet by packet.
pub struct Decoded {
    path: PathBuf,
    format: Box<dyn FormatReader>,
    decoder: Box<dyn AudioDecoder>,
    pcm: Option<Pcm>,
    track: u32,
    rate: u32,
    channels: usize,
    frames: Option<u64>,
    interleaved: Vec<f32>,
    position: u64,
    /// Frames before this one are decoded but not handed out (after a seek
    /// that landed on the packet holding it).
    skip_to: u64,
    /// The position is taken from the next packet's timestamp (after a seek).
    resync: bool,
    /// A seek went past the end: no more blocks.
    ended: bool,
    sanitized: u64,
    opts: DecodeOptions,
}

impl Decoded {
    /// Opens `path` and reads its header.
    pub fn open(path: &Path, opts: &DecodeOptions) -> Result<Decoded, AudioError> {
        let err = |m: String| AudioError::Decode {
            path: path.to_path_buf(),
            message: m,
        };
        let (file, meta) = ferrofeed_core::open_regular(path).map_err(|e| err(e.to_string()))?;
        Self::from_source(Box::new(file), meta.len(), path, opts)
    }

    /// Decodes a file held in memory (a tar member, a fuzz input); `name`
    /// names it in errors and its extension hints the format.
    pub fn from_bytes(
        bytes: Vec<u8>,
        name: &Path,
        opts: &DecodeOptions,
    ) -> Result<Decoded, AudioError> {
        let len = bytes.len() as u64;
        Self::from_source(Box::new(std::io::Cursor::new(bytes)), len, name, opts)
    }

    fn from_source(
        source: Box<dyn symphonia::core::io::MediaSource>,
        len: u64,
        path: &Path,
        opts: &DecodeOptions,
    ) -> Result<Decoded, AudioError> {
        let err = |m: String| AudioError::Decode {
            path: path.to_path_buf(),
            message: m,
        };
        if len == 0 {
            return Err(err("empty file".into()));
        }
        let mss = MediaSourceStream::new(source, Default::default());
        let mut hint = Hint::new();
        if let Some(ext) = path.extension().and_then(|e| e.to_str()) {
            hint.with_extension(ext);
        }
        let format = symphonia::default::get_probe()
            .probe(
                &hint,
                mss,
                FormatOptions::default(),
                MetadataOptions::default(),
            )
            .map_err(|e| err(format!("unrecognised audio container: {e}")))?;
        let track = format
            .default_track(TrackType::Audio)
            .ok_or_else(|| err("no audio track".into()))?;
        let params = track
            .codec_params
            .as_ref()
            .and_then(|p| p.audio())
            .ok_or_else(|| err("no audio codec parameters".into()))?;
        let rate = params
            .sample_rate
            .ok_or_else(|| err("the header gives no sample rate".into()))?;
        if rate == 0 || rate > MAX_SAMPLE_RATE {
            return Err(err(format!(
                "the header claims a sample rate of {rate} Hz (accepted: 1 Hz to {MAX_SAMPLE_RATE} Hz)"
            )));
        }
        let channels = params.channels.as_ref().map_or(1, |c| c.count()).max(1);
        let pcm = Pcm::of(params);
        let decoder = symphonia::default::get_codecs()
            .make_audio_decoder(params, &AudioDecoderOptions::default())
            .map_err(|e| err(format!("unsupported codec: {e}")))?;
        let track_id = track.id;
        let frames = track.num_frames;
        Ok(Decoded {
            path: path.to_path_buf(),
            format,
            decoder,
            pcm,
            track: track_id,
            rate,
            channels,
            frames,
            interleaved: Vec::new(),
            position: 0,
            skip_to: 0,
            resync: false,
            ended: false,
            sanitized: 0,
            opts: *opts,
        })
    }

    /// The file's sample rate.
    pub fn sample_rate(&self) -> u32 {
        self.rate
    }
    /// The file's channel count (mixed to mono on output).
    pub fn channels(&self) -> usize {
        self.channels
    }
    /// Frames the header announces, when it does.
    pub fn frames_hint(&self) -> Option<u64> {
        self.frames
    }
    /// NaN/Inf samples replaced so far.
    pub fn sanitized(&self) -> u64 {
        self.sanitized
    }
    /// The file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Whether [`seek_to`](Self::seek_to) lands exactly: WAV and FLAC, whose
    /// packets decode alone (a FLAC frame, a run of PCM frames), so samples
    /// from a seek equal those of decoding from the start. MP3 and Vorbis
    /// carry state from packet to packet.
    pub fn seeks_exactly(&self) -> bool {
        let ext = self
            .path
            .extension()
            .and_then(|e| e.to_str())
            .map(str::to_ascii_lowercase);
        matches!(ext.as_deref(), Some("wav" | "flac"))
    }

    /// Moves to frame `frame`: the next block starts there, with the same
    /// samples decoding from the start gives (see
    /// [`seeks_exactly`](Self::seeks_exactly)). A frame past the end gives
    /// no more blocks.
    pub fn seek_to(&mut self, frame: u64) -> Result<(), AudioError> {
        if frame == 0 && self.position == 0 {
            return Ok(());
        }
        let to = SeekTo::Timestamp {
            ts: (frame.min(i64::MAX as u64) as i64).into(),
            track_id: self.track,
        };
        match self.format.seek(SeekMode::Accurate, to) {
            Ok(seeked) => {
                self.position = u64::try_from(seeked.actual_ts.get()).unwrap_or(0);
                self.resync = true;
            }
            Err(SymError::SeekError(SeekErrorKind::OutOfRange)) => self.ended = true,
            Err(SymError::IoError(e)) if e.kind() == std::io::ErrorKind::UnexpectedEof => {
                self.ended = true
            }
            Err(e) => {
                return Err(AudioError::Decode {
                    path: self.path.clone(),
                    message: format!("seeking to sample {frame}: {e}"),
                })
            }
        }
        if self.decoder_in_use() {
            self.decoder.reset();
        }
        self.skip_to = frame;
        Ok(())
    }

    /// Decodes on from here but hands out nothing before frame `frame` (for
    /// a format that cannot seek exactly).
    pub fn discard_before(&mut self, frame: u64) {
        self.skip_to = frame;
    }

    /// The end of the stream: an error naming the file when a WAV or FLAC
    /// header announced more samples than the file holds (cut short, or a
    /// header that lies), else the end.
    fn end(&mut self) -> Result<Option<Vec<Vec<f32>>>, AudioError> {
        self.ended = true;
        match self.frames {
            Some(n) if self.seeks_exactly() && self.position < n => Err(AudioError::Decode {
                path: self.path.clone(),
                message: format!(
                    "truncated: the header announces {n} samples per channel, the file ends after {}",
                    self.position
                ),
            }),
            _ => Ok(None),
        }
    }

    fn decoder_in_use(&self) -> bool {
        self.pcm.is_none()
    }

    /// The next block of mono samples (channels averaged); `None` at the end.
    pub fn next_block(&mut self) -> Result<Option<Vec<f32>>, AudioError> {
        Ok(self.next_planar(false)?.map(|mut c| c.swap_remove(0)))
    }

    /// The next block with every channel kept: one vector per channel, all
    /// of the same length; `None` at the end.
    pub fn next_channels(&mut self) -> Result<Option<Vec<Vec<f32>>>, AudioError> {
        self.next_planar(true)
    }

    fn next_planar(&mut self, keep: bool) -> Result<Option<Vec<Vec<f32>>>, AudioError> {
        let err = |m: String| AudioError::Decode {
            path: self.path.clone(),
            message: m,
        };
        if self.ended {
            return Ok(None);
        }
        loop {
            let packet = match self.format.next_packet() {
                Ok(Some(p)) => p,
                Ok(None) => return self.end(),
                Err(SymError::IoError(e)) if e.kind() == std::io::ErrorKind::UnexpectedEof => {
                    return self.end()
                }
                Err(e) => return Err(err(format!("after {} samples: {e}", self.position))),
            };
            if packet.track_id != self.track {
                continue;
            }
            if std::mem::take(&mut self.resync) {
                if let Ok(pts) = u64::try_from(packet.pts.get()) {
                    self.position = pts;
                }
            }
            // Only float samples can be NaN or infinite.
            let (ch, float) = match self.pcm {
                Some(pcm) => {
                    pcm.convert(&packet.data, self.channels, &mut self.interleaved);
                    (self.channels, pcm == Pcm::F32)
                }
                None => {
                    let buf = match self.decoder.decode(&packet) {
                        Ok(b) => b,
                        Err(e) => {
                            return Err(AudioError::Decode {
                                path: self.path.clone(),
                                message: format!(
                                    "corrupt data after {} samples: {e}",
                                    self.position
                                ),
                            })
                        }
                    };
                    buf.copy_to_vec_interleaved(&mut self.interleaved);
                    let float = matches!(
                        buf,
                        GenericAudioBufferRef::F32(_) | GenericAudioBufferRef::F64(_)
                    );
                    (buf.spec().channels().count().max(1), float)
                }
            };
            let mut planes: Vec<Vec<f32>> = Vec::new();
            if ch == 1 {
                planes.push(std::mem::take(&mut self.interleaved));
            } else {
                let frames = self.interleaved.len() / ch;
                if keep {
                    planes = (0..ch)
                        .map(|c| {
                            self.interleaved
                                .iter()
                                .skip(c)
                                .step_by(ch)
                                .copied()
                                .collect()
                        })
                        .collect();
                } else {
                    let inv = 1.0 / ch as f32;
                    let mut mono = Vec::with_capacity(frames);
                    mono.extend(
                        self.interleaved
                            .chunks_exact(ch)
                            .map(|f| f.iter().sum::<f32>() * inv),
                    );
                    planes.push(mono);
                }
            }
            if self.position < self.skip_to {
                // Before the frame sought: not handed out, not checked.
                let n = planes.first().map_or(0, Vec::len);
                let drop = ((self.skip_to - self.position) as usize).min(n);
                for plane in &mut planes {
                    plane.drain(..drop);
                }
                self.position += drop as u64;
            }
            for plane in planes.iter_mut().filter(|_| float) {
                if let Some(i) = plane.iter().position(|x| !x.is_finite()) {
                    match self.opts.non_finite {
                        NonFinite::Error => {
                            return Err(AudioError::Decode {
                                path: self.path.clone(),
                                message: format!(
                                "sample {} is {} (decode with non-finite samples zeroed to accept it)",
                                self.position + i as u64,
                                plane[i]
                            ),
                            })
                        }
                        NonFinite::Zero => {
                            for x in &mut plane[i..] {
                                if !x.is_finite() {
                                    *x = 0.0;
                                    self.sanitized += 1;
                                }
                            }
                        }
                    }
                }
            }
            let n = planes.first().map_or(0, Vec::len);
            self.position += n as u64;
            if n > 0 {
                return Ok(Some(planes));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::synth::write_wav;

    fn all_blocks(d: &mut Decoded, keep: bool) -> Result<Vec<Vec<Vec<f32>>>, AudioError> {
        let mut out = Vec::new();
        while let Some(b) = d.next_planar(keep)? {
            out.push(b);
        }
        Ok(out)
    }

    #[test]
    fn pcm_from_packet_bytes_equals_the_decoder() {
        let dir = tempfile::tempdir().unwrap();
        let n = 40_000;
        let wave = |k: f32| -> Vec<f32> {
            (0..n)
                .map(|i| ((i as f32 * k).sin() * 1.3).clamp(-1.0, 1.0))
                .collect()
        };
        let mut nan = wave(0.02);
        nan[31_234] = f32::NAN;
        let cases = [
            ("mono16.wav", vec![wave(0.01)], false),
            ("stereo16.wav", vec![wave(0.01), wave(0.03)], false),
            (
                "tri_float.wav",
                vec![wave(0.01), wave(0.02), wave(0.05)],
                true,
            ),
            ("nan_float.wav", vec![nan], true),
        ];
        for (name, chans, float) in cases {
            let path = dir.path().join(name);
            write_wav(&path, &chans, 16_000, float).unwrap();
            for keep in [false, true] {
                for non_finite in [NonFinite::Error, NonFinite::Zero] {
                    let opts = DecodeOptions { non_finite };
                    let mut fast = Decoded::open(&path, &opts).unwrap();
                    assert!(fast.pcm.is_some(), "{name}");
                    let mut slow = Decoded::open(&path, &opts).unwrap();
                    slow.pcm = None;
                    let (f, s) = (all_blocks(&mut fast, keep), all_blocks(&mut slow, keep));
                    match (f, s) {
                        (Ok(f), Ok(s)) => {
                            assert_eq!(f, s, "{name}");
                            let got: usize = f.iter().map(|b| b[0].len()).sum();
                            assert_eq!(got, n, "{name}");
                        }
                        (Err(f), Err(s)) => assert_eq!(f.to_string(), s.to_string()),
                        (f, s) => panic!("{name}: {f:?} vs {s:?}"),
                    }
                    assert_eq!(fast.sanitized(), slow.sanitized());
                }
            }
        }
    }
}
