//! Running a tool from a blocking thread: its output, its exit status, and a deadline.
//!
//! The async runner in [`super::tools`] serves the node service's mkfs and blkid; this one
//! serves backends, whose methods run on blocking threads (and in the operator commands,
//! outside any runtime). A tool that outlives its deadline is killed and reaped.

use std::io::Read;
use std::process::{Child, Command, ExitStatus, Output, Stdio};
use std::thread;
use std::time::{Duration, Instant};

use crate::error::{Error, Result};

/// Runs `program args...` with stdin closed and returns its output whatever the exit
/// status.
///
/// # Errors
/// `Io` when it cannot start; `Timeout` when it runs longer than `timeout` (it is killed).
pub fn run(program: &str, args: &[String], timeout: Duration) -> Result<Output> {
    let mut child = Command::new(program)
        .args(args)
        .env("LC_ALL", "C")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| Error::io("start", program, e))?;
    // Both pipes are drained while the tool runs, so a chatty tool cannot block on a
    // full pipe and look hung.
    let stdout = drain(child.stdout.take());
    let stderr = drain(child.stderr.take());
    let status = wait_until(&mut child, Instant::now() + timeout);
    let output = Output {
        status: match status {
            Ok(Some(status)) => status,
            Ok(None) => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(Error::Timeout(format!("{program} {}", args.join(" "))));
            }
            Err(e) => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(Error::io("wait for", program, e));
            }
        },
        stdout: stdout.join().unwrap_or_default(),
        stderr: stderr.join().unwrap_or_default(),
    };
    Ok(output)
}

/// Runs a tool and fails unless it exits with status 0; its stderr lands in the error.
///
/// # Errors
/// As [`run`], plus `Tool` for a non-zero exit.
pub fn run_ok(program: &str, args: &[String], timeout: Duration) -> Result<Output> {
    let output = run(program, args, timeout)?;
    if output.status.success() {
        Ok(output)
    } else {
        Err(Error::Tool {
            program: program.to_owned(),
            args: args.join(" "),
            status: output.status.to_string(),
            stderr: String::from_utf8_lossy(&output.stderr).trim().to_owned(),
        })
    }
}

fn drain(pipe: Option<impl Read + Send + 'static>) -> thread::JoinHandle<Vec<u8>> {
    thread::spawn(move || {
        let mut bytes = Vec::new();
        if let Some(mut pipe) = pipe {
            let _ = pipe.read_to_end(&mut bytes);
        }
        bytes
    })
}

/// Waits for the child until `deadline`; `None` when it is still running then.
fn wait_until(child: &mut Child, deadline: Instant) -> std::io::Result<Option<ExitStatus>> {
    let mut pause = Duration::from_millis(1);
    loop {
        if let Some(status) = child.try_wait()? {
            return Ok(Some(status));
        }
        let now = Instant::now();
        if now >= deadline {
            return Ok(None);
        }
        thread::sleep(pause.min(deadline - now));
        pause = (pause * 2).min(Duration::from_millis(20));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn output_status_and_deadline() {
        let out = run_ok(
            "sh",
            &["-c".into(), "echo out; echo err >&2".into()],
            Duration::from_secs(5),
        )
        .expect("sh runs");
        assert_eq!(out.stdout, b"out\n");
        assert_eq!(out.stderr, b"err\n");
        let failed = run_ok(
            "sh",
            &["-c".into(), "echo why >&2; exit 3".into()],
            Duration::from_secs(5),
        );
        match failed {
            Err(Error::Tool { stderr, status, .. }) => {
                assert_eq!(stderr, "why");
                assert!(status.contains('3'), "{status}");
            }
            other => panic!("expected a tool error, got {other:?}"),
        }
        let started = Instant::now();
        let slow = run("sleep", &["30".into()], Duration::from_millis(200));
        assert!(matches!(slow, Err(Error::Timeout(_))), "{slow:?}");
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "the tool was not killed"
        );
    }
}
