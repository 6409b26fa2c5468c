//! Opening the files a user names: regular files only, checked before they
//! are opened (opening a FIFO waits for a writer, reading `/dev/zero` never
//! ends), and settings files under a size cap.
//!
//! ```
//! let p = std::env::temp_dir().join(format!("ff-files-doc-{}", std::process::id()));
//! std::fs::write(&p, b"abc").unwrap();
//! let (_, meta) = ferrofeed_core::open_regular(&p).unwrap();
//! assert_eq!(meta.len(), 3);
//! let e = ferrofeed_core::open_regular(std::path::Path::new("/dev/zero")).unwrap_err();
//! assert!(e.to_string().contains("not a regular file"));
//! std::fs::remove_file(&p).unwrap();
//! ```
use std::fs::{File, Metadata};
use std::path::Path;

/// Opens `path` for reading when it is a regular file (symlinks followed),
/// with its metadata; a folder, FIFO, device or socket is refused with
/// [`std::io::ErrorKind::InvalidInput`] before it is opened, so no open or
/// read can block or run forever on it.
pub fn open_regular(path: &Path) -> std::io::Result<(File, Metadata)> {
    let refuse = || {
        std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            "not a regular file (a folder, FIFO, device or socket)",
        )
    };
    if !std::fs::metadata(path)?.is_file() {
        return Err(refuse());
    }
    let file = File::open(path)?;
    // Checked again on what was opened: the path may have changed between.
    let meta = file.metadata()?;
    if !meta.is_file() {
        return Err(refuse());
    }
    Ok((file, meta))
}

/// Reads a settings file (a saved state, a tokenizer) of at most `max`
/// bytes: anything but a regular file (a FIFO, `/dev/zero`, a folder) is
/// refused before it is read, and a file longer than `max` is refused after
/// reading `max + 1` bytes at most, so a lying size cannot run memory out.
///
/// ```
/// let p = std::env::temp_dir().join(format!("ff-settings-doc-{}.json", std::process::id()));
/// std::fs::write(&p, "{}").unwrap();
/// assert_eq!(ferrofeed_core::read_settings_file(&p, 16).unwrap(), b"{}");
/// assert!(ferrofeed_core::read_settings_file(&p, 1).is_err());
/// assert!(ferrofeed_core::read_settings_file(std::path::Path::new("/dev/zero"), 16).is_err());
/// std::fs::remove_file(&p).unwrap();
/// ```
pub fn read_settings_file(path: &Path, max: u64) -> std::io::Result<Vec<u8>> {
    use std::io::{Error, ErrorKind, Read};
    let (file, meta) = open_regular(path)?;
    let mut out = Vec::with_capacity(meta.len().min(max) as usize);
    file.take(max + 1).read_to_end(&mut out)?;
    if out.len() as u64 > max {
        return Err(Error::new(
            ErrorKind::InvalidData,
            format!("longer than {max} bytes: refusing to read it"),
        ));
    }
    Ok(out)
}
