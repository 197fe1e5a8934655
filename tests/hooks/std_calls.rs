//! The `hook` feature: blocking C library calls made by std (and any crate) in a fiber park
//! only that fiber.
#![cfg(feature = "hook")]

use std::io::{ErrorKind, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::os::fd::{AsRawFd, IntoRawFd};
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::common::{finish, with_deadline};
use fibra::Scheduler;

fn sched(threads: usize) -> Arc<Scheduler> {
    let s = Arc::new(Scheduler::builder().threads(threads).build().unwrap());
    s.start();
    s
}

/// The kernel's view of an fd's flags (`/proc/self/fdinfo`), which the hooks do not touch.
fn kernel_flags(fd: i32) -> i32 {
    let info = std::fs::read_to_string(format!("/proc/self/fdinfo/{fd}")).unwrap();
    let line = info.lines().find(|l| l.starts_with("flags:")).unwrap();
    i32::from_str_radix(line["flags:".len()..].trim(), 8).unwrap()
}

/// `fcntl(F_GETFL)` through the hooks: the user's view.
fn user_flags(fd: i32) -> i32 {
    // SAFETY: F_GETFL on a live fd.
    unsafe { libc::fcntl(fd, libc::F_GETFL) }
}

fn errno() -> i32 {
    std::io::Error::last_os_error().raw_os_error().unwrap()
}

#[test]
fn a_thousand_std_sleeps_on_one_worker_overlap() {
    with_deadline(|| {
        let s = sched(1);
        let start = Instant::now();
        let hs: Vec<_> = (0..1000)
            .map(|_| {
                s.submit(|| std::thread::sleep(Duration::from_millis(100)), None)
                    .unwrap()
            })
            .collect();
        hs.into_iter().for_each(finish);
        let took = start.elapsed();
        // Serially it would take 100 s; overlapped, about 100 ms.
        assert!(took >= Duration::from_millis(100), "{took:?}");
        assert!(took < Duration::from_secs(1), "1000 sleeps took {took:?}");
        s.stop();
    });
}

#[test]
fn libc_sleeps_of_every_kind_park_the_fiber() {
    with_deadline(|| {
        let s = sched(1);
        let start = Instant::now();
        let hs: Vec<_> = (0..400)
            .map(|i| {
                s.submit(
                    move || {
                        let d = Duration::from_millis(100);
                        // SAFETY: plain libc sleeps with live timespecs.
                        unsafe {
                            match i % 4 {
                                0 => {
                                    let mut now = libc::timespec {
                                        tv_sec: 0,
                                        tv_nsec: 0,
                                    };
                                    libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut now);
                                    let end =
                                        Duration::new(now.tv_sec as u64, now.tv_nsec as u32) + d;
                                    let ts = libc::timespec {
                                        tv_sec: end.as_secs() as _,
                                        tv_nsec: end.subsec_nanos() as _,
                                    };
                                    let r = libc::clock_nanosleep(
                                        libc::CLOCK_MONOTONIC,
                                        libc::TIMER_ABSTIME,
                                        &ts,
                                        std::ptr::null_mut(),
                                    );
                                    assert_eq!(r, 0);
                                }
                                1 => {
                                    let ts = libc::timespec {
                                        tv_sec: 0,
                                        tv_nsec: 100_000_000,
                                    };
                                    let r = libc::clock_nanosleep(
                                        libc::CLOCK_REALTIME,
                                        0,
                                        &ts,
                                        std::ptr::null_mut(),
                                    );
                                    assert_eq!(r, 0);
                                }
                                2 => assert_eq!(libc::usleep(100_000), 0),
                                _ => {
                                    let ts = libc::timespec {
                                        tv_sec: 0,
                                        tv_nsec: 100_000_000,
                                    };
                                    assert_eq!(libc::nanosleep(&ts, std::ptr::null_mut()), 0);
                                }
                            }
                        }
                        let _ = d;
                    },
                    None,
                )
                .unwrap()
            })
            .collect();
        hs.into_iter().for_each(finish);
        let took = start.elapsed();
        assert!(took >= Duration::from_millis(99), "{took:?}");
        assert!(took < Duration::from_secs(2), "400 sleeps took {took:?}");
        // A bad request still gets libc's error, in a fiber and outside.
        let bad = || {
            let ts = libc::timespec {
                tv_sec: 0,
                tv_nsec: 2_000_000_000,
            };
            // SAFETY: a live (invalid) timespec.
            let r = unsafe { libc::nanosleep(&ts, std::ptr::null_mut()) };
            (r, errno())
        };
        assert_eq!(s.block_on(bad), (-1, libc::EINVAL));
        assert_eq!(bad(), (-1, libc::EINVAL));
        s.stop();
    });
}

