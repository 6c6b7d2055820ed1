//! Storage backends: where a volume's bytes live.
//!
//! A backend creates, deletes and measures the storage behind a volume and tells the node
//! service which file or device to attach. CSI semantics (names, capabilities, status
//! codes) stay in the services; backends speak in volume ids and bytes. Every method
//! blocks and is called from a blocking thread.

pub mod loopfile;
pub mod lvm;
pub mod tally;

use std::fmt;
use std::path::{Path, PathBuf};

use crate::error::{Error, Result};
use crate::ids::{SnapshotId, VolumeId};
use crate::os::mount::MountEntry;
use crate::store::{SnapshotRecord, VolumeRecord};

pub use loopfile::LoopBackend;
pub use lvm::LvmBackend;

/// A block device that serves a volume on this node: a loop device over a backing file,
/// or a logical volume's device-mapper node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Device {
    /// The node the driver mounts and binds (`/dev/loop3`, `/dev/mapper/vg0-fv--...`).
    pub path: PathBuf,
    /// Its device number (`st_rdev`).
    pub rdev: u64,
    /// Set when the storage behind the device was removed while it stayed attached (a
    /// loop device whose backing file was deleted).
    pub storage_deleted: bool,
}

impl Device {
    /// A device node as it is now.
    ///
    /// # Errors
    /// `Io` when the node cannot be stat'ed.
    pub fn at(path: &Path) -> Result<Device> {
        Ok(Device {
            path: path.to_owned(),
            rdev: crate::os::loopdev::rdev_of(path)?,
            storage_deleted: false,
        })
    }

    /// `(major, minor)` of the device.
    pub fn major_minor(&self) -> (u32, u32) {
        (
            nix::sys::stat::major(self.rdev) as u32,
            nix::sys::stat::minor(self.rdev) as u32,
        )
    }

    /// The device size in bytes, from sysfs.
    ///
    /// # Errors
    /// `Io` when sysfs cannot be read (the device went away).
    pub fn size_bytes(&self) -> Result<u64> {
        let (major, minor) = self.major_minor();
        let path = PathBuf::from(format!("/sys/dev/block/{major}:{minor}/size"));
        let text = std::fs::read_to_string(&path).map_err(|e| Error::io("read", &path, e))?;
        let sectors: u64 = text.trim().parse().map_err(|_| {
            Error::Internal(format!("{}: unexpected content {text:?}", path.display()))
        })?;
        Ok(sectors.saturating_mul(512))
    }

    /// Whether a mount is a filesystem on this device: by its source, or by the device
    /// number the kernel reports for it (a mount made through another name of the node).
    pub fn is_source_of(&self, entry: &MountEntry) -> bool {
        Path::new(&entry.source) == self.path || entry.device == self.major_minor()
    }
}

/// Space in the pool.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PoolCapacity {
    /// Bytes the pool can still promise to new volumes.
    pub available_bytes: u64,
    /// Size of the pool's filesystem in bytes.
    pub total_bytes: u64,
}

/// What a backend knows of one volume's storage.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StorageStatus {
    /// The storage exists.
    Present {
        /// Its size in bytes.
        size_bytes: u64,
        /// Bytes of it really allocated on disk.
        allocated_bytes: u64,
    },
    /// Nothing exists for this id.
    Missing,
}

