//! The pinned pool: recycled page-locked batch buffers for collate, with
//! host memory as the fallback.

use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use ferrofeed_core::sync::LockExt;
use ferrofeed_core::{BufferSource, HostBuffer};

#[cfg(feature = "cuda")]
use super::cuda;
use super::{device_count, local_device, CudaError};

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
