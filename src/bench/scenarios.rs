//! The scenarios of `ferrovol bench` and the clean-up after them.
//!
//! Every RPC goes through [`Bench::call`], which times it and records success or the gRPC
//! code; every response is then checked ([`Bench::check`]) and a failed check counts as an
//! error (`CHECK`). An iteration that fails stops at that step; what it made stays in the
//! inventory and the clean-up removes it.

use std::collections::HashMap;
use std::future::Future;
use std::io::Write;
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

use tonic::{Response, Status};

use super::progress::Progress;
use super::report::{Recorder, RunReport};
use super::resources::Resources;
use super::{BenchArgs, Clients, Scenario};
use crate::csi::v1::volume_capability::access_mode::Mode as AccessMode;
use crate::csi::v1::volume_capability::MountVolume;
use crate::csi::v1::volume_capability::{AccessMode as AccessModeMsg, AccessType, BlockVolume};
use crate::csi::v1::volume_content_source::{SnapshotSource, Type as SourceType};
use crate::csi::v1::*;

/// What the workers share.
#[derive(Debug)]
pub struct Bench {
    /// The command line.
    pub args: BenchArgs,
    /// Clients of the one connection.
    clients: Clients,
    /// Names start with this.
    prefix: String,
    /// Set by Ctrl-C: no new iterations start.
    stop: Arc<AtomicBool>,
    /// What exists and must be removed.
    pub resources: Resources,
    /// The node id (NodeGetInfo), when a node cycle publishes through the controller.
    node_id: tokio::sync::OnceCell<String>,
}

/// What an iteration's calls return when a call or a check failed (already recorded).
#[derive(Debug)]
struct Failed;

type Step<T> = std::result::Result<T, Failed>;

fn code_name(status: &Status) -> String {
    format!("{:?}", status.code())
}

fn mount_capability(fs_type: &str) -> VolumeCapability {
    let access_type = if fs_type == "block" {
        AccessType::Block(BlockVolume {})
    } else {
        AccessType::Mount(MountVolume {
            fs_type: fs_type.to_owned(),
            ..Default::default()
        })
    };
    VolumeCapability {
        access_mode: Some(AccessModeMsg {
            mode: AccessMode::SingleNodeWriter as i32,
        }),
        access_type: Some(access_type),
    }
}

/// Whether `path` is a mount point (its device differs from its parent's) or, for
/// `block`, a block device node.
fn looks_published(path: &Path, block: bool) -> bool {
    if block {
        return std::fs::metadata(path).is_ok_and(|m| m.file_type().is_block_device());
    }
    let (Ok(here), Some(Ok(parent))) = (
        std::fs::metadata(path),
        path.parent().map(std::fs::metadata),
    ) else {
        return false;
    };
    here.dev() != parent.dev() || here.ino() == parent.ino()
}

impl Bench {
    /// Shared state of one bench command.
    pub fn new(args: BenchArgs, clients: Clients, prefix: String, stop: Arc<AtomicBool>) -> Self {
        Bench {
            args,
            clients,
            prefix,
            stop,
            resources: Resources::default(),
            node_id: tokio::sync::OnceCell::new(),
        }
    }

    /// Whether Ctrl-C stopped the run.
    pub fn stopped(&self) -> bool {
        self.stop.load(Ordering::Relaxed)
    }

    fn parameters(&self) -> HashMap<String, String> {
        self.args.parameters.iter().cloned().collect()
    }

    /// Times one RPC and records its outcome.
    async fn call<T>(
        &self,
        rec: &Recorder,
        name: &'static str,
        rpc: impl Future<Output = std::result::Result<Response<T>, Status>>,
    ) -> Step<T> {
        let started = Instant::now();
        match rpc.await {
            Ok(resp) => {
                rec.ok(name, started.elapsed());
                Ok(resp.into_inner())
            }
            Err(status) => {
                rec.error(name, &code_name(&status), status.message());
                Err(Failed)
            }
        }
    }

