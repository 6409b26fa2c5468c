//! Any bytes through the training decode stage (header, random crop, region
//! decode through libjpeg-turbo when present, the scan index and its
//! stand-in streams, resize, flip), twice.
#![no_main]
use std::sync::atomic::AtomicBool;

use ferrofeed_core::{Stage, StageCtx};
use ferrofeed_stages::Bytes;
use ferrofeed_vision::{DecodeOptions, DecodeTransform, Transform};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let mut stage = DecodeTransform::new(Transform::train(32));
    stage.decode = DecodeOptions {
        max_pixels: 4 << 20,
        ..DecodeOptions::default()
    };
    let stop = AtomicBool::new(false);
    // Two epochs: the second decodes through the scan index the first
    // filled, at another random crop.
    for epoch in 0..2 {
        let ctx = StageCtx::detached(data.len() as u64, epoch, 7, &stop);
        let _ = stage.process(Bytes::from(data.to_vec()), &ctx);
    }
});
