//! The loop backend's space tally: what every volume was promised and what it already
//! holds, kept in memory so that CreateVolume and GetCapacity cost O(1), not a `stat(2)`
//! of every backing file.
//!
//! # Design
//! A pool can promise `ratio × (free + held) − promised`, where `free` is the pool
//! filesystem's available space (one `statvfs(2)`), `held` the bytes the volumes' sparse
//! files already occupy (each capped at its size) and `promised` the sum of their sizes.
//! With the ratio at 1 that is the free space less what every volume may still grow into:
//! no overcommit. A volume's writes move bytes from `free` to `held`, so the figure does
//! not change while volumes fill; only creating, growing and deleting volumes (which the
//! tally sees, under the backend's allocation lock) and writers outside the pool change it.
//!
//! The tally learns a volume's `held` bytes when it creates, grows or adopts it, and
//! in a recount (`stat` of every backing file): at start, before any refusal and when
//! GetCapacity finds the figures older than [`RECOUNT_AFTER`]. Between recounts the held
//! figures can only be too low (sparse files grow as they are written), which makes the
//! offer too small, never too large: a request the fast figure refuses is checked again
//! after a recount before it is refused.
//!
//! # Limitations
//! A volume whose filesystem discards blocks (`fstrim`) shrinks its file; until the next
//! recount the tally then counts those bytes as held and as free at once, so the offer is
//! too large by what was trimmed since the last recount.

use std::collections::HashMap;
use std::path::Path;
use std::time::{Duration, Instant};

use crate::error::Result;
use crate::ids::VolumeId;

/// How old the held figures may be before GetCapacity recounts them.
pub const RECOUNT_AFTER: Duration = Duration::from_secs(10);

/// One volume as the tally knows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Holding {
    /// The volume's size: what it was promised.
    pub size_bytes: u64,
    /// Bytes its file occupied when last measured, capped at `size_bytes`.
    pub held_bytes: u64,
}

impl Holding {
    /// A volume of `size_bytes` whose file occupies `allocated_bytes`.
    pub fn new(size_bytes: u64, allocated_bytes: u64) -> Self {
        Holding {
            size_bytes,
            held_bytes: allocated_bytes.min(size_bytes),
        }
    }

    /// Bytes the volume may still grow into.
    pub fn unheld_bytes(self) -> u64 {
        self.size_bytes - self.held_bytes
    }
}

/// Every volume's promise and holding, and their sums.
#[derive(Debug)]
pub struct SpaceTally {
    /// Each volume with a backing file (or one being made).
    volumes: HashMap<VolumeId, Holding>,
    /// Sum of `size_bytes`.
    promised: u64,
    /// Sum of `held_bytes`.
    held: u64,
    /// When the held figures were last measured for every volume.
    counted_at: Instant,
}

impl SpaceTally {
    /// A tally of the given volumes.
    pub fn from_holdings(holdings: impl IntoIterator<Item = (VolumeId, Holding)>) -> Self {
        let mut tally = SpaceTally {
            volumes: HashMap::new(),
            promised: 0,
            held: 0,
            counted_at: Instant::now(),
        };
        for (id, holding) in holdings {
            tally.set(id, holding);
        }
        tally
    }

    /// Measures every volume with `measure` (which answers `None` for a volume whose
    /// file is gone) and starts a new tally from the figures.
    ///
    /// # Errors
    /// The first error of `measure`.
    pub fn count(
        ids: Vec<VolumeId>,
        mut measure: impl FnMut(&VolumeId) -> Result<Option<Holding>>,
    ) -> Result<Self> {
        let mut holdings = Vec::with_capacity(ids.len());
        for id in ids {
            if let Some(holding) = measure(&id)? {
                holdings.push((id, holding));
            }
        }
        Ok(Self::from_holdings(holdings))
    }

    /// How the tally knows volume `id`, if at all.
    pub fn get(&self, id: &VolumeId) -> Option<Holding> {
        self.volumes.get(id).copied()
    }

    /// Records (or replaces) what volume `id` was promised and holds.
    pub fn set(&mut self, id: VolumeId, holding: Holding) {
        if let Some(old) = self.volumes.insert(id, holding) {
            self.promised -= old.size_bytes;
            self.held -= old.held_bytes;
        }
        self.promised = self.promised.saturating_add(holding.size_bytes);
        self.held = self.held.saturating_add(holding.held_bytes);
    }

    /// Forgets volume `id` (its storage is gone).
    pub fn remove(&mut self, id: &VolumeId) {
        if let Some(old) = self.volumes.remove(id) {
            self.promised -= old.size_bytes;
            self.held -= old.held_bytes;
        }
    }

