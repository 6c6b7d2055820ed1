//! The Node service: staging, publishing, stats and node info.
//!
//! [`stage`] holds NodeStage/NodeUnstage (loop attach, probe, mkfs, mount), [`publish`]
//! NodePublish/NodeUnpublish (bind mounts), [`stats`] NodeGetVolumeStats, [`expand`]
//! NodeExpandVolume. Every decision
//! is taken from the real system (sysfs loop backing files, mountinfo), so a repeated call
//! or a call after a driver restart or a node reboot finds the true state.

mod expand;
mod publish;
mod stage;
mod stats;

use std::path::{Path, PathBuf};
use std::sync::Arc;

use tonic::{Request, Response, Status};

use crate::backend::{Device, StorageStatus};
use crate::config::FsType;
use crate::csi::v1::node_server::Node;
use crate::csi::v1::node_service_capability::rpc::Type as Rpc;
use crate::csi::v1::node_service_capability::{Rpc as RpcCapability, Type as CapabilityType};
use crate::csi::v1::*;
use crate::driver::Driver;
use crate::error::{Error, Result};
use crate::ids::VolumeId;
use crate::os::{paths, superblock};
use crate::rpc::{self, Subject};
use crate::validate;

/// Serves the CSI Node service.
#[derive(Debug, Clone)]
pub struct NodeService {
    /// Shared driver state.
    driver: Arc<Driver>,
    /// Set in a controller-only process with node expansion: only NodeGetCapabilities
    /// answers (external-resizer reads it there to pick its node-only path); every other
    /// node RPC belongs to the node plugins.
    capabilities_only: bool,
}

impl NodeService {
    /// A service over the shared driver state.
    pub fn new(driver: Arc<Driver>) -> Self {
        let capabilities_only = driver.config.mode == crate::config::Mode::Controller;
        NodeService {
            driver,
            capabilities_only,
        }
    }

    /// Refuses node operations in a controller-only process.
    fn serving(&self, method: &str) -> Result<()> {
        if self.capabilities_only {
            return Err(Error::Unimplemented(format!(
                "{method}: this ferrovol process serves only the controller (--mode controller); \
                 node operations go to the node plugin on the volume's node"
            )));
        }
        Ok(())
    }
}

/// The node RPCs that work, exactly.
const CAPABILITIES: &[Rpc] = &[
    Rpc::StageUnstageVolume,
    Rpc::GetVolumeStats,
    Rpc::VolumeCondition,
    Rpc::SingleNodeMultiWriter,
    Rpc::ExpandVolume,
];

/// The size of the volume's storage; NOT_FOUND unless it exists.
async fn require_storage(driver: &Arc<Driver>, id: &VolumeId) -> Result<u64> {
    let backend = Arc::clone(&driver.backend);
    let status_id = id.clone();
    match driver.blocking(move || backend.status(&status_id)).await? {
        StorageStatus::Missing => Err(Error::NotFound(format!("volume {id} does not exist"))),
        StorageStatus::Present { size_bytes, .. } => Ok(size_bytes),
    }
}

/// A staging, target or volume path of a node RPC: absolute, without `..`, strictly below
/// a path root, and through no symbolic link below that root.
///
/// # Errors
/// `InvalidArgument` for any of those; `Io` when a component cannot be inspected.
async fn checked_path(driver: &Arc<Driver>, field: &str, raw: &str) -> Result<PathBuf> {
    let path = validate::node_path(&driver.config, field, raw)?;
    let root = validate::root_of(&driver.config, &path)
        .map(Path::to_path_buf)
        .ok_or_else(|| Error::Internal(format!("{field} lost its root")))?;
    let checked = path.clone();
    driver
        .blocking(move || paths::refuse_symlinks(&root, &checked))
        .await?;
    Ok(path)
}

/// The devices that serve volume `id` on this node, found on a blocking thread.
async fn devices_of(driver: &Driver, id: &VolumeId) -> Result<Vec<Device>> {
    let backend = Arc::clone(&driver.backend);
    let id = id.clone();
    driver.blocking(move || backend.devices(&id)).await
}

/// Whether the storage of volume `id` exists, found on a blocking thread.
async fn storage_exists(driver: &Driver, id: &VolumeId) -> Result<bool> {
    let backend = Arc::clone(&driver.backend);
    let id = id.clone();
    let status = driver.blocking(move || backend.status(&id)).await?;
    Ok(matches!(status, StorageStatus::Present { .. }))
}

