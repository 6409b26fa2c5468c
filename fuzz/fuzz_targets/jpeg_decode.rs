//! Any bytes through the JPEG decoder (zune-jpeg path): an error, never a
//! panic, and no allocation beyond the pixel limit.
#![no_main]
use ferrofeed_vision::{decode, DecodeOptions};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let opts = DecodeOptions {
        max_pixels: 4 << 20,
        ..DecodeOptions::default()
    };
    let _ = decode(data, &opts);
});
