//! Readiness delivered at home: the first fiber to wait for an fd moves it into its worker's
//! own epoll instance, so that worker sees its readiness itself. What must stay right: a
//! fiber of another worker, a readiness continuation or a scheduler of its own waiting for
//! the same fd (the fd goes back to the shared instance), a busy home worker, deregistering
//! and reusing the fd number, registering it again, timers and remote wakes of a worker
//! asleep at home, and a `fork`.

use std::io::{Read, Write};
use std::os::fd::{AsRawFd, FromRawFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

use crate::common::{child_ok, listener_and_client, started, wait_until, LIMIT};
use fibra::net::TcpStream;

/// A fiber on worker 0 echoes 200 messages from a plain thread while worker 1 holds the
/// shared instance's poller role: worker 0 sees each readiness itself, so its fiber is
/// resumed by local wakes, not by another thread's.
#[test]
fn a_fiber_waiting_alone_is_woken_by_its_own_worker() {
    crate::common::with_deadline(|| {
        let sched = started(2);
        // Worker 1 takes the shared instance's poller role first, and keeps it while idle: a
        // wait that times out there makes sure the reactor exists when it goes idle.
        sched
            .submit(
                || {
                    let (l, _c) = listener_and_client();
                    let (s, _) = l.accept().unwrap();
                    s.set_read_timeout(Some(Duration::from_millis(1))).unwrap();
                    assert!((&s).read(&mut [0u8; 1]).is_err());
                },
                Some(1),
            )
            .expect("submitted")
            .join()
            .expect("timed out once");
        std::thread::sleep(Duration::from_millis(20));
        let (listener, mut client) = listener_and_client();
        client.set_read_timeout(Some(LIMIT)).unwrap();
        let echo = sched
            .submit(
                move || {
                    let (mut s, _) = listener.accept().expect("accept");
                    let mut buf = [0u8; 8];
                    loop {
                        match s.read(&mut buf).expect("read") {
                            0 => return,
                            n => s.write_all(&buf[..n]).expect("write"),
                        }
                    }
                },
                Some(0),
            )
            .expect("submitted");
        // Connected and parked once, so the socket has moved.
        client.write_all(b"x").unwrap();
        client.read_exact(&mut [0u8; 1]).unwrap();
        let before = sched.metrics();
        for _ in 0..200 {
            client.write_all(b"ping").unwrap();
            let mut got = [0u8; 4];
            client.read_exact(&mut got).unwrap();
        }
        let d = sched.metrics().delta(&before);
        let (w0, w1) = (&d.workers()[0], &d.workers()[1]);
        assert!(
            w0.remote_wakes() < 10 && w1.sleeps() < 10,
            "the echo fiber was woken from another thread {} times in 200 rounds ({} local), \
             and worker 1 woke {} times",
            w0.remote_wakes(),
            w0.local_wakes(),
            w1.sleeps()
        );
        drop(client);
        crate::common::finish(echo);
        sched.stop();
    });
}

/// The reader parks on worker 0 (the socket moves there), then a writer on worker 1 waits
/// for the same socket to drain: both must be woken by their readiness, whichever worker
/// polls.
#[test]
fn a_socket_waited_for_from_two_workers_wakes_both() {
    crate::common::with_deadline(|| {
        let sched = crate::common::shared_started(2);
        let (listener, mut client) = listener_and_client();
        client.set_read_timeout(Some(LIMIT)).unwrap();
        let (tx, rx) = mpsc::channel();
        let sc = sched.clone();
        sched
            .submit(
                move || {
                    let (s, _) = listener.accept().expect("accept");
                    let s = Arc::new(s);
                    let w = s.clone();
                    let writer = sc
                        .submit(
                            move || {
                                // Fill the socket until the write parks, then finish.
                                let chunk = vec![7u8; 64 * 1024];
                                let mut sent = 0usize;
                                while sent < 8 << 20 {
                                    sent += (&*w).write(&chunk).expect("write");
                                }
                                sent
                            },
                            Some(1),
                        )
                        .expect("pinned to 1");
                    let mut buf = [0u8; 4];
                    (&*s).read_exact(&mut buf).expect("read on worker 0");
                    tx.send(buf).unwrap();
                    writer.join().expect("writer")
                },
                Some(0),
            )
            .expect("submitted");
        // Drain the writer's bytes (it blocks on a full socket meanwhile), then send the
        // reader's.
        let mut drained = 0usize;
        let mut buf = vec![0u8; 1 << 20];
        while drained < 8 << 20 {
            drained += client.read(&mut buf).expect("the writer's bytes");
        }
        client.write_all(b"read").unwrap();
        assert_eq!(&rx.recv_timeout(LIMIT).expect("the reader woke"), b"read");
        sched.stop();
    });
}

/// The socket's fiber on worker 0 waited once (the socket moved there); then worker 0 is
/// held by a fiber that never suspends until a continuation registered on that socket from
/// worker 1 has run. The continuation must run on worker 1 all the same: its readiness
/// cannot wait for worker 0.
#[test]
fn a_continuation_on_a_socket_at_a_busy_home_still_runs() {
    crate::common::with_deadline(|| {
        let sched = started(2);
        let (listener, mut client) = listener_and_client();
        let (sock_tx, sock_rx) = fibra::sync::oneshot::channel::<TcpStream>();
        let (hold_tx, hold_rx) = mpsc::channel();
        let ran = Arc::new(AtomicBool::new(false));
        sched
            .submit(
                move || {
                    let (s, _) = listener.accept().expect("accept");
                    s.set_read_timeout(Some(Duration::from_millis(5))).unwrap();
                    // Parks once on worker 0, and times out: the socket moved home.
                    assert!((&s).read(&mut [0u8; 1]).is_err());
                    assert!(sock_tx.send(s).is_ok(), "sent");
                },
                Some(0),
            )
            .expect("submitted");
        let r = ran.clone();
        sched
            .submit(
                move || {
                    let s = sock_rx.recv().expect("the socket");
                    s.spawn_when_readable(move |s| {
                        let mut b = [0u8; 4];
                        s.try_read(&mut b).expect("data");
                        r.store(true, Ordering::SeqCst);
                    })
                    .expect("registered");
                    hold_tx.send(()).unwrap();
                },
                Some(1),
            )
            .expect("submitted");
        hold_rx.recv_timeout(LIMIT).unwrap();
        let r = ran.clone();
        let hold = sched
            .submit(
                move || {
                    let end = Instant::now() + LIMIT;
                    while !r.load(Ordering::SeqCst) && Instant::now() < end {
                        std::hint::spin_loop();
                    }
                },
                Some(0),
            )
            .expect("submitted");
        client.write_all(b"data").unwrap();
        wait_until("the continuation ran while worker 0 is held", || {
            ran.load(Ordering::SeqCst)
        });
        crate::common::finish(hold);
        sched.stop();
    });
}

/// Reads `n` bytes from the non-blocking `s` (whose fd is `fd`), waiting with
/// `io::wait_readable` (a hint: a readiness seen before may return at once) on `EAGAIN`.
fn read_when_ready(fd: i32, mut s: &std::os::unix::net::UnixStream, n: usize) -> Vec<u8> {
    let mut got = vec![0u8; n];
    let mut have = 0;
    while have < n {
        match s.read(&mut got[have..]) {
            Ok(0) => panic!("end of file"),
            Ok(k) => have += k,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                fibra::io::wait_readable(fd, Some(LIMIT)).expect("readable");
            }
            Err(e) => panic!("{e}"),
        }
    }
    got
}

