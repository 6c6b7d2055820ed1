//! Volume expansion: ControllerExpandVolume (sizes, rounding, idempotency, the error code of
//! each bad input, the backing file and the reported capacity) and NodeExpandVolume (bad
//! input; online growth of a published ext4, xfs and block volume; growth after an offline
//! controller expansion).
//!
//! Checked on the host: the backing file's length, the loop device's size, `statvfs(3)` of
//! the published target, and the files written before the expansion.

use std::fs::OpenOptions;
use std::os::unix::fs::FileExt;
use std::path::Path;

use ferrovol::csi::v1::volume_usage::Unit;
use ferrovol::csi::v1::{
    ControllerExpandVolumeRequest, ControllerGetVolumeRequest, ListVolumesRequest, VolumeCapability,
};
use tonic::Code;

use crate::content::{block_size, pattern, verify_block, verify_files, write_block, write_files};
use crate::harness::Driver;
use crate::host::{fs_available_bytes, fs_total_bytes, has_effective_cap, CAP_SYS_RESOURCE};
use crate::node::stats;
use crate::requests::{
    block_cap, expect_code, mount_cap, ok, range, CodeChecks, MALFORMED_VOLUME_ID, MIB, MIN_XFS,
    UNKNOWN_VOLUME_ID,
};

/// The capacity ControllerGetVolume and ListVolumes report for a volume; they must agree.
async fn reported_capacity(d: &Driver, volume_id: &str) -> i64 {
    let from_get = ok(
        d.controller()
            .controller_get_volume(ControllerGetVolumeRequest {
                volume_id: volume_id.to_owned(),
            })
            .await,
        "ControllerGetVolume",
    )
    .volume
    .expect("volume")
    .capacity_bytes;
    let listed = ok(
        d.controller()
            .list_volumes(ListVolumesRequest::default())
            .await,
        "ListVolumes",
    );
    let from_list = listed
        .entries
        .iter()
        .filter_map(|e| e.volume.as_ref())
        .find(|v| v.volume_id == volume_id)
        .expect("the volume is listed")
        .capacity_bytes;
    assert_eq!(
        from_get, from_list,
        "ControllerGetVolume and ListVolumes disagree"
    );
    from_get
}

/// Length of a volume's backing file.
fn backing_len(d: &Driver, volume_id: &str) -> i64 {
    let len = d.storage_size(volume_id).expect("the volume has storage");
    i64::try_from(len).expect("fits")
}

