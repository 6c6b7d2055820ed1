//! One operation per volume at a time.
//!
//! A second concurrent operation on the same volume gets ABORTED, as the CSI spec asks.
//! The guard is an owned value: handlers move it into the spawned work so that the volume
//! stays locked until the kernel call really returns, even if the caller gave up.

use std::collections::HashSet;
use std::sync::{Arc, Mutex};

use crate::error::{Error, Result};

/// The set of keys (volume ids) with an operation in progress.
#[derive(Debug, Default)]
pub struct OpLocks {
    /// Keys currently held.
    busy: Mutex<HashSet<String>>,
}

/// Holds one key; releases it on drop.
#[derive(Debug)]
pub struct OpGuard {
    /// The lock set to release into.
    locks: Arc<OpLocks>,
    /// The key held.
    key: String,
}

impl OpLocks {
    /// Takes `key` for the caller, or fails at once with ABORTED if someone holds it.
    ///
    /// # Errors
    /// `Aborted` when another operation holds the key.
    pub fn try_lock(self: &Arc<Self>, key: &str) -> Result<OpGuard> {
        let mut busy = self
            .busy
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        if !busy.insert(key.to_owned()) {
            return Err(Error::Aborted(format!(
                "an operation on {key} is already in progress; retry later"
            )));
        }
        Ok(OpGuard {
            locks: Arc::clone(self),
            key: key.to_owned(),
        })
    }
}

impl Drop for OpGuard {
    fn drop(&mut self) {
        let mut busy = self
            .locks
            .busy
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        busy.remove(&self.key);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn second_lock_is_aborted_until_the_first_drops() {
        let locks = Arc::new(OpLocks::default());
        let first = locks.try_lock("fv-a").expect("free key");
        let second = locks.try_lock("fv-a");
        assert!(matches!(second, Err(Error::Aborted(_))));
        assert!(locks.try_lock("fv-b").is_ok(), "other keys proceed");
        drop(first);
        assert!(locks.try_lock("fv-a").is_ok());
    }
}

/// The file under the state directory that keeps `ferrovol gc` and running operations
/// apart.
pub const GATE_FILE: &str = "ops.lock";

/// The driver's side of the lock it shares with `ferrovol gc`: while any operation runs,
/// the process holds a shared `flock` on [`GATE_FILE`]; gc takes it exclusively. An
/// operation that arrives while gc holds it gets ABORTED (the CO retries).
#[derive(Debug)]
pub struct Gate {
    /// The open lock file; one open file, so one shared lock for the whole process.
    file: std::fs::File,
    /// Its path, for messages.
    path: std::path::PathBuf,
    /// How many operations are running; the lock is held while this is above zero.
    active: Mutex<usize>,
}

/// One running operation's share of the [`Gate`].
#[derive(Debug)]
pub struct GatePass {
    /// The gate to leave.
    gate: Arc<Gate>,
}

impl Gate {
    /// Opens the gate's lock file in `state_dir`.
    ///
    /// # Errors
    /// `Io` when the file cannot be opened.
    pub fn open(state_dir: &std::path::Path) -> Result<Self> {
        let path = state_dir.join(GATE_FILE);
        Ok(Gate {
            file: crate::os::flock::open(&path)?,
            path,
            active: Mutex::new(0),
        })
    }

    /// Lets an operation in.
    ///
    /// # Errors
    /// `Aborted` while `ferrovol gc` holds the lock; `Io` if the lock call fails.
    pub fn enter(self: &Arc<Self>) -> Result<GatePass> {
        let mut active = self
            .active
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        if *active == 0
            && !crate::os::flock::try_lock(&self.file, crate::os::flock::Kind::Shared, &self.path)?
        {
            return Err(Error::Aborted(
                "ferrovol gc is cleaning up this node; retry in a moment".into(),
            ));
        }
        *active += 1;
        Ok(GatePass {
            gate: Arc::clone(self),
        })
    }
}

impl Drop for GatePass {
    fn drop(&mut self) {
        let mut active = self
            .gate
            .active
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        *active = active.saturating_sub(1);
        if *active == 0 {
            if let Err(e) = crate::os::flock::unlock(&self.gate.file, &self.gate.path) {
                tracing::warn!(cause = %e, "cannot release the operations lock");
            }
        }
    }
}
