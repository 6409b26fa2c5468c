//! Pin and transfer: page-locked batch buffers from a recycling pool, and
//! host-to-device copies with `cudarc`, whose driver library is loaded at
//! run time — so everything here builds and runs on machines with no CUDA
//! toolkit or driver, where pinning falls back to host memory (or, when
//! demanded strictly, reports "no CUDA device").
//!
//! - [`PinnedPool`] is a [`BufferSource`] for collate: batches are written
//!   straight into a fixed number of recycled page-locked buffers, which go
//!   back to the pool when the batch is dropped.
//! - [`Transfer`] is a [`BatchStage`]: in the worker that built the batch, it
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
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use ferrofeed_core::sync::LockExt;
use ferrofeed_core::{Batch, BatchStage, BoxError, BufferSource, HostBuffer};

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

#[cfg(feature = "cuda")]
mod cuda {
    use std::panic::{catch_unwind, AssertUnwindSafe};
    use std::sync::Arc;

    use cudarc::driver::{CudaContext, CudaSlice, CudaStream, DriverError, PinnedHostSlice};

    use super::CudaError;

    /// Runs a driver call; cudarc panics when the library or a symbol is
    /// missing, which becomes an error here.
    pub fn guarded<T>(f: impl FnOnce() -> Result<T, DriverError>) -> Result<T, CudaError> {
        match catch_unwind(AssertUnwindSafe(f)) {
            Ok(Ok(v)) => Ok(v),
            Ok(Err(e)) => Err(driver_error(&e, 0)),
            Err(_) => Err(CudaError::Init(
                "the driver library lacks a symbol this build needs".into(),
            )),
        }
    }

    pub fn driver_error(e: &DriverError, bytes: usize) -> CudaError {
        let message = format!("{e:?}");
        if message.contains("OUT_OF_MEMORY") {
            CudaError::OutOfMemory { bytes, message }
        } else {
            CudaError::Driver(message)
        }
    }

    pub fn device_count() -> Result<usize, CudaError> {
        // SAFETY: only probes whether the library can be loaded.
        if !unsafe { cudarc::driver::sys::is_culib_present() } {
            return Err(CudaError::NoDriver);
        }
        let n = guarded(CudaContext::device_count).map_err(|e| match e {
            CudaError::Driver(m) => CudaError::Init(m),
            other => other,
        })?;
        if n <= 0 {
            return Err(CudaError::NoDevice);
        }
        Ok(n as usize)
    }

    pub fn open(ordinal: usize) -> Result<Arc<CudaContext>, CudaError> {
        guarded(|| CudaContext::new(ordinal))
    }

    /// A page-locked host allocation and a pointer to its bytes.
    pub struct Pinned {
        pub slice: PinnedHostSlice<u8>,
        pub ptr: *mut u8,
    }
    // SAFETY: the pointer is owned by `slice`, which is Send + Sync.
    unsafe impl Send for Pinned {}
    unsafe impl Sync for Pinned {}

    pub fn alloc_pinned(ctx: &Arc<CudaContext>, bytes: usize) -> Result<Pinned, CudaError> {
        // SAFETY: the memory is uninitialised; callers write before reading
        // (collate writes every element). Flags 0: plain page-locked memory,
        // readable by the CPU at full speed (not write-combined).
        let mut slice = guarded(|| unsafe { ctx.alloc_pinned_with_flags::<u8>(bytes.max(1), 0) })?;
        let ptr = guarded(|| slice.as_mut_ptr())?;
        Ok(Pinned { slice, ptr })
    }

    pub struct Copier {
        pub stream: Arc<CudaStream>,
    }

    impl Copier {
        pub fn new(ordinal: usize) -> Result<Copier, CudaError> {
            let ctx = open(ordinal)?;
            let stream = guarded(|| ctx.new_stream())?;
            Ok(Copier { stream })
        }
        pub fn htod(&self, bytes: &[u8]) -> Result<CudaSlice<u8>, CudaError> {
            match catch_unwind(AssertUnwindSafe(|| self.stream.clone_htod(bytes))) {
                Ok(Ok(d)) => Ok(d),
                Ok(Err(e)) => Err(driver_error(&e, bytes.len())),
                Err(_) => Err(CudaError::Driver(
                    "the copy panicked in the driver bindings".into(),
                )),
            }
        }
        pub fn synchronize(&self) -> Result<(), CudaError> {
            guarded(|| self.stream.synchronize())
        }
        pub fn dtoh(&self, d: &CudaSlice<u8>) -> Result<Vec<u8>, CudaError> {
            guarded(|| self.stream.clone_dtoh(d))
        }
    }
}

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

