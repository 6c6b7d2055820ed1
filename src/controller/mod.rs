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

fn unimplemented(method: &str) -> Status {
    Status::unimplemented(format!("{method} is not supported by ferrovol yet"))
}

fn reply<T>(result: crate::Result<T>) -> Result<Response<T>, Status> {
    result.map(Response::new).map_err(Status::from)
}

#[tonic::async_trait]
impl Controller for ControllerService {
    async fn create_volume(
        &self,
        request: Request<CreateVolumeRequest>,
    ) -> Result<Response<CreateVolumeResponse>, Status> {
        reply(create::create_volume(&self.driver, request.into_inner()).await)
    }

    async fn delete_volume(
        &self,
        request: Request<DeleteVolumeRequest>,
    ) -> Result<Response<DeleteVolumeResponse>, Status> {
        reply(create::delete_volume(&self.driver, request.into_inner()).await)
    }

    async fn controller_publish_volume(
        &self,
        request: Request<ControllerPublishVolumeRequest>,
    ) -> Result<Response<ControllerPublishVolumeResponse>, Status> {
        reply(publish::publish(&self.driver, request.into_inner()).await)
    }

    async fn controller_unpublish_volume(
        &self,
        request: Request<ControllerUnpublishVolumeRequest>,
    ) -> Result<Response<ControllerUnpublishVolumeResponse>, Status> {
        reply(publish::unpublish(&self.driver, request.into_inner()).await)
    }

    async fn validate_volume_capabilities(
        &self,
        request: Request<ValidateVolumeCapabilitiesRequest>,
    ) -> Result<Response<ValidateVolumeCapabilitiesResponse>, Status> {
        reply(publish::validate_capabilities(
            &self.driver,
            request.into_inner(),
        ))
    }

    async fn list_volumes(
        &self,
        request: Request<ListVolumesRequest>,
    ) -> Result<Response<ListVolumesResponse>, Status> {
        reply(query::list_volumes(&self.driver, request.into_inner()).await)
    }

    async fn get_capacity(
        &self,
        request: Request<GetCapacityRequest>,
    ) -> Result<Response<GetCapacityResponse>, Status> {
        reply(query::get_capacity(&self.driver, request.into_inner()).await)
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
        Ok(Response::new(ControllerGetCapabilitiesResponse {
            capabilities,
        }))
    }

    async fn create_snapshot(
        &self,
        request: Request<CreateSnapshotRequest>,
    ) -> Result<Response<CreateSnapshotResponse>, Status> {
        reply(snapshot::create_snapshot(&self.driver, request.into_inner()).await)
    }

    async fn delete_snapshot(
        &self,
        request: Request<DeleteSnapshotRequest>,
    ) -> Result<Response<DeleteSnapshotResponse>, Status> {
        reply(snapshot::delete_snapshot(&self.driver, request.into_inner()).await)
    }

    async fn list_snapshots(
        &self,
        request: Request<ListSnapshotsRequest>,
    ) -> Result<Response<ListSnapshotsResponse>, Status> {
        reply(snapshot::list_snapshots(&self.driver, request.into_inner()))
    }

    async fn get_snapshot(
        &self,
        request: Request<GetSnapshotRequest>,
    ) -> Result<Response<GetSnapshotResponse>, Status> {
        reply(snapshot::get_snapshot(&self.driver, request.into_inner()))
    }

    async fn controller_expand_volume(
        &self,
        request: Request<ControllerExpandVolumeRequest>,
    ) -> Result<Response<ControllerExpandVolumeResponse>, Status> {
        reply(expand::expand_volume(&self.driver, request.into_inner()).await)
    }

    async fn controller_get_volume(
        &self,
        request: Request<ControllerGetVolumeRequest>,
    ) -> Result<Response<ControllerGetVolumeResponse>, Status> {
        reply(query::get_volume(&self.driver, request.into_inner()).await)
    }

    async fn controller_modify_volume(
        &self,
        _request: Request<ControllerModifyVolumeRequest>,
    ) -> Result<Response<ControllerModifyVolumeResponse>, Status> {
        Err(unimplemented("ControllerModifyVolume"))
    }
}
