//! Crash at every step: for each point in `ferrovol::crash::POINTS` the driver is started
//! with the point armed (`FERROVOL_CRASH_AT`), the RPC that reaches it is sent and the
//! driver dies there by SIGKILL; the driver is started again without the point and the
//! same RPC is retried. The retry must succeed, the end state (pool files, records,
//! mounts, loop devices) must equal that of a run without the crash, the data written
//! before the crash must be intact, and after a full teardown nothing may remain: no
//! backing or snapshot file, no record, no loop device of the pool, no mount.
//!
//! Needs a build with the `crash-points` feature (`scripts/test.sh` has it); without it
//! the test fails, because a crash test that cannot crash would prove nothing.
//!
//! RPCs: CreateVolume (empty, restore, clone), DeleteVolume, CreateSnapshot,
//! ControllerExpandVolume, NodeExpandVolume, NodeStageVolume, NodeUnstageVolume, and
//! ListVolumes, ListSnapshots for the teardown.

use std::collections::BTreeMap;
use std::fs;
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use ferrovol::csi::v1::{
    ControllerExpandVolumeRequest, DeleteVolumeRequest, ListSnapshotsRequest, ListVolumesRequest,
    NodeExpandVolumeRequest, NodeStageVolumeRequest, NodeUnstageVolumeRequest, VolumeCapability,
};
use ferrovol::ids::{SnapshotId, VolumeId};
use tokio::sync::Semaphore;
use tonic::Status;

use crate::content::{verify_files, write_files};
use crate::harness::{Driver, Options};
use crate::host::{loops_backed_under, mounts_under};
use crate::requests::{
    create_from, create_request, from_snapshot, from_volume, mount_cap, ok, range,
    snapshot_request, MIB, MIN_XFS,
};

/// The RPC a crash point is reached in, with the state it starts from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Scenario {
    /// CreateVolume of an empty volume.
    Create,
    /// DeleteVolume of an unstaged volume.
    Delete,
    /// CreateSnapshot of a staged volume holding data (frozen around the copy).
    Snapshot,
    /// CreateVolume from a snapshot.
    Restore,
    /// CreateVolume from a staged volume holding data.
    Clone,
    /// ControllerExpandVolume of an unstaged volume holding data.
    Expand,
    /// NodeExpandVolume of a staged XFS volume, with `--expansion node`.
    NodeExpand,
    /// NodeStageVolume of a blank volume (mkfs).
    StageBlank,
    /// NodeStageVolume of a volume holding a filesystem with data.
    StageExisting,
    /// NodeUnstageVolume of a staged volume holding data.
    Unstage,
}

use Scenario::*;

/// Every scenario, for the reference runs.
const SCENARIOS: &[Scenario] = &[
    Create,
    Delete,
    Snapshot,
    Restore,
    Clone,
    Expand,
    NodeExpand,
    StageBlank,
    StageExisting,
    Unstage,
];

/// The scenarios that reach `point`. A point without one fails the test: every point in
/// the driver's list must be crashed at.
fn scenarios_for(point: &str) -> Vec<Scenario> {
    match point {
        "store.before_rename" => vec![Create],
        "copy.frozen" => vec![Snapshot, Clone],
        "copy.after_clone" => vec![Snapshot, Restore, Clone],
        "stage.before_mkfs" | "stage.after_mkfs" | "stage.after_format_record" => {
            vec![StageBlank]
        }
        p if p.starts_with("stage.") => vec![StageBlank, StageExisting],
        p if p.starts_with("create.") => vec![Create],
        p if p.starts_with("delete.") => vec![Delete],
        p if p.starts_with("snapshot.") => vec![Snapshot],
        p if p.starts_with("restore.") => vec![Restore],
        p if p.starts_with("clone.") => vec![Clone],
        p if p.starts_with("expand.") => vec![Expand],
        p if p.starts_with("node_expand.") => vec![NodeExpand],
        p if p.starts_with("unstage.") => vec![Unstage],
        other => panic!(
            "crash point {other} has no scenario in tests/sanity/crash.rs: add the RPC that reaches it"
        ),
    }
}

