//! Freezing a mounted filesystem around a snapshot (CreateSnapshot of a staged volume):
//! the `FIFREEZE` and `FITHAW` ioctls on the mount point.
//!
//! # Design
//! A freeze flushes all dirty data and metadata and then blocks every new write until the
//! thaw, so a copy or reflink of the backing file taken in between is crash-consistent. A
//! filesystem left frozen stalls every writer in the pod, so [`freeze_guard`] returns a
//! [`FrozenFs`] that thaws on drop: after success, after an error, and during a panic. It
//! thaws through the directory fd it froze through, so it reaches the same filesystem even
//! if the path is unmounted or mounted over meanwhile.
//!
//! Both directions are idempotent: freezing a frozen filesystem (`EBUSY`) and thawing one
//! that is not frozen (`EINVAL`) count as success.
//!
//! A path that is not the root of a mount is refused before any ioctl: freezing it would
//! freeze the filesystem it lies on, which for a staging path whose volume is not mounted
//! is the node's root filesystem.
//!
//! # Limitations
//! The kernel does not count userspace freezes: if someone else froze the filesystem
//! first, our freeze succeeds (`EBUSY`) and our thaw ends their freeze too. The volume lock
//! keeps the driver from overlapping itself. `FIFREEZE` needs `CAP_SYS_ADMIN` and can take
//! as long as flushing the filesystem; callers run it on a blocking thread.

use std::fs::{self, File};
use std::os::fd::AsRawFd;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use nix::errno::Errno;

use crate::error::{Error, Result};

// FIFREEZE is `_IOWR('X', 119, int)` and FITHAW `_IOWR('X', 120, int)`; the kernel ignores
// the argument of both.
nix::ioctl_readwrite!(fifreeze, b'X', 119, libc::c_int);
nix::ioctl_readwrite!(fithaw, b'X', 120, libc::c_int);

/// Freezes the filesystem mounted at `mount_point`; an already frozen one counts as
/// success.
///
/// Prefer [`freeze_guard`], which cannot forget the thaw.
///
/// # Errors
/// `FailedPrecondition` when `mount_point` is not the root of a mount; `Io` when it
/// cannot be opened or the ioctl fails (`EPERM` without `CAP_SYS_ADMIN`, `EOPNOTSUPP` for
/// a filesystem that cannot freeze).
pub fn freeze(mount_point: &Path) -> Result<()> {
    let dir = open_mount_root(mount_point)?;
    freeze_fd(&dir, mount_point)
}

/// Thaws the filesystem mounted at `mount_point`; one that is not frozen counts as
/// success.
///
/// # Errors
/// `FailedPrecondition` when `mount_point` is not the root of a mount; `Io` when it
/// cannot be opened or the ioctl fails.
pub fn thaw(mount_point: &Path) -> Result<()> {
    let dir = open_mount_root(mount_point)?;
    thaw_fd(&dir, mount_point)
}

/// Freezes the filesystem mounted at `mount_point` until the returned guard is dropped
/// or [`FrozenFs::thaw`] is called.
///
/// # Errors
/// As [`freeze`].
pub fn freeze_guard(mount_point: &Path) -> Result<FrozenFs> {
    let dir = open_mount_root(mount_point)?;
    freeze_fd(&dir, mount_point)?;
    Ok(FrozenFs {
        mount_point: mount_point.to_owned(),
        dir: Some(dir),
    })
}

/// A frozen filesystem, thawed when this is dropped.
#[derive(Debug)]
#[must_use = "dropping the guard thaws the filesystem at once"]
pub struct FrozenFs {
    /// Where the filesystem is mounted, for messages.
    mount_point: PathBuf,
    /// The root directory of the frozen filesystem, open; `None` once thawed.
    dir: Option<File>,
}

impl FrozenFs {
    /// Where the frozen filesystem is mounted.
    pub fn mount_point(&self) -> &Path {
        &self.mount_point
    }

    /// Thaws now and reports the outcome, which dropping the guard can only log.
    ///
    /// # Errors
    /// `Io` when the ioctl fails.
    pub fn thaw(mut self) -> Result<()> {
        match self.dir.take() {
            Some(dir) => thaw_fd(&dir, &self.mount_point),
            None => Ok(()),
        }
    }
}

impl Drop for FrozenFs {
    fn drop(&mut self) {
        if let Some(dir) = self.dir.take() {
            if let Err(err) = thaw_fd(&dir, &self.mount_point) {
                tracing::error!(
                    mount_point = %self.mount_point.display(),
                    error = %err,
                    "cannot thaw filesystem; writers to it stay blocked"
                );
            }
        }
    }
}

/// Opens `mount_point` and checks that it is the root of a mount, not a directory on the
/// filesystem around it: its device must differ from that of its parent (`..`, which at a
/// mount root is the directory it is mounted on).
fn open_mount_root(mount_point: &Path) -> Result<File> {
    let dir = File::open(mount_point).map_err(|e| Error::io("open", mount_point, e))?;
    let meta = dir
        .metadata()
        .map_err(|e| Error::io("stat", mount_point, e))?;
    let parent = mount_point.join("..");
    let parent_meta = fs::metadata(&parent).map_err(|e| Error::io("stat", &parent, e))?;
    if !meta.is_dir() || meta.dev() == parent_meta.dev() {
        return Err(Error::FailedPrecondition(format!(
            "{} is not the root of a mounted filesystem: refusing to freeze or thaw the \
             filesystem it lies on",
            mount_point.display()
        )));
    }
    Ok(dir)
}

