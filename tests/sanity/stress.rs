//! Concurrency stress: many clients at once issue overlapping CreateVolume, DeleteVolume,
//! CreateSnapshot, DeleteSnapshot, NodeStage, NodeUnstage, NodePublish and NodeUnpublish
//! calls on a few shared names (and some calls of their own), chosen by a seeded random
//! stream. The seed is printed; `FERROVOL_STRESS_SEED=<n>` replays a run.
//!
//! Asserted:
//! - every answer is one a correct driver may give in some interleaving (OK, ABORTED for
//!   a volume busy with another call, NOT_FOUND for one deleted meanwhile,
//!   FAILED_PRECONDITION for a volume still staged or published, or not staged yet), never
//!   INTERNAL, UNKNOWN or a hang;
//! - a call answered ABORTED succeeds or gets a definite answer when retried;
//! - no duplicate volumes: one id per name (also when the same name comes with two
//!   sizes at once), one record per pool file and back, of the same size, at most one
//!   loop device per volume and one mount per path;
//! - the state is not corrupted: afterwards every volume can be created, staged, written,
//!   published, snapshotted and torn down, each call first time;
//! - nothing leaks: no file, record, loop device or mount once everything is deleted.
//!
//! Bounded: a fixed number of clients and calls, and a deadline for the whole run.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use ferrovol::csi::v1::volume_capability::access_mode::Mode;
use ferrovol::csi::v1::{
    DeleteSnapshotRequest, DeleteVolumeRequest, ListSnapshotsRequest, ListVolumesRequest,
    NodeUnpublishVolumeRequest, NodeUnstageVolumeRequest, VolumeCapability,
};
use ferrovol::ids::{SnapshotId, VolumeId};
use tonic::{Code, Status};

use crate::content::{verify_files, write_files};
use crate::harness::Driver;
use crate::host::{loops_backed_under, mount_count_at, mounts_under};
use crate::requests::{create_request, mount_cap_mode, ok, snapshot_request, MIB};

/// Clients running at once.
const CLIENTS: usize = 8;
/// Calls per client.
const CALLS: usize = 50;
/// Shared volume names.
const VOLUMES: usize = 4;
/// How long an ABORTED call is retried before the test gives up on the driver.
const RETRY_FOR: Duration = Duration::from_secs(30);
/// Deadline of the concurrent phase.
const DEADLINE: Duration = Duration::from_secs(120);

/// xorshift64*: a small seeded stream, enough to pick calls.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    fn below(&mut self, n: usize) -> usize {
        usize::try_from(self.next() % n as u64).expect("small")
    }
}

fn volume_name(i: usize) -> String {
    format!("stress-vol-{i}")
}

fn volume_id(i: usize) -> String {
    VolumeId::from_name(&volume_name(i)).to_string()
}

/// Snapshot `s` is always of volume `s % VOLUMES`, so a repeated name never names another
/// source (that would be a legitimate ALREADY_EXISTS, not what this test is after).
fn snapshot_name(s: usize) -> String {
    format!("stress-snap-{s}")
}

fn cap() -> VolumeCapability {
    // Several targets per volume are allowed, so publishes do not refuse each other.
    mount_cap_mode("ext4", Mode::SingleNodeMultiWriter)
}

/// One call a client may make.
#[derive(Debug, Clone)]
enum Call {
    Create(usize),
    /// The same name with another size: conflicts with `Create` of a volume that exists.
    CreateBigger(usize),
    Delete(usize),
    Snapshot(usize),
    DeleteSnapshot(usize),
    Stage(usize),
    Unstage(usize),
    /// Volume and target label.
    Publish(usize, String),
    Unpublish(usize, String),
}

