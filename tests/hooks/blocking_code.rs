//! The `hook` feature from the point of view of unmodified blocking code: `MSG_WAITALL`,
//! `MSG_PEEK` and urgent data, blocking modes shared by duplicates and by fds received over
//! `SCM_RIGHTS`, vectored calls with control data, shutdowns waking parked calls, the edges
//! of `poll`/`select` and of socket timeouts, plain threads on switched fds (spawned from a
//! fiber, restarted by a signal, timed), signals at every thread, a switched socket on the
//! standard streams, the largest timeouts, and a closed stdin.
//!
//! Each test compares what a hooked call does in a fiber with what the C library's own call
//! does on a plain thread (on a fresh fd the hooks never switched, so it is libc's call).
//! Those that install signal handlers, replace the standard streams or must not see another
//! test's descriptors run in a child process.
#![cfg(feature = "hook")]

use std::io::{ErrorKind, Read, Write};
use std::net::{TcpListener, TcpStream, UdpSocket};
use std::os::fd::{AsRawFd, FromRawFd, RawFd};
use std::os::unix::net::{UnixDatagram, UnixStream};
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::common::{both, child_ok, errno, finish, same_as_libc, shared_started, with_deadline};
use fibra::Scheduler;

/// A connected TCP pair on 127.0.0.1 made with real calls on this thread: (client, server).
fn tcp_pair() -> (TcpStream, TcpStream) {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let c = TcpStream::connect(l.local_addr().unwrap()).unwrap();
    let (s, _) = l.accept().unwrap();
    (c, s)
}

// ---------------------------------------------------------------------------------------
// MSG_WAITALL on datagram sockets, MSG_PEEK | MSG_WAITALL
// ---------------------------------------------------------------------------------------

fn udp_waitall() -> (isize, Vec<u8>) {
    let a = UdpSocket::bind("127.0.0.1:0").unwrap();
    let b = UdpSocket::bind("127.0.0.1:0").unwrap();
    let to = b.local_addr().unwrap();
    a.send_to(&[1u8; 10], to).unwrap();
    a.send_to(&[2u8; 10], to).unwrap();
    std::thread::sleep(Duration::from_millis(50));
    let mut buf = [0u8; 20];
    // SAFETY: a live 20-byte buffer.
    let n = unsafe {
        libc::recv(
            b.as_raw_fd(),
            buf.as_mut_ptr().cast(),
            20,
            libc::MSG_WAITALL,
        )
    };
    (n, buf[..n.max(0) as usize].to_vec())
}

/// MSG_WAITALL has no effect on a datagram socket: one recv is one datagram. In a fiber the
/// hook loops "until the whole buffer" and glues two datagrams together.
#[test]
fn msg_waitall_on_udp_returns_one_datagram() {
    with_deadline(|| {
        same_as_libc(udp_waitall, (10, vec![1u8; 10]), "MSG_WAITALL recv on UDP");
    });
}

fn unix_dgram_waitall() -> (isize, Vec<u8>) {
    let (a, b) = UnixDatagram::pair().unwrap();
    a.send(&[1u8; 10]).unwrap();
    a.send(&[2u8; 10]).unwrap();
    let mut buf = [0u8; 20];
    let mut from: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
    let mut len = std::mem::size_of::<libc::sockaddr_storage>() as libc::socklen_t;
    // SAFETY: live buffers of the sizes passed.
    let n = unsafe {
        libc::recvfrom(
            b.as_raw_fd(),
            buf.as_mut_ptr().cast(),
            20,
            libc::MSG_WAITALL,
            (&mut from as *mut libc::sockaddr_storage).cast(),
            &mut len,
        )
    };
    (n, buf[..n.max(0) as usize].to_vec())
}

#[test]
fn msg_waitall_on_unix_datagram_returns_one_datagram() {
    with_deadline(|| {
        same_as_libc(
            unix_dgram_waitall,
            (10, vec![1u8; 10]),
            "MSG_WAITALL recvfrom on a unix datagram socket",
        );
    });
}

fn peek_waitall() -> (isize, Vec<u8>) {
    let (mut c, srv) = tcp_pair();
    c.write_all(b"ab").unwrap();
    let w = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(300));
        c.write_all(b"cd").unwrap();
        c
    });
    crate::common::set_socket_timeout(srv.as_raw_fd(), libc::SO_RCVTIMEO, Duration::from_secs(5));
    let mut buf = [0u8; 4];
    // SAFETY: a live 4-byte buffer.
    let n = unsafe {
        libc::recv(
            srv.as_raw_fd(),
            buf.as_mut_ptr().cast(),
            4,
            libc::MSG_PEEK | libc::MSG_WAITALL,
        )
    };
    let _c = w.join().unwrap();
    (n, buf[..n.max(0) as usize].to_vec())
}

/// recv(MSG_PEEK | MSG_WAITALL) on TCP waits for the whole buffer and peeks "abcd". The hook
/// loops peeking from the start of the queue each time, writing at an offset: "abab".
#[test]
fn msg_peek_with_waitall_does_not_duplicate_bytes() {
    with_deadline(|| {
        same_as_libc(
            peek_waitall,
            (4, b"abcd".to_vec()),
            "recv(MSG_PEEK|MSG_WAITALL)",
        );
    });
}

// ---------------------------------------------------------------------------------------
// Out-of-band data: poll(POLLPRI), select(exceptfds)
// ---------------------------------------------------------------------------------------

/// A connected TCP pair whose client sends one byte of urgent data 200 ms from now, from a
/// thread that returns the client; and the server end.
fn urgent_byte_later() -> (std::thread::JoinHandle<TcpStream>, TcpStream) {
    let (c, srv) = tcp_pair();
    let w = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(200));
        // SAFETY: one byte from a static buffer.
        let r = unsafe { libc::send(c.as_raw_fd(), b"!".as_ptr().cast(), 1, libc::MSG_OOB) };
        assert_eq!(r, 1);
        c
    });
    (w, srv)
}

fn oob_poll() -> (i32, i16, bool) {
    let (w, srv) = urgent_byte_later();
    let mut p = libc::pollfd {
        fd: srv.as_raw_fd(),
        events: libc::POLLPRI,
        revents: 0,
    };
    let t = Instant::now();
    // SAFETY: one live pollfd.
    let r = unsafe { libc::poll(&mut p, 1, 5000) };
    let quick = t.elapsed() < Duration::from_secs(4);
    let _c = w.join().unwrap();
    (r, p.revents & libc::POLLPRI, quick)
}

/// Urgent data makes poll report POLLPRI. The reactor registers fds without EPOLLPRI, so the
/// urgent byte (not readable in-line) never wakes a fiber parked in poll(POLLPRI).
#[test]
fn poll_for_pollpri_sees_urgent_data() {
    with_deadline(|| {
        same_as_libc(
            oob_poll,
            (1, libc::POLLPRI, true),
            "poll(POLLPRI) for TCP urgent data",
        );
    });
}

fn oob_select() -> (i32, bool, bool) {
    let (w, srv) = urgent_byte_later();
    let fd = srv.as_raw_fd();
    let t = Instant::now();
    // SAFETY: fd sets and timeval on the stack; fd < FD_SETSIZE.
    let (r, set) = unsafe {
        let mut ex: libc::fd_set = std::mem::zeroed();
        libc::FD_ZERO(&mut ex);
        libc::FD_SET(fd, &mut ex);
        let mut tv = libc::timeval {
            tv_sec: 5,
            tv_usec: 0,
        };
        let r = libc::select(
            fd + 1,
            std::ptr::null_mut(),
            std::ptr::null_mut(),
            &mut ex,
            &mut tv,
        );
        (r, libc::FD_ISSET(fd, &ex))
    };
    let t_ok = t.elapsed() < Duration::from_secs(4);
    let _c = w.join().unwrap();
    (r, set, t_ok)
}

#[test]
fn select_exceptfds_sees_urgent_data() {
    with_deadline(|| {
        same_as_libc(
            oob_select,
            (1, true, true),
            "select(exceptfds) for TCP urgent data",
        );
    });
}

// ---------------------------------------------------------------------------------------
// The blocking mode is a property of the open file, shared by duplicates
// ---------------------------------------------------------------------------------------

fn dup_then_nonblock_on_copy(touch_first: bool) -> (bool, bool) {
    let (a, b) = UnixStream::pair().unwrap();
    let mut a = a;
    let mut b = b;
    if touch_first {
        b.write_all(b"1").unwrap();
        let mut one = [0u8; 1];
        a.read_exact(&mut one).unwrap();
    }
    let copy = a.try_clone().unwrap();
    copy.set_nonblocking(true).unwrap();
    // SAFETY: F_GETFL on a live fd.
    let shows_nb = unsafe { libc::fcntl(a.as_raw_fd(), libc::F_GETFL) } & libc::O_NONBLOCK != 0;
    // The peer writes late: a blocking read would get it; a non-blocking one fails first.
    let w = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(500));
        let _ = b.write_all(b"2");
        b
    });
    let mut one = [0u8; 1];
    let would_block = matches!(a.read(&mut one), Err(e) if e.kind() == ErrorKind::WouldBlock);
    let _b = w.join().unwrap();
    (shows_nb, would_block)
}

