//! Spectral features (FFTs by `rustfft`): STFT power or magnitude, mel and log-mel, with
//! librosa's conventions.
//!
//! Defaults equal `librosa.feature.melspectrogram(y, sr=16000, n_fft=400,
//! hop_length=160, n_mels=80, power=2.0, center=True, pad_mode='constant')`:
//! a periodic Hann window, frames centred on `t × hop` with `n_fft / 2` zeros
//! of padding at both ends (`1 + len / hop` frames), the Slaney mel scale with
//! Slaney area normalisation. `logmel = 10 × log10(max(mel, 1e-10))`.
//! A [`FeatureExtractor`] holds the FFT plan and the filterbank (sparse: each
//! filter's first bin and weights) and is built once per stage, shared by its
//! workers; per-call scratch is a few kilobytes.
//!
//! ```
//! use ferrofeed_audio::{FeatureConfig, FeatureExtractor, FeatureKind};
//! let fx = FeatureExtractor::new(FeatureConfig::default()).unwrap();
//! let tone: Vec<f32> = (0..16000).map(|i| (i as f32 * 2.0 * std::f32::consts::PI * 1000.0 / 16000.0).sin()).collect();
//! let f = fx.compute(&tone, FeatureKind::LogMel);
//! assert_eq!((f.bins, f.frames), (80, 101));
//! // The loudest mel band of a 1 kHz tone is the one around 1 kHz.
//! let mid = &f.data[..]; // [bins × frames]
//! let band = (0..80).max_by(|&a, &b| mid[a * 101 + 50].total_cmp(&mid[b * 101 + 50])).unwrap();
//! let centre = ferrofeed_audio::mel_to_hz(ferrofeed_audio::hz_to_mel(8000.0) * (band + 1) as f64 / 81.0);
//! assert!((centre - 1000.0).abs() < 60.0, "band {band} at {centre} Hz");
//! ```
use std::sync::Arc;

use rustfft::num_complex::Complex;
use rustfft::{Fft, FftPlanner};

use crate::AudioError;

/// Which features a stage computes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum FeatureKind {
    /// The samples themselves, `[1, samples]`.
    Waveform,
    /// STFT power, `[n_fft / 2 + 1, frames]`.
    Spectrogram,
    /// Mel power, `[n_mels, frames]`.
    Mel,
    /// `10 log10(max(mel, 1e-10))`, `[n_mels, frames]`.
    #[default]
    LogMel,
}

impl std::str::FromStr for FeatureKind {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        Ok(match s {
            "waveform" => FeatureKind::Waveform,
            "spectrogram" => FeatureKind::Spectrogram,
            "mel" => FeatureKind::Mel,
            "logmel" => FeatureKind::LogMel,
            _ => {
                return Err(format!(
                    "`{s}`: expected waveform, spectrogram, mel or logmel"
                ))
            }
        })
    }
}

/// STFT and mel parameters.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct FeatureConfig {
    /// Sample rate of the input, Hz.
    pub sample_rate: u32,
    /// FFT size (and window length).
    pub n_fft: usize,
    /// Samples between frames.
    pub hop: usize,
    /// Mel bands.
    pub n_mels: usize,
    /// Lowest mel frequency, Hz.
    pub fmin: f64,
    /// Highest mel frequency, Hz (`None`: `sample_rate / 2`).
    pub fmax: Option<f64>,
    /// Exponent of the magnitude (2: power, 1: magnitude).
    pub power: f32,
}

impl Default for FeatureConfig {
    fn default() -> Self {
        FeatureConfig {
            sample_rate: 16000,
            n_fft: 400,
            hop: 160,
            n_mels: 80,
            fmin: 0.0,
            fmax: None,
            power: 2.0,
        }
    }
}

