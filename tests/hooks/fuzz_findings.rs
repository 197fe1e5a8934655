#![cfg(feature = "hook")]
//! What the differential fuzzing of the hooks (`fuzz/`, `tests/hooks/differential`) found
//! where a hooked call in a fiber differed from the C library's: each case as a plain test,
//! the fiber's result against libc's on a plain thread.

use std::io::Write;
use std::net::{TcpListener, TcpStream};
use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::net::UnixStream;
use std::time::Duration;

use crate::common::{child_ok, errno, same_as_libc, unmapped_page, with_deadline};

/// A result as compared: the return value, and `errno` after a failure.
fn res(r: isize) -> (isize, i32) {
    (r, if r < 0 { errno() } else { 0 })
}

/// The ways to receive nothing: `read`, `recv`, `readv`, `recvmsg` and `recvfrom` of no
/// bytes (the last two asking for the address, the message with a control buffer too),
/// with what they wrote back: (result, errno, address length, control length, flags).
fn receive_nothing(fd: RawFd) -> Vec<(isize, i32, u32, usize, i32)> {
    let mut byte = [0u8; 1];
    let p = byte.as_mut_ptr().cast();
    let plain = |r: isize| {
        let (r, e) = res(r);
        (r, e, 0, 0, 0)
    };
    // SAFETY: a live buffer, asked for 0 bytes; an empty iovec array; msghdrs with no
    // buffers and live name and control buffers.
    unsafe {
        let mut name: libc::sockaddr_storage = std::mem::zeroed();
        let mut control = [0u64; 8];
        let mut m: libc::msghdr = std::mem::zeroed();
        m.msg_name = (&raw mut name).cast();
        m.msg_namelen = 128;
        m.msg_control = control.as_mut_ptr().cast();
        m.msg_controllen = 64;
        m.msg_flags = 12345;
        let (r, e) = res(libc::recvmsg(fd, &mut m, libc::MSG_CMSG_CLOEXEC));
        let msg = (r, e, m.msg_namelen, m.msg_controllen, m.msg_flags);
        let mut len: libc::socklen_t = 128;
        let (r, e) = res(libc::recvfrom(
            fd,
            p,
            0,
            0,
            (&raw mut name).cast(),
            &mut len,
        ));
        vec![
            plain(libc::read(fd, p, 0)),
            plain(libc::recv(fd, p, 0, 0)),
            plain(libc::readv(fd, std::ptr::null(), 0)),
            msg,
            (r, e, len, 0, 0),
        ]
    }
}

/// A blocking stream socket with a receive timeout and nothing queued, asked for 0 bytes.
/// `read` and `readv` of nothing return 0 at once on any socket. `recv`, `recvmsg` and
/// `recvfrom` wait out the timeout; then a Unix socket's fail with `EAGAIN` (and write
/// nothing back), but a TCP socket's return 0 (its receive loop ends once the buffer is
/// full, and an empty one is) and write back what a receive of no address and no control
/// message does: lengths 0, and `recvmsg`'s flags (which keep `MSG_CMSG_CLOEXEC`).
fn zero_length_receives_at_the_timeout() -> Vec<(isize, i32, u32, usize, i32)> {
    let (a, _b) = UnixStream::pair().unwrap();
    a.set_read_timeout(Some(Duration::from_millis(20))).unwrap();
    let mut got = receive_nothing(a.as_raw_fd());
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let c = TcpStream::connect(l.local_addr().unwrap()).unwrap();
    let (_s, _) = l.accept().unwrap();
    c.set_read_timeout(Some(Duration::from_millis(20))).unwrap();
    got.extend(receive_nothing(c.as_raw_fd()));
    got
}