impl Call {
    fn pick(rng: &mut Rng, client: usize) -> Call {
        let v = rng.below(VOLUMES);
        // Targets: one shared by every client, and one of this client's own.
        let label = if rng.below(2) == 0 {
            format!("shared-{v}")
        } else {
            format!("c{client}-{v}")
        };
        match rng.below(11) {
            0 | 1 => Call::Create(v),
            10 => Call::CreateBigger(v),
            2 => Call::Delete(v),
            3 => Call::Snapshot(rng.below(VOLUMES * 2)),
            4 => Call::DeleteSnapshot(rng.below(VOLUMES * 2)),
            5 | 6 => Call::Stage(v),
            7 => Call::Unstage(v),
            8 => Call::Publish(v, label),
            _ => Call::Unpublish(v, label),
        }
    }

    /// The answers a correct driver may give to this call in some interleaving.
    fn allowed(&self, code: Code) -> bool {
        use Code::*;
        match self {
            Call::Create(_) | Call::DeleteSnapshot(_) => code == Ok,
            // The name exists with the smaller size.
            Call::CreateBigger(_) => matches!(code, Ok | AlreadyExists),
            // Still staged here.
            Call::Delete(_) => matches!(code, Ok | FailedPrecondition),
            // Source gone, or never made.
            Call::Snapshot(_) => matches!(code, Ok | NotFound),
            // Volume gone (or not made yet).
            Call::Stage(_) => matches!(code, Ok | NotFound),
            // Gone; or still published.
            Call::Unstage(_) => matches!(code, Ok | NotFound | FailedPrecondition),
            // Gone; or not staged.
            Call::Publish(..) => matches!(code, Ok | NotFound | FailedPrecondition),
            Call::Unpublish(..) => matches!(code, Ok | NotFound),
        }
    }

    async fn send(&self, d: &Driver) -> Result<(), Status> {
        let mut controller = d.controller();
        let mut node = d.node();
        let cap = cap();
        match self {
            Call::Create(v) | Call::CreateBigger(v) => {
                let size = if matches!(self, Call::Create(_)) {
                    16 * MIB
                } else {
                    32 * MIB
                };
                let volume = controller
                    .create_volume(create_request(&volume_name(*v), size, vec![cap]))
                    .await?
                    .into_inner()
                    .volume
                    .ok_or_else(|| Status::internal("CreateVolume answered no volume"))?;
                if volume.volume_id != volume_id(*v) {
                    return Err(Status::internal(format!(
                        "CreateVolume {} answered id {}, another than its first",
                        volume_name(*v),
                        volume.volume_id
                    )));
                }
                Ok(())
            }
            Call::Delete(v) => controller
                .delete_volume(DeleteVolumeRequest {
                    volume_id: volume_id(*v),
                    ..Default::default()
                })
                .await
                .map(drop),
            Call::Snapshot(s) => controller
                .create_snapshot(snapshot_request(
                    &snapshot_name(*s),
                    &volume_id(s % VOLUMES),
                ))
                .await
                .map(drop),
            Call::DeleteSnapshot(s) => controller
                .delete_snapshot(DeleteSnapshotRequest {
                    snapshot_id: SnapshotId::from_name(&snapshot_name(*s)).to_string(),
                    ..Default::default()
                })
                .await
                .map(drop),
            Call::Stage(v) => node
                .node_stage_volume(d.stage_request(&volume_id(*v), &cap))
                .await
                .map(drop),
            Call::Unstage(v) => node
                .node_unstage_volume(NodeUnstageVolumeRequest {
                    volume_id: volume_id(*v),
                    staging_target_path: d.staging_path(&volume_id(*v)).display().to_string(),
                })
                .await
                .map(drop),
            Call::Publish(v, label) => node
                .node_publish_volume(d.publish_request(&volume_id(*v), &cap, label, false))
                .await
                .map(drop),
            Call::Unpublish(v, label) => node
                .node_unpublish_volume(NodeUnpublishVolumeRequest {
                    volume_id: volume_id(*v),
                    target_path: d.target_path(label).display().to_string(),
                })
                .await
                .map(drop),
        }
    }
}

