//! Serving: endpoint parsing, the unix socket (stale-file handling, permissions), service
//! registration, start-up reconciliation and graceful shutdown.
//!
//! Shutdown is a parameter: [`run`] serves until the given future completes, then stops
//! accepting and lets in-flight RPCs finish before it returns.

use std::fs;
use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::os::unix::fs::{FileTypeExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use nix::sys::stat::{umask, Mode as FileMode};
use tokio::net::{TcpListener, UnixListener};
use tokio_stream::wrappers::{TcpListenerStream, UnixListenerStream};
use tonic::transport::Server;
use tracing::{info, warn};

use crate::backend::{Backend, LoopBackend, LvmBackend};
use crate::config::{BackendConfig, Config, Expansion, Mode};
use crate::controller::ControllerService;
use crate::csi::v1::controller_server::ControllerServer;
use crate::csi::v1::identity_server::IdentityServer;
use crate::csi::v1::node_server::NodeServer;
use crate::driver::Driver;
use crate::error::{Error, Result};
use crate::identity::IdentityService;
use crate::node::NodeService;
use crate::os::{freeze, mount};

/// Where the driver listens.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Endpoint {
    /// A unix socket at this path.
    Unix(PathBuf),
    /// A TCP address.
    Tcp(SocketAddr),
}

impl Endpoint {
    /// Parses `unix:///path/csi.sock`, `unix:/path` or `tcp://127.0.0.1:PORT`.
    ///
    /// # Errors
    /// `InvalidArgument` for any other form.
    pub fn parse(raw: &str) -> Result<Self> {
        if let Some(rest) = raw
            .strip_prefix("unix://")
            .or_else(|| raw.strip_prefix("unix:"))
        {
            let path = PathBuf::from(rest);
            if !path.is_absolute() {
                return Err(Error::InvalidArgument(format!(
                    "endpoint {raw:?}: the socket path must be absolute"
                )));
            }
            return Ok(Endpoint::Unix(path));
        }
        if let Some(rest) = raw.strip_prefix("tcp://") {
            let addr = rest
                .parse()
                .map_err(|e| Error::InvalidArgument(format!("endpoint {raw:?}: {e}")))?;
            return Ok(Endpoint::Tcp(addr));
        }
        Err(Error::InvalidArgument(format!(
            "endpoint {raw:?} must start with unix:// or tcp://"
        )))
    }
}

/// Removes a socket file that no process serves; refuses one that a live process serves.
fn clear_stale_socket(path: &Path) -> Result<()> {
    let meta = match fs::symlink_metadata(path) {
        Ok(meta) => meta,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(Error::io("stat", path, e)),
    };
    if !meta.file_type().is_socket() {
        return Err(Error::FailedPrecondition(format!(
            "{} exists and is not a socket; refusing to replace it",
            path.display()
        )));
    }
    match std::os::unix::net::UnixStream::connect(path) {
        Ok(_) => Err(Error::FailedPrecondition(format!(
            "another process is serving {}; refusing to start a second driver on it",
            path.display()
        ))),
        Err(_) => {
            warn!(socket = %path.display(), "removing stale socket");
            fs::remove_file(path).map_err(|e| Error::io("remove stale socket", path, e))
        }
    }
}

/// Binds a unix socket that only its owner (the driver's user) and group can use (mode
/// 0660); `group` gives the socket to another group, whose members may then call the
/// driver.
fn bind_unix(path: &Path, group: Option<u32>) -> Result<UnixListener> {
    if let Some(parent) = path.parent() {
        fs::create_dir_all(parent).map_err(|e| Error::io("create socket directory", parent, e))?;
    }
    clear_stale_socket(path)?;
    // The socket is created with the process umask: tighten it for the bind so the socket
    // is never reachable by others, not even for an instant.
    let previous = umask(FileMode::from_bits_truncate(0o117));
    let bound = UnixListener::bind(path);
    umask(previous);
    let listener = bound.map_err(|e| Error::io("bind", path, e))?;
    fs::set_permissions(path, fs::Permissions::from_mode(0o660))
        .map_err(|e| Error::io("chmod", path, e))?;
    if let Some(gid) = group {
        // Still 0660 and owned by the driver's group until here: never wider than asked.
        nix::unistd::chown(path, None, Some(nix::unistd::Gid::from_raw(gid)))
            .map_err(|e| Error::sys("chown", path, e))?;
    }
    Ok(listener)
}

