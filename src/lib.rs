//! # ferrofeed
//!
//! Typed, threaded input pipelines that keep accelerators fed. This facade
//! re-exports the engine ([`core`]), the generic stages ([`stages`]) and,
//! behind features, the domain packs ([`vision`], [`text`], [`audio`]).
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
#[cfg(feature = "audio")]
pub use ferrofeed_audio as audio;
pub use ferrofeed_core as core;
pub use ferrofeed_stages as stages;
#[cfg(feature = "text")]
pub use ferrofeed_text as text;
#[cfg(feature = "vision")]
pub use ferrofeed_vision as vision;

/// The built-in domain jobs behind the `ferrofeed` command and the Python
/// package: each domain's typed settings, the pipeline they build, and the
/// epoch loop.
#[cfg(feature = "jobs")]
pub use ferrofeed_jobs as jobs;

/// The `ferrofeed` command.
#[cfg(feature = "jobs")]
pub mod cli;

/// This release of ferrofeed.
pub const VERSION: &str = env!("CARGO_PKG_VERSION");
