//! Runtime configuration shared by every service, built once in `main` and passed in.

use std::path::PathBuf;
use std::time::Duration;

/// Which of the CSI services this process serves.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Mode {
    /// Identity, Controller and Node on one socket (the default).
    All,
    /// Identity and Controller only.
    Controller,
    /// Identity and Node only.
    Node,
}

/// Who grows a volume's storage when Kubernetes asks for more.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Expansion {
    /// ControllerExpandVolume grows the storage, NodeExpandVolume the filesystem (the
    /// default; external-resizer calls the controller).
    Controller,
    /// The controller does not advertise expansion, so external-resizer only records the
    /// new size and kubelet's NodeExpandVolume grows the storage and the filesystem on the
    /// node that holds them. For deployments where no controller can reach node-local
    /// storage.
    Node,
}

/// Filesystems the node service can create and mount.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, serde::Serialize, serde::Deserialize,
)]
#[serde(rename_all = "lowercase")]
pub enum FsType {
    /// ext4, grown online with resize2fs.
    Ext4,
    /// XFS, grown online with xfs_growfs.
    Xfs,
    /// btrfs, grown online with `btrfs filesystem resize`.
    Btrfs,
}

impl FsType {
    /// Parses the `fs_type` of a mount capability; `None` for an unsupported name.
    pub fn parse(name: &str) -> Option<FsType> {
        match name {
            "ext4" => Some(FsType::Ext4),
            "xfs" => Some(FsType::Xfs),
            "btrfs" => Some(FsType::Btrfs),
            _ => None,
        }
    }

    /// The name the kernel and blkid use.
    pub fn as_str(self) -> &'static str {
        match self {
            FsType::Ext4 => "ext4",
            FsType::Xfs => "xfs",
            FsType::Btrfs => "btrfs",
        }
    }

    /// The smallest volume mkfs accepts for this filesystem, in bytes.
    pub fn min_bytes(self) -> u64 {
        match self {
            FsType::Ext4 => 16 << 20,
            FsType::Xfs => 300 << 20,
            FsType::Btrfs => 128 << 20,
        }
    }
}

/// Which backend holds the volumes, with its settings.
#[derive(Debug, Clone, PartialEq)]
pub enum BackendConfig {
    /// Sparse files in `Config::pool_dir`, attached as loop devices (the default).
    Loop,
    /// Logical volumes in the volume groups of these device classes.
    Lvm(crate::backend::lvm::classes::LvmConfig),
}

/// The YAML file given with `--config`: the backend and its pools. Flags given on the
/// command line win over it.
///
/// ```yaml
/// backend: lvm            # or loop
/// poolDir: /var/lib/ferrovol/pool   # loop only
/// lvm:
///   deviceClasses:
///     - name: thin
///       volumeGroup: vg0
///       type: thin        # or linear
///       thinPool: pool0
///       overprovisionRatio: 4
///       default: true
/// ```
#[derive(Debug, Clone, PartialEq, Default, serde::Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct FileConfig {
    /// `loop` or `lvm`.
    #[serde(default)]
    pub backend: Option<String>,
    /// The loop backend's pool directory.
    #[serde(default)]
    pub pool_dir: Option<PathBuf>,
    /// The lvm backend's device classes.
    #[serde(default)]
    pub lvm: Option<crate::backend::lvm::classes::LvmConfig>,
}

impl FileConfig {
    /// Reads and parses a configuration file.
    ///
    /// # Errors
    /// `Io` when it cannot be read; `InvalidArgument` saying where it does not parse.
    pub fn load(path: &std::path::Path) -> crate::error::Result<Self> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| crate::error::Error::io("read configuration", path, e))?;
        serde_norway::from_str(&text).map_err(|e| {
            crate::error::Error::InvalidArgument(format!("configuration {}: {e}", path.display()))
        })
    }
}

/// Everything a service needs to know about its surroundings.
#[derive(Debug, Clone)]
pub struct Config {
    /// The CSI driver name, reported by GetPluginInfo (`ferrovol.csi.dev`).
    pub driver_name: String,
    /// This node's id, reported by NodeGetInfo and used as the topology value.
    pub node_id: String,
    /// Where durable metadata records live.
    pub state_dir: PathBuf,
    /// Where the loop backend keeps its sparse backing files.
    pub pool_dir: PathBuf,
    /// The backend and its settings.
    pub backend: BackendConfig,
    /// The volume limit NodeGetInfo reports; 0 means no limit.
    pub max_volumes_per_node: i64,
    /// Filesystem for mount volumes whose capability names none.
    pub default_fs_type: FsType,
    /// Which services to serve.
    pub mode: Mode,
    /// Whether the controller or the node grows storage.
    pub expansion: Expansion,
    /// How long an external tool (mkfs, blkid) may run before it is killed.
    pub tool_timeout: Duration,
    /// How many blocking jobs (ioctls, mounts, file work) may run at once.
    pub max_blocking_jobs: usize,
    /// The only directories below which NodeStage/NodePublish mount (and the other node
    /// RPCs look): kubelet's directory by default.
    pub path_roots: Vec<PathBuf>,
    /// Where to serve `/metrics` and `/healthz`; `None` turns the HTTP port off.
    pub metrics_address: Option<std::net::SocketAddr>,
    /// The group that owns the unix socket (with mode 0660 its members may call the
    /// driver); `None` keeps the driver's own group.
    pub socket_group: Option<u32>,
    /// How many times the loop pool's space sparse volumes may be promised in all
    /// (1.0: never more than exists).
    pub overprovision_ratio: f64,
}

impl Config {
    /// kubelet's directory, the default (and usual only) path root.
    pub const KUBELET_DIR: &'static str = "/var/lib/kubelet";

    /// The topology key under which every volume and node reports its node.
    pub const TOPOLOGY_KEY: &'static str = "topology.ferrovol.csi.dev/node";

    /// A configuration with defaults, rooted in the given directories (used by tests).
    pub fn with_dirs(node_id: &str, state_dir: PathBuf, pool_dir: PathBuf) -> Self {
        Config {
            driver_name: "ferrovol.csi.dev".into(),
            node_id: node_id.into(),
            state_dir,
            pool_dir,
            backend: BackendConfig::Loop,
            max_volumes_per_node: 0,
            default_fs_type: FsType::Ext4,
            mode: Mode::All,
            expansion: Expansion::Controller,
            tool_timeout: Duration::from_secs(120),
            max_blocking_jobs: 16,
            metrics_address: None,
            socket_group: None,
            path_roots: vec![PathBuf::from(Self::KUBELET_DIR)],
            overprovision_ratio: 1.0,
        }
    }
}
