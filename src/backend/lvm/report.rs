//! The lvm2 tools, driven with JSON reports: `lvs` and `vgs` with `--reportformat json`,
//! sizes in bytes (`--units b --nosuffix`), never parsed from human output.
//!
//! Every call goes through [`Lvm::run`]: a timeout, `LC_ALL=C`, no prompts (`-y` where a
//! tool would ask), and the tool's stderr in the error when it fails.

use std::path::PathBuf;
use std::time::Duration;

use serde::Deserialize;

use crate::error::{Error, Result};
use crate::os::command;

/// The fields every `lvs` call asks for.
const LV_FIELDS: &str = "vg_name,lv_name,lv_size,lv_attr,pool_lv,data_percent,lv_tags,lv_dm_path";

/// One logical volume as `lvs` reports it.
#[derive(Debug, Clone, PartialEq)]
pub struct Lv {
    /// Its volume group.
    pub vg: String,
    /// Its name in the volume group.
    pub name: String,
    /// Its (virtual) size in bytes.
    pub size_bytes: u64,
    /// The ten attribute characters (`Vwi-aotz--`).
    pub attr: String,
    /// The thin pool it lives in; empty for a linear LV.
    pub pool: String,
    /// For thin LVs and pools: the share of the size that holds mapped data, in percent.
    pub data_percent: Option<f64>,
    /// Its tags.
    pub tags: Vec<String>,
    /// The device-mapper node (`/dev/mapper/vg-lv`), present while it is active.
    pub dm_path: PathBuf,
}

impl Lv {
    fn attr_at(&self, index: usize) -> char {
        self.attr.chars().nth(index).unwrap_or('-')
    }

    /// Whether it is active (has a device node).
    pub fn active(&self) -> bool {
        self.attr_at(4) == 'a'
    }

    /// Whether its device is open (mounted or held by a process).
    pub fn open(&self) -> bool {
        self.attr_at(5) == 'o'
    }

    /// Whether it is a thin LV (lives in a thin pool).
    pub fn thin(&self) -> bool {
        !self.pool.is_empty()
    }

    /// `VG/LV`, the name the tools take.
    pub fn full_name(&self) -> String {
        format!("{}/{}", self.vg, self.name)
    }

    /// Bytes of it that hold data: the mapped share of a thin LV, all of a linear one.
    pub fn allocated_bytes(&self) -> u64 {
        match (self.thin(), self.data_percent) {
            (true, Some(percent)) => {
                // A percentage with two decimals: exact enough for accounting.
                let share = (self.size_bytes as f64) * percent / 100.0;
                share.round() as u64
            }
            _ => self.size_bytes,
        }
    }
}

/// One volume group as `vgs` reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Vg {
    /// Its size in bytes.
    pub size_bytes: u64,
    /// Unallocated bytes.
    pub free_bytes: u64,
    /// Its extent size in bytes, the unit linear LVs are allocated in.
    pub extent_bytes: u64,
}

#[derive(Deserialize)]
struct Report<T> {
    report: Vec<T>,
}

#[derive(Deserialize)]
struct LvSection {
    #[serde(default)]
    lv: Vec<RawLv>,
}

#[derive(Deserialize)]
struct VgSection {
    #[serde(default)]
    vg: Vec<RawVg>,
}

#[derive(Deserialize)]
struct RawLv {
    vg_name: String,
    lv_name: String,
    lv_size: String,
    lv_attr: String,
    #[serde(default)]
    pool_lv: String,
    #[serde(default)]
    data_percent: String,
    #[serde(default)]
    lv_tags: String,
    #[serde(default)]
    lv_dm_path: String,
}

#[derive(Deserialize)]
struct RawVg {
    vg_size: String,
    vg_free: String,
    vg_extent_size: String,
}

fn bytes(field: &str, raw: &str) -> Result<u64> {
    raw.trim()
        .parse()
        .map_err(|_| Error::Internal(format!("lvm reported {field} {raw:?}, not a byte count")))
}

/// Parses the JSON of `lvs --reportformat json --units b --nosuffix -o LV_FIELDS`.
///
/// # Errors
/// `Internal` when the report does not have that shape.
pub fn parse_lvs(json: &[u8]) -> Result<Vec<Lv>> {
    let report: Report<LvSection> = serde_json::from_slice(json)
        .map_err(|e| Error::Internal(format!("cannot read the lvs report: {e}")))?;
    let mut lvs = Vec::new();
    for raw in report.report.into_iter().flat_map(|s| s.lv) {
        let data_percent = match raw.data_percent.trim() {
            "" => None,
            text => Some(
                text.parse()
                    .map_err(|_| Error::Internal(format!("lvm reported data_percent {text:?}")))?,
            ),
        };
        lvs.push(Lv {
            size_bytes: bytes("lv_size", &raw.lv_size)?,
            vg: raw.vg_name,
            name: raw.lv_name,
            attr: raw.lv_attr,
            pool: raw.pool_lv.trim_matches(['[', ']']).to_owned(),
            data_percent,
            tags: raw
                .lv_tags
                .split(',')
                .filter(|t| !t.is_empty())
                .map(str::to_owned)
                .collect(),
            dm_path: PathBuf::from(raw.lv_dm_path),
        });
    }
    Ok(lvs)
}

