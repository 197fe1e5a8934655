//! Reads and writes: `read`, `readv`, `recv`, `recvfrom`, `recvmsg`, `write`, `writev`,
//! `send`, `sendto` and `sendmsg`. Each is `hook::io` around the real call (a socket call
//! with `MSG_DONTWAIT` is the real call alone); a blocking write, or a receive with
//! `MSG_WAITALL`, goes on past a partial transfer as the kernel's would. The msghdr and
//! iovec arithmetic they need is in `msghdr`; nothing here touches the fd table but the
//! descriptors a `recvmsg` brings in.

use super::msghdr::{iov_rest, iov_total, iovecs, msg_from, readable_msg, received_fds, sent_fds};
use crate::hook::{self, io, peek_all, real, READ, WRITE};
use libc::{c_int, c_void, iovec, msghdr, size_t, sockaddr, socklen_t, ssize_t};
use std::cell::Cell;
use std::ptr::null_mut;

#[no_mangle]
pub unsafe extern "C" fn read(fd: c_int, buf: *mut c_void, n: size_t) -> ssize_t {
    // SAFETY: the caller's arguments, passed on as they came.
    io(fd, READ, || 0, |_| unsafe { real::read(fd, buf, n) })
}

#[no_mangle]
pub unsafe extern "C" fn readv(fd: c_int, iov: *const iovec, n: c_int) -> ssize_t {
    // SAFETY: the caller's arguments, passed on as they came.
    io(fd, READ, || 0, |_| unsafe { real::readv(fd, iov, n) })
}

/// A socket call with `flags`: with `MSG_DONTWAIT` it never waits (the real call, as the
/// kernel would make it), else as [`io`].
#[inline(always)]
fn sock_io(
    fd: c_int,
    flags: c_int,
    dir: hook::Dir,
    whole: impl FnOnce() -> usize,
    mut op: impl FnMut(usize) -> isize,
) -> isize {
    if flags & libc::MSG_DONTWAIT != 0 {
        return op(0);
    }
    io(fd, dir, whole, op)
}

/// The length a `MSG_WAITALL` receive of `n` bytes waits for, or 0. The kernel honours the
/// flag on stream sockets only: a datagram socket's receive returns one datagram.
fn wait_all(fd: c_int, flags: c_int, n: size_t) -> usize {
    if flags & libc::MSG_WAITALL != 0 && is_stream(fd) {
        n
    } else {
        0
    }
}

/// Whether `fd` is a stream socket (asked only for the rare `MSG_WAITALL`).
pub(super) fn is_stream(fd: c_int) -> bool {
    let mut kind: c_int = 0;
    let mut len = std::mem::size_of::<c_int>() as socklen_t;
    // SAFETY: `kind` and `len` are live and sized for SO_TYPE's int.
    let r = unsafe {
        libc::getsockopt(
            fd,
            libc::SOL_SOCKET,
            libc::SO_TYPE,
            (&raw mut kind).cast(),
            &mut len,
        )
    };
    r == 0 && kind == libc::SOCK_STREAM
}

/// A receive: `MSG_PEEK` with `MSG_WAITALL` on a stream socket other than a Unix one waits
/// for `whole` bytes to peek ([`peek_all`], `op(0)` each time, until `ended` says a part
/// brought ancillary data); an error-queue receive on a socket that has one is the real
/// call alone; else as [`sock_io`].
#[inline(always)]
fn recv_io(
    fd: c_int,
    flags: c_int,
    whole: usize,
    ended: &Cell<bool>,
    mut op: impl FnMut(usize) -> isize,
) -> isize {
    if flags & libc::MSG_ERRQUEUE != 0 && error_queue(fd) {
        return op(0);
    }
    if whole > 0 && flags & (libc::MSG_PEEK | libc::MSG_DONTWAIT) == libc::MSG_PEEK {
        // A Unix socket's peek never waits for more once it copied something: it returns
        // after its first part, as any receive does.
        if is_unix_stream(fd) {
            return sock_io(fd, flags, READ, || 0, op);
        }
        let mut op = op;
        return peek_all(fd, whole, ended, || op(0));
    }
    sock_io(fd, flags, READ, move || whole, op)
}

