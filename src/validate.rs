//! Request validation shared by the Controller and Node services.
//!
//! Everything a request says is checked here before it reaches a backend or the OS: the
//! shape and support of volume capabilities, capacity ranges, parameters, paths and
//! topology. Errors name the field and say what was wrong.

use std::collections::HashMap;
use std::path::{Component, Path, PathBuf};

use crate::config::{Config, FsType};
use crate::csi::v1::volume_capability::access_mode::Mode;
use crate::csi::v1::volume_capability::AccessType;
use crate::csi::v1::{CapacityRange, Topology, TopologyRequirement, VolumeCapability};
use crate::error::{Error, Result};

/// Volume sizes are multiples of this (1 MiB).
pub const GRANULARITY: u64 = 1 << 20;
/// The size of a volume whose request gives no capacity (1 GiB).
pub const DEFAULT_SIZE: u64 = 1 << 30;
/// The smallest volume of any kind.
pub const MIN_SIZE: u64 = 16 << 20;
/// Prefix of the parameters that Kubernetes sidecars add on their own.
pub const K8S_PARAMETER_PREFIX: &str = "csi.storage.k8s.io/";
/// The StorageClass parameter naming the backend a volume must come from.
pub const BACKEND_PARAMETER: &str = "backend";
/// The longest CSI name accepted.
pub const MAX_NAME_LEN: usize = 256;
/// The longest path accepted.
pub const MAX_PATH_LEN: usize = 4096;
/// The longest component of a path accepted (the kernel's NAME_MAX).
pub const MAX_PATH_COMPONENT_LEN: usize = 255;
/// The most bytes (keys and values together) a parameter map may hold, the CSI spec's
/// size limit for `map<string, string>` fields.
pub const MAX_PARAMETER_BYTES: usize = 4096;

/// How a capability wants the volume presented.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Access {
    /// A raw block device.
    Block,
    /// A mounted filesystem.
    Mount {
        /// The filesystem; `None` means the driver's default.
        fs_type: Option<FsType>,
        /// Mount flags as given.
        mount_flags: Vec<String>,
    },
}

/// A capability that ferrovol can serve.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Capability {
    /// Block or mount.
    pub access: Access,
    /// The access mode (one of the single-node modes).
    pub mode: Mode,
}

impl Capability {
    /// Whether the mode allows no writer.
    pub fn read_only_mode(&self) -> bool {
        self.mode == Mode::SingleNodeReaderOnly
    }

    /// The smallest volume that can serve this capability.
    pub fn min_bytes(&self, default_fs: FsType) -> u64 {
        match &self.access {
            Access::Block => MIN_SIZE,
            Access::Mount { fs_type, .. } => {
                fs_type.unwrap_or(default_fs).min_bytes().max(MIN_SIZE)
            }
        }
    }
}

/// Checks that a capability is well-formed: an access type and an access mode are set.
///
/// # Errors
/// `InvalidArgument` when either is missing.
pub fn capability_shape(field: &str, cap: &VolumeCapability) -> Result<()> {
    if cap.access_type.is_none() {
        return Err(Error::InvalidArgument(format!(
            "{field}: access_type (mount or block) is required"
        )));
    }
    if cap.access_mode.is_none() {
        return Err(Error::InvalidArgument(format!(
            "{field}: access_mode is required"
        )));
    }
    Ok(())
}

