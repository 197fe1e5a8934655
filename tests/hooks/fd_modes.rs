#![cfg(feature = "hook")]
//! The `hook` feature's view of an fd's blocking mode, which belongs to the open file
//! (duplicates, fds received over `SCM_RIGHTS`, stale numbers, failed calls, `fork`), calls
//! that meet fibra's switch in the kernel, and the other names of hooked calls (`fcntl64`,
//! the `_FORTIFY_SOURCE` forms). Each compares a hooked call with what libc's own call does;
//! the `fork` and `fcntl64` checks run in a child process.

use std::io::{Read, Write};
use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicBool, AtomicI32, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::common::{both, child_ok, errno, finish, same_as_libc, shared_started, with_deadline};

fn getfl_nb(fd: RawFd) -> bool {
    // SAFETY: F_GETFL on an fd number.
    unsafe { libc::fcntl(fd, libc::F_GETFL) & libc::O_NONBLOCK != 0 }
}

/// Writes one byte on `peer` after `ms` milliseconds from a plain thread.
fn write_later(mut peer: UnixStream, ms: u64) -> std::thread::JoinHandle<UnixStream> {
    std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(ms));
        let _ = peer.write_all(b"L");
        peer
    })
}

/// One read of one byte on `fd` (hooked libc read), as a result.
fn read1(fd: RawFd) -> Result<usize, i32> {
    let mut b = [0u8; 1];
    // SAFETY: a live one-byte buffer.
    let r = unsafe { libc::read(fd, b.as_mut_ptr().cast(), 1) };
    if r < 0 {
        Err(errno())
    } else {
        Ok(r as usize)
    }
}

/// Switches `a` (in a fiber; on a plain thread a plain use): the peer writes a byte, `a`
/// reads it.
fn touch(a: &mut UnixStream, b: &mut UnixStream) {
    b.write_all(b"1").unwrap();
    let mut one = [0u8; 1];
    a.read_exact(&mut one).unwrap();
}

// ---------------------------------------------------------------------------------------
// A duplicate made before the switch
// ---------------------------------------------------------------------------------------

/// `try_clone` of a socket nobody used yet, then the original is used (in a fiber: switched),
/// then the copy is read: the copy is blocking in the user's view, so the read must wait.
fn dup_before_switch() -> (bool, Result<usize, i32>) {
    let (mut a, mut b) = UnixStream::pair().unwrap();
    let copy = a.try_clone().unwrap();
    touch(&mut a, &mut b);
    let shows_nb = getfl_nb(copy.as_raw_fd());
    let w = write_later(b, 300);
    let r = read1(copy.as_raw_fd());
    let _b = w.join().unwrap();
    (shows_nb, r)
}

#[test]
fn a_duplicate_made_before_the_switch_keeps_blocking() {
    with_deadline(|| {
        same_as_libc(
            dup_before_switch,
            (false, Ok(1)),
            "read of a copy made before the switch",
        );
    });
}

/// The same, with the copy read on a plain thread after a fiber switched the original.
#[test]
fn a_duplicate_made_before_the_switch_blocks_on_a_plain_thread() {
    with_deadline(|| {
        let s = shared_started(1);
        let (a, b) = UnixStream::pair().unwrap();
        let copy = a.try_clone().unwrap();
        let (mut a, mut b) = s.block_on(move || {
            let (mut a, mut b) = (a, b);
            touch(&mut a, &mut b);
            (a, b)
        });
        let _ = (&mut a, &mut b);
        let shows_nb = getfl_nb(copy.as_raw_fd());
        let w = write_later(b, 300);
        let r = read1(copy.as_raw_fd());
        let _b = w.join().unwrap();
        s.stop();
        assert_eq!(
            (shows_nb, r),
            (false, Ok(1)),
            "libc: blocks, then reads the byte"
        );
    });
}

// ---------------------------------------------------------------------------------------
// F_SETFL that fails in the kernel
// ---------------------------------------------------------------------------------------

/// Switches a socket `a` (in a fiber), makes `call` with its fd (a call that fails), then
/// reports the call's result and errno, whether `a` shows O_NONBLOCK, and how a read of
/// `a` ends when its peer writes late (blocking: it gets the byte).
fn after_failed_call(call: impl FnOnce(RawFd) -> i32) -> (i32, i32, bool, Result<usize, i32>) {
    let (mut a, mut b) = UnixStream::pair().unwrap();
    touch(&mut a, &mut b);
    let r = call(a.as_raw_fd());
    let e = errno();
    let shows_nb = getfl_nb(a.as_raw_fd());
    let w = write_later(b, 300);
    let got = read1(a.as_raw_fd());
    let _b = w.join().unwrap();
    (r, e, shows_nb, got)
}

/// `fcntl(F_SETFL, O_NONBLOCK | O_DIRECT)` on a socket: the kernel refuses O_DIRECT (EINVAL)
/// and changes nothing; the fd stays blocking.
fn setfl_einval() -> (i32, i32, bool, Result<usize, i32>) {
    // SAFETY: F_SETFL on a live fd.
    after_failed_call(|a| unsafe {
        libc::fcntl(a, libc::F_SETFL, libc::O_NONBLOCK | libc::O_DIRECT)
    })
}

