//! Log-mel of a 10 s, 16 kHz signal, `N` times (default 20) — one path, so
//! `valgrind --tool=callgrind` can count its instructions (stable where
//! wall time is not).
//!
//! `cargo run --release -p ferrofeed-audio --example features_speed -- [N]`
use ferrofeed_audio::{FeatureConfig, FeatureExtractor, FeatureKind};

fn main() {
    let n: usize = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(20);
    let fx = FeatureExtractor::new(FeatureConfig::default()).expect("default config");
    let x: Vec<f32> = (0..160_000)
        .map(|i| ((i as f32) * 0.031).sin() * 0.5 + ((i * 7919 % 1013) as f32 / 1013.0 - 0.5) * 0.1)
        .collect();
    let t = std::time::Instant::now();
    let mut sum = 0f64;
    for _ in 0..n {
        let f = fx.compute(&x, FeatureKind::LogMel);
        sum += f64::from(f.data[f.data.len() / 2]);
    }
    let dt = t.elapsed().as_secs_f64() / n as f64;
    println!("{:.3} ms per 10 s log-mel (check {sum:.3})", dt * 1e3);
}
