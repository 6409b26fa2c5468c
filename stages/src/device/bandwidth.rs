//! Host-to-device bandwidth: raw pageable and pinned copies, and the
//! transfer stage from a pinned pool.

use super::CudaError;
#[cfg(feature = "cuda")]
use super::{cuda, PinnedPool, Transfer};
#[cfg(feature = "cuda")]
use ferrofeed_core::{Batch, BatchStage};
#[cfg(feature = "cuda")]
use std::time::Instant;

/// Host-to-device bandwidth on one device, GB/s, for one buffer size.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct H2dBandwidth {
    /// Raw cudarc copies from pageable (ordinary) memory.
    pub pageable_raw: f64,
    /// Raw cudarc copies from page-locked memory, queued back to back.
    pub pinned_raw: f64,
    /// [`Transfer`] copying a batch whose column lives in a [`PinnedPool`]
    /// buffer.
    pub pinned_transfer: f64,
}

/// Measures [`H2dBandwidth`] on device `ordinal` with `iters` copies of
/// `bytes` bytes each.
pub fn measure_h2d(ordinal: usize, bytes: usize, iters: usize) -> Result<H2dBandwidth, CudaError> {
    #[cfg(feature = "cuda")]
    {
        use cudarc::driver::CudaSlice;
        let gbps = |secs: f64| (bytes * iters) as f64 / secs / 1e9;
        let copier = cuda::Copier::new(ordinal)?;
        let ctx = copier.stream.context().clone();
        let stream = &copier.stream;
        let mut dev: CudaSlice<u8> = cuda::guarded(|| unsafe { stream.alloc::<u8>(bytes) })?;
        let pageable = vec![1u8; bytes];
        let t = Instant::now();
        for _ in 0..iters {
            cuda::guarded(|| stream.memcpy_htod(&pageable, &mut dev))?;
        }
        copier.synchronize()?;
        let pageable_raw = gbps(t.elapsed().as_secs_f64());
        let pinned = cuda::alloc_pinned(&ctx, bytes)?;
        let t = Instant::now();
        for _ in 0..iters {
            cuda::guarded(|| stream.memcpy_htod(&pinned.slice, &mut dev))?;
        }
        copier.synchronize()?;
        let pinned_raw = gbps(t.elapsed().as_secs_f64());
        let pool = PinnedPool::on_device(ordinal, 2)?;
        let transfer = Transfer::to_device(ordinal)?;
        let mut batch = Batch::new(vec![0]);
        batch.insert(
            "data",
            ferrofeed_core::Tensor::uninit_from(&pool, ferrofeed_core::DType::U8, &[bytes]),
        );
        let t = Instant::now();
        for _ in 0..iters {
            transfer
                .process(&mut batch)
                .map_err(|e| CudaError::Driver(e.to_string()))?;
        }
        let pinned_transfer = gbps(t.elapsed().as_secs_f64());
        Ok(H2dBandwidth {
            pageable_raw,
            pinned_raw,
            pinned_transfer,
        })
    }
    #[cfg(not(feature = "cuda"))]
    {
        let _ = (ordinal, bytes, iters);
        Err(CudaError::NotBuilt)
    }
}