#[test]
fn a_failed_setfl_leaves_the_blocking_mode_alone() {
    with_deadline(|| {
        same_as_libc(
            setfl_einval,
            (-1, libc::EINVAL, false, Ok(1)),
            "F_SETFL(O_NONBLOCK|O_DIRECT) on a socket fails with EINVAL",
        );
    });
}

/// A duplicate closed behind the hooks' back, then F_SETFL(O_NONBLOCK) on its (now free)
/// number: libc fails with EBADF and the original is untouched.
fn setfl_ebadf_on_closed_copy() -> (i32, i32, bool, Result<usize, i32>) {
    // SAFETY: plain calls on fds this function owns; `copy` is closed with the raw call.
    after_failed_call(|a| unsafe {
        let copy = libc::dup(a);
        assert_eq!(libc::syscall(libc::SYS_close, copy), 0);
        libc::fcntl(copy, libc::F_SETFL, libc::O_NONBLOCK)
    })
}

#[test]
fn setfl_on_a_closed_duplicate_leaves_the_original_alone() {
    with_deadline(|| {
        same_as_libc(
            setfl_ebadf_on_closed_copy,
            (-1, libc::EBADF, false, Ok(1)),
            "F_SETFL on the number of a duplicate closed behind the hooks' back",
        );
    });
}

/// A temporary regular file, opened with libc's (unhooked) open.
fn temp_file(tag: &str) -> RawFd {
    let path = std::env::temp_dir().join(format!("fibra_hook_views_{tag}_{}", std::process::id()));
    let c = std::ffi::CString::new(path.to_str().unwrap()).unwrap();
    // SAFETY: a live C string.
    let fd = unsafe {
        libc::open(
            c.as_ptr(),
            libc::O_RDWR | libc::O_CREAT | libc::O_CLOEXEC,
            0o600,
        )
    };
    assert!(fd >= 0);
    // SAFETY: as above.
    unsafe { libc::unlink(c.as_ptr()) };
    fd
}

/// A duplicate `copy` of a switched socket is closed behind the hooks' back and its number
/// reused by an unrelated regular file (raw dup3, as a shared library's open would). The
/// user makes the socket non-blocking, then sets O_APPEND on the file: the socket must stay
/// non-blocking (its read fails with EAGAIN at once), and the file must not show O_NONBLOCK.
fn stale_copy_reused_by_a_file() -> (bool, bool, Result<usize, i32>, bool) {
    let (mut a, mut b) = UnixStream::pair().unwrap();
    touch(&mut a, &mut b);
    // SAFETY: plain calls on fds this function owns.
    unsafe {
        let copy = libc::dup(a.as_raw_fd());
        let file = temp_file("stale");
        // Closes `copy` and puts the file in its place, behind the hooks' back.
        assert_eq!(
            libc::syscall(libc::SYS_dup3, file, copy, libc::O_CLOEXEC),
            copy as i64
        );
        libc::syscall(libc::SYS_close, file);
        a.set_nonblocking(true).unwrap();
        assert_eq!(libc::fcntl(copy, libc::F_SETFL, libc::O_APPEND), 0);
        let file_nb = getfl_nb(copy);
        let sock_nb = getfl_nb(a.as_raw_fd());
        let w = write_later(b, 300);
        let got = read1(a.as_raw_fd());
        let _b = w.join().unwrap();
        libc::close(copy);
        (file_nb, sock_nb, got, false)
    }
}

#[test]
fn setfl_on_an_unrelated_fd_reusing_a_stale_number_leaves_the_socket_alone() {
    with_deadline(|| {
        same_as_libc(
            stale_copy_reused_by_a_file,
            (false, true, Err(libc::EAGAIN), false),
            "F_SETFL(O_APPEND) on a regular file at a stale duplicate's number",
        );
    });
}

// ---------------------------------------------------------------------------------------
// dup2/dup3 that fail
// ---------------------------------------------------------------------------------------

/// `dup2(bad, a)` fails with EBADF and leaves `a` alone: it stays blocking.
fn dup2_bad_source() -> (i32, i32, bool, Result<usize, i32>) {
    // SAFETY: a closed fd number as the source: the call fails.
    after_failed_call(|a| unsafe {
        let bad = libc::dup(a);
        libc::close(bad);
        libc::dup2(bad, a)
    })
}

#[test]
fn a_failed_dup2_leaves_the_target_alone() {
    with_deadline(|| {
        same_as_libc(
            dup2_bad_source,
            (-1, libc::EBADF, false, Ok(1)),
            "dup2(closed, a)",
        );
    });
}