/// Features of one signal: `data` is `[bins, frames]`, row-major.
#[derive(Debug, Clone, PartialEq)]
pub struct Features {
    /// Values, `bins × frames`.
    pub data: Vec<f32>,
    /// Rows (mel bands, FFT bins, or 1 for a waveform).
    pub bins: usize,
    /// Columns (frames, or samples for a waveform).
    pub frames: usize,
}

/// Hz → mel on the Slaney scale (linear below 1 kHz, logarithmic above).
pub fn hz_to_mel(hz: f64) -> f64 {
    let f_sp = 200.0 / 3.0;
    let (min_log_hz, min_log_mel, logstep) = (1000.0, 15.0, (6.4f64).ln() / 27.0);
    if hz >= min_log_hz {
        min_log_mel + (hz / min_log_hz).ln() / logstep
    } else {
        hz / f_sp
    }
}

/// Mel → Hz on the Slaney scale.
pub fn mel_to_hz(mel: f64) -> f64 {
    let f_sp = 200.0 / 3.0;
    let (min_log_hz, min_log_mel, logstep) = (1000.0, 15.0, (6.4f64).ln() / 27.0);
    if mel >= min_log_mel {
        min_log_hz * (logstep * (mel - min_log_mel)).exp()
    } else {
        f_sp * mel
    }
}

/// One mel filter: weights of bins `start..start + weights.len()`.
#[derive(Debug, Clone)]
struct Filter {
    start: usize,
    weights: Vec<f32>,
}

/// The filterbank of `librosa.filters.mel(sr, n_fft, n_mels, fmin, fmax,
/// htk=False, norm='slaney')`, as dense `[n_mels, n_fft/2 + 1]` rows.
pub fn mel_filterbank(cfg: &FeatureConfig) -> Vec<Vec<f32>> {
    let bins = cfg.n_fft / 2 + 1;
    let sr = f64::from(cfg.sample_rate);
    let fmax = cfg.fmax.unwrap_or(sr / 2.0);
    let (lo, hi) = (hz_to_mel(cfg.fmin), hz_to_mel(fmax));
    let n = cfg.n_mels;
    let mel_f: Vec<f64> = (0..n + 2)
        .map(|i| mel_to_hz(lo + (hi - lo) * i as f64 / (n + 1) as f64))
        .collect();
    let fft_f: Vec<f64> = (0..bins)
        .map(|k| sr / 2.0 * k as f64 / (bins - 1).max(1) as f64)
        .collect();
    (0..n)
        .map(|i| {
            let (d0, d1) = (mel_f[i + 1] - mel_f[i], mel_f[i + 2] - mel_f[i + 1]);
            let enorm = 2.0 / (mel_f[i + 2] - mel_f[i]);
            fft_f
                .iter()
                .map(|&f| {
                    let lower = (f - mel_f[i]) / d0;
                    let upper = (mel_f[i + 2] - f) / d1;
                    (lower.min(upper).max(0.0) * enorm) as f32
                })
                .collect()
        })
        .collect()
}

/// STFT plan, window and filterbank, built once.
pub struct FeatureExtractor {
    cfg: FeatureConfig,
    /// A complex FFT of `n_fft / 2` points (see [`Stft`]).
    fft: Arc<dyn Fft<f32>>,
    /// `e^{−2πik/n_fft}` for `k = 1..n_fft/4` (rounded up), real and
    /// imaginary parts.
    twiddles: (Vec<f32>, Vec<f32>),
    window: Vec<f32>,
    filters: Vec<Filter>,
}

impl std::fmt::Debug for FeatureExtractor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FeatureExtractor")
            .field("cfg", &self.cfg)
            .finish()
    }
}

/// The largest `n_fft` (and window) accepted.
pub const MAX_N_FFT: usize = 1 << 16;
/// The largest hop accepted.
pub const MAX_HOP: usize = 1 << 20;
/// The most mel bands accepted.
pub const MAX_N_MELS: usize = 4096;