#[test]
fn a_zero_length_receive_waits_out_its_timeout_as_libc_does() {
    with_deadline(|| {
        let again = (-1, libc::EAGAIN, 0, 0, 0);
        same_as_libc(
            zero_length_receives_at_the_timeout,
            vec![
                (0, 0, 0, 0, 0),
                again,
                (0, 0, 0, 0, 0),
                (-1, libc::EAGAIN, 128, 64, 12345),
                (-1, libc::EAGAIN, 128, 0, 0),
                (0, 0, 0, 0, 0),
                (0, 0, 0, 0, 0),
                (0, 0, 0, 0, 0),
                (0, 0, 0, 0, libc::MSG_CMSG_CLOEXEC),
                (0, 0, 0, 0, 0),
            ],
            "read, recv, readv, recvmsg and recvfrom of 0 bytes on Unix and TCP stream sockets",
        );
    });
}

/// A blocking Unix datagram socket whose receive side is shut down, with nothing queued:
/// a receive returns 0 at once and writes back what a receive of no address and no control
/// message does (lengths 0; `recvmsg`'s flags keep `MSG_CMSG_CLOEXEC`).
fn receives_after_a_datagram_shutdown() -> Vec<(isize, i32, u32, usize, i32)> {
    let (a, _b) = std::os::unix::net::UnixDatagram::pair().unwrap();
    a.shutdown(std::net::Shutdown::Read).unwrap();
    receive_nothing(a.as_raw_fd())
}

#[test]
fn a_receive_on_a_shut_datagram_socket_writes_back_as_libc_does() {
    with_deadline(|| {
        same_as_libc(
            receives_after_a_datagram_shutdown,
            vec![
                (0, 0, 0, 0, 0),
                (0, 0, 0, 0, 0),
                (0, 0, 0, 0, 0),
                (0, 0, 0, 0, libc::MSG_CMSG_CLOEXEC),
                (0, 0, 0, 0, 0),
            ],
            "read, recv, readv, recvmsg and recvfrom on a datagram socket shut for reading",
        );
    });
}

/// `ioctl(FIONBIO)` with an unmapped argument on a socket the hooks switched (in a fiber: a
/// read made it non-blocking in the kernel): the kernel fails with `EFAULT` and changes
/// nothing; the socket stays blocking.
fn fionbio_bad_pointer() -> ((isize, i32), bool) {
    let (mut a, mut b) = UnixStream::pair().unwrap();
    b.write_all(b"x").unwrap();
    let mut one = [0u8; 1];
    std::io::Read::read_exact(&mut a, &mut one).unwrap();
    // SAFETY: FIONBIO with a pointer no call may read: the kernel refuses it.
    let r = unsafe { libc::ioctl(a.as_raw_fd(), libc::FIONBIO, unmapped_page()) };
    let got = res(r as isize);
    // SAFETY: F_GETFL takes no argument.
    let nonblocking = unsafe { libc::fcntl(a.as_raw_fd(), libc::F_GETFL) } & libc::O_NONBLOCK != 0;
    (got, nonblocking)
}

#[test]
fn fionbio_with_a_bad_pointer_fails_with_efault() {
    // In a child: the defect was a fault that ends the process.
    child_ok(|| {
        with_deadline(|| {
            same_as_libc(
                fionbio_bad_pointer,
                ((-1, libc::EFAULT), false),
                "FIONBIO with an unmapped argument",
            );
        });
    });
}

// ---------------------------------------------------------------------------------------
// The blocking mode belongs to the open file
// ---------------------------------------------------------------------------------------

/// Whether `fd` shows `O_NONBLOCK` (the hooked `fcntl`).
fn getfl_nb(fd: RawFd) -> bool {
    // SAFETY: F_GETFL takes no argument.
    unsafe { libc::fcntl(fd, libc::F_GETFL) & libc::O_NONBLOCK != 0 }
}

/// A socket made non-blocking, copied, looked at through the original (`F_GETFL`, which on
/// any thread makes the hooks take the mode as the user's), then made blocking through the
/// original: the copy shares the open file, so it is blocking too.
fn mode_set_through_the_original() -> (bool, bool) {
    let (a, _b) = UnixStream::pair().unwrap();
    a.set_nonblocking(true).unwrap();
    let copy = a.try_clone().unwrap();
    assert!(getfl_nb(a.as_raw_fd()));
    a.set_nonblocking(false).unwrap();
    (getfl_nb(a.as_raw_fd()), getfl_nb(copy.as_raw_fd()))
}

