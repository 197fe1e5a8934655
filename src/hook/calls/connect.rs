//! Connections: `connect` (a blocking connect waits for writability, or retries on a
//! timer while a Unix listener's backlog is full), `accept` and `accept4` (which tell the
//! fd table about the new descriptor).

use crate::hook::{self, cancelled, errno, fd, in_fiber, io, real, route, set_errno};
use crate::hook::{Blocking, Ctx, Route, READ, WRITE};
use libc::{c_int, pollfd, sockaddr, socklen_t};
use std::time::Duration;

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
            match hook::switched_route(fd, WRITE) {
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
