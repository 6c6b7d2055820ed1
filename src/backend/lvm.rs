//! The lvm backend (placeholder while it is written).
