//! Controller service, per volume: ControllerGetCapabilities (the volume, snapshot, clone
//! and expansion RPCs), ValidateVolumeCapabilities,
//! ControllerPublishVolume, ControllerUnpublishVolume, ControllerGetVolume.

use std::collections::BTreeSet;

use ferrovol::csi::v1::controller_service_capability::rpc::Type as RpcType;
use ferrovol::csi::v1::controller_service_capability::{Rpc, Type as CapType};
use ferrovol::csi::v1::volume_capability::access_mode::Mode;
use ferrovol::csi::v1::{
    ControllerGetCapabilitiesRequest, ControllerGetVolumeRequest, ControllerPublishVolumeRequest,
    ControllerUnpublishVolumeRequest, ListVolumesRequest, ValidateVolumeCapabilitiesRequest,
    VolumeCapability,
};
use tonic::Code;

use crate::harness::Driver;
use crate::requests::{
    mount_cap, mount_cap_mode, node_topology, ok, CodeChecks, MALFORMED_VOLUME_ID, MIB,
    UNKNOWN_VOLUME_ID,
};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn controller_capabilities_are_the_documented_set() {
    let d = Driver::start().await;
    let resp = ok(
        d.controller()
            .controller_get_capabilities(ControllerGetCapabilitiesRequest {})
            .await,
        "ControllerGetCapabilities",
    );
    let got: BTreeSet<RpcType> = resp
        .capabilities
        .iter()
        .filter_map(|c| match c.r#type {
            Some(CapType::Rpc(Rpc { r#type })) => RpcType::try_from(r#type).ok(),
            None => None,
        })
        .collect();
    let want: BTreeSet<RpcType> = [
        RpcType::CreateDeleteVolume,
        RpcType::PublishUnpublishVolume,
        RpcType::ListVolumes,
        RpcType::GetCapacity,
        RpcType::PublishReadonly,
        RpcType::ListVolumesPublishedNodes,
        RpcType::VolumeCondition,
        RpcType::GetVolume,
        RpcType::SingleNodeMultiWriter,
        RpcType::CreateDeleteSnapshot,
        RpcType::ListSnapshots,
        RpcType::GetSnapshot,
        RpcType::CloneVolume,
        RpcType::ExpandVolume,
    ]
    .into_iter()
    .collect();
    assert_eq!(
        got, want,
        "controller capabilities: {:?}",
        resp.capabilities
    );
    d.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn validate_volume_capabilities() {
    let d = Driver::start().await;
    let mut checks = CodeChecks::new();
    let vol = d.create("pvc-validate", 16 * MIB, mount_cap("ext4")).await;
    let req = |id: &str, caps: Vec<VolumeCapability>| ValidateVolumeCapabilitiesRequest {
        volume_id: id.to_owned(),
        volume_capabilities: caps,
        ..Default::default()
    };
    checks.code(
        d.controller()
            .validate_volume_capabilities(req("", vec![mount_cap("ext4")]))
            .await,
        Code::InvalidArgument,
        "ValidateVolumeCapabilities empty id",
    );
    checks.code(
        d.controller()
            .validate_volume_capabilities(req(&vol.volume_id, vec![]))
            .await,
        Code::InvalidArgument,
        "ValidateVolumeCapabilities no capabilities",
    );
    for id in [UNKNOWN_VOLUME_ID, MALFORMED_VOLUME_ID] {
        checks.code(
            d.controller()
                .validate_volume_capabilities(req(id, vec![mount_cap("ext4")]))
                .await,
            Code::NotFound,
            &format!("ValidateVolumeCapabilities {id}"),
        );
    }

    let supported = vec![
        mount_cap("ext4"),
        mount_cap_mode("ext4", Mode::SingleNodeReaderOnly),
        mount_cap_mode("ext4", Mode::SingleNodeMultiWriter),
    ];
    let resp = ok(
        d.controller()
            .validate_volume_capabilities(req(&vol.volume_id, supported.clone()))
            .await,
        "ValidateVolumeCapabilities supported",
    );
    let confirmed = resp
        .confirmed
        .unwrap_or_else(|| panic!("supported capabilities not confirmed: {:?}", resp.message));
    assert_eq!(
        confirmed.volume_capabilities, supported,
        "confirmed capabilities"
    );

    for mode in [Mode::MultiNodeMultiWriter, Mode::MultiNodeReaderOnly] {
        let resp = ok(
            d.controller()
                .validate_volume_capabilities(req(
                    &vol.volume_id,
                    vec![mount_cap("ext4"), mount_cap_mode("ext4", mode)],
                ))
                .await,
            "ValidateVolumeCapabilities multi-node",
        );
        assert!(
            resp.confirmed.is_none(),
            "{mode:?} must not be confirmed: {:?}",
            resp.confirmed
        );
        assert!(!resp.message.trim().is_empty(), "{mode:?}: empty message");
    }
    d.delete(&vol.volume_id).await;
    checks.finish();
    d.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn controller_publish_and_unpublish() {
    let d = Driver::start().await;
    let mut checks = CodeChecks::new();
    let node = d.opts.node_id.clone();
    let vol = d.create("pvc-publish", 16 * MIB, mount_cap("ext4")).await;
    let id = vol.volume_id.clone();
    let publish = |id: &str, node: &str, readonly: bool| ControllerPublishVolumeRequest {
        volume_id: id.to_owned(),
        node_id: node.to_owned(),
        volume_capability: Some(mount_cap("ext4")),
        readonly,
        ..Default::default()
    };
    let unpublish = |id: &str, node: &str| ControllerUnpublishVolumeRequest {
        volume_id: id.to_owned(),
        node_id: node.to_owned(),
        ..Default::default()
    };
    let published_nodes = |d: &Driver, id: String| {
        let mut c = d.controller();
        async move {
            let resp = ok(
                c.controller_get_volume(ControllerGetVolumeRequest {
                    volume_id: id.clone(),
                })
                .await,
                "ControllerGetVolume",
            );
            let from_get = resp.status.expect("status").published_node_ids;
            let listed = ok(
                c.list_volumes(ListVolumesRequest::default()).await,
                "ListVolumes",
            );
            let entry = listed
                .entries
                .iter()
                .find(|e| e.volume.as_ref().is_some_and(|v| v.volume_id == id))
                .expect("volume is listed");
            let from_list = entry
                .status
                .as_ref()
                .expect("ListVolumes entry has a status")
                .published_node_ids
                .clone();
            assert_eq!(from_get, from_list, "GetVolume and ListVolumes disagree");
            from_get
        }
    };

    // Bad input.
    checks.code(
        d.controller()
            .controller_publish_volume(publish("", &node, false))
            .await,
        Code::InvalidArgument,
        "ControllerPublishVolume empty volume id",
    );
    checks.code(
        d.controller()
            .controller_publish_volume(publish(&id, "", false))
            .await,
        Code::InvalidArgument,
        "ControllerPublishVolume empty node id",
    );
    let mut no_cap = publish(&id, &node, false);
    no_cap.volume_capability = None;
    checks.code(
        d.controller().controller_publish_volume(no_cap).await,
        Code::InvalidArgument,
        "ControllerPublishVolume without capability",
    );
    for unknown in [UNKNOWN_VOLUME_ID, MALFORMED_VOLUME_ID] {
        checks.code(
            d.controller()
                .controller_publish_volume(publish(unknown, &node, false))
                .await,
            Code::NotFound,
            &format!("ControllerPublishVolume unknown volume {unknown}"),
        );
    }
    checks.code(
        d.controller()
            .controller_publish_volume(publish(&id, "some-other-node", false))
            .await,
        Code::NotFound,
        "ControllerPublishVolume to another node",
    );
    assert!(published_nodes(&d, id.clone()).await.is_empty());

    // Publish, twice; a different readonly flag conflicts.
    checks.ok(
        d.controller()
            .controller_publish_volume(publish(&id, &node, false))
            .await,
        "ControllerPublishVolume",
    );
    checks.ok(
        d.controller()
            .controller_publish_volume(publish(&id, &node, false))
            .await,
        "ControllerPublishVolume again",
    );
    checks.code(
        d.controller()
            .controller_publish_volume(publish(&id, &node, true))
            .await,
        Code::AlreadyExists,
        "ControllerPublishVolume readonly after read-write",
    );
    assert_eq!(published_nodes(&d, id.clone()).await, vec![node.clone()]);

    // Unpublish, twice, and for unknown volumes.
    checks.code(
        d.controller()
            .controller_unpublish_volume(unpublish("", &node))
            .await,
        Code::InvalidArgument,
        "ControllerUnpublishVolume empty volume id",
    );
    checks.ok(
        d.controller()
            .controller_unpublish_volume(unpublish(&id, &node))
            .await,
        "ControllerUnpublishVolume",
    );
    assert!(published_nodes(&d, id.clone()).await.is_empty());
    checks.ok(
        d.controller()
            .controller_unpublish_volume(unpublish(&id, &node))
            .await,
        "ControllerUnpublishVolume again",
    );
    for unknown in [UNKNOWN_VOLUME_ID, MALFORMED_VOLUME_ID] {
        checks.ok(
            d.controller()
                .controller_unpublish_volume(unpublish(unknown, &node))
                .await,
            &format!("ControllerUnpublishVolume unknown volume {unknown}"),
        );
    }

    // Read-only first, then read-write conflicts; unpublish from every node (empty node id).
    checks.ok(
        d.controller()
            .controller_publish_volume(publish(&id, &node, true))
            .await,
        "ControllerPublishVolume readonly",
    );
    checks.code(
        d.controller()
            .controller_publish_volume(publish(&id, &node, false))
            .await,
        Code::AlreadyExists,
        "ControllerPublishVolume read-write after readonly",
    );
    checks.ok(
        d.controller()
            .controller_unpublish_volume(unpublish(&id, ""))
            .await,
        "ControllerUnpublishVolume from every node",
    );
    assert!(published_nodes(&d, id.clone()).await.is_empty());

    d.delete(&id).await;
    checks.finish();
    d.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn controller_get_volume_reports_status_and_missing_backing_file() {
    let d = Driver::start().await;
    let mut checks = CodeChecks::new();
    let get = |id: &str| ControllerGetVolumeRequest {
        volume_id: id.to_owned(),
    };
    checks.code(
        d.controller().controller_get_volume(get("")).await,
        Code::InvalidArgument,
        "ControllerGetVolume empty id",
    );
    for id in [UNKNOWN_VOLUME_ID, MALFORMED_VOLUME_ID] {
        checks.code(
            d.controller().controller_get_volume(get(id)).await,
            Code::NotFound,
            &format!("ControllerGetVolume {id}"),
        );
    }

    let vol = d.create("pvc-get", 24 * MIB, mount_cap("ext4")).await;
    let resp = ok(
        d.controller()
            .controller_get_volume(get(&vol.volume_id))
            .await,
        "ControllerGetVolume",
    );
    let got = resp.volume.expect("volume");
    assert_eq!(got.volume_id, vol.volume_id);
    assert_eq!(got.capacity_bytes, 24 * MIB);
    assert_eq!(
        got.accessible_topology,
        vec![node_topology(&d.opts.node_id)]
    );
    let status = resp.status.expect("status");
    assert!(status.published_node_ids.is_empty());
    let condition = status.volume_condition.expect("volume_condition");
    assert!(
        !condition.abnormal,
        "healthy volume reported abnormal: {condition:?}"
    );

    // Delete the backing file behind the driver's back.
    d.remove_storage_behind_back(&vol.volume_id);
    let resp = ok(
        d.controller()
            .controller_get_volume(get(&vol.volume_id))
            .await,
        "ControllerGetVolume with the backing file gone",
    );
    let condition = resp
        .status
        .and_then(|s| s.volume_condition)
        .expect("volume_condition");
    assert!(
        condition.abnormal,
        "missing backing file not reported: {condition:?}"
    );
    assert!(
        !condition.message.trim().is_empty(),
        "abnormal condition without message"
    );

    let listed = ok(
        d.controller()
            .list_volumes(ListVolumesRequest::default())
            .await,
        "ListVolumes",
    );
    let entry = listed
        .entries
        .iter()
        .find(|e| {
            e.volume
                .as_ref()
                .is_some_and(|v| v.volume_id == vol.volume_id)
        })
        .expect("the broken volume is still listed");
    let condition = entry
        .status
        .as_ref()
        .and_then(|s| s.volume_condition.clone())
        .expect("ListVolumes entry carries volume_condition (VOLUME_CONDITION capability)");
    assert!(condition.abnormal, "ListVolumes condition: {condition:?}");

    d.delete(&vol.volume_id).await;
    checks.code(
        d.controller()
            .controller_get_volume(get(&vol.volume_id))
            .await,
        Code::NotFound,
        "ControllerGetVolume after delete",
    );
    checks.finish();
    d.finish().await;
}