#[test]
fn std_echo_server_and_200_std_clients_on_one_worker() {
    with_deadline(|| {
        let s = sched(1);
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let server = s
            .submit(
                move || {
                    let mut conns = Vec::new();
                    for _ in 0..200 {
                        let (mut c, _) = listener.accept().unwrap();
                        conns.push(fibra::spawn(move || {
                            let mut buf = [0u8; 256];
                            loop {
                                match c.read(&mut buf).unwrap() {
                                    0 => return,
                                    n => c.write_all(&buf[..n]).unwrap(),
                                }
                            }
                        }));
                    }
                    conns.into_iter().for_each(|c| c.join().unwrap());
                },
                None,
            )
            .unwrap();
        let clients: Vec<_> = (0..200)
            .map(|i| {
                s.submit(
                    move || {
                        let mut c = TcpStream::connect(addr).unwrap();
                        for round in 0..3 {
                            let msg = format!("client {i} round {round}");
                            c.write_all(msg.as_bytes()).unwrap();
                            let mut back = vec![0u8; msg.len()];
                            c.read_exact(&mut back).unwrap();
                            assert_eq!(back, msg.as_bytes());
                        }
                    },
                    None,
                )
                .unwrap()
            })
            .collect();
        clients.into_iter().for_each(finish);
        finish(server);
        s.stop();
    });
}

#[test]
fn user_nonblocking_mode_keeps_its_meaning() {
    with_deadline(|| {
        let s = sched(1);
        let (a, mut b) = UnixStream::pair().unwrap();
        let fd = a.as_raw_fd();
        let r = s.block_on(move || {
            let mut a = a;
            a.set_nonblocking(true).unwrap();
            let mut buf = [0u8; 8];
            let t = Instant::now();
            let e = a.read(&mut buf).unwrap_err();
            assert_eq!(e.kind(), ErrorKind::WouldBlock);
            assert!(t.elapsed() < Duration::from_secs(1));
            assert_ne!(user_flags(fd) & libc::O_NONBLOCK, 0);
            // Blocking again: the read parks until the peer writes.
            a.set_nonblocking(false).unwrap();
            assert_eq!(user_flags(fd) & libc::O_NONBLOCK, 0);
            assert_ne!(
                kernel_flags(fd) & libc::O_NONBLOCK,
                0,
                "hooked fds stay non-blocking"
            );
            let writer = fibra::spawn(move || {
                fibra::sleep(Duration::from_millis(30));
                b.write_all(b"late").unwrap();
                b
            });
            let n = a.read(&mut buf).unwrap();
            let _b = writer.join().unwrap();
            // fcntl(F_SETFL) is tracked like ioctl(FIONBIO).
            // SAFETY: F_SETFL with flags on a live fd.
            unsafe { libc::fcntl(fd, libc::F_SETFL, user_flags(fd) | libc::O_NONBLOCK) };
            let e = a.read(&mut buf).unwrap_err().kind();
            (buf[..n].to_vec(), e)
        });
        assert_eq!(r, (b"late".to_vec(), ErrorKind::WouldBlock));
        s.stop();
    });
}

#[test]
fn read_timeouts_fire_while_other_fibers_run() {
    with_deadline(|| {
        let s = sched(1);
        let stop = Arc::new(AtomicBool::new(false));
        let (ticks, tick) = crate::common::ticker(&s, stop.clone(), Duration::from_millis(1));
        let (a, _b) = UnixStream::pair().unwrap();
        let (kind, took, ticked) = s.block_on(move || {
            let mut a = a;
            a.set_read_timeout(Some(Duration::from_millis(150)))
                .unwrap();
            let before = ticks.load(Ordering::Relaxed);
            let t = Instant::now();
            let e = a.read(&mut [0u8; 4]).unwrap_err();
            (
                e.kind(),
                t.elapsed(),
                ticks.load(Ordering::Relaxed) - before,
            )
        });
        stop.store(true, Ordering::Relaxed);
        finish(tick);
        assert_eq!(kind, ErrorKind::WouldBlock);
        assert!(took >= Duration::from_millis(149), "{took:?}");
        assert!(
            ticked >= 10,
            "the worker ran the ticker {ticked} times meanwhile"
        );
        s.stop();
    });
}

