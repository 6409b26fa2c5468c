//! Readers: sources over files, folders and tar shards (indexed, or
//! streamed shard by shard), and the stage that reads a file's bytes.
//!
//! ```no_run
//! use ferrofeed_stages::ImageFolder;
//! let folder = ImageFolder::scan("data/train", &["jpg", "jpeg", "png"]).unwrap();
//! println!("{} images in {} classes", folder.files().len(), folder.classes().len());
//! ```
pub(crate) mod files;
pub(crate) mod folder;
pub(crate) mod streamed;
pub(crate) mod tar;