/// Parses a capability and checks that ferrovol supports it.
///
/// # Errors
/// `InvalidArgument` for a malformed or unsupported capability, saying which part.
pub fn capability(field: &str, cap: Option<&VolumeCapability>) -> Result<Capability> {
    let cap = cap.ok_or_else(|| Error::InvalidArgument(format!("{field} is required")))?;
    capability_shape(field, cap)?;
    let raw_mode = cap.access_mode.as_ref().map_or(0, |m| m.mode);
    let mode = Mode::try_from(raw_mode).map_err(|_| {
        Error::InvalidArgument(format!(
            "{field}: access mode {raw_mode} is not a CSI access mode"
        ))
    })?;
    match mode {
        Mode::SingleNodeWriter
        | Mode::SingleNodeReaderOnly
        | Mode::SingleNodeSingleWriter
        | Mode::SingleNodeMultiWriter => {}
        Mode::Unknown => {
            return Err(Error::InvalidArgument(format!(
                "{field}: access mode is UNKNOWN"
            )));
        }
        Mode::MultiNodeReaderOnly | Mode::MultiNodeSingleWriter | Mode::MultiNodeMultiWriter => {
            return Err(Error::InvalidArgument(format!(
                "{field}: access mode {} is not supported: ferrovol volumes are node-local, only SINGLE_NODE_* modes work",
                mode.as_str_name()
            )));
        }
    }
    let access = match &cap.access_type {
        Some(AccessType::Block(_)) => Access::Block,
        Some(AccessType::Mount(mount)) => {
            let fs_type = if mount.fs_type.is_empty() {
                None
            } else {
                Some(FsType::parse(&mount.fs_type).ok_or_else(|| {
                    Error::InvalidArgument(format!(
                        "{field}: fs_type {:?} is not supported (use ext4, xfs or btrfs)",
                        clip(&mount.fs_type)
                    ))
                })?)
            };
            if !mount.volume_mount_group.is_empty() {
                return Err(Error::InvalidArgument(format!(
                    "{field}: volume_mount_group is not supported by ferrovol"
                )));
            }
            crate::os::mount::parse_mount_flags(&mount.mount_flags)
                .map_err(|e| Error::InvalidArgument(format!("{field}: {e}")))?;
            Access::Mount {
                fs_type,
                mount_flags: mount.mount_flags.clone(),
            }
        }
        None => {
            return Err(Error::InvalidArgument(format!(
                "{field}: access_type (mount or block) is required"
            )))
        }
    };
    Ok(Capability { access, mode })
}

/// Parses a non-empty list of capabilities.
///
/// # Errors
/// `InvalidArgument` for an empty list or any unsupported entry.
pub fn capabilities(field: &str, caps: &[VolumeCapability]) -> Result<Vec<Capability>> {
    if caps.is_empty() {
        return Err(Error::InvalidArgument(format!(
            "{field} must name at least one capability"
        )));
    }
    caps.iter()
        .enumerate()
        .map(|(i, c)| capability(&format!("{field}[{i}]"), Some(c)))
        .collect()
}

/// Checks a node id from a request: present and at most [`MAX_NAME_LEN`] bytes.
///
/// # Errors
/// `InvalidArgument` when it is empty or too long.
pub fn node_id(field: &str, node_id: &str) -> Result<()> {
    if node_id.is_empty() {
        return Err(Error::InvalidArgument(format!("{field} is required")));
    }
    if node_id.len() > MAX_NAME_LEN {
        return Err(Error::InvalidArgument(format!(
            "{field} is {} bytes long; at most {MAX_NAME_LEN} are allowed",
            node_id.len()
        )));
    }
    Ok(())
}

/// Checks that a CSI name is present and sane.
///
/// # Errors
/// `InvalidArgument` when it is empty, too long or holds control characters.
pub fn name(field: &str, name: &str) -> Result<()> {
    if name.is_empty() {
        return Err(Error::InvalidArgument(format!("{field} is required")));
    }
    if name.len() > MAX_NAME_LEN {
        return Err(Error::InvalidArgument(format!(
            "{field} is {} bytes long; at most {MAX_NAME_LEN} are allowed",
            name.len()
        )));
    }
    if name.chars().any(char::is_control) {
        return Err(Error::InvalidArgument(format!(
            "{field} contains control characters"
        )));
    }
    Ok(())
}

