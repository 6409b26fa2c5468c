//! Any bytes through the training decode stage (header, random crop, region
//! decode through libjpeg-turbo when present, resize, flip).
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
    let ctx = StageCtx::detached(data.len() as u64, 0, 7, &stop);
    let _ = stage.process(Bytes::from(data.to_vec()), &ctx);
});
