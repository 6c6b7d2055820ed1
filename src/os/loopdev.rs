//! Loop devices through the loop ioctls (`LOOP_CTL_GET_FREE`, `LOOP_CONFIGURE`,
//! `LOOP_CLR_FD`, `LOOP_SET_CAPACITY`), found again by backing file through sysfs.
//!
//! # Design
//! `losetup` output is never parsed: a device is attached with `LOOP_CONFIGURE` (one
//! atomic ioctl that sets the backing file, flags and block size) and found again by
//! reading `/sys/block/loopN/loop/backing_file`, so staging is idempotent across driver
//! restarts. Direct I/O is asked for and silently dropped when the pool filesystem cannot
//! do it (tmpfs, for one), so page-cache double buffering is avoided where possible. The
//! logical block size is always 4096 bytes, so a filesystem made on a volume mounts again
//! whatever the pool and whether or not direct I/O was granted.
//!
//! # Limitations
//! Devices are found by backing file path; a pool directory reached through two different
//! paths (bind mounts) would hide a device from the lookup. The pool path is canonicalised
//! at start for that reason.

use std::fs::{self, File, OpenOptions};
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::thread;
use std::time::Duration;

use nix::errno::Errno;
use nix::sys::stat::{makedev, mknod, Mode, SFlag};

use crate::error::{Error, Result};

const LOOP_CONTROL: &str = "/dev/loop-control";
const LOOP_MAJOR: u64 = 7;
const LO_FLAGS_READ_ONLY: u32 = 1;
const LO_FLAGS_DIRECT_IO: u32 = 16;
const LO_NAME_SIZE: usize = 64;
const LO_KEY_SIZE: usize = 32;
/// The logical block size of every loop device ferrovol attaches. It must not change over
/// a volume's life: a filesystem made with blocks smaller than the device's logical block
/// size cannot be mounted (ext4 "bad block size"), and with `block_size` 0 the kernel
/// picks 512 or the pool's direct-I/O alignment (4096 on XFS) depending on whether direct
/// I/O was granted. 4096 fits every pool's alignment, so direct I/O stays possible.
const LOGICAL_BLOCK_SIZE: u32 = 4096;
/// How often attach retries when another process takes the free device first.
const ATTACH_ATTEMPTS: usize = 32;

/// `struct loop_info64` from `<linux/loop.h>`.
#[repr(C)]
#[derive(Debug)]
struct LoopInfo64 {
    lo_device: u64,
    lo_inode: u64,
    lo_rdevice: u64,
    lo_offset: u64,
    lo_sizelimit: u64,
    lo_number: u32,
    lo_encrypt_type: u32,
    lo_encrypt_key_size: u32,
    lo_flags: u32,
    lo_file_name: [u8; LO_NAME_SIZE],
    lo_crypt_name: [u8; LO_NAME_SIZE],
    lo_encrypt_key: [u8; LO_KEY_SIZE],
    lo_init: [u64; 2],
}

/// `struct loop_config` from `<linux/loop.h>`, the argument of `LOOP_CONFIGURE`.
#[repr(C)]
#[derive(Debug)]
struct LoopConfig {
    fd: u32,
    block_size: u32,
    info: LoopInfo64,
    reserved: [u64; 8],
}

nix::ioctl_none_bad!(loop_ctl_get_free, 0x4C82);
nix::ioctl_write_ptr_bad!(loop_configure, 0x4C0A, LoopConfig);
nix::ioctl_none_bad!(loop_clr_fd, 0x4C01);
nix::ioctl_none_bad!(loop_set_capacity, 0x4C07);

/// A loop device attached to one of our backing files.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LoopDevice {
    /// The device number N of `/dev/loopN`.
    pub number: u32,
    /// `/dev/loopN`.
    pub path: PathBuf,
    /// Whether the backing file was deleted while attached (sysfs says `(deleted)`).
    pub backing_deleted: bool,
}

