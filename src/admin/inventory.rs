//! `ferrovol volumes list`, `ferrovol volumes show ID` and `ferrovol snapshots list`: the
//! driver's volumes and snapshots from its records, with the PVC and VolumeSnapshot names
//! the sidecars passed, sizes, the node, and the staged and published state on this node.

use std::path::PathBuf;

use serde::Serialize;

use super::{human_bytes, json, table, utc_time, Output, Paths, Records, Report};
use crate::backend::loopfile::backing_file_in;
use crate::error::{Error, Result};
use crate::ids::VolumeId;
use crate::os::loopdev;
use crate::store::{ContentSource, StagedAccess, VolumeRecord};

const PVC_NAME: &str = "csi.storage.k8s.io/pvc/name";
const PVC_NAMESPACE: &str = "csi.storage.k8s.io/pvc/namespace";
const PV_NAME: &str = "csi.storage.k8s.io/pv/name";
const SNAPSHOT_NAME: &str = "csi.storage.k8s.io/volumesnapshot/name";
const SNAPSHOT_NAMESPACE: &str = "csi.storage.k8s.io/volumesnapshot/namespace";

/// One volume as the operator sees it.
#[derive(Debug, Serialize)]
pub struct VolumeView {
    /// The volume id (the PV's volume handle).
    pub volume_id: String,
    /// The CSI name (the PV name, from external-provisioner); empty when only this node's
    /// stage record knows the volume.
    pub name: String,
    /// `namespace/name` of the PVC, when the provisioner passed it.
    pub pvc: Option<String>,
    /// The PV name, when the provisioner passed it.
    pub pv: Option<String>,
    /// Size in bytes.
    pub capacity_bytes: Option<u64>,
    /// The node the volume lives on.
    pub node_id: Option<String>,
    /// What it was made from.
    pub content_source: Option<ContentSource>,
    /// Creation time, UTC.
    pub created: Option<String>,
    /// Nodes it is ControllerPublished to.
    pub published_to: Vec<String>,
    /// How it is staged on this node, if it is.
    pub staged: Option<StagedView>,
}

/// A volume's staging on this node.
#[derive(Debug, Serialize)]
pub struct StagedView {
    /// The staging path kubelet gave.
    pub staging_path: PathBuf,
    /// `block`, or the filesystem type.
    pub access: String,
    /// Staged for reading only.
    pub read_only: bool,
    /// Where it is published into pods.
    pub targets: Vec<PathBuf>,
}

/// `volumes show`: the view plus what the machine says.
#[derive(Debug, Serialize)]
pub struct VolumeDetail {
    /// The record's view.
    #[serde(flatten)]
    pub view: VolumeView,
    /// The backing file in the pool.
    pub backing_file: PathBuf,
    /// Whether it exists.
    pub backing_file_exists: bool,
    /// Loop devices attached to it now.
    pub loop_devices: Vec<PathBuf>,
}

/// One snapshot as the operator sees it.
#[derive(Debug, Serialize)]
pub struct SnapshotView {
    /// The snapshot id.
    pub snapshot_id: String,
    /// The CSI name (from external-snapshotter).
    pub name: String,
    /// `namespace/name` of the VolumeSnapshot, when the snapshotter passed it.
    pub volume_snapshot: Option<String>,
    /// The volume it was taken of.
    pub source_volume_id: String,
    /// Size in bytes.
    pub size_bytes: u64,
    /// Creation time, UTC.
    pub created: String,
}

fn namespaced(
    params: &std::collections::BTreeMap<String, String>,
    ns: &str,
    name: &str,
) -> Option<String> {
    match (params.get(ns), params.get(name)) {
        (Some(ns), Some(name)) => Some(format!("{ns}/{name}")),
        (None, Some(name)) => Some(name.clone()),
        _ => None,
    }
}

fn view(record: Option<&VolumeRecord>, volume_id: &str, records: &Records) -> VolumeView {
    let staged = records.stage_of(volume_id).map(|s| StagedView {
        staging_path: s.staging_path.clone(),
        access: match &s.access {
            StagedAccess::Block => "block".to_owned(),
            StagedAccess::Mount { fs_type, .. } => fs_type.as_str().to_owned(),
        },
        read_only: s.read_only,
        targets: s.targets.keys().cloned().collect(),
    });
    VolumeView {
        volume_id: volume_id.to_owned(),
        name: record.map(|r| r.name.clone()).unwrap_or_default(),
        pvc: record.and_then(|r| namespaced(&r.parameters, PVC_NAMESPACE, PVC_NAME)),
        pv: record.and_then(|r| r.parameters.get(PV_NAME).cloned()),
        capacity_bytes: record.map(|r| r.capacity_bytes),
        node_id: record.map(|r| r.node_id.clone()),
        content_source: record.and_then(|r| r.content_source.clone()),
        created: record.map(|r| utc_time(i64::try_from(r.created_at).unwrap_or(i64::MAX))),
        published_to: record
            .map(|r| r.published.keys().cloned().collect())
            .unwrap_or_default(),
        staged,
    }
}

/// Every volume the records know: the controller's, and those only staged here.
pub fn volumes(records: &Records) -> Vec<VolumeView> {
    let mut views: Vec<VolumeView> = records
        .volumes
        .iter()
        .map(|r| view(Some(r), &r.volume_id, records))
        .collect();
    for stage in &records.staged {
        if !records
            .volumes
            .iter()
            .any(|r| r.volume_id == stage.volume_id)
        {
            views.push(view(None, &stage.volume_id, records));
        }
    }
    views.sort_by(|a, b| a.volume_id.cmp(&b.volume_id));
    views
}

