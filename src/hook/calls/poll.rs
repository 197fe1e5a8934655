//! Waiting for many descriptors: `poll`, `ppoll` and `select`. In a fiber they wait through
//! `hook::wait` for the reactor; whatever only the kernel can do (a signal mask, a zero or
//! invalid timeout, an array or set it cannot read) goes to the real call.

use super::sleep::duration;
use crate::hook::{self, active, cancelled, in_fiber, real};
use crate::sys::deadline_after;
use libc::{c_int, nfds_t, pollfd, timespec};
use std::time::Duration;

#[no_mangle]
pub unsafe extern "C" fn poll(fds: *mut pollfd, n: nfds_t, timeout: c_int) -> c_int {
    match active() {
        // A null array of entries is the kernel's to refuse (EFAULT).
        Some(meta) if timeout != 0 && nfds_ok(n) && (n == 0 || !fds.is_null()) => {
            let deadline =
                (timeout > 0).then(|| deadline_after(Duration::from_millis(timeout as u64)));
            in_fiber(meta, cancelled, || {
                // SAFETY: the caller's array of `n` pollfds, `n` within the limit.
                unsafe { hook::wait::poll(meta, fds, n as usize, deadline) }
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
        unsafe { hook::wait::poll(meta, fds, n as usize, d.map(deadline_after)) }
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
        .any(|set| !set.is_null() && !hook::readable(set.cast(), bytes))
    {
        // SAFETY: the caller's arguments, passed on as they came.
        return unsafe { real::select(n, r, w, e, timeout) };
    }
    let deadline = d.map(deadline_after);
    in_fiber(meta, cancelled, || {
        // SAFETY: the caller's fd sets (null ones are skipped) and timeout.
        unsafe { hook::wait::select(meta, n, [r, w, e], deadline, timeout) }
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