/// Checks creation parameters. Known are the `csi.storage.k8s.io/` ones that Kubernetes
/// sidecars add, and [`BACKEND_PARAMETER`], which must name the backend this driver runs
/// (`backend_kind`), so that a StorageClass meant for another backend fails loudly. Any
/// other key goes to `backend_check`, the backend's own parameters (`deviceClass` of the
/// lvm backend).
///
/// # Errors
/// `InvalidArgument` naming the first unknown key, or a backend this driver does not run.
pub fn parameters(
    params: &HashMap<String, String>,
    backend_kind: &str,
    backend_check: impl Fn(&str, &str) -> Result<()>,
) -> Result<()> {
    let bytes: usize = params.iter().map(|(k, v)| k.len() + v.len()).sum();
    if bytes > MAX_PARAMETER_BYTES {
        return Err(Error::InvalidArgument(format!(
            "parameters hold {bytes} bytes; at most {MAX_PARAMETER_BYTES} are allowed"
        )));
    }
    let mut keys: Vec<&String> = params.keys().collect();
    keys.sort();
    for key in keys {
        if key == BACKEND_PARAMETER {
            let wanted = &params[key];
            if wanted != backend_kind {
                return Err(Error::InvalidArgument(format!(
                    "parameter {BACKEND_PARAMETER}={:?}: this driver runs the {backend_kind:?} backend",
                    clip(wanted)
                )));
            }
        } else if !key.starts_with(K8S_PARAMETER_PREFIX) {
            backend_check(key, &params[key]).map_err(|e| match e {
                Error::InvalidArgument(why) => Error::InvalidArgument(format!(
                    "{why} (ferrovol accepts {BACKEND_PARAMETER}, {K8S_PARAMETER_PREFIX}* and the backend's own)"
                )),
                other => other,
            })?;
        }
    }
    Ok(())
}

/// At most 64 characters of a request value, for an error message: a status message
/// travels in a gRPC trailer, which clients cap in size.
pub fn clip(value: &str) -> &str {
    match value.char_indices().nth(64) {
        Some((cut, _)) => &value[..cut],
        None => value,
    }
}

/// Picks a volume size from a capacity range: the smallest multiple of [`GRANULARITY`] that
/// is at least `required_bytes` (and at least `min_bytes`) and at most `limit_bytes`.
///
/// # Errors
/// `InvalidArgument` for negative numbers; `OutOfRange` when no size fits.
pub fn volume_size(range: Option<&CapacityRange>, min_bytes: u64) -> Result<u64> {
    let (required, limit) = range.map_or((0, 0), |r| (r.required_bytes, r.limit_bytes));
    let required = u64::try_from(required).map_err(|_| {
        Error::InvalidArgument(format!(
            "capacity_range.required_bytes {required} is negative"
        ))
    })?;
    let limit = u64::try_from(limit).map_err(|_| {
        Error::InvalidArgument(format!("capacity_range.limit_bytes {limit} is negative"))
    })?;
    if limit > 0 && required > limit {
        return Err(Error::OutOfRange(format!(
            "capacity_range.required_bytes {required} exceeds limit_bytes {limit}"
        )));
    }
    let wanted = if required > 0 {
        required
    } else if limit > 0 && limit < DEFAULT_SIZE {
        // No minimum given and a limit below the default: the largest size under it.
        (limit / GRANULARITY) * GRANULARITY
    } else {
        DEFAULT_SIZE
    };
    let wanted = wanted.max(min_bytes);
    let size = wanted
        .checked_next_multiple_of(GRANULARITY)
        .filter(|s| i64::try_from(*s).is_ok())
        .ok_or_else(|| {
            Error::OutOfRange(format!(
                "a volume of {wanted} bytes is larger than any ferrovol can make"
            ))
        })?;
    if limit > 0 && size > limit {
        return Err(Error::OutOfRange(format!(
            "the smallest volume that fits is {size} bytes (minimum {min_bytes}, granularity {GRANULARITY}), above limit_bytes {limit}"
        )));
    }
    Ok(size)
}