/// Whether `fd` is a Unix stream socket (asked only for the rare `MSG_WAITALL`).
fn is_unix_stream(fd: c_int) -> bool {
    let mut domain: c_int = 0;
    let mut len = std::mem::size_of::<c_int>() as socklen_t;
    // SAFETY: `domain` and `len` are live and sized for SO_DOMAIN's int.
    let r = unsafe {
        libc::getsockopt(
            fd,
            libc::SOL_SOCKET,
            libc::SO_DOMAIN,
            (&raw mut domain).cast(),
            &mut len,
        )
    };
    r == 0 && domain == libc::AF_UNIX && is_stream(fd)
}

/// `recv` or `recvfrom` with `MSG_WAITALL` on a Unix stream socket, made as [`recvmsg`]
/// with the caller's buffer and no control buffer, as the kernel makes them: its parts then
/// see the descriptors the kernel closes for want of room (`MSG_CTRUNC`), after which the
/// kernel's receive ends. `addr` and `len` are `recvfrom`'s (null for `recv`).
///
/// # Safety
/// The caller's arguments to `recvfrom`.
unsafe fn unix_whole(
    fd: c_int,
    buf: *mut c_void,
    n: size_t,
    flags: c_int,
    addr: *mut sockaddr,
    len: *mut socklen_t,
) -> isize {
    let mut iov = iovec {
        iov_base: buf,
        iov_len: n,
    };
    // SAFETY: an all-zero msghdr is valid: no name, no control, no buffers yet.
    let mut m: msghdr = unsafe { std::mem::zeroed() };
    m.msg_iov = &mut iov;
    m.msg_iovlen = 1;
    if !addr.is_null() {
        // The kernel reads the caller's length first: one it cannot is its to refuse.
        if !hook::readable(len.cast(), size_of::<socklen_t>()) {
            // SAFETY: the caller's arguments, passed on as they came.
            return unsafe { real::recvfrom(fd, buf, n, flags, addr, len) };
        }
        m.msg_name = addr.cast();
        // SAFETY: readable (just asked).
        m.msg_namelen = unsafe { len.read_unaligned() };
    }
    // SAFETY: a msghdr over the caller's buffer and address.
    let r = unsafe { recvmsg(fd, &mut m, flags) };
    if r >= 0 && !addr.is_null() {
        // SAFETY: the caller's length, written back as the kernel would.
        if let Err(e) = unsafe { write_back(len.cast(), &m.msg_namelen) } {
            hook::set_errno(e);
            return -1;
        }
    }
    r
}

/// A receive of no bytes on a blocking TCP socket that waited out its `SO_RCVTIMEO`
/// returns 0, as the kernel's does (`tcp_recvmsg` ends its loop once the buffer, empty, is
/// full); other sockets' fail with `EAGAIN`, as the hook's wait does. `r` is the hooked
/// call's result; `len` gives the bytes asked for, asked only after a failure with
/// `EAGAIN` (the kernel took the call's buffers then). See [`made_zero`] for what the
/// kernel writes back with that 0.
fn empty_receive(fd: c_int, flags: c_int, r: isize, len: impl FnOnce() -> usize) -> isize {
    let once = libc::MSG_DONTWAIT | libc::MSG_ERRQUEUE;
    if r >= 0 || flags & once != 0 || hook::errno() != libc::EAGAIN || len() != 0 {
        return r;
    }
    // On a hooked fd that is blocking in the user's view, EAGAIN is the timeout's.
    let waited = matches!(hook::route(fd), hook::Route::Wait(..));
    if waited && is_tcp(fd) {
        0
    } else {
        r
    }
}