#[test]
fn a_mode_set_through_one_fd_shows_through_its_copy() {
    with_deadline(|| {
        same_as_libc(
            mode_set_through_the_original,
            (false, false),
            "O_NONBLOCK cleared through the original, seen through the copy",
        );
    });
}

/// `fd` sent to this process over a new Unix socket pair, and the copy received.
fn pass_to_self(fd: RawFd) -> RawFd {
    let (s, r) = UnixStream::pair().unwrap();
    let mut byte = [0u8; 1];
    // SAFETY: msghdrs over live buffers and control buffers sized for one fd.
    unsafe {
        let space = libc::CMSG_SPACE(size_of::<RawFd>() as u32) as usize;
        let mut cbuf = vec![0u8; space];
        let mut iov = libc::iovec {
            iov_base: byte.as_mut_ptr().cast(),
            iov_len: 1,
        };
        let mut m: libc::msghdr = std::mem::zeroed();
        m.msg_iov = &mut iov;
        m.msg_iovlen = 1;
        m.msg_control = cbuf.as_mut_ptr().cast();
        m.msg_controllen = space;
        let c = libc::CMSG_FIRSTHDR(&m);
        (*c).cmsg_level = libc::SOL_SOCKET;
        (*c).cmsg_type = libc::SCM_RIGHTS;
        (*c).cmsg_len = libc::CMSG_LEN(size_of::<RawFd>() as u32) as usize;
        std::ptr::write_unaligned(libc::CMSG_DATA(c).cast::<RawFd>(), fd);
        assert_eq!(libc::sendmsg(s.as_raw_fd(), &m, 0), 1);
        cbuf.fill(0);
        assert_eq!(
            libc::recvmsg(r.as_raw_fd(), &mut m, libc::MSG_CMSG_CLOEXEC),
            1
        );
        let c = libc::CMSG_FIRSTHDR(&m);
        assert!(!c.is_null());
        std::ptr::read_unaligned(libc::CMSG_DATA(c).cast::<RawFd>())
    }
}

/// A socket the user made non-blocking, looked at, then received over `SCM_RIGHTS` while
/// it is open, and made blocking through the received copy: both are blocking.
fn mode_set_through_a_received_copy() -> (bool, bool) {
    let (a, _b) = UnixStream::pair().unwrap();
    a.set_nonblocking(true).unwrap();
    assert!(getfl_nb(a.as_raw_fd()));
    let got = pass_to_self(a.as_raw_fd());
    // SAFETY: an int for FIONBIO.
    assert_eq!(
        unsafe { libc::ioctl(got, libc::FIONBIO, &0 as *const i32) },
        0
    );
    let r = (getfl_nb(a.as_raw_fd()), getfl_nb(got));
    // SAFETY: the received fd, ours.
    unsafe { libc::close(got) };
    r
}

#[test]
fn a_mode_set_through_a_received_copy_shows_through_the_original() {
    with_deadline(|| {
        same_as_libc(
            mode_set_through_a_received_copy,
            (false, false),
            "O_NONBLOCK cleared through a copy received over SCM_RIGHTS",
        );
    });
}

/// Writes one byte on `peer` after 300 ms from a plain thread.
fn write_later(mut peer: UnixStream) -> std::thread::JoinHandle<UnixStream> {
    std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(300));
        peer.write_all(b"L").unwrap();
        peer
    })
}

/// A copy made before the switch, then the original used (in a fiber: switched) and
/// closed: the copy, the open file's last fd, is still blocking, so its read waits.
fn copy_after_the_switched_fd_closed() -> (bool, (isize, i32)) {
    let (mut a, mut b) = UnixStream::pair().unwrap();
    let copy = a.try_clone().unwrap();
    b.write_all(b"1").unwrap();
    let mut one = [0u8; 1];
    std::io::Read::read_exact(&mut a, &mut one).unwrap();
    drop(a);
    let shows_nb = getfl_nb(copy.as_raw_fd());
    let w = write_later(b);
    // SAFETY: a live one-byte buffer.
    let r = res(unsafe { libc::read(copy.as_raw_fd(), one.as_mut_ptr().cast(), 1) });
    let _b = w.join().unwrap();
    (shows_nb, r)
}

