//! Advisory whole-file locks (`flock(2)`), the one lock that ferrovol's processes share:
//! the driver holds `STATE/ops.lock` shared while any operation runs, and `ferrovol gc`
//! takes it exclusively, so the two never change the same machine state at once.

use std::fs::{File, OpenOptions};
use std::os::fd::AsRawFd;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

use nix::errno::Errno;

use crate::error::{Error, Result};

/// Opens (creating, mode 0600) the lock file at `path`.
///
/// # Errors
/// `Io` when it cannot be opened.
pub fn open(path: &Path) -> Result<File> {
    OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .mode(0o600)
        .open(path)
        .map_err(|e| Error::io("open lock file", path, e))
}

/// The kinds of lock.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// Many holders at once (the driver's operations).
    Shared,
    /// One holder, no shared ones (gc).
    Exclusive,
}

/// Takes the lock on `file` without waiting. `Ok(false)` when another open file holds a
/// conflicting lock.
///
/// # Errors
/// `Io` for any other failure.
pub fn try_lock(file: &File, kind: Kind, path: &Path) -> Result<bool> {
    let operation = match kind {
        Kind::Shared => libc::LOCK_SH,
        Kind::Exclusive => libc::LOCK_EX,
    } | libc::LOCK_NB;
    // SAFETY: flock takes an open fd, owned by `file` for the duration of the call, and a
    // constant operation; it touches no memory of ours.
    let rc = unsafe { libc::flock(file.as_raw_fd(), operation) };
    if rc == 0 {
        return Ok(true);
    }
    match Errno::last() {
        Errno::EWOULDBLOCK => Ok(false),
        e => Err(Error::sys("lock", path, e)),
    }
}

/// Releases whatever lock `file` holds.
///
/// # Errors
/// `Io` when the kernel refuses.
pub fn unlock(file: &File, path: &Path) -> Result<()> {
    // SAFETY: as in `try_lock`.
    let rc = unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_UN) };
    if rc == 0 {
        Ok(())
    } else {
        Err(Error::sys("unlock", path, Errno::last()))
    }
}
