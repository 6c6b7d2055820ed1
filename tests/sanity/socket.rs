//! The endpoint and the process: socket permissions, one driver per socket, stale sockets,
//! graceful SIGTERM, the tcp endpoint, JSON logs.
//!
//! RPCs: GetPluginInfo and Probe, as the "is it serving" check.

use std::os::unix::fs::FileTypeExt;
use std::time::Duration;

use ferrovol::csi::v1::{GetPluginInfoRequest, ProbeRequest};

use crate::content::read_string;
use crate::harness::{wait_bounded, Driver, Options};
use crate::host::mode_of;
use crate::requests::{ok, DRIVER_NAME};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn socket_mode_is_0660_or_tighter() {
    let d = Driver::start().await;
    let meta = std::fs::symlink_metadata(&d.socket).expect("stat the socket");
    assert!(
        meta.file_type().is_socket(),
        "{} is not a socket",
        d.socket.display()
    );
    let mode = mode_of(&d.socket);
    assert_eq!(
        mode & !0o660,
        0,
        "socket mode {mode:o} grants more than 0660"
    );
    d.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_first_start_creates_the_state_and_pool_dirs() {
    // A fresh node: neither directory exists yet (the harness normally makes them).
    let mut d = Driver::prepare(Options::default());
    std::fs::remove_dir(&d.state).expect("remove the state dir");
    std::fs::remove_dir(&d.pool).expect("remove the pool dir");
    d.spawn_and_connect().await;
    assert!(d.state.is_dir() && d.pool.is_dir());
    ok(
        d.identity().probe(ProbeRequest {}).await,
        "Probe on a first start",
    );
    d.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn second_driver_on_a_live_socket_fails() {
    let mut d = Driver::start().await;
    // Same socket, its own pool and state, so only the socket is contested.
    let pool2 = d.root.join("pool2");
    let state2 = d.root.join("state2");
    std::fs::create_dir_all(&pool2).expect("pool2");
    std::fs::create_dir_all(&state2).expect("state2");
    let args: Vec<String> = vec![
        "--endpoint".into(),
        d.endpoint.clone(),
        "--node-id".into(),
        "second".into(),
        "--state-dir".into(),
        state2.display().to_string(),
        "--pool-dir".into(),
        pool2.display().to_string(),
    ];
    let mut second = d.spawn_process(&args);
    let status = wait_bounded(&mut second, Duration::from_secs(10)).await;
    let Some(status) = status else {
        let _ = second.kill();
        let _ = second.wait();
        panic!(
            "a second driver on a live socket kept running\n{}",
            d.log_text()
        );
    };
    assert!(!status.success(), "second driver exited with {status}");

    // The first driver still owns and serves its socket.
    assert!(
        d.socket.exists(),
        "the second driver removed the live socket"
    );
    assert!(d.is_running(), "the first driver died");
    let fresh = crate::harness::connect_unix(&d.socket)
        .await
        .expect("connect to the first driver again");
    let info = ok(
        ferrovol::csi::v1::identity_client::IdentityClient::new(fresh)
            .get_plugin_info(GetPluginInfoRequest {})
            .await,
        "GetPluginInfo on the first driver over a new connection",
    );
    assert_eq!(info.name, DRIVER_NAME);
    d.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stale_socket_file_is_replaced() {
    let mut d = Driver::prepare(Options::default());
    {
        // Bound and closed: the file stays, nobody listens.
        let _listener =
            std::os::unix::net::UnixListener::bind(&d.socket).expect("bind a stale socket");
    }
    assert!(d.socket.exists(), "stale socket file");
    d.spawn_and_connect().await;
    ok(
        d.identity().probe(ProbeRequest {}).await,
        "Probe after replacing a stale socket",
    );
    assert_eq!(mode_of(&d.socket) & !0o660, 0, "replaced socket mode");
    d.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_exits_zero_and_removes_the_socket() {
    let mut d = Driver::start().await;
    ok(d.identity().probe(ProbeRequest {}).await, "Probe");
    let status = d.stop().await;
    assert!(
        status.success(),
        "exit after SIGTERM: {status}\n{}",
        d.log_text()
    );
    assert!(!d.socket.exists(), "socket left behind after SIGTERM");
    d.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tcp_endpoint_serves() {
    let d = Driver::start_with(Options {
        tcp: true,
        ..Options::default()
    })
    .await;
    let info = ok(
        d.identity().get_plugin_info(GetPluginInfoRequest {}).await,
        "GetPluginInfo over tcp",
    );
    assert_eq!(info.name, DRIVER_NAME);
    d.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn json_log_format_writes_json_lines() {
    let mut d = Driver::start_with(Options {
        log_format: Some("json".to_owned()),
        ..Options::default()
    })
    .await;
    ok(d.identity().probe(ProbeRequest {}).await, "Probe");
    let status = d.stop().await;
    assert!(status.success(), "exit after SIGTERM: {status}");
    let log = read_string(&d.log);
    let lines: Vec<&str> = log.lines().filter(|l| !l.trim().is_empty()).collect();
    assert!(!lines.is_empty(), "no log output with --log-format json");
    for line in lines {
        let value: serde_json::Value = serde_json::from_str(line)
            .unwrap_or_else(|e| panic!("log line is not JSON ({e}): {line}"));
        assert!(value.is_object(), "log line is not a JSON object: {line}");
    }
    d.finish().await;
}
