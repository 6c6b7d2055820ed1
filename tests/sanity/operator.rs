//! The operator commands of the binary: `volumes list|show`, `snapshots list`, `doctor`
//! and `gc`, run as an operator runs them, beside a live driver.
//!
//! The listings must say what the driver says over CSI (ids, sizes, sources) plus what
//! only the records know (PVC names, staged and published state). `gc` must find a
//! planted orphan backing file, an orphan snapshot file, stale loop devices and a stale
//! mount, remove exactly those, and leave every volume, its mounts and data, and every
//! file the driver does not name, alone. While gc holds the operations lock, an RPC gets
//! ABORTED.

use std::collections::{BTreeSet, HashMap};
use std::fs::{self, File};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use ferrovol::csi::v1::*;
use ferrovol::ids::{SnapshotId, VolumeId};
use serde_json::Value;
use tonic::Code;

use crate::content::{verify_files, write_files};
use crate::harness::Driver;
use crate::host::{loop_devices, mount_at, run_tool};
use crate::requests::*;

/// Runs `ferrovol ARGS --state-dir S --pool-dir P` against the driver's directories.
fn ferrovol(d: &Driver, args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_ferrovol"));
    cmd.args(args)
        .arg("--state-dir")
        .arg(&d.state)
        .arg("--pool-dir")
        .arg(&d.pool);
    for (key, value) in env {
        cmd.env(key, value);
    }
    cmd.output().expect("run the ferrovol binary")
}