impl LoopDevice {
    fn new(number: u32, backing_deleted: bool) -> Self {
        LoopDevice {
            number,
            path: PathBuf::from(format!("/dev/loop{number}")),
            backing_deleted,
        }
    }

    /// `/dev/loopN` as a value, attached or not.
    pub fn numbered(number: u32) -> Self {
        LoopDevice::new(number, false)
    }

    /// The kernel's name of the device, `loopN`.
    pub fn name(&self) -> String {
        format!("loop{}", self.number)
    }

    /// The device size in bytes, from sysfs.
    ///
    /// # Errors
    /// `Io` when sysfs cannot be read (the device went away).
    pub fn size_bytes(&self) -> Result<u64> {
        let path = PathBuf::from(format!("/sys/block/loop{}/size", self.number));
        let text = fs::read_to_string(&path).map_err(|e| Error::io("read", &path, e))?;
        let sectors: u64 = text.trim().parse().map_err(|_| {
            Error::Internal(format!("{}: unexpected content {text:?}", path.display()))
        })?;
        Ok(sectors.saturating_mul(512))
    }
}

/// Reads the backing file of `/sys/block/loopN`, `None` when the device is detached.
fn backing_file_of(sys_dir: &Path) -> Option<String> {
    let text = fs::read_to_string(sys_dir.join("loop/backing_file")).ok()?;
    let text = text.trim_end_matches('\n');
    (!text.is_empty()).then(|| text.to_owned())
}

/// Every attached loop device whose backing file is `backing`.
///
/// Usually one; more only when something outside the driver attached the file too.
///
/// # Errors
/// `Io` when `/sys/block` cannot be listed.
pub fn find_by_backing_file(backing: &Path) -> Result<Vec<LoopDevice>> {
    let wanted = backing.to_string_lossy();
    let wanted_deleted = format!("{wanted} (deleted)");
    let mut found = Vec::new();
    for (number, sys_dir) in loop_sys_dirs()? {
        match backing_file_of(&sys_dir) {
            Some(b) if b == wanted => found.push(LoopDevice::new(number, false)),
            Some(b) if b == wanted_deleted => found.push(LoopDevice::new(number, true)),
            _ => {}
        }
    }
    Ok(found)
}

/// Every attached loop device whose backing file lies in `dir` (directly), with that
/// backing file. A deleted backing file is reported with its old path and
/// `backing_deleted` set.
///
/// # Errors
/// `Io` when `/sys/block` cannot be listed.
pub fn attached_in(dir: &Path) -> Result<Vec<(LoopDevice, PathBuf)>> {
    let mut found = Vec::new();
    for (number, sys_dir) in loop_sys_dirs()? {
        let Some(text) = backing_file_of(&sys_dir) else {
            continue;
        };
        let (path, deleted) = match text.strip_suffix(" (deleted)") {
            Some(path) => (PathBuf::from(path), true),
            None => (PathBuf::from(text), false),
        };
        if path.parent() == Some(dir) {
            found.push((LoopDevice::new(number, deleted), path));
        }
    }
    found.sort_by_key(|(device, _)| device.number);
    Ok(found)
}

/// The loop device with the given device number (from `stat().st_rdev`), if it is one,
/// and its backing file (`None` when detached).
pub fn loop_by_rdev(rdev: u64) -> Option<(u32, Option<String>)> {
    let major = nix::sys::stat::major(rdev);
    if major != LOOP_MAJOR {
        return None;
    }
    let minor = nix::sys::stat::minor(rdev);
    let sys_dir = PathBuf::from(format!("/sys/dev/block/{major}:{minor}"));
    let name = fs::read_link(&sys_dir).ok()?;
    let number = name
        .file_name()?
        .to_str()?
        .strip_prefix("loop")?
        .parse()
        .ok()?;
    Some((number, backing_file_of(&sys_dir)))
}

