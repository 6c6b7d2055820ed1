//! NodeStageVolume and NodeUnstageVolume.
//!
//! Staging makes the volume's device on this node (the backend attaches a loop device or
//! activates a logical volume) and, for mount access, mounts its filesystem at the staging
//! path, creating the filesystem only on a blank device.
//!
//! # Design
//! "Blank" is decided twice: blkid must find no signature at all, and the backend must
//! know of no written data (`SEEK_DATA` finds nothing in a backing file; a thin LV has no
//! mapped blocks). A device that a crash left half
//! formatted is recognised by the `formatting` flag that the stage record carries while
//! mkfs runs. So no path formats a device that holds data, also when blkid misses it.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use nix::mount::MsFlags;
use tracing::{info, warn};

use crate::backend::Device;
use crate::config::FsType;
use crate::csi::v1::{
    NodeStageVolumeRequest, NodeStageVolumeResponse, NodeUnstageVolumeRequest,
    NodeUnstageVolumeResponse,
};
use crate::driver::Driver;
use crate::error::{Error, Result};
use crate::ids::VolumeId;
use crate::os::loopdev;
use crate::os::mount::{self, MountEntry};
use crate::os::tools::{self, Content};
use crate::os::{grow, paths};
use crate::store::{StageRecord, StagedAccess};
use crate::validate::{self, Access};

use super::devices_of;

pub(super) async fn stage(
    driver: &Arc<Driver>,
    req: NodeStageVolumeRequest,
) -> Result<NodeStageVolumeResponse> {
    let id = VolumeId::parse_ours("volume_id", &req.volume_id)?;
    let staging =
        super::checked_path(driver, "staging_target_path", &req.staging_target_path).await?;
    let cap = validate::capability("volume_capability", req.volume_capability.as_ref())?;
    let read_only = cap.read_only_mode();
    let access = match cap.access {
        Access::Block => StagedAccess::Block,
        Access::Mount {
            fs_type,
            mount_flags,
        } => StagedAccess::Mount {
            fs_type: fs_type.unwrap_or(driver.config.default_fs_type),
            mount_flags,
        },
    };
    let key = id.to_string();
    driver
        .locked(&key, move |d| async move {
            super::require_storage(&d, &id).await?;
            let previous = d.staged.get(id.as_str());
            if let Some(p) = &previous {
                if p.staging_path != staging {
                    return Err(Error::FailedPrecondition(format!(
                        "volume {id} is already staged at {}",
                        p.staging_path.display()
                    )));
                }
                if p.access != access || p.read_only != read_only {
                    return Err(Error::AlreadyExists(format!(
                        "volume {id} is already staged at {} with another capability ({:?})",
                        staging.display(),
                        p.access
                    )));
                }
            }
            let mut record = previous.clone().unwrap_or(StageRecord {
                volume_id: id.to_string(),
                staging_path: staging.clone(),
                access,
                read_only,
                formatting: false,
                targets: Default::default(),
            });
            if previous.is_none() {
                put_record(&d, &record).await?;
                crate::crash_point!("stage.after_record");
            }
            let mut attached_now = None;
            let result = stage_steps(&d, &id, &mut record, read_only, &mut attached_now).await;
            if let Err(e) = &result {
                // Leave nothing this call made behind, so the failure is clean to retry.
                if let Some(device) = attached_now {
                    let backend = Arc::clone(&d.backend);
                    let detach_id = id.clone();
                    if let Err(detach) = d.blocking(move || backend.detach(&detach_id, &device)).await {
                        warn!(cause = %detach, "could not detach after a failed stage");
                    }
                }
                if previous.is_none() && !record.formatting {
                    let stored = Arc::clone(&d);
                    let record_id = id.to_string();
                    if let Err(remove) = d.blocking(move || stored.staged.remove(&record_id)).await {
                        warn!(cause = %remove, "could not remove the stage record after a failed stage");
                    }
                }
                warn!(cause = %e, "stage failed");
            } else {
                info!(staging_path = %staging.display(), "volume staged");
            }
            result.map(|()| NodeStageVolumeResponse {})
        })
        .await
}

async fn put_record(driver: &Arc<Driver>, record: &StageRecord) -> Result<()> {
    let stored = Arc::clone(driver);
    let record = record.clone();
    driver
        .blocking(move || stored.staged.put(&record.volume_id.clone(), &record))
        .await
}

