//! ListVolumes, GetCapacity and ControllerGetVolume: the read-only controller RPCs.
//!
//! ListVolumes pages through the records in id order. Its `next_token` is the id of the
//! first volume of the next page; a token that names no volume (garbage, or a volume that
//! was deleted between pages) is stale and gets ABORTED, so the CO restarts the listing.

use std::sync::Arc;

use crate::backend::StorageStatus;
use crate::csi::v1::{
    controller_get_volume_response, list_volumes_response, ControllerGetVolumeRequest,
    ControllerGetVolumeResponse, GetCapacityRequest, GetCapacityResponse, ListVolumesRequest,
    ListVolumesResponse, VolumeCondition,
};
use crate::driver::Driver;
use crate::error::{Error, Result};
use crate::ids::{ParsedId, VolumeId};
use crate::store::VolumeRecord;
use crate::validate;

use super::create::volume_message;

/// The health of a volume's storage, as the controller sees it.
fn condition(record: &VolumeRecord, status: Result<StorageStatus>) -> VolumeCondition {
    let problem = match status {
        Ok(StorageStatus::Present { size_bytes, .. }) if size_bytes < record.capacity_bytes => {
            Some(format!(
                "backing storage of volume {} is {size_bytes} bytes, smaller than its {} bytes",
                record.volume_id, record.capacity_bytes
            ))
        }
        Ok(StorageStatus::Present { .. }) => None,
        Ok(StorageStatus::Missing) => Some(format!(
            "backing storage of volume {} is missing",
            record.volume_id
        )),
        Err(e) => Some(format!("cannot inspect volume {}: {e}", record.volume_id)),
    };
    VolumeCondition {
        abnormal: problem.is_some(),
        message: problem.unwrap_or_default(),
    }
}

/// Conditions for a batch of records, measured on a blocking thread.
async fn conditions(
    driver: &Arc<Driver>,
    records: Vec<VolumeRecord>,
) -> Result<Vec<(VolumeRecord, VolumeCondition)>> {
    let backend = Arc::clone(&driver.backend);
    driver
        .blocking(move || {
            Ok(records
                .into_iter()
                .map(|r| {
                    let status = VolumeId::parse_ours("volume_id", &r.volume_id)
                        .and_then(|id| backend.status(&id));
                    let c = condition(&r, status);
                    (r, c)
                })
                .collect())
        })
        .await
}

pub(super) async fn list_volumes(
    driver: &Arc<Driver>,
    req: ListVolumesRequest,
) -> Result<ListVolumesResponse> {
    let max = validate::max_entries(req.max_entries)?;
    let start = if req.starting_token.is_empty() {
        None
    } else {
        match VolumeId::parse("starting_token", &req.starting_token) {
            Ok(ParsedId::Ours(id)) if driver.volumes.contains(id.as_str()) => Some(id.to_string()),
            _ => {
                return Err(Error::Aborted(format!(
                    "starting_token {:?} is not valid (the volume it points at is gone); restart the listing",
                    req.starting_token
                )));
            }
        }
    };
    let (records, next) = driver.volumes.page(start.as_deref(), max);
    let entries = conditions(driver, records)
        .await?
        .into_iter()
        .map(|(record, condition)| list_volumes_response::Entry {
            volume: Some(volume_message(driver, &record)),
            status: Some(list_volumes_response::VolumeStatus {
                published_node_ids: record.published.keys().cloned().collect(),
                volume_condition: Some(condition),
            }),
        })
        .collect();
    Ok(ListVolumesResponse {
        entries,
        next_token: next.unwrap_or_default(),
    })
}

pub(super) async fn get_capacity(
    driver: &Arc<Driver>,
    req: GetCapacityRequest,
) -> Result<GetCapacityResponse> {
    let zero = GetCapacityResponse {
        available_capacity: 0,
        maximum_volume_size: Some(0),
        minimum_volume_size: Some(0),
    };
    // A class for another backend has no room here (capacity tracking asks every node
    // about every class); other unknown parameters are still an error.
    if req
        .parameters
        .get(validate::BACKEND_PARAMETER)
        .is_some_and(|b| b != driver.backend.kind())
    {
        return Ok(zero);
    }
    validate::parameters(&req.parameters, driver.backend.kind(), |k, v| {
        driver.backend.check_parameter(k, v)
    })?;
    for (i, cap) in req.volume_capabilities.iter().enumerate() {
        validate::capability_shape(&format!("volume_capabilities[{i}]"), cap)?;
    }
    if !req.volume_capabilities.is_empty()
        && validate::capabilities("volume_capabilities", &req.volume_capabilities).is_err()
    {
        // Volumes with these capabilities cannot be made at all.
        return Ok(zero);
    }
    if let Some(topology) = &req.accessible_topology {
        if !validate::is_this_node(&driver.config, topology) {
            return Ok(zero);
        }
    }
    let backend = Arc::clone(&driver.backend);
    let parameters = req.parameters.clone();
    let capacity = driver
        .blocking(move || backend.capacity_for(&parameters))
        .await?;
    let available = i64::try_from(capacity.available_bytes).unwrap_or(i64::MAX);
    let largest = (capacity.available_bytes / validate::GRANULARITY) * validate::GRANULARITY;
    Ok(GetCapacityResponse {
        available_capacity: available,
        maximum_volume_size: Some(i64::try_from(largest).unwrap_or(i64::MAX)),
        minimum_volume_size: Some(i64::try_from(validate::MIN_SIZE).unwrap_or(i64::MAX)),
    })
}

pub(super) async fn get_volume(
    driver: &Arc<Driver>,
    req: ControllerGetVolumeRequest,
) -> Result<ControllerGetVolumeResponse> {
    let id = VolumeId::parse_ours("volume_id", &req.volume_id)?;
    let record = driver.volume_record(&id)?;
    let (record, condition) = conditions(driver, vec![record])
        .await?
        .pop()
        .ok_or_else(|| Error::Internal("condition of one volume went missing".into()))?;
    Ok(ControllerGetVolumeResponse {
        volume: Some(volume_message(driver, &record)),
        status: Some(controller_get_volume_response::VolumeStatus {
            published_node_ids: record.published.keys().cloned().collect(),
            volume_condition: Some(condition),
        }),
    })
}
