//! The state every service shares: configuration, backend, records, locks, and the bounded
//! pool of blocking work.

use std::future::Future;
use std::sync::Arc;

use tokio::sync::Semaphore;
use tracing::{Instrument, Span};

use crate::backend::Backend;
use crate::config::Config;
use crate::error::{Error, Result};
use crate::ids::VolumeId;
use crate::locks::{Gate, OpLocks};
use crate::store::{RecordDir, SnapshotRecord, StageRecord, VolumeRecord};

/// Shared state of one driver process.
#[derive(Debug)]
pub struct Driver {
    /// Settings from the command line.
    pub config: Config,
    /// Where volumes live.
    pub backend: Arc<dyn Backend>,
    /// The controller's volume records.
    pub volumes: RecordDir<VolumeRecord>,
    /// The controller's snapshot records.
    pub snapshots: RecordDir<SnapshotRecord>,
    /// The node's records of staged volumes.
    pub staged: RecordDir<StageRecord>,
    /// One operation per volume at a time.
    pub locks: Arc<OpLocks>,
    /// Keeps operations and `ferrovol gc` apart.
    pub gate: Arc<Gate>,
    /// Whether this process may grow a mounted ext4 (`CAP_SYS_RESOURCE`), read once at
    /// start: capabilities do not change while the process runs.
    pub can_grow_mounted_ext4: bool,
    /// Request counts, latencies and state gauges for `/metrics`.
    pub metrics: crate::metrics::Metrics,
    /// Bounds how much blocking work (ioctls, mounts, fsyncs) runs at once, so one hung
    /// device cannot take every blocking thread.
    blocking_slots: Arc<Semaphore>,
}

impl Driver {
    /// Opens the metadata store under `config.state_dir`.
    ///
    /// # Errors
    /// `Io` or `Record` when the store cannot be opened.
    pub fn open(config: Config, backend: Arc<dyn Backend>) -> Result<Arc<Self>> {
        let volumes = RecordDir::open(&config.state_dir.join("volumes"))?;
        let snapshots = RecordDir::open(&config.state_dir.join("snapshots"))?;
        let staged = RecordDir::open(&config.state_dir.join("staged"))?;
        let slots = config.max_blocking_jobs.max(1);
        let gate = Arc::new(Gate::open(&config.state_dir)?);
        Ok(Arc::new(Driver {
            config,
            backend,
            volumes,
            snapshots,
            staged,
            locks: Arc::new(OpLocks::default()),
            gate,
            can_grow_mounted_ext4: crate::os::caps::has_effective(
                crate::os::caps::CAP_SYS_RESOURCE,
            ),
            metrics: crate::metrics::Metrics::new()?,
            blocking_slots: Arc::new(Semaphore::new(slots)),
        }))
    }

    /// The controller record of volume `id`.
    ///
    /// # Errors
    /// `NotFound` when there is none.
    pub fn volume_record(&self, id: &VolumeId) -> Result<VolumeRecord> {
        self.volumes
            .get(id.as_str())
            .ok_or_else(|| Error::NotFound(format!("volume {id} does not exist")))
    }

    /// Runs blocking work on a blocking thread, within the bound on concurrent jobs.
    ///
    /// # Errors
    /// Whatever `work` returns; `Internal` if the thread panicked.
    pub async fn blocking<T, F>(&self, work: F) -> Result<T>
    where
        F: FnOnce() -> Result<T> + Send + 'static,
        T: Send + 'static,
    {
        // The slot moves into the job: it is held until the blocking call really returns,
        // also when the caller gave up and dropped this future.
        let slot = Arc::clone(&self.blocking_slots)
            .acquire_owned()
            .await
            .map_err(|_| Error::Internal("blocking job pool closed".into()))?;
        let span = Span::current();
        tokio::task::spawn_blocking(move || {
            let _slot = slot;
            span.in_scope(work)
        })
        .await
        .map_err(|e| Error::Internal(format!("blocking job failed: {e}")))?
    }

    /// Runs an operation on `key` under its lock, in a task of its own.
    ///
    /// The lock moves into the task, so when the client gives up (tonic drops the handler
    /// future) the operation still runs to its end and the volume stays locked until then.
    ///
    /// # Errors
    /// `Aborted` when another operation holds `key` or `ferrovol gc` is running; otherwise
    /// whatever `op` returns.
    pub async fn locked<T, F, Fut>(self: &Arc<Self>, key: &str, op: F) -> Result<T>
    where
        F: FnOnce(Arc<Driver>) -> Fut + Send + 'static,
        Fut: Future<Output = Result<T>> + Send + 'static,
        T: Send + 'static,
    {
        let guard = self.locks.try_lock(key)?;
        let pass = self.gate.enter()?;
        let driver = Arc::clone(self);
        tokio::spawn(
            async move {
                let _guard = guard;
                let _pass = pass;
                op(driver).await
            }
            .instrument(Span::current()),
        )
        .await
        .map_err(|e| Error::Internal(format!("operation on {key} failed: {e}")))?
    }
}
