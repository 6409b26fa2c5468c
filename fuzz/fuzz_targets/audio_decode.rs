//! Any bytes as a wav/flac/mp3/ogg file through decode, resampling and
//! chunking: errors, never panics or hangs.
#![no_main]
use std::path::Path;

use ferrofeed_audio::decode::Decoded;
use ferrofeed_audio::stream::{ChunkSpec, Chunker, StreamResampler};
use ferrofeed_audio::DecodeOptions;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Some((&kind, body)) = data.split_first() else {
        return;
    };
    let ext = ["wav", "flac", "mp3", "ogg"][kind as usize % 4];
    let name = format!("input.{ext}");
    let Ok(mut d) = Decoded::from_bytes(body.to_vec(), Path::new(&name), &DecodeOptions::default())
    else {
        return;
    };
    let mut resampler = if d.sample_rate() != 16000 {
        StreamResampler::new(d.sample_rate(), 16000).ok()
    } else {
        None
    };
    let mut chunker = Chunker::new(
        ChunkSpec {
            chunk: 4000,
            overlap: 1000,
        },
        16000,
    );
    let mut out = Vec::new();
    let mut total = 0usize;
    while let Ok(Some(block)) = d.next_block() {
        total += block.len();
        if total > 16000 * 600 {
            break; // ten minutes of audio is enough for one input
        }
        match &mut resampler {
            Some(r) => {
                let mut buf = Vec::new();
                if r.push(&block, &mut buf).is_err() {
                    return;
                }
                chunker.push(&buf, &mut out);
            }
            None => chunker.push(&block, &mut out),
        }
        out.clear();
    }
    let _ = chunker.finish(&mut out);
});
