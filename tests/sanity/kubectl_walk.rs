//! The kubectl walk of `deploy/examples/README.md`, replayed over the driver's socket with
//! the requests the sidecars and kubelet send for it, on real loop devices and mounts.
//!
//! No Kubernetes API server runs here, so the test plays the sidecars' and kubelet's part:
//! each request carries the fields they fill in (external-provisioner with
//! `--extra-create-metadata` and topology, external-attacher, external-resizer,
//! external-snapshotter, kubelet's staging and publish paths and pod info). Two overlays:
//!
//! - **single-node**: the attacher publishes the volume, and the resizer calls
//!   ControllerExpandVolume before kubelet's NodeExpandVolume;
//! - **multi-node**: no attacher; the resizer talks to a controller-only ferrovol run with
//!   `--expansion node`, finds no controller expansion but node expansion, and only records
//!   the new size (its "trivial resizer"); kubelet's NodeExpandVolume on the node plugin
//!   (also `--expansion node`) grows the backing file and then the filesystem.
//!
//! The README's class is ext4, which the kernel grows while mounted only for a process
//! with `CAP_SYS_RESOURCE` (a privileged pod has it). Without it NodeExpandVolume still
//! grows the storage, answers FAILED_PRECONDITION naming the capability (kubelet retries),
//! and the filesystem grows at the next NodeStageVolume: the walk checks that on the
//! restored volume. The xfs class grows online everywhere, and is walked too.

use std::collections::HashMap;
use std::fs;
use std::path::PathBuf;

use ferrovol::csi::v1::controller_service_capability::rpc::Type as ControllerRpc;
use ferrovol::csi::v1::controller_service_capability::Type as ControllerCapType;
use ferrovol::csi::v1::node_service_capability::rpc::Type as NodeRpc;
use ferrovol::csi::v1::node_service_capability::Type as NodeCapType;
use ferrovol::csi::v1::plugin_capability::service::Type as ServiceType;
use ferrovol::csi::v1::plugin_capability::Type as PluginCapType;
use ferrovol::csi::v1::volume_capability::access_mode::Mode;
use ferrovol::csi::v1::*;
use sha2::{Digest, Sha256};
use tonic::Code;

use crate::content::{verify_block, verify_files, write_block, write_files};
use crate::harness::{Driver, Options};
use crate::host::{fs_total_bytes, has_effective_cap, mount_at, CAP_SYS_RESOURCE};
use crate::requests::*;

const GIB: i64 = 1 << 30;
const NODE: &str = "node-a";
const DRIVER: &str = "ferrovol.csi.dev";

/// Which deployment's sidecars the walk plays.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Overlay {
    /// One pod with every sidecar: attacher, controller expansion.
    SingleNode,
    /// A DaemonSet without attacher; expansion on the node.
    MultiNode,
}

/// A PVC as the walk's manifests define it, and the PV name the provisioner gives it.
struct Claim {
    /// `metadata.name` of the PVC.
    name: &'static str,
    /// The PVC's uid; the PV is `pvc-<uid>`.
    uid: &'static str,
}

impl Claim {
    fn pv(&self) -> String {
        format!("pvc-{}", self.uid)
    }
}

/// kubelet's directories, below the test's root.
struct Kubelet {
    /// Stands for `/var/lib/kubelet`.
    root: PathBuf,
}

impl Kubelet {
    fn new(driver: &Driver) -> Self {
        Kubelet {
            root: driver.root.join("kubelet"),
        }
    }

    /// `plugins/kubernetes.io/csi/<driver>/<sha256 of the volume handle>/globalmount`,
    /// made by kubelet before NodeStageVolume.
    fn staging(&self, volume_id: &str) -> PathBuf {
        let digest = Sha256::digest(volume_id.as_bytes());
        let hex: String = digest.iter().map(|b| format!("{b:02x}")).collect();
        let path = self
            .root
            .join("plugins/kubernetes.io/csi")
            .join(DRIVER)
            .join(hex)
            .join("globalmount");
        fs::create_dir_all(&path).expect("kubelet makes the staging dir");
        path
    }

