//! Copying a backing file into a new file, for snapshots and clones on the loop backend
//! (CreateSnapshot, CreateVolume from a snapshot or a volume): the `FICLONE` ioctl where the
//! pool filesystem has reflinks, otherwise a sparse-aware copy with `lseek(2)`
//! `SEEK_DATA`/`SEEK_HOLE` and `copy_file_range(2)`. The copy is made durable with
//! `fsync(2)` on the file and its directory.
//!
//! # Design
//! A reflink (XFS with `reflink=1`, btrfs) takes constant time and no space: the two files
//! share extents until one is written. Where the filesystem cannot reflink (ext4, tmpfs,
//! source and destination on different filesystems), [`clone_file`] falls back to
//! [`sparse_copy`], which walks the data extents of the source and copies only those, so a
//! mostly empty volume stays mostly unallocated in its copy. `copy_file_range` lets the
//! kernel move the bytes (or share them, on filesystems that can); when it cannot work
//! between these two files (different filesystems), plain `pread`/`pwrite` take over.
//!
//! The caller never sees a half copy: on any failure, the partly written destination is
//! removed before the error is returned (also when the copy panics).
//!
//! # Limitations
//! The source must not be written during the copy (the caller freezes a mounted volume
//! first). A source that shrinks meanwhile does not fail the copy: it ends where the source
//! ended, and the rest of the destination, up to the length the source had when the copy
//! began, reads as zeros. [`supports_reflink`] leaves two files named
//! `.ferrovol-reflink-probe-*` behind only if the process dies in the middle of the probe.

use std::fs::{self, File, OpenOptions};
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};

use nix::errno::Errno;
use nix::unistd::{lseek, Whence};

use crate::error::{Error, Result};

// FICLONE is `_IOW(0x94, 9, int)` = 0x40049409; its argument is the source fd by value.
nix::ioctl_write_int!(ficlone, 0x94, 9);

/// The most one `copy_file_range` call is asked to copy (the kernel caps a call lower).
const COPY_CHUNK: usize = 1 << 30;
/// Buffer size of the `pread`/`pwrite` fallback.
const FALLBACK_BUFFER: usize = 1 << 20;
/// Bytes written into the reflink probe source, one filesystem block on most filesystems.
const PROBE_BYTES: usize = 4096;
/// Name prefix of the probe files that [`supports_reflink`] makes.
pub const PROBE_PREFIX: &str = ".ferrovol-reflink-probe-";

/// How [`clone_file`] made its copy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CloneMethod {
    /// The destination shares the source's extents (`FICLONE`).
    Reflink,
    /// The data extents of the source were copied; holes stayed holes.
    SparseCopy,
}

/// Copies `src` into `dst` by reflink, falling back to a sparse copy where the filesystem
/// cannot reflink these two files.
///
/// `dst` is created, or truncated if it exists. On success it is fsynced, and so is its
/// directory; on failure it is removed.
///
/// # Errors
/// `Io` naming the step that failed (open, create, clone, seek, copy, fsync); `ENOSPC`
/// from a sparse copy into a full pool among them.
pub fn clone_file(src: &Path, dst: &Path) -> Result<CloneMethod> {
    let src_file = open_source(src)?;
    let (dst_file, partial) = create_destination(dst)?;
    let method = match ficlone_into(&src_file, &dst_file) {
        Ok(()) => CloneMethod::Reflink,
        Err(errno) if reflink_unsupported(errno) => {
            tracing::debug!(
                src = %src.display(),
                dst = %dst.display(),
                %errno,
                "no reflink here, copying the data extents"
            );
            copy_sparse(&src_file, &dst_file, src, dst)?;
            CloneMethod::SparseCopy
        }
        Err(errno) => return Err(Error::sys("reflink into", dst, errno)),
    };
    make_durable(&dst_file, dst)?;
    partial.keep();
    Ok(method)
}