/// A receive's result `r`, where no call of the kernel's succeeded (`filled` false): a 0
/// is then the hooks' own (a datagram socket whose receive side is shut down, a TCP
/// receive of nothing at its timeout), and the kernel's receive, returning 0 there, writes
/// back an empty address, its flags and no control data, which `written` does (its
/// error, as an errno, if it cannot).
fn made_zero(r: isize, filled: bool, written: impl FnOnce() -> Result<(), c_int>) -> isize {
    if r != 0 || filled {
        return r;
    }
    match written() {
        Ok(()) => 0,
        Err(e) => {
            hook::set_errno(e);
            -1
        }
    }
}

/// What the kernel writes back for a receive that got no address (`move_addr_to_user` of
/// an empty one), if the caller asked for it (`addr` not null): the length 0, after
/// reading the caller's, which must not be negative as an int.
///
/// # Safety
/// `len` is the caller's pointer to the address length, or bad.
unsafe fn no_address(addr: *mut c_void, len: *mut socklen_t) -> Result<(), c_int> {
    if addr.is_null() {
        return Ok(());
    }
    if !hook::readable(len.cast(), size_of::<socklen_t>()) {
        return Err(libc::EFAULT);
    }
    // SAFETY: readable (just asked).
    if (unsafe { len.read_unaligned() } as c_int) < 0 {
        return Err(libc::EINVAL);
    }
    // SAFETY: the caller's length, written as the kernel would.
    unsafe { write_back(len.cast(), &(0 as socklen_t)) }
}

/// Writes `v` to the caller's `dst` as the kernel does (`EFAULT` if it cannot).
///
/// # Safety
/// `dst` is the caller's memory for a `T`, or bad.
unsafe fn write_back<T: Copy>(dst: *mut c_void, v: &T) -> Result<(), c_int> {
    // SAFETY: `v`'s bytes, a plain value.
    let bytes = unsafe { std::slice::from_raw_parts((v as *const T).cast::<u8>(), size_of::<T>()) };
    // SAFETY: the caller's guarantee.
    if unsafe { hook::write_user(dst, bytes) } {
        Ok(())
    } else {
        Err(libc::EFAULT)
    }
}

/// Whether `fd` is a socket whose receive with `MSG_ERRQUEUE` reads its error queue: the
/// kernel looks once and fails with `EAGAIN` if it is empty, never waiting. Internet
/// sockets (TCP, UDP, raw, ping), but not SCTP's; Unix sockets ignore the flag and receive
/// data as without it. Asked only when the flag is given.
fn error_queue(fd: c_int) -> bool {
    let opt = |name| {
        let mut v: c_int = 0;
        let mut len = std::mem::size_of::<c_int>() as socklen_t;
        // SAFETY: `v` and `len` are live and sized for the option's int.
        let r =
            unsafe { libc::getsockopt(fd, libc::SOL_SOCKET, name, (&raw mut v).cast(), &mut len) };
        (r == 0).then_some(v)
    };
    matches!(opt(libc::SO_DOMAIN), Some(libc::AF_INET | libc::AF_INET6))
        && opt(libc::SO_PROTOCOL) != Some(libc::IPPROTO_SCTP)
}

/// Whether `fd` is a TCP socket.
fn is_tcp(fd: c_int) -> bool {
    let mut proto: c_int = 0;
    let mut len = std::mem::size_of::<c_int>() as socklen_t;
    // SAFETY: `proto` and `len` are live and sized for SO_PROTOCOL's int.
    let r = unsafe {
        libc::getsockopt(
            fd,
            libc::SOL_SOCKET,
            libc::SO_PROTOCOL,
            (&raw mut proto).cast(),
            &mut len,
        )
    };
    r == 0 && proto == libc::IPPROTO_TCP
}

