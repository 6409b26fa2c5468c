//! Streaming resampling to the target rate, with rubato's FFT resampler:
//! exact output lengths, the delay trimmed, and a start mid-stream that
//! hands out what resampling the whole stream gives there (for a long
//! file's segments).
//!
//! ```
//! use ferrofeed_audio::StreamResampler;
//! let x = vec![0.25f32; 44_100];
//! let mut r = StreamResampler::new(44_100, 16_000).unwrap();
//! let mut out = Vec::new();
//! r.push(&x, &mut out).unwrap();
//! r.finish(&mut out).unwrap();
//! assert_eq!(out.len(), 16_000);
//! ```
use rubato::{FftFixedIn, Resampler};

use crate::AudioError;

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

/// How far apart (either way) a file's rate and the target may be.
pub const MAX_RESAMPLE_RATIO: u64 = 64;

/// Input chunk and sub-chunks the resampler is built with.
const RESAMPLE_CHUNK: usize = 8192;
const RESAMPLE_SUB_CHUNKS: usize = 8;

impl StreamResampler {
    /// From `rate_in` to `rate_out` Hz. Rates more than
    /// [`MAX_RESAMPLE_RATIO`] apart are refused: a header claiming 1 Hz
    /// would make each input block 16,000× larger (gigabytes from a 2 KB
    /// file).
    pub fn new(rate_in: u32, rate_out: u32) -> Result<Self, AudioError> {
        let (lo, hi) = (rate_in.min(rate_out), rate_in.max(rate_out));
        if lo == 0 || u64::from(hi) > u64::from(lo) * MAX_RESAMPLE_RATIO {
            return Err(AudioError::Config(format!(
                "sample rate {rate_in} Hz is more than {MAX_RESAMPLE_RATIO}× from the target \
                 {rate_out} Hz: refusing to resample it (a damaged header?)"
            )));
        }
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

#[cfg(test)]
mod tests {
    use super::*;

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
