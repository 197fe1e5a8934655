//! `poll` and `select` in a fiber: park on the reactor records of all the fds at once.

use super::{fd, real};
use crate::fiber::FiberMeta;
use crate::io::reactor::{wait_any, IoRecord, READABLE, WRITABLE};
use libc::{c_int, pollfd};
use std::sync::Arc;
use std::time::Instant;

/// The fiber's `poll`: the real call with a zero timeout until something is ready or the
/// deadline passes, parked on the fds' readiness in between. Fds the reactor cannot watch
/// (regular files: always ready) are left to the real call.
pub(super) fn poll(meta: &FiberMeta, fds: &mut [pollfd], deadline: Option<Instant>) -> c_int {
    crate::coop::spend();
    let mut watched: Vec<(Arc<IoRecord>, u32)> = Vec::with_capacity(fds.len());
    for p in fds.iter() {
        if p.fd < 0 {
            continue;
        }
        let mut interest = 0;
        if p.events & (libc::POLLIN | libc::POLLPRI | libc::POLLRDHUP) != 0 {
            interest |= READABLE;
        }
        if p.events & libc::POLLOUT != 0 {
            interest |= WRITABLE;
        }
        if let Some(rec) = fd::slot(p.fd).and_then(|s| s.register(p.fd).ok()) {
            watched.push((rec, interest));
        }
    }
    loop {
        let seen: Vec<u64> = watched.iter().map(|(r, _)| r.snapshot()).collect();
        // SAFETY: the caller's live array.
        let n = unsafe { real::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, 0) };
        // Even a poll that does not wait fails with `EINTR` when a signal is pending and
        // nothing is ready; a hooked call in a fiber never reports that (module docs).
        if n < 0 && super::errno() == libc::EINTR {
            continue;
        }
        if n != 0 {
            return n;
        }
        if deadline.is_some_and(|d| Instant::now() >= d) {
            return 0;
        }
        if meta.hook_cancel.get() {
            super::set_errno(libc::ECANCELED);
            return -1;
        }
        for ((rec, interest), seen) in watched.iter().zip(seen) {
            rec.clear(seen, *interest);
        }
        if watched.is_empty() {
            match deadline {
                Some(d) => crate::sleep_until(d),
                None => crate::sleep_until(crate::time::far_future()),
            }
        } else {
            wait_any(&watched, deadline);
        }
    }
}

/// The fiber's `select`, by way of [`poll`]. Updates the timeout to the time left, as Linux
/// does.
///
/// # Safety
/// `sets` are null or the caller's fd sets; `timeout` is null or the caller's timeval.
pub(super) unsafe fn select(
    meta: &FiberMeta,
    n: c_int,
    sets: [*mut libc::fd_set; 3],
    deadline: Option<Instant>,
    timeout: *mut libc::timeval,
) -> c_int {
    const EVENTS: [libc::c_short; 3] = [libc::POLLIN, libc::POLLOUT, libc::POLLPRI];
    let mut fds: Vec<pollfd> = Vec::new();
    for fd in 0..n {
        let mut events = 0;
        for (set, ev) in sets.iter().zip(EVENTS) {
            // SAFETY: a non-null set is the caller's; `fd < n <= FD_SETSIZE`.
            if !set.is_null() && unsafe { libc::FD_ISSET(fd, *set) } {
                events |= ev;
            }
        }
        if events != 0 {
            fds.push(pollfd {
                fd,
                events,
                revents: 0,
            });
        }
    }
    let r = poll(meta, &mut fds, deadline);
    if let (Some(d), false) = (deadline, timeout.is_null()) {
        let left = d.saturating_duration_since(Instant::now());
        // SAFETY: the caller's timeval.
        unsafe {
            (*timeout).tv_sec = left.as_secs() as libc::time_t;
            (*timeout).tv_usec = left.subsec_micros() as libc::suseconds_t;
        }
    }
    if r < 0 {
        return r;
    }
    if fds.iter().any(|p| p.revents & libc::POLLNVAL != 0) {
        super::set_errno(libc::EBADF);
        return -1;
    }
    let mut count = 0;
    for set in sets.iter().filter(|s| !s.is_null()) {
        // SAFETY: the caller's set.
        unsafe { libc::FD_ZERO(*set) };
    }
    for p in &fds {
        let ready = [
            p.revents & (libc::POLLIN | libc::POLLHUP | libc::POLLERR) != 0,
            p.revents & (libc::POLLOUT | libc::POLLERR) != 0,
            p.revents & libc::POLLPRI != 0,
        ];
        for ((set, ev), hit) in sets.iter().zip(EVENTS).zip(ready) {
            if !set.is_null() && p.events & ev != 0 && hit {
                // SAFETY: the caller's set; `p.fd < n`.
                unsafe { libc::FD_SET(p.fd, *set) };
                count += 1;
            }
        }
    }
    count
}
