//! Controller service, inventory: ListVolumes (pagination, stability under deletes) and
//! GetCapacity (pool space, reservations of sparse volumes, topology).

use std::collections::BTreeSet;

use ferrovol::csi::v1::{GetCapacityRequest, ListVolumesRequest, ListVolumesResponse};
use tonic::Code;

use crate::harness::{count_by, Driver};
use crate::host::fs_free_bytes;
use crate::requests::{block_cap, mount_cap, node_topology, ok, CodeChecks, GIB, MIB};

/// Every ListVolumes entry, following next_token with pages of `max_entries`.
pub async fn list_all(d: &Driver, max_entries: i32) -> Vec<ListVolumesResponse> {
    let mut pages = Vec::new();
    let mut token = String::new();
    for _ in 0..1000 {
        let page = ok(
            d.controller()
                .list_volumes(ListVolumesRequest {
                    max_entries,
                    starting_token: token.clone(),
                })
                .await,
            "ListVolumes",
        );
        if max_entries > 0 {
            assert!(
                page.entries.len() <= usize::try_from(max_entries).expect("positive"),
                "ListVolumes returned {} entries for max_entries {max_entries}",
                page.entries.len()
            );
        }
        token = page.next_token.clone();
        pages.push(page);
        if token.is_empty() {
            return pages;
        }
    }
    panic!("ListVolumes pagination did not end after 1000 pages");
}

