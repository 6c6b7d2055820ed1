//! Prometheus metrics: per-RPC counts, latencies and in-flight operations, and gauges of
//! the pool and the driver's state read at scrape time.
//!
//! Every metric lives in one [`prometheus::Registry`] owned by [`Metrics`], which the
//! driver state carries (no global registry). Labels are method names, gRPC codes, the
//! backend kind and the pool name, never a volume id or a name from a request, so the
//! number of series stays fixed and the port shows nothing of what the volumes hold.
//!
//! | metric | type | labels |
//! | --- | --- | --- |
//! | `ferrovol_rpc_requests_total` | counter | `method`, `code` |
//! | `ferrovol_rpc_duration_seconds` | histogram | `method` |
//! | `ferrovol_rpc_in_flight` | gauge | `method` |
//! | `ferrovol_pool_capacity_bytes` | gauge | `backend`, `pool` |
//! | `ferrovol_pool_available_bytes` | gauge | `backend`, `pool` |
//! | `ferrovol_volumes` | gauge | |
//! | `ferrovol_snapshots` | gauge | |
//! | `ferrovol_loop_devices` | gauge | |
//! | `ferrovol_staged_volumes` | gauge | |
//! | `ferrovol_published_targets` | gauge | |

use std::time::{Duration, Instant};

use prometheus::{
    Encoder, HistogramOpts, HistogramVec, IntCounterVec, IntGauge, IntGaugeVec, Opts, Registry,
    TextEncoder,
};
use tonic::Code;

use crate::driver::Driver;
use crate::error::{Error, Result};
use crate::os::loopdev;

/// Latency buckets in seconds: from a cached answer (well under a millisecond) to a mkfs
/// of a large volume (a minute or more).
const LATENCY_BUCKETS: &[f64] = &[
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
    60.0, 120.0,
];

/// The name of the one pool a loop backend has, as the `pool` label shows it.
pub const DEFAULT_POOL: &str = "default";

/// The driver's metrics and the registry that exposes them.
#[derive(Debug)]
pub struct Metrics {
    /// Holds every metric below; rendered by [`Metrics::render`].
    registry: Registry,
    /// Finished RPCs by method and status code.
    requests: IntCounterVec,
    /// How long RPCs took, by method.
    latency: HistogramVec,
    /// RPCs running now, by method.
    in_flight: IntGaugeVec,
    /// Size of each pool.
    pool_capacity: IntGaugeVec,
    /// Bytes each pool can still promise to new volumes.
    pool_available: IntGaugeVec,
    /// Volume records of the controller.
    volumes: IntGauge,
    /// Snapshot records of the controller.
    snapshots: IntGauge,
    /// Loop devices attached to backing files of the pool.
    loop_devices: IntGauge,
    /// Volumes staged on this node.
    staged: IntGauge,
    /// Publish targets (pod mounts and device binds) on this node.
    published: IntGauge,
}

fn registered<M: prometheus::core::Collector + Clone + 'static>(
    registry: &Registry,
    metric: std::result::Result<M, prometheus::Error>,
) -> Result<M> {
    let metric = metric.map_err(|e| Error::Internal(format!("metric definition: {e}")))?;
    registry
        .register(Box::new(metric.clone()))
        .map_err(|e| Error::Internal(format!("metric registration: {e}")))?;
    Ok(metric)
}

