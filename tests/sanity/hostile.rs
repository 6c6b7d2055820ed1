//! Hostile and malformed input, table by table for every RPC: empty, oversized (1 MiB),
//! control-character and invalid UTF-8 values, relative and `..` paths, paths outside
//! the path root or through a planted symbolic link, ids of other drivers and ids with
//! path separators, negative and overflowing capacities, unknown, oversized and
//! conflicting parameters, access modes the loop backend cannot serve, and mount flags
//! that would weaken isolation or pull a host device into a mount.
//!
//! Each case must get exactly its gRPC code with a short, non-empty message (a status
//! message travels in an HTTP/2 trailer; one that echoed a 1 MiB request value would
//! break the connection instead of answering). Afterwards the files below a canary
//! directory outside the path root and below the driver's own scratch directories must
//! be exactly as before (type, mode, size, mtime, link target), no mount or loop device
//! may have appeared, and the driver must still serve.
//!
//! Bytes that are no valid request at all are `malformed.rs`'s.
//!
//! RPCs: all of Identity, Controller and Node.

use std::collections::{BTreeMap, HashMap};
use std::fmt::Debug;
use std::fs;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

use ferrovol::csi::v1::volume_capability::access_mode::Mode;
use ferrovol::csi::v1::volume_capability::{AccessMode, AccessType, MountVolume};
use ferrovol::csi::v1::*;
use tonic::{Code, Response, Status};

use crate::harness::Driver;
use crate::host::{loops_backed_under, mounts_under};
use crate::requests::{
    block_cap, block_cap_mode, create_from, create_request, from_snapshot, from_volume, mount_cap,
    mount_cap_flags, mount_cap_mode, range, snapshot_request, MIB,
};

/// The longest status message a case may carry.
const MAX_MESSAGE: usize = 4096;

/// Collects every case that did not get its code, so one run lists them all.
#[derive(Debug, Default)]
pub struct Table {
    /// One line per case that went wrong.
    pub failures: Vec<String>,
    /// How many cases ran.
    pub cases: usize,
}

impl Table {
    /// Records a failure unless `result` has `code` (`Code::Ok`: succeeded) and, for an
    /// error, a non-empty message of at most `MAX_MESSAGE` bytes.
    pub fn expect<T: Debug>(
        &mut self,
        what: &str,
        result: Result<Response<T>, Status>,
        code: Code,
    ) {
        self.cases += 1;
        match result {
            Ok(_) if code == Code::Ok => {}
            Ok(resp) => {
                let text = format!("{:?}", resp.into_inner());
                self.failures.push(format!(
                    "{what}: expected {code:?}, got OK: {}",
                    clip(&text)
                ));
            }
            Err(status) if status.code() != code => self.failures.push(format!(
                "{what}: expected {code:?}, got {:?}: {}",
                status.code(),
                clip(status.message())
            )),
            Err(status) if status.message().trim().is_empty() => self
                .failures
                .push(format!("{what}: {code:?} with an empty message")),
            Err(status) if status.message().len() > MAX_MESSAGE => self.failures.push(format!(
                "{what}: {code:?} with a {} byte message: {}",
                status.message().len(),
                clip(status.message())
            )),
            Err(_) => {}
        }
    }

    #[track_caller]
    pub fn finish(self) {
        eprintln!("{} cases checked", self.cases);
        assert!(
            self.failures.is_empty(),
            "{} of {} hostile cases went wrong:\n  {}",
            self.failures.len(),
            self.cases,
            self.failures.join("\n  ")
        );
    }
}

pub fn clip(text: &str) -> String {
    match text.char_indices().nth(300) {
        Some((cut, _)) => format!("{}... ({} bytes)", &text[..cut], text.len()),
        None => text.to_owned(),
    }
}

/// 1 MiB of `x`: far beyond every size limit, well below tonic's 4 MiB message limit.
fn huge() -> String {
    "x".repeat(1 << 20)
}

/// Ids no ferrovol driver makes, some shaped to climb out of the pool if used as a path.
fn foreign_ids() -> Vec<(&'static str, String)> {
    vec![
        (
            "another driver's id",
            "pvc-0b1c2d3e-4f50-6172-8394-a5b6c7d8e9f0".into(),
        ),
        ("an id with separators", "fv-../../../../etc/passwd".into()),
        ("a relative path", "../../state/volumes/x".into()),
        ("an absolute path", "/etc/shadow".into()),
        ("an id with NUL", format!("fv-{}\0", "0".repeat(31))),
        ("an upper-case lookalike", format!("fv-{}", "A".repeat(32))),
        (
            "a snapshot id as a volume id",
            format!("fvs-{}", "0".repeat(32)),
        ),
    ]
}

/// Ids refused before anything is looked up.
fn invalid_ids() -> Vec<(&'static str, String)> {
    vec![("an empty id", String::new()), ("a 1 MiB id", huge())]
}

/// A mount capability with one raw flag.
fn flag_cap(flag: &str) -> VolumeCapability {
    mount_cap_flags("ext4", &[flag])
}

