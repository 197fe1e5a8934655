//! The hooked C library functions themselves. Each is the real call unless it runs in a fiber
//! with hooks on (or on an fd fibra switched to non-blocking mode, where a plain thread's
//! call is made to block as the user expects). See the module docs of `fibra::hook`.

#![allow(clippy::missing_safety_doc)]

use super::{
    active, cancelled, errno, fd, in_fiber, io, peek_all, real, route, set_errno, Blocking, Ctx,
    Route, READ, WRITE,
};
use crate::time::deadline_after;
use libc::{
    addrinfo, c_char, c_int, c_uint, c_ulong, c_void, iovec, msghdr, nfds_t, pollfd, size_t,
    sockaddr, socklen_t, ssize_t, timespec,
};
use std::time::Duration;

/// Every hook, referenced so the linker keeps them (see `hook::link`).
pub(super) struct Hooks(#[allow(dead_code)] [*const (); 31]);
// SAFETY: a table of function addresses, never dereferenced.
unsafe impl Sync for Hooks {}
pub(super) static HOOKS: Hooks = Hooks([
    read as *const (),
    readv as *const (),
    recv as *const (),
    recvfrom as *const (),
    recvmsg as *const (),
    write as *const (),
    writev as *const (),
    send as *const (),
    sendto as *const (),
    sendmsg as *const (),
    connect as *const (),
    accept as *const (),
    accept4 as *const (),
    poll as *const (),
    ppoll as *const (),
    select as *const (),
    sleep as *const (),
    usleep as *const (),
    nanosleep as *const (),
    clock_nanosleep as *const (),
    getaddrinfo as *const (),
    close as *const (),
    fcntl as *const (),
    ioctl as *const (),
    dup as *const (),
    dup2 as *const (),
    dup3 as *const (),
    socket as *const (),
    socketpair as *const (),
    pipe as *const (),
    pipe2 as *const (),
]);

// ---- reading and writing ----

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
    dir: super::Dir,
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
fn is_stream(fd: c_int) -> bool {
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

/// A receive: `MSG_PEEK` with `MSG_WAITALL` on a stream socket waits for `whole` bytes to
/// peek ([`peek_all`], `op(0)` each time), else as [`sock_io`].
#[inline(always)]
fn recv_io(fd: c_int, flags: c_int, whole: usize, op: impl FnMut(usize) -> isize) -> isize {
    if whole > 0 && flags & (libc::MSG_PEEK | libc::MSG_DONTWAIT) == libc::MSG_PEEK {
        let mut op = op;
        return peek_all(fd, whole, || op(0));
    }
    sock_io(fd, flags, READ, move || whole, op)
}

#[no_mangle]
pub unsafe extern "C" fn recv(fd: c_int, buf: *mut c_void, n: size_t, flags: c_int) -> ssize_t {
    // SAFETY: the caller's arguments; `off` counts bytes already transferred, so it
    // stays below `n` and the pointer within the caller's buffer.
    recv_io(fd, flags, wait_all(fd, flags, n), |off| unsafe {
        real::recv(fd, buf.cast::<u8>().add(off).cast(), n - off, flags)
    })
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
    // SAFETY: the caller's arguments; `off` as in `recv`.
    recv_io(fd, flags, wait_all(fd, flags, n), |off| unsafe {
        real::recvfrom(
            fd,
            buf.cast::<u8>().add(off).cast(),
            n - off,
            flags,
            addr,
            len,
        )
    })
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
    let mut ended = false;
    // The kernel filled in the caller's msghdr (its first part succeeded).
    let mut filled = false;
    // SAFETY: the caller's arguments; past `off` bytes the call goes on in the rest of the
    // caller's buffers, with the caller's control buffer while no part filled it.
    let r = recv_io(fd, flags, whole, |off| unsafe {
        // The kernel's receive ends after a part that brought ancillary data (a Unix
        // socket's fds): 0 ends the loop with what came.
        if ended {
            return 0;
        }
        msg_from(msg, off, Some(control), |part| {
            let r = real::recvmsg(fd, part, flags);
            filled |= r >= 0;
            // A part that brought ancillary data, or had some and no room for it (its fds
            // closed, MSG_CTRUNC), ends the kernel's receive.
            if r > 0 && ((*part).msg_controllen > 0 || (*part).msg_flags & libc::MSG_CTRUNC != 0) {
                ended = true;
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
    r
}

/// Tells the fd table about the descriptors that came in `msg`'s ancillary data.
///
/// # Safety
/// `msg` points to a valid msghdr whose control buffer and length the kernel just wrote.
unsafe fn received_fds(msg: *const msghdr) {
    // SAFETY: the caller's guarantee; the CMSG macros stay within `msg_controllen`.
    unsafe {
        let mut c = libc::CMSG_FIRSTHDR(msg);
        while !c.is_null() {
            if (*c).cmsg_level == libc::SOL_SOCKET && (*c).cmsg_type == libc::SCM_RIGHTS {
                let data = libc::CMSG_DATA(c).cast::<c_int>();
                let bytes = (*c).cmsg_len.saturating_sub(libc::CMSG_LEN(0) as usize);
                for i in 0..bytes / std::mem::size_of::<c_int>() {
                    fd::received(std::ptr::read_unaligned(data.add(i)));
                }
            }
            c = libc::CMSG_NXTHDR(msg, c);
        }
    }
}

/// Whether the caller's `msg` and its iovec array can be read, and the kernel takes their
/// count (at most `IOV_MAX`): else the real call answers for them.
///
/// # Safety
/// `msg` is null or points to memory the caller passed as a msghdr.
unsafe fn readable_msg(msg: *const msghdr) -> bool {
    if !super::readable(msg.cast(), std::mem::size_of::<msghdr>()) {
        return false;
    }
    // SAFETY: just checked readable.
    let (iov, n) = unsafe { ((*msg).msg_iov, (*msg).msg_iovlen) };
    n <= libc::UIO_MAXIOV as usize && super::readable(iov.cast(), n * std::mem::size_of::<iovec>())
}

/// The total length of `msg`'s buffers (saturating: the kernel refuses more than it can
/// count); 0 for a null `msg`, which the kernel refuses.
///
/// # Safety
/// `msg` is null or points to a valid msghdr whose `msg_iov` holds `msg_iovlen` iovecs.
unsafe fn iov_total(msg: *const msghdr) -> usize {
    if msg.is_null() {
        return 0;
    }
    // SAFETY: the caller's guarantee.
    let m = unsafe { &*msg };
    // SAFETY: as above.
    unsafe { iovecs(m.msg_iov, m.msg_iovlen) }
        .iter()
        .fold(0usize, |t, v| t.saturating_add(v.iov_len))
}

/// The caller's iovec array as a slice (empty for a null one).
///
/// # Safety
/// `iov` points to `n` valid iovecs, or `n` is 0.
unsafe fn iovecs<'a>(iov: *const iovec, n: usize) -> &'a [iovec] {
    if iov.is_null() || n == 0 {
        &[]
    } else {
        // SAFETY: the caller's guarantee.
        unsafe { std::slice::from_raw_parts(iov, n) }
    }
}

/// The buffers of `iov` past their first `off` bytes.
fn iov_rest(iov: &[iovec], mut off: usize) -> Vec<iovec> {
    let mut rest = Vec::with_capacity(iov.len());
    for v in iov {
        if off >= v.iov_len {
            off -= v.iov_len;
            continue;
        }
        rest.push(iovec {
            // SAFETY: `off` is below this buffer's length, so the pointer stays inside it.
            iov_base: unsafe { v.iov_base.cast::<u8>().add(off).cast() },
            iov_len: v.iov_len - off,
        });
        off = 0;
    }
    rest
}

/// Calls `call` with `msg` itself (`off` 0), or with a copy whose buffers start `off` bytes
/// on and which carries `control` as its ancillary data buffer, or none (a send's went with
/// the first part); no address (a stream's peer is fixed).
///
/// # Safety
/// `msg` points to a valid msghdr whose `msg_iov` holds `msg_iovlen` iovecs; `control` is
/// the caller's control buffer.
unsafe fn msg_from(
    msg: *mut msghdr,
    off: usize,
    control: Option<(*mut c_void, usize)>,
    call: impl FnOnce(*mut msghdr) -> isize,
) -> isize {
    if off == 0 {
        return call(msg);
    }
    // SAFETY: the caller's guarantee.
    let m = unsafe { &*msg };
    // SAFETY: as above.
    let mut rest = iov_rest(unsafe { iovecs(m.msg_iov, m.msg_iovlen) }, off);
    // SAFETY: an all-zero msghdr is valid: no name, no control, no buffers yet.
    let mut part: msghdr = unsafe { std::mem::zeroed() };
    part.msg_iov = rest.as_mut_ptr();
    part.msg_iovlen = rest.len();
    if let Some((buf, len)) = control {
        part.msg_control = buf;
        part.msg_controllen = len;
    }
    call(&mut part)
}

#[no_mangle]
pub unsafe extern "C" fn write(fd: c_int, buf: *const c_void, n: size_t) -> ssize_t {
    // SAFETY: the caller's arguments; `off` counts bytes already transferred, so it
    // stays below `n` and the pointer within the caller's buffer.
    io(
        fd,
        WRITE,
        || n,
        |off| unsafe { real::write(fd, buf.cast::<u8>().add(off).cast(), n - off) },
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
        |off| unsafe { real::send(fd, buf.cast::<u8>().add(off).cast(), n - off, flags) },
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
        |off| unsafe {
            real::sendto(
                fd,
                buf.cast::<u8>().add(off).cast(),
                n - off,
                flags,
                addr,
                len,
            )
        },
    )
}

#[no_mangle]
pub unsafe extern "C" fn sendmsg(fd: c_int, msg: *const msghdr, flags: c_int) -> ssize_t {
    // SAFETY: the caller's msghdr and its iovec array, read only once the kernel took them
    // in the first call (see `io`).
    let whole = || unsafe { iov_total(msg) };
    // SAFETY: the caller's arguments; a blocking send sends everything, as `send`: past
    // `off` bytes the rest goes on, without the ancillary data the first part carried.
    sock_io(fd, flags, WRITE, whole, |off| unsafe {
        msg_from(msg.cast_mut(), off, None, |m| real::sendmsg(fd, m, flags))
    })
}

// ---- connections ----

#[no_mangle]
pub unsafe extern "C" fn connect(fd: c_int, addr: *const sockaddr, len: socklen_t) -> c_int {
    // The first call's result and errno, when it went through unhooked.
    let (b, first) = match route(fd) {
        Route::Pass => {
            // SAFETY: the caller's arguments, passed on as they came.
            let r = unsafe { real::connect(fd, addr, len) };
            let e = errno();
            if r == 0 || !matches!(e, libc::EINPROGRESS | libc::EALREADY | libc::EAGAIN) {
                return r;
            }
            // A blocking connect does not fail so: fibra switched the socket under it (the
            // kernel restarted it after a signal, `SA_RESTART`, and it met the switch; or a
            // fiber switched it between our look and our call). It goes on as a hooked one.
            match super::switched_route(fd, WRITE) {
                Some(b) => (b, Some((r, e))),
                None => return r,
            }
        }
        Route::Wait(ctx, slot, state) => (Blocking::new(ctx, fd, slot, state, WRITE), None),
    };
    let ctx = b.ctx;
    let call = move || {
        let mut b = b;
        let r = match first {
            Some((r, e)) => {
                set_errno(e);
                r
            }
            // SAFETY: the caller's arguments, passed on as they came.
            None => unsafe { real::connect(fd, addr, len) },
        };
        match errno() {
            _ if r == 0 => return 0,
            libc::EAGAIN => {
                // SAFETY: as above.
                let retry = || unsafe { real::connect(fd, addr, len) };
                return unix_backlog_full(&mut b, retry);
            }
            // EALREADY: an earlier connect (one that timed out) is still under way; a
            // blocking connect waits for it, as for a new one.
            libc::EINPROGRESS | libc::EALREADY => {}
            _ => return r,
        }
        // Connecting: wait until the socket is writable, which is when the kernel is done.
        loop {
            let seen = b.before();
            let mut p = pollfd {
                fd,
                events: libc::POLLOUT,
                revents: 0,
            };
            // SAFETY: one live pollfd.
            let n = unsafe { real::poll(&mut p, 1, 0) };
            // A signal pending fails even this look with `EINTR`: look again.
            if n < 0 && errno() == libc::EINTR {
                continue;
            }
            if n != 0 {
                break;
            }
            if let Err(e) = b.wait(seen) {
                // Linux's blocking connect reports its SO_SNDTIMEO timeout as EINPROGRESS.
                set_errno(if e == libc::EAGAIN {
                    libc::EINPROGRESS
                } else {
                    e
                });
                return -1;
            }
        }
        // Done: connecting again reports how it ended (0, or the kernel's error such as
        // ECONNREFUSED) and, on failure, resets the socket as a blocking connect's failure
        // does, so that the caller may try again (reading SO_ERROR instead left it half
        // connecting: a retry failed with ECONNABORTED).
        // SAFETY: as above.
        let r = unsafe { real::connect(fd, addr, len) };
        if r == 0 || errno() == libc::EISCONN {
            return 0;
        }
        r
    };
    match ctx {
        Ctx::Thread => call(),
        Ctx::Fiber(meta) => in_fiber(meta, cancelled, || {
            crate::coop::spend();
            call()
        }),
    }
}

/// A blocking `connect` to a Unix socket whose listener's backlog is full (`EAGAIN` on the
/// non-blocking socket): room in the listener's queue wakes nothing this socket can wait
/// on, so `retry` (the connect) runs again on a timer, 1 ms doubling to 50 ms, until it
/// does not fail with `EAGAIN` or the socket's timeout passes (then `EAGAIN`, as the
/// kernel's blocking connect reports it).
fn unix_backlog_full(b: &mut Blocking, mut retry: impl FnMut() -> c_int) -> c_int {
    let deadline = b.deadline();
    let mut pause = Duration::from_millis(1);
    loop {
        let now = std::time::Instant::now();
        let left = deadline.map(|d| d.saturating_duration_since(now));
        if left.is_some_and(|l| l.is_zero()) {
            set_errno(libc::EAGAIN);
            return -1;
        }
        let nap = left.map_or(pause, |l| l.min(pause));
        match b.ctx {
            Ctx::Fiber(meta) => {
                if meta.hook_cancel.get() {
                    set_errno(libc::ECANCELED);
                    return -1;
                }
                crate::time::sleep(nap);
            }
            Ctx::Thread => std::thread::sleep(nap),
        }
        let r = retry();
        if r == 0 || errno() != libc::EAGAIN {
            return r;
        }
        pause = (pause * 2).min(Duration::from_millis(50));
    }
}

#[no_mangle]
pub unsafe extern "C" fn accept(fd: c_int, addr: *mut sockaddr, len: *mut socklen_t) -> c_int {
    // SAFETY: the caller's arguments.
    let r = io(
        fd,
        READ,
        || 0,
        |_| unsafe { real::accept(fd, addr, len) } as isize,
    ) as c_int;
    if r >= 0 {
        fd::created(r);
    }
    r
}

#[no_mangle]
pub unsafe extern "C" fn accept4(
    fd: c_int,
    addr: *mut sockaddr,
    len: *mut socklen_t,
    flags: c_int,
) -> c_int {
    // SAFETY: the caller's arguments.
    let r = io(
        fd,
        READ,
        || 0,
        |_| unsafe { real::accept4(fd, addr, len, flags) } as isize,
    ) as c_int;
    if r >= 0 {
        fd::created(r);
    }
    r
}

// ---- waiting for many ----

#[no_mangle]
pub unsafe extern "C" fn poll(fds: *mut pollfd, n: nfds_t, timeout: c_int) -> c_int {
    match active() {
        // A null array of entries is the kernel's to refuse (EFAULT).
        Some(meta) if timeout != 0 && nfds_ok(n) && (n == 0 || !fds.is_null()) => {
            let deadline =
                (timeout > 0).then(|| deadline_after(Duration::from_millis(timeout as u64)));
            in_fiber(meta, cancelled, || {
                // SAFETY: the caller's array of `n` pollfds, `n` within the limit.
                unsafe { super::wait::poll(meta, fds, n as usize, deadline) }
            })
        }
        // SAFETY: the caller's arguments.
        _ => unsafe { real::poll(fds, n, timeout) },
    }
}

#[no_mangle]
pub unsafe extern "C" fn ppoll(
    fds: *mut pollfd,
    n: nfds_t,
    timeout: *const timespec,
    mask: *const libc::sigset_t,
) -> c_int {
    let meta = match active() {
        // With a signal mask the caller waits for signals too: only the kernel can do that.
        Some(meta) if mask.is_null() && nfds_ok(n) && (n == 0 || !fds.is_null()) => meta,
        // SAFETY: the caller's arguments.
        _ => return unsafe { real::ppoll(fds, n, timeout, mask) },
    };
    // SAFETY: a non-null timeout points to the caller's timespec.
    let d = match unsafe { timeout.as_ref() } {
        None => None,
        Some(ts) => match duration(ts) {
            Some(d) if !d.is_zero() => Some(d),
            // Zero or invalid: the real call answers (at once, or with EINVAL).
            // SAFETY: the caller's arguments, passed on as they came.
            _ => return unsafe { real::ppoll(fds, n, timeout, mask) },
        },
    };
    in_fiber(meta, cancelled, || {
        // SAFETY: the caller's array of `n` pollfds, `n` within the limit.
        unsafe { super::wait::poll(meta, fds, n as usize, d.map(deadline_after)) }
    })
}

#[no_mangle]
pub unsafe extern "C" fn select(
    n: c_int,
    r: *mut libc::fd_set,
    w: *mut libc::fd_set,
    e: *mut libc::fd_set,
    timeout: *mut libc::timeval,
) -> c_int {
    let meta = match active() {
        // Past FD_SETSIZE the caller's sets are larger than `fd_set` (glibc's select passes
        // any `n` on); past the descriptor limit the kernel refuses.
        Some(meta) if n >= 0 && nfds_ok(n as nfds_t) => meta,
        // SAFETY: the caller's arguments.
        _ => return unsafe { real::select(n, r, w, e, timeout) },
    };
    // SAFETY: a non-null timeout points to the caller's timeval.
    let d = match unsafe { timeout.as_ref() } {
        None => None,
        Some(tv) if tv.tv_sec < 0 || !(0..1_000_000).contains(&tv.tv_usec) => {
            // SAFETY: the caller's arguments, passed on as they came.
            return unsafe { real::select(n, r, w, e, timeout) };
        }
        Some(tv) => {
            let d = Duration::new(tv.tv_sec as u64, tv.tv_usec as u32 * 1000);
            if d.is_zero() {
                // SAFETY: the caller's arguments, passed on as they came.
                return unsafe { real::select(n, r, w, e, timeout) };
            }
            Some(d)
        }
    };
    // The kernel reads the first `ceil(n / bits)` words of each set: a set that cannot be
    // read is the real call's to refuse (EFAULT).
    let bytes = (n as usize).div_ceil(libc::c_ulong::BITS as usize) * size_of::<libc::c_ulong>();
    if [r, w, e]
        .iter()
        .any(|set| !set.is_null() && !super::readable(set.cast(), bytes))
    {
        // SAFETY: the caller's arguments, passed on as they came.
        return unsafe { real::select(n, r, w, e, timeout) };
    }
    let deadline = d.map(deadline_after);
    in_fiber(meta, cancelled, || {
        // SAFETY: the caller's fd sets (null ones are skipped) and timeout.
        unsafe { super::wait::select(meta, n, [r, w, e], deadline, timeout) }
    })
}

/// Whether `n` pollfds are within what the kernel accepts (`RLIMIT_NOFILE`); beyond it the
/// real call answers `EINVAL` without reading the array, as the hook must not either.
fn nfds_ok(n: nfds_t) -> bool {
    if n <= 1024 {
        return true;
    }
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: a live rlimit to fill in.
    unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) == 0 && n <= lim.rlim_cur }
}

// ---- sleeping ----

/// A valid timespec as a duration.
fn duration(ts: &timespec) -> Option<Duration> {
    (ts.tv_sec >= 0 && (0..1_000_000_000).contains(&ts.tv_nsec))
        .then(|| Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32))
}

/// The caller's sleep request as a duration; `None` for a null, unreadable or invalid one,
/// which the real call refuses (`EFAULT`, `EINVAL`).
///
/// # Safety
/// `req` is what the caller passed as a timespec pointer.
unsafe fn request(req: *const timespec) -> Option<Duration> {
    if !super::readable(req.cast(), size_of::<timespec>()) {
        return None;
    }
    // SAFETY: readable, just checked.
    duration(unsafe { &*req })
}

/// Sleeps the fiber; a cancellation ends the sleep early, and a fiber whose cancellation a
/// hook caught does not sleep at all (like every hooked call that would wait): a loop of
/// sleeps, or std's `thread::sleep(Duration::MAX)` split into several, then ends.
fn fiber_sleep(meta: &crate::fiber::FiberMeta, d: Duration) {
    if !meta.hook_cancel.get() {
        in_fiber(meta, || (), || crate::time::sleep(d))
    }
}

#[no_mangle]
pub unsafe extern "C" fn nanosleep(req: *const timespec, rem: *mut timespec) -> c_int {
    if let Some(meta) = active() {
        // SAFETY: the caller's timespec, checked first.
        if let Some(d) = unsafe { request(req) } {
            fiber_sleep(meta, d);
            return 0;
        }
    }
    // SAFETY: the caller's arguments (a bad request gets the real call's error).
    unsafe { real::nanosleep(req, rem) }
}

#[no_mangle]
pub unsafe extern "C" fn clock_nanosleep(
    clock: libc::clockid_t,
    flags: c_int,
    req: *const timespec,
    rem: *mut timespec,
) -> c_int {
    let meta = match active() {
        Some(meta)
            if matches!(
                clock,
                libc::CLOCK_REALTIME | libc::CLOCK_MONOTONIC | libc::CLOCK_BOOTTIME
            ) =>
        {
            meta
        }
        // SAFETY: the caller's arguments.
        _ => return unsafe { real::clock_nanosleep(clock, flags, req, rem) },
    };
    // SAFETY: the caller's timespec, checked first.
    let Some(d) = (unsafe { request(req) }) else {
        // SAFETY: the caller's arguments, passed on as they came.
        return unsafe { real::clock_nanosleep(clock, flags, req, rem) };
    };
    let d = if flags & libc::TIMER_ABSTIME != 0 {
        let mut now = timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        // SAFETY: `now` is a live timespec; the clock is one of three valid ones.
        unsafe { libc::clock_gettime(clock, &mut now) };
        d.saturating_sub(duration(&now).unwrap_or_default())
    } else {
        d
    };
    fiber_sleep(meta, d);
    0
}

#[no_mangle]
pub unsafe extern "C" fn usleep(usecs: libc::useconds_t) -> c_int {
    match active() {
        Some(meta) => {
            fiber_sleep(meta, Duration::from_micros(u64::from(usecs)));
            0
        }
        // SAFETY: no pointers.
        None => unsafe { real::usleep(usecs) },
    }
}

#[no_mangle]
pub unsafe extern "C" fn sleep(secs: c_uint) -> c_uint {
    match active() {
        Some(meta) => {
            fiber_sleep(meta, Duration::from_secs(u64::from(secs)));
            0
        }
        // SAFETY: no pointers.
        None => unsafe { real::sleep(secs) },
    }
}

// ---- name resolution ----

struct Args(
    *const c_char,
    *const c_char,
    *const addrinfo,
    *mut *mut addrinfo,
);
// SAFETY: the pointers are the caller's, valid until the hook returns, and the hook waits for
// the pool thread to finish with them (also when the fiber is cancelled meanwhile).
unsafe impl Send for Args {}

#[no_mangle]
pub unsafe extern "C" fn getaddrinfo(
    node: *const c_char,
    service: *const c_char,
    hints: *const addrinfo,
    res: *mut *mut addrinfo,
) -> c_int {
    let Some(meta) = active() else {
        // SAFETY: the caller's arguments.
        return unsafe { real::getaddrinfo(node, service, hints, res) };
    };
    let args = Args(node, service, hints, res);
    // What the pool's call returned, written by the pool thread itself: if the fiber is
    // cancelled while it waits, `unblock` still waits for the call but its value is lost.
    const NOT_RUN: c_int = c_int::MIN;
    let returned = std::sync::atomic::AtomicI32::new(NOT_RUN);
    let cancelled = std::cell::Cell::new(false);
    let rc = in_fiber(
        meta,
        || {
            cancelled.set(true);
            libc::EAI_SYSTEM
        },
        || {
            let returned = &returned;
            crate::unblock(move || {
                let a = args;
                // SAFETY: the caller's arguments, alive until this hook returns.
                let rc = unsafe { real::getaddrinfo(a.0, a.1, a.2, a.3) };
                returned.store(rc, std::sync::atomic::Ordering::Release);
                rc
            })
        },
    );
    if cancelled.get() {
        // Cancelled: the caller sees an error, so it will not free a list the call made.
        if returned.load(std::sync::atomic::Ordering::Acquire) == 0 {
            // SAFETY: the successful call wrote the list to the caller's out-pointer.
            unsafe {
                libc::freeaddrinfo(*res);
                *res = std::ptr::null_mut();
            }
        }
        set_errno(libc::ECANCELED);
    }
    rc
}

// ---- other names of the same calls ----
//
// C code built with `_FILE_OFFSET_BITS=64` calls `fcntl64` (glibc's headers rename `fcntl`),
// and code built with `_FORTIFY_SOURCE` calls the `__*_chk` forms where the compiler knows
// the buffer's size: without these, such code would bypass the hooks and block a worker.

#[no_mangle]
pub unsafe extern "C" fn fcntl64(fd: c_int, cmd: c_int, arg: c_ulong) -> c_int {
    // SAFETY: the caller's arguments, as `fcntl` takes them.
    unsafe { fcntl(fd, cmd, arg) }
}

#[no_mangle]
pub unsafe extern "C" fn __fcntl(fd: c_int, cmd: c_int, arg: c_ulong) -> c_int {
    // SAFETY: as above.
    unsafe { fcntl(fd, cmd, arg) }
}

extern "C" {
    /// glibc's report of a buffer overflow caught by a `_chk` function: it aborts.
    fn __chk_fail() -> !;
}

#[no_mangle]
pub unsafe extern "C" fn __read_chk(
    fd: c_int,
    buf: *mut c_void,
    n: size_t,
    buflen: size_t,
) -> ssize_t {
    if n > buflen {
        // SAFETY: no arguments; it does not return.
        unsafe { __chk_fail() }
    }
    // SAFETY: the caller's arguments, checked as glibc's `__read_chk` does.
    unsafe { read(fd, buf, n) }
}

#[no_mangle]
pub unsafe extern "C" fn __recv_chk(
    fd: c_int,
    buf: *mut c_void,
    n: size_t,
    buflen: size_t,
    flags: c_int,
) -> ssize_t {
    if n > buflen {
        // SAFETY: as above.
        unsafe { __chk_fail() }
    }
    // SAFETY: as above.
    unsafe { recv(fd, buf, n, flags) }
}

#[no_mangle]
pub unsafe extern "C" fn __recvfrom_chk(
    fd: c_int,
    buf: *mut c_void,
    n: size_t,
    buflen: size_t,
    flags: c_int,
    addr: *mut sockaddr,
    len: *mut socklen_t,
) -> ssize_t {
    if n > buflen {
        // SAFETY: as above.
        unsafe { __chk_fail() }
    }
    // SAFETY: as above.
    unsafe { recvfrom(fd, buf, n, flags, addr, len) }
}

#[no_mangle]
pub unsafe extern "C" fn __poll_chk(
    fds: *mut pollfd,
    n: nfds_t,
    timeout: c_int,
    fdslen: size_t,
) -> c_int {
    if fdslen / std::mem::size_of::<pollfd>() < n as usize {
        // SAFETY: as above.
        unsafe { __chk_fail() }
    }
    // SAFETY: as above.
    unsafe { poll(fds, n, timeout) }
}

#[no_mangle]
pub unsafe extern "C" fn __ppoll_chk(
    fds: *mut pollfd,
    n: nfds_t,
    timeout: *const timespec,
    mask: *const libc::sigset_t,
    fdslen: size_t,
) -> c_int {
    if fdslen / std::mem::size_of::<pollfd>() < n as usize {
        // SAFETY: as above.
        unsafe { __chk_fail() }
    }
    // SAFETY: as above.
    unsafe { ppoll(fds, n, timeout, mask) }
}

// ---- descriptors: keep the table right ----

#[no_mangle]
pub unsafe extern "C" fn close(fd: c_int) -> c_int {
    fd::forget(fd);
    // SAFETY: the caller's fd.
    unsafe { real::close(fd) }
}

/// `fcntl(fd, cmd, arg)`. The C function is variadic; on the 64-bit Linux ABIs fibra
/// supports, an integer or pointer third argument travels in the same register either way,
/// so it is taken (and passed on) as one machine word.
#[no_mangle]
pub unsafe extern "C" fn fcntl(fd: c_int, cmd: c_int, arg: c_ulong) -> c_int {
    match cmd {
        libc::F_GETFL => {
            // SAFETY: F_GETFL takes no argument.
            let flags = unsafe { real::fcntl(fd, cmd, arg) };
            let state = if flags >= 0 && flags & libc::O_NONBLOCK != 0 {
                fd::look_nonblocking(fd)
            } else {
                fd::lookup(fd).map(|s| s.state())
            };
            match state {
                Some(s) if flags >= 0 && s & 3 == fd::HOOKED => {
                    (flags & !libc::O_NONBLOCK)
                        | if s & fd::USER_NONBLOCK != 0 {
                            libc::O_NONBLOCK
                        } else {
                            0
                        }
                }
                _ => flags,
            }
        }
        libc::F_SETFL => {
            let Some(slot) = fd::lookup(fd).filter(|s| s.hooked()) else {
                // SAFETY: F_SETFL takes an int of flags.
                return unsafe { real::fcntl(fd, cmd, arg) };
            };
            // The kernel mode stays non-blocking; the user's view changes only if the kernel
            // takes the rest of the request.
            // SAFETY: as above.
            let r = unsafe { real::fcntl(fd, cmd, arg | libc::O_NONBLOCK as c_ulong) };
            if r == 0 {
                slot.set_user_nonblock(fd, arg as c_int & libc::O_NONBLOCK != 0);
            }
            r
        }
        libc::F_DUPFD | libc::F_DUPFD_CLOEXEC => {
            // SAFETY: the caller's arguments.
            let r = unsafe { real::fcntl(fd, cmd, arg) };
            if r >= 0 {
                fd::duplicated(fd, r);
            }
            r
        }
        // SAFETY: the caller's arguments, passed on in the same register.
        _ => unsafe { real::fcntl(fd, cmd, arg) },
    }
}

/// `ioctl(fd, request, arg)`: variadic like `fcntl`, taken the same way.
#[no_mangle]
pub unsafe extern "C" fn ioctl(fd: c_int, request: c_ulong, arg: c_ulong) -> c_int {
    if request == libc::FIONBIO as c_ulong && arg != 0 {
        if let Some(slot) = fd::lookup(fd).filter(|s| s.hooked()) {
            // SAFETY: FIONBIO's argument points to the caller's int.
            let on = unsafe { *(arg as *const c_int) } != 0;
            let one: c_int = 1;
            // SAFETY: FIONBIO with a pointer to a live int: the kernel mode stays
            // non-blocking; the user's view changes if the kernel takes the request.
            let r = unsafe { real::ioctl(fd, request, &one as *const c_int as c_ulong) };
            if r == 0 {
                slot.set_user_nonblock(fd, on);
            }
            return r;
        }
    }
    // SAFETY: the caller's arguments, passed on in the same registers.
    unsafe { real::ioctl(fd, request, arg) }
}

#[no_mangle]
pub unsafe extern "C" fn dup(fd: c_int) -> c_int {
    // SAFETY: the caller's fd.
    let r = unsafe { real::dup(fd) };
    if r >= 0 {
        fd::duplicated(fd, r);
    }
    r
}

/// Whether `fd` is open (a failed `dup2`/`dup3` must leave its target alone).
fn is_open(fd: c_int) -> bool {
    // SAFETY: F_GETFD takes no argument.
    unsafe { real::fcntl(fd, libc::F_GETFD, 0) >= 0 }
}

#[no_mangle]
pub unsafe extern "C" fn dup2(fd: c_int, new: c_int) -> c_int {
    if fd != new && is_open(fd) {
        // `new` is closed by the call: forget it first, as `close` would (after, a waiter
        // or the reactor would meet the number's new file).
        fd::forget(new);
    }
    // SAFETY: the caller's fds.
    let r = unsafe { real::dup2(fd, new) };
    if r >= 0 && fd != new {
        fd::duplicated(fd, r);
    }
    r
}

#[no_mangle]
pub unsafe extern "C" fn dup3(fd: c_int, new: c_int, flags: c_int) -> c_int {
    // The kernel refuses these before touching `new`.
    if fd != new && flags & !libc::O_CLOEXEC == 0 && is_open(fd) {
        fd::forget(new);
    }
    // SAFETY: the caller's arguments.
    let r = unsafe { real::dup3(fd, new, flags) };
    if r >= 0 {
        fd::duplicated(fd, r);
    }
    r
}

#[no_mangle]
pub unsafe extern "C" fn socket(domain: c_int, ty: c_int, proto: c_int) -> c_int {
    // SAFETY: no pointers.
    let r = unsafe { real::socket(domain, ty, proto) };
    if r >= 0 {
        fd::created(r);
    }
    r
}

#[no_mangle]
pub unsafe extern "C" fn socketpair(
    domain: c_int,
    ty: c_int,
    proto: c_int,
    fds: *mut c_int,
) -> c_int {
    // SAFETY: the caller's array of two fds.
    let r = unsafe { real::socketpair(domain, ty, proto, fds) };
    if r == 0 {
        // SAFETY: filled in by the successful call.
        unsafe { forget_pair(fds) };
    }
    r
}

#[no_mangle]
pub unsafe extern "C" fn pipe(fds: *mut c_int) -> c_int {
    // SAFETY: the caller's array of two fds.
    let r = unsafe { real::pipe(fds) };
    if r == 0 {
        // SAFETY: filled in by the successful call.
        unsafe { forget_pair(fds) };
    }
    r
}

#[no_mangle]
pub unsafe extern "C" fn pipe2(fds: *mut c_int, flags: c_int) -> c_int {
    // SAFETY: the caller's array of two fds.
    let r = unsafe { real::pipe2(fds, flags) };
    if r == 0 {
        // SAFETY: filled in by the successful call.
        unsafe { forget_pair(fds) };
    }
    r
}

unsafe fn forget_pair(fds: *const c_int) {
    // SAFETY: the caller's two-fd array.
    let (a, b) = unsafe { (*fds, *fds.add(1)) };
    fd::created(a);
    fd::created(b);
}
