#![cfg(feature = "hook")]
//! Calls that move data between two fds in the kernel (`splice`, `tee`, `sendfile`, which
//! std's `io::copy` uses), `vmsplice`, and the batched `recvmmsg`/`sendmmsg`, on fds the
//! hooks switched to non-blocking mode: they keep their blocking meaning, in a fiber (parked,
//! the worker free) and on a plain thread, where the kernel alone would fail them with
//! `EAGAIN` part-way.
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream, UdpSocket};
use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::common::{errno, finish, same_as_libc, started, with_deadline};

/// What the copies move: more than a socket's and a pipe's buffers hold together.
const TOTAL: usize = 8 << 20;

/// The byte at `i` of the copies' stream.
fn byte(i: usize) -> u8 {
    (i % 251) as u8
}

/// Writes `TOTAL` bytes of the pattern to `w`.
fn write_pattern(mut w: impl Write) {
    let chunk: Vec<u8> = (0..64 * 1024).map(byte).collect();
    let mut sent = 0;
    while sent < TOTAL {
        // 64 KiB is a multiple of nothing in particular: the pattern restarts each chunk,
        // and `check_pattern` follows it the same way.
        let n = chunk.len().min(TOTAL - sent);
        w.write_all(&chunk[..n]).unwrap();
        sent += n;
    }
}

/// Reads `r` to its end, slowly at first (so that the writer's buffers fill and its calls
/// would block), handing `check` each chunk with its offset in the stream: the byte count.
fn read_slowly(mut r: impl Read, check: impl Fn(usize, &[u8])) -> usize {
    let mut buf = vec![0u8; 64 * 1024];
    let mut got = 0;
    let mut reads = 0;
    loop {
        if reads < 20 {
            std::thread::sleep(Duration::from_millis(5));
        }
        reads += 1;
        let n = r.read(&mut buf).unwrap();
        if n == 0 {
            return got;
        }
        check(got, &buf[..n]);
        got += n;
    }
}

/// Reads `r` as [`read_slowly`], checking the pattern `write_pattern` wrote.
fn check_pattern(r: impl Read) -> usize {
    read_slowly(r, |at, chunk| {
        for (k, b) in chunk.iter().enumerate() {
            assert_eq!(
                *b,
                byte((at + k) % (64 * 1024)),
                "byte {} of the stream",
                at + k
            );
        }
    })
}

/// A loopback listener and a thread that accepts one connection and checks the pattern on it.
fn pattern_sink() -> (std::net::SocketAddr, std::thread::JoinHandle<usize>) {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    let sink = std::thread::spawn(move || check_pattern(l.accept().unwrap().0));
    (addr, sink)
}

/// A fiber on one worker that counts while `f` runs in another fiber of the same worker;
/// `f` gets the count, to wait for it (which it can only see grow while it is parked).
fn with_a_sibling<T: Send + 'static>(
    f: impl FnOnce(Arc<AtomicUsize>) -> T + Send + 'static,
) -> (T, usize) {
    let s = started(1);
    let ticks = Arc::new(AtomicUsize::new(0));
    let done = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let sibling = {
        let (ticks, done) = (ticks.clone(), done.clone());
        s.submit(
            move || {
                while !done.load(Ordering::Relaxed) {
                    ticks.fetch_add(1, Ordering::Relaxed);
                    fibra::sleep(Duration::from_millis(1));
                }
            },
            None,
        )
        .unwrap()
    };
    let t = ticks.clone();
    let r = finish(s.submit(move || f(t), None).unwrap());
    done.store(true, Ordering::Relaxed);
    finish(sibling);
    s.stop();
    (r, ticks.load(Ordering::Relaxed))
}

/// Waits (on a plain thread) until `ticks` has grown by 5: the sibling fiber ran.
fn sibling_ran(ticks: &AtomicUsize) {
    let from = ticks.load(Ordering::Relaxed);
    let t = Instant::now();
    while ticks.load(Ordering::Relaxed) < from + 5 {
        assert!(
            t.elapsed() < Duration::from_secs(30),
            "the worker stayed blocked"
        );
        std::thread::sleep(Duration::from_millis(1));
    }
}