/// O_NONBLOCK set through a duplicate, then cleared through the original: both block.
fn dup_nb_then_blocking_through_original() -> (bool, Result<usize, ErrorKind>) {
    let (mut a, mut b) = UnixStream::pair().unwrap();
    b.write_all(b"1").unwrap();
    let mut one = [0u8; 1];
    a.read_exact(&mut one).unwrap();
    let mut copy = a.try_clone().unwrap();
    copy.set_nonblocking(true).unwrap();
    a.set_nonblocking(false).unwrap();
    // SAFETY: F_GETFL on a live fd.
    let shows_nb = unsafe { libc::fcntl(copy.as_raw_fd(), libc::F_GETFL) } & libc::O_NONBLOCK != 0;
    let w = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(300));
        b.write_all(b"2").unwrap();
        b
    });
    let r = copy.read(&mut one).map_err(|e| e.kind());
    let _b = w.join().unwrap();
    (shows_nb, r)
}

#[test]
fn blocking_mode_set_back_through_the_original_reaches_the_duplicate() {
    with_deadline(|| {
        same_as_libc(
            dup_nb_then_blocking_through_original,
            (false, Ok(1)),
            "O_NONBLOCK on a copy, cleared on the original",
        );
    });
}

fn dup_nb_touched() -> (bool, bool) {
    dup_then_nonblock_on_copy(true)
}

fn dup_nb_fresh() -> (bool, bool) {
    dup_then_nonblock_on_copy(false)
}

/// O_NONBLOCK belongs to the open file description: set through a duplicate (try_clone),
/// the original is non-blocking too, and the hooks' view of it must follow.
#[test]
fn nonblocking_set_on_a_duplicate_applies_to_the_original() {
    with_deadline(|| {
        same_as_libc(
            dup_nb_fresh,
            (true, true),
            "fd not yet switched when duplicated",
        );
        same_as_libc(
            dup_nb_touched,
            (true, true),
            "fd switched before it was duplicated",
        );
    });
}

// ---------------------------------------------------------------------------------------
// Short vectored writes on blocking sockets
// ---------------------------------------------------------------------------------------

const BIG: usize = 8 << 20;

fn vectored(sendmsg: bool) -> (isize, usize) {
    let (c, srv) = tcp_pair();
    let reader = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(200));
        let mut srv = srv;
        let mut total = 0usize;
        let mut buf = vec![0u8; 1 << 16];
        loop {
            match srv.read(&mut buf) {
                Ok(0) | Err(_) => break,
                Ok(n) => total += n,
            }
        }
        total
    });
    let one = vec![7u8; BIG / 2];
    let two = vec![9u8; BIG / 2];
    let iov = [
        libc::iovec {
            iov_base: one.as_ptr() as *mut _,
            iov_len: one.len(),
        },
        libc::iovec {
            iov_base: two.as_ptr() as *mut _,
            iov_len: two.len(),
        },
    ];
    // SAFETY: live iovecs over live buffers.
    let n = unsafe {
        if sendmsg {
            let mut msg: libc::msghdr = std::mem::zeroed();
            msg.msg_iov = iov.as_ptr() as *mut _;
            msg.msg_iovlen = 2;
            libc::sendmsg(c.as_raw_fd(), &msg, 0)
        } else {
            libc::writev(c.as_raw_fd(), iov.as_ptr(), 2)
        }
    };
    drop(c);
    (n, reader.join().unwrap())
}

/// How many fds the control data of `msg` carries (closing them).
///
/// # Safety
/// `msg` was filled by a successful `recvmsg`.
unsafe fn count_fds(msg: &libc::msghdr) -> usize {
    let mut n = 0;
    // SAFETY: walking the control data the kernel wrote, per the caller.
    unsafe {
        let mut c = libc::CMSG_FIRSTHDR(msg);
        while !c.is_null() {
            if (*c).cmsg_level == libc::SOL_SOCKET && (*c).cmsg_type == libc::SCM_RIGHTS {
                let data = (*c).cmsg_len as usize - libc::CMSG_LEN(0) as usize;
                for i in 0..data / std::mem::size_of::<RawFd>() {
                    let p = libc::CMSG_DATA(c).cast::<RawFd>().add(i);
                    libc::close(std::ptr::read_unaligned(p));
                    n += 1;
                }
            }
            c = libc::CMSG_NXTHDR(msg, c);
        }
    }
    n
}

/// The byte at offset `i` of the payloads below.
fn pattern(i: usize) -> u8 {
    (i % 251) as u8
}

/// A 4 MiB `sendmsg` over three buffers (one empty) with an fd in its control data, on a
/// Unix stream a plain thread drains late: (sent, received, fds received, bytes intact).
fn sendmsg_with_an_fd() -> (isize, usize, usize, bool) {
    let (a, b) = UnixStream::pair().unwrap();
    let reader = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(200));
        let mut got = vec![0u8; BIG / 2];
        let mut cbuf = vec![0u8; 256];
        let (mut total, mut fds, mut intact) = (0usize, 0usize, true);
        loop {
            let mut iov = libc::iovec {
                iov_base: got.as_mut_ptr().cast(),
                iov_len: got.len(),
            };
            // SAFETY: an all-zero msghdr, then live buffers.
            let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
            msg.msg_iov = &mut iov;
            msg.msg_iovlen = 1;
            msg.msg_control = cbuf.as_mut_ptr().cast();
            msg.msg_controllen = cbuf.len();
            // SAFETY: as above.
            let n = unsafe { libc::recvmsg(b.as_raw_fd(), &mut msg, libc::MSG_CMSG_CLOEXEC) };
            if n <= 0 {
                break;
            }
            // SAFETY: filled by the recvmsg above.
            fds += unsafe { count_fds(&msg) };
            intact &= (0..n as usize).all(|i| got[i] == pattern(total + i));
            total += n as usize;
        }
        (total, fds, intact)
    });
    let data: Vec<u8> = (0..BIG / 2).map(pattern).collect();
    let (head, tail) = data.split_at(1000);
    let iov = [
        libc::iovec {
            iov_base: head.as_ptr() as *mut _,
            iov_len: head.len(),
        },
        libc::iovec {
            iov_base: std::ptr::null_mut(),
            iov_len: 0,
        },
        libc::iovec {
            iov_base: tail.as_ptr() as *mut _,
            iov_len: tail.len(),
        },
    ];
    let passed = UdpSocket::bind("127.0.0.1:0").unwrap();
    let n = send_with_fd(a.as_raw_fd(), &iov, passed.as_raw_fd());
    drop(a);
    let (total, fds, intact) = reader.join().unwrap();
    (n, total, fds, intact)
}

/// `recvmsg(MSG_WAITALL)` into two buffers on a Unix stream whose peer (a plain thread)
/// sends 1 000 bytes, 200 ms later one byte with an fd, then the rest of 4 MiB. The
/// kernel's receive ends after the part that brought the fd, even with `MSG_WAITALL`:
/// (received, fds, then every byte intact once the rest is read).
fn recvmsg_waitall_with_an_fd() -> (isize, usize, bool) {
    let (a, b) = UnixStream::pair().unwrap();
    let sender = std::thread::spawn(move || {
        let data: Vec<u8> = (0..BIG / 2).map(pattern).collect();
        (&b).write_all(&data[..1000]).unwrap();
        std::thread::sleep(Duration::from_millis(200));
        // `send_fd` sends one byte, 0: the pattern's byte at 1 000 is 1000 % 251.
        send_fd(b.as_raw_fd(), b.as_raw_fd());
        (&b).write_all(&data[1001..]).unwrap();
        b
    });
    let mut one = vec![0u8; 3000];
    let mut two = vec![0u8; BIG / 2 - 3000];
    let mut iov = [
        libc::iovec {
            iov_base: one.as_mut_ptr().cast(),
            iov_len: one.len(),
        },
        libc::iovec {
            iov_base: two.as_mut_ptr().cast(),
            iov_len: two.len(),
        },
    ];
    let mut cbuf = vec![0u8; 256];
    // SAFETY: an all-zero msghdr, then live buffers.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = iov.as_mut_ptr();
    msg.msg_iovlen = 2;
    msg.msg_control = cbuf.as_mut_ptr().cast();
    msg.msg_controllen = cbuf.len();
    // SAFETY: as above.
    let n = unsafe {
        libc::recvmsg(
            a.as_raw_fd(),
            &mut msg,
            libc::MSG_WAITALL | libc::MSG_CMSG_CLOEXEC,
        )
    };
    // SAFETY: filled by the recvmsg above (or untouched, if it failed: no control data).
    let fds = if n > 0 { unsafe { count_fds(&msg) } } else { 0 };
    one.extend_from_slice(&two);
    let mut got = one;
    let done = n.max(0) as usize;
    (&a).read_exact(&mut got[done..]).unwrap();
    drop(sender.join().unwrap());
    got[1000] = pattern(1000); // the fd's byte
    let intact = got.iter().enumerate().all(|(i, &v)| v == pattern(i));
    (n, fds, intact)
}

/// `sendmsg` and `recvmsg` (with and without `MSG_WAITALL`) given a null msghdr, on a socket
/// a fiber has used: (result, errno) of each.
fn null_msghdr() -> Vec<(isize, i32)> {
    let (a, b) = UnixStream::pair().unwrap();
    (&a).write_all(b"x").unwrap();
    (&b).read_exact(&mut [0u8; 1]).unwrap();
    let mut out = Vec::new();
    for call in 0..3 {
        // SAFETY: a null msghdr, which the kernel refuses with EFAULT.
        let r = unsafe {
            match call {
                0 => libc::sendmsg(b.as_raw_fd(), std::ptr::null(), 0),
                1 => libc::recvmsg(b.as_raw_fd(), std::ptr::null_mut(), 0),
                _ => libc::recvmsg(b.as_raw_fd(), std::ptr::null_mut(), libc::MSG_WAITALL),
            }
        };
        out.push((r, if r < 0 { errno() } else { 0 }));
    }
    out
}