/// What the clients saw, for the report and the checks.
#[derive(Debug, Default)]
struct Tally {
    /// Answers by call kind and code (after retries).
    answers: BTreeMap<(String, String), usize>,
    /// ABORTED answers that were retried.
    aborted: usize,
    /// Answers no correct driver gives.
    wrong: Vec<String>,
}

fn kind(call: &Call) -> String {
    format!("{call:?}")
        .split('(')
        .next()
        .unwrap_or_default()
        .to_owned()
}

async fn client(d: Arc<Driver>, id: usize, seed: u64, tally: Arc<Mutex<Tally>>) {
    let mut rng = Rng(seed ^ ((id as u64 + 1).wrapping_mul(0x9e37_79b9_7f4a_7c15)) | 1);
    for _ in 0..CALLS {
        let call = Call::pick(&mut rng, id);
        let started = Instant::now();
        let answer = loop {
            match call.send(&d).await {
                Err(status) if status.code() == Code::Aborted => {
                    tally.lock().expect("tally").aborted += 1;
                    if started.elapsed() > RETRY_FOR {
                        break Err(status);
                    }
                    let pause = 5 + rng.below(20) as u64;
                    tokio::time::sleep(Duration::from_millis(pause)).await;
                }
                other => break other,
            }
        };
        let code = answer.as_ref().err().map_or(Code::Ok, Status::code);
        let mut tally = tally.lock().expect("tally");
        *tally
            .answers
            .entry((kind(&call), format!("{code:?}")))
            .or_default() += 1;
        if !call.allowed(code) {
            let message = answer.err().map(|s| s.message().to_owned());
            tally
                .wrong
                .push(format!("client {id}: {call:?} -> {code:?} {message:?}"));
        }
    }
}

/// After the storm: one id per name, pool files and records match one to one, at most
/// one loop device per volume, and every staged volume is mounted once at its path.
async fn assert_consistent(d: &Driver) {
    let listed = ok(
        d.controller()
            .list_volumes(ListVolumesRequest::default())
            .await,
        "ListVolumes after the storm",
    );
    let ids: Vec<String> = listed
        .entries
        .iter()
        .filter_map(|e| e.volume.as_ref().map(|v| v.volume_id.clone()))
        .collect();
    let unique: BTreeSet<&String> = ids.iter().collect();
    assert_eq!(unique.len(), ids.len(), "duplicate volumes listed: {ids:?}");
    let known: BTreeSet<String> = (0..VOLUMES).map(volume_id).collect();
    assert!(
        ids.iter().all(|id| known.contains(id)),
        "volumes nobody asked for: {ids:?}"
    );
    let files: BTreeSet<String> = d
        .pool_images()
        .into_iter()
        .map(|f| f.trim_end_matches(".img").to_owned())
        .collect();
    let records: BTreeSet<String> = unique.into_iter().cloned().collect();
    assert_eq!(files, records, "backing files and volume records disagree");
    for volume in listed.entries.iter().filter_map(|e| e.volume.as_ref()) {
        let file_bytes = fs::metadata(d.backing_file(&volume.volume_id))
            .map(|m| m.len())
            .unwrap_or(0);
        assert_eq!(
            i64::try_from(file_bytes).ok(),
            Some(volume.capacity_bytes),
            "{}: backing file and record disagree on the size",
            volume.volume_id
        );
    }
    for id in &ids {
        // `loop_of` itself fails on more than one loop device per volume.
        let attached = d.loop_of(id).is_some();
        let staged = d.state.join("staged").join(format!("{id}.json")).exists();
        assert_eq!(
            attached, staged,
            "{id}: loop device attached {attached}, stage record {staged}"
        );
        if staged {
            assert_eq!(
                mount_count_at(&d.staging_path(id)),
                1,
                "{id}: staging path mounted other than once"
            );
        }
    }
    for m in mounts_under(&d.root) {
        assert_eq!(
            mount_count_at(&m.mount_point),
            1,
            "{} is mounted more than once",
            m.mount_point.display()
        );
    }
}

