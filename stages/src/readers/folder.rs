//! ImageFolder: `ROOT/<class>/<file>`, labels = sorted class names.
//!
//! ```
//! let dir = tempfile::tempdir().unwrap();
//! for (class, file) in [("cat", "a.jpg"), ("dog", "b.jpg"), ("cat", "c.JPG")] {
//!     std::fs::create_dir_all(dir.path().join(class)).unwrap();
//!     std::fs::write(dir.path().join(class).join(file), b"x").unwrap();
//! }
//! let f = ferrofeed_stages::ImageFolder::scan(dir.path(), &["jpg"]).unwrap();
//! assert_eq!(f.classes(), &["cat", "dog"]);
//! assert_eq!(f.files().len(), 3);
//! assert_eq!(f.files()[2].1, 1, "dog is class 1");
//! ```
use std::path::{Path, PathBuf};

use crate::readers::files::LabeledFiles;

/// Why a folder cannot be used as a dataset.
#[derive(Debug, thiserror::Error)]
pub enum ScanError {
    /// The root is missing or not a folder.
    #[error("{0}: not a readable folder")]
    NotAFolder(PathBuf),
    /// No class sub-folders.
    #[error("{0}: no class folders (expected ROOT/<class>/<file>)")]
    NoClasses(PathBuf),
    /// Class folders exist but hold no file with an accepted extension.
    #[error("{root}: no files with extension {exts} under the class folders")]
    NoFiles {
        /// The root.
        root: PathBuf,
        /// Accepted extensions.
        exts: String,
    },
    /// A class folder's name is not valid UTF-8: leaving it out would shift
    /// every later label against torchvision's `ImageFolder`.
    #[error("{}: class folder name is not valid UTF-8; rename it (every label follows the sorted class names)", .0.display())]
    NonUtf8Class(PathBuf),
    /// Listing failed (permissions, a symlink loop…).
    #[error("{path}: {message}")]
    Walk {
        /// Where.
        path: PathBuf,
        /// What.
        message: String,
    },
}

/// Every file under `root`, following symlinks, in path order (each
/// folder's entries by name, depth first): regular files, and also what is
/// neither a folder nor readable as a file — a FIFO, socket or device, a
/// dangling symlink, a symlink looping to itself — so that reading it
/// fails naming it instead of it being left out unsaid. A symlink loop back
/// to a folder above, or an unreadable folder, is an error naming the path.
///
/// ```
/// let dir = tempfile::tempdir().unwrap();
/// std::fs::create_dir(dir.path().join("b")).unwrap();
/// std::fs::write(dir.path().join("b/x.txt"), "").unwrap();
/// std::fs::write(dir.path().join("a.txt"), "").unwrap();
/// let files = ferrofeed_stages::walk_files(dir.path()).unwrap();
/// assert_eq!(files, vec![dir.path().join("a.txt"), dir.path().join("b/x.txt")]);
/// ```
pub fn walk_files(root: &Path) -> Result<Vec<PathBuf>, ScanError> {
    let mut out = Vec::new();
    for entry in walkdir::WalkDir::new(root)
        .follow_links(true)
        .sort_by_file_name()
    {
        let entry = match entry {
            Ok(entry) => entry,
            // A dangling symlink, or one that loops to itself rather than
            // to a folder above it: a file that cannot be read, listed so
            // that reading it fails naming it (under the error policy)
            // instead of the whole scan.
            Err(e) if e.loop_ancestor().is_none() && e.io_error().is_some() && e.depth() > 0 => {
                match e.path() {
                    Some(p) if p.symlink_metadata().is_ok_and(|m| m.is_symlink()) => {
                        out.push(p.to_path_buf());
                        continue;
                    }
                    _ => return Err(walk_error(root, &e)),
                }
            }
            Err(e) => return Err(walk_error(root, &e)),
        };
        // Anything but a folder is a sample: a FIFO, socket or device
        // fails when read, naming it, rather than being left out unsaid.
        if !entry.file_type().is_dir() {
            out.push(entry.into_path());
        }
    }
    Ok(out)
}

