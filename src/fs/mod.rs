//! Files and directories for fibers, built on
//! [`unblock`](crate::unblock()).
//!
//! Each function has `std::fs`'s signature and behaviour and runs the `std::fs` call on the
//! blocking pool: inside a fiber only the fiber waits, its worker runs others; on a plain
//! thread the call simply runs inline. Errors come back as `std::io::Error`, exactly as std
//! reports them, never as panics. [`File`], [`OpenOptions`] and [`read_dir`] follow std the
//! same way.
//!
//! Every call is one round trip to a pool thread (a few microseconds), so prefer whole-file
//! calls ([`read()`], [`write()`]) or large buffers ([`std::io::BufReader`] around a [`File`])
//! to many small reads. `io_uring` is not used: every operation goes through the pool.
//!
//! ```
//! let sched = fibra::Scheduler::builder().threads(1).build().unwrap();
//! sched.start();
//! let dir = std::env::temp_dir().join(format!("fibra-fs-doc-{}", std::process::id()));
//! let text = sched.block_on(move || {
//!     fibra::fs::create_dir_all(&dir)?;
//!     let path = dir.join("hello.txt");
//!     fibra::fs::write(&path, "hello from a fiber")?;
//!     let text = fibra::fs::read_to_string(&path)?;
//!     fibra::fs::remove_dir_all(&dir)?;
//!     std::io::Result::Ok(text)
//! });
//! assert_eq!(text.unwrap(), "hello from a fiber");
//! ```

mod file;
mod open_options;
mod read_dir;

pub use file::File;
pub use open_options::OpenOptions;
pub use read_dir::{read_dir, DirEntry, ReadDir};
pub use std::fs::{FileType, Metadata, Permissions};

use crate::unblock::unblock;
use std::io;
use std::path::{Path, PathBuf};

/// Reads the whole file into a vector ([`std::fs::read`]).
pub fn read<P: AsRef<Path>>(path: P) -> io::Result<Vec<u8>> {
    let path = path.as_ref();
    unblock(|| std::fs::read(path))
}

/// Reads the whole file into a string ([`std::fs::read_to_string`]).
pub fn read_to_string<P: AsRef<Path>>(path: P) -> io::Result<String> {
    let path = path.as_ref();
    unblock(|| std::fs::read_to_string(path))
}

/// Writes `contents` as the whole file, creating or truncating it ([`std::fs::write`]).
pub fn write<P: AsRef<Path>, C: AsRef<[u8]>>(path: P, contents: C) -> io::Result<()> {
    let (path, contents) = (path.as_ref(), contents.as_ref());
    unblock(|| std::fs::write(path, contents))
}

/// Copies a file's contents and permissions; returns the bytes copied ([`std::fs::copy`]).
pub fn copy<P: AsRef<Path>, Q: AsRef<Path>>(from: P, to: Q) -> io::Result<u64> {
    let (from, to) = (from.as_ref(), to.as_ref());
    unblock(|| std::fs::copy(from, to))
}

/// Renames a file or directory, replacing `to` if it exists ([`std::fs::rename`]).
pub fn rename<P: AsRef<Path>, Q: AsRef<Path>>(from: P, to: Q) -> io::Result<()> {
    let (from, to) = (from.as_ref(), to.as_ref());
    unblock(|| std::fs::rename(from, to))
}

/// Removes a file ([`std::fs::remove_file`]).
pub fn remove_file<P: AsRef<Path>>(path: P) -> io::Result<()> {
    let path = path.as_ref();
    unblock(|| std::fs::remove_file(path))
}

/// Creates a directory; its parent must exist ([`std::fs::create_dir`]).
pub fn create_dir<P: AsRef<Path>>(path: P) -> io::Result<()> {
    let path = path.as_ref();
    unblock(|| std::fs::create_dir(path))
}

/// Creates a directory and any missing parents ([`std::fs::create_dir_all`]).
pub fn create_dir_all<P: AsRef<Path>>(path: P) -> io::Result<()> {
    let path = path.as_ref();
    unblock(|| std::fs::create_dir_all(path))
}

/// Removes an empty directory ([`std::fs::remove_dir`]).
pub fn remove_dir<P: AsRef<Path>>(path: P) -> io::Result<()> {
    let path = path.as_ref();
    unblock(|| std::fs::remove_dir(path))
}

/// Removes a directory and everything in it ([`std::fs::remove_dir_all`]).
pub fn remove_dir_all<P: AsRef<Path>>(path: P) -> io::Result<()> {
    let path = path.as_ref();
    unblock(|| std::fs::remove_dir_all(path))
}

/// Metadata of a path, following symlinks ([`std::fs::metadata`]).
pub fn metadata<P: AsRef<Path>>(path: P) -> io::Result<Metadata> {
    let path = path.as_ref();
    unblock(|| std::fs::metadata(path))
}

/// Metadata of a path without following a final symlink ([`std::fs::symlink_metadata`]).
pub fn symlink_metadata<P: AsRef<Path>>(path: P) -> io::Result<Metadata> {
    let path = path.as_ref();
    unblock(|| std::fs::symlink_metadata(path))
}

/// The absolute path with every symlink resolved ([`std::fs::canonicalize`]).
pub fn canonicalize<P: AsRef<Path>>(path: P) -> io::Result<PathBuf> {
    let path = path.as_ref();
    unblock(|| std::fs::canonicalize(path))
}

/// Changes the permissions of a file or directory ([`std::fs::set_permissions`]).
pub fn set_permissions<P: AsRef<Path>>(path: P, perm: Permissions) -> io::Result<()> {
    let path = path.as_ref();
    unblock(|| std::fs::set_permissions(path, perm))
}

/// Whether the path exists; errors other than "not found" are returned
/// ([`std::fs::exists`]).
pub fn exists<P: AsRef<Path>>(path: P) -> io::Result<bool> {
    let path = path.as_ref();
    unblock(|| std::fs::exists(path))
}