#[test]
fn a_copy_made_before_the_switch_stays_blocking_once_the_switched_fd_closes() {
    with_deadline(|| {
        same_as_libc(
            copy_after_the_switched_fd_closed,
            (false, (1, 0)),
            "a copy made before the switch, read after the switched fd closed",
        );
    });
}

// ---------------------------------------------------------------------------------------
// Receives from the error queue
// ---------------------------------------------------------------------------------------

/// `recv(MSG_ERRQUEUE)` on a blocking TCP socket with nothing queued there: the kernel
/// looks at the error queue once and fails with `EAGAIN`, whether the receive side is shut
/// down (no end-of-file: the flag asks for errors, not data) or not (no wait, however long
/// `SO_RCVTIMEO` is). Returns both results and whether the second came at once.
fn error_queue_receives() -> ((isize, i32), (isize, i32), bool) {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let c = TcpStream::connect(l.local_addr().unwrap()).unwrap();
    let (_s, _) = l.accept().unwrap();
    let mut buf = [0u8; 16];
    c.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let started = std::time::Instant::now();
    // SAFETY: a live buffer of its length.
    let open = res(unsafe {
        libc::recv(
            c.as_raw_fd(),
            buf.as_mut_ptr().cast(),
            16,
            libc::MSG_ERRQUEUE,
        )
    });
    let at_once = started.elapsed() < Duration::from_millis(2500);
    c.shutdown(std::net::Shutdown::Read).unwrap();
    // SAFETY: as above.
    let shut = res(unsafe {
        libc::recv(
            c.as_raw_fd(),
            buf.as_mut_ptr().cast(),
            16,
            libc::MSG_ERRQUEUE | libc::MSG_WAITALL,
        )
    });
    (open, shut, at_once)
}

#[test]
fn an_error_queue_receive_on_tcp_never_waits() {
    with_deadline(|| {
        same_as_libc(
            error_queue_receives,
            ((-1, libc::EAGAIN), (-1, libc::EAGAIN), true),
            "recv(MSG_ERRQUEUE) on TCP, open and with its receive side shut down",
        );
    });
}

// ---------------------------------------------------------------------------------------
// A whole peek that end-of-file or the timeout cuts short (TCP's: a Unix socket's peek
// never waits for more once it copied something)
// ---------------------------------------------------------------------------------------

/// A connected TCP pair on loopback, without Nagle's delay.
fn tcp_pair() -> (TcpStream, TcpStream) {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let c = TcpStream::connect(l.local_addr().unwrap()).unwrap();
    let (s, _) = l.accept().unwrap();
    c.set_nodelay(true).unwrap();
    s.set_nodelay(true).unwrap();
    (c, s)
}

/// Until TCP on loopback delivered what `sender` sent (all of it acknowledged).
fn delivered(sender: &TcpStream) {
    crate::common::wait_until("TCP to deliver", || {
        let mut n: libc::c_int = -1;
        // SAFETY: TIOCOUTQ writes an int.
        unsafe { libc::ioctl(sender.as_raw_fd(), libc::TIOCOUTQ, &mut n) };
        n == 0
    });
}

/// `recv(MSG_PEEK | MSG_WAITALL)` of more than is queued on a blocking TCP socket whose
/// peer shut down its writing side: the kernel peeks what there is and returns.
fn peek_all_at_end_of_file(fd: RawFd) -> (isize, i32) {
    let mut buf = [0u8; 4096];
    // SAFETY: a live buffer of its length.
    res(unsafe {
        libc::recv(
            fd,
            buf.as_mut_ptr().cast(),
            buf.len(),
            libc::MSG_PEEK | libc::MSG_WAITALL,
        )
    })
}

fn short_peek_at_end_of_file() -> (isize, i32) {
    let (a, mut b) = tcp_pair();
    b.write_all(&[7u8; 66]).unwrap();
    b.shutdown(std::net::Shutdown::Write).unwrap();
    peek_all_at_end_of_file(a.as_raw_fd())
}