/// A fiber waits for an fd with `io::wait_readable` (it moves home), again and again (each
/// call registers it anew: the same record must come back), then the fd is deregistered and
/// closed, and a new fd with the same number is waited for: its readiness must reach the
/// new waiter, and the old registration's must not.
#[test]
fn a_homed_fd_deregistered_and_its_number_reused_is_watched_anew() {
    crate::common::with_deadline(|| {
        let sched = started(1);
        let v = sched.block_on(|| {
            let (a, mut b) = std::os::unix::net::UnixStream::pair().unwrap();
            a.set_nonblocking(true).unwrap();
            let fd = a.as_raw_fd();
            for round in 0..3u8 {
                let writer = std::thread::spawn(move || {
                    std::thread::sleep(Duration::from_millis(5));
                    b.write_all(&[round]).unwrap();
                    b
                });
                assert_eq!(read_when_ready(fd, &a, 1), [round]);
                b = writer.join().unwrap();
            }
            fibra::io::deregister(fd);
            drop(b);
            // A new socket under the old number: `dup2` onto it closes the old one and
            // gives its number to the new (other tests of this binary open fds meanwhile,
            // so the lowest free number may be taken by then).
            let (c, mut other) = std::os::unix::net::UnixStream::pair().unwrap();
            // SAFETY: `fd` is `a`'s, which `dup2` closes and replaces; `a` is forgotten so
            // that it does not close the number again.
            assert_eq!(unsafe { libc::dup2(c.as_raw_fd(), fd) }, fd);
            std::mem::forget(a);
            drop(c);
            // SAFETY: `fd` now names the new socket, owned here alone.
            let mine = unsafe { std::os::unix::net::UnixStream::from_raw_fd(fd) };
            mine.set_nonblocking(true).unwrap();
            let writer = std::thread::spawn(move || {
                std::thread::sleep(Duration::from_millis(5));
                other.write_all(b"new").unwrap();
                other
            });
            let got = read_when_ready(fd, &mine, 3);
            drop(writer.join().unwrap());
            fibra::io::deregister(fd);
            got
        });
        assert_eq!(&v, b"new");
        sched.stop();
    });
}