/// Makes `dst` a reflink of `src` with `FICLONE`, without falling back.
///
/// `dst` is created, or truncated if it exists. On success it is fsynced, and so is its
/// directory; on failure it is removed.
///
/// # Errors
/// `FailedPrecondition` when the filesystem cannot reflink these files (`EOPNOTSUPP`,
/// `EXDEV`, `EINVAL`, `ENOTTY`): the caller may fall back to [`sparse_copy`]. `Io` for any
/// other failure.
pub fn reflink(src: &Path, dst: &Path) -> Result<()> {
    let src_file = open_source(src)?;
    let (dst_file, partial) = create_destination(dst)?;
    ficlone_into(&src_file, &dst_file).map_err(|errno| {
        if reflink_unsupported(errno) {
            Error::FailedPrecondition(format!(
                "cannot reflink {} to {}: {errno}",
                src.display(),
                dst.display()
            ))
        } else {
            Error::sys("reflink into", dst, errno)
        }
    })?;
    make_durable(&dst_file, dst)?;
    partial.keep();
    Ok(())
}

/// Copies the data extents of `src` into `dst`, leaving holes as holes.
///
/// `dst` is created, or truncated if it exists, and gets the length of `src`. On success
/// it is fsynced, and so is its directory; on failure it is removed.
///
/// # Errors
/// `Io` naming the step that failed (open, create, seek, copy, fsync).
pub fn sparse_copy(src: &Path, dst: &Path) -> Result<()> {
    let src_file = open_source(src)?;
    let (dst_file, partial) = create_destination(dst)?;
    copy_sparse(&src_file, &dst_file, src, dst)?;
    make_durable(&dst_file, dst)?;
    partial.keep();
    Ok(())
}

/// Whether files in `dir` can be reflinked to each other, found by trying it on two
/// scratch files (removed again whatever happens).
///
/// # Errors
/// `Io` when the scratch files cannot be made, or `FICLONE` fails for another reason than
/// the filesystem lacking reflinks.
pub fn supports_reflink(dir: &Path) -> Result<bool> {
    static PROBES: AtomicU32 = AtomicU32::new(0);
    let n = PROBES.fetch_add(1, Ordering::Relaxed);
    let stem = format!("{PROBE_PREFIX}{}-{n}", std::process::id());
    let src = PartialFile::new(dir.join(format!("{stem}-src")));
    let dst = PartialFile::new(dir.join(format!("{stem}-dst")));
    let src_file = create_probe(&src.path)?;
    src_file
        .write_all_at(&[0xA5; PROBE_BYTES], 0)
        .map_err(|e| Error::io("write", &src.path, e))?;
    let dst_file = create_probe(&dst.path)?;
    match ficlone_into(&src_file, &dst_file) {
        Ok(()) => Ok(true),
        Err(errno) if reflink_unsupported(errno) => Ok(false),
        Err(errno) => Err(Error::sys("reflink into", &dst.path, errno)),
    }
    // `src` and `dst` drop here and remove both files.
}

/// The errnos with which `FICLONE` says "not on this filesystem / not these files".
fn reflink_unsupported(errno: Errno) -> bool {
    matches!(
        errno,
        Errno::EOPNOTSUPP | Errno::EXDEV | Errno::EINVAL | Errno::ENOTTY
    )
}

/// `FICLONE`: makes `dst` share all of `src`'s extents.
fn ficlone_into(src: &File, dst: &File) -> Result<(), Errno> {
    let src_fd =
        nix::sys::ioctl::ioctl_param_type::try_from(src.as_raw_fd()).map_err(|_| Errno::EBADF)?;
    // SAFETY: FICLONE reads its argument as an fd number, not as a pointer; both fds stay
    // open for the duration of the call.
    unsafe { ficlone(dst.as_raw_fd(), src_fd) }.map(drop)
}

/// Opens the source read-only and checks that it is a regular file.
fn open_source(src: &Path) -> Result<File> {
    let file = File::open(src).map_err(|e| Error::io("open", src, e))?;
    let meta = file.metadata().map_err(|e| Error::io("stat", src, e))?;
    if !meta.is_file() {
        return Err(Error::io(
            "copy",
            src,
            io::Error::new(io::ErrorKind::InvalidInput, "not a regular file"),
        ));
    }
    Ok(file)
}

/// Creates (or truncates) the destination, with a guard that removes it unless kept.
fn create_destination(dst: &Path) -> Result<(File, PartialFile)> {
    let file = OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .open(dst)
        .map_err(|e| Error::io("create", dst, e))?;
    Ok((file, PartialFile::new(dst.to_owned())))
}

