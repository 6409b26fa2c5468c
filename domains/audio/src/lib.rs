//! # ferrofeed-audio
//!
//! The audio pack: files decoded with `symphonia` packet by packet (wav,
//! flac, mp3, ogg/vorbis), mixed to mono, resampled with `rubato` when their
//! rate differs, cut into fixed-length overlapping chunks as they stream,
//! then STFT / mel / log-mel features with librosa's conventions.
//!
//! ```no_run
//! use ferrofeed_audio::*;
//! use ferrofeed_core::prelude::*;
//! let files = AudioFiles::scan("audio/".as_ref(), StreamOptions::default()).unwrap();
//! let pipeline = Pipeline::builder_iterable(files)
//!     .stage("logmel", FeatureStage::new(FeatureConfig::default(), FeatureKind::LogMel).unwrap())
//!     .batch_size(32)
//!     .collate(FeatureCollate::new())
//!     .build()
//!     .unwrap();
//! for batch in pipeline.epoch(0) {
//!     let b = batch.unwrap(); // features f32 [32, 80, 1001], lengths, chunk_starts
//! }
//! ```
#![warn(missing_docs)]
#![warn(unreachable_pub)]

mod augment;
mod cache;
mod decode;
mod features;
mod files;
mod resample;
mod stage;
mod stream;
pub mod synth;

pub use augment::Augment;
pub use cache::{CachedFeatures, FeatureCache};
pub use decode::{DecodeOptions, Decoded, NonFinite, MAX_SAMPLE_RATE};
pub use features::{
    db, hz_to_mel, mel_filterbank, mel_to_hz, FeatureConfig, FeatureExtractor, FeatureKind,
    Features, MAX_HOP, MAX_N_FFT, MAX_N_MELS,
};
pub use files::{AudioFiles, Segment, AUDIO_EXTENSIONS};
pub use resample::{StreamResampler, MAX_RESAMPLE_RATIO};
pub use stage::{ChunkFeatures, FeatureCollate, FeatureStage};
pub use stream::{
    AudioChunk, ChunkSpec, ChunkStream, Chunker, StreamOptions, DEFAULT_SEGMENT_SECONDS,
    MAX_CHUNK_SAMPLES, SEGMENT_MIN_BYTES,
};

use std::path::PathBuf;

/// Audio pack errors.
#[derive(Debug, thiserror::Error)]
pub enum AudioError {
    /// A file that cannot be decoded.
    #[error("decode {path}: {message}")]
    Decode {
        /// The file.
        path: PathBuf,
        /// Why.
        message: String,
    },
    /// Unusable settings.
    #[error("{0}")]
    Config(String),
}