/// A fiber parked in a read on `a`; another fiber calls `dup3(a, a, 0)` (EINVAL) and
/// `dup2(closed, a)` (EBADF): the parked read must go on and get the byte written later.
#[test]
fn a_failed_dup2_does_not_wake_a_parked_reader_with_ebadf() {
    with_deadline(|| {
        let s = shared_started(1);
        let (a, b) = UnixStream::pair().unwrap();
        let fd = a.as_raw_fd();
        let reader = s.submit(move || read1(fd), None).unwrap();
        std::thread::sleep(Duration::from_millis(200));
        let h = s
            .submit(
                move || {
                    // SAFETY: calls that fail without touching `fd`.
                    unsafe {
                        let bad = libc::dup(fd);
                        libc::close(bad);
                        let r1 = libc::dup2(bad, fd);
                        let r2 = libc::dup3(fd, fd, 0);
                        (r1, r2)
                    }
                },
                None,
            )
            .unwrap();
        assert_eq!(finish(h), (-1, -1));
        std::thread::sleep(Duration::from_millis(200));
        let early = reader.is_finished();
        (&b).write_all(b"x").unwrap();
        let got = finish(reader);
        s.stop();
        drop(a);
        assert_eq!(
            (early, got),
            (false, Ok(1)),
            "libc: the read waits for the byte"
        );
    });
}

// ---------------------------------------------------------------------------------------
// fork: a number closed and reused in the child
// ---------------------------------------------------------------------------------------

/// A fiber switched socket `a`; the process forks; the child closes `a` and makes a
/// non-blocking pipe whose read end takes `a`'s number. In the child hooks never park, but
/// the table still says "hooked, blocking" for that number: libc's read fails with EAGAIN
/// at once, F_GETFL shows O_NONBLOCK.
#[test]
fn a_forked_child_reusing_a_switched_number_gets_libc_semantics() {
    child_ok(|| {
        let s = shared_started(1);
        let (a, b) = UnixStream::pair().unwrap();
        let (a, _b) = s.block_on(move || {
            let (mut a, mut b) = (a, b);
            touch(&mut a, &mut b);
            (a, b)
        });
        let fd = a.as_raw_fd();
        // SAFETY: the child makes plain calls and leaves with _exit.
        let pid = unsafe { libc::fork() };
        if pid == 0 {
            // SAFETY: as above.
            unsafe {
                libc::alarm(3);
                libc::close(fd);
                let mut p = [0; 2];
                if libc::pipe2(p.as_mut_ptr(), libc::O_NONBLOCK) != 0 {
                    libc::_exit(10);
                }
                if p[0] != fd && libc::dup2(p[0], fd) != fd {
                    libc::_exit(11);
                }
                let nb = libc::fcntl(fd, libc::F_GETFL) & libc::O_NONBLOCK != 0;
                let mut one = [0u8; 1];
                let r = libc::read(fd, one.as_mut_ptr().cast(), 1);
                let e = *libc::__errno_location();
                let code = match (nb, r, e) {
                    (true, -1, libc::EAGAIN) => 0,
                    (false, -1, libc::EAGAIN) => 2,
                    _ => 3,
                };
                libc::_exit(code);
            }
        }
        let mut status = 0;
        // SAFETY: our child.
        unsafe { libc::waitpid(pid, &mut status, 0) };
        s.stop();
        let how = if libc::WIFSIGNALED(status) {
            format!(
                "killed by signal {} (the read hung)",
                libc::WTERMSIG(status)
            )
        } else {
            format!("exit {}", libc::WEXITSTATUS(status))
        };
        assert!(
            libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0,
            "the forked child: {how} (0: EAGAIN and O_NONBLOCK shown, as libc; 2: EAGAIN but F_GETFL hides O_NONBLOCK)"
        );
    });
}

// ---------------------------------------------------------------------------------------
// A plain thread's blocking pipe write while a fiber switches the write end
// ---------------------------------------------------------------------------------------

/// A plain thread writes 1 MiB to a pipe in one blocking `write` (the hooks never touched
/// the pipe: a real blocking write, which fills the pipe and sleeps). A fiber then writes 0
/// bytes to the same write end, which switches its open file to O_NONBLOCK. The reader
/// drains the pipe. libc: the blocking write returns 1 MiB (no signal came).
#[test]
fn a_plain_threads_blocking_pipe_write_is_not_cut_short_by_the_switch() {
    with_deadline(|| pipe_write_while_switched(false)); // control: no switch, all 1 MiB
    with_deadline(|| pipe_write_while_switched(true));
}