#[test]
fn is_active_only_in_scheduled_fibers_outside_without() {
    with_deadline(|| {
        assert!(!fibra::hook::is_active());
        let s = sched(1);
        let r = s.block_on(|| {
            let inside = fibra::hook::is_active();
            let within = fibra::hook::without(|| {
                let nested = fibra::hook::without(fibra::hook::is_active);
                (fibra::hook::is_active(), nested)
            });
            let after = fibra::hook::is_active();
            let pool = fibra::unblock(fibra::hook::is_active);
            (inside, within, after, pool)
        });
        assert_eq!(r, (true, (false, false), true, false));
        let seen = Arc::new(AtomicBool::new(true));
        let seen2 = seen.clone();
        let mut standalone =
            fibra::Fiber::new(move || seen2.store(fibra::hook::is_active(), Ordering::Relaxed));
        standalone.resume();
        assert!(
            !seen.load(Ordering::Relaxed),
            "hooks on in a standalone fiber"
        );
        assert!(!fibra::hook::without(fibra::hook::is_active));
        s.stop();
    });
}

#[test]
fn without_makes_calls_block_the_worker() {
    with_deadline(|| {
        let s = sched(1);
        let stop = Arc::new(AtomicBool::new(false));
        let (ticks, tick) = crate::common::ticker(&s, stop.clone(), Duration::from_millis(1));
        let (during, after) = s.block_on(move || {
            fibra::sleep(Duration::from_millis(20));
            let t0 = ticks.load(Ordering::Relaxed);
            fibra::hook::without(|| std::thread::sleep(Duration::from_millis(100)));
            let during = ticks.load(Ordering::Relaxed) - t0;
            std::thread::sleep(Duration::from_millis(100));
            (during, ticks.load(Ordering::Relaxed) - t0)
        });
        stop.store(true, Ordering::Relaxed);
        finish(tick);
        assert_eq!(
            during, 0,
            "the worker ran other fibers during an unhooked sleep"
        );
        assert!(
            after >= 10,
            "the hooked sleep let the ticker run only {after} times"
        );
        s.stop();
    });
}

#[test]
fn a_pipe_between_two_fibers_of_one_worker() {
    with_deadline(|| {
        let s = sched(1);
        let (mut r, mut w) = std::io::pipe().unwrap();
        let reader = s
            .submit(
                move || {
                    let mut got = Vec::new();
                    r.read_to_end(&mut got).unwrap();
                    got
                },
                None,
            )
            .unwrap();
        let writer = s
            .submit(
                move || {
                    for i in 0..50u8 {
                        fibra::sleep(Duration::from_millis(1));
                        w.write_all(&[i; 1000]).unwrap();
                    }
                },
                None,
            )
            .unwrap();
        finish(writer);
        let got = finish(reader);
        assert_eq!(got.len(), 50_000);
        assert!(got
            .chunks(1000)
            .enumerate()
            .all(|(i, c)| c.iter().all(|&b| b == i as u8)));
        s.stop();
    });
}

#[test]
fn one_write_on_a_blocking_socket_sends_everything() {
    with_deadline(|| {
        let s = sched(1);
        let (a, b) = UnixStream::pair().unwrap();
        const LEN: usize = 8 << 20;
        let reader = s
            .submit(
                move || {
                    let mut b = b;
                    let mut got = Vec::new();
                    b.read_to_end(&mut got).unwrap();
                    got
                },
                None,
            )
            .unwrap();
        let n = s.block_on(move || {
            let data: Vec<u8> = (0..LEN).map(|i| (i % 251) as u8).collect();
            // One call, as a C library would make it: the kernel's blocking write returns
            // only when all bytes went.
            // SAFETY: a live buffer of LEN bytes.
            let n = unsafe { libc::write(a.as_raw_fd(), data.as_ptr().cast(), LEN) };
            drop(a);
            n
        });
        assert_eq!(n, LEN as isize);
        let got = finish(reader);
        assert_eq!(got.len(), LEN);
        assert!(got.iter().enumerate().all(|(i, &b)| b == (i % 251) as u8));
        s.stop();
    });
}

