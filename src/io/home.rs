//! Readiness delivered at home: each worker's own epoll instance ([`HomePoll`]), and which
//! epoll instance a registered fd is in ([`Waiters::settle`]).
//!
//! A fiber that waits for an fd stays on its worker (a started fiber never changes thread).
//! If the fd were only in the process's shared epoll instance, whichever worker polls there
//! would see its readiness, and for another worker's fiber the wake would travel through
//! that worker's inbox and a futex: a second thread has to run before the fiber can. So the
//! first time a fiber waits for an fd that nobody else waits for, the fd moves from the
//! shared instance into its worker's own (`EPOLL_CTL_ADD` there, then `EPOLL_CTL_DEL` from
//! the shared one: never in neither), and that worker sleeps in its own `epoll_wait`. The
//! kernel then wakes the fiber's worker itself, and the worker resumes the fiber directly.
//!
//! An fd goes back to the shared instance, for good, as soon as anything but a fiber of
//! its home worker waits for it — a fiber of another worker, a readiness continuation
//! (which any worker may run), the `poll` hook over several fds — so that its readiness
//! does not depend on one worker's thread. An fd that several workers' fibers wait for
//! (a listener with accept loops on two workers, a socket with its reader here and its
//! writer there) is served from the shared instance, as before.
//!
//! Every waiter is counted where its readiness will be seen: in its record's home
//! (`HomePoll::waiting`), or in the reactor's `shared_waiting`, which tells workers that
//! somebody must poll the shared instance. Both counts change only under the record's lock,
//! with the list (see [`Waiters`]).

use super::reactor::{reactor, IoRecord, Reactor, Waiter, EVENTS, WAKE_TOKEN};
#[cfg(feature = "hook")]
use crate::sys::real;
#[cfg(not(feature = "hook"))]
use libc as real;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// The event `data` of the shared epoll instance while it is nested in a home instance (its
/// worker holds the poller role and sleeps at home).
pub(super) const SHARED_TOKEN: u64 = u64::MAX - 1;

/// A worker's own epoll instance: the fds its fibers alone wait for, and an eventfd that
/// wakes the worker while it sleeps there.
pub(crate) struct HomePoll {
    epoll: OwnedFd,
    wake: OwnedFd,
    /// Waiters on the fds homed here (changed under their records' locks).
    waiting: AtomicUsize,
}

impl HomePoll {
    /// A new home instance with its eventfd registered.
    pub(crate) fn new() -> io::Result<Arc<HomePoll>> {
        let (epoll, wake) = epoll_with_eventfd()?;
        Ok(Arc::new(HomePoll {
            epoll,
            wake,
            waiting: AtomicUsize::new(0),
        }))
    }

    /// Takes `fd` out of this instance.
    fn remove(&self, fd: RawFd) {
        del(self.epoll.as_raw_fd(), fd);
    }

    /// Whether fibers wait for fds homed here: the worker must watch this instance.
    pub(crate) fn has_waiters(&self) -> bool {
        self.waiting.load(Ordering::SeqCst) != 0
    }

    /// Interrupts the worker's `epoll_wait` here.
    pub(crate) fn wake(&self) {
        write_one(self.wake.as_raw_fd());
    }

    /// Waits here for events at most `timeout` (`None`: until one arrives or `wake`), and
    /// wakes the fibers and continuations they concern. With `shared` (the caller holds the
    /// poller role) the shared instance is nested here meanwhile, so that its events end the
    /// wait too; they are handled the same way.
    pub(crate) fn poll(&self, reactor: &Reactor, timeout: Option<Duration>, shared: bool) {
        let nested = shared
            && ctl(
                self.epoll.as_raw_fd(),
                libc::EPOLL_CTL_ADD,
                reactor.epoll_fd(),
                libc::EPOLLIN as u32,
                SHARED_TOKEN,
            )
            .is_ok();
        let mut events = [libc::epoll_event { events: 0, u64: 0 }; EVENTS];
        let n = epoll_wait_on(self.epoll.as_raw_fd(), &mut events, timeout);
        if nested {
            del(self.epoll.as_raw_fd(), reactor.epoll_fd());
        }
        if n > 0 && reactor.dispatch(&events[..n as usize], self.wake.as_raw_fd()) {
            // The shared instance had events: take them without waiting.
            reactor.poll(Some(Duration::ZERO));
        }
    }
}

/// A new epoll instance and an eventfd registered in it (event `data` `WAKE_TOKEN`), both
/// close-on-exec: what wakes a thread blocked in the instance.
pub(super) fn epoll_with_eventfd() -> io::Result<(OwnedFd, OwnedFd)> {
    // SAFETY: plain system calls; on success we own the returned descriptors.
    let epoll = unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) };
    if epoll < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `epoll` is a fresh descriptor we own.
    let epoll = unsafe { OwnedFd::from_raw_fd(epoll) };
    // SAFETY: as above.
    let wake = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK) };
    if wake < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `wake` is a fresh descriptor we own.
    let wake = unsafe { OwnedFd::from_raw_fd(wake) };
    ctl(
        epoll.as_raw_fd(),
        libc::EPOLL_CTL_ADD,
        wake.as_raw_fd(),
        libc::EPOLLIN as u32,
        WAKE_TOKEN,
    )?;
    Ok((epoll, wake))
}

