//! The `ferrovol` binary: parses flags, starts logging and runs the driver until SIGTERM
//! or SIGINT.

use std::io::IsTerminal;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Parser, Subcommand, ValueEnum};
use ferrovol::admin::{self, Output, Paths};
use ferrovol::backend::lvm::classes::{ClassKind, DeviceClass, LvmConfig};
use ferrovol::config::{BackendConfig, Config, Expansion, FileConfig, FsType, Mode};
use ferrovol::server::{self, Endpoint};
use tokio::signal::unix::{signal, SignalKind};
use tracing::{error, info};

/// `--backend`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum BackendKind {
    /// Sparse files attached as loop devices.
    Loop,
    /// Logical volumes of lvm2.
    Lvm,
}

/// How log lines are written.
#[derive(Debug, Clone, Copy, ValueEnum)]
enum LogFormat {
    /// Human-readable text.
    Text,
    /// One JSON object per line.
    Json,
}

/// ferrovol: a node-local CSI driver (loop-file or LVM volumes).
///
/// Without a subcommand it serves CSI; the subcommands are operator tools that read the
/// driver's records and the machine.
#[derive(Debug, Parser)]
#[command(version, about)]
struct Cli {
    /// An operator command instead of serving
    #[command(subcommand)]
    command: Option<Command>,
    /// Where to serve CSI: unix:///path/csi.sock or tcp://127.0.0.1:PORT
    /// [default: unix://<data dir>/csi.sock]
    #[arg(long, env = "CSI_ENDPOINT")]
    endpoint: Option<String>,
    /// This node's id, reported by NodeGetInfo and used in topology [default: hostname]
    #[arg(long, env = "NODE_ID")]
    node_id: Option<String>,
    /// The CSI driver name
    #[arg(long, default_value = "ferrovol.csi.dev")]
    driver_name: String,
    /// Directory of durable metadata records [default: <data dir>/state]
    #[arg(long, global = true)]
    state_dir: Option<PathBuf>,
    /// Directory of the loop backend's sparse backing files [default: <data dir>/pool]
    #[arg(long, global = true)]
    pool_dir: Option<PathBuf>,
    /// A YAML file with the backend and its pools (see README); flags win over it
    #[arg(long, env = "FERROVOL_CONFIG")]
    config: Option<PathBuf>,
    /// Where volumes live: `loop` (sparse files in --pool-dir) or `lvm` (logical volumes)
    /// [default: loop, or the configuration file's]
    #[arg(long, value_enum)]
    backend: Option<BackendKind>,
    /// lvm backend: the volume group of a single device class (instead of a file's
    /// classes); the class is named `thin` with --lvm-thin-pool, `linear` without
    #[arg(long)]
    lvm_volume_group: Option<String>,
    /// lvm backend: the thin pool LV of that class in the volume group
    #[arg(long, requires = "lvm_volume_group")]
    lvm_thin_pool: Option<String>,
    /// Volume limit reported by NodeGetInfo (0: no limit)
    #[arg(long, default_value_t = 0, value_parser = clap::value_parser!(i64).range(0..))]
    max_volumes_per_node: i64,
    /// Filesystem for mount volumes whose capability names none
    #[arg(long, value_enum, default_value = "ext4", global = true)]
    default_fs_type: FsType,
    /// Which services to serve
    #[arg(long, value_enum, default_value = "all")]
    mode: Mode,
    /// Who grows storage: `controller` (ControllerExpandVolume) or `node` (not advertised
    /// by the controller, so kubelet's NodeExpandVolume grows the storage on its node)
    #[arg(long, value_enum, default_value = "controller")]
    expansion: Expansion,
    /// Seconds an external tool (mkfs, blkid) may run
    #[arg(long, default_value_t = 120)]
    tool_timeout_secs: u64,
    /// A directory below which node RPCs may mount and look (repeat for more); staging and
    /// target paths anywhere else, or through a symbolic link, are refused
    #[arg(long = "path-root", default_value = "/var/lib/kubelet")]
    path_roots: Vec<PathBuf>,
    /// How many times the loop pool's free space sparse volumes may be promised in all
    /// (1: no overcommit; 2: twice the pool). Writes into an overcommitted pool can fail
    /// with ENOSPC inside the volumes
    #[arg(long, default_value_t = 1.0)]
    overprovision_ratio: f64,
    /// Where to serve /metrics and /healthz over HTTP (HOST:PORT), or `off`
    #[arg(long, default_value = "127.0.0.1:9810", value_parser = parse_metrics_address)]
    metrics_address: MetricsAddress,
    /// Log format
    #[arg(long, value_enum, default_value = "text")]
    log_format: LogFormat,
    /// The group (name or number) that owns the unix socket; its members may call the
    /// driver [default: the driver's own group]
    #[arg(long, value_parser = parse_group)]
    socket_group: Option<u32>,
}