/// Mount flags that would weaken isolation, turn the mount into another kind, or pull a
/// host device or label into it.
fn hostile_flags() -> Vec<String> {
    let mut flags: Vec<String> = [
        "suid",
        "dev",
        "bind",
        "rbind",
        "remount",
        "move",
        "shared",
        "rshared",
        "nosuid,suid",
        "noexec suid",
        "journal_path=/dev/vda",
        "journal_dev=64768",
        "logdev=/dev/vda",
        "rtdev=/dev/vda",
        "device=/dev/vda",
        "context=system_u:object_r:container_file_t:s0",
        "rootcontext=system_u:object_r:etc_t:s0",
        "usrjquota=/etc/passwd",
        "",
    ]
    .iter()
    .map(|s| (*s).to_owned())
    .collect();
    flags.push(huge());
    flags
}

/// Paths that must be refused wherever a node RPC takes one: `canary` lies outside the
/// path root, `link` is a symbolic link below the root that points at the canary.
fn hostile_paths(root: &Path, canary: &Path, link: &Path) -> Vec<(&'static str, String)> {
    vec![
        ("an empty path", String::new()),
        ("a relative path", "targets/x".into()),
        (
            "a path climbing out with ..",
            format!("{}/targets/../../../{}", root.display(), canary.display()),
        ),
        (
            "a path outside the root",
            canary.join("x").display().to_string(),
        ),
        ("the canary itself", canary.display().to_string()),
        ("/", "/".into()),
        ("/etc", "/etc".into()),
        ("the path root itself", root.display().to_string()),
        (
            "a path with NUL",
            format!("{}/targets/a\0b", root.display()),
        ),
        ("a 1 MiB path", format!("{}/{}", root.display(), huge())),
        (
            "a path through a planted symlink",
            link.join("x").display().to_string(),
        ),
    ]
}

/// What a file looked like, for the before/after comparison.
#[derive(Debug, PartialEq, Eq)]
struct Seen {
    kind: &'static str,
    mode: u32,
    size: u64,
    mtime_ns: i128,
    link: Option<PathBuf>,
}

/// Every file, directory and link below `dir` (links not followed), minus `skip`.
fn tree(dir: &Path, skip: &[&Path]) -> BTreeMap<PathBuf, Seen> {
    let mut seen = BTreeMap::new();
    let mut todo = vec![dir.to_owned()];
    while let Some(path) = todo.pop() {
        if skip.iter().any(|s| path.starts_with(s)) {
            continue;
        }
        let Ok(meta) = fs::symlink_metadata(&path) else {
            continue;
        };
        let kind = if meta.is_symlink() {
            "link"
        } else if meta.is_dir() {
            "dir"
        } else {
            "file"
        };
        if meta.is_dir() {
            if let Ok(entries) = fs::read_dir(&path) {
                todo.extend(entries.filter_map(Result::ok).map(|e| e.path()));
            }
        }
        seen.insert(
            path.clone(),
            Seen {
                kind,
                mode: meta.permissions().mode(),
                size: if meta.is_dir() { 0 } else { meta.len() },
                mtime_ns: i128::from(meta.mtime()) * 1_000_000_000 + i128::from(meta.mtime_nsec()),
                link: fs::read_link(&path).ok(),
            },
        );
    }
    seen
}

/// What differs between two trees, one line per path.
fn tree_changes(
    what: &str,
    before: &BTreeMap<PathBuf, Seen>,
    after: &BTreeMap<PathBuf, Seen>,
) -> Vec<String> {
    let mut changes = Vec::new();
    for (path, was) in before {
        match after.get(path) {
            None => changes.push(format!("{what}: {} was removed", path.display())),
            Some(now) if now != was => changes.push(format!(
                "{what}: {} changed from {was:?} to {now:?}",
                path.display()
            )),
            Some(_) => {}
        }
    }
    for path in after.keys().filter(|p| !before.contains_key(*p)) {
        changes.push(format!("{what}: {} appeared", path.display()));
    }
    changes
}

fn cap_with_mode(raw_mode: i32) -> VolumeCapability {
    VolumeCapability {
        access_type: Some(AccessType::Mount(MountVolume::default())),
        access_mode: Some(AccessMode { mode: raw_mode }),
    }
}

fn cap_without_access_type() -> VolumeCapability {
    VolumeCapability {
        access_type: None,
        access_mode: Some(AccessMode {
            mode: Mode::SingleNodeWriter as i32,
        }),
    }
}