#[test]
fn a_null_msghdr_fails_with_efault() {
    with_deadline(|| {
        same_as_libc(
            null_msghdr,
            vec![(-1, libc::EFAULT); 3],
            "sendmsg and recvmsg with a null msghdr",
        );
    });
}

/// Vectored socket calls carrying control data: a 4 MiB `sendmsg` with an fd goes whole,
/// the fd once; a `recvmsg(MSG_WAITALL)` over two buffers waits past a first part and ends,
/// as the kernel's does, with the part that brings an fd.
#[test]
fn vectored_calls_with_control_data_move_everything_and_the_fd_once() {
    with_deadline(|| {
        same_as_libc(
            sendmsg_with_an_fd,
            (BIG as isize / 2, BIG / 2, 1, true),
            "sendmsg",
        );
        same_as_libc(recvmsg_waitall_with_an_fd, (1001, 1, true), "recvmsg");
    });
}

fn vectored_writev() -> (isize, usize) {
    vectored(false)
}

fn vectored_sendmsg() -> (isize, usize) {
    vectored(true)
}

/// A blocking TCP writev/sendmsg returns only when every byte went (tcp_sendmsg waits for
/// room). Hooked, writev and sendmsg return after the first partial write.
#[test]
fn blocking_writev_and_sendmsg_send_everything() {
    with_deadline(|| {
        same_as_libc(
            vectored_writev,
            (BIG as isize, BIG),
            "writev of 8 MiB on a blocking TCP socket",
        );
        same_as_libc(
            vectored_sendmsg,
            (BIG as isize, BIG),
            "sendmsg of 8 MiB on a blocking TCP socket",
        );
    });
}

// ---------------------------------------------------------------------------------------
// shutdown() from another thread wakes a parked call
// ---------------------------------------------------------------------------------------

/// Calls `shutdown(fd, how)` from a plain thread after 200 ms.
fn shutdown_later(fd: RawFd, how: i32) -> std::thread::JoinHandle<()> {
    std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(200));
        // SAFETY: shutting down a socket the caller keeps open until this thread is joined.
        unsafe { libc::shutdown(fd, how) };
    })
}

/// Makes `call` on `fd` (with a 5 s receive timeout) while another thread shuts the socket
/// down `how` soon after: (its result, `errno`, whether it returned well before the timeout).
fn call_while_shut_down(fd: RawFd, how: i32, call: fn(RawFd) -> isize) -> (isize, i32, bool) {
    crate::common::set_socket_timeout(fd, libc::SO_RCVTIMEO, Duration::from_secs(5));
    let t = Instant::now();
    let sh = shutdown_later(fd, how);
    let n = call(fd);
    let e = if n < 0 { errno() } else { 0 };
    let quick = t.elapsed() < Duration::from_secs(4);
    sh.join().unwrap();
    (n, e, quick)
}

fn read8(fd: RawFd) -> isize {
    let mut buf = [0u8; 8];
    // SAFETY: a live buffer.
    unsafe { libc::read(fd, buf.as_mut_ptr().cast(), 8) }
}

fn recv8(fd: RawFd) -> isize {
    let mut buf = [0u8; 8];
    // SAFETY: a live buffer.
    unsafe { libc::recv(fd, buf.as_mut_ptr().cast(), 8, 0) }
}

fn shut_tcp_read() -> (isize, i32, bool) {
    let (_c, srv) = tcp_pair();
    call_while_shut_down(srv.as_raw_fd(), libc::SHUT_RD, read8)
}

fn shut_unix_read() -> (isize, i32, bool) {
    let (a, _b) = UnixStream::pair().unwrap();
    call_while_shut_down(a.as_raw_fd(), libc::SHUT_RD, read8)
}

fn shut_udp_recv() -> (isize, i32, bool) {
    let u = UdpSocket::bind("127.0.0.1:0").unwrap();
    call_while_shut_down(u.as_raw_fd(), libc::SHUT_RD, recv8)
}

fn shut_unix_dgram_recv() -> (isize, i32, bool) {
    let (u, _v) = UnixDatagram::pair().unwrap();
    call_while_shut_down(u.as_raw_fd(), libc::SHUT_RD, recv8)
}

fn shut_accept() -> (isize, i32, bool) {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    call_while_shut_down(l.as_raw_fd(), libc::SHUT_RDWR, |fd| {
        // SAFETY: no address wanted.
        unsafe { libc::accept(fd, std::ptr::null_mut(), std::ptr::null_mut()) as isize }
    })
}

/// The usual way to stop a thread blocked in read/recv/accept: shutdown() the socket from
/// another thread. The kernel wakes the blocked call (read: 0; accept: EINVAL).
#[test]
fn shutdown_from_another_thread_wakes_parked_calls() {
    with_deadline(|| {
        let mut bad = Vec::new();
        for (what, f) in [
            (
                "tcp read after SHUT_RD",
                shut_tcp_read as fn() -> (isize, i32, bool),
            ),
            ("unix read after SHUT_RD", shut_unix_read),
            ("udp recv after SHUT_RD", shut_udp_recv),
            ("unix datagram recv after SHUT_RD", shut_unix_dgram_recv),
            ("accept after SHUT_RDWR of the listener", shut_accept),
        ] {
            let (fib, plain) = both(f);
            assert!(plain.2, "libc's reference for {what}: {plain:?}");
            if fib != plain {
                bad.push(format!("{what}: fiber {fib:?}, libc {plain:?}"));
            }
        }
        assert!(bad.is_empty(), "(result, errno, woke within 4 s): {bad:#?}");
    });
}

// ---------------------------------------------------------------------------------------
// A descriptor of a switched socket received over SCM_RIGHTS
// ---------------------------------------------------------------------------------------

fn send_fd(sock: RawFd, fd: RawFd) {
    let mut byte = [0u8; 1];
    let iov = [libc::iovec {
        iov_base: byte.as_mut_ptr().cast(),
        iov_len: 1,
    }];
    assert_eq!(send_with_fd(sock, &iov, fd), 1);
}

/// `sendmsg` of the buffers `iov` with `fd` in one SCM_RIGHTS message.
fn send_with_fd(sock: RawFd, iov: &[libc::iovec], fd: RawFd) -> isize {
    // SAFETY: a msghdr over the caller's live buffers and a control buffer sized for one fd.
    unsafe {
        let space = libc::CMSG_SPACE(std::mem::size_of::<RawFd>() as u32) as usize;
        let mut cbuf = vec![0u8; space];
        let mut msg: libc::msghdr = std::mem::zeroed();
        msg.msg_iov = iov.as_ptr().cast_mut();
        msg.msg_iovlen = iov.len();
        msg.msg_control = cbuf.as_mut_ptr().cast();
        msg.msg_controllen = space;
        let c = libc::CMSG_FIRSTHDR(&msg);
        (*c).cmsg_level = libc::SOL_SOCKET;
        (*c).cmsg_type = libc::SCM_RIGHTS;
        (*c).cmsg_len = libc::CMSG_LEN(std::mem::size_of::<RawFd>() as u32) as usize;
        std::ptr::write_unaligned(libc::CMSG_DATA(c).cast::<RawFd>(), fd);
        libc::sendmsg(sock, &msg, 0)
    }
}

fn recv_fd(sock: RawFd) -> RawFd {
    // SAFETY: as in `send_fd`.
    unsafe {
        let mut byte = [0u8; 1];
        let mut iov = libc::iovec {
            iov_base: byte.as_mut_ptr().cast(),
            iov_len: 1,
        };
        let space = libc::CMSG_SPACE(std::mem::size_of::<RawFd>() as u32) as usize;
        let mut cbuf = vec![0u8; space];
        let mut msg: libc::msghdr = std::mem::zeroed();
        msg.msg_iov = &mut iov;
        msg.msg_iovlen = 1;
        msg.msg_control = cbuf.as_mut_ptr().cast();
        msg.msg_controllen = space;
        assert_eq!(libc::recvmsg(sock, &mut msg, libc::MSG_CMSG_CLOEXEC), 1);
        let c = libc::CMSG_FIRSTHDR(&msg);
        assert!(!c.is_null());
        std::ptr::read_unaligned(libc::CMSG_DATA(c).cast::<RawFd>())
    }
}

fn passed_fd_read() -> (bool, Result<usize, ErrorKind>) {
    let (mut x, mut y) = UnixStream::pair().unwrap();
    // Use x once (in a fiber this switches it).
    y.write_all(b"1").unwrap();
    let mut one = [0u8; 1];
    x.read_exact(&mut one).unwrap();
    read_a_received_copy(x, y)
}