    /// `pods/<uid>/volumes/kubernetes.io~csi/<pv>/mount`: kubelet makes the parent, the
    /// driver the target itself.
    fn pod_target(&self, pod_uid: &str, pv: &str) -> PathBuf {
        let dir = self
            .root
            .join("pods")
            .join(pod_uid)
            .join("volumes/kubernetes.io~csi")
            .join(pv);
        fs::create_dir_all(&dir).expect("kubelet makes the volume dir");
        dir.join("mount")
    }

    /// `plugins/kubernetes.io/csi/volumeDevices/staging/<pv>` for a block volume.
    fn block_staging(&self, pv: &str) -> PathBuf {
        let path = self
            .root
            .join("plugins/kubernetes.io/csi/volumeDevices/staging")
            .join(pv);
        fs::create_dir_all(&path).expect("kubelet makes the block staging dir");
        path
    }

    /// `plugins/kubernetes.io/csi/volumeDevices/publish/<pv>/<pod uid>`: a file the driver
    /// makes and binds the device onto.
    fn block_target(&self, pv: &str, pod_uid: &str) -> PathBuf {
        let dir = self
            .root
            .join("plugins/kubernetes.io/csi/volumeDevices/publish")
            .join(pv);
        fs::create_dir_all(&dir).expect("kubelet makes the block publish dir");
        dir.join(pod_uid)
    }
}

/// The access mode external-provisioner sends for a ReadWriteOnce PVC: SINGLE_NODE_MULTI_WRITER
/// when the controller offers that capability, SINGLE_NODE_WRITER otherwise.
async fn rwo_mode(driver: &Driver) -> Mode {
    let caps = ok(
        driver
            .controller()
            .controller_get_capabilities(ControllerGetCapabilitiesRequest {})
            .await,
        "ControllerGetCapabilities",
    );
    if controller_rpcs(&caps).contains(&ControllerRpc::SingleNodeMultiWriter) {
        Mode::SingleNodeMultiWriter
    } else {
        Mode::SingleNodeWriter
    }
}

fn controller_rpcs(caps: &ControllerGetCapabilitiesResponse) -> Vec<ControllerRpc> {
    caps.capabilities
        .iter()
        .filter_map(|c| match &c.r#type {
            Some(ControllerCapType::Rpc(rpc)) => ControllerRpc::try_from(rpc.r#type).ok(),
            None => None,
        })
        .collect()
}

fn node_rpcs(caps: &NodeGetCapabilitiesResponse) -> Vec<NodeRpc> {
    caps.capabilities
        .iter()
        .filter_map(|c| match &c.r#type {
            Some(NodeCapType::Rpc(rpc)) => NodeRpc::try_from(rpc.r#type).ok(),
            None => None,
        })
        .collect()
}

