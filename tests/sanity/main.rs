//! ferrovol's CSI v1.12 conformance suite, written from the CSI spec.
//!
//! Every test starts the real `ferrovol` binary on its own unix socket in its own temp dir
//! (see [`harness::Driver`]) and talks gRPC to it; node tests stage and publish real loop
//! devices and mounts, so the suite must run as root. Each test ends with the leak check:
//! no mount under its temp dir and no loop device backed by its pool may remain.
//!
//! Run with `cargo test --test sanity` (as root).
//!
//! Support: `harness` (the driver process and its temp dir, CSI call shortcuts, the leak
//! check), `host` (mountinfo, loop devices, changes behind the driver's back), `requests`
//! (request builders, code assertions), `content` (test data written and verified).
//!
//! Tests: `identity` (GetPluginInfo, GetPluginCapabilities, Probe), `create` (CreateVolume,
//! DeleteVolume), `listing` (ListVolumes, GetCapacity), `controller` (capabilities,
//! ValidateVolumeCapabilities, Controller(Un)PublishVolume, ControllerGetVolume), `node`
//! (NodeGetInfo, capabilities, bad input, stats errors, volume condition), `lifecycle`
//! (stage/publish/unpublish/unstage with real loop devices and mounts), `data` (data
//! survives the lifecycle and teardowns behind the driver's back; no reformatting),
//! `restart` (SIGKILL and restart), `socket` (endpoint handling, shutdown, logs).

mod content;
mod harness;
mod host;
mod requests;

mod controller;
mod create;
mod data;
mod identity;
mod lifecycle;
mod listing;
mod node;
mod restart;
mod reuse;
mod socket;
