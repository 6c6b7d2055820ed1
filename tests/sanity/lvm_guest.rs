//! The lvm backend, for real: this test boots the LVM test guest (a Debian kernel with
//! device-mapper under qemu TCG, `scripts/vm/`) and runs this very test binary inside it
//! with `FERROVOL_SANITY_BACKEND=lvm` (`tests/vm/lvm-suite.sh`). There every test driver
//! provisions from a volume group of its own with a thin pool (`lvm_vg`), the suite below
//! runs against it, and so do the lvm-only tests of `lvm`.
//!
//! The guest's exit code decides: a guest that does not boot, or a suite that fails, fails
//! this test with the guest's console and the suite's log.
//!
//! The guest runs the modules of [`GUEST_MODULES`]: the CSI conformance tests, whose
//! every check holds for any backend, and the lvm-only tests. The others stay on the host
//! only, each for the reason in [`HOST_ONLY`]: they test the loop backend's own files,
//! loop devices and pool, or the endpoint and process rather than storage, or they are
//! long attacks (crash points, stress, hostile input) written against the loop backend.
//! Under TCG every lvm command costs a few hundred milliseconds, and the whole guest run
//! must stay within minutes.

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::harness::require_root;
use crate::lvm_vg::backend_is_lvm;

/// The modules the guest runs (libtest filters: every test whose name starts with one).
pub const GUEST_MODULES: &[&str] = &[
    "identity::",
    "create::",
    "listing::",
    "controller::",
    "node::",
    "lifecycle::",
    "data::",
    "snapshot::",
    "restore::",
    "snapshot_data::",
    "expand::",
    "restart::",
    "reuse::",
    "concurrency::",
    "paths::",
    "lvm::",
];

/// Tests inside [`GUEST_MODULES`] that check the loop backend's own machinery, with the
/// reason (libtest `--skip` filters).
const LOOP_ONLY: &[(&str, &str)] = &[
    (
        "concurrency::a_second_operation_on_a_busy_volume_is_aborted",
        "holds a CreateVolume by freezing the loop pool's filesystem, which an lvm create never touches",
    ),
    (
        "listing::get_capacity_tracks_pool_space_and_topology",
        "compares GetCapacity with the loop pool filesystem's free space (lvm: lvm::capacity_rounding_and_classes)",
    ),
    (
        "node::node_get_volume_stats_reports_detached_block_device_abnormal",
        "detaches a published loop device behind the driver's back; an open LV cannot be deactivated",
    ),
    (
        "reuse::block_target_whose_loop_device_was_reused_is_abnormal_and_cleanable",
        "a loop device number reused by another volume",
    ),
    (
        "snapshot_data::in_use_block_volume_is_not_copied_on_a_pool_without_reflinks",
        "a loop pool without reflinks; thin snapshots are atomic",
    ),
];

/// The modules that run on the host only, and why.
pub const HOST_ONLY: &[(&str, &str)] = &[
    ("pool", "reflinks and sparse copies in the loop pool"),
    (
        "operator",
        "gc, inventory and doctor of the loop pool's files and loop devices",
    ),
    (
        "kubectl_walk",
        "the StorageClasses of deploy/ (backend: loop) and their backing files",
    ),
    ("socket", "the endpoint and the process, not storage"),
    (
        "observability",
        "pool gauges and health of the loop pool directory",
    ),
    (
        "crash",
        "SIGKILL at the crash points of the loop backend's file, loop and copy steps",
    ),
    (
        "stress",
        "a long concurrency attack, checked against the loop pool's files and loop devices",
    ),
    (
        "hostile",
        "hundreds of bad requests; refused before any backend work",
    ),
    (
        "malformed",
        "undecodable request bytes; refused before any backend work",
    ),
    (
        "exposure",
        "socket owner, group and mode, and the metrics labels",
    ),
    (
        "full_pool",
        "a loop pool filesystem filled up (--overprovision-ratio, ENOSPC)",
    ),
    (
        "bench",
        "the load generator's counts and clean-up, checked against the loop pool",
    ),
    ("lvm_guest", "this test, which boots the guest"),
];