    /// Records a failed check of a response.
    fn check(
        &self,
        rec: &Recorder,
        name: &'static str,
        ok: bool,
        what: impl FnOnce() -> String,
    ) -> Step<()> {
        if ok {
            Ok(())
        } else {
            rec.error(name, "CHECK", &what());
            Err(Failed)
        }
    }

    async fn create_volume(
        &self,
        rec: &Recorder,
        name: String,
        cap: VolumeCapability,
        source: Option<VolumeContentSource>,
    ) -> Step<String> {
        let required = i64::try_from(self.args.size).unwrap_or(i64::MAX);
        let req = CreateVolumeRequest {
            name: name.clone(),
            capacity_range: Some(CapacityRange {
                required_bytes: required,
                limit_bytes: 0,
            }),
            volume_capabilities: vec![cap],
            parameters: self.parameters(),
            volume_content_source: source.clone(),
            ..Default::default()
        };
        let resp = self
            .call(
                rec,
                "CreateVolume",
                self.clients.controller.clone().create_volume(req),
            )
            .await?;
        let volume = resp.volume.unwrap_or_default();
        if !volume.volume_id.is_empty() {
            self.resources.add_volume(&volume.volume_id);
        }
        self.check(rec, "CreateVolume", !volume.volume_id.is_empty(), || {
            format!("CreateVolume {name}: the response carries no volume id")
        })?;
        // 0 means "unknown" in CSI; anything else must cover the request.
        self.check(
            rec,
            "CreateVolume",
            volume.capacity_bytes == 0 || volume.capacity_bytes >= required,
            || {
                format!(
                    "CreateVolume {name}: capacity {} is below the {required} bytes asked for",
                    volume.capacity_bytes
                )
            },
        )?;
        self.check(
            rec,
            "CreateVolume",
            source.is_none() || volume.content_source == source,
            || {
                format!(
                    "CreateVolume {name}: content source {:?}",
                    volume.content_source
                )
            },
        )?;
        Ok(volume.volume_id)
    }

    async fn delete_volume(&self, rec: &Recorder, id: &str) -> Step<()> {
        let req = DeleteVolumeRequest {
            volume_id: id.to_owned(),
            ..Default::default()
        };
        self.call(
            rec,
            "DeleteVolume",
            self.clients.controller.clone().delete_volume(req),
        )
        .await?;
        self.resources.remove_volume(id);
        Ok(())
    }

    /// CreateVolume then DeleteVolume.
    async fn create_delete(&self, rec: &Recorder, i: u64) -> Step<()> {
        let id = self
            .create_volume(
                rec,
                format!("{}-cd-{i}", self.prefix),
                mount_capability("ext4"),
                None,
            )
            .await?;
        self.delete_volume(rec, &id).await
    }

    async fn node_id(&self, rec: &Recorder) -> Step<String> {
        if let Some(id) = self.node_id.get() {
            return Ok(id.clone());
        }
        let info = self
            .call(
                rec,
                "NodeGetInfo",
                self.clients
                    .node
                    .clone()
                    .node_get_info(NodeGetInfoRequest {}),
            )
            .await?;
        let _ = self.node_id.set(info.node_id.clone());
        Ok(info.node_id)
    }

    /// Makes `dir` (and records it for removal) unless it exists.
    fn make_dir(&self, dir: &Path) -> std::io::Result<()> {
        if dir.exists() {
            return Ok(());
        }
        std::fs::create_dir(dir)?;
        self.resources.add_dir(dir.to_owned());
        Ok(())
    }

    /// The iteration's directory below --work-dir, with its staging directory made (as a
    /// CO makes it) and the target left for the driver to make.
    fn iteration_paths(&self, rec: &Recorder, label: &str) -> Step<(PathBuf, PathBuf)> {
        let Some(work) = &self.args.work_dir else {
            rec.error("setup", "CHECK", "no --work-dir");
            return Err(Failed);
        };
        let dir = work.join(format!("{}-{label}", self.prefix));
        let staging = dir.join("staging");
        let made = self.make_dir(&dir).and_then(|()| self.make_dir(&staging));
        if let Err(e) = made {
            rec.error("setup", "IO", &format!("make {}: {e}", staging.display()));
            return Err(Failed);
        }
        Ok((staging, dir.join("target")))
    }

