//! CreateVolume (empty, from a snapshot, or cloned from a volume) and DeleteVolume.
//!
//! CreateVolume is idempotent by name: the volume id is derived from the name, so a retry
//! (also one after a crash) lands on the same id and finds what the first attempt made.
//! The backing storage is made first and the record written last: a volume exists for the
//! CO only once its record is durable, and storage left by a crash in between is adopted
//! by the retry.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use tracing::info;

use crate::backend::Source;
use crate::csi::v1::volume_content_source::{SnapshotSource, Type as SourceType, VolumeSource};
use crate::csi::v1::{
    CreateVolumeRequest, CreateVolumeResponse, DeleteVolumeRequest, DeleteVolumeResponse, Volume,
    VolumeContentSource,
};
use crate::driver::Driver;
use crate::error::{Error, Result};
use crate::ids::{ParsedId, SnapshotId, VolumeId};
use crate::store::{ContentSource, VolumeRecord};
use crate::validate;

/// The content source a CreateVolume asks for, with its ids checked (not yet looked up).
fn requested_source(source: Option<&VolumeContentSource>) -> Result<Option<ContentSource>> {
    let Some(source) = source else {
        return Ok(None);
    };
    match &source.r#type {
        Some(SourceType::Snapshot(s)) => {
            let id = SnapshotId::parse_ours(
                "volume_content_source.snapshot.snapshot_id",
                &s.snapshot_id,
            )?;
            Ok(Some(ContentSource::Snapshot {
                snapshot_id: id.to_string(),
            }))
        }
        Some(SourceType::Volume(v)) => {
            let id = VolumeId::parse_ours("volume_content_source.volume.volume_id", &v.volume_id)?;
            Ok(Some(ContentSource::Volume {
                volume_id: id.to_string(),
            }))
        }
        None => Err(Error::InvalidArgument(
            "volume_content_source names neither a snapshot nor a volume".into(),
        )),
    }
}

/// The size of a content source, from its record: a new volume is at least this big.
fn source_size(driver: &Driver, source: &ContentSource) -> Result<u64> {
    match source {
        ContentSource::Snapshot { snapshot_id } => driver
            .snapshots
            .get(snapshot_id)
            .map(|r| r.size_bytes)
            .ok_or_else(|| {
                Error::NotFound(format!("source snapshot {snapshot_id} does not exist"))
            }),
        ContentSource::Volume { volume_id } => driver
            .volumes
            .get(volume_id)
            .map(|r| r.capacity_bytes)
            .ok_or_else(|| Error::NotFound(format!("source volume {volume_id} does not exist"))),
    }
}

fn content_source_message(source: &ContentSource) -> VolumeContentSource {
    let r#type = match source {
        ContentSource::Snapshot { snapshot_id } => SourceType::Snapshot(SnapshotSource {
            snapshot_id: snapshot_id.clone(),
        }),
        ContentSource::Volume { volume_id } => SourceType::Volume(VolumeSource {
            volume_id: volume_id.clone(),
        }),
    };
    VolumeContentSource {
        r#type: Some(r#type),
    }
}

/// The CSI `Volume` message for a record.
pub(super) fn volume_message(driver: &Driver, record: &VolumeRecord) -> Volume {
    Volume {
        capacity_bytes: i64::try_from(record.capacity_bytes).unwrap_or(i64::MAX),
        volume_id: record.volume_id.clone(),
        volume_context: Default::default(),
        content_source: record.content_source.as_ref().map(content_source_message),
        accessible_topology: vec![validate::node_topology(&driver.config)],
    }
}

