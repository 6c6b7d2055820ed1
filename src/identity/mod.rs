//! The Identity service: GetPluginInfo, GetPluginCapabilities and Probe.
//!
//! Probe answers `ready=false` (not an error) while the pool or, on a node, the loop
//! control device is unusable, so that liveness checks can tell "up but not ready".

use std::sync::Arc;

use tonic::{Request, Response, Status};
use tracing::warn;

use crate::config::Mode;
use crate::csi::v1::identity_server::Identity;
use crate::csi::v1::plugin_capability::{
    service, volume_expansion, Service, Type, VolumeExpansion,
};
use crate::csi::v1::{
    GetPluginCapabilitiesRequest, GetPluginCapabilitiesResponse, GetPluginInfoRequest,
    GetPluginInfoResponse, PluginCapability, ProbeRequest, ProbeResponse,
};
use crate::driver::Driver;
use crate::error::Result;
use crate::rpc::{self, Subject};

/// Serves the CSI Identity service.
#[derive(Debug, Clone)]
pub struct IdentityService {
    /// Shared driver state.
    driver: Arc<Driver>,
}

impl IdentityService {
    /// A service over the shared driver state.
    pub fn new(driver: Arc<Driver>) -> Self {
        IdentityService { driver }
    }

    /// Whether the driver can serve requests now; the error says why not.
    ///
    /// # Errors
    /// The first problem found.
    pub async fn readiness(&self) -> Result<()> {
        let backend = Arc::clone(&self.driver.backend);
        let serves_node = self.driver.config.mode != Mode::Controller;
        self.driver
            .blocking(move || {
                backend.check()?;
                if serves_node {
                    backend.check_node()?;
                }
                Ok(())
            })
            .await
    }
}

fn service_capability(kind: service::Type) -> PluginCapability {
    PluginCapability {
        r#type: Some(Type::Service(Service {
            r#type: kind as i32,
        })),
    }
}

#[tonic::async_trait]
impl Identity for IdentityService {
    async fn get_plugin_info(
        &self,
        _request: Request<GetPluginInfoRequest>,
    ) -> Result<Response<GetPluginInfoResponse>, Status> {
        rpc::serve(&self.driver, "GetPluginInfo", Subject::none(), async {
            Ok(GetPluginInfoResponse {
                name: self.driver.config.driver_name.clone(),
                vendor_version: env!("CARGO_PKG_VERSION").to_owned(),
                manifest: Default::default(),
            })
        })
        .await
    }

    async fn get_plugin_capabilities(
        &self,
        _request: Request<GetPluginCapabilitiesRequest>,
    ) -> Result<Response<GetPluginCapabilitiesResponse>, Status> {
        let mut capabilities = Vec::new();
        if self.driver.config.mode != Mode::Node {
            capabilities.push(service_capability(service::Type::ControllerService));
        }
        capabilities.push(service_capability(
            service::Type::VolumeAccessibilityConstraints,
        ));
        capabilities.push(PluginCapability {
            r#type: Some(Type::VolumeExpansion(VolumeExpansion {
                r#type: volume_expansion::Type::Online as i32,
            })),
        });
        rpc::serve(
            &self.driver,
            "GetPluginCapabilities",
            Subject::none(),
            async { Ok(GetPluginCapabilitiesResponse { capabilities }) },
        )
        .await
    }

    async fn probe(
        &self,
        _request: Request<ProbeRequest>,
    ) -> Result<Response<ProbeResponse>, Status> {
        rpc::serve(&self.driver, "Probe", Subject::none(), async {
            let ready = match self.readiness().await {
                Ok(()) => true,
                Err(e) => {
                    warn!(cause = %e, "not ready");
                    false
                }
            };
            Ok(ProbeResponse { ready: Some(ready) })
        })
        .await
    }
}