fn state_of(view: &VolumeView) -> String {
    match &view.staged {
        Some(staged) if !staged.targets.is_empty() => {
            format!("published x{}", staged.targets.len())
        }
        Some(_) => "staged".to_owned(),
        None if !view.published_to.is_empty() => {
            format!("attached to {}", view.published_to.join(","))
        }
        None => "-".to_owned(),
    }
}

fn source_of(source: Option<&ContentSource>) -> String {
    match source {
        Some(ContentSource::Snapshot { snapshot_id }) => format!("snapshot {snapshot_id}"),
        Some(ContentSource::Volume { volume_id }) => format!("volume {volume_id}"),
        None => "-".to_owned(),
    }
}

/// `ferrovol volumes list`.
///
/// # Errors
/// `Io` or `Record` when the records cannot be read.
pub fn list_volumes(paths: &Paths, output: Output) -> Result<Report> {
    let records = Records::read(paths)?;
    let views = volumes(&records);
    let text = match output {
        Output::Json => json(&views)?,
        Output::Table => {
            let rows: Vec<Vec<String>> = views
                .iter()
                .map(|v| {
                    vec![
                        v.volume_id.clone(),
                        v.pvc.clone().unwrap_or_else(|| "-".into()),
                        v.capacity_bytes.map_or_else(|| "-".into(), human_bytes),
                        v.node_id.clone().unwrap_or_else(|| "-".into()),
                        state_of(v),
                        source_of(v.content_source.as_ref()),
                    ]
                })
                .collect();
            table(
                &["VOLUME", "PVC", "CAPACITY", "NODE", "STATE", "SOURCE"],
                &rows,
            )
        }
    };
    Ok(Report {
        text,
        failed: false,
    })
}

/// `ferrovol volumes show ID`.
///
/// # Errors
/// `NotFound` when no record knows the volume; `Io` or `Record` when records cannot be
/// read.
pub fn show_volume(paths: &Paths, volume_id: &str, output: Output) -> Result<Report> {
    let id = VolumeId::parse_ours("volume id", volume_id)?;
    let records = Records::read(paths)?;
    let record = records.volumes.iter().find(|r| r.volume_id == volume_id);
    if record.is_none() && records.stage_of(volume_id).is_none() {
        return Err(Error::NotFound(format!(
            "volume {volume_id:?} has no record in {}",
            paths.state_dir.display()
        )));
    }
    let backing_file = backing_file_in(&paths.pool_dir, &id);
    let loop_devices = loopdev::find_by_backing_file(&backing_file)?
        .into_iter()
        .map(|d| d.path)
        .collect();
    let detail = VolumeDetail {
        view: view(record, volume_id, &records),
        backing_file_exists: backing_file.exists(),
        backing_file,
        loop_devices,
    };
    let text = match output {
        Output::Json => json(&detail)?,
        Output::Table => {
            let v = &detail.view;
            let mut rows = vec![
                ("volume", v.volume_id.clone()),
                ("name", v.name.clone()),
                ("pvc", v.pvc.clone().unwrap_or_else(|| "-".into())),
                ("pv", v.pv.clone().unwrap_or_else(|| "-".into())),
                (
                    "capacity",
                    v.capacity_bytes.map_or_else(|| "-".into(), human_bytes),
                ),
                ("node", v.node_id.clone().unwrap_or_else(|| "-".into())),
                ("source", source_of(v.content_source.as_ref())),
                ("created", v.created.clone().unwrap_or_else(|| "-".into())),
                ("state", state_of(v)),
                ("backing file", detail.backing_file.display().to_string()),
                (
                    "loop devices",
                    detail
                        .loop_devices
                        .iter()
                        .map(|p| p.display().to_string())
                        .collect::<Vec<_>>()
                        .join(", "),
                ),
            ];
            if let Some(staged) = &v.staged {
                rows.push(("staged at", staged.staging_path.display().to_string()));
                rows.push(("access", staged.access.clone()));
                for target in &staged.targets {
                    rows.push(("published at", target.display().to_string()));
                }
            }
            rows.iter()
                .map(|(key, value)| format!("{key:<13} {value}\n"))
                .collect()
        }
    };
    Ok(Report {
        text,
        failed: false,
    })
}

/// `ferrovol snapshots list`.
///
/// # Errors
/// `Io` or `Record` when the records cannot be read.
pub fn list_snapshots(paths: &Paths, output: Output) -> Result<Report> {
    let records = Records::read(paths)?;
    let views: Vec<SnapshotView> = records
        .snapshots
        .iter()
        .map(|s| SnapshotView {
            snapshot_id: s.snapshot_id.clone(),
            name: s.name.clone(),
            volume_snapshot: namespaced(&s.parameters, SNAPSHOT_NAMESPACE, SNAPSHOT_NAME),
            source_volume_id: s.source_volume_id.clone(),
            size_bytes: s.size_bytes,
            created: utc_time(s.created_secs),
        })
        .collect();
    let text = match output {
        Output::Json => json(&views)?,
        Output::Table => {
            let rows: Vec<Vec<String>> = views
                .iter()
                .map(|s| {
                    vec![
                        s.snapshot_id.clone(),
                        s.volume_snapshot.clone().unwrap_or_else(|| "-".into()),
                        s.source_volume_id.clone(),
                        human_bytes(s.size_bytes),
                        s.created.clone(),
                    ]
                })
                .collect();
            table(
                &[
                    "SNAPSHOT",
                    "VOLUMESNAPSHOT",
                    "SOURCE VOLUME",
                    "SIZE",
                    "CREATED",
                ],
                &rows,
            )
        }
    };
    Ok(Report {
        text,
        failed: false,
    })
}