#[test]
fn a_whole_peek_returns_what_is_there_at_end_of_file() {
    with_deadline(|| {
        same_as_libc(
            short_peek_at_end_of_file,
            (66, 0),
            "MSG_PEEK | MSG_WAITALL of 4096 bytes with 66 queued and the peer shut",
        );
    });
}

/// The same on a plain thread, on a socket a fiber switched first.
#[test]
fn a_whole_peek_on_a_switched_socket_returns_at_end_of_file_on_a_plain_thread() {
    with_deadline(|| {
        let s = crate::common::shared_started(1);
        let (a, b) = tcp_pair();
        let (a, mut b) = s.block_on(move || {
            let (mut a, mut b) = (a, b);
            b.write_all(b"1").unwrap();
            let mut one = [0u8; 1];
            std::io::Read::read_exact(&mut a, &mut one).unwrap();
            (a, b)
        });
        b.write_all(&[7u8; 66]).unwrap();
        b.shutdown(std::net::Shutdown::Write).unwrap();
        let got = peek_all_at_end_of_file(a.as_raw_fd());
        s.stop();
        assert_eq!(got, (66, 0), "libc: the peek returns what is there");
    });
}

/// `recvmsg(MSG_PEEK | MSG_WAITALL)` of more than is queued on a blocking TCP socket with a
/// receive timeout and a control buffer too small for a header: the kernel waits out the
/// timeout and returns what it peeked.
fn short_peek_at_the_timeout() -> (isize, i32) {
    let (a, mut b) = tcp_pair();
    b.write_all(&[7u8; 30]).unwrap();
    delivered(&b);
    a.set_read_timeout(Some(Duration::from_millis(1))).unwrap();
    let mut buf = [0u8; 33];
    let mut control = [0u64; 1];
    let mut iov = libc::iovec {
        iov_base: buf.as_mut_ptr().cast(),
        iov_len: buf.len(),
    };
    // SAFETY: a msghdr over live buffers.
    unsafe {
        let mut m: libc::msghdr = std::mem::zeroed();
        m.msg_iov = &mut iov;
        m.msg_iovlen = 1;
        m.msg_control = control.as_mut_ptr().cast();
        m.msg_controllen = 8;
        res(libc::recvmsg(
            a.as_raw_fd(),
            &mut m,
            libc::MSG_PEEK | libc::MSG_WAITALL | libc::MSG_CMSG_CLOEXEC,
        ))
    }
}

#[test]
fn a_whole_peek_returns_what_is_there_at_its_timeout() {
    with_deadline(|| {
        same_as_libc(
            short_peek_at_the_timeout,
            (30, 0),
            "MSG_PEEK | MSG_WAITALL of 33 bytes with 30 queued and a 1 ms timeout",
        );
    });
}

/// A socket the user made non-blocking, received over `SCM_RIGHTS` while it is open (the
/// hooks look at the received copy at once), then given `O_APPEND` alone through the
/// original, which nothing looked at: that clears `O_NONBLOCK` of their open file, so the
/// received copy is blocking too.
fn flags_set_through_an_fd_never_looked_at() -> (bool, bool) {
    let (a, _b) = UnixStream::pair().unwrap();
    a.set_nonblocking(true).unwrap();
    let got = pass_to_self(a.as_raw_fd());
    // SAFETY: F_SETFL with an int of flags.
    assert_eq!(
        unsafe { libc::fcntl(a.as_raw_fd(), libc::F_SETFL, libc::O_APPEND) },
        0
    );
    let r = (getfl_nb(a.as_raw_fd()), getfl_nb(got));
    // SAFETY: the received fd, ours.
    unsafe { libc::close(got) };
    r
}

#[test]
fn flags_set_through_an_fd_never_looked_at_show_through_its_copies() {
    with_deadline(|| {
        same_as_libc(
            flags_set_through_an_fd_never_looked_at,
            (false, false),
            "F_SETFL(O_APPEND) through the original of a received copy",
        );
    });
}

// ---------------------------------------------------------------------------------------
// A whole receive ends after a part that brought descriptors
// ---------------------------------------------------------------------------------------

