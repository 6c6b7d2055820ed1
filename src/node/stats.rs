//! NodeGetVolumeStats: usage and condition of a published or staged volume.
//!
//! The path must be shown to be this volume's before anything is reported: a filesystem on
//! one of the volume's devices, or a block device node that is one of them. The condition
//! turns abnormal when the storage (backing file, logical volume) was deleted or the
//! device was detached behind the driver's back. The condition is also
//! abnormal when the pool has less space free than the volume's sparse file may still
//! grow into (a full or overprovisioned pool): writes inside the volume that need new
//! space then fail with ENOSPC.

use std::path::Path;
use std::sync::Arc;

use crate::backend::{Device, StorageStatus};
use crate::csi::v1::volume_usage::Unit;
use crate::csi::v1::{
    NodeGetVolumeStatsRequest, NodeGetVolumeStatsResponse, VolumeCondition, VolumeUsage,
};
use crate::driver::Driver;
use crate::error::{Error, Result};
use crate::ids::VolumeId;
use crate::os::loopdev;
use crate::os::{mount, paths, statfs};

fn usage(unit: Unit, total: u64, available: u64, used: u64) -> VolumeUsage {
    let clamp = |v: u64| i64::try_from(v).unwrap_or(i64::MAX);
    VolumeUsage {
        available: clamp(available),
        total: clamp(total),
        used: clamp(used),
        unit: unit as i32,
    }
}

fn condition(problem: Option<String>) -> Option<VolumeCondition> {
    Some(VolumeCondition {
        abnormal: problem.is_some(),
        message: problem.unwrap_or_default(),
    })
}

pub(super) async fn volume_stats(
    driver: &Arc<Driver>,
    req: NodeGetVolumeStatsRequest,
) -> Result<NodeGetVolumeStatsResponse> {
    let id = VolumeId::parse_ours("volume_id", &req.volume_id)?;
    let path = super::checked_path(driver, "volume_path", &req.volume_path).await?;
    if !req.staging_target_path.is_empty() {
        super::checked_path(driver, "staging_target_path", &req.staging_target_path).await?;
    }
    let backend = Arc::clone(&driver.backend);
    let recorded = driver
        .staged
        .get(id.as_str())
        .is_some_and(|r| r.targets.contains_key(&path) || r.staging_path == path);
    driver
        .blocking(move || {
            if !paths::exists(&path) {
                return Err(Error::NotFound(format!(
                    "volume_path {} does not exist",
                    path.display()
                )));
            }
            let devices = backend.devices(&id)?;
            let backing_problem = match backend.status(&id)? {
                StorageStatus::Missing => Some(format!(
                    "the storage of volume {id} ({}) is gone",
                    backend.source_path(&id).display()
                )),
                StorageStatus::Present { .. } => growth_problem(backend.growth_room(&id), &id),
            };
            if loopdev::is_block_device(&path) {
                block_stats(&id, &path, &devices, backing_problem, recorded)
            } else {
                mount_stats(&id, &path, &devices, backing_problem)
            }
        })
        .await
}

/// Why volume `id` cannot grow into its full size, if it cannot.
fn growth_problem(room: Result<Option<(u64, u64)>>, id: &VolumeId) -> Option<String> {
    match room {
        Ok(Some((unwritten, free))) if free < unwritten => Some(format!(
            "the pool has {free} bytes free but volume {id} may still grow by {unwritten}: \
             writes inside it that need new space fail with ENOSPC (pool full or overprovisioned)"
        )),
        Ok(_) => None,
        Err(e) => Some(format!("cannot measure the storage of volume {id}: {e}")),
    }
}

fn block_stats(
    id: &VolumeId,
    path: &Path,
    devices: &[Device],
    backing_problem: Option<String>,
    recorded: bool,
) -> Result<NodeGetVolumeStatsResponse> {
    let rdev = loopdev::rdev_of(path)?;
    let not_ours = || {
        Error::NotFound(format!(
            "volume_path {} is not a device of volume {id}",
            path.display()
        ))
    };
    let Some(device) = devices.iter().find(|d| d.rdev == rdev) else {
        // Not (or no longer) one of the volume's devices. If the driver published it here,
        // the device was detached, or detached and reused, behind its back.
        if !recorded {
            return Err(not_ours());
        }
        let what = match loopdev::loop_by_rdev(rdev) {
            Some((number, None)) => {
                format!("loop device /dev/loop{number} of volume {id} was detached")
            }
            Some((number, Some(other))) => format!(
                "loop device /dev/loop{number} of volume {id} was detached and now serves {other}"
            ),
            None => format!("device {} of volume {id} was detached", path.display()),
        };
        return Ok(NodeGetVolumeStatsResponse {
            usage: Vec::new(),
            volume_condition: condition(Some(format!(
                "{what}; the volume is unreachable until it is staged again"
            ))),
        });
    };
    let size = device.size_bytes()?;
    let problem = backing_problem.or_else(|| {
        device
            .storage_deleted
            .then(|| format!("backing file of volume {id} was deleted while attached"))
    });
    Ok(NodeGetVolumeStatsResponse {
        usage: vec![usage(Unit::Bytes, size, 0, size)],
        volume_condition: condition(problem),
    })
}

fn mount_stats(
    id: &VolumeId,
    path: &Path,
    devices: &[Device],
    backing_problem: Option<String>,
) -> Result<NodeGetVolumeStatsResponse> {
    let table = mount::read_mountinfo()?;
    let entry = mount::mount_at(&table, path).ok_or_else(|| {
        Error::NotFound(format!(
            "volume_path {} is not a mount of volume {id}",
            path.display()
        ))
    })?;
    let device = devices
        .iter()
        .find(|d| d.is_source_of(entry))
        .ok_or_else(|| {
            Error::NotFound(format!(
                "volume_path {} is a mount of {}, not of volume {id}",
                path.display(),
                entry.source
            ))
        })?;
    let fs = statfs::usage(path)?;
    let problem = backing_problem.or_else(|| {
        device
            .storage_deleted
            .then(|| format!("backing file of volume {id} was deleted while attached"))
    });
    let mut usages = vec![usage(
        Unit::Bytes,
        fs.total_bytes,
        fs.available_bytes,
        fs.total_bytes.saturating_sub(fs.free_bytes),
    )];
    // btrfs allocates inodes dynamically and reports none: say nothing rather than zeros.
    if fs.total_inodes > 0 {
        usages.push(usage(
            Unit::Inodes,
            fs.total_inodes,
            fs.free_inodes,
            fs.total_inodes.saturating_sub(fs.free_inodes),
        ));
    }
    Ok(NodeGetVolumeStatsResponse {
        usage: usages,
        volume_condition: condition(problem),
    })
}
