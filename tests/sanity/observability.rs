//! The HTTP port (`/metrics`, `/healthz`) and what the logs may and may not say.
//!
//! The metrics test runs a known sequence of RPCs on a fresh driver and then asserts the
//! exact counter values and label sets the scrape shows; the state gauges follow a staged
//! and published volume. `/healthz` must fail (503, with the reason) while the pool is
//! unusable and recover with it. Request secrets must appear in no log line and no error
//! message, in text and JSON logs alike.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fs;

use ferrovol::csi::v1::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tonic::Code;

use crate::harness::{Driver, Options};
use crate::requests::*;

/// One HTTP/1.1 request to the driver's metrics address; returns the status code and body.
pub async fn http(driver: &Driver, method: &str, path: &str) -> (u16, String) {
    let mut stream = TcpStream::connect(&driver.metrics_address)
        .await
        .unwrap_or_else(|e| panic!("connect to {}: {e}", driver.metrics_address));
    let request =
        format!("{method} {path} HTTP/1.1\r\nHost: ferrovol\r\nConnection: close\r\n\r\n");
    stream
        .write_all(request.as_bytes())
        .await
        .expect("send the HTTP request");
    let mut raw = Vec::new();
    stream
        .read_to_end(&mut raw)
        .await
        .expect("read the HTTP response");
    let text = String::from_utf8(raw).expect("the response is UTF-8");
    let (head, body) = text.split_once("\r\n\r\n").expect("a response head");
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|code| code.parse().ok())
        .unwrap_or_else(|| panic!("no status in {head:?}"));
    (status, body.to_owned())
}

/// A sample of the text format: metric name, labels, value.
#[derive(Debug, Clone, PartialEq)]
pub struct Sample {
    pub name: String,
    pub labels: BTreeMap<String, String>,
    pub value: f64,
}

/// Parses the Prometheus text format (no escapes in our label values).
pub fn parse_metrics(text: &str) -> Vec<Sample> {
    let mut samples = Vec::new();
    for line in text
        .lines()
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
    {
        let (series, value) = line
            .rsplit_once(' ')
            .expect("a sample line ends with a value");
        let value: f64 = value
            .parse()
            .unwrap_or_else(|_| panic!("bad value in {line:?}"));
        let (name, labels) = match series.split_once('{') {
            Some((name, rest)) => {
                let inner = rest.strip_suffix('}').expect("labels end with }");
                let labels = inner
                    .split(',')
                    .filter(|kv| !kv.is_empty())
                    .map(|kv| {
                        let (k, v) = kv.split_once('=').expect("label is k=v");
                        (k.to_owned(), v.trim_matches('"').to_owned())
                    })
                    .collect();
                (name.to_owned(), labels)
            }
            None => (series.to_owned(), BTreeMap::new()),
        };
        samples.push(Sample {
            name,
            labels,
            value,
        });
    }
    samples
}

