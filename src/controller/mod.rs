//! The Controller service: volume lifecycle on the controller side.
//!
//! Each RPC group lives in its own file: [`create`] (CreateVolume, DeleteVolume),
//! [`publish`] (ControllerPublish/Unpublish, ValidateVolumeCapabilities), [`query`]
//! (ListVolumes, GetCapacity, ControllerGetVolume), [`snapshot`] (Create/Delete/List/Get
//! snapshots) and [`expand`] (ControllerExpandVolume). This file wires them to the
//! generated tonic trait and lists the capabilities. ControllerModifyVolume answers
//! UNIMPLEMENTED.

mod create;
mod expand;
mod publish;
mod query;
mod snapshot;

use std::sync::Arc;

use tonic::{Request, Response, Status};

use crate::config::Expansion;
use crate::csi::v1::controller_server::Controller;
use crate::csi::v1::controller_service_capability::rpc::Type as Rpc;
use crate::csi::v1::controller_service_capability::{Rpc as RpcCapability, Type as CapabilityType};
use crate::csi::v1::*;
use crate::driver::Driver;
use crate::rpc::{self, Subject};

/// Serves the CSI Controller service.
#[derive(Debug, Clone)]
pub struct ControllerService {
    /// Shared driver state.
    driver: Arc<Driver>,
}

impl ControllerService {
    /// A service over the shared driver state.
    pub fn new(driver: Arc<Driver>) -> Self {
        ControllerService { driver }
    }
}

/// The controller RPCs that work, exactly.
const CAPABILITIES: &[Rpc] = &[
    Rpc::CreateDeleteVolume,
    Rpc::PublishUnpublishVolume,
    Rpc::ListVolumes,
    Rpc::GetCapacity,
    Rpc::PublishReadonly,
    Rpc::ListVolumesPublishedNodes,
    Rpc::VolumeCondition,
    Rpc::GetVolume,
    Rpc::SingleNodeMultiWriter,
    Rpc::CreateDeleteSnapshot,
    Rpc::ListSnapshots,
    Rpc::GetSnapshot,
    Rpc::CloneVolume,
    Rpc::ExpandVolume,
];

#[tonic::async_trait]
impl Controller for ControllerService {
    async fn create_volume(
        &self,
        request: Request<CreateVolumeRequest>,
    ) -> Result<Response<CreateVolumeResponse>, Status> {
        let req = request.into_inner();
        rpc::serve(
            &self.driver,
            "CreateVolume",
            Subject::name(&req.name, None),
            create::create_volume(&self.driver, req),
        )
        .await
    }

    async fn delete_volume(
        &self,
        request: Request<DeleteVolumeRequest>,
    ) -> Result<Response<DeleteVolumeResponse>, Status> {
        let req = request.into_inner();
        rpc::serve(
            &self.driver,
            "DeleteVolume",
            Subject::volume(&req.volume_id),
            create::delete_volume(&self.driver, req),
        )
        .await
    }

    async fn controller_publish_volume(
        &self,
        request: Request<ControllerPublishVolumeRequest>,
    ) -> Result<Response<ControllerPublishVolumeResponse>, Status> {
        let req = request.into_inner();
        rpc::serve(
            &self.driver,
            "ControllerPublishVolume",
            Subject::volume(&req.volume_id),
            publish::publish(&self.driver, req),
        )
        .await
    }

    async fn controller_unpublish_volume(
        &self,
        request: Request<ControllerUnpublishVolumeRequest>,
    ) -> Result<Response<ControllerUnpublishVolumeResponse>, Status> {
        let req = request.into_inner();
        rpc::serve(
            &self.driver,
            "ControllerUnpublishVolume",
            Subject::volume(&req.volume_id),
            publish::unpublish(&self.driver, req),
        )
        .await
    }

    async fn validate_volume_capabilities(
        &self,
        request: Request<ValidateVolumeCapabilitiesRequest>,
    ) -> Result<Response<ValidateVolumeCapabilitiesResponse>, Status> {
        let req = request.into_inner();
        rpc::serve(
            &self.driver,
            "ValidateVolumeCapabilities",
            Subject::volume(&req.volume_id),
            async { publish::validate_capabilities(&self.driver, req) },
        )
        .await
    }