impl FeatureExtractor {
    /// Plans the FFT and builds the filterbank. Every size is bounded
    /// ([`MAX_N_FFT`], [`MAX_HOP`], [`MAX_N_MELS`], [`MAX_SAMPLE_RATE`](crate::MAX_SAMPLE_RATE)) and
    /// refused by name before anything is allocated.
    pub fn new(cfg: FeatureConfig) -> Result<Self, AudioError> {
        let bad = |m: String| Err(AudioError::Config(m));
        if cfg.n_fft < 2 || !cfg.n_fft.is_multiple_of(2) {
            return bad(format!(
                "n_fft must be even and at least 2, not {}",
                cfg.n_fft
            ));
        }
        if cfg.n_fft > MAX_N_FFT {
            return bad(format!("n_fft {} is more than {MAX_N_FFT}", cfg.n_fft));
        }
        if cfg.hop == 0 || cfg.hop > MAX_HOP {
            return bad(format!("hop must be 1 to {MAX_HOP}, not {}", cfg.hop));
        }
        if cfg.n_mels == 0 || cfg.n_mels > MAX_N_MELS {
            return bad(format!(
                "n_mels must be 1 to {MAX_N_MELS}, not {}",
                cfg.n_mels
            ));
        }
        use crate::MAX_SAMPLE_RATE;
        if cfg.sample_rate == 0 || cfg.sample_rate > MAX_SAMPLE_RATE {
            return bad(format!(
                "sample rate must be 1 to {MAX_SAMPLE_RATE} Hz, not {}",
                cfg.sample_rate
            ));
        }
        let fmax = cfg.fmax.unwrap_or(f64::from(cfg.sample_rate) / 2.0);
        if !(cfg.fmin >= 0.0 && cfg.fmin < fmax) {
            return bad(format!("need 0 ≤ fmin < fmax, got {} and {fmax}", cfg.fmin));
        }
        let fft = FftPlanner::<f32>::new().plan_fft_forward(cfg.n_fft / 2);
        let angle = |k: usize| -2.0 * std::f64::consts::PI * k as f64 / cfg.n_fft as f64;
        let twiddles = (1..(cfg.n_fft / 2).div_ceil(2))
            .map(|k| (angle(k).cos() as f32, angle(k).sin() as f32))
            .unzip();
        // Periodic Hann: scipy.signal.get_window('hann', n_fft, fftbins=True).
        let n = cfg.n_fft as f64;
        let window = (0..cfg.n_fft)
            .map(|i| (0.5 - 0.5 * (2.0 * std::f64::consts::PI * i as f64 / n).cos()) as f32)
            .collect();
        let filters = mel_filterbank(&cfg)
            .into_iter()
            .map(|row| {
                let start = row.iter().position(|&w| w != 0.0).unwrap_or(0);
                let end = row.iter().rposition(|&w| w != 0.0).map_or(start, |e| e + 1);
                Filter {
                    start,
                    weights: row[start..end].to_vec(),
                }
            })
            .collect();
        Ok(FeatureExtractor {
            cfg,
            fft,
            twiddles,
            window,
            filters,
        })
    }

    /// The configuration.
    pub fn config(&self) -> &FeatureConfig {
        &self.cfg
    }

    /// Frames of a signal of `len` samples (`1 + len / hop`).
    pub fn frames(&self, len: usize) -> usize {
        1 + len / self.cfg.hop
    }

