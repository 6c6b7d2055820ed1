//! Fuzzing request decoding and validation with proptest, bounded for CI.
//!
//! Three kinds of input reach a driver served in this process (its pool, state and
//! path root in a temp dir; the services are called directly, as tonic would):
//! - arbitrary bytes, decoded with prost as each of the 26 request types;
//! - requests built from hostile field values (path-like and oversized strings, control
//!   characters, any 64-bit number, refused mount flags), encoded, cut short or bit-flipped,
//!   and decoded again;
//! - the same values fed to the pure checks in `validate`, `ids` and `os::mount`, whose
//!   results must keep their promises (sizes round and bounded, paths below the root
//!   without `..`, ids safe as file names, mounts always nosuid and nodev).
//!
//! Every answer must be OK or a status whose code is one of the request errors the
//! CSI spec names (never UNKNOWN, never INTERNAL: no input may reach a failure the driver
//! did not foresee) with a non-empty message of at most 2 KiB; nothing may panic.
//!
//! Bounded: `FERROVOL_FUZZ_CASES` cases per property (default 2000) from a fixed seed
//! unless `FERROVOL_FUZZ_SEED` gives another, so CI runs are repeatable and take seconds;
//! a longer hunt is `FERROVOL_FUZZ_CASES=100000 FERROVOL_FUZZ_SEED=$RANDOM`. No request
//! the generators make can reach a mount: paths below the root name no staged volume.

use std::path::{Component, Path, PathBuf};
use std::sync::{Arc, OnceLock};

use ferrovol::config::Config;
use ferrovol::controller::ControllerService;
use ferrovol::csi::v1::controller_server::Controller;
use ferrovol::csi::v1::identity_server::Identity;
use ferrovol::csi::v1::node_server::Node;
use ferrovol::csi::v1::volume_capability::access_mode::Mode;
use ferrovol::csi::v1::volume_capability::{AccessMode, AccessType, BlockVolume, MountVolume};
use ferrovol::csi::v1::*;
use ferrovol::identity::IdentityService;
use ferrovol::ids::{ParsedId, VolumeId};
use ferrovol::node::NodeService;
use ferrovol::validate;
use proptest::prelude::*;
use proptest::test_runner::{Config as ProptestConfig, RngAlgorithm, TestRng, TestRunner};
use prost::Message;
use tonic::{Code, Request, Status};

/// A driver in this process, shared by every case.
struct Served {
    _dir: tempfile::TempDir,
    root: PathBuf,
    runtime: tokio::runtime::Runtime,
    identity: IdentityService,
    controller: ControllerService,
    node: NodeService,
}

fn served() -> &'static Served {
    static SERVED: OnceLock<Served> = OnceLock::new();
    SERVED.get_or_init(|| {
        // A static is never dropped, so the temp dir of this process outlives it: remove
        // those of earlier runs (their process is gone) first. They hold only sparse files
        // and records; no request the generators make can mount anything.
        remove_stale_dirs();
        let dir = tempfile::Builder::new()
            .prefix(&format!("ferrovol-fuzz-{}-", std::process::id()))
            .tempdir_in("/tmp")
            .expect("temp dir");
        let base = std::fs::canonicalize(dir.path()).expect("canonical temp dir");
        let root = base.join("kubelet");
        std::fs::create_dir_all(&root).expect("path root");
        let mut config = Config::with_dirs("fuzz-node", base.join("state"), base.join("pool"));
        config.path_roots = vec![root.clone()];
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .expect("runtime");
        let driver = runtime
            .block_on(async { ferrovol::server::open_driver(config) })
            .expect("open the driver");
        Served {
            _dir: dir,
            root,
            runtime,
            identity: IdentityService::new(Arc::clone(&driver)),
            controller: ControllerService::new(Arc::clone(&driver)),
            node: NodeService::new(driver),
        }
    })
}

fn remove_stale_dirs() {
    let Ok(entries) = std::fs::read_dir("/tmp") else {
        return;
    };
    for entry in entries.filter_map(Result::ok) {
        let name = entry.file_name().to_string_lossy().into_owned();
        let Some(pid) = name
            .strip_prefix("ferrovol-fuzz-")
            .and_then(|rest| rest.split('-').next())
            .and_then(|pid| pid.parse::<u32>().ok())
        else {
            continue;
        };
        if !Path::new(&format!("/proc/{pid}")).exists() {
            let _ = std::fs::remove_dir_all(entry.path());
        }
    }
}