/// A Unix stream socket with four one-byte messages queued, each carrying a descriptor
/// (`SCM_RIGHTS`): a receive with `MSG_WAITALL` (and with `MSG_PEEK` too) and no control
/// buffer ends after the first message, as a part that brought descriptors (closed for
/// want of room) ends the kernel's receive, at once (a 5 s `SO_RCVTIMEO` bounds a wait).
/// `recv`, `recv` peeking, `recvfrom` and `recvmsg`, each on a fresh pair: (result, errno,
/// whether it came at once).
fn whole_receives_across_descriptors() -> Vec<(isize, i32, bool)> {
    let receive = |how: u8| {
        let (a, b) = UnixStream::pair().unwrap();
        for _ in 0..4 {
            let got = pass_over(&b, b.as_raw_fd());
            assert_eq!(got, 1);
        }
        a.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let mut buf = [0u8; 41];
        let p = buf.as_mut_ptr().cast();
        let fd = a.as_raw_fd();
        let started = std::time::Instant::now();
        // SAFETY: a live buffer of its length; a msghdr over it; a live address buffer.
        let (r, e) = res(unsafe {
            match how {
                0 => libc::recv(fd, p, 41, libc::MSG_WAITALL),
                1 => libc::recv(fd, p, 41, libc::MSG_WAITALL | libc::MSG_PEEK),
                2 => {
                    let mut name: libc::sockaddr_storage = std::mem::zeroed();
                    let mut len = size_of::<libc::sockaddr_storage>() as libc::socklen_t;
                    libc::recvfrom(
                        fd,
                        p,
                        41,
                        libc::MSG_WAITALL,
                        (&raw mut name).cast(),
                        &mut len,
                    )
                }
                _ => {
                    let mut iov = libc::iovec {
                        iov_base: p,
                        iov_len: 41,
                    };
                    let mut m: libc::msghdr = std::mem::zeroed();
                    m.msg_iov = &mut iov;
                    m.msg_iovlen = 1;
                    libc::recvmsg(fd, &mut m, libc::MSG_WAITALL)
                }
            }
        });
        (r, e, started.elapsed() < Duration::from_millis(2500))
    };
    (0..4).map(receive).collect()
}

/// Sends one byte with `fd` in an `SCM_RIGHTS` message on `sock`.
fn pass_over(sock: &UnixStream, fd: RawFd) -> isize {
    let mut byte = [0u8; 1];
    // SAFETY: a msghdr over a live byte and a control buffer sized for one fd.
    unsafe {
        let space = libc::CMSG_SPACE(size_of::<RawFd>() as u32) as usize;
        let mut cbuf = vec![0u8; space];
        let mut iov = libc::iovec {
            iov_base: byte.as_mut_ptr().cast(),
            iov_len: 1,
        };
        let mut m: libc::msghdr = std::mem::zeroed();
        m.msg_iov = &mut iov;
        m.msg_iovlen = 1;
        m.msg_control = cbuf.as_mut_ptr().cast();
        m.msg_controllen = space;
        let c = libc::CMSG_FIRSTHDR(&m);
        (*c).cmsg_level = libc::SOL_SOCKET;
        (*c).cmsg_type = libc::SCM_RIGHTS;
        (*c).cmsg_len = libc::CMSG_LEN(size_of::<RawFd>() as u32) as usize;
        std::ptr::write_unaligned(libc::CMSG_DATA(c).cast::<RawFd>(), fd);
        libc::sendmsg(sock.as_raw_fd(), &m, 0)
    }
}

#[test]
fn a_whole_receive_ends_after_a_part_that_brought_descriptors() {
    with_deadline(|| {
        same_as_libc(
            whole_receives_across_descriptors,
            vec![(1, 0, true); 4],
            "MSG_WAITALL receives over one-byte messages carrying descriptors",
        );
    });
}

// ---------------------------------------------------------------------------------------
// A whole receive ends at the urgent mark
// ---------------------------------------------------------------------------------------

