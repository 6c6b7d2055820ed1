//! Storage backends: where a volume's bytes live.
//!
//! A backend creates, deletes and measures the storage behind a volume and tells the node
//! service which file or device to attach. CSI semantics (names, capabilities, status
//! codes) stay in the services; backends speak in volume ids and bytes. Every method
//! blocks and is called from a blocking thread.

pub mod loopfile;

use std::fmt;
use std::path::PathBuf;

use crate::error::Result;
use crate::ids::{SnapshotId, VolumeId};

pub use loopfile::LoopBackend;

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

    /// Creates `size_bytes` of storage for `id`. Storage left by an interrupted earlier
    /// attempt is reused and resized.
    ///
    /// # Errors
    /// `ResourceExhausted` when the pool cannot hold it; `Io` for other failures.
    fn create(&self, id: &VolumeId, size_bytes: u64) -> Result<()>;

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

    /// The file or device the node attaches for `id`.
    fn source_path(&self, id: &VolumeId) -> PathBuf;

    /// Creates `size_bytes` of storage for `id` holding a copy of `source`'s data. The
    /// size must be at least the source's.
    ///
    /// # Errors
    /// `NotFound` when the source has no storage; `ResourceExhausted` when the pool cannot
    /// hold the copy; `Io` otherwise.
    fn create_from(&self, id: &VolumeId, source: Source<'_>, size_bytes: u64) -> Result<()>;

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
    fn snapshot(&self, volume: &VolumeId, snapshot: &SnapshotId) -> Result<u64>;

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

    /// Ids of all volumes whose storage exists.
    ///
    /// # Errors
    /// `Io` when the pool cannot be listed.
    fn list(&self) -> Result<Vec<VolumeId>>;
}
