//! NodeExpandVolume: the node half of online expansion.
//!
//! The controller grew the backing file, or (with `--expansion node`, or when the
//! controller has not) this RPC grows it to the requested size first; then the loop
//! device learns the new size
//! (`LOOP_SET_CAPACITY`) and the mounted filesystem grows into it (resize2fs, xfs_growfs,
//! btrfs resize). A block volume needs only the device step.
//!
//! # Limitations
//! The kernel lets only a process with `CAP_SYS_RESOURCE` grow a mounted ext4. Without it
//! the request fails with FAILED_PRECONDITION saying so; the filesystem then grows
//! offline the next time the volume is staged.

use std::sync::Arc;

use tracing::info;

use crate::config::FsType;
use crate::csi::v1::{NodeExpandVolumeRequest, NodeExpandVolumeResponse};
use crate::driver::Driver;
use crate::error::{Error, Result};
use crate::ids::VolumeId;
use crate::os::{grow, loopdev, mount};
use crate::validate;

use super::devices_of;

pub(super) async fn expand(
    driver: &Arc<Driver>,
    req: NodeExpandVolumeRequest,
) -> Result<NodeExpandVolumeResponse> {
    let id = VolumeId::parse_ours("volume_id", &req.volume_id)?;
    let path = super::checked_path(driver, "volume_path", &req.volume_path).await?;
    if !req.staging_target_path.is_empty() {
        super::checked_path(driver, "staging_target_path", &req.staging_target_path).await?;
    }
    // The size kubelet asks for: the storage grows to it here when the controller did not
    // grow it (node expansion, or a controller that lost the race with a restart).
    let (wanted, limit) = match req.capacity_range.as_ref() {
        Some(range) if range.required_bytes != 0 || range.limit_bytes != 0 => {
            let size = validate::volume_size(Some(range), validate::MIN_SIZE)?;
            let size = driver.backend.round_size(size);
            let limit = u64::try_from(range.limit_bytes).unwrap_or(0);
            (Some(size), limit)
        }
        _ => (None, 0),
    };
    if let Some(cap) = req.volume_capability.as_ref() {
        validate::capability("volume_capability", Some(cap))?;
    }
    let key = id.to_string();
    driver
        .locked(&key, move |d| async move {
            let stored_bytes = super::require_storage(&d, &id).await?;
            let device = devices_of(&d, &id)
                .await?
                .into_iter()
                .next()
.ok_or_else(|| {
                    Error::NotFound(format!(
                        "volume_path {} is not a mount of volume {id}: the volume is not staged on this node",
                        path.display()
                    ))
                })?;
            let recorded = d
                .staged
                .get(id.as_str())
                .is_some_and(|r| r.targets.contains_key(&path) || r.staging_path == path);
            let (check_id, check_device, check_path) = (id.clone(), device.clone(), path.clone());
            // First make sure the request names this volume's mount or device here, and
            // only then grow anything: a wrong request changes nothing.
            let filesystem = d
                .blocking(move || {
                    let table = mount::read_mountinfo()?;
                    let entry = mount::mount_at(&table, &check_path);
                    if loopdev::is_block_device(&check_path) {
                        let same = loopdev::rdev_of(&check_path)? == check_device.rdev;
                        if entry.is_none() || !(same || recorded) {
                            return Err(Error::NotFound(format!(
                                "volume_path {} is not a device of volume {check_id}",
                                check_path.display()
                            )));
                        }
                        return Ok(None);
                    }
                    let entry = entry
                        .filter(|m| check_device.is_source_of(m))
                        .ok_or_else(|| {
                            Error::NotFound(format!(
                                "volume_path {} is not a mount of volume {check_id}",
                                check_path.display()
                            ))
                        })?;
                    let fs = FsType::parse(&entry.fs_type).ok_or_else(|| {
                        Error::FailedPrecondition(format!("cannot grow a {} filesystem", entry.fs_type))
                    })?;
                    Ok(Some((fs, entry.read_only())))
                })
                .await?;
            if let Some((_, true)) = filesystem {
                return Err(Error::FailedPrecondition(format!(
                    "volume {id} is mounted read-only at {}; its filesystem cannot grow there",
                    path.display()
                )));
            }
            if let Some(size) = wanted {
                grow_storage(&d, &id, stored_bytes, size, limit).await?;
            }
            let refreshed = device.clone();
            let backend = Arc::clone(&d.backend);
            let size = d
                .blocking(move || {
                    backend.refresh(&refreshed)?;
                    refreshed.size_bytes()
                })
                .await?;
            crate::crash_point!("node_expand.after_capacity");
            if let Some((fs, _)) = filesystem {
                let needs_growth = fs != FsType::Ext4 || super::smaller_than_device(&d, &device, fs).await?;
                if needs_growth && fs == FsType::Ext4 && !d.can_grow_mounted_ext4 {
                    return Err(Error::FailedPrecondition(format!(
                        "growing the mounted ext4 filesystem of volume {id} needs CAP_SYS_RESOURCE, which the driver \
                         lacks; the device has grown to {size} bytes and the filesystem grows when the volume is next staged"
                    )));
                }
                if needs_growth {
                    grow::grow_filesystem(fs, &device.path, &path, d.config.tool_timeout).await?;
                    crate::crash_point!("node_expand.after_fs_grow");
                }
            }
            info!(capacity_bytes = size, "volume expanded on the node");
            Ok(NodeExpandVolumeResponse {
                capacity_bytes: i64::try_from(size).unwrap_or(i64::MAX),
            })
        })
        .await
}

/// Grows the storage of `id` from `current` to at least `size` bytes, and its controller
/// record with it when this process holds one. A volume already that big is left alone;
/// one above `limit` (when set) cannot shrink and fails with OUT_OF_RANGE.
async fn grow_storage(
    driver: &Arc<Driver>,
    id: &VolumeId,
    current: u64,
    size: u64,
    limit: u64,
) -> Result<()> {
    if limit > 0 && current > limit {
        return Err(Error::OutOfRange(format!(
            "volume {id} has {current} bytes, above limit_bytes {limit}; shrinking is not supported"
        )));
    }
    if size > current {
        let backend = Arc::clone(&driver.backend);
        let grow_id = id.clone();
        crate::crash_point!("node_expand.before_grow_file");
        driver
            .blocking(move || backend.expand(&grow_id, size))
            .await?;
        crate::crash_point!("node_expand.after_grow_file");
        info!(capacity_bytes = size, "volume storage grown on the node");
    }
    // Also when the file grew in an earlier attempt whose record write failed.
    if let Some(mut record) = driver.volumes.get(id.as_str()) {
        if record.capacity_bytes < size {
            record.capacity_bytes = size;
            let stored = Arc::clone(driver);
            driver
                .blocking(move || stored.volumes.put(&record.volume_id.clone(), &record))
                .await?;
        }
    }
    Ok(())
}
