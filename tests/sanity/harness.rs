//! The driver under test: one `ferrovol` process per test, in its own temp dir.
//!
//! A [`Driver`] makes `/tmp/ferrovol-sanity-XXXX/` holding `pool/`, `state/`, `staging/`,
//! `targets/`, the socket `csi.sock` and the log `driver.log` (stdout and stderr of the
//! binary), starts `env!("CARGO_BIN_EXE_ferrovol")` on that socket, waits for it to serve, and
//! hands out gRPC clients. It also knows the CSI calls every lifecycle test repeats
//! (create/stage/publish/unpublish/unstage/delete) so the tests stay short.
//!
//! # Cleanup
//! Every test ends with [`Driver::finish`], which fails the test when a mount under the temp
//! dir or a loop device backed by a file in the pool is still there after the test's own
//! teardown RPCs, and then stops the driver with SIGTERM (exit 0, socket removed).
//! [`Drop`] is the cleanup of last resort, run even when the test panicked: it kills the
//! driver, lazily unmounts everything under the temp dir, detaches the pool's loop devices,
//! and prints the driver log when the test failed. A `Driver` dropped without `finish` while
//! the test is not already failing fails the test, so no test can forget the leak check.
//!
//! # Pools on a filesystem of the test's choice
//! With [`Options::pool_fs`] the pool is not a plain directory in `/tmp` but the mount point
//! of a filesystem the harness makes (`pool-fs.img` in the temp dir, `mkfs`, `mount -o
//! loop`), so tests can tell reflinks from copies. That mount and its loop device are the
//! harness's: the leak check ignores them, `finish` unmounts the pool after the driver
//! stopped (failing the test if the pool is still busy) and `Drop` releases it after the
//! cleanup of last resort.
//!
//! The mount table and loop device inspection it relies on live in `host`.

use std::collections::BTreeMap;
use std::fs;
use std::os::unix::fs::FileTypeExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use ferrovol::csi::v1::controller_client::ControllerClient;
use ferrovol::csi::v1::identity_client::IdentityClient;
use ferrovol::csi::v1::node_client::NodeClient;
use ferrovol::csi::v1::{
    ControllerExpandVolumeRequest, ControllerExpandVolumeResponse, CreateSnapshotRequest,
    CreateVolumeRequest, DeleteSnapshotRequest, DeleteVolumeRequest, NodeExpandVolumeRequest,
    NodeExpandVolumeResponse, NodePublishVolumeRequest, NodeStageVolumeRequest,
    NodeUnpublishVolumeRequest, NodeUnstageVolumeRequest, Snapshot, Volume, VolumeCapability,
};
use tonic::transport::{Channel, Endpoint};

use crate::host::{
    cleanup_last_resort, loop_devices, loops_backed_under, make_pool_fs, mounts_under,
    release_pool_fs, run_tool, LoopDevice, PoolFs,
};
use crate::requests::{create_request, ok, range, snapshot_request};

/// How long a driver may take to create its socket and answer.
const START_TIMEOUT: Duration = Duration::from_secs(10);
/// The same on the lvm backend in the TCG guest, where every lvm command the start runs
/// (the classes' VGs, the records in the tags) takes a few hundred milliseconds.
const LVM_START_TIMEOUT: Duration = Duration::from_secs(60);
/// How long a driver may take to exit after SIGTERM.
const STOP_TIMEOUT: Duration = Duration::from_secs(10);
/// Upper bound for any single RPC, so a hung driver fails the test instead of hanging it.
const RPC_TIMEOUT: Duration = Duration::from_secs(60);

/// Panics unless the suite runs as root: it needs loop devices and mounts, and a root test
/// that cannot run must fail, never skip.
pub fn require_root() {
    assert!(
        nix::unistd::geteuid().is_root(),
        "the ferrovol sanity suite needs root (it attaches loop devices and mounts \
         filesystems); run it as root, e.g. `sudo -E cargo test --test sanity`"
    );
}

