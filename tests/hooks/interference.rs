//! Hooked calls in a fiber that something else interferes with: the fd taken over by
//! `fibra::net` and given back, polled while `fibra::net` waits on it, `dup2`ed over, closed
//! and its number reused, toggled non-blocking by a thread, its pipe's writer closed, used
//! from two workers at once; the fiber cancelled in a sleep or while a `Drop` makes hooked
//! calls, its scheduler stopped with a timeout. Also `poll` with odd fd lists and counts,
//! child processes' pipes read in fibers, and ten thousand fibers of hooked I/O on one
//! worker.
#![cfg(feature = "hook")]

use std::io::{ErrorKind, Read, Write};
use std::os::fd::{AsRawFd, IntoRawFd};
use std::os::unix::net::UnixStream;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::common::{child_ok, finish, wait_until, with_deadline};
use fibra::Scheduler;

fn sched(threads: usize) -> Arc<Scheduler> {
    let s = Arc::new(Scheduler::builder().threads(threads).build().unwrap());
    s.start();
    s
}

fn errno() -> i32 {
    std::io::Error::last_os_error().raw_os_error().unwrap()
}

/// A std socket that waited in a hooked call (so its hook slot holds a reactor record), then
/// taken over by fibra::net (which waits, sharing that record), then given back to std: a
/// read that must wait must still be woken by data.
#[test]
fn std_to_fibra_net_and_back_then_read_waits() {
    with_deadline(|| {
        let s = sched(1);
        let (a, b) = UnixStream::pair().unwrap();
        let b = Arc::new(b);
        let b2 = b.clone();
        let writer = s
            .submit(
                move || {
                    for byte in [b'1', b'2', b'3'] {
                        fibra::sleep(Duration::from_millis(50));
                        (&*b2).write_all(&[byte]).unwrap();
                    }
                },
                None,
            )
            .unwrap();
        let reader = s
            .submit(
                move || {
                    let mut one = [0u8; 1];
                    // 1: a hooked std read that waits (registers the hook record).
                    let mut a = a;
                    a.read_exact(&mut one).unwrap();
                    let mut got = vec![one[0]];
                    // 2: fibra::net waits on the same fd.
                    let mut f = fibra::net::unix::UnixStream::from(a);
                    f.read_exact(&mut one).unwrap();
                    got.push(one[0]);
                    // 3: back to std; this read must wait for the third byte.
                    let mut a: UnixStream = f.into();
                    a.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
                    let r = a.read(&mut one);
                    (got, r.map(|n| one[..n].to_vec()).map_err(|e| e.kind()))
                },
                None,
            )
            .unwrap();
        finish(writer);
        let (got, last) = finish(reader);
        assert_eq!(got, b"12");
        assert_eq!(last, Ok(b"3".to_vec()));
        drop(b);
        s.stop();
    });
}

/// dup2 over an fd that a fiber waits on (another worker): the waiter returns.
#[test]
fn dup2_over_a_waited_fd_wakes_the_waiter() {
    with_deadline(|| {
        let s = sched(2);
        let (a, _b) = UnixStream::pair().unwrap();
        let (c, _d) = UnixStream::pair().unwrap();
        let fd = a.into_raw_fd();
        let cfd = c.as_raw_fd();
        let waiter = s
            .submit(
                move || {
                    let mut buf = [0u8; 4];
                    // SAFETY: a live buffer.
                    let r = unsafe { libc::read(fd, buf.as_mut_ptr().cast(), 4) };
                    (r, if r < 0 { errno() } else { 0 })
                },
                Some(0),
            )
            .unwrap();
        std::thread::sleep(Duration::from_millis(50));
        let d = s
            // SAFETY: duplicates a live fd over another fd the test owns.
            .submit(move || unsafe { libc::dup2(cfd, fd) }, Some(1))
            .unwrap();
        assert_eq!(finish(d), fd);
        let (r, e) = finish(waiter);
        assert_eq!((r, e), (-1, libc::EBADF));
        // SAFETY: closes an fd the test owns and no longer uses through any handle.
        unsafe { libc::close(fd) };
        drop(c);
        s.stop();
    });
}

