//! The `ferrofeed._ferrofeed` extension module: ferrofeed's domain jobs as
//! Python loaders. The keywords go straight into each domain's typed
//! settings ([`ferrofeed_jobs::keywords`]); an epoch runs on a driver
//! thread that hands batches over a one-slot channel, so the interpreter
//! waits for a batch with the GIL released and still sees Ctrl-C.
//!
//! ```text
//! Loader(domain, path, options) ─ __iter__ → driver thread: pipeline.epoch(e) ─▶ (batch, state) ─▶ __next__
//! ```
mod array;
mod compose;
mod dropin;
mod loader;

use pyo3::prelude::*;

// Workers allocate and free image-sized buffers at a high rate on different
// threads; mimalloc's thread-local free lists keep that off glibc's locks
// (the command uses it for the same reason). Only the extension's own Rust
// allocations go through it.
#[global_allocator]
static ALLOC: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// mimalloc's `mi_option_purge_delay` (the same index in its v2 and v3).
const MI_OPTION_PURGE_DELAY: libmimalloc_sys::mi_option_t = 15;
/// mimalloc v3's `mi_option_allow_thp`.
const MI_OPTION_ALLOW_THP: libmimalloc_sys::mi_option_t = 43;

/// `MADV_NOHUGEPAGE` on the mapping that holds `addr` (the allocator's
/// arena). Best effort: without `/proc` or on an old kernel nothing changes.
fn no_huge_pages_under(addr: usize) {
    let Ok(maps) = std::fs::read_to_string("/proc/self/maps") else {
        return;
    };
    for line in maps.lines() {
        let Some((range, _)) = line.split_once(' ') else {
            continue;
        };
        let Some((lo, hi)) = range.split_once('-') else {
            continue;
        };
        let (Ok(lo), Ok(hi)) = (usize::from_str_radix(lo, 16), usize::from_str_radix(hi, 16))
        else {
            continue;
        };
        if (lo..hi).contains(&addr) {
            // SAFETY: advice on a whole mapping of this process; it changes
            // how the kernel backs the pages, never their contents.
            unsafe { libc::madvise(lo as *mut libc::c_void, hi - lo, libc::MADV_NOHUGEPAGE) };
            return;
        }
    }
}

#[pymodule]
fn _ferrofeed(m: &Bound<'_, PyModule>) -> PyResult<()> {
    // Freed pages stay with the allocator instead of going back to the
    // kernel after 10 ms, so the next batch's buffers reuse them rather than
    // faulting in fresh zeroed pages (as the command does; memory stays
    // bounded by the byte budget).
    // SAFETY: sets a plain option; called once, at import.
    unsafe { libmimalloc_sys::mi_option_set(MI_OPTION_PURGE_DELAY, -1) };
    // No transparent huge pages under the allocator's memory: the first
    // touch of a huge page zeroes all 2 MiB of it, and a loader's first
    // epoch ran ~20% slower for it. The command disables THP for its whole
    // process; here only the extension's own memory is affected, not the
    // interpreter's or torch's. The allocator is initialised by now (the
    // probe at the latest), so the option does not turn THP off for the
    // process; it keeps later arenas from being advised, and the arena
    // already reserved (advised MADV_HUGEPAGE at reservation) is advised
    // back.
    let probe = Box::new(0u64);
    // SAFETY: as above.
    unsafe { libmimalloc_sys::mi_option_set(MI_OPTION_ALLOW_THP, 0) };
    no_huge_pages_under(&*probe as *const u64 as usize);
    drop(probe);
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    m.add_class::<array::Array>()?;
    m.add_class::<loader::Loader>()?;
    m.add_class::<dropin::MapRunner>()?;
    m.add_function(wrap_pyfunction!(loader::flags, m)?)?;
    m.add_function(wrap_pyfunction!(loader::setting_names, m)?)?;
    Ok(())
}