    /// Create, (controller publish), stage, publish, unpublish, unstage, (controller
    /// unpublish), delete.
    async fn node_cycle(&self, rec: &Recorder, fs_type: &str, i: u64) -> Step<()> {
        let cap = mount_capability(fs_type);
        let block = fs_type == "block";
        let label = format!("nc-{fs_type}-{i}");
        let (staging, target) = self.iteration_paths(rec, &label)?;
        let id = self
            .create_volume(rec, format!("{}-{label}", self.prefix), cap.clone(), None)
            .await?;
        let mut publish_context = HashMap::new();
        let node_id = if self.args.controller_publish {
            let node_id = self.node_id(rec).await?;
            let resp = self
                .call(
                    rec,
                    "ControllerPublishVolume",
                    self.clients.controller.clone().controller_publish_volume(
                        ControllerPublishVolumeRequest {
                            volume_id: id.clone(),
                            node_id: node_id.clone(),
                            volume_capability: Some(cap.clone()),
                            ..Default::default()
                        },
                    ),
                )
                .await?;
            publish_context = resp.publish_context;
            Some(node_id)
        } else {
            None
        };
        let staging_text = staging.display().to_string();
        self.call(
            rec,
            "NodeStageVolume",
            self.clients
                .node
                .clone()
                .node_stage_volume(NodeStageVolumeRequest {
                    volume_id: id.clone(),
                    publish_context: publish_context.clone(),
                    staging_target_path: staging_text.clone(),
                    volume_capability: Some(cap.clone()),
                    ..Default::default()
                }),
        )
        .await?;
        self.resources.add_staged(&id, staging.clone());
        self.call(
            rec,
            "NodePublishVolume",
            self.clients
                .node
                .clone()
                .node_publish_volume(NodePublishVolumeRequest {
                    volume_id: id.clone(),
                    publish_context,
                    staging_target_path: staging_text.clone(),
                    target_path: target.display().to_string(),
                    volume_capability: Some(cap),
                    ..Default::default()
                }),
        )
        .await?;
        self.resources.add_published(&id, target.clone());
        self.check(
            rec,
            "NodePublishVolume",
            looks_published(&target, block),
            || {
                format!(
                    "NodePublishVolume {id}: {} is not a mount or device",
                    target.display()
                )
            },
        )?;
        self.unpublish(rec, &id, &target).await?;
        self.check(rec, "NodeUnpublishVolume", !target.exists(), || {
            format!(
                "NodeUnpublishVolume {id}: {} still exists",
                target.display()
            )
        })?;
        self.unstage(rec, &id, &staging).await?;
        if let Some(node_id) = node_id {
            self.call(
                rec,
                "ControllerUnpublishVolume",
                self.clients.controller.clone().controller_unpublish_volume(
                    ControllerUnpublishVolumeRequest {
                        volume_id: id.clone(),
                        node_id,
                        ..Default::default()
                    },
                ),
            )
            .await?;
        }
        self.delete_volume(rec, &id).await?;
        self.remove_dirs(&staging);
        Ok(())
    }

    async fn unpublish(&self, rec: &Recorder, id: &str, target: &Path) -> Step<()> {
        self.call(
            rec,
            "NodeUnpublishVolume",
            self.clients
                .node
                .clone()
                .node_unpublish_volume(NodeUnpublishVolumeRequest {
                    volume_id: id.to_owned(),
                    target_path: target.display().to_string(),
                }),
        )
        .await?;
        self.resources.remove_published(&target.to_owned());
        Ok(())
    }

    async fn unstage(&self, rec: &Recorder, id: &str, staging: &Path) -> Step<()> {
        self.call(
            rec,
            "NodeUnstageVolume",
            self.clients
                .node
                .clone()
                .node_unstage_volume(NodeUnstageVolumeRequest {
                    volume_id: id.to_owned(),
                    staging_target_path: staging.display().to_string(),
                }),
        )
        .await?;
        self.resources.remove_staged(id);
        Ok(())
    }

