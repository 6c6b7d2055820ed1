//! The loop backend: one sparse file per volume in a pool directory.
//!
//! # Design
//! A volume is `POOL/<volume id>.img`, created sparse with `ftruncate`, so creation costs
//! the same whatever the size. Sparse files must not overcommit the pool: the space the
//! pool can still promise is the filesystem's available space minus what existing volumes
//! may still grow into (their size less what they already occupy). A mutex makes
//! check-and-create atomic, so two concurrent creates cannot both take the last space.
//!
//! # Limitations
//! Space that other programs write into the pool's filesystem after a volume was created
//! can still starve it; then the writer inside the volume sees ENOSPC.

use std::fs::{self, OpenOptions};
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use nix::unistd::{access, AccessFlags};

use crate::backend::{Backend, PoolCapacity, StorageStatus};
use crate::error::{Error, Result};
use crate::ids::{ParsedId, VolumeId};
use crate::os::{loopdev, statfs};
use crate::store::sync_dir;

const SUFFIX: &str = ".img";

/// Sparse files in a pool directory.
#[derive(Debug)]
pub struct LoopBackend {
    /// The canonical path of the pool directory.
    pool_dir: PathBuf,
    /// Serialises the free-space check with the creation that depends on it.
    allocation: Mutex<()>,
}

impl LoopBackend {
    /// Opens the pool, creating the directory if needed.
    ///
    /// # Errors
    /// `Io` when the directory cannot be created or resolved.
    pub fn open(pool_dir: &Path) -> Result<Self> {
        fs::create_dir_all(pool_dir)
            .map_err(|e| Error::io("create pool directory", pool_dir, e))?;
        let pool_dir = fs::canonicalize(pool_dir)
            .map_err(|e| Error::io("resolve pool directory", pool_dir, e))?;
        Ok(LoopBackend {
            pool_dir,
            allocation: Mutex::new(()),
        })
    }

    /// The canonical pool directory.
    pub fn pool_dir(&self) -> &Path {
        &self.pool_dir
    }

    fn backing_file(&self, id: &VolumeId) -> PathBuf {
        self.pool_dir.join(format!("{id}{SUFFIX}"))
    }

    /// Bytes that existing volumes may still grow into.
    fn promised_bytes(&self) -> Result<u64> {
        let mut promised = 0u64;
        for id in self.list()? {
            if let StorageStatus::Present {
                size_bytes,
                allocated_bytes,
            } = self.status(&id)?
            {
                promised = promised.saturating_add(size_bytes.saturating_sub(allocated_bytes));
            }
        }
        Ok(promised)
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

    fn create(&self, id: &VolumeId, size_bytes: u64) -> Result<()> {
        let _allocating = self.allocation.lock().unwrap_or_else(|p| p.into_inner());
        let path = self.backing_file(id);
        let existing = match self.status(id)? {
            StorageStatus::Present {
                size_bytes,
                allocated_bytes,
            } => size_bytes.saturating_sub(allocated_bytes),
            StorageStatus::Missing => 0,
        };
        let capacity = self.capacity()?;
        let available = capacity.available_bytes.saturating_add(existing);
        if size_bytes > available {
            return Err(Error::ResourceExhausted(format!(
                "volume {id} needs {size_bytes} bytes but pool {} can promise only {available}",
                self.pool_dir.display()
            )));
        }
        let file = OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(false)
            .open(&path)
            .map_err(|e| Error::io("create backing file", &path, e))?;
        let sized = file
            .set_len(size_bytes)
            .map_err(|e| Error::io("size backing file", &path, e))
            .and_then(|()| file.sync_all().map_err(|e| Error::io("fsync", &path, e)))
            .and_then(|()| sync_dir(&self.pool_dir));
        if let Err(e) = sized {
            drop(file);
            let _ = fs::remove_file(&path);
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
        match fs::remove_file(&path) {
            Ok(()) => sync_dir(&self.pool_dir),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
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
        let usage = statfs::usage(&self.pool_dir)?;
        let promised = self.promised_bytes()?;
        Ok(PoolCapacity {
            available_bytes: usage.available_bytes.saturating_sub(promised),
            total_bytes: usage.total_bytes,
        })
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
}
