//! Randomness after the features: SpecAugment-style time and frequency
//! masking (torchaudio's `TimeMasking`/`FrequencyMasking`: a width drawn
//! from `[0, W)`, a start from what is left, the band set to 0) and a
//! random gain, as one seeded stage. Its draws come from the sample's
//! `(seed, epoch, index)` RNG, so batches are bit-identical across runs and
//! worker counts, differ from epoch to epoch, and a cache of the features
//! before it does not freeze the augmentation.
//!
//! ```
//! use ferrofeed_audio::{Augment, ChunkFeatures, FeatureKind, Features};
//! let aug = Augment { time_masks: 1, time_mask_width: 10, ..Augment::off(FeatureKind::LogMel) };
//! let c = ChunkFeatures {
//!     features: Features { data: vec![1.0; 4 * 50], bins: 4, frames: 50 },
//!     channels: 1,
//!     valid: 50,
//!     start: 0,
//! };
//! let out = aug.apply(c, &mut ferrofeed_core::rng::sample_rng(7));
//! let zeros = out.features.data.iter().filter(|&&v| v == 0.0).count();
//! assert!(zeros % 4 == 0 && zeros < 4 * 10); // whole frames, fewer than 10 of them
//! ```
use ferrofeed_core::{BoxError, Stage, StageCtx};
use rand::Rng;

use crate::features::FeatureKind;
use crate::stage::ChunkFeatures;

/// Masks and gain for computed features (all off by default).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Augment {
    /// Time masks per chunk.
    pub time_masks: usize,
    /// Each time mask's width is drawn from `[0, time_mask_width)` frames.
    pub time_mask_width: usize,
    /// Frequency masks per chunk.
    pub freq_masks: usize,
    /// Each frequency mask's width is drawn from `[0, freq_mask_width)` bins.
    pub freq_mask_width: usize,
    /// A gain drawn uniformly from `[-gain_db, +gain_db]` dB per chunk.
    pub gain_db: f32,
    /// What the features are (the gain adds dB to log-mel, scales power by
    /// `10^(g/10)` and waveforms by `10^(g/20)`).
    pub kind: FeatureKind,
}

impl Augment {
    /// No augmentation, for features of `kind`.
    pub fn off(kind: FeatureKind) -> Self {
        Augment {
            time_masks: 0,
            time_mask_width: 0,
            freq_masks: 0,
            freq_mask_width: 0,
            gain_db: 0.0,
            kind,
        }
    }

    /// Whether anything is drawn.
    pub fn is_off(&self) -> bool {
        (self.time_masks == 0 || self.time_mask_width == 0)
            && (self.freq_masks == 0 || self.freq_mask_width == 0)
            && self.gain_db == 0.0
    }

    /// Checks the settings.
    pub fn validate(&self) -> Result<(), String> {
        if !(self.gain_db.is_finite() && (0.0..=60.0).contains(&self.gain_db)) {
            return Err(format!("--gain-db {} must be within 0–60", self.gain_db));
        }
        if self.kind == FeatureKind::Waveform && self.freq_masks > 0 {
            return Err("--freq-masks needs spectral features, not waveform".into());
        }
        Ok(())
    }

    /// Applies the draws from `rng` to one chunk's features. Masks cover only
    /// the chunk's real frames (not the padding of a short last chunk).
    pub fn apply(&self, mut c: ChunkFeatures, rng: &mut impl Rng) -> ChunkFeatures {
        let (bins, frames) = (c.features.bins, c.features.frames);
        let planes = c.channels.max(1);
        let valid = c.valid.min(frames);
        let data = &mut c.features.data;
        for _ in 0..self.time_masks {
            if self.time_mask_width == 0 || valid == 0 {
                break;
            }
            let w = rng.random_range(0..self.time_mask_width).min(valid);
            let t0 = rng.random_range(0..=valid - w);
            for plane in data.chunks_mut(bins * frames).take(planes) {
                for row in plane.chunks_mut(frames) {
                    row[t0..t0 + w].fill(0.0);
                }
            }
        }
        for _ in 0..self.freq_masks {
            if self.freq_mask_width == 0 || bins == 0 {
                break;
            }
            let w = rng.random_range(0..self.freq_mask_width).min(bins);
            let f0 = rng.random_range(0..=bins - w);
            for plane in data.chunks_mut(bins * frames).take(planes) {
                plane[f0 * frames..(f0 + w) * frames].fill(0.0);
            }
        }
        if self.gain_db > 0.0 {
            let g = rng.random_range(-self.gain_db..=self.gain_db);
            match self.kind {
                FeatureKind::LogMel => data.iter_mut().for_each(|v| *v += g),
                FeatureKind::Mel | FeatureKind::Spectrogram => {
                    let s = 10f32.powf(g / 10.0);
                    data.iter_mut().for_each(|v| *v *= s);
                }
                FeatureKind::Waveform => {
                    let s = 10f32.powf(g / 20.0);
                    data.iter_mut().for_each(|v| *v *= s);
                }
            }
        }
        c
    }
}

