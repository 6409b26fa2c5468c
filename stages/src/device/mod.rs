//! Pin and transfer: page-locked batch buffers from a recycling pool, and
//! host-to-device copies with `cudarc`, whose driver library is loaded at
//! run time — so everything here builds and runs on machines with no CUDA
//! toolkit or driver, where pinning falls back to host memory (or, when
//! demanded strictly, reports "no CUDA device").
//!
//! - [`PinnedPool`] is a [`BufferSource`](ferrofeed_core::BufferSource) for collate: batches are written
//!   straight into a fixed number of recycled page-locked buffers, which go
//!   back to the pool when the batch is dropped.
//! - [`Transfer`] is a [`BatchStage`](ferrofeed_core::BatchStage): in the worker that built the batch, it
//!   copies every column to the device selected by `LOCAL_RANK` on its own
//!   stream, so the copy of batch k+1 overlaps the consumer's use of batch k;
//!   the batch then carries [`DeviceColumns`].
//!
//! ```
//! use ferrofeed_stages::device::{PinMode, PinnedPool};
//! // On a machine without CUDA, Auto falls back to host memory; Strict refuses.
//! let pool = PinnedPool::new(PinMode::Auto, 4).unwrap();
//! if !pool.is_pinned() {
//!     assert!(pool.fallback_reason().unwrap().starts_with("no CUDA device"));
//!     assert!(PinnedPool::new(PinMode::Strict, 4).is_err());
//! }
//! ```
//!
//! The rooms: the driver calls (`cuda.rs`, built with the `cuda` feature),
//! the pinned pool (`pinned.rs`), the transfer stage (`transfer.rs`) and
//! the bandwidth probe (`bandwidth.rs`).

mod bandwidth;
#[cfg(feature = "cuda")]
mod cuda;
mod pinned;
#[cfg(test)]
mod tests;
mod transfer;

pub use bandwidth::{measure_h2d, H2dBandwidth};
pub use pinned::{PinMode, PinnedPool, SMALL_TENSOR};
pub use transfer::{DeviceColumns, Transfer, TransferMode};

/// Why CUDA cannot be used, or a CUDA operation failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CudaError {
    /// The driver library (libcuda) is not on this machine.
    #[error("no CUDA device: the CUDA driver library is not installed")]
    NoDriver,
    /// The driver is there but reports no device.
    #[error("no CUDA device: the driver reports none")]
    NoDevice,
    /// The driver failed to start.
    #[error("no CUDA device: the driver failed to start: {0}")]
    Init(String),
    /// `LOCAL_RANK` names a device that does not exist.
    #[error("LOCAL_RANK {rank} is past the {count} CUDA device(s) of this machine")]
    RankPastDevices {
        /// The local rank.
        rank: usize,
        /// Devices present.
        count: usize,
    },
    /// `LOCAL_RANK` is not a number.
    #[error("LOCAL_RANK={0:?} is not a whole number")]
    BadLocalRank(String),
    /// This binary was built without the `cuda` feature.
    #[error("no CUDA device: built without the `cuda` feature")]
    NotBuilt,
    /// The device ran out of memory.
    #[error("out of device memory copying a batch of {bytes} bytes: {message}")]
    OutOfMemory {
        /// Bytes the batch needed.
        bytes: usize,
        /// The driver's message.
        message: String,
    },
    /// Another driver error.
    #[error("CUDA error: {0}")]
    Driver(String),
}

/// The device for this process: `LOCAL_RANK` (default 0), checked against
/// `count` devices.
pub fn local_device(local_rank: Option<&str>, count: usize) -> Result<usize, CudaError> {
    let rank = match local_rank {
        None => 0,
        Some(v) => v
            .trim()
            .parse::<usize>()
            .map_err(|_| CudaError::BadLocalRank(v.to_string()))?,
    };
    if rank >= count {
        return Err(CudaError::RankPastDevices { rank, count });
    }
    Ok(rank)
}

/// Number of CUDA devices, or why there are none.
pub fn device_count() -> Result<usize, CudaError> {
    #[cfg(feature = "cuda")]
    {
        cuda::device_count()
    }
    #[cfg(not(feature = "cuda"))]
    {
        Err(CudaError::NotBuilt)
    }
}
