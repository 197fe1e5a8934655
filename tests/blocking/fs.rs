//! `fibra::fs` (seed 002's async file module): std's file API on the blocking pool; errors
//! come back as `io::Error`, exactly as std reports them.

use crate::common::{finish, with_deadline};
use std::io::{self, ErrorKind, Read, Seek, SeekFrom, Write};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::thread;

/// A fresh directory for one test, removed when dropped.
struct Scratch(PathBuf);

impl Scratch {
    fn new(name: &str) -> Scratch {
        let dir = std::env::temp_dir().join(format!("fibra-fs-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        Scratch(dir)
    }

    fn path(&self, name: &str) -> PathBuf {
        self.0.join(name)
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Runs `f` in a fiber of a one-worker scheduler and returns its value.
fn in_fiber<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> T {
    let sched = fibra::Scheduler::builder().threads(1).build().unwrap();
    sched.start();
    let v = finish(sched.submit(f, None).unwrap());
    sched.stop();
    v
}

#[test]
fn a_file_round_trip_inside_a_fiber() {
    with_deadline(|| {
        let scratch = Scratch::new("round-trip");
        let dir = scratch.0.clone();
        in_fiber(move || -> io::Result<()> {
            let home = thread::current().id();
            let nested = dir.join("a/b/c");
            fibra::fs::create_dir_all(&nested)?;
            assert!(fibra::fs::metadata(&nested)?.is_dir());

            // Whole-file calls.
            let path = nested.join("data.bin");
            let data: Vec<u8> = (0..=255u8).cycle().take(100_000).collect();
            fibra::fs::write(&path, &data)?;
            assert_eq!(fibra::fs::read(&path)?, data);
            assert_eq!(fibra::fs::metadata(&path)?.len(), 100_000);
            fibra::fs::write(&path, "text now")?;
            assert_eq!(fibra::fs::read_to_string(&path)?, "text now");

            // File: create, write, seek, read, set_len, sync, metadata.
            let fpath = dir.join("file.txt");
            let mut f = fibra::fs::File::create(&fpath)?;
            f.write_all(b"hello, ")?;
            let rest = "world";
            write!(f, "{rest}")?;
            f.flush()?;
            f.sync_all()?;
            f.sync_data()?;
            assert_eq!(f.metadata()?.len(), 12);
            drop(f);
            let mut f = fibra::fs::File::options()
                .read(true)
                .write(true)
                .open(&fpath)?;
            let mut head = [0u8; 5];
            f.read_exact(&mut head)?;
            assert_eq!(&head, b"hello");
            assert_eq!(f.seek(SeekFrom::End(-5))?, 7);
            let mut tail = String::new();
            f.read_to_string(&mut tail)?;
            assert_eq!(tail, "world");
            f.set_len(5)?;
            f.seek(SeekFrom::Start(0))?;
            let mut all = Vec::new();
            (&f).read_to_end(&mut all)?;
            assert_eq!(all, b"hello");
            let mut one = [0u8; 3];
            f.seek(SeekFrom::Start(1))?;
            assert_eq!(f.read(&mut one)?, 3);
            assert_eq!(&one, b"ell");
            let clone = f.try_clone()?;
            assert_eq!(clone.metadata()?.len(), 5);
            drop((f, clone));

            // Append through OpenOptions.
            let mut log = fibra::fs::OpenOptions::new().append(true).open(&fpath)?;
            log.write_all(b"!")?;
            drop(log);
            assert_eq!(fibra::fs::read_to_string(&fpath)?, "hello!");

            // Copy, rename, list, remove.
            assert_eq!(fibra::fs::copy(&fpath, dir.join("copy.txt"))?, 6);
            fibra::fs::rename(dir.join("copy.txt"), dir.join("moved.txt"))?;
            assert!(!fibra::fs::exists(dir.join("copy.txt"))?);
            assert!(fibra::fs::exists(dir.join("moved.txt"))?);
            let mut names: Vec<String> = fibra::fs::read_dir(&dir)?
                .map(|e| Ok(e?.file_name().into_string().unwrap()))
                .collect::<io::Result<_>>()?;
            names.sort();
            assert_eq!(names, ["a", "file.txt", "moved.txt"]);
            for entry in fibra::fs::read_dir(&dir)? {
                let entry = entry?;
                let is_dir = entry.file_name() == "a";
                assert_eq!(entry.file_type()?.is_dir(), is_dir);
                assert_eq!(entry.metadata()?.is_dir(), is_dir);
                assert_eq!(entry.path(), dir.join(entry.file_name()));
            }
            assert_eq!(
                fibra::fs::canonicalize(dir.join("a/b/../b"))?,
                fibra::fs::canonicalize(dir.join("a/b"))?
            );
            let mut perm = fibra::fs::metadata(dir.join("moved.txt"))?.permissions();
            perm.set_mode(0o600);
            fibra::fs::set_permissions(dir.join("moved.txt"), perm)?;
            assert_eq!(
                fibra::fs::symlink_metadata(dir.join("moved.txt"))?
                    .permissions()
                    .mode()
                    & 0o777,
                0o600
            );
            fibra::fs::remove_file(dir.join("moved.txt"))?;
            fibra::fs::create_dir(dir.join("empty"))?;
            fibra::fs::remove_dir(dir.join("empty"))?;
            fibra::fs::remove_dir_all(dir.join("a"))?;
            assert!(!fibra::fs::exists(dir.join("a"))?);
            assert_eq!(thread::current().id(), home, "every call resumed at home");
            Ok(())
        })
        .unwrap();
    });
}

#[test]
fn large_directories_are_listed_in_batches() {
    with_deadline(|| {
        let scratch = Scratch::new("many");
        for i in 0..300 {
            std::fs::write(scratch.path(&format!("f{i:03}")), "").unwrap();
        }
        let dir = scratch.0.clone();
        let mut names = in_fiber(move || {
            fibra::fs::read_dir(&dir)
                .unwrap()
                .map(|e| e.unwrap().file_name().into_string().unwrap())
                .collect::<Vec<_>>()
        });
        names.sort();
        let expected: Vec<_> = (0..300).map(|i| format!("f{i:03}")).collect();
        assert_eq!(names, expected);
    });
}

#[test]
fn it_works_outside_a_fiber_too() {
    let scratch = Scratch::new("outside");
    let path = scratch.path("plain.txt");
    fibra::fs::write(&path, "from a thread").unwrap();
    assert_eq!(fibra::fs::read_to_string(&path).unwrap(), "from a thread");
    let mut s = String::new();
    fibra::fs::File::open(&path)
        .unwrap()
        .read_to_string(&mut s)
        .unwrap();
    assert_eq!(s, "from a thread");
}

/// `fibra`'s result and std's for the same operation: both fail with the same kind.
fn same_error<T: std::fmt::Debug, U: std::fmt::Debug>(
    fibra_result: io::Result<T>,
    std_result: io::Result<U>,
) -> ErrorKind {
    let ours = fibra_result.expect_err("fibra::fs should fail here");
    let theirs = std_result.expect_err("std::fs fails here");
    assert_eq!(ours.kind(), theirs.kind(), "{ours} vs std's {theirs}");
    assert_eq!(ours.raw_os_error(), theirs.raw_os_error());
    ours.kind()
}

#[test]
fn errors_come_back_as_io_errors() {
    with_deadline(|| {
        let scratch = Scratch::new("errors");
        let dir = scratch.0.clone();
        in_fiber(move || {
            let missing = dir.join("missing");
            let nf = ErrorKind::NotFound;
            assert_eq!(
                same_error(fibra::fs::read(&missing), std::fs::read(&missing)),
                nf
            );
            assert_eq!(
                same_error(
                    fibra::fs::read_to_string(&missing),
                    std::fs::read_to_string(&missing)
                ),
                nf
            );
            assert_eq!(
                same_error(
                    fibra::fs::File::open(&missing),
                    std::fs::File::open(&missing)
                ),
                nf
            );
            assert_eq!(
                same_error(fibra::fs::metadata(&missing), std::fs::metadata(&missing)),
                nf
            );
            assert_eq!(
                same_error(
                    fibra::fs::remove_file(&missing),
                    std::fs::remove_file(&missing)
                ),
                nf
            );
            assert_eq!(
                same_error(fibra::fs::read_dir(&missing), std::fs::read_dir(&missing)),
                nf
            );
            assert_eq!(
                same_error(
                    fibra::fs::rename(&missing, dir.join("x")),
                    std::fs::rename(&missing, dir.join("x"))
                ),
                nf
            );
            assert_eq!(
                same_error(
                    fibra::fs::copy(&missing, dir.join("x")),
                    std::fs::copy(&missing, dir.join("x"))
                ),
                nf
            );
            assert_eq!(
                same_error(
                    fibra::fs::write(missing.join("deeper"), "x"),
                    std::fs::write(missing.join("deeper"), "x")
                ),
                nf
            );

            let file = dir.join("file");
            std::fs::write(&file, "x").unwrap();
            assert_eq!(
                same_error(fibra::fs::read_dir(&file), std::fs::read_dir(&file)),
                ErrorKind::NotADirectory
            );
            assert_eq!(
                same_error(
                    fibra::fs::create_dir_all(file.join("sub")),
                    std::fs::create_dir_all(file.join("sub"))
                ),
                ErrorKind::NotADirectory
            );
            assert_eq!(
                same_error(
                    fibra::fs::File::create_new(&file),
                    std::fs::File::create_new(&file)
                ),
                ErrorKind::AlreadyExists
            );
            assert_eq!(
                same_error(fibra::fs::create_dir(&dir), std::fs::create_dir(&dir)),
                ErrorKind::AlreadyExists
            );
            assert_eq!(
                same_error(fibra::fs::write(&dir, "x"), std::fs::write(&dir, "x")),
                ErrorKind::IsADirectory
            );
            assert_eq!(
                same_error(fibra::fs::remove_dir(&dir), std::fs::remove_dir(&dir)),
                ErrorKind::DirectoryNotEmpty
            );
            // A read from a file opened only for writing.
            let mut w = fibra::fs::File::create(dir.join("w")).unwrap();
            let mut buf = [0u8; 4];
            assert!(w.read(&mut buf).is_err());
        });
    });
}

fn running_as_root() -> bool {
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe { libc::geteuid() == 0 }
}

#[test]
fn permission_denied_comes_back_as_an_io_error() {
    with_deadline(|| {
        let scratch = Scratch::new("permissions");
        let locked = scratch.path("mode-000");
        std::fs::write(&locked, "secret").unwrap();
        std::fs::set_permissions(&locked, std::fs::Permissions::from_mode(0o000)).unwrap();
        let read_only_dir = scratch.path("read-only-dir");
        std::fs::create_dir(&read_only_dir).unwrap();
        std::fs::set_permissions(&read_only_dir, std::fs::Permissions::from_mode(0o500)).unwrap();
        let (l, d) = (locked.clone(), read_only_dir.clone());
        let (read, create) = in_fiber(move || {
            (
                fibra::fs::read(&l).map(|_| ()),
                fibra::fs::write(d.join("new"), "x"),
            )
        });
        if running_as_root() {
            // Root's CAP_DAC_OVERRIDE ignores permission bits; fibra must behave as std does.
            println!(
                "running as root: mode 000 and a read-only directory do not stop root, so \
                 those cases only check that fibra::fs agrees with std (both succeed)"
            );
            assert_eq!(read.is_ok(), std::fs::read(&locked).is_ok());
            assert_eq!(
                create.is_ok(),
                std::fs::write(read_only_dir.join("new2"), "x").is_ok()
            );
        } else {
            assert_eq!(read.unwrap_err().kind(), ErrorKind::PermissionDenied);
            assert_eq!(create.unwrap_err().kind(), ErrorKind::PermissionDenied);
        }
        // An immutable file refuses writes even to root (EPERM: PermissionDenied too).
        let frozen = scratch.path("immutable");
        std::fs::write(&frozen, "frozen").unwrap();
        match set_immutable(&frozen, true) {
            Err(e) => println!("skipping the immutable-file case: cannot set the flag here: {e}"),
            Ok(()) => {
                let f = frozen.clone();
                let (write, open, remove) = in_fiber(move || {
                    (
                        fibra::fs::write(&f, "thaw"),
                        fibra::fs::OpenOptions::new()
                            .append(true)
                            .open(&f)
                            .map(|_| ()),
                        fibra::fs::remove_file(&f),
                    )
                });
                set_immutable(&frozen, false).unwrap();
                for r in [write, open, remove] {
                    assert_eq!(r.unwrap_err().kind(), ErrorKind::PermissionDenied);
                }
            }
        }
        std::fs::set_permissions(&read_only_dir, std::fs::Permissions::from_mode(0o700)).unwrap();
    });
}

/// Sets or clears the ext4/xfs/btrfs "immutable" attribute (`chattr +i`), which needs
/// CAP_LINUX_IMMUTABLE and a file system that supports it.
fn set_immutable(path: &Path, on: bool) -> io::Result<()> {
    use std::os::fd::AsRawFd;
    const FS_IMMUTABLE_FL: libc::c_int = 0x10;
    let f = std::fs::File::open(path)?;
    let mut flags: libc::c_int = 0;
    // SAFETY: FS_IOC_GETFLAGS writes one int (the kernel's type, despite the ioctl's name)
    // to the pointer, which points to a live local; the fd is open.
    if unsafe { libc::ioctl(f.as_raw_fd(), libc::FS_IOC_GETFLAGS, &mut flags) } != 0 {
        return Err(io::Error::last_os_error());
    }
    if on {
        flags |= FS_IMMUTABLE_FL;
    } else {
        flags &= !FS_IMMUTABLE_FL;
    }
    // SAFETY: FS_IOC_SETFLAGS reads one int from the pointer, a live local; the fd is open.
    if unsafe { libc::ioctl(f.as_raw_fd(), libc::FS_IOC_SETFLAGS, &flags) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}
