//! ControllerExpandVolume: grows a volume's backing storage.
//!
//! The filesystem (and, on the loop backend, the loop device's idea of the size) grows on
//! the node, so `node_expansion_required` is always true. Shrinking is refused with
//! OUT_OF_RANGE; asking for the current size again succeeds.

use std::sync::Arc;

use tracing::info;

use crate::config::Expansion;
use crate::csi::v1::{ControllerExpandVolumeRequest, ControllerExpandVolumeResponse};
use crate::driver::Driver;
use crate::error::{Error, Result};
use crate::ids::VolumeId;
use crate::validate;

pub(super) async fn expand_volume(
    driver: &Arc<Driver>,
    req: ControllerExpandVolumeRequest,
) -> Result<ControllerExpandVolumeResponse> {
    if driver.config.expansion == Expansion::Node {
        return Err(Error::Unimplemented(
            "ControllerExpandVolume: this driver runs with --expansion node; volumes grow through \
             NodeExpandVolume on their node"
                .into(),
        ));
    }
    let id = VolumeId::parse_ours("volume_id", &req.volume_id)?;
    let range = req
        .capacity_range
        .filter(|r| r.required_bytes != 0 || r.limit_bytes != 0)
        .ok_or_else(|| {
            Error::InvalidArgument("capacity_range is required to expand a volume".into())
        })?;
    if let Some(cap) = req.volume_capability.as_ref() {
        validate::capability("volume_capability", Some(cap))?;
    }
    let size = validate::volume_size(Some(&range), validate::MIN_SIZE)?;
    let size = super::create::rounded(driver, size, Some(&range))?;
    let key = id.to_string();
    driver
        .locked(&key, move |d| async move {
            let mut record = d.volume_record(&id)?;
            let limit = u64::try_from(range.limit_bytes).unwrap_or(0);
            if limit > 0 && record.capacity_bytes > limit {
                return Err(Error::OutOfRange(format!(
                    "volume {id} has {} bytes, above limit_bytes {limit}; shrinking is not supported",
                    record.capacity_bytes
                )));
            }
            // Already at least as big as required: nothing to do (a retry, or a request
            // the rounding already satisfied).
            let size = size.max(record.capacity_bytes);
            if size > record.capacity_bytes {
                let backend = Arc::clone(&d.backend);
                let grow_id = id.clone();
                crate::crash_point!("expand.before_grow");
                d.blocking(move || backend.expand(&grow_id, size)).await?;
                crate::crash_point!("expand.after_grow");
                record.capacity_bytes = size;
                let stored = Arc::clone(&d);
                d.blocking(move || stored.volumes.put(&record.volume_id.clone(), &record))
                    .await?;
                crate::crash_point!("expand.after_record");
                info!(capacity_bytes = size, "volume expanded");
            }
            Ok(ControllerExpandVolumeResponse {
                capacity_bytes: i64::try_from(size).unwrap_or(i64::MAX),
                node_expansion_required: true,
            })
        })
        .await
}
