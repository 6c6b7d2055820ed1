//! Controller service, volume content sources: CreateVolume from a snapshot or from a volume
//! (sizes, content_source in the answer, idempotency by name, ALREADY_EXISTS for a name
//! taken with another source, the error code of each bad input), and a snapshot that
//! outlives its source volume and still restores.
//!
//! Checked beside the RPCs: the backing files of the new volumes and the pool after failed
//! requests. What the new volumes hold after a snapshot of a busy volume is
//! `snapshot_data`'s subject.

use ferrovol::csi::v1::{ControllerGetVolumeRequest, CreateVolumeRequest};
use tonic::Code;

use crate::content::{verify_files, write_files};
use crate::harness::Driver;
use crate::requests::{
    create_from, create_request, from_snapshot, from_volume, is_volume_id, mount_cap, ok, range,
    CodeChecks, MALFORMED_SNAPSHOT_ID, MALFORMED_VOLUME_ID, MIB, UNKNOWN_SNAPSHOT_ID,
    UNKNOWN_VOLUME_ID,
};
use crate::snapshot::get_snapshot;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn snapshot_outlives_its_source_volume() {
    let d = Driver::start().await;
    let cap = mount_cap("ext4");
    let src = d.create("pvc-doomed", 16 * MIB, cap.clone()).await;
    let src_id = src.volume_id.clone();
    d.stage(&src_id, &cap).await;
    let target = d.publish(&src_id, &cap, "src", false).await;
    write_files(&target, 71);
    d.unpublish(&src_id, &target).await;
    d.unstage(&src_id).await;
    let snap = d.snapshot("snap-orphan", &src_id).await;

    // Deleting the source is allowed and leaves the snapshot whole.
    d.delete(&src_id).await;
    assert!(
        d.storage_size(&src_id).is_none(),
        "source backing file after delete"
    );
    assert!(
        d.snapshot_storage_size(&snap.snapshot_id).is_some(),
        "deleting the source volume removed the snapshot file"
    );
    let got = get_snapshot(&d, &snap.snapshot_id).await;
    assert_eq!(got.snapshot_id, snap.snapshot_id);
    assert_eq!(
        got.source_volume_id, src_id,
        "source_volume_id after the source is gone"
    );
    assert_eq!(got.size_bytes, 16 * MIB);
    assert!(got.ready_to_use);

    // Restore it; then delete the snapshot before using the restored volume: the restored
    // volume does not need its snapshot either.
    let restored = d
        .create_with(create_from(
            "pvc-from-orphan",
            16 * MIB,
            cap.clone(),
            from_snapshot(&snap.snapshot_id),
        ))
        .await;
    d.delete_snapshot(&snap.snapshot_id).await;
    let id = restored.volume_id.clone();
    d.stage(&id, &cap).await;
    let target = d.publish(&id, &cap, "restored", false).await;
    verify_files(&target, 71);
    d.unpublish(&id, &target).await;
    d.unstage(&id).await;
    d.delete(&id).await;
    d.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn create_volume_from_source_errors() {
    let d = Driver::start().await;
    let mut checks = CodeChecks::new();
    let cap = mount_cap("ext4");
    let src = d.create("pvc-src-errors", 32 * MIB, cap.clone()).await;
    let snap = d.snapshot("snap-src-errors", &src.volume_id).await;
    let images_before = d.pool_images();

    let mut cases: Vec<(String, CreateVolumeRequest, Code)> = Vec::new();
    for id in [UNKNOWN_SNAPSHOT_ID, MALFORMED_SNAPSHOT_ID] {
        cases.push((
            format!("unknown snapshot {id}"),
            create_from("pvc-bad-src", 32 * MIB, cap.clone(), from_snapshot(id)),
            Code::NotFound,
        ));
    }
    for id in [UNKNOWN_VOLUME_ID, MALFORMED_VOLUME_ID] {
        cases.push((
            format!("unknown volume {id}"),
            create_from("pvc-bad-src", 32 * MIB, cap.clone(), from_volume(id)),
            Code::NotFound,
        ));
    }
    // A snapshot id given as volume source and the other way round name nothing.
    cases.push((
        "a snapshot id as volume source".into(),
        create_from(
            "pvc-bad-src",
            32 * MIB,
            cap.clone(),
            from_volume(&snap.snapshot_id),
        ),
        Code::NotFound,
    ));
    cases.push((
        "a volume id as snapshot source".into(),
        create_from(
            "pvc-bad-src",
            32 * MIB,
            cap.clone(),
            from_snapshot(&src.volume_id),
        ),
        Code::NotFound,
    ));
    for (kind, source) in [
        ("snapshot", from_snapshot(&snap.snapshot_id)),
        ("volume", from_volume(&src.volume_id)),
    ] {
        let mut req = create_from("pvc-too-small", 16 * MIB, cap.clone(), source.clone());
        req.capacity_range = range(16 * MIB, 16 * MIB);
        cases.push((
            format!("{kind} of 32 MiB into limit_bytes 16 MiB"),
            req,
            Code::OutOfRange,
        ));
        let mut req = create_from("pvc-too-small", 0, cap.clone(), source);
        req.capacity_range = range(0, 32 * MIB - 1);
        cases.push((
            format!("{kind} of 32 MiB into limit_bytes 32 MiB - 1"),
            req,
            Code::OutOfRange,
        ));
    }
    for (what, req, code) in cases {
        checks.code(
            d.controller().create_volume(req).await,
            code,
            &format!("CreateVolume from {what}"),
        );
    }
    assert_eq!(
        d.pool_images(),
        images_before,
        "failed creates from a source changed the pool"
    );
    d.delete_snapshot(&snap.snapshot_id).await;
    d.delete(&src.volume_id).await;
    checks.finish();
    d.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn create_volume_from_snapshot_and_volume() {
    let d = Driver::start().await;
    let mut checks = CodeChecks::new();
    let cap = mount_cap("ext4");
    let src = d.create("pvc-origin", 32 * MIB, cap.clone()).await;
    let other = d.create("pvc-origin-2", 32 * MIB, cap.clone()).await;
    let snap = d.snapshot("snap-origin", &src.volume_id).await;
    let snap2 = d.snapshot("snap-origin-2", &src.volume_id).await;
    let get_capacity = |id: String| {
        let mut c = d.controller();
        async move {
            ok(
                c.controller_get_volume(ControllerGetVolumeRequest {
                    volume_id: id.clone(),
                })
                .await,
                "ControllerGetVolume",
            )
            .volume
            .expect("volume")
            .capacity_bytes
        }
    };

    // (name, required_bytes, source, expected capacity)
    let cases = [
        (
            "pvc-restore-small",
            16 * MIB,
            from_snapshot(&snap.snapshot_id),
            32 * MIB,
        ),
        (
            "pvc-restore-big",
            48 * MIB,
            from_snapshot(&snap.snapshot_id),
            48 * MIB,
        ),
        (
            "pvc-clone-small",
            MIB,
            from_volume(&src.volume_id),
            32 * MIB,
        ),
        (
            "pvc-clone-big",
            40 * MIB + 1,
            from_volume(&src.volume_id),
            d.rounded(41 * MIB),
        ),
    ];
    let mut made = Vec::new();
    for (name, required, source, want) in cases {
        let req = create_from(name, required, cap.clone(), source.clone());
        let vol = d.create_with(req.clone()).await;
        assert!(
            is_volume_id(&vol.volume_id),
            "{name}: id {:?}",
            vol.volume_id
        );
        assert_eq!(
            vol.capacity_bytes, want,
            "{name}: capacity for required {required}"
        );
        assert_eq!(vol.content_source, source, "{name}: content_source");
        assert_eq!(
            d.storage_size(&vol.volume_id)
                .expect("storage of a restored volume"),
            u64::try_from(want).expect("positive"),
            "{name}: backing file length"
        );
        assert_eq!(get_capacity(vol.volume_id.clone()).await, want, "{name}");

        // The same request again: the same volume.
        let again = d.create_with(req.clone()).await;
        assert_eq!(again.volume_id, vol.volume_id, "{name}: retry");
        assert_eq!(again.capacity_bytes, want, "{name}: retry capacity");
        assert_eq!(again.content_source, source, "{name}: retry content_source");

        // The same name with another source, or none, is another volume.
        let others = [
            ("another snapshot", from_snapshot(&snap2.snapshot_id)),
            ("another volume", from_volume(&other.volume_id)),
            ("no source", None),
        ];
        for (what, other_source) in others {
            let mut conflicting = req.clone();
            conflicting.volume_content_source = other_source;
            checks.code(
                d.controller().create_volume(conflicting).await,
                Code::AlreadyExists,
                &format!("CreateVolume {name} again with {what}"),
            );
        }
        made.push(vol.volume_id);
    }

    // A plain volume's name with a source is taken too.
    for (what, source) in [
        ("a snapshot", from_snapshot(&snap.snapshot_id)),
        ("a volume", from_volume(&src.volume_id)),
    ] {
        checks.code(
            d.controller()
                .create_volume(create_from("pvc-origin-2", 32 * MIB, cap.clone(), source))
                .await,
            Code::AlreadyExists,
            &format!("CreateVolume of an existing plain volume's name from {what}"),
        );
    }
    // A restored volume can be the source of a clone and of snapshots.
    let chained = d
        .create_with(create_from(
            "pvc-clone-of-restore",
            16 * MIB,
            cap.clone(),
            from_volume(&made[1]),
        ))
        .await;
    assert_eq!(
        chained.capacity_bytes,
        48 * MIB,
        "clone of the 48 MiB restore"
    );
    let snap3 = d.snapshot("snap-of-clone", &made[3]).await;
    assert_eq!(snap3.size_bytes, d.rounded(41 * MIB));
    made.push(chained.volume_id);

    let plain = d
        .create_with(create_request(
            "pvc-plain-after",
            16 * MIB,
            vec![cap.clone()],
        ))
        .await;
    assert_eq!(
        plain.content_source, None,
        "a plain volume has no content_source"
    );
    made.push(plain.volume_id);

    for s in [&snap, &snap2, &snap3] {
        d.delete_snapshot(&s.snapshot_id).await;
    }
    for id in made.iter().chain([&src.volume_id, &other.volume_id]) {
        d.delete(id).await;
    }
    assert!(d.pool_images().is_empty(), "pool: {:?}", d.pool_images());
    checks.finish();
    d.finish().await;
}
