//! Controller service, snapshots: CreateSnapshot (id, size, time, idempotency by name, the
//! error code of each bad input), DeleteSnapshot, GetSnapshot, ListSnapshots (filters,
//! pagination, stability under deletes).
//!
//! Checked beside the RPCs: the snapshot file `POOL/snapshots/<snapshot_id>.img` follows the
//! snapshot. Volumes made from snapshots are `restore`'s subject, the data they hold
//! `snapshot_data`'s, reflinks and copies `pool`'s.

use std::collections::{BTreeSet, HashMap};
use std::fs;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use ferrovol::csi::v1::{
    DeleteSnapshotRequest, GetSnapshotRequest, ListSnapshotsRequest, ListSnapshotsResponse,
    Snapshot,
};
use tonic::Code;

use crate::harness::{count_by, Driver};
use crate::requests::{
    block_cap, expect_code, is_snapshot_id, mount_cap, ok, snapshot_request, CodeChecks,
    MALFORMED_SNAPSHOT_ID, MALFORMED_VOLUME_ID, MIB, UNKNOWN_SNAPSHOT_ID, UNKNOWN_VOLUME_ID,
};

/// One ListSnapshots call that must succeed.
pub async fn list_snapshots(d: &Driver, req: ListSnapshotsRequest) -> ListSnapshotsResponse {
    let what = format!("ListSnapshots {req:?}");
    ok(d.controller().list_snapshots(req).await, &what)
}

/// Every ListSnapshots entry matching `filter`, following next_token with pages of
/// `max_entries`; returns the snapshots in the order they came.
pub async fn list_all_snapshots(
    d: &Driver,
    filter: &ListSnapshotsRequest,
    max_entries: i32,
) -> Vec<Snapshot> {
    let mut got = Vec::new();
    let mut token = String::new();
    for _ in 0..1000 {
        let page = list_snapshots(
            d,
            ListSnapshotsRequest {
                max_entries,
                starting_token: token.clone(),
                ..filter.clone()
            },
        )
        .await;
        if max_entries > 0 {
            assert!(
                page.entries.len() <= usize::try_from(max_entries).expect("positive"),
                "ListSnapshots returned {} entries for max_entries {max_entries}",
                page.entries.len()
            );
        }
        got.extend(
            page.entries
                .into_iter()
                .map(|e| e.snapshot.expect("ListSnapshots entry has a snapshot")),
        );
        token = page.next_token;
        if token.is_empty() {
            return got;
        }
    }
    panic!("ListSnapshots pagination did not end after 1000 pages");
}

/// Snapshot ids, sorted.
fn snapshot_ids(snapshots: &[Snapshot]) -> BTreeSet<String> {
    snapshots.iter().map(|s| s.snapshot_id.clone()).collect()
}

/// A ListSnapshots filter on one snapshot id.
fn by_snapshot_id(id: &str) -> ListSnapshotsRequest {
    ListSnapshotsRequest {
        snapshot_id: id.to_owned(),
        ..Default::default()
    }
}

/// A ListSnapshots filter on one source volume.
fn by_source(volume_id: &str) -> ListSnapshotsRequest {
    ListSnapshotsRequest {
        source_volume_id: volume_id.to_owned(),
        ..Default::default()
    }
}

/// GetSnapshot of `id` that must succeed.
pub async fn get_snapshot(d: &Driver, id: &str) -> Snapshot {
    ok(
        d.controller()
            .get_snapshot(GetSnapshotRequest {
                snapshot_id: id.to_owned(),
                ..Default::default()
            })
            .await,
        &format!("GetSnapshot {id}"),
    )
    .snapshot
    .expect("GetSnapshot response carries a snapshot")
}