fn loop_sys_dirs() -> Result<Vec<(u32, PathBuf)>> {
    let root = Path::new("/sys/block");
    let entries = fs::read_dir(root).map_err(|e| Error::io("list", root, e))?;
    let mut dirs = Vec::new();
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(number) = name
            .to_str()
            .and_then(|n| n.strip_prefix("loop"))
            .and_then(|n| n.parse().ok())
        else {
            continue;
        };
        dirs.push((number, entry.path()));
    }
    Ok(dirs)
}

/// Attaches `backing` to a free loop device, with direct I/O when the pool allows it;
/// `read_only` makes the device refuse writes (a read-only bind of a device node does not).
///
/// # Errors
/// `Io` naming the step (open, get free, configure) that failed.
pub fn attach(backing: &Path, read_only: bool) -> Result<LoopDevice> {
    let file = OpenOptions::new()
        .read(true)
        .write(!read_only)
        .open(backing)
        .map_err(|e| Error::io("open backing file", backing, e))?;
    let control = OpenOptions::new()
        .read(true)
        .write(true)
        .open(LOOP_CONTROL)
        .map_err(|e| Error::io("open", LOOP_CONTROL, e))?;
    for _ in 0..ATTACH_ATTEMPTS {
        // SAFETY: LOOP_CTL_GET_FREE takes no argument; `control` is an open loop-control fd.
        let number = unsafe { loop_ctl_get_free(control.as_raw_fd()) }
            .map_err(|e| Error::sys("find a free loop device via", LOOP_CONTROL, e))?;
        let number = u32::try_from(number)
            .map_err(|_| Error::Internal(format!("LOOP_CTL_GET_FREE returned {number}")))?;
        let device = LoopDevice::new(number, false);
        let dev_file = open_device_node(&device)?;
        match configure(&dev_file, &file, backing, true, read_only) {
            Ok(()) => return Ok(device),
            // Someone else took this device between GET_FREE and CONFIGURE: try another.
            Err(Errno::EBUSY) => continue,
            // The pool filesystem cannot do direct I/O for this file: attach buffered.
            Err(Errno::EINVAL) => match configure(&dev_file, &file, backing, false, read_only) {
                Ok(()) => return Ok(device),
                Err(Errno::EBUSY) => continue,
                Err(e) => return Err(Error::sys("configure loop device for", backing, e)),
            },
            Err(e) => return Err(Error::sys("configure loop device for", backing, e)),
        }
    }
    Err(Error::Internal(format!(
        "no free loop device for {} after {ATTACH_ATTEMPTS} attempts",
        backing.display()
    )))
}

/// Opens `/dev/loopN`, creating the node when the device manager did not (containers
/// with a static `/dev`).
fn open_device_node(device: &LoopDevice) -> Result<File> {
    let open = || OpenOptions::new().read(true).write(true).open(&device.path);
    match open() {
        Ok(f) => Ok(f),
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            let dev = makedev(LOOP_MAJOR, u64::from(device.number));
            match mknod(
                &device.path,
                SFlag::S_IFBLK,
                Mode::from_bits_truncate(0o660),
                dev,
            ) {
                Ok(()) | Err(Errno::EEXIST) => {}
                Err(e) => return Err(Error::sys("create device node", &device.path, e)),
            }
            open().map_err(|e| Error::io("open", &device.path, e))
        }
        Err(e) => Err(Error::io("open", &device.path, e)),
    }
}