fn create_probe(path: &Path) -> Result<File> {
    OpenOptions::new()
        .read(true)
        .write(true)
        .create_new(true)
        .open(path)
        .map_err(|e| Error::io("create", path, e))
}

/// fsyncs the file and then its directory, so that both content and name survive a crash.
fn make_durable(file: &File, path: &Path) -> Result<()> {
    file.sync_all().map_err(|e| Error::io("fsync", path, e))?;
    let dir = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(|e| Error::io("fsync", dir, e))
}

/// Sets the destination length to the source's and copies the source's data extents.
fn copy_sparse(src_file: &File, dst_file: &File, src: &Path, dst: &Path) -> Result<()> {
    let len = src_file
        .metadata()
        .map_err(|e| Error::io("stat", src, e))?
        .len();
    dst_file
        .set_len(len)
        .map_err(|e| Error::io("set length of", dst, e))?;
    let mut copier = ExtentCopier {
        src_file,
        dst_file,
        src,
        dst,
        use_copy_file_range: true,
        buffer: Vec::new(),
    };
    copier.copy_extents(len)
}

/// Copies data extents from one open file to another at the same offsets.
struct ExtentCopier<'a> {
    /// The file read from.
    src_file: &'a File,
    /// The file written to, already as long as the source.
    dst_file: &'a File,
    /// The source path, for errors.
    src: &'a Path,
    /// The destination path, for errors.
    dst: &'a Path,
    /// Cleared once `copy_file_range` says it cannot copy between these two files.
    use_copy_file_range: bool,
    /// The `pread`/`pwrite` buffer, allocated when first needed.
    buffer: Vec<u8>,
}

impl ExtentCopier<'_> {
    /// Copies every data extent below `len`; stops early, without error, where the source
    /// turns out to end before `len`.
    fn copy_extents(&mut self, len: u64) -> Result<()> {
        let end = i64::try_from(len).map_err(|_| {
            Error::Internal(format!("{}: length {len} too big", self.src.display()))
        })?;
        let mut offset = 0;
        while offset < end {
            let data = match lseek(self.src_file, offset, Whence::SeekData) {
                Ok(o) => o,
                // No data after `offset`: the rest is a hole, or the source shrank.
                Err(Errno::ENXIO) => break,
                Err(e) => return Err(Error::sys("seek for data in", self.src, e)),
            };
            if data >= end {
                break;
            }
            let hole = match lseek(self.src_file, data, Whence::SeekHole) {
                Ok(o) => o.min(end),
                // The source shrank below `data` between the two seeks.
                Err(Errno::ENXIO) => break,
                Err(e) => return Err(Error::sys("seek for a hole in", self.src, e)),
            };
            let reached = self.copy_range(data, hole)?;
            if reached < hole {
                // The source ended early: it shrank while we copied.
                break;
            }
            offset = hole;
        }
        Ok(())
    }

    /// Copies `[start, end)` to the same offsets; returns where it stopped, which is below
    /// `end` only when the source ended first.
    fn copy_range(&mut self, start: i64, end: i64) -> Result<i64> {
        let mut pos = start;
        while pos < end {
            let want = usize::try_from(end - pos)
                .unwrap_or(COPY_CHUNK)
                .min(COPY_CHUNK);
            let copied = if self.use_copy_file_range {
                match copy_file_range(self.src_file, self.dst_file, pos, want) {
                    Ok(n) => n,
                    Err(Errno::EINTR) => continue,
                    // Not between these files (different filesystems, or a filesystem
                    // without it): fall back to reading and writing, from `pos` on.
                    Err(Errno::EXDEV | Errno::ENOSYS | Errno::EOPNOTSUPP | Errno::EINVAL) => {
                        self.use_copy_file_range = false;
                        continue;
                    }
                    Err(e) => return Err(Error::sys("copy data into", self.dst, e)),
                }
            } else {
                self.read_write(pos, want)?
            };
            if copied == 0 {
                break;
            }
            pos = pos.saturating_add(i64::try_from(copied).unwrap_or(i64::MAX));
        }
        Ok(pos)
    }

    /// Copies up to `want` bytes at `pos` through the buffer; 0 at the end of the source.
    fn read_write(&mut self, pos: i64, want: usize) -> Result<usize> {
        if self.buffer.is_empty() {
            self.buffer = vec![0; FALLBACK_BUFFER];
        }
        let offset = u64::try_from(pos)
            .map_err(|_| Error::Internal(format!("negative offset {pos} in copy")))?;
        let len = want.min(self.buffer.len());
        let buf = &mut self.buffer[..len];
        let n = loop {
            match self.src_file.read_at(buf, offset) {
                Ok(n) => break n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(Error::io("read", self.src, e)),
            }
        };
        self.dst_file
            .write_all_at(&buf[..n], offset)
            .map_err(|e| Error::io("write", self.dst, e))?;
        Ok(n)
    }
}