/// Every target directory that holds a mount, with the volume it belongs to.
fn published_targets(d: &Driver) -> Vec<(usize, String)> {
    let mut found = Vec::new();
    for m in mounts_under(&d.root.join("targets")) {
        let label = m
            .mount_point
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        let v = label
            .rsplit('-')
            .next()
            .and_then(|n| n.parse::<usize>().ok())
            .expect("target labels end in the volume number");
        found.push((v, label));
    }
    found
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn overlapping_calls_from_many_clients_keep_the_state_sound() {
    let seed = std::env::var("FERROVOL_STRESS_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| {
            SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map_or(1, |t| t.as_nanos() as u64)
        });
    eprintln!("stress seed {seed} (replay with FERROVOL_STRESS_SEED={seed})");
    let d = Arc::new(Driver::start().await);
    let tally = Arc::new(Mutex::new(Tally::default()));
    let started = Instant::now();
    let clients: Vec<_> = (0..CLIENTS)
        .map(|id| tokio::spawn(client(Arc::clone(&d), id, seed, Arc::clone(&tally))))
        .collect();
    let storm = async {
        for c in clients {
            c.await.expect("client task");
        }
    };
    tokio::time::timeout(DEADLINE, storm)
        .await
        .unwrap_or_else(|_| panic!("seed {seed}: the clients did not finish within {DEADLINE:?}"));
    let tally = std::mem::take(&mut *tally.lock().expect("tally"));
    eprintln!(
        "seed {seed}: {} calls in {:.1?}, {} ABORTED answers retried; answers {:?}",
        CLIENTS * CALLS,
        started.elapsed(),
        tally.aborted,
        tally.answers
    );
    assert!(
        tally.wrong.is_empty(),
        "seed {seed}: answers no correct driver gives:\n  {}",
        tally.wrong.join("\n  ")
    );
    assert_consistent(&d).await;

    // The state is sound: every volume goes through a whole life, each call first time.
    for target in published_targets(&d) {
        d.unpublish(&volume_id(target.0), &d.target_path(&target.1))
            .await;
    }
    let cap = cap();
    for v in 0..VOLUMES {
        let id = d
            .create(&volume_name(v), 16 * MIB, cap.clone())
            .await
            .volume_id;
        let staging = d.stage(&id, &cap).await;
        write_files(&staging, 900 + v as u64);
        let target = d.publish(&id, &cap, &format!("final-{v}"), false).await;
        verify_files(&target, 900 + v as u64);
        d.snapshot(&format!("stress-final-{v}"), &id).await;
        d.unpublish(&id, &target).await;
        d.unstage(&id).await;
    }
    // Teardown of everything, then nothing may be left.
    let snapshots = ok(
        d.controller()
            .list_snapshots(ListSnapshotsRequest::default())
            .await,
        "ListSnapshots",
    );
    for s in snapshots.entries.into_iter().filter_map(|e| e.snapshot) {
        d.delete_snapshot(&s.snapshot_id).await;
    }
    for v in 0..VOLUMES {
        d.delete(&volume_id(v)).await;
    }
    assert!(
        d.pool_images().is_empty(),
        "seed {seed}: backing files left: {:?}",
        d.pool_images()
    );
    let snapshot_files: Vec<_> = fs::read_dir(d.pool.join("snapshots"))
        .map(|r| r.filter_map(Result::ok).map(|e| e.file_name()).collect())
        .unwrap_or_default();
    assert!(
        snapshot_files.is_empty(),
        "seed {seed}: snapshot files left: {snapshot_files:?}"
    );
    for dir in ["volumes", "snapshots", "staged"] {
        let left: Vec<_> = fs::read_dir(d.state.join(dir))
            .map(|r| r.filter_map(Result::ok).map(|e| e.file_name()).collect())
            .unwrap_or_default();
        assert!(left.is_empty(), "seed {seed}: {dir} records left: {left:?}");
    }
    assert!(loops_backed_under(&d.pool).is_empty());
    let d = Arc::try_unwrap(d).expect("the clients are done");
    d.finish().await;
}