#[test]
fn close_wakes_a_fiber_waiting_on_the_fd() {
    with_deadline(|| {
        let s = sched(1);
        let (a, _b) = UnixStream::pair().unwrap();
        let fd = a.into_raw_fd();
        let waiter = s
            .submit(
                move || {
                    let mut buf = [0u8; 4];
                    // SAFETY: a live buffer; the fd is closed by the other fiber meanwhile.
                    let r = unsafe { libc::read(fd, buf.as_mut_ptr().cast(), 4) };
                    (r, errno())
                },
                None,
            )
            .unwrap();
        let closer = s
            .submit(
                move || {
                    fibra::sleep(Duration::from_millis(30));
                    // SAFETY: we own the fd (taken from the stream above).
                    unsafe { libc::close(fd) }
                },
                None,
            )
            .unwrap();
        assert_eq!(finish(closer), 0);
        assert_eq!(finish(waiter), (-1, libc::EBADF));
        s.stop();
    });
}

#[test]
fn plain_threads_keep_blocking_semantics_on_switched_fds() {
    with_deadline(|| {
        let s = sched(1);
        let (a, b) = UnixStream::pair().unwrap();
        let fd = a.as_raw_fd();
        (&b).write_all(b"x").unwrap();
        // A fiber's read switches the fd to non-blocking mode in the kernel.
        let a = s.block_on(move || {
            let mut a = a;
            let mut one = [0u8; 1];
            a.read_exact(&mut one).unwrap();
            a
        });
        assert_ne!(kernel_flags(fd) & libc::O_NONBLOCK, 0);
        assert_eq!(user_flags(fd) & libc::O_NONBLOCK, 0);
        // A plain thread's read still blocks until data comes, not EAGAIN.
        let writer = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(50));
            (&b).write_all(b"later").unwrap();
            b
        });
        let mut buf = [0u8; 5];
        (&a).read_exact(&mut buf).unwrap();
        assert_eq!(&buf, b"later");
        let _b = writer.join().unwrap();
        // And its read timeout is honoured.
        a.set_read_timeout(Some(Duration::from_millis(60))).unwrap();
        let t = Instant::now();
        let e = (&a).read(&mut buf).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::WouldBlock);
        assert!(t.elapsed() >= Duration::from_millis(59));
        s.stop();
    });
}

#[test]
fn a_duplicate_keeps_the_users_blocking_view() {
    with_deadline(|| {
        let s = sched(1);
        let (a, b) = UnixStream::pair().unwrap();
        let got = s.block_on(move || {
            let mut a = a;
            (&b).write_all(b"1").unwrap();
            a.read_exact(&mut [0u8; 1]).unwrap(); // switched
            let mut clone = a.try_clone().unwrap(); // F_DUPFD_CLOEXEC
            assert_eq!(user_flags(clone.as_raw_fd()) & libc::O_NONBLOCK, 0);
            let w = fibra::spawn(move || {
                fibra::sleep(Duration::from_millis(20));
                (&b).write_all(b"2").unwrap();
                b
            });
            // Parks (blocking view) instead of failing with EAGAIN.
            let mut two = [0u8; 1];
            clone.read_exact(&mut two).unwrap();
            drop(w.join().unwrap());
            two[0]
        });
        assert_eq!(got, b'2');
        s.stop();
    });
}

#[test]
fn msg_dontwait_never_waits() {
    with_deadline(|| {
        let s = sched(1);
        let (a, _b) = UnixStream::pair().unwrap();
        let r = s.block_on(move || {
            let mut buf = [0u8; 4];
            // SAFETY: a live buffer.
            let r = unsafe {
                libc::recv(
                    a.as_raw_fd(),
                    buf.as_mut_ptr().cast(),
                    4,
                    libc::MSG_DONTWAIT,
                )
            };
            (r, errno())
        });
        assert_eq!(r, (-1, libc::EAGAIN));
        s.stop();
    });
}

