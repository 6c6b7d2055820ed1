//! The lvm backend: every volume is a logical volume in a volume group the operator names.
//!
//! # Design
//! - **Device classes** ([`classes`]) name a volume group and, for thin classes, a thin
//!   pool. The StorageClass parameter `deviceClass` picks one; without it the default
//!   class serves.
//! - **Names and tags**: an LV is named by its volume or snapshot id (`fv-…`, `fvs-…`),
//!   and its tags carry the rest of the record ([`tags`]), written by the same `lvcreate`
//!   that makes it. The volume group alone is the source of truth: at start the driver
//!   rebuilds any record it lacks from the tags ([`Backend::stored_records`]).
//! - **Linear classes** allocate the whole size up front (`lvcreate -L`). They take no
//!   snapshots and no clones: a classic LVM snapshot slows every write to its origin and
//!   is lost when its copy-on-write space runs out, which is no place for a volume's
//!   backups. Such requests get FAILED_PRECONDITION naming the reason.
//! - **Thin classes** make thin LVs (`lvcreate -V -T`); a snapshot is a thin snapshot
//!   (`lvcreate -s`, which keeps lvm's activation-skip flag, so it is never activated by
//!   accident), and a restore or clone is a thin snapshot of the snapshot or volume made
//!   with `-kn` so that it activates like any volume, grown with `lvextend` when a bigger
//!   size was asked for. Thin snapshots stay in their pool, so a restore or clone must ask
//!   for a class on the same pool. Creating a snapshot suspends the origin's device, and
//!   device-mapper freezes a mounted filesystem for it: the snapshot is consistent without
//!   FIFREEZE of our own.
//! - **Capacity**: a linear class offers the volume group's free space. A thin class
//!   offers `pool size × overprovisionRatio − sizes of its volumes`; snapshots are not
//!   counted, because they share their origin's blocks until either side is written.
//! - **Node side**: a volume's device is the LV's device-mapper node. Staging activates
//!   the LV (`lvchange -ay -K`), unstaging deactivates it, so an LV is open only where it
//!   is staged. A block volume staged for reading only gets the kernel's read-only flag
//!   (BLKROSET) on its device.
//!
//! # Limitations
//! - A linear LV cannot tell whether it holds data, so "blank" before mkfs is decided by
//!   the signature probe alone (a thin LV without mapped blocks is known to be blank).
//! - Writes after snapshots (copy-on-write) and snapshots themselves use pool space the
//!   overprovisioning ratio does not cover: watch the pool's `data_percent`, or let
//!   dmeventd extend it (`thin_pool_autoextend_threshold`).

pub mod classes;
pub mod report;
pub mod tags;

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Mutex;
use std::time::Duration;

use tracing::warn;

use crate::backend::{Backend, Device, PoolCapacity, Source, StorageStatus, StoredRecords};
use crate::error::{Error, Result};
use crate::ids::{ParsedId, SnapshotId, VolumeId};
use crate::os::blockdev;
use crate::store::{SnapshotRecord, VolumeRecord};

use classes::{DeviceClass, LvmConfig, DEVICE_CLASS_PARAMETER};
use report::{Lv, Lvm};

/// Logical volumes in the volume groups of the configured device classes.
#[derive(Debug)]
pub struct LvmBackend {
    /// The device classes.
    config: LvmConfig,
    /// The tools, with their deadline.
    lvm: Lvm,
    /// The largest extent size of the classes' volume groups: sizes are rounded up to it.
    extent_bytes: u64,
    /// Serialises each space check with the allocation that depends on it.
    allocation: Mutex<()>,
}

impl LvmBackend {
    /// Checks the classes and reads their volume groups' extent sizes.
    ///
    /// # Errors
    /// `InvalidArgument` for bad classes; `FailedPrecondition` for a volume group that
    /// does not exist; tool errors from `vgs`.
    pub fn open(config: LvmConfig, tool_timeout: Duration) -> Result<Self> {
        config.check()?;
        let lvm = Lvm {
            timeout: tool_timeout,
        };
        let mut extent_bytes = 512;
        for class in &config.device_classes {
            let vg = lvm
                .vg(&class.volume_group)?
                .ok_or_else(|| missing_vg(class))?;
            extent_bytes = extent_bytes.max(vg.extent_bytes);
        }
        Ok(LvmBackend {
            config,
            lvm,
            extent_bytes,
            allocation: Mutex::new(()),
        })
    }