/// Operator commands.
#[derive(Debug, Subcommand)]
enum Command {
    /// Volumes in the driver's records
    Volumes {
        #[command(subcommand)]
        action: VolumesCommand,
    },
    /// Snapshots in the driver's records
    Snapshots {
        #[command(subcommand)]
        action: SnapshotsCommand,
    },
    /// Check that this node can run the driver (exits non-zero on a problem)
    Doctor {
        /// table or json
        #[arg(long, value_enum, default_value = "table")]
        output: Output,
    },
    /// Find (and without --dry-run remove) mounts, loop devices and files no record owns
    Gc {
        /// Only report what would be removed
        #[arg(long)]
        dry_run: bool,
        /// Seconds to wait for running operations before giving up
        #[arg(long, default_value_t = 10)]
        wait_secs: u64,
        /// table or json
        #[arg(long, value_enum, default_value = "table")]
        output: Output,
    },
    /// Load a CSI endpoint (this driver or another) and print latency and throughput
    Bench(ferrovol::bench::BenchArgs),
}

/// `ferrovol volumes ...`
#[derive(Debug, Subcommand)]
enum VolumesCommand {
    /// Every volume: PVC, capacity, node, staged and published state
    List {
        /// table or json
        #[arg(long, value_enum, default_value = "table")]
        output: Output,
    },
    /// One volume in detail
    Show {
        /// The volume id (fv-...)
        volume_id: String,
        /// table or json
        #[arg(long, value_enum, default_value = "table")]
        output: Output,
    },
}

/// `ferrovol snapshots ...`
#[derive(Debug, Subcommand)]
enum SnapshotsCommand {
    /// Every snapshot: VolumeSnapshot, source volume, size
    List {
        /// table or json
        #[arg(long, value_enum, default_value = "table")]
        output: Output,
    },
}

/// Runs an operator command; prints its report and picks the exit status.
fn run_command(command: Command, paths: &Paths, default_fs: FsType) -> ExitCode {
    let report = match command {
        Command::Volumes {
            action: VolumesCommand::List { output },
        } => admin::inventory::list_volumes(paths, output),
        Command::Volumes {
            action: VolumesCommand::Show { volume_id, output },
        } => admin::inventory::show_volume(paths, &volume_id, output),
        Command::Snapshots {
            action: SnapshotsCommand::List { output },
        } => admin::inventory::list_snapshots(paths, output),
        Command::Doctor { output } => admin::doctor::doctor(paths, default_fs, output),
        Command::Gc {
            dry_run,
            wait_secs,
            output,
        } => admin::gc::gc(paths, dry_run, Duration::from_secs(wait_secs), output),
        Command::Bench(args) => return ferrovol::bench::main(args),
    };
    match report {
        Ok(report) => {
            print!("{}", report.text);
            if report.failed {
                ExitCode::FAILURE
            } else {
                ExitCode::SUCCESS
            }
        }
        Err(e) => {
            eprintln!("ferrovol: {e}");
            ExitCode::from(2)
        }
    }
}

