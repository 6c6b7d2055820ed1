//! The loop backend: one sparse file per volume in a pool directory.
//!
//! # Design
//! A volume is `POOL/<volume id>.img`, created sparse with `ftruncate`, so creation costs
//! the same whatever the size. Sparse files must not overcommit the pool: the space the
//! pool can still promise is the filesystem's available space minus what existing volumes
//! may still grow into (their size less what they already occupy), times the
//! overprovisioning ratio (`--overprovision-ratio`, 1 by default: no overcommit). Those
//! figures are kept in memory ([`SpaceTally`]), so a create costs one `statvfs(2)`
//! whatever the number of volumes. A mutex over the tally makes check-and-create atomic,
//! so two concurrent creates cannot both take the last space; the fsyncs that make a new
//! file durable run after the mutex is released.
//!
//! Snapshots are files in `POOL/snapshots/`; snapshots, restores and clones are made with
//! reflinks where the pool filesystem has them (XFS with reflink, btrfs: constant time,
//! no space) and with a sparse-aware copy otherwise. A copy is a file of its own, so a
//! snapshot stays restorable after its source volume is deleted. When the source is
//! mounted on this node its filesystem is frozen around the copy.
//!
//! # Limitations
//! Space that other programs write into the pool's filesystem after a volume was created
//! can still starve it, and so can overprovisioning; then the writer inside the volume
//! sees ENOSPC (and NodeGetVolumeStats reports the volume abnormal).

use std::fs::{self, OpenOptions};
use std::io;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, MutexGuard};

use nix::unistd::{access, AccessFlags};

use crate::backend::tally::{self, Holding, SpaceTally};
use crate::backend::{Backend, Device, PoolCapacity, Source, StorageStatus};
use crate::error::{Error, Result};
use crate::ids::{ParsedId, SnapshotId, VolumeId};
use crate::os::freeze::{self, FrozenFs};
use crate::os::{clone, loopdev, mount, statfs};
use crate::store::{sync_dir, SnapshotRecord, VolumeRecord};

const SUFFIX: &str = ".img";
const SNAPSHOT_DIR: &str = "snapshots";

/// Sparse files in a pool directory.
#[derive(Debug)]
pub struct LoopBackend {
    /// The canonical path of the pool directory.
    pool_dir: PathBuf,
    /// Serialises the free-space check with the creation that depends on it, and holds
    /// what every volume was promised and already occupies.
    allocation: Mutex<SpaceTally>,
    /// How many times the pool's space sparse volumes may be promised (1.0: no more than
    /// exists).
    overprovision_ratio: f64,
    /// Whether the pool filesystem shares extents (FICLONE works), probed once at open.
    reflinks: bool,
}

/// The file in a pool that names the state directory of the driver that uses the pool, so
/// that `ferrovol gc` never judges a pool's files by another directory's records.
pub const OWNER_FILE: &str = ".ferrovol-state";

/// Records `state_dir` (canonical) as the pool's owner.
///
/// # Errors
/// `Io` when the directory cannot be resolved or the marker written.
pub fn write_owner(pool_dir: &Path, state_dir: &Path) -> Result<()> {
    let state = fs::canonicalize(state_dir).map_err(|e| Error::io("resolve", state_dir, e))?;
    let text = format!("{}\n", state.display());
    crate::store::write_atomically(pool_dir, OWNER_FILE, text.as_bytes())
}

/// The state directory recorded as the pool's owner; `None` when there is no marker.
///
/// # Errors
/// `Io` when the marker exists but cannot be read.
pub fn read_owner(pool_dir: &Path) -> Result<Option<PathBuf>> {
    let path = pool_dir.join(OWNER_FILE);
    match fs::read_to_string(&path) {
        Ok(text) => Ok(Some(PathBuf::from(text.trim_end_matches('\n')))),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(Error::io("read", &path, e)),
    }
}

/// The backing file of volume `id` in the pool at `pool_dir`.
pub fn backing_file_in(pool_dir: &Path, id: &VolumeId) -> PathBuf {
    pool_dir.join(format!("{id}{SUFFIX}"))
}

/// The file of snapshot `id` in the pool at `pool_dir`.
pub fn snapshot_file_in(pool_dir: &Path, id: &SnapshotId) -> PathBuf {
    pool_dir.join(SNAPSHOT_DIR).join(format!("{id}{SUFFIX}"))
}

/// The directory of snapshot files in the pool at `pool_dir`.
pub fn snapshot_dir_in(pool_dir: &Path) -> PathBuf {
    pool_dir.join(SNAPSHOT_DIR)
}

