//! The lvm backend's own behaviour, beyond the suite every backend passes: thin and linear
//! device classes, LV tags as the source of truth, extent rounding, capacity per class,
//! and what a linear class refuses.
//!
//! These need device-mapper, so they are `#[ignore]`d on the host and run inside the LVM
//! test guest (`lvm_guest::lvm_backend_in_a_guest` boots it and runs them with
//! `--include-ignored` and `FERROVOL_SANITY_BACKEND=lvm`). Each one asserts first that it
//! really runs on the lvm backend, so a stray `--ignored` run on the host fails.
//!
//! RPCs: CreateVolume (empty, from snapshot, from volume), DeleteVolume, CreateSnapshot,
//! ListVolumes, ListSnapshots, GetCapacity, ControllerExpandVolume, NodeStageVolume,
//! NodePublishVolume, NodeExpandVolume, NodeUnpublishVolume, NodeUnstageVolume.

use std::collections::{BTreeMap, HashMap};
use std::path::Path;

use ferrovol::csi::v1::{GetCapacityRequest, ListSnapshotsRequest, ListVolumesRequest};
use tonic::Code;

use crate::content::{verify_files, write_files};
use crate::harness::Driver;
use crate::host::{fs_total_bytes, mount_at, run_tool};
use crate::lvm_vg::{backend_is_lvm, TestVg};
use crate::requests::{
    create_from, create_request, expect_code, from_snapshot, from_volume, mount_cap, ok, range,
    snapshot_request, MIB,
};

const GIB: i64 = 1024 * MIB;

fn require_lvm() {
    assert!(
        backend_is_lvm(),
        "this test needs the lvm backend: it runs inside the LVM guest with FERROVOL_SANITY_BACKEND=lvm"
    );
}

fn vg(d: &Driver) -> &TestVg {
    d.vg.as_ref().expect("an lvm driver has a test VG")
}

/// `lvs` fields of one LV: (attr, size in bytes, pool, tags).
fn lv_fields(d: &Driver, name: &str) -> Option<(String, u64, String, String)> {
    let out = std::process::Command::new("lvs")
        .args([
            "--noheadings",
            "--units",
            "b",
            "--nosuffix",
            "--separator",
            "|",
        ])
        .args(["-o", "lv_attr,lv_size,pool_lv,lv_tags"])
        .arg(format!("{}/{name}", vg(d).name))
        .output()
        .expect("run lvs");
    if !out.status.success() {
        return None;
    }
    let text = String::from_utf8_lossy(&out.stdout).trim().to_owned();
    let fields: Vec<&str> = text.split('|').collect();
    match fields.as_slice() {
        [attr, size, pool, tags] => Some((
            attr.trim().to_owned(),
            size.trim().parse().expect("lv_size is a number"),
            pool.trim().to_owned(),
            tags.trim().to_owned(),
        )),
        _ => panic!("unexpected lvs line {text:?}"),
    }
}