#[test]
fn io_copy_from_a_child_process_pipe_to_a_switched_tcp_stream_copies_everything() {
    // The report: `std::io::copy` from a child's stdout to a TcpStream connected in a fiber
    // (the hooked connect switched it) stopped with WouldBlock after about 4 MB of 8.
    with_deadline(|| {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        let sink = std::thread::spawn(move || {
            read_slowly(l.accept().unwrap().0, |_, chunk| {
                assert!(chunk.iter().all(|b| *b == 0))
            })
        });
        let s = started(2);
        let copied = finish(
            s.submit(
                move || {
                    let mut out = TcpStream::connect(addr).unwrap();
                    let mut child = std::process::Command::new("head")
                        .args(["-c", &TOTAL.to_string(), "/dev/zero"])
                        .stdout(std::process::Stdio::piped())
                        .spawn()
                        .unwrap();
                    let n = std::io::copy(child.stdout.as_mut().unwrap(), &mut out).unwrap();
                    assert!(child.wait().unwrap().success());
                    n
                },
                None,
            )
            .unwrap(),
        );
        s.stop();
        assert_eq!(copied, TOTAL as u64);
        assert_eq!(sink.join().unwrap(), TOTAL);
    });
}

#[test]
fn io_copy_from_a_pipe_to_a_switched_tcp_stream_parks_only_the_fiber() {
    // splice(pipe → socket): either side may hold it up; the writer starts only once the
    // sibling fiber ran while the copy waited, so a blocked worker would hang the test.
    with_deadline(|| {
        let (addr, sink) = pattern_sink();
        let ((copied, writer), ticks) = with_a_sibling(move |ticks| {
            let (r, w) = std::io::pipe().unwrap();
            let writer = std::thread::spawn(move || {
                sibling_ran(&ticks);
                write_pattern(w);
            });
            let mut out = TcpStream::connect(addr).unwrap();
            let mut r = r;
            (std::io::copy(&mut r, &mut out).unwrap(), writer)
        });
        writer.join().unwrap();
        assert_eq!(copied, TOTAL as u64);
        assert_eq!(sink.join().unwrap(), TOTAL);
        assert!(ticks >= 5);
    });
}

#[test]
fn io_copy_from_a_switched_tcp_stream_to_a_pipe_copies_everything() {
    // splice(socket → pipe), with a slow reader of the pipe. The fiber reads a first byte
    // itself: that hooked read switches the socket.
    with_deadline(|| {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        let sender = std::thread::spawn(move || {
            let mut c = TcpStream::connect(addr).unwrap();
            c.write_all(b"h").unwrap();
            write_pattern(c)
        });
        let (r, w) = std::io::pipe().unwrap();
        let sink = std::thread::spawn(move || check_pattern(r));
        let (copied, _) = with_a_sibling(move |_| {
            let mut inp = l.accept().unwrap().0;
            let mut first = [0u8];
            inp.read_exact(&mut first).unwrap();
            assert_eq!(&first, b"h");
            let mut w = w;
            std::io::copy(&mut inp, &mut w).unwrap()
        });
        sender.join().unwrap();
        assert_eq!(copied, TOTAL as u64);
        assert_eq!(sink.join().unwrap(), TOTAL);
    });
}

/// A file of `TOTAL` pattern bytes, removed when dropped.
struct PatternFile(std::path::PathBuf);

impl PatternFile {
    fn new(what: &str) -> Self {
        let path = std::env::temp_dir().join(format!("fibra-{what}-{}", std::process::id()));
        write_pattern(std::fs::File::create(&path).unwrap());
        PatternFile(path)
    }
}

impl Drop for PatternFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