/// The volume id a pool file name (`<id>.img`) stands for; `None` for any other file.
pub fn volume_of_file(file_name: &str) -> Option<VolumeId> {
    let stem = file_name.strip_suffix(SUFFIX)?;
    match VolumeId::parse("file", stem) {
        Ok(ParsedId::Ours(id)) => Some(id),
        _ => None,
    }
}

/// The snapshot id a snapshot file name (`<id>.img`) stands for; `None` for any other
/// file.
pub fn snapshot_of_file(file_name: &str) -> Option<SnapshotId> {
    let stem = file_name.strip_suffix(SUFFIX)?;
    SnapshotId::parse_ours("file", stem).ok()
}

impl LoopBackend {
    /// Opens the pool without overprovisioning, creating the directory if needed.
    ///
    /// # Errors
    /// `Io` when the directory cannot be created, resolved or measured.
    pub fn open(pool_dir: &Path) -> Result<Self> {
        Self::open_with_ratio(pool_dir, 1.0)
    }

    /// Opens the pool, creating the directory if needed, and measures every volume in it.
    /// Sparse volumes may be promised up to `overprovision_ratio` times the pool's space.
    ///
    /// # Errors
    /// `InvalidArgument` for a ratio below 1 or not finite; `Io` when the directory cannot
    /// be created, resolved or measured.
    pub fn open_with_ratio(pool_dir: &Path, overprovision_ratio: f64) -> Result<Self> {
        if !tally::valid_ratio(overprovision_ratio) {
            return Err(Error::InvalidArgument(format!(
                "overprovisioning ratio {overprovision_ratio} must be a number of at least 1"
            )));
        }
        fs::create_dir_all(pool_dir)
            .map_err(|e| Error::io("create pool directory", pool_dir, e))?;
        let pool_dir = fs::canonicalize(pool_dir)
            .map_err(|e| Error::io("resolve pool directory", pool_dir, e))?;
        let reflinks = clone::supports_reflink(&pool_dir)?;
        let mut backend = LoopBackend {
            pool_dir,
            allocation: Mutex::new(SpaceTally::from_holdings([])),
            overprovision_ratio,
            reflinks,
        };
        let counted = backend.recount()?;
        *backend
            .allocation
            .get_mut()
            .unwrap_or_else(|p| p.into_inner()) = counted;
        Ok(backend)
    }

    /// The tally, under the allocation lock.
    fn tally(&self) -> MutexGuard<'_, SpaceTally> {
        self.allocation.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Measures every backing file in the pool: O(number of volumes).
    fn recount(&self) -> Result<SpaceTally> {
        SpaceTally::count(self.list()?, |id| {
            tally::measure_file(&self.backing_file(id))
        })
    }

    /// What the pool filesystem has available.
    fn free_bytes(&self) -> Result<u64> {
        Ok(statfs::usage(&self.pool_dir)?.available_bytes)
    }

    /// Fails with RESOURCE_EXHAUSTED unless the pool can promise `growth(tally)` more
    /// bytes. The fast figure can only be too small (see [`SpaceTally`]), so it is
    /// recounted before a refusal.
    fn ensure_room(
        &self,
        tally: &mut SpaceTally,
        what: &str,
        growth: impl Fn(&SpaceTally) -> u64,
    ) -> Result<()> {
        let free = self.free_bytes()?;
        if growth(tally) <= tally.available(free, self.overprovision_ratio) {
            return Ok(());
        }
        *tally = self.recount()?;
        let free = self.free_bytes()?;
        let needed = growth(tally);
        let available = tally.available(free, self.overprovision_ratio);
        if needed > available {
            return Err(Error::ResourceExhausted(format!(
                "{what} needs {needed} more bytes but pool {} can promise only {available} \
                 ({free} bytes free on its filesystem, overprovisioning ratio {})",
                self.pool_dir.display(),
                self.overprovision_ratio
            )));
        }
        Ok(())
    }

    /// Records the current size and occupation of `id`'s backing file in the tally.
    fn remeasure(&self, tally: &mut SpaceTally, id: &VolumeId) -> Result<()> {
        match tally::measure_file(&self.backing_file(id))? {
            Some(holding) => tally.set(id.clone(), holding),
            None => tally.remove(id),
        }
        Ok(())
    }

    fn backing_file(&self, id: &VolumeId) -> PathBuf {
        backing_file_in(&self.pool_dir, id)
    }

    fn snapshot_file(&self, id: &SnapshotId) -> PathBuf {
        snapshot_file_in(&self.pool_dir, id)
    }