impl Stage for Augment {
    type In = ChunkFeatures;
    type Out = ChunkFeatures;
    fn process(&self, c: ChunkFeatures, ctx: &StageCtx) -> Result<ChunkFeatures, BoxError> {
        Ok(self.apply(c, &mut ctx.rng()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::features::Features;
    use ferrofeed_core::rng::sample_rng;

    fn chunk(bins: usize, frames: usize, valid: usize) -> ChunkFeatures {
        ChunkFeatures {
            features: Features {
                data: (0..bins * frames).map(|i| 1.0 + i as f32).collect(),
                bins,
                frames,
            },
            channels: 1,
            valid,
            start: 0,
        }
    }

    #[test]
    fn masks_are_whole_bands_within_their_widths_and_the_real_frames() {
        let aug = Augment {
            time_masks: 2,
            time_mask_width: 8,
            freq_masks: 1,
            freq_mask_width: 5,
            ..Augment::off(FeatureKind::LogMel)
        };
        for seed in 0..200 {
            let out = aug.apply(chunk(16, 40, 30), &mut sample_rng(seed));
            let d = &out.features.data;
            let zero_rows = (0..16)
                .filter(|&b| d[b * 40..(b + 1) * 40].iter().all(|&v| v == 0.0))
                .count();
            assert!(zero_rows < 5, "seed {seed}: {zero_rows} bins masked");
            let zero_cols: Vec<usize> = (0..40)
                .filter(|&t| (0..16).all(|b| d[b * 40 + t] == 0.0))
                .collect();
            assert!(
                zero_cols.len() <= 14,
                "seed {seed}: {} frames",
                zero_cols.len()
            );
            assert!(
                zero_cols.iter().all(|&t| t < 30),
                "seed {seed}: padding masked"
            );
            // Values outside the masks are untouched.
            for (i, &v) in d.iter().enumerate() {
                assert!(v == 0.0 || v == 1.0 + i as f32);
            }
        }
    }

    #[test]
    fn draws_follow_the_rng_and_the_gain_follows_the_kind() {
        let aug = Augment {
            time_masks: 1,
            time_mask_width: 20,
            gain_db: 6.0,
            ..Augment::off(FeatureKind::Mel)
        };
        let a = aug.apply(chunk(4, 50, 50), &mut sample_rng(1));
        let b = aug.apply(chunk(4, 50, 50), &mut sample_rng(1));
        let c = aug.apply(chunk(4, 50, 50), &mut sample_rng(2));
        assert_eq!(a.features.data, b.features.data);
        assert_ne!(a.features.data, c.features.data);
        let s = a
            .features
            .data
            .iter()
            .enumerate()
            .find(|(_, &v)| v != 0.0)
            .map(|(i, &v)| v / (1.0 + i as f32))
            .unwrap();
        assert!((0.25..=4.0).contains(&s) && (10.0 * s.log10()).abs() <= 6.0 + 1e-4);
        let log = Augment {
            gain_db: 3.0,
            ..Augment::off(FeatureKind::LogMel)
        };
        let d = log.apply(chunk(2, 3, 3), &mut sample_rng(9)).features.data;
        let g = d[0] - 1.0;
        assert!(
            g.abs() <= 3.0
                && d.iter()
                    .enumerate()
                    .all(|(i, &v)| (v - (1.0 + i as f32) - g).abs() < 1e-5)
        );
        assert!(Augment::off(FeatureKind::LogMel).is_off());
        assert!(Augment {
            gain_db: f32::NAN,
            ..log
        }
        .validate()
        .is_err());
        assert!(Augment {
            freq_masks: 1,
            freq_mask_width: 2,
            ..Augment::off(FeatureKind::Waveform)
        }
        .validate()
        .is_err());
    }
}
