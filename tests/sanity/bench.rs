//! `ferrovol bench` against a test driver: the JSON report counts exactly the calls that
//! ran, errors are counted by gRPC code, and the bench leaves nothing behind (no volume,
//! record, snapshot, mount, loop device or directory), also when it is interrupted.
//!
//! These check the tool, not speed: the figures it prints are not asserted.

use std::collections::BTreeSet;
use std::fs;
use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::harness::{wait_bounded, Driver};

fn bench(d: &Driver, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_ferrovol"))
        .arg("bench")
        .args(args)
        .args(["--endpoint", &d.endpoint, "--output", "json"])
        .env("RUST_LOG", "warn")
        .output()
        .expect("run ferrovol bench")
}

fn report(out: &Output) -> Value {
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "ferrovol bench printed no JSON report ({e}); stdout: {} stderr: {}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    })
}

/// The `calls` entry of a run for `call`.
fn call<'a>(run: &'a Value, call: &str) -> &'a Value {
    run["calls"]
        .as_array()
        .expect("calls")
        .iter()
        .find(|c| c["call"] == call)
        .unwrap_or_else(|| panic!("no {call} in {run:#}"))
}

fn count(run: &Value, name: &str) -> u64 {
    call(run, name)["count"].as_u64().expect("count")
}

/// What the driver still has: volume and snapshot records, and files in the pool.
fn driver_holdings(d: &Driver) -> BTreeSet<String> {
    let mut held = BTreeSet::new();
    for dir in [
        d.state.join("volumes"),
        d.state.join("snapshots"),
        d.state.join("staged"),
    ] {
        if let Ok(entries) = fs::read_dir(&dir) {
            held.extend(entries.flatten().map(|e| e.path().display().to_string()));
        }
    }
    held.extend(d.pool_images());
    if let Ok(entries) = fs::read_dir(d.pool.join("snapshots")) {
        held.extend(entries.flatten().map(|e| e.path().display().to_string()));
    }
    held
}