#[no_mangle]
pub unsafe extern "C" fn recv(fd: c_int, buf: *mut c_void, n: size_t, flags: c_int) -> ssize_t {
    if flags & libc::MSG_WAITALL != 0 && is_unix_stream(fd) {
        // SAFETY: the caller's arguments, without an address.
        return unsafe { unix_whole(fd, buf, n, flags, null_mut(), null_mut()) };
    }
    let whole = wait_all(fd, flags, n);
    // SAFETY: the caller's arguments; `off` counts bytes already transferred, so it
    // stays below `n` and the pointer within the caller's buffer.
    let r = recv_io(fd, flags, whole, &Cell::new(false), |off| unsafe {
        real::recv(fd, buf.byte_add(off), n - off, flags)
    });
    empty_receive(fd, flags, r, || n)
}

#[no_mangle]
pub unsafe extern "C" fn recvfrom(
    fd: c_int,
    buf: *mut c_void,
    n: size_t,
    flags: c_int,
    addr: *mut sockaddr,
    len: *mut socklen_t,
) -> ssize_t {
    if flags & libc::MSG_WAITALL != 0 && is_unix_stream(fd) {
        // SAFETY: the caller's arguments.
        return unsafe { unix_whole(fd, buf, n, flags, addr, len) };
    }
    let whole = wait_all(fd, flags, n);
    // The kernel wrote back the address (a call succeeded).
    let mut filled = false;
    // SAFETY: the caller's arguments; `off` as in `recv`.
    let r = recv_io(fd, flags, whole, &Cell::new(false), |off| unsafe {
        let r = real::recvfrom(fd, buf.byte_add(off), n - off, flags, addr, len);
        filled |= r >= 0;
        r
    });
    let r = empty_receive(fd, flags, r, || n);
    // SAFETY: the caller's address buffer and length.
    made_zero(r, filled, || unsafe { no_address(addr.cast(), len) })
}

#[no_mangle]
pub unsafe extern "C" fn recvmsg(fd: c_int, msg: *mut msghdr, flags: c_int) -> ssize_t {
    // A receive that waits for all of its buffers needs their total, and the caller's
    // control buffer for the parts after the first: read only once the kernel would.
    let whole = if flags & libc::MSG_WAITALL != 0 {
        // SAFETY: what the caller passed as a msghdr.
        if !unsafe { readable_msg(msg) } {
            // SAFETY: the caller's arguments, for the kernel to refuse (EFAULT, EMSGSIZE).
            return unsafe { real::recvmsg(fd, msg, flags) };
        }
        // SAFETY: the caller's msghdr and its iovec array, checked readable just above.
        wait_all(fd, flags, unsafe { iov_total(msg) })
    } else {
        0
    };
    let control = if whole > 0 {
        // SAFETY: the caller's msghdr, checked above.
        unsafe { ((*msg).msg_control, (*msg).msg_controllen) }
    } else {
        // Not used: a receive that does not wait for all returns after its first part.
        (std::ptr::null_mut(), 0)
    };
    let ended = Cell::new(false);
    // The kernel filled in the caller's msghdr (its first part succeeded).
    let mut filled = false;
    // SAFETY: the caller's arguments; past `off` bytes the call goes on in the rest of the
    // caller's buffers, with the caller's control buffer while no part filled it.
    let r = recv_io(fd, flags, whole, &ended, |off| unsafe {
        // The kernel's receive ends after a part that brought ancillary data (a Unix
        // socket's fds): 0 ends the loop with what came.
        if ended.get() {
            return 0;
        }
        msg_from(msg, off, Some(control), |part| {
            let r = real::recvmsg(fd, part, flags);
            filled |= r >= 0;
            // A part that brought ancillary data, or had some and no room for it (its fds
            // closed, MSG_CTRUNC), ends the kernel's receive.
            if r > 0 && ((*part).msg_controllen > 0 || (*part).msg_flags & libc::MSG_CTRUNC != 0) {
                ended.set(true);
                if part != msg {
                    (*msg).msg_controllen = (*part).msg_controllen;
                    (*msg).msg_flags |= (*part).msg_flags;
                }
            }
            r
        })
    });
    if r >= 0 && filled {
        // SAFETY: the caller's msghdr, whose control part the kernel wrote.
        unsafe { received_fds(msg) };
    }
    // SAFETY: asked only after EAGAIN: the kernel read the msghdr and its iovec array.
    let r = empty_receive(fd, flags, r, || unsafe { iov_total(msg) });
    // SAFETY: the caller's msghdr, which the kernel read; it writes back the address
    // length, the flags and the control length, in that order.
    made_zero(r, filled, || unsafe {
        no_address((*msg).msg_name, &raw mut (*msg).msg_namelen)?;
        write_back(
            (&raw mut (*msg).msg_flags).cast(),
            &(flags & libc::MSG_CMSG_CLOEXEC),
        )?;
        write_back((&raw mut (*msg).msg_controllen).cast(), &0usize)
    })
}

