//! The CUDA driver calls, loaded at run time by `cudarc`: driver errors
//! become [`CudaError`]s, including a missing library or symbol.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Arc;

use cudarc::driver::{CudaContext, CudaSlice, CudaStream, DriverError, PinnedHostSlice};

use super::CudaError;

/// Runs a driver call; cudarc panics when the library or a symbol is
/// missing, which becomes an error here.
pub(super) fn guarded<T>(f: impl FnOnce() -> Result<T, DriverError>) -> Result<T, CudaError> {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(Ok(v)) => Ok(v),
        Ok(Err(e)) => Err(driver_error(&e, 0)),
        Err(_) => Err(CudaError::Init(
            "the driver library lacks a symbol this build needs".into(),
        )),
    }
}

pub(super) fn driver_error(e: &DriverError, bytes: usize) -> CudaError {
    let message = format!("{e:?}");
    if message.contains("OUT_OF_MEMORY") {
        CudaError::OutOfMemory { bytes, message }
    } else {
        CudaError::Driver(message)
    }
}

pub(super) fn device_count() -> Result<usize, CudaError> {
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

pub(super) fn open(ordinal: usize) -> Result<Arc<CudaContext>, CudaError> {
    guarded(|| CudaContext::new(ordinal))
}

/// A page-locked host allocation and a pointer to its bytes.
pub(super) struct Pinned {
    pub slice: PinnedHostSlice<u8>,
    pub ptr: *mut u8,
}
// SAFETY: the pointer is owned by `slice`, which is Send + Sync.
unsafe impl Send for Pinned {}
unsafe impl Sync for Pinned {}

pub(super) fn alloc_pinned(ctx: &Arc<CudaContext>, bytes: usize) -> Result<Pinned, CudaError> {
    // SAFETY: the memory is uninitialised; callers write before reading
    // (collate writes every element). Flags 0: plain page-locked memory,
    // readable by the CPU at full speed (not write-combined).
    let mut slice = guarded(|| unsafe { ctx.alloc_pinned_with_flags::<u8>(bytes.max(1), 0) })?;
    let ptr = guarded(|| slice.as_mut_ptr())?;
    Ok(Pinned { slice, ptr })
}

pub(super) struct Copier {
    pub stream: Arc<CudaStream>,
}

impl Copier {
    pub(super) fn new(ordinal: usize) -> Result<Copier, CudaError> {
        let ctx = open(ordinal)?;
        let stream = guarded(|| ctx.new_stream())?;
        Ok(Copier { stream })
    }
    pub(super) fn htod(&self, bytes: &[u8]) -> Result<CudaSlice<u8>, CudaError> {
        match catch_unwind(AssertUnwindSafe(|| self.stream.clone_htod(bytes))) {
            Ok(Ok(d)) => Ok(d),
            Ok(Err(e)) => Err(driver_error(&e, bytes.len())),
            Err(_) => Err(CudaError::Driver(
                "the copy panicked in the driver bindings".into(),
            )),
        }
    }
    pub(super) fn synchronize(&self) -> Result<(), CudaError> {
        guarded(|| self.stream.synchronize())
    }
    pub(super) fn dtoh(&self, d: &CudaSlice<u8>) -> Result<Vec<u8>, CudaError> {
        guarded(|| self.stream.clone_dtoh(d))
    }
}
