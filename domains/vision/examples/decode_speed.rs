//! Single-thread decode and transform timings over a folder of JPEGs:
//! `cargo run --release -p ferrofeed-vision --example decode_speed -- DIR`.
use std::time::Instant;

use ferrofeed_core::rng::sample_rng;
use ferrofeed_vision::{decode, DecodeOptions, Transform};

fn main() {
    let dir = std::env::args().nth(1).expect("usage: decode_speed DIR");
    let folder = ferrofeed_stages::ImageFolder::scan(&dir, &["jpg"]).expect("a folder of JPEGs");
    let files: Vec<Vec<u8>> = folder
        .files()
        .iter()
        .take(1024)
        .map(|(p, _)| std::fs::read(p).expect("readable"))
        .collect();
    let o = DecodeOptions::default();
    let t = Instant::now();
    let imgs: Vec<_> = files
        .iter()
        .map(|b| decode(b, &o).expect("decodes"))
        .collect();
    let dt = t.elapsed().as_secs_f64();
    println!(
        "decode only: {:.3} ms/image ({:.0} img/s)",
        dt * 1e3 / files.len() as f64,
        files.len() as f64 / dt
    );
    let mut rng = sample_rng(1);
    for (name, tr) in [
        ("train", Transform::train(224)),
        ("eval", Transform::eval(256, 224)),
    ] {
        let t = Instant::now();
        for img in &imgs {
            let _ = tr.apply(img.clone(), &mut rng).expect("transforms");
        }
        let dt = t.elapsed().as_secs_f64();
        println!(
            "{name} transform only: {:.3} ms/image",
            dt * 1e3 / imgs.len() as f64
        );
    }
    for (name, tr) in [
        ("train", Transform::train(224)),
        ("eval", Transform::eval(256, 224)),
    ] {
        let st = ferrofeed_vision::DecodeTransform::new(tr);
        let t = Instant::now();
        for f in &files {
            let _ = st.run(f, &mut rng).expect("runs");
        }
        let fused = t.elapsed().as_secs_f64();
        let t = Instant::now();
        for f in &files {
            let _ = st.run_unfused(f, &mut rng).expect("runs");
        }
        let unfused = t.elapsed().as_secs_f64();
        let n = files.len() as f64;
        println!(
            "{name} decode+transform: fused {:.3} ms/image, unfused {:.3} ms/image",
            fused * 1e3 / n,
            unfused * 1e3 / n
        );
    }
    let fast = ferrofeed_vision::DecodeTransform {
        transform: Transform::train(224),
        decode: DecodeOptions {
            fast: true,
            ..Default::default()
        },
    };
    let t = Instant::now();
    for f in &files {
        let _ = fast.run(f, &mut rng).expect("runs");
    }
    println!(
        "train fused fast: {:.3} ms/image",
        t.elapsed().as_secs_f64() * 1e3 / files.len() as f64
    );
    let zune = DecodeOptions {
        backend: ferrofeed_vision::Backend::Zune,
        ..Default::default()
    };
    let t = Instant::now();
    for f in &files {
        let _ = decode(f, &zune).expect("decodes");
    }
    println!(
        "zune-jpeg decode only: {:.3} ms/image",
        t.elapsed().as_secs_f64() * 1e3 / files.len() as f64
    );
}
