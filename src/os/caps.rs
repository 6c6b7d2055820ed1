//! Process capabilities, read from `/proc/self/status`.
//!
//! Some kernel operations need a capability that a root process may still lack in a
//! restricted container: ext4 online resize needs `CAP_SYS_RESOURCE`. Checking first lets
//! the driver say so instead of passing on a tool's "Permission denied".

use std::fs;

/// `CAP_SYS_RESOURCE`, needed for ext4 online resize.
pub const CAP_SYS_RESOURCE: u32 = 24;

/// Whether this process has capability `bit` in its effective set.
pub fn has_effective(bit: u32) -> bool {
    fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|status| {
            status
                .lines()
                .find_map(|l| l.strip_prefix("CapEff:"))
                .and_then(|hex| u64::from_str_radix(hex.trim(), 16).ok())
        })
        .is_some_and(|effective| bit < 64 && effective & (1 << bit) != 0)
}