    /// Features of `signal`.
    pub fn compute(&self, signal: &[f32], kind: FeatureKind) -> Features {
        if kind == FeatureKind::Waveform {
            return Features {
                data: signal.to_vec(),
                bins: 1,
                frames: signal.len(),
            };
        }
        let bins = self.cfg.n_fft / 2 + 1;
        let frames = self.frames(signal.len());
        let mut stft = Stft::new(self);
        // Frames are taken BLOCK at a time into a bin-major block; a mel band
        // is then a weighted sum of whole block rows (contiguous frames, a
        // loop the compiler vectorises), and the block stays in L1.
        const BLOCK: usize = 16;
        let mut block = vec![0f32; bins * BLOCK];
        if kind == FeatureKind::Spectrogram {
            let mut data = vec![0f32; bins * frames];
            for t0 in (0..frames).step_by(BLOCK) {
                let n = BLOCK.min(frames - t0);
                stft.block::<BLOCK>(signal, t0, n, &mut block);
                for k in 0..bins {
                    data[k * frames + t0..k * frames + t0 + n]
                        .copy_from_slice(&block[k * BLOCK..k * BLOCK + n]);
                }
            }
            return Features { data, bins, frames };
        }
        let n_mels = self.filters.len();
        let mut out = vec![0f32; n_mels * frames];
        for t0 in (0..frames).step_by(BLOCK) {
            let n = BLOCK.min(frames - t0);
            stft.block::<BLOCK>(signal, t0, n, &mut block);
            for (m, f) in self.filters.iter().enumerate() {
                // Summed on the stack and stored once: `out` is fresh zeroed
                // memory, and reading it before the first write maps the
                // shared zero page, whose replacement on the write costs a
                // TLB flush on every CPU running the process's other workers
                // (measured: most of a first epoch's system time).
                let mut acc = [0f32; BLOCK];
                for (j, &w) in f.weights.iter().enumerate() {
                    let k = f.start + j;
                    for (a, &p) in acc.iter_mut().zip(&block[k * BLOCK..k * BLOCK + n]) {
                        *a += w * p;
                    }
                }
                if kind == FeatureKind::LogMel {
                    for a in &mut acc[..n] {
                        *a = db(*a);
                    }
                }
                out[m * frames + t0..m * frames + t0 + n].copy_from_slice(&acc[..n]);
            }
        }
        Features {
            data: out,
            bins: n_mels,
            frames,
        }
    }
}

/// One worker's STFT buffers. A real frame `x` of even length `N` goes
/// through one complex FFT of `M = N/2` points as `z[n] = x[2n] + i·x[2n+1]`
/// (the frame's own memory, read as complex numbers). With `Z` its spectrum,
/// the even and odd samples' spectra are `E[k] = (Z[k] + conj Z[M−k]) / 2`
/// and `O[k] = (Z[k] − conj Z[M−k]) / 2i`; with `T = e^{−2πik/N}·O[k]`,
/// `X[k] = E[k] + T` and `X[M−k] = conj(E[k] − T)`. Only the power is kept,
/// computed on split real/imaginary arrays so that the loop vectorises.
/// Each frame is transformed on its own: its values never depend on its
/// neighbours, so overlapping chunks agree with the whole file.
struct Stft<'a> {
    fx: &'a FeatureExtractor,
    input: Vec<Complex<f32>>,
    z: Vec<Complex<f32>>,
    scratch: Vec<Complex<f32>>,
    /// `re`, `im` of `Z`; `lo`, `hi`: `|X[k]|²`, `|X[M−k]|²` for the pairs.
    split: [Vec<f32>; 4],
    row: Vec<f32>,
}

impl<'a> Stft<'a> {
    fn new(fx: &'a FeatureExtractor) -> Self {
        let m = fx.cfg.n_fft / 2;
        let zero = Complex::new(0f32, 0f32);
        Stft {
            fx,
            input: vec![zero; m],
            z: vec![zero; m],
            scratch: vec![zero; fx.fft.get_outofplace_scratch_len()],
            split: std::array::from_fn(|_| vec![0f32; m]),
            row: vec![0f32; m + 1],
        }
    }

