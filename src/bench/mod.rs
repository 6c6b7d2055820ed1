//! `ferrovol bench`: a CSI load generator that speaks gRPC to any CSI endpoint (ferrovol
//! or another driver), so drivers can be compared on the same client.
//!
//! Scenarios ([`scenarios`]): `create-delete` (CreateVolume then DeleteVolume, N at
//! concurrency C, optionally with M volumes made beforehand), `node-cycle` (CreateVolume,
//! NodeStage, NodePublish, NodeUnpublish, NodeUnstage, DeleteVolume per filesystem type or
//! block), `snapshot` (a volume holding D bytes, then CreateSnapshot and a restore from
//! it, each iteration) and `mixed` (all of them interleaved, plus GetCapacity and
//! ListVolumes). Every response is checked; failed calls and failed checks are counted
//! by gRPC code ([`report`]). Everything a run makes is tracked ([`resources`]) and
//! removed at the end, also after an error or Ctrl-C (which stops new iterations).
//!
//! # Design
//! The client runs on one thread (a current-thread tokio runtime) and one HTTP/2
//! connection, so that on a small machine it takes as little CPU from the driver as
//! possible; concurrency comes from C tasks multiplexed on that connection.

mod progress;
pub mod report;
mod resources;
mod scenarios;

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tonic::transport::{Channel, Endpoint as TonicEndpoint};

use crate::admin::Output;
use crate::csi::v1::controller_client::ControllerClient;
use crate::csi::v1::identity_client::IdentityClient;
use crate::csi::v1::node_client::NodeClient;
use crate::csi::v1::GetPluginInfoRequest;
use crate::error::{Error, Result};
use crate::server::Endpoint;

pub use report::Report;

/// Which load to generate.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Scenario {
    /// CreateVolume then DeleteVolume.
    CreateDelete,
    /// Create, stage, publish, unpublish, unstage, delete.
    NodeCycle,
    /// Snapshot and restore of a volume holding data.
    Snapshot,
    /// Everything interleaved.
    Mixed,
}

impl Scenario {
    fn name(self) -> &'static str {
        match self {
            Scenario::CreateDelete => "create-delete",
            Scenario::NodeCycle => "node-cycle",
            Scenario::Snapshot => "snapshot",
            Scenario::Mixed => "mixed",
        }
    }
}

/// `ferrovol bench` arguments.
#[derive(Debug, Clone, clap::Args)]
pub struct BenchArgs {
    /// The scenario
    #[arg(value_enum)]
    pub scenario: Scenario,
    /// The CSI endpoint to load: unix:///path/csi.sock or tcp://HOST:PORT
    #[arg(long, env = "CSI_ENDPOINT")]
    pub endpoint: String,
    /// Iterations (create-delete pairs, node cycles, snapshot+restore rounds)
    #[arg(long, short = 'n', default_value_t = 1000)]
    pub count: u64,
    /// Iterations running at once
    #[arg(long, short = 'c', default_value_t = 16)]
    pub concurrency: u64,
    /// Volumes to create before measuring, kept while measuring (create-delete, mixed)
    #[arg(long, default_value_t = 0)]
    pub existing: u64,
    /// Volume size: bytes, or with a suffix K/M/G/T (binary: 1G = 1 GiB)
    #[arg(long, default_value = "1G", value_parser = parse_size)]
    pub size: u64,
    /// Filesystem types for node-cycle, comma-separated; `block` for a raw block volume
    #[arg(long, value_delimiter = ',', default_value = "ext4")]
    pub fs_types: Vec<String>,
    /// Directory for staging and target paths (node-cycle, snapshot, mixed); it must lie
    /// below the driver's --path-root
    #[arg(long)]
    pub work_dir: Option<PathBuf>,
    /// Bytes written into the volume before it is snapshotted (snapshot scenario)
    #[arg(long, default_value = "512M", value_parser = parse_size)]
    pub data: u64,
    /// CreateVolume/CreateSnapshot parameters, KEY=VALUE (repeat for more)
    #[arg(long = "parameter", value_parser = parse_parameter)]
    pub parameters: Vec<(String, String)>,
    /// Prefix of the names the bench gives volumes and snapshots [default: bench-<pid>]
    #[arg(long)]
    pub name_prefix: Option<String>,
    /// Call ControllerPublishVolume/ControllerUnpublishVolume in node cycles (for
    /// drivers that attach)
    #[arg(long)]
    pub controller_publish: bool,
    /// Seconds any single RPC may take
    #[arg(long, default_value_t = 300)]
    pub rpc_timeout_secs: u64,
    /// table or json
    #[arg(long, value_enum, default_value = "table")]
    pub output: Output,
}

