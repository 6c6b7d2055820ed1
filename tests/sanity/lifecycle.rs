//! Node lifecycles with real loop devices and mounts: NodeStageVolume, NodePublishVolume,
//! NodeGetVolumeStats, NodeUnpublishVolume, NodeUnstageVolume for ext4, xfs, btrfs, the
//! default filesystem and block access; the second-publish rules per access mode; read-only
//! publishing; DeleteVolume and NodeUnstageVolume refused while the volume is in use.
//!
//! Checked in `/proc/self/mountinfo` and `/sys/block/loop*`: one loop device per staged
//! volume, one mount per staging path and target, nothing left after unstage.

use std::fs::{self, OpenOptions};
use std::os::unix::fs::FileTypeExt;

use ferrovol::csi::v1::volume_capability::access_mode::Mode;
use ferrovol::csi::v1::volume_usage::Unit;
use ferrovol::csi::v1::VolumeCapability;
use tonic::Code;

use crate::content::{block_size, verify_block, verify_files, write_block, write_files};
use crate::harness::{Driver, Options};
use crate::host::{assert_mount_of, mount_at, mount_count_at, rdev_of};
use crate::node::{
    assert_delete_refused_while_staged, assert_unstage_refused_while_published, stats,
};
use crate::requests::{
    block_cap_mode, expect_code, mount_cap, mount_cap_full, mount_cap_mode, ok, MIB, MIN_BTRFS,
    MIN_XFS,
};

