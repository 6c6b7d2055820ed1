//! What snapshots and clones hold: files written into a published volume, a snapshot (or a
//! clone) taken while it stays published, the files changed afterwards, and the snapshot
//! restored (or the clone used) as a new, larger volume that is staged and published beside
//! the still-mounted source. The new volume must show the files as they were at snapshot
//! time, byte for byte (also a file that was written but never fsynced: the driver freezes a
//! staged ext4/xfs volume around the copy), and a filesystem grown to the new device size.
//!
//! RPCs: CreateSnapshot, CreateVolume with a content source, NodeStageVolume,
//! NodePublishVolume, and their teardown. Checked with file contents and `statvfs(3)`.

use std::fs;

use ferrovol::csi::v1::VolumeContentSource;

use crate::content::{
    block_size, verify_block, verify_file, verify_files, write_block, write_files, write_unsynced,
};
use crate::harness::{Driver, Options};
use crate::host::{fs_total_bytes, PoolFs};
use crate::requests::{
    block_cap, create_from, expect_code, from_snapshot, from_volume, mount_cap, snapshot_request,
    MIB, MIN_XFS,
};

/// Size of the file written without fsync just before the snapshot.
const UNSYNCED_LEN: usize = 3 << 20;

/// How the new volume gets its content.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum CopyKind {
    /// CreateSnapshot of the published source, then CreateVolume from the snapshot.
    Restore,
    /// CreateVolume from the published source volume.
    Clone,
}

