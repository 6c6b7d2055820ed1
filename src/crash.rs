//! Crash points: named places inside the RPCs where a test build can stop the process
//! dead, as a power cut or an OOM kill would, to prove that a retry after a restart
//! finishes the work and leaves nothing behind.
//!
//! # Design
//! [`crash_point!`](crate::crash_point) marks a point. Without the `crash-points` cargo
//! feature it expands to nothing. With it, the process sends itself SIGKILL at the point
//! whose name the environment variable [`ENV`] held when the server started serving
//! ([`arm_from_env`]): no destructor, no flush, no thaw runs, exactly like a crash. Points
//! reached during start-up (the pool owner file, for instance) never fire, so a driver
//! armed at a point always comes up and dies only inside an RPC.
//!
//! [`POINTS`] is the one list of points. The macro refuses, at compile time, a name that
//! is not in it, and the crash test (`tests/sanity/crash.rs`) runs every name in it, so a
//! new point can be neither misspelt nor left untested.

/// The environment variable that names the point to crash at.
pub const ENV: &str = "FERROVOL_CRASH_AT";

/// Whether this build has live crash points (the `crash-points` feature).
pub fn enabled() -> bool {
    cfg!(feature = "crash-points")
}

/// Every crash point, as `<rpc>.<step>`. The crash test maps each prefix to the RPC it
/// runs.
pub const POINTS: &[&str] = &[
    // CreateVolume (empty): backing file, then record.
    "create.before_file",
    "create.after_file",
    "create.after_record",
    // CreateVolume from a snapshot.
    "restore.before_copy",
    "restore.after_copy",
    "restore.after_record",
    // CreateVolume from a volume.
    "clone.before_copy",
    "clone.after_copy",
    "clone.after_record",
    // Inside every copy (snapshot, restore, clone): the data is in the new file, which
    // is not yet sized to the new volume.
    "copy.after_clone",
    // DeleteVolume: backing file, then record.
    "delete.before_file",
    "delete.after_file",
    "delete.after_record",
    // Inside a copy whose source is mounted on this node: frozen, not yet copied.
    "copy.frozen",
    // CreateSnapshot: copy (frozen when staged), then record.
    "snapshot.before_copy",
    "snapshot.after_copy",
    "snapshot.after_record",
    // ControllerExpandVolume: backing file, then record.
    "expand.before_grow",
    "expand.after_grow",
    "expand.after_record",
    // NodeExpandVolume with a capacity the controller has not applied (node expansion):
    // file, record, loop capacity, filesystem.
    "node_expand.before_grow_file",
    "node_expand.after_grow_file",
    "node_expand.after_capacity",
    "node_expand.after_fs_grow",
    // NodeStageVolume: record, loop device, mkfs (with its intent record), mount.
    "stage.after_record",
    "stage.before_attach",
    "stage.after_attach",
    "stage.before_mkfs",
    "stage.after_mkfs",
    "stage.after_format_record",
    "stage.before_mount",
    "stage.after_mount",
    // NodeUnstageVolume: unmount, detach, record.
    "unstage.before_unmount",
    "unstage.after_unmount",
    "unstage.after_detach",
    "unstage.after_record",
    // Any record write: the temporary file is written and synced, not yet renamed.
    "store.before_rename",
];

/// Whether `name` is in [`POINTS`]; usable in constants, so the macro can check names
/// while compiling.
pub const fn is_listed(name: &str) -> bool {
    let mut i = 0;
    while i < POINTS.len() {
        if same(POINTS[i].as_bytes(), name.as_bytes()) {
            return true;
        }
        i += 1;
    }
    false
}

const fn same(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    let mut i = 0;
    while i < a.len() {
        if a[i] != b[i] {
            return false;
        }
        i += 1;
    }
    true
}

/// Marks a crash point. The name must be a string literal listed in
/// [`crash::POINTS`](crate::crash::POINTS); without the `crash-points` feature this is no
/// code at all.
#[macro_export]
macro_rules! crash_point {
    ($name:literal) => {{
        #[cfg(feature = "crash-points")]
        {
            const _: () = assert!(
                $crate::crash::is_listed($name),
                concat!("crash point ", $name, " is not listed in crash::POINTS")
            );
            $crate::crash::reached($name);
        }
    }};
}

#[cfg(feature = "crash-points")]
static ARMED: std::sync::OnceLock<String> = std::sync::OnceLock::new();

/// Reads [`ENV`] once; from now on the point it names kills the process. Call it when
/// the driver starts serving. Does nothing without the `crash-points` feature.
pub fn arm_from_env() {
    #[cfg(feature = "crash-points")]
    if let Some(name) = std::env::var_os(ENV).and_then(|v| v.into_string().ok()) {
        if !is_listed(&name) {
            tracing::warn!(point = %name, "{ENV} names no crash point; nothing will crash");
        }
        tracing::warn!(point = %name, "crash point armed: the process kills itself there");
        let _ = ARMED.set(name);
    }
}

/// Called by [`crash_point!`]: kills the process with SIGKILL when `name` is armed.
#[cfg(feature = "crash-points")]
pub fn reached(name: &str) {
    if ARMED.get().is_some_and(|armed| armed == name) {
        // Said on stderr without the logging machinery, so it shows even though nothing
        // gets flushed after the kill.
        eprintln!("ferrovol: crash point {name} reached: SIGKILL");
        let _ = nix::sys::signal::raise(nix::sys::signal::Signal::SIGKILL);
        // raise(SIGKILL) does not return; should it ever, still die without any cleanup.
        std::process::abort();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn points_are_unique_and_named_rpc_dot_step() {
        let mut seen = std::collections::BTreeSet::new();
        for point in POINTS {
            assert!(seen.insert(*point), "{point} listed twice");
            let (rpc, step) = point.split_once('.').expect("<rpc>.<step>");
            assert!(!rpc.is_empty() && !step.is_empty(), "{point}");
            assert!(is_listed(point));
        }
        assert!(!is_listed("create.nowhere"));
        assert!(!is_listed(""));
    }
}