/// Parses the JSON of `vgs --reportformat json --units b --nosuffix -o vg_size,vg_free,vg_extent_size`.
///
/// # Errors
/// `Internal` when the report does not have that shape.
pub fn parse_vg(json: &[u8]) -> Result<Option<Vg>> {
    let report: Report<VgSection> = serde_json::from_slice(json)
        .map_err(|e| Error::Internal(format!("cannot read the vgs report: {e}")))?;
    let Some(raw) = report.report.into_iter().flat_map(|s| s.vg).next() else {
        return Ok(None);
    };
    Ok(Some(Vg {
        size_bytes: bytes("vg_size", &raw.vg_size)?,
        free_bytes: bytes("vg_free", &raw.vg_free)?,
        extent_bytes: bytes("vg_extent_size", &raw.vg_extent_size)?,
    }))
}

/// The lvm2 tools with a deadline per call.
#[derive(Debug, Clone)]
pub struct Lvm {
    /// How long one tool may run.
    pub timeout: Duration,
}

impl Lvm {
    /// Runs `program args...`; fails with the tool's stderr unless it exits 0.
    ///
    /// # Errors
    /// `Tool` for a failed run; `Timeout`; `Io` when it cannot start.
    pub fn run(&self, program: &str, args: &[String]) -> Result<Vec<u8>> {
        command::run_ok(program, args, self.timeout).map(|o| o.stdout)
    }

    /// Every LV of the given volume groups. A volume group that does not exist is an
    /// error: the driver must not mistake a missing VG for one without volumes.
    ///
    /// # Errors
    /// As [`Lvm::run`]; `Internal` for a report it cannot read.
    pub fn lvs(&self, vgs: &[&str]) -> Result<Vec<Lv>> {
        let mut args = report_args(LV_FIELDS);
        args.extend(vgs.iter().map(|vg| (*vg).to_owned()));
        parse_lvs(&self.run("lvs", &args)?)
    }

    /// The LVs called `name` in the given volume groups (one, or none).
    ///
    /// # Errors
    /// As [`Lvm::lvs`].
    pub fn lv(&self, vgs: &[&str], name: &str) -> Result<Vec<Lv>> {
        let mut args = report_args(LV_FIELDS);
        args.push("-S".into());
        args.push(format!("lv_name={name}"));
        args.extend(vgs.iter().map(|vg| (*vg).to_owned()));
        parse_lvs(&self.run("lvs", &args)?)
    }

    /// One volume group; `None` when there is none of that name.
    ///
    /// # Errors
    /// As [`Lvm::run`] (other than for a missing VG).
    pub fn vg(&self, vg: &str) -> Result<Option<Vg>> {
        let mut args = report_args("vg_size,vg_free,vg_extent_size");
        args.push(vg.to_owned());
        match self.run("vgs", &args) {
            Ok(json) => parse_vg(&json),
            Err(Error::Tool { stderr, .. }) if stderr.contains("not found") => Ok(None),
            Err(e) => Err(e),
        }
    }
}

fn report_args(fields: &str) -> Vec<String> {
    [
        "--reportformat",
        "json",
        "--units",
        "b",
        "--nosuffix",
        "-o",
        fields,
    ]
    .iter()
    .map(|s| (*s).to_owned())
    .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lvs_report_is_read() {
        // As lvm2 2.03 prints it for a thin pool, a thin LV and a linear LV.
        let json = br#"{
      "report": [
          {
              "lv": [
                  {"vg_name":"vg0", "lv_name":"pool0", "lv_size":"1073741824", "lv_attr":"twi-aotz--", "pool_lv":"", "data_percent":"10.50", "lv_tags":"", "lv_dm_path":"/dev/mapper/vg0-pool0"},
                  {"vg_name":"vg0", "lv_name":"fv-00", "lv_size":"104857600", "lv_attr":"Vwi-aotz--", "pool_lv":"pool0", "data_percent":"25.00", "lv_tags":"fv.kind=volume,fv.m.00=abc", "lv_dm_path":"/dev/mapper/vg0-fv--00"},
                  {"vg_name":"vg0", "lv_name":"lin", "lv_size":"8388608", "lv_attr":"-wi-a-----", "pool_lv":"", "data_percent":"", "lv_tags":"", "lv_dm_path":"/dev/mapper/vg0-lin"}
              ]
          }
      ]
  }"#;
        let lvs = parse_lvs(json).expect("parses");
        assert_eq!(lvs.len(), 3);
        let thin = &lvs[1];
        assert!(thin.thin() && thin.active() && thin.open());
        assert_eq!(thin.allocated_bytes(), 26214400);
        assert_eq!(thin.tags, vec!["fv.kind=volume", "fv.m.00=abc"]);
        assert_eq!(thin.full_name(), "vg0/fv-00");
        let linear = &lvs[2];
        assert!(!linear.thin() && linear.active() && !linear.open());
        assert_eq!(linear.allocated_bytes(), 8388608);
        assert!(parse_lvs(b"{\"report\":[{\"lv\":[{\"vg_name\":\"v\"}]}]}").is_err());
    }

    #[test]
    fn vgs_report_is_read() {
        let json = br#"{"report":[{"vg":[{"vg_size":"8585740288","vg_free":"7511998464","vg_extent_size":"4194304"}]}]}"#;
        assert_eq!(
            parse_vg(json).expect("parses"),
            Some(Vg {
                size_bytes: 8585740288,
                free_bytes: 7511998464,
                extent_bytes: 4194304
            })
        );
        assert_eq!(
            parse_vg(br#"{"report":[{"vg":[]}]}"#).expect("parses"),
            None
        );
    }
}
