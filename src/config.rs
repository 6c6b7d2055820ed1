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
            max_volumes_per_node: 0,
            default_fs_type: FsType::Ext4,
            mode: Mode::All,
            expansion: Expansion::Controller,
            tool_timeout: Duration::from_secs(120),
            max_blocking_jobs: 16,
            metrics_address: None,
            socket_group: None,
            path_roots: vec![PathBuf::from(Self::KUBELET_DIR)],
        }
    }
}
