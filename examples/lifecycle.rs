//! Walks one volume through its life over CSI, the way Kubernetes would drive it:
//! CreateVolume, ControllerPublishVolume, NodeStageVolume, NodePublishVolume, a file
//! written through the published path, NodeGetVolumeStats, then everything undone.
//!
//! ```text
//! cargo run --example lifecycle -- unix:///var/lib/ferrovol/csi.sock /tmp/ferrovol-walk
//! ```
//! The second argument is a scratch directory for the staging and target paths. Node
//! steps need root.

use std::path::PathBuf;

use ferrovol::csi::v1::controller_client::ControllerClient;
use ferrovol::csi::v1::identity_client::IdentityClient;
use ferrovol::csi::v1::node_client::NodeClient;
use ferrovol::csi::v1::volume_capability::{
    access_mode::Mode, AccessMode, AccessType, MountVolume,
};
use ferrovol::csi::v1::*;
use hyper_util::rt::TokioIo;
use tonic::transport::{Channel, Endpoint};

async fn connect(endpoint: &str) -> Result<Channel, Box<dyn std::error::Error>> {
    if let Some(path) = endpoint.strip_prefix("unix://") {
        let path = PathBuf::from(path);
        let channel = Endpoint::try_from("http://[::]:50051")?
            .connect_with_connector(tower::service_fn(move |_| {
                let path = path.clone();
                async move {
                    Ok::<_, std::io::Error>(TokioIo::new(
                        tokio::net::UnixStream::connect(path).await?,
                    ))
                }
            }))
            .await?;
        return Ok(channel);
    }
    let address = endpoint.replace("tcp://", "http://");
    Ok(Endpoint::try_from(address)?.connect().await?)
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let endpoint = args
        .next()
        .unwrap_or_else(|| "unix:///var/lib/ferrovol/csi.sock".into());
    let scratch = PathBuf::from(args.next().unwrap_or_else(|| "/tmp/ferrovol-walk".into()));
    let channel = connect(&endpoint).await?;
    let mut identity = IdentityClient::new(channel.clone());
    let mut controller = ControllerClient::new(channel.clone());
    let mut node = NodeClient::new(channel);

    let info = identity
        .get_plugin_info(GetPluginInfoRequest {})
        .await?
        .into_inner();
    println!("GetPluginInfo: {} {}", info.name, info.vendor_version);
    let node_info = node
        .node_get_info(NodeGetInfoRequest {})
        .await?
        .into_inner();
    println!(
        "NodeGetInfo: node {} topology {:?}",
        node_info.node_id, node_info.accessible_topology
    );

    let capability = VolumeCapability {
        access_mode: Some(AccessMode {
            mode: Mode::SingleNodeWriter as i32,
        }),
        access_type: Some(AccessType::Mount(MountVolume {
            fs_type: "ext4".into(),
            ..Default::default()
        })),
    };
    let volume = controller
        .create_volume(CreateVolumeRequest {
            name: "pvc-walkthrough".into(),
            capacity_range: Some(CapacityRange {
                required_bytes: 64 << 20,
                limit_bytes: 0,
            }),
            volume_capabilities: vec![capability.clone()],
            parameters: [(
                "csi.storage.k8s.io/pvc/name".to_owned(),
                "walkthrough".to_owned(),
            )]
            .into(),
            accessibility_requirements: node_info.accessible_topology.clone().map(|t| {
                TopologyRequirement {
                    requisite: vec![t.clone()],
                    preferred: vec![t],
                }
            }),
            ..Default::default()
        })
        .await?
        .into_inner()
        .volume
        .ok_or("CreateVolume returned no volume")?;
    let id = volume.volume_id.clone();
    println!("CreateVolume: {id}, {} bytes", volume.capacity_bytes);

    controller
        .controller_publish_volume(ControllerPublishVolumeRequest {
            volume_id: id.clone(),
            node_id: node_info.node_id.clone(),
            volume_capability: Some(capability.clone()),
            ..Default::default()
        })
        .await?;
    println!(
        "ControllerPublishVolume: published to {}",
        node_info.node_id
    );

    let staging = scratch.join("staging");
    let target = scratch.join("target");
    std::fs::create_dir_all(&staging)?;
    node.node_stage_volume(NodeStageVolumeRequest {
        volume_id: id.clone(),
        staging_target_path: staging.display().to_string(),
        volume_capability: Some(capability.clone()),
        ..Default::default()
    })
    .await?;
    println!(
        "NodeStageVolume: formatted and mounted at {}",
        staging.display()
    );
    node.node_publish_volume(NodePublishVolumeRequest {
        volume_id: id.clone(),
        staging_target_path: staging.display().to_string(),
        target_path: target.display().to_string(),
        volume_capability: Some(capability.clone()),
        ..Default::default()
    })
    .await?;
    println!("NodePublishVolume: bind-mounted at {}", target.display());

    std::fs::write(target.join("hello.txt"), b"hello from a ferrovol volume\n")?;
    let stats = node
        .node_get_volume_stats(NodeGetVolumeStatsRequest {
            volume_id: id.clone(),
            volume_path: target.display().to_string(),
            staging_target_path: String::new(),
        })
        .await?
        .into_inner();
    for usage in &stats.usage {
        println!(
            "NodeGetVolumeStats: unit {} total {} used {} available {}",
            usage.unit, usage.total, usage.used, usage.available
        );
    }

    node.node_unpublish_volume(NodeUnpublishVolumeRequest {
        volume_id: id.clone(),
        target_path: target.display().to_string(),
    })
    .await?;
    println!("NodeUnpublishVolume: done");
    node.node_unstage_volume(NodeUnstageVolumeRequest {
        volume_id: id.clone(),
        staging_target_path: staging.display().to_string(),
    })
    .await?;
    println!("NodeUnstageVolume: unmounted and loop device detached");
    controller
        .controller_unpublish_volume(ControllerUnpublishVolumeRequest {
            volume_id: id.clone(),
            node_id: node_info.node_id,
            ..Default::default()
        })
        .await?;
    println!("ControllerUnpublishVolume: done");
    controller
        .delete_volume(DeleteVolumeRequest {
            volume_id: id,
            ..Default::default()
        })
        .await?;
    println!("DeleteVolume: backing file removed");
    Ok(())
}