    /// Removes the staging directory and the iteration directory above it, if empty.
    fn remove_dirs(&self, staging: &Path) {
        for dir in [Some(staging), staging.parent()].into_iter().flatten() {
            if std::fs::remove_dir(dir).is_ok() || !dir.exists() {
                self.resources.remove_dir(&dir.to_owned());
            }
        }
    }

    async fn snapshot_and_restore(&self, rec: &Recorder, source_id: &str, i: u64) -> Step<()> {
        let name = format!("{}-snap-{i}", self.prefix);
        let resp = self
            .call(
                rec,
                "CreateSnapshot",
                self.clients
                    .controller
                    .clone()
                    .create_snapshot(CreateSnapshotRequest {
                        source_volume_id: source_id.to_owned(),
                        name: name.clone(),
                        parameters: HashMap::new(),
                        ..Default::default()
                    }),
            )
            .await?;
        let snapshot = resp.snapshot.unwrap_or_default();
        if !snapshot.snapshot_id.is_empty() {
            self.resources.add_snapshot(&snapshot.snapshot_id);
        }
        self.check(
            rec,
            "CreateSnapshot",
            !snapshot.snapshot_id.is_empty()
                && snapshot.source_volume_id == source_id
                && snapshot.ready_to_use,
            || format!("CreateSnapshot {name}: {snapshot:?}"),
        )?;
        let source = Some(VolumeContentSource {
            r#type: Some(SourceType::Snapshot(SnapshotSource {
                snapshot_id: snapshot.snapshot_id.clone(),
            })),
        });
        let restored = self
            .create_volume(
                rec,
                format!("{}-restore-{i}", self.prefix),
                mount_capability("ext4"),
                source,
            )
            .await?;
        self.delete_volume(rec, &restored).await?;
        self.call(
            rec,
            "DeleteSnapshot",
            self.clients
                .controller
                .clone()
                .delete_snapshot(DeleteSnapshotRequest {
                    snapshot_id: snapshot.snapshot_id.clone(),
                    ..Default::default()
                }),
        )
        .await?;
        self.resources.remove_snapshot(&snapshot.snapshot_id);
        Ok(())
    }

    async fn capacity_and_listing(&self, rec: &Recorder) -> Step<()> {
        let cap = self
            .call(
                rec,
                "GetCapacity",
                self.clients
                    .controller
                    .clone()
                    .get_capacity(GetCapacityRequest {
                        volume_capabilities: vec![mount_capability("ext4")],
                        parameters: self.parameters(),
                        ..Default::default()
                    }),
            )
            .await?;
        self.check(rec, "GetCapacity", cap.available_capacity >= 0, || {
            format!("GetCapacity: negative capacity {}", cap.available_capacity)
        })?;
        self.call(
            rec,
            "ListVolumes",
            self.clients
                .controller
                .clone()
                .list_volumes(ListVolumesRequest {
                    max_entries: 100,
                    starting_token: String::new(),
                }),
        )
        .await?;
        Ok(())
    }

    /// Runs `count` iterations of `body` on `concurrency` tasks; returns the report.
    async fn measure<F, Fut>(
        self: &Arc<Self>,
        scenario: &str,
        variant: String,
        unit: &str,
        preexisting: u64,
        rec: Arc<Recorder>,
        body: F,
    ) -> RunReport
    where
        F: Fn(Arc<Bench>, Arc<Recorder>, u64) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Step<()>> + Send + 'static,
    {
        let count = self.args.count;
        let label = if variant.is_empty() {
            scenario.to_owned()
        } else {
            format!("{scenario} {variant}")
        };
        let progress = Arc::new(Progress::start(&label, count));
        let next = Arc::new(AtomicU64::new(0));
        let completed = Arc::new(AtomicU64::new(0));
        let body = Arc::new(body);
        let started = Instant::now();
        let mut workers = Vec::new();
        for _ in 0..self.args.concurrency.min(count.max(1)) {
            let (bench, rec, next, completed, body, progress) = (
                Arc::clone(self),
                Arc::clone(&rec),
                Arc::clone(&next),
                Arc::clone(&completed),
                Arc::clone(&body),
                Arc::clone(&progress),
            );
            workers.push(tokio::spawn(async move {
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    if i >= count || bench.stopped() {
                        break;
                    }
                    let t = Instant::now();
                    if body(Arc::clone(&bench), Arc::clone(&rec), i).await.is_ok() {
                        rec.ok("cycle", t.elapsed());
                        completed.fetch_add(1, Ordering::Relaxed);
                    }
                    progress.tick();
                }
            }));
        }
        for w in workers {
            if let Err(e) = w.await {
                rec.error("worker", "PANIC", &e.to_string());
            }
        }
        let wall = started.elapsed();
        if let Ok(progress) = Arc::try_unwrap(progress) {
            progress.finish().await;
        }
        let done = completed.load(Ordering::Relaxed);
        #[allow(clippy::cast_precision_loss)]
        let rate = done as f64 / wall.as_secs_f64().max(1e-9);
        RunReport {
            scenario: scenario.to_owned(),
            variant,
            iterations: count,
            completed: done,
            concurrency: self.args.concurrency,
            preexisting_volumes: preexisting,
            wall_seconds: wall.as_secs_f64(),
            iterations_per_second: rate,
            iteration_unit: unit.to_owned(),
            errors: rec.error_count(),
            calls: rec.summary(),
        }
    }

    /// Makes `count` volumes that stay while a scenario measures (not measured).
    async fn make_existing(self: &Arc<Self>, rec: &Arc<Recorder>) -> Vec<String> {
        let count = self.args.existing;
        let next = Arc::new(AtomicU64::new(0));
        let made = Arc::new(std::sync::Mutex::new(Vec::new()));
        let mut workers = Vec::new();
        for _ in 0..self.args.concurrency.min(count.max(1)) {
            let (bench, rec, next, made) = (
                Arc::clone(self),
                Arc::clone(rec),
                Arc::clone(&next),
                Arc::clone(&made),
            );
            workers.push(tokio::spawn(async move {
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    if i >= count || bench.stopped() {
                        break;
                    }
                    let name = format!("{}-pre-{i}", bench.prefix);
                    if let Ok(id) = bench
                        .create_volume(&rec, name, mount_capability("ext4"), None)
                        .await
                    {
                        made.lock().unwrap_or_else(|p| p.into_inner()).push(id);
                    }
                }
            }));
        }
        for w in workers {
            let _ = w.await;
        }
        let made = made.lock().unwrap_or_else(|p| p.into_inner()).clone();
        made
    }

    /// Writes `bytes` of incompressible data into `dir/data.bin` and fsyncs it.
    async fn fill(dir: PathBuf, bytes: u64) -> std::io::Result<()> {
        tokio::task::spawn_blocking(move || {
            let mut file = std::fs::File::create(dir.join("data.bin"))?;
            let mut block = vec![0u8; 1 << 20];
            let mut state = 0x9e37_79b9_7f4a_7c15_u64;
            let mut left = bytes;
            while left > 0 {
                for chunk in block.chunks_exact_mut(8) {
                    // xorshift64: cheap bytes that no layer can compress or skip.
                    state ^= state << 13;
                    state ^= state >> 7;
                    state ^= state << 17;
                    chunk.copy_from_slice(&state.to_le_bytes());
                }
                let n = usize::try_from(left.min(block.len() as u64)).unwrap_or(block.len());
                file.write_all(&block[..n])?;
                left -= n as u64;
            }
            file.sync_all()
        })
        .await
        .map_err(std::io::Error::other)?
    }

    /// Removes everything the run made that is still there; returns how many removals
    /// failed.
    pub async fn clean_up(&self) -> u64 {
        let rec = Recorder::default();
        let left = self.resources.leftovers();
        for (id, target) in &left.published {
            let _ = self.unpublish(&rec, id, target).await;
        }
        for (id, staging) in &left.staged {
            let _ = self.unstage(&rec, id, staging).await;
        }
        for id in &left.snapshots {
            let done = self
                .call(
                    &rec,
                    "DeleteSnapshot",
                    self.clients
                        .controller
                        .clone()
                        .delete_snapshot(DeleteSnapshotRequest {
                            snapshot_id: id.clone(),
                            ..Default::default()
                        }),
                )
                .await;
            if done.is_ok() {
                self.resources.remove_snapshot(id);
            }
        }
        // Volumes go at the run's concurrency: there may be thousands.
        let ids = Arc::new(std::sync::Mutex::new(left.volumes.clone()));
        let rec = Arc::new(rec);
        let mut workers = Vec::new();
        for _ in 0..self.args.concurrency.max(1) {
            let (ids, rec) = (Arc::clone(&ids), Arc::clone(&rec));
            workers.push(async move {
                loop {
                    let next = ids.lock().unwrap_or_else(|p| p.into_inner()).pop();
                    let Some(id) = next else { break };
                    let _ = self.delete_volume(&rec, &id).await;
                }
            });
        }
        futures_join_all(workers).await;
        for dir in self.resources.leftovers().dirs {
            if std::fs::remove_dir(&dir).is_ok() || !dir.exists() {
                self.resources.remove_dir(&dir);
            }
        }
        rec.error_count()
    }
}