/// Parses `1073741824`, `512M`, `1G`, `1Gi`, `16MiB`.
///
/// # Errors
/// A message for anything else.
pub fn parse_size(raw: &str) -> std::result::Result<u64, String> {
    let text = raw.trim();
    let digits = text
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(text.len());
    let (number, unit) = text.split_at(digits);
    let number: u64 = number
        .parse()
        .map_err(|_| format!("{raw:?} is not a size (e.g. 1073741824, 512M, 1G)"))?;
    let shift = match unit.trim().to_ascii_uppercase().as_str() {
        "" | "B" => 0,
        "K" | "KI" | "KIB" => 10,
        "M" | "MI" | "MIB" => 20,
        "G" | "GI" | "GIB" => 30,
        "T" | "TI" | "TIB" => 40,
        other => return Err(format!("{raw:?}: unknown size unit {other:?}")),
    };
    number
        .checked_mul(1u64 << shift)
        .ok_or_else(|| format!("{raw:?} is too large"))
}

fn parse_parameter(raw: &str) -> std::result::Result<(String, String), String> {
    raw.split_once('=')
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .ok_or_else(|| format!("{raw:?} is not KEY=VALUE"))
}

/// The gRPC clients of one connection.
#[derive(Debug, Clone)]
pub struct Clients {
    /// Identity service.
    pub identity: IdentityClient<Channel>,
    /// Controller service.
    pub controller: ControllerClient<Channel>,
    /// Node service.
    pub node: NodeClient<Channel>,
}

/// Connects to a CSI endpoint (`unix://` or `tcp://`).
///
/// # Errors
/// `InvalidArgument` for a malformed endpoint; `FailedPrecondition` when nothing answers.
pub async fn connect(endpoint: &str, rpc_timeout: Duration) -> Result<Clients> {
    let unavailable = |e: tonic::transport::Error| {
        Error::FailedPrecondition(format!("cannot connect to {endpoint}: {e}"))
    };
    let channel = match Endpoint::parse(endpoint)? {
        Endpoint::Tcp(addr) => TonicEndpoint::try_from(format!("http://{addr}"))
            .map_err(unavailable)?
            .timeout(rpc_timeout)
            .connect()
            .await
            .map_err(unavailable)?,
        Endpoint::Unix(path) => {
            // The URI is required by the API and unused: the connector dials the socket.
            TonicEndpoint::try_from("http://[::]:50051")
                .map_err(unavailable)?
                .timeout(rpc_timeout)
                .connect_with_connector(tower::service_fn(move |_| {
                    let path = path.clone();
                    async move {
                        Ok::<_, std::io::Error>(hyper_util::rt::TokioIo::new(
                            tokio::net::UnixStream::connect(path).await?,
                        ))
                    }
                }))
                .await
                .map_err(unavailable)?
        }
    };
    Ok(Clients {
        identity: IdentityClient::new(channel.clone()),
        controller: ControllerClient::new(channel.clone()),
        node: NodeClient::new(channel),
    })
}

