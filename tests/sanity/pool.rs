//! Where snapshots and clones take their space from. On a pool that is XFS with reflinks,
//! CreateSnapshot and CreateVolume from a snapshot or a volume share extents with their
//! source: the pool's free space barely moves however much data the volume holds. On an
//! ext4 pool (no reflinks) they are sparse copies: the copy allocates about what the source
//! allocated, its holes stay holes, and its bytes equal the source's.
//!
//! The pools are filesystems the harness makes (`Options::pool_fs`). Checked with
//! `statvfs(3)` of the pool, `st_blocks` of the files in it, and the data read back through
//! the restored volumes.

use crate::content::{
    assert_same_bytes, verify_big_file, verify_files, write_big_file, write_files,
};
use crate::harness::{Driver, Options};
use crate::host::{allocated_bytes, fs_free_bytes, mount_at, sync_fs, PoolFs};
use crate::requests::{create_from, from_snapshot, from_volume, mount_cap, MIB};

/// At most this much pool space may a reflinked snapshot, restore or clone take.
const REFLINK_SLACK: u64 = 8 << 20;

/// Pool free space after everything dirty in the pool was written back.
fn settled_free(d: &Driver) -> u64 {
    sync_fs(&d.pool);
    fs_free_bytes(&d.pool)
}

/// Asserts the pool lost less than `REFLINK_SLACK` between two readings.
#[track_caller]
fn assert_took_no_space(before: u64, after: u64, what: &str) {
    let used = before.saturating_sub(after);
    eprintln!("{what}: {} KiB of pool space", used >> 10);
    assert!(
        used < REFLINK_SLACK,
        "{what} on an XFS reflink pool used {} KiB of pool space ({before} -> {after}); \
         a reflink shares the extents instead",
        used >> 10
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reflink_pool_snapshot_restore_and_clone_take_almost_no_space() {
    const DATA: usize = 64 << 20;
    let d = Driver::start_with(Options {
        pool_fs: Some(PoolFs::XfsReflink),
        ..Options::default()
    })
    .await;
    assert_eq!(
        mount_at(&d.pool).expect("the pool is a mount").fs_type,
        "xfs",
        "harness pool filesystem"
    );
    let cap = mount_cap("ext4");
    let src = d.create("pvc-reflink-src", 128 * MIB, cap.clone()).await;
    let src_id = src.volume_id.clone();
    d.stage(&src_id, &cap).await;
    let src_target = d.publish(&src_id, &cap, "src", false).await;
    write_big_file(&src_target.join("big.bin"), 5, DATA);
    write_files(&src_target, 6);
    let free = settled_free(&d);
    let src_allocated = allocated_bytes(&d.backing_file(&src_id));
    assert!(
        src_allocated >= DATA as u64,
        "the source's backing file holds only {src_allocated} bytes after {DATA} were written"
    );

    // Snapshot while published (frozen around the reflink).
    let snap = d.snapshot("snap-reflink", &src_id).await;
    let after_snapshot = settled_free(&d);
    assert_took_no_space(free, after_snapshot, "CreateSnapshot of 64 MiB of data");
    assert!(d.snapshot_file(&snap.snapshot_id).exists(), "snapshot file");

    let restored = d
        .create_with(create_from(
            "pvc-reflink-restore",
            128 * MIB,
            cap.clone(),
            from_snapshot(&snap.snapshot_id),
        ))
        .await;
    let after_restore = settled_free(&d);
    assert_took_no_space(
        after_snapshot,
        after_restore,
        "CreateVolume from the snapshot",
    );

    // Unpublish the source first, so the clone sees a quiet volume.
    d.unpublish(&src_id, &src_target).await;
    d.unstage(&src_id).await;
    let before_clone = settled_free(&d);
    let clone = d
        .create_with(create_from(
            "pvc-reflink-clone",
            128 * MIB,
            cap.clone(),
            from_volume(&src_id),
        ))
        .await;
    let after_clone = settled_free(&d);
    assert_took_no_space(before_clone, after_clone, "CreateVolume from the volume");

    for vol in [&restored, &clone] {
        let id = &vol.volume_id;
        d.stage(id, &cap).await;
        let target = d.publish(id, &cap, id, false).await;
        verify_big_file(&target.join("big.bin"), 5, DATA);
        verify_files(&target, 6);
        d.unpublish(id, &target).await;
        d.unstage(id).await;
    }
    d.delete_snapshot(&snap.snapshot_id).await;
    for id in [&restored.volume_id, &clone.volume_id, &src_id] {
        d.delete(id).await;
    }
    d.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn copy_pool_snapshot_and_restore_keep_holes() {
    const DATA: usize = 16 << 20;
    const SIZE: i64 = 64 * MIB;
    let d = Driver::start_with(Options {
        pool_fs: Some(PoolFs::Ext4),
        ..Options::default()
    })
    .await;
    assert_eq!(
        mount_at(&d.pool).expect("the pool is a mount").fs_type,
        "ext4",
        "harness pool filesystem"
    );
    let cap = mount_cap("ext4");
    let src = d.create("pvc-copy-src", SIZE, cap.clone()).await;
    let src_id = src.volume_id.clone();
    d.stage(&src_id, &cap).await;
    let src_target = d.publish(&src_id, &cap, "src", false).await;
    write_big_file(&src_target.join("big.bin"), 9, DATA);
    write_files(&src_target, 10);

    let snap = d.snapshot("snap-copy", &src_id).await;
    sync_fs(&d.pool);
    let src_allocated = allocated_bytes(&d.backing_file(&src_id));
    let file = d.snapshot_file(&snap.snapshot_id);
    let snap_allocated = allocated_bytes(&file);
    let half = u64::try_from(SIZE / 2).expect("positive");
    eprintln!("source allocates {src_allocated} bytes, its snapshot {snap_allocated}");
    assert!(
        snap_allocated >= DATA as u64,
        "the snapshot file allocates {snap_allocated} bytes; {DATA} bytes of data were written"
    );
    assert!(
        snap_allocated <= src_allocated + (2 << 20) && snap_allocated < half,
        "the snapshot file allocates {snap_allocated} bytes of its {SIZE}; the source \
         allocates {src_allocated}: the copy filled holes"
    );

    let restored = d
        .create_with(create_from(
            "pvc-copy-restore",
            SIZE,
            cap.clone(),
            from_snapshot(&snap.snapshot_id),
        ))
        .await;
    let id = restored.volume_id.clone();
    sync_fs(&d.pool);
    let restored_allocated = allocated_bytes(&d.backing_file(&id));
    assert!(
        restored_allocated <= snap_allocated + (2 << 20),
        "the restored volume allocates {restored_allocated} bytes, its snapshot \
         {snap_allocated}: the copy filled holes"
    );
    assert_same_bytes(&file, &d.backing_file(&id));

    d.stage(&id, &cap).await;
    let target = d.publish(&id, &cap, "restored", false).await;
    verify_big_file(&target.join("big.bin"), 9, DATA);
    verify_files(&target, 10);
    d.unpublish(&id, &target).await;
    d.unstage(&id).await;
    d.unpublish(&src_id, &src_target).await;
    d.unstage(&src_id).await;
    d.delete_snapshot(&snap.snapshot_id).await;
    d.delete(&id).await;
    d.delete(&src_id).await;
    d.finish().await;
}
