//! `ferrovol doctor`: checks that this node can run the driver, one line per check.
//!
//! Checked: `/dev/loop-control`, the pool directory (present, a directory, writable, and
//! whether its filesystem has reflinks), the state directory (writable), the tools the
//! driver runs (blkid, mkfs and grow tools per filesystem), the kernel's filesystems, and
//! `CAP_SYS_RESOURCE` (online ext4 growth). A `fail` makes the command exit non-zero; a
//! `warn` names something that works with a limit (a filesystem that cannot be used, ext4
//! growth only offline). The lvm backend is not built yet, so there is nothing to check
//! for it.

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use serde::Serialize;

use super::{json, table, Output, Paths, Report};
use crate::config::FsType;
use crate::error::Result;
use crate::os::{caps, clone};

/// How a check came out.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Status {
    /// Fine.
    Ok,
    /// Works, with a limit the detail names.
    Warn,
    /// The driver cannot work as configured.
    Fail,
}

/// One check's result.
#[derive(Debug, Clone, Serialize)]
pub struct Check {
    /// What was checked.
    pub check: String,
    /// How it came out.
    pub status: Status,
    /// What was found, and for a problem what to do.
    pub detail: String,
}

fn check(name: &str, status: Status, detail: impl Into<String>) -> Check {
    Check {
        check: name.to_owned(),
        status,
        detail: detail.into(),
    }
}

/// The first executable called `program` on `$PATH`.
pub fn find_program(program: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|dir| dir.join(program))
        .find(|candidate| {
            fs::metadata(candidate)
                .is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
        })
}

/// Whether a directory takes a new file (made and removed again).
fn writable(dir: &Path) -> std::result::Result<(), String> {
    let probe = dir.join(format!(".ferrovol-doctor-{}", std::process::id()));
    fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(&probe)
        .and_then(|mut file| std::io::Write::write_all(&mut file, b"ferrovol doctor\n"))
        .map_err(|e| format!("cannot create a file: {e}"))?;
    fs::remove_file(&probe).map_err(|e| format!("cannot remove {}: {e}", probe.display()))
}

fn directory_checks(name: &str, dir: &Path) -> Check {
    match fs::metadata(dir) {
        Err(e) => check(name, Status::Fail, format!("{}: {e}", dir.display())),
        Ok(meta) if !meta.is_dir() => check(
            name,
            Status::Fail,
            format!("{} is not a directory", dir.display()),
        ),
        Ok(_) => match writable(dir) {
            Ok(()) => check(name, Status::Ok, format!("{} is writable", dir.display())),
            Err(why) => check(name, Status::Fail, format!("{}: {why}", dir.display())),
        },
    }
}

/// The filesystems the running kernel knows (`/proc/filesystems`).
fn kernel_filesystems() -> Vec<String> {
    fs::read_to_string("/proc/filesystems")
        .map(|text| {
            text.lines()
                .filter_map(|line| line.split_whitespace().last().map(str::to_owned))
                .collect()
        })
        .unwrap_or_default()
}

/// Runs every check.
pub fn run_checks(paths: &Paths, default_fs: FsType) -> Vec<Check> {
    let mut checks = Vec::new();
    checks.push(if Path::new("/dev/loop-control").exists() {
        check("loop devices", Status::Ok, "/dev/loop-control is present")
    } else {
        check(
            "loop devices",
            Status::Fail,
            "/dev/loop-control is missing: load the loop module (modprobe loop) or give the \
             node pod /dev",
        )
    });
    let pool = directory_checks("pool directory", &paths.pool_dir);
    let pool_ok = pool.status == Status::Ok;
    checks.push(pool);
    if pool_ok {
        checks.push(match clone::supports_reflink(&paths.pool_dir) {
            Ok(true) => check(
                "reflinks",
                Status::Ok,
                "the pool filesystem has reflinks: snapshots and clones take no time or space",
            ),
            Ok(false) => check(
                "reflinks",
                Status::Warn,
                "the pool filesystem has no reflinks: snapshots and clones copy the data \
                 (use XFS with reflink=1 or btrfs for instant ones)",
            ),
            Err(e) => check("reflinks", Status::Warn, format!("cannot tell: {e}")),
        });
    }
    checks.push(directory_checks("state directory", &paths.state_dir));
    checks.push(match find_program("blkid") {
        Some(path) => check("blkid", Status::Ok, path.display().to_string()),
        None => check(
            "blkid",
            Status::Fail,
            "not found on $PATH: install util-linux; without it no volume can be staged",
        ),
    });
    let known = kernel_filesystems();
    for fs in [FsType::Ext4, FsType::Xfs, FsType::Btrfs] {
        let tools: &[&str] = match fs {
            FsType::Ext4 => &["mkfs.ext4", "e2fsck", "resize2fs"],
            FsType::Xfs => &["mkfs.xfs", "xfs_growfs"],
            FsType::Btrfs => &["mkfs.btrfs", "btrfs"],
        };
        let package = match fs {
            FsType::Ext4 => "e2fsprogs",
            FsType::Xfs => "xfsprogs",
            FsType::Btrfs => "btrfs-progs",
        };
        let missing: Vec<&str> = tools
            .iter()
            .copied()
            .filter(|tool| find_program(tool).is_none())
            .collect();
        // Only the default filesystem is a must; the others serve volumes that ask for them.
        let severity = if fs == default_fs {
            Status::Fail
        } else {
            Status::Warn
        };
        let name = format!("{} tools", fs.as_str());
        checks.push(if missing.is_empty() {
            check(&name, Status::Ok, tools.join(", "))
        } else {
            check(
                &name,
                severity,
                format!(
                    "missing {}: install {package}; {} volumes cannot be made or grown",
                    missing.join(", "),
                    fs.as_str()
                ),
            )
        });
        if !known.is_empty() && !known.iter().any(|k| k == fs.as_str()) {
            checks.push(check(
                &format!("{} in the kernel", fs.as_str()),
                Status::Warn,
                format!(
                    "{} is not in /proc/filesystems (yet): a module may still load on mount",
                    fs.as_str()
                ),
            ));
        }
    }
    checks.push(if caps::has_effective(caps::CAP_SYS_RESOURCE) {
        check("online ext4 growth", Status::Ok, "CAP_SYS_RESOURCE is held")
    } else {
        check(
            "online ext4 growth",
            Status::Warn,
            "CAP_SYS_RESOURCE is missing: a mounted ext4 cannot grow; it grows at its next \
             NodeStageVolume instead (xfs, btrfs and block volumes grow online)",
        )
    });
    checks
}

/// `ferrovol doctor`.
///
/// # Errors
/// `Internal` only if the report cannot be rendered.
pub fn doctor(paths: &Paths, default_fs: FsType, output: Output) -> Result<Report> {
    let checks = run_checks(paths, default_fs);
    let failed = checks.iter().any(|c| c.status == Status::Fail);
    let text = match output {
        Output::Json => json(&checks)?,
        Output::Table => {
            let rows: Vec<Vec<String>> = checks
                .iter()
                .map(|c| {
                    let status = match c.status {
                        Status::Ok => "ok",
                        Status::Warn => "warn",
                        Status::Fail => "FAIL",
                    };
                    vec![c.check.clone(), status.to_owned(), c.detail.clone()]
                })
                .collect();
            table(&["CHECK", "STATUS", "DETAIL"], &rows)
        }
    };
    Ok(Report { text, failed })
}