/// poll in a fiber on the fd of a fibra::net socket (which has its own registration).
#[test]
fn poll_on_a_fibra_net_socket_fd() {
    with_deadline(|| {
        let s = sched(1);
        let (a, b) = fibra::net::unix::UnixStream::pair().unwrap();
        let r = s.block_on(move || {
            let w = fibra::spawn(move || {
                let mut b = b;
                fibra::sleep(Duration::from_millis(30));
                b.write_all(b"x").unwrap();
                fibra::sleep(Duration::from_millis(30));
                b.write_all(b"y").unwrap();
                b
            });
            let mut a = a;
            let mut one = [0u8; 1];
            a.read_exact(&mut one).unwrap(); // fibra::net registers the fd
            let mut p = libc::pollfd {
                fd: a.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            };
            // SAFETY: a live array of pollfds of the length passed.
            let n = unsafe { libc::poll(&mut p, 1, 10_000) };
            let _b = w.join().unwrap();
            (n, p.revents & libc::POLLIN != 0)
        });
        assert_eq!(r, (1, true));
        s.stop();
    });
}

/// poll with a closed fd number, a negative fd and a duplicate: POLLNVAL at once.
#[test]
fn poll_with_nval_negative_and_duplicate_fds_returns_at_once() {
    with_deadline(|| {
        let s = sched(1);
        let r = s.block_on(|| {
            let (a, _b) = UnixStream::pair().unwrap();
            let closed = {
                let (x, _y) = UnixStream::pair().unwrap();
                x.as_raw_fd()
            };
            let mut p = [
                libc::pollfd {
                    fd: a.as_raw_fd(),
                    events: libc::POLLIN,
                    revents: 0,
                },
                libc::pollfd {
                    fd: -5,
                    events: libc::POLLIN,
                    revents: 0,
                },
                libc::pollfd {
                    fd: a.as_raw_fd(),
                    events: libc::POLLIN,
                    revents: 0,
                },
                libc::pollfd {
                    fd: closed + 1000,
                    events: libc::POLLIN,
                    revents: 0,
                },
            ];
            let t = Instant::now();
            // SAFETY: a live array of pollfds of the length passed.
            let n = unsafe { libc::poll(p.as_mut_ptr(), 4, 5_000) };
            (n, p[3].revents, p[1].revents, t.elapsed())
        });
        assert_eq!(r.0, 1);
        assert_eq!(r.1, libc::POLLNVAL);
        assert_eq!(r.2, 0);
        assert!(r.3 < Duration::from_secs(2));
        s.stop();
    });
}

/// poll with no fds and a timeout sleeps that long; negative-only fds likewise.
#[test]
fn poll_with_only_negative_fds_sleeps_the_timeout() {
    with_deadline(|| {
        let s = sched(1);
        let e = s.block_on(|| {
            let mut p = [libc::pollfd {
                fd: -1,
                events: libc::POLLIN,
                revents: 0,
            }];
            let t = Instant::now();
            // SAFETY: a live array of pollfds of the length passed.
            let n = unsafe { libc::poll(p.as_mut_ptr(), 1, 100) };
            // SAFETY: no fds: a null array with a zero count is valid.
            let n0 = unsafe { libc::poll(std::ptr::null_mut(), 0, 50) };
            (n, n0, t.elapsed())
        });
        assert_eq!((e.0, e.1), (0, 0));
        assert!(
            e.2 >= Duration::from_millis(150) && e.2 < Duration::from_secs(5),
            "{:?}",
            e.2
        );
        s.stop();
    });
}

/// UDP recv_from with a read timeout, then a datagram.
#[test]
fn udp_recv_from_with_timeout_then_data() {
    with_deadline(|| {
        let s = sched(1);
        let r = s.block_on(|| {
            let sock = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
            let addr = sock.local_addr().unwrap();
            sock.set_read_timeout(Some(Duration::from_millis(100)))
                .unwrap();
            let mut buf = [0u8; 16];
            let t = Instant::now();
            let e = sock.recv_from(&mut buf).unwrap_err().kind();
            let waited = t.elapsed();
            let w = fibra::spawn(move || {
                fibra::sleep(Duration::from_millis(20));
                let o = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
                o.send_to(b"hello", addr).unwrap();
            });
            sock.set_read_timeout(None).unwrap();
            let (n, _) = sock.recv_from(&mut buf).unwrap();
            w.join().unwrap();
            (e, waited, buf[..n].to_vec())
        });
        assert_eq!(r.0, ErrorKind::WouldBlock);
        assert!(r.1 >= Duration::from_millis(90), "{:?}", r.1);
        assert_eq!(r.2, b"hello");
        s.stop();
    });
}