/// Sends `r` to this very process over a Unix socket and reads the received copy while the
/// peer `w` writes a byte 300 ms later: whether the copy shows O_NONBLOCK, and the read.
fn read_a_received_copy<R, W>(r: R, mut w: W) -> (bool, Result<usize, ErrorKind>)
where
    R: AsRawFd,
    W: Write + Send + 'static,
{
    let (s1, s2) = UnixStream::pair().unwrap();
    send_fd(s1.as_raw_fd(), r.as_raw_fd());
    let got = recv_fd(s2.as_raw_fd());
    // SAFETY: a fresh fd we own.
    let mut copy = unsafe { std::fs::File::from_raw_fd(got) };
    // SAFETY: F_GETFL on a live fd.
    let shows_nb = unsafe { libc::fcntl(got, libc::F_GETFL) } & libc::O_NONBLOCK != 0;
    let t = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(300));
        w.write_all(b"2").unwrap();
        w
    });
    let mut one = [0u8; 1];
    let res = copy.read(&mut one).map_err(|e| e.kind());
    let _w = t.join().unwrap();
    drop(r);
    (shows_nb, res)
}

/// A descriptor received over a Unix socket (here: from this very process) shares the open
/// file of one the hooks switched: the user never asked for O_NONBLOCK, so F_GETFL must not
/// show it and a read must block (it failed with EAGAIN when the view was per fd number).
#[test]
fn an_fd_received_over_scm_rights_keeps_blocking_semantics() {
    with_deadline(|| {
        same_as_libc(
            passed_fd_read,
            (false, Ok(1)),
            "read of a received copy of a switched socket",
        );
    });
}

/// A pipe's read end, switched (a fiber wrote and read a byte, switching both ends: they
/// share one inode but are two open files), received over a Unix socket: it keeps blocking.
fn passed_pipe_read() -> (bool, Result<usize, ErrorKind>) {
    let mut fds = [0; 2];
    // SAFETY: a live array of two fds.
    assert_eq!(unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) }, 0);
    // SAFETY: fresh fds we own.
    let (mut r, mut w) = unsafe {
        (
            std::fs::File::from_raw_fd(fds[0]),
            std::fs::File::from_raw_fd(fds[1]),
        )
    };
    w.write_all(b"1").unwrap();
    let mut one = [0u8; 1];
    r.read_exact(&mut one).unwrap();
    read_a_received_copy(r, w)
}

#[test]
fn a_pipe_end_received_over_scm_rights_keeps_blocking_semantics() {
    with_deadline(|| {
        same_as_libc(
            passed_pipe_read,
            (false, Ok(1)),
            "read of a received copy of a switched pipe end",
        );
    });
}

/// Every eventfd shares one anonymous inode: a received eventfd that its creator made
/// non-blocking must not take the blocking view of another, switched, eventfd.
fn passed_nonblocking_eventfd() -> (bool, i32) {
    // SAFETY: plain system calls on fds this function owns.
    unsafe {
        let a = libc::eventfd(0, libc::EFD_CLOEXEC);
        let v: u64 = 1;
        assert_eq!(libc::write(a, (&v as *const u64).cast(), 8), 8);
        let mut got: u64 = 0;
        assert_eq!(libc::read(a, (&mut got as *mut u64).cast(), 8), 8);
        let b = libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK);
        let (s1, s2) = UnixStream::pair().unwrap();
        send_fd(s1.as_raw_fd(), b);
        let b2 = recv_fd(s2.as_raw_fd());
        let shows_nb = libc::fcntl(b2, libc::F_GETFL) & libc::O_NONBLOCK != 0;
        let r = libc::read(b2, (&mut got as *mut u64).cast(), 8);
        let e = if r < 0 { errno() } else { 0 };
        for fd in [a, b, b2] {
            libc::close(fd);
        }
        (shows_nb, e)
    }
}

#[test]
fn a_received_nonblocking_eventfd_keeps_its_own_mode() {
    with_deadline(|| {
        same_as_libc(
            passed_nonblocking_eventfd,
            (true, libc::EAGAIN),
            "read of a received non-blocking eventfd beside a switched one",
        );
    });
}

// ---------------------------------------------------------------------------------------
// pipes, eventfd, timerfd, FIFOs between fibers of one worker
// ---------------------------------------------------------------------------------------

#[test]
fn eventfd_timerfd_and_fifo_park_only_the_fiber() {
    with_deadline(|| {
        let s = shared_started(1);
        let dir = std::env::temp_dir().join(format!("fibra_r4b_fifo_{}", std::process::id()));
        let _ = std::fs::remove_file(&dir);
        let c = std::ffi::CString::new(dir.to_str().unwrap()).unwrap();
        // SAFETY: a NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
        let path = dir.clone();
        let r = s.block_on(move || {
            // eventfd: a reader parks, a writer fiber of the same worker wakes it.
            // SAFETY: plain system call.
            let efd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC) };
            assert!(efd >= 0);
            let w = fibra::spawn(move || {
                std::thread::sleep(Duration::from_millis(50));
                let v: u64 = 5;
                // SAFETY: 8 bytes from a live u64.
                unsafe { libc::write(efd, (&v as *const u64).cast(), 8) }
            });
            let mut v: u64 = 0;
            // SAFETY: 8 bytes into a live u64.
            let n = unsafe { libc::read(efd, (&mut v as *mut u64).cast(), 8) };
            assert_eq!((n, w.join().unwrap()), (8, 8));
            assert_eq!(v, 5);
            // SAFETY: our fd.
            unsafe { libc::close(efd) };

            // timerfd: read parks until expiry while another fiber ticks. On this one worker
            // the ticker can run while the read is in progress only if the read parked the
            // fiber rather than blocking the thread; a tick counts only then. (Armed just
            // before the read, the timer could still expire first if the machine stalled this
            // thread for its whole 200 ms: then the read does not wait and the check is made
            // again.)
            // SAFETY: plain system calls.
            let tfd = unsafe { libc::timerfd_create(libc::CLOCK_MONOTONIC, libc::TFD_CLOEXEC) };
            assert!(tfd >= 0);
            let reading = Arc::new(AtomicBool::new(false));
            let ticks_while_reading = Arc::new(AtomicUsize::new(0));
            let stop = Arc::new(AtomicBool::new(false));
            let (r2, t2, s2) = (reading.clone(), ticks_while_reading.clone(), stop.clone());
            let ticker = fibra::spawn(move || {
                while !s2.load(Ordering::Relaxed) {
                    if r2.load(Ordering::Relaxed) {
                        t2.fetch_add(1, Ordering::Relaxed);
                    }
                    fibra::sleep(Duration::from_millis(2));
                }
            });
            for _ in 0..5 {
                let spec = libc::itimerspec {
                    it_interval: libc::timespec {
                        tv_sec: 0,
                        tv_nsec: 0,
                    },
                    it_value: libc::timespec {
                        tv_sec: 0,
                        tv_nsec: 200_000_000,
                    },
                };
                reading.store(true, Ordering::Relaxed);
                // SAFETY: a live itimerspec.
                assert_eq!(
                    unsafe { libc::timerfd_settime(tfd, 0, &spec, std::ptr::null_mut()) },
                    0
                );
                let mut exp: u64 = 0;
                // SAFETY: 8 bytes into a live u64.
                let n = unsafe { libc::read(tfd, (&mut exp as *mut u64).cast(), 8) };
                reading.store(false, Ordering::Relaxed);
                assert_eq!((n, exp), (8, 1));
                if ticks_while_reading.load(Ordering::Relaxed) > 0 {
                    break;
                }
            }
            stop.store(true, Ordering::Relaxed);
            ticker.join().unwrap();
            assert!(
                ticks_while_reading.load(Ordering::Relaxed) > 0,
                "the worker was blocked by a timerfd read"
            );
            // SAFETY: our fd.
            unsafe { libc::close(tfd) };

            // A FIFO opened read-write (open never blocks then): a reader fiber parks.
            let mut f = std::fs::OpenOptions::new()
                .read(true)
                .write(true)
                .open(&path)
                .unwrap();
            let mut f2 = f.try_clone().unwrap();
            let w = fibra::spawn(move || {
                std::thread::sleep(Duration::from_millis(50));
                f2.write_all(b"fifo").unwrap();
            });
            let mut buf = [0u8; 4];
            f.read_exact(&mut buf).unwrap();
            w.join().unwrap();
            buf
        });
        assert_eq!(&r, b"fifo");
        let _ = std::fs::remove_file(&dir);
        s.stop();
    });
}

// ---------------------------------------------------------------------------------------
// Child processes with piped stdin and stdout, from many fibers at once
// ---------------------------------------------------------------------------------------

#[test]
fn cat_with_piped_stdin_and_stdout_in_many_fibers() {
    with_deadline(|| {
        let s = shared_started(2);
        let hs: Vec<_> = (0..16)
            .map(|i| {
                s.submit(
                    move || {
                        let mut child = std::process::Command::new("cat")
                            .stdin(std::process::Stdio::piped())
                            .stdout(std::process::Stdio::piped())
                            .spawn()
                            .unwrap();
                        let mut stdin = child.stdin.take().unwrap();
                        let data: Vec<u8> = (0..(256 * 1024)).map(|k| (k * 7 + i) as u8).collect();
                        let d2 = data.clone();
                        // More than a pipe holds both ways: writer and reader must overlap.
                        let w = fibra::spawn(move || {
                            stdin.write_all(&d2).unwrap();
                        });
                        let mut out = Vec::new();
                        child.stdout.take().unwrap().read_to_end(&mut out).unwrap();
                        w.join().unwrap();
                        let st = child.wait().unwrap();
                        (st.success(), out == data)
                    },
                    None,
                )
                .unwrap()
            })
            .collect();
        for h in hs {
            assert_eq!(finish(h), (true, true));
        }
        s.stop();
    });
}