fn runner() -> TestRunner {
    let cases = std::env::var("FERROVOL_FUZZ_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(2000);
    let config = ProptestConfig {
        cases,
        failure_persistence: None,
        ..ProptestConfig::default()
    };
    let seed: u64 = std::env::var("FERROVOL_FUZZ_SEED")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(0x5e5e_0008);
    eprintln!("fuzz: {cases} cases, seed {seed} (FERROVOL_FUZZ_SEED, FERROVOL_FUZZ_CASES)");
    let mut bytes = [0u8; 32];
    for (i, chunk) in bytes.chunks_mut(8).enumerate() {
        chunk.copy_from_slice(&seed.rotate_left(i as u32 * 16).to_le_bytes());
    }
    TestRunner::new_with_rng(config, TestRng::from_seed(RngAlgorithm::ChaCha, &bytes))
}

/// The codes a request may be refused with; anything else (UNKNOWN, INTERNAL, ...) is a
/// failure the driver did not foresee.
fn check_answer<T>(method: &str, answer: Result<T, Status>) -> Result<(), TestCaseError> {
    let Err(status) = answer else {
        return Ok(());
    };
    let allowed = matches!(
        status.code(),
        Code::InvalidArgument
            | Code::NotFound
            | Code::AlreadyExists
            | Code::FailedPrecondition
            | Code::OutOfRange
            | Code::ResourceExhausted
            | Code::Aborted
            | Code::Unimplemented
    );
    prop_assert!(
        allowed,
        "{method}: answered {:?}: {}",
        status.code(),
        status.message()
    );
    prop_assert!(
        !status.message().trim().is_empty(),
        "{method}: empty message"
    );
    prop_assert!(
        status.message().len() <= ferrovol::error::MAX_STATUS_MESSAGE,
        "{method}: a {} byte message",
        status.message().len()
    );
    Ok(())
}

/// Decodes `bytes` as the request of method number `which` and, if it decodes, serves it.
fn decode_and_serve(which: usize, bytes: &[u8]) -> Result<(), TestCaseError> {
    let s = served();
    macro_rules! methods {
        ($( $service:ident . $call:ident ( $req:ty ) ),* $(,)?) => {{
            let mut i = 0usize;
            $(
                if which == i {
                    return match <$req>::decode(bytes) {
                        // tonic answers INTERNAL for a request that does not decode.
                        Err(_) => Ok(()),
                        Ok(req) => {
                            let answer = s.runtime.block_on(s.$service.$call(Request::new(req)));
                            check_answer(stringify!($call), answer)
                        }
                    };
                }
                i += 1;
            )*
            let _ = i;
            Ok(())
        }};
    }
    methods!(
        identity.get_plugin_info(GetPluginInfoRequest),
        identity.get_plugin_capabilities(GetPluginCapabilitiesRequest),
        identity.probe(ProbeRequest),
        controller.create_volume(CreateVolumeRequest),
        controller.delete_volume(DeleteVolumeRequest),
        controller.controller_publish_volume(ControllerPublishVolumeRequest),
        controller.controller_unpublish_volume(ControllerUnpublishVolumeRequest),
        controller.validate_volume_capabilities(ValidateVolumeCapabilitiesRequest),
        controller.list_volumes(ListVolumesRequest),
        controller.get_capacity(GetCapacityRequest),
        controller.controller_get_capabilities(ControllerGetCapabilitiesRequest),
        controller.create_snapshot(CreateSnapshotRequest),
        controller.delete_snapshot(DeleteSnapshotRequest),
        controller.list_snapshots(ListSnapshotsRequest),
        controller.get_snapshot(GetSnapshotRequest),
        controller.controller_expand_volume(ControllerExpandVolumeRequest),
        controller.controller_get_volume(ControllerGetVolumeRequest),
        controller.controller_modify_volume(ControllerModifyVolumeRequest),
        node.node_stage_volume(NodeStageVolumeRequest),
        node.node_unstage_volume(NodeUnstageVolumeRequest),
        node.node_publish_volume(NodePublishVolumeRequest),
        node.node_unpublish_volume(NodeUnpublishVolumeRequest),
        node.node_get_volume_stats(NodeGetVolumeStatsRequest),
        node.node_expand_volume(NodeExpandVolumeRequest),
        node.node_get_capabilities(NodeGetCapabilitiesRequest),
        node.node_get_info(NodeGetInfoRequest),
    )
}

const METHODS: usize = 26;

/// Strings a hostile client sends: path pieces, separators, control characters,
/// lookalike ids, odd Unicode, and long runs.
fn hostile_string() -> impl Strategy<Value = String> {
    let pieces = prop::sample::select(vec![
        "",
        "/",
        "..",
        ".",
        "a",
        "fv-",
        "fvs-",
        "0123456789abcdef",
        "\0",
        "\n",
        "\u{1b}",
        "\u{7f}",
        "\u{202e}",
        "\u{fffd}",
        "é",
        "=",
        ",",
        " ",
        "suid",
        "dev",
        "bind",
        "/dev/vda",
        "/etc/passwd",
        "csi.storage.k8s.io/",
        "backend",
        "loop",
        "ext4",
        "xfs",
    ]);
    prop_oneof![
        4 => prop::collection::vec(pieces, 0..8).prop_map(|p| p.concat()),
        1 => (prop::sample::select(vec!["x", "/", "é", "a/"]), 100usize..5000)
            .prop_map(|(s, n)| s.repeat(n)),
        1 => any::<String>(),
    ]
}

/// Paths: hostile strings, also placed below the path root so some pass the first checks.
fn hostile_path() -> impl Strategy<Value = String> {
    let root = served().root.display().to_string();
    prop_oneof![
        hostile_string(),
        hostile_string().prop_map(move |s| format!("{root}/{s}")),
    ]
}

/// 32 lowercase hex digits.
fn hex32() -> impl Strategy<Value = String> {
    prop::collection::vec(0u32..16, 32).prop_map(|digits| {
        digits
            .into_iter()
            .filter_map(|d| char::from_digit(d, 16))
            .collect()
    })
}

/// Ids: hostile strings and well-formed ids of volumes and snapshots that do not exist.
fn hostile_id() -> impl Strategy<Value = String> {
    prop_oneof![
        hostile_string(),
        hex32().prop_map(|h| format!("fv-{h}")),
        hex32().prop_map(|h| format!("fvs-{h}")),
    ]
}

fn hostile_capability() -> impl Strategy<Value = VolumeCapability> {
    let flags = prop::collection::vec(
        prop_oneof![
            prop::sample::select(vec![
                "ro",
                "noatime",
                "suid",
                "dev",
                "bind",
                "remount",
                "logdev=/dev/vda",
                "device=/dev/sda",
                "errors=panic",
                "context=x",
                "nouuid",
                "discard",
            ])
            .prop_map(str::to_owned),
            hostile_string(),
        ],
        0..4,
    );
    let mode = prop_oneof![0i32..8, any::<i32>()];
    let fs_type = prop_oneof![
        prop::sample::select(vec!["", "ext4", "xfs", "btrfs", "ntfs"]).prop_map(str::to_owned),
        hostile_string(),
    ];
    (any::<bool>(), fs_type, flags, mode, any::<bool>()).prop_map(
        |(block, fs_type, mount_flags, mode, has_mode)| VolumeCapability {
            access_type: Some(if block {
                AccessType::Block(BlockVolume {})
            } else {
                AccessType::Mount(MountVolume {
                    fs_type,
                    mount_flags,
                    volume_mount_group: String::new(),
                })
            }),
            access_mode: has_mode.then_some(AccessMode { mode }),
        },
    )
}

fn hostile_range() -> impl Strategy<Value = Option<CapacityRange>> {
    let bytes = prop_oneof![
        Just(0i64),
        any::<i64>(),
        (0i64..(64 << 20)),
        Just(i64::MAX),
        Just(i64::MIN),
    ];
    prop::option::of(
        (bytes.clone(), bytes).prop_map(|(required_bytes, limit_bytes)| CapacityRange {
            required_bytes,
            limit_bytes,
        }),
    )
}

fn hostile_parameters() -> impl Strategy<Value = std::collections::HashMap<String, String>> {
    prop::collection::hash_map(hostile_string(), hostile_string(), 0..3)
}

/// A request of one of the RPCs that take the most input, encoded.
fn hostile_request() -> impl Strategy<Value = (usize, Vec<u8>)> {
    prop_oneof![
        (
            hostile_string(),
            hostile_range(),
            prop::collection::vec(hostile_capability(), 0..3),
            hostile_parameters(),
            prop::option::of(hostile_id()),
        )
            .prop_map(|(name, capacity_range, caps, parameters, source)| {
                let req = CreateVolumeRequest {
                    name,
                    capacity_range,
                    volume_capabilities: caps,
                    parameters,
                    volume_content_source: source.map(|id| VolumeContentSource {
                        r#type: Some(if id.starts_with("fvs-") {
                            volume_content_source::Type::Snapshot(
                                volume_content_source::SnapshotSource { snapshot_id: id },
                            )
                        } else {
                            volume_content_source::Type::Volume(
                                volume_content_source::VolumeSource { volume_id: id },
                            )
                        }),
                    }),
                    ..Default::default()
                };
                (3, req.encode_to_vec())
            }),
        (hostile_string(), hostile_id(), hostile_parameters()).prop_map(
            |(name, source_volume_id, parameters)| {
                let req = CreateSnapshotRequest {
                    name,
                    source_volume_id,
                    parameters,
                    ..Default::default()
                };
                (11, req.encode_to_vec())
            }
        ),
        (
            hostile_id(),
            hostile_range(),
            prop::option::of(hostile_capability())
        )
            .prop_map(|(volume_id, capacity_range, volume_capability)| {
                let req = ControllerExpandVolumeRequest {
                    volume_id,
                    capacity_range,
                    volume_capability,
                    ..Default::default()
                };
                (15, req.encode_to_vec())
            }),
        (
            hostile_id(),
            hostile_path(),
            prop::option::of(hostile_capability())
        )
            .prop_map(|(volume_id, staging_target_path, volume_capability)| {
                let req = NodeStageVolumeRequest {
                    volume_id,
                    staging_target_path,
                    volume_capability,
                    ..Default::default()
                };
                (18, req.encode_to_vec())
            }),
        (
            hostile_id(),
            hostile_path(),
            hostile_path(),
            prop::option::of(hostile_capability()),
            any::<bool>()
        )
            .prop_map(
                |(volume_id, staging_target_path, target_path, volume_capability, readonly)| {
                    let req = NodePublishVolumeRequest {
                        volume_id,
                        staging_target_path,
                        target_path,
                        volume_capability,
                        readonly,
                        ..Default::default()
                    };
                    (20, req.encode_to_vec())
                }
            ),
        (hostile_id(), hostile_path()).prop_map(|(volume_id, target_path)| {
            (
                21,
                NodeUnpublishVolumeRequest {
                    volume_id,
                    target_path,
                }
                .encode_to_vec(),
            )
        }),
        (
            hostile_id(),
            hostile_path(),
            hostile_path(),
            hostile_range()
        )
            .prop_map(
                |(volume_id, volume_path, staging_target_path, capacity_range)| {
                    let req = NodeExpandVolumeRequest {
                        volume_id,
                        volume_path,
                        staging_target_path,
                        capacity_range,
                        ..Default::default()
                    };
                    (23, req.encode_to_vec())
                }
            ),
        (any::<i32>(), hostile_string()).prop_map(|(max_entries, starting_token)| {
            (
                8,
                ListVolumesRequest {
                    max_entries,
                    starting_token,
                }
                .encode_to_vec(),
            )
        }),
    ]
}

