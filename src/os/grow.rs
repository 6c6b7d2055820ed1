//! Growing a mounted filesystem to fill its grown device (NodeExpandVolume): `resize2fs`
//! for ext4, `xfs_growfs` for XFS, `btrfs filesystem resize max` for btrfs, all online.
//!
//! The device must already have its new size (`LOOP_SET_CAPACITY` for a loop device, the
//! LV extended for lvm). Each tool grows to the full device and does nothing when the
//! filesystem fills it already, so a repeated call succeeds.

use std::path::Path;
use std::time::Duration;

use crate::config::FsType;
use crate::error::Result;
use crate::os::tools::{run, run_ok};

/// Grows the filesystem of type `fs` on `device`, mounted at `mount_point`, to the size of
/// the device.
///
/// resize2fs is given the device; xfs_growfs and btrfs, which work through the mounted
/// filesystem, the mount point.
///
/// # Errors
/// `Io` when the tool cannot start, `Timeout` when it runs longer than `timeout`, `Tool`
/// when it fails (not mounted, device not grown, ...).
pub async fn grow_filesystem(
    fs: FsType,
    device: &Path,
    mount_point: &Path,
    timeout: Duration,
) -> Result<()> {
    let (program, args) = grow_command(fs, device, mount_point);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    run_ok(program, &args, timeout).await.map(drop)
}

/// Grows an unmounted ext4 filesystem to its device's size: `e2fsck -f -p` (which
/// resize2fs demands first, and which replays a journal left by a frozen snapshot), then
/// `resize2fs`. Unlike online resize this needs no `CAP_SYS_RESOURCE`.
///
/// # Errors
/// `Tool` when e2fsck finds errors it cannot fix on its own or resize2fs fails; `Io` and
/// `Timeout` as for [`grow_filesystem`].
pub async fn grow_ext4_offline(device: &Path, timeout: Duration) -> Result<()> {
    let dev = device.to_string_lossy();
    let check = run("e2fsck", &["-f", "-p", dev.as_ref()], timeout).await?;
    // 0: clean, 1: errors fixed; anything else needs a person.
    if !matches!(check.status.code(), Some(0 | 1)) {
        return Err(crate::error::Error::Tool {
            program: "e2fsck".into(),
            args: format!("-f -p {dev}"),
            status: check.status.to_string(),
            stderr: String::from_utf8_lossy(&check.stderr).trim().to_owned(),
        });
    }
    run_ok("resize2fs", &[dev.as_ref()], timeout)
        .await
        .map(drop)
}

/// The program and arguments that grow `fs`.
fn grow_command(fs: FsType, device: &Path, mount_point: &Path) -> (&'static str, Vec<String>) {
    let device = device.to_string_lossy().into_owned();
    let mount_point = mount_point.to_string_lossy().into_owned();
    match fs {
        FsType::Ext4 => ("resize2fs", vec![device]),
        FsType::Xfs => ("xfs_growfs", vec![mount_point]),
        FsType::Btrfs => (
            "btrfs",
            vec![
                "filesystem".into(),
                "resize".into(),
                "max".into(),
                mount_point,
            ],
        ),
    }
}

/// Scratch filesystems on loop devices for the root tests of the OS layer.
#[cfg(test)]
pub(crate) mod scratch {
    use std::fs::File;
    use std::path::{Path, PathBuf};
    use std::process::Command;

    use tempfile::TempDir;

    /// Fails the test, loudly, when not running as root.
    pub(crate) fn require_root(what: &str) {
        assert!(
            nix::unistd::geteuid().is_root(),
            "this test needs root ({what}); run the tests as root, as CI does"
        );
    }

    /// Runs a command and fails the test unless it succeeds.
    pub(crate) fn run(program: &str, args: &[&str]) {
        let output = Command::new(program)
            .args(args)
            .output()
            .unwrap_or_else(|e| panic!("cannot run {program}: {e}"));
        assert!(
            output.status.success(),
            "{program} {} failed: {}",
            args.join(" "),
            String::from_utf8_lossy(&output.stderr)
        );
    }

    /// A filesystem in a sparse image file, mounted through a loop device; unmounted (which
    /// detaches the loop device) and deleted on drop, also when the test fails.
    #[derive(Debug)]
    pub(crate) struct ScratchFs {
        /// Where the filesystem is mounted.
        pub(crate) mount_point: PathBuf,
        /// The image file behind the loop device.
        pub(crate) image: PathBuf,
        /// Holds the image and the mount point; removed after the unmount.
        _dir: TempDir,
    }

    impl ScratchFs {
        /// Makes an image of `size` bytes, formats it with `mkfs` (program and options; the
        /// image path is appended) and mounts it with `mount -o loop`.
        pub(crate) fn new(size: u64, mkfs: &[&str]) -> ScratchFs {
            require_root("it mounts loop filesystems");
            let dir = tempfile::tempdir().expect("temp dir");
            let image = dir.path().join("fs.img");
            File::create(&image)
                .and_then(|f| f.set_len(size))
                .expect("create image");
            let image_arg = image.to_str().expect("utf-8 temp path");
            let (program, options) = mkfs.split_first().expect("a mkfs program");
            let mut args = options.to_vec();
            args.push(image_arg);
            run(program, &args);
            let mount_point = dir.path().join("mnt");
            std::fs::create_dir(&mount_point).expect("create mount point");
            let mount_point = mount_point.canonicalize().expect("canonical mount point");
            let mount_arg = mount_point.to_str().expect("utf-8 temp path");
            run("mount", &["-o", "loop", image_arg, mount_arg]);
            ScratchFs {
                mount_point,
                image,
                _dir: dir,
            }
        }