/// std::process::Command with piped stdout, read in fibers on one worker.
#[test]
fn command_output_in_fibers() {
    with_deadline(|| {
        let s = sched(1);
        let hs: Vec<_> = (0..8)
            .map(|i| {
                s.submit(
                    move || {
                        let out = std::process::Command::new("sh")
                            .arg("-c")
                            .arg(format!("sleep 0.1; echo out{i}; echo err{i} >&2"))
                            .output()
                            .unwrap();
                        let mut child = std::process::Command::new("sh")
                            .arg("-c")
                            .arg(format!("sleep 0.05; echo spawned{i}"))
                            .stdout(std::process::Stdio::piped())
                            .spawn()
                            .unwrap();
                        let mut text = String::new();
                        child
                            .stdout
                            .take()
                            .unwrap()
                            .read_to_string(&mut text)
                            .unwrap();
                        child.wait().unwrap();
                        (
                            String::from_utf8(out.stdout).unwrap(),
                            String::from_utf8(out.stderr).unwrap(),
                            text,
                        )
                    },
                    None,
                )
                .unwrap()
            })
            .collect();
        for (i, h) in hs.into_iter().enumerate() {
            let (o, e, t) = finish(h);
            assert_eq!(o, format!("out{i}\n"));
            assert_eq!(e, format!("err{i}\n"));
            assert_eq!(t, format!("spawned{i}\n"));
        }
        s.stop();
    });
}

/// A pipe whose writer closes: the reader on another worker sees EOF.
#[test]
fn pipe_writer_close_gives_eof_across_workers() {
    with_deadline(|| {
        let s = sched(2);
        for _ in 0..50 {
            let mut fds = [0; 2];
            // SAFETY: a live two-int array for the new fds.
            assert_eq!(unsafe { libc::pipe(fds.as_mut_ptr()) }, 0);
            let (r, w) = (fds[0], fds[1]);
            let reader = s
                .submit(
                    move || {
                        let mut got = Vec::new();
                        let mut buf = [0u8; 64];
                        loop {
                            // SAFETY: a live buffer of at least the length passed; the fd is the test's.
                            let n = unsafe { libc::read(r, buf.as_mut_ptr().cast(), 64) };
                            assert!(n >= 0, "read: {}", errno());
                            if n == 0 {
                                break;
                            }
                            got.extend_from_slice(&buf[..n as usize]);
                        }
                        // SAFETY: closes an fd the test owns and no longer uses through any handle.
                        unsafe { libc::close(r) };
                        got
                    },
                    Some(0),
                )
                .unwrap();
            let writer = s
                .submit(
                    move || {
                        fibra::sleep(Duration::from_millis(1));
                        // SAFETY: a live buffer of the length passed; the fd is the test's.
                        assert_eq!(unsafe { libc::write(w, b"abc".as_ptr().cast(), 3) }, 3);
                        // SAFETY: closes an fd the test owns and no longer uses through any handle.
                        unsafe { libc::close(w) };
                    },
                    Some(1),
                )
                .unwrap();
            finish(writer);
            assert_eq!(finish(reader), b"abc");
        }
        s.stop();
    });
}

/// Two fibers on two workers use one socket at once, one reading and one writing, with a
/// plain-thread echo on the other end.
#[test]
fn full_duplex_one_socket_two_workers() {
    with_deadline(|| {
        const LEN: usize = 8 << 20;
        let s = sched(2);
        let (a, b) = UnixStream::pair().unwrap();
        let echo = std::thread::spawn(move || {
            let mut b = b;
            let mut buf = vec![0u8; 65536];
            let mut total = 0;
            while total < LEN {
                let n = b.read(&mut buf).unwrap();
                assert!(n > 0);
                b.write_all(&buf[..n]).unwrap();
                total += n;
            }
        });
        let a = Arc::new(a);
        let a2 = a.clone();
        let w = s
            .submit(
                move || {
                    let data: Vec<u8> = (0..LEN).map(|i| (i % 253) as u8).collect();
                    for c in data.chunks(7919) {
                        (&*a2).write_all(c).unwrap();
                    }
                },
                Some(0),
            )
            .unwrap();
        let r = s
            .submit(
                move || {
                    let mut got = vec![0u8; LEN];
                    (&*a).read_exact(&mut got).unwrap();
                    got.iter().enumerate().all(|(i, &b)| b == (i % 253) as u8)
                },
                Some(1),
            )
            .unwrap();
        finish(w);
        assert!(finish(r));
        echo.join().unwrap();
        s.stop();
    });
}