/// Damages an encoded request: cut it short or flip a byte.
fn damage(bytes: Vec<u8>, how: u8, at: usize) -> Vec<u8> {
    let mut bytes = bytes;
    if bytes.is_empty() {
        return bytes;
    }
    let at = at % bytes.len();
    match how % 3 {
        0 => bytes,
        1 => {
            bytes.truncate(at);
            bytes
        }
        _ => {
            bytes[at] ^= 0x80 | how;
            bytes
        }
    }
}

#[test]
fn arbitrary_bytes_as_any_request() {
    runner()
        .run(
            &(0..METHODS, prop::collection::vec(any::<u8>(), 0..256)),
            |(which, bytes)| decode_and_serve(which, &bytes),
        )
        .expect("every decodable request gets a proper answer");
}

#[test]
fn hostile_requests_encoded_damaged_and_decoded() {
    runner()
        .run(
            &(hostile_request(), any::<u8>(), any::<usize>()),
            |((which, bytes), how, at)| decode_and_serve(which, &damage(bytes, how, at)),
        )
        .expect("every hostile request gets a proper answer");
}

#[test]
fn volume_sizes_keep_their_promises() {
    runner()
        .run(
            &(
                hostile_range(),
                prop_oneof![Just(validate::MIN_SIZE), any::<u64>()],
            ),
            |(range, min)| {
                match validate::volume_size(range.as_ref(), min) {
                    Ok(size) => {
                        let (required, limit) =
                            range.map_or((0, 0), |r| (r.required_bytes, r.limit_bytes));
                        prop_assert_eq!(size % validate::GRANULARITY, 0);
                        prop_assert!(size >= min && i64::try_from(size).is_ok());
                        prop_assert!(i64::try_from(size).is_ok_and(|s| s >= required));
                        prop_assert!(limit == 0 || i64::try_from(size).is_ok_and(|s| s <= limit));
                    }
                    Err(e) => {
                        prop_assert!(matches!(e.code(), Code::InvalidArgument | Code::OutOfRange))
                    }
                }
                Ok(())
            },
        )
        .expect("volume_size");
}