/// Command-line choices for one driver process.
#[derive(Debug, Clone)]
pub struct Options {
    /// `--node-id`.
    pub node_id: String,
    /// `--driver-name`, when the test wants a non-default name.
    pub driver_name: Option<String>,
    /// `--max-volumes-per-node`.
    pub max_volumes_per_node: Option<i64>,
    /// `--log-format`.
    pub log_format: Option<String>,
    /// `--default-fs-type`.
    pub default_fs_type: Option<String>,
    /// Serve on `tcp://127.0.0.1:<free port>` instead of the unix socket.
    pub tcp: bool,
    /// Put the pool on a filesystem the harness makes, instead of a directory in `/tmp`.
    pub pool_fs: Option<PoolFs>,
    /// More flags, appended as given (`--mode controller`, `--expansion node`, ...).
    pub extra_args: Vec<String>,
    /// Environment variables for the driver process (`FERROVOL_CRASH_AT`, ...).
    pub env: Vec<(String, String)>,
}

impl Default for Options {
    fn default() -> Self {
        Self {
            node_id: "sanity-node".to_owned(),
            driver_name: None,
            max_volumes_per_node: None,
            log_format: None,
            default_fs_type: None,
            tcp: false,
            pool_fs: None,
            extra_args: Vec::new(),
            env: Vec::new(),
        }
    }
}

/// One running `ferrovol` process with its own directories.
#[derive(Debug)]
pub struct Driver {
    /// Owns the temp dir; removed after our `Drop` has unmounted everything in it.
    _dir: tempfile::TempDir,
    /// Canonical path of the temp dir; every mount a test makes lives below it.
    pub root: PathBuf,
    /// `--pool-dir`: backing files `<volume_id>.img` live here.
    pub pool: PathBuf,
    /// The image file of the harness-made pool filesystem, while it is mounted on `pool`.
    pool_image: Option<PathBuf>,
    /// With `FERROVOL_SANITY_BACKEND=lvm`: the volume group the driver provisions from.
    pub vg: Option<crate::lvm_vg::TestVg>,
    /// `--state-dir`: the driver's metadata.
    pub state: PathBuf,
    /// The unix socket path (also created for tcp drivers, but unused then).
    pub socket: PathBuf,
    /// Where the driver's stdout and stderr go.
    pub log: PathBuf,
    /// The options the driver was started with, kept for restarts.
    pub opts: Options,
    /// `--endpoint` value.
    pub endpoint: String,
    /// `--metrics-address`: a free port on loopback, picked for this driver.
    pub metrics_address: String,
    /// The driver process while it runs.
    child: Option<Child>,
    /// The gRPC channel to the running driver.
    channel: Option<Channel>,
    /// Set by `finish`; a driver dropped without it (and without a panic) fails the test.
    finished: bool,
}

impl Driver {
    /// Starts a driver with default options and waits until it serves.
    pub async fn start() -> Driver {
        Self::start_with(Options::default()).await
    }

    /// Starts a driver with `opts` and waits until it serves.
    pub async fn start_with(opts: Options) -> Driver {
        let mut driver = Self::prepare(opts);
        driver.spawn_and_connect().await;
        driver
    }

