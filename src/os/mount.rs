//! Mounts: `mount(2)`, `umount2(2)` and reading `/proc/self/mountinfo`.
//!
//! The mount table is always read from mountinfo (never from `mount` output). Parsing is a
//! single pass over a file read once, so a mount table that changes underneath cannot make
//! it loop.

use std::fs;
use std::path::{Path, PathBuf};

use nix::errno::Errno;
use nix::mount::{umount2, MntFlags, MsFlags};

use crate::error::{Error, Result};

const MOUNTINFO: &str = "/proc/self/mountinfo";

/// One line of `/proc/self/mountinfo`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MountEntry {
    /// `major:minor` of the mounted device (st_dev of files in it).
    pub device: (u32, u32),
    /// The directory of the mounted filesystem that appears at the mount point (`/` for a
    /// whole filesystem, `/loop3` for a bind of `/dev/loop3`).
    pub root: String,
    /// Where it is mounted.
    pub mount_point: PathBuf,
    /// Per-mount options (`rw`, `ro`, `nosuid`, ...).
    pub options: String,
    /// The filesystem type.
    pub fs_type: String,
    /// The mount source (`/dev/loop3`).
    pub source: String,
}

impl MountEntry {
    /// Whether the mount is read-only.
    pub fn read_only(&self) -> bool {
        self.options.split(',').any(|o| o == "ro")
    }
}

/// Reads the current mount table.
///
/// # Errors
/// `Io` when mountinfo cannot be read.
pub fn read_mountinfo() -> Result<Vec<MountEntry>> {
    let text = fs::read_to_string(MOUNTINFO).map_err(|e| Error::io("read", MOUNTINFO, e))?;
    Ok(parse_mountinfo(&text))
}

/// Parses mountinfo text; malformed lines are skipped.
pub fn parse_mountinfo(text: &str) -> Vec<MountEntry> {
    text.lines().filter_map(parse_line).collect()
}

fn parse_line(line: &str) -> Option<MountEntry> {
    let mut fields = line.split(' ');
    let _mount_id = fields.next()?;
    let _parent_id = fields.next()?;
    let (major, minor) = fields.next()?.split_once(':')?;
    let root = unescape(fields.next()?);
    let mount_point = PathBuf::from(unescape(fields.next()?));
    let options = fields.next()?.to_owned();
    // Optional fields end with a lone "-".
    for field in fields.by_ref() {
        if field == "-" {
            break;
        }
    }
    let fs_type = fields.next()?.to_owned();
    let source = unescape(fields.next()?);
    Some(MountEntry {
        device: (major.parse().ok()?, minor.parse().ok()?),
        root,
        mount_point,
        options,
        fs_type,
        source,
    })
}