#[test]
fn node_paths_stay_below_the_root() {
    let root = served().root.clone();
    let mut config = Config::with_dirs("n", "/s".into(), "/p".into());
    config.path_roots = vec![root.clone()];
    runner()
        .run(&hostile_path(), |raw| {
            match validate::node_path(&config, "target_path", &raw) {
                Ok(path) => {
                    prop_assert!(path.starts_with(&root) && path != root, "{path:?}");
                    prop_assert!(path.is_absolute());
                    prop_assert!(!path.components().any(|c| c == Component::ParentDir));
                    prop_assert!(!raw.contains('\0'));
                }
                Err(e) => prop_assert_eq!(e.code(), Code::InvalidArgument),
            }
            Ok(())
        })
        .expect("node_path");
}

#[test]
fn ids_that_parse_as_ours_are_safe_file_names() {
    runner()
        .run(&hostile_id(), |raw| {
            match VolumeId::parse("volume_id", &raw) {
                Ok(ParsedId::Ours(id)) => {
                    let s = id.as_str();
                    prop_assert!(s.len() == 35 && s.starts_with("fv-"));
                    prop_assert!(s[3..]
                        .bytes()
                        .all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase()));
                    prop_assert_eq!(Path::new(s).components().count(), 1);
                }
                Ok(ParsedId::Foreign) => prop_assert!(!raw.is_empty() && raw.len() <= 128),
                Err(e) => {
                    prop_assert_eq!(e.code(), Code::InvalidArgument);
                    prop_assert!(raw.is_empty() || raw.len() > 128);
                }
            }
            Ok(())
        })
        .expect("VolumeId::parse");
}

