//! Data safety: what is written through a published volume survives every way the volume can
//! be taken down and brought back, and the driver never formats a device that holds data.
//!
//! RPCs: NodeStageVolume, NodePublishVolume, NodeUnpublishVolume, NodeUnstageVolume.
//! Behind the driver's back: `umount2(MNT_DETACH)` and `losetup -d`, the state a reboot leaves.

use tonic::Code;

use crate::content::{verify_block, verify_files, write_block, write_files};
use crate::harness::Driver;
use crate::host::{mount_at, umount_behind_back};
use crate::requests::{block_cap, mount_cap, MIB, MIN_XFS};
use ferrovol::csi::v1::VolumeCapability;

/// Writes data through a published volume, then unpublishes, unstages, stages and publishes
/// it twice (the second time at another target) and checks the data each time.
async fn data_survives_lifecycle(name: &str, cap: VolumeCapability, size: i64) {
    let d = Driver::start().await;
    let is_block = matches!(
        cap.access_type,
        Some(ferrovol::csi::v1::volume_capability::AccessType::Block(_))
    );
    let write = |p: &std::path::Path| {
        if is_block {
            write_block(p, 7)
        } else {
            write_files(p, 7)
        }
    };
    let verify = |p: &std::path::Path| {
        if is_block {
            verify_block(p, 7)
        } else {
            verify_files(p, 7)
        }
    };
    let vol = d.create(name, size, cap.clone()).await;
    let id = vol.volume_id;

    d.stage(&id, &cap).await;
    let target = d.publish(&id, &cap, "first", false).await;
    write(&target);
    for round in ["second", "third"] {
        let previous = if round == "second" { "first" } else { "second" };
        d.unpublish(&id, &d.target_path(previous)).await;
        d.unstage(&id).await;
        assert!(d.loop_of(&id).is_none(), "loop device survived unstage");
        d.stage(&id, &cap).await;
        let target = d.publish(&id, &cap, round, false).await;
        verify(&target);
    }
    d.unpublish(&id, &d.target_path("third")).await;
    d.unstage(&id).await;
    d.delete(&id).await;
    d.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn data_survives_unpublish_unstage_stage_publish_ext4() {
    data_survives_lifecycle("pvc-data-ext4", mount_cap("ext4"), 32 * MIB).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn data_survives_unpublish_unstage_stage_publish_xfs() {
    data_survives_lifecycle("pvc-data-xfs", mount_cap("xfs"), MIN_XFS).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn data_survives_unpublish_unstage_stage_publish_block() {
    data_survives_lifecycle("pvc-data-block", block_cap(), 16 * MIB).await;
}

/// Stages and publishes a volume, writes files, then takes the target mount, the staging
/// mount and the loop device away behind the driver's back (what a reboot does). Staging and
/// publishing again must bring back the same filesystem with the files intact.
async fn restage_after_reboot(fs_type: &str, size: i64) {
    let d = Driver::start().await;
    let cap = mount_cap(fs_type);
    let vol = d
        .create(&format!("pvc-reboot-{fs_type}"), size, cap.clone())
        .await;
    let id = vol.volume_id;
    let staging = d.stage(&id, &cap).await;
    let target = d.publish(&id, &cap, "t", false).await;
    write_files(&target, 31);

    umount_behind_back(&target);
    umount_behind_back(&staging);
    d.detach_behind_back(&id);
    assert!(mount_at(&staging).is_none() && mount_at(&target).is_none());
    assert!(d.loop_of(&id).is_none(), "loop device still attached");

    // The kubelet after a reboot: stage, then publish to the same (now plain) target dir.
    d.stage(&id, &cap).await;
    assert!(d.loop_of(&id).is_some(), "restage attached no loop device");
    let m = mount_at(&staging).expect("staging mounted again");
    assert_eq!(m.fs_type, fs_type);
    let target = d.publish(&id, &cap, "t", false).await;
    assert!(mount_at(&target).is_some(), "target mounted again");
    verify_files(&target, 31);

    d.unpublish(&id, &target).await;
    d.unstage(&id).await;
    d.delete(&id).await;
    d.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restage_after_reboot_keeps_files_ext4() {
    restage_after_reboot("ext4", 32 * MIB).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restage_after_reboot_keeps_files_xfs() {
    restage_after_reboot("xfs", MIN_XFS).await;
}

/// Staging `id` with `cap` must fail; the staging path must not be left mounted.
async fn assert_stage_refused(d: &Driver, id: &str, cap: &VolumeCapability, what: &str) {
    let result = d.node().node_stage_volume(d.stage_request(id, cap)).await;
    match result {
        Ok(_) => panic!("{what}: NodeStageVolume succeeded; it must refuse instead of formatting"),
        Err(status) => {
            assert_ne!(status.code(), Code::Ok);
            assert!(
                !status.message().trim().is_empty(),
                "{what}: {:?} with an empty message",
                status.code()
            );
            eprintln!(
                "{what}: refused with {:?}: {}",
                status.code(),
                status.message()
            );
        }
    }
    assert!(
        mount_at(&d.staging_path(id)).is_none(),
        "{what}: refused stage left a mount"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn staging_ext4_volume_as_xfs_fails_and_keeps_files() {
    let d = Driver::start().await;
    // Created without a filesystem type and big enough for xfs, so nothing but the probe of
    // the device can stop an xfs format.
    let ext4 = mount_cap("");
    let vol = d.create("pvc-wrong-fs", MIN_XFS, ext4.clone()).await;
    let id = vol.volume_id;
    d.stage(&id, &ext4).await;
    assert_eq!(
        mount_at(&d.staging_path(&id)).expect("staged").fs_type,
        "ext4"
    );
    let target = d.publish(&id, &ext4, "t", false).await;
    write_files(&target, 41);
    d.unpublish(&id, &target).await;
    d.unstage(&id).await;

    assert_stage_refused(&d, &id, &mount_cap("xfs"), "stage an ext4 volume as xfs").await;
    assert_stage_refused(
        &d,
        &id,
        &mount_cap("btrfs"),
        "stage an ext4 volume as btrfs",
    )
    .await;

    // Clean up whatever the refused stages attached, then check the files with ext4.
    d.unstage(&id).await;
    d.stage(&id, &ext4).await;
    assert_eq!(
        mount_at(&d.staging_path(&id)).expect("staged").fs_type,
        "ext4"
    );
    let target = d.publish(&id, &ext4, "t2", false).await;
    verify_files(&target, 41);
    d.unpublish(&id, &target).await;
    d.unstage(&id).await;
    d.delete(&id).await;
    d.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn staging_block_data_as_filesystem_fails_and_keeps_data() {
    // Raw data at the start of the device is no filesystem, but it is not blank either.
    let d = Driver::start().await;
    let block = block_cap();
    let vol = d
        .create_with(crate::requests::create_request(
            "pvc-raw-data",
            16 * MIB,
            vec![block.clone(), mount_cap("ext4")],
        ))
        .await;
    let id = vol.volume_id;
    d.stage(&id, &block).await;
    let target = d.publish(&id, &block, "blk", false).await;
    write_block(&target, 51);
    d.unpublish(&id, &target).await;
    d.unstage(&id).await;

    assert_stage_refused(&d, &id, &mount_cap("ext4"), "stage raw block data as ext4").await;

    d.unstage(&id).await;
    d.stage(&id, &block).await;
    let target = d.publish(&id, &block, "blk2", false).await;
    verify_block(&target, 51);
    d.unpublish(&id, &target).await;
    d.unstage(&id).await;
    d.delete(&id).await;
    d.finish().await;
}