pub(super) async fn create_volume(
    driver: &Arc<Driver>,
    req: CreateVolumeRequest,
) -> Result<CreateVolumeResponse> {
    validate::name("name", &req.name)?;
    let caps = validate::capabilities("volume_capabilities", &req.volume_capabilities)?;
    validate::parameters(&req.parameters, driver.backend.kind(), |k, v| {
        driver.backend.check_parameter(k, v)
    })?;
    let source = requested_source(req.volume_content_source.as_ref())?;
    let id = VolumeId::from_name(&req.name);
    // A retry of a CreateVolume that already succeeded must find its volume even if the
    // source is gone by now: look the source up only for a volume still to be made.
    let source_bytes = match &source {
        Some(s) if !driver.volumes.contains(id.as_str()) => Some(source_size(driver, s)?),
        _ => None,
    };
    let default_fs = driver.config.default_fs_type;
    let min_bytes = caps
        .iter()
        .map(|c| c.min_bytes(default_fs))
        .chain(source_bytes)
        .max()
        .unwrap_or(validate::MIN_SIZE);
    let size = validate::volume_size(req.capacity_range.as_ref(), min_bytes)?;
    let size = rounded(driver, size, req.capacity_range.as_ref())?;
    if !validate::topology_allows(&driver.config, req.accessibility_requirements.as_ref()) {
        return Err(Error::ResourceExhausted(format!(
            "accessibility_requirements name no topology this driver can serve: it provisions only on {}={}",
            crate::config::Config::TOPOLOGY_KEY,
            driver.config.node_id
        )));
    }
    let key = id.to_string();
    driver
        .locked(&key, move |d| async move {
            let parameters: BTreeMap<String, String> = req.parameters.into_iter().collect();
            if let Some(existing) = d.volumes.get(id.as_str()) {
                check_compatible(
                    &existing,
                    &req.name,
                    req.capacity_range.as_ref(),
                    &parameters,
                )?;
                let wanted = source.as_ref();
                if existing.content_source.as_ref() != wanted {
                    return Err(Error::AlreadyExists(format!(
                        "volume {:?} exists with content source {:?}, not {wanted:?}",
                        existing.name, existing.content_source
                    )));
                }
                return Ok(CreateVolumeResponse {
                    volume: Some(volume_message(&d, &existing)),
                });
            }
            let record = VolumeRecord {
                volume_id: id.to_string(),
                name: req.name,
                capacity_bytes: size,
                node_id: d.config.node_id.clone(),
                parameters,
                created_at: SystemTime::now()
                    .duration_since(UNIX_EPOCH)
                    .map_or(0, |t| t.as_secs()),
                published: BTreeMap::new(),
                content_source: source,
            };
            let backend = Arc::clone(&d.backend);
            let create_id = id.clone();
            let described = record.clone();
            match record.content_source.clone() {
                None => {
                    crate::crash_point!("create.before_file");
                    d.blocking(move || backend.create(&create_id, size, &described))
                        .await?;
                    crate::crash_point!("create.after_file");
                }
                Some(from) => {
                    // The source stays put (no delete, no expand) while it is copied.
                    let source_key = match &from {
                        ContentSource::Snapshot { snapshot_id } => snapshot_id.clone(),
                        ContentSource::Volume { volume_id } => volume_id.clone(),
                    };
                    let _source_guard = d.locks.try_lock(&source_key)?;
                    match &from {
                        ContentSource::Snapshot { .. } => {
                            crate::crash_point!("restore.before_copy")
                        }
                        ContentSource::Volume { .. } => crate::crash_point!("clone.before_copy"),
                    }
                    let copied = from.clone();
                    d.blocking(move || {
                        let (snapshot, volume);
                        let source = match &from {
                            ContentSource::Snapshot { snapshot_id } => {
                                snapshot = SnapshotId::parse_ours("snapshot_id", snapshot_id)?;
                                Source::Snapshot(&snapshot)
                            }
                            ContentSource::Volume { volume_id } => {
                                volume = VolumeId::parse_ours("volume_id", volume_id)?;
                                Source::Volume(&volume)
                            }
                        };
                        backend.create_from(&create_id, source, size, &described)
                    })
                    .await?;
                    match copied {
                        ContentSource::Snapshot { .. } => crate::crash_point!("restore.after_copy"),
                        ContentSource::Volume { .. } => crate::crash_point!("clone.after_copy"),
                    }
                }
            }
            let stored = Arc::clone(&d);
            let to_store = record.clone();
            let put = d
                .blocking(move || stored.volumes.put(&to_store.volume_id.clone(), &to_store))
                .await;
            if let Err(e) = put {
                // Without its record the volume does not exist: take the storage back.
                let backend = Arc::clone(&d.backend);
                let _ = d.blocking(move || backend.delete(&id)).await;
                return Err(e);
            }
            match &record.content_source {
                None => crate::crash_point!("create.after_record"),
                Some(ContentSource::Snapshot { .. }) => crate::crash_point!("restore.after_record"),
                Some(ContentSource::Volume { .. }) => crate::crash_point!("clone.after_record"),
            }
            info!(volume_id = %record.volume_id, capacity_bytes = size, "volume created");
            Ok(CreateVolumeResponse {
                volume: Some(volume_message(&d, &record)),
            })
        })
        .await
}

