//! External tools: blkid to probe a device, mkfs to format a blank one.
//!
//! Each runs as a child process with a timeout (killed when it expires or when the caller
//! gives up) and its stderr lands in the error.

use std::path::Path;
use std::process::{Output, Stdio};
use std::time::Duration;

use tokio::process::Command;

use crate::config::FsType;
use crate::error::{Error, Result};

/// Runs `program args...`, returning its output whatever the exit status.
///
/// # Errors
/// `Io` when it cannot start; `Timeout` when it runs longer than `timeout`.
pub async fn run(program: &str, args: &[&str], timeout: Duration) -> Result<Output> {
    let child = Command::new(program)
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .map_err(|e| Error::io("start", program, e))?;
    match tokio::time::timeout(timeout, child.wait_with_output()).await {
        Ok(Ok(output)) => Ok(output),
        Ok(Err(e)) => Err(Error::io("wait for", program, e)),
        Err(_) => Err(Error::Timeout(format!("{program} {}", args.join(" ")))),
    }
}

/// Runs a tool and fails unless it exits with status 0.
///
/// # Errors
/// As [`run`], plus `Tool` for a non-zero exit.
pub async fn run_ok(program: &str, args: &[&str], timeout: Duration) -> Result<Output> {
    let output = run(program, args, timeout).await?;
    if output.status.success() {
        Ok(output)
    } else {
        Err(tool_error(program, args, &output))
    }
}

fn tool_error(program: &str, args: &[&str], output: &Output) -> Error {
    Error::Tool {
        program: program.to_owned(),
        args: args.join(" "),
        status: output.status.to_string(),
        stderr: String::from_utf8_lossy(&output.stderr).trim().to_owned(),
    }
}

/// What a device holds, as far as blkid can tell.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Content {
    /// No signature of any kind.
    Nothing,
    /// A filesystem (or other signature) of this type: `ext4`, `xfs`, `LVM2_member`, ...
    Signature(String),
    /// A partition table of this type.
    PartitionTable(String),
}

/// Probes a device for filesystem, RAID, LVM and partition-table signatures.
///
/// # Errors
/// As [`run`], plus `Tool` when blkid fails for another reason than finding nothing.
pub async fn probe(device: &Path, timeout: Duration) -> Result<Content> {
    let dev = device.to_string_lossy();
    let args = ["-p", "-o", "export", dev.as_ref()];
    let output = run("blkid", &args, timeout).await?;
    match output.status.code() {
        // blkid -p exits 2 when it finds no signature.
        Some(2) => Ok(Content::Nothing),
        Some(0) => Ok(parse_blkid_export(&String::from_utf8_lossy(&output.stdout))),
        _ => Err(tool_error("blkid", &args, &output)),
    }
}

fn parse_blkid_export(text: &str) -> Content {
    let mut pttype = None;
    for line in text.lines() {
        if let Some(t) = line.strip_prefix("TYPE=") {
            return Content::Signature(t.to_owned());
        }
        if let Some(t) = line.strip_prefix("PTTYPE=") {
            pttype = Some(t.to_owned());
        }
    }
    match pttype {
        Some(t) => Content::PartitionTable(t),
        // Exit 0 with neither line: some other signature we cannot name.
        None => Content::Signature("unknown".into()),
    }
}

/// Creates a filesystem on a device that the caller has found blank.
///
/// Discard is skipped: on a fresh sparse loop file it only costs time. Without `overwrite`
/// the tools' own checks for an existing filesystem stay on as a second guard; the caller
/// sets it only for a device whose first format a crash interrupted.
///
/// # Errors
/// As [`run_ok`].
pub async fn mkfs(device: &Path, fs: FsType, overwrite: bool, timeout: Duration) -> Result<()> {
    let dev = device.to_string_lossy();
    let (program, mut args): (&str, Vec<&str>) = match fs {
        FsType::Ext4 => (
            "mkfs.ext4",
            vec![
                "-q",
                "-E",
                "lazy_itable_init=1,lazy_journal_init=1,nodiscard",
            ],
        ),
        FsType::Xfs => ("mkfs.xfs", vec!["-q", "-K"]),
        FsType::Btrfs => ("mkfs.btrfs", vec!["-q", "-K"]),
    };
    if overwrite {
        args.push(if fs == FsType::Ext4 { "-F" } else { "-f" });
    }
    args.push(dev.as_ref());
    run_ok(program, &args, timeout).await.map(drop)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blkid_export_is_classified() {
        assert_eq!(
            parse_blkid_export("DEVNAME=/dev/loop0\nUUID=x\nTYPE=ext4\nUSAGE=filesystem\n"),
            Content::Signature("ext4".into())
        );
        assert_eq!(
            parse_blkid_export("DEVNAME=/dev/loop0\nPTUUID=y\nPTTYPE=gpt\n"),
            Content::PartitionTable("gpt".into())
        );
        assert_eq!(
            parse_blkid_export("DEVNAME=/dev/loop0\n"),
            Content::Signature("unknown".into())
        );
    }
}
