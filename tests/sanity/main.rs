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
//! check, pools on a filesystem the test makes), `host` (mountinfo, loop devices, space and
//! block counts, changes behind the driver's back), `requests` (request builders, code
//! assertions), `content` (test data written and verified).
//!
//! Tests: `identity` (GetPluginInfo, GetPluginCapabilities, Probe), `create` (CreateVolume,
//! DeleteVolume), `listing` (ListVolumes, GetCapacity), `controller` (capabilities,
//! ValidateVolumeCapabilities, Controller(Un)PublishVolume, ControllerGetVolume), `node`
//! (NodeGetInfo, capabilities, bad input, stats errors, volume condition), `lifecycle`
//! (stage/publish/unpublish/unstage with real loop devices and mounts), `data` (data
//! survives the lifecycle and teardowns behind the driver's back; no reformatting),
//! `restart` (SIGKILL and restart), `socket` (endpoint handling, shutdown, logs),
//! `snapshot` (CreateSnapshot, DeleteSnapshot, GetSnapshot, ListSnapshots), `restore`
//! (CreateVolume from a snapshot or a volume; snapshots outlive their source), `snapshot_data` (snapshots and clones of published volumes hold
//! the data of their moment, restored into grown filesystems), `expand`
//! (ControllerExpandVolume, NodeExpandVolume, online growth of ext4, xfs and block volumes),
//! `pool` (reflinks on an XFS pool, sparse copies on an ext4 pool), `crash` (SIGKILL at
//! every crash point of the driver, restart, retry; needs `--features crash-points`),
//! `stress` (overlapping calls from many clients, seeded), `hostile` (malformed and
//! hostile input to every RPC), `malformed` (undecodable bytes to every method), `exposure` (socket owner,
//! group and who may connect; no request data in `/metrics`), `full_pool`
//! (RESOURCE_EXHAUSTED, overprovisioning, ENOSPC inside a volume), `bench` (`ferrovol
//! bench` against a test driver: its report's counts and its clean-up).

mod content;
mod harness;
mod host;
mod lvm_vg;
mod requests;

mod bench;
mod concurrency;
mod controller;
mod crash;
mod create;
mod data;
mod expand;
mod exposure;
mod full_pool;
mod hostile;
mod identity;
mod kubectl_walk;
mod lifecycle;
mod listing;
mod lvm;
mod lvm_guest;
mod malformed;
mod node;
mod observability;
mod operator;
mod paths;
mod pool;
mod restart;
mod restore;
mod reuse;
mod snapshot;
mod snapshot_data;
mod socket;
mod stress;
