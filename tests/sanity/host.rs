//! What the host kernel shows and the few changes tests make behind the driver's back.
//!
//! Reads `/proc/self/mountinfo`, `/sys/block/loop*/loop/backing_file`, `/sys/block/loop*/dev`,
//! `statvfs(3)` and `stat(2)` block counts; changes things only with `umount2(MNT_DETACH)` and
//! `losetup -d`, for the tests that simulate a reboot or a detached device and for the cleanup
//! of last resort.
//!
//! The one thing the harness itself builds with host tools is a pool on a filesystem of the
//! test's choice ([`PoolFs`]): `mkfs.xfs`/`mkfs.ext4` on an image file in the temp dir and
//! `mount -o loop`, undone by [`release_pool_fs`]. That mount and its loop device belong to
//! the harness, not to the driver, and the leak check leaves them out.

use std::fs::{self, File};
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

/// The permission bits of a path.
pub fn mode_of(path: &Path) -> u32 {
    fs::symlink_metadata(path)
        .expect("stat")
        .permissions()
        .mode()
        & 0o7777
}

/// One line of `/proc/self/mountinfo`.
#[derive(Debug, Clone)]
pub struct MountEntry {
    /// `major:minor` of the mounted filesystem's device.
    pub major_minor: String,
    /// Where it is mounted.
    pub mount_point: PathBuf,
    /// Per-mount options, e.g. `rw,relatime` or `ro,relatime`.
    pub options: Vec<String>,
    /// Filesystem type, e.g. `ext4`.
    pub fs_type: String,
    /// Mount source, e.g. `/dev/loop3`.
    pub source: String,
}

impl MountEntry {
    /// True when the mount itself is read-only.
    pub fn is_read_only(&self) -> bool {
        self.options.iter().any(|o| o == "ro")
    }
}

