//! The `ferrofeed` command: runs the built-in domain pipelines over a folder
//! or file, inspects single samples, and writes synthetic datasets.
//!
//! ```text
//! ferrofeed                       # vision pipeline on the embedded default dataset
//! ferrofeed vision DIR --transform eval --batch-size 32
//! ferrofeed inspect vision DIR --index 42 --out /tmp/look
//! ferrofeed make-dataset vision DIR --count 2000
//! ```
mod cli;

// Workers allocate and free image-sized buffers at a high rate, often on
// different threads; mimalloc's thread-local free lists keep that off the
// page-fault and lock paths that glibc's allocator takes.
#[global_allocator]
static ALLOC: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() {
    std::process::exit(cli::main());
}