#[test]
fn poll_and_select_in_a_fiber_park_it() {
    with_deadline(|| {
        let s = sched(1);
        let pipes: Vec<_> = (0..3).map(|_| std::io::pipe().unwrap()).collect();
        let fds: Vec<i32> = pipes.iter().map(|(r, _)| r.as_raw_fd()).collect();
        let (_readers, writers): (Vec<_>, Vec<_>) = pipes.into_iter().unzip();
        let mut writers = writers.into_iter();
        let _w0 = writers.next().unwrap();
        let mut w1 = writers.next().unwrap();
        let _w2 = writers.next().unwrap();
        let poller = s
            .submit(
                move || {
                    let mut p: Vec<libc::pollfd> = fds
                        .iter()
                        .map(|&fd| libc::pollfd {
                            fd,
                            events: libc::POLLIN,
                            revents: 0,
                        })
                        .collect();
                    // SAFETY: a live array of pollfds.
                    let n = unsafe { libc::poll(p.as_mut_ptr(), 3, 10_000) };
                    let ready: Vec<bool> =
                        p.iter().map(|p| p.revents & libc::POLLIN != 0).collect();
                    // Nothing more comes: a timed poll returns 0 after its timeout.
                    let t = Instant::now();
                    p[1].events = 0;
                    // SAFETY: as above.
                    let none = unsafe { libc::poll(p.as_mut_ptr(), 3, 60) };
                    let waited = t.elapsed();
                    // select on the readable pipe.
                    // SAFETY: a zeroed fd_set, filled with a valid fd.
                    let mut set: libc::fd_set = unsafe { std::mem::zeroed() };
                    unsafe { libc::FD_SET(fds[1], &mut set) };
                    let mut tv = libc::timeval {
                        tv_sec: 5,
                        tv_usec: 0,
                    };
                    // SAFETY: live sets and timeout.
                    let sel = unsafe {
                        libc::select(
                            fds[1] + 1,
                            &mut set,
                            std::ptr::null_mut(),
                            std::ptr::null_mut(),
                            &mut tv,
                        )
                    };
                    // SAFETY: the set select filled in.
                    let in_set = unsafe { libc::FD_ISSET(fds[1], &set) };
                    (n, ready, none, waited, sel, in_set)
                },
                None,
            )
            .unwrap();
        let writer = s
            .submit(
                move || {
                    fibra::sleep(Duration::from_millis(30));
                    w1.write_all(b"!").unwrap();
                    w1
                },
                None,
            )
            .unwrap();
        let _w1 = finish(writer);
        let (n, ready, none, waited, sel, in_set) = finish(poller);
        assert_eq!(n, 1);
        assert_eq!(ready, [false, true, false]);
        assert_eq!(none, 0);
        assert!(waited >= Duration::from_millis(59), "{waited:?}");
        assert_eq!((sel, in_set), (1, true));
        s.stop();
    });
}

#[test]
fn connect_refused_and_name_resolution_in_fibers() {
    with_deadline(|| {
        let s = sched(1);
        let closed = {
            let l = TcpListener::bind("127.0.0.1:0").unwrap();
            l.local_addr().unwrap()
        };
        let (refused, resolved) = s.block_on(move || {
            let refused = TcpStream::connect(closed).unwrap_err().kind();
            use std::net::ToSocketAddrs;
            let resolved: Vec<_> = ("localhost", 80).to_socket_addrs().unwrap().collect();
            (refused, resolved)
        });
        assert_eq!(refused, ErrorKind::ConnectionRefused);
        assert!(
            resolved.iter().any(|a| a.ip().is_loopback()),
            "{resolved:?}"
        );
        s.stop();
    });
}

#[test]
fn regular_files_pass_through_untouched() {
    with_deadline(|| {
        let s = sched(1);
        let path = std::env::temp_dir().join(format!("fibra-hook-{}", std::process::id()));
        let p = path.clone();
        let (kernel, text) = s.block_on(move || {
            std::fs::write(&p, b"plain file").unwrap();
            let mut f = std::fs::File::open(&p).unwrap();
            let mut text = String::new();
            f.read_to_string(&mut text).unwrap();
            (kernel_flags(f.as_raw_fd()), text)
        });
        std::fs::remove_file(&path).unwrap();
        assert_eq!(text, "plain file");
        assert_eq!(kernel & libc::O_NONBLOCK, 0);
        s.stop();
    });
}

