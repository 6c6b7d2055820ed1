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
