//! The durable metadata store: one JSON file per record, written atomically.
//!
//! A write goes to `ID.json.tmp`, is fsynced, renamed over `ID.json`, and the directory is
//! fsynced, so after a crash a record is either the old one or the new one, never a torn
//! mix. Records are cached in memory (loaded once at start) so that reads and listings
//! cost no I/O. All methods block: call them from blocking threads.

use std::collections::BTreeMap;
use std::fs::{self, File, OpenOptions};
use std::io::Write;
use std::ops::Bound;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};

/// A directory of records of one kind, keyed by id.
#[derive(Debug)]
pub struct RecordDir<T> {
    /// Where the record files live.
    dir: PathBuf,
    /// Every record on disk, by id.
    cache: Mutex<BTreeMap<String, T>>,
}

impl<T: Serialize + DeserializeOwned + Clone> RecordDir<T> {
    /// Opens (creating if needed) the directory and loads every record in it.
    ///
    /// Leftover temporary files of interrupted writes are removed.
    ///
    /// # Errors
    /// `Io` when the directory cannot be read; `Record` for a record that does not parse.
    pub fn open(dir: &Path) -> Result<Self> {
        fs::create_dir_all(dir).map_err(|e| Error::io("create directory", dir, e))?;
        let mut cache = BTreeMap::new();
        let entries = fs::read_dir(dir).map_err(|e| Error::io("read directory", dir, e))?;
        for entry in entries {
            let entry = entry.map_err(|e| Error::io("read directory", dir, e))?;
            let path = entry.path();
            let Some(name) = path.file_name().and_then(|n| n.to_str()) else {
                continue;
            };
            if name.ends_with(".json.tmp") {
                fs::remove_file(&path).map_err(|e| Error::io("remove", &path, e))?;
            } else if let Some(id) = name.strip_suffix(".json") {
                let bytes = fs::read(&path).map_err(|e| Error::io("read", &path, e))?;
                let record = serde_json::from_slice(&bytes).map_err(|e| Error::Record {
                    path: path.clone(),
                    reason: e.to_string(),
                })?;
                cache.insert(id.to_owned(), record);
            }
        }
        Ok(RecordDir {
            dir: dir.to_owned(),
            cache: Mutex::new(cache),
        })
    }

    fn cache(&self) -> std::sync::MutexGuard<'_, BTreeMap<String, T>> {
        self.cache
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// The record with this id, if any.
    pub fn get(&self, id: &str) -> Option<T> {
        self.cache().get(id).cloned()
    }

    /// Every record, ordered by id.
    pub fn all(&self) -> Vec<T> {
        self.cache().values().cloned().collect()
    }

    /// How many records there are.
    pub fn len(&self) -> usize {
        self.cache().len()
    }

    /// Whether there are no records.
    pub fn is_empty(&self) -> bool {
        self.cache().is_empty()
    }

    /// Whether a record with this id exists.
    pub fn contains(&self, id: &str) -> bool {
        self.cache().contains_key(id)
    }

    /// Up to `max` records with ids at or after `start`, and the id that follows them.
    pub fn page(&self, start: Option<&str>, max: usize) -> (Vec<T>, Option<String>) {
        let cache = self.cache();
        let lower = match start {
            Some(s) => Bound::Included(s.to_owned()),
            None => Bound::Unbounded,
        };
        let mut iter = cache.range((lower, Bound::Unbounded));
        let items: Vec<T> = iter.by_ref().take(max).map(|(_, v)| v.clone()).collect();
        let next = iter.next().map(|(k, _)| k.clone());
        (items, next)
    }

    /// Writes a record durably, then updates the cache.
    ///
    /// # Errors
    /// `Io` when any step of the atomic write fails; the old record then stays in force.
    pub fn put(&self, id: &str, record: &T) -> Result<()> {
        let bytes = serde_json::to_vec_pretty(record).map_err(|e| Error::Record {
            path: self.path(id),
            reason: e.to_string(),
        })?;
        write_atomically(&self.dir, &format!("{id}.json"), &bytes)?;
        self.cache().insert(id.to_owned(), record.clone());
        Ok(())
    }

    /// Removes a record durably; removing a missing record succeeds.
    ///
    /// # Errors
    /// `Io` when the file cannot be removed or the directory synced.
    pub fn remove(&self, id: &str) -> Result<()> {
        let path = self.path(id);
        match fs::remove_file(&path) {
            Ok(()) => sync_dir(&self.dir)?,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(Error::io("remove", &path, e)),
        }
        self.cache().remove(id);
        Ok(())
    }

    fn path(&self, id: &str) -> PathBuf {
        self.dir.join(format!("{id}.json"))
    }
}