// ---------------------------------------------------------------------------------------
// poll / select called directly
// ---------------------------------------------------------------------------------------

fn poll_no_events_hup() -> (i32, i16, bool) {
    let (a, b) = UnixStream::pair().unwrap();
    let w = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(200));
        drop(b);
    });
    let mut p = libc::pollfd {
        fd: a.as_raw_fd(),
        events: 0,
        revents: 0,
    };
    let t = Instant::now();
    // SAFETY: one live pollfd.
    let r = unsafe { libc::poll(&mut p, 1, 5000) };
    let quick = t.elapsed() < Duration::from_secs(4);
    w.join().unwrap();
    (r, p.revents & (libc::POLLHUP | libc::POLLERR), quick)
}

/// poll with events == 0 still reports POLLHUP/POLLERR.
#[test]
fn poll_with_no_events_reports_a_hangup() {
    with_deadline(|| {
        let (fib, plain) = both(poll_no_events_hup);
        assert_eq!(plain.0, 1, "libc's reference {plain:?}");
        assert_eq!(
            fib, plain,
            "fiber: poll(events = 0) until the peer hangs up"
        );
    });
}

/// `select` for reading on `fds` (each below FD_SETSIZE) with a timeout of `secs` seconds.
fn select_readable(fds: &[RawFd], secs: libc::time_t) -> i32 {
    let n = fds.iter().max().map_or(0, |&fd| fd + 1);
    // SAFETY: an fd set and a timeval on the stack; every fd is below FD_SETSIZE.
    unsafe {
        let mut rd: libc::fd_set = std::mem::zeroed();
        libc::FD_ZERO(&mut rd);
        for &fd in fds {
            libc::FD_SET(fd, &mut rd);
        }
        let mut tv = libc::timeval {
            tv_sec: secs,
            tv_usec: 0,
        };
        libc::select(
            n,
            &mut rd,
            std::ptr::null_mut(),
            std::ptr::null_mut(),
            &mut tv,
        )
    }
}

fn select_bad_fd() -> (i32, i32, bool) {
    let (a, _b) = UnixStream::pair().unwrap();
    // In a fiber the select registers its fds with the reactor, whose first registration
    // opens the reactor's own fds, at the lowest free numbers: make it exist first.
    let _ = fibra::io::wait_writable(a.as_raw_fd(), Some(Duration::ZERO));
    let (c, _d) = UnixStream::pair().unwrap();
    // Closed, and in a child process so that no test beside this one reuses its number
    // (select ignores fds past the fd table's size, so a high unused number will not do).
    let bad = c.as_raw_fd();
    drop(c);
    let t = Instant::now();
    let r = select_readable(&[a.as_raw_fd(), bad], 5);
    let e = if r < 0 { errno() } else { 0 };
    (r, e, t.elapsed() < Duration::from_secs(4))
}

#[test]
fn select_with_a_closed_fd_fails_with_ebadf_at_once() {
    child_ok(|| {
        with_deadline(|| {
            same_as_libc(
                select_bad_fd,
                (-1, libc::EBADF, true),
                "select with a closed fd",
            );
        });
    });
}

fn ppoll_and_poll_edge_timeouts() -> Vec<(i32, i16)> {
    let (a, b) = UnixStream::pair().unwrap();
    let mut out = Vec::new();
    // Zero timeout, nothing ready.
    let mut p = [libc::pollfd {
        fd: a.as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    }];
    // SAFETY: live pollfds.
    out.push((unsafe { libc::poll(p.as_mut_ptr(), 1, 0) }, p[0].revents));
    // -1 with an invalid fd and a ready fd mixed in: at once.
    (&b).write_all(b"x").unwrap();
    let mut p = [
        libc::pollfd {
            fd: 1_000_000,
            events: libc::POLLIN,
            revents: 0,
        },
        libc::pollfd {
            fd: -1,
            events: libc::POLLIN,
            revents: 0,
        },
        libc::pollfd {
            fd: a.as_raw_fd(),
            events: libc::POLLIN | libc::POLLOUT,
            revents: 0,
        },
    ];
    // SAFETY: live pollfds.
    let r = unsafe { libc::poll(p.as_mut_ptr(), 3, -1) };
    out.push((r, p[0].revents));
    out.push((r, p[1].revents));
    out.push((r, p[2].revents));
    // ppoll with a tiny timeout and nothing ready (read the byte first).
    let mut one = [0u8; 1];
    (&a).read_exact(&mut one).unwrap();
    let ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 1,
    };
    let mut p = [libc::pollfd {
        fd: a.as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    }];
    // SAFETY: live pollfds and timespec.
    out.push((
        unsafe { libc::ppoll(p.as_mut_ptr(), 1, &ts, std::ptr::null()) },
        p[0].revents,
    ));
    // ppoll with an invalid timespec: EINVAL.
    let ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 2_000_000_000,
    };
    // SAFETY: as above.
    let r = unsafe { libc::ppoll(p.as_mut_ptr(), 1, &ts, std::ptr::null()) };
    out.push((r, errno() as i16));
    drop(b);
    out
}

#[test]
fn poll_and_ppoll_edge_timeouts_match_libc() {
    with_deadline(|| {
        let (fib, plain) = both(ppoll_and_poll_edge_timeouts);
        assert_eq!(fib, plain);
    });
}

// ---------------------------------------------------------------------------------------
// getaddrinfo from many fibers
// ---------------------------------------------------------------------------------------

#[test]
fn getaddrinfo_localhost_from_300_fibers_on_one_worker() {
    use std::net::ToSocketAddrs;
    with_deadline(|| {
        let s = shared_started(1);
        let hs: Vec<_> = (0..300)
            .map(|i| {
                s.submit(
                    move || {
                        let addrs: Vec<_> = ("localhost", 1000 + i as u16)
                            .to_socket_addrs()
                            .unwrap()
                            .collect();
                        addrs
                            .iter()
                            .any(|a| a.ip().is_loopback() && a.port() == 1000 + i as u16)
                    },
                    None,
                )
                .unwrap()
            })
            .collect();
        for h in hs {
            assert!(finish(h));
        }
        s.stop();
    });
}

// ---------------------------------------------------------------------------------------
// Socket timeouts
// ---------------------------------------------------------------------------------------

fn sndtimeo_partial() -> (bool, bool, i32) {
    let (c, _srv) = tcp_pair();
    crate::common::set_socket_timeout(c.as_raw_fd(), libc::SO_SNDTIMEO, Duration::from_millis(300));
    let big = vec![1u8; 64 << 20];
    let t = Instant::now();
    // SAFETY: a live buffer.
    let n = unsafe { libc::write(c.as_raw_fd(), big.as_ptr().cast(), big.len()) };
    let e = if n < 0 { errno() } else { 0 };
    let took = t.elapsed();
    // Partial count, after roughly the timeout.
    (
        n > 0 && (n as usize) < big.len(),
        took >= Duration::from_millis(250) && took < Duration::from_secs(5),
        e,
    )
}

fn rcvtimeo_accept_and_udp() -> Vec<(i32, bool)> {
    let mut out = Vec::new();
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    l.set_read_timeout_compat(Duration::from_millis(200));
    let t = Instant::now();
    // SAFETY: no address wanted.
    let r = unsafe { libc::accept(l.as_raw_fd(), std::ptr::null_mut(), std::ptr::null_mut()) };
    let e = if r < 0 { errno() } else { 0 };
    let took = t.elapsed();
    out.push((
        e,
        took >= Duration::from_millis(150) && took < Duration::from_secs(5),
    ));
    let u = UdpSocket::bind("127.0.0.1:0").unwrap();
    u.set_read_timeout(Some(Duration::from_millis(200)))
        .unwrap();
    let t = Instant::now();
    let mut buf = [0u8; 4];
    let r = u
        .recv_from(&mut buf)
        .map(|_| 0)
        .unwrap_or_else(|e| e.raw_os_error().unwrap());
    let took = t.elapsed();
    out.push((
        r,
        took >= Duration::from_millis(150) && took < Duration::from_secs(5),
    ));
    // The smallest timeout: 1 µs.
    u.set_read_timeout(Some(Duration::from_micros(1))).unwrap();
    let t = Instant::now();
    let r = u
        .recv_from(&mut buf)
        .map(|_| 0)
        .unwrap_or_else(|e| e.raw_os_error().unwrap());
    out.push((r, t.elapsed() < Duration::from_secs(2)));
    out
}

trait ListenerTimeout {
    fn set_read_timeout_compat(&self, d: Duration);
}
impl ListenerTimeout for TcpListener {
    fn set_read_timeout_compat(&self, d: Duration) {
        crate::common::set_socket_timeout(self.as_raw_fd(), libc::SO_RCVTIMEO, d);
    }
}

#[test]
fn socket_timeouts_on_write_accept_and_udp_match_libc() {
    with_deadline(|| {
        same_as_libc(sndtimeo_partial, (true, true, 0), "write with SO_SNDTIMEO");
        let (fib, plain) = both(rcvtimeo_accept_and_udp);
        assert_eq!(
            plain,
            vec![
                (libc::EAGAIN, true),
                (libc::EAGAIN, true),
                (libc::EAGAIN, true)
            ],
            "libc's reference"
        );
        assert_eq!(fib, plain, "fiber: SO_RCVTIMEO on accept and UDP");
    });
}