/// Undoes the octal escapes (`\040` for space and so on) of mountinfo.
fn unescape(field: &str) -> String {
    if !field.contains('\\') {
        return field.to_owned();
    }
    let bytes = field.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let octal = bytes
            .get(i + 1..i + 4)
            .filter(|d| d.iter().all(|b| (b'0'..=b'7').contains(b)));
        match (bytes[i], octal) {
            (b'\\', Some(d)) => {
                let value = d.iter().fold(0u32, |acc, b| acc * 8 + u32::from(b - b'0'));
                out.push(u8::try_from(value).unwrap_or(b'?'));
                i += 4;
            }
            (b, _) => {
                out.push(b);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// The topmost mount at exactly `path`, if any.
pub fn mount_at<'a>(table: &'a [MountEntry], path: &Path) -> Option<&'a MountEntry> {
    table.iter().rev().find(|m| m.mount_point == path)
}

/// Mounts a filesystem from `device` at `target`.
///
/// # Errors
/// `Io` carrying the errno (EINVAL for bad options, for instance).
pub fn mount_fs(
    device: &Path,
    target: &Path,
    fs_type: &str,
    flags: MsFlags,
    data: &str,
) -> Result<()> {
    let data = (!data.is_empty()).then_some(data);
    nix::mount::mount(Some(device), target, Some(fs_type), flags, data)
        .map_err(|e| Error::sys("mount", target, e))
}

/// Bind-mounts `source` onto `target`, then applies `flags` (read-only and the like) with
/// a bind remount, since the kernel ignores them on the bind itself.
///
/// # Errors
/// `Io` for the step that failed; a failed remount undoes the bind.
pub fn bind(source: &Path, target: &Path, flags: MsFlags) -> Result<()> {
    nix::mount::mount(
        Some(source),
        target,
        None::<&str>,
        MsFlags::MS_BIND,
        None::<&str>,
    )
    .map_err(|e| Error::sys("bind mount onto", target, e))?;
    if flags.is_empty() {
        return Ok(());
    }
    let remount = MsFlags::MS_BIND | MsFlags::MS_REMOUNT | flags;
    if let Err(e) = nix::mount::mount(None::<&str>, target, None::<&str>, remount, None::<&str>) {
        let _ = unmount(target);
        return Err(Error::sys("remount with flags", target, e));
    }
    Ok(())
}

/// How often an unmount that finds the mount busy is tried, a little apart. A mount is
/// busy for an instant when another process holds it only briefly: a child forked by any
/// multi-threaded process inherits its open files until it execs, and blkid or udev
/// open device nodes to probe them. A mount really in use stays busy through all tries.
const UNMOUNT_TRIES: u32 = 8;

/// Unmounts `target` without following a symlink there. Not mounted counts as success.
/// A busy mount is tried again a few times within about half a second (blocks the thread).
///
/// # Errors
/// `Io` for EBUSY that lasts, and other failures.
pub fn unmount(target: &Path) -> Result<()> {
    let mut tries = 1;
    loop {
        match umount2(target, MntFlags::UMOUNT_NOFOLLOW) {
            Ok(()) | Err(Errno::EINVAL) | Err(Errno::ENOENT) => return Ok(()),
            Err(Errno::EBUSY) if tries < UNMOUNT_TRIES => {
                std::thread::sleep(std::time::Duration::from_millis(15 * u64::from(tries)));
                tries += 1;
            }
            Err(e) => return Err(Error::sys("unmount", target, e)),
        }
    }
}

/// Mount flags from a CSI capability, split into kernel flags and filesystem options.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MountOptions {
    /// Flags for `mount(2)`.
    pub flags: MsFlags,
    /// The comma-separated option string passed to the filesystem.
    pub data: String,
}

/// Flags that would weaken the isolation of a volume or mount something else entirely.
const REFUSED_FLAGS: &[&str] = &[
    "suid",
    "dev",
    "bind",
    "rbind",
    "remount",
    "move",
    "make-shared",
    "shared",
    "rshared",
    "defaults",
    "user",
    "users",
    "owner",
    "group",
];

/// Filesystem options that name something outside the volume (a host device for a journal,
/// log, realtime section or extra btrfs device; a security label) or that turn a fault of
/// the volume into a crash of the node (`errors=panic`). Refused whatever their value.
const REFUSED_OPTIONS: &[&str] = &[
    "journal_path",
    "journal_dev",
    "logdev",
    "rtdev",
    "device",
    "context",
    "fscontext",
    "defcontext",
    "rootcontext",
    "seclabel",
];

