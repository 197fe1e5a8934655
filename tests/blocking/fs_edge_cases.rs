//! `fibra::fs` at its edges: directories deleted while read, std's open errors, file calls
//! on a minimum stack, one file from many fibers, cancellation during a pool call.

use std::io::{ErrorKind, Read, Seek, SeekFrom, Write};
use std::sync::Arc;
use std::thread;
use std::time::Duration;

use crate::common::{finish, started, wait_until, LIMIT};
use fibra::dump::{Status, WaitOn};
use fibra::{Scheduler, MIN_STACK_SIZE};

fn scratch(what: &str) -> std::path::PathBuf {
    let d = std::env::temp_dir().join(format!("fibra-fs-edge-{what}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// Whether the fiber of `id` is parked on what `on` accepts, by this scheduler's dump (the
/// reactor's and the pool's counters are the whole process's, which other tests share).
fn parked_on(sched: &Scheduler, id: fibra::FiberId, on: impl Fn(&WaitOn) -> bool) -> bool {
    sched
        .dump()
        .fibers()
        .iter()
        .any(|e| e.id() == id && matches!(e.status(), Status::Parked(w) if on(&w)))
}

// ---------------------------------------------------------------------------------------
// 2. fs
// ---------------------------------------------------------------------------------------

/// read_dir of a directory removed while it is being iterated: the iteration ends (entries or
/// errors), bounded, no panic, in a fiber and on a thread.
#[test]
fn fs_read_dir_of_a_directory_deleted_mid_iteration() {
    crate::common::with_deadline(|| {
        let sched = started(2);
        let run = |tag: &'static str| {
            let dir = scratch(tag);
            for i in 0..1000 {
                std::fs::write(dir.join(format!("f{i:04}")), b"").unwrap();
            }
            let mut it = fibra::fs::read_dir(&dir).unwrap();
            let first = it.next().expect("one entry").unwrap();
            assert!(first.file_type().unwrap().is_file());
            fibra::fs::remove_dir_all(&dir).unwrap();
            let mut n = 1;
            for e in it.by_ref() {
                n += 1;
                assert!(n <= 2000, "endless iteration");
                if let Ok(e) = e {
                    let _ = e.metadata();
                }
            }
            assert!(it.next().is_none());
            assert!(it.next().is_none());
            n
        };
        run("rd-thread");
        finish(sched.spawn(move || run("rd-fiber")));
        sched.stop();
    });
}

/// Opening a directory for writing is EISDIR; opening a missing file is NotFound; the same
/// errors as std, in a fiber and on a thread.
#[test]
fn fs_open_errors_match_std() {
    crate::common::with_deadline(|| {
        let sched = started(1);
        let dir = scratch("open-errs");
        let d2 = dir.clone();
        let check = move || {
            let e = fibra::fs::OpenOptions::new()
                .write(true)
                .open(&d2)
                .unwrap_err();
            let s = std::fs::OpenOptions::new()
                .write(true)
                .open(&d2)
                .unwrap_err();
            assert_eq!(e.raw_os_error(), s.raw_os_error());
            assert_eq!(e.raw_os_error(), Some(libc::EISDIR));
            let e = fibra::fs::File::open(d2.join("missing")).unwrap_err();
            assert_eq!(e.kind(), ErrorKind::NotFound);
            // Reading a directory opened read-only: EISDIR on read.
            let f = fibra::fs::File::open(&d2).unwrap();
            let e = (&f).read(&mut [0u8; 8]).unwrap_err();
            assert_eq!(e.raw_os_error(), Some(libc::EISDIR));
            let e = fibra::fs::read(&d2).unwrap_err();
            assert_eq!(e.raw_os_error(), Some(libc::EISDIR));
            // create_new on an existing path.
            let e = fibra::fs::File::create_new(&d2).unwrap_err();
            assert_eq!(e.kind(), ErrorKind::AlreadyExists);
            // A path with an interior NUL is InvalidInput, not a panic.
            let e = fibra::fs::File::open("a\0b").unwrap_err();
            assert_eq!(e.kind(), ErrorKind::InvalidInput);
        };
        check();
        finish(sched.spawn(check));
        let _ = std::fs::remove_dir_all(&dir);
        sched.stop();
    });
}

/// File: write, seek (past the end, negative), set_len (grow and shrink), sync, metadata,
/// read_exact past EOF, from a fiber on the minimum stack.
#[test]
fn fs_file_ops_on_a_minimum_stack_fiber() {
    crate::common::with_deadline(|| {
        let sched = started(1);
        let dir = scratch("fileops");
        let path = dir.join("f");
        let h = sched
            .task()
            .stack_size(MIN_STACK_SIZE)
            .name("min-fs")
            .submit(
                move || {
                    let mut f = fibra::fs::File::options()
                        .read(true)
                        .write(true)
                        .create(true)
                        .truncate(true)
                        .open(&path)
                        .unwrap();
                    f.write_all(b"0123456789").unwrap();
                    assert_eq!(f.stream_position().unwrap(), 10);
                    let e = f.seek(SeekFrom::Current(-100)).unwrap_err();
                    assert_eq!(e.kind(), ErrorKind::InvalidInput);
                    assert_eq!(f.seek(SeekFrom::Start(1 << 20)).unwrap(), 1 << 20);
                    f.write_all(b"end").unwrap();
                    assert_eq!(f.metadata().unwrap().len(), (1 << 20) + 3);
                    f.set_len(5).unwrap();
                    assert_eq!(f.metadata().unwrap().len(), 5);
                    f.set_len(1 << 30).unwrap(); // sparse 1 GiB
                    assert_eq!(f.metadata().unwrap().len(), 1 << 30);
                    f.set_len(5).unwrap();
                    f.sync_all().unwrap();
                    f.sync_data().unwrap();
                    f.seek(SeekFrom::Start(0)).unwrap();
                    let mut buf = [0u8; 8];
                    let e = f.read_exact(&mut buf).unwrap_err();
                    assert_eq!(e.kind(), ErrorKind::UnexpectedEof);
                    f.seek(SeekFrom::Start(0)).unwrap();
                    let mut s = String::new();
                    f.read_to_string(&mut s).unwrap();
                    s
                },
                None,
            )
            .unwrap();
        assert_eq!(finish(h), "01234");
        let _ = std::fs::remove_dir_all(&dir);
        sched.stop();
    });
}

/// One File (O_APPEND) written by 32 fibers at once through `&File`: every record arrives
/// whole; then a 48 MiB read into a Vec, read_exact into a big heap buffer.
#[test]
fn fs_one_file_many_fibers_and_large_reads() {
    crate::common::with_deadline(|| {
        const FIBERS: usize = 32;
        const RECORDS: usize = 100;
        let sched = started(2);
        let dir = scratch("shared");
        let path = dir.join("log");
        let f = Arc::new(
            fibra::fs::File::options()
                .append(true)
                .create(true)
                .open(&path)
                .unwrap(),
        );
        let hs: Vec<_> = (0..FIBERS)
            .map(|i| {
                let f = f.clone();
                sched.spawn(move || {
                    let rec = [b'a' + (i % 26) as u8; 64];
                    for _ in 0..RECORDS {
                        (&*f).write_all(&rec).unwrap();
                    }
                })
            })
            .collect();
        for h in hs {
            finish(h);
        }
        let data = std::fs::read(&path).unwrap();
        assert_eq!(data.len(), FIBERS * RECORDS * 64);
        for rec in data.chunks(64) {
            assert!(rec.iter().all(|&b| b == rec[0]), "a torn record");
        }
        let big = dir.join("big");
        std::fs::write(&big, vec![3u8; 48 << 20]).unwrap();
        let b2 = big.clone();
        let (n, sum) = finish(sched.spawn(move || {
            let v = fibra::fs::read(&b2).unwrap();
            let mut f = fibra::fs::File::open(&b2).unwrap();
            let mut buf = vec![0u8; 48 << 20];
            f.read_exact(&mut buf).unwrap();
            assert_eq!(f.read(&mut buf).unwrap(), 0);
            (v.len(), buf.iter().map(|&x| x as u64).sum::<u64>())
        }));
        assert_eq!(n, 48 << 20);
        assert_eq!(sum, 3 * (48 << 20));
        let _ = std::fs::remove_dir_all(&dir);
        sched.stop();
    });
}

/// A fiber cancelled while its `fs` call blocks on the pool (opening a FIFO with no writer)
/// must not finish before the call does: the call borrows the fiber's stack.
#[test]
fn fs_cancel_during_a_blocked_pool_call_waits_for_it() {
    crate::common::with_deadline(|| {
        let sched = started(1);
        let dir = scratch("fifo");
        let fifo = dir.join("p");
        let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
        // SAFETY: a valid NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
        let f2 = fifo.clone();
        let h = sched.spawn(move || {
            let mut buf = [0u8; 16];
            let mut f = fibra::fs::File::open(&f2).unwrap(); // blocks: no writer yet
            let n = f.read(&mut buf).unwrap();
            buf[..n].to_vec()
        });
        wait_until("the call blocks on the pool", || {
            parked_on(&sched, h.id(), |w| *w == WaitOn::Blocking)
        });
        h.cancel();
        thread::sleep(Duration::from_millis(100));
        assert!(
            !h.is_finished(),
            "the fiber left while the pool still had its call"
        );
        // The worker is not blocked meanwhile.
        assert_eq!(finish(sched.spawn(|| 5)), 5);
        // Opening the write end lets the pool's open return; the cancelled fiber then drops
        // the file it will never read, so the write may find no reader (EPIPE).
        let mut w = std::fs::OpenOptions::new().write(true).open(&fifo).unwrap();
        let _ = w.write_all(b"late");
        drop(w);
        assert!(h.wait_timeout(LIMIT));
        let r = h.join();
        assert!(r.is_err() && r.unwrap_err().is_cancelled());
        let _ = std::fs::remove_dir_all(&dir);
        sched.stop();
    });
}
