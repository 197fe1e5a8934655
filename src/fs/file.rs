//! [`File`]: an open file whose reads, writes and syncs run on the blocking pool.

use super::{Metadata, OpenOptions, Permissions};
use crate::unblock::unblock;
use std::io::{self, IoSlice, IoSliceMut, Read, Seek, SeekFrom, Write};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, RawFd};
use std::path::Path;

/// An open file: [`std::fs::File`] whose blocking calls run on the blocking pool, so a fiber
/// reading or writing it lets its worker run other fibers.
///
/// It implements [`Read`], [`Write`] and [`Seek`] (also for `&File`, like std). Each `read`
/// or `write` is one round trip to a pool thread; `read_to_end`, `read_exact` and
/// `write_all` do all their work in one. Wrap it in a [`std::io::BufReader`] /
/// [`BufWriter`](std::io::BufWriter) for many small operations. `seek` runs inline:
/// `lseek(2)` does no I/O.
///
/// ```
/// use std::io::{Read, Seek, SeekFrom, Write};
/// let sched = fibra::Scheduler::builder().threads(1).build().unwrap();
/// sched.start();
/// let path = std::env::temp_dir().join(format!("fibra-file-doc-{}", std::process::id()));
/// let text = sched.block_on(move || -> std::io::Result<String> {
///     let mut f = fibra::fs::File::options().read(true).write(true).create(true).open(&path)?;
///     f.write_all(b"hello, file")?;
///     f.seek(SeekFrom::Start(7))?;
///     let mut tail = String::new();
///     f.read_to_string(&mut tail)?;
///     f.sync_all()?;
///     fibra::fs::remove_file(&path)?;
///     Ok(tail)
/// });
/// assert_eq!(text.unwrap(), "file");
/// ```
#[derive(Debug)]
pub struct File {
    inner: std::fs::File,
}

impl File {
    /// Opens a file for reading ([`std::fs::File::open`]).
    pub fn open<P: AsRef<Path>>(path: P) -> io::Result<File> {
        OpenOptions::new().read(true).open(path)
    }

    /// Opens a file for writing, creating or truncating it ([`std::fs::File::create`]).
    pub fn create<P: AsRef<Path>>(path: P) -> io::Result<File> {
        OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .open(path)
    }

    /// Creates a new file for writing, failing if it exists ([`std::fs::File::create_new`]).
    pub fn create_new<P: AsRef<Path>>(path: P) -> io::Result<File> {
        OpenOptions::new().write(true).create_new(true).open(path)
    }

    /// Options to open a file with; [`OpenOptions::new`].
    pub fn options() -> OpenOptions {
        OpenOptions::new()
    }

    /// Flushes data and metadata to the device ([`std::fs::File::sync_all`]).
    pub fn sync_all(&self) -> io::Result<()> {
        let f = &self.inner;
        unblock(|| f.sync_all())
    }

    /// Flushes data to the device, metadata only as needed ([`std::fs::File::sync_data`]).
    pub fn sync_data(&self) -> io::Result<()> {
        let f = &self.inner;
        unblock(|| f.sync_data())
    }

    /// Truncates or extends the file to `size` bytes ([`std::fs::File::set_len`]).
    pub fn set_len(&self, size: u64) -> io::Result<()> {
        let f = &self.inner;
        unblock(|| f.set_len(size))
    }

    /// The file's metadata ([`std::fs::File::metadata`]).
    pub fn metadata(&self) -> io::Result<Metadata> {
        let f = &self.inner;
        unblock(|| f.metadata())
    }

    /// Changes the file's permissions ([`std::fs::File::set_permissions`]).
    pub fn set_permissions(&self, perm: Permissions) -> io::Result<()> {
        let f = &self.inner;
        unblock(|| f.set_permissions(perm))
    }

    /// A second handle to the same open file, sharing its cursor
    /// ([`std::fs::File::try_clone`]; `dup(2)` does no I/O, so it runs inline).
    pub fn try_clone(&self) -> io::Result<File> {
        self.inner.try_clone().map(File::from)
    }

    /// The std file inside.
    pub fn into_std(self) -> std::fs::File {
        self.inner
    }
}

impl From<std::fs::File> for File {
    fn from(inner: std::fs::File) -> Self {
        File { inner }
    }
}

impl From<File> for std::fs::File {
    fn from(f: File) -> Self {
        f.inner
    }
}

impl AsFd for File {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.inner.as_fd()
    }
}

impl AsRawFd for File {
    fn as_raw_fd(&self) -> RawFd {
        self.inner.as_raw_fd()
    }
}

impl Read for &File {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let mut f = &self.inner;
        unblock(|| f.read(buf))
    }

    fn read_vectored(&mut self, bufs: &mut [IoSliceMut<'_>]) -> io::Result<usize> {
        let mut f = &self.inner;
        unblock(|| f.read_vectored(bufs))
    }

    fn read_to_end(&mut self, buf: &mut Vec<u8>) -> io::Result<usize> {
        let mut f = &self.inner;
        unblock(|| f.read_to_end(buf))
    }

    fn read_to_string(&mut self, buf: &mut String) -> io::Result<usize> {
        let mut f = &self.inner;
        unblock(|| f.read_to_string(buf))
    }

    fn read_exact(&mut self, buf: &mut [u8]) -> io::Result<()> {
        let mut f = &self.inner;
        unblock(|| f.read_exact(buf))
    }
}

impl Read for File {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        (&*self).read(buf)
    }

    fn read_vectored(&mut self, bufs: &mut [IoSliceMut<'_>]) -> io::Result<usize> {
        (&*self).read_vectored(bufs)
    }

    fn read_to_end(&mut self, buf: &mut Vec<u8>) -> io::Result<usize> {
        (&*self).read_to_end(buf)
    }

    fn read_to_string(&mut self, buf: &mut String) -> io::Result<usize> {
        (&*self).read_to_string(buf)
    }

    fn read_exact(&mut self, buf: &mut [u8]) -> io::Result<()> {
        (&*self).read_exact(buf)
    }
}

impl Write for &File {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let mut f = &self.inner;
        unblock(|| f.write(buf))
    }

    fn write_vectored(&mut self, bufs: &[IoSlice<'_>]) -> io::Result<usize> {
        let mut f = &self.inner;
        unblock(|| f.write_vectored(bufs))
    }

    fn write_all(&mut self, buf: &[u8]) -> io::Result<()> {
        let mut f = &self.inner;
        unblock(|| f.write_all(buf))
    }

    /// A file has no user-space buffer: nothing to do (like std's).
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

impl Write for File {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        (&*self).write(buf)
    }

    fn write_vectored(&mut self, bufs: &[IoSlice<'_>]) -> io::Result<usize> {
        (&*self).write_vectored(bufs)
    }

    fn write_all(&mut self, buf: &[u8]) -> io::Result<()> {
        (&*self).write_all(buf)
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

impl Seek for &File {
    fn seek(&mut self, pos: SeekFrom) -> io::Result<u64> {
        (&self.inner).seek(pos)
    }
}

impl Seek for File {
    fn seek(&mut self, pos: SeekFrom) -> io::Result<u64> {
        (&*self).seek(pos)
    }
}
