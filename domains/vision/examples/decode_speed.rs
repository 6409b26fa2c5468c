//! Single-thread decode and transform timings over a folder of JPEGs:
//! `cargo run --release -p ferrofeed-vision --example decode_speed -- DIR [MODE]`.
//!
//! MODE runs one path only (to count instructions under callgrind):
//! `zune` (zune-jpeg decode only: the "plain decode limit"), `decode`
//! (default decoder, decode only), `train-fused`, `train-unfused`,
//! `train-seek`, `train-indexed` (see `run`), `train-fast`, `eval-fused`, `eval-unfused`. Without MODE, all of them.
use std::time::Instant;

use ferrofeed_core::rng::sample_rng;
use ferrofeed_vision::{decode, Backend, DecodeOptions, DecodeTransform, Transform};

fn run(mode: &str, files: &[Vec<u8>]) -> f64 {
    let mut rng = sample_rng(1);
    let stage = |transform, fast| DecodeTransform {
        transform,
        decode: DecodeOptions {
            fast,
            ..Default::default()
        },
        cache: None,
        disk: None,
        seek: None,
    };
    // Through a scan index: `train-seek` times a first pass, which fills
    // the index (a first epoch), `train-indexed` a second pass over images
    // the first pass marked (later epochs).
    let indexed = DecodeTransform {
        seek: Some(ferrofeed_vision::jpeg::ScanIndex::new(64 << 20)),
        ..stage(Transform::train(224), false)
    };
    if mode == "train-indexed" {
        for (i, f) in files.iter().enumerate() {
            assert!(indexed.run_keyed(f, Some(i as u64), &mut rng).is_ok());
        }
    }
    let t = Instant::now();
    for (i, f) in files.iter().enumerate() {
        let ok = match mode {
            "zune" => decode(
                f,
                &DecodeOptions {
                    backend: Backend::Zune,
                    ..Default::default()
                },
            )
            .is_ok(),
            "decode" => decode(f, &DecodeOptions::default()).is_ok(),
            "train-fused" => stage(Transform::train(224), false).run(f, &mut rng).is_ok(),
            "train-unfused" => stage(Transform::train(224), false)
                .run_unfused(f, &mut rng)
                .is_ok(),
            "train-seek" => indexed.run_keyed(f, Some(i as u64), &mut rng).is_ok(),
            "train-indexed" => indexed.run_keyed(f, Some(i as u64), &mut rng).is_ok(),
            "train-fast" => stage(Transform::train(224), true).run(f, &mut rng).is_ok(),
            "eval-fused" => stage(Transform::eval(256, 224), false)
                .run(f, &mut rng)
                .is_ok(),
            "eval-unfused" => stage(Transform::eval(256, 224), false)
                .run_unfused(f, &mut rng)
                .is_ok(),
            other => panic!("unknown mode {other}"),
        };
        assert!(ok, "{mode} failed");
    }
    t.elapsed().as_secs_f64() * 1e3 / files.len() as f64
}

fn main() {
    let dir = std::env::args()
        .nth(1)
        .expect("usage: decode_speed DIR [MODE]");
    let folder = ferrofeed_stages::ImageFolder::scan(&dir, &["jpg"]).expect("a folder of JPEGs");
    let files: Vec<Vec<u8>> = folder
        .files()
        .iter()
        .take(1024)
        .map(|(p, _)| std::fs::read(p).expect("readable"))
        .collect();
    let modes = match std::env::args().nth(2) {
        Some(m) => vec![m],
        None => [
            "zune",
            "decode",
            "train-fused",
            "train-unfused",
            "train-seek",
            "train-indexed",
            "train-fast",
            "eval-fused",
            "eval-unfused",
        ]
        .map(String::from)
        .to_vec(),
    };
    for m in modes {
        let ms = run(&m, &files);
        let label = if m == "zune" {
            "zune-jpeg decode only".to_string()
        } else {
            m.clone()
        };
        println!("{label}: {ms:.3} ms/image");
    }
}