/// The backend from the flags, else from the configuration file, else the loop backend.
fn backend_config(
    flag: Option<BackendKind>,
    volume_group: Option<String>,
    thin_pool: Option<String>,
    file: &FileConfig,
) -> Result<BackendConfig, String> {
    let kind = match (flag, file.backend.as_deref()) {
        (Some(kind), _) => kind,
        (None, None | Some("loop")) => BackendKind::Loop,
        (None, Some("lvm")) => BackendKind::Lvm,
        (None, Some(other)) => {
            return Err(format!(
                "backend {other:?} in the configuration file: use loop or lvm"
            ))
        }
    };
    if kind == BackendKind::Loop {
        if volume_group.is_some() {
            return Err("--lvm-volume-group needs --backend lvm".into());
        }
        return Ok(BackendConfig::Loop);
    }
    let classes = match volume_group {
        Some(volume_group) => LvmConfig {
            device_classes: vec![DeviceClass {
                name: if thin_pool.is_some() { "thin" } else { "linear" }.into(),
                volume_group,
                kind: if thin_pool.is_some() {
                    ClassKind::Thin
                } else {
                    ClassKind::Linear
                },
                thin_pool,
                overprovision_ratio: 1.0,
                default: true,
            }],
        },
        None => file.lvm.clone().ok_or(
            "the lvm backend needs device classes: --lvm-volume-group, or `lvm.deviceClasses` in --config",
        )?,
    };
    classes.check().map_err(|e| e.to_string())?;
    Ok(BackendConfig::Lvm(classes))
}

/// `--socket-group`: a group name from the group database, or a number.
fn parse_group(raw: &str) -> Result<u32, String> {
    if let Ok(gid) = raw.parse::<u32>() {
        return Ok(gid);
    }
    match nix::unistd::Group::from_name(raw) {
        Ok(Some(group)) => Ok(group.gid.as_raw()),
        Ok(None) => Err(format!("no group named {raw:?}")),
        Err(e) => Err(format!("cannot look up group {raw:?}: {e}")),
    }
}

/// `--metrics-address`: an address, or `off`.
#[derive(Debug, Clone, Copy)]
struct MetricsAddress(Option<SocketAddr>);

fn parse_metrics_address(raw: &str) -> Result<MetricsAddress, String> {
    if raw == "off" || raw.is_empty() {
        return Ok(MetricsAddress(None));
    }
    raw.parse()
        .map(|addr| MetricsAddress(Some(addr)))
        .map_err(|e| format!("{raw:?} is neither HOST:PORT nor `off`: {e}"))
}

/// The default data directory: `/var/lib/ferrovol` for root, else
/// `$XDG_DATA_HOME/ferrovol` or `~/.local/share/ferrovol`, so a first unprivileged run works.
fn default_data_dir() -> PathBuf {
    if nix::unistd::geteuid().is_root() {
        return PathBuf::from("/var/lib/ferrovol");
    }
    if let Some(xdg) = std::env::var_os("XDG_DATA_HOME").filter(|v| !v.is_empty()) {
        return PathBuf::from(xdg).join("ferrovol");
    }
    match std::env::var_os("HOME").filter(|v| !v.is_empty()) {
        Some(home) => PathBuf::from(home).join(".local/share/ferrovol"),
        None => PathBuf::from("ferrovol-data"),
    }
}

fn init_logging(format: LogFormat) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::stderr().is_terminal())
        .with_writer(std::io::stderr);
    match format {
        LogFormat::Text => builder.init(),
        LogFormat::Json => builder.json().init(),
    }
}

