//! The one path every CSI RPC takes through the services: a tracing span, the metrics and
//! the mapping of the crate's error to a gRPC status.
//!
//! The span (`rpc`) carries the method, the volume or snapshot id or name the request is
//! about, and, once the answer is known, its status code and duration. One event closes
//! it: `info` for a mutating RPC, `debug` for the frequent read-only ones (Probe,
//! capabilities, GetCapacity), `warn` or `error` for failures. Values that come from a
//! request, and error messages (which quote request values), are shortened and printed
//! quoted, so a hostile name cannot forge log lines.
//! Request `secrets` never reach this module.

use std::future::Future;

use tonic::{Code, Response, Status};
use tracing::field::{debug, Empty};
use tracing::{Instrument, Level};

use crate::driver::Driver;
use crate::metrics::code_name;

/// How much of a request value a log line shows.
const MAX_LOGGED_CHARS: usize = 128;
/// How much of an error message a log line shows.
const MAX_LOGGED_ERROR_CHARS: usize = 1024;

/// What an RPC is about, as its span shows it.
#[derive(Debug, Default)]
pub struct Subject {
    /// `volume_id` of the request.
    volume_id: Option<String>,
    /// `snapshot_id` of the request.
    snapshot_id: Option<String>,
    /// `name` of a CreateVolume or CreateSnapshot request.
    name: Option<String>,
}

fn shortened(value: &str) -> String {
    match value.char_indices().nth(MAX_LOGGED_CHARS) {
        Some((cut, _)) => format!("{}…", &value[..cut]),
        None => value.to_owned(),
    }
}

impl Subject {
    /// An RPC about nothing in particular (capabilities, listings).
    pub fn none() -> Self {
        Subject::default()
    }

    /// An RPC about a volume.
    pub fn volume(volume_id: &str) -> Self {
        Subject {
            volume_id: Some(shortened(volume_id)),
            ..Subject::default()
        }
    }

    /// An RPC about a snapshot.
    pub fn snapshot(snapshot_id: &str) -> Self {
        Subject {
            snapshot_id: Some(shortened(snapshot_id)),
            ..Subject::default()
        }
    }

    /// An RPC that creates something by name (from a volume, for CreateSnapshot).
    pub fn name(name: &str, source_volume_id: Option<&str>) -> Self {
        Subject {
            name: Some(shortened(name)),
            volume_id: source_volume_id.map(shortened),
            ..Subject::default()
        }
    }
}

/// An error message as a log field: cut to [`MAX_LOGGED_ERROR_CHARS`], and printed quoted
/// (Debug), because messages embed request values that may hold newlines.
fn shortened_error(e: &crate::Error) -> String {
    let text = e.to_string();
    match text.char_indices().nth(MAX_LOGGED_ERROR_CHARS) {
        Some((cut, _)) => format!("{}…", &text[..cut]),
        None => text,
    }
}

/// Whether a method is asked often and changes nothing, so its success logs at debug.
fn is_routine(method: &str) -> bool {
    matches!(
        method,
        "Probe"
            | "GetPluginInfo"
            | "GetPluginCapabilities"
            | "ControllerGetCapabilities"
            | "NodeGetCapabilities"
            | "NodeGetInfo"
            | "GetCapacity"
            | "ListVolumes"
            | "ListSnapshots"
            | "NodeGetVolumeStats"
            | "ControllerGetVolume"
            | "GetSnapshot"
    )
}

/// Whether a code says the driver failed, rather than the request.
fn is_server_fault(code: Code) -> bool {
    matches!(
        code,
        Code::Internal | Code::Unknown | Code::DeadlineExceeded | Code::DataLoss
    )
}

/// Runs one RPC's work inside its span, records its metrics and turns its result into a
/// gRPC answer.
///
/// # Errors
/// The work's error, as a `tonic::Status` with the code [`crate::Error::code`] picks.
pub async fn serve<T, W>(
    driver: &Driver,
    method: &'static str,
    subject: Subject,
    work: W,
) -> Result<Response<T>, Status>
where
    W: Future<Output = crate::Result<T>>,
{
    let span = tracing::info_span!(
        "rpc",
        method,
        volume_id = Empty,
        snapshot_id = Empty,
        name = Empty,
        code = Empty,
        duration_ms = Empty,
    );
    if let Some(id) = &subject.volume_id {
        span.record("volume_id", debug(id));
    }
    if let Some(id) = &subject.snapshot_id {
        span.record("snapshot_id", debug(id));
    }
    if let Some(name) = &subject.name {
        span.record("name", debug(name));
    }
    let in_flight = driver.metrics.begin(method);
    let result = work.instrument(span.clone()).await;
    let code = match &result {
        Ok(_) => Code::Ok,
        Err(e) => e.code(),
    };
    let elapsed = in_flight.finish(code);
    span.record("code", code_name(code));
    span.record("duration_ms", elapsed.as_secs_f64() * 1000.0);
    span.in_scope(|| match &result {
        Ok(_) if is_routine(method) => tracing::event!(Level::DEBUG, "rpc done"),
        Ok(_) => tracing::event!(Level::INFO, "rpc done"),
        Err(e) if is_server_fault(code) => {
            tracing::event!(Level::ERROR, error = ?shortened_error(e), "rpc failed")
        }
        Err(e) => tracing::event!(Level::WARN, error = ?shortened_error(e), "rpc refused"),
    });
    result.map(Response::new).map_err(Status::from)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn long_values_are_cut() {
        assert_eq!(shortened("fv-1"), "fv-1");
        let long = "x".repeat(1 << 20);
        let cut = shortened(&long);
        assert_eq!(cut.chars().count(), MAX_LOGGED_CHARS + 1);
        let wide = "é".repeat(200);
        assert!(shortened(&wide).starts_with("éé"));
    }
}
