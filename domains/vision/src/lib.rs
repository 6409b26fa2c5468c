//! # ferrofeed-vision
//!
//! The vision pack: JPEG decoding with `zune-jpeg` (other formats through
//! `image`), EXIF orientation, torchvision-compatible RandomResizedCrop,
//! antialiased Resize and CenterCrop (the [`resample`] module), flips,
//! normalisation, and a collate that writes CHW rows straight into the batch.
//! JPEG crops decode through libjpeg-turbo when present, and from the second
//! epoch on only the MCUs they cover, found through a scan index of where
//! each MCU starts (the [`jpeg`] module).
//!
//! ```
//! use ferrofeed_core::prelude::*;
//! use ferrofeed_stages::{Bytes, Label};
//! use ferrofeed_vision::{synth, DecodeTransform, Transform};
//!
//! // Three synthetic JPEGs held in memory.
//! let jpegs: Vec<Vec<u8>> = (0..3).map(|i| synth::jpeg(7, i, 90).unwrap()).collect();
//! let source = FnSource::new(3, move |i| Ok((Bytes::from(jpegs[i as usize].clone()), Label(i as i64))));
//! let p = Pipeline::builder(source)
//!     .stage("decode", DecodeTransform::new(Transform::train(64)))
//!     .batch_size(3)
//!     .collate(ferrofeed_vision::collate())
//!     .build()
//!     .unwrap();
//! let batch = p.epoch(0).next().unwrap().unwrap();
//! assert_eq!(batch.get("images").unwrap().shape(), &[3, 3, 64, 64]);
//! ```
#![warn(missing_docs)]
#![warn(unreachable_pub)]

mod cache;
mod decode;
mod disk_cache;
mod fused;
mod image;
pub mod jpeg;
pub mod libjpeg;
pub mod resample;
pub mod synth;
mod transform;

pub use cache::ImageCache;
pub use decode::{
    decode, jpeg_header, jpeg_orientation, orient, peek_dimensions, Backend, DecodeError,
    DecodeOptions, JpegHeader,
};
pub use disk_cache::ImageDiskCache;
pub use fused::{DecodeTransform, DEFAULT_SEEK_BYTES};
pub use image::{Image, NormalizedImage};
pub use transform::{
    center_crop_box, eval_resize_size, random_resized_crop_box, resize_crop, CropBox, Normalize,
    Plan, ResizeTo, Transform,
};

use ferrofeed_core::StackCollate;
use ferrofeed_stages::Label;

/// `images` u8 `[N,3,H,W]` and `labels` i64 `[N]`.
pub fn collate() -> StackCollate {
    StackCollate::new()
        .column::<Image>("images")
        .column::<Label>("labels")
}

/// File extensions the vision readers accept.
pub const IMAGE_EXTENSIONS: &[&str] = &["jpg", "jpeg", "png", "bmp", "gif", "tif", "tiff", "webp"];