/// A worker asleep at home (its fiber waits for a socket) wakes for its timers and for
/// work sent from a plain thread.
#[test]
fn a_worker_asleep_at_home_wakes_for_timers_and_remote_work() {
    crate::common::with_deadline(|| {
        let sched = started(1);
        let (listener, mut client) = listener_and_client();
        let reader = sched.spawn(move || {
            let (mut s, _) = listener.accept().expect("accept");
            let mut b = [0u8; 3];
            s.read_exact(&mut b).expect("read");
            b
        });
        wait_until("the reader parks", || sched.metrics().io_waiting() == 1);
        let slept = sched.spawn(|| {
            let t = Instant::now();
            fibra::sleep(Duration::from_millis(20));
            t.elapsed()
        });
        assert!(crate::common::finish(slept) >= Duration::from_millis(20));
        let (tx, rx) = fibra::sync::mpsc::channel::<u32>();
        let got = sched.spawn(move || rx.recv().expect("sent"));
        std::thread::sleep(Duration::from_millis(10));
        tx.send(7).unwrap();
        assert_eq!(crate::common::finish(got), 7);
        client.write_all(b"end").unwrap();
        assert_eq!(&crate::common::finish(reader), b"end");
        sched.stop();
    });
}

/// A socket moved into the home of scheduler `a`'s worker; `a` stops; a fiber of scheduler
/// `b` then waits for the same socket: it must be woken by its data, though `a`'s worker
/// will never poll again.
#[test]
fn a_socket_left_at_a_stopped_schedulers_home_is_watched_for_another() {
    crate::common::with_deadline(|| {
        let a = started(1);
        let (listener, mut client) = listener_and_client();
        let s = a.block_on(move || {
            let (s, _) = listener.accept().expect("accept");
            s.set_read_timeout(Some(Duration::from_millis(5))).unwrap();
            assert!((&s).read(&mut [0u8; 1]).is_err(), "parked once, timed out");
            s.set_read_timeout(None).unwrap();
            s
        });
        a.stop();
        drop(a);
        let b = started(1);
        let reader = b.spawn(move || {
            let mut got = [0u8; 4];
            (&s).read_exact(&mut got).expect("read");
            got
        });
        std::thread::sleep(Duration::from_millis(20));
        client.write_all(b"late").unwrap();
        assert_eq!(&crate::common::finish(reader), b"late");
        b.stop();
    });
}

/// After a fiber's socket moved home, the process forks: in the child (one thread, no
/// workers), a new scheduler's fiber waits for the inherited socket and gets its data.
#[test]
fn a_forked_child_waits_for_a_socket_that_was_at_home_in_the_parent() {
    let sched = started(1);
    let (listener, client) = listener_and_client();
    let s = sched.block_on(move || {
        let (s, _) = listener.accept().expect("accept");
        s.set_read_timeout(Some(Duration::from_millis(5))).unwrap();
        assert!((&s).read(&mut [0u8; 1]).is_err(), "parked once, timed out");
        s.set_read_timeout(None).unwrap();
        s
    });
    let client = std::sync::Mutex::new(Some(client));
    child_ok(|| {
        let mut client = client.lock().unwrap().take().unwrap();
        let child = started(1);
        let reader = child.spawn(move || {
            let mut got = [0u8; 5];
            (&s).read_exact(&mut got).expect("read in the child");
            got
        });
        std::thread::sleep(Duration::from_millis(20));
        client.write_all(b"child").unwrap();
        assert_eq!(&crate::common::finish(reader), b"child");
        child.stop();
    });
    sched.stop();
}

/// Out of descriptors when a worker's fiber first waits for a socket, the worker cannot
/// make its own epoll instance: the socket stays in the shared one and the wait works all
/// the same.
#[test]
fn a_worker_that_cannot_make_its_home_waits_in_the_shared_instance() {
    child_ok(|| {
        let (listener, mut client) = listener_and_client();
        // The reactor exists (a plain thread's registration makes it), the worker has no
        // home yet (none of its fibers ever waited).
        let (a, _b) = std::os::unix::net::UnixStream::pair().unwrap();
        a.set_nonblocking(true).unwrap();
        assert!(fibra::io::wait_readable(a.as_raw_fd(), Some(Duration::from_millis(1))).is_err());
        let sched = started(1);
        let (mut s, _) = listener.accept().expect("accept");
        let filler = crate::common::fill_descriptor_table(0);
        let reader = sched.spawn(move || {
            let mut got = [0u8; 4];
            s.read_exact(&mut got).expect("read without a home");
            drop(filler);
            got
        });
        std::thread::sleep(Duration::from_millis(20));
        client.write_all(b"full").unwrap();
        assert_eq!(&crate::common::finish(reader), b"full");
        sched.stop();
    });
}