const SOURCE: &str = "crash-source";
const SNAPSHOT: &str = "crash-snapshot";
const RESTORED: &str = "crash-restored";
const CLONE: &str = "crash-clone";
/// Seed of the files written before the crash.
const SEED: u64 = 8_100;

fn source_id() -> String {
    VolumeId::from_name(SOURCE).to_string()
}

fn snapshot_id() -> String {
    SnapshotId::from_name(SNAPSHOT).to_string()
}

impl Scenario {
    /// The capability of the source volume.
    fn cap(self) -> VolumeCapability {
        match self {
            NodeExpand => mount_cap("xfs"),
            _ => mount_cap("ext4"),
        }
    }

    fn options(self) -> Options {
        let mut opts = Options::default();
        if self == NodeExpand {
            opts.extra_args = vec!["--expansion".into(), "node".into()];
        }
        opts
    }

    fn source_bytes(self) -> i64 {
        match self {
            NodeExpand => MIN_XFS,
            _ => 32 * MIB,
        }
    }

    /// Brings a fresh driver to the state the RPC starts from.
    async fn setup(self, d: &Driver) {
        let cap = self.cap();
        if self == Create {
            return;
        }
        let id = d
            .create(SOURCE, self.source_bytes(), cap.clone())
            .await
            .volume_id;
        if matches!(self, Delete | StageBlank) {
            return;
        }
        let staging = d.stage(&id, &cap).await;
        write_files(&staging, SEED);
        match self {
            Restore => {
                d.snapshot(SNAPSHOT, &id).await;
                d.unstage(&id).await;
            }
            StageExisting | Expand => d.unstage(&id).await,
            _ => {}
        }
    }

    /// The RPC under test.
    async fn rpc(self, d: &Driver) -> Result<(), Status> {
        let cap = self.cap();
        let id = source_id();
        let mut controller = d.controller();
        let mut node = d.node();
        match self {
            Create => controller
                .create_volume(create_request(SOURCE, self.source_bytes(), vec![cap]))
                .await
                .map(drop),
            Delete => controller
                .delete_volume(DeleteVolumeRequest {
                    volume_id: id,
                    ..Default::default()
                })
                .await
                .map(drop),
            Snapshot => controller
                .create_snapshot(snapshot_request(SNAPSHOT, &id))
                .await
                .map(drop),
            Restore => controller
                .create_volume(create_from(
                    RESTORED,
                    32 * MIB,
                    cap,
                    from_snapshot(&snapshot_id()),
                ))
                .await
                .map(drop),
            Clone => controller
                .create_volume(create_from(CLONE, 48 * MIB, cap, from_volume(&id)))
                .await
                .map(drop),
            Expand => controller
                .controller_expand_volume(ControllerExpandVolumeRequest {
                    volume_id: id,
                    capacity_range: range(64 * MIB, 0),
                    ..Default::default()
                })
                .await
                .map(drop),
            NodeExpand => {
                let staging = d.staging_path(&id);
                node.node_expand_volume(NodeExpandVolumeRequest {
                    volume_id: id,
                    volume_path: staging.display().to_string(),
                    staging_target_path: staging.display().to_string(),
                    capacity_range: range(MIN_XFS + 100 * MIB, 0),
                    volume_capability: Some(cap),
                    ..Default::default()
                })
                .await
                .map(drop)
            }
            StageBlank | StageExisting => {
                let req: NodeStageVolumeRequest = d.stage_request(&id, &cap);
                node.node_stage_volume(req).await.map(drop)
            }
            Unstage => node
                .node_unstage_volume(NodeUnstageVolumeRequest {
                    staging_target_path: d.staging_path(&id).display().to_string(),
                    volume_id: id,
                })
                .await
                .map(drop),
        }
    }