/// The page size of a List call: `max_entries` 0 means "all".
///
/// # Errors
/// `InvalidArgument` for a negative value.
pub fn max_entries(max_entries: i32) -> Result<usize> {
    match usize::try_from(max_entries) {
        Ok(0) => Ok(usize::MAX),
        Ok(n) => Ok(n),
        Err(_) => Err(Error::InvalidArgument(format!(
            "max_entries {max_entries} is negative"
        ))),
    }
}

/// Checks an absolute path from a request and returns it; `..` is refused.
///
/// # Errors
/// `InvalidArgument` when the path is empty, relative, too long or climbs with `..`.
pub fn abs_path(field: &str, raw: &str) -> Result<PathBuf> {
    if raw.is_empty() {
        return Err(Error::InvalidArgument(format!("{field} is required")));
    }
    if raw.len() > MAX_PATH_LEN || raw.contains('\0') {
        return Err(Error::InvalidArgument(format!(
            "{field} is too long or contains NUL"
        )));
    }
    let path = Path::new(raw);
    if !path.is_absolute() {
        return Err(Error::InvalidArgument(format!(
            "{field} {raw:?} is not an absolute path"
        )));
    }
    if path.components().any(|c| c == Component::ParentDir) {
        return Err(Error::InvalidArgument(format!(
            "{field} {raw:?} must not contain '..'"
        )));
    }
    if let Some(long) = path
        .components()
        .find(|c| c.as_os_str().len() > MAX_PATH_COMPONENT_LEN)
    {
        return Err(Error::InvalidArgument(format!(
            "{field} has a component of {} bytes; at most {MAX_PATH_COMPONENT_LEN} are allowed",
            long.as_os_str().len()
        )));
    }
    if path.parent().is_none() {
        return Err(Error::InvalidArgument(format!(
            "{field} must not be the root directory"
        )));
    }
    Ok(path.components().collect())
}

/// Checks a node RPC's path like [`abs_path`], and that it lies strictly below one of the
/// configured path roots (`--path-root`, kubelet's directory by default), so that no
/// request can mount onto, or remove, anything elsewhere. Symbolic links below the root
/// are refused later, where the filesystem is looked at.
///
/// # Errors
/// `InvalidArgument` naming the field, the path and the roots.
pub fn node_path(config: &Config, field: &str, raw: &str) -> Result<PathBuf> {
    let path = abs_path(field, raw)?;
    if root_of(config, &path).is_some() {
        return Ok(path);
    }
    let roots: Vec<String> = config
        .path_roots
        .iter()
        .map(|r| r.display().to_string())
        .collect();
    Err(Error::InvalidArgument(format!(
        "{field} {raw:?} is outside the directories this driver works in ({}; see --path-root)",
        roots.join(", ")
    )))
}

/// The configured root that `path` lies strictly below.
pub fn root_of<'a>(config: &'a Config, path: &Path) -> Option<&'a Path> {
    config
        .path_roots
        .iter()
        .map(PathBuf::as_path)
        .find(|root| path != *root && path.starts_with(root))
}

/// The topology segment of this node.
pub fn node_topology(config: &Config) -> Topology {
    Topology {
        segments: HashMap::from([(Config::TOPOLOGY_KEY.to_owned(), config.node_id.clone())]),
    }
}

/// Whether a segment names this node.
pub fn is_this_node(config: &Config, topology: &Topology) -> bool {
    topology.segments.get(Config::TOPOLOGY_KEY) == Some(&config.node_id)
}