fn assert_empty_dir(dir: &Path) {
    let left: Vec<_> = fs::read_dir(dir)
        .expect("read the work dir")
        .flatten()
        .map(|e| e.path())
        .collect();
    assert!(
        left.is_empty(),
        "the bench left {left:?} in {}",
        dir.display()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn create_delete_reports_every_pair_and_leaves_nothing() {
    let d = Driver::start().await;
    let out = bench(
        &d,
        &[
            "create-delete",
            "-n",
            "40",
            "-c",
            "8",
            "--existing",
            "10",
            "--size",
            "16M",
        ],
    );
    let r = report(&out);
    assert!(out.status.success(), "exit {}: {r:#}", out.status);
    assert_eq!(r["errors"], 0, "{r:#}");
    assert_eq!(r["leftovers"].as_array().map(Vec::len), Some(0), "{r:#}");
    let runs = r["runs"].as_array().expect("runs");
    assert_eq!(runs.len(), 1);
    let run = &runs[0];
    assert_eq!(run["scenario"], "create-delete");
    assert_eq!(
        (run["iterations"].as_u64(), run["completed"].as_u64()),
        (Some(40), Some(40))
    );
    assert_eq!(run["concurrency"], 8);
    assert_eq!(run["preexisting_volumes"], 10);
    // The 10 volumes made beforehand are not among the measured calls.
    assert_eq!(count(run, "CreateVolume"), 40);
    assert_eq!(count(run, "DeleteVolume"), 40);
    assert_eq!(count(run, "cycle"), 40);
    let create = call(run, "CreateVolume");
    for key in ["p50_ms", "p90_ms", "p99_ms", "max_ms"] {
        assert!(
            create[key].as_f64().is_some_and(|v| v > 0.0),
            "{key} in {create:#}"
        );
    }
    assert!(create["p50_ms"].as_f64() <= create["max_ms"].as_f64());
    assert!(run["iterations_per_second"]
        .as_f64()
        .is_some_and(|v| v > 0.0));
    assert!(
        driver_holdings(&d).is_empty(),
        "the bench left {:?}",
        driver_holdings(&d)
    );
    d.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn node_cycle_stages_and_publishes_each_type_and_cleans_up() {
    let d = Driver::start().await;
    let work = d.root.join("bench-work");
    fs::create_dir(&work).expect("make the work dir");
    let work_text = work.display().to_string();
    let out = bench(
        &d,
        &[
            "node-cycle",
            "-n",
            "2",
            "-c",
            "2",
            "--size",
            "64M",
            "--fs-types",
            "ext4,block",
            "--work-dir",
            &work_text,
        ],
    );
    let r = report(&out);
    assert!(out.status.success(), "exit {}: {r:#}", out.status);
    assert_eq!(r["errors"], 0, "{r:#}");
    let runs = r["runs"].as_array().expect("runs");
    let variants: Vec<_> = runs.iter().map(|run| run["variant"].clone()).collect();
    assert_eq!(variants, ["fs_type=ext4", "fs_type=block"], "{r:#}");
    for run in runs {
        assert_eq!(run["completed"], 2, "{run:#}");
        for rpc in [
            "CreateVolume",
            "NodeStageVolume",
            "NodePublishVolume",
            "NodeUnpublishVolume",
            "NodeUnstageVolume",
            "DeleteVolume",
        ] {
            assert_eq!(count(run, rpc), 2, "{rpc} in {run:#}");
        }
    }
    assert_empty_dir(&work);
    assert!(
        driver_holdings(&d).is_empty(),
        "left {:?}",
        driver_holdings(&d)
    );
    fs::remove_dir(&work).expect("remove the work dir");
    d.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failed_calls_are_counted_by_code_and_fail_the_command() {
    let d = Driver::start().await;
    // Far larger than the pool (a directory in /tmp) can promise: every create fails.
    let out = bench(
        &d,
        &["create-delete", "-n", "5", "-c", "2", "--size", "64T"],
    );
    let r = report(&out);
    assert_eq!(out.status.code(), Some(1), "{r:#}");
    assert_eq!(r["errors"], 5, "{r:#}");
    let run = &r["runs"][0];
    assert_eq!(run["completed"], 0);
    let create = call(run, "CreateVolume");
    assert_eq!(create["errors"], 5);
    assert_eq!(create["error_codes"]["ResourceExhausted"], 5, "{create:#}");
    assert!(
        driver_holdings(&d).is_empty(),
        "left {:?}",
        driver_holdings(&d)
    );
    d.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn interrupted_bench_cleans_up_what_it_made() {
    let d = Driver::start().await;
    let child = Command::new(env!("CARGO_BIN_EXE_ferrovol"))
        .args([
            "bench",
            "create-delete",
            "-n",
            "1000000",
            "-c",
            "4",
            "--existing",
            "20",
        ])
        .args([
            "--size",
            "16M",
            "--endpoint",
            &d.endpoint,
            "--output",
            "json",
        ])
        .env("RUST_LOG", "warn")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn ferrovol bench");
    // Interrupt once the volumes made beforehand exist and pairs are running.
    let deadline = Instant::now() + Duration::from_secs(30);
    while fs::read_dir(d.state.join("volumes")).map_or(0, |e| e.count()) < 20 {
        assert!(Instant::now() < deadline, "the bench made no volumes");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    let pid = nix::unistd::Pid::from_raw(i32::try_from(child.id()).expect("pid"));
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGINT).expect("SIGINT the bench");
    let mut child = child;
    let status = wait_bounded(&mut child, Duration::from_secs(60))
        .await
        .expect("the bench exits after SIGINT");
    let out = child.wait_with_output().expect("collect the bench output");
    let r = report(&Output { status, ..out });
    assert_eq!(status.code(), Some(1), "an interrupted run exits 1: {r:#}");
    assert_eq!(r["interrupted"], true);
    assert_eq!(r["leftovers"].as_array().map(Vec::len), Some(0), "{r:#}");
    let run = &r["runs"][0];
    let done = run["completed"].as_u64().expect("completed");
    assert!(done > 0 && done < 1_000_000, "completed {done}");
    assert!(
        driver_holdings(&d).is_empty(),
        "left {:?}",
        driver_holdings(&d)
    );
    d.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn snapshot_and_mixed_scenarios_run_clean() {
    let d = Driver::start().await;
    let work = d.root.join("bench-work");
    fs::create_dir(&work).expect("make the work dir");
    let work_text = work.display().to_string();
    let out = bench(
        &d,
        &[
            "snapshot",
            "-n",
            "3",
            "-c",
            "1",
            "--size",
            "32M",
            "--data",
            "4M",
            "--work-dir",
            &work_text,
        ],
    );
    let r = report(&out);
    assert!(out.status.success(), "exit {}: {r:#}", out.status);
    assert_eq!(r["errors"], 0, "{r:#}");
    let run = &r["runs"][0];
    assert_eq!(run["completed"], 3, "{run:#}");
    // The source volume's setup is not among the measured calls.
    for rpc in [
        "CreateSnapshot",
        "CreateVolume",
        "DeleteVolume",
        "DeleteSnapshot",
    ] {
        assert_eq!(count(run, rpc), 3, "{rpc} in {run:#}");
    }
    assert_empty_dir(&work);
    assert!(
        driver_holdings(&d).is_empty(),
        "left {:?}",
        driver_holdings(&d)
    );

    let out = bench(
        &d,
        &[
            "mixed",
            "-n",
            "20",
            "-c",
            "4",
            "--size",
            "32M",
            "--existing",
            "5",
            "--work-dir",
            &work_text,
        ],
    );
    let r = report(&out);
    assert!(out.status.success(), "exit {}: {r:#}", out.status);
    assert_eq!(r["errors"], 0, "{r:#}");
    let run = &r["runs"][0];
    assert_eq!(run["completed"], 20, "{run:#}");
    // Iterations 0-5, 10-15: pairs; 6, 7, 16, 17: capacity and listing; 8, 18: node
    // cycles; 9, 19: snapshot rounds (each with one more CreateVolume and DeleteVolume).
    assert_eq!(count(run, "GetCapacity"), 4, "{run:#}");
    assert_eq!(count(run, "ListVolumes"), 4, "{run:#}");
    assert_eq!(count(run, "NodeStageVolume"), 2, "{run:#}");
    assert_eq!(count(run, "CreateSnapshot"), 2, "{run:#}");
    assert_eq!(count(run, "CreateVolume"), 12 + 2 + 2, "{run:#}");
    assert_empty_dir(&work);
    assert!(
        driver_holdings(&d).is_empty(),
        "left {:?}",
        driver_holdings(&d)
    );
    fs::remove_dir(&work).expect("remove the work dir");
    d.finish().await;
}
