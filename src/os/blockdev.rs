//! Block device ioctls that are not about loop devices: the kernel's read-only flag.

use std::fs::File;
use std::os::fd::AsRawFd;
use std::path::Path;

use crate::error::{Error, Result};

// BLKROSET is _IO(0x12, 93) but takes a pointer to an int, hence the "bad" form.
nix::ioctl_write_ptr_bad!(blk_ro_set, nix::request_code_none!(0x12, 93), libc::c_int);

/// Sets or clears the read-only flag of the block device at `path`: while it is set the
/// kernel refuses every write through the device, whoever opens it.
///
/// # Errors
/// `Io` when the device cannot be opened or the ioctl fails.
pub fn set_read_only(path: &Path, read_only: bool) -> Result<()> {
    let device = File::open(path).map_err(|e| Error::io("open", path, e))?;
    let flag: libc::c_int = read_only.into();
    // SAFETY: BLKROSET reads one c_int through the pointer, which points at `flag` and
    // outlives the call; `device` is an open block device fd.
    unsafe { blk_ro_set(device.as_raw_fd(), &flag) }
        .map(drop)
        .map_err(|e| Error::sys("set the read-only flag of", path, e))
}
