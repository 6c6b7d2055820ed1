//! Node service: NodeGetInfo, NodeGetCapabilities, the error code of each bad input to
//! NodeStageVolume, NodePublishVolume, NodeUnpublishVolume, NodeUnstageVolume and
//! NodeGetVolumeStats, and the volume condition of a block volume whose loop device was
//! detached behind the driver's back. The full stage/publish lifecycles are in `lifecycle`.

use std::fs;
use std::path::Path;

use ferrovol::csi::v1::node_service_capability::rpc::Type as RpcType;
use ferrovol::csi::v1::node_service_capability::{Rpc, Type as CapType};
use ferrovol::csi::v1::{
    DeleteVolumeRequest, NodeGetCapabilitiesRequest, NodeGetInfoRequest, NodeGetVolumeStatsRequest,
    NodeGetVolumeStatsResponse, NodeUnpublishVolumeRequest, NodeUnstageVolumeRequest,
};
use tonic::Code;

use crate::harness::{Driver, Options};
use crate::host::{detach_loop_behind_back, mount_at};
use crate::requests::{
    block_cap, expect_code, mount_cap, node_topology, ok, CodeChecks, MALFORMED_VOLUME_ID, MIB,
    UNKNOWN_VOLUME_ID,
};

/// NodeGetVolumeStats for `volume_path`.
pub async fn stats(d: &Driver, volume_id: &str, volume_path: &Path) -> NodeGetVolumeStatsResponse {
    ok(
        d.node()
            .node_get_volume_stats(NodeGetVolumeStatsRequest {
                volume_id: volume_id.to_owned(),
                volume_path: volume_path.display().to_string(),
                staging_target_path: String::new(),
            })
            .await,
        &format!("NodeGetVolumeStats {volume_id} {}", volume_path.display()),
    )
}

/// Asserts a DeleteVolume of a staged volume is refused.
pub async fn assert_delete_refused_while_staged(d: &Driver, volume_id: &str) {
    expect_code(
        d.controller()
            .delete_volume(DeleteVolumeRequest {
                volume_id: volume_id.to_owned(),
                ..Default::default()
            })
            .await,
        Code::FailedPrecondition,
        "DeleteVolume of a staged volume",
    );
    assert!(
        d.storage_size(volume_id).is_some(),
        "refused delete removed the file"
    );
}