#[no_mangle]
pub unsafe extern "C" fn write(fd: c_int, buf: *const c_void, n: size_t) -> ssize_t {
    // SAFETY: the caller's arguments; `off` counts bytes already transferred, so it
    // stays below `n` and the pointer within the caller's buffer.
    io(
        fd,
        WRITE,
        || n,
        |off| unsafe { real::write(fd, buf.byte_add(off), n - off) },
    )
}

#[no_mangle]
pub unsafe extern "C" fn writev(fd: c_int, iov: *const iovec, n: c_int) -> ssize_t {
    // SAFETY: the caller's array, read only once the kernel took it in the first call
    // (`io` asks for the total only then, and `off` > 0 follows bytes written).
    let bufs = || unsafe { iovecs(iov, usize::try_from(n).unwrap_or(0)) };
    // A blocking write writes everything, as `write`: past `off` bytes the rest goes on.
    io(
        fd,
        WRITE,
        || {
            bufs()
                .iter()
                .fold(0usize, |t, v| t.saturating_add(v.iov_len))
        },
        |off| {
            if off == 0 {
                // SAFETY: the caller's arguments, passed on as they came.
                return unsafe { real::writev(fd, iov, n) };
            }
            let rest = iov_rest(bufs(), off);
            // SAFETY: buffers within the caller's, fewer than the caller's `n`.
            unsafe { real::writev(fd, rest.as_ptr(), rest.len() as c_int) }
        },
    )
}

#[no_mangle]
pub unsafe extern "C" fn send(fd: c_int, buf: *const c_void, n: size_t, flags: c_int) -> ssize_t {
    // SAFETY: the caller's arguments; `off` counts bytes already transferred, so it
    // stays below `n` and the pointer within the caller's buffer.
    sock_io(
        fd,
        flags,
        WRITE,
        || n,
        |off| unsafe { real::send(fd, buf.byte_add(off), n - off, flags) },
    )
}

#[no_mangle]
pub unsafe extern "C" fn sendto(
    fd: c_int,
    buf: *const c_void,
    n: size_t,
    flags: c_int,
    addr: *const sockaddr,
    len: socklen_t,
) -> ssize_t {
    // SAFETY: the caller's arguments, passed on as they came.
    sock_io(
        fd,
        flags,
        WRITE,
        || n,
        |off| unsafe { real::sendto(fd, buf.byte_add(off), n - off, flags, addr, len) },
    )
}

#[no_mangle]
pub unsafe extern "C" fn sendmsg(fd: c_int, msg: *const msghdr, flags: c_int) -> ssize_t {
    // SAFETY: the caller's msghdr and its iovec array, read only once the kernel took them
    // in the first call (see `io`).
    let whole = || unsafe { iov_total(msg) };
    // SAFETY: the caller's arguments; a blocking send sends everything, as `send`: past
    // `off` bytes the rest goes on, without the ancillary data the first part carried.
    let r = sock_io(fd, flags, WRITE, whole, |off| unsafe {
        msg_from(msg.cast_mut(), off, None, |m| real::sendmsg(fd, m, flags))
    });
    if r >= 0 {
        // SAFETY: the caller's msghdr, whose control part the kernel took.
        unsafe { sent_fds(msg) };
    }
    r
}