/// Closing an fd (and reusing its number at once) while a fiber on another worker starts
/// waiting on it: the waiter must return, not wait on the new fd.
#[test]
fn close_and_reuse_race_with_a_starting_waiter() {
    with_deadline(|| {
        let s = sched(2);
        let mut keep = Vec::new();
        for i in 0..100 {
            let (a, _b) = UnixStream::pair().unwrap();
            let fd = a.into_raw_fd();
            let parks = s.metrics().workers()[0].parks();
            let waiter = s
                .submit(
                    move || {
                        let mut buf = [0u8; 4];
                        // SAFETY: a live buffer of at least the length passed; the fd is the test's.
                        let r = unsafe { libc::read(fd, buf.as_mut_ptr().cast(), 4) };
                        (r, if r < 0 { errno() } else { 0 })
                    },
                    Some(0),
                )
                .unwrap();
            // The waiter must have parked in its read before the close (a close before the
            // read starts would be the user's own use-after-close race): on a loaded machine
            // the closer's sleep alone did not make sure of it.
            wait_until("the waiter to park in its read", || {
                s.metrics().workers()[0].parks() > parks
            });
            let closer = s
                .submit(
                    move || {
                        // Let the waiter park first (a close before the read starts would
                        // be the user's own use-after-close race).
                        fibra::sleep(Duration::from_millis(5 + (i % 3) as u64));
                        // SAFETY: closes an fd the test owns and no longer uses through any handle.
                        unsafe { libc::close(fd) };
                        // Reuse the number at once with an idle socket.
                        UnixStream::pair().unwrap()
                    },
                    Some(1),
                )
                .unwrap();
            keep.push(finish(closer));
            assert!(
                waiter.wait_timeout(Duration::from_secs(3)),
                "iteration {i}: the waiter of a closed fd still waits"
            );
            let (r, _) = waiter.join().unwrap();
            assert_eq!(r, -1);
            if keep.len() > 50 {
                keep.clear();
            }
        }
        s.stop();
    });
}

/// After a cancellation caught in a hooked sleep, a loop of hooked sleeps must end soon
/// (the docs: a cancelled fiber's sleep just ends).
#[test]
fn cancelled_fiber_in_a_sleep_loop_ends() {
    with_deadline(|| {
        let s = sched(1);
        let h = s
            .submit(
                || {
                    for _ in 0..300 {
                        std::thread::sleep(Duration::from_millis(100));
                    }
                },
                None,
            )
            .unwrap();
        std::thread::sleep(Duration::from_millis(50));
        h.cancel();
        assert!(
            h.wait_timeout(Duration::from_secs(5)),
            "a cancelled fiber in a loop of std sleeps did not end within 5 s"
        );
        s.stop();
    });
}

/// std::thread::sleep(Duration::MAX) in a fiber, cancelled: must end.
#[test]
fn cancelled_fiber_in_an_endless_std_sleep_ends() {
    with_deadline(|| {
        let s = sched(1);
        let h = s
            .submit(|| std::thread::sleep(Duration::MAX), None)
            .unwrap();
        std::thread::sleep(Duration::from_millis(50));
        h.cancel();
        assert!(
            h.wait_timeout(Duration::from_secs(5)),
            "a cancelled fiber in std::thread::sleep(Duration::MAX) did not end within 5 s"
        );
        s.stop();
    });
}

/// stop_timeout with a fiber in a hooked sleep loop.
#[test]
fn stop_timeout_with_a_hooked_sleep_loop() {
    with_deadline(|| {
        let s = Scheduler::builder().threads(1).build().unwrap();
        s.start();
        let _h = s
            .submit(
                || loop {
                    std::thread::sleep(Duration::from_millis(20))
                },
                None,
            )
            .unwrap();
        std::thread::sleep(Duration::from_millis(50));
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            s.stop_timeout(Duration::from_millis(50));
            let _ = tx.send(());
        });
        assert!(
            rx.recv_timeout(Duration::from_secs(10)).is_ok(),
            "stop_timeout did not return within 10 s"
        );
    });
}