/// Awaits every future (no extra crate for one join).
async fn futures_join_all<F: Future<Output = ()>>(futures: Vec<F>) {
    let mut set = Vec::new();
    for f in futures {
        set.push(Box::pin(f));
    }
    let mut pending: Vec<_> = set.iter_mut().map(Some).collect();
    std::future::poll_fn(|cx| {
        let mut all_done = true;
        for slot in &mut pending {
            if let Some(f) = slot {
                if f.as_mut().poll(cx).is_ready() {
                    *slot = None;
                } else {
                    all_done = false;
                }
            }
        }
        if all_done {
            std::task::Poll::Ready(())
        } else {
            std::task::Poll::Pending
        }
    })
    .await;
}

/// Runs the scenario the arguments name; one report per run.
pub async fn run(bench: &Arc<Bench>) -> Vec<RunReport> {
    let mut runs = Vec::new();
    match bench.args.scenario {
        Scenario::CreateDelete => {
            let setup = Arc::new(Recorder::default());
            let pre = bench.make_existing(&setup).await.len() as u64;
            let rec = Arc::new(Recorder::default());
            let mut run = bench
                .measure(
                    "create-delete",
                    String::new(),
                    "CreateVolume+DeleteVolume pairs",
                    pre,
                    rec,
                    |b, rec, i| async move { b.create_delete(&rec, i).await },
                )
                .await;
            add_setup(&mut run, &setup);
            runs.push(run);
        }
        Scenario::NodeCycle => {
            for fs_type in bench.args.fs_types.clone() {
                if bench.stopped() {
                    break;
                }
                let fs = fs_type.clone();
                let run = bench
                    .measure(
                        "node-cycle",
                        format!("fs_type={fs_type}"),
                        "cycles",
                        0,
                        Arc::new(Recorder::default()),
                        move |b, rec, i| {
                            let fs = fs.clone();
                            async move { b.node_cycle(&rec, &fs, i).await }
                        },
                    )
                    .await;
                runs.push(run);
            }
        }
        Scenario::Snapshot => runs.push(snapshot_run(bench).await),
        Scenario::Mixed => {
            let setup = Arc::new(Recorder::default());
            let pre = bench.make_existing(&setup).await.len() as u64;
            let rec = Arc::new(Recorder::default());
            let base = bench
                .create_volume(
                    &setup,
                    format!("{}-mixed-base", bench.prefix),
                    mount_capability("ext4"),
                    None,
                )
                .await
                .ok();
            let base = Arc::new(base);
            let mut run = bench
                .measure(
                    "mixed",
                    String::new(),
                    "operations",
                    pre,
                    rec,
                    move |b, rec, i| {
                        let base = Arc::clone(&base);
                        async move {
                            match (i % 10, base.as_deref()) {
                                (6 | 7, _) => b.capacity_and_listing(&rec).await,
                                (8, _) if b.args.work_dir.is_some() => {
                                    let fs = b
                                        .args
                                        .fs_types
                                        .first()
                                        .cloned()
                                        .unwrap_or_else(|| "ext4".into());
                                    b.node_cycle(&rec, &fs, i).await
                                }
                                (9, Some(base)) => b.snapshot_and_restore(&rec, base, i).await,
                                _ => b.create_delete(&rec, i).await,
                            }
                        }
                    },
                )
                .await;
            add_setup(&mut run, &setup);
            runs.push(run);
        }
    }
    runs
}

