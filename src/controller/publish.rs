//! ControllerPublishVolume, ControllerUnpublishVolume and ValidateVolumeCapabilities.
//!
//! ferrovol volumes are node-local, so "publishing" attaches nothing: it checks that the
//! node is the volume's own node, records the publication (and its read-only flag) and
//! lets ListVolumes/ControllerGetVolume report it.

use std::sync::Arc;

use crate::csi::v1::validate_volume_capabilities_response::Confirmed;
use crate::csi::v1::{
    ControllerPublishVolumeRequest, ControllerPublishVolumeResponse,
    ControllerUnpublishVolumeRequest, ControllerUnpublishVolumeResponse,
    ValidateVolumeCapabilitiesRequest, ValidateVolumeCapabilitiesResponse,
};
use crate::driver::Driver;
use crate::error::{Error, Result};
use crate::ids::{ParsedId, VolumeId};
use crate::store::Publication;
use crate::validate;

pub(super) async fn publish(
    driver: &Arc<Driver>,
    req: ControllerPublishVolumeRequest,
) -> Result<ControllerPublishVolumeResponse> {
    let id = VolumeId::parse_ours("volume_id", &req.volume_id)?;
    validate::node_id("node_id", &req.node_id)?;
    validate::capability("volume_capability", req.volume_capability.as_ref())?;
    let key = id.to_string();
    driver
        .locked(&key, move |d| async move {
            let mut record = d.volume_record(&id)?;
            if req.node_id != record.node_id {
                return Err(Error::NotFound(format!(
                    "node {:?} cannot reach volume {id}: the volume lives on node {:?}",
                    req.node_id, record.node_id
                )));
            }
            if let Some(other) = record.published.keys().find(|n| **n != req.node_id) {
                return Err(Error::FailedPrecondition(format!(
                    "volume {id} is already published to node {other:?} and its access mode allows one node"
                )));
            }
            match record.published.get(&req.node_id) {
                Some(p) if p.readonly == req.readonly => {}
                Some(p) => {
                    return Err(Error::AlreadyExists(format!(
                        "volume {id} is already published to node {:?} with readonly={}",
                        req.node_id, p.readonly
                    )));
                }
                None => {
                    record
                        .published
                        .insert(req.node_id.clone(), Publication { readonly: req.readonly });
                    let stored = Arc::clone(&d);
                    d.blocking(move || stored.volumes.put(&record.volume_id.clone(), &record))
                        .await?;
                }
            }
            Ok(ControllerPublishVolumeResponse {
                publish_context: Default::default(),
            })
        })
        .await
}

pub(super) async fn unpublish(
    driver: &Arc<Driver>,
    req: ControllerUnpublishVolumeRequest,
) -> Result<ControllerUnpublishVolumeResponse> {
    let id = match VolumeId::parse("volume_id", &req.volume_id)? {
        ParsedId::Ours(id) => id,
        ParsedId::Foreign => return Ok(ControllerUnpublishVolumeResponse {}),
    };
    let key = id.to_string();
    driver
        .locked(&key, move |d| async move {
            let Some(mut record) = d.volumes.get(id.as_str()) else {
                return Ok(ControllerUnpublishVolumeResponse {});
            };
            let before = record.published.len();
            if req.node_id.is_empty() {
                record.published.clear();
            } else {
                record.published.remove(&req.node_id);
            }
            if record.published.len() != before {
                let stored = Arc::clone(&d);
                d.blocking(move || stored.volumes.put(&record.volume_id.clone(), &record))
                    .await?;
            }
            Ok(ControllerUnpublishVolumeResponse {})
        })
        .await
}

pub(super) fn validate_capabilities(
    driver: &Driver,
    req: ValidateVolumeCapabilitiesRequest,
) -> Result<ValidateVolumeCapabilitiesResponse> {
    let id = VolumeId::parse_ours("volume_id", &req.volume_id)?;
    if req.volume_capabilities.is_empty() {
        return Err(Error::InvalidArgument(
            "volume_capabilities must name at least one capability".into(),
        ));
    }
    for (i, cap) in req.volume_capabilities.iter().enumerate() {
        validate::capability_shape(&format!("volume_capabilities[{i}]"), cap)?;
    }
    let record = driver.volume_record(&id)?;
    let unconfirmed = |message: String| ValidateVolumeCapabilitiesResponse {
        confirmed: None,
        message: crate::error::clipped(&message, crate::error::MAX_STATUS_MESSAGE).into_owned(),
    };
    if let Err(e) = validate::parameters(&req.parameters, driver.backend.kind(), |k, v| {
        driver.backend.check_parameter(k, v)
    }) {
        return Ok(unconfirmed(e.to_string()));
    }
    let caps = match validate::capabilities("volume_capabilities", &req.volume_capabilities) {
        Ok(caps) => caps,
        Err(e) => return Ok(unconfirmed(e.to_string())),
    };
    let default_fs = driver.config.default_fs_type;
    if let Some(cap) = caps
        .iter()
        .find(|c| c.min_bytes(default_fs) > record.capacity_bytes)
    {
        return Ok(unconfirmed(format!(
            "volume {id} has {} bytes, too small for {:?} (needs {})",
            record.capacity_bytes,
            cap.access,
            cap.min_bytes(default_fs)
        )));
    }
    Ok(ValidateVolumeCapabilitiesResponse {
        confirmed: Some(Confirmed {
            volume_context: req.volume_context,
            volume_capabilities: req.volume_capabilities,
            parameters: req.parameters,
            mutable_parameters: req.mutable_parameters,
        }),
        message: String::new(),
    })
}
