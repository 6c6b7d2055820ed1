//! The OS layer: one syscall, ioctl or tool run per function.
//!
//! Everything privileged that ferrovol does to the machine happens here; services and
//! backends call these helpers and never make syscalls of their own. The functions in
//! [`loopdev`], [`mount`], [`paths`], [`statfs`], [`superblock`], [`clone`] and [`freeze`]
//! block; callers run them on blocking threads. The ones in [`tools`] and [`grow`] are
//! async and run external programs with a timeout.

pub mod blockdev;
pub mod caps;
pub mod clone;
pub mod command;
pub mod flock;
pub mod freeze;
pub mod grow;
pub mod loopdev;
pub mod mount;
pub mod paths;
pub mod statfs;
pub mod superblock;
pub mod tools;