#[test]
fn io_copy_from_a_file_to_a_switched_tcp_stream_sends_it_whole() {
    with_deadline(|| {
        let file = Arc::new(PatternFile::new("copy"));
        let (addr, sink) = pattern_sink();
        let f = file.clone();
        let (copied, _) = with_a_sibling(move |_| {
            let mut f = std::fs::File::open(&f.0).unwrap();
            let mut out = TcpStream::connect(addr).unwrap();
            std::io::copy(&mut f, &mut out).unwrap()
        });
        assert_eq!(copied, TOTAL as u64);
        assert_eq!(sink.join().unwrap(), TOTAL);
    });
}

#[test]
fn one_sendfile_to_a_switched_socket_sends_all_it_was_asked_for() {
    // A blocking sendfile returns once it sent everything (or the file ended), as on a
    // plain thread's blocking socket; the kernel alone returns part-way on a switched one.
    fn send_all(path: &std::path::Path) -> isize {
        let (addr, sink) = pattern_sink();
        let f = std::fs::File::open(path).unwrap();
        let out = TcpStream::connect(addr).unwrap();
        // A hooked call on a plain thread's socket changes nothing; in a fiber the connect
        // already switched it.
        // SAFETY: live fds; a null offset: the file's own.
        let n = unsafe {
            libc::sendfile(
                out.as_raw_fd(),
                f.as_raw_fd(),
                std::ptr::null_mut(),
                TOTAL + 10,
            )
        };
        drop(out);
        assert_eq!(sink.join().unwrap(), TOTAL);
        n
    }
    with_deadline(|| {
        let file = PatternFile::new("sendfile");
        assert_eq!(send_all(&file.0), TOTAL as isize, "a plain thread's");
        let path = file.0.clone();
        let (n, _) = with_a_sibling(move |_| send_all(&path));
        assert_eq!(n, TOTAL as isize, "a fiber's");
    });
}

#[test]
fn a_plain_thread_copies_into_a_stream_a_fiber_switched() {
    // Connected in a fiber (switched there), then handed to a plain thread: its copy blocks
    // as on any blocking socket.
    with_deadline(|| {
        let (addr, sink) = pattern_sink();
        let s = started(1);
        let out = finish(
            s.submit(move || TcpStream::connect(addr).unwrap(), None)
                .unwrap(),
        );
        s.stop();
        let (r, w) = std::io::pipe().unwrap();
        let writer = std::thread::spawn(move || write_pattern(w));
        let mut out = out;
        let mut r = r;
        assert_eq!(std::io::copy(&mut r, &mut out).unwrap(), TOTAL as u64);
        drop(out);
        writer.join().unwrap();
        assert_eq!(sink.join().unwrap(), TOTAL);
    });
}

/// A pipe, both ends raw.
fn pipe() -> (RawFd, RawFd) {
    let mut p = [0; 2];
    // SAFETY: room for two fds.
    assert_eq!(unsafe { libc::pipe(p.as_mut_ptr()) }, 0);
    (p[0], p[1])
}

/// Fills a pipe's write end `w` (made non-blocking for the fill, then blocking again).
fn fill(w: RawFd) -> usize {
    // SAFETY: fcntl on a live fd.
    unsafe { libc::fcntl(w, libc::F_SETFL, libc::O_NONBLOCK) };
    let buf = [7u8; 4096];
    let mut n = 0;
    loop {
        // SAFETY: a live buffer.
        let r = unsafe { libc::write(w, buf.as_ptr().cast(), buf.len()) };
        if r <= 0 {
            break;
        }
        n += r as usize;
    }
    // SAFETY: as above.
    unsafe { libc::fcntl(w, libc::F_SETFL, 0) };
    n
}

