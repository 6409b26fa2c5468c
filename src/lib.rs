//! # ferrofeed
//!
//! Typed, threaded input pipelines that keep accelerators fed. This facade
//! re-exports the engine ([`core`]) and, behind features, the stage library
//! and the domain packs.
//!
//! ```
//! use ferrofeed::core::prelude::*;
//! let p = Pipeline::builder(FnSource::new(8, |i| Ok(i as i64)))
//!     .batch_size(4)
//!     .collate(StackCollate::new().column::<i64>("x"))
//!     .build()
//!     .unwrap();
//! assert_eq!(p.epoch(0).count(), 2);
//! ```
pub use ferrofeed_core as core;
