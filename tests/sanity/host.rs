//! What the host kernel shows and the few changes tests make behind the driver's back.
//!
//! Reads `/proc/self/mountinfo`, `/sys/block/loop*/loop/backing_file`, `/sys/block/loop*/dev`
//! and `statvfs(3)`; changes things only with `umount2(MNT_DETACH)` and `losetup -d`, for the
//! tests that simulate a reboot or a detached device and for the cleanup of last resort.

use std::fs;
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

/// Unmounts everything below `root` and detaches loop devices backed by files below `pool`;
/// returns what it had to remove.
pub fn cleanup_last_resort(root: &Path, pool: &Path) -> Vec<String> {
    let mut removed = Vec::new();
    for _ in 0..8 {
        let mut found = mounts_under(root);
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