/// Where a new volume's data comes from.
#[derive(Debug, Clone, Copy)]
pub enum Source<'a> {
    /// A snapshot (restore).
    Snapshot(&'a SnapshotId),
    /// Another volume (clone).
    Volume(&'a VolumeId),
}

/// The storage operations every backend provides.
pub trait Backend: Send + Sync + fmt::Debug {
    /// A short name for logs and metrics (`loop`, `lvm`).
    fn kind(&self) -> &'static str;

    /// Checks that the pool can serve requests (Probe).
    ///
    /// # Errors
    /// Any error says why the pool is unusable.
    fn check(&self) -> Result<()>;

    /// Checks what the node side needs beyond the pool (Probe of a process that serves
    /// the Node service); by default nothing.
    ///
    /// # Errors
    /// Any error says what the node lacks.
    fn check_node(&self) -> Result<()> {
        Ok(())
    }

    /// Checks a StorageClass parameter that only this backend knows (the generic ones
    /// are checked by the services).
    ///
    /// # Errors
    /// `InvalidArgument` for an unknown key or a bad value.
    fn check_parameter(&self, key: &str, value: &str) -> Result<()>;

    /// The size the backend really allocates for a request of `size_bytes` (rounded up
    /// to its allocation unit).
    fn round_size(&self, size_bytes: u64) -> u64;

    /// Creates `size_bytes` of storage for `id`, described by `record` (backends that keep
    /// metadata beside the storage store it from there). Storage left by an interrupted
    /// earlier attempt is reused and resized.
    ///
    /// # Errors
    /// `ResourceExhausted` when the pool cannot hold it; `Io` for other failures.
    fn create(&self, id: &VolumeId, size_bytes: u64, record: &VolumeRecord) -> Result<()>;

    /// Removes the storage of `id`; missing storage counts as success.
    ///
    /// # Errors
    /// `FailedPrecondition` while the volume is in use on this node; `Io` otherwise.
    fn delete(&self, id: &VolumeId) -> Result<()>;

    /// The state of the storage of `id`.
    ///
    /// # Errors
    /// `Io` when it cannot be inspected.
    fn status(&self, id: &VolumeId) -> Result<StorageStatus>;

    /// Free and total space.
    ///
    /// # Errors
    /// `Io` when the pool cannot be measured.
    fn capacity(&self) -> Result<PoolCapacity>;

    /// Free and total space for volumes made with these StorageClass parameters
    /// (GetCapacity); by default the whole pool's.
    ///
    /// # Errors
    /// `InvalidArgument` for parameters naming no pool; `Io` when it cannot be measured.
    fn capacity_for(
        &self,
        _parameters: &std::collections::HashMap<String, String>,
    ) -> Result<PoolCapacity> {
        self.capacity()
    }

    /// The file or device the node attaches for `id`.
    fn source_path(&self, id: &VolumeId) -> PathBuf;

    /// Creates `size_bytes` of storage for `id` holding a copy of `source`'s data. The
    /// size must be at least the source's.
    ///
    /// # Errors
    /// `NotFound` when the source has no storage; `ResourceExhausted` when the pool cannot
    /// hold the copy; `Io` otherwise.
    fn create_from(
        &self,
        id: &VolumeId,
        source: Source<'_>,
        size_bytes: u64,
        record: &VolumeRecord,
    ) -> Result<()>;

    /// Grows the storage of `id` to `size_bytes` (never shrinks it).
    ///
    /// # Errors
    /// `NotFound` when it has no storage; `ResourceExhausted` when the pool cannot hold
    /// the growth.
    fn expand(&self, id: &VolumeId, size_bytes: u64) -> Result<()>;

    /// Takes a point-in-time copy of `volume` as `snapshot`, consistent with a filesystem
    /// staged on this node (frozen around the copy). Returns the snapshot's size.
    ///
    /// # Errors
    /// `NotFound` when the volume has no storage; `ResourceExhausted` when the pool cannot
    /// hold the copy.
    fn snapshot(
        &self,
        volume: &VolumeId,
        snapshot: &SnapshotId,
        record: &SnapshotRecord,
    ) -> Result<u64>;

    /// Removes a snapshot's storage; missing storage counts as success.
    ///
    /// # Errors
    /// `Io` when it cannot be removed.
    fn delete_snapshot(&self, snapshot: &SnapshotId) -> Result<()>;

    /// The state of a snapshot's storage.
    ///
    /// # Errors
    /// `Io` when it cannot be inspected.
    fn snapshot_status(&self, snapshot: &SnapshotId) -> Result<StorageStatus>;

    /// How many bytes the storage of `id` may still grow into, and how many its pool has
    /// free for that: when the second is smaller, a writer inside the volume may get
    /// ENOSPC. `None` for storage that never grows on write (fully allocated).
    ///
    /// # Errors
    /// `NotFound` when it has no storage; `Io` when it cannot be measured.
    fn growth_room(&self, _id: &VolumeId) -> Result<Option<(u64, u64)>> {
        Ok(None)
    }

    /// Ids of all volumes whose storage exists.
    ///
    /// # Errors
    /// `Io` when the pool cannot be listed.
    fn list(&self) -> Result<Vec<VolumeId>>;

    /// The records a backend keeps beside its storage (LV tags), from which the
    /// controller's records are rebuilt at start. Backends that keep none return nothing.
    ///
    /// # Errors
    /// `Io` when the storage cannot be listed.
    fn stored_records(&self) -> Result<StoredRecords> {
        Ok(StoredRecords::default())
    }

    /// The devices that serve `id` on this node now (none when it is not attached).
    ///
    /// # Errors
    /// `Io` when the system cannot be inspected.
    fn devices(&self, id: &VolumeId) -> Result<Vec<Device>>;

    /// Makes a device for `id` on this node (or returns the one there is). A `read_only`
    /// device refuses writes.
    ///
    /// # Errors
    /// `NotFound` when `id` has no storage; `Io` when the device cannot be made.
    fn attach(&self, id: &VolumeId, read_only: bool) -> Result<Device>;

    /// Takes a device of `id` away again, once nothing uses it.
    ///
    /// # Errors
    /// `Io` when the device cannot be released.
    fn detach(&self, id: &VolumeId, device: &Device) -> Result<()>;

    /// Lets an attached device see storage that was grown underneath it.
    ///
    /// # Errors
    /// `Io` when the device cannot be refreshed.
    fn refresh(&self, device: &Device) -> Result<()>;

    /// Whether the storage of `id` holds any written data, so that a device without a
    /// filesystem signature is not formatted over it. Backends that cannot tell answer
    /// `false` and rely on the signature probe alone.
    ///
    /// # Errors
    /// `Io` when the storage cannot be inspected.
    fn holds_data(&self, id: &VolumeId) -> Result<bool>;
}

/// Volume and snapshot records kept by a backend beside its storage.
#[derive(Debug, Default)]
pub struct StoredRecords {
    /// One per volume.
    pub volumes: Vec<VolumeRecord>,
    /// One per snapshot.
    pub snapshots: Vec<SnapshotRecord>,
}
