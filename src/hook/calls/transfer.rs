//! Transfers the kernel makes between two fds: `splice`, `tee` and `sendfile` (with
//! `sendfile64`), which std's `io::copy` uses between pipes, sockets and files; and
//! `vmsplice`, between a pipe and memory.
//!
//! Either fd may be one the hooks switched to non-blocking mode, and the kernel then fails
//! the whole transfer with `EAGAIN` where a blocking one would wait (a `splice` into a
//! switched socket even for an empty pipe on the other side). A call that is blocking in
//! the user's view goes on instead: it waits for the side that held it up — parked, for an
//! fd the hooks switched; in `poll(2)`, blocking the thread, for an fd that blocks in the
//! kernel (a standard stream) — and returns once it moved something, as the kernel's
//! does (`sendfile`: all it was asked for). A side the user made non-blocking fails it
//! with `EAGAIN`, as the kernel would.

use crate::hook::{
    blocking, errno, in_ctx, real, route, set_errno, start, switched_route, Blocking, Ctx, Route,
    READ, RECHECK_FIRST, RECHECK_MAX, WRITE,
};
use libc::{c_int, c_uint, iovec, loff_t, off64_t, off_t, size_t, ssize_t};

#[no_mangle]
pub unsafe extern "C" fn splice(
    fd_in: c_int,
    off_in: *mut loff_t,
    fd_out: c_int,
    off_out: *mut loff_t,
    len: size_t,
    flags: c_uint,
) -> ssize_t {
    // SAFETY: the caller's arguments, passed on as they came: the kernel moves the offsets
    // on, so a call that goes on continues where the last one ended.
    transfer(fd_in, fd_out, flags, 0, |_| unsafe {
        real::splice(fd_in, off_in, fd_out, off_out, len, flags)
    })
}

#[no_mangle]
pub unsafe extern "C" fn tee(fd_in: c_int, fd_out: c_int, len: size_t, flags: c_uint) -> ssize_t {
    // SAFETY: the caller's arguments, passed on as they came.
    transfer(fd_in, fd_out, flags, 0, |_| unsafe {
        real::tee(fd_in, fd_out, len, flags)
    })
}

#[no_mangle]
pub unsafe extern "C" fn sendfile(
    out_fd: c_int,
    in_fd: c_int,
    offset: *mut off_t,
    count: size_t,
) -> ssize_t {
    // SAFETY: the caller's arguments; the kernel moves the offset (or the file position)
    // on, and `done` counts the bytes already sent, so `count - done` is what is left.
    transfer(in_fd, out_fd, 0, count, |done| unsafe {
        real::sendfile(out_fd, in_fd, offset, count - done)
    })
}

/// `sendfile` with a 64-bit offset, which `off_t` is on the platforms fibra runs on.
#[no_mangle]
pub unsafe extern "C" fn sendfile64(
    out_fd: c_int,
    in_fd: c_int,
    offset: *mut off64_t,
    count: size_t,
) -> ssize_t {
    // SAFETY: the caller's arguments; `off64_t` is `off_t` here.
    unsafe { sendfile(out_fd, in_fd, offset, count) }
}

#[no_mangle]
pub unsafe extern "C" fn vmsplice(
    fd: c_int,
    iov: *const iovec,
    nr_segs: size_t,
    flags: c_uint,
) -> ssize_t {
    // The kernel's vmsplice waits for the pipe whatever the file's mode; only the flag
    // stops it. So the call is made with the flag where the fd waits in a fiber's way.
    if flags & libc::SPLICE_F_NONBLOCK != 0 {
        // SAFETY: the caller's arguments, passed on as they came.
        return unsafe { real::vmsplice(fd, iov, nr_segs, flags) };
    }
    // SAFETY: F_GETFL takes no argument.
    let mode = unsafe { real::fcntl(fd, libc::F_GETFL, 0) };
    // The pipe's write end moves memory into the pipe; its read end, out of it.
    let dir = if mode >= 0 && mode & libc::O_ACCMODE == libc::O_WRONLY {
        WRITE
    } else {
        READ
    };
    // SAFETY: the caller's arguments, passed on as they came (an fd that does not wait).
    let first = || unsafe { real::vmsplice(fd, iov, nr_segs, flags) };
    match start(fd, dir, || 0, first) {
        Err(r) => r,
        Ok((b, _)) => blocking(b, |b| {
            let flags = flags | libc::SPLICE_F_NONBLOCK;
            // SAFETY: the caller's arguments, with the kernel's own non-blocking flag.
            b.run(|| unsafe { real::vmsplice(fd, iov, nr_segs, flags) })
        }),
    }
}

