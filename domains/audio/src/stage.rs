//! The feature stage and the collate.
//!
//! [`FeatureStage`] turns an [`AudioChunk`] into [`ChunkFeatures`] with one
//! shared [`FeatureExtractor`] (FFT plan and filterbank built once).
//! [`FeatureCollate`] stacks them: `features` f32 `[N, bins, frames]`
//! (`[N, channels, bins, frames]` when channels are kept),
//! `lengths` i64 `[N]` (valid frames: `1 + valid_samples / hop`, or valid
//! samples for waveforms) and `chunk_starts` i64 `[N]`.
//!
//! ```
//! use ferrofeed_audio::{AudioChunk, FeatureConfig, FeatureKind, FeatureStage};
//! use ferrofeed_core::{Stage, StageCtx};
//! let stage = FeatureStage::new(FeatureConfig::default(), FeatureKind::LogMel).unwrap();
//! let chunk = AudioChunk { samples: vec![0.1; 16000], channels: 1, valid: 8000, start: 0, sample_rate: 16000 };
//! let stop = std::sync::atomic::AtomicBool::new(false);
//! let f = stage.process(chunk, &StageCtx::detached(0, 0, 0, &stop)).unwrap();
//! assert_eq!((f.features.bins, f.features.frames, f.valid), (80, 101, 51));
//! ```
use std::sync::Arc;

use ferrofeed_core::BatchRows;
use ferrofeed_core::{
    Batch, BoxError, BufferPool, BufferSource, Collate, CollateError, Component, ComponentId,
    DType, Stage, StageCtx, Tensor,
};

use crate::features::{FeatureConfig, FeatureExtractor, FeatureKind, Features};
use crate::stream::AudioChunk;
use crate::AudioError;

/// The features of one chunk.
#[derive(Clone, Debug, PartialEq)]
pub struct ChunkFeatures {
    /// `[bins, frames]`, or `[channels, bins, frames]` flattened into `data`
    /// when channels are kept.
    pub features: Features,
    /// Channels (1 unless kept).
    pub channels: usize,
    /// Frames (or samples, for waveforms) computed from real audio.
    pub valid: usize,
    /// First sample of the chunk in its file.
    pub start: u64,
}

impl Component for ChunkFeatures {
    fn nbytes(&self) -> usize {
        self.features.data.len() * 4 + 24
    }
    fn describe(&self) -> String {
        let (lo, hi) = self
            .features
            .data
            .iter()
            .fold((f32::INFINITY, f32::NEG_INFINITY), |(a, b), &x| {
                (a.min(x), b.max(x))
            });
        let ch = if self.channels > 1 {
            format!("{} × ", self.channels)
        } else {
            String::new()
        };
        format!(
            "[{ch}{} × {}] ({} valid) from sample {}, range {lo:.2}..{hi:.2}",
            self.features.bins, self.features.frames, self.valid, self.start
        )
    }
}

/// The stage `AudioChunk → ChunkFeatures`.
#[derive(Debug, Clone)]
pub struct FeatureStage {
    fx: Arc<FeatureExtractor>,
    kind: FeatureKind,
}

impl FeatureStage {
    /// Plans the FFT and the filterbank once.
    pub fn new(cfg: FeatureConfig, kind: FeatureKind) -> Result<Self, AudioError> {
        Ok(FeatureStage {
            fx: Arc::new(FeatureExtractor::new(cfg)?),
            kind,
        })
    }
}

impl Stage for FeatureStage {
    type In = AudioChunk;
    type Out = ChunkFeatures;
    fn process(&self, c: AudioChunk, _ctx: &StageCtx) -> Result<ChunkFeatures, BoxError> {
        self.features_of(c)
    }
}

impl FeatureStage {
    /// What the settings describe, for cache keys.
    pub fn settings(&self) -> String {
        format!("{:?} {:?}", self.fx.config(), self.kind)
    }