/// Drains `n` bytes from the read end `r` on a plain thread once `ticks` grew.
fn drain_later(r: RawFd, n: usize, ticks: Arc<AtomicUsize>) -> std::thread::JoinHandle<()> {
    std::thread::spawn(move || {
        sibling_ran(&ticks);
        let mut buf = vec![0u8; n];
        let mut got = 0;
        while got < n {
            // SAFETY: a live buffer of `n - got` bytes past `got`.
            let r = unsafe { libc::read(r, buf[got..].as_mut_ptr().cast(), n - got) };
            assert!(r > 0, "errno {}", errno());
            got += r as usize;
        }
    })
}

#[test]
fn vmsplice_into_a_full_switched_pipe_parks_only_the_fiber() {
    // The kernel's vmsplice waits for room whatever the file's mode: unhooked, it would block
    // the worker (and the drain below, which waits for the sibling, would never start).
    with_deadline(|| {
        let (r, w) = pipe();
        let ((n, drained, _data), ticks) = with_a_sibling(move |ticks| {
            // A first hooked call switches the pipe; then it is filled to the brim.
            // SAFETY: a zero-length write on a live fd.
            assert_eq!(unsafe { libc::write(w, [].as_ptr(), 0) }, 0);
            let full = fill(w);
            let drain = drain_later(r, full, ticks);
            // vmsplice maps the pages, which the reader copies later: they must outlive
            // the fiber.
            let data = vec![9u8; 100];
            let iov = libc::iovec {
                iov_base: data.as_ptr() as *mut _,
                iov_len: data.len(),
            };
            // SAFETY: one live iovec.
            let n = unsafe { libc::vmsplice(w, &iov, 1, 0) };
            (n, drain, data)
        });
        drained.join().unwrap();
        assert_eq!(n, 100, "errno {}", errno());
        assert!(ticks >= 5);
        let mut buf = [0u8; 100];
        // SAFETY: a live buffer.
        assert_eq!(unsafe { libc::read(r, buf.as_mut_ptr().cast(), 100) }, 100);
        assert_eq!(buf, [9u8; 100]);
        // SAFETY: our fds.
        unsafe { (libc::close(r), libc::close(w)) };
    });
}

#[test]
fn tee_from_an_empty_switched_pipe_waits_for_data() {
    with_deadline(|| {
        let ((a_r, a_w), (b_r, b_w)) = (pipe(), pipe());
        let ((n, writer), _) = with_a_sibling(move |ticks| {
            let writer = std::thread::spawn(move || {
                sibling_ran(&ticks);
                // SAFETY: a live buffer.
                assert_eq!(unsafe { libc::write(a_w, b"hello".as_ptr().cast(), 5) }, 5);
            });
            // SAFETY: live pipes.
            (unsafe { libc::tee(a_r, b_w, 100, 0) }, writer)
        });
        writer.join().unwrap();
        assert_eq!(n, 5, "errno {}", errno());
        let mut buf = [0u8; 5];
        // SAFETY: a live buffer.
        assert_eq!(unsafe { libc::read(b_r, buf.as_mut_ptr().cast(), 5) }, 5);
        assert_eq!(&buf, b"hello");
        for fd in [a_r, a_w, b_r, b_w] {
            // SAFETY: our fds.
            unsafe { libc::close(fd) };
        }
    });
}

#[test]
fn splice_with_its_non_blocking_flag_or_a_non_blocking_user_fd_fails_at_once() {
    // The caller's own non-blocking choices stand: EAGAIN at once, in a fiber as on a thread.
    fn attempt() -> Vec<(isize, i32)> {
        let (r, w) = pipe();
        let (a, b) = UnixStream::pair().unwrap();
        // SAFETY: live fds; an empty pipe and a socket with room.
        let flagged = unsafe {
            libc::splice(
                r,
                std::ptr::null_mut(),
                a.as_raw_fd(),
                std::ptr::null_mut(),
                10,
                libc::SPLICE_F_NONBLOCK,
            )
        };
        let e1 = errno();
        b.set_nonblocking(true).unwrap();
        // SAFETY: as above: the socket is empty.
        let user = unsafe {
            libc::splice(
                b.as_raw_fd(),
                std::ptr::null_mut(),
                w,
                std::ptr::null_mut(),
                10,
                0,
            )
        };
        let e2 = errno();
        // SAFETY: our fds.
        unsafe { (libc::close(r), libc::close(w)) };
        vec![(flagged, e1), (user, e2)]
    }
    with_deadline(|| {
        same_as_libc(
            attempt,
            vec![(-1, libc::EAGAIN), (-1, libc::EAGAIN)],
            "non-blocking splices",
        )
    });
}