/// Reads every record in `dir` without changing anything there (no cleanup of temporary
/// files), for operator tools that look at a running driver's state. A missing directory
/// holds no records.
///
/// # Errors
/// `Io` when the directory cannot be read; `Record` for a record that does not parse.
pub fn read_records<T: DeserializeOwned>(dir: &Path) -> Result<Vec<T>> {
    let entries = match fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(Error::io("read directory", dir, e)),
    };
    let mut paths: Vec<PathBuf> = entries
        .filter_map(|entry| entry.ok().map(|e| e.path()))
        .filter(|path| path.extension().is_some_and(|ext| ext == "json"))
        .collect();
    paths.sort();
    let mut records = Vec::with_capacity(paths.len());
    for path in paths {
        let bytes = match fs::read(&path) {
            Ok(bytes) => bytes,
            // Removed by the driver since the listing: not a record any more.
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
            Err(e) => return Err(Error::io("read", &path, e)),
        };
        records.push(serde_json::from_slice(&bytes).map_err(|e| Error::Record {
            path: path.clone(),
            reason: e.to_string(),
        })?);
    }
    Ok(records)
}

/// Replaces `dir/name` with `bytes` so that a crash leaves either the old or the new file.
///
/// # Errors
/// `Io` naming the step that failed.
pub fn write_atomically(dir: &Path, name: &str, bytes: &[u8]) -> Result<()> {
    let tmp = dir.join(format!("{name}.tmp"));
    let target = dir.join(name);
    let mut file = OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(&tmp)
        .map_err(|e| Error::io("create", &tmp, e))?;
    file.write_all(bytes)
        .map_err(|e| Error::io("write", &tmp, e))?;
    file.sync_all().map_err(|e| Error::io("fsync", &tmp, e))?;
    drop(file);
    crate::crash_point!("store.before_rename");
    fs::rename(&tmp, &target).map_err(|e| Error::io("rename into place", &target, e))?;
    sync_dir(dir)
}

/// Fsyncs a directory so that renames and removals in it are durable.
///
/// # Errors
/// `Io` when the directory cannot be opened or synced.
pub fn sync_dir(dir: &Path) -> Result<()> {
    let handle = File::open(dir).map_err(|e| Error::io("open directory", dir, e))?;
    handle
        .sync_all()
        .map_err(|e| Error::io("fsync directory", dir, e))
}

/// A node a volume is published to (ControllerPublishVolume).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Publication {
    /// Whether the volume was published read-only to this node.
    pub readonly: bool,
}

/// The controller's durable record of one volume.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct VolumeRecord {
    /// The volume id (derived from `name`).
    pub volume_id: String,
    /// The CSI name the CO gave at CreateVolume.
    pub name: String,
    /// Size of the volume in bytes.
    pub capacity_bytes: u64,
    /// The node the volume lives on.
    pub node_id: String,
    /// Creation parameters as given (the `csi.storage.k8s.io/*` ones included).
    #[serde(default)]
    pub parameters: BTreeMap<String, String>,
    /// Seconds since the epoch when the volume was created.
    pub created_at: u64,
    /// Nodes this volume is published to, by node id.
    #[serde(default)]
    pub published: BTreeMap<String, Publication>,
    /// What the volume was created from, if not empty.
    #[serde(default)]
    pub content_source: Option<ContentSource>,
}

/// The source a volume's data came from.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "kind")]
pub enum ContentSource {
    /// Restored from this snapshot.
    Snapshot {
        /// The snapshot id.
        snapshot_id: String,
    },
    /// Cloned from this volume.
    Volume {
        /// The source volume id.
        volume_id: String,
    },
}

/// The controller's durable record of one snapshot.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SnapshotRecord {
    /// The snapshot id (derived from `name`).
    pub snapshot_id: String,
    /// The CSI name the CO gave at CreateSnapshot.
    pub name: String,
    /// The volume it was taken of.
    pub source_volume_id: String,
    /// Size of the snapshot (the source volume's size then), in bytes.
    pub size_bytes: u64,
    /// Creation time: seconds since the epoch.
    pub created_secs: i64,
    /// Creation time: nanoseconds within the second.
    pub created_nanos: i32,
    /// Creation parameters as given.
    #[serde(default)]
    pub parameters: BTreeMap<String, String>,
}

/// How a volume is staged on this node.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "kind")]
pub enum StagedAccess {
    /// A raw block device; no filesystem.
    Block,
    /// A filesystem mounted at the staging path.
    Mount {
        /// The filesystem type.
        fs_type: crate::config::FsType,
        /// The mount flags the CO asked for.
        mount_flags: Vec<String>,
    },
}

/// The node's durable record of a staged (or being staged) volume.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StageRecord {
    /// The volume id.
    pub volume_id: String,
    /// The staging path kubelet gave.
    pub staging_path: PathBuf,
    /// Block or mount, and how.
    pub access: StagedAccess,
    /// Whether it was staged for reading only (SINGLE_NODE_READER_ONLY).
    #[serde(default)]
    pub read_only: bool,
    /// Set just before mkfs runs: a device that a crash left half-formatted may be formatted
    /// again although it is not blank.
    #[serde(default)]
    pub formatting: bool,
    /// Target paths the volume is published at (NodePublishVolume), checked against the
    /// mount table before use: an entry whose mount is gone no longer counts.
    #[serde(default)]
    pub targets: BTreeMap<PathBuf, TargetRecord>,
}

/// One NodePublishVolume target of a staged volume.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TargetRecord {
    /// The CSI access mode it was published with (`SINGLE_NODE_WRITER`, ...).
    pub access_mode: String,
    /// Whether it was published read-only.
    pub readonly: bool,
}
