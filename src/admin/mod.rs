//! Operator commands of the `ferrovol` binary: `volumes list|show`, `snapshots list`,
//! `doctor` and `gc`.
//!
//! They read the driver's durable records (never its in-memory state, so they work
//! beside a running driver and without one) and the machine itself (sysfs, mountinfo).
//! Only `gc` without `--dry-run` removes anything, and only while it holds the lock that
//! keeps it apart from the driver's operations (see [`crate::locks::Gate`]); `doctor`
//! creates and removes one probe file in each directory it checks.
//!
//! Each command returns a [`Report`]: the text to print, as a table for people or JSON
//! for scripts, and whether it found a problem (the exit status).

pub mod doctor;
pub mod gc;
pub mod inventory;

use std::path::PathBuf;

use serde::Serialize;

use crate::error::{Error, Result};
use crate::store::{read_records, SnapshotRecord, StageRecord, VolumeRecord};

/// How a command prints its result.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Output {
    /// Aligned columns for people.
    Table,
    /// One JSON document for scripts.
    Json,
}

/// What a command prints and whether it found a problem.
#[derive(Debug)]
pub struct Report {
    /// The text for standard output.
    pub text: String,
    /// True when the command found a problem: the process exits non-zero.
    pub failed: bool,
}

/// Where the driver keeps things, as the operator commands need to know.
#[derive(Debug, Clone)]
pub struct Paths {
    /// `--state-dir` of the driver.
    pub state_dir: PathBuf,
    /// `--pool-dir` of the driver.
    pub pool_dir: PathBuf,
}

/// The driver's records, read from disk.
#[derive(Debug, Default)]
pub struct Records {
    /// Volume records of the controller.
    pub volumes: Vec<VolumeRecord>,
    /// Snapshot records of the controller.
    pub snapshots: Vec<SnapshotRecord>,
    /// Stage records of this node.
    pub staged: Vec<StageRecord>,
}

impl Records {
    /// Reads every record under `state_dir`.
    ///
    /// # Errors
    /// `Io` or `Record` when a record cannot be read.
    pub fn read(paths: &Paths) -> Result<Self> {
        Ok(Records {
            volumes: read_records(&paths.state_dir.join("volumes"))?,
            snapshots: read_records(&paths.state_dir.join("snapshots"))?,
            staged: read_records(&paths.state_dir.join("staged"))?,
        })
    }

    /// The stage record of a volume, if it is staged on this node.
    pub fn stage_of(&self, volume_id: &str) -> Option<&StageRecord> {
        self.staged.iter().find(|s| s.volume_id == volume_id)
    }
}

/// Renders `value` as pretty JSON.
///
/// # Errors
/// `Internal` if serialisation fails (a bug).
pub fn json<T: Serialize>(value: &T) -> Result<String> {
    serde_json::to_string_pretty(value)
        .map(|mut text| {
            text.push('\n');
            text
        })
        .map_err(|e| Error::Internal(format!("rendering JSON: {e}")))
}

/// Aligns `rows` under `headers`, two spaces between columns.
pub fn table(headers: &[&str], rows: &[Vec<String>]) -> String {
    let mut widths: Vec<usize> = headers.iter().map(|h| h.chars().count()).collect();
    for row in rows {
        for (width, cell) in widths.iter_mut().zip(row) {
            *width = (*width).max(cell.chars().count());
        }
    }
    let mut out = String::new();
    let mut line = |cells: &mut dyn Iterator<Item = &str>| {
        let mut text = String::new();
        for (i, (cell, width)) in cells.zip(&widths).enumerate() {
            if i > 0 {
                text.push_str("  ");
            }
            text.push_str(cell);
            text.extend(std::iter::repeat_n(' ', width - cell.chars().count()));
        }
        out.push_str(text.trim_end());
        out.push('\n');
    };
    line(&mut headers.iter().copied());
    for row in rows {
        line(&mut row.iter().map(String::as_str));
    }
    out
}

/// `1.5 GiB`, `64 MiB`, `512 B`.
pub fn human_bytes(bytes: u64) -> String {
    const UNITS: [&str; 5] = ["KiB", "MiB", "GiB", "TiB", "PiB"];
    if bytes < 1024 {
        return format!("{bytes} B");
    }
    let mut value = bytes as f64 / 1024.0;
    let mut unit = 0;
    while value >= 1024.0 && unit + 1 < UNITS.len() {
        value /= 1024.0;
        unit += 1;
    }
    if value.fract() < 0.05 {
        format!("{value:.0} {}", UNITS[unit])
    } else {
        format!("{value:.1} {}", UNITS[unit])
    }
}

/// `2026-11-22T10:04:05Z` for seconds since the epoch (UTC).
pub fn utc_time(epoch_secs: i64) -> String {
    let days = epoch_secs.div_euclid(86_400);
    let secs = epoch_secs.rem_euclid(86_400);
    // Civil date from days since 1970-01-01 (the proleptic Gregorian calendar).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1_460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}Z",
        secs / 3600,
        secs / 60 % 60,
        secs % 60
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_read_well() {
        assert_eq!(human_bytes(512), "512 B");
        assert_eq!(human_bytes(64 << 20), "64 MiB");
        assert_eq!(human_bytes(3 << 29), "1.5 GiB");
        assert_eq!(human_bytes(1 << 30), "1 GiB");
    }

    #[test]
    fn times_are_utc_dates() {
        assert_eq!(utc_time(0), "1970-01-01T00:00:00Z");
        assert_eq!(utc_time(951_782_400), "2000-02-29T00:00:00Z");
        assert_eq!(utc_time(1_795_349_045), "2026-11-22T12:04:05Z");
    }

    #[test]
    fn tables_align() {
        let text = table(
            &["A", "LONG HEADER"],
            &[vec!["wide cell".into(), "x".into()]],
        );
        assert_eq!(text, "A          LONG HEADER\nwide cell  x\n");
    }
}