    /// How many volumes the tally holds.
    pub fn len(&self) -> usize {
        self.volumes.len()
    }

    /// Whether the tally holds no volume.
    pub fn is_empty(&self) -> bool {
        self.volumes.is_empty()
    }

    /// Whether the held figures are older than `limit`.
    pub fn older_than(&self, limit: Duration) -> bool {
        self.counted_at.elapsed() > limit
    }

    /// Bytes the pool can still promise, given `free_bytes` available on its filesystem
    /// and the overprovisioning `ratio` (1.0: never promise more than exists).
    pub fn available(&self, free_bytes: u64, ratio: f64) -> u64 {
        let base = free_bytes.saturating_add(self.held);
        let capacity = if ratio == 1.0 {
            base
        } else {
            // f64 holds byte counts exactly up to 8 PiB; the float-to-int cast saturates.
            #[allow(clippy::cast_precision_loss, clippy::cast_possible_truncation)]
            let scaled = (base as f64 * ratio) as u64;
            #[allow(clippy::cast_sign_loss)]
            scaled
        };
        capacity.saturating_sub(self.promised)
    }
}

/// Whether `ratio` is a usable overprovisioning ratio (finite and at least 1).
pub fn valid_ratio(ratio: f64) -> bool {
    ratio.is_finite() && ratio >= 1.0
}

/// The bytes a file at `path` occupies, or `None` when it does not exist.
///
/// # Errors
/// `Io` when it cannot be stat'ed.
pub fn measure_file(path: &Path) -> Result<Option<Holding>> {
    use std::os::unix::fs::MetadataExt;
    match std::fs::metadata(path) {
        Ok(meta) => Ok(Some(Holding::new(
            meta.len(),
            meta.blocks().saturating_mul(512),
        ))),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(crate::error::Error::io("stat backing file", path, e)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(name: &str) -> VolumeId {
        VolumeId::from_name(name)
    }

    #[test]
    fn sums_follow_sets_replacements_and_removals() {
        let mut tally = SpaceTally::from_holdings([(id("a"), Holding::new(100, 10))]);
        assert_eq!(tally.available(1000, 1.0), 1000 + 10 - 100);
        tally.set(id("b"), Holding::new(200, 0));
        assert_eq!(tally.available(1000, 1.0), 1000 + 10 - 300);
        // A replacement counts once, with its new figures.
        tally.set(id("a"), Holding::new(150, 150));
        assert_eq!(tally.available(1000, 1.0), 1000 + 150 - 350);
        tally.remove(&id("a"));
        tally.remove(&id("never"));
        assert_eq!(tally.available(1000, 1.0), 1000 - 200);
        assert_eq!(tally.len(), 1);
        tally.remove(&id("b"));
        assert!(tally.is_empty());
        assert_eq!(tally.available(1000, 1.0), 1000);
    }

    #[test]
    fn held_bytes_are_capped_at_the_size() {
        // A file can occupy a little more than its size (extent metadata): that must not
        // make other volumes' promises look smaller.
        let holding = Holding::new(100, 4096);
        assert_eq!(holding.held_bytes, 100);
        assert_eq!(holding.unheld_bytes(), 0);
        let tally = SpaceTally::from_holdings([(id("a"), holding)]);
        assert_eq!(tally.available(50, 1.0), 50);
    }

    #[test]
    fn writes_inside_volumes_do_not_change_the_offer() {
        // Free space moves into held space as a volume is written.
        let before = SpaceTally::from_holdings([(id("a"), Holding::new(600, 0))]);
        let after = SpaceTally::from_holdings([(id("a"), Holding::new(600, 400))]);
        assert_eq!(before.available(1000, 1.0), after.available(600, 1.0));
        // A stale (too low) held figure only makes the offer smaller.
        assert!(before.available(600, 1.0) < after.available(600, 1.0));
    }

    #[test]
    fn overprovisioning_scales_the_pool_and_never_underflows() {
        let tally = SpaceTally::from_holdings([(id("a"), Holding::new(3000, 0))]);
        assert_eq!(tally.available(1000, 1.0), 0);
        assert_eq!(tally.available(1000, 4.0), 1000);
        assert_eq!(tally.available(u64::MAX, 2.0), u64::MAX - 3000);
        assert!(valid_ratio(1.0) && valid_ratio(2.5));
        assert!(!valid_ratio(0.5) && !valid_ratio(f64::NAN) && !valid_ratio(f64::INFINITY));
    }
}