fn pipe_write_while_switched(switch: bool) {
    {
        const N: usize = 1 << 20;
        let s = shared_started(1);
        let mut p = [0; 2];
        // SAFETY: a live array.
        assert_eq!(unsafe { libc::pipe2(p.as_mut_ptr(), libc::O_CLOEXEC) }, 0);
        let (r, w) = (p[0], p[1]);
        let done = Arc::new(AtomicBool::new(false));
        let d2 = done.clone();
        let writer = std::thread::spawn(move || {
            let buf = vec![7u8; N];
            // SAFETY: a live buffer.
            let n = unsafe { libc::write(w, buf.as_ptr().cast(), N) };
            d2.store(true, Ordering::SeqCst);
            n
        });
        std::thread::sleep(Duration::from_millis(200));
        if switch {
            let h = s
                // SAFETY: a zero-length write.
                .submit(
                    move || unsafe { libc::write(w, [0u8; 1].as_ptr().cast(), 0) },
                    None,
                )
                .unwrap();
            assert_eq!(finish(h), 0);
        }
        // Drain with raw syscalls (no hooks involved on the read end).
        let mut total = 0usize;
        let mut buf = vec![0u8; 65536];
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let mut pf = libc::pollfd {
                fd: r,
                events: libc::POLLIN,
                revents: 0,
            };
            // SAFETY: raw poll and read on our fd.
            let n = unsafe {
                libc::syscall(libc::SYS_poll, &mut pf, 1, 100);
                if pf.revents & libc::POLLIN != 0 {
                    libc::syscall(libc::SYS_read, r, buf.as_mut_ptr(), buf.len())
                } else {
                    0
                }
            };
            if n > 0 {
                total += n as usize;
                std::thread::sleep(Duration::from_millis(1));
            } else if done.load(Ordering::SeqCst) || Instant::now() > deadline {
                break;
            }
        }
        let n = writer.join().unwrap();
        s.stop();
        // SAFETY: our fds.
        unsafe {
            libc::close(r);
            libc::close(w);
        }
        assert_eq!(
            (n, total),
            (N as isize, N),
            "libc: the blocking write moves all 1 MiB (switch: {switch})"
        );
    }
}

// ---------------------------------------------------------------------------------------
// recvmsg(MSG_WAITALL) with fds and no room for them
// ---------------------------------------------------------------------------------------