/// Seconds since the epoch, now.
fn now_seconds() -> i64 {
    let since = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("clock after 1970");
    i64::try_from(since.as_secs()).expect("fits")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn create_snapshot_reports_id_size_time_and_file() {
    let d = Driver::start().await;
    let vol = d.create("pvc-snap-src", 32 * MIB, mount_cap("ext4")).await;
    let other = d.create("pvc-snap-other", 16 * MIB, block_cap()).await;

    let before = now_seconds();
    let snap = d.snapshot("snap-basic", &vol.volume_id).await;
    let after = now_seconds();
    assert!(
        is_snapshot_id(&snap.snapshot_id),
        "snapshot id {:?}",
        snap.snapshot_id
    );
    assert_eq!(snap.source_volume_id, vol.volume_id, "source_volume_id");
    assert_eq!(
        snap.size_bytes,
        32 * MIB,
        "size_bytes is the source's capacity"
    );
    assert!(snap.ready_to_use, "ready_to_use: {snap:?}");
    let created = snap.creation_time.expect("creation_time is set");
    assert!(
        (before - 2..=after + 2).contains(&created.seconds),
        "creation_time {created:?} is not between {before} and {after}"
    );
    assert_eq!(
        d.snapshot_storage_size(&snap.snapshot_id),
        Some(32 << 20),
        "the snapshot's storage size"
    );

    // Same name and source: the same snapshot, with the time of the first call.
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let again = d.snapshot("snap-basic", &vol.volume_id).await;
    assert_eq!(
        again.snapshot_id, snap.snapshot_id,
        "same name, same source"
    );
    assert_eq!(
        again.creation_time, snap.creation_time,
        "a retried CreateSnapshot reports the first creation_time"
    );
    assert_eq!(again.size_bytes, snap.size_bytes);
    assert_eq!(again.source_volume_id, snap.source_volume_id);

    // Same name, another source: a conflict; the first snapshot is untouched.
    expect_code(
        d.controller()
            .create_snapshot(snapshot_request("snap-basic", &other.volume_id))
            .await,
        Code::AlreadyExists,
        "CreateSnapshot same name, another source volume",
    );
    assert_eq!(
        get_snapshot(&d, &snap.snapshot_id).await.source_volume_id,
        vol.volume_id
    );

    // Another name: another snapshot of the same volume; Kubernetes' parameters are fine.
    let mut req = snapshot_request("snap-basic-2", &vol.volume_id);
    req.parameters = HashMap::from([
        (
            "csi.storage.k8s.io/volumesnapshot/name".to_owned(),
            "nightly".to_owned(),
        ),
        (
            "csi.storage.k8s.io/volumesnapshot/namespace".to_owned(),
            "default".to_owned(),
        ),
        (
            "csi.storage.k8s.io/volumesnapshotcontent/name".to_owned(),
            "snapcontent-1234".to_owned(),
        ),
    ]);
    let second = d.snapshot_with(req).await;
    assert!(is_snapshot_id(&second.snapshot_id));
    assert_ne!(
        second.snapshot_id, snap.snapshot_id,
        "different names, different ids"
    );
    // A snapshot of a block volume.
    let third = d.snapshot("snap-block", &other.volume_id).await;
    assert_eq!(third.size_bytes, 16 * MIB);
    assert_eq!(third.source_volume_id, other.volume_id);

    for s in [&snap, &second, &third] {
        d.delete_snapshot(&s.snapshot_id).await;
        assert!(
            d.snapshot_storage_size(&s.snapshot_id).is_none(),
            "snapshot file of {} after DeleteSnapshot",
            s.snapshot_id
        );
    }
    // After a delete the name is free again, for any source.
    let reborn = d.snapshot("snap-basic", &other.volume_id).await;
    assert_eq!(reborn.source_volume_id, other.volume_id);
    d.delete_snapshot(&reborn.snapshot_id).await;
    d.delete(&vol.volume_id).await;
    d.delete(&other.volume_id).await;
    d.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn create_snapshot_argument_errors() {
    let d = Driver::start().await;
    let mut checks = CodeChecks::new();
    let vol = d.create("pvc-snap-args", 16 * MIB, mount_cap("ext4")).await;
    let id = vol.volume_id.clone();

    let mut cases = vec![
        (
            "empty name",
            snapshot_request("", &id),
            Code::InvalidArgument,
        ),
        (
            "empty source_volume_id",
            snapshot_request("snap-args", ""),
            Code::InvalidArgument,
        ),
        (
            "unknown source volume",
            snapshot_request("snap-args", UNKNOWN_VOLUME_ID),
            Code::NotFound,
        ),
        (
            "malformed source volume id",
            snapshot_request("snap-args", MALFORMED_VOLUME_ID),
            Code::NotFound,
        ),
    ];
    let mut r = snapshot_request("snap-args", &id);
    r.parameters = HashMap::from([("consistency".to_owned(), "crash".to_owned())]);
    cases.push(("unknown parameter", r, Code::InvalidArgument));
    let mut r = snapshot_request("snap-args", &id);
    r.parameters = HashMap::from([
        (
            "csi.storage.k8s.io/volumesnapshot/name".to_owned(),
            "s".to_owned(),
        ),
        ("pool".to_owned(), "fast".to_owned()),
    ]);
    cases.push(("known and unknown parameters", r, Code::InvalidArgument));
    for (what, req, code) in cases {
        checks.code(
            d.controller().create_snapshot(req).await,
            code,
            &format!("CreateSnapshot with {what}"),
        );
    }
    let listed = list_all_snapshots(&d, &ListSnapshotsRequest::default(), 0).await;
    assert!(
        listed.is_empty(),
        "failed creates left snapshots: {listed:?}"
    );
    let files: Vec<_> = fs::read_dir(d.pool.join("snapshots"))
        .map(|rd| rd.filter_map(Result::ok).map(|e| e.file_name()).collect())
        .unwrap_or_default();
    assert!(files.is_empty(), "failed creates left files: {files:?}");
    d.delete(&id).await;
    checks.finish();
    d.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn delete_and_get_snapshot() {
    let d = Driver::start().await;
    let mut checks = CodeChecks::new();
    let del = |id: &str| DeleteSnapshotRequest {
        snapshot_id: id.to_owned(),
        ..Default::default()
    };
    let get = |id: &str| GetSnapshotRequest {
        snapshot_id: id.to_owned(),
        ..Default::default()
    };
    checks.code(
        d.controller().delete_snapshot(del("")).await,
        Code::InvalidArgument,
        "DeleteSnapshot empty id",
    );
    checks.code(
        d.controller().get_snapshot(get("")).await,
        Code::InvalidArgument,
        "GetSnapshot empty id",
    );
    // A volume id is no snapshot id either.
    for id in [
        UNKNOWN_SNAPSHOT_ID,
        MALFORMED_SNAPSHOT_ID,
        UNKNOWN_VOLUME_ID,
    ] {
        checks.ok(
            d.controller().delete_snapshot(del(id)).await,
            &format!("DeleteSnapshot unknown {id}"),
        );
        checks.code(
            d.controller().get_snapshot(get(id)).await,
            Code::NotFound,
            &format!("GetSnapshot unknown {id}"),
        );
    }

    let vol = d.create("pvc-snap-del", 16 * MIB, mount_cap("ext4")).await;
    let snap = d.snapshot("snap-del", &vol.volume_id).await;
    let got = get_snapshot(&d, &snap.snapshot_id).await;
    assert_eq!(got, snap, "GetSnapshot returns what CreateSnapshot made");
    // The source volume's id is not the snapshot's.
    checks.code(
        d.controller().get_snapshot(get(&vol.volume_id)).await,
        Code::NotFound,
        "GetSnapshot with the source volume's id",
    );

    d.delete_snapshot(&snap.snapshot_id).await;
    assert!(
        d.snapshot_storage_size(&snap.snapshot_id).is_none(),
        "snapshot file after delete"
    );
    assert!(
        d.storage_size(&vol.volume_id).is_some(),
        "DeleteSnapshot removed the source volume's backing file"
    );
    checks.code(
        d.controller().get_snapshot(get(&snap.snapshot_id)).await,
        Code::NotFound,
        "GetSnapshot after delete",
    );
    let listed = list_all_snapshots(&d, &ListSnapshotsRequest::default(), 0).await;
    assert!(listed.is_empty(), "listed after delete: {listed:?}");
    d.delete_snapshot(&snap.snapshot_id).await;
    d.delete(&vol.volume_id).await;
    checks.finish();
    d.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn list_snapshots_filters_by_snapshot_and_source() {
    let d = Driver::start().await;
    let a = d.create("pvc-list-a", 16 * MIB, mount_cap("ext4")).await;
    let b = d.create("pvc-list-b", 24 * MIB, block_cap()).await;
    let a1 = d.snapshot("snap-a1", &a.volume_id).await;
    let a2 = d.snapshot("snap-a2", &a.volume_id).await;
    let b1 = d.snapshot("snap-b1", &b.volume_id).await;
    let all = [&a1, &a2, &b1];

    let listed = list_all_snapshots(&d, &ListSnapshotsRequest::default(), 0).await;
    assert_eq!(listed.len(), 3, "unfiltered: {listed:?}");
    for s in all {
        let entry = listed
            .iter()
            .find(|l| l.snapshot_id == s.snapshot_id)
            .unwrap_or_else(|| panic!("{} not listed", s.snapshot_id));
        assert_eq!(entry, s, "listed entry equals the created snapshot");
    }

    for s in all {
        let got = list_all_snapshots(&d, &by_snapshot_id(&s.snapshot_id), 0).await;
        assert_eq!(
            got,
            vec![s.clone()],
            "filter on snapshot id {}",
            s.snapshot_id
        );
        // Both filters, consistent with each other.
        let both = ListSnapshotsRequest {
            snapshot_id: s.snapshot_id.clone(),
            source_volume_id: s.source_volume_id.clone(),
            ..Default::default()
        };
        assert_eq!(list_all_snapshots(&d, &both, 0).await, vec![s.clone()]);
    }
    for id in [
        UNKNOWN_SNAPSHOT_ID,
        MALFORMED_SNAPSHOT_ID,
        a.volume_id.as_str(),
    ] {
        let got = list_all_snapshots(&d, &by_snapshot_id(id), 0).await;
        assert!(
            got.is_empty(),
            "filter on unknown snapshot id {id}: {got:?}"
        );
    }

    let of_a = list_all_snapshots(&d, &by_source(&a.volume_id), 0).await;
    assert_eq!(
        snapshot_ids(&of_a),
        snapshot_ids(&[a1.clone(), a2.clone()]),
        "filter on source a"
    );
    let of_b = list_all_snapshots(&d, &by_source(&b.volume_id), 1).await;
    assert_eq!(of_b, vec![b1.clone()], "filter on source b, pages of 1");
    for id in [UNKNOWN_VOLUME_ID, MALFORMED_VOLUME_ID] {
        let got = list_all_snapshots(&d, &by_source(id), 0).await;
        assert!(got.is_empty(), "filter on unknown source {id}: {got:?}");
    }

    for s in all {
        d.delete_snapshot(&s.snapshot_id).await;
    }
    d.delete(&a.volume_id).await;
    d.delete(&b.volume_id).await;
    d.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn list_snapshots_paginates_and_rejects_bad_input() {
    let d = Driver::start().await;
    let mut checks = CodeChecks::new();
    let a = d.create("pvc-page-a", 16 * MIB, block_cap()).await;
    let b = d.create("pvc-page-b", 16 * MIB, block_cap()).await;
    let mut created = BTreeSet::new();
    let mut of_a = BTreeSet::new();
    for i in 0..5 {
        let source = if i < 3 { &a } else { &b };
        let s = d
            .snapshot(&format!("snap-page-{i}"), &source.volume_id)
            .await;
        if i < 3 {
            of_a.insert(s.snapshot_id.clone());
        }
        created.insert(s.snapshot_id);
    }
    for max in [0, 1, 2, 5, 6] {
        let got = list_all_snapshots(&d, &ListSnapshotsRequest::default(), max).await;
        let counts = count_by(got.iter().map(|s| s.snapshot_id.clone()));
        assert!(
            counts.values().all(|n| *n == 1),
            "max_entries {max}: duplicates {counts:?}"
        );
        assert_eq!(
            counts.keys().cloned().collect::<BTreeSet<_>>(),
            created,
            "max_entries {max}"
        );
        // Paging combined with the source filter.
        let got = list_all_snapshots(&d, &by_source(&a.volume_id), max).await;
        assert_eq!(snapshot_ids(&got), of_a, "source filter, max_entries {max}");
        assert_eq!(got.len(), 3, "source filter, max_entries {max}: {got:?}");
    }
    let first = list_snapshots(
        &d,
        ListSnapshotsRequest {
            max_entries: 2,
            ..Default::default()
        },
    )
    .await;
    assert_eq!(first.entries.len(), 2, "page 1 of 5 in pages of 2");
    assert!(
        !first.next_token.is_empty(),
        "page 1 of 5 needs a next_token"
    );

    checks.code(
        d.controller()
            .list_snapshots(ListSnapshotsRequest {
                max_entries: -1,
                ..Default::default()
            })
            .await,
        Code::InvalidArgument,
        "ListSnapshots max_entries -1",
    );
    checks.code(
        d.controller()
            .list_snapshots(ListSnapshotsRequest {
                max_entries: 2,
                starting_token: "garbage-token-%%%".to_owned(),
                ..Default::default()
            })
            .await,
        Code::Aborted,
        "ListSnapshots garbage starting_token",
    );
    for id in &created {
        d.delete_snapshot(id).await;
    }
    d.delete(&a.volume_id).await;
    d.delete(&b.volume_id).await;
    checks.finish();
    d.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn list_snapshots_pagination_survives_deletes_between_pages() {
    let d = Driver::start().await;
    let vol = d.create("pvc-snap-stale", 16 * MIB, block_cap()).await;
    // Delete the last entry of page 1, then (second round) the first entry of page 1.
    for (round, victim_index) in [(0, 1usize), (1, 0usize)] {
        let mut created = BTreeSet::new();
        for i in 0..5 {
            let s = d
                .snapshot(&format!("snap-stale-{round}-{i}"), &vol.volume_id)
                .await;
            created.insert(s.snapshot_id);
        }
        let page1 = list_snapshots(
            &d,
            ListSnapshotsRequest {
                max_entries: 2,
                ..Default::default()
            },
        )
        .await;
        assert_eq!(page1.entries.len(), 2, "page 1 size");
        assert!(
            !page1.next_token.is_empty(),
            "page 1 of 5 needs a next_token"
        );
        let page1_ids: Vec<String> = page1
            .entries
            .iter()
            .map(|e| e.snapshot.as_ref().expect("snapshot").snapshot_id.clone())
            .collect();
        let victim = page1_ids[victim_index].clone();
        d.delete_snapshot(&victim).await;
        created.remove(&victim);

        let mut seen: Vec<String> = page1_ids.into_iter().filter(|id| *id != victim).collect();
        let mut token = page1.next_token.clone();
        for _ in 0..100 {
            if token.is_empty() {
                break;
            }
            let page = list_snapshots(
                &d,
                ListSnapshotsRequest {
                    max_entries: 2,
                    starting_token: token.clone(),
                    ..Default::default()
                },
            )
            .await;
            seen.extend(
                page.entries
                    .iter()
                    .map(|e| e.snapshot.as_ref().expect("snapshot").snapshot_id.clone()),
            );
            token = page.next_token;
        }
        assert!(token.is_empty(), "pagination did not end");
        let counts = count_by(seen.iter().cloned());
        assert!(
            counts.values().all(|n| *n == 1),
            "round {round}: seen twice: {counts:?}"
        );
        assert_eq!(
            counts.keys().cloned().collect::<BTreeSet<_>>(),
            created,
            "round {round}: every remaining snapshot exactly once"
        );
        for id in &created {
            d.delete_snapshot(id).await;
        }
    }
    d.delete(&vol.volume_id).await;
    d.finish().await;
}