    /// One chunk's features.
    pub fn features_of(&self, c: AudioChunk) -> Result<ChunkFeatures, BoxError> {
        let rate = self.fx.config().sample_rate;
        if c.sample_rate != rate {
            return Err(format!(
                "chunk at {} Hz, features configured for {rate} Hz",
                c.sample_rate
            )
            .into());
        }
        let channels = c.channels.max(1);
        let plane = c.samples.len() / channels;
        let mut features = self.fx.compute(&c.samples[..plane], self.kind);
        for ch in 1..channels {
            let f = self
                .fx
                .compute(&c.samples[ch * plane..(ch + 1) * plane], self.kind);
            features.data.extend_from_slice(&f.data);
        }
        let valid = match self.kind {
            FeatureKind::Waveform => c.valid,
            _ => self.fx.frames(c.valid).min(features.frames),
        };
        Ok(ChunkFeatures {
            features,
            channels,
            valid,
            start: c.start,
        })
    }
}

/// Stacks [`ChunkFeatures`] into `features`, `lengths`, `chunk_starts`;
/// `features` goes into buffers recycled from a pool once the batches
/// holding them are dropped (every element is written, none zeroed first).
#[derive(Clone)]
pub struct FeatureCollate {
    pool: Arc<dyn BufferSource>,
}

impl Default for FeatureCollate {
    fn default() -> Self {
        FeatureCollate {
            pool: BufferPool::for_collate(),
        }
    }
}

impl std::fmt::Debug for FeatureCollate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FeatureCollate").finish_non_exhaustive()
    }
}

impl FeatureCollate {
    /// A collate with its own recycling pool.
    pub fn new() -> Self {
        Self::default()
    }
    /// Takes the `features` memory from `source` (e.g. a pool of
    /// page-locked buffers) instead.
    pub fn buffers(mut self, source: Arc<dyn BufferSource>) -> Self {
        self.pool = source;
        self
    }
}

impl Collate for FeatureCollate {
    fn reads(&self) -> Vec<ComponentId> {
        vec![ComponentId::of::<ChunkFeatures>()]
    }
    fn collate(&self, rows: &BatchRows<'_>) -> Result<Batch, CollateError> {
        let fs = rows.column::<ChunkFeatures>().ok_or_else(|| CollateError {
            sample: None,
            message: "no ChunkFeatures column".into(),
        })?;
        let first = fs.first().ok_or_else(|| CollateError {
            sample: None,
            message: "empty batch".into(),
        })?;
        let (bins, frames, channels) = (first.features.bins, first.features.frames, first.channels);
        // Mono: [N, bins, frames]; channels kept: [N, channels, bins, frames].
        let shape: Vec<usize> = if channels == 1 {
            vec![fs.len(), bins, frames]
        } else {
            vec![fs.len(), channels, bins, frames]
        };
        let per = channels * bins * frames;
        let mut t = Tensor::uninit_from(self.pool.as_ref(), DType::F32, &shape);
        {
            let out = t.as_slice_mut::<f32>().map_err(|e| CollateError {
                sample: None,
                message: e.to_string(),
            })?;
            for (i, f) in fs.iter().enumerate() {
                if (f.channels, f.features.bins, f.features.frames) != (channels, bins, frames) {
                    return Err(CollateError {
                        sample: Some(i),
                        message: format!(
                            "features [{} × {} × {}] (channels × bins × frames) differ from the batch's [{channels} × {bins} × {frames}]",
                            f.channels, f.features.bins, f.features.frames
                        ),
                    });
                }
                out[i * per..(i + 1) * per].copy_from_slice(&f.features.data);
            }
        }
        let lengths: Vec<i64> = fs.iter().map(|f| f.valid as i64).collect();
        let starts: Vec<i64> = fs.iter().map(|f| f.start as i64).collect();
        let mut b = Batch::new(Vec::new());
        b.insert("features", t);
        b.insert("lengths", Tensor::from_slice(&lengths, &[fs.len()]));
        b.insert("chunk_starts", Tensor::from_slice(&starts, &[fs.len()]));
        Ok(b)
    }
}
