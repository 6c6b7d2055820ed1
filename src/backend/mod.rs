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
use crate::ids::VolumeId;

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

    /// Ids of all volumes whose storage exists.
    ///
    /// # Errors
    /// `Io` when the pool cannot be listed.
    fn list(&self) -> Result<Vec<VolumeId>>;
}