fn listener_nonblocking_toggle() -> (ErrorKind, bool, bool) {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    l.set_nonblocking(true).unwrap();
    let t = Instant::now();
    let k = l.accept().map(|_| ErrorKind::Other).unwrap_err().kind();
    let quick = t.elapsed() < Duration::from_secs(1);
    l.set_nonblocking(false).unwrap();
    let c = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(100));
        TcpStream::connect(addr).unwrap()
    });
    let (acc, _) = l.accept().unwrap();
    let _c = c.join().unwrap();
    // SAFETY: F_GETFL on a live fd.
    let acc_nb = unsafe { libc::fcntl(acc.as_raw_fd(), libc::F_GETFL) } & libc::O_NONBLOCK != 0;
    (k, quick, acc_nb)
}

#[test]
fn listener_nonblocking_toggle_matches_libc() {
    with_deadline(|| {
        let (fib, plain) = both(listener_nonblocking_toggle);
        assert_eq!(
            plain,
            (ErrorKind::WouldBlock, true, false),
            "libc's reference"
        );
        assert_eq!(fib, plain);
    });
}

// ---------------------------------------------------------------------------------------
// A plain thread spawned from inside a fiber is a plain thread
// ---------------------------------------------------------------------------------------

#[test]
fn a_thread_spawned_from_a_fiber_gets_libc_semantics_on_switched_fds() {
    with_deadline(|| {
        let s = shared_started(1);
        let r = s.block_on(|| {
            let (a, b) = UnixStream::pair().unwrap();
            // Switch `a` in the fiber.
            (&b).write_all(b"1").unwrap();
            let mut one = [0u8; 1];
            (&a).read_exact(&mut one).unwrap();
            let a = Arc::new(a);
            let a2 = a.clone();
            let t = std::thread::spawn(move || {
                assert!(!fibra::hook::is_active());
                let mut one = [0u8; 1];
                // Blocking: waits for the late byte.
                let n = (&*a2).read(&mut one).unwrap();
                // Timeout honoured.
                a2.set_read_timeout(Some(Duration::from_millis(100)))
                    .unwrap();
                let t = Instant::now();
                let k = (&*a2).read(&mut one).unwrap_err().kind();
                let took = t.elapsed();
                a2.set_read_timeout(None).unwrap();
                // Non-blocking honoured.
                a2.set_nonblocking(true).unwrap();
                let k2 = (&*a2).read(&mut one).unwrap_err().kind();
                a2.set_nonblocking(false).unwrap();
                (n, k, took >= Duration::from_millis(90), k2)
            });
            std::thread::sleep(Duration::from_millis(100)); // parks the fiber
            (&b).write_all(b"2").unwrap();
            let r = loop {
                if t.is_finished() {
                    break t.join().unwrap();
                }
                std::thread::sleep(Duration::from_millis(5));
            };
            drop(b);
            r
        });
        assert_eq!(r, (1, ErrorKind::WouldBlock, true, ErrorKind::WouldBlock));
        s.stop();
    });
}

// ---------------------------------------------------------------------------------------
// Signals (in child processes: handlers are process-wide)
// ---------------------------------------------------------------------------------------

extern "C" fn on_signal(_: libc::c_int) {}

/// Signals without SA_RESTART rain on every thread (workers included) while fibers park in
/// all kinds of hooked calls: each call completes as if no signal came, and no worker
/// stalls or dies.
#[test]
fn signals_at_every_thread_while_fibers_park_in_hooked_calls() {
    child_ok(|| {
        crate::common::install_signal(libc::SIGUSR1, false, on_signal);
        let s = shared_started(2);
        let stop = Arc::new(AtomicBool::new(false));
        let st = stop.clone();
        let signaller = std::thread::spawn(move || {
            let mut sent = 0usize;
            while !st.load(Ordering::Relaxed) {
                crate::common::signal_other_threads(libc::SIGUSR1);
                sent += 1;
                // A raw nanosleep: unhooked and restarted by hand.
                crate::common::block_thread(Duration::from_micros(300));
            }
            sent
        });
        let hs: Vec<_> = (0..60)
            .map(|i| {
                s.submit(
                    move || -> Result<(), String> {
                        for round in 0..5 {
                            match i % 7 {
                                0 => {
                                    let ts = libc::timespec {
                                        tv_sec: 0,
                                        tv_nsec: 20_000_000,
                                    };
                                    let mut rem = libc::timespec {
                                        tv_sec: 9,
                                        tv_nsec: 9,
                                    };
                                    let t = Instant::now();
                                    // SAFETY: live timespecs.
                                    let r = unsafe { libc::nanosleep(&ts, &mut rem) };
                                    if r != 0 || t.elapsed() < Duration::from_millis(19) {
                                        return Err(format!(
                                            "nanosleep {r} errno {} after {:?}",
                                            errno(),
                                            t.elapsed()
                                        ));
                                    }
                                }
                                1 => {
                                    let (a, b) = UnixStream::pair().unwrap();
                                    let w = fibra::spawn(move || {
                                        std::thread::sleep(Duration::from_millis(15));
                                        (&b).write_all(b"z").unwrap();
                                        b
                                    });
                                    let mut one = [0u8; 1];
                                    // SAFETY: a live buffer.
                                    let n = unsafe {
                                        libc::read(a.as_raw_fd(), one.as_mut_ptr().cast(), 1)
                                    };
                                    let e = errno();
                                    drop(w.join().unwrap());
                                    if n != 1 {
                                        return Err(format!("read {n} errno {e}"));
                                    }
                                }
                                2 => {
                                    let l = TcpListener::bind("127.0.0.1:0").unwrap();
                                    let addr = l.local_addr().unwrap();
                                    let c = fibra::spawn(move || {
                                        std::thread::sleep(Duration::from_millis(15));
                                        TcpStream::connect(addr).map_err(|e| e.to_string())
                                    });
                                    // SAFETY: no address wanted.
                                    let fd = unsafe {
                                        libc::accept(
                                            l.as_raw_fd(),
                                            std::ptr::null_mut(),
                                            std::ptr::null_mut(),
                                        )
                                    };
                                    let e = errno();
                                    let cr = c.join().unwrap();
                                    if fd < 0 {
                                        return Err(format!("accept errno {e}"));
                                    }
                                    // SAFETY: ours.
                                    unsafe { libc::close(fd) };
                                    cr?;
                                }
                                3 => {
                                    let (a, b) = UnixStream::pair().unwrap();
                                    let w = fibra::spawn(move || {
                                        std::thread::sleep(Duration::from_millis(15));
                                        (&b).write_all(b"z").unwrap();
                                        b
                                    });
                                    let mut p = libc::pollfd {
                                        fd: a.as_raw_fd(),
                                        events: libc::POLLIN,
                                        revents: 0,
                                    };
                                    // SAFETY: one live pollfd.
                                    let r = unsafe { libc::poll(&mut p, 1, -1) };
                                    let e = errno();
                                    drop(w.join().unwrap());
                                    if r != 1 {
                                        return Err(format!("poll {r} errno {e}"));
                                    }
                                }
                                4 => {
                                    let u = UdpSocket::bind("127.0.0.1:0").unwrap();
                                    let to = u.local_addr().unwrap();
                                    let w = fibra::spawn(move || {
                                        std::thread::sleep(Duration::from_millis(15));
                                        let v = UdpSocket::bind("127.0.0.1:0").unwrap();
                                        v.send_to(b"dg", to).unwrap();
                                    });
                                    let mut buf = [0u8; 8];
                                    let r = u.recv_from(&mut buf).map_err(|e| e.to_string());
                                    w.join().unwrap();
                                    if r?.0 != 2 {
                                        return Err("short datagram".into());
                                    }
                                }
                                5 => {
                                    use std::net::ToSocketAddrs;
                                    let n = ("localhost", 80)
                                        .to_socket_addrs()
                                        .map_err(|e| e.to_string())?
                                        .count();
                                    if n == 0 {
                                        return Err("no address for localhost".into());
                                    }
                                }
                                _ => {
                                    let (a, b) = UnixStream::pair().unwrap();
                                    let w = fibra::spawn(move || {
                                        std::thread::sleep(Duration::from_millis(15));
                                        (&b).write_all(b"z").unwrap();
                                        b
                                    });
                                    let fd = a.as_raw_fd();
                                    let r = select_readable(&[fd], 10);
                                    let e = errno();
                                    drop(w.join().unwrap());
                                    if r != 1 {
                                        return Err(format!("select {r} errno {e} round {round}"));
                                    }
                                }
                            }
                        }
                        Ok(())
                    },
                    None,
                )
                .unwrap()
            })
            .collect();
        let mut errs = Vec::new();
        for (i, h) in hs.into_iter().enumerate() {
            if let Err(e) = finish(h) {
                errs.push(format!("fiber {i}: {e}"));
            }
        }
        stop.store(true, Ordering::Relaxed);
        let sent = signaller.join().unwrap();
        assert!(errs.is_empty(), "{errs:#?}");
        assert!(sent > 10, "only {sent} signal rounds");
        s.stop();
    });
}

