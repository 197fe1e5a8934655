//! `fibra::net` at its edges: accept storms and EMFILE, connect timeouts at the extremes,
//! half-closes, many fibers on one socket, UDP and Unix datagrams, readiness continuations
//! racing resets and shutdowns, registrations returned after drop.

use std::collections::HashSet;
use std::io::{ErrorKind, Read, Write};
use std::net::Shutdown;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use crate::common::{child_ok, finish, started, wait_until, LIMIT};
use fibra::dump::{Status, WaitOn};
use fibra::exec::Executor;
use fibra::net::unix::{UnixDatagram, UnixStream};
use fibra::net::{TcpListener, TcpStream, UdpSocket};
use fibra::{Scheduler, WhenReadableError};

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

fn open_fds() -> usize {
    std::fs::read_dir("/proc/self/fd").unwrap().count()
}

// ---------------------------------------------------------------------------------------
// 1. net
// ---------------------------------------------------------------------------------------

/// Several fibers accept on one listener (`&TcpListener` in an `Arc`): every connection is
/// accepted exactly once, none is lost, nobody hangs.
#[test]
fn net_many_acceptors_share_one_listener_each_connection_once() {
    crate::common::with_deadline(|| {
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
    child_ok(|| {
        let sched = started(1);
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let _pending: Vec<_> = (0..3)
            .map(|_| std::net::TcpStream::connect(addr).unwrap())
            .collect();
        // Register the listener's fd with the reactor while fds are available.
        let filler = crate::common::fill_descriptor_table(0);
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
    });
}

/// connect_timeout with zero (InvalidInput), Duration::MAX (connects) and a closed port
/// (refused, not timed out), from a fiber and from a plain thread.
#[test]
fn net_connect_timeout_extremes_fiber_and_thread() {
    crate::common::with_deadline(|| {
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
    crate::common::with_deadline(|| {
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
    crate::common::with_deadline(|| {
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
    crate::common::with_deadline(|| {
        let sched = started(2);
        let (listener, mut client) = crate::common::listener_and_client();
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
    crate::common::with_deadline(|| {
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
    crate::common::with_deadline(|| {
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
            // Another test of this binary may be starting a child process at this moment:
            // between its fork and its exec the child holds a copy of every fd, `b`'s
            // included, and the socket lives on until the exec closes it. So the peer is
            // gone within milliseconds, not necessarily at once.
            let give_up = Instant::now() + Duration::from_secs(5);
            let e = loop {
                match a.send(b"x") {
                    Err(e) => break e,
                    Ok(_) if Instant::now() < give_up => fibra::sleep(Duration::from_millis(1)),
                    Ok(n) => panic!("sent {n} bytes to a dropped peer for 5 s"),
                }
            };
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
    crate::common::with_deadline(|| {
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
    crate::common::with_deadline(|| {
        let sched = started(2);
        let (listener, client) = crate::common::listener_and_client();
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
        crate::common::reset(client);
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
    crate::common::with_deadline(|| {
        let (listener, mut client) = crate::common::listener_and_client();
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
    crate::common::with_deadline(|| {
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
            crate::common::reset(c);
        }
        stopper.join().unwrap();
        assert_eq!(ran.load(Ordering::SeqCst), N);
        assert_eq!(sched.metrics().live_tasks(), 0);
    });
}

/// 100 connections served as chains of continuations while their clients keep sending;
/// `stop_timeout(50 ms)` in the middle: it returns within the bound, nothing stays live,
/// every server socket is closed (each client sees EOF or a reset), registrations go back.
#[test]
fn net_stop_timeout_amid_continuation_chains_leaks_nothing() {
    // Descriptors and reactor records are the process's: counted in a process of its own,
    // where no other test opens any.
    child_ok(|| {
        crate::common::with_deadline(|| {
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
                crate::common::eventually(Duration::from_secs(5), || open_fds() <= fds_before + 2),
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
    });
}

/// A UDP datagram larger than the maximum is EMSGSIZE at once, not a wait; a send to port 0
/// is an error; from a fiber and a thread.
#[test]
fn net_udp_oversized_and_bad_destinations() {
    crate::common::with_deadline(|| {
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

/// Sockets that waited once and are dropped give their reactor registrations back, from
/// fibers and threads (no record leak): io_registrations returns to where it was.
#[test]
fn net_registrations_return_after_drop() {
    // Descriptors and reactor records are the process's: counted in a process of its own,
    // where no other test opens any.
    child_ok(|| {
        crate::common::with_deadline(|| {
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
    });
}