async fn shutdown_signal() {
    let (Ok(mut term), Ok(mut int)) = (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
    ) else {
        error!("cannot install signal handlers; stop with SIGKILL");
        return std::future::pending().await;
    };
    tokio::select! {
        _ = term.recv() => info!("SIGTERM: finishing in-flight requests, then stopping"),
        _ = int.recv() => info!("SIGINT: finishing in-flight requests, then stopping"),
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    init_logging(cli.log_format);
    let data_dir = default_data_dir();
    if let Some(command) = cli.command {
        let paths = Paths {
            state_dir: cli.state_dir.unwrap_or_else(|| data_dir.join("state")),
            pool_dir: cli.pool_dir.unwrap_or_else(|| data_dir.join("pool")),
        };
        return run_command(command, &paths, cli.default_fs_type);
    }
    let node_id = match cli.node_id {
        Some(id) if !id.is_empty() => id,
        _ => match nix::unistd::gethostname() {
            Ok(name) => name.to_string_lossy().into_owned(),
            Err(e) => {
                error!(cause = %e, "cannot read the hostname; pass --node-id");
                return ExitCode::FAILURE;
            }
        },
    };
    let endpoint_text = cli
        .endpoint
        .unwrap_or_else(|| format!("unix://{}", data_dir.join("csi.sock").display()));
    let endpoint = match Endpoint::parse(&endpoint_text) {
        Ok(e) => e,
        Err(e) => {
            error!(cause = %e, "bad --endpoint");
            return ExitCode::FAILURE;
        }
    };
    let file = match cli.config.as_deref().map(FileConfig::load).transpose() {
        Ok(file) => file.unwrap_or_default(),
        Err(e) => {
            error!(cause = %e, "bad --config");
            return ExitCode::FAILURE;
        }
    };
    let backend = match backend_config(cli.backend, cli.lvm_volume_group, cli.lvm_thin_pool, &file)
    {
        Ok(backend) => backend,
        Err(e) => {
            error!(cause = %e, "bad backend configuration");
            return ExitCode::FAILURE;
        }
    };
    let mut config = Config::with_dirs(
        &node_id,
        cli.state_dir.unwrap_or_else(|| data_dir.join("state")),
        cli.pool_dir
            .or(file.pool_dir)
            .unwrap_or_else(|| data_dir.join("pool")),
    );
    config.backend = backend;
    config.driver_name = cli.driver_name;
    config.max_volumes_per_node = cli.max_volumes_per_node;
    config.default_fs_type = cli.default_fs_type;
    config.mode = cli.mode;
    config.expansion = cli.expansion;
    config.metrics_address = cli.metrics_address.0;
    config.socket_group = cli.socket_group;
    if !ferrovol::backend::tally::valid_ratio(cli.overprovision_ratio) {
        error!(
            ratio = cli.overprovision_ratio,
            "--overprovision-ratio must be a number of at least 1"
        );
        return ExitCode::FAILURE;
    }
    config.overprovision_ratio = cli.overprovision_ratio;
    if let Some(bad) = cli
        .path_roots
        .iter()
        .find(|r| !r.is_absolute() || r.parent().is_none())
    {
        error!(root = %bad.display(), "--path-root must be an absolute directory other than /");
        return ExitCode::FAILURE;
    }
    config.path_roots = cli.path_roots;
    config.tool_timeout = Duration::from_secs(cli.tool_timeout_secs.max(1));

    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            error!(cause = %e, "cannot start the async runtime");
            return ExitCode::FAILURE;
        }
    };
    let result = runtime.block_on(async move {
        let driver = tokio::task::spawn_blocking(move || server::open_driver(config))
            .await
            .map_err(|e| ferrovol::Error::Internal(e.to_string()))??;
        ferrovol::crash::arm_from_env();
        server::run(driver, endpoint, shutdown_signal()).await
    });
    match result {
        Ok(()) => {
            info!("stopped");
            ExitCode::SUCCESS
        }
        Err(e) => {
            error!(cause = %e, "ferrovol failed");
            ExitCode::FAILURE
        }
    }
}
