//! NodePublishVolume and NodeUnpublishVolume: bind mounts into the pod's target path.
//!
//! A mount volume is published by binding its staging mount onto a target directory; a
//! block volume by binding its device node onto a target file. A target is only ever
//! unmounted after it was shown to be a mount of this volume.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use nix::mount::MsFlags;
use tracing::info;

use crate::backend::Device;
use crate::csi::v1::volume_capability::access_mode::Mode;
use crate::csi::v1::{
    NodePublishVolumeRequest, NodePublishVolumeResponse, NodeUnpublishVolumeRequest,
    NodeUnpublishVolumeResponse,
};
use crate::driver::Driver;
use crate::error::{Error, Result};
use crate::ids::VolumeId;
use crate::os::loopdev;
use crate::os::mount::{self, MountEntry};
use crate::os::paths;
use crate::store::{StagedAccess, TargetRecord};
use crate::validate::{self, Access};

use super::devices_of;

/// Whether the mount at a target belongs to this volume.
///
/// A filesystem mount belongs when it is a filesystem on one of the volume's devices. A
/// block target (a bound device node) belongs when it is one of those devices, or when
/// the driver recorded publishing it there (`recorded`): its loop device may have been
/// detached behind the driver's back, or even reused by another volume since, and the
/// stale bind must still be cleanable by the volume that made it.
pub(super) fn is_ours(
    entry: &MountEntry,
    target: &Path,
    devices: &[Device],
    recorded: bool,
) -> bool {
    if devices.iter().any(|d| d.is_source_of(entry)) {
        return true;
    }
    if !loopdev::is_block_device(target) {
        return false;
    }
    recorded || loopdev::rdev_of(target).is_ok_and(|rdev| devices.iter().any(|d| d.rdev == rdev))
}

/// Why a further publish would break the access mode of the volume's live targets.
///
/// SINGLE_NODE_SINGLE_WRITER allows one target; SINGLE_NODE_WRITER one read-write target
/// (read-only ones beside it are fine); the other single-node modes allow many.
fn mode_conflict(
    id: &VolumeId,
    mode: Mode,
    read_only: bool,
    live: &[(PathBuf, TargetRecord)],
) -> Option<String> {
    let single = Mode::SingleNodeSingleWriter.as_str_name();
    let writer = Mode::SingleNodeWriter.as_str_name();
    let clash = live.iter().find(|(_, other)| {
        mode == Mode::SingleNodeSingleWriter
            || other.access_mode == single
            || (!read_only
                && !other.readonly
                && (mode == Mode::SingleNodeWriter || other.access_mode == writer))
    })?;
    Some(format!(
        "volume {id} is already published at {} ({}, readonly={}); {} does not allow another {}target",
        clash.0.display(),
        clash.1.access_mode,
        clash.1.readonly,
        if mode == Mode::SingleNodeSingleWriter || clash.1.access_mode == single { single } else { writer },
        if read_only { "" } else { "read-write " }
    ))
}

pub(super) async fn publish(
    driver: &Arc<Driver>,
    req: NodePublishVolumeRequest,
) -> Result<NodePublishVolumeResponse> {
    let id = VolumeId::parse_ours("volume_id", &req.volume_id)?;
    if req.staging_target_path.is_empty() {
        return Err(Error::FailedPrecondition(
            "staging_target_path is not set: ferrovol volumes must be staged (NodeStageVolume) before they are published"
                .into(),
        ));
    }
    let staging =
        super::checked_path(driver, "staging_target_path", &req.staging_target_path).await?;
    let target = super::checked_path(driver, "target_path", &req.target_path).await?;
    let cap = validate::capability("volume_capability", req.volume_capability.as_ref())?;
    if target == staging || target.starts_with(&staging) || staging.starts_with(&target) {
        return Err(Error::InvalidArgument(format!(
            "target_path {} and staging_target_path {} must not contain each other",
            target.display(),
            staging.display()
        )));
    }
    let read_only = req.readonly || cap.read_only_mode();
    let key = id.to_string();
    driver
        .locked(&key, move |d| async move {
            super::require_storage(&d, &id).await?;
            let mut record = d.staged.get(id.as_str()).ok_or_else(|| {
                Error::FailedPrecondition(format!("volume {id} is not staged on this node; stage it first"))
            })?;
            if record.staging_path != staging {
                return Err(Error::FailedPrecondition(format!(
                    "volume {id} is staged at {}, not at {}",
                    record.staging_path.display(),
                    staging.display()
                )));
            }
            let block = match (&record.access, &cap.access) {
                (StagedAccess::Block, Access::Block) => true,
                (StagedAccess::Mount { .. }, Access::Mount { .. }) => false,
                _ => {
                    return Err(Error::FailedPrecondition(format!(
                        "volume {id} is staged as {:?}, which cannot serve {:?}",
                        record.access, cap.access
                    )));
                }
            };
            let mount_flags = match &cap.access {
                Access::Mount { mount_flags, .. } => mount_flags.clone(),
                Access::Block => Vec::new(),
            };
            let device = devices_of(&d, &id).await?.into_iter().next().ok_or_else(|| {
                Error::FailedPrecondition(format!(
                    "volume {id} has no device on this node (was the node rebooted?); stage it again"
                ))
            })?;
            let entry = TargetRecord {
                access_mode: cap.mode.as_str_name().to_owned(),
                readonly: read_only,
            };
            let others: Vec<(PathBuf, TargetRecord)> = record
                .targets
                .iter()
                .filter(|(t, _)| **t != target)
                .map(|(t, r)| (t.clone(), r.clone()))
                .collect();
            let publish_id = id.clone();
            let bind_target_path = target.clone();
            let recorded = record.targets.contains_key(&target);
            let mode = cap.mode;
            d.blocking(move || {
                let table = mount::read_mountinfo()?;
                if let Some(existing) = mount::mount_at(&table, &bind_target_path) {
                    return check_existing(&publish_id, existing, &bind_target_path, &device, read_only, recorded);
                }
                let live: Vec<(PathBuf, TargetRecord)> = others
                    .into_iter()
                    .filter(|(t, _)| {
                        mount::mount_at(&table, t).is_some_and(|m| is_ours(m, t, std::slice::from_ref(&device), false))
                    })
                    .collect();
                if let Some(conflict) = mode_conflict(&publish_id, mode, read_only, &live) {
                    return Err(Error::FailedPrecondition(conflict));
                }
                bind_target(&publish_id, &table, &device, &staging, &bind_target_path, block, read_only, &mount_flags)
            })
            .await?;
            if record.targets.get(&target) != Some(&entry) {
                record.targets.insert(target, entry);
                let stored = Arc::clone(&d);
                d.blocking(move || stored.staged.put(&record.volume_id.clone(), &record))
                    .await?;
            }
            info!("volume published");
            Ok(NodePublishVolumeResponse {})
        })
        .await
}