fn stdout(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Runs a command that must succeed and print JSON.
fn json_of(d: &Driver, args: &[&str]) -> Value {
    let out = ferrovol(d, args, &[]);
    assert!(
        out.status.success(),
        "ferrovol {args:?} failed with {}:\n{}{}",
        out.status,
        stdout(&out),
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("ferrovol {args:?} printed no JSON ({e}):\n{}", stdout(&out)))
}

fn with_params(mut req: CreateVolumeRequest, params: &[(&str, &str)]) -> CreateVolumeRequest {
    req.parameters = params
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect::<HashMap<_, _>>();
    req
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn listings_match_the_driver() {
    let d = Driver::start().await;
    let cap = mount_cap("ext4");
    let a = d
        .create_with(with_params(
            create_request("pv-list-a", 64 << 20, vec![cap.clone()]),
            &[
                ("csi.storage.k8s.io/pvc/name", "data-a"),
                ("csi.storage.k8s.io/pvc/namespace", "ns1"),
                ("csi.storage.k8s.io/pv/name", "pv-list-a"),
            ],
        ))
        .await;
    let b = d.create("pv-list-b", 32 << 20, block_cap()).await;
    d.stage(&a.volume_id, &cap).await;
    let target = d.publish(&a.volume_id, &cap, "list-pod", false).await;
    let mut snap = snapshot_request("snap-list-a", &a.volume_id);
    snap.parameters = HashMap::from([
        (
            "csi.storage.k8s.io/volumesnapshot/name".to_owned(),
            "snap-a".to_owned(),
        ),
        (
            "csi.storage.k8s.io/volumesnapshot/namespace".to_owned(),
            "ns1".to_owned(),
        ),
    ]);
    let snapshot = d.snapshot_with(snap).await;

    // volumes list --output json against ListVolumes.
    let listed = ok(
        d.controller()
            .list_volumes(ListVolumesRequest::default())
            .await,
        "ListVolumes",
    );
    let views = json_of(&d, &["volumes", "list", "--output", "json"]);
    let views = views.as_array().expect("a JSON array");
    let from_cli: BTreeSet<(String, u64)> = views
        .iter()
        .map(|v| {
            (
                v["volume_id"].as_str().expect("id").to_owned(),
                v["capacity_bytes"].as_u64().expect("capacity"),
            )
        })
        .collect();
    let from_csi: BTreeSet<(String, u64)> = listed
        .entries
        .iter()
        .filter_map(|e| e.volume.as_ref())
        .map(|v| {
            (
                v.volume_id.clone(),
                u64::try_from(v.capacity_bytes).expect("size"),
            )
        })
        .collect();
    assert_eq!(
        from_cli, from_csi,
        "volumes list says what ListVolumes says"
    );
    let view_a = views
        .iter()
        .find(|v| v["volume_id"] == a.volume_id.as_str())
        .expect("volume a listed");
    assert_eq!(view_a["pvc"], "ns1/data-a");
    assert_eq!(view_a["pv"], "pv-list-a");
    assert_eq!(view_a["node_id"], "sanity-node");
    assert_eq!(view_a["staged"]["access"], "ext4");
    assert_eq!(
        view_a["staged"]["targets"],
        serde_json::json!([target.display().to_string()])
    );
    let view_b = views
        .iter()
        .find(|v| v["volume_id"] == b.volume_id.as_str())
        .expect("volume b listed");
    assert!(
        view_b["staged"].is_null() && view_b["pvc"].is_null(),
        "{view_b}"
    );

    // The table says the same for people.
    let out = ferrovol(&d, &["volumes", "list"], &[]);
    assert!(out.status.success());
    let text = stdout(&out);
    let mut lines = text.lines();
    let header = lines.next().expect("a header");
    assert!(header.starts_with("VOLUME") && header.contains("PVC") && header.contains("STATE"));
    let row_a = text
        .lines()
        .find(|l| l.starts_with(&a.volume_id))
        .unwrap_or_else(|| panic!("no row for a:\n{text}"));
    for cell in ["ns1/data-a", "64 MiB", "sanity-node", "published x1"] {
        assert!(row_a.contains(cell), "row {row_a:?} lacks {cell:?}");
    }

    // volumes show: the record plus the machine.
    let shown = json_of(&d, &["volumes", "show", &a.volume_id, "--output", "json"]);
    assert_eq!(
        shown["backing_file"],
        d.backing_file(&a.volume_id).display().to_string()
    );
    assert_eq!(shown["backing_file_exists"], true);
    let device = d.loop_of(&a.volume_id).expect("a is attached").device;
    assert_eq!(
        shown["loop_devices"],
        serde_json::json!([device.display().to_string()])
    );
    let missing = ferrovol(
        &d,
        &["volumes", "show", &format!("fv-{}", "0".repeat(32))],
        &[],
    );
    assert_eq!(
        missing.status.code(),
        Some(2),
        "an unknown volume is an error"
    );
    let hostile = ferrovol(&d, &["volumes", "show", "../../etc/passwd"], &[]);
    assert_eq!(hostile.status.code(), Some(2), "a path is no volume id");

    // snapshots list against ListSnapshots.
    let snaps = json_of(&d, &["snapshots", "list", "--output", "json"]);
    let snaps = snaps.as_array().expect("a JSON array");
    assert_eq!(snaps.len(), 1);
    assert_eq!(snaps[0]["snapshot_id"], snapshot.snapshot_id.as_str());
    assert_eq!(snaps[0]["source_volume_id"], a.volume_id.as_str());
    assert_eq!(snaps[0]["volume_snapshot"], "ns1/snap-a");
    assert_eq!(snaps[0]["size_bytes"].as_i64(), Some(snapshot.size_bytes));
    let table = stdout(&ferrovol(&d, &["snapshots", "list"], &[]));
    assert!(
        table.contains(&snapshot.snapshot_id) && table.contains("ns1/snap-a"),
        "{table}"
    );

    d.delete_snapshot(&snapshot.snapshot_id).await;
    d.unpublish(&a.volume_id, &target).await;
    d.unstage(&a.volume_id).await;
    d.delete(&a.volume_id).await;
    d.delete(&b.volume_id).await;
    d.finish().await;
}

fn sparse_file(path: &Path, bytes: u64) {
    File::create(path)
        .and_then(|f| f.set_len(bytes))
        .unwrap_or_else(|e| panic!("make {}: {e}", path.display()));
}

fn findings(report: &Value) -> BTreeSet<(String, String, String)> {
    report
        .as_array()
        .expect("a JSON array")
        .iter()
        .map(|f| {
            (
                f["kind"].as_str().expect("kind").to_owned(),
                f["path"].as_str().expect("path").to_owned(),
                f["action"].as_str().expect("action").to_owned(),
            )
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gc_removes_only_what_no_record_owns() {
    let d = Driver::start().await;
    let cap = mount_cap("ext4");
    let kept = d.create("gc-kept", 64 << 20, cap.clone()).await;
    d.stage(&kept.volume_id, &cap).await;
    let target = d.publish(&kept.volume_id, &cap, "gc-pod", false).await;
    write_files(&target, 5);
    let idle = d.create("gc-idle", 32 << 20, block_cap()).await;

    // The planted mess.
    let orphan = d
        .pool
        .join(format!("{}.img", VolumeId::from_name("gc-orphan")));
    sparse_file(&orphan, 16 << 20);
    fs::create_dir_all(d.pool.join("snapshots")).expect("snapshot dir");
    let orphan_snapshot = d
        .pool
        .join("snapshots")
        .join(format!("{}.img", SnapshotId::from_name("gc-orphan-snap")));
    sparse_file(&orphan_snapshot, 16 << 20);
    let stale = d
        .pool
        .join(format!("{}.img", VolumeId::from_name("gc-stale")));
    sparse_file(&stale, 32 << 20);
    let stale_loop = run_tool("losetup", &["-f", "--show", &stale.display().to_string()]);
    run_tool("mkfs.ext4", &["-q", &stale_loop]);
    let stale_mount = d.root.join("stale-mount");
    fs::create_dir_all(&stale_mount).expect("mount dir");
    run_tool("mount", &[&stale_loop, &stale_mount.display().to_string()]);
    let idle_file = d.backing_file(&idle.volume_id);
    let idle_loop = run_tool(
        "losetup",
        &["-f", "--show", &idle_file.display().to_string()],
    );
    // A mount of a staged volume's device that no record names, as kubelet makes for a
    // subPath: it is kubelet's, and stays.
    fs::create_dir_all(target.join("sub")).expect("a subdir");
    let subpath = d.root.join("subpath-bind");
    fs::create_dir_all(&subpath).expect("subpath dir");
    run_tool(
        "mount",
        &[
            "--bind",
            &target.join("sub").display().to_string(),
            &subpath.display().to_string(),
        ],
    );
    // Not the driver's names: never touched.
    let foreign = [d.pool.join("notes.txt"), d.pool.join("fv-short.img")];
    for path in &foreign {
        fs::write(path, b"someone else's").expect("plant a foreign file");
    }

    let expected: BTreeSet<(String, String)> = [
        ("mount", stale_mount.display().to_string()),
        ("loop_device", stale_loop.clone()),
        ("loop_device", idle_loop.clone()),
        ("backing_file", orphan.display().to_string()),
        ("backing_file", stale.display().to_string()),
        ("snapshot_file", orphan_snapshot.display().to_string()),
    ]
    .into_iter()
    .map(|(k, p)| (k.to_owned(), p))
    .collect();
    let with_action = |action: &str| -> BTreeSet<(String, String, String)> {
        expected
            .iter()
            .map(|(k, p)| (k.clone(), p.clone(), action.to_owned()))
            .collect()
    };

    // Judged by another state directory's records, everything would look orphaned: gc
    // refuses a pool that names another owner.
    let wrong_state = d.root.join("wrong-state");
    fs::create_dir_all(&wrong_state).expect("an empty state dir");
    let out = Command::new(env!("CARGO_BIN_EXE_ferrovol"))
        .args(["gc", "--state-dir"])
        .arg(&wrong_state)
        .arg("--pool-dir")
        .arg(&d.pool)
        .output()
        .expect("run gc");
    assert_eq!(
        out.status.code(),
        Some(2),
        "gc ran with a foreign state dir"
    );
    assert!(String::from_utf8_lossy(&out.stderr).contains("--state-dir"));
    assert!(
        orphan.exists() && idle_file.exists(),
        "the refused gc removed something"
    );

    // --dry-run lists exactly the mess and changes nothing.
    let dry = json_of(&d, &["gc", "--dry-run", "--output", "json"]);
    assert_eq!(findings(&dry), with_action("would_remove"), "{dry:#}");
    assert!(orphan.exists() && orphan_snapshot.exists() && stale.exists());
    assert!(mount_at(&stale_mount).is_some(), "dry run unmounted");
    let attached: BTreeSet<String> = loop_devices()
        .into_iter()
        .map(|l| l.device.display().to_string())
        .collect();
    assert!(attached.contains(&stale_loop) && attached.contains(&idle_loop));

    // The real run removes exactly that.
    let table = stdout(&ferrovol(&d, &["gc", "--dry-run"], &[]));
    assert!(
        table.contains("would remove") && table.contains(&stale_loop),
        "{table}"
    );
    let done = json_of(&d, &["gc", "--output", "json"]);
    assert_eq!(findings(&done), with_action("removed"), "{done:#}");
    assert!(!orphan.exists() && !orphan_snapshot.exists() && !stale.exists());
    assert!(
        mount_at(&stale_mount).is_none(),
        "the stale mount is still there"
    );
    let attached: BTreeSet<String> = loop_devices()
        .into_iter()
        .map(|l| l.device.display().to_string())
        .collect();
    assert!(!attached.contains(&stale_loop) && !attached.contains(&idle_loop));

    // Everything that belongs to a volume, or to someone else, is untouched.
    for path in &foreign {
        assert!(path.exists(), "gc removed {}", path.display());
    }
    assert!(idle_file.exists(), "gc removed the idle volume's file");
    assert!(
        mount_at(&target).is_some(),
        "gc unmounted a published volume"
    );
    assert!(
        mount_at(&subpath).is_some(),
        "gc unmounted kubelet's subPath bind"
    );
    run_tool("umount", &[&subpath.display().to_string()]);
    verify_files(&target, 5);
    assert!(
        d.loop_of(&kept.volume_id).is_some(),
        "gc detached a staged volume"
    );
    let listed = ok(
        d.controller()
            .list_volumes(ListVolumesRequest::default())
            .await,
        "ListVolumes",
    );
    assert_eq!(listed.entries.len(), 2);
    let again = json_of(&d, &["gc", "--output", "json"]);
    assert_eq!(again, serde_json::json!([]), "a second gc finds nothing");

    d.unpublish(&kept.volume_id, &target).await;
    d.unstage(&kept.volume_id).await;
    d.delete(&kept.volume_id).await;
    d.delete(&idle.volume_id).await;
    d.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn operations_wait_out_a_running_gc() {
    let d = Driver::start().await;
    let lock_path = d.state.join("ops.lock");
    let file = File::open(&lock_path).expect("the driver made its operations lock");
    // Stand in for a running `ferrovol gc`: hold the lock exclusively.
    let held = nix::fcntl::Flock::lock(file, nix::fcntl::FlockArg::LockExclusiveNonblock)
        .map_err(|(_, e)| e)
        .expect("no operation runs, so the lock is free");
    let status = expect_code(
        d.controller()
            .create_volume(create_request("during-gc", 32 << 20, vec![block_cap()]))
            .await,
        Code::Aborted,
        "CreateVolume while gc runs",
    );
    assert!(status.message().contains("gc"), "{}", status.message());
    // And gc itself gives up on a held lock instead of tearing things down.
    let out = ferrovol(&d, &["gc", "--wait-secs", "0"], &[]);
    assert_eq!(
        out.status.code(),
        Some(2),
        "gc ran although the lock was held"
    );
    drop(held);
    let volume = d.create("during-gc", 32 << 20, block_cap()).await;
    d.delete(&volume.volume_id).await;
    d.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn doctor_names_each_problem() {
    let d = Driver::start().await;
    let report = json_of(&d, &["doctor", "--output", "json"]);
    let status_of = |report: &Value, check: &str| -> String {
        report
            .as_array()
            .expect("a JSON array")
            .iter()
            .find(|c| c["check"] == check)
            .and_then(|c| c["status"].as_str())
            .unwrap_or_else(|| panic!("no {check:?} check in {report:#}"))
            .to_owned()
    };
    for check in [
        "loop devices",
        "pool directory",
        "state directory",
        "blkid",
        "ext4 tools",
    ] {
        assert_eq!(status_of(&report, check), "ok", "{check}: {report:#}");
    }

    // A pool that is a file, not a directory.
    let not_a_dir: PathBuf = d.root.join("pool-file");
    fs::write(&not_a_dir, b"x").expect("a file");
    let out = Command::new(env!("CARGO_BIN_EXE_ferrovol"))
        .args(["doctor", "--state-dir"])
        .arg(&d.state)
        .arg("--pool-dir")
        .arg(&not_a_dir)
        .output()
        .expect("run doctor");
    assert_eq!(out.status.code(), Some(1));
    let text = stdout(&out);
    let line = text
        .lines()
        .find(|l| l.starts_with("pool directory"))
        .unwrap_or_else(|| panic!("no pool line:\n{text}"));
    assert!(
        line.contains("FAIL") && line.contains("not a directory"),
        "{line}"
    );

    // No tools on $PATH.
    let out = ferrovol(&d, &["doctor"], &[("PATH", "/nonexistent")]);
    assert_eq!(out.status.code(), Some(1));
    let text = stdout(&out);
    for needle in ["blkid", "mkfs.ext4", "e2fsprogs"] {
        assert!(
            text.contains(needle),
            "doctor does not name {needle}:\n{text}"
        );
    }
    d.finish().await;
}
