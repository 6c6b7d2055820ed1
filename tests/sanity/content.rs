//! Test data written through published volumes and checked later.
//!
//! Contents are a deterministic pseudo-random stream from a seed, so a check needs only the
//! seed, not a copy of the data. Files go through the mounted filesystem; block data goes
//! straight to the published device node at fixed offsets. Everything is fsynced before the
//! writer returns, because the tests then tear the volume down, sometimes behind the
//! driver's back.

use std::fs::{self, File, OpenOptions};
use std::io::{Read, Write};
use std::os::unix::fs::FileExt;
use std::path::Path;

/// `len` bytes of a xorshift stream seeded by `seed`.
pub fn pattern(seed: u64, len: usize) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    let mut out = Vec::with_capacity(len + 8);
    while out.len() < len {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        out.extend_from_slice(&x.to_le_bytes());
    }
    out.truncate(len);
    out
}

/// The files `write_files` makes: relative path and size.
const FILES: &[(&str, usize)] = &[
    ("small.txt", 100),
    ("dir/medium.bin", 256 * 1024),
    ("dir/sub/large.bin", 2 * 1024 * 1024),
];

/// Writes a small tree of files below `dir` and fsyncs them and their directories.
pub fn write_files(dir: &Path, seed: u64) {
    for (i, (rel, size)) in FILES.iter().enumerate() {
        let path = dir.join(rel);
        let parent = path.parent().expect("file has a parent");
        fs::create_dir_all(parent).unwrap_or_else(|e| panic!("create {}: {e}", parent.display()));
        let mut f =
            File::create(&path).unwrap_or_else(|e| panic!("create {}: {e}", path.display()));
        f.write_all(&pattern(seed + i as u64, *size))
            .unwrap_or_else(|e| panic!("write {}: {e}", path.display()));
        f.sync_all()
            .unwrap_or_else(|e| panic!("fsync {}: {e}", path.display()));
        File::open(parent)
            .and_then(|d| d.sync_all())
            .unwrap_or_else(|e| panic!("fsync {}: {e}", parent.display()));
    }
}

/// Asserts the tree `write_files(dir, seed)` made is there with the same contents.
pub fn verify_files(dir: &Path, seed: u64) {
    for (i, (rel, size)) in FILES.iter().enumerate() {
        let path = dir.join(rel);
        let got = fs::read(&path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()));
        assert!(
            got.len() == *size && got == pattern(seed + i as u64, *size),
            "{} changed: {} bytes, expected {size} bytes of the seed {seed} pattern",
            path.display(),
            got.len()
        );
    }
}

/// Offsets of the block-data chunks (bytes), each `BLOCK_CHUNK` long.
const BLOCK_OFFSETS: &[u64] = &[0, 3 << 20, 9 << 20];
/// Size of one block-data chunk.
const BLOCK_CHUNK: usize = 1 << 20;

/// Writes chunks at fixed offsets of a block device (the published target) and fsyncs.
/// The device must be at least 10 MiB.
pub fn write_block(device: &Path, seed: u64) {
    let f = OpenOptions::new()
        .write(true)
        .open(device)
        .unwrap_or_else(|e| panic!("open {} for writing: {e}", device.display()));
    for (i, off) in BLOCK_OFFSETS.iter().enumerate() {
        f.write_all_at(&pattern(seed + i as u64, BLOCK_CHUNK), *off)
            .unwrap_or_else(|e| panic!("write {} at {off}: {e}", device.display()));
    }
    f.sync_all()
        .unwrap_or_else(|e| panic!("fsync {}: {e}", device.display()));
}

/// Asserts the chunks `write_block(device, seed)` wrote are there.
pub fn verify_block(device: &Path, seed: u64) {
    let f = File::open(device).unwrap_or_else(|e| panic!("open {}: {e}", device.display()));
    for (i, off) in BLOCK_OFFSETS.iter().enumerate() {
        let mut buf = vec![0u8; BLOCK_CHUNK];
        f.read_exact_at(&mut buf, *off)
            .unwrap_or_else(|e| panic!("read {} at {off}: {e}", device.display()));
        assert!(
            buf == pattern(seed + i as u64, BLOCK_CHUNK),
            "{}: data at offset {off} changed",
            device.display()
        );
    }
}

/// The size of a block device in bytes (seek to its end).
pub fn block_size(device: &Path) -> u64 {
    use std::io::{Seek, SeekFrom};
    let mut f = File::open(device).unwrap_or_else(|e| panic!("open {}: {e}", device.display()));
    f.seek(SeekFrom::End(0))
        .unwrap_or_else(|e| panic!("seek {}: {e}", device.display()))
}

/// Reads a whole file to a string, panicking with its path.
pub fn read_string(path: &Path) -> String {
    let mut s = String::new();
    File::open(path)
        .and_then(|mut f| f.read_to_string(&mut s))
        .unwrap_or_else(|e| panic!("read {}: {e}", path.display()));
    s
}