#[test]
fn copy_file_range_refuses_pipes_and_sockets_as_libc_does() {
    // It works on regular files only, which never wait: nothing to hook.
    fn attempt() -> (isize, i32) {
        let (r, w) = pipe();
        // SAFETY: live fds.
        let n = unsafe {
            libc::copy_file_range(r, std::ptr::null_mut(), w, std::ptr::null_mut(), 10, 0)
        };
        let e = errno();
        // SAFETY: our fds.
        unsafe { (libc::close(r), libc::close(w)) };
        (n, e)
    }
    with_deadline(|| same_as_libc(attempt, (-1, libc::EINVAL), "copy_file_range"));
}

/// Two UDP sockets on loopback: (receiver, sender connected to it).
/// In a fiber, a first datagram each way, sent and received with hooked calls, switches both.
fn udp_pair() -> (UdpSocket, UdpSocket) {
    let rx = UdpSocket::bind("127.0.0.1:0").unwrap();
    let tx = UdpSocket::bind("127.0.0.1:0").unwrap();
    tx.connect(rx.local_addr().unwrap()).unwrap();
    rx.connect(tx.local_addr().unwrap()).unwrap();
    for (a, b) in [(&tx, &rx), (&rx, &tx)] {
        a.send(b"w").unwrap();
        assert_eq!(b.recv(&mut [0u8; 4]).unwrap(), 1);
    }
    (rx, tx)
}

/// A batched call's result, `errno` (0 if it succeeded) and each message's `msg_len`.
type Batch = (i32, i32, Vec<u32>);

/// `recvmmsg` of up to `n` datagrams of 16 bytes: (result, errno, the lengths received).
fn recvmmsg(rx: &UdpSocket, n: usize, flags: i32, timeout: Option<Duration>) -> Batch {
    let mut bufs = vec![[0u8; 16]; n];
    let mut iovs: Vec<libc::iovec> = bufs
        .iter_mut()
        .map(|b| libc::iovec {
            iov_base: b.as_mut_ptr().cast(),
            iov_len: b.len(),
        })
        .collect();
    // SAFETY: all-zero mmsghdrs are valid; each gets one live iovec.
    let mut msgs: Vec<libc::mmsghdr> = (0..n).map(|_| unsafe { std::mem::zeroed() }).collect();
    for (m, v) in msgs.iter_mut().zip(iovs.iter_mut()) {
        m.msg_hdr.msg_iov = v;
        m.msg_hdr.msg_iovlen = 1;
    }
    let mut ts = timeout.map(|t| libc::timespec {
        tv_sec: t.as_secs() as _,
        tv_nsec: t.subsec_nanos() as _,
    });
    let tsp = ts.as_mut().map_or(std::ptr::null_mut(), |t| t as *mut _);
    // SAFETY: live messages and timeout.
    let r = unsafe { libc::recvmmsg(rx.as_raw_fd(), msgs.as_mut_ptr(), n as u32, flags, tsp) };
    let e = if r < 0 { errno() } else { 0 };
    let got = usize::try_from(r).unwrap_or(0);
    (r, e, msgs[..got].iter().map(|m| m.msg_len).collect())
}

/// A thread that sends a datagram of `len` bytes after each delay in `ms` (from the last).
fn send_later(tx: UdpSocket, plan: &'static [(u64, usize)]) -> std::thread::JoinHandle<()> {
    std::thread::spawn(move || {
        for &(ms, len) in plan {
            std::thread::sleep(Duration::from_millis(ms));
            tx.send(&[1u8; 16][..len]).unwrap();
        }
    })
}

