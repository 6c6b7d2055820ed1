//! Mount targets: creating the directory or file a mount goes onto, and removing it again.
//!
//! Targets are created without following a symlink in their last component, so a link
//! planted at a target path cannot redirect a mount elsewhere.

use std::fs::{self, OpenOptions};
use std::io;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

use crate::error::{Error, Result};

/// Refuses `path` when any of its components below `root` is a symbolic link, so that a
/// link planted in a kubelet directory cannot send a mount (or a removal) elsewhere.
/// Components that do not exist yet are fine: they are created without following links.
///
/// # Errors
/// `InvalidArgument` naming the link; `Io` when a component cannot be inspected.
pub fn refuse_symlinks(root: &Path, path: &Path) -> Result<()> {
    let Ok(below) = path.strip_prefix(root) else {
        return Err(Error::InvalidArgument(format!(
            "{} is not below {}",
            path.display(),
            root.display()
        )));
    };
    let mut prefix = root.to_path_buf();
    for component in below.components() {
        prefix.push(component);
        match fs::symlink_metadata(&prefix) {
            Ok(meta) if meta.file_type().is_symlink() => {
                return Err(Error::InvalidArgument(format!(
                    "{} leads through the symbolic link {}; ferrovol does not follow links in \
                     staging or target paths",
                    path.display(),
                    prefix.display()
                )));
            }
            Ok(_) => {}
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
            Err(e) => return Err(Error::io("stat", &prefix, e)),
        }
    }
    Ok(())
}

/// Makes sure `path` is a directory (creating it and its parents), and not a symlink.
///
/// # Errors
/// `Io` when it cannot be created; `FailedPrecondition` when something else is there.
pub fn ensure_dir(path: &Path) -> Result<()> {
    match fs::symlink_metadata(path) {
        Ok(meta) if meta.is_dir() => Ok(()),
        Ok(_) => Err(Error::FailedPrecondition(format!(
            "{} exists and is not a directory",
            path.display()
        ))),
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            fs::create_dir_all(path).map_err(|e| Error::io("create directory", path, e))
        }
        Err(e) => Err(Error::io("stat", path, e)),
    }
}

/// Makes sure `path` is a regular file (creating it, and its parent directories), not a
/// symlink. Returns whether it was created.
///
/// # Errors
/// `Io` when it cannot be created; `FailedPrecondition` when something else is there.
pub fn ensure_file(path: &Path) -> Result<bool> {
    match fs::symlink_metadata(path) {
        Ok(meta) if meta.is_file() => Ok(false),
        Ok(_) => Err(Error::FailedPrecondition(format!(
            "{} exists and is not a regular file",
            path.display()
        ))),
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            if let Some(parent) = path.parent() {
                fs::create_dir_all(parent).map_err(|e| Error::io("create directory", parent, e))?;
            }
            OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(0o600)
                .custom_flags(libc::O_NOFOLLOW)
                .open(path)
                .map_err(|e| Error::io("create", path, e))?;
            Ok(true)
        }
        Err(e) => Err(Error::io("stat", path, e)),
    }
}

/// Removes an unmounted target: an empty directory or an empty regular file. A missing
/// target is fine; one that holds data is left alone and reported.
///
/// # Errors
/// `FailedPrecondition` for a target that is not empty; `Io` for other failures.
pub fn remove_target(path: &Path) -> Result<()> {
    let meta = match fs::symlink_metadata(path) {
        Ok(meta) => meta,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(Error::io("stat", path, e)),
    };
    let removed = if meta.is_dir() {
        fs::remove_dir(path)
    } else if meta.is_file() && meta.len() == 0 {
        fs::remove_file(path)
    } else {
        return Err(Error::FailedPrecondition(format!(
            "{} is not an empty directory or file; leaving it alone",
            path.display()
        )));
    };
    match removed {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        Err(e) if e.raw_os_error() == Some(libc::ENOTEMPTY) => {
            Err(Error::FailedPrecondition(format!(
                "{} is not empty after unmount; leaving it alone",
                path.display()
            )))
        }
        Err(e) => Err(Error::io("remove", path, e)),
    }
}

/// Whether anything exists at `path` (without following a symlink).
pub fn exists(path: &Path) -> bool {
    fs::symlink_metadata(path).is_ok()
}