    /// `|STFT|^power` of frames `t0..t0 + n` into `block`, bin-major with a
    /// row stride of `BLOCK` (`block[k * BLOCK + j]` is bin `k` of frame
    /// `t0 + j`).
    fn block<const BLOCK: usize>(
        &mut self,
        signal: &[f32],
        t0: usize,
        n: usize,
        block: &mut [f32],
    ) {
        let cfg = &self.fx.cfg;
        let (power, half) = (cfg.power, cfg.power / 2.0);
        for j in 0..n {
            self.window(signal, t0 + j);
            self.fx.fft.process_outofplace_with_scratch(
                &mut self.input,
                &mut self.z,
                &mut self.scratch,
            );
            self.power_row();
            let rows = self.row.iter().zip(block.chunks_exact_mut(BLOCK));
            if power == 2.0 {
                for (&p, row) in rows {
                    row[j] = p;
                }
            } else {
                for (&p, row) in rows {
                    row[j] = p.powf(half);
                }
            }
        }
    }

    /// `|X[k]|²` for `k = 0..=M` from `Z` in `self.z`, into `self.row`.
    fn power_row(&mut self) {
        let (z, row) = (&self.z, &mut self.row);
        let m = z.len();
        let [re, im, lo, hi] = &mut self.split;
        for ((c, r), i) in z.iter().zip(re.iter_mut()).zip(im.iter_mut()) {
            *r = c.re;
            *i = c.im;
        }
        // k = 0 and k = M: E and O are real, T = O.
        row[0] = (re[0] + im[0]) * (re[0] + im[0]);
        row[m] = (re[0] - im[0]) * (re[0] - im[0]);
        // The pairs k < M − k, k = 1..h.
        let h = m.div_ceil(2);
        let (tw_re, tw_im) = &self.fx.twiddles;
        let pairs = h - 1;
        let (ar, ai) = (&re[1..h], &im[1..h]);
        let (br, bi) = (&re[m + 1 - h..m], &im[m + 1 - h..m]);
        let (lo, hi) = (&mut lo[..pairs], &mut hi[..pairs]);
        let (tw_re, tw_im) = (&tw_re[..pairs], &tw_im[..pairs]);
        for i in 0..pairs {
            // b = Z[M − k] with k = i + 1: read backwards.
            let (a_re, a_im) = (ar[i], ai[i]);
            let (b_re, b_im) = (br[pairs - 1 - i], bi[pairs - 1 - i]);
            let (er, ei) = (0.5 * (a_re + b_re), 0.5 * (a_im - b_im));
            let (or, oi) = (0.5 * (a_im + b_im), 0.5 * (b_re - a_re));
            let (wr, wi) = (tw_re[i], tw_im[i]);
            let (tr, ti) = (wr * or - wi * oi, wr * oi + wi * or);
            lo[i] = (er + tr) * (er + tr) + (ei + ti) * (ei + ti);
            hi[i] = (er - tr) * (er - tr) + (ei - ti) * (ei - ti);
        }
        row[1..h].copy_from_slice(lo);
        for (o, &p) in row[m + 1 - h..m].iter_mut().rev().zip(hi.iter()) {
            *o = p;
        }
        // k = M/2 is its own mirror: |X|² = |Z[M/2]|².
        if m % 2 == 0 && m > 0 {
            row[m / 2] = re[m / 2] * re[m / 2] + im[m / 2] * im[m / 2];
        }
    }

    /// Windowed frame `t` (centred on `t × hop`, zeros beyond the signal)
    /// into `self.input`, samples `2n` and `2n + 1` as the real and
    /// imaginary parts of element `n`.
    fn window(&mut self, signal: &[f32], t: usize) {
        let cfg = &self.fx.cfg;
        let (n_fft, hop) = (cfg.n_fft, cfg.hop);
        let len = signal.len() as isize;
        let start = t as isize * hop as isize - (n_fft / 2) as isize;
        let window = &self.fx.window;
        let pairs = self.input.iter_mut().zip(window.chunks_exact(2));
        if start >= 0 && start + n_fft as isize <= len {
            let s = start as usize;
            for ((o, w), x) in pairs.zip(signal[s..s + n_fft].chunks_exact(2)) {
                *o = Complex::new(x[0] * w[0], x[1] * w[1]);
            }
        } else {
            let at = |j: isize| {
                if (0..len).contains(&j) {
                    signal[j as usize]
                } else {
                    0.0
                }
            };
            for (n, (o, w)) in pairs.enumerate() {
                let j = start + 2 * n as isize;
                *o = Complex::new(at(j) * w[0], at(j + 1) * w[1]);
            }
        }
    }
}