/// A transfer from `src` to `dst` that `op` makes (the real call, given how many bytes this
/// call already moved; -1 with `errno` on failure), with `flags` the caller's (`splice`'s
/// own non-blocking flag makes it the real call alone). It ends once it moved something,
/// or `whole` bytes if `whole` is more; at the end of the input (0); or at an error,
/// reported if nothing moved before it.
fn transfer(
    src: c_int,
    dst: c_int,
    flags: c_uint,
    whole: usize,
    mut op: impl FnMut(usize) -> isize,
) -> isize {
    if flags & libc::SPLICE_F_NONBLOCK != 0 {
        return op(0);
    }
    let side = |fd, dir| match route(fd) {
        Route::Pass => None,
        Route::Wait(ctx, slot, state) => Some(Blocking::new(ctx, fd, slot, state, dir)),
    };
    let (mut from, mut to) = (side(src, READ), side(dst, WRITE));
    if from.is_none() && to.is_none() {
        let r = op(0);
        if !(r < 0 && errno() == libc::EAGAIN) {
            return r;
        }
        // Neither waited when the call set out, and it would block: one of them may have
        // been switched while it was on its way (see `switched_under`).
        from = switched_route(src, READ);
        to = switched_route(dst, WRITE);
    }
    let ctx = match (&from, &to) {
        (Some(b), _) | (None, Some(b)) => b.ctx,
        (None, None) => {
            set_errno(libc::EAGAIN);
            return -1;
        }
    };
    in_ctx(ctx, || {
        let mut done = 0usize;
        let mut nap = RECHECK_FIRST;
        let fail = |done: usize, e: c_int| {
            if done > 0 {
                done as isize
            } else {
                set_errno(e);
                -1
            }
        };
        loop {
            let seen_from = from.as_ref().and_then(Blocking::before);
            let seen_to = to.as_ref().and_then(Blocking::before);
            let r = op(done);
            if r > 0 {
                done += r as usize;
                if done >= whole {
                    return done as isize;
                }
                continue;
            }
            if r == 0 || errno() != libc::EAGAIN {
                return if done > 0 { done as isize } else { r };
            }
            // Which side held it up?
            let (fd, dir, b, seen) = if !ready(src, READ.interest) {
                (src, READ, &mut from, seen_from)
            } else if !ready(dst, WRITE.interest) {
                (dst, WRITE, &mut to, seen_to)
            } else {
                // Both look ready, yet the call would block (a pipe with room for less than
                // the kernel wants to move at once): look again after a nap.
                match ctx {
                    Ctx::Fiber(_) => crate::sleep(nap),
                    Ctx::Thread => std::thread::sleep(nap),
                }
                nap = (nap * 2).min(RECHECK_MAX);
                continue;
            };
            let waited = match b {
                Some(b) => b.again(seen),
                // Not ready and not switched: the user made it non-blocking, and the
                // kernel's answer stands; or it blocks in the kernel (a standard stream),
                // and the kernel failed the call only for the other side's mode: wait as
                // the kernel would have, blocking the thread.
                None if nonblocking(fd) => Err(libc::EAGAIN),
                None => crate::io::reactor::poll_fd(fd, dir.interest, None)
                    .map(drop)
                    .map_err(|e| e.raw_os_error().unwrap_or(libc::EAGAIN)),
            };
            if let Err(e) = waited {
                return fail(done, e);
            }
        }
    })
}

/// Whether `fd` is ready for `interest` now (an error or a hang-up counts: the call
/// reports it). Keeps `errno`.
fn ready(fd: c_int, interest: u32) -> bool {
    let saved = errno();
    let r = crate::io::reactor::poll_once(fd, interest, 0).map_or(true, |bits| bits != 0);
    set_errno(saved);
    r
}

/// Whether `fd`'s open file is in non-blocking mode in the kernel. Keeps `errno`.
fn nonblocking(fd: c_int) -> bool {
    let saved = errno();
    // SAFETY: F_GETFL takes no argument.
    let mode = unsafe { real::fcntl(fd, libc::F_GETFL, 0) };
    set_errno(saved);
    mode >= 0 && mode & libc::O_NONBLOCK != 0
}
