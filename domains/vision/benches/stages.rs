//! Per-stage costs of the vision pack on synthetic ~500×375 q90 JPEGs:
//! decode (libjpeg-turbo and zune-jpeg), fused decode + RandomResizedCrop,
//! the antialiased resize alone (ours, and `fast_image_resize` on the same
//! crop for comparison), and collate of a batch of 64.
//!
//! `cargo bench -p ferrofeed-vision --bench stages`
use std::hint::black_box;

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use ferrofeed_core::rng::sample_rng;
use ferrofeed_core::BatchRows;
use ferrofeed_core::{Collate, Table};
use ferrofeed_stages::Label;
use ferrofeed_vision::{
    decode, resize_crop, synth, Backend, DecodeOptions, DecodeTransform, Transform,
};

fn bench(c: &mut Criterion) {
    let jpegs: Vec<Vec<u8>> = (0..16)
        .map(|i| synth::jpeg(0, i, 90).expect("encodes"))
        .collect();
    let mut g = c.benchmark_group("vision");
    g.sample_size(20);
    g.measurement_time(std::time::Duration::from_secs(3));
    g.throughput(Throughput::Elements(jpegs.len() as u64));
    for (name, backend) in [
        ("decode_libjpeg", Backend::Auto),
        ("decode_zune", Backend::Zune),
    ] {
        let o = DecodeOptions {
            backend,
            ..Default::default()
        };
        g.bench_function(name, |b| {
            b.iter(|| {
                for j in &jpegs {
                    black_box(decode(j, &o).expect("decodes"));
                }
            })
        });
    }
    let train = DecodeTransform {
        seek: None,
        ..DecodeTransform::new(Transform::train(224))
    };
    // Through the scan index: a fresh one each iteration (a first epoch,
    // which fills it), and one filled beforehand (later epochs).
    g.bench_function("fused_decode_rrc224_index_first_epoch", |b| {
        let mut rng = sample_rng(1);
        b.iter(|| {
            let stage = DecodeTransform::new(Transform::train(224));
            for (i, j) in jpegs.iter().enumerate() {
                black_box(stage.run_keyed(j, Some(i as u64), &mut rng).expect("runs"));
            }
        })
    });
    g.bench_function("fused_decode_rrc224_index_later_epochs", |b| {
        let mut rng = sample_rng(1);
        let stage = DecodeTransform::new(Transform::train(224));
        for _ in 0..8 {
            for (i, j) in jpegs.iter().enumerate() {
                stage.run_keyed(j, Some(i as u64), &mut rng).expect("runs");
            }
        }
        b.iter(|| {
            for (i, j) in jpegs.iter().enumerate() {
                black_box(stage.run_keyed(j, Some(i as u64), &mut rng).expect("runs"));
            }
        })
    });
    g.bench_function("fused_decode_rrc224", |b| {
        let mut rng = sample_rng(1);
        b.iter(|| {
            for j in &jpegs {
                black_box(train.run(j, &mut rng).expect("runs"));
            }
        })
    });
    g.bench_function("unfused_decode_rrc224", |b| {
        let mut rng = sample_rng(1);
        b.iter(|| {
            for j in &jpegs {
                black_box(train.run_unfused(j, &mut rng).expect("runs"));
            }
        })
    });
    let images: Vec<_> = jpegs
        .iter()
        .map(|j| decode(j, &DecodeOptions::default()).expect("decodes"))
        .collect();
    g.bench_function("resize_300_crop_to_224", |b| {
        b.iter(|| {
            for img in &images {
                black_box(resize_crop(img, (20.0, 5.0, 300.0, 300.0), 224, 224).expect("resizes"));
            }
        })
    });
    g.bench_function("resize_300_crop_to_224_fast_image_resize", |b| {
        use fast_image_resize as fir;
        let mut resizer = fir::Resizer::new();
        let opts = fir::ResizeOptions::new()
            .resize_alg(fir::ResizeAlg::Convolution(fir::FilterType::Bilinear))
            .crop(20.0, 5.0, 300.0, 300.0);
        b.iter(|| {
            for img in &images {
                let src = fir::images::ImageRef::new(
                    img.width,
                    img.height,
                    &img.data,
                    fir::PixelType::U8x3,
                )
                .expect("a valid image");
                let mut dst = fir::images::Image::new(224, 224, fir::PixelType::U8x3);
                resizer.resize(&src, &mut dst, &opts).expect("resizes");
                black_box(dst);
            }
        })
    });
    g.throughput(Throughput::Elements(64));
    let mut rng = sample_rng(2);
    let crops: Vec<_> = (0..64)
        .map(|i| {
            Transform::train(224)
                .apply_ref(&images[i % images.len()], &mut rng)
                .expect("transforms")
        })
        .collect();
    let mut table = Table::with_indices((0..64).collect());
    table.insert_column(crops);
    table.insert_column((0..64).map(Label).collect::<Vec<_>>());
    let collate = ferrofeed_vision::collate();
    g.bench_function("collate_64x3x224x224", |b| {
        b.iter(|| {
            black_box(
                collate
                    .collate(&BatchRows::new(&table, 0..64))
                    .expect("collates"),
            )
        })
    });
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
