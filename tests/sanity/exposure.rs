//! Who can reach the driver, and what its HTTP port gives away.
//!
//! The socket belongs to the driver's user and, with `--socket-group`, to the group
//! named there, mode 0660: a process of that group can connect, any other user cannot.
//! An unknown group stops the driver at start. `/metrics` carries only label values
//! from fixed sets (method and code names, backend, pool), never an id, a name, a
//! parameter value or a path from a request, and `/healthz` says only `ok`.
//!
//! RPCs: CreateVolume, NodeStage/Publish/Unpublish/Unstage, CreateSnapshot and their
//! teardown, as the workload whose traces the scrape must not show.

use std::collections::{BTreeSet, HashMap};
use std::fs;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::os::unix::process::CommandExt;
use std::process::Command;
use std::time::Duration;

use ferrovol::csi::v1::{CreateVolumeRequest, ProbeRequest};
use tonic::Code;

use crate::harness::{wait_bounded, Driver, Options};
use crate::observability::{http, parse_metrics};
use crate::requests::{create_request, expect_code, mount_cap, ok, MIB};

/// A group id no account on a test machine uses.
const SOCKET_GID: u32 = 4242;
/// The unprivileged user the connection attempts run as.
const NOBODY: u32 = 65534;

/// Whether a process of `uid`/`gid` can connect to the unix socket at `path`.
fn can_connect_as(uid: u32, gid: u32, path: &std::path::Path) -> bool {
    let status = Command::new("python3")
        .args([
            "-c",
            "import socket, sys\ns = socket.socket(socket.AF_UNIX)\ntry:\n    s.connect(sys.argv[1])\nexcept PermissionError:\n    sys.exit(3)\n",
        ])
        .arg(path)
        .uid(uid)
        .gid(gid)
        .status()
        .expect("run python3");
    match status.code() {
        Some(0) => true,
        Some(3) => false,
        other => panic!("the connection probe failed otherwise: {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_socket_belongs_to_the_driver_and_its_group() {
    let mut d = Driver::prepare(Options {
        extra_args: vec!["--socket-group".into(), SOCKET_GID.to_string()],
        ..Options::default()
    });
    // Let other users reach the socket's directory, so only the socket's own mode and
    // owners decide who connects.
    fs::set_permissions(&d.root, fs::Permissions::from_mode(0o711)).expect("chmod the root");
    d.spawn_and_connect().await;
    let meta = fs::symlink_metadata(&d.socket).expect("stat the socket");
    assert_eq!(meta.uid(), nix::unistd::geteuid().as_raw(), "socket owner");
    assert_eq!(meta.gid(), SOCKET_GID, "socket group");
    assert_eq!(meta.mode() & 0o7777, 0o660, "socket mode {:o}", meta.mode());
    assert!(
        can_connect_as(NOBODY, SOCKET_GID, &d.socket),
        "a member of the socket group cannot connect"
    );
    assert!(
        !can_connect_as(NOBODY, NOBODY, &d.socket),
        "a user outside the socket group can connect"
    );
    d.finish().await;

    // By name, and without the flag the driver's own group.
    let named = Driver::start_with(Options {
        extra_args: vec!["--socket-group".into(), "daemon".into()],
        ..Options::default()
    })
    .await;
    let daemon = nix::unistd::Group::from_name("daemon")
        .expect("group database")
        .expect("the daemon group exists on Debian")
        .gid
        .as_raw();
    assert_eq!(fs::metadata(&named.socket).expect("stat").gid(), daemon);
    named.finish().await;
    let plain = Driver::start().await;
    let meta = fs::metadata(&plain.socket).expect("stat");
    assert_eq!(meta.gid(), nix::unistd::getegid().as_raw());
    assert_eq!(meta.uid(), nix::unistd::geteuid().as_raw());
    plain.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unknown_socket_group_stops_the_start() {
    let d = Driver::prepare(Options::default());
    let mut args = d.args();
    args.extend(["--socket-group".into(), "no-such-group-ferrovol".into()]);
    let mut child = d.spawn_process(&args);
    let status = wait_bounded(&mut child, Duration::from_secs(10))
        .await
        .unwrap_or_else(|| {
            let _ = child.kill();
            panic!("the driver kept running with an unknown --socket-group")
        });
    assert!(!status.success());
    let log = d.log_text();
    assert!(log.contains("no group named"), "{log}");
    assert!(!d.socket.exists(), "a socket was created");
    d.finish().await;
}

/// Every RPC name, the only values the `method` label may take.
const METHODS: &[&str] = &[
    "GetPluginInfo",
    "GetPluginCapabilities",
    "Probe",
    "CreateVolume",
    "DeleteVolume",
    "ControllerPublishVolume",
    "ControllerUnpublishVolume",
    "ValidateVolumeCapabilities",
    "ListVolumes",
    "GetCapacity",
    "ControllerGetCapabilities",
    "CreateSnapshot",
    "DeleteSnapshot",
    "ListSnapshots",
    "GetSnapshot",
    "ControllerExpandVolume",
    "ControllerGetVolume",
    "ControllerModifyVolume",
    "NodeStageVolume",
    "NodeUnstageVolume",
    "NodePublishVolume",
    "NodeUnpublishVolume",
    "NodeGetVolumeStats",
    "NodeExpandVolume",
    "NodeGetCapabilities",
    "NodeGetInfo",
];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_show_no_request_data() {
    let d = Driver::start().await;
    let cap = mount_cap("ext4");
    let volume = d
        .create_with(CreateVolumeRequest {
            parameters: HashMap::from([
                (
                    "csi.storage.k8s.io/pvc/name".to_owned(),
                    "claim-secretive".to_owned(),
                ),
                (
                    "csi.storage.k8s.io/pvc/namespace".to_owned(),
                    "ns-secretive".to_owned(),
                ),
            ]),
            ..create_request("pvc-secretive", 16 * MIB, vec![cap.clone()])
        })
        .await
        .volume_id;
    d.stage(&volume, &cap).await;
    let target = d.publish(&volume, &cap, "pod-secretive", false).await;
    let snapshot = d.snapshot("snap-secretive", &volume).await.snapshot_id;
    // Refused requests whose values would break or forge a metrics line if echoed.
    for name in [
        "x".repeat(1 << 20),
        "secretive\n# TYPE forged counter\nforged 1".to_owned(),
    ] {
        expect_code(
            d.controller()
                .create_volume(create_request(&name, 16 * MIB, vec![]))
                .await,
            Code::InvalidArgument,
            "CreateVolume with a hostile name",
        );
    }

    let (status, body) = http(&d, "GET", "/metrics").await;
    assert_eq!(status, 200);
    let codes: BTreeSet<String> = (0..=16)
        .map(|c| {
            let code = Code::from_i32(c);
            // The gRPC spec's spelling, as the driver writes it.
            match code {
                Code::Ok => "OK".to_owned(),
                other => format!("{other:?}")
                    .chars()
                    .fold(String::new(), |mut s, ch| {
                        if ch.is_uppercase() && !s.is_empty() {
                            s.push('_');
                        }
                        s.push(ch.to_ascii_uppercase());
                        s
                    }),
            }
        })
        .collect();
    let mut bad = Vec::new();
    for sample in parse_metrics(&body) {
        for (key, value) in &sample.labels {
            let fine = match key.as_str() {
                "method" => METHODS.contains(&value.as_str()),
                "code" => codes.contains(value),
                "backend" => value == "loop",
                "pool" => value == "default",
                "le" => value == "+Inf" || value.parse::<f64>().is_ok(),
                _ => false,
            };
            if !fine {
                bad.push(format!("{} {key}={value:?}", sample.name));
            }
        }
    }
    assert!(
        bad.is_empty(),
        "label values outside the fixed sets: {bad:?}"
    );
    for secret in [
        volume.as_str(),
        snapshot.as_str(),
        "secretive",
        "forged",
        &d.root.display().to_string(),
        "/tmp",
    ] {
        assert!(!body.contains(secret), "/metrics shows {secret:?}");
    }
    let (status, health) = http(&d, "GET", "/healthz").await;
    assert_eq!((status, health.trim()), (200, "ok"));
    ok(d.identity().probe(ProbeRequest {}).await, "Probe");

    d.unpublish(&volume, &target).await;
    d.unstage(&volume).await;
    d.delete_snapshot(&snapshot).await;
    d.delete(&volume).await;
    d.finish().await;
}