    /// After the RPC succeeded: the data written before it is intact and the new
    /// volumes hold it. Staging a new volume for the check is undone before returning.
    async fn check_data(self, d: &Driver) {
        let cap = self.cap();
        let id = source_id();
        match self {
            Snapshot | Clone | NodeExpand | StageExisting => {
                verify_files(&d.staging_path(&id), SEED);
            }
            StageBlank => {
                write_files(&d.staging_path(&id), SEED + 1);
                verify_files(&d.staging_path(&id), SEED + 1);
            }
            Unstage | Expand => {
                // An expanded volume's filesystem grows at this stage.
                let staging = d.stage(&id, &cap).await;
                verify_files(&staging, SEED);
                d.unstage(&id).await;
            }
            _ => {}
        }
        // Every copy holds the data: restore the snapshot, or look into the clone.
        let copy = match self {
            Snapshot => {
                let restored = d
                    .create_with(create_from(
                        RESTORED,
                        32 * MIB,
                        cap.clone(),
                        from_snapshot(&snapshot_id()),
                    ))
                    .await;
                Some(restored.volume_id)
            }
            Restore => Some(VolumeId::from_name(RESTORED).to_string()),
            Clone => Some(VolumeId::from_name(CLONE).to_string()),
            _ => None,
        };
        if let Some(copy) = copy {
            let staging = d.stage(&copy, &cap).await;
            verify_files(&staging, SEED);
            d.unstage(&copy).await;
        }
    }
}

/// What a run leaves behind, with the temp dir's path, times and loop numbers taken out,
/// so that two runs in two temp dirs compare equal when they did the same.
#[derive(Debug, PartialEq, Eq)]
struct EndState {
    /// Files in the pool (path below the pool, size).
    pool_files: Vec<(String, u64)>,
    /// Files in the state dir (path below it, record without times).
    records: Vec<(String, serde_json::Value)>,
    /// Mounts below the temp dir (path below it, fs type, read-only, filesystem size).
    mounts: Vec<(String, String, bool, u64)>,
    /// Backing files (below the pool) of attached loop devices.
    loops: Vec<String>,
}

fn files_below(dir: &Path) -> Vec<PathBuf> {
    let mut found = Vec::new();
    let mut todo = vec![dir.to_owned()];
    while let Some(d) = todo.pop() {
        let Ok(entries) = fs::read_dir(&d) else {
            continue;
        };
        for entry in entries.filter_map(Result::ok) {
            let path = entry.path();
            if path.is_dir() {
                todo.push(path);
            } else {
                found.push(path);
            }
        }
    }
    found.sort();
    found
}

fn relative(path: &Path, base: &Path) -> String {
    path.strip_prefix(base)
        .unwrap_or(path)
        .display()
        .to_string()
}

fn without_times(value: &mut serde_json::Value) {
    if let serde_json::Value::Object(map) = value {
        for key in ["created_at", "created_secs", "created_nanos"] {
            map.remove(key);
        }
    }
}

fn end_state(d: &Driver) -> EndState {
    let root = d.root.display().to_string();
    let pool_files = files_below(&d.pool)
        .into_iter()
        .filter(|p| p.file_name().is_some_and(|n| n != ".ferrovol-state"))
        .map(|p| {
            let size = fs::metadata(&p).map(|m| m.len()).unwrap_or(0);
            (relative(&p, &d.pool), size)
        })
        .collect();
    let records = files_below(&d.state)
        .into_iter()
        .filter(|p| p.file_name().is_some_and(|n| n != "ops.lock"))
        .map(|p| {
            let text = fs::read_to_string(&p)
                .unwrap_or_default()
                .replace(&root, "<root>");
            let mut value = serde_json::from_str(&text).unwrap_or(serde_json::Value::String(text));
            without_times(&mut value);
            (relative(&p, &d.state), value)
        })
        .collect();
    let mounts = mounts_under(&d.root)
        .into_iter()
        .map(|m| {
            let size = nix::sys::statvfs::statvfs(&m.mount_point)
                .map(|s| s.blocks() * s.fragment_size())
                .unwrap_or(0);
            let ro = m.is_read_only();
            (relative(&m.mount_point, &d.root), m.fs_type, ro, size)
        })
        .collect();
    let mut loops: Vec<String> = loops_backed_under(&d.pool)
        .into_iter()
        .map(|l| relative(Path::new(&l.backing_file), &d.pool))
        .collect();
    loops.sort();
    EndState {
        pool_files,
        records,
        mounts,
        loops,
    }
}