/// On a plain thread (one spawned from main, one spawned from inside a fiber) every hooked
/// function is libc's: a signal without SA_RESTART interrupts it with EINTR, nanosleep
/// reports the time left, sleep() the seconds left.
#[test]
fn plain_threads_see_eintr_as_in_libc() {
    child_ok(|| {
        crate::common::install_signal(libc::SIGUSR1, false, on_signal);
        let s = shared_started(1);
        let tid = Arc::new(AtomicI32::new(0));
        let done = Arc::new(AtomicBool::new(false));
        let run_on = |spawn_in_fiber: bool| -> Vec<String> {
            tid.store(0, Ordering::SeqCst);
            done.store(false, Ordering::SeqCst);
            let (t2, d2) = (tid.clone(), done.clone());
            let body = move || {
                t2.store(crate::common::gettid(), Ordering::SeqCst);
                let r = eintr_battery();
                d2.store(true, Ordering::SeqCst);
                r
            };
            let th = if spawn_in_fiber {
                s.block_on(move || std::thread::spawn(body))
            } else {
                std::thread::spawn(body)
            };
            while tid.load(Ordering::SeqCst) == 0 {
                std::thread::yield_now();
            }
            while !done.load(Ordering::SeqCst) {
                crate::common::block_thread(Duration::from_millis(100));
                crate::common::tgkill(tid.load(Ordering::SeqCst), libc::SIGUSR1);
            }
            th.join().unwrap()
        };
        let a = run_on(false);
        let b = run_on(true);
        assert!(
            a.is_empty() && b.is_empty(),
            "from main: {a:?}; from a fiber: {b:?}"
        );
        s.stop();
    });
}