    /// Makes the temp dir and paths without starting anything.
    pub fn prepare(opts: Options) -> Driver {
        require_root();
        let dir = tempfile::Builder::new()
            .prefix("ferrovol-sanity-")
            .tempdir_in("/tmp")
            .expect("create a temp dir under /tmp");
        let root = fs::canonicalize(dir.path()).expect("canonicalize the temp dir");
        let pool = root.join("pool");
        let state = root.join("state");
        for d in [&pool, &state, &root.join("staging"), &root.join("targets")] {
            fs::create_dir_all(d).expect("create a test directory");
        }
        let pool_image = opts.pool_fs.map(|kind| {
            let image = root.join("pool-fs.img");
            make_pool_fs(&image, &pool, kind);
            image
        });
        let vg = crate::lvm_vg::backend_is_lvm().then(|| {
            let vg = crate::lvm_vg::TestVg::create(&root);
            fs::write(root.join("lvm.yaml"), vg.config_yaml())
                .expect("write the lvm configuration");
            vg
        });
        let socket = root.join("csi.sock");
        let endpoint = if opts.tcp {
            format!("tcp://127.0.0.1:{}", free_tcp_port())
        } else {
            format!("unix://{}", socket.display())
        };
        Driver {
            _dir: dir,
            log: root.join("driver.log"),
            root,
            pool,
            pool_image,
            vg,
            state,
            socket,
            opts,
            endpoint,
            metrics_address: format!("127.0.0.1:{}", free_tcp_port()),
            child: None,
            channel: None,
            finished: false,
        }
    }

    /// The full argument list of the driver (without the program name).
    pub fn args(&self) -> Vec<String> {
        let mut args = vec![
            "--endpoint".to_owned(),
            self.endpoint.clone(),
            "--node-id".to_owned(),
            self.opts.node_id.clone(),
            "--state-dir".to_owned(),
            self.state.display().to_string(),
            "--pool-dir".to_owned(),
            self.pool.display().to_string(),
            "--metrics-address".to_owned(),
            self.metrics_address.clone(),
            "--path-root".to_owned(),
            self.root.display().to_string(),
        ];
        if self.vg.is_some() {
            args.extend([
                "--config".to_owned(),
                self.root.join("lvm.yaml").display().to_string(),
            ]);
        }
        if let Some(name) = &self.opts.driver_name {
            args.extend(["--driver-name".to_owned(), name.clone()]);
        }
        if let Some(max) = self.opts.max_volumes_per_node {
            args.extend(["--max-volumes-per-node".to_owned(), max.to_string()]);
        }
        if let Some(format) = &self.opts.log_format {
            args.extend(["--log-format".to_owned(), format.clone()]);
        }
        if let Some(fs_type) = &self.opts.default_fs_type {
            args.extend(["--default-fs-type".to_owned(), fs_type.clone()]);
        }
        args.extend(self.opts.extra_args.iter().cloned());
        args
    }