/// Asserts NodeUnstageVolume is refused while a target is still published.
pub async fn assert_unstage_refused_while_published(d: &Driver, volume_id: &str) {
    expect_code(
        d.node()
            .node_unstage_volume(NodeUnstageVolumeRequest {
                volume_id: volume_id.to_owned(),
                staging_target_path: d.staging_path(volume_id).display().to_string(),
            })
            .await,
        Code::FailedPrecondition,
        "NodeUnstageVolume while published",
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn node_get_info_reports_id_limit_and_topology() {
    let d = Driver::start_with(Options {
        node_id: "worker-7".to_owned(),
        max_volumes_per_node: Some(7),
        ..Options::default()
    })
    .await;
    let info = ok(
        d.node().node_get_info(NodeGetInfoRequest {}).await,
        "NodeGetInfo",
    );
    assert_eq!(info.node_id, "worker-7");
    assert_eq!(info.max_volumes_per_node, 7);
    assert_eq!(info.accessible_topology, Some(node_topology("worker-7")));
    d.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn node_capabilities_are_the_documented_set() {
    let d = Driver::start().await;
    let resp = ok(
        d.node()
            .node_get_capabilities(NodeGetCapabilitiesRequest {})
            .await,
        "NodeGetCapabilities",
    );
    let mut got: Vec<RpcType> = resp
        .capabilities
        .iter()
        .filter_map(|c| match c.r#type {
            Some(CapType::Rpc(Rpc { r#type })) => RpcType::try_from(r#type).ok(),
            None => None,
        })
        .collect();
    got.sort();
    assert_eq!(
        got,
        vec![
            RpcType::StageUnstageVolume,
            RpcType::GetVolumeStats,
            RpcType::ExpandVolume,
            RpcType::VolumeCondition,
            RpcType::SingleNodeMultiWriter,
        ],
        "node capabilities: {:?}",
        resp.capabilities
    );
    d.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn node_stage_volume_argument_errors() {
    let d = Driver::start().await;
    let mut checks = CodeChecks::new();
    let vol = d
        .create("pvc-stage-args", 16 * MIB, mount_cap("ext4"))
        .await;
    let id = vol.volume_id.clone();
    let cap = mount_cap("ext4");

    let mut r = d.stage_request(&id, &cap);
    r.volume_id = String::new();
    checks.code(
        d.node().node_stage_volume(r).await,
        Code::InvalidArgument,
        "empty volume id",
    );
    let mut r = d.stage_request(&id, &cap);
    r.staging_target_path = String::new();
    checks.code(
        d.node().node_stage_volume(r).await,
        Code::InvalidArgument,
        "empty staging path",
    );
    let mut r = d.stage_request(&id, &cap);
    r.staging_target_path = "staging/relative".to_owned();
    checks.code(
        d.node().node_stage_volume(r).await,
        Code::InvalidArgument,
        "relative staging path",
    );
    let mut r = d.stage_request(&id, &cap);
    r.volume_capability = None;
    checks.code(
        d.node().node_stage_volume(r).await,
        Code::InvalidArgument,
        "no capability",
    );
    let mut no_type = cap.clone();
    no_type.access_type = None;
    let r = d.stage_request(&id, &no_type);
    checks.code(
        d.node().node_stage_volume(r).await,
        Code::InvalidArgument,
        "capability without access_type",
    );
    for unknown in [UNKNOWN_VOLUME_ID, MALFORMED_VOLUME_ID] {
        let r = d.stage_request(unknown, &cap);
        checks.code(
            d.node().node_stage_volume(r).await,
            Code::NotFound,
            &format!("NodeStageVolume unknown volume {unknown}"),
        );
    }
    assert!(
        d.loop_of(&id).is_none(),
        "a refused stage attached a loop device"
    );
    d.delete(&id).await;
    checks.finish();
    d.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn node_publish_unpublish_unstage_argument_errors() {
    let d = Driver::start().await;
    let mut checks = CodeChecks::new();
    let cap = mount_cap("ext4");
    let vol = d.create("pvc-publish-args", 16 * MIB, cap.clone()).await;
    let id = vol.volume_id.clone();

    // Before staging: publishing is a precondition failure.
    fs::create_dir_all(d.staging_path(&id)).expect("staging dir");
    checks.code(
        d.node()
            .node_publish_volume(d.publish_request(&id, &cap, "t", false))
            .await,
        Code::FailedPrecondition,
        "NodePublishVolume before NodeStageVolume",
    );
    assert!(mount_at(&d.target_path("t")).is_none());

    d.stage(&id, &cap).await;
    let mut r = d.publish_request(&id, &cap, "t", false);
    r.volume_id = String::new();
    checks.code(
        d.node().node_publish_volume(r).await,
        Code::InvalidArgument,
        "empty volume id",
    );
    // The spec's own row: "Staging target path not set" is FAILED_PRECONDITION.
    let mut r = d.publish_request(&id, &cap, "t", false);
    r.staging_target_path = String::new();
    checks.code(
        d.node().node_publish_volume(r).await,
        Code::FailedPrecondition,
        "NodePublishVolume without staging_target_path",
    );
    let mut r = d.publish_request(&id, &cap, "t", false);
    r.target_path = String::new();
    checks.code(
        d.node().node_publish_volume(r).await,
        Code::InvalidArgument,
        "empty target path",
    );
    let mut r = d.publish_request(&id, &cap, "t", false);
    r.volume_capability = None;
    checks.code(
        d.node().node_publish_volume(r).await,
        Code::InvalidArgument,
        "no capability",
    );
    let r = d.publish_request(UNKNOWN_VOLUME_ID, &cap, "t", false);
    checks.code(
        d.node().node_publish_volume(r).await,
        Code::NotFound,
        "NodePublishVolume unknown volume",
    );
    assert!(
        mount_at(&d.target_path("t")).is_none(),
        "a refused publish mounted"
    );

    let unpublish = |id: &str, target: &str| NodeUnpublishVolumeRequest {
        volume_id: id.to_owned(),
        target_path: target.to_owned(),
    };
    let target = d.target_path("t").display().to_string();
    checks.code(
        d.node().node_unpublish_volume(unpublish("", &target)).await,
        Code::InvalidArgument,
        "NodeUnpublishVolume empty volume id",
    );
    checks.code(
        d.node().node_unpublish_volume(unpublish(&id, "")).await,
        Code::InvalidArgument,
        "NodeUnpublishVolume empty target",
    );
    // A target that was never published is already in the wanted state.
    checks.ok(
        d.node()
            .node_unpublish_volume(unpublish(&id, &target))
            .await,
        "NodeUnpublishVolume of a never-published target",
    );
    checks.code(
        d.node()
            .node_unpublish_volume(unpublish(UNKNOWN_VOLUME_ID, &target))
            .await,
        Code::NotFound,
        "NodeUnpublishVolume of an unknown volume",
    );

    let unstage = |id: &str, path: &str| NodeUnstageVolumeRequest {
        volume_id: id.to_owned(),
        staging_target_path: path.to_owned(),
    };
    let staging = d.staging_path(&id).display().to_string();
    checks.code(
        d.node().node_unstage_volume(unstage("", &staging)).await,
        Code::InvalidArgument,
        "NodeUnstageVolume empty volume id",
    );
    checks.code(
        d.node().node_unstage_volume(unstage(&id, "")).await,
        Code::InvalidArgument,
        "NodeUnstageVolume empty staging path",
    );
    checks.code(
        d.node()
            .node_unstage_volume(unstage(UNKNOWN_VOLUME_ID, &staging))
            .await,
        Code::NotFound,
        "NodeUnstageVolume of an unknown volume",
    );
    d.unstage(&id).await;
    d.unstage(&id).await;
    d.delete(&id).await;
    checks.finish();
    d.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn node_get_volume_stats_errors() {
    let d = Driver::start().await;
    let mut checks = CodeChecks::new();
    let cap = mount_cap("ext4");
    let vol = d.create("pvc-stats", 16 * MIB, cap.clone()).await;
    let other = d.create("pvc-stats-other", 16 * MIB, cap.clone()).await;
    let id = vol.volume_id.clone();
    d.stage(&id, &cap).await;
    let target = d.publish(&id, &cap, "t", false).await;

    let req = |id: &str, path: &Path| NodeGetVolumeStatsRequest {
        volume_id: id.to_owned(),
        volume_path: path.display().to_string(),
        staging_target_path: String::new(),
    };
    checks.code(
        d.node().node_get_volume_stats(req("", &target)).await,
        Code::InvalidArgument,
        "NodeGetVolumeStats empty volume id",
    );
    checks.code(
        d.node()
            .node_get_volume_stats(req(&id, Path::new("")))
            .await,
        Code::InvalidArgument,
        "NodeGetVolumeStats empty volume path",
    );
    let cases = [
        ("missing path", id.clone(), d.root.join("does-not-exist")),
        (
            "a directory that is no mount",
            id.clone(),
            d.root.join("targets"),
        ),
        (
            "another volume's id",
            other.volume_id.clone(),
            target.clone(),
        ),
        (
            "an unknown volume id",
            UNKNOWN_VOLUME_ID.to_owned(),
            target.clone(),
        ),
    ];
    for (what, vid, path) in cases {
        checks.code(
            d.node().node_get_volume_stats(req(&vid, &path)).await,
            Code::NotFound,
            &format!("NodeGetVolumeStats with {what}"),
        );
    }
    stats(&d, &id, &target).await;

    d.unpublish(&id, &target).await;
    checks.code(
        d.node().node_get_volume_stats(req(&id, &target)).await,
        Code::NotFound,
        "NodeGetVolumeStats after unpublish",
    );
    d.unstage(&id).await;
    d.delete(&id).await;
    d.delete(&other.volume_id).await;
    checks.finish();
    d.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn node_get_volume_stats_reports_detached_block_device_abnormal() {
    let d = Driver::start().await;
    let cap = block_cap();
    let vol = d.create("pvc-detached", 16 * MIB, cap.clone()).await;
    let id = vol.volume_id.clone();
    d.stage(&id, &cap).await;
    let target = d.publish(&id, &cap, "blk", false).await;
    let cond = stats(&d, &id, &target)
        .await
        .volume_condition
        .expect("volume_condition");
    assert!(!cond.abnormal, "before detach: {cond:?}");

    let lo = d.loop_of(&id).expect("loop device");
    detach_loop_behind_back(&lo.device);
    assert!(d.loop_of(&id).is_none(), "losetup -d did not detach");
    let cond = stats(&d, &id, &target)
        .await
        .volume_condition
        .expect("volume_condition");
    assert!(cond.abnormal, "detached loop device not reported: {cond:?}");
    assert!(
        !cond.message.trim().is_empty(),
        "abnormal condition without message"
    );

    // Teardown still works on the broken volume.
    d.unpublish(&id, &target).await;
    d.unstage(&id).await;
    d.delete(&id).await;
    d.finish().await;
}
