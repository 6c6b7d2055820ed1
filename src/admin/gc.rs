//! `ferrovol gc [--dry-run]`: finds what no record owns and removes it.
//!
//! What counts, and only in the driver's own pool:
//! - a **mount** of one of the pool's loop devices (a filesystem mount, or the bind of the
//!   device node onto a block target) at a path that no stage record names;
//! - a **loop device** attached to a pool file, when the file was deleted, is a snapshot,
//!   or belongs to a volume not staged on this node;
//! - a **backing file** `<volume id>.img` with neither a volume record nor a stage record,
//!   and a **snapshot file** without a snapshot record.
//!
//! Files the driver does not name (anything not `fv-…`/`fvs-…` + `.img`) are never
//! touched. Removal goes mounts first (deepest first), then loop devices, then files, and
//! runs only while gc holds the operations lock exclusively, so no driver operation is
//! half-way through making what gc would take for an orphan. `--dry-run` takes no lock:
//! it may list the storage of a CreateVolume running at that moment.
//!
//! gc refuses a pool whose owner marker (`POOL/.ferrovol-state`, written by the driver at
//! start) names another state directory: judged by the wrong records, every file would
//! look like an orphan. Any mount of a staged volume's device is kept, also ones that no
//! record names (kubelet's subPath binds and block maps).
//!
//! # Limitations
//! A state directory without volume records (a node-only process whose controller keeps
//! its records elsewhere, or a pool with no volumes left) makes gc keep every backing
//! file, and say so. An unmount or detach that hangs on a dead device holds the
//! operations lock, so the driver answers ABORTED until gc is killed.

use std::collections::BTreeMap;
use std::fs::{self, File};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde::Serialize;

use super::{json, table, Output, Paths, Records, Report};
use crate::backend::loopfile::{
    read_owner, snapshot_dir_in, snapshot_of_file, volume_of_file, OWNER_FILE,
};
use crate::backend::{Backend, LoopBackend};
use crate::error::{Error, Result};
use crate::locks::GATE_FILE;
use crate::os::loopdev::{self, LoopDevice};
use crate::os::{flock, mount};

/// What was found.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Kind {
    /// A mount of a pool loop device.
    Mount,
    /// A loop device attached to a pool file.
    LoopDevice,
    /// A volume backing file.
    BackingFile,
    /// A snapshot file.
    SnapshotFile,
}

/// What gc did about a finding.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Action {
    /// `--dry-run`: it would be removed.
    WouldRemove,
    /// Removed.
    Removed,
    /// Removal failed (see `error`).
    Failed,
    /// Left alone on purpose (see `reason`).
    Kept,
}