/// `recvmsg(MSG_WAITALL)` of 6 bytes with no control buffer on a Unix stream socket; the
/// peer sends "abc" with an fd, then (later) "def". The kernel's receive ends after the part
/// that brought the fd (it drops the fd and sets MSG_CTRUNC): 3 bytes.
fn waitall_fd_then_data(fd_first: bool) -> (isize, bool) {
    let (a, b) = UnixStream::pair().unwrap();
    let a2 = a.try_clone().unwrap();
    // SAFETY: an eventfd to pass.
    let ev = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC) };
    let sender = std::thread::spawn(move || {
        let parts: [&[u8]; 2] = [b"abc", b"def"];
        for (i, part) in parts.iter().enumerate() {
            let iov = [libc::iovec {
                iov_base: part.as_ptr() as *mut _,
                iov_len: 3,
            }];
            if (i == 0) == fd_first {
                assert_eq!(send_with_fd(a2.as_raw_fd(), &iov, ev), 3);
            } else {
                // SAFETY: a live buffer.
                assert_eq!(
                    unsafe { libc::send(a2.as_raw_fd(), part.as_ptr().cast(), 3, 0) },
                    3
                );
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    });
    let mut buf = [0u8; 6];
    let mut iov = libc::iovec {
        iov_base: buf.as_mut_ptr().cast(),
        iov_len: 6,
    };
    // SAFETY: a msghdr over live buffers, no control buffer.
    let (r, flags) = unsafe {
        let mut msg: libc::msghdr = std::mem::zeroed();
        msg.msg_iov = &mut iov;
        msg.msg_iovlen = 1;
        let r = libc::recvmsg(b.as_raw_fd(), &mut msg, libc::MSG_WAITALL);
        (r, msg.msg_flags)
    };
    sender.join().unwrap();
    // SAFETY: ours.
    unsafe { libc::close(ev) };
    drop(a);
    (r, flags & libc::MSG_CTRUNC != 0)
}

fn waitall_fd_first() -> (isize, bool) {
    waitall_fd_then_data(true)
}

fn waitall_fd_second() -> (isize, bool) {
    waitall_fd_then_data(false)
}

#[test]
fn recvmsg_waitall_without_room_for_fds_ends_where_the_kernel_does() {
    with_deadline(|| {
        same_as_libc(
            waitall_fd_first,
            (3, true),
            "fd with the first part, no control buffer",
        );
    });
}

#[test]
fn recvmsg_waitall_without_room_for_fds_reports_ctrunc() {
    with_deadline(|| {
        same_as_libc(
            waitall_fd_second,
            (6, true),
            "fd with the second part, no control buffer",
        );
    });
}

/// `sendmsg` of the buffers `iov` with `fd` in one SCM_RIGHTS message.
fn send_with_fd(sock: RawFd, iov: &[libc::iovec], fd: RawFd) -> isize {
    send_with_fds(sock, iov, &[fd])
}

fn send_with_fds(sock: RawFd, iov: &[libc::iovec], fds: &[RawFd]) -> isize {
    // SAFETY: a msghdr over the caller's live buffers and a control buffer sized for `fds`.
    unsafe {
        let bytes = std::mem::size_of_val(fds) as u32;
        let space = libc::CMSG_SPACE(bytes) as usize;
        let mut cbuf = vec![0u8; space];
        let mut msg: libc::msghdr = std::mem::zeroed();
        msg.msg_iov = iov.as_ptr().cast_mut();
        msg.msg_iovlen = iov.len();
        msg.msg_control = cbuf.as_mut_ptr().cast();
        msg.msg_controllen = space;
        let c = libc::CMSG_FIRSTHDR(&msg);
        (*c).cmsg_level = libc::SOL_SOCKET;
        (*c).cmsg_type = libc::SCM_RIGHTS;
        (*c).cmsg_len = libc::CMSG_LEN(bytes) as usize;
        std::ptr::copy_nonoverlapping(fds.as_ptr(), libc::CMSG_DATA(c).cast::<RawFd>(), fds.len());
        libc::sendmsg(sock, &msg, 0)
    }
}

/// Receives one message with room for `room` fds; returns (bytes, fds, msg_flags).
fn recv_fds(sock: RawFd, room: usize, flags: i32) -> (isize, Vec<RawFd>, i32) {
    // SAFETY: a msghdr over live buffers.
    unsafe {
        let mut byte = [0u8; 16];
        let mut iov = libc::iovec {
            iov_base: byte.as_mut_ptr().cast(),
            iov_len: byte.len(),
        };
        let space = if room == 0 {
            0
        } else {
            libc::CMSG_SPACE((room * 4) as u32) as usize
        };
        let mut cbuf = vec![0u8; space.max(1)];
        let mut msg: libc::msghdr = std::mem::zeroed();
        msg.msg_iov = &mut iov;
        msg.msg_iovlen = 1;
        msg.msg_control = if room == 0 {
            std::ptr::null_mut()
        } else {
            cbuf.as_mut_ptr().cast()
        };
        msg.msg_controllen = space;
        let r = libc::recvmsg(sock, &mut msg, flags | libc::MSG_CMSG_CLOEXEC);
        let mut fds = Vec::new();
        if r >= 0 {
            let mut c = libc::CMSG_FIRSTHDR(&msg);
            while !c.is_null() {
                if (*c).cmsg_type == libc::SCM_RIGHTS {
                    let n = ((*c).cmsg_len - libc::CMSG_LEN(0) as usize) / 4;
                    for i in 0..n {
                        fds.push(std::ptr::read_unaligned(
                            libc::CMSG_DATA(c).cast::<RawFd>().add(i),
                        ));
                    }
                }
                c = libc::CMSG_NXTHDR(&msg, c);
            }
        }
        (r, fds, msg.msg_flags)
    }
}

// ---------------------------------------------------------------------------------------
// SCM_RIGHTS with fds of every kind, at once, peeked, truncated
// ---------------------------------------------------------------------------------------

/// fds of many kinds, each used once (in a fiber: switched where pollable); the second
/// FIFO open file is non-blocking by the user's choice. Returns them and what to close.
fn kinds() -> Vec<RawFd> {
    // SAFETY: plain calls making fds this test owns.
    unsafe {
        let mut v = Vec::new();
        let mut p = [0; 2];
        assert_eq!(libc::pipe2(p.as_mut_ptr(), libc::O_CLOEXEC), 0);
        let one = 1u64;
        assert_eq!(libc::write(p[1], (&one as *const u64).cast(), 1), 1);
        let mut buf = [0u8; 8];
        assert_eq!(libc::read(p[0], buf.as_mut_ptr().cast(), 1), 1);
        v.extend(p);
        let ev = libc::eventfd(0, libc::EFD_CLOEXEC);
        assert_eq!(libc::write(ev, (&one as *const u64).cast(), 8), 8);
        v.push(ev);
        let tfd = libc::timerfd_create(libc::CLOCK_MONOTONIC, libc::TFD_CLOEXEC);
        let spec = libc::itimerspec {
            it_interval: libc::timespec {
                tv_sec: 0,
                tv_nsec: 0,
            },
            it_value: libc::timespec {
                tv_sec: 0,
                tv_nsec: 1_000_000,
            },
        };
        libc::timerfd_settime(tfd, 0, &spec, std::ptr::null_mut());
        assert_eq!(libc::read(tfd, buf.as_mut_ptr().cast(), 8), 8);
        v.push(tfd);
        let ep = libc::epoll_create1(libc::EPOLL_CLOEXEC);
        v.push(ep);
        v.push(temp_file("kinds"));
        let dir = std::ffi::CString::new("/tmp").unwrap();
        v.push(libc::open(
            dir.as_ptr(),
            libc::O_RDONLY | libc::O_DIRECTORY | libc::O_CLOEXEC,
        ));
        let null = std::ffi::CString::new("/dev/null").unwrap();
        let dn = libc::open(null.as_ptr(), libc::O_RDWR | libc::O_CLOEXEC);
        assert_eq!(libc::write(dn, buf.as_ptr().cast(), 1), 1);
        v.push(dn);
        let fifo = std::env::temp_dir().join(format!(
            "fibra_hook_views_fifo_{}_{:?}",
            std::process::id(),
            std::thread::current().id()
        ));
        let fifo = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
        libc::unlink(fifo.as_ptr());
        assert_eq!(libc::mkfifo(fifo.as_ptr(), 0o600), 0);
        let f1 = libc::open(fifo.as_ptr(), libc::O_RDWR | libc::O_CLOEXEC);
        assert_eq!(libc::write(f1, buf.as_ptr().cast(), 1), 1);
        assert_eq!(libc::read(f1, buf.as_mut_ptr().cast(), 1), 1);
        let f2 = libc::open(
            fifo.as_ptr(),
            libc::O_RDONLY | libc::O_NONBLOCK | libc::O_CLOEXEC,
        );
        libc::unlink(fifo.as_ptr());
        v.extend([f1, f2]);
        let (x, y) = UnixStream::pair().unwrap();
        let (mut x, mut y) = (x, y);
        touch(&mut x, &mut y);
        v.push(std::os::fd::IntoRawFd::into_raw_fd(x));
        v.push(std::os::fd::IntoRawFd::into_raw_fd(y));
        assert!(v.iter().all(|&fd| fd >= 0));
        v
    }
}

/// Sends all the kinds at once, 10 times over (100+ fds per message is too many for one
/// cmsg: SCM_MAX_FD is 253), receives them with MSG_PEEK first, then with a control buffer
/// too small (MSG_CTRUNC), then whole; reports what F_GETFL shows of each received fd.
fn scm_rights_kinds() -> Vec<String> {
    let mine = kinds();
    let mut all = Vec::new();
    for _ in 0..10 {
        all.extend(&mine);
    }
    let (s1, s2) = UnixStream::pair().unwrap();
    let mut out = Vec::new();
    let byte = [9u8; 1];
    let iov = [libc::iovec {
        iov_base: byte.as_ptr() as *mut _,
        iov_len: 1,
    }];
    for _ in 0..3 {
        assert_eq!(send_with_fds(s1.as_raw_fd(), &iov, &all), 1);
    }
    let show = |fds: &[RawFd]| -> String {
        fds.iter()
            .take(mine.len())
            .map(|&fd| if getfl_nb(fd) { 'N' } else { 'b' })
            .collect()
    };
    let close = |fds: &[RawFd]| {
        for &fd in fds {
            // SAFETY: received fds we own.
            unsafe { libc::close(fd) };
        }
    };
    // Peek: the kernel installs copies.
    let (r, fds, fl) = recv_fds(s2.as_raw_fd(), all.len(), libc::MSG_PEEK);
    out.push(format!(
        "peek {r} {} ctrunc={} {}",
        fds.len(),
        fl & libc::MSG_CTRUNC != 0,
        show(&fds)
    ));
    close(&fds);
    // Too small: 5 fds fit.
    let (r, fds, fl) = recv_fds(s2.as_raw_fd(), 5, 0);
    out.push(format!(
        "small {r} {} ctrunc={} {}",
        fds.len(),
        fl & libc::MSG_CTRUNC != 0,
        show(&fds)
    ));
    close(&fds);
    // No control buffer at all.
    let (r, fds, fl) = recv_fds(s2.as_raw_fd(), 0, 0);
    out.push(format!(
        "none {r} {} ctrunc={}",
        fds.len(),
        fl & libc::MSG_CTRUNC != 0
    ));
    close(&fds);
    let (r, fds, fl) = recv_fds(s2.as_raw_fd(), all.len(), 0);
    out.push(format!(
        "whole {r} {} ctrunc={} {}",
        fds.len(),
        fl & libc::MSG_CTRUNC != 0,
        show(&fds)
    ));
    // A blocking read on each received pipe read end / socket must wait, not fail.
    let w = mine[1];
    let later = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(300));
        // SAFETY: a raw one-byte write to our pipe's write end.
        unsafe { libc::syscall(libc::SYS_write, w, b"z".as_ptr(), 1) };
    });
    let t = Instant::now();
    let r = read1(fds[0]);
    later.join().unwrap();
    out.push(format!(
        "read of the received pipe end: {:?} early={}",
        r,
        t.elapsed() < Duration::from_millis(100) && r.is_err()
    ));
    close(&fds);
    close(&mine);
    out
}