/// The name of a gRPC status code as the gRPC and CSI specs spell it (`OK`,
/// `INVALID_ARGUMENT`, ...).
pub fn code_name(code: Code) -> &'static str {
    match code {
        Code::Ok => "OK",
        Code::Cancelled => "CANCELLED",
        Code::Unknown => "UNKNOWN",
        Code::InvalidArgument => "INVALID_ARGUMENT",
        Code::DeadlineExceeded => "DEADLINE_EXCEEDED",
        Code::NotFound => "NOT_FOUND",
        Code::AlreadyExists => "ALREADY_EXISTS",
        Code::PermissionDenied => "PERMISSION_DENIED",
        Code::ResourceExhausted => "RESOURCE_EXHAUSTED",
        Code::FailedPrecondition => "FAILED_PRECONDITION",
        Code::Aborted => "ABORTED",
        Code::OutOfRange => "OUT_OF_RANGE",
        Code::Unimplemented => "UNIMPLEMENTED",
        Code::Internal => "INTERNAL",
        Code::Unavailable => "UNAVAILABLE",
        Code::DataLoss => "DATA_LOSS",
        Code::Unauthenticated => "UNAUTHENTICATED",
    }
}

impl Metrics {
    /// A fresh registry with every ferrovol metric in it.
    ///
    /// # Errors
    /// `Internal` if a metric definition is rejected (a bug).
    pub fn new() -> Result<Self> {
        let registry = Registry::new();
        let requests = registered(
            &registry,
            IntCounterVec::new(
                Opts::new(
                    "ferrovol_rpc_requests_total",
                    "CSI RPCs finished, by method and gRPC status code",
                ),
                &["method", "code"],
            ),
        )?;
        let latency = registered(
            &registry,
            HistogramVec::new(
                HistogramOpts::new(
                    "ferrovol_rpc_duration_seconds",
                    "Time from a CSI RPC's arrival to its answer, by method",
                )
                .buckets(LATENCY_BUCKETS.to_vec()),
                &["method"],
            ),
        )?;
        let in_flight = registered(
            &registry,
            IntGaugeVec::new(
                Opts::new("ferrovol_rpc_in_flight", "CSI RPCs running now, by method"),
                &["method"],
            ),
        )?;
        let pool_capacity = registered(
            &registry,
            IntGaugeVec::new(
                Opts::new("ferrovol_pool_capacity_bytes", "Size of the pool in bytes"),
                &["backend", "pool"],
            ),
        )?;
        let pool_available = registered(
            &registry,
            IntGaugeVec::new(
                Opts::new(
                    "ferrovol_pool_available_bytes",
                    "Bytes the pool can still promise to new volumes (GetCapacity)",
                ),
                &["backend", "pool"],
            ),
        )?;
        let gauge = |name: &str, help: &str| registered(&registry, IntGauge::new(name, help));
        Ok(Metrics {
            volumes: gauge(
                "ferrovol_volumes",
                "Volumes the controller holds records of",
            )?,
            snapshots: gauge(
                "ferrovol_snapshots",
                "Snapshots the controller holds records of",
            )?,
            loop_devices: gauge(
                "ferrovol_loop_devices",
                "Loop devices attached to backing files in the pool",
            )?,
            staged: gauge("ferrovol_staged_volumes", "Volumes staged on this node")?,
            published: gauge(
                "ferrovol_published_targets",
                "Publish targets (pod mounts and block binds) on this node",
            )?,
            registry,
            requests,
            latency,
            in_flight,
            pool_capacity,
            pool_available,
        })
    }