/// Volume ids of a set of pages, in order.
pub fn ids_of(pages: &[ListVolumesResponse]) -> Vec<String> {
    pages
        .iter()
        .flat_map(|p| p.entries.iter())
        .map(|e| {
            e.volume
                .as_ref()
                .expect("entry has a volume")
                .volume_id
                .clone()
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn list_volumes_paginates_and_rejects_bad_input() {
    let d = Driver::start().await;
    let mut checks = CodeChecks::new();
    let mut created = BTreeSet::new();
    for i in 0..5 {
        let vol = d
            .create(&format!("pvc-list-{i}"), 16 * MIB, mount_cap("ext4"))
            .await;
        created.insert(vol.volume_id);
    }
    for max in [0, 1, 2, 5, 6] {
        let pages = list_all(&d, max).await;
        let ids = ids_of(&pages);
        let counts = count_by(ids.iter().cloned());
        assert!(
            counts.values().all(|n| *n == 1),
            "max_entries {max}: duplicates {counts:?}"
        );
        assert_eq!(
            counts.keys().cloned().collect::<BTreeSet<_>>(),
            created,
            "max_entries {max}"
        );
        if max == 2 {
            assert_eq!(pages.len(), 3, "5 volumes in pages of 2");
        }
        for entry in pages.iter().flat_map(|p| p.entries.iter()) {
            let v = entry.volume.as_ref().expect("volume");
            assert_eq!(
                v.capacity_bytes,
                16 * MIB,
                "listed capacity of {}",
                v.volume_id
            );
            assert_eq!(v.accessible_topology, vec![node_topology(&d.opts.node_id)]);
            let status = entry
                .status
                .as_ref()
                .expect("ListVolumes entry has a status");
            assert!(status.published_node_ids.is_empty());
        }
    }
    checks.code(
        d.controller()
            .list_volumes(ListVolumesRequest {
                max_entries: -1,
                starting_token: String::new(),
            })
            .await,
        Code::InvalidArgument,
        "ListVolumes max_entries -1",
    );
    checks.code(
        d.controller()
            .list_volumes(ListVolumesRequest {
                max_entries: 2,
                starting_token: "garbage-token-%%%".to_owned(),
            })
            .await,
        Code::Aborted,
        "ListVolumes garbage starting_token",
    );
    for id in &created {
        d.delete(id).await;
    }
    checks.finish();
    d.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn list_volumes_pagination_survives_deletes_between_pages() {
    let d = Driver::start().await;
    // Delete the last entry of page 1, then (second round) the first entry of page 1.
    for (round, victim_index) in [(0, 1usize), (1, 0usize)] {
        let mut created = BTreeSet::new();
        for i in 0..5 {
            let vol = d
                .create(&format!("pvc-page-{round}-{i}"), 16 * MIB, block_cap())
                .await;
            created.insert(vol.volume_id);
        }
        let page1 = ok(
            d.controller()
                .list_volumes(ListVolumesRequest {
                    max_entries: 2,
                    starting_token: String::new(),
                })
                .await,
            "ListVolumes page 1",
        );
        assert_eq!(page1.entries.len(), 2, "page 1 size");
        assert!(
            !page1.next_token.is_empty(),
            "page 1 of 5 volumes needs a next_token"
        );
        let page1_ids = ids_of(std::slice::from_ref(&page1));
        let victim = page1_ids[victim_index].clone();
        d.delete(&victim).await;
        created.remove(&victim);

        let mut seen: Vec<String> = page1_ids.into_iter().filter(|id| *id != victim).collect();
        let mut token = page1.next_token.clone();
        for _ in 0..100 {
            if token.is_empty() {
                break;
            }
            let page = ok(
                d.controller()
                    .list_volumes(ListVolumesRequest {
                        max_entries: 2,
                        starting_token: token.clone(),
                    })
                    .await,
                "ListVolumes next page after a delete",
            );
            seen.extend(ids_of(std::slice::from_ref(&page)));
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
            "round {round}: every remaining volume exactly once"
        );
        for id in &created {
            d.delete(id).await;
        }
    }
    d.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn get_capacity_tracks_pool_space_and_topology() {
    // Other tests share the filesystem /tmp is on and write to it in parallel, so space
    // comparisons allow this much noise.
    const SLACK: i64 = 256 * MIB;
    let d = Driver::start().await;
    let capacity = |req: GetCapacityRequest| {
        let mut c = d.controller();
        async move { ok(c.get_capacity(req).await, "GetCapacity") }
    };

    let free_before = fs_free_bytes(&d.pool);
    let before = capacity(GetCapacityRequest::default()).await;
    let free_after = fs_free_bytes(&d.pool);
    assert!(
        before.available_capacity > 0,
        "available {}",
        before.available_capacity
    );
    let fs_free = i64::try_from(free_before.max(free_after)).expect("fits");
    assert!(
        before.available_capacity <= fs_free,
        "available {} exceeds the pool filesystem's free {fs_free}",
        before.available_capacity
    );
    let max = before
        .maximum_volume_size
        .expect("GetCapacity sets maximum_volume_size");
    assert!(max > 0 && max <= fs_free, "maximum_volume_size {max}");

    // With capabilities and our own topology: still space; another node's topology: none.
    let ours = capacity(GetCapacityRequest {
        volume_capabilities: vec![mount_cap("ext4")],
        accessible_topology: Some(node_topology(&d.opts.node_id)),
        ..Default::default()
    })
    .await;
    assert!(ours.available_capacity > 0);
    let theirs = capacity(GetCapacityRequest {
        volume_capabilities: vec![mount_cap("ext4")],
        accessible_topology: Some(node_topology("some-other-node")),
        ..Default::default()
    })
    .await;
    assert_eq!(theirs.available_capacity, 0, "capacity on another node");

    // A sparse 4 GiB volume reserves its full size.
    let vol = d.create("pvc-capacity", 4 * GIB, block_cap()).await;
    let after = capacity(GetCapacityRequest::default()).await;
    let drop = before.available_capacity - after.available_capacity;
    assert!(
        (drop - 4 * GIB).abs() <= SLACK,
        "available went from {} to {} after a 4 GiB volume (down {drop})",
        before.available_capacity,
        after.available_capacity
    );
    d.delete(&vol.volume_id).await;
    let restored = capacity(GetCapacityRequest::default()).await;
    assert!(
        (restored.available_capacity - before.available_capacity).abs() <= SLACK,
        "available {} after delete, {} before create",
        restored.available_capacity,
        before.available_capacity
    );
    d.finish().await;
}