    /// Freezes the filesystem of `backing` if it is mounted on this node, so that a copy
    /// taken while the guard lives is consistent. `None` when it is not mounted.
    fn freeze_if_mounted(&self, backing: &Path) -> Result<Option<FrozenFs>> {
        let devices = loopdev::find_by_backing_file(backing)?;
        if devices.is_empty() {
            return Ok(None);
        }
        let table = mount::read_mountinfo()?;
        let mounted = table
            .iter()
            .find(|m| devices.iter().any(|d| Path::new(&m.source) == d.path));
        match mounted {
            Some(m) => freeze::freeze_guard(&m.mount_point).map(Some),
            // In use as a raw block device: nothing to freeze. A reflink is atomic against
            // concurrent writes (crash-consistent); a copy of extents one by one is not.
            None if self.reflinks => Ok(None),
            None => Err(Error::FailedPrecondition(format!(
                "{} is in use as a raw block device on {} and pool {} has no reflinks: a copy taken now \
                 could be torn; unstage the volume first, or use a pool on XFS (reflink=1) or btrfs",
                backing.display(),
                devices[0].path.display(),
                self.pool_dir.display()
            ))),
        }
    }

    /// Copies `src` to `dst` (reflink or sparse copy), frozen when `src` is mounted, and
    /// sizes the copy to `size_bytes` when that is larger.
    fn copy_into(&self, src: &Path, dst: &Path, size_bytes: Option<u64>) -> Result<()> {
        let frozen = self.freeze_if_mounted(src)?;
        if frozen.is_some() {
            crate::crash_point!("copy.frozen");
        }
        let method = clone::clone_file(src, dst);
        if let Some(guard) = frozen {
            guard.thaw()?;
        }
        let method = method?;
        crate::crash_point!("copy.after_clone");
        tracing::debug!(?method, src = %src.display(), dst = %dst.display(), "copied");
        if let Some(size) = size_bytes {
            let grown = OpenOptions::new()
                .write(true)
                .open(dst)
                .and_then(|f| {
                    if f.metadata()?.len() < size {
                        f.set_len(size)?;
                    }
                    f.sync_all()
                })
                .map_err(|e| Error::io("size copy", dst, e));
            if let Err(e) = grown {
                let _ = fs::remove_file(dst);
                return Err(e);
            }
        }
        Ok(())
    }
}