/// Whether a file can be created and synced in `dir` within `limit`: a filesystem left
/// frozen blocks the writer (the thread is left behind then; a later thaw releases it).
fn writable_within(dir: &Path, limit: Duration) -> bool {
    let path = dir.join("after-restart.txt");
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let done = fs::write(&path, b"written after the restart")
            .and_then(|()| fs::File::open(&path)?.sync_all())
            .and_then(|()| fs::remove_file(&path));
        let _ = tx.send(done.is_ok());
    });
    rx.recv_timeout(limit).unwrap_or(false)
}

/// Tears down whatever a run left: unstages staged volumes, deletes snapshots and
/// volumes; then asserts that the pool and the state dir hold nothing and, through
/// `finish`, that no mount and no loop device of the pool remains.
async fn teardown(d: Driver, what: &str) {
    for record in files_below(&d.state.join("staged")) {
        let id = record
            .file_stem()
            .map(|s| s.to_string_lossy().into_owned())
            .unwrap_or_default();
        ok(
            d.node()
                .node_unstage_volume(NodeUnstageVolumeRequest {
                    staging_target_path: d.staging_path(&id).display().to_string(),
                    volume_id: id.clone(),
                })
                .await,
            &format!("{what}: NodeUnstageVolume {id} in the teardown"),
        );
    }
    let snapshots = ok(
        d.controller()
            .list_snapshots(ListSnapshotsRequest::default())
            .await,
        "ListSnapshots",
    );
    for entry in snapshots.entries {
        if let Some(s) = entry.snapshot {
            d.delete_snapshot(&s.snapshot_id).await;
        }
    }
    let volumes = ok(
        d.controller()
            .list_volumes(ListVolumesRequest::default())
            .await,
        "ListVolumes",
    );
    for entry in volumes.entries {
        if let Some(v) = entry.volume {
            d.delete(&v.volume_id).await;
        }
    }
    let left = end_state(&d);
    assert!(
        left.pool_files.is_empty() && left.records.is_empty(),
        "{what}: left behind after the teardown: {left:#?}"
    );
    d.finish().await;
}

/// A run without a crash: the end state every crash at this scenario must reach.
async fn reference(scenario: Scenario) -> EndState {
    let d = Driver::start_with(scenario.options()).await;
    scenario.setup(&d).await;
    if let Err(status) = scenario.rpc(&d).await {
        panic!("{scenario:?} without a crash failed: {status:?}");
    }
    let state = end_state(&d);
    scenario.check_data(&d).await;
    teardown(d, &format!("{scenario:?} reference")).await;
    state
}