/// `size` rounded up to the backend's allocation unit, still within `limit_bytes`.
pub(super) fn rounded(
    driver: &Driver,
    size: u64,
    range: Option<&crate::csi::v1::CapacityRange>,
) -> Result<u64> {
    let rounded = driver.backend.round_size(size);
    let limit = range.map_or(0, |r| u64::try_from(r.limit_bytes).unwrap_or(0));
    if limit > 0 && rounded > limit {
        return Err(Error::OutOfRange(format!(
            "{size} bytes round up to {rounded} (the {} backend's allocation unit), above limit_bytes {limit}",
            driver.backend.kind()
        )));
    }
    Ok(rounded)
}

/// Whether an existing volume satisfies a repeated CreateVolume.
fn check_compatible(
    existing: &VolumeRecord,
    name: &str,
    range: Option<&crate::csi::v1::CapacityRange>,
    parameters: &BTreeMap<String, String>,
) -> Result<()> {
    if existing.name != name {
        return Err(Error::AlreadyExists(format!(
            "volume id {} already belongs to volume {:?}",
            existing.volume_id, existing.name
        )));
    }
    let (required, limit) = range.map_or((0, 0), |r| (r.required_bytes, r.limit_bytes));
    let capacity = i64::try_from(existing.capacity_bytes).unwrap_or(i64::MAX);
    if capacity < required || (limit > 0 && capacity > limit) {
        return Err(Error::AlreadyExists(format!(
            "volume {name:?} exists with {capacity} bytes, outside the requested range [{required}, {limit}]"
        )));
    }
    if &existing.parameters != parameters {
        return Err(Error::AlreadyExists(format!(
            "volume {name:?} exists with different parameters"
        )));
    }
    Ok(())
}

pub(super) async fn delete_volume(
    driver: &Arc<Driver>,
    req: DeleteVolumeRequest,
) -> Result<DeleteVolumeResponse> {
    let id = match VolumeId::parse("volume_id", &req.volume_id)? {
        ParsedId::Ours(id) => id,
        // Never one of ours, so it does not exist: deleting it succeeds.
        ParsedId::Foreign => return Ok(DeleteVolumeResponse {}),
    };
    let key = id.to_string();
    driver
        .locked(&key, move |d| async move {
            let backend = Arc::clone(&d.backend);
            let delete_id = id.clone();
            crate::crash_point!("delete.before_file");
            d.blocking(move || backend.delete(&delete_id)).await?;
            crate::crash_point!("delete.after_file");
            let stored = Arc::clone(&d);
            let record_id = id.to_string();
            d.blocking(move || stored.volumes.remove(&record_id))
                .await?;
            crate::crash_point!("delete.after_record");
            info!(volume_id = %id, "volume deleted");
            Ok(DeleteVolumeResponse {})
        })
        .await
}
