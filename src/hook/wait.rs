//! `poll` and `select` in a fiber: park on the reactor records of all the fds at once.

use super::{fd, real};
use crate::fiber::FiberMeta;
use crate::io::reactor::{wait_any, IoRecord, READABLE, WRITABLE};
use libc::{c_int, pollfd};
use std::sync::Arc;
use std::time::Instant;

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
        let saved = super::errno();
        let registered = fd::slot(p.fd).map(|s| s.register(p.fd));
        super::set_errno(saved);
        match registered {
            Some(Ok(rec)) => watched.push((rec, interest)),
            // A regular file: always ready, so the real call answers at once.
            Some(Err(e)) if e.raw_os_error() == Some(libc::EPERM) => {}
            _ => unwatched = true,
        }
    }
    let mut recheck = super::RECHECK_FIRST;
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
            recheck = (recheck * 2).min(super::RECHECK_MAX);
            Some(deadline.map_or(soon, |d| d.min(soon)))
        } else {
            deadline
        };
        if watched.is_empty() {
            crate::sleep_until(until.unwrap_or_else(crate::sys::far_future));
        } else {
            wait_any(&watched, until);
        }
    }
}

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
/// does. The caller's sets are read into copies (the caller checked they can be read) and
/// the results written back as the kernel writes them: a set that cannot be written fails
/// the call with `EFAULT`, a timeout that cannot be updated is left as it was.
///
/// # Safety
/// `sets` are null or the caller's fd sets, readable for `n` bits; `timeout` is null or the
/// caller's timeval.
pub(super) unsafe fn select(
    meta: &FiberMeta,
    n: c_int,
    sets: [*mut libc::fd_set; 3],
    deadline: Option<Instant>,
    timeout: *mut libc::timeval,
) -> c_int {
    const EVENTS: [libc::c_short; 3] = [libc::POLLIN, libc::POLLOUT, libc::POLLPRI];
    // SAFETY: the caller's guarantee.
    let given = sets.map(|set| (!set.is_null()).then(|| unsafe { FdBits::read(set, n) }));
    let mut fds: Vec<pollfd> = Vec::new();
    for fd in 0..n {
        let mut events = 0;
        for (set, ev) in given.iter().zip(EVENTS) {
            if set.as_ref().is_some_and(|s| s.get(fd)) {
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
    let r = loop {
        // SAFETY: our own array.
        let r = unsafe { poll(meta, fds.as_mut_ptr(), fds.len(), deadline) };
        if r <= 0 {
            break r;
        }
        // The kernel's select counts only what its sets ask for: poll reports a hang-up or
        // an error whatever was asked, which ends no select that asked only for urgent data
        // (or only to write, for a hang-up). Such an fd can never be ready for what was
        // asked (nothing more comes on it), and would end every wait: leave it out, and
        // wait on for the others or the timeout.
        let mut left_out = false;
        let mut counted = false;
        for p in fds.iter_mut().filter(|p| p.revents != 0) {
            if p.revents & libc::POLLNVAL != 0 || select_hits(p).iter().any(|&h| h) {
                counted = true;
            } else {
                p.fd = -1;
                left_out = true;
            }
        }
        if counted || !left_out {
            break r;
        }
    };
    if let (Some(d), false) = (deadline, timeout.is_null()) {
        let left = d.saturating_duration_since(Instant::now());
        let tv = libc::timeval {
            tv_sec: left.as_secs() as libc::time_t,
            tv_usec: left.subsec_micros() as libc::suseconds_t,
        };
        // SAFETY: the caller's timeval, written as a whole; `tv` is plain data.
        let bytes = unsafe {
            std::slice::from_raw_parts((&raw const tv).cast::<u8>(), size_of::<libc::timeval>())
        };
        // SAFETY: the caller's timeval. One that cannot be written is left as it was.
        unsafe { super::write_user(timeout.cast(), bytes) };
    }
    if r < 0 {
        return r;
    }
    if fds.iter().any(|p| p.revents & libc::POLLNVAL != 0) {
        super::set_errno(libc::EBADF);
        return -1;
    }
    let mut out = given.map(|set| set.map(|_| FdBits::empty(n)));
    let mut count = 0;
    for p in &fds {
        for ((set, ev), hit) in out.iter_mut().zip(EVENTS).zip(select_hits(p)) {
            if let Some(set) = set {
                if p.events & ev != 0 && hit {
                    set.set(p.fd);
                    count += 1;
                }
            }
        }
    }
    for (set, bits) in sets.iter().zip(&out) {
        if let Some(bits) = bits {
            // SAFETY: the caller's set, `n` bits long at least.
            if !unsafe { bits.write_back(*set) } {
                super::set_errno(libc::EFAULT);
                return -1;
            }
        }
    }
    count
}

/// Which of select's sets (read, write, exception) a pollfd's `revents` counts for, as the
/// kernel maps them (`POLLIN_SET`, `POLLOUT_SET`, `POLLEX_SET`), for the events it asked.
fn select_hits(p: &pollfd) -> [bool; 3] {
    let asked = |ev: libc::c_short| p.events & ev != 0;
    [
        asked(libc::POLLIN) && p.revents & (libc::POLLIN | libc::POLLHUP | libc::POLLERR) != 0,
        asked(libc::POLLOUT) && p.revents & (libc::POLLOUT | libc::POLLERR) != 0,
        asked(libc::POLLPRI) && p.revents & libc::POLLPRI != 0,
    ]
}

/// A copy of a caller's `fd_set` as the kernel reads it: the first `ceil(n / bits)` words,
/// however many `FD_SETSIZE` says (a program may allocate a larger set for fds past 1 024).
struct FdBits(Vec<libc::c_ulong>);

impl FdBits {
    const BITS: usize = libc::c_ulong::BITS as usize;

    fn words(n: c_int) -> usize {
        (n as usize).div_ceil(Self::BITS)
    }

    /// The first `n` bits of the caller's `set`.
    ///
    /// # Safety
    /// `set` can be read for `n` bits.
    unsafe fn read(set: *const libc::fd_set, n: c_int) -> FdBits {
        let mut bits = Self::empty(n);
        // SAFETY: the caller's guarantee; copied as bytes, so any alignment will do.
        unsafe {
            std::ptr::copy_nonoverlapping(
                set.cast::<u8>(),
                bits.0.as_mut_ptr().cast::<u8>(),
                size_of_val(&bits.0[..]),
            )
        };
        bits
    }

    /// `n` bits, all clear.
    fn empty(n: c_int) -> FdBits {
        FdBits(vec![0; Self::words(n)])
    }

    fn get(&self, fd: c_int) -> bool {
        self.0[fd as usize / Self::BITS] >> (fd as usize % Self::BITS) & 1 != 0
    }

    fn set(&mut self, fd: c_int) {
        self.0[fd as usize / Self::BITS] |= 1 << (fd as usize % Self::BITS);
    }

    /// Writes the words back to the caller's `set`; false if it cannot be written.
    ///
    /// # Safety
    /// `set` is the caller's set, at least as long as these words.
    unsafe fn write_back(&self, set: *mut libc::fd_set) -> bool {
        // SAFETY: our own words, as bytes.
        let bytes = unsafe {
            std::slice::from_raw_parts(self.0.as_ptr().cast::<u8>(), size_of_val(&self.0[..]))
        };
        // SAFETY: the caller's guarantee.
        unsafe { super::write_user(set.cast(), bytes) }
    }
}