/// `copy_file_range(2)` of up to `len` bytes at `offset` in both files; returns how many
/// were copied, 0 at the end of the source.
fn copy_file_range(src: &File, dst: &File, offset: i64, len: usize) -> Result<usize, Errno> {
    let (mut off_in, mut off_out) = (offset, offset);
    // SAFETY: both offset pointers point at live locals for the duration of the call, both
    // fds are open, and flags must be 0.
    let copied = unsafe {
        libc::copy_file_range(
            src.as_raw_fd(),
            &mut off_in,
            dst.as_raw_fd(),
            &mut off_out,
            len,
            0,
        )
    };
    Errno::result(copied).map(|n| usize::try_from(n).unwrap_or(0))
}

/// Removes a file on drop unless [`PartialFile::keep`] was called: a copy that failed (or
/// panicked) half way leaves nothing behind.
#[derive(Debug)]
struct PartialFile {
    /// The file to remove.
    path: PathBuf,
    /// Set once the file is complete and must stay.
    keep: bool,
}

impl PartialFile {
    fn new(path: PathBuf) -> Self {
        PartialFile { path, keep: false }
    }

    fn keep(mut self) {
        self.keep = true;
    }
}

impl Drop for PartialFile {
    fn drop(&mut self) {
        if self.keep {
            return;
        }
        match fs::remove_file(&self.path) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => tracing::warn!(
                path = %self.path.display(),
                error = %e,
                "cannot remove an incomplete copy"
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::io::Read;
    use std::os::unix::fs::MetadataExt;

    use super::*;
    use crate::os::grow::scratch::ScratchFs;

    const MIB: u64 = 1 << 20;

    /// Writes `len` bytes of a non-zero pattern at `offset`.
    fn write_data(file: &File, offset: u64, len: usize) {
        let bytes: Vec<u8> = (0..len)
            .map(|i| u8::try_from((i as u64 + offset) % 251).expect("below 251") + 1)
            .collect();
        file.write_all_at(&bytes, offset).expect("write data");
    }

    /// A 64 MiB (and a bit) file of holes with data at its start, in its middle at odd
    /// offsets and at its very end.
    fn holey_file(path: &Path) -> u64 {
        let len = 64 * MIB + 1000;
        let file = File::create(path).expect("create source");
        file.set_len(len).expect("set source length");
        write_data(&file, 0, 4096);
        write_data(&file, MIB, 64 << 10);
        write_data(&file, 10 * MIB + 123, 5000);
        write_data(&file, len - 700, 700);
        file.sync_all().expect("fsync source");
        len
    }

    /// A file of `len` bytes that is data all through.
    fn full_file(path: &Path, len: u64) {
        let file = File::create(path).expect("create source");
        for offset in (0..len).step_by(MIB as usize) {
            write_data(&file, offset, MIB as usize);
        }
        file.sync_all().expect("fsync source");
    }

    /// The data extents of a file, as `(data, hole)` offset pairs.
    fn extents(path: &Path) -> Vec<(i64, i64)> {
        let file = File::open(path).expect("open");
        let mut found = Vec::new();
        let mut offset = 0;
        loop {
            let data = match lseek(&file, offset, Whence::SeekData) {
                Ok(o) => o,
                Err(Errno::ENXIO) => return found,
                Err(e) => panic!("seek data: {e}"),
            };
            let hole = lseek(&file, data, Whence::SeekHole).expect("seek hole");
            found.push((data, hole));
            offset = hole;
        }
    }

    fn assert_same_content(a: &Path, b: &Path) {
        let (mut fa, mut fb) = (File::open(a).expect("open"), File::open(b).expect("open"));
        assert_eq!(
            fa.metadata().expect("stat").len(),
            fb.metadata().expect("stat").len(),
            "lengths of {} and {}",
            a.display(),
            b.display()
        );
        let (mut ba, mut bb) = (vec![0; MIB as usize], vec![0; MIB as usize]);
        let mut offset = 0;
        loop {
            let n = fa.read(&mut ba).expect("read");
            fb.read_exact(&mut bb[..n]).expect("read");
            assert!(ba[..n] == bb[..n], "contents differ in the MiB at {offset}");
            if n == 0 {
                return;
            }
            offset += n;
        }
    }

    fn blocks(path: &Path) -> u64 {
        fs::metadata(path).expect("stat").blocks()
    }

    fn names_in(dir: &Path) -> Vec<String> {
        let mut names: Vec<String> = fs::read_dir(dir)
            .expect("list")
            .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        names
    }

    #[test]
    fn ficlone_request_code_is_iow_0x94_9_int() {
        let code = nix::request_code_write!(0x94, 9, std::mem::size_of::<libc::c_int>());
        assert_eq!(code as u32, 0x4004_9409);
    }

    #[test]
    fn sparse_copy_copies_data_and_keeps_holes() {
        let dir = tempfile::tempdir().expect("temp dir");
        let (src, dst) = (dir.path().join("src"), dir.path().join("dst"));
        holey_file(&src);
        sparse_copy(&src, &dst).expect("sparse copy");
        assert_same_content(&src, &dst);
        assert_eq!(extents(&dst), extents(&src), "data extents and holes");
        assert!(
            blocks(&dst) <= blocks(&src) + 16,
            "{} blocks allocated for a source of {}",
            blocks(&dst),
            blocks(&src)
        );
    }

    #[test]
    fn sparse_copy_of_holes_only_allocates_nothing() {
        let dir = tempfile::tempdir().expect("temp dir");
        let (src, dst) = (dir.path().join("src"), dir.path().join("dst"));
        File::create(&src)
            .and_then(|f| f.set_len(1 << 30))
            .expect("create source");
        sparse_copy(&src, &dst).expect("sparse copy");
        assert_eq!(fs::metadata(&dst).expect("stat").len(), 1 << 30);
        assert_eq!(blocks(&dst), 0);
        assert!(extents(&dst).is_empty());
    }

    #[test]
    fn read_write_fallback_copies_the_same() {
        let dir = tempfile::tempdir().expect("temp dir");
        let (src, dst) = (dir.path().join("src"), dir.path().join("dst"));
        let len = holey_file(&src);
        let src_file = File::open(&src).expect("open source");
        let dst_file = File::create(&dst).expect("create destination");
        dst_file.set_len(len).expect("set length");
        let mut copier = ExtentCopier {
            src_file: &src_file,
            dst_file: &dst_file,
            src: &src,
            dst: &dst,
            use_copy_file_range: false,
            buffer: Vec::new(),
        };
        copier.copy_extents(len).expect("copy");
        dst_file.sync_all().expect("fsync");
        assert_same_content(&src, &dst);
        assert_eq!(extents(&dst), extents(&src));
    }

    #[test]
    fn a_source_shorter_than_expected_ends_the_copy_quietly() {
        let dir = tempfile::tempdir().expect("temp dir");
        let (src, dst) = (dir.path().join("src"), dir.path().join("dst"));
        full_file(&src, 3 * MIB);
        // As if the source had been 8 MiB long when the copy began and shrank since.
        let src_file = File::open(&src).expect("open source");
        let dst_file = File::create(&dst).expect("create destination");
        dst_file.set_len(8 * MIB).expect("set length");
        for use_copy_file_range in [true, false] {
            let mut copier = ExtentCopier {
                src_file: &src_file,
                dst_file: &dst_file,
                src: &src,
                dst: &dst,
                use_copy_file_range,
                buffer: Vec::new(),
            };
            copier
                .copy_extents(8 * MIB)
                .expect("copy of a shrunk source");
        }
        let copied = fs::read(&dst).expect("read copy");
        assert_eq!(copied.len(), 8 << 20);
        assert!(copied[..3 << 20] == fs::read(&src).expect("read source")[..]);
        assert!(copied[3 << 20..].iter().all(|&b| b == 0));
    }

    #[test]
    fn a_failed_copy_leaves_no_destination() {
        let dir = tempfile::tempdir().expect("temp dir");
        let dst = dir.path().join("dst");
        let err = sparse_copy(dir.path(), &dst).expect_err("a directory is no source");
        assert!(matches!(err, Error::Io { .. }), "{err}");
        assert!(!dst.exists());
        let err = clone_file(&dir.path().join("missing"), &dst).expect_err("no source");
        assert!(matches!(err, Error::Io { .. }), "{err}");
        assert!(!dst.exists());
    }

    #[test]
    fn a_copy_into_a_full_filesystem_is_removed() {
        // 48 MiB of data from /tmp into a 24 MiB ext4: copy_file_range refuses to cross
        // filesystems, the read/write fallback runs out of space.
        let dir = tempfile::tempdir().expect("temp dir");
        let src = dir.path().join("src");
        full_file(&src, 48 * MIB);
        let small = ScratchFs::new(24 * MIB, &["mkfs.ext4", "-q", "-F"]);
        let dst = small.path("dst");
        let err = clone_file(&src, &dst).expect_err("no room for the copy");
        assert_eq!(err.code(), tonic::Code::ResourceExhausted, "{err}");
        assert!(!dst.exists(), "a half copy was left behind");
    }

    #[test]
    fn ext4_falls_back_to_a_sparse_copy() {
        let scratch = ScratchFs::new(128 * MIB, &["mkfs.ext4", "-q", "-F"]);
        let (src, dst) = (scratch.path("src"), scratch.path("dst"));
        holey_file(&src);
        assert!(!supports_reflink(&scratch.mount_point).expect("probe"));
        let err = reflink(&src, &dst).expect_err("ext4 has no reflinks");
        assert!(matches!(err, Error::FailedPrecondition(_)), "{err}");
        assert!(!dst.exists());
        assert_eq!(
            clone_file(&src, &dst).expect("clone"),
            CloneMethod::SparseCopy
        );
        assert_same_content(&src, &dst);
        assert_eq!(extents(&dst), extents(&src));
        assert_eq!(names_in(&scratch.mount_point), ["dst", "lost+found", "src"]);
    }

    /// On a filesystem with reflinks: the probe says so and leaves nothing behind, and a
    /// clone is a reflink that costs (almost) no space.
    fn reflinks_on(scratch: &ScratchFs) {
        let (src, dst) = (scratch.path("src"), scratch.path("dst"));
        let before = names_in(&scratch.mount_point);
        assert!(supports_reflink(&scratch.mount_point).expect("probe"));
        full_file(&src, 16 * MIB);
        let free = crate::os::statfs::usage(&scratch.mount_point)
            .expect("statvfs")
            .free_bytes;
        assert_eq!(clone_file(&src, &dst).expect("clone"), CloneMethod::Reflink);
        assert_same_content(&src, &dst);
        let used = free.saturating_sub(
            crate::os::statfs::usage(&scratch.mount_point)
                .expect("statvfs")
                .free_bytes,
        );
        assert!(used < MIB, "a reflink of 16 MiB used {used} bytes");
        let again = scratch.path("again");
        reflink(&dst, &again).expect("reflink of the reflink");
        assert_same_content(&src, &again);
        let mut expected = before;
        expected.extend(["again", "dst", "src"].map(String::from));
        expected.sort();
        assert_eq!(names_in(&scratch.mount_point), expected);
    }

    #[test]
    fn xfs_with_reflink_clones_by_reflink() {
        let scratch = ScratchFs::new(512 * MIB, &["mkfs.xfs", "-q", "-m", "reflink=1"]);
        reflinks_on(&scratch);
    }

    #[test]
    fn btrfs_clones_by_reflink() {
        let scratch = ScratchFs::new(256 * MIB, &["mkfs.btrfs", "-q"]);
        reflinks_on(&scratch);
    }
}