fn eintr_battery() -> Vec<String> {
    let mut bad = Vec::new();
    // nanosleep
    let ts = libc::timespec {
        tv_sec: 3,
        tv_nsec: 0,
    };
    let mut rem = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: live timespecs.
    let r = unsafe { libc::nanosleep(&ts, &mut rem) };
    let e = errno();
    if r != -1 || e != libc::EINTR || rem.tv_sec > 3 || (rem.tv_sec == 0 && rem.tv_nsec == 0) {
        bad.push(format!(
            "nanosleep: {r} errno {e} rem {}.{:09}",
            rem.tv_sec, rem.tv_nsec
        ));
    }
    // clock_nanosleep returns the error
    // SAFETY: live timespecs.
    let r = unsafe { libc::clock_nanosleep(libc::CLOCK_MONOTONIC, 0, &ts, &mut rem) };
    if r != libc::EINTR {
        bad.push(format!("clock_nanosleep: {r}"));
    }
    // sleep returns the seconds left
    // SAFETY: no pointers.
    let left = unsafe { libc::sleep(3) };
    if left == 0 {
        bad.push("sleep(3) returned 0 though interrupted".into());
    }
    // poll
    let (a, _b) = UnixStream::pair().unwrap();
    let mut p = libc::pollfd {
        fd: a.as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one live pollfd.
    let r = unsafe { libc::poll(&mut p, 1, 3000) };
    let e = errno();
    if r != -1 || e != libc::EINTR {
        bad.push(format!("poll: {r} errno {e}"));
    }
    // read on a fresh (unswitched) socket
    let mut one = [0u8; 1];
    // SAFETY: a live buffer.
    let r = unsafe { libc::read(a.as_raw_fd(), one.as_mut_ptr().cast(), 1) };
    let e = errno();
    if r != -1 || e != libc::EINTR {
        bad.push(format!("read: {r} errno {e}"));
    }
    // accept on a fresh listener
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    // SAFETY: no address wanted.
    let r = unsafe { libc::accept(l.as_raw_fd(), std::ptr::null_mut(), std::ptr::null_mut()) };
    let e = errno();
    if r != -1 || e != libc::EINTR {
        bad.push(format!("accept: {r} errno {e}"));
    }
    bad
}

/// Writes "ping" on `a` from a fiber of `s`, which switches its open file to O_NONBLOCK
/// (while a plain thread is blocked in a real read on it).
fn switch_from_a_fiber(s: &Scheduler, a: &Arc<UnixStream>) {
    let a = a.clone();
    let h = s
        .submit(move || (&*a).write_all(b"ping").map_err(|e| e.kind()), None)
        .unwrap();
    assert_eq!(finish(h), Ok(()));
}

/// A plain thread is blocked in a real read on a socket (the hooks never touched it); then
/// a fiber writes on the same socket (full duplex), which switches its open file to
/// O_NONBLOCK; then a signal with SA_RESTART (a profiler's SIGPROF, say) interrupts the
/// thread. The kernel restarts the read, which now sees O_NONBLOCK and fails with EAGAIN,
/// an error a blocking read can never return: the hook must go on waiting for the data.
#[test]
fn a_restarted_read_on_a_plain_thread_after_a_fiber_switched_the_socket() {
    child_ok(|| {
        crate::common::install_signal(libc::SIGUSR1, true, on_signal);
        let s = shared_started(1);
        let (a, b) = UnixStream::pair().unwrap();
        let a = Arc::new(a);
        let a2 = a.clone();
        let tid = Arc::new(AtomicI32::new(0));
        let t2 = tid.clone();
        let reader = std::thread::spawn(move || {
            t2.store(crate::common::gettid(), Ordering::SeqCst);
            let mut buf = [0u8; 16];
            (&*a2)
                .read(&mut buf)
                .map(|n| buf[..n].to_vec())
                .map_err(|e| e.kind())
        });
        while tid.load(Ordering::SeqCst) == 0 {
            std::thread::yield_now();
        }
        crate::common::block_thread(Duration::from_millis(200));
        switch_from_a_fiber(&s, &a);
        for _ in 0..3 {
            crate::common::tgkill(tid.load(Ordering::SeqCst), libc::SIGUSR1);
            crate::common::block_thread(Duration::from_millis(100));
        }
        let early = reader.is_finished();
        (&b).write_all(b"data").unwrap();
        let got = reader.join().unwrap();
        assert!(
            !early && got == Ok(b"data".to_vec()),
            "the reader returned early: {early}, with {got:?} (libc: blocks until the data, then Ok(\"data\"))"
        );
        s.stop();
    });
}

/// The other side of the restart fix: a plain thread in a real blocking read with a receive
/// timeout, whose socket a fiber switches meanwhile, still times out once, after its own
/// timeout (the kernel fails it with `EAGAIN` then, which the hook must not take for the
/// switch and wait a second timeout for).
#[test]
fn a_timed_read_on_a_plain_thread_ends_at_its_timeout_after_a_fiber_switched_the_socket() {
    const TIMEOUT: Duration = Duration::from_millis(800);
    let s = shared_started(1);
    let (a, _b) = UnixStream::pair().unwrap();
    a.set_read_timeout(Some(TIMEOUT)).unwrap();
    let a = Arc::new(a);
    let a2 = a.clone();
    let reader = std::thread::spawn(move || {
        let start = Instant::now();
        let mut buf = [0u8; 16];
        let r = (&*a2).read(&mut buf).map_err(|e| e.kind());
        (r, start.elapsed())
    });
    // Let the reader get into the kernel, then switch the socket from a fiber.
    crate::common::block_thread(Duration::from_millis(200));
    switch_from_a_fiber(&s, &a);
    let (r, took) = reader.join().unwrap();
    assert_eq!(r, Err(ErrorKind::WouldBlock), "libc: the timeout's EAGAIN");
    assert!(
        took >= TIMEOUT - Duration::from_millis(50)
            && took < TIMEOUT * 2 - Duration::from_millis(100),
        "the read ended after {took:?}; its timeout is {TIMEOUT:?}"
    );
    s.stop();
}

// ---------------------------------------------------------------------------------------
// A switched socket duplicated onto a standard stream
// ---------------------------------------------------------------------------------------

/// `dup2(sock, 0)` / `dup2(sock, 1)` of a socket a fiber already used (so its open file is
/// O_NONBLOCK in the kernel): the standard-stream numbers are never waited on in a fiber, so
/// a blocking read of stdin fails with EAGAIN at once and a big blocking write to stdout
/// comes back short (or fails), where libc blocks.
#[test]
fn a_switched_socket_dup2ed_onto_stdin_and_stdout_keeps_blocking() {
    child_ok(|| {
        // SAFETY: duplicating our own standard streams, to put them back afterwards (the test
        // harness reports on stdout).
        let saved = unsafe { (libc::dup(0), libc::dup(1)) };
        assert!(saved.0 >= 0 && saved.1 >= 0);
        let s = shared_started(1);
        let r = s.block_on(|| {
            let (a, b) = UnixStream::pair().unwrap();
            // Switch `a` by using it in this fiber.
            (&b).write_all(b"1").unwrap();
            let mut one = [0u8; 1];
            (&a).read_exact(&mut one).unwrap();
            // SAFETY: replacing our own stdin with a socket we own.
            assert_eq!(unsafe { libc::dup2(a.as_raw_fd(), 0) }, 0);
            let w = std::thread::spawn(move || {
                std::thread::sleep(Duration::from_millis(200));
                (&b).write_all(b"line\n").unwrap();
                b
            });
            let mut buf = [0u8; 16];
            // SAFETY: a live buffer.
            let n = unsafe { libc::read(0, buf.as_mut_ptr().cast(), 16) };
            let e = if n < 0 { errno() } else { 0 };
            let b = w.join().unwrap();
            let stdin = (n, e);

            // SAFETY: replacing our own stdout (the test harness captured nothing: --nocapture,
            // and the parent reads only stderr).
            assert_eq!(unsafe { libc::dup2(a.as_raw_fd(), 1) }, 1);
            let reader = std::thread::spawn(move || {
                std::thread::sleep(Duration::from_millis(200));
                let mut total = 0usize;
                let mut buf = vec![0u8; 1 << 16];
                let mut b = b;
                b.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
                while let Ok(n) = b.read(&mut buf) {
                    if n == 0 {
                        break;
                    }
                    total += n;
                    if total >= 4 << 20 {
                        break;
                    }
                }
                total
            });
            let big = vec![b'x'; 4 << 20];
            // SAFETY: a live buffer.
            let n = unsafe { libc::write(1, big.as_ptr().cast(), big.len()) };
            let e = if n < 0 { errno() } else { 0 };
            let got = reader.join().unwrap();
            (stdin, (n, e, got))
        });
        // SAFETY: putting back the streams saved above.
        unsafe {
            libc::dup2(saved.0, 0);
            libc::dup2(saved.1, 1);
        }
        let expect = ((5, 0), (4 << 20, 0, 4 << 20));
        assert_eq!(
            r, expect,
            "((stdin read, errno), (stdout write, errno, bytes read))"
        );
        s.stop();
    });
}

// ---------------------------------------------------------------------------------------
// A plain thread on a switched datagram socket after shutdown(SHUT_RD)
// ---------------------------------------------------------------------------------------

fn thread_cpu() -> Duration {
    // SAFETY: a live rusage.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    unsafe { libc::getrusage(libc::RUSAGE_THREAD, &mut ru) };
    Duration::new(ru.ru_utime.tv_sec as u64, ru.ru_utime.tv_usec as u32 * 1000)
        + Duration::new(ru.ru_stime.tv_sec as u64, ru.ru_stime.tv_usec as u32 * 1000)
}

/// A plain thread's blocking recv on a UDP socket a fiber switched, after shutdown(SHUT_RD):
/// libc returns 0 at once; the emulation's poll says readable, the non-blocking recv says
/// EAGAIN, and the thread spins until its timeout.
#[test]
fn a_plain_thread_recv_on_a_switched_udp_socket_after_shutdown() {
    with_deadline(|| {
        let s = shared_started(1);
        let u = Arc::new(UdpSocket::bind("127.0.0.1:0").unwrap());
        let u2 = u.clone();
        // Switch it in a fiber (a read that times out).
        s.block_on(move || {
            u2.set_read_timeout(Some(Duration::from_millis(10)))
                .unwrap();
            let mut b = [0u8; 4];
            assert!(u2.recv(&mut b).is_err());
        });
        u.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
        // SAFETY: our socket.
        unsafe { libc::shutdown(u.as_raw_fd(), libc::SHUT_RD) };
        let u3 = u.clone();
        let (r, took, cpu) = std::thread::spawn(move || {
            let c0 = thread_cpu();
            let t = Instant::now();
            let mut b = [0u8; 4];
            let r = u3.recv(&mut b).map_err(|e| e.kind());
            (r, t.elapsed(), thread_cpu() - c0)
        })
        .join()
        .unwrap();
        assert_eq!(
            r,
            Ok(0),
            "libc's recv returns 0 at once after SHUT_RD; took {took:?} using {cpu:?} of CPU"
        );
        s.stop();
    });
}

// ---------------------------------------------------------------------------------------
// Huge timeouts: the largest values each call accepts park (do not overflow), and end on
// cancellation
// ---------------------------------------------------------------------------------------

#[test]
fn the_largest_timeouts_park_and_end_on_cancel() {
    child_ok(|| {
        let s = shared_started(1);
        let stop = Arc::new(AtomicBool::new(false));
        let ticks = Arc::new(AtomicUsize::new(0));
        let (st, tk) = (stop.clone(), ticks.clone());
        let ticker = s
            .submit(
                move || {
                    while !st.load(Ordering::Relaxed) {
                        tk.fetch_add(1, Ordering::Relaxed);
                        fibra::sleep(Duration::from_millis(2));
                    }
                },
                None,
            )
            .unwrap();
        let (pa, _pb) = UnixStream::pair().unwrap();
        let pfd = pa.as_raw_fd();
        /// A named call on an fd, returning its result widened.
        type Call = (&'static str, fn(RawFd) -> i64);
        let calls: Vec<Call> = vec![
            ("select", |_| unsafe {
                let mut tv = libc::timeval {
                    tv_sec: libc::time_t::MAX,
                    tv_usec: 999_999,
                };
                libc::select(
                    0,
                    std::ptr::null_mut(),
                    std::ptr::null_mut(),
                    std::ptr::null_mut(),
                    &mut tv,
                ) as i64
            }),
            ("ppoll", |fd| unsafe {
                let ts = libc::timespec {
                    tv_sec: libc::time_t::MAX,
                    tv_nsec: 999_999_999,
                };
                let mut p = libc::pollfd {
                    fd,
                    events: libc::POLLIN,
                    revents: 0,
                };
                libc::ppoll(&mut p, 1, &ts, std::ptr::null()) as i64
            }),
            ("poll", |fd| unsafe {
                let mut p = libc::pollfd {
                    fd,
                    events: libc::POLLIN,
                    revents: 0,
                };
                libc::poll(&mut p, 1, i32::MAX) as i64
            }),
            ("clock_nanosleep abstime", |_| unsafe {
                let ts = libc::timespec {
                    tv_sec: libc::time_t::MAX,
                    tv_nsec: 999_999_999,
                };
                libc::clock_nanosleep(
                    libc::CLOCK_REALTIME,
                    libc::TIMER_ABSTIME,
                    &ts,
                    std::ptr::null_mut(),
                ) as i64
            }),
            ("nanosleep", |_| unsafe {
                let ts = libc::timespec {
                    tv_sec: libc::time_t::MAX,
                    tv_nsec: 999_999_999,
                };
                libc::nanosleep(&ts, std::ptr::null_mut()) as i64
            }),
            ("thread::sleep(MAX)", |_| {
                std::thread::sleep(Duration::MAX);
                0
            }),
            ("sleep(u32::MAX)", |_| unsafe {
                libc::sleep(u32::MAX) as i64
            }),
        ];
        let hs: Vec<_> = calls
            .into_iter()
            .map(|(name, f)| (name, s.submit(move || f(pfd), None).unwrap()))
            .collect();
        crate::common::block_thread(Duration::from_millis(300));
        let mut bad = Vec::new();
        for (name, h) in &hs {
            if h.is_finished() {
                bad.push(format!("{name} returned early"));
            }
        }
        let before = ticks.load(Ordering::Relaxed);
        crate::common::block_thread(Duration::from_millis(100));
        assert!(
            ticks.load(Ordering::Relaxed) > before,
            "the worker is blocked"
        );
        for (_, h) in &hs {
            h.cancel();
        }
        for (name, h) in hs {
            if !h.wait_timeout(Duration::from_secs(10)) {
                bad.push(format!("{name} did not end after cancel"));
            }
        }
        stop.store(true, Ordering::Relaxed);
        finish(ticker);
        assert!(bad.is_empty(), "{bad:?}");
        s.stop();
    });
}

// ---------------------------------------------------------------------------------------
// No stdin at all
// ---------------------------------------------------------------------------------------

#[test]
fn stdin_closed_reads_as_end_of_file_in_fibers() {
    child_ok(|| {
        let s = shared_started(1);
        // /dev/null first (how in_child starts us), then no fd 0 at all.
        let r1 = s.block_on(|| {
            let mut line = String::new();
            std::io::stdin().read_line(&mut line).map_err(|e| e.kind())
        });
        // SAFETY: closing our own stdin.
        unsafe { libc::close(0) };
        let r2 = s.block_on(|| {
            let mut buf = Vec::new();
            std::io::stdin().read_to_end(&mut buf).map_err(|e| e.kind())
        });
        assert_eq!((r1, r2), (Ok(0), Ok(0)));
        s.stop();
    });
}

// ---------------------------------------------------------------------------------------
// recvmsg with MSG_WAITALL on a stream socket
// ---------------------------------------------------------------------------------------

fn recvmsg_waitall() -> (isize, Vec<u8>) {
    let (mut c, srv) = tcp_pair();
    c.write_all(b"ab").unwrap();
    let w = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(300));
        c.write_all(b"cd").unwrap();
        c
    });
    crate::common::set_socket_timeout(srv.as_raw_fd(), libc::SO_RCVTIMEO, Duration::from_secs(5));
    let mut buf = [0u8; 4];
    let mut iov = libc::iovec {
        iov_base: buf.as_mut_ptr().cast(),
        iov_len: 4,
    };
    // SAFETY: a msghdr over one live iovec.
    let n = unsafe {
        let mut msg: libc::msghdr = std::mem::zeroed();
        msg.msg_iov = &mut iov;
        msg.msg_iovlen = 1;
        libc::recvmsg(srv.as_raw_fd(), &mut msg, libc::MSG_WAITALL)
    };
    let _c = w.join().unwrap();
    (n, buf[..n.max(0) as usize].to_vec())
}

/// The README's table: the read calls, recvmsg included, honour MSG_WAITALL ("waits for the
/// whole buffer"). recvmsg returns after the first bytes.
#[test]
fn recvmsg_with_msg_waitall_waits_for_the_whole_buffer() {
    with_deadline(|| {
        same_as_libc(
            recvmsg_waitall,
            (4, b"abcd".to_vec()),
            "recvmsg(MSG_WAITALL) on TCP",
        );
    });
}
