//! What a bench run made and has not yet removed, so that it cleans up after itself: after
//! the last iteration, after an error and after Ctrl-C alike.

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::sync::Mutex;

/// Everything a run made that still exists, as far as it knows.
#[derive(Debug, Default)]
struct Made {
    /// Volume ids.
    volumes: BTreeSet<String>,
    /// Snapshot ids.
    snapshots: BTreeSet<String>,
    /// Staged volumes: volume id -> staging path.
    staged: BTreeMap<String, PathBuf>,
    /// Published targets: target path -> volume id.
    published: BTreeMap<PathBuf, String>,
    /// Directories the bench made (removed when empty, deepest first).
    dirs: BTreeSet<PathBuf>,
}

/// The bench's own inventory, shared by its workers.
#[derive(Debug, Default)]
pub struct Resources {
    /// Guarded by a mutex: workers add and remove concurrently.
    made: Mutex<Made>,
}

/// What is left to remove, in the order it must go.
#[derive(Debug, Default)]
pub struct Leftovers {
    /// Targets to unpublish: (volume id, target path).
    pub published: Vec<(String, PathBuf)>,
    /// Volumes to unstage: (volume id, staging path).
    pub staged: Vec<(String, PathBuf)>,
    /// Snapshots to delete.
    pub snapshots: Vec<String>,
    /// Volumes to delete.
    pub volumes: Vec<String>,
    /// Directories to remove, deepest first.
    pub dirs: Vec<PathBuf>,
}

impl Leftovers {
    /// One line per leftover, for the report.
    pub fn describe(&self) -> Vec<String> {
        let mut lines = Vec::new();
        for (v, t) in &self.published {
            lines.push(format!("volume {v} published at {}", t.display()));
        }
        for (v, s) in &self.staged {
            lines.push(format!("volume {v} staged at {}", s.display()));
        }
        lines.extend(self.snapshots.iter().map(|s| format!("snapshot {s}")));
        lines.extend(self.volumes.iter().map(|v| format!("volume {v}")));
        lines.extend(
            self.dirs
                .iter()
                .map(|d| format!("directory {}", d.display())),
        );
        lines
    }
}

impl Resources {
    fn made(&self) -> std::sync::MutexGuard<'_, Made> {
        self.made.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A volume now exists.
    pub fn add_volume(&self, id: &str) {
        self.made().volumes.insert(id.to_owned());
    }

    /// A volume is gone.
    pub fn remove_volume(&self, id: &str) {
        self.made().volumes.remove(id);
    }

    /// A snapshot now exists.
    pub fn add_snapshot(&self, id: &str) {
        self.made().snapshots.insert(id.to_owned());
    }

    /// A snapshot is gone.
    pub fn remove_snapshot(&self, id: &str) {
        self.made().snapshots.remove(id);
    }

    /// A volume is staged at `path`.
    pub fn add_staged(&self, id: &str, path: PathBuf) {
        self.made().staged.insert(id.to_owned(), path);
    }

    /// A volume is no longer staged.
    pub fn remove_staged(&self, id: &str) {
        self.made().staged.remove(id);
    }

    /// A volume is published at `target`.
    pub fn add_published(&self, id: &str, target: PathBuf) {
        self.made().published.insert(target, id.to_owned());
    }

    /// Nothing is published at `target` any more.
    pub fn remove_published(&self, target: &PathBuf) {
        self.made().published.remove(target);
    }

    /// The bench made this directory.
    pub fn add_dir(&self, dir: PathBuf) {
        self.made().dirs.insert(dir);
    }

    /// The directory is gone.
    pub fn remove_dir(&self, dir: &PathBuf) {
        self.made().dirs.remove(dir);
    }

    /// Everything still there, in removal order.
    pub fn leftovers(&self) -> Leftovers {
        let made = self.made();
        let mut dirs: Vec<PathBuf> = made.dirs.iter().cloned().collect();
        dirs.sort_by_key(|d| std::cmp::Reverse(d.components().count()));
        Leftovers {
            published: made
                .published
                .iter()
                .map(|(t, v)| (v.clone(), t.clone()))
                .collect(),
            staged: made
                .staged
                .iter()
                .map(|(v, s)| (v.clone(), s.clone()))
                .collect(),
            snapshots: made.snapshots.iter().cloned().collect(),
            volumes: made.volumes.iter().cloned().collect(),
            dirs,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn leftovers_come_out_in_removal_order() {
        let r = Resources::default();
        r.add_volume("v1");
        r.add_volume("v2");
        r.add_staged("v1", PathBuf::from("/w/a/staging"));
        r.add_published("v1", PathBuf::from("/w/a/target"));
        r.add_snapshot("s1");
        r.add_dir(PathBuf::from("/w/a"));
        r.add_dir(PathBuf::from("/w/a/staging"));
        r.remove_volume("v2");
        let left = r.leftovers();
        assert_eq!(left.volumes, vec!["v1".to_owned()]);
        assert_eq!(left.published.len(), 1);
        assert_eq!(left.staged.len(), 1);
        assert_eq!(left.snapshots, vec!["s1".to_owned()]);
        assert_eq!(
            left.dirs,
            vec![PathBuf::from("/w/a/staging"), PathBuf::from("/w/a")]
        );
        assert_eq!(left.describe().len(), 6);
        r.remove_published(&PathBuf::from("/w/a/target"));
        r.remove_staged("v1");
        r.remove_snapshot("s1");
        r.remove_volume("v1");
        r.remove_dir(&PathBuf::from("/w/a"));
        r.remove_dir(&PathBuf::from("/w/a/staging"));
        assert!(r.leftovers().describe().is_empty());
    }
}
