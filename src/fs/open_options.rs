//! [`OpenOptions`]: how to open a [`File`](super::File), like [`std::fs::OpenOptions`].

use super::File;
use crate::unblock::unblock;
use std::io;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

/// Options for opening a [`File`]: [`std::fs::OpenOptions`], with `open` run on the
/// blocking pool.
///
/// ```
/// use fibra::fs::OpenOptions;
/// use std::io::Write;
/// let path = std::env::temp_dir().join(format!("fibra-open-options-{}", std::process::id()));
/// let mut log = OpenOptions::new().create(true).append(true).open(&path)?;
/// log.write_all(b"one line\n")?;
/// fibra::fs::remove_file(&path)?;
/// # std::io::Result::Ok(())
/// ```
#[derive(Clone, Debug)]
pub struct OpenOptions {
    inner: std::fs::OpenOptions,
}

impl OpenOptions {
    /// All options off (std's default): set at least `read`, `write` or `append`.
    pub fn new() -> Self {
        OpenOptions {
            inner: std::fs::OpenOptions::new(),
        }
    }

    /// Open for reading.
    pub fn read(&mut self, read: bool) -> &mut Self {
        self.inner.read(read);
        self
    }

    /// Open for writing.
    pub fn write(&mut self, write: bool) -> &mut Self {
        self.inner.write(write);
        self
    }

    /// Every write goes to the end of the file.
    pub fn append(&mut self, append: bool) -> &mut Self {
        self.inner.append(append);
        self
    }

    /// Truncate an existing file to length 0 (needs `write`).
    pub fn truncate(&mut self, truncate: bool) -> &mut Self {
        self.inner.truncate(truncate);
        self
    }

    /// Create the file if it does not exist (needs `write` or `append`).
    pub fn create(&mut self, create: bool) -> &mut Self {
        self.inner.create(create);
        self
    }

    /// Create the file, failing if it exists (atomically; needs `write` or `append`).
    pub fn create_new(&mut self, create_new: bool) -> &mut Self {
        self.inner.create_new(create_new);
        self
    }

    /// The permission bits of a newly created file (before the umask); default `0o666`.
    pub fn mode(&mut self, mode: u32) -> &mut Self {
        self.inner.mode(mode);
        self
    }

    /// Extra `open(2)` flags, such as `libc::O_NOFOLLOW`.
    pub fn custom_flags(&mut self, flags: i32) -> &mut Self {
        self.inner.custom_flags(flags);
        self
    }

    /// Opens `path` with these options.
    pub fn open<P: AsRef<Path>>(&self, path: P) -> io::Result<File> {
        let (options, path) = (&self.inner, path.as_ref());
        unblock(|| options.open(path)).map(File::from)
    }
}

impl Default for OpenOptions {
    fn default() -> Self {
        OpenOptions::new()
    }
}

impl From<std::fs::OpenOptions> for OpenOptions {
    fn from(inner: std::fs::OpenOptions) -> Self {
        OpenOptions { inner }
    }
}