#[test]
fn scm_rights_of_every_kind_peeked_truncated_and_whole_match_libc() {
    with_deadline(|| {
        let (fib, plain) = both(scm_rights_kinds);
        eprintln!("{fib:?}");
        assert_eq!(fib, plain, "fiber vs libc");
    });
}

/// A datagram with fds and no data (unix SOCK_DGRAM), of a switched socket.
fn dgram_fd_no_data() -> (isize, usize, bool) {
    let (mut x, mut y) = UnixStream::pair().unwrap();
    touch(&mut x, &mut y);
    let (d1, d2) = std::os::unix::net::UnixDatagram::pair().unwrap();
    assert_eq!(send_with_fds(d1.as_raw_fd(), &[], &[x.as_raw_fd()]), 0);
    let (r, fds, _) = recv_fds(d2.as_raw_fd(), 1, 0);
    let nb = fds.first().is_some_and(|&fd| getfl_nb(fd));
    for fd in &fds {
        // SAFETY: ours.
        unsafe { libc::close(*fd) };
    }
    (r, fds.len(), nb)
}

#[test]
fn a_datagram_with_an_fd_and_no_data_matches_libc() {
    with_deadline(|| same_as_libc(dgram_fd_no_data, (0, 1, false), "empty datagram with an fd"));
}

