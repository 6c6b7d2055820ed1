//! One operation per volume at a time: a second concurrent operation on the same volume
//! gets ABORTED, while other volumes proceed.
//!
//! The test makes the overlap certain rather than likely: the pool lives on a filesystem
//! of the harness's own, which the test freezes (`fsfreeze`). A CreateVolume then blocks
//! inside its fsync while holding the volume's lock, and stays there until the thaw.

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use tonic::Code;

use crate::harness::{Driver, Options};
use crate::host::PoolFs;
use crate::requests::{create_request, expect_code, mount_cap, ok, MIB};

/// Freezes a filesystem with fsfreeze; thaws it on drop, so a failing test cannot leave
/// the machine with a frozen mount.
struct Frozen<'a>(&'a Path);

impl<'a> Frozen<'a> {
    fn freeze(mount_point: &'a Path) -> Frozen<'a> {
        let status = Command::new("fsfreeze")
            .arg("--freeze")
            .arg(mount_point)
            .status()
            .expect("run fsfreeze");
        assert!(
            status.success(),
            "fsfreeze --freeze {}",
            mount_point.display()
        );
        Frozen(mount_point)
    }
}

impl Drop for Frozen<'_> {
    fn drop(&mut self) {
        let _ = Command::new("fsfreeze")
            .arg("--unfreeze")
            .arg(self.0)
            .status();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_operation_on_a_busy_volume_is_aborted() {
    let d = Driver::start_with(Options {
        pool_fs: Some(PoolFs::Ext4),
        ..Options::default()
    })
    .await;
    let cap = mount_cap("ext4");
    let request = create_request("pvc-busy", 32 * MIB, vec![cap]);
    let frozen = Frozen::freeze(&d.pool);

    // The first CreateVolume blocks in the frozen pool, holding the volume's lock.
    let mut first_client = d.controller();
    let first_request = request.clone();
    let first = tokio::spawn(async move { first_client.create_volume(first_request).await });
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        !first.is_finished(),
        "CreateVolume finished although the pool is frozen"
    );

    // The same name again, and a DeleteVolume of the same id: both ABORTED at once.
    // The ABORTED message names the busy volume; its id is checked against the first
    // call's answer after the thaw.
    let id = {
        let second = tokio::time::timeout(
            Duration::from_secs(5),
            d.controller().create_volume(request.clone()),
        )
        .await
        .expect("a busy volume must be refused at once, not queued");
        let status = second.expect_err("second CreateVolume of a busy volume");
        assert_eq!(status.code(), Code::Aborted, "{status:?}");
        let message = status.message().to_owned();
        message
            .split_whitespace()
            .find(|w| w.starts_with("fv-"))
            .unwrap_or_else(|| panic!("ABORTED message names the volume: {message}"))
            .to_owned()
    };
    expect_code(
        tokio::time::timeout(
            Duration::from_secs(5),
            d.controller()
                .delete_volume(ferrovol::csi::v1::DeleteVolumeRequest {
                    volume_id: id.clone(),
                    ..Default::default()
                }),
        )
        .await
        .expect("DeleteVolume of a busy volume must not wait"),
        Code::Aborted,
        "DeleteVolume while CreateVolume of the same volume runs",
    );

    // Thawed, the first call completes; a retry of the second then succeeds too.
    drop(frozen);
    let created = ok(
        tokio::time::timeout(Duration::from_secs(30), first)
            .await
            .expect("CreateVolume finishes after the thaw")
            .expect("task"),
        "first CreateVolume",
    )
    .volume
    .expect("volume");
    assert_eq!(created.volume_id, id);
    let retried = ok(
        d.controller().create_volume(request).await,
        "retried CreateVolume",
    )
    .volume
    .expect("volume");
    assert_eq!(retried.volume_id, id);
    d.delete(&id).await;
    d.finish().await;
}
