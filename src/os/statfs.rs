//! Filesystem figures: `statvfs(2)` for usage, `stat(2)` and `lseek(SEEK_DATA)` for how
//! much of a sparse file is really allocated.

use std::fs::File;
use std::os::unix::fs::MetadataExt;
use std::path::Path;

use nix::errno::Errno;
use nix::unistd::{lseek, Whence};

use crate::error::{Error, Result};

/// Sizes of a mounted filesystem.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FsUsage {
    /// Size of the filesystem in bytes.
    pub total_bytes: u64,
    /// Bytes not in use (including those reserved for root).
    pub free_bytes: u64,
    /// Bytes an unprivileged writer can still use.
    pub available_bytes: u64,
    /// Inodes in the filesystem.
    pub total_inodes: u64,
    /// Inodes not in use.
    pub free_inodes: u64,
}

/// Usage of the filesystem that holds `path`.
///
/// # Errors
/// `Io` when statvfs fails.
pub fn usage(path: &Path) -> Result<FsUsage> {
    let st = nix::sys::statvfs::statvfs(path).map_err(|e| Error::sys("statvfs", path, e))?;
    let frsize = st.fragment_size();
    Ok(FsUsage {
        total_bytes: st.blocks().saturating_mul(frsize),
        free_bytes: st.blocks_free().saturating_mul(frsize),
        available_bytes: st.blocks_available().saturating_mul(frsize),
        total_inodes: st.files(),
        free_inodes: st.files_free(),
    })
}

/// Bytes of disk a (possibly sparse) file really occupies.
///
/// # Errors
/// `Io` when the file cannot be stat'ed.
pub fn allocated_bytes(path: &Path) -> Result<u64> {
    let meta = std::fs::metadata(path).map_err(|e| Error::io("stat", path, e))?;
    Ok(meta.blocks().saturating_mul(512))
}

/// Whether a file holds any written data at all (false for a file of holes only).
///
/// # Errors
/// `Io` when the file cannot be opened or seeked.
pub fn holds_data(path: &Path) -> Result<bool> {
    let file = File::open(path).map_err(|e| Error::io("open", path, e))?;
    match lseek(&file, 0, Whence::SeekData) {
        Ok(_) => Ok(true),
        Err(Errno::ENXIO) => Ok(false),
        Err(e) => Err(Error::sys("seek for data in", path, e)),
    }
}