// ---------------------------------------------------------------------------------------
// Timed plain-thread calls while a fiber switches the fd
// ---------------------------------------------------------------------------------------

/// accept (SO_RCVTIMEO) and a write on a full socket (SO_SNDTIMEO) on a plain thread, in the
/// kernel when a fiber switches the fd (a zero-length write / a read of the listener): each
/// ends with EAGAIN once, at its own timeout.
#[test]
fn timed_plain_thread_accept_and_write_end_once_after_a_switch() {
    with_deadline(|| {
        const TIMEOUT: Duration = Duration::from_millis(800);
        let s = shared_started(1);
        // accept
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let lfd = l.as_raw_fd();
        crate::common::set_socket_timeout(lfd, libc::SO_RCVTIMEO, TIMEOUT);
        let acc = std::thread::spawn(move || {
            let t = Instant::now();
            // SAFETY: no address wanted.
            let r = unsafe { libc::accept(lfd, std::ptr::null_mut(), std::ptr::null_mut()) };
            (r, errno(), t.elapsed())
        });
        // write
        let (a, _b) = UnixStream::pair().unwrap();
        let afd = a.as_raw_fd();
        a.set_nonblocking(true).unwrap();
        let chunk = [0u8; 4096];
        while (&a).write(&chunk).is_ok() {}
        a.set_nonblocking(false).unwrap();
        crate::common::set_socket_timeout(afd, libc::SO_SNDTIMEO, TIMEOUT);
        let wr = std::thread::spawn(move || {
            let t = Instant::now();
            // SAFETY: a live buffer.
            let r = unsafe { libc::write(afd, chunk.as_ptr().cast(), chunk.len()) };
            (r as i32, errno(), t.elapsed())
        });
        std::thread::sleep(Duration::from_millis(200));
        let h = s
            .submit(
                move || {
                    let mut b = [0u8; 1];
                    // SAFETY: calls that switch the fds and return at once.
                    unsafe {
                        libc::write(afd, b.as_ptr().cast(), 0);
                        libc::read(lfd, b.as_mut_ptr().cast(), 1);
                    }
                },
                None,
            )
            .unwrap();
        finish(h);
        for (what, (r, e, took)) in [
            ("accept", acc.join().unwrap()),
            ("write", wr.join().unwrap()),
        ] {
            assert_eq!((r, e), (-1, libc::EAGAIN), "{what}: libc's timeout");
            assert!(
                took >= TIMEOUT - Duration::from_millis(50)
                    && took < TIMEOUT * 2 - Duration::from_millis(100),
                "{what} ended after {took:?}; its timeout is {TIMEOUT:?}"
            );
        }
        drop((l, a));
        s.stop();
    });
}

// ---------------------------------------------------------------------------------------
// F_SETFL racing dup
// ---------------------------------------------------------------------------------------

/// One thread toggles O_NONBLOCK on a switched socket while another dups and closes it;
/// afterwards every duplicate and the original agree with the last F_SETFL, as in libc.
#[test]
fn setfl_racing_dup_leaves_one_view() {
    with_deadline(|| {
        let s = shared_started(1);
        let (a, b) = UnixStream::pair().unwrap();
        let (a, _b) = s.block_on(move || {
            let (mut a, mut b) = (a, b);
            touch(&mut a, &mut b);
            (a, b)
        });
        let fd = a.as_raw_fd();
        let stop = Arc::new(AtomicBool::new(false));
        let st = stop.clone();
        let toggler = std::thread::spawn(move || {
            let mut i = 0u32;
            while !st.load(Ordering::Relaxed) {
                let fl = if i.is_multiple_of(2) {
                    libc::O_NONBLOCK
                } else {
                    0
                };
                // SAFETY: F_SETFL on a live fd.
                unsafe { libc::fcntl(fd, libc::F_SETFL, fl) };
                i += 1;
            }
        });
        let kept = Arc::new(AtomicI32::new(-1));
        let k2 = kept.clone();
        let st = stop.clone();
        let duper = std::thread::spawn(move || {
            let mut n = 0;
            while !st.load(Ordering::Relaxed) {
                // SAFETY: dup and close of our fd's copies.
                unsafe {
                    let c = libc::dup(fd);
                    let c2 = libc::dup(c);
                    libc::close(c);
                    let old = k2.swap(c2, Ordering::SeqCst);
                    if old >= 0 {
                        libc::close(old);
                    }
                }
                n += 1;
            }
            n
        });
        std::thread::sleep(Duration::from_millis(1500));
        stop.store(true, Ordering::Relaxed);
        toggler.join().unwrap();
        let _n = duper.join().unwrap();
        let c = kept.load(Ordering::SeqCst);
        let mut bad = Vec::new();
        for want in [true, false, true, false] {
            let fl = if want { libc::O_NONBLOCK } else { 0 };
            for (via, other) in [(fd, c), (c, fd)] {
                // SAFETY: F_SETFL on live fds.
                unsafe { libc::fcntl(via, libc::F_SETFL, fl) };
                if getfl_nb(other) != want {
                    bad.push(format!("set {want} via {via}, {other} shows {}", !want));
                }
            }
        }
        // SAFETY: ours.
        unsafe { libc::close(c) };
        s.stop();
        assert!(bad.is_empty(), "{bad:?}");
    });
}