/// The state at copy time: the file tree of seed 100, and (for snapshots) `unsynced.bin`
/// that never saw an fsync. After the copy the source changes to seed 200, loses
/// `unsynced.bin` and gains `later.txt`. The copy, grown from `size` to `new_size`, must
/// show the first state; the source keeps the second.
async fn copy_keeps_state_at_copy_time(fs_type: &str, size: i64, new_size: i64, how: CopyKind) {
    let d = Driver::start().await;
    let cap = mount_cap(fs_type);
    let label = format!("{fs_type}-{how:?}").to_lowercase();
    let src = d
        .create(&format!("pvc-src-{label}"), size, cap.clone())
        .await;
    let src_id = src.volume_id.clone();
    d.stage(&src_id, &cap).await;
    let src_target = d.publish(&src_id, &cap, "src", false).await;
    write_files(&src_target, 100);
    // Only a snapshot promises the freeze; a clone is checked with fsynced data only.
    if how == CopyKind::Restore {
        write_unsynced(&src_target.join("unsynced.bin"), 150, UNSYNCED_LEN);
    }
    let src_total = fs_total_bytes(&src_target);

    let (source, snapshot_id): (Option<VolumeContentSource>, Option<String>) = match how {
        CopyKind::Restore => {
            let snap = d.snapshot(&format!("snap-{label}"), &src_id).await;
            assert_eq!(snap.size_bytes, size, "snapshot size_bytes");
            (from_snapshot(&snap.snapshot_id), Some(snap.snapshot_id))
        }
        CopyKind::Clone => (from_volume(&src_id), None),
    };
    let new_name = format!("pvc-copy-{label}");
    let copy_request = create_from(&new_name, new_size, cap.clone(), source.clone());
    let copy = match how {
        // The clone is taken from the published source at this point.
        CopyKind::Clone => Some(d.create_with(copy_request.clone()).await),
        CopyKind::Restore => None,
    };

    // Change the source after the copy.
    write_files(&src_target, 200);
    fs::remove_file(src_target.join("unsynced.bin")).ok();
    fs::write(src_target.join("later.txt"), b"written after the copy").expect("write later.txt");

    let copy = match copy {
        Some(v) => v,
        // The restore is made after the source changed: it must not matter.
        None => d.create_with(copy_request).await,
    };
    assert_eq!(copy.capacity_bytes, new_size, "capacity of the new volume");
    assert_eq!(
        copy.content_source, source,
        "content_source of the new volume"
    );
    let id = copy.volume_id.clone();

    // Stage and publish the copy while the source stays mounted (two filesystems with the
    // same UUID on one node must both mount).
    d.stage(&id, &cap).await;
    let target = d.publish(&id, &cap, "copy", false).await;
    verify_files(&target, 100);
    if how == CopyKind::Restore {
        verify_file(&target.join("unsynced.bin"), 150, UNSYNCED_LEN);
    }
    assert!(
        !target.join("later.txt").exists(),
        "the copy shows a file written after it was taken"
    );
    let total = fs_total_bytes(&target);
    let growth = u64::try_from(new_size - size).expect("grows") / 2;
    assert!(
        total >= src_total + growth,
        "the {fs_type} filesystem of the {new_size}-byte copy was not grown to its device: \
         {total} bytes, the {size}-byte source has {src_total}"
    );
    // The copy is a volume of its own: writable, and the source does not see its writes.
    write_files(&target.join("own"), 300);
    verify_files(&target.join("own"), 300);
    assert!(
        !src_target.join("own").exists(),
        "the source sees the copy's writes"
    );
    verify_files(&src_target, 200);

    d.unpublish(&id, &target).await;
    d.unstage(&id).await;
    d.unpublish(&src_id, &src_target).await;
    d.unstage(&src_id).await;
    if let Some(snapshot_id) = snapshot_id {
        d.delete_snapshot(&snapshot_id).await;
    }
    d.delete(&id).await;
    d.delete(&src_id).await;
    d.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn snapshot_of_published_ext4_restores_state_at_snapshot_time() {
    copy_keeps_state_at_copy_time("ext4", 64 * MIB, 128 * MIB, CopyKind::Restore).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn snapshot_of_published_xfs_restores_state_at_snapshot_time() {
    copy_keeps_state_at_copy_time("xfs", MIN_XFS, 400 * MIB, CopyKind::Restore).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clone_of_published_ext4_holds_state_at_clone_time() {
    copy_keeps_state_at_copy_time("ext4", 64 * MIB, 128 * MIB, CopyKind::Clone).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clone_of_published_xfs_holds_state_at_clone_time() {
    copy_keeps_state_at_copy_time("xfs", MIN_XFS, 400 * MIB, CopyKind::Clone).await;
}

/// Block data: a snapshot and a clone of a published block volume, both restored larger,
/// hold the chunks written before and not those written after; the devices have the new
/// size.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn snapshot_and_clone_of_published_block_volume() {
    // A raw block volume in use cannot be frozen; a reflink is atomic against its writes,
    // so the copy is crash-consistent. That needs a pool with reflinks.
    let d = Driver::start_with(Options {
        pool_fs: Some(PoolFs::XfsReflink),
        ..Options::default()
    })
    .await;
    let cap = block_cap();
    let src = d.create("pvc-src-block", 16 * MIB, cap.clone()).await;
    let src_id = src.volume_id.clone();
    d.stage(&src_id, &cap).await;
    let src_target = d.publish(&src_id, &cap, "src", false).await;
    write_block(&src_target, 110);
    let snap = d.snapshot("snap-block-data", &src_id).await;
    let clone = d
        .create_with(create_from(
            "pvc-clone-block",
            24 * MIB,
            cap.clone(),
            from_volume(&src_id),
        ))
        .await;
    write_block(&src_target, 120);
    let restored = d
        .create_with(create_from(
            "pvc-restore-block",
            32 * MIB,
            cap.clone(),
            from_snapshot(&snap.snapshot_id),
        ))
        .await;

    for (vol, want) in [(&clone, 24 << 20), (&restored, 32 << 20)] {
        let id = &vol.volume_id;
        d.stage(id, &cap).await;
        let label = format!("copy-{id}");
        let target = d.publish(id, &cap, &label, false).await;
        assert_eq!(block_size(&target), want, "device size of {id}");
        verify_block(&target, 110);
        d.unpublish(id, &target).await;
        d.unstage(id).await;
    }
    verify_block(&src_target, 120);
    d.unpublish(&src_id, &src_target).await;
    d.unstage(&src_id).await;
    d.delete_snapshot(&snap.snapshot_id).await;
    for id in [&clone.volume_id, &restored.volume_id, &src_id] {
        d.delete(id).await;
    }
    assert!(
        d.snapshot_storage_size(&snap.snapshot_id).is_none(),
        "snapshot file after delete"
    );
    d.finish().await;
}

/// On a pool without reflinks a copy of a raw block volume in use would be taken extent by
/// extent while the pod writes: it could be torn, so it is refused with a reason. Once the
/// volume is unstaged nothing writes to it and the copy is exact.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn in_use_block_volume_is_not_copied_on_a_pool_without_reflinks() {
    let d = Driver::start_with(Options {
        pool_fs: Some(PoolFs::Ext4),
        ..Options::default()
    })
    .await;
    let cap = block_cap();
    let src = d.create("pvc-busy-block", 16 * MIB, cap.clone()).await;
    let src_id = src.volume_id.clone();
    d.stage(&src_id, &cap).await;
    let src_target = d.publish(&src_id, &cap, "src", false).await;
    write_block(&src_target, 130);
    expect_code(
        d.controller()
            .create_snapshot(snapshot_request("snap-busy-block", &src_id))
            .await,
        tonic::Code::FailedPrecondition,
        "CreateSnapshot of a raw block volume in use on a copy-only pool",
    );
    expect_code(
        d.controller()
            .create_volume(create_from(
                "pvc-busy-clone",
                16 * MIB,
                cap.clone(),
                from_volume(&src_id),
            ))
            .await,
        tonic::Code::FailedPrecondition,
        "clone of a raw block volume in use on a copy-only pool",
    );
    let left: Vec<_> = fs::read_dir(d.pool.join("snapshots"))
        .map(|dir| dir.flatten().map(|e| e.file_name()).collect())
        .unwrap_or_default();
    assert!(left.is_empty(), "a refused snapshot left files: {left:?}");
    d.unpublish(&src_id, &src_target).await;
    d.unstage(&src_id).await;
    let snap = d.snapshot("snap-busy-block", &src_id).await;
    let restored = d
        .create_with(create_from(
            "pvc-idle-restore",
            16 * MIB,
            cap.clone(),
            from_snapshot(&snap.snapshot_id),
        ))
        .await;
    d.stage(&restored.volume_id, &cap).await;
    let target = d
        .publish(&restored.volume_id, &cap, "restored", false)
        .await;
    verify_block(&target, 130);
    d.unpublish(&restored.volume_id, &target).await;
    d.unstage(&restored.volume_id).await;
    d.delete(&restored.volume_id).await;
    d.delete_snapshot(&snap.snapshot_id).await;
    d.delete(&src_id).await;
    d.finish().await;
}