/// The cases of a blocking `recvmmsg` on a fresh socket: (result, errno, lengths).
fn recvmmsg_battery() -> Vec<Batch> {
    let mut out = Vec::new();
    // Waits for all three, which come 30 ms apart.
    let (rx, tx) = udp_pair();
    let t = send_later(tx, &[(30, 3), (30, 4), (30, 5)]);
    out.push(recvmmsg(&rx, 3, 0, None));
    t.join().unwrap();
    // MSG_WAITFORONE: the first, and what came with it (nothing more for 500 ms).
    let (rx, tx) = udp_pair();
    let t = send_later(tx, &[(30, 6), (500, 7)]);
    out.push(recvmmsg(&rx, 4, libc::MSG_WAITFORONE, None));
    t.join().unwrap();
    // A timeout that passes between the first and second: the kernel checks it only as each
    // message comes, so the call returns with the second.
    let (rx, tx) = udp_pair();
    let t = send_later(tx, &[(20, 8), (150, 9), (0, 10)]);
    out.push(recvmmsg(&rx, 4, 0, Some(Duration::from_millis(60))));
    t.join().unwrap();
    // MSG_DONTWAIT on an empty socket, and zero messages.
    let (rx, _tx) = udp_pair();
    out.push(recvmmsg(&rx, 2, libc::MSG_DONTWAIT, None));
    out.push(recvmmsg(&rx, 0, 0, None));
    out
}

#[test]
fn recvmmsg_on_a_switched_udp_socket_waits_as_libc() {
    // The report: it returned EAGAIN at once.
    with_deadline(|| {
        same_as_libc(
            recvmmsg_battery,
            vec![
                (3, 0, vec![3, 4, 5]),
                (1, 0, vec![6]),
                (2, 0, vec![8, 9]),
                (-1, libc::EAGAIN, vec![]),
                (0, 0, vec![]),
            ],
            "recvmmsg",
        )
    });
}

/// `sendmmsg` of `sizes.len()` messages on `fd`, message `i` of `sizes[i]` bytes of the
/// pattern, continuing it: (result, errno, each message's `msg_len`).
fn sendmmsg(fd: RawFd, sizes: &[usize]) -> Batch {
    let mut from = 0;
    let mut bufs: Vec<Vec<u8>> = Vec::new();
    for &n in sizes {
        bufs.push((from..from + n).map(|i| byte(i % (64 * 1024))).collect());
        from += n;
    }
    let mut iovs: Vec<libc::iovec> = bufs
        .iter_mut()
        .map(|b| libc::iovec {
            iov_base: b.as_mut_ptr().cast(),
            iov_len: b.len(),
        })
        .collect();
    // SAFETY: all-zero mmsghdrs are valid; each gets one live iovec.
    let mut msgs: Vec<libc::mmsghdr> = (0..sizes.len())
        .map(|_| unsafe { std::mem::zeroed() })
        .collect();
    for (m, v) in msgs.iter_mut().zip(iovs.iter_mut()) {
        m.msg_hdr.msg_iov = v;
        m.msg_hdr.msg_iovlen = 1;
    }
    // SAFETY: live messages.
    let r = unsafe { libc::sendmmsg(fd, msgs.as_mut_ptr(), sizes.len() as u32, 0) };
    let e = if r < 0 { errno() } else { 0 };
    (r, e, msgs.iter().map(|m| m.msg_len).collect())
}