/// `epoll_ctl(epfd, op, fd)` for `events` with `data`.
pub(super) fn ctl(
    epfd: RawFd,
    op: libc::c_int,
    fd: RawFd,
    events: u32,
    data: u64,
) -> io::Result<()> {
    let mut ev = libc::epoll_event { events, u64: data };
    // SAFETY: `ev` lives across the call; bad descriptors are errors.
    if unsafe { libc::epoll_ctl(epfd, op, fd, &mut ev) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// `EPOLL_CTL_DEL` of `fd` from `epfd`. An error (`fd` closed, or not there) is harmless:
/// either way it is not there any more.
pub(super) fn del(epfd: RawFd, fd: RawFd) {
    // SAFETY: a plain system call on descriptors; bad ones are errors.
    unsafe { libc::epoll_ctl(epfd, libc::EPOLL_CTL_DEL, fd, std::ptr::null_mut()) };
}

/// Adds 1 to the eventfd `fd`, waking whoever waits for it.
pub(super) fn write_one(fd: RawFd) {
    let one: u64 = 1;
    // SAFETY: writing 8 bytes from a live u64 to an eventfd; EAGAIN (counter full) means a
    // wake is already pending, which is all we need.
    unsafe {
        real::write(fd, (&one as *const u64).cast(), std::mem::size_of::<u64>());
    }
}

/// Resets the eventfd `fd` after it woke a wait.
pub(super) fn read_all(fd: RawFd) {
    let mut buf: u64 = 0;
    // SAFETY: reading 8 bytes into a live u64 resets the eventfd counter.
    unsafe {
        real::read(
            fd,
            (&mut buf as *mut u64).cast(),
            std::mem::size_of::<u64>(),
        );
    }
}

/// A record's waiters, and the epoll instance its fd is in. Every change of the list goes
/// through these methods, which keep the waiter counts (`HomePoll::waiting`,
/// `Reactor::shared_waiting`) in step.
pub(super) struct Waiters {
    list: Vec<Waiter>,
    /// The home instance the fd is in; `None`: the shared one.
    home: Option<Arc<HomePoll>>,
    /// Waited for from more than one place, or deregistered: stays in the shared instance.
    shared_for_good: bool,
}

impl Waiters {
    pub(super) const fn new() -> Waiters {
        Waiters {
            list: Vec::new(),
            home: None,
            shared_for_good: false,
        }
    }

    /// The count this record's waiters are in.
    fn counter<'a>(&'a self, reactor: &'a Reactor) -> &'a AtomicUsize {
        match &self.home {
            Some(h) => &h.waiting,
            None => &reactor.shared_waiting,
        }
    }

    /// Adds a waiter; whether it is the first in the shared instance, so that the caller,
    /// once it has released the record's lock, must make sure some worker polls there
    /// (`Reactor::hand_off`).
    #[must_use]
    pub(super) fn push(&mut self, w: Waiter) -> bool {
        let first = self.counter(reactor()).fetch_add(1, Ordering::SeqCst) == 0;
        self.list.push(w);
        first && self.home.is_none()
    }

    /// Removes and returns the waiters `pred` picks.
    pub(super) fn take(&mut self, pred: impl FnMut(&mut Waiter) -> bool) -> Vec<Waiter> {
        let taken: Vec<Waiter> = self.list.extract_if(.., pred).collect();
        if !taken.is_empty() {
            self.counter(reactor())
                .fetch_sub(taken.len(), Ordering::SeqCst);
        }
        taken
    }

    /// Removes the waiter `id`, if it is still here.
    pub(super) fn remove(&mut self, id: u64) {
        drop(self.take(|w| w.id == id));
    }

    /// In the child of a `fork`: forgets the waiters (they belong to the parent's threads)
    /// and the home (the parent's worker), without dropping either (see
    /// `Reactor::after_fork_in_child`). The counts are reset by the caller.
    pub(super) fn forget_in_child(&mut self) {
        std::mem::forget(std::mem::take(&mut self.list));
        std::mem::forget(self.home.take());
        self.shared_for_good = false;
    }

    /// Puts `record`'s fd where a waiter of `at` will see its readiness soonest, before the
    /// waiter joins the list: `at` is the home instance of the waiting fiber's worker, or
    /// `None` for a waiter any worker may serve (a continuation, the `poll` hook). An fd in
    /// the shared instance that nobody waits for moves to the fiber's home; an fd at home
    /// that anyone else waits for goes back to the shared instance for good. A failed
    /// `epoll_ctl` leaves the fd where it was: it is watched there still. Whether waiters
    /// came into the shared instance where there were none, as [`push`](Waiters::push) says.
    #[must_use]
    pub(super) fn settle(&mut self, record: &IoRecord, at: Option<&Arc<HomePoll>>) -> bool {
        let reactor = reactor();
        match (&self.home, at) {
            (Some(h), Some(a)) if Arc::ptr_eq(h, a) => false,
            (None, Some(a)) if !self.shared_for_good && self.list.is_empty() => {
                let fd = record.fd();
                if ctl(
                    a.epoll.as_raw_fd(),
                    libc::EPOLL_CTL_ADD,
                    fd,
                    super::reactor::REGISTERED_EVENTS,
                    record.token(),
                )
                .is_ok()
                {
                    reactor.remove_from_shared(fd);
                    self.home = Some(a.clone());
                }
                false
            }
            (None, _) => false,
            (Some(h), _) => {
                let fd = record.fd();
                match reactor.add_to_shared(fd, record.token()) {
                    Err(e) if e.raw_os_error() != Some(libc::EEXIST) => return false,
                    _ => {}
                }
                h.remove(fd);
                let n = self.list.len();
                h.waiting.fetch_sub(n, Ordering::SeqCst);
                self.home = None;
                self.shared_for_good = true;
                n > 0 && reactor.shared_waiting.fetch_add(n, Ordering::SeqCst) == 0
            }
        }
    }

    /// The fd is being deregistered: takes it out of its home instance, if any, and keeps it
    /// from moving into one again. Its waiters stay (the caller wakes them).
    pub(super) fn leave_home(&mut self, fd: RawFd) {
        self.shared_for_good = true;
        if let Some(h) = self.home.take() {
            h.remove(fd);
            let n = self.list.len();
            h.waiting.fetch_sub(n, Ordering::SeqCst);
            reactor().shared_waiting.fetch_add(n, Ordering::SeqCst);
        }
    }

    /// Whether `fd` is still registered in its home instance as `record` (same open file):
    /// for a registration of an fd number that may have been closed and reused meanwhile.
    pub(super) fn still_home(&self, record: &IoRecord) -> bool {
        self.home.as_ref().is_some_and(|h| {
            ctl(
                h.epoll.as_raw_fd(),
                libc::EPOLL_CTL_MOD,
                record.fd(),
                super::reactor::REGISTERED_EVENTS,
                record.token(),
            )
            .is_ok()
        })
    }
}

/// Blocks in epoll instance `epfd` until events arrive into `events`, or `timeout`; returns
/// how many arrived (`<= 0`: none). The timeout is kept to the nanosecond with `epoll_pwait2`
/// (Linux 5.11), so a worker sleeping here wakes at its exact timer deadline (plus the
/// kernel's timer slack, as on a futex); on an older kernel, `epoll_wait` rounds it up to
/// the next millisecond, never down: a timer is then up to 1 ms late, never early.
pub(super) fn epoll_wait_on(
    epfd: RawFd,
    events: &mut [libc::epoll_event],
    timeout: Option<Duration>,
) -> libc::c_int {
    /// Cleared once the kernel said it has no `epoll_pwait2`.
    static PWAIT2: AtomicBool = AtomicBool::new(true);
    let max = events.len().min(libc::c_int::MAX as usize) as libc::c_int;
    if PWAIT2.load(Ordering::Relaxed) {
        let ts = timeout.map(crate::sys::timespec);
        let ts_ptr = ts
            .as_ref()
            .map_or(std::ptr::null(), |t| t as *const libc::timespec);
        // SAFETY: `events` is a live, writable buffer of `max` entries for the whole call;
        // the timespec pointer is null (no timeout) or points to a live local; a null
        // signal mask leaves the mask alone (its size argument is then ignored).
        let n = unsafe {
            libc::syscall(
                libc::SYS_epoll_pwait2,
                epfd,
                events.as_mut_ptr(),
                max,
                ts_ptr,
                std::ptr::null::<libc::sigset_t>(),
                0usize,
            )
        };
        let unknown = n < 0
            && matches!(
                // ENOSYS: an older kernel; EPERM: a seccomp filter that does not know it.
                io::Error::last_os_error().raw_os_error(),
                Some(libc::ENOSYS | libc::EPERM)
            );
        if !unknown {
            return n as libc::c_int;
        }
        PWAIT2.store(false, Ordering::Relaxed);
    }
    let ms = match timeout {
        None => -1,
        Some(t) => t.as_nanos().div_ceil(1_000_000).min(i32::MAX as u128) as i32,
    };
    // SAFETY: `events` is a live, writable buffer of `max` entries for the whole call.
    unsafe { libc::epoll_wait(epfd, events.as_mut_ptr(), max, ms) }
}