    async fn list_volumes(
        &self,
        request: Request<ListVolumesRequest>,
    ) -> Result<Response<ListVolumesResponse>, Status> {
        let req = request.into_inner();
        rpc::serve(
            &self.driver,
            "ListVolumes",
            Subject::none(),
            query::list_volumes(&self.driver, req),
        )
        .await
    }

    async fn get_capacity(
        &self,
        request: Request<GetCapacityRequest>,
    ) -> Result<Response<GetCapacityResponse>, Status> {
        let req = request.into_inner();
        rpc::serve(
            &self.driver,
            "GetCapacity",
            Subject::none(),
            query::get_capacity(&self.driver, req),
        )
        .await
    }

    async fn controller_get_capabilities(
        &self,
        _request: Request<ControllerGetCapabilitiesRequest>,
    ) -> Result<Response<ControllerGetCapabilitiesResponse>, Status> {
        let node_expansion = self.driver.config.expansion == Expansion::Node;
        let capabilities = CAPABILITIES
            .iter()
            .filter(|rpc| !(node_expansion && **rpc == Rpc::ExpandVolume))
            .map(|rpc| ControllerServiceCapability {
                r#type: Some(CapabilityType::Rpc(RpcCapability {
                    r#type: *rpc as i32,
                })),
            })
            .collect();
        rpc::serve(
            &self.driver,
            "ControllerGetCapabilities",
            Subject::none(),
            async { Ok(ControllerGetCapabilitiesResponse { capabilities }) },
        )
        .await
    }

    async fn create_snapshot(
        &self,
        request: Request<CreateSnapshotRequest>,
    ) -> Result<Response<CreateSnapshotResponse>, Status> {
        let req = request.into_inner();
        rpc::serve(
            &self.driver,
            "CreateSnapshot",
            Subject::name(&req.name, Some(&req.source_volume_id)),
            snapshot::create_snapshot(&self.driver, req),
        )
        .await
    }

    async fn delete_snapshot(
        &self,
        request: Request<DeleteSnapshotRequest>,
    ) -> Result<Response<DeleteSnapshotResponse>, Status> {
        let req = request.into_inner();
        rpc::serve(
            &self.driver,
            "DeleteSnapshot",
            Subject::snapshot(&req.snapshot_id),
            snapshot::delete_snapshot(&self.driver, req),
        )
        .await
    }

    async fn list_snapshots(
        &self,
        request: Request<ListSnapshotsRequest>,
    ) -> Result<Response<ListSnapshotsResponse>, Status> {
        let req = request.into_inner();
        rpc::serve(&self.driver, "ListSnapshots", Subject::none(), async {
            snapshot::list_snapshots(&self.driver, req)
        })
        .await
    }

    async fn get_snapshot(
        &self,
        request: Request<GetSnapshotRequest>,
    ) -> Result<Response<GetSnapshotResponse>, Status> {
        let req = request.into_inner();
        rpc::serve(
            &self.driver,
            "GetSnapshot",
            Subject::snapshot(&req.snapshot_id),
            async { snapshot::get_snapshot(&self.driver, req) },
        )
        .await
    }

    async fn controller_expand_volume(
        &self,
        request: Request<ControllerExpandVolumeRequest>,
    ) -> Result<Response<ControllerExpandVolumeResponse>, Status> {
        let req = request.into_inner();
        rpc::serve(
            &self.driver,
            "ControllerExpandVolume",
            Subject::volume(&req.volume_id),
            expand::expand_volume(&self.driver, req),
        )
        .await
    }

    async fn controller_get_volume(
        &self,
        request: Request<ControllerGetVolumeRequest>,
    ) -> Result<Response<ControllerGetVolumeResponse>, Status> {
        let req = request.into_inner();
        rpc::serve(
            &self.driver,
            "ControllerGetVolume",
            Subject::volume(&req.volume_id),
            query::get_volume(&self.driver, req),
        )
        .await
    }

    async fn controller_modify_volume(
        &self,
        request: Request<ControllerModifyVolumeRequest>,
    ) -> Result<Response<ControllerModifyVolumeResponse>, Status> {
        let req = request.into_inner();
        rpc::serve(&self.driver, "ControllerModifyVolume", Subject::volume(&req.volume_id), async {
            Err(crate::Error::Unimplemented(
                "ControllerModifyVolume is not supported: ferrovol volumes have no mutable parameters".into(),
            ))
        })
        .await
    }
}