impl Backend for LoopBackend {
    fn kind(&self) -> &'static str {
        "loop"
    }

    fn check(&self) -> Result<()> {
        let meta = fs::metadata(&self.pool_dir)
            .map_err(|e| Error::io("stat pool directory", &self.pool_dir, e))?;
        if !meta.is_dir() {
            return Err(Error::FailedPrecondition(format!(
                "pool {} is not a directory",
                self.pool_dir.display()
            )));
        }
        access(&self.pool_dir, AccessFlags::W_OK | AccessFlags::X_OK)
            .map_err(|e| Error::sys("check write access to pool", &self.pool_dir, e))
    }

    fn check_node(&self) -> Result<()> {
        if !Path::new("/dev/loop-control").exists() {
            return Err(Error::FailedPrecondition(
                "/dev/loop-control is missing".into(),
            ));
        }
        Ok(())
    }

    fn check_parameter(&self, key: &str, _value: &str) -> Result<()> {
        Err(Error::InvalidArgument(format!(
            "parameter {:?} is not known to the loop backend",
            crate::validate::clip(key)
        )))
    }

    fn round_size(&self, size_bytes: u64) -> u64 {
        size_bytes
    }

    fn create(&self, id: &VolumeId, size_bytes: u64, _record: &VolumeRecord) -> Result<()> {
        let path = self.backing_file(id);
        // Check, create and size under the lock; make it durable after it (the volume's
        // own lock keeps other operations on `id` out meanwhile).
        let file = {
            let mut tally = self.tally();
            // Storage an interrupted attempt left is replaced: only the growth counts.
            self.ensure_room(&mut tally, &format!("volume {id}"), |t| {
                size_bytes.saturating_sub(t.get(id).map_or(0, |h| h.size_bytes))
            })?;
            let file = OpenOptions::new()
                .write(true)
                .create(true)
                .truncate(false)
                .open(&path)
                .map_err(|e| Error::io("create backing file", &path, e))?;
            if let Err(e) = file
                .set_len(size_bytes)
                .map_err(|e| Error::io("size backing file", &path, e))
            {
                drop(file);
                let _ = fs::remove_file(&path);
                let _ = self.remeasure(&mut tally, id);
                return Err(e);
            }
            let held = file.metadata().map_or(0, |m| {
                use std::os::unix::fs::MetadataExt;
                m.blocks().saturating_mul(512)
            });
            tally.set(id.clone(), Holding::new(size_bytes, held));
            file
        };
        let durable = file
            .sync_all()
            .map_err(|e| Error::io("fsync", &path, e))
            .and_then(|()| sync_dir(&self.pool_dir));
        if let Err(e) = durable {
            drop(file);
            let _ = fs::remove_file(&path);
            self.tally().remove(id);
            return Err(e);
        }
        Ok(())
    }

    fn delete(&self, id: &VolumeId) -> Result<()> {
        let path = self.backing_file(id);
        if let Some(device) = loopdev::find_by_backing_file(&path)?.first() {
            return Err(Error::FailedPrecondition(format!(
                "volume {id} is still attached to {} on this node; unstage it first",
                device.path.display()
            )));
        }
        // The tally keeps the volume's promise until the file is gone: a concurrent
        // create sees too little room for a moment, never too much.
        match fs::remove_file(&path) {
            Ok(()) => {
                self.tally().remove(id);
                sync_dir(&self.pool_dir)
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                self.tally().remove(id);
                Ok(())
            }
            Err(e) => Err(Error::io("remove backing file", &path, e)),
        }
    }

    fn status(&self, id: &VolumeId) -> Result<StorageStatus> {
        let path = self.backing_file(id);
        match fs::metadata(&path) {
            Ok(meta) => Ok(StorageStatus::Present {
                size_bytes: meta.len(),
                allocated_bytes: statfs::allocated_bytes(&path)?,
            }),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(StorageStatus::Missing),
            Err(e) => Err(Error::io("stat backing file", &path, e)),
        }
    }

    fn capacity(&self) -> Result<PoolCapacity> {
        let mut tally = self.tally();
        if tally.older_than(tally::RECOUNT_AFTER) {
            *tally = self.recount()?;
        }
        let usage = statfs::usage(&self.pool_dir)?;
        Ok(PoolCapacity {
            available_bytes: tally.available(usage.available_bytes, self.overprovision_ratio),
            total_bytes: usage.total_bytes,
        })
    }

    fn create_from(
        &self,
        id: &VolumeId,
        source: Source<'_>,
        size_bytes: u64,
        _record: &VolumeRecord,
    ) -> Result<()> {
        let mut tally = self.tally();
        let src = match source {
            Source::Snapshot(s) => self.snapshot_file(s),
            Source::Volume(v) => self.backing_file(v),
        };
        let meta = match fs::metadata(&src) {
            Ok(meta) => meta,
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                return Err(Error::NotFound(format!(
                    "the source of volume {id} has no data ({})",
                    src.display()
                )));
            }
            Err(e) => return Err(Error::io("stat", &src, e)),
        };
        if meta.len() > size_bytes {
            return Err(Error::OutOfRange(format!(
                "volume {id} of {size_bytes} bytes cannot hold its source of {} bytes",
                meta.len()
            )));
        }
        // The copy may grow into its whole size; what it shares with the source is
        // already allocated (reflink) or will be copied (sparse copy).
        let dst = self.backing_file(id);
        self.ensure_room(&mut tally, &format!("volume {id}"), |t| {
            size_bytes.saturating_sub(t.get(id).map_or(0, |h| h.size_bytes))
        })?;
        let copied = self.copy_into(&src, &dst, Some(size_bytes));
        self.remeasure(&mut tally, id)?;
        copied?;
        sync_dir(&self.pool_dir)
    }

    fn expand(&self, id: &VolumeId, size_bytes: u64) -> Result<()> {
        let mut tally = self.tally();
        let path = self.backing_file(id);
        let current = match self.status(id)? {
            StorageStatus::Present { size_bytes, .. } => size_bytes,
            StorageStatus::Missing => {
                return Err(Error::NotFound(format!(
                    "volume {id} has no backing file {}",
                    path.display()
                )));
            }
        };
        if size_bytes <= current {
            return Ok(());
        }
        self.remeasure(&mut tally, id)?;
        self.ensure_room(&mut tally, &format!("growing volume {id}"), |t| {
            size_bytes.saturating_sub(t.get(id).map_or(current, |h| h.size_bytes))
        })?;
        let file = OpenOptions::new()
            .write(true)
            .open(&path)
            .map_err(|e| Error::io("open backing file", &path, e))?;
        let grown = file
            .set_len(size_bytes)
            .map_err(|e| Error::io("grow backing file", &path, e));
        self.remeasure(&mut tally, id)?;
        grown?;
        drop(tally);
        file.sync_all().map_err(|e| Error::io("fsync", &path, e))
    }

    fn snapshot(
        &self,
        volume: &VolumeId,
        snapshot: &SnapshotId,
        _record: &SnapshotRecord,
    ) -> Result<u64> {
        let src = self.backing_file(volume);
        if !src.exists() {
            return Err(Error::NotFound(format!(
                "volume {volume} has no backing file {}",
                src.display()
            )));
        }
        let dir = self.pool_dir.join(SNAPSHOT_DIR);
        fs::create_dir_all(&dir).map_err(|e| Error::io("create directory", &dir, e))?;
        let dst = self.snapshot_file(snapshot);
        let mut tally = self.tally();
        if !self.reflinks {
            // The copy takes as much space as the source holds: it must not eat into what
            // the pool promised to volumes.
            let copied_bytes = statfs::allocated_bytes(&src)?;
            self.ensure_room(&mut tally, &format!("snapshot {snapshot}"), |_| {
                copied_bytes
            })?;
        }
        self.copy_into(&src, &dst, None)?;
        sync_dir(&dir)?;
        fs::metadata(&dst)
            .map(|m| m.len())
            .map_err(|e| Error::io("stat", &dst, e))
    }

    fn delete_snapshot(&self, snapshot: &SnapshotId) -> Result<()> {
        let path = self.snapshot_file(snapshot);
        match fs::remove_file(&path) {
            Ok(()) => sync_dir(&self.pool_dir.join(SNAPSHOT_DIR)),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(Error::io("remove snapshot file", &path, e)),
        }
    }

    fn snapshot_status(&self, snapshot: &SnapshotId) -> Result<StorageStatus> {
        let path = self.snapshot_file(snapshot);
        match fs::metadata(&path) {
            Ok(meta) => Ok(StorageStatus::Present {
                size_bytes: meta.len(),
                allocated_bytes: statfs::allocated_bytes(&path)?,
            }),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(StorageStatus::Missing),
            Err(e) => Err(Error::io("stat snapshot file", &path, e)),
        }
    }

    fn growth_room(&self, id: &VolumeId) -> Result<Option<(u64, u64)>> {
        let path = self.backing_file(id);
        let holding = tally::measure_file(&path)?.ok_or_else(|| {
            Error::NotFound(format!(
                "volume {id} has no backing file {}",
                path.display()
            ))
        })?;
        Ok(Some((holding.unheld_bytes(), self.free_bytes()?)))
    }

    fn source_path(&self, id: &VolumeId) -> PathBuf {
        self.backing_file(id)
    }

    fn list(&self) -> Result<Vec<VolumeId>> {
        let entries =
            fs::read_dir(&self.pool_dir).map_err(|e| Error::io("list pool", &self.pool_dir, e))?;
        let mut ids = Vec::new();
        for entry in entries {
            let entry = entry.map_err(|e| Error::io("list pool", &self.pool_dir, e))?;
            let name = entry.file_name();
            let Some(stem) = name.to_str().and_then(|n| n.strip_suffix(SUFFIX)) else {
                continue;
            };
            if let Ok(ParsedId::Ours(id)) = VolumeId::parse("file", stem) {
                ids.push(id);
            }
        }
        ids.sort();
        Ok(ids)
    }

    fn devices(&self, id: &VolumeId) -> Result<Vec<Device>> {
        loopdev::find_by_backing_file(&self.backing_file(id))?
            .into_iter()
            .map(|d| device_of(&d))
            .collect()
    }

    fn attach(&self, id: &VolumeId, read_only: bool) -> Result<Device> {
        if let Some(device) = self.devices(id)?.into_iter().next() {
            return Ok(device);
        }
        device_of(&loopdev::attach(&self.backing_file(id), read_only)?)
    }

    fn detach(&self, _id: &VolumeId, device: &Device) -> Result<()> {
        loopdev::detach(&loop_of(device)?)
    }

    fn refresh(&self, device: &Device) -> Result<()> {
        loopdev::refresh_capacity(&loop_of(device)?)
    }

    fn holds_data(&self, id: &VolumeId) -> Result<bool> {
        statfs::holds_data(&self.backing_file(id))
    }
}

/// The backend's view of a loop device.
fn device_of(device: &loopdev::LoopDevice) -> Result<Device> {
    Ok(Device {
        storage_deleted: device.backing_deleted,
        ..Device::at(&device.path)?
    })
}

/// The loop device behind a [`Device`] this backend made.
fn loop_of(device: &Device) -> Result<loopdev::LoopDevice> {
    loopdev::loop_by_rdev(device.rdev)
        .map(|(number, _)| loopdev::LoopDevice::numbered(number))
        .ok_or_else(|| Error::Internal(format!("{} is not a loop device", device.path.display())))
}