/// Turns the `mount_flags` of a capability into kernel flags and filesystem options.
///
/// Every mount ferrovol makes is `nosuid` and `nodev`; flags that would undo that, or that
/// turn the mount into a bind, move or remount, are refused, and so are filesystem options
/// that reach outside the volume: the ones in [`REFUSED_OPTIONS`], any option that holds
/// a path (a `/`), and `errors=panic`.
///
/// # Errors
/// `InvalidArgument` naming the offending flag.
pub fn parse_mount_flags(mount_flags: &[String]) -> Result<MountOptions> {
    let mut opts = MountOptions {
        flags: MsFlags::MS_NOSUID | MsFlags::MS_NODEV,
        data: String::new(),
    };
    for raw in mount_flags {
        let flag = raw.trim();
        if flag.is_empty() || flag.len() > 256 || flag.contains([',', '\0', '\n', ' ']) {
            return Err(Error::InvalidArgument(format!(
                "mount flag {:?} ({} bytes) is empty, too long or contains a separator",
                crate::validate::clip(raw),
                raw.len()
            )));
        }
        if REFUSED_FLAGS.contains(&flag) {
            return Err(Error::InvalidArgument(format!(
                "mount flag {flag:?} is not allowed: it would weaken the volume's isolation"
            )));
        }
        let option = flag.split_once('=').map_or(flag, |(option, _)| option);
        if REFUSED_OPTIONS.contains(&option) || flag.contains('/') || flag == "errors=panic" {
            return Err(Error::InvalidArgument(format!(
                "mount flag {flag:?} is not allowed: it would reach outside the volume (a host \
                 device, path or security label) or let the volume crash the node"
            )));
        }
        let kernel = match flag {
            "ro" => Some(MsFlags::MS_RDONLY),
            "rw" | "nosuid" | "nodev" | "exec" | "async" | "relatime" => Some(MsFlags::empty()),
            "noexec" => Some(MsFlags::MS_NOEXEC),
            "sync" => Some(MsFlags::MS_SYNCHRONOUS),
            "dirsync" => Some(MsFlags::MS_DIRSYNC),
            "noatime" => Some(MsFlags::MS_NOATIME),
            "nodiratime" => Some(MsFlags::MS_NODIRATIME),
            "strictatime" => Some(MsFlags::MS_STRICTATIME),
            "lazytime" => Some(MsFlags::MS_LAZYTIME),
            "mand" | "nomand" => None,
            _ => None,
        };
        match kernel {
            Some(f) => opts.flags |= f,
            None => {
                if !opts.data.is_empty() {
                    opts.data.push(',');
                }
                opts.data.push_str(flag);
            }
        }
    }
    Ok(opts)
}

#[cfg(test)]
mod tests {
    use super::*;

    const SAMPLE: &str = "\
22 1 252:0 / / rw,relatime shared:1 - ext4 /dev/vda rw
90 22 7:3 / /var/lib/kubelet/plugins/st\\040age rw,nosuid,nodev shared:40 - xfs /dev/loop3 rw,attr2
91 22 7:3 / /pods/x/mount ro,nosuid,nodev - xfs /dev/loop3 rw,attr2
92 22 0:5 /loop4 /pods/y/dev rw,nosuid - devtmpfs udev rw,size=10k
";

    #[test]
    fn parses_fields_and_escapes() {
        let table = parse_mountinfo(SAMPLE);
        assert_eq!(table.len(), 4);
        assert_eq!(
            table[1].mount_point,
            Path::new("/var/lib/kubelet/plugins/st age")
        );
        assert_eq!(table[1].device, (7, 3));
        assert_eq!(table[1].source, "/dev/loop3");
        assert_eq!(table[1].fs_type, "xfs");
        assert!(!table[1].read_only());
        assert!(table[2].read_only());
        assert_eq!(table[3].root, "/loop4");
        assert_eq!(
            mount_at(&table, Path::new("/pods/x/mount")),
            Some(&table[2])
        );
        assert_eq!(mount_at(&table, Path::new("/pods/x")), None);
    }

    #[test]
    fn malformed_lines_are_skipped() {
        assert!(parse_mountinfo("garbage\n1 2 x:y\n\n").is_empty());
        assert_eq!(unescape("a\\1"), "a\\1");
        assert_eq!(unescape("tail\\"), "tail\\");
    }

    #[test]
    fn mount_flags_split_into_kernel_flags_and_data() {
        let opts = parse_mount_flags(&[
            "ro".into(),
            "noatime".into(),
            "discard".into(),
            "errors=remount-ro".into(),
        ])
        .expect("valid flags");
        assert!(opts.flags.contains(
            MsFlags::MS_RDONLY | MsFlags::MS_NOATIME | MsFlags::MS_NOSUID | MsFlags::MS_NODEV
        ));
        assert_eq!(opts.data, "discard,errors=remount-ro");
    }

    #[test]
    fn weakening_flags_are_refused() {
        for bad in [
            "suid",
            "dev",
            "bind",
            "remount",
            "a,b",
            "",
            "logdev=/dev/sda",
            "device=/dev/sdb",
            "journal_path=/dev/vda1",
            "journal_dev=2049",
            "context=system_u:object_r:etc_t:s0",
            "usrjquota=/etc/passwd",
            "errors=panic",
        ] {
            assert!(
                matches!(
                    parse_mount_flags(&[bad.into()]),
                    Err(Error::InvalidArgument(_))
                ),
                "{bad}"
            );
        }
    }
}
