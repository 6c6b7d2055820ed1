//! The driver's HTTP port (`--metrics-address`): `/metrics` in the Prometheus text format
//! and `/healthz`, which answers as Probe does (200 when ready, 503 with the reason when
//! not).
//!
//! HTTP/1.1 only, GET and HEAD only; a client gets 10 seconds to send its request head.
//! The port shows metric names, codes, counts and sizes, never a volume's data or a
//! request's secrets.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use http_body_util::Full;
use hyper::body::{Bytes, Incoming};
use hyper::header::{HeaderValue, CONTENT_TYPE};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::net::TcpListener;
use tracing::{debug, info, warn};

use crate::driver::Driver;
use crate::error::{Error, Result};
use crate::identity::IdentityService;

/// How long a client may take to send its request head.
const HEADER_TIMEOUT: Duration = Duration::from_secs(10);

/// Binds the HTTP port.
///
/// # Errors
/// `Io` when the address cannot be bound (in use, no permission).
pub async fn bind(addr: SocketAddr) -> Result<TcpListener> {
    TcpListener::bind(addr)
        .await
        .map_err(|e| Error::io("bind metrics address", addr.to_string(), e))
}

/// Serves `/metrics` and `/healthz` on `listener` until the task is dropped.
pub async fn serve(listener: TcpListener, driver: Arc<Driver>) {
    if let Ok(local) = listener.local_addr() {
        info!(address = %local, "serving /metrics and /healthz");
    }
    loop {
        let (stream, peer) = match listener.accept().await {
            Ok(accepted) => accepted,
            Err(e) => {
                warn!(cause = %e, "metrics port: accept failed");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let driver = Arc::clone(&driver);
        tokio::spawn(async move {
            let service = service_fn(move |req| answer(Arc::clone(&driver), req));
            let served = http1::Builder::new()
                .timer(TokioTimer::new())
                .header_read_timeout(HEADER_TIMEOUT)
                .serve_connection(TokioIo::new(stream), service)
                .await;
            if let Err(e) = served {
                debug!(%peer, cause = %e, "metrics connection ended with an error");
            }
        });
    }
}

fn text(status: StatusCode, body: String, content_type: &'static str) -> Response<Full<Bytes>> {
    let mut response = Response::new(Full::new(Bytes::from(body)));
    *response.status_mut() = status;
    response
        .headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static(content_type));
    response
}

async fn answer(
    driver: Arc<Driver>,
    req: Request<Incoming>,
) -> std::result::Result<Response<Full<Bytes>>, Infallible> {
    const PLAIN: &str = "text/plain; charset=utf-8";
    if req.method() != Method::GET && req.method() != Method::HEAD {
        return Ok(text(
            StatusCode::METHOD_NOT_ALLOWED,
            "only GET and HEAD\n".into(),
            PLAIN,
        ));
    }
    let response = match req.uri().path() {
        "/metrics" => {
            let scraped = Arc::clone(&driver);
            match driver
                .blocking(move || scraped.metrics.render(&scraped))
                .await
            {
                Ok(body) => text(
                    StatusCode::OK,
                    body,
                    "text/plain; version=0.0.4; charset=utf-8",
                ),
                Err(e) => text(StatusCode::INTERNAL_SERVER_ERROR, format!("{e}\n"), PLAIN),
            }
        }
        "/healthz" => match IdentityService::new(Arc::clone(&driver)).readiness().await {
            Ok(()) => text(StatusCode::OK, "ok\n".into(), PLAIN),
            Err(e) => text(
                StatusCode::SERVICE_UNAVAILABLE,
                format!("not ready: {e}\n"),
                PLAIN,
            ),
        },
        _ => text(
            StatusCode::NOT_FOUND,
            "not found: try /metrics or /healthz\n".into(),
            PLAIN,
        ),
    };
    Ok(response)
}