async fn stage_steps(
    driver: &Arc<Driver>,
    id: &VolumeId,
    record: &mut StageRecord,
    read_only: bool,
    attached_now: &mut Option<Device>,
) -> Result<()> {
    let device = match devices_of(driver, id).await?.into_iter().next() {
        Some(device) => device,
        None => {
            let backend = Arc::clone(&driver.backend);
            let attach_id = id.clone();
            // A block volume staged for reading only gets a device that refuses writes; a
            // mount volume is protected by its read-only mount (and may need mkfs first).
            let read_only = read_only && record.access == StagedAccess::Block;
            crate::crash_point!("stage.before_attach");
            let device = driver
                .blocking(move || backend.attach(&attach_id, read_only))
                .await?;
            *attached_now = Some(device.clone());
            crate::crash_point!("stage.after_attach");
            device
        }
    };
    let StagedAccess::Mount {
        fs_type,
        mount_flags,
    } = record.access.clone()
    else {
        return Ok(());
    };
    let staging = record.staging_path.clone();
    let table = driver.blocking(mount::read_mountinfo).await?;
    if let Some(m) = mount::mount_at(&table, &staging) {
        if device.is_source_of(m) {
            return Ok(());
        }
        return Err(Error::FailedPrecondition(format!(
            "staging path {} already holds a mount of {}",
            staging.display(),
            m.source
        )));
    }
    let existed = ensure_filesystem(driver, id, &device, fs_type, record).await?;
    // A filesystem smaller than its device (restored or cloned into a larger volume, or
    // expanded while not staged) is grown: ext4 offline before the mount, which needs no
    // CAP_SYS_RESOURCE; XFS and btrfs online after it, the only way they grow.
    let mut grow_after_mount =
        existed && !read_only && super::smaller_than_device(driver, &device, fs_type).await?;
    if grow_after_mount && fs_type == FsType::Ext4 {
        grow::grow_ext4_offline(&device.path, driver.config.tool_timeout).await?;
        grow_after_mount = false;
    }
    let mut opts = mount::parse_mount_flags(&mount_flags)?;
    if read_only {
        opts.flags |= MsFlags::MS_RDONLY;
    }
    if fs_type == FsType::Xfs {
        // Clones and restored snapshots share their source's UUID; XFS refuses a second
        // mount of a UUID unless told not to care.
        opts.data = if opts.data.is_empty() {
            "nouuid".into()
        } else {
            format!("{},nouuid", opts.data)
        };
    }
    let dev_path = device.path.clone();
    let mount_point = staging.clone();
    crate::crash_point!("stage.before_mount");
    driver
        .blocking(move || {
            paths::ensure_dir(&staging)?;
            mount::mount_fs(
                &dev_path,
                &staging,
                fs_type.as_str(),
                opts.flags,
                &opts.data,
            )
            .map_err(|e| match e {
                Error::Io { ref source, .. } if source.raw_os_error() == Some(libc::EINVAL) => {
                    Error::InvalidArgument(format!(
                        "{e} (the filesystem refused the mount flags {mount_flags:?})"
                    ))
                }
                other => other,
            })
        })
        .await?;
    crate::crash_point!("stage.after_mount");
    if grow_after_mount {
        if let Err(e) = grow::grow_filesystem(
            fs_type,
            &device.path,
            &mount_point,
            driver.config.tool_timeout,
        )
        .await
        {
            // Leave no mount behind a failed stage.
            let _ = driver.blocking(move || mount::unmount(&mount_point)).await;
            return Err(e);
        }
        info!(
            fs_type = fs_type.as_str(),
            "grew the filesystem to its device"
        );
    }
    Ok(())
}