#[test]
fn errno_outside_fibers_is_the_c_librarys() {
    // SAFETY: reading from an invalid fd into a live buffer.
    let r = unsafe { libc::read(-1, [0u8; 1].as_mut_ptr().cast(), 1) };
    assert_eq!((r, errno()), (-1, libc::EBADF));
    // SAFETY: as above.
    let r = unsafe { libc::close(-1) };
    assert_eq!((r, errno()), (-1, libc::EBADF));
}

#[test]
fn a_cancelled_fiber_in_a_hooked_read_fails_it_then_unwinds() {
    with_deadline(|| {
        let s = sched(1);
        let (a, _b) = UnixStream::pair().unwrap();
        let (seen_tx, seen_rx) = std::sync::mpsc::channel();
        let reader = s
            .submit(
                move || {
                    let mut a = a;
                    let e = a.read(&mut [0u8; 4]).unwrap_err();
                    seen_tx.send(e.raw_os_error()).unwrap();
                    // The cancellation is raised here, at the next suspension in fibra.
                    fibra::sleep(Duration::from_secs(60));
                    unreachable!("a cancelled fiber went on past a suspension");
                },
                None,
            )
            .unwrap();
        std::thread::sleep(Duration::from_millis(50));
        reader.cancel();
        assert_eq!(
            seen_rx.recv_timeout(crate::common::LIMIT).unwrap(),
            Some(libc::ECANCELED)
        );
        assert!(reader.wait_timeout(crate::common::LIMIT));
        assert!(reader.join().unwrap_err().is_cancelled());
        s.stop();
    });
}

/// A fiber whose cancellation a hooked call caught makes no further wait: a later
/// `getaddrinfo` (which always waits, on the blocking pool) fails at once with `EAI_SYSTEM`
/// and `ECANCELED`, as a read or a sleep would, instead of resolving. A resolver loop in
/// C code that only ever suspends inside hooks would otherwise run on for as long as it
/// pleased after its cancellation.
#[test]
fn after_a_caught_cancellation_getaddrinfo_fails_at_once() {
    with_deadline(|| {
        let s = sched(1);
        let (a, _b) = UnixStream::pair().unwrap();
        let (seen_tx, seen_rx) = std::sync::mpsc::channel();
        let reader = s
            .submit(
                move || {
                    let mut a = a;
                    let e = a.read(&mut [0u8; 4]).unwrap_err();
                    let (r, gai_errno) = crate::resolve_localhost();
                    // Through std too: its resolver is the same call.
                    use std::net::ToSocketAddrs;
                    let std_err = ("localhost", 80)
                        .to_socket_addrs()
                        .map(|a| a.count())
                        .map_err(|e| e.to_string());
                    seen_tx
                        .send((e.raw_os_error(), r, gai_errno, std_err))
                        .unwrap();
                    fibra::sleep(Duration::from_secs(60));
                    unreachable!("a cancelled fiber went on past a suspension");
                },
                None,
            )
            .unwrap();
        std::thread::sleep(Duration::from_millis(50));
        reader.cancel();
        let (read, r, gai_errno, std_err) = seen_rx.recv_timeout(crate::common::LIMIT).unwrap();
        assert_eq!(read, Some(libc::ECANCELED));
        assert_eq!(
            (r, gai_errno),
            (libc::EAI_SYSTEM, libc::ECANCELED),
            "getaddrinfo after a caught cancellation"
        );
        assert!(
            std_err.is_err(),
            "std resolved after the cancellation: {std_err:?}"
        );
        assert!(reader.wait_timeout(crate::common::LIMIT));
        assert!(reader.join().unwrap_err().is_cancelled());
        s.stop();
    });
}

#[test]
fn stop_timeout_ends_fibers_blocked_in_hooked_calls() {
    with_deadline(|| {
        let s = Scheduler::builder().threads(1).build().unwrap();
        s.start();
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let (a, _b) = UnixStream::pair().unwrap();
        let acceptor = s
            .submit(move || listener.accept().map(|_| ()), None)
            .unwrap();
        let reader = s
            .submit(move || (&a).read(&mut [0u8; 4]).map(|_| ()), None)
            .unwrap();
        let sleeper = s
            .submit(|| std::thread::sleep(Duration::from_secs(3600)), None)
            .unwrap();
        std::thread::sleep(Duration::from_millis(50));
        let t = Instant::now();
        s.stop_timeout(Duration::from_millis(50));
        assert!(t.elapsed() < Duration::from_secs(20));
        // Each ended: with the cancellation, or (where no fibra suspension followed the
        // failed call) with the call's ECANCELED error.
        for h in [acceptor, reader] {
            match h.join() {
                Err(e) => assert!(e.is_cancelled()),
                Ok(r) => assert_eq!(r.unwrap_err().raw_os_error(), Some(libc::ECANCELED)),
            }
        }
        assert!(sleeper.join().map_or_else(|e| e.is_cancelled(), |()| true));
    });
}