fn class(name: &str) -> HashMap<String, String> {
    HashMap::from([("deviceClass".to_owned(), name.to_owned())])
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs device-mapper: runs inside the LVM guest (lvm_guest::lvm_backend_in_a_guest)"]
async fn thin_volumes_live_through_snapshot_restore_clone_expand_and_restart() {
    require_lvm();
    let mut d = Driver::start().await;
    let cap = mount_cap("ext4");
    let mut req = create_request("pvc-lvm-origin", 64 * MIB, vec![cap.clone()]);
    req.parameters = HashMap::from([
        ("csi.storage.k8s.io/pvc/name".to_owned(), "data".to_owned()),
        (
            "csi.storage.k8s.io/pvc/namespace".to_owned(),
            "team-a".to_owned(),
        ),
    ]);
    let origin = d.create_with(req.clone()).await;
    let id = origin.volume_id.clone();
    let (attr, size, pool, tags) = lv_fields(&d, &id).expect("the volume is an LV");
    assert!(attr.starts_with('V'), "a thin LV, got attr {attr}");
    assert_eq!(pool, "pool");
    assert_eq!(size, 64 << 20);
    assert!(
        tags.contains("fv.kind=volume") && tags.contains("fv.m.00="),
        "tags {tags}"
    );

    // Stage, publish, write.
    d.stage(&id, &cap).await;
    let target = d.publish(&id, &cap, "origin", false).await;
    write_files(&target, 501);
    run_tool("sync", &[] as &[&str]);

    // A thin snapshot of the mounted volume: its own LV, activation-skipped.
    let snap = d.snapshot("snap-lvm", &id).await;
    let (snap_attr, _, snap_pool, snap_tags) =
        lv_fields(&d, &snap.snapshot_id).expect("the snapshot is an LV");
    assert!(
        snap_attr.starts_with('V') && snap_attr.ends_with('k'),
        "attr {snap_attr}"
    );
    assert_eq!(snap_pool, "pool");
    assert!(snap_tags.contains("fv.kind=snapshot"), "tags {snap_tags}");

    // Data written after the snapshot must not reach the restore.
    write_files(&target, 502);

    // Restore into a bigger volume and clone the origin.
    let restored = d
        .create_with(create_from(
            "pvc-lvm-restored",
            128 * MIB,
            cap.clone(),
            from_snapshot(&snap.snapshot_id),
        ))
        .await;
    assert_eq!(restored.capacity_bytes, 128 * MIB);
    let clone = d
        .create_with(create_from(
            "pvc-lvm-clone",
            64 * MIB,
            cap.clone(),
            from_volume(&id),
        ))
        .await;
    for (volume, seed, label) in [(&restored, 501, "restored"), (&clone, 502, "clone")] {
        let staging = d.stage(&volume.volume_id, &cap).await;
        // The restored filesystem grew to its bigger device at stage.
        if label == "restored" {
            assert!(
                fs_total_bytes(&staging) > 100 << 20,
                "restored fs was not grown"
            );
        }
        let t = d.publish(&volume.volume_id, &cap, label, false).await;
        verify_files(&t, seed);
        d.unpublish(&volume.volume_id, &t).await;
        d.unstage(&volume.volume_id).await;
    }

    // Online expansion: the LV grows (controller), then the mounted ext4 (node).
    let grown = d.expand(&id, 256 * MIB).await;
    assert_eq!(grown.capacity_bytes, 256 * MIB);
    assert_eq!(lv_fields(&d, &id).expect("LV").1, 256 << 20);
    d.node_expand(&id, &target, &cap, 256 * MIB).await;
    assert!(
        fs_total_bytes(&target) > 200 << 20,
        "the mounted ext4 did not grow online"
    );
    verify_files(&target, 502);

    // An empty state directory: every record comes back from the LV tags.
    let before_volumes = list_volumes(&d).await;
    let before_snapshots = list_snapshots(&d).await;
    d.kill_hard();
    std::fs::remove_dir_all(&d.state).expect("remove the state dir");
    d.spawn_and_connect().await;
    assert_eq!(list_volumes(&d).await, before_volumes);
    assert_eq!(list_snapshots(&d).await, before_snapshots);
    // The restored record still answers a retried CreateVolume by name, and knows its
    // parameters: other parameters are ALREADY_EXISTS.
    let again = d.create_with(req.clone()).await;
    assert_eq!(again.volume_id, id);
    let mut other = req.clone();
    other
        .parameters
        .insert("deviceClass".into(), "linear".into());
    expect_code(
        d.controller().create_volume(other).await,
        Code::AlreadyExists,
        "CreateVolume with other parameters after the restart",
    );
    // The staged volume is still usable and comes apart cleanly.
    verify_files(&target, 502);
    d.unpublish(&id, &target).await;
    d.unstage(&id).await;
    for volume in [&restored.volume_id, &clone.volume_id, &id] {
        d.delete(volume).await;
        assert!(
            lv_fields(&d, volume).is_none(),
            "LV {volume} outlived DeleteVolume"
        );
    }
    d.delete_snapshot(&snap.snapshot_id).await;
    assert!(lv_fields(&d, &snap.snapshot_id).is_none());
    d.finish().await;
}

async fn list_volumes(d: &Driver) -> BTreeMap<String, (i64, HashMap<String, String>)> {
    let resp = ok(
        d.controller()
            .list_volumes(ListVolumesRequest::default())
            .await,
        "ListVolumes",
    );
    resp.entries
        .into_iter()
        .filter_map(|e| e.volume)
        .map(|v| (v.volume_id, (v.capacity_bytes, v.volume_context)))
        .collect()
}

async fn list_snapshots(d: &Driver) -> BTreeMap<String, (String, i64)> {
    let resp = ok(
        d.controller()
            .list_snapshots(ListSnapshotsRequest::default())
            .await,
        "ListSnapshots",
    );
    resp.entries
        .into_iter()
        .filter_map(|e| e.snapshot)
        .map(|s| (s.snapshot_id, (s.source_volume_id, s.size_bytes)))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs device-mapper: runs inside the LVM guest (lvm_guest::lvm_backend_in_a_guest)"]
async fn linear_class_makes_linear_lvs_and_refuses_snapshots_and_clones() {
    require_lvm();
    let d = Driver::start().await;
    let cap = mount_cap("xfs");
    let mut req = create_request("pvc-lvm-linear", 320 * MIB, vec![cap.clone()]);
    req.parameters = class("linear");
    let vol = d.create_with(req).await;
    let (attr, size, pool, _) = lv_fields(&d, &vol.volume_id).expect("an LV");
    assert!(attr.starts_with('-'), "a linear LV, got attr {attr}");
    assert!(pool.is_empty());
    assert_eq!(size, 320 << 20);

    let target = {
        d.stage(&vol.volume_id, &cap).await;
        d.publish(&vol.volume_id, &cap, "linear", false).await
    };
    write_files(&target, 511);
    let before = fs_total_bytes(&target);
    d.expand(&vol.volume_id, 512 * MIB).await;
    assert_eq!(lv_fields(&d, &vol.volume_id).expect("LV").1, 512 << 20);
    d.node_expand(&vol.volume_id, &target, &cap, 512 * MIB)
        .await;
    // XFS keeps its log and metadata out of the total: compare the growth, 192 MiB.
    let after = fs_total_bytes(&target);
    assert!(
        after >= before + (180 << 20),
        "xfs did not grow online: {before} -> {after} bytes"
    );
    verify_files(&target, 511);

    let refused = expect_code(
        d.controller()
            .create_snapshot(snapshot_request("snap-linear", &vol.volume_id))
            .await,
        Code::FailedPrecondition,
        "CreateSnapshot of a linear volume",
    );
    assert!(
        refused.message().contains("linear"),
        "{}",
        refused.message()
    );
    let mut clone = create_from(
        "pvc-linear-clone",
        512 * MIB,
        cap.clone(),
        from_volume(&vol.volume_id),
    );
    clone.parameters = class("linear");
    let refused = expect_code(
        d.controller().create_volume(clone).await,
        Code::FailedPrecondition,
        "a clone into a linear class",
    );
    assert!(
        refused.message().contains("linear"),
        "{}",
        refused.message()
    );

    d.unpublish(&vol.volume_id, &target).await;
    d.unstage(&vol.volume_id).await;
    assert!(mount_at(Path::new(&target)).is_none());
    d.delete(&vol.volume_id).await;
    assert!(lv_fields(&d, &vol.volume_id).is_none());
    d.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs device-mapper: runs inside the LVM guest (lvm_guest::lvm_backend_in_a_guest)"]
async fn capacity_rounding_and_classes() {
    require_lvm();
    let d = Driver::start().await;
    let cap = mount_cap("ext4");
    let capacity = |params: HashMap<String, String>| {
        let mut controller = d.controller();
        async move {
            ok(
                controller
                    .get_capacity(GetCapacityRequest {
                        parameters: params,
                        ..Default::default()
                    })
                    .await,
                "GetCapacity",
            )
            .available_capacity
        }
    };
    // The thin class offers 4 GiB pool x ratio 4; the linear class the VG's free space.
    assert_eq!(capacity(HashMap::new()).await, 16 * GIB);
    assert_eq!(capacity(class("thin")).await, 16 * GIB);
    let linear_free = capacity(class("linear")).await;
    assert!(
        linear_free > 3 * GIB && linear_free < 4 * GIB,
        "linear free {linear_free}"
    );
    expect_code(
        d.controller()
            .get_capacity(GetCapacityRequest {
                parameters: class("fast"),
                ..Default::default()
            })
            .await,
        Code::InvalidArgument,
        "GetCapacity for an unknown device class",
    );

    // Sizes round up to the 4 MiB extent; a limit below the rounded size is OUT_OF_RANGE.
    let mut odd = create_request("pvc-lvm-odd", 17 * MIB + 1, vec![cap.clone()]);
    let vol = d.create_with(odd.clone()).await;
    assert_eq!(vol.capacity_bytes, 20 * MIB);
    assert_eq!(lv_fields(&d, &vol.volume_id).expect("LV").1, 20 << 20);
    assert_eq!(capacity(HashMap::new()).await, 16 * GIB - 20 * MIB);
    odd.name = "pvc-lvm-odd-limited".into();
    odd.capacity_range = range(17 * MIB + 1, 18 * MIB);
    expect_code(
        d.controller().create_volume(odd).await,
        Code::OutOfRange,
        "a limit below the extent-rounded size",
    );

    // More than a class can promise: RESOURCE_EXHAUSTED, and nothing is left behind.
    let mut huge = create_request("pvc-lvm-huge", 17 * GIB, vec![cap.clone()]);
    expect_code(
        d.controller().create_volume(huge.clone()).await,
        Code::ResourceExhausted,
        "a thin volume over the overprovisioned pool",
    );
    huge.name = "pvc-lvm-huge-linear".into();
    huge.parameters = class("linear");
    huge.capacity_range = range(5 * GIB, 0);
    expect_code(
        d.controller().create_volume(huge).await,
        Code::ResourceExhausted,
        "a linear volume over the VG's free space",
    );
    let mut unknown = create_request("pvc-lvm-unknown", 16 * MIB, vec![cap.clone()]);
    unknown.parameters = class("fast");
    expect_code(
        d.controller().create_volume(unknown).await,
        Code::InvalidArgument,
        "an unknown device class",
    );
    assert_eq!(
        list_volumes(&d).await.len(),
        1,
        "a refused create left a volume"
    );
    d.delete(&vol.volume_id).await;
    assert_eq!(capacity(HashMap::new()).await, 16 * GIB);
    d.finish().await;
}
