//! No fibra socket write raises `SIGPIPE`: writing to a TCP or Unix stream whose peer is
//! gone, or to a datagram socket shut down for writing, fails with an `io::Error` (`EPIPE`,
//! or `ECONNRESET` first after a reset) through every write path — `write`,
//! `write_vectored`, `send`, `send_to` — from a fiber and from a plain thread.
//!
//! The test harness (like every Rust program) ignores `SIGPIPE`, so the writes cannot be
//! checked in this process: each check runs in a child process (`in_child`), which puts
//! `SIGPIPE` back to its default action, as in a C program embedding fibra, where the signal
//! kills the process; the parent then requires that the child's body returned and that it
//! exited cleanly, not by signal 13.

use std::env;
use std::io::{self, IoSlice, Write};
use std::net::Shutdown;
use std::os::fd::AsRawFd;
use std::time::{Duration, Instant};

use crate::common::{in_child, ChildRun};
use fibra::net::unix::{UnixDatagram, UnixStream};
use fibra::net::{TcpListener, TcpStream, UdpSocket};
use fibra::Scheduler;

/// Requires that the child survived every write.
fn assert_no_sigpipe(run: ChildRun) {
    assert_ne!(
        run.signal(),
        Some(libc::SIGPIPE),
        "a socket write raised SIGPIPE and killed the child of {}; its stderr:\n{}",
        run.test,
        run.stderr
    );
    run.assert_ok("a write to a vanished peer failed in the child");
}

/// Gives `SIGPIPE` its default action (terminate) in this process, as a C program has it.
fn default_sigpipe() {
    // SAFETY: `signal` with a valid signal number and `SIG_DFL` installs no handler; it only
    // changes the disposition, which no other code of this process relies on.
    let previous = unsafe { libc::signal(libc::SIGPIPE, libc::SIG_DFL) };
    assert_ne!(previous, libc::SIG_ERR, "signal(SIGPIPE, SIG_DFL) failed");
}

/// Every error a write to a vanished peer may report: `ECONNRESET` once after a reset, then
/// `EPIPE`.
fn assert_peer_gone(what: &str, e: &io::Error) {
    assert!(
        matches!(e.raw_os_error(), Some(libc::EPIPE) | Some(libc::ECONNRESET)),
        "{what}: expected EPIPE or ECONNRESET, got {e:?}"
    );
}

/// Calls `write` until it reports `EPIPE` (the error that comes with `SIGPIPE` when the flag
/// is missing), checking every error on the way; fails after 10 s of successful writes.
fn write_until_epipe(what: &str, mut write: impl FnMut() -> io::Result<usize>) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        match write() {
            Ok(_) => {}
            Err(e) if e.raw_os_error() == Some(libc::EPIPE) => break,
            Err(e) => assert_peer_gone(what, &e),
        }
        assert!(
            Instant::now() < deadline,
            "{what}: writes kept succeeding after the peer was gone"
        );
        fibra::sleep(Duration::from_millis(1));
    }
    // And again, now that the connection is known dead.
    let e = write().expect_err("a write after EPIPE");
    assert_peer_gone(what, &e);
}

/// A TCP connection whose peer has reset it (or, with `rst` false, just closed it: the
/// first write then draws the reset).
fn tcp_with_peer_gone(rst: bool) -> TcpStream {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
    let client = TcpStream::connect(listener.local_addr().unwrap()).expect("connect");
    let (server, _) = listener.accept().expect("accept");
    if rst {
        crate::common::reset(server);
    } else {
        drop(server);
    }
    client
}

/// Shuts down the sending half of the socket `fd` (fibra's `UdpSocket` has no `shutdown`,
/// like std's).
fn shutdown_write(fd: i32) {
    // SAFETY: `shutdown` on an fd the caller keeps open; it touches no memory.
    let r = unsafe { libc::shutdown(fd, libc::SHUT_WR) };
    assert_eq!(r, 0, "shutdown: {}", io::Error::last_os_error());
}

/// Every write path of every socket type, against a peer that is gone.
fn all_writes() {
    let two = [IoSlice::new(b"ab"), IoSlice::new(b"cd")];
    for rst in [true, false] {
        let s = tcp_with_peer_gone(rst);
        write_until_epipe(&format!("TcpStream::write_vectored (rst {rst})"), || {
            (&s).write_vectored(&two)
        });
        let s = tcp_with_peer_gone(rst);
        write_until_epipe(&format!("TcpStream::write (rst {rst})"), || {
            (&s).write(b"abcd")
        });
    }

    let (a, b) = UnixStream::pair().expect("pair");
    drop(b);
    write_until_epipe("UnixStream::write_vectored", || (&a).write_vectored(&two));
    let (a, b) = UnixStream::pair().expect("pair");
    drop(b);
    write_until_epipe("UnixStream::write", || (&a).write(b"abcd"));

    let peer = UdpSocket::bind("127.0.0.1:0").expect("bind");
    let to = peer.local_addr().unwrap();
    let udp = UdpSocket::bind("127.0.0.1:0").expect("bind");
    udp.connect(to).expect("connect");
    shutdown_write(udp.as_raw_fd());
    write_until_epipe("UdpSocket::send", || udp.send(b"abcd"));
    write_until_epipe("UdpSocket::send_to", || udp.send_to(b"abcd", to));

    let dir = env::temp_dir().join(format!("fibra-sigpipe-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let path = dir.join("receiver");
    let _ = std::fs::remove_file(&path);
    let receiver = UnixDatagram::bind(&path).expect("bind");
    let (a, _b) = UnixDatagram::pair().expect("pair");
    a.shutdown(Shutdown::Write).expect("shutdown");
    write_until_epipe("UnixDatagram::send", || a.send(b"abcd"));
    write_until_epipe("UnixDatagram::send_to", || a.send_to(b"abcd", &path));
    drop(receiver);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn writes_to_a_vanished_peer_raise_no_sigpipe_in_a_fiber() {
    assert_no_sigpipe(in_child(|| {
        default_sigpipe();
        let sched = Scheduler::builder().threads(1).build().expect("build");
        let in_fiber = sched.block_on(|| {
            all_writes();
            fibra::current_worker().is_some()
        });
        assert!(in_fiber, "the writes ran outside a fiber");
        sched.stop();
    }));
}

#[test]
fn writes_to_a_vanished_peer_raise_no_sigpipe_on_a_thread() {
    assert_no_sigpipe(in_child(|| {
        default_sigpipe();
        all_writes();
        assert!(fibra::current_worker().is_none());
    }));
}