/// A stream with "abc", one byte of urgent data (`MSG_OOB`) and "defgh" queued: a receive
/// of 100 bytes with `MSG_WAITALL`, peeking or not, ends at the urgent mark with "abc", at
/// once (a 5 s `SO_RCVTIMEO` bounds a wait), on TCP and on Unix stream sockets. Returns
/// (result, errno, at once) for a peek, then a receive, of each.
fn whole_receives_before_the_mark() -> Vec<(isize, i32, bool)> {
    let mut out = Vec::new();
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let tcp = TcpStream::connect(l.local_addr().unwrap()).unwrap();
    let (peer, _) = l.accept().unwrap();
    tcp.set_nodelay(true).unwrap();
    let (unix, unix_peer) = UnixStream::pair().unwrap();
    for (fd, from) in [
        (tcp.as_raw_fd(), peer.as_raw_fd()),
        (unix.as_raw_fd(), unix_peer.as_raw_fd()),
    ] {
        // SAFETY: live buffers of their lengths.
        unsafe {
            assert_eq!(libc::send(from, b"abc".as_ptr().cast(), 3, 0), 3);
            assert_eq!(libc::send(from, b"!".as_ptr().cast(), 1, libc::MSG_OOB), 1);
            assert_eq!(libc::send(from, b"defgh".as_ptr().cast(), 5, 0), 5);
        }
        let timeout = libc::timeval {
            tv_sec: 5,
            tv_usec: 0,
        };
        // SAFETY: a live timeval of the option's size.
        unsafe {
            libc::setsockopt(
                fd,
                libc::SOL_SOCKET,
                libc::SO_RCVTIMEO,
                (&timeout as *const libc::timeval).cast(),
                size_of::<libc::timeval>() as libc::socklen_t,
            )
        };
        // Until TCP on loopback delivered all 9 bytes (the sender's are all acknowledged;
        // on a Unix socket they are there at once).
        if fd == tcp.as_raw_fd() {
            crate::common::wait_until("the data to arrive", || {
                let mut n: libc::c_int = -1;
                // SAFETY: TIOCOUTQ writes an int.
                unsafe { libc::ioctl(from, libc::TIOCOUTQ, &mut n) };
                n == 0
            });
        }
        for flags in [libc::MSG_WAITALL | libc::MSG_PEEK, libc::MSG_WAITALL] {
            let mut buf = [0u8; 100];
            let started = std::time::Instant::now();
            // SAFETY: a live buffer of its length.
            let (r, e) = res(unsafe { libc::recv(fd, buf.as_mut_ptr().cast(), 100, flags) });
            out.push((r, e, started.elapsed() < Duration::from_millis(2500)));
        }
    }
    out
}

#[test]
fn a_whole_receive_ends_at_the_urgent_mark() {
    with_deadline(|| {
        same_as_libc(
            whole_receives_before_the_mark,
            vec![(3, 0, true); 4],
            "MSG_WAITALL receives, peeking or not, before an urgent mark (TCP, Unix)",
        );
    });
}

/// `recv(MSG_PEEK | MSG_WAITALL)` of 100 bytes on a blocking Unix stream socket with 5
/// queued: a Unix socket's peek never waits for more once it copied something, so the
/// kernel returns the 5 at once (a TCP socket's waits for all 100). A 5 s `SO_RCVTIMEO`
/// bounds a wait. Returns (result, errno, at once).
fn unix_whole_peek() -> (isize, i32, bool) {
    let (a, mut b) = UnixStream::pair().unwrap();
    b.write_all(b"hello").unwrap();
    a.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let mut buf = [0u8; 100];
    let started = std::time::Instant::now();
    // SAFETY: a live buffer of its length.
    let (r, e) = res(unsafe {
        libc::recv(
            a.as_raw_fd(),
            buf.as_mut_ptr().cast(),
            100,
            libc::MSG_PEEK | libc::MSG_WAITALL,
        )
    });
    (r, e, started.elapsed() < Duration::from_millis(2500))
}

#[test]
fn a_whole_peek_on_a_unix_socket_returns_what_is_queued() {
    with_deadline(|| {
        same_as_libc(
            unix_whole_peek,
            (5, 0, true),
            "MSG_PEEK | MSG_WAITALL of 100 bytes with 5 queued on a Unix stream socket",
        );
    });
}