/// How hard to insist on page-locked memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PinMode {
    /// Ordinary host memory (still recycled).
    Off,
    /// Page-locked when a CUDA device is there; otherwise host memory, with
    /// one log line saying so.
    Auto,
    /// Page-locked or an error.
    Strict,
}

enum Block {
    #[cfg(feature = "cuda")]
    Pinned(cuda::Pinned),
    Host(Vec<u64>),
}

impl Block {
    fn capacity(&self) -> usize {
        match self {
            #[cfg(feature = "cuda")]
            Block::Pinned(p) => p.slice.len(),
            Block::Host(v) => v.len() * 8,
        }
    }
}

struct PoolState {
    free: Vec<Block>,
    /// Buffers that exist (free or lent).
    allocated: usize,
    lent: usize,
    high_water: usize,
    fallbacks: u64,
}

struct PoolShared {
    #[cfg(feature = "cuda")]
    ctx: Option<Arc<cudarc::driver::CudaContext>>,
    max_buffers: usize,
    wait: Duration,
    state: Mutex<PoolState>,
    returned: Condvar,
}

/// A fixed number of recycled batch buffers, page-locked when CUDA is there.
/// A buffer is lent to one tensor and comes back only when that tensor (its
/// batch) is dropped. When every buffer is lent for longer than a short
/// wait, the tensor gets ordinary, unpooled memory instead (counted in
/// [`fallbacks`](Self::fallbacks)) — never more page-locked memory than the
/// bound, and never a deadlock with a consumer that holds batches.
#[derive(Clone)]
pub struct PinnedPool {
    shared: Arc<PoolShared>,
    reason: Option<String>,
}

impl std::fmt::Debug for PinnedPool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PinnedPool")
            .field("pinned", &self.is_pinned())
            .field("max_buffers", &self.shared.max_buffers)
            .finish()
    }
}

impl PinnedPool {
    /// A pool of at most `max_buffers` buffers (see [`PinMode`]); the
    /// device is the one `LOCAL_RANK` selects.
    pub fn new(mode: PinMode, max_buffers: usize) -> Result<PinnedPool, CudaError> {
        let device = match mode {
            PinMode::Off => Err(None),
            PinMode::Auto | PinMode::Strict => device_count()
                .and_then(|n| local_device(std::env::var("LOCAL_RANK").ok().as_deref(), n))
                .map_err(Some),
        };
        match device {
            Ok(ordinal) => Self::on_device(ordinal, max_buffers),
            Err(Some(e)) if mode == PinMode::Strict => Err(e),
            Err(e) => {
                let reason = e.map(|e| {
                    let line = format!("{e}: pin falls back to host memory");
                    let line = if line.starts_with("no CUDA device") {
                        line
                    } else {
                        format!("no CUDA device ({line})")
                    };
                    tracing::warn!("{line}");
                    line
                });
                Ok(PinnedPool {
                    shared: Arc::new(Self::shared_state(max_buffers)),
                    reason,
                })
            }
        }
    }

    /// The pool's state, with no device (host memory) until one is set.
    fn shared_state(max_buffers: usize) -> PoolShared {
        PoolShared {
            #[cfg(feature = "cuda")]
            ctx: None,
            max_buffers: max_buffers.max(1),
            wait: Duration::from_millis(50),
            state: Mutex::new(PoolState {
                free: Vec::new(),
                allocated: 0,
                lent: 0,
                high_water: 0,
                fallbacks: 0,
            }),
            returned: Condvar::new(),
        }
    }

    /// A page-locked pool on device `ordinal`.
    pub fn on_device(ordinal: usize, max_buffers: usize) -> Result<PinnedPool, CudaError> {
        #[cfg(feature = "cuda")]
        {
            let mut shared = Self::shared_state(max_buffers);
            shared.ctx = Some(cuda::open(ordinal)?);
            Ok(PinnedPool {
                shared: Arc::new(shared),
                reason: None,
            })
        }
        #[cfg(not(feature = "cuda"))]
        {
            let _ = (ordinal, max_buffers);
            Err(CudaError::NotBuilt)
        }
    }