/// Whether a volume may be created on this node under the given requirement.
pub fn topology_allows(config: &Config, req: Option<&TopologyRequirement>) -> bool {
    match req {
        None => true,
        Some(r) if r.requisite.is_empty() => true,
        Some(r) => r.requisite.iter().any(|t| is_this_node(config, t)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn range(required: i64, limit: i64) -> CapacityRange {
        CapacityRange {
            required_bytes: required,
            limit_bytes: limit,
        }
    }

    #[test]
    fn sizes_round_up_to_the_granularity() {
        assert_eq!(volume_size(None, MIN_SIZE).ok(), Some(DEFAULT_SIZE));
        assert_eq!(
            volume_size(Some(&range(1, 0)), MIN_SIZE).ok(),
            Some(MIN_SIZE)
        );
        assert_eq!(
            volume_size(Some(&range((20 << 20) + 1, 0)), MIN_SIZE).ok(),
            Some(21 << 20)
        );
        assert_eq!(
            volume_size(Some(&range(0, 100 << 20)), MIN_SIZE).ok(),
            Some(100 << 20)
        );
        assert_eq!(
            volume_size(Some(&range(0, (100 << 20) + 5)), MIN_SIZE).ok(),
            Some(100 << 20)
        );
    }

    #[test]
    fn impossible_sizes_are_refused() {
        assert!(matches!(
            volume_size(Some(&range(-1, 0)), MIN_SIZE),
            Err(Error::InvalidArgument(_))
        ));
        assert!(matches!(
            volume_size(Some(&range(0, -1)), MIN_SIZE),
            Err(Error::InvalidArgument(_))
        ));
        assert!(matches!(
            volume_size(Some(&range(10, 5)), MIN_SIZE),
            Err(Error::OutOfRange(_))
        ));
        assert!(matches!(
            volume_size(Some(&range(0, 1 << 20)), MIN_SIZE),
            Err(Error::OutOfRange(_))
        ));
        assert!(matches!(
            volume_size(Some(&range(i64::MAX, 0)), MIN_SIZE),
            Err(Error::OutOfRange(_))
        ));
        let limit = (20 << 20) + 1;
        assert!(matches!(
            volume_size(Some(&range(limit, limit)), MIN_SIZE),
            Err(Error::OutOfRange(_))
        ));
    }

    #[test]
    fn paths_must_be_absolute_without_parent_components() {
        assert!(abs_path("p", "/a/b").is_ok());
        assert_eq!(
            abs_path("p", "/a//b/./c/").ok(),
            Some(PathBuf::from("/a/b/c"))
        );
        let long = format!("/a/{}/b", "x".repeat(256));
        for bad in ["", "a/b", "/a/../b", "/", &long] {
            assert!(abs_path("p", bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn node_paths_stay_below_the_roots() {
        let config = Config::with_dirs("n", "/s".into(), "/p".into());
        assert!(node_path(&config, "p", "/var/lib/kubelet/pods/x/mount").is_ok());
        for bad in [
            "/var/lib/kubelet",
            "/var/lib/kubeletx/y",
            "/etc/passwd",
            "/var/lib/kubelet/../../etc",
            "relative",
        ] {
            assert!(node_path(&config, "p", bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn only_kubernetes_parameters_are_accepted() {
        let ok = HashMap::from([
            ("csi.storage.k8s.io/pvc/name".to_owned(), "x".to_owned()),
            ("backend".to_owned(), "loop".to_owned()),
        ]);
        let none = |key: &str, _: &str| Err(Error::InvalidArgument(format!("{key} unknown")));
        assert!(parameters(&ok, "loop", none).is_ok());
        assert!(parameters(&ok, "lvm", none).is_err());
        let bad = HashMap::from([("color".to_owned(), "blue".to_owned())]);
        assert!(parameters(&bad, "loop", none).is_err());
        let class = |key: &str, _: &str| {
            if key == "deviceClass" {
                Ok(())
            } else {
                Err(Error::InvalidArgument(format!("{key} unknown")))
            }
        };
        let lvm: HashMap<String, String> = [("deviceClass".to_owned(), "thin".to_owned())].into();
        assert!(parameters(&lvm, "lvm", class).is_ok());
        assert!(parameters(&lvm, "loop", none).is_err());
    }
}
