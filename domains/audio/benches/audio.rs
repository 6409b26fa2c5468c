//! Audio-seconds per second of each step on one thread: log-mel of a 10 s
//! chunk, decoding 16 kHz WAV and 44.1 kHz FLAC, resampling 44.1 → 16 kHz,
//! and the whole stream (decode + resample + chunk) of a file.
//!
//! `cargo bench -p ferrofeed-audio --bench audio`
use std::time::Duration;

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use ferrofeed_audio::synth::{signal, write_flac, write_wav};
use ferrofeed_audio::*;
use ferrofeed_audio::{ChunkStream, StreamResampler};

fn bench(c: &mut Criterion) {
    let dir = tempfile::tempdir().expect("temp dir");
    let mut rng = ferrofeed_core::rng::sample_rng(1);
    let x16 = signal("mix", 16000 * 10, 16000, &mut rng);
    let x44 = signal("mix", 44100 * 10, 44100, &mut rng);
    let wav = dir.path().join("a.wav");
    let flac = dir.path().join("b.flac");
    write_wav(&wav, std::slice::from_ref(&x16), 16000, false).expect("wav");
    write_flac(&flac, std::slice::from_ref(&x44), 44100).expect("flac");

    let mut g = c.benchmark_group("audio");
    g.sample_size(20)
        .measurement_time(Duration::from_secs(4))
        // Elements = seconds of audio, so "elem/s" reads as audio-s/s.
        .throughput(Throughput::Elements(10));
    let fx = FeatureExtractor::new(FeatureConfig::default()).expect("plan");
    for (name, kind) in [
        ("spectrogram_10s", FeatureKind::Spectrogram),
        ("mel_10s", FeatureKind::Mel),
        ("logmel_10s", FeatureKind::LogMel),
    ] {
        g.bench_function(name, |b| b.iter(|| fx.compute(&x16, kind)));
    }
    g.bench_function("resample_44k_to_16k_10s", |b| {
        b.iter(|| {
            let mut r = StreamResampler::new(44100, 16000).expect("resampler");
            let mut out = Vec::new();
            for p in x44.chunks(4096) {
                r.push(p, &mut out).expect("push");
            }
            r.finish(&mut out).expect("finish");
            out.len()
        })
    });
    let stream = |path: &std::path::Path| {
        ChunkStream::open(path, &StreamOptions::default())
            .expect("open")
            .map(|c| c.expect("chunk").valid)
            .sum::<usize>()
    };
    g.bench_function("stream_wav16k_10s", |b| b.iter(|| stream(&wav)));
    g.bench_function("stream_flac44k_to_16k_10s", |b| b.iter(|| stream(&flac)));
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
