//! The sleeps: `nanosleep`, `clock_nanosleep`, `usleep` and `sleep` park the fiber on a
//! timer instead of blocking its worker. A request the real call would refuse goes to it,
//! for its error.

use crate::hook::{self, active, in_fiber, real};
use libc::{c_int, c_uint, timespec};
use std::time::Duration;

/// A valid timespec as a duration.
pub(super) fn duration(ts: &timespec) -> Option<Duration> {
    (ts.tv_sec >= 0 && (0..1_000_000_000).contains(&ts.tv_nsec))
        .then(|| Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32))
}

/// The caller's sleep request as a duration; `None` for a null, unreadable or invalid one,
/// which the real call refuses (`EFAULT`, `EINVAL`).
///
/// # Safety
/// `req` is what the caller passed as a timespec pointer.
unsafe fn request(req: *const timespec) -> Option<Duration> {
    if !hook::readable(req.cast(), size_of::<timespec>()) {
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