/// A Drop that makes hooked calls while the fiber unwinds from a cancellation.
#[test]
fn hooked_calls_in_drop_during_cancel_unwind() {
    child_ok(|| {
        struct Noisy(UnixStream, std::sync::mpsc::Sender<(i32, usize)>);
        impl Drop for Noisy {
            fn drop(&mut self) {
                std::thread::sleep(Duration::from_millis(10));
                let mut b = [0u8; 4];
                let r = (&self.0).read(&mut b);
                let _ = (&self.0).write(b"bye");
                let _ = self.1.send((
                    r.as_ref().err().and_then(|e| e.raw_os_error()).unwrap_or(0),
                    *r.as_ref().unwrap_or(&0),
                ));
            }
        }
        let s = sched(1);
        let (a, b) = UnixStream::pair().unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        let h = s
            .submit(
                move || {
                    let _n = Noisy(a, tx);
                    fibra::sleep(Duration::from_secs(60));
                },
                None,
            )
            .unwrap();
        std::thread::sleep(Duration::from_millis(50));
        h.cancel();
        let w = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(100));
            (&b).write_all(b"data").unwrap();
            b
        });
        assert!(h.wait_timeout(crate::common::LIMIT));
        assert!(h.join().unwrap_err().is_cancelled());
        let (e, n) = rx.recv_timeout(crate::common::LIMIT).unwrap();
        assert!(n == 4 || e == libc::ECANCELED, "drop read: errno {e} n {n}");
        drop(w.join().unwrap());
        s.stop();
    });
}

/// poll with an nfds far above RLIMIT_NOFILE: in a fiber the hook gives the real call's
/// answer (the kernel takes nfds as a 32-bit count, so 1 << 40 reads as 0 fds: a plain
/// timeout) instead of building a slice of 2^40 entries.
#[test]
fn poll_with_a_huge_nfds_answers_in_a_fiber_as_on_a_thread() {
    child_ok(|| {
        let call = || {
            let mut p = [libc::pollfd {
                fd: -1,
                events: libc::POLLIN,
                revents: 0,
            }];
            // SAFETY: a live one-entry array; the count is deliberately wrong.
            let n = unsafe { libc::poll(p.as_mut_ptr(), 1 << 40, 100) };
            (n, if n < 0 { errno() } else { 0 })
        };
        let plain = call();
        let s = sched(1);
        let in_fiber = s.block_on(call);
        assert_eq!(in_fiber, plain);
        s.stop();
    });
}

/// Many fibers doing hooked I/O and sleeps on one worker.
#[test]
fn ten_thousand_fibers_of_hooked_io_on_one_worker() {
    with_deadline(|| {
        let s = sched(1);
        let mut hs = Vec::new();
        for i in 0..5000 {
            let (a, b) = UnixStream::pair().unwrap();
            hs.push(
                s.submit(
                    move || {
                        std::thread::sleep(Duration::from_millis(1 + (i % 5) as u64));
                        let mut buf = [0u8; 4];
                        (&a).read_exact(&mut buf).unwrap();
                        (&a).write_all(&buf).unwrap();
                        u32::from_le_bytes(buf)
                    },
                    None,
                )
                .unwrap(),
            );
            hs.push(
                s.submit(
                    move || {
                        std::thread::sleep(Duration::from_millis(1 + (i % 3) as u64));
                        (&b).write_all(&(i as u32).to_le_bytes()).unwrap();
                        let mut buf = [0u8; 4];
                        (&b).read_exact(&mut buf).unwrap();
                        u32::from_le_bytes(buf)
                    },
                    None,
                )
                .unwrap(),
            );
        }
        for (k, h) in hs.into_iter().enumerate() {
            assert_eq!(finish(h), (k / 2) as u32);
        }
        s.stop();
    });
}

/// set_nonblocking toggled by a plain thread while a fiber waits: the fiber still gets the
/// data, and the user's view is what the thread set last.
#[test]
fn nonblocking_toggled_from_a_thread_while_a_fiber_waits() {
    with_deadline(|| {
        let s = sched(1);
        let (a, b) = UnixStream::pair().unwrap();
        let a = Arc::new(a);
        let a2 = a.clone();
        let h = s
            .submit(
                move || {
                    let mut one = [0u8; 1];
                    let r = (&*a2).read(&mut one).map_err(|e| e.kind());
                    r.map(|_| one[0])
                },
                None,
            )
            .unwrap();
        std::thread::sleep(Duration::from_millis(30));
        for _ in 0..100 {
            a.set_nonblocking(true).unwrap();
            a.set_nonblocking(false).unwrap();
        }
        (&b).write_all(b"z").unwrap();
        assert_eq!(finish(h), Ok(b'z'));
        // From the thread: blocking, so a read with a timeout times out.
        a.set_read_timeout(Some(Duration::from_millis(50))).unwrap();
        let t = Instant::now();
        assert_eq!(
            (&*a).read(&mut [0u8; 1]).unwrap_err().kind(),
            ErrorKind::WouldBlock
        );
        assert!(t.elapsed() >= Duration::from_millis(40));
        s.stop();
    });
}
