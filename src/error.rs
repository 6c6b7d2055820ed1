//! The crate's one error type and the single place that maps it to gRPC status codes.
//!
//! Variants are named for what went wrong; each carries the volume, path or tool it is
//! about so that the status message alone tells an operator what happened.

use std::io;
use std::path::PathBuf;

/// Result alias used throughout the crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Everything that can go wrong in ferrovol.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A request field is missing or malformed.
    #[error("{0}")]
    InvalidArgument(String),
    /// The volume, snapshot, node or path named by the request does not exist.
    #[error("{0}")]
    NotFound(String),
    /// An object with this name exists but differs from the request.
    #[error("{0}")]
    AlreadyExists(String),
    /// The request is valid but the volume is not in a state that allows it.
    #[error("{0}")]
    FailedPrecondition(String),
    /// A size that the driver cannot honour.
    #[error("{0}")]
    OutOfRange(String),
    /// The pool has no room, or the requested topology cannot be served.
    #[error("{0}")]
    ResourceExhausted(String),
    /// Another operation on the same object is in progress, or a list token went stale.
    #[error("{0}")]
    Aborted(String),
    /// A file or syscall failed.
    #[error("{op} {path}: {source}")]
    Io {
        /// What the driver was doing.
        op: &'static str,
        /// The file or device it was doing it to.
        path: PathBuf,
        /// The underlying error.
        source: io::Error,
    },
    /// An external tool (mkfs, blkid, ...) exited with an error.
    #[error("{program} {args} exited with {status}: {stderr}")]
    Tool {
        /// The program that ran.
        program: String,
        /// Its arguments, space separated.
        args: String,
        /// Its exit status.
        status: String,
        /// What it printed on stderr, trimmed.
        stderr: String,
    },
    /// An external tool or kernel call did not finish in time.
    #[error("{0} timed out")]
    Timeout(String),
    /// A durable record could not be read or written.
    #[error("metadata record {path}: {reason}")]
    Record {
        /// The record file.
        path: PathBuf,
        /// What was wrong with it.
        reason: String,
    },
    /// The RPC is not served by this driver or this process.
    #[error("{0}")]
    Unimplemented(String),
    /// A bug or an unexpected state inside the driver.
    #[error("{0}")]
    Internal(String),
}

impl Error {
    /// Wraps an `io::Error` with what was being done and to which path.
    pub fn io(op: &'static str, path: impl Into<PathBuf>, source: io::Error) -> Self {
        Error::Io {
            op,
            path: path.into(),
            source,
        }
    }

    /// Wraps an errno from a nix call with what was being done and to which path.
    pub fn sys(op: &'static str, path: impl Into<PathBuf>, errno: nix::errno::Errno) -> Self {
        Error::io(op, path, io::Error::from_raw_os_error(errno as i32))
    }

    /// The gRPC status code this error maps to.
    pub fn code(&self) -> tonic::Code {
        use tonic::Code;
        match self {
            Error::InvalidArgument(_) => Code::InvalidArgument,
            Error::NotFound(_) => Code::NotFound,
            Error::AlreadyExists(_) => Code::AlreadyExists,
            Error::FailedPrecondition(_) => Code::FailedPrecondition,
            Error::OutOfRange(_) => Code::OutOfRange,
            Error::ResourceExhausted(_) => Code::ResourceExhausted,
            Error::Aborted(_) => Code::Aborted,
            Error::Io { source, .. } => match source.raw_os_error() {
                Some(libc::ENOSPC) | Some(libc::EDQUOT) => Code::ResourceExhausted,
                Some(libc::EFBIG) => Code::OutOfRange,
                _ => Code::Internal,
            },
            Error::Timeout(_) => Code::DeadlineExceeded,
            Error::Unimplemented(_) => Code::Unimplemented,
            Error::Tool { .. } | Error::Record { .. } | Error::Internal(_) => Code::Internal,
        }
    }
}

/// The longest status message sent, in bytes. A status message travels in an HTTP/2
/// trailer, and clients refuse header blocks past a few KiB (16 KiB in h2), so a message
/// that echoed a huge request value would break the connection instead of answering.
pub const MAX_STATUS_MESSAGE: usize = 2048;

/// `text` cut to at most `max` bytes on a character boundary, saying how much was cut.
pub fn clipped(text: &str, max: usize) -> std::borrow::Cow<'_, str> {
    if text.len() <= max {
        return std::borrow::Cow::Borrowed(text);
    }
    let mut cut = max.saturating_sub(32);
    while !text.is_char_boundary(cut) {
        cut -= 1;
    }
    std::borrow::Cow::Owned(format!(
        "{}… ({} more bytes)",
        &text[..cut],
        text.len() - cut
    ))
}

impl From<Error> for tonic::Status {
    fn from(err: Error) -> Self {
        let message = err.to_string();
        tonic::Status::new(
            err.code(),
            clipped(&message, MAX_STATUS_MESSAGE).into_owned(),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_messages_are_clipped_on_a_character_boundary() {
        let long = Error::InvalidArgument(format!("fs_type {:?}", "é".repeat(1 << 20)));
        let status = tonic::Status::from(long);
        assert_eq!(status.code(), tonic::Code::InvalidArgument);
        assert!(status.message().len() <= MAX_STATUS_MESSAGE);
        assert!(status.message().starts_with("fs_type \"é"));
        assert!(status.message().ends_with("more bytes)"));
        let short = tonic::Status::from(Error::NotFound("volume x does not exist".into()));
        assert_eq!(short.message(), "volume x does not exist");
    }
}