/// Adds the failures of a run's unmeasured setup (volumes made beforehand) to its report.
fn add_setup(run: &mut RunReport, setup: &Recorder) {
    let errors = setup.error_count();
    if errors > 0 {
        run.errors += errors;
        run.calls.extend(setup.summary().into_iter().map(|mut c| {
            c.call = format!("setup {}", c.call);
            c
        }));
    }
}

/// The snapshot scenario: one volume published and filled with `--data` bytes, then
/// snapshot, restore, delete both, `--count` times.
async fn snapshot_run(bench: &Arc<Bench>) -> RunReport {
    let setup_rec = Arc::new(Recorder::default());
    let setup = async {
        let fs = bench
            .args
            .fs_types
            .first()
            .cloned()
            .unwrap_or_else(|| "ext4".into());
        let cap = mount_capability(&fs);
        let (staging, target) = bench.iteration_paths(&setup_rec, "snapshot-source")?;
        let id = bench
            .create_volume(
                &setup_rec,
                format!("{}-snapshot-source", bench.prefix),
                cap.clone(),
                None,
            )
            .await?;
        bench
            .call(
                &setup_rec,
                "NodeStageVolume",
                bench
                    .clients
                    .node
                    .clone()
                    .node_stage_volume(NodeStageVolumeRequest {
                        volume_id: id.clone(),
                        staging_target_path: staging.display().to_string(),
                        volume_capability: Some(cap.clone()),
                        ..Default::default()
                    }),
            )
            .await?;
        bench.resources.add_staged(&id, staging.clone());
        bench
            .call(
                &setup_rec,
                "NodePublishVolume",
                bench
                    .clients
                    .node
                    .clone()
                    .node_publish_volume(NodePublishVolumeRequest {
                        volume_id: id.clone(),
                        staging_target_path: staging.display().to_string(),
                        target_path: target.display().to_string(),
                        volume_capability: Some(cap),
                        ..Default::default()
                    }),
            )
            .await?;
        bench.resources.add_published(&id, target.clone());
        if let Err(e) = Bench::fill(target.clone(), bench.args.data).await {
            setup_rec.error(
                "fill",
                "IO",
                &format!(
                    "write {} bytes into {}: {e}",
                    bench.args.data,
                    target.display()
                ),
            );
            return Err(Failed);
        }
        Ok((id, staging, target))
    };
    let Ok((id, staging, target)) = setup.await else {
        let mut run = bench
            .measure(
                "snapshot",
                "setup failed".into(),
                "rounds",
                0,
                setup_rec,
                |_, _, _| async { Err(Failed) },
            )
            .await;
        run.completed = 0;
        return run;
    };
    let source = Arc::new(id.clone());
    let mut run = bench
        .measure(
            "snapshot",
            format!("data_bytes={}", bench.args.data),
            "snapshot+restore rounds",
            0,
            Arc::new(Recorder::default()),
            move |b, rec, i| {
                let source = Arc::clone(&source);
                async move { b.snapshot_and_restore(&rec, &source, i).await }
            },
        )
        .await;
    add_setup(&mut run, &setup_rec);
    // Tear the source down here so that its calls are not mistaken for clean-up trouble.
    let teardown = Recorder::default();
    if bench.unpublish(&teardown, &id, &target).await.is_ok()
        && bench.unstage(&teardown, &id, &staging).await.is_ok()
        && bench.delete_volume(&teardown, &id).await.is_ok()
    {
        bench.remove_dirs(&staging);
    }
    run
}