/// Size of the loop device of a staged volume.
fn loop_size(d: &Driver, volume_id: &str) -> i64 {
    let lo = d
        .loop_of(volume_id)
        .expect("staged volume has a loop device");
    i64::try_from(block_size(&lo.device)).expect("fits")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn controller_expand_volume() {
    let d = Driver::start().await;
    let mut checks = CodeChecks::new();
    let vol = d.create("pvc-grow", 32 * MIB, mount_cap("ext4")).await;
    let id = vol.volume_id.clone();
    let req = |id: &str, required: i64, limit: i64| ControllerExpandVolumeRequest {
        volume_id: id.to_owned(),
        capacity_range: range(required, limit),
        volume_capability: Some(mount_cap("ext4")),
        ..Default::default()
    };

    checks.code(
        d.controller()
            .controller_expand_volume(req("", 64 * MIB, 0))
            .await,
        Code::InvalidArgument,
        "ControllerExpandVolume empty volume id",
    );
    for unknown in [UNKNOWN_VOLUME_ID, MALFORMED_VOLUME_ID] {
        checks.code(
            d.controller()
                .controller_expand_volume(req(unknown, 64 * MIB, 0))
                .await,
            Code::NotFound,
            &format!("ControllerExpandVolume unknown volume {unknown}"),
        );
    }
    let mut no_range = req(&id, 0, 0);
    no_range.capacity_range = None;
    checks.code(
        d.controller().controller_expand_volume(no_range).await,
        Code::InvalidArgument,
        "ControllerExpandVolume without capacity_range",
    );
    checks.code(
        d.controller()
            .controller_expand_volume(req(&id, 0, 0))
            .await,
        Code::InvalidArgument,
        "ControllerExpandVolume with an empty capacity_range",
    );
    // A limit below the current size demands a shrink, which is not supported.
    checks.code(
        d.controller()
            .controller_expand_volume(req(&id, 16 * MIB, 24 * MIB))
            .await,
        Code::OutOfRange,
        "ControllerExpandVolume with limit_bytes below the current 32 MiB",
    );
    assert_eq!(
        backing_len(&d, &id),
        32 * MIB,
        "a refused shrink changed the file"
    );
    assert_eq!(reported_capacity(&d, &id).await, 32 * MIB);

    // A volume already at least as large as required: the spec's "SHOULD reply 0 OK",
    // with the volume left as it is.
    let smaller = ok(
        d.controller()
            .controller_expand_volume(req(&id, 16 * MIB, 0))
            .await,
        "ControllerExpandVolume to less than the current 32 MiB, no limit",
    );
    assert_eq!(
        smaller.capacity_bytes,
        32 * MIB,
        "capacity after a smaller request"
    );
    assert_eq!(
        backing_len(&d, &id),
        32 * MIB,
        "a smaller request changed the file"
    );

    // The current size again: nothing to do, and OK.
    let same = ok(
        d.controller()
            .controller_expand_volume(req(&id, 32 * MIB, 0))
            .await,
        "ControllerExpandVolume to the current size",
    );
    assert_eq!(same.capacity_bytes, 32 * MIB);

    // Growth rounds up to whole MiB, and the node must follow.
    let grown = ok(
        d.controller()
            .controller_expand_volume(req(&id, 40 * MIB + 1, 0))
            .await,
        "ControllerExpandVolume to 40 MiB + 1",
    );
    assert_eq!(
        grown.capacity_bytes,
        d.rounded(41 * MIB),
        "40 MiB + 1 rounds up to 41 MiB"
    );
    assert!(
        grown.node_expansion_required,
        "node_expansion_required: {grown:?}"
    );
    assert_eq!(
        backing_len(&d, &id),
        d.rounded(41 * MIB),
        "backing file after expansion"
    );
    assert_eq!(reported_capacity(&d, &id).await, d.rounded(41 * MIB));

    // Retries of the same expansion, with and without a limit it fits, are OK.
    for (required, limit) in [(40 * MIB + 1, 0), (41 * MIB, 0), (40 * MIB, 64 * MIB)] {
        let again = ok(
            d.controller()
                .controller_expand_volume(req(&id, required, limit))
                .await,
            &format!("ControllerExpandVolume again, required {required} limit {limit}"),
        );
        assert_eq!(
            again.capacity_bytes,
            d.rounded(41 * MIB),
            "required {required} limit {limit}"
        );
    }
    checks.code(
        d.controller()
            .controller_expand_volume(req(&id, 32 * MIB, 32 * MIB))
            .await,
        Code::OutOfRange,
        "ControllerExpandVolume back to exactly 32 MiB after growing to 41 MiB",
    );
    assert_eq!(backing_len(&d, &id), d.rounded(41 * MIB));

    // Block volumes grow the same way.
    let blk = d.create("pvc-grow-block", 16 * MIB, block_cap()).await;
    let grown = d.expand(&blk.volume_id, 48 * MIB).await;
    assert_eq!(grown.capacity_bytes, 48 * MIB);
    assert_eq!(backing_len(&d, &blk.volume_id), 48 * MIB);
    assert_eq!(reported_capacity(&d, &blk.volume_id).await, 48 * MIB);

    d.delete(&id).await;
    d.delete(&blk.volume_id).await;
    checks.finish();
    d.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn node_expand_volume_argument_errors() {
    let d = Driver::start().await;
    let mut checks = CodeChecks::new();
    let cap = mount_cap("ext4");
    let a = d.create("pvc-nexp-a", 16 * MIB, cap.clone()).await;
    let b = d.create("pvc-nexp-b", 16 * MIB, cap.clone()).await;
    let unstaged = d.create("pvc-nexp-c", 16 * MIB, cap.clone()).await;
    let (a, b) = (a.volume_id, b.volume_id);
    d.stage(&a, &cap).await;
    d.stage(&b, &cap).await;
    let ta = d.publish(&a, &cap, "a", false).await;
    let tb = d.publish(&b, &cap, "b", false).await;

    let mut r = d.node_expand_request(&a, &ta, &cap, 16 * MIB);
    r.volume_id = String::new();
    checks.code(
        d.node().node_expand_volume(r).await,
        Code::InvalidArgument,
        "NodeExpandVolume empty volume id",
    );
    let mut r = d.node_expand_request(&a, &ta, &cap, 16 * MIB);
    r.volume_path = String::new();
    checks.code(
        d.node().node_expand_volume(r).await,
        Code::InvalidArgument,
        "NodeExpandVolume empty volume path",
    );
    let missing = d.root.join("does-not-exist");
    let plain_dir = d.root.join("targets");
    let never_published = d.target_path("c");
    let cases: Vec<(&str, &str, &Path)> = vec![
        ("an unknown volume id", UNKNOWN_VOLUME_ID, &ta),
        ("a malformed volume id", MALFORMED_VOLUME_ID, &ta),
        ("another volume's target", &a, &tb),
        ("a directory that is no mount", &a, &plain_dir),
        ("a missing path", &a, &missing),
        (
            "a volume that is not staged",
            &unstaged.volume_id,
            &never_published,
        ),
    ];
    for (what, id, path) in cases {
        checks.code(
            d.node()
                .node_expand_volume(d.node_expand_request(id, path, &cap, 16 * MIB))
                .await,
            Code::NotFound,
            &format!("NodeExpandVolume with {what}"),
        );
    }
    // Nothing to grow: OK (the filesystem already fills its device).
    checks.ok(
        d.node()
            .node_expand_volume(d.node_expand_request(&a, &ta, &cap, 16 * MIB))
            .await,
        "NodeExpandVolume of a volume with nothing to grow",
    );
    // The kubelet may leave capacity_range out.
    let mut r = d.node_expand_request(&a, &ta, &cap, 0);
    r.capacity_range = None;
    checks.ok(
        d.node().node_expand_volume(r).await,
        "NodeExpandVolume without capacity_range",
    );

    for (id, target) in [(&a, &ta), (&b, &tb)] {
        d.unpublish(id, target).await;
        d.unstage(id).await;
        d.delete(id).await;
    }
    d.delete(&unstaged.volume_id).await;
    checks.finish();
    d.finish().await;
}

/// Grows a published `fs_type` volume from `from` to `to` bytes while it is mounted and
/// checks the filesystem grew by at least `min_growth` bytes, kept its files and takes new
/// ones; then that the growth survives unstage and stage.
///
/// The kernel grows a mounted ext4 only for a process with `CAP_SYS_RESOURCE`. On a host
/// that withholds it (some containers), the spec's answer is FAILED_PRECONDITION (the
/// filesystem cannot grow while staged): then the device must have grown, and the
/// filesystem must be grown by the next NodeStageVolume, after which NodeExpandVolume has
/// nothing left to do and answers OK. That path is checked instead; it is no skip.
async fn online_expansion(fs_type: &str, from: i64, to: i64, min_growth: u64) {
    let d = Driver::start().await;
    let cap = mount_cap(fs_type);
    let vol = d
        .create(&format!("pvc-online-{fs_type}"), from, cap.clone())
        .await;
    let id = vol.volume_id.clone();
    d.stage(&id, &cap).await;
    let target = d.publish(&id, &cap, "t", false).await;
    write_files(&target, 61);
    let total_before = fs_total_bytes(&target);

    let grown = d.expand(&id, to).await;
    assert_eq!(grown.capacity_bytes, to, "ControllerExpandVolume capacity");
    assert!(
        grown.node_expansion_required,
        "node_expansion_required: {grown:?}"
    );
    assert_eq!(
        backing_len(&d, &id),
        to,
        "backing file after ControllerExpandVolume"
    );

    let mut target = target;
    if fs_type == "ext4" && !has_effective_cap(CAP_SYS_RESOURCE) {
        eprintln!("no CAP_SYS_RESOURCE: checking ext4 growth at the next stage instead of online");
        expect_code(
            d.node()
                .node_expand_volume(d.node_expand_request(&id, &target, &cap, to))
                .await,
            Code::FailedPrecondition,
            "NodeExpandVolume of a mounted ext4 without CAP_SYS_RESOURCE",
        );
        assert_eq!(
            loop_size(&d, &id),
            to,
            "loop device size after the refused growth"
        );
        verify_files(&target, 61);
        d.unpublish(&id, &target).await;
        d.unstage(&id).await;
        d.stage(&id, &cap).await;
        target = d.publish(&id, &cap, "t", false).await;
        let restaged = fs_total_bytes(&target);
        assert!(
            restaged >= total_before + min_growth,
            "NodeStageVolume did not grow the ext4 that could not grow online: {total_before} \
             bytes before, {restaged} after restaging"
        );
    }
    let resp = d.node_expand(&id, &target, &cap, to).await;
    assert_eq!(resp.capacity_bytes, to, "NodeExpandVolume capacity_bytes");
    assert_eq!(
        loop_size(&d, &id),
        to,
        "loop device size after NodeExpandVolume"
    );
    let total_after = fs_total_bytes(&target);
    assert!(
        total_after >= total_before + min_growth,
        "{fs_type} did not grow online: {total_before} bytes before, {total_after} after \
         (want at least {min_growth} more)"
    );
    assert!(
        fs_available_bytes(&target) > total_before,
        "the new space is not available: {} bytes free, the old filesystem had {total_before}",
        fs_available_bytes(&target)
    );
    let st = stats(&d, &id, &target).await;
    let bytes = st
        .usage
        .iter()
        .find(|u| u.unit == Unit::Bytes as i32)
        .expect("BYTES usage");
    assert!(
        u64::try_from(bytes.total).expect("positive") >= total_before + min_growth,
        "NodeGetVolumeStats after growth: {bytes:?}"
    );

    // The data before is intact and the volume still takes writes.
    verify_files(&target, 61);
    write_files(&target.join("after"), 62);
    verify_files(&target.join("after"), 62);

    // Once more: nothing left to do, same answer.
    let again = d.node_expand(&id, &target, &cap, to).await;
    assert_eq!(again.capacity_bytes, to, "second NodeExpandVolume");
    assert_eq!(
        fs_total_bytes(&target),
        total_after,
        "second NodeExpandVolume"
    );

    // The growth is in the filesystem, not in the mount: it survives unstage and stage.
    d.unpublish(&id, &target).await;
    d.unstage(&id).await;
    d.stage(&id, &cap).await;
    let target = d.publish(&id, &cap, "t2", false).await;
    assert_eq!(fs_total_bytes(&target), total_after, "size after restaging");
    verify_files(&target, 61);
    verify_files(&target.join("after"), 62);
    d.unpublish(&id, &target).await;
    d.unstage(&id).await;
    d.delete(&id).await;
    d.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn online_expansion_ext4_64_to_128_mib() {
    online_expansion("ext4", 64 * MIB, 128 * MIB, 56 << 20).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn online_expansion_xfs_300_to_400_mib() {
    online_expansion("xfs", MIN_XFS, 400 * MIB, 90 << 20).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn online_expansion_block() {
    let d = Driver::start().await;
    let cap = block_cap();
    let vol = d.create("pvc-online-block", 16 * MIB, cap.clone()).await;
    let id = vol.volume_id.clone();
    d.stage(&id, &cap).await;
    let target = d.publish(&id, &cap, "blk", false).await;
    write_block(&target, 63);

    let grown = d.expand(&id, 32 * MIB).await;
    assert_eq!(grown.capacity_bytes, 32 * MIB);
    let resp = d.node_expand(&id, &target, &cap, 32 * MIB).await;
    assert_eq!(
        resp.capacity_bytes,
        32 * MIB,
        "NodeExpandVolume capacity_bytes"
    );
    assert_eq!(
        block_size(&target),
        32 << 20,
        "published block target size after NodeExpandVolume"
    );
    assert_eq!(loop_size(&d, &id), 32 * MIB);
    verify_block(&target, 63);

    // The new range is usable: write past the old end and read it back.
    let chunk = pattern(64, 1 << 20);
    let f = OpenOptions::new()
        .read(true)
        .write(true)
        .open(&target)
        .expect("open the block target");
    f.write_all_at(&chunk, 24 << 20)
        .expect("write past the old end");
    f.sync_all().expect("fsync the block target");
    let mut back = vec![0u8; chunk.len()];
    f.read_exact_at(&mut back, 24 << 20)
        .expect("read past the old end");
    assert!(back == chunk, "data past the old end did not read back");
    drop(f);

    let again = d.node_expand(&id, &target, &cap, 32 * MIB).await;
    assert_eq!(again.capacity_bytes, 32 * MIB, "second NodeExpandVolume");
    let st = stats(&d, &id, &target).await;
    let bytes = st
        .usage
        .iter()
        .find(|u| u.unit == Unit::Bytes as i32)
        .expect("BYTES usage");
    assert_eq!(bytes.total, 32 * MIB, "block stats after growth: {bytes:?}");

    d.unpublish(&id, &target).await;
    d.unstage(&id).await;
    d.delete(&id).await;
    d.finish().await;
}

/// What the kubelet does after an expansion while no pod used the volume: the controller
/// grew the file offline, then the node stages, publishes and calls NodeExpandVolume.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn offline_controller_expansion_then_node_expand_ext4() {
    let d = Driver::start().await;
    let cap: VolumeCapability = mount_cap("ext4");
    let vol = d.create("pvc-offline-grow", 32 * MIB, cap.clone()).await;
    let id = vol.volume_id.clone();
    d.stage(&id, &cap).await;
    let target = d.publish(&id, &cap, "t", false).await;
    write_files(&target, 65);
    let total_before = fs_total_bytes(&target);
    d.unpublish(&id, &target).await;
    d.unstage(&id).await;

    let grown = d.expand(&id, 64 * MIB).await;
    assert_eq!(grown.capacity_bytes, 64 * MIB);
    d.stage(&id, &cap).await;
    assert_eq!(
        loop_size(&d, &id),
        64 * MIB,
        "loop device of the grown file"
    );
    let target = d.publish(&id, &cap, "t", false).await;
    let resp = d.node_expand(&id, &target, &cap, 64 * MIB).await;
    assert_eq!(resp.capacity_bytes, 64 * MIB);
    let total_after = fs_total_bytes(&target);
    assert!(
        total_after >= total_before + (28 << 20),
        "ext4 did not grow: {total_before} bytes before, {total_after} after"
    );
    verify_files(&target, 65);
    d.unpublish(&id, &target).await;
    d.unstage(&id).await;
    d.delete(&id).await;
    d.finish().await;
}