    /// Whether buffers are page-locked.
    pub fn is_pinned(&self) -> bool {
        #[cfg(feature = "cuda")]
        {
            self.shared.ctx.is_some()
        }
        #[cfg(not(feature = "cuda"))]
        {
            false
        }
    }
    /// Why the pool fell back to host memory (`Auto` without a device).
    pub fn fallback_reason(&self) -> Option<&str> {
        self.reason.as_deref()
    }
    fn state(&self) -> std::sync::MutexGuard<'_, PoolState> {
        self.shared.state.lock_unpoisoned()
    }
    /// Buffers that exist (never more than `max_buffers`).
    pub fn allocated(&self) -> usize {
        self.state().allocated
    }
    /// Buffers lent to live tensors now.
    pub fn lent(&self) -> usize {
        self.state().lent
    }
    /// Most buffers lent at once.
    pub fn high_water(&self) -> usize {
        self.state().high_water
    }
    /// Tensors that got ordinary memory because every buffer was lent.
    pub fn fallbacks(&self) -> u64 {
        self.state().fallbacks
    }

    fn alloc(&self, bytes: usize) -> Result<Block, CudaError> {
        #[cfg(feature = "cuda")]
        if let Some(ctx) = &self.shared.ctx {
            return cuda::alloc_pinned(ctx, bytes).map(Block::Pinned);
        }
        Ok(Block::Host(vec![0u64; bytes.div_ceil(8)]))
    }
}

/// A buffer lent by a [`PinnedPool`]; returns on drop.
struct Lent {
    block: Option<Block>,
    pinned: bool,
    shared: Arc<PoolShared>,
}

impl HostBuffer for Lent {
    fn as_bytes(&self) -> &[u8] {
        match &self.block {
            #[cfg(feature = "cuda")]
            // SAFETY: `ptr` points at the block's `len` page-locked bytes,
            // which live as long as the block; no copy reads them while a
            // `&mut` is out (the transfer reads the finished batch).
            Some(Block::Pinned(p)) => unsafe { std::slice::from_raw_parts(p.ptr, p.slice.len()) },
            Some(Block::Host(v)) => bytemuck_bytes(v),
            None => &[],
        }
    }
    fn as_bytes_mut(&mut self) -> &mut [u8] {
        match &mut self.block {
            #[cfg(feature = "cuda")]
            // SAFETY: as above, and `&mut self` makes this the only view.
            Some(Block::Pinned(p)) => unsafe {
                std::slice::from_raw_parts_mut(p.ptr, p.slice.len())
            },
            Some(Block::Host(v)) => bytemuck_bytes_mut(v),
            None => &mut [],
        }
    }
    fn is_pinned(&self) -> bool {
        self.pinned
    }
}

fn bytemuck_bytes(v: &[u64]) -> &[u8] {
    // SAFETY: u64 has no padding and any byte pattern is a valid u8.
    unsafe { std::slice::from_raw_parts(v.as_ptr().cast(), v.len() * 8) }
}
fn bytemuck_bytes_mut(v: &mut [u64]) -> &mut [u8] {
    // SAFETY: as above; the borrow is exclusive.
    unsafe { std::slice::from_raw_parts_mut(v.as_mut_ptr().cast(), v.len() * 8) }
}

impl Drop for Lent {
    fn drop(&mut self) {
        let Some(block) = self.block.take() else {
            return;
        };
        let mut st = self.shared.state.lock_unpoisoned();
        st.lent -= 1;
        st.free.push(block);
        self.shared.returned.notify_one();
    }
}

/// Unpooled memory for when every pooled buffer is lent.
struct Overflow(Vec<u64>);

impl HostBuffer for Overflow {
    fn as_bytes(&self) -> &[u8] {
        bytemuck_bytes(&self.0)
    }
    fn as_bytes_mut(&mut self) -> &mut [u8] {
        bytemuck_bytes_mut(&mut self.0)
    }
}

/// Tensors smaller than this (labels, lengths…) take ordinary memory: pinning
/// them gains nothing and they would tie up the pool's large buffers.
pub const SMALL_TENSOR: usize = 64 << 10;

