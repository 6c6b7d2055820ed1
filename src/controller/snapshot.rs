//! CreateSnapshot, DeleteSnapshot, ListSnapshots and GetSnapshot.
//!
//! Snapshots are idempotent by name like volumes: the id is derived from the name, a retry
//! with the same source returns the same snapshot, another source gets ALREADY_EXISTS.
//! The copy is taken first and the record written last, so a snapshot exists for the CO
//! only once it is complete (`ready_to_use` is always true).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use tracing::info;

use crate::csi::v1::{
    list_snapshots_response, CreateSnapshotRequest, CreateSnapshotResponse, DeleteSnapshotRequest,
    DeleteSnapshotResponse, GetSnapshotRequest, GetSnapshotResponse, ListSnapshotsRequest,
    ListSnapshotsResponse, Snapshot,
};
use crate::driver::Driver;
use crate::error::{Error, Result};
use crate::ids::{ParsedId, SnapshotId, VolumeId};
use crate::store::SnapshotRecord;
use crate::validate;

fn snapshot_message(record: &SnapshotRecord) -> Snapshot {
    Snapshot {
        size_bytes: i64::try_from(record.size_bytes).unwrap_or(i64::MAX),
        snapshot_id: record.snapshot_id.clone(),
        source_volume_id: record.source_volume_id.clone(),
        creation_time: Some(prost_types::Timestamp {
            seconds: record.created_secs,
            nanos: record.created_nanos,
        }),
        ready_to_use: true,
        group_snapshot_id: String::new(),
    }
}

pub(super) async fn create_snapshot(
    driver: &Arc<Driver>,
    req: CreateSnapshotRequest,
) -> Result<CreateSnapshotResponse> {
    validate::name("name", &req.name)?;
    let source = VolumeId::parse_ours("source_volume_id", &req.source_volume_id)?;
    validate::parameters(&req.parameters, driver.backend.kind(), |k, v| {
        driver.backend.check_parameter(k, v)
    })?;
    let id = SnapshotId::from_name(&req.name);
    let key = id.to_string();
    driver
        .locked(&key, move |d| async move {
            if let Some(existing) = d.snapshots.get(id.as_str()) {
                if existing.name != req.name || existing.source_volume_id != source.as_str() {
                    return Err(Error::AlreadyExists(format!(
                        "snapshot {:?} already exists for volume {}",
                        existing.name, existing.source_volume_id
                    )));
                }
                return Ok(CreateSnapshotResponse {
                    snapshot: Some(snapshot_message(&existing)),
                });
            }
            let Some(source_record) = d.volumes.get(source.as_str()) else {
                return Err(Error::NotFound(format!(
                    "source volume {source} does not exist"
                )));
            };
            // The source stays put while it is copied.
            let _source_guard = d.locks.try_lock(source.as_str())?;
            let backend = Arc::clone(&d.backend);
            let (copy_source, copy_id) = (source.clone(), id.clone());
            let now = SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .unwrap_or_default();
            let mut record = SnapshotRecord {
                snapshot_id: id.to_string(),
                name: req.name,
                source_volume_id: source.to_string(),
                size_bytes: source_record.capacity_bytes,
                created_secs: i64::try_from(now.as_secs()).unwrap_or(i64::MAX),
                created_nanos: i32::try_from(now.subsec_nanos()).unwrap_or(0),
                parameters: req.parameters.into_iter().collect::<BTreeMap<_, _>>(),
            };
            let described = record.clone();
            crate::crash_point!("snapshot.before_copy");
            record.size_bytes = d
                .blocking(move || backend.snapshot(&copy_source, &copy_id, &described))
                .await?;
            crate::crash_point!("snapshot.after_copy");
            let size = record.size_bytes;
            let stored = Arc::clone(&d);
            let to_store = record.clone();
            let put = d
                .blocking(move || {
                    stored
                        .snapshots
                        .put(&to_store.snapshot_id.clone(), &to_store)
                })
                .await;
            if let Err(e) = put {
                let backend = Arc::clone(&d.backend);
                let _ = d.blocking(move || backend.delete_snapshot(&id)).await;
                return Err(e);
            }
            crate::crash_point!("snapshot.after_record");
            info!(snapshot_id = %record.snapshot_id, size_bytes = size, "snapshot created");
            Ok(CreateSnapshotResponse {
                snapshot: Some(snapshot_message(&record)),
            })
        })
        .await
}

pub(super) async fn delete_snapshot(
    driver: &Arc<Driver>,
    req: DeleteSnapshotRequest,
) -> Result<DeleteSnapshotResponse> {
    let id = match SnapshotId::parse("snapshot_id", &req.snapshot_id)? {
        ParsedId::Ours(id) => id,
        ParsedId::Foreign => return Ok(DeleteSnapshotResponse {}),
    };
    let key = id.to_string();
    driver
        .locked(&key, move |d| async move {
            let backend = Arc::clone(&d.backend);
            let delete_id = id.clone();
            d.blocking(move || backend.delete_snapshot(&delete_id))
                .await?;
            let stored = Arc::clone(&d);
            let record_id = id.to_string();
            d.blocking(move || stored.snapshots.remove(&record_id))
                .await?;
            info!("snapshot deleted");
            Ok(DeleteSnapshotResponse {})
        })
        .await
}

pub(super) fn list_snapshots(
    driver: &Driver,
    req: ListSnapshotsRequest,
) -> Result<ListSnapshotsResponse> {
    let max = validate::max_entries(req.max_entries)?;
    let mut records = if req.snapshot_id.is_empty() {
        driver.snapshots.all()
    } else {
        match SnapshotId::parse("snapshot_id", &req.snapshot_id)? {
            ParsedId::Ours(id) => driver.snapshots.get(id.as_str()).into_iter().collect(),
            ParsedId::Foreign => Vec::new(),
        }
    };
    if !req.source_volume_id.is_empty() {
        records.retain(|r| r.source_volume_id == req.source_volume_id);
    }
    let start = if req.starting_token.is_empty() {
        0
    } else {
        records
            .iter()
            .position(|r| r.snapshot_id == req.starting_token)
            .ok_or_else(|| {
                Error::Aborted(format!(
                    "starting_token {:?} is not valid (the snapshot it points at is gone); restart the listing",
                    req.starting_token
                ))
            })?
    };
    let page: Vec<&SnapshotRecord> = records.iter().skip(start).take(max).collect();
    let next_token = records
        .get(start.saturating_add(page.len()))
        .map(|r| r.snapshot_id.clone())
        .unwrap_or_default();
    Ok(ListSnapshotsResponse {
        entries: page
            .into_iter()
            .map(|r| list_snapshots_response::Entry {
                snapshot: Some(snapshot_message(r)),
            })
            .collect(),
        next_token,
    })
}

pub(super) fn get_snapshot(
    driver: &Driver,
    req: GetSnapshotRequest,
) -> Result<GetSnapshotResponse> {
    let id = SnapshotId::parse_ours("snapshot_id", &req.snapshot_id)?;
    let record = driver
        .snapshots
        .get(id.as_str())
        .ok_or_else(|| Error::NotFound(format!("snapshot {id} does not exist")))?;
    Ok(GetSnapshotResponse {
        snapshot: Some(snapshot_message(&record)),
    })
}
