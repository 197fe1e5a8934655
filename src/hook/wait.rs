//! `poll` and `select` in a fiber: park on the reactor records of all the fds at once.

use super::{fd, real};
use crate::fiber::FiberMeta;
use crate::io::reactor::{wait_any, IoRecord, READABLE, WRITABLE};
use libc::{c_int, pollfd};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The fiber's `poll`: the real call with a zero timeout until something is ready or the
/// deadline passes, parked on the fds' readiness in between. Fds the reactor cannot watch
/// (regular files: always ready) are left to the real call. The kernel looks at the array
/// first, so a bad one gets its error (`EFAULT`) before the hook reads an entry. Fds the
/// reactor could not take (it cannot make its epoll instance, or `epoll_ctl` fails under
/// memory pressure) are looked at again on a short timer, so their readiness is late but
/// never lost.
///
/// # Safety
/// `fds` and `n` are the caller's, as passed to `poll`; `n` is within `RLIMIT_NOFILE`.
pub(super) unsafe fn poll(
    meta: &FiberMeta,
    fds: *mut pollfd,
    n: usize,
    deadline: Option<Instant>,
) -> c_int {
    crate::coop::spend();
    let look = || loop {
        // SAFETY: the caller's arguments; the kernel checks the array.
        let r = unsafe { real::poll(fds, n as libc::nfds_t, 0) };
        // Even a poll that does not wait fails with `EINTR` when a signal is pending and
        // nothing is ready; a hooked call in a fiber never reports that (module docs).
        if !(r < 0 && super::errno() == libc::EINTR) {
            break r;
        }
    };
    let r = look();
    if r != 0 || deadline.is_some_and(|d| Instant::now() >= d) {
        return r;
    }
    if !fds.is_aligned() {
        // Only C code that is wrong already passes a misaligned array the kernel takes: it
        // gets the real call, which blocks the worker.
        let timeout = deadline.map_or(-1, |d| {
            let left = d.saturating_duration_since(Instant::now());
            c_int::try_from(left.as_millis().max(1)).unwrap_or(c_int::MAX)
        });
        // SAFETY: the caller's arguments.
        return unsafe { real::poll(fds, n as libc::nfds_t, timeout) };
    }
    // SAFETY: the kernel read and wrote the caller's `n` entries just now.
    let fds = unsafe { slice(fds, n) };
    let mut watched: Vec<(Arc<IoRecord>, u32)> = Vec::with_capacity(fds.len());
    let mut unwatched = false;
    for p in fds.iter() {
        if p.fd < 0 {
            continue;
        }
        let mut interest = 0;
        let read = libc::POLLIN | libc::POLLPRI | libc::POLLRDHUP | libc::POLLRDNORM;
        if p.events & (read | libc::POLLRDBAND) != 0 {
            interest |= READABLE;
        }
        if p.events & (libc::POLLOUT | libc::POLLWRNORM | libc::POLLWRBAND) != 0 {
            interest |= WRITABLE;
        }
        match fd::slot(p.fd).map(|s| s.register(p.fd)) {
            Some(Ok(rec)) => watched.push((rec, interest)),
            // A regular file: always ready, so the real call answers at once.
            Some(Err(e)) if e.raw_os_error() == Some(libc::EPERM) => {}
            _ => unwatched = true,
        }
    }
    let mut recheck = Duration::from_millis(1);
    loop {
        let seen: Vec<u64> = watched.iter().map(|(r, _)| r.snapshot()).collect();
        let r = look();
        if r != 0 {
            return r;
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
        let until = if unwatched {
            let soon = Instant::now() + recheck;
            recheck = (recheck * 2).min(RECHECK_AT_MOST);
            Some(deadline.map_or(soon, |d| d.min(soon)))
        } else {
            deadline
        };
        if watched.is_empty() {
            crate::sleep_until(until.unwrap_or_else(crate::time::far_future));
        } else {
            wait_any(&watched, until);
        }
    }
}

/// How long at most a `poll` waits before it looks again at fds the reactor could not take.
const RECHECK_AT_MOST: Duration = Duration::from_millis(16);

/// The caller's `n` pollfds as a slice.
///
/// # Safety
/// `fds` points to `n` live, aligned pollfds (or `n` is 0), used by nothing else meanwhile.
unsafe fn slice<'a>(fds: *mut pollfd, n: usize) -> &'a mut [pollfd] {
    if n == 0 || fds.is_null() {
        &mut []
    } else {
        // SAFETY: the caller's guarantee.
        unsafe { std::slice::from_raw_parts_mut(fds, n) }
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
            // SAFETY: a non-null set is the caller's, `n` bits long at least (`fd < n`).
            if !set.is_null() && unsafe { FdBits(*set).get(fd) } {
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
    // SAFETY: our own array.
    let r = unsafe { poll(meta, fds.as_mut_ptr(), fds.len(), deadline) };
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
        // SAFETY: the caller's set, `n` bits long at least.
        unsafe { FdBits(*set).clear(n) };
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
                unsafe { FdBits(*set).set(p.fd) };
                count += 1;
            }
        }
    }
    count
}

/// A caller's `fd_set`, as the kernel reads it: an array of words of which the first
/// `ceil(n / bits)` count, however many `FD_SETSIZE` says (a program may allocate a larger
/// set for fds past 1 024).
struct FdBits(*mut libc::fd_set);

impl FdBits {
    const BITS: usize = libc::c_ulong::BITS as usize;

    fn word(&self, fd: c_int) -> *mut libc::c_ulong {
        // In bounds by the callers' contracts: the set holds `fd`'s word.
        self.0
            .cast::<libc::c_ulong>()
            .wrapping_add(fd as usize / Self::BITS)
    }

    /// # Safety
    /// The set holds at least `fd + 1` bits.
    unsafe fn get(&self, fd: c_int) -> bool {
        // SAFETY: the caller's guarantee.
        unsafe { *self.word(fd) >> (fd as usize % Self::BITS) & 1 != 0 }
    }

    /// # Safety
    /// As for [`get`](FdBits::get).
    unsafe fn set(&self, fd: c_int) {
        // SAFETY: the caller's guarantee.
        unsafe { *self.word(fd) |= 1 << (fd as usize % Self::BITS) };
    }

    /// Clears the words that hold the first `n` bits, as the kernel writes them back.
    ///
    /// # Safety
    /// The set holds at least `n` bits.
    unsafe fn clear(&self, n: c_int) {
        for w in 0..(n as usize).div_ceil(Self::BITS) {
            // SAFETY: the caller's guarantee: word `w` holds bits below `n`.
            unsafe { *self.0.cast::<libc::c_ulong>().add(w) = 0 };
        }
    }
}
