//! Helpers that `scripts/bench.sh` runs around `ferrovol bench`: states that a benchmark
//! measures in (a volume left published for fio, many volumes left present for the
//! memory figure) and the start-up time to the first successful Probe.
//!
//! ```text
//! bench_tools up ENDPOINT NAME SIZE FS STAGING TARGET   # create, stage, publish; prints the id
//! bench_tools down ENDPOINT VOLUME_ID STAGING TARGET    # unpublish, unstage, delete
//! bench_tools fill ENDPOINT PREFIX COUNT SIZE           # create COUNT volumes PREFIX-0..
//! bench_tools drain ENDPOINT PREFIX COUNT               # delete them again
//! bench_tools first-probe ENDPOINT -- DRIVER ARGS...    # start the driver, time the first ready Probe
//! ```

use std::process::{Command, ExitCode, Stdio};
use std::time::{Duration, Instant};

use ferrovol::bench::{connect, parse_size, Clients};
use ferrovol::csi::v1::volume_capability::{
    access_mode::Mode, AccessMode, AccessType, MountVolume,
};
use ferrovol::csi::v1::*;

type Failure = Box<dyn std::error::Error>;

fn capability(fs_type: &str) -> VolumeCapability {
    VolumeCapability {
        access_mode: Some(AccessMode {
            mode: Mode::SingleNodeWriter as i32,
        }),
        access_type: Some(AccessType::Mount(MountVolume {
            fs_type: fs_type.to_owned(),
            ..Default::default()
        })),
    }
}

fn create_request(name: &str, size: u64, fs_type: &str) -> CreateVolumeRequest {
    CreateVolumeRequest {
        name: name.to_owned(),
        capacity_range: Some(CapacityRange {
            required_bytes: i64::try_from(size).unwrap_or(i64::MAX),
            limit_bytes: 0,
        }),
        volume_capabilities: vec![capability(fs_type)],
        ..Default::default()
    }
}

async fn clients(endpoint: &str) -> Result<Clients, Failure> {
    Ok(connect(endpoint, Duration::from_secs(300)).await?)
}

async fn up(args: &[String]) -> Result<(), Failure> {
    let [endpoint, name, size, fs, staging, target] = args else {
        return Err("up ENDPOINT NAME SIZE FS STAGING TARGET".into());
    };
    let mut c = clients(endpoint).await?;
    let size = parse_size(size)?;
    let volume = c
        .controller
        .create_volume(create_request(name, size, fs))
        .await?
        .into_inner()
        .volume
        .ok_or("CreateVolume returned no volume")?;
    std::fs::create_dir_all(staging)?;
    c.node
        .node_stage_volume(NodeStageVolumeRequest {
            volume_id: volume.volume_id.clone(),
            staging_target_path: staging.clone(),
            volume_capability: Some(capability(fs)),
            ..Default::default()
        })
        .await?;
    c.node
        .node_publish_volume(NodePublishVolumeRequest {
            volume_id: volume.volume_id.clone(),
            staging_target_path: staging.clone(),
            target_path: target.clone(),
            volume_capability: Some(capability(fs)),
            ..Default::default()
        })
        .await?;
    println!("{}", volume.volume_id);
    Ok(())
}

async fn down(args: &[String]) -> Result<(), Failure> {
    let [endpoint, id, staging, target] = args else {
        return Err("down ENDPOINT VOLUME_ID STAGING TARGET".into());
    };
    let mut c = clients(endpoint).await?;
    c.node
        .node_unpublish_volume(NodeUnpublishVolumeRequest {
            volume_id: id.clone(),
            target_path: target.clone(),
        })
        .await?;
    c.node
        .node_unstage_volume(NodeUnstageVolumeRequest {
            volume_id: id.clone(),
            staging_target_path: staging.clone(),
        })
        .await?;
    c.controller
        .delete_volume(DeleteVolumeRequest {
            volume_id: id.clone(),
            ..Default::default()
        })
        .await?;
    let _ = std::fs::remove_dir(staging);
    Ok(())
}

async fn fill(args: &[String]) -> Result<(), Failure> {
    let [endpoint, prefix, count, size] = args else {
        return Err("fill ENDPOINT PREFIX COUNT SIZE".into());
    };
    let mut c = clients(endpoint).await?;
    let size = parse_size(size)?;
    for i in 0..count.parse::<u64>()? {
        c.controller
            .create_volume(create_request(&format!("{prefix}-{i}"), size, "ext4"))
            .await?;
    }
    Ok(())
}

async fn drain(args: &[String]) -> Result<(), Failure> {
    let [endpoint, prefix, count] = args else {
        return Err("drain ENDPOINT PREFIX COUNT".into());
    };
    let mut c = clients(endpoint).await?;
    for i in 0..count.parse::<u64>()? {
        // The id of a name is not known to a generic client: create is idempotent and
        // answers with the existing volume.
        let volume = c
            .controller
            .create_volume(create_request(&format!("{prefix}-{i}"), 1, "ext4"))
            .await;
        if let Ok(resp) = volume {
            if let Some(v) = resp.into_inner().volume {
                c.controller
                    .delete_volume(DeleteVolumeRequest {
                        volume_id: v.volume_id,
                        ..Default::default()
                    })
                    .await?;
            }
        }
    }
    Ok(())
}

async fn first_probe(args: &[String]) -> Result<(), Failure> {
    let [endpoint, dashdash, driver @ ..] = args else {
        return Err("first-probe ENDPOINT -- DRIVER ARGS...".into());
    };
    if dashdash != "--" || driver.is_empty() {
        return Err("first-probe ENDPOINT -- DRIVER ARGS...".into());
    }
    let started = Instant::now();
    let mut child = Command::new(&driver[0])
        .args(&driver[1..])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()?;
    let deadline = started + Duration::from_secs(10);
    let ready = loop {
        if let Ok(mut c) = connect(endpoint, Duration::from_secs(1)).await {
            if let Ok(resp) = c.identity.probe(ProbeRequest {}).await {
                if resp.into_inner().ready == Some(true) {
                    break Some(started.elapsed());
                }
            }
        }
        if Instant::now() > deadline || child.try_wait()?.is_some() {
            break None;
        }
        tokio::time::sleep(Duration::from_micros(200)).await;
    };
    // Stop the driver the way kubelet does, and wait for it.
    if let Ok(pid) = i32::try_from(child.id()) {
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(pid),
            nix::sys::signal::Signal::SIGTERM,
        );
    }
    // Waiting asynchronously lets the runtime close the client's connection, which the
    // driver's graceful shutdown waits for.
    while child.try_wait()?.is_none() {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    match ready {
        Some(took) => {
            println!("{:.3}", took.as_secs_f64() * 1000.0);
            Ok(())
        }
        None => Err("the driver never answered Probe with ready=true".into()),
    }
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let Some((command, rest)) = args.split_first() else {
        eprintln!("usage: bench_tools up|down|fill|drain|first-probe ...");
        return ExitCode::from(2);
    };
    let result = match command.as_str() {
        "up" => up(rest).await,
        "down" => down(rest).await,
        "fill" => fill(rest).await,
        "drain" => drain(rest).await,
        "first-probe" => first_probe(rest).await,
        other => Err(format!("unknown command {other:?}").into()),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("bench_tools {command}: {e}");
            ExitCode::FAILURE
        }
    }
}
