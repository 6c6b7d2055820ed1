//! Crash and restart: SIGKILL the driver while volumes are staged and published, start it
//! again on the same state and pool dirs, and every volume must still be usable and cleanly
//! torn down.
//!
//! RPCs: ListVolumes, ControllerGetVolume, NodeStageVolume, NodePublishVolume,
//! NodeGetVolumeStats, NodeUnpublishVolume, NodeUnstageVolume, DeleteVolume.

use std::collections::BTreeSet;

use ferrovol::csi::v1::volume_capability::access_mode::Mode;
use ferrovol::csi::v1::{
    ControllerGetVolumeRequest, ListVolumesRequest, NodeGetVolumeStatsRequest,
};

use crate::content::{verify_block, verify_files, write_block, write_files};
use crate::harness::Driver;
use crate::host::{mount_at, mount_count_at};
use crate::requests::{block_cap, mount_cap, mount_cap_mode, ok, MIB};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkill_and_restart_keeps_volumes_usable() {
    let mut d = Driver::start().await;
    // SINGLE_NODE_MULTI_WRITER, so the fs volume may have two targets.
    let ext4 = mount_cap_mode("ext4", Mode::SingleNodeMultiWriter);
    let block = block_cap();

    let published_fs = d
        .create("pvc-crash-fs", 32 * MIB, ext4.clone())
        .await
        .volume_id;
    let published_blk = d
        .create("pvc-crash-blk", 16 * MIB, block.clone())
        .await
        .volume_id;
    let staged_only = d
        .create("pvc-crash-staged", 16 * MIB, ext4.clone())
        .await
        .volume_id;
    let created_only = d
        .create("pvc-crash-created", 16 * MIB, ext4.clone())
        .await
        .volume_id;

    d.stage(&published_fs, &ext4).await;
    let fs_target = d.publish(&published_fs, &ext4, "fs", false).await;
    let fs_ro = d.publish(&published_fs, &ext4, "fs-ro", true).await;
    write_files(&fs_target, 61);
    d.stage(&published_blk, &block).await;
    let blk_target = d.publish(&published_blk, &block, "blk", false).await;
    write_block(&blk_target, 62);
    let staged = d.stage(&staged_only, &ext4).await;
    write_files(&staged, 63);
    let loops_before: Vec<_> = [&published_fs, &published_blk, &staged_only]
        .iter()
        .map(|id| d.loop_of(id).expect("loop device").device)
        .collect();

    d.kill_hard();
    // The socket file of the killed driver stays behind; the new one must replace it.
    d.spawn_and_connect().await;

    let listed = ok(
        d.controller()
            .list_volumes(ListVolumesRequest::default())
            .await,
        "ListVolumes after restart",
    );
    let ids: BTreeSet<String> = listed
        .entries
        .iter()
        .filter_map(|e| e.volume.as_ref().map(|v| v.volume_id.clone()))
        .collect();
    let want: BTreeSet<String> = [&published_fs, &published_blk, &staged_only, &created_only]
        .into_iter()
        .cloned()
        .collect();
    assert_eq!(ids, want, "volumes after restart");
    let got = ok(
        d.controller()
            .controller_get_volume(ControllerGetVolumeRequest {
                volume_id: published_fs.clone(),
            })
            .await,
        "ControllerGetVolume after restart",
    );
    let cond = got
        .status
        .and_then(|s| s.volume_condition)
        .expect("condition");
    assert!(
        !cond.abnormal,
        "published volume abnormal after restart: {cond:?}"
    );

    // What the kubelet does after a driver restart: stage and publish again (idempotent).
    d.stage(&published_fs, &ext4).await;
    d.publish(&published_fs, &ext4, "fs", false).await;
    d.publish(&published_fs, &ext4, "fs-ro", true).await;
    d.stage(&published_blk, &block).await;
    d.publish(&published_blk, &block, "blk", false).await;
    d.stage(&staged_only, &ext4).await;
    for (id, lo) in [&published_fs, &published_blk, &staged_only]
        .iter()
        .zip(&loops_before)
    {
        assert_eq!(
            &d.loop_of(id).expect("loop device").device,
            lo,
            "{id}: loop changed"
        );
    }
    for path in [
        &fs_target,
        &fs_ro,
        &blk_target,
        &d.staging_path(&published_fs),
        &staged,
    ] {
        assert_eq!(
            mount_count_at(path),
            1,
            "{} mounted more than once",
            path.display()
        );
    }
    assert!(mount_at(&fs_ro).expect("ro target").is_read_only());
    verify_files(&fs_target, 61);
    verify_files(&fs_ro, 61);
    verify_block(&blk_target, 62);
    verify_files(&staged, 63);
    ok(
        d.node()
            .node_get_volume_stats(NodeGetVolumeStatsRequest {
                volume_id: published_fs.clone(),
                volume_path: fs_target.display().to_string(),
                staging_target_path: String::new(),
            })
            .await,
        "NodeGetVolumeStats after restart",
    );

    // Clean teardown of everything.
    d.unpublish(&published_fs, &fs_target).await;
    d.unpublish(&published_fs, &fs_ro).await;
    d.unpublish(&published_blk, &blk_target).await;
    for id in [&published_fs, &published_blk, &staged_only] {
        d.unstage(id).await;
    }
    for id in [&published_fs, &published_blk, &staged_only, &created_only] {
        d.delete(id).await;
    }
    d.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkill_and_restart_then_teardown_without_restage() {
    // After a restart the CO may go straight to teardown without staging again.
    let mut d = Driver::start().await;
    let ext4 = mount_cap("ext4");
    let id = d
        .create("pvc-crash-teardown", 16 * MIB, ext4.clone())
        .await
        .volume_id;
    d.stage(&id, &ext4).await;
    let target = d.publish(&id, &ext4, "t", false).await;
    write_files(&target, 71);

    d.kill_hard();
    d.spawn_and_connect().await;

    verify_files(&target, 71);
    d.unpublish(&id, &target).await;
    d.unstage(&id).await;
    d.delete(&id).await;
    d.finish().await;
}