/// Opens the backend and the store and checks records against what exists.
///
/// # Errors
/// `Io` or `Record` when the pool or the store cannot be opened.
pub fn open_driver(config: Config) -> Result<Arc<Driver>> {
    // A first start on a fresh node has neither directory yet.
    fs::create_dir_all(&config.state_dir)
        .map_err(|e| Error::io("create state directory", &config.state_dir, e))?;
    let backend: Arc<dyn Backend> = match &config.backend {
        BackendConfig::Loop => {
            let backend =
                LoopBackend::open_with_ratio(&config.pool_dir, config.overprovision_ratio)?;
            // gc judges the pool's files by this state directory's records: say which it is.
            if config.mode != Mode::Node {
                crate::backend::loopfile::write_owner(&config.pool_dir, &config.state_dir)?;
            }
            Arc::new(backend)
        }
        BackendConfig::Lvm(classes) => {
            Arc::new(LvmBackend::open(classes.clone(), config.tool_timeout)?)
        }
    };
    let driver = Driver::open(config, backend)?;
    restore_records(&driver)?;
    reconcile(&driver);
    Ok(driver)
}

/// Gives the controller back every record that its backend keeps beside the storage (LV
/// tags) and the state directory lacks: after a crash between the storage and the record,
/// or in a new pod with an empty state directory.
///
/// # Errors
/// `Io` or `Record` when the backend cannot be listed or a record cannot be written.
fn restore_records(driver: &Driver) -> Result<()> {
    if driver.config.mode == Mode::Node {
        return Ok(());
    }
    let stored = driver.backend.stored_records()?;
    for record in stored.volumes {
        if !driver.volumes.contains(&record.volume_id) {
            info!(volume_id = %record.volume_id, "volume record restored from the backend");
            driver.volumes.put(&record.volume_id.clone(), &record)?;
        }
    }
    for record in stored.snapshots {
        if !driver.snapshots.contains(&record.snapshot_id) {
            info!(snapshot_id = %record.snapshot_id, "snapshot record restored from the backend");
            driver.snapshots.put(&record.snapshot_id.clone(), &record)?;
        }
    }
    Ok(())
}

/// Reports records and storage that disagree, after a crash or a reboot, and thaws the
/// filesystems of staged volumes.
///
/// Nothing is deleted here: storage without a record is left by a CreateVolume that never
/// answered, and its retry adopts it; stage records without a mount are restored by the
/// NodeStageVolume that kubelet sends after a reboot.
///
/// A driver that died during CreateSnapshot (or a clone) of a staged volume left that
/// volume's filesystem frozen, and every writer in the pod blocked, until a retry of the
/// same call happens to thaw it, which may never come. So every staging mount of this
/// node's volumes is thawed at start; thawing one that is not frozen changes nothing.
/// The kernel does not say who froze a filesystem, so this also ends a freeze that
/// someone else made on a staged volume (see `os::freeze`).
fn reconcile(driver: &Driver) {
    if driver.config.mode != Mode::Node {
        match driver.backend.list() {
            Ok(ids) => {
                for id in ids
                    .iter()
                    .filter(|id| !driver.volumes.contains(id.as_str()))
                {
                    warn!(volume_id = %id, "storage without a record (an interrupted CreateVolume); a retry adopts it");
                }
                for record in driver.volumes.all() {
                    if !ids.iter().any(|id| id.as_str() == record.volume_id) {
                        warn!(volume_id = %record.volume_id, "volume record without storage");
                    }
                }
            }
            Err(e) => warn!(cause = %e, "cannot list the pool"),
        }
    }
    if driver.config.mode != Mode::Controller {
        let table = mount::read_mountinfo().unwrap_or_else(|e| {
            warn!(cause = %e, "cannot read the mount table; frozen staging mounts stay as they are");
            Vec::new()
        });
        for record in driver.staged.all() {
            let devices = crate::ids::VolumeId::parse_ours("volume_id", &record.volume_id)
                .ok()
                .and_then(|id| driver.backend.devices(&id).ok())
                .unwrap_or_default();
            if devices.is_empty() {
                warn!(volume_id = %record.volume_id, "staged volume has no device (node rebooted?); NodeStageVolume restores it");
                continue;
            }
            let staged_here = mount::mount_at(&table, &record.staging_path)
                .is_some_and(|m| devices.iter().any(|d| d.is_source_of(m)));
            if staged_here {
                if let Err(e) = freeze::thaw(&record.staging_path) {
                    warn!(volume_id = %record.volume_id, cause = %e, "cannot thaw the staging mount");
                }
            }
        }
    }
    info!(
        volumes = driver.volumes.len(),
        staged = driver.staged.len(),
        backend = driver.backend.kind(),
        "driver state loaded"
    );
}