/// `select` with one fd, in the exception set alone: a socket shut down both ways (poll
/// reports it hung up) or one with nothing to say. The kernel's select counts only
/// `POLLPRI` for that set, so both wait out the 30-ms timeout and return 0 with no time
/// left: (result, errno, waited it out, time left in µs).
fn select_on_a_hung_up_socket_in_the_exception_set() -> Vec<(isize, i32, bool, i64)> {
    let select_except = |fd: RawFd| {
        // SAFETY: an fd_set is plain bits; FD_SET on a live fd below FD_SETSIZE.
        let mut set: libc::fd_set = unsafe { std::mem::zeroed() };
        unsafe { libc::FD_SET(fd, &mut set) };
        let mut tv = libc::timeval {
            tv_sec: 0,
            tv_usec: 30_000,
        };
        let t0 = std::time::Instant::now();
        // SAFETY: a live set and timeval, no other sets.
        let r = unsafe {
            libc::select(
                fd + 1,
                std::ptr::null_mut(),
                std::ptr::null_mut(),
                &mut set,
                &mut tv,
            )
        };
        let (r, e) = res(r as isize);
        let waited = t0.elapsed() >= Duration::from_millis(30);
        (r, e, waited, tv.tv_sec * 1_000_000 + tv.tv_usec)
    };
    let (a, _b) = std::os::unix::net::UnixDatagram::pair().unwrap();
    a.shutdown(std::net::Shutdown::Both).unwrap();
    let (c, _d) = UnixStream::pair().unwrap();
    vec![select_except(a.as_raw_fd()), select_except(c.as_raw_fd())]
}

#[test]
fn select_waits_out_a_hang_up_in_the_exception_set() {
    with_deadline(|| {
        same_as_libc(
            select_on_a_hung_up_socket_in_the_exception_set,
            vec![(0, 0, true, 0), (0, 0, true, 0)],
            "select of a hung-up socket in the exception set",
        );
    });
}

/// The same hung-up socket in the exception set, beside a socket in the read set that a
/// thread writes to 20 ms later: the select ends with the read, reporting only that
/// (result, errno, read set has the reader, exception set has the hung-up one).
fn select_on_a_hang_up_and_a_later_read() -> (isize, i32, bool, bool) {
    let (a, _b) = std::os::unix::net::UnixDatagram::pair().unwrap();
    a.shutdown(std::net::Shutdown::Both).unwrap();
    let (c, d) = UnixStream::pair().unwrap();
    let w = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(20));
        (&d).write_all(b"x").unwrap();
        d
    });
    let (fa, fc) = (a.as_raw_fd(), c.as_raw_fd());
    // SAFETY: fd_sets are plain bits; FD_SET and FD_ISSET on live fds below FD_SETSIZE.
    let (mut except, mut read): (libc::fd_set, libc::fd_set) =
        unsafe { (std::mem::zeroed(), std::mem::zeroed()) };
    unsafe {
        libc::FD_SET(fa, &mut except);
        libc::FD_SET(fc, &mut read);
    }
    let mut tv = libc::timeval {
        tv_sec: 20,
        tv_usec: 0,
    };
    // SAFETY: live sets and timeval.
    let r = unsafe {
        libc::select(
            fa.max(fc) + 1,
            &mut read,
            std::ptr::null_mut(),
            &mut except,
            &mut tv,
        )
    };
    let (r, e) = res(r as isize);
    // SAFETY: as above.
    let got = unsafe { (libc::FD_ISSET(fc, &read), libc::FD_ISSET(fa, &except)) };
    drop(w.join().unwrap());
    (r, e, got.0, got.1)
}

#[test]
fn select_with_a_hang_up_in_the_exception_set_still_sees_a_later_read() {
    with_deadline(|| {
        same_as_libc(
            select_on_a_hang_up_and_a_later_read,
            (1, 0, true, false),
            "select of a hung-up socket (exception set) and a later read",
        );
    });
}