    fn volume_groups(&self) -> Vec<&str> {
        let mut vgs: Vec<&str> = self
            .config
            .device_classes
            .iter()
            .map(|c| c.volume_group.as_str())
            .collect();
        vgs.sort_unstable();
        vgs.dedup();
        vgs
    }

    /// The LV called `name` in any of the classes' volume groups (one `lvs`).
    fn find(&self, name: &str) -> Result<Option<Lv>> {
        let found = self.lvm.lv(&self.volume_groups(), name)?;
        named(&found, name)
    }

    /// Every LV of the classes' volume groups (one `lvs`).
    fn all_lvs(&self) -> Result<Vec<Lv>> {
        self.lvm.lvs(&self.volume_groups())
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, ()> {
        self.allocation.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The class a volume's parameters pick.
    fn class_for(
        &self,
        parameters: &std::collections::BTreeMap<String, String>,
    ) -> Result<&DeviceClass> {
        self.config
            .pick(parameters.get(DEVICE_CLASS_PARAMETER).map(String::as_str))
    }

    /// The class an existing LV belongs to, if any.
    fn class_of(&self, lv: &Lv) -> Option<&DeviceClass> {
        self.config.device_classes.iter().find(|c| {
            c.volume_group == lv.vg
                && match c.pool() {
                    Some(pool) => lv.pool == pool,
                    None => !lv.thin(),
                }
        })
    }

    /// Space a class can still promise.
    fn class_capacity(&self, class: &DeviceClass) -> Result<PoolCapacity> {
        let lvs = match class.pool() {
            Some(_) => self.lvm.lvs(&[&class.volume_group])?,
            None => Vec::new(),
        };
        self.class_capacity_with(class, &lvs)
    }

    /// Space a class can still promise, with its VG's LVs already listed (thin classes).
    fn class_capacity_with(&self, class: &DeviceClass, lvs: &[Lv]) -> Result<PoolCapacity> {
        match class.pool() {
            None => {
                let vg = self
                    .lvm
                    .vg(&class.volume_group)?
                    .ok_or_else(|| missing_vg(class))?;
                Ok(PoolCapacity {
                    available_bytes: vg.free_bytes,
                    total_bytes: vg.size_bytes,
                })
            }
            Some(pool) => {
                let lvs: Vec<&Lv> = lvs
                    .iter()
                    .filter(|lv| lv.vg == class.volume_group)
                    .collect();
                let pool_lv = lvs.iter().find(|lv| lv.name == pool).ok_or_else(|| {
                    Error::FailedPrecondition(format!(
                        "thin pool {}/{pool} of device class {:?} does not exist",
                        class.volume_group, class.name
                    ))
                })?;
                let promised: u64 = lvs
                    .iter()
                    .filter(|lv| lv.pool == pool && is_volume(&lv.name))
                    .map(|lv| lv.size_bytes)
                    .sum();
                let offered = (pool_lv.size_bytes as f64 * class.overprovision_ratio) as u64;
                Ok(PoolCapacity {
                    available_bytes: offered.saturating_sub(promised),
                    total_bytes: pool_lv.size_bytes,
                })
            }
        }
    }

    /// Fails with RESOURCE_EXHAUSTED unless `class` can promise `needed` more bytes;
    /// `lvs` are the LVs of the classes' VGs, listed just before.
    fn ensure_room(&self, class: &DeviceClass, lvs: &[Lv], what: &str, needed: u64) -> Result<()> {
        let available = self.class_capacity_with(class, lvs)?.available_bytes;
        if needed > available {
            let place = match class.pool() {
                Some(pool) => format!(
                    "thin pool {}/{pool} (overprovisionRatio {})",
                    class.volume_group, class.overprovision_ratio
                ),
                None => format!("volume group {}", class.volume_group),
            };
            return Err(Error::ResourceExhausted(format!(
                "{what} needs {needed} more bytes but device class {:?} ({place}) can promise only {available}",
                class.name
            )));
        }
        Ok(())
    }

    /// Runs an lvm command that allocates; lvm's own "no space" becomes RESOURCE_EXHAUSTED.
    fn allocate(&self, program: &str, args: Vec<String>) -> Result<()> {
        match self.lvm.run(program, &args) {
            Err(Error::Tool { stderr, .. }) if stderr.contains("nsufficient") => {
                Err(Error::ResourceExhausted(format!("{program}: {stderr}")))
            }
            other => other.map(drop),
        }
    }

    fn remove(&self, lv: &Lv) -> Result<()> {
        self.lvm
            .run("lvremove", &args(&["-y", &lv.full_name()]))
            .map(drop)
    }

    /// Grows `lv` to `size_bytes` (never shrinks it).
    fn grow(&self, lv: &Lv, size_bytes: u64) -> Result<()> {
        if size_bytes <= lv.size_bytes {
            return Ok(());
        }
        self.allocate(
            "lvextend",
            args(&["-y", "-L", &format!("{size_bytes}b"), &lv.full_name()]),
        )
    }

    /// Makes a retried create's LV what the new attempt wants: big enough and tagged.
    fn adopt(&self, lv: &Lv, size_bytes: u64, tags: &[String]) -> Result<()> {
        self.grow(lv, size_bytes)?;
        let stale: Vec<&String> = lv
            .tags
            .iter()
            .filter(|t| t.starts_with("fv.") && !tags.contains(t))
            .collect();
        let missing: Vec<&String> = tags.iter().filter(|t| !lv.tags.contains(t)).collect();
        if stale.is_empty() && missing.is_empty() {
            return Ok(());
        }
        let mut command = vec!["-y".to_owned()];
        for tag in stale {
            command.push("--deltag".into());
            command.push(tag.clone());
        }
        for tag in missing {
            command.push("--addtag".into());
            command.push(tag.clone());
        }
        command.push(lv.full_name());
        self.lvm.run("lvchange", &command).map(drop)
    }

    /// Deactivates a volume's LV that nothing holds open: a volume's LV is to be active
    /// only where it is staged.
    fn deactivate_unused(&self, lv: &Lv) -> Result<()> {
        if lv.active() && !lv.open() {
            self.lvm
                .run("lvchange", &args(&["-y", "-an", &lv.full_name()]))?;
        }
        Ok(())
    }

    fn lv_of(&self, id: &VolumeId) -> Result<Lv> {
        self.find(id.as_str())?
            .ok_or_else(|| Error::NotFound(format!("volume {id} has no logical volume")))
    }
}

/// The one LV called `name` among `lvs`.
fn named(lvs: &[Lv], name: &str) -> Result<Option<Lv>> {
    let mut found = lvs.iter().filter(|lv| lv.name == name);
    let first = found.next().cloned();
    if found.next().is_some() {
        return Err(Error::Internal(format!(
            "LV {name} exists in more than one volume group"
        )));
    }
    Ok(first)
}

fn missing_vg(class: &DeviceClass) -> Error {
    Error::FailedPrecondition(format!(
        "volume group {:?} of device class {:?} does not exist",
        class.volume_group, class.name
    ))
}

fn is_volume(name: &str) -> bool {
    matches!(VolumeId::parse("lv", name), Ok(ParsedId::Ours(_)))
}

fn args(list: &[&str]) -> Vec<String> {
    list.iter().map(|s| (*s).to_owned()).collect()
}

fn with_tags(mut command: Vec<String>, tags: &[String]) -> Vec<String> {
    for tag in tags {
        command.push("--addtag".into());
        command.push(tag.clone());
    }
    command
}

fn status_of(lv: Option<Lv>) -> StorageStatus {
    match lv {
        Some(lv) => StorageStatus::Present {
            size_bytes: lv.size_bytes,
            allocated_bytes: lv.allocated_bytes(),
        },
        None => StorageStatus::Missing,
    }
}

impl Backend for LvmBackend {
    fn kind(&self) -> &'static str {
        "lvm"
    }

    fn check(&self) -> Result<()> {
        for class in &self.config.device_classes {
            let Some(pool) = class.pool() else {
                self.lvm
                    .vg(&class.volume_group)?
                    .ok_or_else(|| missing_vg(class))?;
                continue;
            };
            match self
                .lvm
                .lv(&[&class.volume_group], pool)?
                .into_iter()
                .next()
            {
                Some(lv) if lv.attr.starts_with('t') => {}
                Some(_) => {
                    return Err(Error::FailedPrecondition(format!(
                        "{}/{pool} of device class {:?} is not a thin pool",
                        class.volume_group, class.name
                    )));
                }
                None => {
                    return Err(Error::FailedPrecondition(format!(
                        "thin pool {}/{pool} of device class {:?} does not exist",
                        class.volume_group, class.name
                    )));
                }
            }
        }
        Ok(())
    }

    fn check_parameter(&self, key: &str, value: &str) -> Result<()> {
        if key == DEVICE_CLASS_PARAMETER {
            return self.config.pick(Some(value)).map(drop);
        }
        Err(Error::InvalidArgument(format!(
            "parameter {:?} is not known to the lvm backend (it takes {DEVICE_CLASS_PARAMETER})",
            crate::validate::clip(key)
        )))
    }

    fn round_size(&self, size_bytes: u64) -> u64 {
        size_bytes
            .div_ceil(self.extent_bytes)
            .saturating_mul(self.extent_bytes)
    }

    fn create(&self, id: &VolumeId, size_bytes: u64, record: &VolumeRecord) -> Result<()> {
        let class = self.class_for(&record.parameters)?;
        let tags = tags::for_volume(record)?;
        let _allocating = self.lock();
        let lvs = self.all_lvs()?;
        if let Some(lv) = named(&lvs, id.as_str())? {
            if self.class_of(&lv).map(|c| &c.name) != Some(&class.name) {
                return Err(Error::AlreadyExists(format!(
                    "volume {id} exists as {} outside device class {:?}",
                    lv.full_name(),
                    class.name
                )));
            }
            if size_bytes > lv.size_bytes {
                self.ensure_room(
                    class,
                    &lvs,
                    &format!("volume {id}"),
                    size_bytes - lv.size_bytes,
                )?;
            }
            self.adopt(&lv, size_bytes, &tags)?;
            return self.deactivate_unused(&lv);
        }
        self.ensure_room(class, &lvs, &format!("volume {id}"), size_bytes)?;
        let size = format!("{size_bytes}b");
        // A thin LV is made inactive (the pool hands out zeroed blocks); a linear one
        // must be active for its signatures to be wiped, and is deactivated after.
        let command = match class.pool() {
            Some(pool) => args(&[
                "-y",
                "-an",
                "-V",
                &size,
                "-T",
                &format!("{}/{pool}", class.volume_group),
                "-n",
                id.as_str(),
            ]),
            None => args(&[
                "-y",
                "-W",
                "y",
                "-L",
                &size,
                "-n",
                id.as_str(),
                &class.volume_group,
            ]),
        };
        self.allocate("lvcreate", with_tags(command, &tags))?;
        if class.pool().is_none() {
            self.lvm.run(
                "lvchange",
                &args(&["-y", "-an", &format!("{}/{id}", class.volume_group)]),
            )?;
        }
        Ok(())
    }

    fn delete(&self, id: &VolumeId) -> Result<()> {
        let Some(lv) = self.find(id.as_str())? else {
            return Ok(());
        };
        // Only staging activates a volume's LV: an active LV is staged on this node (like
        // an attached loop device), also when nothing holds it open (a block volume).
        if lv.open() || lv.active() {
            return Err(Error::FailedPrecondition(format!(
                "volume {id} is staged on this node ({} is active); unstage it first",
                lv.full_name()
            )));
        }
        self.remove(&lv)
    }

    fn status(&self, id: &VolumeId) -> Result<StorageStatus> {
        Ok(status_of(self.find(id.as_str())?))
    }

    fn capacity(&self) -> Result<PoolCapacity> {
        match self.config.default_class() {
            Some(class) => self.class_capacity(class),
            None => self.capacity_for(&HashMap::new()),
        }
    }

    fn capacity_for(&self, parameters: &HashMap<String, String>) -> Result<PoolCapacity> {
        match parameters.get(DEVICE_CLASS_PARAMETER) {
            Some(name) => self.class_capacity(self.config.pick(Some(name))?),
            None => match self.config.default_class() {
                Some(class) => self.class_capacity(class),
                // No default: the sum over the classes, each counted once per pool or VG.
                None => {
                    let mut total = PoolCapacity {
                        available_bytes: 0,
                        total_bytes: 0,
                    };
                    let mut seen = Vec::new();
                    for class in &self.config.device_classes {
                        let place = (class.volume_group.as_str(), class.pool());
                        if seen.contains(&place) {
                            continue;
                        }
                        seen.push(place);
                        let c = self.class_capacity(class)?;
                        total.available_bytes =
                            total.available_bytes.saturating_add(c.available_bytes);
                        total.total_bytes = total.total_bytes.saturating_add(c.total_bytes);
                    }
                    Ok(total)
                }
            },
        }
    }

    fn source_path(&self, id: &VolumeId) -> PathBuf {
        // For messages only: the LV may live in another class's VG.
        match self
            .config
            .default_class()
            .or(self.config.device_classes.first())
        {
            Some(class) => PathBuf::from(format!("/dev/{}/{id}", class.volume_group)),
            None => PathBuf::from(id.as_str()),
        }
    }

    fn create_from(
        &self,
        id: &VolumeId,
        source: Source<'_>,
        size_bytes: u64,
        record: &VolumeRecord,
    ) -> Result<()> {
        let class = self.class_for(&record.parameters)?;
        let tags = tags::for_volume(record)?;
        let _allocating = self.lock();
        let lvs = self.all_lvs()?;
        if let Some(lv) = named(&lvs, id.as_str())? {
            self.adopt(&lv, size_bytes, &tags)?;
            return self.deactivate_unused(&lv);
        }
        let source_name = match source {
            Source::Snapshot(s) => s.as_str().to_owned(),
            Source::Volume(v) => v.as_str().to_owned(),
        };
        let src = named(&lvs, &source_name)?.ok_or_else(|| {
            Error::NotFound(format!(
                "the source of volume {id} ({source_name}) has no logical volume"
            ))
        })?;
        let Some(pool) = class.pool() else {
            return Err(Error::FailedPrecondition(format!(
                "device class {:?} is linear: restores and clones are thin snapshots, which only thin device classes make",
                class.name
            )));
        };
        if !src.thin() {
            return Err(Error::FailedPrecondition(format!(
                "{source_name} is a linear LV ({}): only thin LVs can be restored or cloned",
                src.full_name()
            )));
        }
        if src.vg != class.volume_group || src.pool != pool {
            return Err(Error::InvalidArgument(format!(
                "device class {:?} (thin pool {}/{pool}) cannot hold a copy of {source_name}, which lives in thin pool {}/{}: \
                 thin snapshots stay in their pool; ask for a class on that pool",
                class.name, class.volume_group, src.vg, src.pool
            )));
        }
        if src.size_bytes > size_bytes {
            return Err(Error::OutOfRange(format!(
                "volume {id} of {size_bytes} bytes cannot hold its source of {} bytes",
                src.size_bytes
            )));
        }
        self.ensure_room(class, &lvs, &format!("volume {id}"), size_bytes)?;
        let command = args(&[
            "-y",
            "-an",
            "-s",
            "-kn",
            "-n",
            id.as_str(),
            &src.full_name(),
        ]);
        self.allocate("lvcreate", with_tags(command, &tags))?;
        if size_bytes > src.size_bytes {
            let made = Lv {
                name: id.to_string(),
                ..src.clone()
            };
            if let Err(e) = self.grow(&made, size_bytes) {
                // No half-made volume: the copy goes when it cannot get its size.
                if let Err(undo) = self.remove(&made) {
                    warn!(cause = %undo, lv = %made.full_name(), "could not remove a copy that failed to grow");
                }
                return Err(e);
            }
        }
        Ok(())
    }

    fn expand(&self, id: &VolumeId, size_bytes: u64) -> Result<()> {
        let _allocating = self.lock();
        let lvs = self.all_lvs()?;
        let lv = named(&lvs, id.as_str())?
            .ok_or_else(|| Error::NotFound(format!("volume {id} has no logical volume")))?;
        if size_bytes <= lv.size_bytes {
            return Ok(());
        }
        if let Some(class) = self.class_of(&lv) {
            self.ensure_room(
                class,
                &lvs,
                &format!("growing volume {id}"),
                size_bytes - lv.size_bytes,
            )?;
        }
        self.grow(&lv, size_bytes)
    }

    fn snapshot(
        &self,
        volume: &VolumeId,
        snapshot: &SnapshotId,
        record: &SnapshotRecord,
    ) -> Result<u64> {
        let lvs = self.all_lvs()?;
        if let Some(done) = named(&lvs, snapshot.as_str())? {
            return Ok(done.size_bytes);
        }
        let lv = named(&lvs, volume.as_str())?
            .ok_or_else(|| Error::NotFound(format!("volume {volume} has no logical volume")))?;
        if !lv.thin() {
            return Err(Error::FailedPrecondition(format!(
                "volume {volume} is a linear LV ({}): linear device classes take no snapshots \
                 (a classic LVM snapshot slows its origin and dies when its space runs out); use a thin device class",
                lv.full_name()
            )));
        }
        let command = args(&["-y", "-s", "-n", snapshot.as_str(), &lv.full_name()]);
        self.allocate("lvcreate", with_tags(command, &tags::for_snapshot(record)?))?;
        Ok(lv.size_bytes)
    }

    fn delete_snapshot(&self, snapshot: &SnapshotId) -> Result<()> {
        match self.find(snapshot.as_str())? {
            Some(lv) => self.remove(&lv),
            None => Ok(()),
        }
    }

    fn snapshot_status(&self, snapshot: &SnapshotId) -> Result<StorageStatus> {
        Ok(status_of(self.find(snapshot.as_str())?))
    }

    fn list(&self) -> Result<Vec<VolumeId>> {
        let mut ids: Vec<VolumeId> = self
            .lvm
            .lvs(&self.volume_groups())?
            .into_iter()
            .filter_map(|lv| match VolumeId::parse("lv", &lv.name) {
                Ok(ParsedId::Ours(id)) => Some(id),
                _ => None,
            })
            .collect();
        ids.sort();
        Ok(ids)
    }

    fn stored_records(&self) -> Result<StoredRecords> {
        let mut found = StoredRecords::default();
        for lv in self.lvm.lvs(&self.volume_groups())? {
            let read = if is_volume(&lv.name) {
                tags::volume_from(&lv.name, lv.size_bytes, &lv.tags)
                    .map(|r| found.volumes.extend(r))
            } else if SnapshotId::parse_ours("lv", &lv.name).is_ok() {
                tags::snapshot_from(&lv.name, lv.size_bytes, &lv.tags)
                    .map(|r| found.snapshots.extend(r))
            } else {
                Ok(())
            };
            if let Err(e) = read {
                warn!(lv = %lv.full_name(), cause = %e, "cannot read the record in an LV's tags");
            }
        }
        Ok(found)
    }

    fn devices(&self, id: &VolumeId) -> Result<Vec<Device>> {
        match self.find(id.as_str())? {
            Some(lv) if lv.active() && lv.dm_path.exists() => Ok(vec![Device::at(&lv.dm_path)?]),
            _ => Ok(Vec::new()),
        }
    }

    fn attach(&self, id: &VolumeId, read_only: bool) -> Result<Device> {
        let lv = self.lv_of(id)?;
        if !lv.active() {
            self.lvm
                .run("lvchange", &args(&["-y", "-ay", "-K", &lv.full_name()]))?;
        }
        let device = Device::at(&lv.dm_path)?;
        blockdev::set_read_only(&device.path, read_only)?;
        Ok(device)
    }

    fn detach(&self, id: &VolumeId, _device: &Device) -> Result<()> {
        match self.find(id.as_str())? {
            Some(lv) if lv.active() => self
                .lvm
                .run("lvchange", &args(&["-y", "-an", &lv.full_name()]))
                .map(drop),
            _ => Ok(()),
        }
    }

    fn refresh(&self, _device: &Device) -> Result<()> {
        // lvextend reloads the device-mapper table: the device already has its new size.
        Ok(())
    }

    fn holds_data(&self, id: &VolumeId) -> Result<bool> {
        let lv = self.lv_of(id)?;
        Ok(lv.thin() && lv.data_percent.is_some_and(|p| p > 0.0))
    }
}

impl LvmBackend {
    /// The classes, for the operator commands.
    pub fn classes(&self) -> &[DeviceClass] {
        &self.config.device_classes
    }
}
