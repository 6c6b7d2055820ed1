//! Builders for CSI requests and capabilities, and the assertions every test uses on results.
//!
//! The builders give the common case in one call (`mount_cap("ext4")`, `block_cap()`,
//! `create_request(name, bytes, caps)`); tests change single fields of the returned structs to
//! make the bad inputs. `ok` and `expect_code` turn a gRPC result into a test assertion that
//! names the call, the expected and the actual code and the status message.

use std::collections::HashMap;
use std::fmt::Debug;

use ferrovol::csi::v1::volume_capability::access_mode::Mode;
use ferrovol::csi::v1::volume_capability::{AccessMode, AccessType, BlockVolume, MountVolume};
use ferrovol::csi::v1::volume_content_source::{SnapshotSource, Type as SourceType, VolumeSource};
use ferrovol::csi::v1::{
    CapacityRange, CreateSnapshotRequest, CreateVolumeRequest, Topology, VolumeCapability,
    VolumeContentSource,
};
use tonic::{Code, Response, Status};

/// The driver's default name.
pub const DRIVER_NAME: &str = "ferrovol.csi.dev";
/// The topology key of a node-local volume.
pub const TOPOLOGY_KEY: &str = "topology.ferrovol.csi.dev/node";
/// One mebibyte.
pub const MIB: i64 = 1 << 20;
/// One gibibyte.
pub const GIB: i64 = 1 << 30;
/// Smallest ext4 / unspecified mount or block volume.
pub const MIN_EXT4: i64 = 16 * MIB;
/// Smallest xfs volume.
pub const MIN_XFS: i64 = 300 * MIB;
/// Smallest btrfs volume.
pub const MIN_BTRFS: i64 = 128 * MIB;

/// A mount capability with the given filesystem, SINGLE_NODE_WRITER.
pub fn mount_cap(fs_type: &str) -> VolumeCapability {
    mount_cap_full(fs_type, &[], Mode::SingleNodeWriter)
}

/// A mount capability with the given filesystem and access mode.
pub fn mount_cap_mode(fs_type: &str, mode: Mode) -> VolumeCapability {
    mount_cap_full(fs_type, &[], mode)
}

/// A mount capability with mount flags.
pub fn mount_cap_flags(fs_type: &str, flags: &[&str]) -> VolumeCapability {
    mount_cap_full(fs_type, flags, Mode::SingleNodeWriter)
}

/// A mount capability with every field chosen.
pub fn mount_cap_full(fs_type: &str, flags: &[&str], mode: Mode) -> VolumeCapability {
    VolumeCapability {
        access_type: Some(AccessType::Mount(MountVolume {
            fs_type: fs_type.to_owned(),
            mount_flags: flags.iter().map(|f| (*f).to_owned()).collect(),
            volume_mount_group: String::new(),
        })),
        access_mode: Some(AccessMode { mode: mode as i32 }),
    }
}

/// A block capability, SINGLE_NODE_WRITER.
pub fn block_cap() -> VolumeCapability {
    block_cap_mode(Mode::SingleNodeWriter)
}

/// A block capability with the given access mode.
pub fn block_cap_mode(mode: Mode) -> VolumeCapability {
    VolumeCapability {
        access_type: Some(AccessType::Block(BlockVolume {})),
        access_mode: Some(AccessMode { mode: mode as i32 }),
    }
}

/// A CapacityRange.
pub fn range(required_bytes: i64, limit_bytes: i64) -> Option<CapacityRange> {
    Some(CapacityRange {
        required_bytes,
        limit_bytes,
    })
}

/// A CreateVolume request asking for at least `required_bytes` (no limit).
pub fn create_request(
    name: &str,
    required_bytes: i64,
    caps: Vec<VolumeCapability>,
) -> CreateVolumeRequest {
    CreateVolumeRequest {
        name: name.to_owned(),
        capacity_range: range(required_bytes, 0),
        volume_capabilities: caps,
        ..Default::default()
    }
}

/// The topology of a node as this driver names it.
pub fn node_topology(node_id: &str) -> Topology {
    Topology {
        segments: HashMap::from([(TOPOLOGY_KEY.to_owned(), node_id.to_owned())]),
    }
}

/// True when `id` has the driver's volume id form: `fv-` and 32 lowercase hex digits.
pub fn is_volume_id(id: &str) -> bool {
    id.strip_prefix("fv-").is_some_and(|hex| {
        hex.len() == 32
            && hex
                .chars()
                .all(|c| c.is_ascii_digit() || ('a'..='f').contains(&c))
    })
}

/// A volume id that is not of the driver's form.
pub const MALFORMED_VOLUME_ID: &str = "not-a-ferrovol-volume";

/// A well-formed volume id that no test creates.
pub const UNKNOWN_VOLUME_ID: &str = "fv-0123456789abcdef0123456789abcdef";