    /// Counts an RPC as running until the returned guard is finished or dropped.
    pub fn begin(&self, method: &'static str) -> InFlight<'_> {
        self.in_flight.with_label_values(&[method]).inc();
        InFlight {
            metrics: self,
            method,
            started: Instant::now(),
            finished: false,
        }
    }

    fn record(&self, method: &str, code: Code, elapsed: Duration) {
        self.in_flight.with_label_values(&[method]).dec();
        self.requests
            .with_label_values(&[method, code_name(code)])
            .inc();
        self.latency
            .with_label_values(&[method])
            .observe(elapsed.as_secs_f64());
    }

    /// Reads the pool and the driver's records into the gauges, then renders every metric
    /// in the Prometheus text format. Blocks (it measures the pool and lists loop
    /// devices): call it from a blocking thread.
    ///
    /// # Errors
    /// `Internal` when encoding fails. A pool that cannot be measured leaves its gauges
    /// out rather than failing the scrape.
    pub fn render(&self, driver: &Driver) -> Result<String> {
        let backend = driver.backend.kind();
        match driver.backend.capacity() {
            Ok(capacity) => {
                self.pool_capacity
                    .with_label_values(&[backend, DEFAULT_POOL])
                    .set(saturating_i64(capacity.total_bytes));
                self.pool_available
                    .with_label_values(&[backend, DEFAULT_POOL])
                    .set(saturating_i64(capacity.available_bytes));
            }
            Err(e) => {
                tracing::warn!(cause = %e, "cannot measure the pool for /metrics");
                self.pool_capacity.reset();
                self.pool_available.reset();
            }
        }
        self.volumes.set(saturating_i64(driver.volumes.len()));
        self.snapshots.set(saturating_i64(driver.snapshots.len()));
        let staged = driver.staged.all();
        self.staged.set(saturating_i64(staged.len()));
        self.published.set(saturating_i64(
            staged.iter().map(|s| s.targets.len()).sum::<usize>(),
        ));
        // sysfs names backing files by their canonical path.
        let pool = std::fs::canonicalize(&driver.config.pool_dir)
            .unwrap_or_else(|_| driver.config.pool_dir.clone());
        match loopdev::attached_in(&pool) {
            Ok(devices) => self.loop_devices.set(saturating_i64(devices.len())),
            Err(e) => tracing::warn!(cause = %e, "cannot list loop devices for /metrics"),
        }
        let mut out = Vec::new();
        TextEncoder::new()
            .encode(&self.registry.gather(), &mut out)
            .map_err(|e| Error::Internal(format!("encoding metrics: {e}")))?;
        String::from_utf8(out).map_err(|e| Error::Internal(format!("encoding metrics: {e}")))
    }
}

fn saturating_i64(n: impl TryInto<i64>) -> i64 {
    n.try_into().unwrap_or(i64::MAX)
}

/// An RPC counted as in flight. [`InFlight::finish`] records its code and latency; a guard
/// dropped unfinished (the client went away and tonic dropped the handler) counts as
/// CANCELLED.
#[derive(Debug)]
pub struct InFlight<'a> {
    /// Where to record.
    metrics: &'a Metrics,
    /// The RPC's method name.
    method: &'static str,
    /// When the RPC arrived.
    started: Instant,
    /// Set once recorded.
    finished: bool,
}

impl InFlight<'_> {
    /// Records the RPC's outcome; returns how long it took.
    pub fn finish(mut self, code: Code) -> Duration {
        let elapsed = self.started.elapsed();
        self.metrics.record(self.method, code, elapsed);
        self.finished = true;
        elapsed
    }
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        if !self.finished {
            // The client went away (its deadline passed). Work that holds a volume lock
            // runs on in its own task; its outcome shows in that task's log lines only.
            tracing::info!(
                method = self.method,
                "client cancelled the rpc; work already started finishes on its own"
            );
            self.metrics
                .record(self.method, Code::Cancelled, self.started.elapsed());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn outcomes_are_counted_by_method_and_code() {
        let metrics = Metrics::new().expect("metrics");
        metrics.begin("CreateVolume").finish(Code::Ok);
        metrics.begin("CreateVolume").finish(Code::InvalidArgument);
        drop(metrics.begin("DeleteVolume"));
        let count =
            |method: &str, code: &str| metrics.requests.with_label_values(&[method, code]).get();
        assert_eq!(count("CreateVolume", "OK"), 1);
        assert_eq!(count("CreateVolume", "INVALID_ARGUMENT"), 1);
        assert_eq!(count("DeleteVolume", "CANCELLED"), 1);
        assert_eq!(
            metrics.in_flight.with_label_values(&["CreateVolume"]).get(),
            0
        );
        assert_eq!(
            metrics
                .latency
                .with_label_values(&["CreateVolume"])
                .get_sample_count(),
            2
        );
    }
}