fn freeze_fd(dir: &File, mount_point: &Path) -> Result<()> {
    let mut unused: libc::c_int = 0;
    // SAFETY: FIFREEZE ignores its argument; it points at a live int all the same, and
    // `dir` is open for the duration of the call.
    match unsafe { fifreeze(dir.as_raw_fd(), &mut unused) } {
        // EBUSY: already frozen.
        Ok(_) | Err(Errno::EBUSY) => Ok(()),
        Err(e) => Err(Error::sys("freeze", mount_point, e)),
    }
}

fn thaw_fd(dir: &File, mount_point: &Path) -> Result<()> {
    let mut unused: libc::c_int = 0;
    // SAFETY: FITHAW ignores its argument; it points at a live int all the same, and `dir`
    // is open for the duration of the call.
    match unsafe { fithaw(dir.as_raw_fd(), &mut unused) } {
        // EINVAL: not frozen.
        Ok(_) | Err(Errno::EINVAL) => Ok(()),
        Err(e) => Err(Error::sys("thaw", mount_point, e)),
    }
}

#[cfg(test)]
mod tests {
    use std::io::Write;
    use std::sync::mpsc;
    use std::thread;
    use std::time::Duration;

    use super::*;
    use crate::os::grow::scratch::ScratchFs;

    /// Starts a thread that writes and fsyncs a file; the receiver hears when it is done.
    fn write_in_background(path: PathBuf) -> mpsc::Receiver<std::io::Result<()>> {
        let (done, finished) = mpsc::channel();
        thread::spawn(move || {
            let result = File::create(&path).and_then(|mut f| {
                f.write_all(b"written")?;
                f.sync_all()
            });
            let _ = done.send(result);
        });
        finished
    }

    /// A write must finish within five seconds.
    fn assert_write_completes(path: PathBuf) {
        write_in_background(path)
            .recv_timeout(Duration::from_secs(5))
            .expect("write did not finish within 5 s")
            .expect("write");
    }

    fn ext4() -> ScratchFs {
        ScratchFs::new(64 << 20, &["mkfs.ext4", "-q", "-F"])
    }

    #[test]
    fn request_codes_are_iowr_x_int() {
        let size = std::mem::size_of::<libc::c_int>();
        let freeze = nix::request_code_readwrite!(b'X', 119, size);
        let thaw = nix::request_code_readwrite!(b'X', 120, size);
        assert_eq!(freeze as u32, 0xC004_5877);
        assert_eq!(thaw as u32, 0xC004_5878);
    }

    #[test]
    fn only_the_root_of_a_mount_is_frozen() {
        let dir = tempfile::tempdir().expect("temp dir");
        for path in [dir.path(), Path::new("/")] {
            let err = open_mount_root(path).expect_err("not a mount root of its own");
            assert!(matches!(err, Error::FailedPrecondition(_)), "{err}");
        }
        let err = open_mount_root(&dir.path().join("missing")).expect_err("missing");
        assert!(matches!(err, Error::Io { .. }), "{err}");
    }

    #[test]
    fn writes_wait_while_frozen_and_finish_after_thaw() {
        let scratch = ext4();
        freeze(&scratch.mount_point).expect("freeze");
        freeze(&scratch.mount_point).expect("freeze again");
        let finished = write_in_background(scratch.path("during"));
        assert!(
            matches!(
                finished.recv_timeout(Duration::from_millis(200)),
                Err(mpsc::RecvTimeoutError::Timeout)
            ),
            "a write went through a frozen filesystem"
        );
        thaw(&scratch.mount_point).expect("thaw");
        thaw(&scratch.mount_point).expect("thaw again");
        finished
            .recv_timeout(Duration::from_secs(5))
            .expect("the write did not finish after the thaw")
            .expect("write");
        assert_eq!(fs::read(scratch.path("during")).expect("read"), b"written");
    }

    #[test]
    fn the_guard_thaws_on_drop_on_thaw_and_on_panic() {
        let scratch = ext4();
        let guard = freeze_guard(&scratch.mount_point).expect("freeze");
        assert_eq!(guard.mount_point(), scratch.mount_point);
        drop(guard);
        assert_write_completes(scratch.path("after-drop"));

        let guard = freeze_guard(&scratch.mount_point).expect("freeze");
        guard.thaw().expect("thaw");
        assert_write_completes(scratch.path("after-thaw"));

        let mount_point = scratch.mount_point.clone();
        let panicked = std::panic::catch_unwind(move || {
            let _frozen = freeze_guard(&mount_point).expect("freeze");
            panic!("snapshot failed while frozen");
        });
        assert!(panicked.is_err());
        assert_write_completes(scratch.path("after-panic"));
    }
}