fn has_controller_service(caps: &GetPluginCapabilitiesResponse) -> bool {
    caps.capabilities.iter().any(|c| {
        matches!(&c.r#type, Some(PluginCapType::Service(s)) if s.r#type == ServiceType::ControllerService as i32)
    })
}

/// The CreateVolume external-provisioner sends for `claim` with `--extra-create-metadata`
/// and the Topology feature, once the scheduler picked [`NODE`] (WaitForFirstConsumer).
/// The StorageClass says `csi.storage.k8s.io/fstype: xfs` (the provisioner takes it out of
/// the parameters and puts it in the capability) and `backend: loop`.
fn provision(
    claim: &Claim,
    bytes: i64,
    cap: VolumeCapability,
    source: Option<VolumeContentSource>,
) -> CreateVolumeRequest {
    let here = node_topology(NODE);
    CreateVolumeRequest {
        name: claim.pv(),
        capacity_range: range(bytes, 0),
        volume_capabilities: vec![cap],
        parameters: HashMap::from([
            ("backend".to_owned(), "loop".to_owned()),
            (
                "csi.storage.k8s.io/pvc/name".to_owned(),
                claim.name.to_owned(),
            ),
            (
                "csi.storage.k8s.io/pvc/namespace".to_owned(),
                "default".to_owned(),
            ),
            ("csi.storage.k8s.io/pv/name".to_owned(), claim.pv()),
        ]),
        volume_content_source: source,
        accessibility_requirements: Some(TopologyRequirement {
            requisite: vec![here.clone()],
            preferred: vec![here],
        }),
        ..Default::default()
    }
}

/// The volume context kubelet adds to NodePublishVolume when the CSIDriver object says
/// `podInfoOnMount: true`.
fn with_pod_info(
    context: &HashMap<String, String>,
    pod: &str,
    uid: &str,
) -> HashMap<String, String> {
    let mut context = context.clone();
    for (key, value) in [
        ("csi.storage.k8s.io/pod.name", pod),
        ("csi.storage.k8s.io/pod.namespace", "default"),
        ("csi.storage.k8s.io/pod.uid", uid),
        ("csi.storage.k8s.io/serviceAccount.name", "default"),
        ("csi.storage.k8s.io/ephemeral", "false"),
    ] {
        context.insert(key.to_owned(), value.to_owned());
    }
    context
}

/// A volume staged and published into one pod, as kubelet left it.
struct Mounted {
    volume: Volume,
    cap: VolumeCapability,
    staging: PathBuf,
    target: PathBuf,
    publish_context: HashMap<String, String>,
}

/// The attacher's ControllerPublishVolume (single-node overlay only), then kubelet's
/// NodeStageVolume and NodePublishVolume for pod `pod`.
async fn attach_and_mount(
    driver: &Driver,
    kubelet: &Kubelet,
    overlay: Overlay,
    volume: Volume,
    cap: VolumeCapability,
    pod: (&str, &str),
) -> Mounted {
    let publish_context = if overlay == Overlay::SingleNode {
        ok(
            driver
                .controller()
                .controller_publish_volume(ControllerPublishVolumeRequest {
                    volume_id: volume.volume_id.clone(),
                    node_id: NODE.to_owned(),
                    volume_capability: Some(cap.clone()),
                    readonly: false,
                    volume_context: volume.volume_context.clone(),
                    ..Default::default()
                })
                .await,
            "ControllerPublishVolume (external-attacher)",
        )
        .publish_context
    } else {
        HashMap::new()
    };
    let node_caps = ok(
        driver
            .node()
            .node_get_capabilities(NodeGetCapabilitiesRequest {})
            .await,
        "NodeGetCapabilities (kubelet)",
    );
    assert!(node_rpcs(&node_caps).contains(&NodeRpc::StageUnstageVolume));
    let block = matches!(
        cap.access_type,
        Some(volume_capability::AccessType::Block(_))
    );
    let (pod_name, pod_uid) = pod;
    let (staging, target) = if block {
        (
            kubelet.block_staging(&volume.volume_id),
            kubelet.block_target(&volume.volume_id, pod_uid),
        )
    } else {
        (
            kubelet.staging(&volume.volume_id),
            kubelet.pod_target(pod_uid, &volume.volume_id),
        )
    };
    ok(
        driver
            .node()
            .node_stage_volume(NodeStageVolumeRequest {
                volume_id: volume.volume_id.clone(),
                publish_context: publish_context.clone(),
                staging_target_path: staging.display().to_string(),
                volume_capability: Some(cap.clone()),
                volume_context: volume.volume_context.clone(),
                ..Default::default()
            })
            .await,
        "NodeStageVolume (kubelet)",
    );
    ok(
        driver
            .node()
            .node_publish_volume(NodePublishVolumeRequest {
                volume_id: volume.volume_id.clone(),
                publish_context: publish_context.clone(),
                staging_target_path: staging.display().to_string(),
                target_path: target.display().to_string(),
                volume_capability: Some(cap.clone()),
                readonly: false,
                volume_context: with_pod_info(&volume.volume_context, pod_name, pod_uid),
                ..Default::default()
            })
            .await,
        "NodePublishVolume (kubelet)",
    );
    assert!(
        mount_at(&target).is_some(),
        "the pod's volume is mounted or bound"
    );
    Mounted {
        volume,
        cap,
        staging,
        target,
        publish_context,
    }
}

/// Pod deleted, then PVC deleted: kubelet's NodeUnpublishVolume and NodeUnstageVolume, the
/// attacher's ControllerUnpublishVolume, the provisioner's DeleteVolume.
async fn unmount_detach_delete(driver: &Driver, overlay: Overlay, mounted: Mounted) {
    let id = mounted.volume.volume_id.clone();
    ok(
        driver
            .node()
            .node_unpublish_volume(NodeUnpublishVolumeRequest {
                volume_id: id.clone(),
                target_path: mounted.target.display().to_string(),
            })
            .await,
        "NodeUnpublishVolume (kubelet)",
    );
    ok(
        driver
            .node()
            .node_unstage_volume(NodeUnstageVolumeRequest {
                volume_id: id.clone(),
                staging_target_path: mounted.staging.display().to_string(),
            })
            .await,
        "NodeUnstageVolume (kubelet)",
    );
    if overlay == Overlay::SingleNode {
        ok(
            driver
                .controller()
                .controller_unpublish_volume(ControllerUnpublishVolumeRequest {
                    volume_id: id.clone(),
                    node_id: NODE.to_owned(),
                    ..Default::default()
                })
                .await,
            "ControllerUnpublishVolume (external-attacher)",
        );
    }
    ok(
        driver
            .controller()
            .delete_volume(DeleteVolumeRequest {
                volume_id: id,
                ..Default::default()
            })
            .await,
        "DeleteVolume (external-provisioner)",
    );
}

/// `kubectl patch pvc data` to 2Gi, as each overlay's resizer and kubelet carry it out.
async fn expand(driver: &Driver, overlay: Overlay, mounted: &Mounted, bytes: i64) {
    let id = &mounted.volume.volume_id;
    match overlay {
        Overlay::SingleNode => {
            let caps = ok(
                driver
                    .controller()
                    .controller_get_capabilities(ControllerGetCapabilitiesRequest {})
                    .await,
                "ControllerGetCapabilities (external-resizer)",
            );
            assert!(controller_rpcs(&caps).contains(&ControllerRpc::ExpandVolume));
            let grown = ok(
                driver
                    .controller()
                    .controller_expand_volume(ControllerExpandVolumeRequest {
                        volume_id: id.clone(),
                        capacity_range: range(bytes, 0),
                        volume_capability: Some(mounted.cap.clone()),
                        ..Default::default()
                    })
                    .await,
                "ControllerExpandVolume (external-resizer)",
            );
            assert!(grown.capacity_bytes >= bytes);
            assert!(grown.node_expansion_required);
        }
        Overlay::MultiNode => {
            // The controller Deployment: csi-resizer beside `ferrovol --mode controller
            // --expansion node`. Its probes at start decide the trivial resizer.
            let resizer_side = Driver::start_with(Options {
                node_id: "controller".to_owned(),
                extra_args: ["--mode", "controller", "--expansion", "node"]
                    .map(str::to_owned)
                    .to_vec(),
                ..Options::default()
            })
            .await;
            let plugin = ok(
                resizer_side
                    .identity()
                    .get_plugin_capabilities(GetPluginCapabilitiesRequest {})
                    .await,
                "GetPluginCapabilities (external-resizer)",
            );
            assert!(
                has_controller_service(&plugin),
                "the resizer needs CONTROLLER_SERVICE"
            );
            let controller = ok(
                resizer_side
                    .controller()
                    .controller_get_capabilities(ControllerGetCapabilitiesRequest {})
                    .await,
                "ControllerGetCapabilities (external-resizer)",
            );
            assert!(
                !controller_rpcs(&controller).contains(&ControllerRpc::ExpandVolume),
                "with --expansion node the controller must not offer EXPAND_VOLUME"
            );
            let node = ok(
                resizer_side
                    .node()
                    .node_get_capabilities(NodeGetCapabilitiesRequest {})
                    .await,
                "NodeGetCapabilities (external-resizer)",
            );
            assert_eq!(node_rpcs(&node), vec![NodeRpc::ExpandVolume]);
            // It serves no node operation: those belong to the node plugins.
            expect_code(
                resizer_side
                    .node()
                    .node_stage_volume(NodeStageVolumeRequest::default())
                    .await,
                Code::Unimplemented,
                "NodeStageVolume on the controller-only process",
            );
            resizer_side.finish().await;
            // The node plugin refuses controller expansion outright.
            expect_code(
                driver
                    .controller()
                    .controller_expand_volume(ControllerExpandVolumeRequest {
                        volume_id: id.clone(),
                        capacity_range: range(bytes, 0),
                        ..Default::default()
                    })
                    .await,
                Code::Unimplemented,
                "ControllerExpandVolume with --expansion node",
            );
            // A NodeExpandVolume naming a path that is not this volume's grows nothing.
            let elsewhere = driver.root.join("kubelet/pods/not-a-mount");
            fs::create_dir_all(&elsewhere).expect("a plain dir");
            expect_code(
                driver
                    .node()
                    .node_expand_volume(NodeExpandVolumeRequest {
                        volume_id: id.clone(),
                        volume_path: elsewhere.display().to_string(),
                        capacity_range: range(bytes * 2, 0),
                        ..Default::default()
                    })
                    .await,
                Code::NotFound,
                "NodeExpandVolume of a path that is no mount of the volume",
            );
            assert_eq!(
                fs::metadata(driver.backing_file(id))
                    .expect("backing file")
                    .len(),
                u64::try_from(GIB).expect("positive"),
                "a refused NodeExpandVolume grew the storage"
            );
            // The trivial resizer now only updates the PV; the node plugin advertises
            // controller expansion nowhere either.
            let caps = ok(
                driver
                    .controller()
                    .controller_get_capabilities(ControllerGetCapabilitiesRequest {})
                    .await,
                "ControllerGetCapabilities (node plugin)",
            );
            assert!(!controller_rpcs(&caps).contains(&ControllerRpc::ExpandVolume));
        }
    }
    // kubelet sees the PV bigger than the mounted volume and calls NodeExpandVolume.
    let node_caps = ok(
        driver
            .node()
            .node_get_capabilities(NodeGetCapabilitiesRequest {})
            .await,
        "NodeGetCapabilities (kubelet)",
    );
    assert!(node_rpcs(&node_caps).contains(&NodeRpc::ExpandVolume));
    let answer = driver
        .node()
        .node_expand_volume(NodeExpandVolumeRequest {
            volume_id: id.clone(),
            volume_path: mounted.target.display().to_string(),
            capacity_range: range(bytes, 0),
            staging_target_path: mounted.staging.display().to_string(),
            volume_capability: Some(mounted.cap.clone()),
            ..Default::default()
        })
        .await;
    let online = fs_type_of(&mounted.cap) != "ext4" || has_effective_cap(CAP_SYS_RESOURCE);
    if online {
        let grown = ok(answer, "NodeExpandVolume (kubelet)");
        assert!(
            grown.capacity_bytes >= bytes,
            "NodeExpandVolume answered {}",
            grown.capacity_bytes
        );
    } else {
        let status = expect_code(
            answer,
            Code::FailedPrecondition,
            "NodeExpandVolume of a mounted ext4 without CAP_SYS_RESOURCE",
        );
        assert!(
            status.message().contains("CAP_SYS_RESOURCE"),
            "{}",
            status.message()
        );
    }
    let seen = ok(
        driver
            .controller()
            .controller_get_volume(ControllerGetVolumeRequest {
                volume_id: id.clone(),
            })
            .await,
        "ControllerGetVolume",
    );
    assert_eq!(
        seen.volume.map(|v| v.capacity_bytes),
        Some(bytes),
        "the volume record follows the growth"
    );
    if online {
        let fs_bytes = fs_total_bytes(&mounted.target);
        assert!(
            fs_bytes > u64::try_from(bytes * 9 / 10).expect("positive"),
            "the pod's filesystem grew online: {fs_bytes} bytes"
        );
    }
}

fn fs_type_of(cap: &VolumeCapability) -> &str {
    match &cap.access_type {
        Some(volume_capability::AccessType::Mount(m)) => &m.fs_type,
        _ => "",
    }
}

async fn walk(overlay: Overlay, fs_type: &str) {
    let driver = Driver::start_with(Options {
        node_id: NODE.to_owned(),
        extra_args: match overlay {
            Overlay::SingleNode => Vec::new(),
            Overlay::MultiNode => vec!["--expansion".to_owned(), "node".to_owned()],
        },
        ..Options::default()
    })
    .await;
    let kubelet = Kubelet::new(&driver);

    // The sidecars and the registrar start by asking who the driver is.
    let info = ok(
        driver
            .identity()
            .get_plugin_info(GetPluginInfoRequest {})
            .await,
        "GetPluginInfo",
    );
    assert_eq!(info.name, DRIVER, "StorageClass provisioner = driver name");
    let ready = ok(driver.identity().probe(ProbeRequest {}).await, "Probe");
    assert_eq!(ready.ready, Some(true));
    let node_info = ok(
        driver.node().node_get_info(NodeGetInfoRequest {}).await,
        "NodeGetInfo (kubelet, at registration)",
    );
    assert_eq!(node_info.node_id, NODE);
    assert_eq!(node_info.accessible_topology, Some(node_topology(NODE)));

    // Capacity tracking asks about every class: one for another backend has no room here.
    for (backend, has_room) in [("loop", true), ("lvm", false)] {
        let capacity = ok(
            driver
                .controller()
                .get_capacity(GetCapacityRequest {
                    parameters: HashMap::from([("backend".to_owned(), backend.to_owned())]),
                    accessible_topology: Some(node_topology(NODE)),
                    ..Default::default()
                })
                .await,
            "GetCapacity (external-provisioner)",
        );
        assert_eq!(
            capacity.available_capacity > 0,
            has_room,
            "backend {backend}"
        );
    }

    // kubectl apply -f pvc.yaml -f pod.yaml
    let mode = rwo_mode(&driver).await;
    let cap = mount_cap_mode(fs_type, mode);
    let data = Claim {
        name: "data",
        uid: "0c1d6a2e-5f0b-4c1e-9a57-1b2f3e4d5a60",
    };
    let volume = ok(
        driver
            .controller()
            .create_volume(provision(&data, GIB, cap.clone(), None))
            .await,
        "CreateVolume (external-provisioner)",
    )
    .volume
    .expect("a volume");
    assert_eq!(volume.capacity_bytes, GIB);
    assert_eq!(volume.accessible_topology, vec![node_topology(NODE)]);
    let record = fs::read_to_string(
        driver
            .state
            .join("volumes")
            .join(format!("{}.json", volume.volume_id)),
    )
    .expect("the volume record");
    let record: serde_json::Value = serde_json::from_str(&record).expect("record is JSON");
    assert_eq!(record["parameters"]["csi.storage.k8s.io/pvc/name"], "data");
    assert_eq!(
        record["parameters"]["csi.storage.k8s.io/pvc/namespace"],
        "default"
    );
    assert_eq!(
        record["parameters"]["csi.storage.k8s.io/pv/name"],
        data.pv().as_str()
    );

    let writer = ("writer", "7a0f3b44-1c2d-4e5f-8a9b-0c1d2e3f4a5b");
    let mounted = attach_and_mount(&driver, &kubelet, overlay, volume, cap.clone(), writer).await;
    write_files(&mounted.target, 41);

    // kubectl patch pvc data -p '{"spec":{"resources":{"requests":{"storage":"2Gi"}}}}'
    expand(&driver, overlay, &mounted, 2 * GIB).await;
    verify_files(&mounted.target, 41);
    assert_eq!(
        fs::metadata(driver.backing_file(&mounted.volume.volume_id))
            .expect("backing file")
            .len(),
        2 << 30
    );

    // kubectl apply -f snapshot.yaml
    let snapshot = ok(
        driver
            .controller()
            .create_snapshot(CreateSnapshotRequest {
                source_volume_id: mounted.volume.volume_id.clone(),
                name: "snapshot-5e6f7a8b-9c0d-4e1f-a2b3-c4d5e6f7a8b9".to_owned(),
                parameters: HashMap::from([
                    (
                        "csi.storage.k8s.io/volumesnapshot/name".to_owned(),
                        "data-snap".to_owned(),
                    ),
                    (
                        "csi.storage.k8s.io/volumesnapshot/namespace".to_owned(),
                        "default".to_owned(),
                    ),
                    (
                        "csi.storage.k8s.io/volumesnapshotcontent/name".to_owned(),
                        "snapcontent-5e6f7a8b-9c0d-4e1f-a2b3-c4d5e6f7a8b9".to_owned(),
                    ),
                ]),
                ..Default::default()
            })
            .await,
        "CreateSnapshot (external-snapshotter)",
    )
    .snapshot
    .expect("a snapshot");
    assert!(snapshot.ready_to_use);
    assert_eq!(snapshot.size_bytes, 2 * GIB);

    // kubectl apply -f restore-pvc.yaml -f restore-pod.yaml
    let restored_claim = Claim {
        name: "data-restore",
        uid: "9d8c7b6a-5f4e-4d3c-8b2a-1f0e9d8c7b6a",
    };
    let restored = ok(
        driver
            .controller()
            .create_volume(provision(
                &restored_claim,
                2 * GIB,
                cap.clone(),
                from_snapshot(&snapshot.snapshot_id),
            ))
            .await,
        "CreateVolume from the snapshot (external-provisioner)",
    )
    .volume
    .expect("a volume");
    let reader = ("reader", "3e4f5a6b-7c8d-4e9f-a0b1-c2d3e4f5a6b7");
    let restored = attach_and_mount(&driver, &kubelet, overlay, restored, cap, reader).await;
    verify_files(&restored.target, 41);
    assert!(restored.publish_context.len() <= 1);
    // The restore holds the whole grown filesystem, whether it grew online or at stage.
    let restored_fs = fs_total_bytes(&restored.target);
    assert!(
        restored_fs > u64::try_from(2 * GIB * 9 / 10).expect("positive"),
        "the restored filesystem spans the grown volume: {restored_fs} bytes"
    );

    // kubectl delete pod/reader pvc/data-restore pod/writer pvc/data volumesnapshot/data-snap
    unmount_detach_delete(&driver, overlay, restored).await;
    unmount_detach_delete(&driver, overlay, mounted).await;
    ok(
        driver
            .controller()
            .delete_snapshot(DeleteSnapshotRequest {
                snapshot_id: snapshot.snapshot_id,
                ..Default::default()
            })
            .await,
        "DeleteSnapshot (external-snapshotter)",
    );

    // kubectl apply -f block-pvc.yaml -f block-pod.yaml, then delete both.
    block_walk(&driver, &kubelet, overlay, mode).await;

    assert!(
        driver.pool_images().is_empty(),
        "every backing file is gone"
    );
    driver.finish().await;
}

/// The raw block PVC and its pod: `volumeMode: Block`, `volumeDevices` in the pod.
async fn block_walk(driver: &Driver, kubelet: &Kubelet, overlay: Overlay, mode: Mode) {
    let cap = block_cap_mode(mode);
    let claim = Claim {
        name: "raw",
        uid: "b1c2d3e4-f5a6-4b7c-8d9e-0f1a2b3c4d5e",
    };
    let volume = ok(
        driver
            .controller()
            .create_volume(provision(&claim, 256 << 20, cap.clone(), None))
            .await,
        "CreateVolume block (external-provisioner)",
    )
    .volume
    .expect("a volume");
    let pod = ("raw-user", "c2d3e4f5-a6b7-4c8d-9e0f-1a2b3c4d5e6f");
    let mounted = attach_and_mount(driver, kubelet, overlay, volume, cap, pod).await;
    write_block(&mounted.target, 77);
    verify_block(&mounted.target, 77);
    unmount_detach_delete(driver, overlay, mounted).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn single_node_overlay_walk() {
    walk(Overlay::SingleNode, "ext4").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn multi_node_overlay_walk_expands_on_the_node() {
    walk(Overlay::MultiNode, "ext4").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn multi_node_overlay_walk_xfs_grows_online() {
    walk(Overlay::MultiNode, "xfs").await;
}