/// Crashes `scenario` at `point`, restarts, retries, compares and tears down.
async fn crash_at(scenario: Scenario, point: &str, want: &EndState) {
    let what = format!("{scenario:?} at {point}");
    let mut d = Driver::start_with(scenario.options()).await;
    scenario.setup(&d).await;
    let stopped = d.stop().await;
    assert!(stopped.success(), "{what}: driver stop {stopped}");

    d.opts.env = vec![(ferrovol::crash::ENV.to_owned(), point.to_owned())];
    d.spawn_and_connect().await;
    let answer = tokio::time::timeout(Duration::from_secs(60), scenario.rpc(&d)).await;
    let status = d.wait_for_exit(Duration::from_secs(30)).await;
    assert_eq!(
        status.and_then(|s| s.signal()),
        Some(libc::SIGKILL),
        "{what}: the driver did not die at the crash point (exit {status:?}; the RPC answered {answer:?})\n{}",
        d.log_text()
    );

    d.opts.env.clear();
    d.spawn_and_connect().await;
    if point == "copy.frozen" {
        // The source's filesystem was frozen when the process died. The pod writing to it
        // must not hang until the CO happens to retry.
        let staging = d.staging_path(&source_id());
        if !writable_within(&staging, Duration::from_secs(5)) {
            let _ = std::process::Command::new("fsfreeze")
                .arg("--unfreeze")
                .arg(&staging)
                .status();
            panic!(
                "{what}: the staged volume is still frozen after the restart\n{}",
                d.log_text()
            );
        }
    }
    if let Err(status) = scenario.rpc(&d).await {
        panic!(
            "{what}: the retry after the restart failed: {:?}: {}\n{}",
            status.code(),
            status.message(),
            d.log_text()
        );
    }
    let got = end_state(&d);
    assert_eq!(
        &got,
        want,
        "{what}: the end state differs from a run without the crash\n{}",
        d.log_text()
    );
    scenario.check_data(&d).await;
    teardown(d, &what).await;
}

fn panic_text(e: tokio::task::JoinError) -> String {
    match e.try_into_panic() {
        Ok(p) => p
            .downcast_ref::<String>()
            .cloned()
            .or_else(|| p.downcast_ref::<&str>().map(|s| (*s).to_owned()))
            .unwrap_or_else(|| "panic".to_owned()),
        Err(e) => e.to_string(),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_crash_at_every_point_is_healed_by_the_retry() {
    assert!(
        ferrovol::crash::enabled(),
        "this build has no crash points: run with `--features crash-points` (scripts/test.sh does); \
         the crash test cannot pass without them"
    );
    crate::harness::require_root();
    let started = Instant::now();
    // How many drivers run at once; each is mostly waiting on mkfs, fsync and mounts.
    let jobs = std::env::var("FERROVOL_CRASH_JOBS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(3usize);
    let slots = Arc::new(Semaphore::new(jobs));

    let mut references = Vec::new();
    for &scenario in SCENARIOS {
        let slots = Arc::clone(&slots);
        references.push((
            scenario,
            tokio::spawn(async move {
                let _slot = slots.acquire_owned().await.expect("semaphore");
                reference(scenario).await
            }),
        ));
    }
    let mut wanted = BTreeMap::new();
    let mut failures = Vec::new();
    for (scenario, task) in references {
        match task.await {
            Ok(state) => {
                wanted.insert(scenario, Arc::new(state));
            }
            Err(e) => failures.push(format!("{scenario:?} reference: {}", panic_text(e))),
        }
    }
    assert!(
        failures.is_empty(),
        "reference runs failed:\n{}",
        failures.join("\n\n")
    );

    let mut runs = Vec::new();
    for &point in ferrovol::crash::POINTS {
        for scenario in scenarios_for(point) {
            let want = Arc::clone(&wanted[&scenario]);
            let slots = Arc::clone(&slots);
            runs.push((
                scenario,
                point,
                tokio::spawn(async move {
                    let _slot = slots.acquire_owned().await.expect("semaphore");
                    let t = Instant::now();
                    crash_at(scenario, point, &want).await;
                    t.elapsed()
                }),
            ));
        }
    }
    let count = runs.len();
    for (scenario, point, task) in runs {
        match task.await {
            Ok(took) => eprintln!("crash {scenario:?} at {point}: healed in {took:.1?}"),
            Err(e) => failures.push(format!("{scenario:?} at {point}: {}", panic_text(e))),
        }
    }
    eprintln!(
        "{count} crashes at {} points in {:.1?} ({jobs} at a time)",
        ferrovol::crash::POINTS.len(),
        started.elapsed()
    );
    assert!(
        failures.is_empty(),
        "{} of {count} crash runs failed:\n{}",
        failures.len(),
        failures.join("\n\n")
    );
}