/// A target that already holds a mount: fine if it is this volume with the same
/// read-only setting, an error otherwise.
fn check_existing(
    id: &VolumeId,
    existing: &MountEntry,
    target: &Path,
    device: &Device,
    read_only: bool,
    recorded: bool,
) -> Result<()> {
    if !is_ours(existing, target, std::slice::from_ref(device), recorded) {
        return Err(Error::FailedPrecondition(format!(
            "target_path {} already holds a mount of {}, not of volume {id}",
            target.display(),
            existing.source
        )));
    }
    if existing.read_only() != read_only {
        return Err(Error::AlreadyExists(format!(
            "volume {id} is already published at {} with readonly={}",
            target.display(),
            existing.read_only()
        )));
    }
    Ok(())
}

#[allow(clippy::too_many_arguments)]
fn bind_target(
    id: &VolumeId,
    table: &[MountEntry],
    device: &Device,
    staging: &Path,
    target: &Path,
    block: bool,
    read_only: bool,
    mount_flags: &[String],
) -> Result<()> {
    let mut flags = if block {
        MsFlags::MS_NOSUID
    } else {
        match mount::mount_at(table, staging) {
            Some(m) if device.is_source_of(m) => {}
            _ => {
                return Err(Error::FailedPrecondition(format!(
                    "volume {id} has no filesystem mounted at its staging path {}; stage it again",
                    staging.display()
                )));
            }
        }
        mount::parse_mount_flags(mount_flags)?.flags
    };
    if read_only {
        flags |= MsFlags::MS_RDONLY;
    }
    if block {
        let created = paths::ensure_file(target)?;
        if let Err(e) = mount::bind(&device.path, target, flags) {
            if created {
                let _ = paths::remove_target(target);
            }
            return Err(e);
        }
    } else {
        paths::ensure_dir(target)?;
        mount::bind(staging, target, flags)?;
    }
    Ok(())
}

pub(super) async fn unpublish(
    driver: &Arc<Driver>,
    req: NodeUnpublishVolumeRequest,
) -> Result<NodeUnpublishVolumeResponse> {
    let id = VolumeId::parse_ours("volume_id", &req.volume_id)?;
    let target = super::checked_path(driver, "target_path", &req.target_path).await?;
    let key = id.to_string();
    driver
        .locked(&key, move |d| async move {
            let devices = devices_of(&d, &id).await?;
            let record = d.staged.get(id.as_str());
            let known =
                record.is_some() || !devices.is_empty() || super::storage_exists(&d, &id).await?;
            let recorded = record
                .as_ref()
                .is_some_and(|r| r.targets.contains_key(&target));
            let unpublish_id = id.clone();
            let unmount_target = target.clone();
            d.blocking(move || {
                let mut unmounted = false;
                for _ in 0..8 {
                    let table = mount::read_mountinfo()?;
                    let Some(existing) = mount::mount_at(&table, &unmount_target) else {
                        break;
                    };
                    if !is_ours(existing, &unmount_target, &devices, recorded) {
                        return Err(Error::FailedPrecondition(format!(
                            "target_path {} holds a mount of {}, not of volume {unpublish_id}",
                            unmount_target.display(),
                            existing.source
                        )));
                    }
                    mount::unmount(&unmount_target)?;
                    unmounted = true;
                }
                if !unmounted && !known {
                    return Err(Error::NotFound(format!(
                        "volume {unpublish_id} does not exist"
                    )));
                }
                paths::remove_target(&unmount_target)
            })
            .await?;
            if let Some(mut record) = record.filter(|r| r.targets.contains_key(&target)) {
                record.targets.remove(&target);
                let stored = Arc::clone(&d);
                d.blocking(move || stored.staged.put(&record.volume_id.clone(), &record))
                    .await?;
            }
            info!("volume unpublished");
            Ok(NodeUnpublishVolumeResponse {})
        })
        .await
}