    /// Spawns the binary with `args`, output appended to `log`. Not waited for.
    pub fn spawn_process(&self, args: &[String]) -> Child {
        let log = fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)
            .expect("open the driver log");
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_ferrovol"));
        cmd.args(args)
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("clone the log file handle"))
            .stderr(log);
        if std::env::var_os("RUST_LOG").is_none() {
            cmd.env("RUST_LOG", "debug");
        }
        cmd.envs(self.opts.env.iter().map(|(k, v)| (k, v)));
        cmd.spawn().expect("spawn the ferrovol binary")
    }

    /// Starts (or restarts) the driver process and connects to it.
    pub async fn spawn_and_connect(&mut self) {
        assert!(self.child.is_none(), "driver already running");
        let child = self.spawn_process(&self.args());
        self.child = Some(child);
        self.channel = None;
        let limit = if self.vg.is_some() {
            LVM_START_TIMEOUT
        } else {
            START_TIMEOUT
        };
        let deadline = Instant::now() + limit;
        loop {
            if let Some(status) = self
                .child
                .as_mut()
                .and_then(|c| c.try_wait().expect("poll the driver process"))
            {
                self.child = None;
                panic!(
                    "driver exited during startup with {status}\n{}",
                    self.log_text()
                );
            }
            let ready = if self.opts.tcp {
                true
            } else {
                fs::symlink_metadata(&self.socket).is_ok_and(|m| m.file_type().is_socket())
            };
            if ready {
                if let Ok(channel) = self.connect().await {
                    self.channel = Some(channel);
                    return;
                }
            }
            assert!(
                Instant::now() < deadline,
                "driver did not serve on {} within {limit:?}\n{}",
                self.endpoint,
                self.log_text()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Opens a new gRPC channel to the endpoint.
    pub async fn connect(&self) -> Result<Channel, tonic::transport::Error> {
        if let Some(addr) = self.endpoint.strip_prefix("tcp://") {
            return Endpoint::try_from(format!("http://{addr}"))?
                .timeout(RPC_TIMEOUT)
                .connect()
                .await;
        }
        connect_unix(&self.socket).await
    }

    /// True while the driver process has not exited.
    pub fn is_running(&mut self) -> bool {
        match self.child.as_mut() {
            Some(c) => c.try_wait().expect("poll the driver").is_none(),
            None => false,
        }
    }

    /// Kills the driver with SIGKILL (a crash): nothing is cleaned up by the driver.
    pub fn kill_hard(&mut self) {
        let mut child = self.child.take().expect("driver is running");
        child.kill().expect("SIGKILL the driver");
        child.wait().expect("reap the driver");
        self.channel = None;
    }

    /// Waits up to `limit` for the driver to exit by itself (at a crash point, say) and
    /// returns how it ended; `None` while it still runs after `limit`.
    pub async fn wait_for_exit(&mut self, limit: Duration) -> Option<ExitStatus> {
        let child = self.child.as_mut().expect("driver is running");
        let status = wait_bounded(child, limit).await?;
        self.child = None;
        self.channel = None;
        Some(status)
    }

    /// Sends SIGTERM and waits (bounded) for the driver to exit.
    pub async fn stop(&mut self) -> ExitStatus {
        let mut child = self.child.take().expect("driver is running");
        self.channel = None;
        let pid = nix::unistd::Pid::from_raw(i32::try_from(child.id()).expect("pid fits"));
        nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM).expect("send SIGTERM");
        let status = wait_bounded(&mut child, STOP_TIMEOUT).await;
        match status {
            Some(s) => s,
            None => {
                let _ = child.kill();
                let _ = child.wait();
                panic!(
                    "driver did not exit within {STOP_TIMEOUT:?} of SIGTERM\n{}",
                    self.log_text()
                );
            }
        }
    }

    /// The test's final step: assert nothing leaked, then stop the driver gracefully (exit 0,
    /// socket removed). A driver the test already stopped is only checked for leaks.
    pub async fn finish(mut self) {
        self.assert_no_leaks();
        if self.child.is_none() {
            self.release_pool();
            self.finished = true;
            return;
        }
        let status = self.stop().await;
        assert!(
            status.success(),
            "driver exited with {status} after SIGTERM\n{}",
            self.log_text()
        );
        if !self.opts.tcp {
            assert!(
                !self.socket.exists(),
                "driver left its socket {} behind after SIGTERM",
                self.socket.display()
            );
        }
        self.release_pool();
        self.finished = true;
    }

    /// Unmounts the harness-made pool filesystem (not lazily: a pool still busy after the
    /// driver stopped fails the test) and detaches its loop device.
    fn release_pool(&mut self) {
        if let Some(image) = self.pool_image.take() {
            let problems = release_pool_fs(&self.pool, &image, false);
            assert!(
                problems.is_empty(),
                "could not release the pool filesystem: {problems:?}"
            );
        }
        if let Some(vg) = self.vg.take() {
            let problems = vg.remove();
            assert!(
                problems.is_empty(),
                "could not remove the test volume group: {problems:?}"
            );
        }
    }

    /// The harness's own pool mount, which the leak check and the cleanup leave alone.
    fn harness_pool_mount(&self) -> Option<&Path> {
        self.pool_image.as_ref().map(|_| self.pool.as_path())
    }

    /// Fails the test if any mount below the temp dir or any loop device backed by a file in
    /// the pool is still there.
    pub fn assert_no_leaks(&self) {
        let mounts: Vec<String> = mounts_under(&self.root)
            .into_iter()
            .filter(|m| Some(m.mount_point.as_path()) != self.harness_pool_mount())
            .map(|m| {
                format!(
                    "{} ({} on {})",
                    m.mount_point.display(),
                    m.fs_type,
                    m.source
                )
            })
            .collect();
        let loops: Vec<String> = loops_backed_under(&self.pool)
            .into_iter()
            .map(|l| format!("{} -> {}", l.device.display(), l.backing_file))
            .collect();
        let open_lvs = self.vg.as_ref().map(|vg| vg.open_lvs()).unwrap_or_default();
        assert!(
            mounts.is_empty() && loops.is_empty() && open_lvs.is_empty(),
            "leaked after the test's teardown:\n  mounts: {mounts:?}\n  loop devices: {loops:?}\n  open LVs: {open_lvs:?}"
        );
    }

    /// The driver's log so far.
    pub fn log_text(&self) -> String {
        let text = fs::read_to_string(&self.log).unwrap_or_default();
        format!(
            "----- driver log {} -----\n{text}----- end of driver log -----",
            self.log.display()
        )
    }

    fn channel(&self) -> Channel {
        self.channel.clone().expect("driver is connected")
    }

    /// A client for the Identity service.
    pub fn identity(&self) -> IdentityClient<Channel> {
        IdentityClient::new(self.channel())
    }

    /// A client for the Controller service.
    pub fn controller(&self) -> ControllerClient<Channel> {
        ControllerClient::new(self.channel())
    }

    /// A client for the Node service.
    pub fn node(&self) -> NodeClient<Channel> {
        NodeClient::new(self.channel())
    }

    /// The backing file of a volume.
    pub fn backing_file(&self, volume_id: &str) -> PathBuf {
        self.pool.join(format!("{volume_id}.img"))
    }

    /// Names of the `.img` files in the pool.
    ///
    /// On the lvm backend: `<id>.img` for every volume LV, so the same checks apply.
    pub fn pool_images(&self) -> std::collections::BTreeSet<String> {
        if let Some(vg) = &self.vg {
            return vg
                .lv_names()
                .into_iter()
                .filter(|n| n.starts_with("fv-"))
                .map(|n| format!("{n}.img"))
                .collect();
        }
        fs::read_dir(&self.pool)
            .expect("read the pool dir")
            .filter_map(Result::ok)
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .filter(|n| n.ends_with(".img"))
            .collect()
    }

    /// `bytes` rounded up to the backend's allocation unit: 1 MiB for the loop backend,
    /// the 4 MiB extent of the test VG for lvm.
    pub fn rounded(&self, bytes: i64) -> i64 {
        let unit: i64 = if self.vg.is_some() { 4 << 20 } else { 1 << 20 };
        (bytes + unit - 1) / unit * unit
    }

    /// The size of a volume's storage (its backing file, or its LV); `None` when it has
    /// none.
    pub fn storage_size(&self, volume_id: &str) -> Option<u64> {
        match &self.vg {
            Some(vg) => vg.lv_size(volume_id),
            None => fs::metadata(self.backing_file(volume_id))
                .ok()
                .map(|m| m.len()),
        }
    }

    /// The size of a snapshot's storage (its file, or its LV); `None` when it has none.
    pub fn snapshot_storage_size(&self, snapshot_id: &str) -> Option<u64> {
        match &self.vg {
            Some(vg) => vg.lv_size(snapshot_id),
            None => fs::metadata(self.snapshot_file(snapshot_id))
                .ok()
                .map(|m| m.len()),
        }
    }

    /// Deletes a volume's storage behind the driver's back (its file, or its LV).
    pub fn remove_storage_behind_back(&self, volume_id: &str) {
        match &self.vg {
            Some(vg) => {
                run_tool(
                    "lvremove",
                    &["-q", "-f", &format!("{}/{volume_id}", vg.name)],
                );
            }
            None => fs::remove_file(self.backing_file(volume_id)).expect("remove the backing file"),
        }
    }

    /// Takes the volume's device away behind the driver's back, as a reboot would: detaches
    /// its loop device, or deactivates its LV.
    pub fn detach_behind_back(&self, volume_id: &str) {
        match &self.vg {
            Some(vg) => {
                run_tool(
                    "lvchange",
                    &["-q", "-an", &format!("{}/{volume_id}", vg.name)],
                );
            }
            None => {
                let lo = self
                    .loop_of(volume_id)
                    .expect("the volume has a loop device");
                crate::host::detach_loop_behind_back(&lo.device);
            }
        }
    }

    /// Makes the pool unusable (moves the pool directory away, or renames the VG) until
    /// [`Driver::restore_pool`].
    pub fn break_pool(&self) {
        match &self.vg {
            Some(vg) => {
                run_tool("vgrename", &["-q", &vg.name, &format!("{}-away", vg.name)]);
            }
            None => fs::rename(&self.pool, self.root.join("pool-moved-away"))
                .expect("rename the pool away"),
        }
    }

    /// Undoes [`Driver::break_pool`].
    pub fn restore_pool(&self) {
        match &self.vg {
            Some(vg) => {
                run_tool("vgrename", &["-q", &format!("{}-away", vg.name), &vg.name]);
            }
            None => fs::rename(self.root.join("pool-moved-away"), &self.pool)
                .expect("rename the pool back"),
        }
    }

    /// The loop device currently backed by the volume's file, if any.
    ///
    /// On the lvm backend: the LV's device-mapper node while the LV is active (its
    /// "backing file" is then `VG/LV`).
    pub fn loop_of(&self, volume_id: &str) -> Option<LoopDevice> {
        if let Some(vg) = &self.vg {
            return vg
                .active_device(volume_id)
                .map(|(device, major_minor)| LoopDevice {
                    device,
                    major_minor,
                    backing_file: format!("{}/{volume_id}", vg.name),
                });
        }
        let file = self.backing_file(volume_id);
        let mut found: Vec<LoopDevice> = loop_devices()
            .into_iter()
            .filter(|l| Path::new(l.backing_file.trim_end_matches(" (deleted)")) == file)
            .collect();
        assert!(
            found.len() <= 1,
            "volume {volume_id} has more than one loop device: {found:?}"
        );
        found.pop()
    }

    /// The per-volume staging directory (created by `stage_request`, as a CO would).
    pub fn staging_path(&self, volume_id: &str) -> PathBuf {
        self.root.join("staging").join(volume_id)
    }

    /// A publish target path; its parent exists, the target itself does not.
    pub fn target_path(&self, label: &str) -> PathBuf {
        self.root.join("targets").join(label)
    }

    /// CreateVolume that must succeed.
    pub async fn create(&self, name: &str, required_bytes: i64, cap: VolumeCapability) -> Volume {
        self.create_with(create_request(name, required_bytes, vec![cap]))
            .await
    }

    /// CreateVolume with a full request that must succeed.
    pub async fn create_with(&self, req: CreateVolumeRequest) -> Volume {
        let name = req.name.clone();
        let resp = ok(
            self.controller().create_volume(req).await,
            &format!("CreateVolume {name}"),
        );
        resp.volume.expect("CreateVolume response carries a volume")
    }

    /// DeleteVolume that must succeed.
    pub async fn delete(&self, volume_id: &str) {
        ok(
            self.controller()
                .delete_volume(DeleteVolumeRequest {
                    volume_id: volume_id.to_owned(),
                    ..Default::default()
                })
                .await,
            &format!("DeleteVolume {volume_id}"),
        );
    }

    /// The file of a snapshot in the pool.
    pub fn snapshot_file(&self, snapshot_id: &str) -> PathBuf {
        self.pool
            .join("snapshots")
            .join(format!("{snapshot_id}.img"))
    }

    /// CreateSnapshot that must succeed.
    pub async fn snapshot(&self, name: &str, source_volume_id: &str) -> Snapshot {
        self.snapshot_with(snapshot_request(name, source_volume_id))
            .await
    }

    /// CreateSnapshot with a full request that must succeed.
    pub async fn snapshot_with(&self, req: CreateSnapshotRequest) -> Snapshot {
        let what = format!("CreateSnapshot {} of {}", req.name, req.source_volume_id);
        ok(self.controller().create_snapshot(req).await, &what)
            .snapshot
            .expect("CreateSnapshot response carries a snapshot")
    }

    /// DeleteSnapshot that must succeed.
    pub async fn delete_snapshot(&self, snapshot_id: &str) {
        ok(
            self.controller()
                .delete_snapshot(DeleteSnapshotRequest {
                    snapshot_id: snapshot_id.to_owned(),
                    ..Default::default()
                })
                .await,
            &format!("DeleteSnapshot {snapshot_id}"),
        );
    }

    /// ControllerExpandVolume to at least `required_bytes` that must succeed.
    pub async fn expand(
        &self,
        volume_id: &str,
        required_bytes: i64,
    ) -> ControllerExpandVolumeResponse {
        ok(
            self.controller()
                .controller_expand_volume(ControllerExpandVolumeRequest {
                    volume_id: volume_id.to_owned(),
                    capacity_range: range(required_bytes, 0),
                    ..Default::default()
                })
                .await,
            &format!("ControllerExpandVolume {volume_id} to {required_bytes}"),
        )
    }

    /// A NodeExpandVolume request as the kubelet sends it: the published `volume_path`, the
    /// volume's staging path, its capability and the new size.
    pub fn node_expand_request(
        &self,
        volume_id: &str,
        volume_path: &Path,
        cap: &VolumeCapability,
        required_bytes: i64,
    ) -> NodeExpandVolumeRequest {
        NodeExpandVolumeRequest {
            volume_id: volume_id.to_owned(),
            volume_path: volume_path.display().to_string(),
            capacity_range: range(required_bytes, 0),
            staging_target_path: self.staging_path(volume_id).display().to_string(),
            volume_capability: Some(cap.clone()),
            ..Default::default()
        }
    }

    /// NodeExpandVolume that must succeed.
    pub async fn node_expand(
        &self,
        volume_id: &str,
        volume_path: &Path,
        cap: &VolumeCapability,
        required_bytes: i64,
    ) -> NodeExpandVolumeResponse {
        let req = self.node_expand_request(volume_id, volume_path, cap, required_bytes);
        ok(
            self.node().node_expand_volume(req).await,
            &format!("NodeExpandVolume {volume_id} {}", volume_path.display()),
        )
    }

    /// A NodeStageVolume request for the volume's staging dir (the dir is created).
    pub fn stage_request(&self, volume_id: &str, cap: &VolumeCapability) -> NodeStageVolumeRequest {
        let staging = self.staging_path(volume_id);
        fs::create_dir_all(&staging).expect("create the staging dir as a CO does");
        NodeStageVolumeRequest {
            volume_id: volume_id.to_owned(),
            staging_target_path: staging.display().to_string(),
            volume_capability: Some(cap.clone()),
            ..Default::default()
        }
    }

    /// NodeStageVolume that must succeed; returns the staging path.
    pub async fn stage(&self, volume_id: &str, cap: &VolumeCapability) -> PathBuf {
        let req = self.stage_request(volume_id, cap);
        ok(
            self.node().node_stage_volume(req).await,
            &format!("NodeStageVolume {volume_id}"),
        );
        self.staging_path(volume_id)
    }

    /// A NodePublishVolume request from the volume's staging dir to `targets/<label>`.
    pub fn publish_request(
        &self,
        volume_id: &str,
        cap: &VolumeCapability,
        label: &str,
        readonly: bool,
    ) -> NodePublishVolumeRequest {
        NodePublishVolumeRequest {
            volume_id: volume_id.to_owned(),
            staging_target_path: self.staging_path(volume_id).display().to_string(),
            target_path: self.target_path(label).display().to_string(),
            volume_capability: Some(cap.clone()),
            readonly,
            ..Default::default()
        }
    }

    /// NodePublishVolume that must succeed; returns the target path.
    pub async fn publish(
        &self,
        volume_id: &str,
        cap: &VolumeCapability,
        label: &str,
        readonly: bool,
    ) -> PathBuf {
        let req = self.publish_request(volume_id, cap, label, readonly);
        ok(
            self.node().node_publish_volume(req).await,
            &format!("NodePublishVolume {volume_id} -> {label}"),
        );
        self.target_path(label)
    }

    /// NodeUnpublishVolume that must succeed.
    pub async fn unpublish(&self, volume_id: &str, target: &Path) {
        ok(
            self.node()
                .node_unpublish_volume(NodeUnpublishVolumeRequest {
                    volume_id: volume_id.to_owned(),
                    target_path: target.display().to_string(),
                })
                .await,
            &format!("NodeUnpublishVolume {volume_id} {}", target.display()),
        );
    }

    /// NodeUnstageVolume that must succeed.
    pub async fn unstage(&self, volume_id: &str) {
        ok(
            self.node()
                .node_unstage_volume(NodeUnstageVolumeRequest {
                    volume_id: volume_id.to_owned(),
                    staging_target_path: self.staging_path(volume_id).display().to_string(),
                })
                .await,
            &format!("NodeUnstageVolume {volume_id}"),
        );
    }
}

impl Drop for Driver {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
        let mut leftovers = cleanup_last_resort(&self.root, &self.pool, self.harness_pool_mount());
        if let Some(image) = self.pool_image.take() {
            leftovers.extend(release_pool_fs(&self.pool, &image, true));
        }
        if let Some(vg) = self.vg.take() {
            leftovers.extend(vg.remove());
        }
        if std::thread::panicking() {
            eprintln!("{}", self.log_text());
            if !leftovers.is_empty() {
                eprintln!("cleanup of last resort removed: {leftovers:?}");
            }
        } else if !self.finished {
            panic!(
                "the test dropped its Driver without calling finish() (the leak check); \
                 cleanup of last resort removed: {leftovers:?}"
            );
        }
    }
}

