//! Any image size, region (including NaN, infinite, negative, far outside
//! and huge values), output size and flip through the resampler: an error or
//! an output of exactly `out_w × out_h × 3` bytes, never a panic.
#![no_main]
use ferrofeed_vision::resample::resize;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if data.len() < 37 {
        return;
    }
    let (w, h) = (u32::from(data[0] % 80), u32::from(data[1] % 80));
    let (ow, oh) = (u32::from(data[2] % 70), u32::from(data[3] % 70));
    let flip = data[4] & 1 == 1;
    let f = |i: usize| f64::from_le_bytes(data[5 + 8 * i..13 + 8 * i].try_into().unwrap_or([0; 8]));
    let region = (f(0), f(1), f(2), f(3));
    let pixels: Vec<u8> = data[37..]
        .iter()
        .copied()
        .cycle()
        .take(w as usize * h as usize * 3)
        .collect();
    if let Ok(out) = resize(&pixels, w, h, region, ow, oh, flip) {
        assert_eq!(out.len(), ow as usize * oh as usize * 3);
    }
});