/// The whole node lifecycle of a mount volume with real mounts, and its checks.
async fn mount_lifecycle(fs_type: &str, size: i64, want_fs: &str) {
    let d = Driver::start().await;
    // SINGLE_NODE_MULTI_WRITER: several targets on this node are allowed.
    let flags: &[&str] = if fs_type == "ext4" { &["noatime"] } else { &[] };
    let cap = mount_cap_full(fs_type, flags, Mode::SingleNodeMultiWriter);
    let vol = d
        .create(&format!("pvc-life-{want_fs}"), size, cap.clone())
        .await;
    let id = vol.volume_id.clone();

    // Stage: one loop device on the backing file, a mount of it at the staging path.
    let staging = d.stage(&id, &cap).await;
    let lo = d.loop_of(&id).expect("staged volume has a loop device");
    let m = mount_at(&staging).expect("staging path is a mount");
    assert_eq!(m.fs_type, want_fs, "staging mount fs type");
    assert_mount_of(&m, &lo, "staging mount");
    d.stage(&id, &cap).await;
    assert_eq!(mount_count_at(&staging), 1, "second stage stacked a mount");
    assert_eq!(
        d.loop_of(&id).expect("loop").device,
        lo.device,
        "second stage changed loop"
    );
    // Staged already, with another capability: incompatible.
    let other_fs = if want_fs == "xfs" { "ext4" } else { "xfs" };
    for (what, other) in [
        (
            "another fs_type",
            mount_cap_mode(other_fs, Mode::SingleNodeMultiWriter),
        ),
        ("block access", block_cap_mode(Mode::SingleNodeMultiWriter)),
    ] {
        expect_code(
            d.node()
                .node_stage_volume(d.stage_request(&id, &other))
                .await,
            Code::AlreadyExists,
            &format!("NodeStageVolume of a staged {want_fs} volume with {what}"),
        );
    }
    assert_eq!(
        mount_count_at(&staging),
        1,
        "incompatible stage changed the staging mount"
    );
    assert_delete_refused_while_staged(&d, &id).await;

    // Publish read-write, twice; the target directory is created by the driver.
    let rw = d.publish(&id, &cap, "rw", false).await;
    assert!(rw.is_dir(), "mount target is a directory");
    let m = mount_at(&rw).expect("target is a mount");
    assert_eq!(m.fs_type, want_fs);
    assert_mount_of(&m, &lo, "target mount");
    assert!(
        !m.is_read_only(),
        "read-write target mounted ro: {:?}",
        m.options
    );
    if fs_type == "ext4" {
        assert!(
            m.options.iter().any(|o| o == "noatime"),
            "mount flag noatime not applied: {:?}",
            m.options
        );
    }
    d.publish(&id, &cap, "rw", false).await;
    assert_eq!(mount_count_at(&rw), 1, "second publish stacked a mount");
    write_files(&rw, 11);
    verify_files(&staging, 11);

    // Publish read-only at a second target: readable, not writable.
    let ro = d.publish(&id, &cap, "ro", true).await;
    let m = mount_at(&ro).expect("read-only target is a mount");
    assert!(
        m.is_read_only(),
        "readonly target mounted rw: {:?}",
        m.options
    );
    verify_files(&ro, 11);
    let err = fs::write(ro.join("forbidden.txt"), b"x").expect_err("write to a readonly target");
    assert_eq!(
        err.raw_os_error(),
        Some(libc::EROFS),
        "write to a readonly target: {err}"
    );

    // Stats of a mounted volume.
    let st = stats(&d, &id, &rw).await;
    let bytes = st
        .usage
        .iter()
        .find(|u| u.unit == Unit::Bytes as i32)
        .expect("BYTES usage");
    assert!(
        bytes.total > 0 && bytes.available <= bytes.total,
        "bytes {bytes:?}"
    );
    assert!(
        bytes.used >= 0 && bytes.used <= bytes.total,
        "bytes {bytes:?}"
    );
    assert!(
        bytes.total <= vol.capacity_bytes,
        "fs bigger than the volume: {bytes:?}"
    );
    let inodes = st.usage.iter().find(|u| u.unit == Unit::Inodes as i32);
    if want_fs == "btrfs" {
        // btrfs allocates inodes dynamically and reports no inode counts; the spec lets a
        // plugin omit INODES then, so only consistency is checked.
        if let Some(inodes) = inodes {
            assert!(inodes.available <= inodes.total, "inodes {inodes:?}");
        }
    } else {
        let inodes = inodes.expect("INODES usage");
        assert!(
            inodes.total > 0 && inodes.available <= inodes.total,
            "inodes {inodes:?}"
        );
    }
    let cond = st.volume_condition.expect("volume_condition");
    assert!(!cond.abnormal, "healthy volume abnormal: {cond:?}");

    // Teardown order is enforced, every step is idempotent.
    assert_unstage_refused_while_published(&d, &id).await;
    assert!(
        mount_at(&staging).is_some(),
        "refused unstage unmounted the staging path"
    );
    d.unpublish(&id, &rw).await;
    assert!(
        !rw.exists(),
        "target {} not removed by unpublish",
        rw.display()
    );
    d.unpublish(&id, &rw).await;
    assert_unstage_refused_while_published(&d, &id).await;
    d.unpublish(&id, &ro).await;
    assert!(
        !ro.exists(),
        "target {} not removed by unpublish",
        ro.display()
    );
    d.unstage(&id).await;
    assert!(mount_at(&staging).is_none(), "staging path still mounted");
    assert!(
        d.loop_of(&id).is_none(),
        "loop device still attached after unstage"
    );
    d.unstage(&id).await;
    d.delete(&id).await;
    d.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn node_lifecycle_ext4() {
    mount_lifecycle("ext4", 32 * MIB, "ext4").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn node_lifecycle_xfs() {
    mount_lifecycle("xfs", MIN_XFS, "xfs").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn node_lifecycle_btrfs() {
    mount_lifecycle("btrfs", MIN_BTRFS, "btrfs").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn node_lifecycle_default_fs_is_ext4() {
    mount_lifecycle("", 16 * MIB, "ext4").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn node_lifecycle_block() {
    let d = Driver::start().await;
    // SINGLE_NODE_MULTI_WRITER: several targets on this node are allowed.
    let cap = block_cap_mode(Mode::SingleNodeMultiWriter);
    let vol = d.create("pvc-life-block", 32 * MIB, cap.clone()).await;
    let id = vol.volume_id.clone();

    let staging = d.stage(&id, &cap).await;
    let lo = d
        .loop_of(&id)
        .expect("staged block volume has a loop device");
    assert!(mount_at(&staging).is_none(), "block staging mounts nothing");
    d.stage(&id, &cap).await;
    assert_eq!(
        d.loop_of(&id).expect("loop").device,
        lo.device,
        "second stage changed loop"
    );
    assert_delete_refused_while_staged(&d, &id).await;

    // The target is a file the driver creates, bind-mounted to the loop device.
    let target = d.publish(&id, &cap, "blk", false).await;
    d.publish(&id, &cap, "blk", false).await;
    assert_eq!(mount_count_at(&target), 1, "second publish stacked a mount");
    let ft = fs::metadata(&target).expect("stat target").file_type();
    assert!(
        ft.is_block_device(),
        "block target is not a block device: {ft:?}"
    );
    assert_eq!(
        rdev_of(&target),
        lo.major_minor,
        "target is the volume's loop device"
    );
    assert_eq!(
        block_size(&target),
        u64::try_from(vol.capacity_bytes).expect("positive"),
        "device size"
    );
    write_block(&target, 21);
    verify_block(&target, 21);

    let ro = d.publish(&id, &cap, "blk-ro", true).await;
    assert_eq!(rdev_of(&ro), lo.major_minor);
    verify_block(&ro, 21);

    let st = stats(&d, &id, &target).await;
    let bytes = st
        .usage
        .iter()
        .find(|u| u.unit == Unit::Bytes as i32)
        .expect("BYTES usage");
    assert_eq!(
        bytes.total, vol.capacity_bytes,
        "block stats total: {bytes:?}"
    );
    let cond = st.volume_condition.expect("volume_condition");
    assert!(!cond.abnormal, "healthy block volume abnormal: {cond:?}");

    assert_unstage_refused_while_published(&d, &id).await;
    d.unpublish(&id, &target).await;
    assert!(!target.exists(), "block target not removed");
    d.unpublish(&id, &target).await;
    d.unpublish(&id, &ro).await;
    d.unstage(&id).await;
    assert!(
        d.loop_of(&id).is_none(),
        "loop device still attached after unstage"
    );
    d.unstage(&id).await;
    d.delete(&id).await;
    d.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn node_publish_same_target_with_other_readonly_is_already_exists() {
    let d = Driver::start().await;
    let cap = mount_cap("ext4");
    let vol = d.create("pvc-ro-conflict", 16 * MIB, cap.clone()).await;
    let id = vol.volume_id;
    d.stage(&id, &cap).await;
    let target = d.publish(&id, &cap, "t", false).await;
    expect_code(
        d.node()
            .node_publish_volume(d.publish_request(&id, &cap, "t", true))
            .await,
        Code::AlreadyExists,
        "NodePublishVolume same target, readonly after read-write",
    );
    assert_eq!(mount_count_at(&target), 1);
    d.unpublish(&id, &target).await;
    d.unstage(&id).await;
    d.delete(&id).await;
    d.finish().await;
}

/// A second NodePublishVolume of a single-writer volume at another target path must be
/// refused with FAILED_PRECONDITION (the spec's second-publish table for plugins with the
/// SINGLE_NODE_MULTI_WRITER capability); the first target keeps working.
/// Publishes at "one" read-write, then tries "two" read-write and "three" read-only.
/// `read_only_allowed` says whether the mode lets a read-only target sit beside the
/// writer: SINGLE_NODE_WRITER limits only read/write publications ("published once as
/// read/write"), SINGLE_NODE_SINGLE_WRITER allows a single target of any kind.
async fn second_target_refused(mode: Mode, read_only_allowed: bool) {
    let d = Driver::start().await;
    let cap = mount_cap_mode("ext4", mode);
    let vol = d.create("pvc-single-writer", 16 * MIB, cap.clone()).await;
    let id = vol.volume_id;
    d.stage(&id, &cap).await;
    let first = d.publish(&id, &cap, "one", false).await;
    expect_code(
        d.node()
            .node_publish_volume(d.publish_request(&id, &cap, "two", false))
            .await,
        Code::FailedPrecondition,
        &format!("NodePublishVolume {mode:?} at a second read-write target"),
    );
    assert!(mount_at(&d.target_path("two")).is_none(), "two got mounted");
    let result = d
        .node()
        .node_publish_volume(d.publish_request(&id, &cap, "three", true))
        .await;
    if read_only_allowed {
        ok(result, "NodePublishVolume read-only beside the writer");
        assert!(mount_at(&d.target_path("three"))
            .expect("three mounted")
            .is_read_only());
    } else {
        expect_code(
            result,
            Code::FailedPrecondition,
            &format!("NodePublishVolume {mode:?} at a second read-only target"),
        );
        assert!(
            mount_at(&d.target_path("three")).is_none(),
            "three got mounted"
        );
    }
    d.publish(&id, &cap, "one", false).await;
    d.unpublish(&id, &first).await;
    for label in ["two", "three"] {
        d.unpublish(&id, &d.target_path(label)).await;
    }
    // With the writer gone, a new read-write target is fine again.
    let again = d.publish(&id, &cap, "two", false).await;
    d.unpublish(&id, &again).await;
    d.unstage(&id).await;
    d.delete(&id).await;
    d.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn node_publish_single_node_single_writer_refuses_second_target() {
    second_target_refused(Mode::SingleNodeSingleWriter, false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn node_publish_single_node_writer_refuses_second_writer() {
    second_target_refused(Mode::SingleNodeWriter, true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn node_publish_single_node_multi_writer_allows_second_target() {
    let d = Driver::start().await;
    let cap = mount_cap_mode("ext4", Mode::SingleNodeMultiWriter);
    let vol = d.create("pvc-multi-writer", 16 * MIB, cap.clone()).await;
    let id = vol.volume_id;
    d.stage(&id, &cap).await;
    let one = d.publish(&id, &cap, "one", false).await;
    let two = d.publish(&id, &cap, "two", false).await;
    write_files(&one, 81);
    verify_files(&two, 81);
    d.unpublish(&id, &one).await;
    d.unpublish(&id, &two).await;
    d.unstage(&id).await;
    d.delete(&id).await;
    d.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn node_readonly_capability_publishes_read_only() {
    // A SINGLE_NODE_READER_ONLY volume published with readonly set, as Kubernetes does for
    // read-only claims: even creating a file fails with EROFS.
    let d = Driver::start().await;
    let cap: VolumeCapability = mount_cap_mode("ext4", Mode::SingleNodeReaderOnly);
    let vol = d.create("pvc-reader", 16 * MIB, cap.clone()).await;
    let id = vol.volume_id;
    d.stage(&id, &cap).await;
    let target = d.publish(&id, &cap, "r", true).await;
    assert!(mount_at(&target).expect("mounted").is_read_only());
    let err = OpenOptions::new()
        .create(true)
        .truncate(true)
        .write(true)
        .open(target.join("x"))
        .expect_err("create a file on a read-only target");
    assert_eq!(err.raw_os_error(), Some(libc::EROFS), "{err}");
    d.unpublish(&id, &target).await;
    d.unstage(&id).await;
    d.delete(&id).await;
    d.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn node_default_fs_type_flag_applies_to_unspecified_fs_type() {
    let d = Driver::start_with(Options {
        default_fs_type: Some("xfs".to_owned()),
        ..Options::default()
    })
    .await;
    let cap = mount_cap("");
    let vol = d.create("pvc-default-xfs", MIN_XFS, cap.clone()).await;
    let id = vol.volume_id;
    let staging = d.stage(&id, &cap).await;
    assert_eq!(
        mount_at(&staging).expect("staged").fs_type,
        "xfs",
        "fs_type \"\" with --default-fs-type xfs"
    );
    let target = d.publish(&id, &cap, "t", false).await;
    write_files(&target, 91);
    verify_files(&target, 91);
    d.unpublish(&id, &target).await;
    d.unstage(&id).await;
    d.delete(&id).await;
    d.finish().await;
}

/// A read-only bind of a device node does not stop writes to the device, so a block
/// volume staged SINGLE_NODE_READER_ONLY gets a loop device that refuses them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reader_only_block_volume_refuses_writes() {
    use std::io::Write;
    let d = Driver::start().await;
    let cap = block_cap_mode(Mode::SingleNodeReaderOnly);
    let vol = d.create("pvc-ro-block", 16 * MIB, cap.clone()).await;
    let id = vol.volume_id;
    d.stage(&id, &cap).await;
    let target = d.publish(&id, &cap, "ro-blk", true).await;
    let err = OpenOptions::new()
        .write(true)
        .open(&target)
        .and_then(|mut f| {
            f.write_all(&[0x5a; 4096])?;
            f.sync_all()
        })
        .expect_err("write to a read-only block volume");
    assert!(
        matches!(
            err.raw_os_error(),
            Some(libc::EROFS | libc::EPERM | libc::EACCES)
        ),
        "{err}"
    );
    d.unpublish(&id, &target).await;
    d.unstage(&id).await;
    d.delete(&id).await;
    d.finish().await;
}
