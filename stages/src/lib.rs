//! # ferrofeed-stages
//!
//! Generic stages and sources shared by the domain packs: the components
//! every reader produces ([`FilePath`], [`Bytes`], [`Label`]), readers for
//! file lists, ImageFolder trees and WebDataset tar shards, the
//! [`ReadFile`] stage, and [`CacheFolder`], the capped folder the caches on
//! disk keep their entries in.
//!
//! ```
//! use ferrofeed_stages::{Bytes, Label};
//! let b = Bytes::from(vec![1u8, 2, 3]);
//! assert_eq!(&b[..], &[1, 2, 3]);
//! assert_eq!(Label(4).0, 4);
//! ```
#![warn(missing_docs)]
#![warn(unreachable_pub)]

mod cache_folder;
mod components;
pub mod device;
mod readers;
#[cfg(feature = "remote")]
pub mod remote;

pub use cache_folder::{cache_key, content_digest, sweep_temporaries, CacheEntry, CacheFolder};
pub use components::{Bytes, FilePath, Label};
pub use readers::files::{Files, LabeledFiles, ReadFile};
pub use readers::folder::{walk_files, ImageFolder, ScanError};
pub use readers::streamed::{ShardData, ShardOpen, StreamedShards};
pub use readers::tar::{TarError, TarShards};