impl BufferSource for PinnedPool {
    fn take(&self, bytes: usize) -> Box<dyn HostBuffer> {
        if bytes < SMALL_TENSOR {
            return Box::new(Overflow(vec![0u64; bytes.div_ceil(8)]));
        }
        let deadline = Instant::now() + self.shared.wait;
        let mut st = self.state();
        loop {
            // The smallest free buffer that is large enough.
            let fit = st
                .free
                .iter()
                .enumerate()
                .filter(|(_, b)| b.capacity() >= bytes)
                .min_by_key(|(_, b)| b.capacity())
                .map(|(i, _)| i);
            let block = if let Some(i) = fit {
                Some(st.free.swap_remove(i))
            } else if st.allocated < self.shared.max_buffers || !st.free.is_empty() {
                // Grow the pool, or replace a free buffer that is too small.
                if st.allocated >= self.shared.max_buffers {
                    st.free.pop();
                    st.allocated -= 1;
                }
                match self.alloc(bytes) {
                    Ok(b) => {
                        st.allocated += 1;
                        Some(b)
                    }
                    Err(e) => {
                        tracing::warn!(
                            "pinned allocation of {bytes} bytes failed ({e}): using host memory"
                        );
                        None
                    }
                }
            } else {
                let now = Instant::now();
                if now < deadline {
                    st = match self.shared.returned.wait_timeout(st, deadline - now) {
                        Ok((g, _)) => g,
                        Err(e) => e.into_inner().0,
                    };
                    continue;
                }
                None
            };
            return match block {
                Some(block) => {
                    st.lent += 1;
                    st.high_water = st.high_water.max(st.lent);
                    Box::new(Lent {
                        pinned: self.is_pinned(),
                        block: Some(block),
                        shared: Arc::clone(&self.shared),
                    })
                }
                None => {
                    st.fallbacks += 1;
                    Box::new(Overflow(vec![0u64; bytes.div_ceil(8)]))
                }
            };
        }
    }
}

/// How hard to insist on copying batches to a device.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TransferMode {
    /// Keep batches on the host.
    Off,
    /// Copy to the `LOCAL_RANK` device when there is one, else keep batches
    /// on the host (one log line says so).
    Auto,
    /// Copy or fail.
    Strict,
}

/// The device copies of a batch's columns, attached to the batch by
/// [`Transfer`]. The copies are complete when the batch arrives.
pub struct DeviceColumns {
    /// Device ordinal.
    pub device: usize,
    #[cfg(feature = "cuda")]
    columns: Vec<(String, cudarc::driver::CudaSlice<u8>)>,
    #[cfg(feature = "cuda")]
    copier: Arc<cuda::Copier>,
}

impl DeviceColumns {
    /// Names of the columns on the device.
    pub fn names(&self) -> Vec<&str> {
        #[cfg(feature = "cuda")]
        {
            self.columns.iter().map(|(n, _)| n.as_str()).collect()
        }
        #[cfg(not(feature = "cuda"))]
        {
            Vec::new()
        }
    }
    /// The device buffer of column `name`.
    #[cfg(feature = "cuda")]
    pub fn get(&self, name: &str) -> Option<&cudarc::driver::CudaSlice<u8>> {
        self.columns.iter().find(|(n, _)| n == name).map(|(_, d)| d)
    }
    /// Copies column `name` back to the host (for checks).
    pub fn to_host(&self, name: &str) -> Result<Vec<u8>, CudaError> {
        #[cfg(feature = "cuda")]
        {
            let d = self
                .get(name)
                .ok_or_else(|| CudaError::Driver(format!("no column `{name}` on the device")))?;
            self.copier.dtoh(d)
        }
        #[cfg(not(feature = "cuda"))]
        {
            let _ = name;
            Err(CudaError::NotBuilt)
        }
    }
}

/// Copies every column of each batch to the device, in the worker that
/// built it, on a stream of its own.
pub struct Transfer {
    #[cfg(feature = "cuda")]
    copier: Option<Arc<cuda::Copier>>,
    device: Option<usize>,
    reason: Option<String>,
}

impl Transfer {
    /// A transfer to the `LOCAL_RANK` device (see [`TransferMode`]).
    pub fn new(mode: TransferMode) -> Result<Transfer, CudaError> {
        let none = |reason: Option<String>| Transfer {
            #[cfg(feature = "cuda")]
            copier: None,
            device: None,
            reason,
        };
        if mode == TransferMode::Off {
            return Ok(none(None));
        }
        let device = device_count()
            .and_then(|n| local_device(std::env::var("LOCAL_RANK").ok().as_deref(), n));
        match device {
            Ok(ordinal) => Self::to_device(ordinal),
            Err(e) if mode == TransferMode::Strict => Err(e),
            Err(e) => {
                let line = format!("{e}: batches stay in host memory");
                tracing::warn!("{line}");
                Ok(none(Some(line)))
            }
        }
    }

    /// A transfer to device `ordinal`.
    pub fn to_device(ordinal: usize) -> Result<Transfer, CudaError> {
        #[cfg(feature = "cuda")]
        {
            Ok(Transfer {
                copier: Some(Arc::new(cuda::Copier::new(ordinal)?)),
                device: Some(ordinal),
                reason: None,
            })
        }
        #[cfg(not(feature = "cuda"))]
        {
            let _ = ordinal;
            Err(CudaError::NotBuilt)
        }
    }

