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

fn main() {
    std::process::exit(cli::main());
}
