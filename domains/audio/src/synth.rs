//! A deterministic synthetic audio dataset: tones, chirps, noise and their
//! mixes, of varied lengths and sample rates, as 16-bit and float WAV and as
//! FLAC, some stereo — so decoding, mixing, resampling and chunking are all
//! exercised. Same `(count, seed)`, same bytes. [`SPEECH`] adds three
//! spoken sentences (espeak-ng, 22.05 kHz FLAC) for real speech content.
//!
//! ```
//! let dir = tempfile::tempdir().unwrap();
//! let files = ferrofeed_audio::synth::write_dataset(dir.path(), 3, 0, 2.0..4.0).unwrap();
//! assert_eq!(files.len(), 3);
//! ```
use std::f64::consts::PI;
use std::ops::Range;
use std::path::{Path, PathBuf};

use rand::Rng;

/// Rates files are written at.
pub const RATES: &[u32] = &[16000, 22050, 44100, 8000, 48000];

/// Signal kinds, in the order the generator cycles through them.
pub const KINDS: &[&str] = &["tone", "chirp", "noise", "mix"];

/// One mono signal of `n` samples at `rate`.
pub fn signal(kind: &str, n: usize, rate: u32, rng: &mut impl Rng) -> Vec<f32> {
    let sr = f64::from(rate);
    let nyq = sr / 2.0;
    let f0 = rng.random_range(110.0..880.0f64);
    let f1 = rng.random_range(1000.0..(nyq * 0.9).max(1100.0));
    let env_hz = rng.random_range(0.2..2.0f64);
    let mut state = 0f64;
    (0..n)
        .map(|i| {
            let t = i as f64 / sr;
            let env = 0.6 + 0.4 * (2.0 * PI * env_hz * t).sin();
            let tone = (2.0 * PI * f0 * t).sin() + 0.5 * (2.0 * PI * 2.0 * f0 * t).sin();
            let dur = n as f64 / sr;
            let chirp = (2.0 * PI * (f0 * t + (f1 - f0) * t * t / (2.0 * dur))).sin();
            let white: f64 = rng.random_range(-1.0..1.0);
            state = 0.97 * state + 0.03 * white;
            let v = match kind {
                "tone" => 0.4 * tone,
                "chirp" => 0.5 * chirp,
                "noise" => 0.3 * white + 2.0 * state,
                _ => 0.25 * tone + 0.25 * chirp + 0.1 * white,
            };
            (v * env).clamp(-1.0, 1.0) as f32
        })
        .collect()
}

/// File formats [`write_dataset`] writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Format {
    /// A third each of 16-bit WAV, FLAC and float WAV.
    #[default]
    Mixed,
    /// 16-bit PCM WAV only.
    Wav,
    /// 16-bit FLAC only.
    Flac,
}

/// What [`write_dataset`] varies, and what it may fix.
#[derive(Debug, Clone)]
pub struct SynthOptions {
    /// File lengths are drawn uniformly from this range (seconds).
    pub seconds: Range<f64>,
    /// One rate for every file (default: cycle through [`RATES`]).
    pub rate: Option<u32>,
    /// Formats.
    pub format: Format,
    /// Channels for every file (default: every third file stereo).
    pub channels: Option<usize>,
}

impl Default for SynthOptions {
    fn default() -> Self {
        SynthOptions {
            seconds: 3.0..30.0,
            rate: None,
            format: Format::Mixed,
            channels: None,
        }
    }
}

/// Three sentences spoken by espeak-ng, 22.05 kHz 16-bit mono FLAC, 4.5–6.7 s
/// (made by `domains/audio/data/make_speech.sh`).
pub const SPEECH: [(&str, &[u8]); 3] = [
    (
        "speech_1.flac",
        include_bytes!("../data/speech/speech_1.flac"),
    ),
    (
        "speech_2.flac",
        include_bytes!("../data/speech/speech_2.flac"),
    ),
    (
        "speech_3.flac",
        include_bytes!("../data/speech/speech_3.flac"),
    ),
];

/// Writes the [`SPEECH`] files into `dir`; returns their paths.
pub fn write_speech(dir: &Path) -> std::io::Result<Vec<PathBuf>> {
    std::fs::create_dir_all(dir)?;
    SPEECH
        .iter()
        .map(|(name, bytes)| {
            let path = dir.join(name);
            std::fs::write(&path, bytes)?;
            Ok(path)
        })
        .collect()
}

