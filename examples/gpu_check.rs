//! The CUDA path, end to end, for a machine with a GPU (run by
//! `bench/gpu_check.sh`): host-to-device bandwidth from pageable memory,
//! from pinned memory with a raw cudarc loop, and through the pinned pool and
//! [`Transfer`] stage; then the vision pipeline to the device, every batch
//! copied back and compared with the host batch.
//!
//! `cargo run --release --example gpu_check` — exits 2 when there is no
//! CUDA device, 1 when a check fails.
use std::process::ExitCode;
use std::sync::Arc;

use ferrofeed::core::prelude::*;
use ferrofeed::stages::device::{
    device_count, local_device, measure_h2d, DeviceColumns, PinMode, PinnedPool, Transfer,
    TransferMode,
};
use ferrofeed::stages::{ImageFolder, ReadFile};
use ferrofeed::vision::{synth, DecodeTransform, Image, Transform, IMAGE_EXTENSIONS};

fn main() -> ExitCode {
    let n = match device_count() {
        Ok(n) => n,
        Err(e) => {
            eprintln!("{e}");
            return ExitCode::from(2);
        }
    };
    let ordinal = match local_device(std::env::var("LOCAL_RANK").ok().as_deref(), n) {
        Ok(o) => o,
        Err(e) => {
            eprintln!("{e}");
            return ExitCode::from(1);
        }
    };
    println!("{n} CUDA device(s); using device {ordinal}");
    let mut ok = true;
    match measure_h2d(ordinal, 64 << 20, 30) {
        Ok(bw) => {
            let best = bw.pinned_raw.max(bw.pageable_raw);
            let ratio = bw.pinned_transfer / best;
            println!("H2D 64 MiB: pageable raw {:.2} GB/s, pinned raw {:.2} GB/s, pinned pool + Transfer {:.2} GB/s ({:.0}% of the best raw)",
                bw.pageable_raw, bw.pinned_raw, bw.pinned_transfer, ratio * 100.0);
            if ratio < 0.9 {
                println!("CHECK FAILED: the Transfer path is below 90% of the raw bandwidth");
                ok = false;
            }
        }
        Err(e) => {
            println!("CHECK FAILED: bandwidth: {e}");
            ok = false;
        }
    }
    let dir = std::env::temp_dir().join("ferrofeed-gpu-check");
    if !dir.exists() {
        if let Err(e) = synth::write_dataset(&dir, 512, 0, 4) {
            eprintln!("{}: {e}", dir.display());
            return ExitCode::from(1);
        }
    }
    let folder = match ImageFolder::scan(&dir, IMAGE_EXTENSIONS) {
        Ok(f) => f,
        Err(e) => {
            eprintln!("{e}");
            return ExitCode::from(1);
        }
    };
    let (pool, transfer) = match (
        PinnedPool::new(PinMode::Strict, 8),
        Transfer::new(TransferMode::Strict),
    ) {
        (Ok(p), Ok(t)) => (p, t),
        (Err(e), _) | (_, Err(e)) => {
            println!("CHECK FAILED: {e}");
            return ExitCode::from(1);
        }
    };
    let pipeline = Pipeline::builder(folder.into_source())
        .stage("read", ReadFile::default())
        .stage("decode", DecodeTransform::new(Transform::train(224)))
        .batch_size(64)
        .shuffle(true)
        .collate(
            StackCollate::new()
                .column::<Image>("images")
                .column::<ferrofeed::stages::Label>("labels")
                .buffers(Arc::new(pool.clone())),
        )
        .batch_stage("transfer", transfer)
        .build();
    let pipeline = match pipeline {
        Ok(p) => p,
        Err(e) => {
            eprintln!("{e}");
            return ExitCode::from(1);
        }
    };
    let t = std::time::Instant::now();
    let (mut batches, mut images, mut mismatches) = (0, 0, 0);
    for b in pipeline.epoch(0) {
        let b = match b {
            Ok(b) => b,
            Err(e) => {
                println!("CHECK FAILED: {e}");
                return ExitCode::from(1);
            }
        };
        let Some(dev) = b.attached::<DeviceColumns>() else {
            println!("CHECK FAILED: batch {batches} has no device columns");
            return ExitCode::from(1);
        };
        for (name, host) in b.columns() {
            match dev.to_host(name) {
                Ok(back) if back.as_slice() == host.as_bytes() => {}
                Ok(_) => mismatches += 1,
                Err(e) => {
                    println!("CHECK FAILED: copying {name} back: {e}");
                    return ExitCode::from(1);
                }
            }
            if !host.is_pinned() && name == "images" {
                println!(
                    "note: batch {batches} used unpooled memory (every pinned buffer was lent)"
                );
            }
        }
        batches += 1;
        images += b.len();
    }
    println!(
        "vision to device: {images} images in {batches} batches, {:.0} img/s, {mismatches} column mismatches, pinned pool high water {} of 8",
        images as f64 / t.elapsed().as_secs_f64(),
        pool.high_water()
    );
    if mismatches > 0 {
        ok = false;
    }
    if ok {
        println!("GPU CHECK PASSED");
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    }
}