/// One thing no record owns.
#[derive(Debug, Clone, Serialize)]
pub struct Finding {
    /// What it is.
    pub kind: Kind,
    /// Its path (mount point, `/dev/loopN`, file).
    pub path: PathBuf,
    /// Why it counts as unowned.
    pub reason: String,
    /// What gc did.
    pub action: Action,
    /// Why removal failed, if it did.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// Refuses a pool whose owner marker names another state directory (or none): judged by
/// the wrong records, every file would look like an orphan.
fn check_owner(pool: &Path, state_dir: &Path) -> Result<()> {
    let state = fs::canonicalize(state_dir)
        .map_err(|e| Error::io("resolve state directory", state_dir, e))?;
    match read_owner(pool)? {
        Some(owner) if owner == state => Ok(()),
        Some(owner) => Err(Error::FailedPrecondition(format!(
            "pool {} belongs to the driver whose state directory is {}, not {}: pass \
             --state-dir {}",
            pool.display(),
            owner.display(),
            state.display(),
            owner.display()
        ))),
        None => Err(Error::FailedPrecondition(format!(
            "pool {} names no state directory ({} is missing): start the driver on it once",
            pool.display(),
            OWNER_FILE
        ))),
    }
}

/// Takes the operations lock exclusively, waiting up to `wait` for running operations.
fn lock_out_operations(state_dir: &Path, wait: Duration) -> Result<File> {
    let path = state_dir.join(GATE_FILE);
    let file = flock::open(&path)?;
    let deadline = Instant::now()
        .checked_add(wait)
        .unwrap_or_else(|| Instant::now() + Duration::from_secs(3600));
    loop {
        if flock::try_lock(&file, flock::Kind::Exclusive, &path)? {
            return Ok(file);
        }
        if Instant::now() >= deadline {
            return Err(Error::FailedPrecondition(format!(
                "the driver kept operations running for {wait:?} ({} is locked); try again",
                path.display()
            )));
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// The pool's loop devices, by device number, with the volume they belong to (`None` for
/// snapshot files and files the driver does not name).
struct PoolLoops {
    devices: BTreeMap<u32, (LoopDevice, PathBuf, Option<String>)>,
}

impl PoolLoops {
    fn read(pool: &Path) -> Result<Self> {
        let mut devices = BTreeMap::new();
        let snapshots = snapshot_dir_in(pool);
        for dir in [pool, snapshots.as_path()] {
            for (device, backing) in loopdev::attached_in(dir)? {
                let volume = (dir == pool)
                    .then(|| backing.file_name().and_then(|n| n.to_str()))
                    .flatten()
                    .and_then(volume_of_file)
                    .map(|id| id.to_string());
                devices.insert(device.number, (device, backing, volume));
            }
        }
        Ok(PoolLoops { devices })
    }

    /// The pool loop device a mount shows: `/dev/loopN` as its source, or a bind of the
    /// device node (root `/loopN` on devtmpfs).
    fn of_mount(&self, entry: &mount::MountEntry) -> Option<u32> {
        let from_source = entry.source.strip_prefix("/dev/loop");
        let from_root = (entry.fs_type == "devtmpfs")
            .then(|| entry.root.strip_prefix("/loop"))
            .flatten();
        let number: u32 = from_source.or(from_root)?.parse().ok()?;
        self.devices.contains_key(&number).then_some(number)
    }
}

/// Looks for what no record owns; removes it unless `dry_run`.
///
/// # Errors
/// `FailedPrecondition` when running operations keep the lock for `wait`; `Io` or
/// `Record` when the records, the pool or the mount table cannot be read.
pub fn collect(paths: &Paths, dry_run: bool, wait: Duration) -> Result<Vec<Finding>> {
    let _lock = if dry_run {
        None
    } else {
        Some(lock_out_operations(&paths.state_dir, wait)?)
    };
    let pool = fs::canonicalize(&paths.pool_dir)
        .map_err(|e| Error::io("resolve pool directory", &paths.pool_dir, e))?;
    check_owner(&pool, &paths.state_dir)?;
    let records = Records::read(paths)?;
    let loops = PoolLoops::read(&pool)?;
    let mut findings = Vec::new();

    // Mounts of pool loop devices at paths no stage record names.
    let mut stale_mounts: Vec<(&mount::MountEntry, u32)> = Vec::new();
    let table = mount::read_mountinfo()?;
    for entry in &table {
        let Some(number) = loops.of_mount(entry) else {
            continue;
        };
        let (_, _, volume) = &loops.devices[&number];
        // Any mount of a staged volume's device stays: besides the staging path and the
        // targets the records name, kubelet makes its own (subPath binds, the block
        // volume map) that only it knows.
        let owned = volume
            .as_deref()
            .is_some_and(|id| records.stage_of(id).is_some());
        if !owned {
            stale_mounts.push((entry, number));
        }
    }
    // Deepest first, so that a mount inside another comes off before it.
    stale_mounts.sort_by_key(|(e, _)| std::cmp::Reverse(e.mount_point.components().count()));
    for (entry, number) in stale_mounts {
        findings.push(Finding {
            kind: Kind::Mount,
            path: entry.mount_point.clone(),
            reason: format!(
                "a mount of /dev/loop{number}, whose volume is not staged on this node"
            ),
            action: Action::WouldRemove,
            error: None,
        });
    }

    // Loop devices of pool files that no staged volume explains.
    for (device, backing, volume) in loops.devices.values() {
        let reason = if device.backing_deleted {
            Some(format!(
                "its backing file {} was deleted",
                backing.display()
            ))
        } else {
            match volume {
                None => Some(format!(
                    "attached to {}, which no volume stages",
                    backing.display()
                )),
                Some(id) if records.stage_of(id).is_none() => {
                    Some(format!("volume {id} is not staged on this node"))
                }
                Some(_) => None,
            }
        };
        if let Some(reason) = reason {
            findings.push(Finding {
                kind: Kind::LoopDevice,
                path: device.path.clone(),
                reason,
                action: Action::WouldRemove,
                error: None,
            });
        }
    }

    // Files without records.
    // No volume records at all: a node-only state directory, or a pool whose volumes are
    // all gone. Either way no file can be told from a volume: keep them.
    let no_volume_records = records.volumes.is_empty();
    for entry in fs::read_dir(&pool).map_err(|e| Error::io("list pool", &pool, e))? {
        let entry = entry.map_err(|e| Error::io("list pool", &pool, e))?;
        let name = entry.file_name();
        let Some(id) = name.to_str().and_then(volume_of_file) else {
            continue;
        };
        let known = records.volumes.iter().any(|r| r.volume_id == id.as_str())
            || records.stage_of(id.as_str()).is_some();
        if known {
            continue;
        }
        let (action, reason) = if no_volume_records {
            (
                Action::Kept,
                format!(
                    "no record of volume {id}, but {} holds no volume records at all; remove \
                     the file by hand if it is really unused",
                    paths.state_dir.display()
                ),
            )
        } else {
            (Action::WouldRemove, format!("no record of volume {id}"))
        };
        findings.push(Finding {
            kind: Kind::BackingFile,
            path: entry.path(),
            reason,
            action,
            error: None,
        });
    }
    let snapshots = snapshot_dir_in(&pool);
    if snapshots.is_dir() {
        for entry in fs::read_dir(&snapshots).map_err(|e| Error::io("list", &snapshots, e))? {
            let entry = entry.map_err(|e| Error::io("list", &snapshots, e))?;
            let name = entry.file_name();
            let Some(id) = name.to_str().and_then(snapshot_of_file) else {
                continue;
            };
            if !records
                .snapshots
                .iter()
                .any(|s| s.snapshot_id == id.as_str())
            {
                findings.push(Finding {
                    kind: Kind::SnapshotFile,
                    path: entry.path(),
                    reason: format!("no record of snapshot {id}"),
                    action: Action::WouldRemove,
                    error: None,
                });
            }
        }
    }

    if !dry_run {
        let backend = LoopBackend::open(&pool)?;
        for finding in findings
            .iter_mut()
            .filter(|f| f.action == Action::WouldRemove)
        {
            let done = remove(finding, &loops, &backend);
            finding.action = if done.is_ok() {
                Action::Removed
            } else {
                Action::Failed
            };
            finding.error = done.err().map(|e| e.to_string());
        }
    }
    Ok(findings)
}

fn remove(finding: &Finding, loops: &PoolLoops, backend: &LoopBackend) -> Result<()> {
    let name = || {
        finding
            .path
            .file_name()
            .and_then(|n| n.to_str())
            .unwrap_or_default()
            .to_owned()
    };
    match finding.kind {
        Kind::Mount => mount::unmount(&finding.path),
        Kind::LoopDevice => {
            let device = loops
                .devices
                .values()
                .map(|(device, _, _)| device)
                .find(|d| d.path == finding.path)
                .ok_or_else(|| Error::NotFound(format!("{} went away", finding.path.display())))?;
            loopdev::detach(device)
        }
        Kind::BackingFile => {
            let id = volume_of_file(&name()).ok_or_else(|| {
                Error::Internal(format!("{} is not a volume file", finding.path.display()))
            })?;
            backend.delete(&id)
        }
        Kind::SnapshotFile => {
            let id = snapshot_of_file(&name()).ok_or_else(|| {
                Error::Internal(format!("{} is not a snapshot file", finding.path.display()))
            })?;
            backend.delete_snapshot(&id)
        }
    }
}

/// `ferrovol gc`.
///
/// # Errors
/// As [`collect`].
pub fn gc(paths: &Paths, dry_run: bool, wait: Duration, output: Output) -> Result<Report> {
    let findings = collect(paths, dry_run, wait)?;
    let failed = findings.iter().any(|f| f.action == Action::Failed);
    let text = match output {
        Output::Json => json(&findings)?,
        Output::Table if findings.is_empty() => "nothing to collect: every mount, loop device \
                                                 and file of the pool has its record\n"
            .to_owned(),
        Output::Table => {
            let rows: Vec<Vec<String>> = findings
                .iter()
                .map(|f| {
                    let action = match (f.action, &f.error) {
                        (Action::WouldRemove, _) => "would remove".to_owned(),
                        (Action::Removed, _) => "removed".to_owned(),
                        (Action::Kept, _) => "kept".to_owned(),
                        (Action::Failed, Some(e)) => format!("FAILED: {e}"),
                        (Action::Failed, None) => "FAILED".to_owned(),
                    };
                    let kind = match f.kind {
                        Kind::Mount => "mount",
                        Kind::LoopDevice => "loop device",
                        Kind::BackingFile => "backing file",
                        Kind::SnapshotFile => "snapshot file",
                    };
                    vec![
                        kind.to_owned(),
                        f.path.display().to_string(),
                        f.reason.clone(),
                        action,
                    ]
                })
                .collect();
            table(&["KIND", "PATH", "WHY", "ACTION"], &rows)
        }
    };
    Ok(Report { text, failed })
}