/// `10 log10(max(x, 1e-10))`, to within 2e-5 dB for finite `x`, branch-free
/// so that the compiler vectorises it (the libm `log10` took 40% of a
/// log-mel). NaN maps to -100 dB like zero; +∞ to about 385 dB.
#[inline]
pub fn db(x_in: f32) -> f32 {
    let floor = x_in.is_nan() || x_in <= 1e-10;
    let x = if floor { 1.0 } else { x_in };
    // x = 2^e · m, m in [1, 2); log2(m) by a polynomial in t = (m-1)/(m+1).
    let bits = x.to_bits();
    let e = ((bits >> 23) & 0xff) as i32 - 127;
    let m = f32::from_bits((bits & 0x007f_ffff) | 0x3f80_0000);
    let t = (m - 1.0) / (m + 1.0);
    let t2 = t * t;
    // 2/ln2 · atanh(t) = log2(m): odd series, t ≤ 1/3.
    let p = t
        * (2.885_39
            + t2 * (0.961_797_7 + t2 * (0.577_078 + t2 * (0.412_198_6 + t2 * 0.320_598_6))));
    // 10·log10(2) = 3.0103
    let v = std::f32::consts::LOG10_2 * 10.0 * (e as f32 + p);
    // The floor exactly, as librosa gives it.
    if floor {
        -100.0
    } else {
        v
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mel_scale_round_trips_and_filters_have_unit_area_slaney() {
        for hz in [0.0, 200.0, 999.0, 1000.0, 4000.0, 8000.0] {
            assert!((mel_to_hz(hz_to_mel(hz)) - hz).abs() < 1e-9);
        }
        let fb = mel_filterbank(&FeatureConfig::default());
        assert_eq!(fb.len(), 80);
        assert!(fb.iter().all(|r| r.len() == 201));
        // Slaney normalisation: each triangle's area in Hz is 1.
        let df = 8000.0 / 200.0;
        for r in &fb[10..70] {
            let area: f64 = r.iter().map(|&w| f64::from(w) * df).sum();
            assert!((area - 1.0).abs() < 0.1, "area {area}");
        }
    }

    #[test]
    fn every_bin_equals_a_direct_dft() {
        // Even and odd half-lengths (M = n_fft/2), edge frames, both powers.
        let x: Vec<f32> = (0..3000)
            .map(|i| ((i * 7919) % 211) as f32 / 105.0 - 1.0 + (i as f32 * 0.05).sin())
            .collect();
        for (n_fft, hop, power) in [
            (2, 1, 2.0),
            (4, 3, 2.0),
            (6, 2, 2.0),
            (400, 160, 2.0),
            (402, 100, 1.0),
            (512, 128, 2.0),
        ] {
            let cfg = FeatureConfig {
                n_fft,
                hop,
                power,
                ..FeatureConfig::default()
            };
            let fx = FeatureExtractor::new(cfg).unwrap();
            let s = fx.compute(&x, FeatureKind::Spectrogram);
            let bins = n_fft / 2 + 1;
            assert_eq!((s.bins, s.frames), (bins, fx.frames(x.len())));
            for t in [0, 1, s.frames / 2, s.frames - 2, s.frames - 1] {
                let start = (t * hop) as isize - (n_fft / 2) as isize;
                let frame: Vec<f64> = (0..n_fft)
                    .map(|i| {
                        let j = start + i as isize;
                        let w = 0.5
                            - 0.5 * (2.0 * std::f64::consts::PI * i as f64 / n_fft as f64).cos();
                        usize::try_from(j)
                            .ok()
                            .and_then(|j| x.get(j))
                            .map_or(0.0, |&v| f64::from(v) * w)
                    })
                    .collect();
                let want: Vec<f64> = (0..bins)
                    .map(|k| {
                        let (mut re, mut im) = (0.0, 0.0);
                        for (i, v) in frame.iter().enumerate() {
                            let a = -2.0 * std::f64::consts::PI * (k * i) as f64 / n_fft as f64;
                            re += v * a.cos();
                            im += v * a.sin();
                        }
                        (re * re + im * im).powf(f64::from(power) / 2.0)
                    })
                    .collect();
                let peak = want.iter().cloned().fold(1e-12, f64::max);
                for (k, w) in want.iter().enumerate() {
                    let got = f64::from(s.data[k * s.frames + t]);
                    assert!(
                        (got - w).abs() <= 1e-5 * peak,
                        "n_fft {n_fft}, frame {t}, bin {k}: {got} vs {w}"
                    );
                }
            }
        }
    }

    #[test]
    fn frames_and_parseval() {
        let fx = FeatureExtractor::new(FeatureConfig::default()).unwrap();
        assert_eq!(fx.frames(0), 1);
        assert_eq!(fx.frames(16000), 101);
        // A silent signal gives the floor in log-mel.
        let f = fx.compute(&[0.0; 1000], FeatureKind::LogMel);
        assert!(f.data.iter().all(|&v| v == -100.0));
        // Parseval on an interior frame: sum of |X|^2 over the full spectrum = n · sum (x w)^2.
        let x: Vec<f32> = (0..4000)
            .map(|i| ((i * 7919) % 101) as f32 / 50.0 - 1.0)
            .collect();
        let s = fx.compute(&x, FeatureKind::Spectrogram);
        let t = 10;
        let col: Vec<f32> = (0..201).map(|k| s.data[k * s.frames + t]).collect();
        let full: f64 = col
            .iter()
            .enumerate()
            .map(|(k, &p)| {
                let w = if k == 0 || k == 200 { 1.0 } else { 2.0 };
                w * f64::from(p)
            })
            .sum();
        let start = t * 160 - 200;
        let time: f64 = (0..400)
            .map(|i| {
                let w = 0.5 - 0.5 * (2.0 * std::f64::consts::PI * i as f64 / 400.0).cos();
                (f64::from(x[start + i]) * w).powi(2)
            })
            .sum();
        assert!((full / (400.0 * time) - 1.0).abs() < 1e-4);
    }

    #[test]
    fn fast_db_matches_log10() {
        let mut worst = 0f64;
        let mut x = 1e-12f32;
        while x < 1e12 {
            let want = 10.0 * f64::from(x.max(1e-10)).log10();
            worst = worst.max((f64::from(db(x)) - want).abs());
            x *= 1.0007;
        }
        assert!(worst < 2e-5, "worst error {worst} dB");
        assert_eq!(db(0.0), -100.0);
        assert_eq!(db(-3.0), -100.0);
        assert!(db(f32::INFINITY) > 380.0);
        assert_eq!(db(f32::NAN), -100.0);
    }

    #[test]
    fn bad_configs_are_errors() {
        for cfg in [
            FeatureConfig {
                n_fft: 401,
                ..FeatureConfig::default()
            },
            FeatureConfig {
                hop: 0,
                ..FeatureConfig::default()
            },
            FeatureConfig {
                n_mels: 0,
                ..FeatureConfig::default()
            },
            FeatureConfig {
                sample_rate: 0,
                ..FeatureConfig::default()
            },
            FeatureConfig {
                fmin: 9000.0,
                ..FeatureConfig::default()
            },
        ] {
            assert!(FeatureExtractor::new(cfg).is_err(), "{cfg:?}");
        }
    }
}
