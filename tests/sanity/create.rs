//! Controller service, provisioning: CreateVolume and DeleteVolume.
//!
//! Sizes (rounding, minimums per filesystem, limits), ids, topology, idempotency by name, the
//! error code for each bad input, and the backing files in the pool following the volumes.

use std::collections::HashMap;

use ferrovol::csi::v1::volume_capability::access_mode::Mode;
use ferrovol::csi::v1::{
    ControllerGetVolumeRequest, CreateVolumeRequest, DeleteVolumeRequest, TopologyRequirement,
    VolumeCapability,
};
use tonic::Code;

use crate::harness::{count_by, Driver};
use crate::listing::{ids_of, list_all};
use crate::requests::{
    block_cap, block_cap_mode, create_request, is_volume_id, mount_cap, mount_cap_flags,
    mount_cap_mode, node_topology, range, CodeChecks, GIB, MALFORMED_VOLUME_ID, MIB, MIN_BTRFS,
    MIN_EXT4, MIN_XFS, UNKNOWN_VOLUME_ID,
};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn create_volume_reports_id_rounded_capacity_topology_and_backing_file() {
    let d = Driver::start().await;
    let vol = d.create("pvc-size", 20 * MIB + 1, mount_cap("ext4")).await;
    assert!(
        is_volume_id(&vol.volume_id),
        "volume id {:?}",
        vol.volume_id
    );
    assert_eq!(
        vol.capacity_bytes,
        d.rounded(21 * MIB),
        "20 MiB + 1 byte rounds up to 21 MiB"
    );
    assert_eq!(
        vol.accessible_topology,
        vec![node_topology(&d.opts.node_id)],
        "accessible_topology"
    );
    assert_eq!(
        d.storage_size(&vol.volume_id),
        Some(d.rounded(21 * MIB) as u64),
        "the storage's size"
    );

    let other = d.create("pvc-size-2", 16 * MIB, block_cap()).await;
    assert!(is_volume_id(&other.volume_id));
    assert_ne!(
        other.volume_id, vol.volume_id,
        "different names, different ids"
    );
    assert_eq!(other.capacity_bytes, 16 * MIB);

    d.delete(&vol.volume_id).await;
    d.delete(&other.volume_id).await;
    assert!(
        d.pool_images().is_empty(),
        "pool after deletes: {:?}",
        d.pool_images()
    );
    d.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn create_volume_without_capacity_range_is_1gib() {
    let d = Driver::start().await;
    let mut req = create_request("pvc-default", 0, vec![mount_cap("ext4")]);
    req.capacity_range = None;
    let vol = d.create_with(req.clone()).await;
    assert_eq!(vol.capacity_bytes, GIB);
    let again = d.create_with(req).await;
    assert_eq!(again.volume_id, vol.volume_id, "retry without a range");
    assert_eq!(again.capacity_bytes, GIB);
    d.delete(&vol.volume_id).await;
    d.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn create_volume_is_idempotent_by_name() {
    let d = Driver::start().await;
    let mut checks = CodeChecks::new();
    let req = create_request("pvc-idem", 32 * MIB, vec![mount_cap("ext4")]);
    let first = d.create_with(req.clone()).await;
    let second = d.create_with(req.clone()).await;
    assert_eq!(second.volume_id, first.volume_id, "same name, same args");
    assert_eq!(second.capacity_bytes, first.capacity_bytes);
    assert_eq!(second.accessible_topology, first.accessible_topology);

    // A range the existing 32 MiB volume satisfies is compatible.
    let mut within = req.clone();
    within.capacity_range = range(20 * MIB, 64 * MIB);
    let third = d.create_with(within).await;
    assert_eq!(
        third.volume_id, first.volume_id,
        "same name, compatible range"
    );
    assert_eq!(third.capacity_bytes, 32 * MIB);

    // Ranges the existing volume does not satisfy are not.
    let mut bigger = req.clone();
    bigger.capacity_range = range(64 * MIB, 0);
    checks.code(
        d.controller().create_volume(bigger).await,
        Code::AlreadyExists,
        "CreateVolume same name, larger required_bytes",
    );
    let mut smaller = req.clone();
    smaller.capacity_range = range(16 * MIB, 24 * MIB);
    checks.code(
        d.controller().create_volume(smaller).await,
        Code::AlreadyExists,
        "CreateVolume same name, limit below the existing capacity",
    );

    assert_eq!(d.pool_images().len(), 1, "one backing file for one name");
    d.delete(&first.volume_id).await;

    // After a delete the name is free again.
    let fresh = d.create_with(req).await;
    assert_eq!(fresh.capacity_bytes, 32 * MIB);
    d.delete(&fresh.volume_id).await;
    checks.finish();
    d.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn create_volume_raises_small_requests_to_the_minimum() {
    let d = Driver::start().await;
    let mut checks = CodeChecks::new();
    let cases: Vec<(&str, VolumeCapability, i64, i64)> = vec![
        ("min-ext4", mount_cap("ext4"), MIB, MIN_EXT4),
        ("min-default-fs", mount_cap(""), MIB, MIN_EXT4),
        ("min-block", block_cap(), 1, MIN_EXT4),
        ("min-xfs", mount_cap("xfs"), 16 * MIB, MIN_XFS),
        ("min-btrfs", mount_cap("btrfs"), MIB, MIN_BTRFS),
    ];
    for (name, cap, required, want) in cases {
        let vol = d.create(name, required, cap).await;
        assert_eq!(vol.capacity_bytes, want, "{name}: required {required}");
        d.delete(&vol.volume_id).await;
    }

    // Only a limit: the volume must fit below it.
    let mut req = create_request("limit-only", 0, vec![mount_cap("ext4")]);
    req.capacity_range = range(0, 64 * MIB);
    let vol = d.create_with(req).await;
    assert!(
        (MIN_EXT4..=64 * MIB).contains(&vol.capacity_bytes),
        "limit-only volume has {} bytes",
        vol.capacity_bytes
    );
    d.delete(&vol.volume_id).await;

    // The minimum may not exceed limit_bytes.
    let mut req = create_request("min-over-limit", MIB, vec![mount_cap("ext4")]);
    req.capacity_range = range(MIB, 8 * MIB);
    checks.code(
        d.controller().create_volume(req).await,
        Code::OutOfRange,
        "ext4 with limit 8 MiB (minimum 16 MiB)",
    );
    let mut req = create_request("xfs-over-limit", 100 * MIB, vec![mount_cap("xfs")]);
    req.capacity_range = range(100 * MIB, 200 * MIB);
    checks.code(
        d.controller().create_volume(req).await,
        Code::OutOfRange,
        "xfs with limit 200 MiB (minimum 300 MiB)",
    );
    assert!(d.pool_images().is_empty(), "pool: {:?}", d.pool_images());
    checks.finish();
    d.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn create_volume_capacity_errors() {
    let d = Driver::start().await;
    let mut checks = CodeChecks::new();
    let cap = || vec![mount_cap("ext4")];
    let with_range = |name: &str, required: i64, limit: i64| {
        let mut req = create_request(name, required, cap());
        req.capacity_range = range(required, limit);
        req
    };
    let cases: Vec<(&str, CreateVolumeRequest, Code)> = vec![
        (
            "required above limit",
            with_range("cap-1", 64 * MIB, 32 * MIB),
            Code::OutOfRange,
        ),
        (
            "rounded size above limit",
            with_range("cap-2", 20 * MIB + 1, 20 * MIB + 1),
            Code::OutOfRange,
        ),
        (
            "negative required_bytes",
            with_range("cap-3", -1, 0),
            Code::InvalidArgument,
        ),
        (
            "negative limit_bytes",
            with_range("cap-4", 32 * MIB, -1),
            Code::InvalidArgument,
        ),
        (
            "1 PiB",
            with_range("cap-5", 1 << 50, 0),
            Code::ResourceExhausted,
        ),
    ];
    for (what, req, code) in cases {
        checks.code(d.controller().create_volume(req).await, code, what);
    }
    assert!(d.pool_images().is_empty(), "pool: {:?}", d.pool_images());
    let listed = ids_of(&list_all(&d, 0).await);
    assert!(listed.is_empty(), "failed creates left volumes: {listed:?}");
    checks.finish();
    d.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn create_volume_argument_errors() {
    let d = Driver::start().await;
    let mut checks = CodeChecks::new();
    let good = || create_request("pvc-args", 32 * MIB, vec![mount_cap("ext4")]);
    let with_caps = |caps: Vec<VolumeCapability>| {
        let mut req = good();
        req.volume_capabilities = caps;
        req
    };
    let mut cases: Vec<(String, CreateVolumeRequest)> = Vec::new();
    let mut r = good();
    r.name = String::new();
    cases.push(("empty name".into(), r));
    cases.push(("no capabilities".into(), with_caps(vec![])));
    let mut no_type = mount_cap("ext4");
    no_type.access_type = None;
    cases.push((
        "capability without access_type".into(),
        with_caps(vec![no_type]),
    ));
    let mut no_mode = mount_cap("ext4");
    no_mode.access_mode = None;
    cases.push((
        "capability without access_mode".into(),
        with_caps(vec![no_mode]),
    ));
    for mode in [
        Mode::Unknown,
        Mode::MultiNodeReaderOnly,
        Mode::MultiNodeSingleWriter,
        Mode::MultiNodeMultiWriter,
    ] {
        cases.push((
            format!("mount mode {mode:?}"),
            with_caps(vec![mount_cap_mode("ext4", mode)]),
        ));
        cases.push((
            format!("block mode {mode:?}"),
            with_caps(vec![block_cap_mode(mode)]),
        ));
    }
    // One bad capability among good ones spoils the request.
    cases.push((
        "good and multi-node capabilities".into(),
        with_caps(vec![
            mount_cap("ext4"),
            block_cap_mode(Mode::MultiNodeMultiWriter),
        ]),
    ));
    cases.push(("fs_type ntfs".into(), with_caps(vec![mount_cap("ntfs")])));
    cases.push(("fs_type EXT4".into(), with_caps(vec![mount_cap("EXT4")])));
    for flag in ["suid", "dev", "bind", "remount"] {
        cases.push((
            format!("mount flag {flag}"),
            with_caps(vec![mount_cap_flags("ext4", &["noatime", flag])]),
        ));
    }
    let mut r = good();
    r.parameters = HashMap::from([("fsType".to_owned(), "ext4".to_owned())]);
    cases.push(("unknown parameter fsType".into(), r));
    let mut r = good();
    r.parameters = HashMap::from([
        ("csi.storage.k8s.io/pvc/name".to_owned(), "data".to_owned()),
        ("pool".to_owned(), "fast".to_owned()),
    ]);
    cases.push(("known and unknown parameters".into(), r));

    for (what, req) in cases {
        checks.code(
            d.controller().create_volume(req).await,
            Code::InvalidArgument,
            &format!("CreateVolume with {what}"),
        );
    }
    assert!(d.pool_images().is_empty(), "pool: {:?}", d.pool_images());
    checks.finish();
    d.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn create_volume_accepts_single_node_modes_flags_and_k8s_parameters() {
    let d = Driver::start().await;
    let modes = [
        Mode::SingleNodeWriter,
        Mode::SingleNodeReaderOnly,
        Mode::SingleNodeSingleWriter,
        Mode::SingleNodeMultiWriter,
    ];
    let mut ids = Vec::new();
    for (i, mode) in modes.into_iter().enumerate() {
        for (kind, cap) in [
            ("mount", mount_cap_mode("ext4", mode)),
            ("block", block_cap_mode(mode)),
        ] {
            let vol = d.create(&format!("mode-{i}-{kind}"), 16 * MIB, cap).await;
            ids.push(vol.volume_id);
        }
    }
    // Several capabilities at once, harmless mount flags, the parameters Kubernetes adds.
    let mut req = create_request(
        "pvc-k8s",
        16 * MIB,
        vec![
            mount_cap_flags("ext4", &["noatime", "nodiscard"]),
            block_cap(),
        ],
    );
    req.parameters = HashMap::from([
        ("csi.storage.k8s.io/pvc/name".to_owned(), "data".to_owned()),
        (
            "csi.storage.k8s.io/pvc/namespace".to_owned(),
            "default".to_owned(),
        ),
        (
            "csi.storage.k8s.io/pv/name".to_owned(),
            "pv-1234".to_owned(),
        ),
    ]);
    ids.push(d.create_with(req).await.volume_id);
    for fs_type in ["ext4", "xfs", "btrfs", ""] {
        let vol = d
            .create(&format!("fs-{fs_type}"), MIN_XFS, mount_cap(fs_type))
            .await;
        ids.push(vol.volume_id);
    }
    assert_eq!(
        count_by(ids.iter()).len(),
        ids.len(),
        "ids are distinct: {ids:?}"
    );
    for id in &ids {
        d.delete(id).await;
    }
    d.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn create_volume_honours_accessibility_requirements() {
    let d = Driver::start().await;
    let mut checks = CodeChecks::new();
    let ours = node_topology(&d.opts.node_id);
    let other = node_topology("some-other-node");

    let mut req = create_request("topo-other", 16 * MIB, vec![mount_cap("ext4")]);
    req.accessibility_requirements = Some(TopologyRequirement {
        requisite: vec![other.clone()],
        preferred: vec![other.clone()],
    });
    checks.code(
        d.controller().create_volume(req).await,
        Code::ResourceExhausted,
        "CreateVolume requiring another node",
    );

    let mut req = create_request("topo-ours", 16 * MIB, vec![mount_cap("ext4")]);
    req.accessibility_requirements = Some(TopologyRequirement {
        requisite: vec![other.clone(), ours.clone()],
        preferred: vec![ours.clone()],
    });
    let vol = d.create_with(req).await;
    assert_eq!(vol.accessible_topology, vec![ours.clone()]);
    d.delete(&vol.volume_id).await;
    assert!(d.pool_images().is_empty(), "pool: {:?}", d.pool_images());
    checks.finish();
    d.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn delete_volume_is_idempotent_and_removes_the_backing_file() {
    let d = Driver::start().await;
    let mut checks = CodeChecks::new();
    let del = |id: &str| DeleteVolumeRequest {
        volume_id: id.to_owned(),
        ..Default::default()
    };
    checks.code(
        d.controller().delete_volume(del("")).await,
        Code::InvalidArgument,
        "DeleteVolume with empty id",
    );
    checks.ok(
        d.controller().delete_volume(del(MALFORMED_VOLUME_ID)).await,
        "DeleteVolume malformed id",
    );
    checks.ok(
        d.controller().delete_volume(del(UNKNOWN_VOLUME_ID)).await,
        "DeleteVolume unknown id",
    );

    let vol = d.create("pvc-del", 16 * MIB, mount_cap("ext4")).await;
    assert!(d.storage_size(&vol.volume_id).is_some());
    d.delete(&vol.volume_id).await;
    assert!(
        d.storage_size(&vol.volume_id).is_none(),
        "backing file after delete"
    );
    checks.code(
        d.controller()
            .controller_get_volume(ControllerGetVolumeRequest {
                volume_id: vol.volume_id.clone(),
            })
            .await,
        Code::NotFound,
        "ControllerGetVolume after delete",
    );
    assert!(ids_of(&list_all(&d, 0).await).is_empty());
    d.delete(&vol.volume_id).await;
    checks.finish();
    d.finish().await;
}
