//! Offline checks of the Kubernetes manifests: each overlay in deploy/kubernetes/overlays is
//! rendered with `kubectl kustomize` and every object validated against the Kubernetes OpenAPI
//! schemas (kubernetes-validate, strict) plus the cross-references no schema sees (driver name,
//! CSI socket, registration path, RBAC per sidecar, privileges, images, resources, expansion and
//! attach layout, the metrics Service against the pods it selects); deploy/examples likewise.
//! deploy/kubernetes/monitoring is rendered too: its ServiceMonitor is checked against a schema
//! written from the CRD and against the base's metrics Service, and every PromQL expression of its
//! Grafana dashboard against the metrics the driver declares (the table in src/metrics.rs's
//! module doc), so a renamed metric or a label no metric has fails here. The last test breaks the
//! manifests, the dashboard and that table on purpose, one way at a time, and requires the
//! validator to reject every breakage with the check meant for it, so that a validator that
//! passes everything cannot go unnoticed.
//!
//! The work is done by tests/deploy/validate.py. It needs kubectl, PyYAML and
//! kubernetes-validate, which scripts/test.sh installs; without them these tests fail, naming
//! what is missing (in CI as well as locally: a skipped manifest check would look like a pass).

use std::path::Path;
use std::process::{Command, Output};

const VALIDATOR: &str = "tests/deploy/validate.py";
/// The validator's exit status when a tool is missing.
const MISSING_TOOL: i32 = 3;
/// Fewer caught mutations than this means the list was cut down: each one is a proof that a
/// check can fail.
const MIN_MUTATIONS: usize = 130;

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// Runs the validator from the repository root and returns its output; panics when it cannot
/// run or reports a missing tool.
fn validate(args: &[&str]) -> Output {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let output = Command::new("python3")
        .arg(VALIDATOR)
        .args(args)
        .current_dir(root)
        .output()
        .unwrap_or_else(|e| panic!("cannot run python3 {VALIDATOR}: {e}; install python3"));
    if output.status.code() == Some(MISSING_TOOL) {
        let missing = text(&output.stdout);
        let how = if std::env::var("CI").as_deref() == Ok("true") {
            "CI must install them before the tests: scripts/test.sh does"
        } else {
            "run scripts/test.sh, which installs them, or install them yourself"
        };
        panic!("the manifest checks need tools that are missing ({how}):\n{missing}");
    }
    output
}

fn report(output: &Output) -> String {
    format!(
        "exit status {}\n--- stdout\n{}--- stderr\n{}",
        output.status,
        text(&output.stdout),
        text(&output.stderr)
    )
}

fn assert_passes(args: &[&str]) -> String {
    let output = validate(args);
    assert!(
        output.status.success(),
        "validate.py {} failed:\n{}",
        args.join(" "),
        report(&output)
    );
    let stdout = text(&output.stdout);
    assert!(
        stdout.lines().any(|l| l.starts_with("ok: ")),
        "validate.py {} printed no result line:\n{}",
        args.join(" "),
        report(&output)
    );
    stdout
}

#[test]
fn single_node_overlay_renders_and_validates() {
    let stdout = assert_passes(&["overlay", "deploy/kubernetes/overlays/single-node"]);
    assert!(stdout.contains("StatefulSet"), "{stdout}");
}

#[test]
fn multi_node_overlay_renders_and_validates() {
    let stdout = assert_passes(&["overlay", "deploy/kubernetes/overlays/multi-node"]);
    assert!(
        stdout.contains("DaemonSet") && stdout.contains("Deployment"),
        "{stdout}"
    );
}

#[test]
fn examples_validate() {
    assert_passes(&["examples", "deploy/examples"]);
}

#[test]
fn monitoring_renders_and_validates() {
    let stdout = assert_passes(&["monitoring", "deploy/kubernetes/monitoring"]);
    assert!(
        stdout.contains("ServiceMonitor") && stdout.contains("grafana-dashboard.json"),
        "{stdout}"
    );
}

#[test]
fn validator_rejects_each_broken_variant() {
    let output = validate(&["mutations"]);
    let stdout = text(&output.stdout);
    assert!(
        output.status.success(),
        "some broken variant was not rejected by the check meant for it:\n{}",
        report(&output)
    );
    let summary = stdout
        .lines()
        .find_map(|l| l.strip_prefix("mutations caught: "))
        .unwrap_or_else(|| panic!("no summary line:\n{}", report(&output)));
    let (caught, total) = summary
        .split_once(" of ")
        .and_then(|(c, t)| Some((c.parse::<usize>().ok()?, t.trim().parse::<usize>().ok()?)))
        .unwrap_or_else(|| panic!("unreadable summary {summary:?}"));
    assert_eq!(caught, total, "{}", report(&output));
    assert!(
        total >= MIN_MUTATIONS,
        "only {total} mutations were tried (at least {MIN_MUTATIONS} expected):\n{}",
        report(&output)
    );
    let missed = stdout.lines().filter(|l| l.starts_with("MISSED")).count();
    assert_eq!(missed, 0, "{}", report(&output));
}