/// Makes sure the device holds a filesystem of type `fs_type`, formatting it only when it
/// is blank.
async fn ensure_filesystem(
    driver: &Arc<Driver>,
    id: &VolumeId,
    device: &Device,
    fs_type: FsType,
    record: &mut StageRecord,
) -> Result<bool> {
    let timeout = driver.config.tool_timeout;
    let content = tools::probe(&device.path, timeout).await?;
    // A stage that crashed during mkfs left the `formatting` intent behind: the device
    // never held anything but that half-made filesystem, so it is formatted again even
    // if mkfs got as far as writing a signature.
    let overwrite = record.formatting && matches!(content, Content::Signature(_));
    let content = if overwrite { Content::Nothing } else { content };
    match content {
        Content::Signature(found) if found == fs_type.as_str() => Ok(true),
        Content::Signature(found) => Err(Error::FailedPrecondition(format!(
            "volume {} holds a {found} signature but {} was requested; refusing to reformat it",
            record.volume_id,
            fs_type.as_str()
        ))),
        Content::PartitionTable(found) => Err(Error::FailedPrecondition(format!(
            "volume {} holds a {found} partition table; refusing to format it",
            record.volume_id
        ))),
        Content::Nothing => {
            let backend = Arc::clone(&driver.backend);
            let data_id = id.clone();
            let has_data = driver
                .blocking(move || backend.holds_data(&data_id))
                .await?;
            if has_data && !record.formatting {
                return Err(Error::FailedPrecondition(format!(
                    "volume {} holds data but no filesystem signature; refusing to format it",
                    record.volume_id
                )));
            }
            record.formatting = true;
            put_record(driver, record).await?;
            crate::crash_point!("stage.before_mkfs");
            tools::mkfs(&device.path, fs_type, overwrite, timeout).await?;
            crate::crash_point!("stage.after_mkfs");
            record.formatting = false;
            put_record(driver, record).await?;
            crate::crash_point!("stage.after_format_record");
            info!(fs_type = fs_type.as_str(), device = %device.path.display(), "formatted blank volume");
            Ok(false)
        }
    }
}

/// Where the volume is still published: filesystem mounts of its devices other than the
/// staging mount, and recorded block targets that still hold one of its device nodes.
fn still_published(
    table: &[MountEntry],
    devices: &[Device],
    staging: &Path,
    record: Option<&StageRecord>,
) -> Vec<PathBuf> {
    let rdevs: Vec<u64> = devices.iter().map(|d| d.rdev).collect();
    let mut found: Vec<PathBuf> = table
        .iter()
        .filter(|m| m.mount_point != staging && devices.iter().any(|d| d.is_source_of(m)))
        .map(|m| m.mount_point.clone())
        .collect();
    for target in record.map(|r| r.targets.keys()).into_iter().flatten() {
        let bound = mount::mount_at(table, target).is_some()
            && loopdev::is_block_device(target)
            && loopdev::rdev_of(target).is_ok_and(|r| rdevs.contains(&r));
        if bound && !found.contains(target) {
            found.push(target.clone());
        }
    }
    found
}

pub(super) async fn unstage(
    driver: &Arc<Driver>,
    req: NodeUnstageVolumeRequest,
) -> Result<NodeUnstageVolumeResponse> {
    let id = VolumeId::parse_ours("volume_id", &req.volume_id)?;
    let staging =
        super::checked_path(driver, "staging_target_path", &req.staging_target_path).await?;
    let key = id.to_string();
    driver
        .locked(&key, move |d| async move {
            let devices = devices_of(&d, &id).await?;
            if devices.is_empty()
                && !d.staged.contains(id.as_str())
                && !super::storage_exists(&d, &id).await?
            {
                return Err(Error::NotFound(format!("volume {id} does not exist")));
            }
            let unstage_id = id.clone();
            let stored = Arc::clone(&d);
            let record = d.staged.get(id.as_str());
            let backend = Arc::clone(&d.backend);
            d.blocking(move || {
                let table = mount::read_mountinfo()?;
                let still = still_published(&table, &devices, &staging, record.as_ref());
                if !still.is_empty() {
                    return Err(Error::FailedPrecondition(format!(
                        "volume {unstage_id} is still mounted at {still:?}; unpublish it first"
                    )));
                }
                // Unmount the staging mount (possibly stacked), only if it is ours.
                let mut table = table;
                for _ in 0..8 {
                    match mount::mount_at(&table, &staging) {
                        Some(m) if devices.iter().any(|dev| dev.is_source_of(m)) => {
                            crate::crash_point!("unstage.before_unmount");
                            mount::unmount(&staging)?;
                            crate::crash_point!("unstage.after_unmount");
                            table = mount::read_mountinfo()?;
                        }
                        Some(m)
                            if !devices.is_empty()
                                || stored.staged.contains(unstage_id.as_str()) =>
                        {
                            return Err(Error::FailedPrecondition(format!(
                                "staging path {} holds a mount of {}, not of volume {unstage_id}",
                                staging.display(),
                                m.source
                            )));
                        }
                        _ => break,
                    }
                }
                for device in &devices {
                    backend.detach(&unstage_id, device)?;
                }
                crate::crash_point!("unstage.after_detach");
                stored.staged.remove(unstage_id.as_str())
            })
            .await?;
            crate::crash_point!("unstage.after_record");
            info!("volume unstaged");
            Ok(NodeUnstageVolumeResponse {})
        })
        .await
}
