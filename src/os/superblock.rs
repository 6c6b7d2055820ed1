//! Filesystem sizes read from the on-disk superblock (ext4, XFS, btrfs).
//!
//! NodeStageVolume compares this with the device size to tell whether a filesystem must
//! be grown: a volume restored or cloned into a larger volume, or expanded while it was
//! not staged, carries a filesystem smaller than its device. Reading three fields of a
//! superblock is exact and needs no tool.

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::Path;

use crate::config::FsType;
use crate::error::{Error, Result};

const EXT4_SUPERBLOCK: u64 = 1024;
const EXT4_MAGIC: u16 = 0xEF53;
const EXT4_INCOMPAT_64BIT: u32 = 0x80;
const BTRFS_SUPERBLOCK: u64 = 0x10000;

/// Reads a filesystem's size out of its superblock, `None` when the magic does not match.
type SuperblockParser = fn(&[u8]) -> Option<u64>;

fn le_u16(b: &[u8], at: usize) -> u16 {
    u16::from_le_bytes([b[at], b[at + 1]])
}

fn le_u32(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

fn le_u64(b: &[u8], at: usize) -> u64 {
    let mut bytes = [0u8; 8];
    bytes.copy_from_slice(&b[at..at + 8]);
    u64::from_le_bytes(bytes)
}

fn be_u32(b: &[u8], at: usize) -> u32 {
    u32::from_be_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

fn be_u64(b: &[u8], at: usize) -> u64 {
    let mut bytes = [0u8; 8];
    bytes.copy_from_slice(&b[at..at + 8]);
    u64::from_be_bytes(bytes)
}

/// The size in bytes that the filesystem on `device` spans, from its superblock.
///
/// # Errors
/// `Io` when the device cannot be read; `FailedPrecondition` when the superblock is not
/// of the expected type.
pub fn filesystem_bytes(device: &Path, fs: FsType) -> Result<u64> {
    let file = File::open(device).map_err(|e| Error::io("open", device, e))?;
    let mut block = [0u8; 512];
    let (offset, parse): (u64, SuperblockParser) = match fs {
        FsType::Ext4 => (EXT4_SUPERBLOCK, parse_ext4),
        FsType::Xfs => (0, parse_xfs),
        FsType::Btrfs => (BTRFS_SUPERBLOCK, parse_btrfs),
    };
    file.read_exact_at(&mut block, offset)
        .map_err(|e| Error::io("read superblock of", device, e))?;
    parse(&block).ok_or_else(|| {
        Error::FailedPrecondition(format!(
            "{} holds no {} superblock",
            device.display(),
            fs.as_str()
        ))
    })
}

fn parse_ext4(sb: &[u8]) -> Option<u64> {
    if le_u16(sb, 0x38) != EXT4_MAGIC {
        return None;
    }
    let mut blocks = u64::from(le_u32(sb, 0x4));
    if le_u32(sb, 0x60) & EXT4_INCOMPAT_64BIT != 0 {
        blocks |= u64::from(le_u32(sb, 0x150)) << 32;
    }
    let log = le_u32(sb, 0x18);
    (log <= 6).then(|| blocks << (10 + log))
}

fn parse_xfs(sb: &[u8]) -> Option<u64> {
    if &sb[0..4] != b"XFSB" {
        return None;
    }
    be_u64(sb, 8).checked_mul(u64::from(be_u32(sb, 4)))
}

fn parse_btrfs(sb: &[u8]) -> Option<u64> {
    if &sb[0x40..0x48] != b"_BHRfS_M" {
        return None;
    }
    Some(le_u64(sb, 0x70))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::process::Command;

    /// Formats an image file of `size` bytes and reads the size back from its superblock.
    fn formatted_size(fs: FsType, size: u64) -> u64 {
        let dir = tempfile::tempdir().expect("temp dir");
        let image = dir.path().join("fs.img");
        File::create(&image)
            .and_then(|f| f.set_len(size))
            .expect("image");
        let (program, args): (&str, &[&str]) = match fs {
            FsType::Ext4 => ("mkfs.ext4", &["-q", "-F"]),
            FsType::Xfs => ("mkfs.xfs", &["-q"]),
            FsType::Btrfs => ("mkfs.btrfs", &["-q"]),
        };
        let status = Command::new(program)
            .args(args)
            .arg(&image)
            .status()
            .unwrap_or_else(|e| panic!("{program}: {e}"));
        assert!(status.success(), "{program} failed");
        filesystem_bytes(&image, fs).expect("superblock")
    }

    #[test]
    fn superblocks_give_the_formatted_size() {
        assert_eq!(formatted_size(FsType::Ext4, 64 << 20), 64 << 20);
        assert_eq!(formatted_size(FsType::Xfs, 300 << 20), 300 << 20);
        assert_eq!(formatted_size(FsType::Btrfs, 256 << 20), 256 << 20);
    }

    #[test]
    fn a_blank_device_has_no_superblock() {
        let dir = tempfile::tempdir().expect("temp dir");
        let image = dir.path().join("blank.img");
        File::create(&image)
            .and_then(|f| f.set_len(1 << 20))
            .expect("image");
        for fs in [FsType::Ext4, FsType::Xfs, FsType::Btrfs] {
            assert!(
                matches!(
                    filesystem_bytes(&image, fs),
                    Err(Error::FailedPrecondition(_))
                ),
                "{fs:?}"
            );
        }
    }
}
