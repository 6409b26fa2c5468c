//! Helpers shared by the engine's integration tests.
#![allow(dead_code)]

use ferrofeed_core::{Collatable, Component};

/// A component with a real payload, for budget tests.
#[derive(Clone)]
pub struct Blob(pub Vec<u8>);
impl Component for Blob {
    fn nbytes(&self) -> usize {
        self.0.len()
    }
}
impl Collatable for Blob {
    type Elem = u8;
    fn shape(&self) -> Vec<usize> {
        vec![self.0.len()]
    }
    fn write(&self, out: &mut [u8]) {
        out.copy_from_slice(&self.0);
    }
}

/// One number as a sample's component (collated as `i64`).
#[derive(Clone, Debug, PartialEq)]
pub struct Val(pub i64);
impl Component for Val {
    fn nbytes(&self) -> usize {
        8
    }
    fn describe(&self) -> String {
        self.0.to_string()
    }
}
impl Collatable for Val {
    type Elem = i64;
    fn shape(&self) -> Vec<usize> {
        Vec::new()
    }
    fn write(&self, out: &mut [i64]) {
        out[0] = self.0;
    }
}

/// Threads of this process started by ferrofeed (named `ff-…`).
pub fn ff_threads() -> usize {
    std::fs::read_dir("/proc/self/task")
        .map(|d| {
            d.filter_map(|e| e.ok())
                .filter(|e| {
                    std::fs::read_to_string(e.path().join("comm"))
                        .is_ok_and(|c| c.starts_with("ff-"))
                })
                .count()
        })
        .unwrap_or(0)
}
