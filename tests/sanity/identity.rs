//! Identity service: GetPluginInfo, GetPluginCapabilities (services and online volume
//! expansion), Probe.

use ferrovol::csi::v1::plugin_capability::service::Type as ServiceType;
use ferrovol::csi::v1::plugin_capability::volume_expansion::Type as ExpansionType;
use ferrovol::csi::v1::plugin_capability::{Service, Type as CapType, VolumeExpansion};
use ferrovol::csi::v1::{GetPluginCapabilitiesRequest, GetPluginInfoRequest, ProbeRequest};

use crate::harness::{Driver, Options};
use crate::requests::{ok, DRIVER_NAME};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plugin_info_reports_default_name_and_package_version() {
    let d = Driver::start().await;
    let info = ok(
        d.identity().get_plugin_info(GetPluginInfoRequest {}).await,
        "GetPluginInfo",
    );
    assert_eq!(info.name, DRIVER_NAME);
    assert_eq!(info.vendor_version, env!("CARGO_PKG_VERSION"));
    d.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plugin_info_reports_configured_driver_name() {
    let d = Driver::start_with(Options {
        driver_name: Some("other.ferrovol.example.com".to_owned()),
        ..Options::default()
    })
    .await;
    let info = ok(
        d.identity().get_plugin_info(GetPluginInfoRequest {}).await,
        "GetPluginInfo",
    );
    assert_eq!(info.name, "other.ferrovol.example.com");
    d.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plugin_capabilities_are_controller_topology_and_online_expansion() {
    let d = Driver::start().await;
    let resp = ok(
        d.identity()
            .get_plugin_capabilities(GetPluginCapabilitiesRequest {})
            .await,
        "GetPluginCapabilities",
    );
    let mut services: Vec<ServiceType> = resp
        .capabilities
        .iter()
        .filter_map(|c| match c.r#type {
            Some(CapType::Service(Service { r#type })) => ServiceType::try_from(r#type).ok(),
            _ => None,
        })
        .collect();
    services.sort();
    assert_eq!(
        services,
        vec![
            ServiceType::ControllerService,
            ServiceType::VolumeAccessibilityConstraints
        ],
        "plugin capabilities: {:?}",
        resp.capabilities
    );
    let expansion: Vec<ExpansionType> = resp
        .capabilities
        .iter()
        .filter_map(|c| match c.r#type {
            Some(CapType::VolumeExpansion(VolumeExpansion { r#type })) => {
                ExpansionType::try_from(r#type).ok()
            }
            _ => None,
        })
        .collect();
    assert_eq!(
        expansion,
        vec![ExpansionType::Online],
        "volume expansion capability: {:?}",
        resp.capabilities
    );
    d.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn probe_is_ready_and_reports_not_ready_without_pool() {
    let d = Driver::start().await;
    let probe = ok(d.identity().probe(ProbeRequest {}).await, "Probe");
    assert_eq!(probe.ready, Some(true), "Probe with a usable pool");

    // Take the pool away: Probe must still answer OK, with ready=false.
    d.break_pool();
    let probe = ok(
        d.identity().probe(ProbeRequest {}).await,
        "Probe without pool",
    );
    assert_eq!(probe.ready, Some(false), "Probe with the pool dir missing");

    // And back: ready again.
    d.restore_pool();
    let probe = ok(
        d.identity().probe(ProbeRequest {}).await,
        "Probe with pool back",
    );
    assert_eq!(probe.ready, Some(true), "Probe after the pool came back");
    d.finish().await;
}