#[test]
fn accepted_mount_flags_keep_mounts_nosuid_and_nodev() {
    use nix::mount::MsFlags;
    let flag = prop_oneof![
        prop::sample::select(vec![
            "ro",
            "rw",
            "noexec",
            "exec",
            "suid",
            "dev",
            "bind",
            "rbind",
            "remount",
            "move",
            "shared",
            "errors=panic",
            "logdev=/dev/vda",
            "discard",
            "nouuid",
            "sync",
        ])
        .prop_map(str::to_owned),
        hostile_string(),
    ];
    runner()
        .run(&prop::collection::vec(flag, 0..5), |flags| {
            match ferrovol::os::mount::parse_mount_flags(&flags) {
                Ok(opts) => {
                    prop_assert!(opts.flags.contains(MsFlags::MS_NOSUID | MsFlags::MS_NODEV));
                    prop_assert!(!opts.flags.intersects(
                        MsFlags::MS_BIND
                            | MsFlags::MS_REMOUNT
                            | MsFlags::MS_MOVE
                            | MsFlags::MS_SHARED
                    ));
                    for option in opts.data.split(',').filter(|o| !o.is_empty()) {
                        prop_assert!(
                            !["suid", "dev", "bind", "remount"].contains(&option),
                            "{option}"
                        );
                        prop_assert!(!option.contains('/'), "{option}");
                        prop_assert!(option != "errors=panic");
                    }
                }
                Err(e) => prop_assert_eq!(e.code(), Code::InvalidArgument),
            }
            Ok(())
        })
        .expect("parse_mount_flags");
}

#[test]
fn the_capability_check_accepts_only_single_node_modes() {
    runner()
        .run(&hostile_capability(), |cap| {
            match validate::capability("volume_capability", Some(&cap)) {
                Ok(parsed) => prop_assert!(matches!(
                    parsed.mode,
                    Mode::SingleNodeWriter
                        | Mode::SingleNodeReaderOnly
                        | Mode::SingleNodeSingleWriter
                        | Mode::SingleNodeMultiWriter
                )),
                Err(e) => prop_assert_eq!(e.code(), Code::InvalidArgument),
            }
            Ok(())
        })
        .expect("capability");
}
