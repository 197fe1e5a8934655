//! [`read_dir`], [`ReadDir`] and [`DirEntry`]: directory listings read in batches on the
//! blocking pool.

use super::{FileType, Metadata};
use crate::unblock::unblock;
use std::collections::VecDeque;
use std::ffi::OsString;
use std::io;
use std::path::{Path, PathBuf};

/// How many entries one trip to the blocking pool reads.
const BATCH: usize = 128;

/// The entries of a directory ([`std::fs::read_dir`]). Opening the directory and reading
/// the first batch of entries is one call on the blocking pool; the iterator reads the
/// rest 128 entries per call.
///
/// ```
/// let dir = std::env::temp_dir().join(format!("fibra-read-dir-doc-{}", std::process::id()));
/// fibra::fs::create_dir_all(dir.join("sub"))?;
/// fibra::fs::write(dir.join("a.txt"), "a")?;
/// let mut names = fibra::fs::read_dir(&dir)?
///     .map(|e| e.map(|e| e.file_name()))
///     .collect::<std::io::Result<Vec<_>>>()?;
/// names.sort();
/// assert_eq!(names, ["a.txt", "sub"]);
/// fibra::fs::remove_dir_all(&dir)?;
/// # std::io::Result::Ok(())
/// ```
pub fn read_dir<P: AsRef<Path>>(path: P) -> io::Result<ReadDir> {
    let path = path.as_ref();
    unblock(|| {
        let mut inner = std::fs::read_dir(path)?;
        let mut entries = VecDeque::new();
        let more = fill(&mut inner, &mut entries);
        Ok(ReadDir {
            inner: more.then_some(inner),
            entries,
        })
    })
}

/// Moves up to [`BATCH`] entries from `inner` to `out`; returns whether more may follow.
fn fill(inner: &mut std::fs::ReadDir, out: &mut VecDeque<io::Result<DirEntry>>) -> bool {
    for _ in 0..BATCH {
        match inner.next() {
            Some(entry) => out.push_back(entry.map(DirEntry::new)),
            None => return false,
        }
    }
    true
}

/// An iterator over a directory's entries, from [`read_dir`]; like [`std::fs::ReadDir`],
/// without `.` and `..`, in no particular order.
#[derive(Debug)]
pub struct ReadDir {
    /// The open directory, until it is exhausted.
    inner: Option<std::fs::ReadDir>,
    /// Entries read and not yet returned.
    entries: VecDeque<io::Result<DirEntry>>,
}

impl Iterator for ReadDir {
    type Item = io::Result<DirEntry>;

    fn next(&mut self) -> Option<io::Result<DirEntry>> {
        if self.entries.is_empty() {
            if let Some(inner) = self.inner.as_mut() {
                let entries = &mut self.entries;
                if !unblock(|| fill(inner, entries)) {
                    self.inner = None;
                }
            }
        }
        self.entries.pop_front()
    }
}

/// One entry of a [`ReadDir`] ([`std::fs::DirEntry`]). Its file type is read along with
/// the entry, on the pool; [`metadata`](DirEntry::metadata) is a call of its own.
#[derive(Debug)]
pub struct DirEntry {
    inner: std::fs::DirEntry,
    file_type: Option<FileType>,
}

impl DirEntry {
    fn new(inner: std::fs::DirEntry) -> DirEntry {
        // Usually free (the directory entry carries it); an lstat otherwise, on the pool.
        let file_type = inner.file_type().ok();
        DirEntry { inner, file_type }
    }

    /// The full path: the directory given to [`read_dir`] joined with the file name.
    pub fn path(&self) -> PathBuf {
        self.inner.path()
    }

    /// The bare file name.
    pub fn file_name(&self) -> OsString {
        self.inner.file_name()
    }

    /// The entry's metadata, not following a symlink ([`std::fs::DirEntry::metadata`]).
    pub fn metadata(&self) -> io::Result<Metadata> {
        let inner = &self.inner;
        unblock(|| inner.metadata())
    }

    /// The entry's file type, not following a symlink ([`std::fs::DirEntry::file_type`]).
    pub fn file_type(&self) -> io::Result<FileType> {
        match self.file_type {
            Some(t) => Ok(t),
            None => {
                let inner = &self.inner;
                unblock(|| inner.file_type())
            }
        }
    }
}