/// Connects a gRPC channel over a unix socket.
pub async fn connect_unix(socket: &Path) -> Result<Channel, tonic::transport::Error> {
    let path = socket.to_path_buf();
    Endpoint::try_from("http://[::]:50051")?
        .timeout(RPC_TIMEOUT)
        .connect_with_connector(tower::service_fn(move |_| {
            let p = path.clone();
            async move {
                Ok::<_, std::io::Error>(hyper_util::rt::TokioIo::new(
                    tokio::net::UnixStream::connect(p).await?,
                ))
            }
        }))
        .await
}

/// Waits up to `limit` for `child` to exit without blocking the runtime.
pub async fn wait_bounded(child: &mut Child, limit: Duration) -> Option<ExitStatus> {
    let deadline = Instant::now() + limit;
    loop {
        if let Some(status) = child.try_wait().expect("poll a child process") {
            return Some(status);
        }
        if Instant::now() >= deadline {
            return None;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A port on 127.0.0.1 that was free a moment ago.
fn free_tcp_port() -> u16 {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind an ephemeral port");
    listener.local_addr().expect("local addr").port()
}

/// Counts the items of an iterator by key (used to check "seen exactly once").
pub fn count_by<K: Ord, I: IntoIterator<Item = K>>(items: I) -> BTreeMap<K, usize> {
    let mut counts = BTreeMap::new();
    for k in items {
        *counts.entry(k).or_insert(0) += 1;
    }
    counts
}