fn configure(
    dev_file: &File,
    backing: &File,
    backing_path: &Path,
    direct_io: bool,
    read_only: bool,
) -> Result<(), Errno> {
    let mut info = LoopInfo64 {
        lo_device: 0,
        lo_inode: 0,
        lo_rdevice: 0,
        lo_offset: 0,
        lo_sizelimit: 0,
        lo_number: 0,
        lo_encrypt_type: 0,
        lo_encrypt_key_size: 0,
        lo_flags: if direct_io { LO_FLAGS_DIRECT_IO } else { 0 }
            | if read_only { LO_FLAGS_READ_ONLY } else { 0 },
        lo_file_name: [0; LO_NAME_SIZE],
        lo_crypt_name: [0; LO_NAME_SIZE],
        lo_encrypt_key: [0; LO_KEY_SIZE],
        lo_init: [0; 2],
    };
    let name = backing_path.as_os_str().as_encoded_bytes();
    let len = name.len().min(LO_NAME_SIZE - 1);
    info.lo_file_name[..len].copy_from_slice(&name[..len]);
    let fd = u32::try_from(backing.as_raw_fd()).map_err(|_| Errno::EBADF)?;
    let config = LoopConfig {
        fd,
        block_size: LOGICAL_BLOCK_SIZE,
        info,
        reserved: [0; 8],
    };
    // SAFETY: `config` is a fully initialised `struct loop_config` that outlives the call;
    // both fds are open for the duration of the ioctl.
    unsafe { loop_configure(dev_file.as_raw_fd(), &config) }.map(drop)
}

/// Detaches a loop device; a device that is already detached counts as success.
///
/// # Errors
/// `Io` when the device stays busy or the ioctl fails otherwise.
pub fn detach(device: &LoopDevice) -> Result<()> {
    let sys_dir = PathBuf::from(format!("/sys/block/{}", device.name()));
    let backing = backing_file_of(&sys_dir);
    let file = match OpenOptions::new().read(true).open(&device.path) {
        Ok(f) => f,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(Error::io("open", &device.path, e)),
    };
    let mut attempts = 0;
    loop {
        // SAFETY: LOOP_CLR_FD takes no argument; `file` is an open loop device fd.
        match unsafe { loop_clr_fd(file.as_raw_fd()) } {
            Ok(_) => {
                drop(file);
                wait_released(device, &sys_dir, backing.as_deref());
                return Ok(());
            }
            Err(Errno::ENXIO) => return Ok(()),
            // A short-lived opener (blkid, udev) holds the device: wait a moment.
            Err(Errno::EBUSY) if attempts < 20 => {
                attempts += 1;
                thread::sleep(Duration::from_millis(25));
            }
            Err(e) => return Err(Error::sys("detach loop device", &device.path, e)),
        }
    }
}

/// Waits (at most about a second) until the device no longer holds `backing`.
///
/// While another process has the device open (blkid, udev, or any child forked in the
/// instant before it execs), LOOP_CLR_FD only marks it for detaching at the last close.
/// Waiting here lets a caller that reports the volume unstaged, or deletes its backing
/// file next, see the device really gone; a holder that stays is left to the kernel.
fn wait_released(device: &LoopDevice, sys_dir: &Path, backing: Option<&str>) {
    let Some(backing) = backing else {
        return;
    };
    for _ in 0..40 {
        if backing_file_of(sys_dir).as_deref() != Some(backing) {
            return;
        }
        thread::sleep(Duration::from_millis(25));
    }
    tracing::warn!(
        device = %device.path.display(),
        "another process still holds the loop device open; the kernel detaches it at its last close"
    );
}

/// Makes the loop device pick up a new size of its backing file.
///
/// # Errors
/// `Io` when the device cannot be opened or the ioctl fails.
pub fn refresh_capacity(device: &LoopDevice) -> Result<()> {
    let file = File::open(&device.path).map_err(|e| Error::io("open", &device.path, e))?;
    // SAFETY: LOOP_SET_CAPACITY takes no argument; `file` is an open loop device fd.
    unsafe { loop_set_capacity(file.as_raw_fd()) }
        .map(drop)
        .map_err(|e| Error::sys("refresh capacity of", &device.path, e))
}

/// Whether `path` is a block device node (used to check a published block target).
pub fn is_block_device(path: &Path) -> bool {
    fs::metadata(path)
        .map(|m| m.file_type().is_block_device())
        .unwrap_or(false)
}

/// The device number (`st_rdev`) of a device node.
///
/// # Errors
/// `Io` when the path cannot be stat'ed.
pub fn rdev_of(path: &Path) -> Result<u64> {
    fs::metadata(path)
        .map(|m| m.rdev())
        .map_err(|e| Error::io("stat", path, e))
}
