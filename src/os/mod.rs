//! The OS layer: one syscall, ioctl or tool run per function.
//!
//! Everything privileged that ferrovol does to the machine happens here; services and
//! backends call these helpers and never make syscalls of their own. The functions in
//! [`loopdev`], [`mount`] and [`statfs`] block; callers run them on blocking threads. The
//! ones in [`tools`] are async and run external programs with a timeout.

pub mod loopdev;
pub mod mount;
pub mod paths;
pub mod statfs;
pub mod tools;