/// Undoes the octal escapes (`\040`) mountinfo uses for spaces and the like.
fn unescape_mount_field(field: &str) -> String {
    let bytes = field.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'\\' && i + 4 <= bytes.len() {
            let oct = std::str::from_utf8(&bytes[i + 1..i + 4]).ok();
            if let Some(v) = oct.and_then(|o| u8::from_str_radix(o, 8).ok()) {
                out.push(v);
                i += 4;
                continue;
            }
        }
        out.push(bytes[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// All mounts of this process's mount namespace.
pub fn mounts() -> Vec<MountEntry> {
    let text = fs::read_to_string("/proc/self/mountinfo").expect("read /proc/self/mountinfo");
    text.lines()
        .filter_map(|line| {
            let fields: Vec<&str> = line.split(' ').collect();
            let sep = fields.iter().position(|f| *f == "-")?;
            if fields.len() < sep + 3 || sep < 6 {
                return None;
            }
            Some(MountEntry {
                major_minor: fields[2].to_owned(),
                mount_point: PathBuf::from(unescape_mount_field(fields[4])),
                options: fields[5].split(',').map(str::to_owned).collect(),
                fs_type: fields[sep + 1].to_owned(),
                source: unescape_mount_field(fields[sep + 2]),
            })
        })
        .collect()
}

/// Mounts at or below `dir`.
pub fn mounts_under(dir: &Path) -> Vec<MountEntry> {
    mounts()
        .into_iter()
        .filter(|m| m.mount_point.starts_with(dir))
        .collect()
}

/// The topmost mount exactly at `path`, if any.
pub fn mount_at(path: &Path) -> Option<MountEntry> {
    mounts().into_iter().rev().find(|m| m.mount_point == path)
}

/// Asserts that a mount shows the filesystem on `lo`. Most filesystems report the loop
/// device's `major:minor`; btrfs reports an anonymous device number, so its mount source
/// (`/dev/loopN`) is compared instead.
#[track_caller]
pub fn assert_mount_of(m: &MountEntry, lo: &LoopDevice, what: &str) {
    assert!(
        m.major_minor == lo.major_minor || Path::new(&m.source) == lo.device,
        "{what}: mount {} shows {} ({}), not the volume's loop device {} ({})",
        m.mount_point.display(),
        m.source,
        m.major_minor,
        lo.device.display(),
        lo.major_minor
    );
}

/// How many mounts are stacked exactly at `path`.
pub fn mount_count_at(path: &Path) -> usize {
    mounts()
        .into_iter()
        .filter(|m| m.mount_point == path)
        .count()
}

/// An attached loop device.
#[derive(Debug, Clone)]
pub struct LoopDevice {
    /// `/dev/loopN`.
    pub device: PathBuf,
    /// `major:minor` from sysfs.
    pub major_minor: String,
    /// The backing file as the kernel reports it (may end in ` (deleted)`).
    pub backing_file: String,
}

/// Every attached loop device.
pub fn loop_devices() -> Vec<LoopDevice> {
    let Ok(entries) = fs::read_dir("/sys/block") else {
        return Vec::new();
    };
    entries
        .filter_map(Result::ok)
        .filter_map(|e| {
            let name = e.file_name().to_string_lossy().into_owned();
            if !name.starts_with("loop") {
                return None;
            }
            let backing = fs::read_to_string(e.path().join("loop/backing_file")).ok()?;
            let dev = fs::read_to_string(e.path().join("dev")).unwrap_or_default();
            Some(LoopDevice {
                device: PathBuf::from(format!("/dev/{name}")),
                major_minor: dev.trim().to_owned(),
                backing_file: backing.trim_end_matches('\n').to_owned(),
            })
        })
        .collect()
}

/// Loop devices whose backing file lies below `dir`.
pub fn loops_backed_under(dir: &Path) -> Vec<LoopDevice> {
    loop_devices()
        .into_iter()
        .filter(|l| Path::new(&l.backing_file).starts_with(dir))
        .collect()
}

/// `major:minor` of a device special file (a published block target).
pub fn rdev_of(path: &Path) -> String {
    let rdev = fs::metadata(path).expect("stat a device node").rdev();
    let major = ((rdev >> 8) & 0xfff) | ((rdev >> 32) & !0xfff);
    let minor = (rdev & 0xff) | ((rdev >> 12) & !0xff);
    format!("{major}:{minor}")
}

/// Unmounts `path` behind the driver's back (lazy, so it cannot fail on a busy mount).
pub fn umount_behind_back(path: &Path) {
    nix::mount::umount2(path, nix::mount::MntFlags::MNT_DETACH)
        .unwrap_or_else(|e| panic!("umount {}: {e}", path.display()));
}

/// Detaches a loop device behind the driver's back, as `losetup -d` does.
pub fn detach_loop_behind_back(device: &Path) {
    let out = Command::new("losetup")
        .arg("-d")
        .arg(device)
        .output()
        .expect("run losetup -d");
    assert!(
        out.status.success(),
        "losetup -d {}: {}",
        device.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    // LOOP_CLR_FD on a device someone still holds open only sets autoclear; wait until the
    // kernel really lets go.
    let deadline = Instant::now() + Duration::from_secs(5);
    while loop_devices().iter().any(|l| l.device == device) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Free bytes of the filesystem holding `path` (`f_bfree * f_frsize`, root's view).
pub fn fs_free_bytes(path: &Path) -> u64 {
    let st = nix::sys::statvfs::statvfs(path).expect("statvfs");
    #[allow(clippy::unnecessary_cast)]
    let free = st.blocks_free() as u64 * st.fragment_size() as u64;
    free
}

/// Size of the filesystem holding `path` (`f_blocks * f_frsize`).
pub fn fs_total_bytes(path: &Path) -> u64 {
    let st = nix::sys::statvfs::statvfs(path)
        .unwrap_or_else(|e| panic!("statvfs {}: {e}", path.display()));
    #[allow(clippy::unnecessary_cast)]
    let total = st.blocks() as u64 * st.fragment_size() as u64;
    total
}

/// Bytes an unprivileged writer may still use on the filesystem holding `path`
/// (`f_bavail * f_frsize`).
pub fn fs_available_bytes(path: &Path) -> u64 {
    let st = nix::sys::statvfs::statvfs(path)
        .unwrap_or_else(|e| panic!("statvfs {}: {e}", path.display()));
    #[allow(clippy::unnecessary_cast)]
    let avail = st.blocks_available() as u64 * st.fragment_size() as u64;
    avail
}

/// Bytes the filesystem allocated to a file (`st_blocks * 512`): less than its length when
/// it has holes.
pub fn allocated_bytes(path: &Path) -> u64 {
    fs::metadata(path)
        .unwrap_or_else(|e| panic!("stat {}: {e}", path.display()))
        .blocks()
        * 512
}

/// Writes back everything dirty on the filesystem holding `path` (`sync -f`), so that free
/// space and block counts read afterwards are settled.
pub fn sync_fs(path: &Path) {
    let out = Command::new("sync")
        .arg("-f")
        .arg(path)
        .output()
        .expect("run sync -f");
    assert!(
        out.status.success(),
        "sync -f {}: {}",
        path.display(),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// `CAP_SYS_RESOURCE`, the capability the kernel asks for before it grows a mounted ext4.
pub const CAP_SYS_RESOURCE: u32 = 24;

/// True when this process has capability `cap` in its effective set (`CapEff` in
/// `/proc/self/status`). The driver the harness starts runs with the same set.
pub fn has_effective_cap(cap: u32) -> bool {
    let status = fs::read_to_string("/proc/self/status").expect("read /proc/self/status");
    let hex = status
        .lines()
        .find_map(|l| l.strip_prefix("CapEff:"))
        .expect("CapEff in /proc/self/status")
        .trim();
    let mask = u64::from_str_radix(hex, 16).expect("CapEff is hex");
    mask >> cap & 1 == 1
}

/// A filesystem the harness makes for the pool (see `harness::Options::pool_fs`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PoolFs {
    /// XFS made with `-m reflink=1`: the driver must share extents (FICLONE).
    XfsReflink,
    /// ext4: no reflinks, so the driver must fall back to a sparse-aware copy.
    Ext4,
    /// A small ext4 ([`SMALL_POOL_FS_BYTES`]), cheap to fill up.
    SmallExt4,
}

/// Size of the (sparse) image file that holds a harness-made pool filesystem.
const POOL_FS_BYTES: u64 = 1 << 30;
/// Size of the image of a [`PoolFs::SmallExt4`] pool.
pub const SMALL_POOL_FS_BYTES: u64 = 128 << 20;

/// Runs a host tool a test needs, panicking with its stderr when it fails; returns its
/// standard output, trimmed.
pub fn run_tool<A: AsRef<std::ffi::OsStr> + std::fmt::Debug>(program: &str, args: &[A]) -> String {
    let out = Command::new(program)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("run {program}: {e}"));
    assert!(
        out.status.success(),
        "{program} {args:?} failed with {}: {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim().to_owned()
}

/// Makes a `kind` filesystem in a new sparse image file `image` and mounts it on
/// `mount_point` with `mount -o loop`.
pub fn make_pool_fs(image: &Path, mount_point: &Path, kind: PoolFs) {
    File::create(image)
        .and_then(|f| {
            f.set_len(if kind == PoolFs::SmallExt4 {
                SMALL_POOL_FS_BYTES
            } else {
                POOL_FS_BYTES
            })
        })
        .unwrap_or_else(|e| panic!("create the pool image {}: {e}", image.display()));
    match kind {
        PoolFs::XfsReflink => run_tool(
            "mkfs.xfs",
            &[
                "-q".as_ref(),
                "-m".as_ref(),
                "reflink=1".as_ref(),
                image.as_os_str(),
            ],
        ),
        PoolFs::Ext4 | PoolFs::SmallExt4 => run_tool(
            "mkfs.ext4",
            &["-q".as_ref(), "-F".as_ref(), image.as_os_str()],
        ),
    };
    run_tool(
        "mount",
        &[
            "-o".as_ref(),
            "loop".as_ref(),
            image.as_os_str(),
            mount_point.as_os_str(),
        ],
    );
}

/// Unmounts a pool made by [`make_pool_fs`] and detaches its loop device. With `lazy` the
/// unmount is `MNT_DETACH` and cannot fail; without it a busy pool is retried for a few
/// seconds (the driver may just have exited). Returns what could not be undone.
pub fn release_pool_fs(mount_point: &Path, image: &Path, lazy: bool) -> Vec<String> {
    let mut problems = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(5);
    while mount_at(mount_point).is_some() {
        let flags = if lazy {
            nix::mount::MntFlags::MNT_DETACH
        } else {
            nix::mount::MntFlags::empty()
        };
        match nix::mount::umount2(mount_point, flags) {
            Ok(()) => {}
            Err(nix::errno::Errno::EBUSY) if Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(50));
            }
            Err(e) => {
                problems.push(format!("umount {}: {e}", mount_point.display()));
                break;
            }
        }
    }
    let backed_by_image = || {
        loop_devices()
            .into_iter()
            .filter(|l| Path::new(l.backing_file.trim_end_matches(" (deleted)")) == image)
            .collect::<Vec<_>>()
    };
    for l in backed_by_image() {
        // `mount -o loop` sets autoclear, so this is usually done already.
        let _ = Command::new("losetup").arg("-d").arg(&l.device).output();
    }
    let deadline = Instant::now() + Duration::from_secs(5);
    while !backed_by_image().is_empty() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    for l in backed_by_image() {
        problems.push(format!(
            "pool loop device {} -> {} still attached",
            l.device.display(),
            l.backing_file
        ));
    }
    problems
}

/// Unmounts everything below `root` except the mount at `keep` (the harness's own pool
/// filesystem, released afterwards) and detaches loop devices backed by files below
/// `pool`; returns what it had to remove.
pub fn cleanup_last_resort(root: &Path, pool: &Path, keep: Option<&Path>) -> Vec<String> {
    let mut removed = Vec::new();
    for _ in 0..8 {
        let mut found: Vec<MountEntry> = mounts_under(root)
            .into_iter()
            .filter(|m| Some(m.mount_point.as_path()) != keep)
            .collect();
        if found.is_empty() {
            break;
        }
        // Deepest first, so nested mounts go before their parents.
        found.sort_by_key(|m| std::cmp::Reverse(m.mount_point.components().count()));
        for m in found {
            if nix::mount::umount2(&m.mount_point, nix::mount::MntFlags::MNT_DETACH).is_ok() {
                removed.push(format!("mount {}", m.mount_point.display()));
            }
        }
    }
    for l in loops_backed_under(pool) {
        let _ = Command::new("losetup").arg("-d").arg(&l.device).output();
        removed.push(format!("loop {} -> {}", l.device.display(), l.backing_file));
    }
    removed
}