/// A bound CSI endpoint, not yet served.
enum Bound {
    /// A unix socket and its path (removed when serving ends).
    Unix(PathBuf, UnixListener),
    /// A TCP listener and its local address.
    Tcp(SocketAddr, TcpListener),
}

impl Bound {
    async fn bind(endpoint: Endpoint, socket_group: Option<u32>) -> Result<Self> {
        match endpoint {
            Endpoint::Unix(path) => {
                let listener = bind_unix(&path, socket_group)?;
                Ok(Bound::Unix(path, listener))
            }
            Endpoint::Tcp(addr) => {
                let listener = TcpListener::bind(addr)
                    .await
                    .map_err(|e| Error::io("bind", addr.to_string(), e))?;
                let local = listener
                    .local_addr()
                    .map_err(|e| Error::io("local address of", addr.to_string(), e))?;
                Ok(Bound::Tcp(local, listener))
            }
        }
    }

    /// Gives the endpoint up without serving it.
    fn release(self) {
        if let Bound::Unix(path, listener) = self {
            drop(listener);
            let _ = fs::remove_file(&path);
        }
    }
}

/// Serves the configured services on `endpoint`, and `/metrics` and `/healthz` on the
/// metrics address, until `shutdown` completes.
///
/// # Errors
/// `Io` when the endpoint or the metrics address cannot be bound, or serving fails.
pub async fn run(
    driver: Arc<Driver>,
    endpoint: Endpoint,
    shutdown: impl Future<Output = ()> + Send,
) -> Result<()> {
    // The CSI endpoint is bound first: a second driver on a live socket stops there.
    let bound = Bound::bind(endpoint, driver.config.socket_group).await?;
    let metrics = match driver.config.metrics_address {
        Some(addr) => match crate::http::bind(addr).await {
            Ok(listener) => Some(tokio::spawn(crate::http::serve(
                listener,
                Arc::clone(&driver),
            ))),
            Err(e) => {
                bound.release();
                return Err(e);
            }
        },
        None => None,
    };
    let served = serve_csi(&driver, bound, shutdown).await;
    if let Some(task) = metrics {
        task.abort();
    }
    served
}

async fn serve_csi(
    driver: &Arc<Driver>,
    bound: Bound,
    shutdown: impl Future<Output = ()> + Send,
) -> Result<()> {
    let mode = driver.config.mode;
    let identity = IdentityServer::new(IdentityService::new(Arc::clone(driver)));
    let controller = (mode != Mode::Node)
        .then(|| ControllerServer::new(ControllerService::new(Arc::clone(driver))));
    // A controller-only process with node expansion answers NodeGetCapabilities too:
    // external-resizer asks it there before it takes its node-only path.
    let node = (mode != Mode::Controller || driver.config.expansion == Expansion::Node)
        .then(|| NodeServer::new(NodeService::new(Arc::clone(driver))));
    let router = Server::builder()
        .add_service(identity)
        .add_optional_service(controller)
        .add_optional_service(node);
    match bound {
        Bound::Unix(path, listener) => {
            info!(endpoint = %path.display(), driver = %driver.config.driver_name, node_id = %driver.config.node_id, "serving");
            let served = router
                .serve_with_incoming_shutdown(UnixListenerStream::new(listener), shutdown)
                .await;
            let _ = fs::remove_file(&path);
            served.map_err(|e| Error::Internal(format!("serving {}: {e}", path.display())))
        }
        Bound::Tcp(local, listener) => {
            info!(endpoint = %local, driver = %driver.config.driver_name, node_id = %driver.config.node_id, "serving");
            router
                .serve_with_incoming_shutdown(TcpListenerStream::new(listener), shutdown)
                .await
                .map_err(|e| Error::Internal(format!("serving {local}: {e}")))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoints_parse() {
        assert_eq!(
            Endpoint::parse("unix:///csi/csi.sock").ok(),
            Some(Endpoint::Unix(PathBuf::from("/csi/csi.sock")))
        );
        assert_eq!(
            Endpoint::parse("unix:/csi/csi.sock").ok(),
            Some(Endpoint::Unix(PathBuf::from("/csi/csi.sock")))
        );
        assert!(matches!(
            Endpoint::parse("tcp://127.0.0.1:10000"),
            Ok(Endpoint::Tcp(_))
        ));
        for bad in [
            "/csi.sock",
            "unix://relative.sock",
            "tcp://nohost",
            "http://x",
        ] {
            assert!(Endpoint::parse(bad).is_err(), "{bad}");
        }
    }
}
