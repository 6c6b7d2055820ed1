//! Test data written through published volumes and checked later.
//!
//! Contents are a deterministic pseudo-random stream from a seed, so a check needs only the
//! seed, not a copy of the data. Files go through the mounted filesystem; block data goes
//! straight to the published device node at fixed offsets. Everything but `write_unsynced`
//! is fsynced before the writer returns, because the tests then tear the volume down,
//! sometimes behind the driver's back. Besides the small file tree there are big files (for
//! the space accounting of snapshots), files left unsynced on purpose (for the freeze around
//! a snapshot) and a byte-for-byte comparison of two image files.

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

/// Piece size of `write_big_file`: each piece has its own seed, so pieces cannot be mixed up.
const BIG_PIECE: usize = 4 << 20;

/// Writes a file of `len` bytes (a multiple of 4 MiB) at `path` and fsyncs it.
pub fn write_big_file(path: &Path, seed: u64, len: usize) {
    let mut f = File::create(path).unwrap_or_else(|e| panic!("create {}: {e}", path.display()));
    for i in 0..len / BIG_PIECE {
        f.write_all(&pattern(seed * 10_000 + i as u64, BIG_PIECE))
            .unwrap_or_else(|e| panic!("write {}: {e}", path.display()));
    }
    f.sync_all()
        .unwrap_or_else(|e| panic!("fsync {}: {e}", path.display()));
}

/// Asserts the file `write_big_file(path, seed, len)` made is there, unchanged.
pub fn verify_big_file(path: &Path, seed: u64, len: usize) {
    let mut f = File::open(path).unwrap_or_else(|e| panic!("open {}: {e}", path.display()));
    let got_len = f.metadata().expect("stat").len();
    assert_eq!(
        got_len,
        len as u64,
        "{} has the wrong length",
        path.display()
    );
    let mut buf = vec![0u8; BIG_PIECE];
    for i in 0..len / BIG_PIECE {
        f.read_exact(&mut buf)
            .unwrap_or_else(|e| panic!("read {}: {e}", path.display()));
        assert!(
            buf == pattern(seed * 10_000 + i as u64, BIG_PIECE),
            "{}: piece {i} (at {} MiB) changed",
            path.display(),
            i * 4
        );
    }
}

/// Writes `len` bytes of the seed's pattern to `path` without any fsync: the data sits in
/// the page cache of the volume's filesystem until writeback (or a freeze) flushes it.
pub fn write_unsynced(path: &Path, seed: u64, len: usize) {
    fs::write(path, pattern(seed, len)).unwrap_or_else(|e| panic!("write {}: {e}", path.display()));
}

/// Asserts `path` holds exactly `len` bytes of the seed's pattern.
pub fn verify_file(path: &Path, seed: u64, len: usize) {
    let got = fs::read(path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()));
    assert!(
        got.len() == len && got == pattern(seed, len),
        "{} changed: {} bytes, expected {len} bytes of the seed {seed} pattern",
        path.display(),
        got.len()
    );
}

/// Asserts two files have the same bytes (compared piece by piece, for large images).
pub fn assert_same_bytes(a: &Path, b: &Path) {
    let open = |p: &Path| File::open(p).unwrap_or_else(|e| panic!("open {}: {e}", p.display()));
    let (mut fa, mut fb) = (open(a), open(b));
    let (la, lb) = (
        fa.metadata().expect("stat").len(),
        fb.metadata().expect("stat").len(),
    );
    assert_eq!(
        la,
        lb,
        "{} and {} differ in length",
        a.display(),
        b.display()
    );
    let mut ba = vec![0u8; 1 << 20];
    let mut bb = vec![0u8; 1 << 20];
    let mut offset = 0u64;
    while offset < la {
        let n = usize::try_from((la - offset).min(1 << 20)).expect("fits");
        fa.read_exact(&mut ba[..n]).expect("read");
        fb.read_exact(&mut bb[..n]).expect("read");
        assert!(
            ba[..n] == bb[..n],
            "{} and {} differ in the MiB at {offset}",
            a.display(),
            b.display()
        );
        offset += n as u64;
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