#[test]
fn a_fork_child_of_a_fiber_runs_unhooked() {
    with_deadline(|| {
        let s = sched(1);
        let (status, out) = s.block_on(|| {
            // SAFETY: the child only sleeps (the hooked nanosleep), checks is_active and
            // leaves with _exit, all async-signal-safe in substance: no locks are taken.
            let pid = unsafe { libc::fork() };
            if pid == 0 {
                std::thread::sleep(Duration::from_millis(5));
                let code = if fibra::hook::is_active() { 3 } else { 0 };
                // SAFETY: leaving the child without running the parent's destructors.
                unsafe { libc::_exit(code) };
            }
            let mut status = 0;
            // SAFETY: waiting for our own child.
            unsafe { libc::waitpid(pid, &mut status, 0) };
            // A child process with a pre_exec hook is started by fork in std; its output
            // comes back through a pipe the fiber reads, hooked.
            use std::os::unix::process::CommandExt;
            let mut cmd = std::process::Command::new("sh");
            cmd.args(["-c", "sleep 0.05; echo forked"]);
            // SAFETY: the closure does nothing.
            unsafe { cmd.pre_exec(|| Ok(())) };
            let out = cmd.output().unwrap();
            (status, String::from_utf8(out.stdout).unwrap())
        });
        assert!(
            libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0,
            "{status}"
        );
        assert_eq!(out, "forked\n");
        s.stop();
    });
}

#[test]
fn two_fibers_reading_one_socket_each_get_a_message() {
    with_deadline(|| {
        let s = sched(1);
        let (a, b) = UnixStream::pair().unwrap();
        let a = Arc::new(a);
        let readers: Vec<_> = (0..2)
            .map(|_| {
                let a = a.clone();
                s.submit(
                    move || {
                        let mut one = [0u8; 1];
                        (&*a).read_exact(&mut one).unwrap();
                        one[0]
                    },
                    None,
                )
                .unwrap()
            })
            .collect();
        let writer = s
            .submit(
                move || {
                    for byte in [b'a', b'b'] {
                        fibra::sleep(Duration::from_millis(20));
                        (&b).write_all(&[byte]).unwrap();
                    }
                    b
                },
                None,
            )
            .unwrap();
        let _b = finish(writer);
        let mut got: Vec<u8> = readers.into_iter().map(finish).collect();
        got.sort();
        assert_eq!(got, b"ab");
        s.stop();
    });
}

#[test]
fn a_huge_read_timeout_means_wait() {
    with_deadline(|| {
        let s = sched(1);
        let (a, b) = UnixStream::pair().unwrap();
        let got = s.block_on(move || {
            a.set_read_timeout(Some(Duration::MAX)).unwrap();
            let w = fibra::spawn(move || {
                fibra::sleep(Duration::from_millis(20));
                (&b).write_all(b"!").unwrap();
                b
            });
            let mut one = [0u8; 1];
            (&a).read_exact(&mut one).unwrap();
            drop(w.join().unwrap());
            one[0]
        });
        assert_eq!(got, b'!');
        s.stop();
    });
}

extern "C" fn ignore_signal(_: libc::c_int) {}