/// The least number of tests the guest must have run: a filter mistake that leaves
/// (almost) nothing to run must not pass.
const MIN_GUEST_TESTS: usize = 60;

#[test]
fn lvm_backend_in_a_guest() {
    require_root();
    assert!(
        !backend_is_lvm(),
        "lvm_guest runs on the host; the guest skips it"
    );
    let repo = Path::new(env!("CARGO_MANIFEST_DIR"));
    let binary = std::env::current_exe().expect("the test binary's path");
    let skip: Vec<&str> = LOOP_ONLY.iter().map(|(name, _)| *name).collect();
    let only = GUEST_MODULES.join(" ");
    let status = Command::new(repo.join("scripts/vm/run-guest.sh"))
        .args([
            "--quiet",
            "--tmp-size",
            "16G",
            "--mem",
            "3072",
            "--disks",
            "0",
        ])
        .args(["--timeout", "1200"])
        .arg(repo.join("tests/vm/lvm-suite.sh"))
        .env("FERROVOL_SANITY_BIN", &binary)
        .env("FERROVOL_SANITY_SKIP", skip.join(" "))
        .env("FERROVOL_SANITY_ONLY", only)
        // Three tests at a time on the guest's two vCPUs: lvm commands and mkfs wait on
        // locks and I/O often enough for a third to use the time.
        .env("RUST_TEST_THREADS", "3")
        .env_remove("FERROVOL_SANITY_ARGS")
        .current_dir(repo)
        .status()
        .expect("start scripts/vm/run-guest.sh");
    let run = fs_last_run(repo);
    let log = std::fs::read_to_string(run.join("ctl/sanity.log")).unwrap_or_default();
    let failures: Vec<&str> = log
        .lines()
        .filter(|l| l.starts_with("test ") && l.ends_with("FAILED"))
        .collect();
    // A guest that never ran the suite (no boot, a panic, a timeout) leaves no suite log:
    // then its console says why.
    let evidence = if log.trim().is_empty() {
        let console = std::fs::read_to_string(run.join("console.log")).unwrap_or_default();
        format!(
            "----- end of the guest console -----\n{}",
            tail(&console, 150)
        )
    } else {
        format!("----- end of the suite log -----\n{}", tail(&log, 150))
    };
    assert!(
        status.success(),
        "the lvm suite in the guest failed ({status}); failed tests: {failures:#?}\n\
         suite log: {}\nconsole: {}\n{evidence}",
        run.join("ctl/sanity.log").display(),
        run.join("console.log").display(),
    );
    let passed = log
        .lines()
        .find_map(|l| l.strip_prefix("test result: ok. "))
        .and_then(|rest| rest.split(' ').next())
        .and_then(|n| n.parse::<usize>().ok())
        .expect("the guest's suite printed no `test result: ok` line");
    assert!(
        passed >= MIN_GUEST_TESTS,
        "only {passed} tests ran in the guest (at least {MIN_GUEST_TESTS} expected)"
    );
    // scripts/test.sh reports this number in its closing line.
    std::fs::write(
        repo.join("target/vm/lvm-suite-passed"),
        format!("{passed}\n"),
    )
    .expect("write target/vm/lvm-suite-passed");
    eprintln!(
        "lvm backend in the guest: {passed} tests passed; modules run on the host only: {HOST_ONLY:?}; tests left out: {LOOP_ONLY:?}"
    );
}

/// The run directory `run-guest.sh` just used (`target/vm/last`).
fn fs_last_run(repo: &Path) -> PathBuf {
    let last = repo.join("target/vm/last");
    std::fs::canonicalize(&last).unwrap_or(last)
}

fn tail(text: &str, lines: usize) -> String {
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}
