//! ferrovol: a node-local Kubernetes CSI driver.
//!
//! The library holds all the logic; the `ferrovol` binary is a thin command line over
//! [`server::run`]. Requests flow one way: a gRPC service module ([`identity`],
//! [`controller`], [`node`]) validates the request, takes the per-volume lock and maps
//! errors; a [`backend`] or the [`os`] layer does the work; the [`store`] records the
//! outcome.

pub mod admin;
pub mod backend;
pub mod bench;
pub mod config;
pub mod controller;
pub mod crash;
pub mod driver;
pub mod error;
pub mod http;
pub mod identity;
pub mod ids;
pub mod locks;
pub mod metrics;
pub mod node;
pub mod os;
pub mod rpc;
pub mod server;
pub mod store;
pub mod validate;

/// Code generated from `proto/csi.proto` (CSI v1.12, package `csi.v1`).
pub mod csi {
    /// The `csi.v1` package.
    #[allow(missing_docs, clippy::all, missing_debug_implementations)]
    pub mod v1 {
        tonic::include_proto!("csi.v1");
    }
}

pub use error::{Error, Result};
