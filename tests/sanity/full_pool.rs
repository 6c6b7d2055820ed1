//! Full pools. Without overprovisioning (the default) CreateVolume answers
//! RESOURCE_EXHAUSTED for a volume the pool cannot promise, and leaves nothing behind;
//! GetCapacity says how much fits. With `--overprovision-ratio` the pool promises more than
//! it holds: a volume whose sparse file cannot grow any more gives its writer ENOSPC,
//! NodeGetVolumeStats reports the volume abnormal, and the data of the other volumes stays
//! intact.
//!
//! The pools are small ext4 filesystems the harness makes (`PoolFs`), so filling one is
//! quick; ext4 pools have no reflinks, so nothing is shared between files.

use std::fs::{self, File};
use std::io::Write;
use std::path::Path;

use ferrovol::csi::v1::{GetCapacityRequest, NodeGetVolumeStatsResponse};
use tonic::Code;

use crate::content::{verify_big_file, write_big_file};
use crate::harness::{Driver, Options};
use crate::host::{fs_available_bytes, PoolFs};
use crate::node::stats;
use crate::requests::{create_request, expect_code, mount_cap, MIB};

async fn available(d: &Driver) -> i64 {
    d.controller()
        .get_capacity(GetCapacityRequest::default())
        .await
        .expect("GetCapacity")
        .into_inner()
        .available_capacity
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn create_volume_that_does_not_fit_is_resource_exhausted() {
    let d = Driver::start_with(Options {
        pool_fs: Some(PoolFs::Ext4),
        ..Options::default()
    })
    .await;
    let cap = mount_cap("ext4");
    let free = i64::try_from(fs_available_bytes(&d.pool)).expect("fits");
    let offered = available(&d).await;
    assert!(
        offered > 512 * MIB && offered <= free,
        "GetCapacity offers {offered} bytes of an empty pool with {free} available"
    );

    // More than the pool holds: refused, and nothing is left of the attempt.
    let too_big = create_request("pvc-too-big", offered + MIB, vec![cap.clone()]);
    let status = expect_code(
        d.controller().create_volume(too_big).await,
        Code::ResourceExhausted,
        "CreateVolume larger than the pool",
    );
    assert!(
        status.message().contains("can promise only"),
        "message: {}",
        status.message()
    );
    assert!(d.pool_images().is_empty(), "files: {:?}", d.pool_images());
    assert_eq!(
        fs::read_dir(d.state.join("volumes"))
            .expect("records")
            .count(),
        0
    );

    // A sparse volume of 3/5 of the pool takes its full size from the offer, so a second
    // one no longer fits, however little data the first holds.
    let share = (offered * 3 / 5) / MIB * MIB;
    let first = d.create("pvc-first", share, cap.clone()).await;
    let left = available(&d).await;
    assert!(
        (offered - share - left).abs() <= 8 * MIB,
        "offer went from {offered} to {left} after a volume of {share}"
    );
    let second = create_request("pvc-second", share, vec![cap.clone()]);
    expect_code(
        d.controller().create_volume(second.clone()).await,
        Code::ResourceExhausted,
        "a second volume of 3/5 of the pool",
    );
    assert_eq!(d.pool_images().len(), 1, "files: {:?}", d.pool_images());

    // Space comes back with the delete.
    d.delete(&first.volume_id).await;
    let again = d.create_with(second).await;
    d.delete(&again.volume_id).await;
    d.finish().await;
}

/// Writes `chunk`-sized pieces with an fsync after each until a call fails; returns the
/// error and how many bytes were written (at most `limit`).
fn write_until_error(path: &Path, limit: usize) -> (Option<std::io::Error>, usize) {
    let mut file = File::create(path).expect("create the file inside the volume");
    let chunk = vec![0x5au8; 1 << 20];
    let mut written = 0;
    while written < limit {
        if let Err(e) = file.write_all(&chunk).and_then(|()| file.sync_data()) {
            return (Some(e), written);
        }
        written += chunk.len();
    }
    (None, written)
}

fn abnormal(resp: &NodeGetVolumeStatsResponse) -> Option<String> {
    let condition = resp
        .volume_condition
        .as_ref()
        .expect("NodeGetVolumeStats carries volume_condition");
    condition.abnormal.then(|| condition.message.clone())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn overprovisioned_pool_gives_enospc_inside_the_volume_and_keeps_other_data() {
    const KEPT: usize = 16 << 20;
    let d = Driver::start_with(Options {
        pool_fs: Some(PoolFs::SmallExt4),
        extra_args: vec!["--overprovision-ratio".into(), "4".into()],
        ..Options::default()
    })
    .await;
    let cap = mount_cap("ext4");
    let free = i64::try_from(fs_available_bytes(&d.pool)).expect("fits");
    // Two volumes that together promise more than the pool has: only with overprovisioning.
    let a = d.create("pvc-keeps-data", 64 * MIB, cap.clone()).await;
    let b = d.create("pvc-fills-pool", 112 * MIB, cap.clone()).await;
    assert!(
        64 * MIB + 112 * MIB > free,
        "the pool ({free} bytes available) must be overprovisioned by the two volumes"
    );
    let (a_id, b_id) = (a.volume_id.clone(), b.volume_id.clone());
    d.stage(&a_id, &cap).await;
    let a_target = d.publish(&a_id, &cap, "a", false).await;
    write_big_file(&a_target.join("kept.bin"), 41, KEPT);
    assert_eq!(
        abnormal(&stats(&d, &a_id, &a_target).await),
        None,
        "before the pool fills"
    );

    d.stage(&b_id, &cap).await;
    let b_target = d.publish(&b_id, &cap, "b", false).await;
    let (error, written) = write_until_error(&b_target.join("fill.bin"), 200 << 20);
    let error = error.unwrap_or_else(|| {
        panic!("wrote {written} bytes into a 112 MiB volume on a pool of {free} bytes without an error")
    });
    assert_eq!(
        error.raw_os_error(),
        Some(libc::ENOSPC),
        "the writer inside the volume gets ENOSPC after {written} bytes, not {error}"
    );
    let message = abnormal(&stats(&d, &b_id, &b_target).await)
        .expect("NodeGetVolumeStats reports the volume whose file cannot grow as abnormal");
    assert!(message.contains("ENOSPC"), "condition message: {message}");
    // The other volume cannot grow either, while its written data is whole.
    assert!(abnormal(&stats(&d, &a_id, &a_target).await).is_some());

    // Free the pool: unpublish, unstage and delete the volume that filled it.
    d.unpublish(&b_id, &b_target).await;
    d.unstage(&b_id).await;
    d.delete(&b_id).await;
    assert_eq!(
        abnormal(&stats(&d, &a_id, &a_target).await),
        None,
        "with the pool freed, the other volume is normal again"
    );
    // Its data went to disk intact: stage it afresh and read it back.
    d.unpublish(&a_id, &a_target).await;
    d.unstage(&a_id).await;
    d.stage(&a_id, &cap).await;
    let a_target = d.publish(&a_id, &cap, "a-again", false).await;
    verify_big_file(&a_target.join("kept.bin"), 41, KEPT);
    d.unpublish(&a_id, &a_target).await;
    d.unstage(&a_id).await;
    d.delete(&a_id).await;
    d.finish().await;
}