fn walk_error(root: &Path, e: &walkdir::Error) -> ScanError {
    ScanError::Walk {
        path: e
            .path()
            .map_or_else(|| root.to_path_buf(), Path::to_path_buf),
        message: e.to_string(),
    }
}

/// The files of an ImageFolder tree with their class labels.
#[derive(Debug, Clone)]
pub struct ImageFolder {
    root: PathBuf,
    classes: Vec<String>,
    files: Vec<(PathBuf, i64)>,
}

impl ImageFolder {
    /// Lists `root/<class>/**/<file>` for files whose extension is in `exts`
    /// (case-insensitive), sorted by class then path. Symlinks are followed;
    /// a symlink loop is an error naming the path.
    pub fn scan(root: impl AsRef<Path>, exts: &[&str]) -> Result<ImageFolder, ScanError> {
        let root = root.as_ref().to_path_buf();
        let entries = std::fs::read_dir(&root).map_err(|_| ScanError::NotAFolder(root.clone()))?;
        let mut classes = Vec::new();
        for e in entries {
            let e = e.map_err(|e| ScanError::Walk {
                path: root.clone(),
                message: e.to_string(),
            })?;
            let path = e.path();
            if path.is_dir() {
                match e.file_name().to_str() {
                    Some(name) if name.starts_with('.') => {}
                    Some(name) => classes.push(name.to_string()),
                    None => return Err(ScanError::NonUtf8Class(path)),
                }
            }
        }
        classes.sort();
        if classes.is_empty() {
            return Err(ScanError::NoClasses(root));
        }
        let mut files = Vec::new();
        for (label, class) in classes.iter().enumerate() {
            for path in walk_files(&root.join(class))? {
                let ok = path
                    .extension()
                    .and_then(|x| x.to_str())
                    .is_some_and(|x| exts.iter().any(|e| e.eq_ignore_ascii_case(x)));
                if ok {
                    files.push((path, label as i64));
                }
            }
        }
        if files.is_empty() {
            return Err(ScanError::NoFiles {
                root,
                exts: exts.join("/"),
            });
        }
        Ok(ImageFolder {
            root,
            classes,
            files,
        })
    }
    /// An ImageFolder made from a list kept elsewhere (a torchvision
    /// dataset's `samples`): `files` as `(path, label)` in index order,
    /// `classes` naming the labels, `root` what they are under.
    pub fn from_files(
        root: impl Into<PathBuf>,
        classes: Vec<String>,
        files: Vec<(PathBuf, i64)>,
    ) -> ImageFolder {
        ImageFolder {
            root: root.into(),
            classes,
            files,
        }
    }
    /// The root folder.
    pub fn root(&self) -> &Path {
        &self.root
    }
    /// Class names; label `i` is `classes()[i]`.
    pub fn classes(&self) -> &[String] {
        &self.classes
    }
    /// `(path, label)` of every file.
    pub fn files(&self) -> &[(PathBuf, i64)] {
        &self.files
    }
    /// The files as a map-style source of `(FilePath, Label)`.
    pub fn into_source(self) -> LabeledFiles {
        LabeledFiles::new(self.files)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn empty_or_classless_folders_are_errors() {
        let dir = tempfile::tempdir().unwrap();
        assert!(matches!(
            ImageFolder::scan(dir.path(), &["jpg"]),
            Err(ScanError::NoClasses(_))
        ));
        std::fs::create_dir(dir.path().join("a")).unwrap();
        std::fs::write(dir.path().join("a/readme.txt"), b"x").unwrap();
        let e = ImageFolder::scan(dir.path(), &["jpg"]).unwrap_err();
        assert!(e.to_string().contains("no files with extension jpg"), "{e}");
        assert!(matches!(
            ImageFolder::scan(dir.path().join("missing"), &["jpg"]),
            Err(ScanError::NotAFolder(_))
        ));
    }

    #[test]
    fn a_symlink_loop_is_an_error_not_a_hang() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join("a/sub")).unwrap();
        std::os::unix::fs::symlink(dir.path().join("a"), dir.path().join("a/sub/loop")).unwrap();
        let e = ImageFolder::scan(dir.path(), &["jpg"]).unwrap_err();
        assert!(matches!(e, ScanError::Walk { .. }), "{e}");
    }
}