/// True when `id` has the driver's snapshot id form: `fvs-` and 32 lowercase hex digits.
pub fn is_snapshot_id(id: &str) -> bool {
    id.strip_prefix("fvs-").is_some_and(|hex| {
        hex.len() == 32
            && hex
                .chars()
                .all(|c| c.is_ascii_digit() || ('a'..='f').contains(&c))
    })
}

/// A snapshot id that is not of the driver's form.
pub const MALFORMED_SNAPSHOT_ID: &str = "not-a-ferrovol-snapshot";

/// A well-formed snapshot id that no test creates.
pub const UNKNOWN_SNAPSHOT_ID: &str = "fvs-fedcba9876543210fedcba9876543210";

/// A CreateSnapshot request for snapshot `name` of `source_volume_id`.
pub fn snapshot_request(name: &str, source_volume_id: &str) -> CreateSnapshotRequest {
    CreateSnapshotRequest {
        name: name.to_owned(),
        source_volume_id: source_volume_id.to_owned(),
        ..Default::default()
    }
}

/// A volume content source naming a snapshot (CreateVolume restores it).
pub fn from_snapshot(snapshot_id: &str) -> Option<VolumeContentSource> {
    Some(VolumeContentSource {
        r#type: Some(SourceType::Snapshot(SnapshotSource {
            snapshot_id: snapshot_id.to_owned(),
        })),
    })
}

/// A volume content source naming a volume (CreateVolume clones it).
pub fn from_volume(volume_id: &str) -> Option<VolumeContentSource> {
    Some(VolumeContentSource {
        r#type: Some(SourceType::Volume(VolumeSource {
            volume_id: volume_id.to_owned(),
        })),
    })
}

/// A CreateVolume request for at least `required_bytes` with the given content source.
pub fn create_from(
    name: &str,
    required_bytes: i64,
    cap: VolumeCapability,
    source: Option<VolumeContentSource>,
) -> CreateVolumeRequest {
    CreateVolumeRequest {
        volume_content_source: source,
        ..create_request(name, required_bytes, vec![cap])
    }
}

/// Unwraps an OK response; on error panics naming the call, code and message.
#[track_caller]
pub fn ok<T>(result: Result<Response<T>, Status>, what: &str) -> T {
    match result {
        Ok(resp) => resp.into_inner(),
        Err(status) => panic!(
            "{what}: expected OK, got {:?}: {:?}",
            status.code(),
            status.message()
        ),
    }
}

/// Asserts the call failed with exactly `code` and a non-empty message; returns the status.
#[track_caller]
pub fn expect_code<T: Debug>(
    result: Result<Response<T>, Status>,
    code: Code,
    what: &str,
) -> Status {
    match result {
        Ok(resp) => panic!("{what}: expected {code:?}, got OK: {:?}", resp.into_inner()),
        Err(status) => {
            assert_eq!(
                status.code(),
                code,
                "{what}: expected {code:?}, got {:?}: {:?}",
                status.code(),
                status.message()
            );
            assert!(
                !status.message().trim().is_empty(),
                "{what}: {code:?} carries an empty message"
            );
            status
        }
    }
}

/// Collects code mismatches of a table of bad-input cases, so one run reports all of them;
/// `finish` fails the test if any case went wrong.
#[derive(Debug, Default)]
pub struct CodeChecks {
    /// One line per case that did not get its expected code.
    failures: Vec<String>,
}

impl CodeChecks {
    /// An empty collector.
    pub fn new() -> Self {
        Self::default()
    }

    /// Records a failure unless `result` is an error with exactly `code` and a message.
    pub fn code<T: Debug>(&mut self, result: Result<Response<T>, Status>, code: Code, what: &str) {
        match result {
            Ok(resp) => self.failures.push(format!(
                "{what}: expected {code:?}, got OK: {:?}",
                resp.into_inner()
            )),
            Err(status) if status.code() != code => self.failures.push(format!(
                "{what}: expected {code:?}, got {:?}: {:?}",
                status.code(),
                status.message()
            )),
            Err(status) if status.message().trim().is_empty() => self
                .failures
                .push(format!("{what}: {code:?} carries an empty message")),
            Err(_) => {}
        }
    }

    /// Records a failure unless `result` is OK.
    pub fn ok<T>(&mut self, result: Result<Response<T>, Status>, what: &str) {
        if let Err(status) = result {
            self.failures.push(format!(
                "{what}: expected OK, got {:?}: {:?}",
                status.code(),
                status.message()
            ));
        }
    }

    /// Fails the test listing every recorded failure.
    #[track_caller]
    pub fn finish(self) {
        assert!(
            self.failures.is_empty(),
            "{} case(s) failed:\n  {}",
            self.failures.len(),
            self.failures.join("\n  ")
        );
    }
}