/// Runs the benchmark until done or until `stop` is set, cleans up and reports.
///
/// # Errors
/// When the endpoint cannot be reached or the arguments cannot work (no work directory
/// for a scenario that stages); failures of single calls are counted in the report.
pub async fn run(args: BenchArgs, stop: Arc<AtomicBool>) -> Result<Report> {
    if args.concurrency == 0 {
        return Err(Error::InvalidArgument(
            "--concurrency must be at least 1".into(),
        ));
    }
    let needs_dir = matches!(args.scenario, Scenario::NodeCycle | Scenario::Snapshot);
    if needs_dir && args.work_dir.is_none() {
        return Err(Error::InvalidArgument(format!(
            "{} stages volumes: give --work-dir, a directory below the driver's --path-root",
            args.scenario.name()
        )));
    }
    let clients = connect(&args.endpoint, Duration::from_secs(args.rpc_timeout_secs)).await?;
    let info = clients
        .identity
        .clone()
        .get_plugin_info(GetPluginInfoRequest {})
        .await
        .map_err(|s| {
            Error::FailedPrecondition(format!(
                "GetPluginInfo on {}: {}: {}",
                args.endpoint,
                s.code(),
                s.message()
            ))
        })?
        .into_inner();
    let prefix = args
        .name_prefix
        .clone()
        .unwrap_or_else(|| format!("bench-{}", std::process::id()));
    let bench = Arc::new(scenarios::Bench::new(args.clone(), clients, prefix, stop));
    let runs = scenarios::run(&bench).await;
    let cleanup_errors = bench.clean_up().await;
    let leftovers = bench.resources.leftovers().describe();
    let errors = runs.iter().map(|r| r.errors).sum::<u64>() + cleanup_errors;
    Ok(Report {
        endpoint: args.endpoint,
        driver: format!("{} {}", info.name, info.vendor_version),
        runs,
        errors,
        interrupted: bench.stopped(),
        leftovers,
    })
}

/// The `ferrovol bench` command: runs, prints the report, exits 0 only when every call
/// succeeded and nothing was left behind (1 otherwise, 2 when it could not run).
pub fn main(args: BenchArgs) -> ExitCode {
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("ferrovol bench: cannot start the async runtime: {e}");
            return ExitCode::from(2);
        }
    };
    let output = args.output;
    let result = runtime.block_on(async move {
        let stop = Arc::new(AtomicBool::new(false));
        let on_signal = Arc::clone(&stop);
        tokio::spawn(async move {
            if tokio::signal::ctrl_c().await.is_ok() {
                eprintln!("\nferrovol bench: interrupted; finishing running calls and cleaning up");
                on_signal.store(true, Ordering::Relaxed);
            }
        });
        run(args, stop).await
    });
    match result {
        Ok(report) => {
            match output {
                Output::Table => print!("{}", report.table()),
                Output::Json => match serde_json::to_string_pretty(&report) {
                    Ok(json) => println!("{json}"),
                    Err(e) => {
                        eprintln!("ferrovol bench: cannot encode the report: {e}");
                        return ExitCode::from(2);
                    }
                },
            }
            if report.errors == 0 && report.leftovers.is_empty() && !report.interrupted {
                ExitCode::SUCCESS
            } else {
                ExitCode::FAILURE
            }
        }
        Err(e) => {
            eprintln!("ferrovol bench: {e}");
            ExitCode::from(2)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_parse_with_binary_suffixes() {
        assert_eq!(parse_size("4096"), Ok(4096));
        assert_eq!(parse_size("16M"), Ok(16 << 20));
        assert_eq!(parse_size("16MiB"), Ok(16 << 20));
        assert_eq!(parse_size("1G"), Ok(1 << 30));
        assert_eq!(parse_size("1gi"), Ok(1 << 30));
        assert_eq!(parse_size("2T"), Ok(2 << 40));
        for bad in ["", "G", "1X", "-1", "99999999999999T"] {
            assert!(parse_size(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn parameters_parse() {
        assert_eq!(
            parse_parameter("backend=loop"),
            Ok(("backend".into(), "loop".into()))
        );
        assert!(parse_parameter("novalue").is_err());
    }
}