/// Whether the filesystem on `device` is clearly smaller than the device. A few MiB of
/// slack cover the tail that a grown filesystem may leave unused (ext4 drops a last block
/// group too small for its metadata).
pub(super) async fn smaller_than_device(
    driver: &Arc<Driver>,
    device: &Device,
    fs: FsType,
) -> Result<bool> {
    const SLACK: u64 = 4 << 20;
    let device = device.clone();
    driver
        .blocking(move || {
            let device_bytes = device.size_bytes()?;
            let fs_bytes = superblock::filesystem_bytes(&device.path, fs)?;
            Ok(fs_bytes.saturating_add(SLACK) < device_bytes)
        })
        .await
}

#[tonic::async_trait]
impl Node for NodeService {
    async fn node_stage_volume(
        &self,
        request: Request<NodeStageVolumeRequest>,
    ) -> Result<Response<NodeStageVolumeResponse>, Status> {
        let req = request.into_inner();
        rpc::serve(
            &self.driver,
            "NodeStageVolume",
            Subject::volume(&req.volume_id),
            async {
                self.serving("NodeStageVolume")?;
                stage::stage(&self.driver, req).await
            },
        )
        .await
    }

    async fn node_unstage_volume(
        &self,
        request: Request<NodeUnstageVolumeRequest>,
    ) -> Result<Response<NodeUnstageVolumeResponse>, Status> {
        let req = request.into_inner();
        rpc::serve(
            &self.driver,
            "NodeUnstageVolume",
            Subject::volume(&req.volume_id),
            async {
                self.serving("NodeUnstageVolume")?;
                stage::unstage(&self.driver, req).await
            },
        )
        .await
    }

    async fn node_publish_volume(
        &self,
        request: Request<NodePublishVolumeRequest>,
    ) -> Result<Response<NodePublishVolumeResponse>, Status> {
        let req = request.into_inner();
        rpc::serve(
            &self.driver,
            "NodePublishVolume",
            Subject::volume(&req.volume_id),
            async {
                self.serving("NodePublishVolume")?;
                publish::publish(&self.driver, req).await
            },
        )
        .await
    }

    async fn node_unpublish_volume(
        &self,
        request: Request<NodeUnpublishVolumeRequest>,
    ) -> Result<Response<NodeUnpublishVolumeResponse>, Status> {
        let req = request.into_inner();
        rpc::serve(
            &self.driver,
            "NodeUnpublishVolume",
            Subject::volume(&req.volume_id),
            async {
                self.serving("NodeUnpublishVolume")?;
                publish::unpublish(&self.driver, req).await
            },
        )
        .await
    }

    async fn node_get_volume_stats(
        &self,
        request: Request<NodeGetVolumeStatsRequest>,
    ) -> Result<Response<NodeGetVolumeStatsResponse>, Status> {
        let req = request.into_inner();
        rpc::serve(
            &self.driver,
            "NodeGetVolumeStats",
            Subject::volume(&req.volume_id),
            async {
                self.serving("NodeGetVolumeStats")?;
                stats::volume_stats(&self.driver, req).await
            },
        )
        .await
    }

    async fn node_expand_volume(
        &self,
        request: Request<NodeExpandVolumeRequest>,
    ) -> Result<Response<NodeExpandVolumeResponse>, Status> {
        let req = request.into_inner();
        rpc::serve(
            &self.driver,
            "NodeExpandVolume",
            Subject::volume(&req.volume_id),
            async {
                self.serving("NodeExpandVolume")?;
                expand::expand(&self.driver, req).await
            },
        )
        .await
    }

    async fn node_get_capabilities(
        &self,
        _request: Request<NodeGetCapabilitiesRequest>,
    ) -> Result<Response<NodeGetCapabilitiesResponse>, Status> {
        // A controller-only process speaks for how this deployment grows volumes, not for
        // staging, which it does not serve.
        let offered: &[Rpc] = if self.capabilities_only {
            &[Rpc::ExpandVolume]
        } else {
            CAPABILITIES
        };
        let capabilities = offered
            .iter()
            .map(|rpc| NodeServiceCapability {
                r#type: Some(CapabilityType::Rpc(RpcCapability {
                    r#type: *rpc as i32,
                })),
            })
            .collect();
        rpc::serve(
            &self.driver,
            "NodeGetCapabilities",
            Subject::none(),
            async { Ok(NodeGetCapabilitiesResponse { capabilities }) },
        )
        .await
    }

    async fn node_get_info(
        &self,
        _request: Request<NodeGetInfoRequest>,
    ) -> Result<Response<NodeGetInfoResponse>, Status> {
        rpc::serve(&self.driver, "NodeGetInfo", Subject::none(), async {
            self.serving("NodeGetInfo")?;
            let config = &self.driver.config;
            Ok(NodeGetInfoResponse {
                node_id: config.node_id.clone(),
                max_volumes_per_node: config.max_volumes_per_node,
                accessible_topology: Some(validate::node_topology(config)),
            })
        })
        .await
    }
}