/// Capabilities the loop backend cannot serve, or that are malformed.
fn unservable_caps() -> Vec<(String, VolumeCapability)> {
    let mut caps = vec![
        ("access mode 99".to_owned(), cap_with_mode(99)),
        ("access mode UNKNOWN".to_owned(), cap_with_mode(0)),
        ("no access type".to_owned(), cap_without_access_type()),
        ("fs_type ../../bin/sh".to_owned(), mount_cap("../../bin/sh")),
        ("a 1 MiB fs_type".to_owned(), mount_cap(&huge())),
        (
            "a volume_mount_group".to_owned(),
            VolumeCapability {
                access_type: Some(AccessType::Mount(MountVolume {
                    fs_type: "ext4".into(),
                    mount_flags: Vec::new(),
                    volume_mount_group: "0".into(),
                })),
                access_mode: Some(AccessMode {
                    mode: Mode::SingleNodeWriter as i32,
                }),
            },
        ),
    ];
    for mode in [
        Mode::MultiNodeReaderOnly,
        Mode::MultiNodeSingleWriter,
        Mode::MultiNodeMultiWriter,
    ] {
        caps.push((format!("mount {mode:?}"), mount_cap_mode("ext4", mode)));
        caps.push((format!("block {mode:?}"), block_cap_mode(mode)));
    }
    for flag in hostile_flags() {
        caps.push((format!("mount flag {:?}", clip(&flag)), flag_cap(&flag)));
    }
    caps
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_requests_get_their_codes_and_touch_nothing() {
    let d = Driver::start().await;
    let cap = mount_cap("ext4");
    let vol = d
        .create("hostile-vol", 16 * MIB, cap.clone())
        .await
        .volume_id;
    let staging = d.stage(&vol, &cap).await;
    let snap = d.snapshot("hostile-snap", &vol).await.snapshot_id;
    let root = d.root.clone();

    // The canary: files outside the path root that hostile paths point at, and a link
    // below the root that points at it.
    let canary_dir = tempfile::Builder::new()
        .prefix("ferrovol-canary-")
        .tempdir_in("/tmp")
        .expect("canary dir");
    let canary = fs::canonicalize(canary_dir.path()).expect("canonical canary");
    fs::create_dir_all(canary.join("x")).expect("canary subdir");
    fs::write(canary.join("secret.txt"), b"must stay as it is").expect("canary file");
    let link = root.join("targets").join("planted");
    std::os::unix::fs::symlink(&canary, &link).expect("plant a link");
    let skip = [
        d.pool.as_path(),
        d.state.as_path(),
        d.log.as_path(),
        d.socket.as_path(),
    ];
    let before = (tree(&canary, &[]), tree(&root, &skip));
    let mounts_before: Vec<PathBuf> = mounts_under(&root)
        .into_iter()
        .map(|m| m.mount_point)
        .collect();
    let images_before = d.pool_images();

    let mut t = Table::default();
    let paths = hostile_paths(&root, &canary, &link);
    let other = "other-node".to_owned();
    let own_target = d.target_path("hostile-target");

    // ---- CreateVolume
    let mut c = d.controller();
    let good = || create_request("hostile-new", 16 * MIB, vec![mount_cap("ext4")]);
    for (what, name) in [
        ("an empty name", String::new()),
        ("a 1 MiB name", huge()),
        ("a name with NUL", "pvc\0x".to_owned()),
        ("a name with an escape sequence", "pvc-\u{1b}[2J".to_owned()),
        ("a name with DEL", "pvc-\u{7f}".to_owned()),
    ] {
        let req = CreateVolumeRequest { name, ..good() };
        t.expect(
            &format!("CreateVolume with {what}"),
            c.create_volume(req).await,
            Code::InvalidArgument,
        );
    }
    for (what, required, limit, code) in [
        ("required -1", -1, 0, Code::InvalidArgument),
        ("limit -1", 0, -1, Code::InvalidArgument),
        ("required i64::MIN", i64::MIN, 0, Code::InvalidArgument),
        ("required i64::MAX", i64::MAX, 0, Code::OutOfRange),
        ("required i64::MAX - 1", i64::MAX - 1, 0, Code::OutOfRange),
        ("required above limit", 64 * MIB, 32 * MIB, Code::OutOfRange),
        ("a 1 byte limit", 0, 1, Code::OutOfRange),
    ] {
        let req = CreateVolumeRequest {
            capacity_range: range(required, limit),
            ..good()
        };
        t.expect(
            &format!("CreateVolume with {what}"),
            c.create_volume(req).await,
            code,
        );
    }
    for (what, params) in [
        ("an unknown parameter", vec![("fsType", "ext4".to_owned())]),
        ("another backend", vec![("backend", "lvm".to_owned())]),
        (
            "a backend with a path",
            vec![("backend", "../loop".to_owned())],
        ),
        ("a 1 MiB parameter key", vec![("", huge())]),
        (
            "a 1 MiB value of a known parameter",
            vec![("csi.storage.k8s.io/pvc/name", huge())],
        ),
    ] {
        let parameters: HashMap<String, String> = params
            .into_iter()
            .map(|(k, v)| {
                if k.is_empty() {
                    (v, "x".to_owned())
                } else {
                    (k.to_owned(), v)
                }
            })
            .collect();
        let req = CreateVolumeRequest {
            parameters,
            ..good()
        };
        t.expect(
            &format!("CreateVolume with {what}"),
            c.create_volume(req).await,
            Code::InvalidArgument,
        );
    }
    t.expect(
        "CreateVolume with no capability",
        c.create_volume(create_request("hostile-new", 16 * MIB, vec![]))
            .await,
        Code::InvalidArgument,
    );
    for (what, bad) in unservable_caps() {
        let req = create_request("hostile-new", 16 * MIB, vec![block_cap(), bad]);
        t.expect(
            &format!("CreateVolume with {what}"),
            c.create_volume(req).await,
            Code::InvalidArgument,
        );
    }
    for (what, id) in foreign_ids() {
        let from_snap = create_from(
            "hostile-new",
            16 * MIB,
            mount_cap("ext4"),
            from_snapshot(&id),
        );
        t.expect(
            &format!("CreateVolume from a snapshot with {what}"),
            c.create_volume(from_snap).await,
            Code::NotFound,
        );
        let from_vol = create_from("hostile-new", 16 * MIB, mount_cap("ext4"), from_volume(&id));
        t.expect(
            &format!("CreateVolume from a volume with {what}"),
            c.create_volume(from_vol).await,
            Code::NotFound,
        );
    }
    for (what, id) in invalid_ids() {
        let from_snap = create_from(
            "hostile-new",
            16 * MIB,
            mount_cap("ext4"),
            from_snapshot(&id),
        );
        t.expect(
            &format!("CreateVolume from a snapshot with {what}"),
            c.create_volume(from_snap).await,
            Code::InvalidArgument,
        );
    }
    t.expect(
        "CreateVolume with an empty content source",
        c.create_volume(CreateVolumeRequest {
            volume_content_source: Some(VolumeContentSource { r#type: None }),
            ..good()
        })
        .await,
        Code::InvalidArgument,
    );
    t.expect(
        "CreateVolume requiring another node",
        c.create_volume(CreateVolumeRequest {
            accessibility_requirements: Some(TopologyRequirement {
                requisite: vec![crate::requests::node_topology(&other)],
                preferred: Vec::new(),
            }),
            ..good()
        })
        .await,
        Code::ResourceExhausted,
    );
    // Conflicts with the existing volume of that name.
    t.expect(
        "CreateVolume of an existing name with another size",
        c.create_volume(create_request("hostile-vol", 64 * MIB, vec![cap.clone()]))
            .await,
        Code::AlreadyExists,
    );
    t.expect(
        "CreateVolume of an existing name with other parameters",
        c.create_volume(CreateVolumeRequest {
            parameters: HashMap::from([(
                "csi.storage.k8s.io/pvc/name".to_owned(),
                "other".to_owned(),
            )]),
            ..create_request("hostile-vol", 16 * MIB, vec![cap.clone()])
        })
        .await,
        Code::AlreadyExists,
    );
    t.expect(
        "CreateVolume of an existing name from a snapshot",
        c.create_volume(create_from(
            "hostile-vol",
            16 * MIB,
            cap.clone(),
            from_snapshot(&snap),
        ))
        .await,
        Code::AlreadyExists,
    );

    // ---- DeleteVolume, ControllerGetVolume, ControllerUnpublish: ids only
    for (what, id) in invalid_ids() {
        t.expect(
            &format!("DeleteVolume with {what}"),
            c.delete_volume(DeleteVolumeRequest {
                volume_id: id.clone(),
                ..Default::default()
            })
            .await,
            Code::InvalidArgument,
        );
        t.expect(
            &format!("ControllerGetVolume with {what}"),
            c.controller_get_volume(ControllerGetVolumeRequest {
                volume_id: id.clone(),
            })
            .await,
            Code::InvalidArgument,
        );
        t.expect(
            &format!("ControllerUnpublishVolume with {what}"),
            c.controller_unpublish_volume(ControllerUnpublishVolumeRequest {
                volume_id: id.clone(),
                node_id: d.opts.node_id.clone(),
                ..Default::default()
            })
            .await,
            Code::InvalidArgument,
        );
    }
    for (what, id) in foreign_ids() {
        // Never ours, so already gone: deleting succeeds and touches nothing.
        t.expect(
            &format!("DeleteVolume with {what}"),
            c.delete_volume(DeleteVolumeRequest {
                volume_id: id.clone(),
                ..Default::default()
            })
            .await,
            Code::Ok,
        );
        t.expect(
            &format!("ControllerGetVolume with {what}"),
            c.controller_get_volume(ControllerGetVolumeRequest {
                volume_id: id.clone(),
            })
            .await,
            Code::NotFound,
        );
        t.expect(
            &format!("ControllerUnpublishVolume with {what}"),
            c.controller_unpublish_volume(ControllerUnpublishVolumeRequest {
                volume_id: id.clone(),
                node_id: d.opts.node_id.clone(),
                ..Default::default()
            })
            .await,
            Code::Ok,
        );
    }

    // ---- ControllerPublishVolume
    let publish = |volume_id: &str, node_id: &str, cap: Option<VolumeCapability>| {
        ControllerPublishVolumeRequest {
            volume_id: volume_id.to_owned(),
            node_id: node_id.to_owned(),
            volume_capability: cap,
            ..Default::default()
        }
    };
    for (what, id) in invalid_ids() {
        t.expect(
            &format!("ControllerPublishVolume with {what}"),
            c.controller_publish_volume(publish(&id, &d.opts.node_id, Some(cap.clone())))
                .await,
            Code::InvalidArgument,
        );
    }
    for (what, id) in foreign_ids() {
        t.expect(
            &format!("ControllerPublishVolume with {what}"),
            c.controller_publish_volume(publish(&id, &d.opts.node_id, Some(cap.clone())))
                .await,
            Code::NotFound,
        );
    }
    t.expect(
        "ControllerPublishVolume with an empty node id",
        c.controller_publish_volume(publish(&vol, "", Some(cap.clone())))
            .await,
        Code::InvalidArgument,
    );
    t.expect(
        "ControllerPublishVolume with a 1 MiB node id",
        c.controller_publish_volume(publish(&vol, &huge(), Some(cap.clone())))
            .await,
        Code::InvalidArgument,
    );
    t.expect(
        "ControllerPublishVolume to another node",
        c.controller_publish_volume(publish(&vol, &other, Some(cap.clone())))
            .await,
        Code::NotFound,
    );
    t.expect(
        "ControllerPublishVolume without a capability",
        c.controller_publish_volume(publish(&vol, &d.opts.node_id, None))
            .await,
        Code::InvalidArgument,
    );
    for (what, bad) in unservable_caps() {
        t.expect(
            &format!("ControllerPublishVolume with {what}"),
            c.controller_publish_volume(publish(&vol, &d.opts.node_id, Some(bad)))
                .await,
            Code::InvalidArgument,
        );
    }

    // ---- ValidateVolumeCapabilities: unservable capabilities are not confirmed (no error)
    let validate =
        |volume_id: &str, caps: Vec<VolumeCapability>| ValidateVolumeCapabilitiesRequest {
            volume_id: volume_id.to_owned(),
            volume_capabilities: caps,
            ..Default::default()
        };
    for (what, id) in invalid_ids() {
        t.expect(
            &format!("ValidateVolumeCapabilities with {what}"),
            c.validate_volume_capabilities(validate(&id, vec![cap.clone()]))
                .await,
            Code::InvalidArgument,
        );
    }
    for (what, id) in foreign_ids() {
        t.expect(
            &format!("ValidateVolumeCapabilities with {what}"),
            c.validate_volume_capabilities(validate(&id, vec![cap.clone()]))
                .await,
            Code::NotFound,
        );
    }
    t.expect(
        "ValidateVolumeCapabilities with no capability",
        c.validate_volume_capabilities(validate(&vol, vec![])).await,
        Code::InvalidArgument,
    );
    t.expect(
        "ValidateVolumeCapabilities with no access type",
        c.validate_volume_capabilities(validate(&vol, vec![cap_without_access_type()]))
            .await,
        Code::InvalidArgument,
    );
    for (what, bad) in unservable_caps()
        .into_iter()
        .filter(|(w, _)| w != "no access type")
    {
        let what = format!("ValidateVolumeCapabilities with {what}");
        match c
            .validate_volume_capabilities(validate(&vol, vec![bad]))
            .await
        {
            Ok(resp) => {
                let resp = resp.into_inner();
                t.cases += 1;
                if resp.confirmed.is_some()
                    || resp.message.is_empty()
                    || resp.message.len() > MAX_MESSAGE
                {
                    t.failures.push(format!(
                        "{what}: expected unconfirmed with a short message, got confirmed={} message of {} bytes",
                        resp.confirmed.is_some(),
                        resp.message.len()
                    ));
                }
            }
            Err(status) => t.failures.push(format!(
                "{what}: expected OK (unconfirmed), got {:?}: {}",
                status.code(),
                clip(status.message())
            )),
        }
    }

    // ---- ListVolumes, ListSnapshots, GetCapacity
    t.expect(
        "ListVolumes with max_entries -1",
        c.list_volumes(ListVolumesRequest {
            max_entries: -1,
            ..Default::default()
        })
        .await,
        Code::InvalidArgument,
    );
    for token in ["garbage".to_owned(), "../../x".to_owned(), huge()] {
        t.expect(
            &format!("ListVolumes with starting_token {:?}", clip(&token)),
            c.list_volumes(ListVolumesRequest {
                starting_token: token.clone(),
                ..Default::default()
            })
            .await,
            Code::Aborted,
        );
        t.expect(
            &format!("ListSnapshots with starting_token {:?}", clip(&token)),
            c.list_snapshots(ListSnapshotsRequest {
                starting_token: token,
                ..Default::default()
            })
            .await,
            Code::Aborted,
        );
    }
    t.expect(
        "ListSnapshots with max_entries -1",
        c.list_snapshots(ListSnapshotsRequest {
            max_entries: -1,
            ..Default::default()
        })
        .await,
        Code::InvalidArgument,
    );
    t.expect(
        "ListSnapshots with a 1 MiB snapshot id",
        c.list_snapshots(ListSnapshotsRequest {
            snapshot_id: huge(),
            ..Default::default()
        })
        .await,
        Code::InvalidArgument,
    );
    for (what, id) in foreign_ids() {
        match c
            .list_snapshots(ListSnapshotsRequest {
                snapshot_id: id,
                ..Default::default()
            })
            .await
        {
            Ok(r) if r.get_ref().entries.is_empty() => t.cases += 1,
            other => t.failures.push(format!(
                "ListSnapshots of {what}: expected an empty list, got {other:?}"
            )),
        }
    }
    t.expect(
        "GetCapacity with an unknown parameter",
        c.get_capacity(GetCapacityRequest {
            parameters: HashMap::from([("pool".to_owned(), "x".to_owned())]),
            ..Default::default()
        })
        .await,
        Code::InvalidArgument,
    );
    t.expect(
        "GetCapacity with a capability without access type",
        c.get_capacity(GetCapacityRequest {
            volume_capabilities: vec![cap_without_access_type()],
            ..Default::default()
        })
        .await,
        Code::InvalidArgument,
    );

    // ---- CreateSnapshot, DeleteSnapshot, GetSnapshot
    for (what, name) in [
        ("an empty name", String::new()),
        ("a 1 MiB name", huge()),
        ("a name with NUL", "s\0".to_owned()),
    ] {
        t.expect(
            &format!("CreateSnapshot with {what}"),
            c.create_snapshot(snapshot_request(&name, &vol)).await,
            Code::InvalidArgument,
        );
    }
    for (what, id) in invalid_ids() {
        t.expect(
            &format!("CreateSnapshot of {what}"),
            c.create_snapshot(snapshot_request("hostile-snap-2", &id))
                .await,
            Code::InvalidArgument,
        );
        t.expect(
            &format!("DeleteSnapshot with {what}"),
            c.delete_snapshot(DeleteSnapshotRequest {
                snapshot_id: id.clone(),
                ..Default::default()
            })
            .await,
            Code::InvalidArgument,
        );
        t.expect(
            &format!("GetSnapshot with {what}"),
            c.get_snapshot(GetSnapshotRequest {
                snapshot_id: id.clone(),
                ..Default::default()
            })
            .await,
            Code::InvalidArgument,
        );
    }
    for (what, id) in foreign_ids() {
        t.expect(
            &format!("CreateSnapshot of {what}"),
            c.create_snapshot(snapshot_request("hostile-snap-2", &id))
                .await,
            Code::NotFound,
        );
        t.expect(
            &format!("DeleteSnapshot with {what}"),
            c.delete_snapshot(DeleteSnapshotRequest {
                snapshot_id: id.clone(),
                ..Default::default()
            })
            .await,
            Code::Ok,
        );
        t.expect(
            &format!("GetSnapshot with {what}"),
            c.get_snapshot(GetSnapshotRequest {
                snapshot_id: id.clone(),
                ..Default::default()
            })
            .await,
            Code::NotFound,
        );
    }
    t.expect(
        "CreateSnapshot with an unknown parameter",
        c.create_snapshot(CreateSnapshotRequest {
            parameters: HashMap::from([("retain".to_owned(), "x".to_owned())]),
            ..snapshot_request("hostile-snap-2", &vol)
        })
        .await,
        Code::InvalidArgument,
    );
    t.expect(
        "CreateSnapshot of an existing name from another volume",
        c.create_snapshot(snapshot_request(
            "hostile-snap",
            &format!("fv-{}", "0".repeat(32)),
        ))
        .await,
        Code::AlreadyExists,
    );

    // ---- ControllerExpandVolume
    let expand = |volume_id: &str, required: i64, limit: i64| ControllerExpandVolumeRequest {
        volume_id: volume_id.to_owned(),
        capacity_range: range(required, limit),
        ..Default::default()
    };
    for (what, id) in invalid_ids() {
        t.expect(
            &format!("ControllerExpandVolume with {what}"),
            c.controller_expand_volume(expand(&id, 32 * MIB, 0)).await,
            Code::InvalidArgument,
        );
    }
    for (what, id) in foreign_ids() {
        t.expect(
            &format!("ControllerExpandVolume with {what}"),
            c.controller_expand_volume(expand(&id, 32 * MIB, 0)).await,
            Code::NotFound,
        );
    }
    for (what, required, limit, code) in [
        ("no capacity", 0, 0, Code::InvalidArgument),
        ("required -1", -1, 0, Code::InvalidArgument),
        ("limit -1", 32 * MIB, -1, Code::InvalidArgument),
        ("required i64::MAX", i64::MAX, 0, Code::OutOfRange),
        ("a limit below the size", 0, MIB, Code::OutOfRange),
    ] {
        t.expect(
            &format!("ControllerExpandVolume with {what}"),
            c.controller_expand_volume(expand(&vol, required, limit))
                .await,
            code,
        );
    }
    t.expect(
        "ControllerExpandVolume with a multi-node capability",
        c.controller_expand_volume(ControllerExpandVolumeRequest {
            volume_capability: Some(mount_cap_mode("ext4", Mode::MultiNodeMultiWriter)),
            ..expand(&vol, 32 * MIB, 0)
        })
        .await,
        Code::InvalidArgument,
    );
    t.expect(
        "ControllerModifyVolume",
        c.controller_modify_volume(ControllerModifyVolumeRequest {
            volume_id: vol.clone(),
            mutable_parameters: HashMap::from([("iops".to_owned(), huge())]),
            ..Default::default()
        })
        .await,
        Code::Unimplemented,
    );

    // ---- NodeStageVolume
    let mut n = d.node();
    let stage =
        |volume_id: &str, staging: &str, cap: Option<VolumeCapability>| NodeStageVolumeRequest {
            volume_id: volume_id.to_owned(),
            staging_target_path: staging.to_owned(),
            volume_capability: cap,
            ..Default::default()
        };
    let staging_text = staging.display().to_string();
    for (what, id) in invalid_ids() {
        t.expect(
            &format!("NodeStageVolume with {what}"),
            n.node_stage_volume(stage(&id, &staging_text, Some(cap.clone())))
                .await,
            Code::InvalidArgument,
        );
        t.expect(
            &format!("NodeUnstageVolume with {what}"),
            n.node_unstage_volume(NodeUnstageVolumeRequest {
                volume_id: id.clone(),
                staging_target_path: staging_text.clone(),
            })
            .await,
            Code::InvalidArgument,
        );
    }
    for (what, id) in foreign_ids() {
        t.expect(
            &format!("NodeStageVolume with {what}"),
            n.node_stage_volume(stage(&id, &staging_text, Some(cap.clone())))
                .await,
            Code::NotFound,
        );
        t.expect(
            &format!("NodeUnstageVolume with {what}"),
            n.node_unstage_volume(NodeUnstageVolumeRequest {
                volume_id: id.clone(),
                staging_target_path: staging_text.clone(),
            })
            .await,
            Code::NotFound,
        );
    }
    for (what, path) in &paths {
        t.expect(
            &format!("NodeStageVolume at {what}"),
            n.node_stage_volume(stage(&vol, path, Some(cap.clone())))
                .await,
            Code::InvalidArgument,
        );
        t.expect(
            &format!("NodeUnstageVolume at {what}"),
            n.node_unstage_volume(NodeUnstageVolumeRequest {
                volume_id: vol.clone(),
                staging_target_path: path.clone(),
            })
            .await,
            Code::InvalidArgument,
        );
    }
    t.expect(
        "NodeStageVolume without a capability",
        n.node_stage_volume(stage(&vol, &staging_text, None)).await,
        Code::InvalidArgument,
    );
    for (what, bad) in unservable_caps() {
        t.expect(
            &format!("NodeStageVolume with {what}"),
            n.node_stage_volume(stage(&vol, &staging_text, Some(bad)))
                .await,
            Code::InvalidArgument,
        );
    }
    let elsewhere = d.root.join("staging").join("elsewhere");
    t.expect(
        "NodeStageVolume of a staged volume at another path",
        n.node_stage_volume(stage(
            &vol,
            &elsewhere.display().to_string(),
            Some(cap.clone()),
        ))
        .await,
        Code::FailedPrecondition,
    );
    t.expect(
        "NodeStageVolume of a staged volume as xfs",
        n.node_stage_volume(stage(&vol, &staging_text, Some(mount_cap("xfs"))))
            .await,
        Code::AlreadyExists,
    );

    // ---- NodePublishVolume: the bind source is the staging path, the target a pod dir
    let publish = |volume_id: &str, staging: &str, target: &str, cap: VolumeCapability| {
        NodePublishVolumeRequest {
            volume_id: volume_id.to_owned(),
            staging_target_path: staging.to_owned(),
            target_path: target.to_owned(),
            volume_capability: Some(cap),
            ..Default::default()
        }
    };
    let target_text = own_target.display().to_string();
    for (what, id) in invalid_ids() {
        t.expect(
            &format!("NodePublishVolume with {what}"),
            n.node_publish_volume(publish(&id, &staging_text, &target_text, cap.clone()))
                .await,
            Code::InvalidArgument,
        );
        t.expect(
            &format!("NodeUnpublishVolume with {what}"),
            n.node_unpublish_volume(NodeUnpublishVolumeRequest {
                volume_id: id.clone(),
                target_path: target_text.clone(),
            })
            .await,
            Code::InvalidArgument,
        );
    }
    for (what, id) in foreign_ids() {
        t.expect(
            &format!("NodePublishVolume with {what}"),
            n.node_publish_volume(publish(&id, &staging_text, &target_text, cap.clone()))
                .await,
            Code::NotFound,
        );
        t.expect(
            &format!("NodeUnpublishVolume with {what}"),
            n.node_unpublish_volume(NodeUnpublishVolumeRequest {
                volume_id: id.clone(),
                target_path: target_text.clone(),
            })
            .await,
            Code::NotFound,
        );
    }
    for (what, path) in &paths {
        if path.is_empty() {
            // No staging path means "not staged": FAILED_PRECONDITION, covered below.
        } else {
            t.expect(
                &format!("NodePublishVolume from a bind source at {what}"),
                n.node_publish_volume(publish(&vol, path, &target_text, cap.clone()))
                    .await,
                Code::InvalidArgument,
            );
        }
        t.expect(
            &format!("NodePublishVolume onto {what}"),
            n.node_publish_volume(publish(&vol, &staging_text, path, cap.clone()))
                .await,
            Code::InvalidArgument,
        );
        t.expect(
            &format!("NodeUnpublishVolume at {what}"),
            n.node_unpublish_volume(NodeUnpublishVolumeRequest {
                volume_id: vol.clone(),
                target_path: path.clone(),
            })
            .await,
            Code::InvalidArgument,
        );
    }
    t.expect(
        "NodePublishVolume without a staging path",
        n.node_publish_volume(publish(&vol, "", &target_text, cap.clone()))
            .await,
        Code::FailedPrecondition,
    );
    t.expect(
        "NodePublishVolume from another directory below the root as bind source",
        n.node_publish_volume(publish(
            &vol,
            &elsewhere.display().to_string(),
            &target_text,
            cap.clone(),
        ))
        .await,
        Code::FailedPrecondition,
    );
    t.expect(
        "NodePublishVolume onto its staging path",
        n.node_publish_volume(publish(&vol, &staging_text, &staging_text, cap.clone()))
            .await,
        Code::InvalidArgument,
    );
    t.expect(
        "NodePublishVolume into its staging path",
        n.node_publish_volume(publish(
            &vol,
            &staging_text,
            &staging.join("x").display().to_string(),
            cap.clone(),
        ))
        .await,
        Code::InvalidArgument,
    );
    for (what, bad) in unservable_caps() {
        t.expect(
            &format!("NodePublishVolume with {what}"),
            n.node_publish_volume(publish(&vol, &staging_text, &target_text, bad))
                .await,
            Code::InvalidArgument,
        );
    }

    // ---- NodeGetVolumeStats, NodeExpandVolume
    let stats = |volume_id: &str, path: &str| NodeGetVolumeStatsRequest {
        volume_id: volume_id.to_owned(),
        volume_path: path.to_owned(),
        staging_target_path: String::new(),
    };
    let node_expand = |volume_id: &str, path: &str, required: i64| NodeExpandVolumeRequest {
        volume_id: volume_id.to_owned(),
        volume_path: path.to_owned(),
        capacity_range: range(required, 0),
        ..Default::default()
    };
    for (what, id) in invalid_ids() {
        t.expect(
            &format!("NodeGetVolumeStats with {what}"),
            n.node_get_volume_stats(stats(&id, &staging_text)).await,
            Code::InvalidArgument,
        );
        t.expect(
            &format!("NodeExpandVolume with {what}"),
            n.node_expand_volume(node_expand(&id, &staging_text, 32 * MIB))
                .await,
            Code::InvalidArgument,
        );
    }
    for (what, id) in foreign_ids() {
        t.expect(
            &format!("NodeGetVolumeStats with {what}"),
            n.node_get_volume_stats(stats(&id, &staging_text)).await,
            Code::NotFound,
        );
        t.expect(
            &format!("NodeExpandVolume with {what}"),
            n.node_expand_volume(node_expand(&id, &staging_text, 32 * MIB))
                .await,
            Code::NotFound,
        );
    }
    for (what, path) in &paths {
        t.expect(
            &format!("NodeGetVolumeStats at {what}"),
            n.node_get_volume_stats(stats(&vol, path)).await,
            Code::InvalidArgument,
        );
        t.expect(
            &format!("NodeExpandVolume at {what}"),
            n.node_expand_volume(node_expand(&vol, path, 32 * MIB))
                .await,
            Code::InvalidArgument,
        );
        if !path.is_empty() {
            t.expect(
                &format!("NodeExpandVolume with a staging path at {what}"),
                n.node_expand_volume(NodeExpandVolumeRequest {
                    staging_target_path: path.clone(),
                    ..node_expand(&vol, &staging_text, 32 * MIB)
                })
                .await,
                Code::InvalidArgument,
            );
        }
    }
    let not_its_mount = d.root.join("targets").display().to_string();
    t.expect(
        "NodeGetVolumeStats of a directory that is not its mount",
        n.node_get_volume_stats(stats(&vol, &not_its_mount)).await,
        Code::NotFound,
    );
    t.expect(
        "NodeExpandVolume of a directory that is not its mount",
        n.node_expand_volume(node_expand(&vol, &not_its_mount, 32 * MIB))
            .await,
        Code::NotFound,
    );
    t.expect(
        "NodeExpandVolume with required -1",
        n.node_expand_volume(node_expand(&vol, &staging_text, -1))
            .await,
        Code::InvalidArgument,
    );
    t.expect(
        "NodeExpandVolume with required i64::MAX",
        n.node_expand_volume(node_expand(&vol, &staging_text, i64::MAX))
            .await,
        Code::OutOfRange,
    );

    // Names that look like paths or carry odd characters are only names: the volume is a
    // hashed id in the pool, nothing else.
    for name in [
        "../../../etc/passwd",
        "a/b/c",
        "\u{202e}gpj.exe",
        "\u{fffd}\u{fffd}",
        "..",
        "/",
    ] {
        let created = c
            .create_volume(create_request(name, 16 * MIB, vec![cap.clone()]))
            .await;
        match created {
            Ok(resp) => {
                t.cases += 1;
                let id = resp
                    .into_inner()
                    .volume
                    .map(|v| v.volume_id)
                    .unwrap_or_default();
                if !crate::requests::is_volume_id(&id) {
                    t.failures.push(format!(
                        "CreateVolume {name:?}: id {id:?} is not a ferrovol id"
                    ));
                }
                t.expect(
                    &format!("DeleteVolume of {name:?}"),
                    c.delete_volume(DeleteVolumeRequest {
                        volume_id: id,
                        ..Default::default()
                    })
                    .await,
                    Code::Ok,
                );
            }
            Err(status) => t.failures.push(format!(
                "CreateVolume {name:?}: expected OK, got {:?}: {}",
                status.code(),
                status.message()
            )),
        }
    }

    // Nothing outside the driver's own files changed, no mount or device appeared, and the
    // driver still serves.
    let after = (tree(&canary, &[]), tree(&root, &skip));
    fs::remove_file(&link).expect("remove the planted link");
    let before_root = before.1;
    t.failures.extend(tree_changes(
        "the canary outside the path root",
        &before.0,
        &after.0,
    ));
    t.failures.extend(tree_changes(
        "the driver's scratch directories",
        &before_root,
        &after.1,
    ));
    let mounts_after: Vec<PathBuf> = mounts_under(&root)
        .into_iter()
        .map(|m| m.mount_point)
        .collect();
    if mounts_after != mounts_before {
        t.failures.push(format!(
            "mounts changed from {mounts_before:?} to {mounts_after:?}"
        ));
    }
    let images_after = d.pool_images();
    if images_after != images_before {
        t.failures.push(format!(
            "pool files changed from {images_before:?} to {images_after:?}"
        ));
    }
    assert!(
        mounts_under(&canary).is_empty(),
        "something was mounted in the canary"
    );
    assert!(
        loops_backed_under(&canary).is_empty(),
        "a loop device of the canary"
    );
    assert_eq!(
        loops_backed_under(&d.pool).len(),
        1,
        "loop devices of the pool"
    );
    crate::requests::ok(
        d.identity().probe(ProbeRequest {}).await,
        "Probe after the hostile requests",
    );
    t.finish();

    d.unstage(&vol).await;
    d.delete_snapshot(&snap).await;
    d.delete(&vol).await;
    d.finish().await;
}