/// A blocking `sendmmsg` of four 1 MiB messages on a stream socket whose reader is slow,
/// and of three datagrams: (stream result, bytes the reader checked, datagram result).
fn sendmmsg_battery() -> (Batch, usize, Batch) {
    let (a, b) = UnixStream::pair().unwrap();
    // In a fiber, a first hooked call switches the socket.
    // SAFETY: a zero-length write on a live fd.
    assert_eq!(unsafe { libc::write(a.as_raw_fd(), [].as_ptr(), 0) }, 0);
    let reader = std::thread::spawn(move || check_pattern(b));
    let stream = sendmmsg(a.as_raw_fd(), &[1 << 20; 4]);
    drop(a);
    let checked = reader.join().unwrap();
    let (rx, tx) = udp_pair();
    let dgrams = sendmmsg(tx.as_raw_fd(), &[3, 0, 5]);
    assert_eq!(recvmmsg(&rx, 3, 0, None).2, vec![3, 0, 5]);
    (stream, checked, dgrams)
}

#[test]
fn sendmmsg_on_switched_sockets_sends_every_message_whole_as_libc() {
    with_deadline(|| {
        same_as_libc(
            sendmmsg_battery,
            ((4, 0, vec![1 << 20; 4]), 4 << 20, (3, 0, vec![3, 0, 5])),
            "sendmmsg",
        )
    });
}

#[test]
fn a_fiber_cancelled_in_a_splice_ends_cancelled_and_the_call_fails_with_ecanceled() {
    with_deadline(|| {
        let (addr, sink) = pattern_sink();
        let s = started(1);
        let (r, w) = std::io::pipe().unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        let copier = s
            .submit(
                move || {
                    let mut out = TcpStream::connect(addr).unwrap();
                    let mut r = r;
                    // The pipe stays empty: the copy waits until cancelled.
                    let e = std::io::copy(&mut r, &mut out).unwrap_err();
                    tx.send(e.raw_os_error()).unwrap();
                    // The cancellation is raised at the next suspension in fibra's code.
                    fibra::Fiber::yield_now();
                    unreachable!("cancelled at the yield");
                },
                None,
            )
            .unwrap();
        crate::common::parked_on_io(&s, 1);
        copier.cancel();
        assert!(copier.join().unwrap_err().is_cancelled());
        assert_eq!(rx.recv().unwrap(), Some(libc::ECANCELED));
        drop(w);
        s.stop();
        assert_eq!(sink.join().unwrap(), 0);
    });
}

/// A splice from a pipe with data into a socket that is full, whose peer never reads and
/// whose send timeout is 100 ms: (result, errno, whether it took the timeout).
fn splice_into_a_full_socket() -> (isize, i32, bool) {
    let (a, _b) = UnixStream::pair().unwrap();
    let fd = a.as_raw_fd();
    // SAFETY: a zero-length write on a live fd (in a fiber, it switches the socket).
    assert_eq!(unsafe { libc::write(fd, [].as_ptr(), 0) }, 0);
    let chunk = [1u8; 4096];
    // SAFETY: a live buffer; MSG_DONTWAIT fills the socket without waiting.
    while unsafe { libc::send(fd, chunk.as_ptr().cast(), chunk.len(), libc::MSG_DONTWAIT) } > 0 {}
    crate::common::set_socket_timeout(fd, libc::SO_SNDTIMEO, Duration::from_millis(100));
    let (r, w) = pipe();
    // SAFETY: a live buffer.
    assert_eq!(unsafe { libc::write(w, chunk.as_ptr().cast(), 100) }, 100);
    let t = Instant::now();
    // SAFETY: live fds.
    let n = unsafe { libc::splice(r, std::ptr::null_mut(), fd, std::ptr::null_mut(), 100, 0) };
    let e = if n < 0 { errno() } else { 0 };
    let waited = t.elapsed() >= Duration::from_millis(90);
    // SAFETY: our fds.
    unsafe { (libc::close(r), libc::close(w)) };
    (n, e, waited)
}

#[test]
fn a_splice_into_a_full_socket_ends_at_its_send_timeout_as_libc() {
    with_deadline(|| {
        same_as_libc(
            splice_into_a_full_socket,
            (-1, libc::EAGAIN, true),
            "SO_SNDTIMEO",
        )
    });
}