/// Writes `count` files of `seconds` (drawn uniformly) into `dir`; returns
/// their paths. Names say what they hold: `0007_chirp_44100_2ch.flac`.
pub fn write_dataset(
    dir: &Path,
    count: usize,
    seed: u64,
    seconds: Range<f64>,
) -> std::io::Result<Vec<PathBuf>> {
    write_dataset_with(
        dir,
        count,
        seed,
        &SynthOptions {
            seconds,
            ..SynthOptions::default()
        },
    )
}

/// [`write_dataset`] with every option.
pub fn write_dataset_with(
    dir: &Path,
    count: usize,
    seed: u64,
    opts: &SynthOptions,
) -> std::io::Result<Vec<PathBuf>> {
    let seconds = opts.seconds.clone();
    std::fs::create_dir_all(dir)?;
    let mut out = Vec::with_capacity(count);
    for i in 0..count {
        let mut rng = ferrofeed_core::rng::sample_rng(ferrofeed_core::rng::derive_seed(&[
            seed,
            i as u64,
            0x4155_4449,
        ]));
        let kind = KINDS[i % KINDS.len()];
        let rate = opts
            .rate
            .unwrap_or(RATES[(i / KINDS.len() + i) % RATES.len()]);
        let channels = opts.channels.unwrap_or(if i % 3 == 2 { 2 } else { 1 });
        let secs = if seconds.end > seconds.start {
            rng.random_range(seconds.clone())
        } else {
            seconds.start
        };
        let n = (secs * f64::from(rate)) as usize;
        let chans: Vec<Vec<f32>> = (0..channels)
            .map(|_| signal(kind, n, rate, &mut rng))
            .collect();
        // 0: wav i16, 1: flac, 2: wav f32
        let format = match opts.format {
            Format::Mixed => i % 3,
            Format::Wav => 0,
            Format::Flac => 1,
        };
        let ext = if format == 1 { "flac" } else { "wav" };
        let path = dir.join(format!("{i:04}_{kind}_{rate}_{channels}ch.{ext}"));
        match format {
            1 => write_flac(&path, &chans, rate)?,
            f => write_wav(&path, &chans, rate, f == 2)?,
        }
        out.push(path);
    }
    Ok(out)
}

fn to_i16(x: f32) -> i16 {
    (x * 32767.0).round().clamp(-32768.0, 32767.0) as i16
}

/// Writes 16-bit PCM or 32-bit float WAV.
pub fn write_wav(path: &Path, chans: &[Vec<f32>], rate: u32, float: bool) -> std::io::Result<()> {
    let spec = hound::WavSpec {
        channels: chans.len() as u16,
        sample_rate: rate,
        bits_per_sample: if float { 32 } else { 16 },
        sample_format: if float {
            hound::SampleFormat::Float
        } else {
            hound::SampleFormat::Int
        },
    };
    let err = |e: hound::Error| std::io::Error::other(e.to_string());
    let mut w = hound::WavWriter::create(path, spec).map_err(err)?;
    let n = chans.first().map_or(0, Vec::len);
    for i in 0..n {
        for c in chans {
            if float {
                w.write_sample(c[i]).map_err(err)?;
            } else {
                w.write_sample(to_i16(c[i])).map_err(err)?;
            }
        }
    }
    w.finalize().map_err(err)
}

/// Writes 16-bit FLAC.
pub fn write_flac(path: &Path, chans: &[Vec<f32>], rate: u32) -> std::io::Result<()> {
    use flacenc::component::BitRepr;
    use flacenc::error::Verify;
    let n = chans.first().map_or(0, Vec::len);
    let mut interleaved = Vec::with_capacity(n * chans.len());
    for i in 0..n {
        for c in chans {
            interleaved.push(i32::from(to_i16(c[i])));
        }
    }
    let err = |e: String| std::io::Error::other(e);
    let config = flacenc::config::Encoder::default()
        .into_verified()
        .map_err(|e| err(format!("{e:?}")))?;
    let source =
        flacenc::source::MemSource::from_samples(&interleaved, chans.len(), 16, rate as usize);
    let stream = flacenc::encode_with_fixed_block_size(&config, source, config.block_size)
        .map_err(|e| err(format!("{e:?}")))?;
    let mut sink = flacenc::bitsink::ByteSink::new();
    stream.write(&mut sink).map_err(|e| err(format!("{e:?}")))?;
    std::fs::write(path, sink.as_slice())
}
