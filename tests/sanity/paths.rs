//! Path roots: node RPCs mount onto, look at and remove only paths below `--path-root`
//! (kubelet's directory by default; the test's temp dir here), and never through a
//! symbolic link planted below it. Every refusal is INVALID_ARGUMENT and leaves the
//! outside untouched: nothing mounted, created or removed there.

use std::fs;
use std::os::unix::fs::symlink;
use std::path::{Path, PathBuf};

use ferrovol::csi::v1::*;
use tonic::Code;

use crate::harness::Driver;
use crate::host::{mount_at, mounts_under};
use crate::requests::*;

/// A directory outside the driver's root, removed at the end.
struct Outside {
    dir: tempfile::TempDir,
}

impl Outside {
    fn new() -> Self {
        Outside {
            dir: tempfile::Builder::new()
                .prefix("ferrovol-outside-")
                .tempdir_in("/tmp")
                .expect("an outside temp dir"),
        }
    }

    fn path(&self) -> PathBuf {
        fs::canonicalize(self.dir.path()).expect("canonical outside dir")
    }

    /// Nothing mounted in it, and it holds exactly `entries`.
    fn assert_untouched(&self, entries: &[&str]) {
        assert!(
            mounts_under(&self.path()).is_empty(),
            "a mount escaped the root"
        );
        let mut found: Vec<String> = fs::read_dir(self.path())
            .expect("list the outside dir")
            .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
            .collect();
        found.sort();
        assert_eq!(found, entries, "the outside dir changed");
    }
}

fn refused<T: std::fmt::Debug>(result: Result<tonic::Response<T>, tonic::Status>, what: &str) {
    let status = expect_code(result, Code::InvalidArgument, what);
    let message = status.message();
    assert!(
        message.contains("outside") || message.contains("symbolic link") || message.contains(".."),
        "{what}: the message says why: {message}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn node_paths_outside_the_root_are_refused() {
    let d = Driver::start().await;
    let outside = Outside::new();
    let keep = outside.path().join("keep");
    fs::create_dir(&keep).expect("an empty dir outside");
    let cap = mount_cap("ext4");
    let volume = d.create("paths-outside", 64 << 20, cap.clone()).await;
    let id = volume.volume_id.clone();

    let mut stage = d.stage_request(&id, &cap);
    stage.staging_target_path = outside.path().join("staging").display().to_string();
    refused(
        d.node().node_stage_volume(stage).await,
        "NodeStage outside the root",
    );
    let mut stage = d.stage_request(&id, &cap);
    stage.staging_target_path = format!("{}/../../..{}", d.root.display(), keep.display());
    refused(
        d.node().node_stage_volume(stage).await,
        "NodeStage escaping with ..",
    );
    let mut stage = d.stage_request(&id, &cap);
    stage.staging_target_path = d.root.display().to_string();
    refused(
        d.node().node_stage_volume(stage).await,
        "NodeStage onto the root itself",
    );

    let staging = d.stage(&id, &cap).await;
    let mut publish = d.publish_request(&id, &cap, "outside", false);
    publish.target_path = outside.path().join("target").display().to_string();
    refused(
        d.node().node_publish_volume(publish).await,
        "NodePublish outside the root",
    );
    refused(
        d.node()
            .node_unpublish_volume(NodeUnpublishVolumeRequest {
                volume_id: id.clone(),
                target_path: keep.display().to_string(),
            })
            .await,
        "NodeUnpublish of a directory outside the root",
    );
    refused(
        d.node()
            .node_get_volume_stats(NodeGetVolumeStatsRequest {
                volume_id: id.clone(),
                volume_path: "/proc/self".to_owned(),
                staging_target_path: staging.display().to_string(),
            })
            .await,
        "NodeGetVolumeStats of /proc/self",
    );
    let mut expand = d.node_expand_request(&id, &outside.path(), &cap, 64 << 20);
    expand.volume_path = "/".to_owned() + "etc";
    refused(
        d.node().node_expand_volume(expand).await,
        "NodeExpandVolume of /etc",
    );
    refused(
        d.node()
            .node_unstage_volume(NodeUnstageVolumeRequest {
                volume_id: id.clone(),
                staging_target_path: keep.display().to_string(),
            })
            .await,
        "NodeUnstage outside the root",
    );
    outside.assert_untouched(&["keep"]);

    d.unstage(&id).await;
    d.delete(&id).await;
    d.finish().await;
}

/// Plants `link -> target` below the driver's root.
fn plant_link(link: &Path, target: &Path) {
    fs::create_dir_all(link.parent().expect("a parent")).expect("the link's dir");
    symlink(target, link).expect("plant a symlink");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn symlinks_below_the_root_are_not_followed() {
    let d = Driver::start().await;
    let outside = Outside::new();
    let cap = mount_cap("ext4");
    let volume = d.create("paths-links", 64 << 20, cap.clone()).await;
    let id = volume.volume_id.clone();

    // A link as a directory on the way, and a link as the last component.
    let via = d.root.join("targets/via");
    plant_link(&via, &outside.path());
    let last = d.root.join("targets/last");
    plant_link(&last, &outside.path());
    let staging_link = d.root.join("staging/linked");
    plant_link(&staging_link, &outside.path());

    let mut stage = d.stage_request(&id, &cap);
    stage.staging_target_path = staging_link.join("globalmount").display().to_string();
    refused(
        d.node().node_stage_volume(stage).await,
        "NodeStage through a link",
    );
    let mut stage = d.stage_request(&id, &cap);
    stage.staging_target_path = staging_link.display().to_string();
    refused(
        d.node().node_stage_volume(stage).await,
        "NodeStage onto a link",
    );

    let staging = d.stage(&id, &cap).await;
    for target in [via.join("mount"), last.clone()] {
        let mut publish = d.publish_request(&id, &cap, "unused", false);
        publish.target_path = target.display().to_string();
        refused(
            d.node().node_publish_volume(publish).await,
            &format!("NodePublish to {}", target.display()),
        );
        assert!(mount_at(&target).is_none());
    }
    refused(
        d.node()
            .node_unpublish_volume(NodeUnpublishVolumeRequest {
                volume_id: id.clone(),
                target_path: last.display().to_string(),
            })
            .await,
        "NodeUnpublish of a link",
    );
    assert!(
        fs::symlink_metadata(&last).is_ok_and(|m| m.file_type().is_symlink()),
        "the planted link is still there, untouched"
    );
    // The block path: a link where the device node would be bound.
    let block = d.create("paths-links-block", 32 << 20, block_cap()).await;
    d.stage(&block.volume_id, &block_cap()).await;
    let mut publish = d.publish_request(&block.volume_id, &block_cap(), "unused", false);
    publish.target_path = via.join("device").display().to_string();
    refused(
        d.node().node_publish_volume(publish).await,
        "block NodePublish through a link",
    );
    outside.assert_untouched(&[]);
    assert!(mount_at(&staging).is_some());

    d.unstage(&block.volume_id).await;
    d.delete(&block.volume_id).await;
    d.unstage(&id).await;
    d.delete(&id).await;
    d.finish().await;
}
