//! The `ferrofeed` command: runs the built-in domain pipelines over a folder
//! or file, inspects single samples, and writes synthetic datasets.
//!
//! ```text
//! ferrofeed                       # vision pipeline on the embedded default dataset
//! ferrofeed vision DIR --transform eval --batch-size 32
//! ferrofeed inspect vision DIR --index 42 --out /tmp/look
//! ferrofeed make-dataset vision DIR --count 2000
//! ```

// Workers allocate and free image-sized buffers at a high rate, often on
// different threads; mimalloc's thread-local free lists keep that off the
// page-fault and lock paths that glibc's allocator takes.
#[global_allocator]
static ALLOC: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// mimalloc's `mi_option_purge_delay` (the same index in its v2 and v3).
const MI_OPTION_PURGE_DELAY: libmimalloc_sys::mi_option_t = 15;

fn main() {
    // Freed pages stay with the process instead of going back to the kernel
    // after 10 ms: the next image buffers reuse them rather than faulting in
    // (and zeroing) fresh pages. Peak RSS is unchanged: the pipeline's
    // memory is bounded by its byte budget, not by the allocator.
    // SAFETY: sets a plain option before any worker thread starts.
    unsafe { libmimalloc_sys::mi_option_set(MI_OPTION_PURGE_DELAY, -1) };
    // No transparent huge pages for this process: the first touch of a huge
    // page zeroes all 2 MiB of it, so a run's first epoch spent its sys time
    // clearing pages it barely used (measured: sys time halved, first-epoch
    // images/s up ~15%, steady epochs unchanged). Best effort: an old kernel
    // without the flag keeps its default.
    // SAFETY: a plain prctl on this process, before any worker thread starts.
    unsafe { libc::prctl(libc::PR_SET_THP_DISABLE, 1, 0, 0, 0) };
    std::process::exit(ferrofeed::cli::main());
}