        /// The loop device it is mounted from, from the mount table.
        pub(crate) fn device(&self) -> PathBuf {
            let table = crate::os::mount::read_mountinfo().expect("read mountinfo");
            let entry = crate::os::mount::mount_at(&table, &self.mount_point)
                .unwrap_or_else(|| panic!("{} is not mounted", self.mount_point.display()));
            PathBuf::from(&entry.source)
        }

        /// A path inside the filesystem.
        pub(crate) fn path(&self, name: &str) -> PathBuf {
            self.mount_point.join(name)
        }
    }

    impl Drop for ScratchFs {
        fn drop(&mut self) {
            // A test that failed while frozen must not leave an unmount hanging.
            let _ = crate::os::freeze::thaw(&self.mount_point);
            let mount_point = self.mount_point.as_os_str();
            let unmounted = Command::new("umount")
                .arg(mount_point)
                .status()
                .is_ok_and(|s| s.success());
            if !unmounted {
                // Something still holds it: detach it lazily rather than leak the mount.
                let _ = Command::new("umount").arg("-l").arg(mount_point).status();
            }
        }
    }

    /// Size in bytes of the filesystem mounted at `path`.
    pub(crate) fn fs_size(path: &Path) -> u64 {
        crate::os::statfs::usage(path).expect("statvfs").total_bytes
    }
}

#[cfg(test)]
mod tests {
    use std::fs::OpenOptions;
    use std::time::Instant;

    use super::scratch::{fs_size, run, ScratchFs};
    use super::*;

    const TIMEOUT: Duration = Duration::from_secs(60);

    #[test]
    fn each_filesystem_has_its_grow_command() {
        let dev = Path::new("/dev/loop3");
        let mnt = Path::new("/staging/v 1");
        assert_eq!(
            grow_command(FsType::Ext4, dev, mnt),
            ("resize2fs", vec!["/dev/loop3".to_owned()])
        );
        assert_eq!(
            grow_command(FsType::Xfs, dev, mnt),
            ("xfs_growfs", vec!["/staging/v 1".to_owned()])
        );
        assert_eq!(
            grow_command(FsType::Btrfs, dev, mnt),
            (
                "btrfs",
                ["filesystem", "resize", "max", "/staging/v 1"]
                    .map(String::from)
                    .to_vec()
            )
        );
    }

    /// Grows the image of a mounted scratch filesystem from `from` to `to` bytes, refreshes
    /// the loop device, grows the filesystem online (twice: the second is a no-op) and
    /// checks that statvfs sees the new size.
    async fn grows_online(fs: FsType, mkfs: &[&str], from: u64, to: u64) {
        let started = Instant::now();
        let scratch = ScratchFs::new(from, mkfs);
        let device = scratch.device();
        let before = fs_size(&scratch.mount_point);
        OpenOptions::new()
            .write(true)
            .open(&scratch.image)
            .and_then(|f| f.set_len(to))
            .expect("grow image");
        run("losetup", &["-c", device.to_str().expect("utf-8 device")]);
        grow_filesystem(fs, &device, &scratch.mount_point, TIMEOUT)
            .await
            .expect("grow filesystem");
        let after = fs_size(&scratch.mount_point);
        let added = to - from;
        assert!(
            after >= before + added * 9 / 10,
            "{fs:?}: {before} -> {after} bytes after growing the device by {added}"
        );
        grow_filesystem(fs, &device, &scratch.mount_point, TIMEOUT)
            .await
            .expect("grow filesystem a second time");
        assert_eq!(fs_size(&scratch.mount_point), after);
        eprintln!("{fs:?} grown online in {:?}", started.elapsed());
    }

    /// ext4 online resize is a kernel call that needs `CAP_SYS_RESOURCE`. With it the
    /// filesystem grows; without it (a restricted container, as on the development
    /// machines) the tool's refusal must come back as an error, not as a silent no-op.
    #[tokio::test]
    async fn ext4_grows_online_or_reports_the_missing_capability() {
        if crate::os::caps::has_effective(crate::os::caps::CAP_SYS_RESOURCE) {
            grows_online(
                FsType::Ext4,
                &["mkfs.ext4", "-q", "-F"],
                64 << 20,
                128 << 20,
            )
            .await;
            return;
        }
        let scratch = ScratchFs::new(64 << 20, &["mkfs.ext4", "-q", "-F"]);
        let device = scratch.device();
        OpenOptions::new()
            .write(true)
            .open(&scratch.image)
            .and_then(|f| f.set_len(128 << 20))
            .expect("grow image");
        run("losetup", &["-c", device.to_str().expect("utf-8 device")]);
        let err = grow_filesystem(FsType::Ext4, &device, &scratch.mount_point, TIMEOUT)
            .await
            .expect_err("ext4 online resize without CAP_SYS_RESOURCE");
        assert!(
            matches!(err, crate::error::Error::Tool { ref program, ref stderr, .. }
                if program == "resize2fs" && stderr.contains("Permission denied")),
            "{err}"
        );
    }

    #[tokio::test]
    async fn xfs_grows_online() {
        grows_online(FsType::Xfs, &["mkfs.xfs", "-q"], 300 << 20, 400 << 20).await;
    }

    #[tokio::test]
    async fn btrfs_grows_online() {
        grows_online(FsType::Btrfs, &["mkfs.btrfs", "-q"], 256 << 20, 384 << 20).await;
    }

    #[tokio::test]
    async fn growing_an_unmounted_path_fails_with_the_tool_error() {
        let dir = tempfile::tempdir().expect("temp dir");
        let err = grow_filesystem(FsType::Xfs, Path::new("/dev/null"), dir.path(), TIMEOUT)
            .await
            .expect_err("not an xfs mount");
        assert!(
            matches!(err, crate::error::Error::Tool { ref program, .. } if program == "xfs_growfs"),
            "{err}"
        );
    }
}