/// The value of the one sample named `name` with exactly these labels.
pub fn value(samples: &[Sample], name: &str, labels: &[(&str, &str)]) -> Option<f64> {
    let wanted: BTreeMap<String, String> = labels
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect();
    samples
        .iter()
        .find(|s| s.name == name && s.labels == wanted)
        .map(|s| s.value)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_count_every_rpc_by_method_and_code() {
    let d = Driver::start().await;
    // The known sequence.
    ok(
        d.identity().get_plugin_info(GetPluginInfoRequest {}).await,
        "GetPluginInfo",
    );
    let cap = mount_cap("ext4");
    let volume = d.create("metrics-a", 64 << 20, cap.clone()).await;
    d.create("metrics-a", 64 << 20, cap.clone()).await; // idempotent repeat: OK again
    expect_code(
        d.controller()
            .create_volume(create_request("", 64 << 20, vec![cap.clone()]))
            .await,
        Code::InvalidArgument,
        "CreateVolume without a name",
    );
    expect_code(
        d.controller()
            .controller_get_volume(ControllerGetVolumeRequest {
                volume_id: format!("fv-{}", "0".repeat(32)),
            })
            .await,
        Code::NotFound,
        "ControllerGetVolume of a missing volume",
    );
    d.stage(&volume.volume_id, &cap).await;
    let target = d
        .publish(&volume.volume_id, &cap, "metrics-pod", false)
        .await;

    let (status, body) = http(&d, "GET", "/metrics").await;
    assert_eq!(status, 200, "{body}");
    let samples = parse_metrics(&body);
    let requests = "ferrovol_rpc_requests_total";
    let counts: BTreeMap<(String, String), f64> = samples
        .iter()
        .filter(|s| s.name == requests)
        .map(|s| {
            let keys: BTreeSet<&str> = s.labels.keys().map(String::as_str).collect();
            assert_eq!(keys, BTreeSet::from(["code", "method"]), "labels of {s:?}");
            (
                (s.labels["method"].clone(), s.labels["code"].clone()),
                s.value,
            )
        })
        .collect();
    let expected: BTreeMap<(String, String), f64> = [
        ("GetPluginInfo", "OK", 1.0),
        ("CreateVolume", "OK", 2.0),
        ("CreateVolume", "INVALID_ARGUMENT", 1.0),
        ("ControllerGetVolume", "NOT_FOUND", 1.0),
        ("NodeStageVolume", "OK", 1.0),
        ("NodePublishVolume", "OK", 1.0),
    ]
    .into_iter()
    .map(|(m, c, v)| ((m.to_owned(), c.to_owned()), v))
    .collect();
    assert_eq!(
        counts, expected,
        "request counters after the known sequence"
    );
    assert_eq!(
        value(
            &samples,
            "ferrovol_rpc_duration_seconds_count",
            &[("method", "CreateVolume")]
        ),
        Some(3.0)
    );
    assert_eq!(
        value(
            &samples,
            "ferrovol_rpc_in_flight",
            &[("method", "CreateVolume")]
        ),
        Some(0.0)
    );
    for (gauge, want) in [
        ("ferrovol_volumes", 1.0),
        ("ferrovol_snapshots", 0.0),
        ("ferrovol_staged_volumes", 1.0),
        ("ferrovol_published_targets", 1.0),
        ("ferrovol_loop_devices", 1.0),
    ] {
        assert_eq!(value(&samples, gauge, &[]), Some(want), "{gauge}");
    }
    let pool = [("backend", "loop"), ("pool", "default")];
    let total = value(&samples, "ferrovol_pool_capacity_bytes", &pool).expect("pool size");
    let available = value(&samples, "ferrovol_pool_available_bytes", &pool).expect("pool free");
    assert!(
        total > 0.0 && available > 0.0 && available <= total,
        "{total} {available}"
    );
    // Nothing of the volumes beyond counts and sizes: no id, no name, no path.
    for secretish in [volume.volume_id.as_str(), "metrics-a", "metrics-pod"] {
        assert!(!body.contains(secretish), "/metrics shows {secretish:?}");
    }

    // Other paths and methods.
    assert_eq!(http(&d, "GET", "/nothing").await.0, 404);
    assert_eq!(http(&d, "POST", "/metrics").await.0, 405);

    d.unpublish(&volume.volume_id, &target).await;
    d.unstage(&volume.volume_id).await;
    d.delete(&volume.volume_id).await;
    let after = parse_metrics(&http(&d, "GET", "/metrics").await.1);
    for gauge in [
        "ferrovol_volumes",
        "ferrovol_staged_volumes",
        "ferrovol_published_targets",
        "ferrovol_loop_devices",
    ] {
        assert_eq!(
            value(&after, gauge, &[]),
            Some(0.0),
            "{gauge} after teardown"
        );
    }
    assert_eq!(
        value(
            &after,
            requests,
            &[("method", "DeleteVolume"), ("code", "OK")]
        ),
        Some(1.0)
    );
    d.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn healthz_fails_while_the_pool_is_unusable() {
    let d = Driver::start().await;
    let (status, body) = http(&d, "GET", "/healthz").await;
    assert_eq!((status, body.as_str()), (200, "ok\n"));

    let away = d.root.join("pool-away");
    fs::rename(&d.pool, &away).expect("move the pool away");
    let (status, body) = http(&d, "GET", "/healthz").await;
    let probe = ok(d.identity().probe(ProbeRequest {}).await, "Probe");
    fs::rename(&away, &d.pool).expect("put the pool back");
    assert_eq!(status, 503, "{body}");
    assert!(
        body.contains("not ready") && body.contains("pool"),
        "the reason names the pool: {body:?}"
    );
    assert_eq!(probe.ready, Some(false), "Probe agrees with /healthz");

    assert_eq!(
        http(&d, "GET", "/healthz").await.0,
        200,
        "recovers with the pool"
    );
    d.finish().await;
}

/// A secret value that must never be printed.
const SECRET: &str = "s3cr3t-Hunter2-marker";

fn secrets() -> HashMap<String, String> {
    HashMap::from([
        ("password".to_owned(), SECRET.to_owned()),
        (format!("key-{SECRET}"), "x".to_owned()),
    ])
}

/// Every RPC that carries secrets, valid and invalid, in text and JSON logs: the secret is
/// in no log line and no status message.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn secrets_never_reach_logs_or_errors() {
    for format in ["text", "json"] {
        let d = Driver::start_with(Options {
            log_format: Some(format.to_owned()),
            ..Options::default()
        })
        .await;
        let mut messages = Vec::new();
        let mut note = |result: Result<String, tonic::Status>| match result {
            Ok(_) => {}
            Err(status) => messages.push(status.message().to_owned()),
        };
        let cap = mount_cap("ext4");
        let mut create = create_request("secret-vol", 64 << 20, vec![cap.clone()]);
        create.secrets = secrets();
        let volume = ok(
            d.controller().create_volume(create.clone()).await,
            "CreateVolume",
        )
        .volume
        .expect("a volume");
        let id = volume.volume_id.clone();
        let mut bad_create = create.clone();
        bad_create.capacity_range = range(-1, 0);
        note(
            d.controller()
                .create_volume(bad_create)
                .await
                .map(|_| String::new()),
        );
        let mut stage = d.stage_request(&id, &cap);
        stage.secrets = secrets();
        ok(
            d.node().node_stage_volume(stage.clone()).await,
            "NodeStageVolume",
        );
        let mut bad_stage = stage.clone();
        bad_stage.staging_target_path = "relative/path".to_owned();
        note(
            d.node()
                .node_stage_volume(bad_stage)
                .await
                .map(|_| String::new()),
        );
        let mut publish = d.publish_request(&id, &cap, "secret-pod", false);
        publish.secrets = secrets();
        ok(
            d.node().node_publish_volume(publish.clone()).await,
            "NodePublishVolume",
        );
        let mut bad_publish = publish.clone();
        bad_publish.volume_id = format!("fv-{}", "f".repeat(32));
        note(
            d.node()
                .node_publish_volume(bad_publish)
                .await
                .map(|_| String::new()),
        );
        let mut node_expand =
            d.node_expand_request(&id, &d.target_path("secret-pod"), &cap, 64 << 20);
        node_expand.secrets = secrets();
        note(
            d.node()
                .node_expand_volume(node_expand)
                .await
                .map(|_| String::new()),
        );
        note(
            d.controller()
                .controller_publish_volume(ControllerPublishVolumeRequest {
                    volume_id: id.clone(),
                    node_id: "someone-else".to_owned(),
                    volume_capability: Some(cap.clone()),
                    secrets: secrets(),
                    ..Default::default()
                })
                .await
                .map(|_| String::new()),
        );
        note(
            d.controller()
                .controller_expand_volume(ControllerExpandVolumeRequest {
                    volume_id: id.clone(),
                    capacity_range: range(-5, 0),
                    secrets: secrets(),
                    ..Default::default()
                })
                .await
                .map(|_| String::new()),
        );
        note(
            d.controller()
                .validate_volume_capabilities(ValidateVolumeCapabilitiesRequest {
                    volume_id: id.clone(),
                    volume_capabilities: vec![cap.clone()],
                    secrets: secrets(),
                    ..Default::default()
                })
                .await
                .map(|r| r.into_inner().message),
        );
        let mut snap = snapshot_request("secret-snap", &id);
        snap.secrets = secrets();
        let snapshot = ok(d.controller().create_snapshot(snap).await, "CreateSnapshot")
            .snapshot
            .expect("a snapshot");
        note(
            d.controller()
                .list_snapshots(ListSnapshotsRequest {
                    starting_token: "not-a-token".to_owned(),
                    secrets: secrets(),
                    ..Default::default()
                })
                .await
                .map(|_| String::new()),
        );
        ok(
            d.controller()
                .delete_snapshot(DeleteSnapshotRequest {
                    snapshot_id: snapshot.snapshot_id,
                    secrets: secrets(),
                })
                .await,
            "DeleteSnapshot",
        );
        d.unpublish(&id, &d.target_path("secret-pod")).await;
        d.unstage(&id).await;
        ok(
            d.controller()
                .delete_volume(DeleteVolumeRequest {
                    volume_id: id,
                    secrets: secrets(),
                })
                .await,
            "DeleteVolume",
        );
        assert!(
            messages.len() >= 6,
            "the invalid requests failed: {messages:?}"
        );
        for message in &messages {
            assert!(
                !message.contains(SECRET),
                "a status message shows the secret: {message}"
            );
        }
        let log = d.log_text();
        assert!(
            log.contains("rpc done"),
            "the {format} log has the RPC lines:\n{log}"
        );
        assert!(
            !log.contains(SECRET),
            "the {format} log shows the secret:\n{log}"
        );
        d.finish().await;
    }
}