// ---------------------------------------------------------------------------------------
// fcntl64: the name C code built with _FILE_OFFSET_BITS=64 calls
// ---------------------------------------------------------------------------------------

extern "C" {
    /// glibc's fcntl64 (GLIBC_2.28), what `fcntl` becomes in C code compiled with
    /// `-D_FILE_OFFSET_BITS=64` (autoconf's AC_SYS_LARGEFILE, meson's default).
    fn fcntl64(fd: libc::c_int, cmd: libc::c_int, ...) -> libc::c_int;
}

/// C code in the executable clears O_NONBLOCK through fcntl64 on a switched socket it
/// believes non-blocking... here: makes a socket blocking that the user had made
/// non-blocking through fcntl64, after a fiber switched it. A fiber's read then must park
/// (only the fiber), and another fiber of the same single worker must still run.
#[test]
fn fcntl64_on_a_switched_socket_does_not_block_the_worker() {
    child_ok(|| {
        let s = shared_started(1);
        let (a, b) = UnixStream::pair().unwrap();
        let fd = a.as_raw_fd();
        let (a, mut b) = s.block_on(move || {
            let (mut a, mut b) = (a, b);
            touch(&mut a, &mut b);
            // SAFETY: F_GETFL/F_SETFL through glibc's other name.
            unsafe {
                let fl = fcntl64(fd, libc::F_GETFL);
                fcntl64(fd, libc::F_SETFL, fl & !libc::O_NONBLOCK);
            }
            (a, b)
        });
        let reader = s.submit(move || read1(fd), None).unwrap();
        std::thread::sleep(Duration::from_millis(200));
        let other = s.submit(|| 7, None).unwrap();
        let ran = other.wait_timeout(Duration::from_secs(2));
        b.write_all(b"x").unwrap();
        let got = finish(reader);
        drop(a);
        s.stop();
        assert!(
            ran && got == Ok(1),
            "another fiber ran while one read: {ran}; read: {got:?}"
        );
    });
}

extern "C" {
    fn __read_chk(fd: libc::c_int, buf: *mut libc::c_void, n: usize, buflen: usize) -> isize;
    fn __recv_chk(
        fd: libc::c_int,
        buf: *mut libc::c_void,
        n: usize,
        buflen: usize,
        flags: libc::c_int,
    ) -> isize;
    fn __poll_chk(
        fds: *mut libc::pollfd,
        n: libc::nfds_t,
        timeout: libc::c_int,
        len: usize,
    ) -> libc::c_int;
}

/// The `_FORTIFY_SOURCE` forms of `read`, `recv` and `poll` (what C code built with it calls
/// where the compiler knows the buffer's size) park only the fiber, as the plain ones do:
/// another fiber of the single worker runs while each waits for a late write.
#[test]
fn fortified_reads_and_polls_park_only_the_fiber() {
    with_deadline(|| {
        let s = shared_started(1);
        for call in 0..3 {
            let (a, mut b) = UnixStream::pair().unwrap();
            let fd = a.as_raw_fd();
            let reader = s
                .submit(
                    move || {
                        let _a = a;
                        let mut buf = [0u8; 4];
                        // SAFETY: a live 4-byte buffer and pollfd.
                        unsafe {
                            match call {
                                0 => __read_chk(fd, buf.as_mut_ptr().cast(), 4, 4),
                                1 => __recv_chk(fd, buf.as_mut_ptr().cast(), 4, 4, 0),
                                _ => {
                                    let mut p = libc::pollfd {
                                        fd,
                                        events: libc::POLLIN,
                                        revents: 0,
                                    };
                                    let n = std::mem::size_of::<libc::pollfd>();
                                    __poll_chk(&mut p, 1, 10_000, n) as isize
                                }
                            }
                        }
                    },
                    None,
                )
                .unwrap();
            std::thread::sleep(Duration::from_millis(100));
            let other = s.submit(|| 7, None).unwrap();
            let ran = other.wait_timeout(Duration::from_secs(5));
            b.write_all(b"x").unwrap();
            let got = finish(reader);
            assert!(
                ran && got == 1,
                "call {call}: another fiber ran: {ran}; got {got}"
            );
        }
        s.stop();
    });
}