#[test]
fn signals_do_not_surface_as_eintr_in_hooked_calls() {
    with_deadline(|| {
        // A handler without SA_RESTART: a real blocking call it interrupts fails with EINTR.
        // SAFETY: installing a handler that does nothing, with an empty mask.
        unsafe {
            let mut sa: libc::sigaction = std::mem::zeroed();
            sa.sa_sigaction = ignore_signal as *const () as usize;
            libc::sigemptyset(&mut sa.sa_mask);
            libc::sigaction(libc::SIGUSR2, &sa, std::ptr::null_mut());
        }
        let s = sched(2);
        let stop = Arc::new(AtomicBool::new(false));
        let stop2 = stop.clone();
        let signaller = std::thread::spawn(move || {
            while !stop2.load(Ordering::Relaxed) {
                // SAFETY: signalling our own process with a handled signal.
                unsafe { libc::kill(libc::getpid(), libc::SIGUSR2) };
                std::thread::sleep(Duration::from_micros(200));
            }
        });
        let hs: Vec<_> = (0..50)
            .map(|i| {
                s.submit(
                    move || {
                        let (a, b) = UnixStream::pair().unwrap();
                        let w = fibra::spawn(move || {
                            std::thread::sleep(Duration::from_millis(20 + i % 7));
                            (&b).write_all(&[i as u8]).unwrap();
                            b
                        });
                        let mut one = [0u8; 1];
                        // SAFETY: a live one-byte buffer.
                        let r = unsafe { libc::read(a.as_raw_fd(), one.as_mut_ptr().cast(), 1) };
                        let e = errno();
                        drop(w.join().unwrap());
                        assert_eq!(r, 1, "read failed with errno {e}");
                        one[0]
                    },
                    None,
                )
                .unwrap()
            })
            .collect();
        for (i, h) in hs.into_iter().enumerate() {
            assert_eq!(finish(h), i as u8);
        }
        stop.store(true, Ordering::Relaxed);
        signaller.join().unwrap();
        s.stop();
    });
}

#[test]
fn a_connect_to_a_full_backlog_honours_so_sndtimeo() {
    with_deadline(|| {
        // SAFETY: a plain socket, bound to a free loopback port and listening with the
        // smallest backlog; nobody ever accepts.
        let (listener, addr) = unsafe {
            let l = libc::socket(libc::AF_INET, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0);
            let mut sa: libc::sockaddr_in = std::mem::zeroed();
            sa.sin_family = libc::AF_INET as _;
            sa.sin_addr.s_addr = u32::from_ne_bytes([127, 0, 0, 1]);
            let len = std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t;
            assert_eq!(
                libc::bind(l, (&sa as *const libc::sockaddr_in).cast(), len),
                0
            );
            assert_eq!(libc::listen(l, 0), 0);
            let mut got = len;
            libc::getsockname(l, (&mut sa as *mut libc::sockaddr_in).cast(), &mut got);
            (l, sa)
        };
        let s = sched(1);
        let stop = Arc::new(AtomicBool::new(false));
        let (ticks, tick) = crate::common::ticker(&s, stop.clone(), Duration::from_millis(1));
        let outcomes = s.block_on(move || {
            let mut outcomes = Vec::new();
            for _ in 0..4 {
                // SAFETY: a fresh socket with a 200 ms send timeout, connected to the
                // listener above; the fd is left open so the backlog stays full.
                let (r, e, took) = unsafe {
                    let c = libc::socket(libc::AF_INET, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0);
                    let tv = libc::timeval {
                        tv_sec: 0,
                        tv_usec: 200_000,
                    };
                    libc::setsockopt(
                        c,
                        libc::SOL_SOCKET,
                        libc::SO_SNDTIMEO,
                        (&tv as *const libc::timeval).cast(),
                        std::mem::size_of::<libc::timeval>() as libc::socklen_t,
                    );
                    let t = Instant::now();
                    let r = libc::connect(
                        c,
                        (&addr as *const libc::sockaddr_in).cast(),
                        std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t,
                    );
                    (r, errno(), t.elapsed())
                };
                outcomes.push((r, e, took, ticks.load(Ordering::Relaxed)));
            }
            outcomes
        });
        stop.store(true, Ordering::Relaxed);
        finish(tick);
        // SAFETY: our listener.
        unsafe { libc::close(listener) };
        let timed_out: Vec<_> = outcomes.iter().filter(|o| o.0 == -1).collect();
        assert!(!timed_out.is_empty(), "no connect waited: {outcomes:?}");
        for (_, e, took, _) in &timed_out {
            assert_eq!(*e, libc::EINPROGRESS, "{outcomes:?}");
            assert!(*took >= Duration::from_millis(199), "{outcomes:?}");
        }
        // The worker ran the ticker while the connects waited.
        assert!(outcomes.last().unwrap().3 >= 20, "{outcomes:?}");
        s.stop();
    });
}