    /// The device batches go to, if any.
    pub fn device(&self) -> Option<usize> {
        self.device
    }
    /// Why batches stay on the host (`Auto` without a device).
    pub fn fallback_reason(&self) -> Option<&str> {
        self.reason.as_deref()
    }
}

impl BatchStage for Transfer {
    fn process(&self, batch: &mut Batch) -> Result<(), BoxError> {
        #[cfg(feature = "cuda")]
        if let (Some(copier), Some(device)) = (&self.copier, self.device) {
            let mut columns = Vec::new();
            for (name, t) in batch.columns() {
                columns.push((name.to_string(), copier.htod(t.as_bytes())?));
            }
            // The consumer gets the batch with its copies finished.
            copier.synchronize()?;
            batch.attach(DeviceColumns {
                device,
                columns,
                copier: Arc::clone(copier),
            });
        }
        let _ = batch;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn local_rank_is_checked_against_the_devices() {
        assert_eq!(local_device(None, 2), Ok(0));
        assert_eq!(local_device(Some("1"), 2), Ok(1));
        assert_eq!(
            local_device(Some("3"), 2),
            Err(CudaError::RankPastDevices { rank: 3, count: 2 })
        );
        assert!(matches!(
            local_device(Some("x"), 2),
            Err(CudaError::BadLocalRank(_))
        ));
        assert_eq!(
            CudaError::RankPastDevices { rank: 3, count: 2 }.to_string(),
            "LOCAL_RANK 3 is past the 2 CUDA device(s) of this machine"
        );
    }

    #[test]
    fn buffers_are_recycled_and_never_shared_while_lent() {
        let pool = PinnedPool::new(PinMode::Off, 2).unwrap();
        const KB: usize = 1 << 10;
        let mut a = pool.take(100 * KB);
        a.as_bytes_mut()[..4].copy_from_slice(&[1, 2, 3, 4]);
        let b = pool.take(100 * KB);
        assert_ne!(
            a.as_bytes().as_ptr(),
            b.as_bytes().as_ptr(),
            "a lent buffer is not lent twice"
        );
        assert_eq!(&a.as_bytes()[..4], &[1, 2, 3, 4]);
        let pa = a.as_bytes().as_ptr();
        drop(a);
        let c = pool.take(90 * KB);
        assert_eq!(c.as_bytes().as_ptr(), pa, "a returned buffer is reused");
        assert_eq!(
            (pool.allocated(), pool.lent(), pool.high_water()),
            (2, 2, 2)
        );
        // Every buffer lent: after a short wait, unpooled memory, bound kept.
        let d = pool.take(100 * KB);
        assert_eq!(pool.fallbacks(), 1);
        assert_eq!(pool.allocated(), 2);
        drop((b, c, d));
        assert_eq!(pool.lent(), 0);
        // A request larger than any free buffer replaces one.
        let big = pool.take(1000 * KB);
        assert!(big.as_bytes().len() >= 1000 * KB);
        // Small tensors do not touch the pool.
        let small = pool.take(512);
        assert_eq!((pool.lent(), pool.fallbacks()), (1, 1));
        drop(small);
        assert_eq!(pool.allocated(), 2);
    }

    #[test]
    fn without_a_device_auto_falls_back_and_strict_refuses() {
        if device_count().is_ok() {
            return; // a CUDA machine: covered by bench/gpu_check.sh
        }
        let pool = PinnedPool::new(PinMode::Auto, 2).unwrap();
        assert!(!pool.is_pinned());
        let reason = pool.fallback_reason().unwrap();
        assert!(reason.starts_with("no CUDA device"), "{reason}");
        assert!(
            reason.ends_with("pin falls back to host memory"),
            "{reason}"
        );
        let e = PinnedPool::new(PinMode::Strict, 2).unwrap_err();
        assert!(e.to_string().starts_with("no CUDA device"), "{e}");
        let t = Transfer::new(TransferMode::Auto).unwrap();
        assert_eq!(t.device(), None);
        assert!(t
            .fallback_reason()
            .unwrap()
            .contains("batches stay in host memory"));
        assert!(Transfer::new(TransferMode::Strict).is_err());
        assert!(PinnedPool::new(PinMode::Off, 2)
            .unwrap()
            .fallback_reason()
            .is_none());
    }
}
