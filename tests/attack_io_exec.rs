//! Adversarial checks of `fibra::net`, `fibra::fs`, the executors, observability, stacks
//! and tasks: accept storms and EMFILE, timeouts at the extremes, half-closes, many fibers on
//! one socket, UDP and Unix datagrams, readiness continuations racing resets and shutdowns;
//! directories deleted while read, one file from many fibers, cancellation in a pool call;
//! ten thousand continuations and chained tasks; dumps and the watchdog during shutdown;
//! stacks at their limits, misuse of the task builder, JoinSet and scope with thousands of
//! tasks cancelled midway.

mod common;

use std::collections::HashSet;
use std::io::{ErrorKind, Read, Seek, SeekFrom, Write};
use std::net::Shutdown;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use common::{finish, started, wait_until, LIMIT};
use fibra::dump::{Status, WaitOn};
use fibra::exec::{Executor, Inline, Looper, NewThread, ThreadPool};
use fibra::net::unix::{UnixDatagram, UnixStream};
use fibra::net::{TcpListener, TcpStream, UdpSocket};
use fibra::{JoinSet, Scheduler, WhenReadableError, MIN_STACK_SIZE};

const CHILD: &str = "FIBRA_ATTACK_IO_EXEC_CHILD";

fn scratch(what: &str) -> std::path::PathBuf {
    let d = std::env::temp_dir().join(format!(
        "fibra-attack-io-exec-{what}-{}",
        std::process::id()
    ));
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

fn io(w: &WaitOn) -> bool {
    matches!(w, WaitOn::Io { .. })
}

// ---------------------------------------------------------------------------------------
// 1. net
// ---------------------------------------------------------------------------------------

/// Several fibers accept on one listener (`&TcpListener` in an `Arc`): every connection is
/// accepted exactly once, none is lost, nobody hangs.
#[test]
fn net_many_acceptors_share_one_listener_each_connection_once() {
    common::with_deadline(|| {
        const N: usize = 400;
        const ACCEPTORS: usize = 4;
        let sched = started(2);
        let listener = Arc::new(TcpListener::bind("127.0.0.1:0").unwrap());
        let addr = listener.local_addr().unwrap();
        let accepted = Arc::new(AtomicUsize::new(0));
        let acceptors: Vec<_> = (0..ACCEPTORS)
            .map(|_| {
                let (l, accepted) = (listener.clone(), accepted.clone());
                sched.spawn(move || {
                    let mut mine = Vec::new();
                    loop {
                        let (mut s, _) = l.accept().expect("accept");
                        let mut b = [0u8; 8];
                        s.read_exact(&mut b).unwrap();
                        mine.push(u64::from_le_bytes(b));
                        if accepted.fetch_add(1, Ordering::SeqCst) + 1 >= N {
                            return mine;
                        }
                    }
                })
            })
            .collect();
        // N + ACCEPTORS - 1 clients, so every acceptor returns.
        let total = N + ACCEPTORS - 1;
        let clients: Vec<_> = (0..4)
            .map(|t| {
                thread::spawn(move || {
                    let mut keep = Vec::new();
                    for i in (t..total).step_by(4) {
                        let mut c = std::net::TcpStream::connect(addr).unwrap();
                        c.write_all(&(i as u64).to_le_bytes()).unwrap();
                        keep.push(c);
                    }
                    keep
                })
            })
            .collect();
        let mut all = Vec::new();
        for a in acceptors {
            all.extend(finish(a));
        }
        for c in clients {
            drop(c.join().unwrap());
        }
        let set: HashSet<u64> = all.iter().copied().collect();
        assert_eq!(all.len(), total, "accepted {} of {total}", all.len());
        assert_eq!(set.len(), total, "a connection was accepted twice");
        sched.stop();
    });
}

/// An accept loop that retries EMFILE at once (no backoff) on the only worker, while another
/// fiber of that worker frees descriptors after a sleep: the docs promise the loop yields
/// (cooperative budget), so the other fiber's timer fires and the loop then accepts.
#[test]
fn net_accept_retrying_emfile_at_once_still_progresses() {
    let (status, err) = common::run_child(CHILD, "child_accept_emfile_spin");
    assert!(status.success(), "child failed: {status:?}\n{err}");
}

#[test]
#[ignore = "child of net_accept_retrying_emfile_at_once_still_progresses"]
fn child_accept_emfile_spin() {
    if !common::is_child(CHILD, "child_accept_emfile_spin") {
        return;
    }
    let sched = started(1);
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let _pending: Vec<_> = (0..3)
        .map(|_| std::net::TcpStream::connect(addr).unwrap())
        .collect();
    // Register the listener's fd with the reactor while fds are available.
    let filler = common::fill_descriptor_table(0);
    let freed = Arc::new(AtomicBool::new(false));
    let f2 = freed.clone();
    let freer = sched.spawn(move || {
        fibra::sleep(Duration::from_millis(50));
        drop(filler);
        f2.store(true, Ordering::SeqCst);
    });
    let acceptor = sched.spawn(move || {
        let start = Instant::now();
        let mut emfiles = 0u64;
        loop {
            match listener.accept() {
                Ok(_) => return (emfiles, start.elapsed()),
                Err(e) if e.raw_os_error() == Some(libc::EMFILE) => {
                    emfiles += 1;
                    assert!(
                        start.elapsed() < Duration::from_secs(20),
                        "EMFILE loop never let the freer run ({emfiles} tries)"
                    );
                }
                Err(e) => panic!("accept: {e}"),
            }
        }
    });
    let (emfiles, took) = finish(acceptor);
    finish(freer);
    assert!(freed.load(Ordering::SeqCst));
    eprintln!("accepted after {emfiles} EMFILE retries, {took:?}");
    sched.stop();
}

/// connect_timeout with zero (InvalidInput), Duration::MAX (connects) and a closed port
/// (refused, not timed out), from a fiber and from a plain thread.
#[test]
fn net_connect_timeout_extremes_fiber_and_thread() {
    common::with_deadline(|| {
        let sched = started(2);
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let closed = {
            let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            l.local_addr().unwrap()
        };
        let check = move || {
            let e = TcpStream::connect_timeout(&addr, Duration::ZERO).unwrap_err();
            assert_eq!(e.kind(), ErrorKind::InvalidInput);
            let s = TcpStream::connect_timeout(&addr, Duration::MAX).expect("MAX connects");
            assert_eq!(s.peer_addr().unwrap(), addr);
            let e = TcpStream::connect_timeout(&closed, Duration::MAX).unwrap_err();
            assert_eq!(e.kind(), ErrorKind::ConnectionRefused, "{e:?}");
            let e = TcpStream::connect_timeout(&closed, Duration::from_nanos(1));
            // 1 ns: refused (loopback answers at once) or timed out; never a hang or Ok.
            let e = e.unwrap_err();
            assert!(
                matches!(e.kind(), ErrorKind::ConnectionRefused | ErrorKind::TimedOut),
                "{e:?}"
            );
        };
        check();
        finish(sched.spawn(check));
        drop(listener);
        sched.stop();
    });
}

/// Half-close: the client shuts its write side; the server reads to EOF, then answers; the
/// client reads the answer and then EOF. Both sides in fibers on different workers.
#[test]
fn net_half_close_round_trip_in_fibers() {
    common::with_deadline(|| {
        let sched = started(2);
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let server = sched
            .submit(
                move || {
                    let (mut s, _) = listener.accept().unwrap();
                    let mut got = Vec::new();
                    s.read_to_end(&mut got).unwrap();
                    // After EOF, a read returns 0 again at once.
                    assert_eq!(s.read(&mut [0u8; 4]).unwrap(), 0);
                    let reply: Vec<u8> = got.iter().rev().copied().collect();
                    s.write_all(&reply).unwrap();
                    s.shutdown(Shutdown::Write).unwrap();
                    // Writing after our own shutdown is EPIPE, without SIGPIPE.
                    let e = s.write(b"x").unwrap_err();
                    assert_eq!(e.kind(), ErrorKind::BrokenPipe, "{e:?}");
                    got.len()
                },
                Some(0),
            )
            .unwrap();
        let client = sched
            .submit(
                move || {
                    let mut s = TcpStream::connect(addr).unwrap();
                    let msg: Vec<u8> = (0..200_000u32).map(|i| (i % 251) as u8).collect();
                    s.write_all(&msg).unwrap();
                    s.shutdown(Shutdown::Write).unwrap();
                    let mut back = Vec::new();
                    s.read_to_end(&mut back).unwrap();
                    back.reverse();
                    back == msg
                },
                Some(1),
            )
            .unwrap();
        assert_eq!(finish(server), 200_000);
        assert!(finish(client));
        sched.stop();
    });
}

/// Many fibers read and many write one socket at once through `&TcpStream` (an `Arc`),
/// on both workers: every byte arrives once, and when the writer side shuts down, every
/// reader sees EOF (nobody stays parked).
#[test]
fn net_many_fibers_read_and_write_one_socket() {
    common::with_deadline(|| {
        const WRITERS: usize = 6;
        const READERS: usize = 6;
        const PER_WRITER: usize = 300_000;
        let sched = started(2);
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let (a, b) = sched.block_on(move || {
            let c = TcpStream::connect(addr).unwrap();
            let (s, _) = listener.accept().unwrap();
            (c, s)
        });
        let (a, b) = (Arc::new(a), Arc::new(b));
        let readers: Vec<_> = (0..READERS)
            .map(|_| {
                let b = b.clone();
                sched.spawn(move || {
                    let mut n = 0usize;
                    let mut sum = 0u64;
                    let mut buf = [0u8; 3000];
                    loop {
                        match (&*b).read(&mut buf) {
                            Ok(0) => return (n, sum),
                            Ok(k) => {
                                n += k;
                                sum += buf[..k].iter().map(|&x| u64::from(x)).sum::<u64>();
                            }
                            Err(e) => panic!("read: {e}"),
                        }
                    }
                })
            })
            .collect();
        let writers: Vec<_> = (0..WRITERS)
            .map(|w| {
                let a = a.clone();
                sched.spawn(move || {
                    let chunk = vec![(w + 1) as u8; 7919];
                    let mut left = PER_WRITER;
                    while left > 0 {
                        let k = left.min(chunk.len());
                        (&*a).write_all(&chunk[..k]).unwrap();
                        left -= k;
                    }
                })
            })
            .collect();
        for w in writers {
            finish(w);
        }
        a.shutdown(Shutdown::Write).unwrap();
        let (mut n, mut sum) = (0, 0);
        for r in readers {
            let (k, s) = finish(r);
            n += k;
            sum += s;
        }
        let want: u64 = (1..=WRITERS as u64).map(|w| w * PER_WRITER as u64).sum();
        assert_eq!(n, WRITERS * PER_WRITER);
        assert_eq!(sum, want);
        sched.stop();
    });
}

/// A fiber waits to read on a socket while another fiber makes a `try_clone` of it and
/// drops the clone (and the fd number is reused by a new socket meanwhile): the waiter
/// neither errors nor misses the data that comes later.
#[test]
fn net_try_clone_dropped_while_another_fiber_waits() {
    common::with_deadline(|| {
        let sched = started(2);
        let (listener, mut client) = common::listener_and_client();
        let (s, _) = listener.accept().unwrap();
        let s = Arc::new(s);
        let s2 = s.clone();
        let waiter = sched
            .submit(
                move || {
                    let mut buf = [0u8; 5];
                    (&*s2).read_exact(&mut buf).map(|_| buf)
                },
                Some(0),
            )
            .unwrap();
        wait_until("the waiter parks on I/O", || {
            parked_on(&sched, waiter.id(), io)
        });
        let s3 = s.clone();
        let addr = listener.local_addr().unwrap();
        finish(
            sched
                .submit(
                    move || {
                        for _ in 0..50 {
                            let c = s3.try_clone().unwrap();
                            // Make the clone wait once so it is registered, then drop it.
                            c.set_read_timeout(Some(Duration::from_millis(1))).unwrap();
                            let e = (&c).read(&mut [0u8; 1]).unwrap_err();
                            assert_eq!(e.kind(), ErrorKind::WouldBlock);
                            let fd = std::os::fd::AsRawFd::as_raw_fd(&c);
                            drop(c);
                            // Likely gets the same fd number.
                            let other = TcpStream::connect(addr).unwrap();
                            let _ = fd == std::os::fd::AsRawFd::as_raw_fd(&other);
                        }
                        // Timeouts are shared: reset for the waiter's sake (it started
                        // without one and keeps its deadline anyway).
                        s3.set_read_timeout(None).unwrap();
                    },
                    Some(1),
                )
                .unwrap(),
        );
        thread::sleep(Duration::from_millis(50));
        assert!(!waiter.is_finished(), "the waiter woke without data");
        client.write_all(b"hello").unwrap();
        assert_eq!(&finish(waiter).expect("read after clones"), b"hello");
        sched.stop();
    });
}

/// UDP: a datagram longer than the buffer is truncated (the rest discarded, the next one
/// intact), from fibers and threads; a receive with a read timeout gives WouldBlock, not
/// before the timeout.
#[test]
fn net_udp_truncation_and_timeouts() {
    common::with_deadline(|| {
        let sched = started(2);
        let body = || {
            let a = UdpSocket::bind("127.0.0.1:0").unwrap();
            let b = UdpSocket::bind("127.0.0.1:0").unwrap();
            let baddr = b.local_addr().unwrap();
            a.send_to(&[7u8; 1000], baddr).unwrap();
            a.send_to(b"tail", baddr).unwrap();
            let mut small = [0u8; 10];
            let (n, from) = b.recv_from(&mut small).unwrap();
            assert_eq!(n, 10);
            assert_eq!(from, a.local_addr().unwrap());
            let mut buf = [0u8; 100];
            let (n, _) = b.recv_from(&mut buf).unwrap();
            assert_eq!(&buf[..n], b"tail");
            b.set_read_timeout(Some(Duration::from_millis(60))).unwrap();
            let t = Instant::now();
            let e = b.recv_from(&mut buf).unwrap_err();
            assert_eq!(e.kind(), ErrorKind::WouldBlock, "{e:?}");
            assert!(
                t.elapsed() >= Duration::from_millis(60),
                "{:?}",
                t.elapsed()
            );
            // Zero-length datagram.
            a.send_to(&[], baddr).unwrap();
            let (n, _) = b.recv_from(&mut buf).unwrap();
            assert_eq!(n, 0);
        };
        body();
        finish(sched.spawn(body));
        sched.stop();
    });
}

/// Unix datagrams: truncation, timeouts, and a peer that goes away (ECONNREFUSED on send to
/// a vanished connected peer), in a fiber.
#[test]
fn net_unix_datagram_truncation_timeout_and_vanished_peer() {
    common::with_deadline(|| {
        let sched = started(1);
        finish(sched.spawn(|| {
            let (a, b) = UnixDatagram::pair().unwrap();
            a.send(&[1u8; 500]).unwrap();
            let mut small = [0u8; 7];
            assert_eq!(b.recv(&mut small).unwrap(), 7);
            b.set_read_timeout(Some(Duration::from_millis(30))).unwrap();
            let t = Instant::now();
            assert_eq!(
                b.recv(&mut small).unwrap_err().kind(),
                ErrorKind::WouldBlock
            );
            assert!(t.elapsed() >= Duration::from_millis(30));
            drop(b);
            let e = a.send(b"x").unwrap_err();
            assert!(
                matches!(
                    e.kind(),
                    ErrorKind::ConnectionRefused | ErrorKind::BrokenPipe | ErrorKind::NotConnected
                ),
                "{e:?}"
            );
        }));
        sched.stop();
    });
}

/// Unix stream pair: a fiber blocked writing into a full socket wakes with an error when the
/// peer is dropped; a reader blocked on the other one wakes with EOF.
#[test]
fn net_unix_stream_full_writer_wakes_on_peer_drop() {
    common::with_deadline(|| {
        let sched = started(2);
        let (a, b) = UnixStream::pair().unwrap();
        let writer = sched
            .submit(
                move || {
                    let big = vec![0u8; 1 << 20];
                    let mut sent = 0usize;
                    loop {
                        match (&a).write(&big) {
                            Ok(n) => sent += n,
                            Err(e) => return (sent, e.kind()),
                        }
                        assert!(sent < 1 << 30, "never filled");
                    }
                },
                Some(0),
            )
            .unwrap();
        wait_until("the writer parks", || parked_on(&sched, writer.id(), io));
        drop(b);
        let (sent, kind) = finish(writer);
        assert!(sent > 0);
        assert!(
            matches!(kind, ErrorKind::BrokenPipe | ErrorKind::ConnectionReset),
            "{kind:?}"
        );
        sched.stop();
    });
}

/// A readiness continuation whose peer resets the connection meanwhile runs, and its read
/// reports the reset (or EOF); nothing hangs and `stop` returns.
#[test]
fn net_continuation_with_peer_reset_meanwhile() {
    common::with_deadline(|| {
        let sched = started(2);
        let (listener, client) = common::listener_and_client();
        let (tx, rx) = mpsc::channel();
        finish(sched.spawn(move || {
            let (s, _) = listener.accept().unwrap();
            assert_eq!(
                s.try_read(&mut [0u8; 8]).unwrap_err().kind(),
                ErrorKind::WouldBlock
            );
            s.spawn_when_readable(move |s| {
                let r = s.try_read(&mut [0u8; 8]).map_err(|e| e.kind());
                tx.send(r).unwrap();
            })
            .map_err(|_| ())
            .expect("registered");
        }));
        thread::sleep(Duration::from_millis(20));
        common::reset(client);
        let r = rx.recv_timeout(LIMIT).expect("continuation ran");
        assert!(
            matches!(r, Ok(0) | Err(ErrorKind::ConnectionReset)),
            "{r:?}"
        );
        sched.stop();
    });
}

/// `spawn_when_readable` from a plain thread and from a standalone `Fiber`: refused with
/// `NoScheduler`, the socket and the closure handed back, both usable.
#[test]
fn net_continuation_refused_outside_a_scheduled_fiber_even_in_a_standalone_fiber() {
    common::with_deadline(|| {
        let (listener, mut client) = common::listener_and_client();
        let (s, _) = listener.accept().unwrap();
        let ran = Arc::new(AtomicBool::new(false));
        let r2 = ran.clone();
        let slot = Arc::new(Mutex::new(None));
        let slot2 = slot.clone();
        let mut fiber = fibra::Fiber::new(move || {
            match s.spawn_when_readable(move |_s| r2.store(true, Ordering::SeqCst)) {
                Err(WhenReadableError::NoScheduler(s, f)) => {
                    *slot2.lock().unwrap() = Some((s, f));
                }
                Err(_) => panic!("wrong refusal"),
                Ok(()) => panic!("a standalone fiber registered a continuation"),
            }
        });
        fiber.resume();
        let (s, f) = slot.lock().unwrap().take().expect("handed back");
        client.write_all(b"z").unwrap();
        let mut b = [0u8; 1];
        (&s).read_exact(&mut b).unwrap();
        assert_eq!(&b, b"z");
        f(s);
        assert!(ran.load(Ordering::SeqCst));
    });
}

/// Continuations registered during a waiting `stop` by many connections at once, then the
/// peers all reset: every continuation runs, `stop` returns, nothing is counted live after.
#[test]
fn net_continuations_during_stop_with_resets() {
    common::with_deadline(|| {
        const N: usize = 64;
        let sched = Arc::new(started(2));
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let ran = Arc::new(AtomicUsize::new(0));
        let r2 = ran.clone();
        let gate = Arc::new(AtomicBool::new(false));
        let g2 = gate.clone();
        let acceptor = sched.spawn(move || {
            for _ in 0..N {
                let (s, _) = listener.accept().unwrap();
                let r = r2.clone();
                s.spawn_when_readable(move |s| {
                    let _ = s.try_read(&mut [0u8; 4]);
                    r.fetch_add(1, Ordering::SeqCst);
                })
                .map_err(|_| ())
                .expect("registered during a waiting stop");
            }
            // Keep going until the test has started stop().
            while !g2.load(Ordering::SeqCst) {
                fibra::sleep(Duration::from_millis(1));
            }
        });
        let clients: Vec<_> = (0..N)
            .map(|_| std::net::TcpStream::connect(addr).unwrap())
            .collect();
        let s2 = sched.clone();
        let stopper = thread::spawn(move || s2.stop());
        thread::sleep(Duration::from_millis(30));
        gate.store(true, Ordering::SeqCst);
        finish(acceptor);
        thread::sleep(Duration::from_millis(30));
        assert!(
            !stopper.is_finished(),
            "stop did not wait for continuations"
        );
        for c in clients {
            common::reset(c);
        }
        stopper.join().unwrap();
        assert_eq!(ran.load(Ordering::SeqCst), N);
        assert_eq!(sched.metrics().live_tasks(), 0);
    });
}

// ---------------------------------------------------------------------------------------
// 2. fs
// ---------------------------------------------------------------------------------------

/// read_dir of a directory removed while it is being iterated: the iteration ends (entries or
/// errors), bounded, no panic, in a fiber and on a thread.
#[test]
fn fs_read_dir_of_a_directory_deleted_mid_iteration() {
    common::with_deadline(|| {
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
    common::with_deadline(|| {
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
    common::with_deadline(|| {
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
    common::with_deadline(|| {
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
    common::with_deadline(|| {
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

// ---------------------------------------------------------------------------------------
// 3. exec and continuations
// ---------------------------------------------------------------------------------------

/// 10 000 then/catching/finally on one pending handle, registered from 8 threads while the
/// task completes; then 10 000 more on the finished handle. Every one runs once.
#[test]
fn exec_ten_thousand_continuations_from_many_threads() {
    common::with_deadline(|| {
        let sched = Arc::new(started(2));
        let (tx, rx) = mpsc::channel::<()>();
        let rx = Mutex::new(rx);
        let h = Arc::new(sched.spawn(move || {
            let _ = rx.lock().unwrap().recv_timeout(Duration::from_millis(20));
            fibra::sleep(Duration::from_millis(5));
            7u64
        }));
        let thens = Arc::new(AtomicUsize::new(0));
        let finals = Arc::new(AtomicUsize::new(0));
        let catches = Arc::new(AtomicUsize::new(0));
        let regs: Vec<_> = (0..8)
            .map(|_| {
                let (h, thens, finals, catches) =
                    (h.clone(), thens.clone(), finals.clone(), catches.clone());
                thread::spawn(move || {
                    for _ in 0..1250 {
                        let t = thens.clone();
                        let f = finals.clone();
                        let c = catches.clone();
                        h.then(move |v| {
                            assert_eq!(*v, 7);
                            t.fetch_add(1, Ordering::SeqCst);
                        })
                        .finally(move || {
                            f.fetch_add(1, Ordering::SeqCst);
                        })
                        .catching(move |_| {
                            c.fetch_add(1, Ordering::SeqCst);
                        });
                    }
                })
            })
            .collect();
        drop(tx);
        for r in regs {
            r.join().unwrap();
        }
        assert!(h.wait_timeout(LIMIT));
        wait_until("all continuations", || {
            thens.load(Ordering::SeqCst) == 10_000 && finals.load(Ordering::SeqCst) == 10_000
        });
        for _ in 0..10_000 {
            let t = thens.clone();
            h.then(move |_| {
                t.fetch_add(1, Ordering::SeqCst);
            });
        }
        assert_eq!(thens.load(Ordering::SeqCst), 20_000);
        assert_eq!(catches.load(Ordering::SeqCst), 0);
        sched.stop();
    });
}

/// A chain of 10 000 tasks, each started by the `then` of the previous one, on a Scheduler,
/// a ThreadPool and a Looper: finishes, no stack growth (each runs in its own fiber).
#[test]
fn exec_chain_of_ten_thousand_tasks_via_then() {
    common::with_deadline(|| {
        fn step<E: Executor + Send + Sync + 'static>(
            e: Arc<E>,
            left: usize,
            done: mpsc::Sender<usize>,
        ) {
            let e2 = e.clone();
            let h = e.spawn(move || left);
            h.then(move |&l| {
                if l == 0 {
                    done.send(0).unwrap();
                } else {
                    step(e2, l - 1, done);
                }
            });
        }
        let (tx, rx) = mpsc::channel();
        let s = Arc::new(started(2));
        step(s.clone(), 10_000, tx.clone());
        assert_eq!(rx.recv_timeout(LIMIT).unwrap(), 0);
        let p = Arc::new(ThreadPool::new(2));
        step(p.clone(), 10_000, tx.clone());
        assert_eq!(rx.recv_timeout(LIMIT).unwrap(), 0);
        let l = Arc::new(Looper::new());
        step(l.clone(), 10_000, tx.clone());
        assert_eq!(rx.recv_timeout(LIMIT).unwrap(), 0);
        s.stop();
        p.shutdown();
        l.shutdown(true);
    });
}

/// Inline: a chain of continuations where each `then` is on an already-finished handle runs
/// each at once, nested. 10 000 deep on a thread with an 8 MiB stack.
#[test]
fn exec_inline_chain_ten_thousand_deep() {
    let t = thread::Builder::new()
        .stack_size(64 << 20)
        .spawn(|| {
            fn step(left: usize, count: Arc<AtomicUsize>) {
                let h = Inline.spawn(move || left);
                let c = count.clone();
                h.then(move |&l| {
                    c.fetch_add(1, Ordering::SeqCst);
                    if l > 0 {
                        step(l - 1, c);
                    }
                });
            }
            let count = Arc::new(AtomicUsize::new(0));
            step(10_000, count.clone());
            count.load(Ordering::SeqCst)
        })
        .unwrap();
    assert_eq!(t.join().unwrap(), 10_001);
}

/// A continuation that submits to a stopped executor (Looper, ThreadPool, Scheduler) gets a
/// cancelled handle; `execute` drops the job (its captures dropped once).
#[test]
fn exec_continuation_submitting_to_stopped_executors() {
    common::with_deadline(|| {
        let looper = Arc::new(Looper::new());
        let pool = Arc::new(ThreadPool::new(1));
        let sched = Arc::new(started(1));
        looper.shutdown(true);
        pool.shutdown();
        sched.stop();
        let host = started(1);
        let drops = Arc::new(AtomicUsize::new(0));
        let (tx, rx) = mpsc::channel();
        let (l, p, s, d) = (looper.clone(), pool.clone(), sched.clone(), drops.clone());
        let h = host.spawn(|| 1);
        h.then(move |_| {
            let a = l.spawn(|| 1).join().unwrap_err().is_cancelled();
            let b = p.spawn(|| 1).join().unwrap_err().is_cancelled();
            let c = Executor::spawn(&*s, || 1)
                .join()
                .unwrap_err()
                .is_cancelled();
            let c1 = common::Counted(d.clone());
            let c2 = common::Counted(d.clone());
            let c3 = common::Counted(d.clone());
            l.execute(Box::new(move || drop(c1)));
            p.execute(Box::new(move || drop(c2)));
            s.execute(Box::new(move || drop(c3)));
            tx.send((a, b, c)).unwrap();
        });
        assert_eq!(rx.recv_timeout(LIMIT).unwrap(), (true, true, true));
        assert_eq!(drops.load(Ordering::SeqCst), 3);
        host.stop();
    });
}

/// Looper::shutdown(false) with 1 000 queued jobs whose handles have `catching`: each
/// catching sees a cancellation and, as documented, runs inside a fiber.
#[test]
fn exec_looper_discard_runs_catching_in_a_fiber() {
    common::with_deadline(|| {
        let looper = Looper::new();
        let (gate_tx, gate_rx) = mpsc::channel::<()>();
        let (running_tx, running) = mpsc::channel::<()>();
        let blocker = looper.spawn(move || {
            running_tx.send(()).unwrap();
            // Blocks the looper thread so the rest stays queued.
            let _ = gate_rx.recv_timeout(Duration::from_secs(2));
        });
        // Started before the shutdown, so it is not among the discarded.
        running.recv_timeout(LIMIT).unwrap();
        let in_fiber = Arc::new(AtomicUsize::new(0));
        let caught = Arc::new(AtomicUsize::new(0));
        let handles: Vec<_> = (0..1000)
            .map(|_| {
                let h = looper.spawn(|| ());
                let (f, c) = (in_fiber.clone(), caught.clone());
                h.catching(move |e| {
                    assert!(e.is_cancelled());
                    c.fetch_add(1, Ordering::SeqCst);
                    if fibra::Fiber::current().is_some() {
                        f.fetch_add(1, Ordering::SeqCst);
                    }
                });
                h
            })
            .collect();
        let t = thread::spawn(move || {
            thread::sleep(Duration::from_millis(50));
            drop(gate_tx);
        });
        looper.shutdown(false);
        t.join().unwrap();
        finish(blocker);
        for h in handles {
            assert!(h.join().unwrap_err().is_cancelled());
        }
        assert_eq!(caught.load(Ordering::SeqCst), 1000);
        assert_eq!(
            in_fiber.load(Ordering::SeqCst),
            1000,
            "catching ran outside a fiber"
        );
    });
}

/// A ThreadPool shut down (from another thread) while a task with pending continuations is
/// parked: shutdown waits for it, the continuations run, shutdown returns.
#[test]
fn exec_pool_shutdown_with_pending_continuations() {
    common::with_deadline(|| {
        let pool = Arc::new(ThreadPool::new(2));
        let (tx, rx) = mpsc::channel::<u32>();
        let rx = Arc::new(Mutex::new(rx));
        let r2 = rx.clone();
        let h = pool.spawn(move || {
            // Park, not block: fibra's channels would do, this uses an unblock.
            fibra::unblock(|| r2.lock().unwrap().recv().unwrap())
        });
        let ran = Arc::new(AtomicUsize::new(0));
        for _ in 0..100 {
            let r = ran.clone();
            h.then(move |v| {
                assert_eq!(*v, 9);
                // A continuation that spawns on the pool being shut down: may be refused
                // (cancelled) or run, never hang.
                r.fetch_add(1, Ordering::SeqCst);
            });
        }
        let p2 = pool.clone();
        let stopper = thread::spawn(move || p2.shutdown());
        thread::sleep(Duration::from_millis(50));
        assert!(!stopper.is_finished());
        tx.send(9).unwrap();
        stopper.join().unwrap();
        assert_eq!(ran.load(Ordering::SeqCst), 100);
        assert_eq!(h.join().unwrap(), 9);
    });
}

/// NewThread.spawn from inside continuations and fibers: a thousand of them, each on its own
/// thread, all joined; threads do not pile up afterwards.
#[test]
fn exec_new_thread_spawns_from_continuations() {
    common::with_deadline(|| {
        let sched = started(2);
        let (tx, rx) = mpsc::channel();
        for i in 0..200u64 {
            let tx = tx.clone();
            sched.spawn(move || i).then(move |&i| {
                let h = NewThread.spawn(move || {
                    fibra::sleep(Duration::from_millis(1));
                    i * 2
                });
                tx.send(h.join().unwrap()).unwrap();
            });
        }
        drop(tx);
        let mut got: Vec<u64> = rx.iter().take(200).collect();
        got.sort();
        assert_eq!(got, (0..200).map(|i| i * 2).collect::<Vec<_>>());
        sched.stop();
    });
}

// ---------------------------------------------------------------------------------------
// 4. observability
// ---------------------------------------------------------------------------------------

/// metrics and dump from a fiber of the scheduler while it is stopping, from a thread, and on
/// a stopped one: all return, bounded.
#[test]
fn observe_during_and_after_shutdown_from_fibers_and_threads() {
    common::with_deadline(|| {
        let sched = Arc::new(started(2));
        let s2 = sched.clone();
        let hs: Vec<_> = (0..20)
            .map(|i| {
                let s = s2.clone();
                sched.spawn(move || {
                    for _ in 0..20 {
                        let d = s.dump();
                        assert!(d.fibers().iter().any(|e| e.worker() < 2));
                        let m = s.metrics();
                        assert_eq!(m.workers().len(), 2);
                        fibra::sleep(Duration::from_millis(i % 3));
                    }
                })
            })
            .collect();
        let s3 = sched.clone();
        let stopper = thread::spawn(move || s3.stop());
        for _ in 0..20 {
            let t = Instant::now();
            let _ = sched.dump().to_string();
            let _ = sched.metrics().to_string();
            assert!(t.elapsed() < Duration::from_secs(5));
        }
        stopper.join().unwrap();
        for h in hs {
            finish(h);
        }
        let t = Instant::now();
        let d = sched.dump();
        assert!(d.fibers().is_empty());
        assert_eq!(sched.metrics().live_tasks(), 0);
        assert!(t.elapsed() < Duration::from_secs(1));
        // Drop the Arc (its last reference) from inside another scheduler's fiber.
        let other = started(1);
        finish(other.spawn(move || drop(sched)));
        other.stop();
    });
}

/// A dump of a scheduler with many parked fibers (min stack), taken while a stream of fibers
/// ends: every parked fiber is listed once, and the dump is bounded in time.
#[test]
fn observe_dump_of_many_parked_fibers_while_others_end() {
    common::with_deadline(|| {
        let n: usize = std::env::var("FIBRA_ATTACK_PARKED")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(200_000);
        let sched = Scheduler::builder()
            .threads(2)
            .stack_size(MIN_STACK_SIZE)
            .build()
            .unwrap();
        sched.start();
        let unparkers = Arc::new(Mutex::new(Vec::with_capacity(n)));
        let mut handles = Vec::with_capacity(n);
        for _ in 0..n {
            let u = unparkers.clone();
            handles.push(sched.spawn(move || fibra::park(|x| u.lock().unwrap().push(x))));
        }
        let deadline = Instant::now() + Duration::from_secs(120);
        while unparkers.lock().unwrap().len() < n {
            assert!(Instant::now() < deadline, "fibers did not all park");
            thread::sleep(Duration::from_millis(10));
        }
        let churner = {
            let hs: Vec<_> = (0..5000).map(|i| sched.spawn(move || i)).collect();
            hs
        };
        let t = Instant::now();
        let d = sched.dump();
        let took = t.elapsed();
        eprintln!("dump of {} fibers took {took:?}", d.fibers().len());
        let ids: HashSet<_> = d.fibers().iter().map(|e| e.id()).collect();
        assert_eq!(ids.len(), d.fibers().len(), "a fiber listed twice");
        let parked = d
            .fibers()
            .iter()
            .filter(|e| matches!(e.status(), fibra::dump::Status::Parked(_)))
            .count();
        assert!(parked >= n, "{parked} parked listed of {n}");
        assert!(took < Duration::from_secs(30), "{took:?}");
        for h in churner {
            finish(h);
        }
        let t = Instant::now();
        let _ = sched.metrics();
        assert!(t.elapsed() < Duration::from_secs(1));
        for u in unparkers.lock().unwrap().drain(..) {
            u.unpark();
        }
        for h in handles {
            finish(h);
        }
        sched.stop();
    });
}

/// Watchdog in a child: a named fiber hogging a use_caller worker 0 driven by block_on is
/// reported once, by name; a hog in an unnamed continuation-free fiber is reported with an
/// id; a stopped scheduler's watchdog says nothing more.
#[test]
fn observe_watchdog_hog_on_use_caller_worker_and_after_stop() {
    let (status, err) = common::run_child(CHILD, "child_watchdog_variants");
    assert!(status.success(), "child failed: {status:?}\n{err}");
    let reports: Vec<&str> = err.lines().filter(|l| l.contains("watchdog")).collect();
    assert_eq!(reports.len(), 2, "{err}");
    assert!(reports[0].contains("'caller-hog'"), "{err}");
    assert!(!err.contains("after-stop"), "{err}");
}

#[test]
#[ignore = "child of observe_watchdog_hog_on_use_caller_worker_and_after_stop"]
fn child_watchdog_variants() {
    if !common::is_child(CHILD, "child_watchdog_variants") {
        return;
    }
    let s = Scheduler::builder()
        .threads(2)
        .use_caller(true)
        .watchdog(Duration::from_millis(40))
        .build()
        .unwrap();
    // block_on's fiber can go anywhere: submit pinned to worker 0 and block_on a join.
    let h = s
        .task()
        .name("caller-hog")
        .submit(|| common::block_thread(Duration::from_millis(400)), Some(0))
        .unwrap();
    s.block_on(move || h.join().unwrap());
    // An unnamed hog on worker 1.
    let h = s
        .submit(|| common::block_thread(Duration::from_millis(400)), Some(1))
        .unwrap();
    s.block_on(move || h.join().unwrap());
    s.stop();
    // After stop nothing runs; a submit is refused.
    assert!(s
        .task()
        .name("after-stop")
        .submit(|| common::block_thread(Duration::from_millis(300)), None)
        .is_err());
    thread::sleep(Duration::from_millis(200));
}

// ---------------------------------------------------------------------------------------
// 5. stacks and tasks
// ---------------------------------------------------------------------------------------

/// Recursion using most of a task's stack works at MIN_STACK_SIZE, 1 MiB and 64 MiB: the
/// requested size is usable (minus a small margin).
#[test]
fn stacks_recursion_close_to_the_requested_size() {
    common::with_deadline(|| {
        #[inline(never)]
        fn recurse(depth: usize) -> u64 {
            let mut frame = [0u8; 1024];
            std::hint::black_box(&mut frame);
            if depth == 0 {
                return frame[0] as u64;
            }
            recurse(depth - 1) + std::hint::black_box(frame[depth % 1024]) as u64
        }
        let sched = started(2);
        for (size, margin_kib) in [(MIN_STACK_SIZE, 40), (1 << 20, 64), (64 << 20, 64)] {
            // Frames are a little over 1 KiB in debug builds: use ~ (size - margin) / 1.3 KiB.
            let depth = (size / 1024 - margin_kib) * 10 / 14;
            let h = sched
                .task()
                .name(format!("deep-{size}"))
                .stack_size(size)
                .submit(move || recurse(depth), None)
                .unwrap();
            assert_eq!(finish(h), 0, "size {size}");
        }
        sched.stop();
    });
}

/// Stack size and pin misuse: each refusal hands the closure back, the scheduler goes on.
#[test]
fn stacks_builder_misuse_is_refused_with_the_closure() {
    common::with_deadline(|| {
        let sched = started(2);
        let drops = Arc::new(AtomicUsize::new(0));
        for (size, pin) in [
            (MIN_STACK_SIZE - 1, None),
            (0, None),
            (usize::MAX, None),
            ((1 << 30) + 1, None),
            (MIN_STACK_SIZE, Some(2)),
            (MIN_STACK_SIZE, Some(usize::MAX)),
        ] {
            let c = common::Counted(drops.clone());
            let r = sched
                .task()
                .name("x".repeat(10_000))
                .stack_size(size)
                .submit(move || drop(c), pin);
            match r {
                Err(e) => {
                    let f = e.into_inner();
                    f();
                }
                Ok(_) => panic!("size {size} pin {pin:?} accepted"),
            }
        }
        assert_eq!(drops.load(Ordering::SeqCst), 6);
        // Names with odd content work.
        for name in ["", "a\0b", "ünï\ncode", &"y".repeat(100_000)] {
            let n2 = name.to_string();
            let h = sched
                .task()
                .name(name)
                .submit(
                    move || fibra::Fiber::current().unwrap().name().map(String::from),
                    Some(1),
                )
                .unwrap();
            assert_eq!(finish(h).as_deref(), Some(n2.as_str()));
        }
        // The largest accepted stack size runs.
        let h = sched.task().stack_size(1 << 30).submit(|| 1, None).unwrap();
        let r = h.join();
        assert!(
            r.as_ref().map_or_else(|e| e.is_no_stack(), |&v| v == 1),
            "{r:?}"
        );
        sched.stop();
    });
}

/// A stack overflow in a named fiber on the minimum stack size: the report names the fiber
/// and the process aborts (SIGABRT), even with so small a stack.
#[test]
fn stacks_overflow_in_a_min_stack_named_fiber() {
    use std::os::unix::process::ExitStatusExt;
    let (status, err) = common::run_child(CHILD, "child_min_overflow");
    assert_eq!(status.signal(), Some(libc::SIGABRT), "{status:?}\n{err}");
    assert!(err.contains("tiny-overflow"), "{err}");
    assert!(err.contains("overflow"), "{err}");
}

#[test]
#[ignore = "child of stacks_overflow_in_a_min_stack_named_fiber"]
fn child_min_overflow() {
    if !common::is_child(CHILD, "child_min_overflow") {
        return;
    }
    #[inline(never)]
    #[allow(unconditional_recursion)]
    fn recurse(d: u64) -> u64 {
        let mut frame = [0u8; 512];
        std::hint::black_box(&mut frame);
        recurse(d + 1) + frame[d as usize % 512] as u64
    }
    let sched = started(2);
    let h = sched
        .task()
        .name("tiny-overflow")
        .stack_size(MIN_STACK_SIZE)
        .submit(|| recurse(0), Some(1))
        .unwrap();
    let _ = h.join();
    eprintln!("UNREACHABLE: the overflow did not abort");
}

/// JoinSet with 5 000 tasks, cancel_all mid-way: every task comes back exactly once, value
/// or cancelled; dropping a set of 5 000 parked tasks cancels them all promptly.
#[test]
fn tasks_join_set_thousands_with_cancel_mid_way() {
    common::with_deadline(|| {
        const N: usize = 5000;
        let sched = started(2);
        let (values, cancelled, ids) = sched.block_on(|| {
            let mut set = JoinSet::new();
            for i in 0..N {
                set.spawn(move || {
                    if i % 2 == 0 {
                        fibra::sleep(Duration::from_secs(3600));
                    }
                    i
                });
            }
            let mut ids = HashSet::new();
            let (mut values, mut cancelled) = (0, 0);
            // Take some results, then cancel the rest.
            for _ in 0..N / 4 {
                let (id, r) = set.join_next_with_id().unwrap();
                assert!(ids.insert(id));
                assert!(r.unwrap() % 2 == 1);
                values += 1;
            }
            set.cancel_all();
            while let Some((id, r)) = set.join_next_with_id() {
                assert!(ids.insert(id), "returned twice");
                match r {
                    Ok(_) => values += 1,
                    Err(e) => {
                        assert!(e.is_cancelled());
                        cancelled += 1
                    }
                }
            }
            assert!(set.is_empty());
            (values, cancelled, ids.len())
        });
        assert_eq!(ids, N);
        assert_eq!(values + cancelled, N);
        assert!(cancelled >= N / 2, "{cancelled}");
        // Dropping a full set of sleepers.
        let t = Instant::now();
        let drops = Arc::new(AtomicUsize::new(0));
        let d2 = drops.clone();
        sched.block_on(move || {
            let mut set = JoinSet::new();
            for _ in 0..N {
                let c = common::Counted(d2.clone());
                set.spawn(move || {
                    let _c = c;
                    fibra::sleep(Duration::from_secs(3600));
                });
            }
            fibra::sleep(Duration::from_millis(10));
            drop(set);
        });
        wait_until("every dropped set task unwinds", || {
            drops.load(Ordering::SeqCst) == N
        });
        assert!(t.elapsed() < LIMIT);
        wait_until("nothing live", || sched.metrics().live_tasks() == 0);
        sched.stop();
    });
}

/// A scope with 5 000 fibers borrowing the caller's data, half cancelled mid-way through
/// their handles: the scope waits for all, the borrowed data outlives them, and it returns.
#[test]
fn tasks_scope_thousands_with_cancellation() {
    common::with_deadline(|| {
        const N: usize = 5000;
        let sched = started(2);
        let (done, cancelled) = sched.block_on(|| {
            let data: Vec<u64> = (0..N as u64).collect();
            let sum = AtomicUsize::new(0);
            let mut cancelled = 0;
            fibra::scope(|s| {
                let hs: Vec<_> = data
                    .iter()
                    .map(|x| {
                        let sum = &sum;
                        s.spawn(move || {
                            if x % 2 == 0 {
                                fibra::sleep(Duration::from_secs(3600));
                            }
                            sum.fetch_add(*x as usize, Ordering::SeqCst);
                        })
                    })
                    .collect();
                fibra::sleep(Duration::from_millis(20));
                for (i, h) in hs.iter().enumerate() {
                    if i % 2 == 0 {
                        h.cancel();
                    }
                }
                for h in hs {
                    if let Err(e) = h.join() {
                        assert!(e.is_cancelled());
                        cancelled += 1;
                    }
                }
            });
            (sum.load(Ordering::SeqCst), cancelled)
        });
        let odd: usize = (0..N).filter(|x| x % 2 == 1).sum();
        assert_eq!(done, odd);
        assert_eq!(cancelled, N / 2);
        sched.stop();
    });
}

fn open_fds() -> usize {
    std::fs::read_dir("/proc/self/fd").unwrap().count()
}

/// 100 connections served as chains of continuations while their clients keep sending;
/// `stop_timeout(50 ms)` in the middle: it returns within the bound, nothing stays live,
/// every server socket is closed (each client sees EOF or a reset), registrations go back.
#[test]
fn net_stop_timeout_amid_continuation_chains_leaks_nothing() {
    // Descriptors and reactor records are the process's: counted in a process of its own,
    // where no other test opens any.
    let (status, err) = common::run_child(
        CHILD,
        "child_stop_timeout_amid_continuation_chains_leaks_nothing",
    );
    assert!(
        status.success() && err.contains("CHILD OK"),
        "{status}\n{err}"
    );
}

#[test]
#[ignore = "child of net_stop_timeout_amid_continuation_chains_leaks_nothing"]
fn child_stop_timeout_amid_continuation_chains_leaks_nothing() {
    if !common::is_child(
        CHILD,
        "child_stop_timeout_amid_continuation_chains_leaks_nothing",
    ) {
        return;
    }
    common::with_deadline(|| {
        const N: usize = 100;
        fn serve(s: TcpStream, served: Arc<AtomicUsize>) {
            let mut buf = [0u8; 256];
            loop {
                match s.try_read(&mut buf) {
                    Ok(0) => return,
                    Ok(n) => {
                        served.fetch_add(n, Ordering::Relaxed);
                        if (&s).write_all(&buf[..n]).is_err() {
                            return;
                        }
                    }
                    Err(e) if e.kind() == ErrorKind::WouldBlock => {
                        let sv = served.clone();
                        if let Err(e) = s.spawn_when_readable(move |s| serve(s, sv)) {
                            drop(e);
                        }
                        return;
                    }
                    Err(_) => return,
                }
            }
        }
        // The process-wide parts created at the first use (the reactor's epoll and eventfd,
        // the pool) exist before the count.
        let regs_before = {
            let s = started(1);
            finish(s.spawn(|| {
                let (a, _b) = UnixStream::pair().unwrap();
                a.set_read_timeout(Some(Duration::from_millis(1))).unwrap();
                let _ = (&a).read(&mut [0u8; 1]);
                fibra::unblock(|| ());
            }));
            let r = s.metrics().io_registrations();
            s.stop();
            r
        };
        let fds_before = open_fds();
        let sched = started(2);
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let served = Arc::new(AtomicUsize::new(0));
        let sv = served.clone();
        let acceptor = sched.spawn(move || {
            for _ in 0..N {
                let (s, _) = listener.accept().unwrap();
                let sv = sv.clone();
                fibra::spawn(move || serve(s, sv));
            }
        });
        let stop = Arc::new(AtomicBool::new(false));
        let clients: Vec<_> = (0..4)
            .map(|t| {
                let stop = stop.clone();
                thread::spawn(move || {
                    let mut conns: Vec<std::net::TcpStream> = (0..N / 4)
                        .map(|_| std::net::TcpStream::connect(addr).unwrap())
                        .collect();
                    for c in &conns {
                        c.set_read_timeout(Some(LIMIT)).unwrap();
                    }
                    let mut i = 0usize;
                    while !stop.load(Ordering::SeqCst) && i < 100_000 {
                        let c = &mut conns[i % (N / 4)];
                        if c.write_all(&[t as u8; 16]).is_err() {
                            break;
                        }
                        let mut b = [0u8; 16];
                        if c.read_exact(&mut b).is_err() {
                            break;
                        }
                        i += 1;
                    }
                    // Every server side must now close: EOF or reset, never a timeout.
                    let mut ends = 0;
                    for c in &mut conns {
                        let mut b = [0u8; 64];
                        loop {
                            match c.read(&mut b) {
                                Ok(0) => break,
                                Ok(_) => continue,
                                Err(e) => {
                                    assert_ne!(e.kind(), ErrorKind::WouldBlock, "never closed");
                                    assert_ne!(e.kind(), ErrorKind::TimedOut, "never closed");
                                    break;
                                }
                            }
                        }
                        ends += 1;
                    }
                    ends
                })
            })
            .collect();
        finish(acceptor);
        wait_until("traffic", || served.load(Ordering::Relaxed) > 10_000);
        let t = Instant::now();
        let cancelled = sched.stop_timeout(Duration::from_millis(50));
        let took = t.elapsed();
        stop.store(true, Ordering::SeqCst);
        eprintln!("stop_timeout cancelled {cancelled} in {took:?}");
        assert!(took < Duration::from_secs(5), "{took:?}");
        assert_eq!(sched.metrics().live_tasks(), 0);
        assert_eq!(sched.metrics().continuations(), 0);
        let ends: usize = clients.into_iter().map(|c| c.join().unwrap()).sum();
        assert_eq!(ends, N);
        assert!(
            common::eventually(Duration::from_secs(5), || open_fds() <= fds_before + 2),
            "fds leaked: {} -> {}",
            fds_before,
            open_fds()
        );
        let regs_after = sched.metrics().io_registrations();
        assert!(
            regs_after <= regs_before + 1,
            "{regs_before} -> {regs_after}"
        );
    });
    eprintln!("CHILD OK");
}

/// A UDP datagram larger than the maximum is EMSGSIZE at once, not a wait; a send to port 0
/// is an error; from a fiber and a thread.
#[test]
fn net_udp_oversized_and_bad_destinations() {
    common::with_deadline(|| {
        let sched = started(1);
        let body = || {
            let a = UdpSocket::bind("127.0.0.1:0").unwrap();
            let b = UdpSocket::bind("127.0.0.1:0").unwrap();
            let big = vec![0u8; 70_000];
            let e = a.send_to(&big, b.local_addr().unwrap()).unwrap_err();
            assert_eq!(e.raw_os_error(), Some(libc::EMSGSIZE), "{e:?}");
            assert!(a.send_to(b"x", "127.0.0.1:0").is_err());
            assert!(a.send(b"x").is_err()); // not connected
        };
        body();
        finish(sched.spawn(body));
        sched.stop();
    });
}

/// Executors' constructors: invalid sizes are errors (try_new), never a hang.
#[test]
fn exec_thread_pool_bad_sizes() {
    assert!(ThreadPool::try_new(0).is_err());
    assert!(ThreadPool::try_new(fibra::MAX_THREADS + 1).is_err());
    let p = ThreadPool::try_new(1).unwrap();
    assert_eq!(p.threads(), 1);
    p.shutdown();
    p.shutdown();
    assert!(p.spawn(|| 1).join().unwrap_err().is_cancelled());
}

/// Sockets that waited once and are dropped give their reactor registrations back, from
/// fibers and threads (no record leak): io_registrations returns to where it was.
#[test]
fn net_registrations_return_after_drop() {
    // Descriptors and reactor records are the process's: counted in a process of its own,
    // where no other test opens any.
    let (status, err) = common::run_child(CHILD, "child_registrations_return_after_drop");
    assert!(
        status.success() && err.contains("CHILD OK"),
        "{status}\n{err}"
    );
}

#[test]
#[ignore = "child of net_registrations_return_after_drop"]
fn child_registrations_return_after_drop() {
    if !common::is_child(CHILD, "child_registrations_return_after_drop") {
        return;
    }
    common::with_deadline(|| {
        let sched = started(2);
        let before = sched.metrics().io_registrations();
        let hs: Vec<_> = (0..200)
            .map(|_| {
                sched.spawn(|| {
                    let (a, b) = UnixStream::pair().unwrap();
                    a.set_read_timeout(Some(Duration::from_millis(1))).unwrap();
                    let _ = (&a).read(&mut [0u8; 1]);
                    let c = a.try_clone().unwrap();
                    c.set_read_timeout(Some(Duration::from_millis(1))).unwrap();
                    let _ = (&c).read(&mut [0u8; 1]);
                    drop((a, b, c));
                })
            })
            .collect();
        for h in hs {
            finish(h);
        }
        for _ in 0..50 {
            let (a, _b) = UnixStream::pair().unwrap();
            a.set_read_timeout(Some(Duration::from_millis(1))).unwrap();
            let _ = (&a).read(&mut [0u8; 1]);
        }
        let after = sched.metrics().io_registrations();
        assert!(after <= before, "{before} -> {after}");
        sched.stop();
    });
    eprintln!("CHILD OK");
}

/// A worker asleep in epoll (the poller: its only fiber waits on a socket, no timers) must
/// answer a dump from a thread, listing the fiber as waiting on its fd, repeatedly.
#[test]
fn observe_dump_wakes_a_worker_blocked_in_epoll() {
    common::with_deadline(|| {
        let sched = started(1);
        let (a, mut b) = std::os::unix::net::UnixStream::pair().unwrap();
        let a = UnixStream::from(a);
        let h = sched.spawn(move || {
            let mut buf = [0u8; 1];
            (&a).read_exact(&mut buf).map(|_| buf[0])
        });
        wait_until("the fiber waits on I/O", || parked_on(&sched, h.id(), io));
        for i in 0..20 {
            thread::sleep(Duration::from_millis(5));
            let d = sched.dump();
            assert_eq!(d.fibers().len(), 1, "round {i}: {d}");
            assert!(d.workers()[0].pause().is_some(), "round {i}: {d}");
            let s = d.to_string();
            assert!(s.contains("readable"), "{s}");
        }
        b.write_all(&[42]).unwrap();
        assert_eq!(finish(h).unwrap(), 42);
        sched.stop();
    });
}

/// `cancel` racing with the start of the task, from another thread, 2 000 times, some before
/// `start` (scheduler not started yet): each join is the value or cancelled, never a hang;
/// a `catching` of a cancelled one runs in a fiber.
#[test]
fn tasks_cancel_racing_the_start() {
    common::with_deadline(|| {
        let sched = Arc::new(Scheduler::builder().threads(2).build().unwrap());
        let early: Vec<_> = (0..100).map(|i| sched.spawn(move || i)).collect();
        for h in &early {
            h.cancel();
        }
        sched.start();
        let in_fiber = Arc::new(AtomicUsize::new(0));
        for h in early {
            let f = in_fiber.clone();
            h.catching(move |_| {
                if fibra::current_worker().is_some() {
                    f.fetch_add(1, Ordering::SeqCst);
                }
            });
            assert!(h.join().unwrap_err().is_cancelled());
        }
        let (mut ok, mut cancelled) = (0, 0);
        for i in 0..2000u32 {
            let h = Arc::new(sched.spawn(move || {
                if i % 3 == 0 {
                    fibra::Fiber::yield_now();
                }
                i
            }));
            let h2 = h.clone();
            let t = thread::spawn(move || h2.cancel());
            t.join().unwrap();
            assert!(h.wait_timeout(LIMIT), "task {i} never finished");
            let h = Arc::try_unwrap(h).ok().unwrap();
            match h.join() {
                Ok(v) => {
                    assert_eq!(v, i);
                    ok += 1
                }
                Err(e) => {
                    assert!(e.is_cancelled());
                    cancelled += 1
                }
            }
        }
        eprintln!(
            "ok {ok} cancelled {cancelled}; early catching in fiber: {}",
            in_fiber.load(Ordering::SeqCst)
        );
        sched.stop();
    });
}
