//! Idle workers: a per-worker futex [`Parker`], and the [`IdleSet`] of parked workers that
//! `submit` picks one from to wake.

use crate::io::reactor::{self, Reactor};
use crate::sys::futex;
use std::sync::atomic::{AtomicI32, AtomicU32, AtomicU64, Ordering};
use std::time::Duration;

const EMPTY: u32 = 0;
const PARKED: u32 = 1;
const NOTIFIED: u32 = 2;
/// Blocked in the reactor's `epoll_wait` instead of on the futex.
const POLLING: u32 = 3;

/// A worker's sleep: a token like `std::thread::park`'s. `unpark` before `park` makes the
/// next `park` return at once, so a wake is never lost.
pub(crate) struct Parker {
    state: AtomicU32,
    /// Diagnostics: how many times this worker went to sleep.
    pub(crate) sleeps: AtomicI32,
}

impl Parker {
    pub(crate) fn new() -> Self {
        Parker {
            state: AtomicU32::new(EMPTY),
            sleeps: AtomicI32::new(0),
        }
    }

    /// Sleeps until `unpark` or `timeout`. Spurious returns are possible; callers re-check.
    pub(crate) fn park(&self, timeout: Option<Duration>) {
        // Consume a pending notification without sleeping. Acquire pairs with the Release in
        // `unpark`, so work pushed before the unpark is visible.
        if self
            .state
            .compare_exchange(NOTIFIED, EMPTY, Ordering::Acquire, Ordering::Relaxed)
            .is_ok()
        {
            return;
        }
        if self
            .state
            .compare_exchange(EMPTY, PARKED, Ordering::Acquire, Ordering::Acquire)
            .is_err()
        {
            // Raced with an unpark: it is NOTIFIED now.
            self.state.store(EMPTY, Ordering::Relaxed);
            return;
        }
        self.sleeps.fetch_add(1, Ordering::Relaxed);
        futex::wait(&self.state, PARKED, timeout);
        // Whether woken, timed out or interrupted, leave EMPTY; Acquire makes the waker's
        // pushes visible if it was a wake.
        self.state.swap(EMPTY, Ordering::Acquire);
    }

    /// Like [`park`](Parker::park), but sleeps in the reactor's `epoll_wait` (the caller holds
    /// the poller role), handling I/O readiness while it waits.
    pub(crate) fn park_polling(&self, reactor: &Reactor, timeout: Option<Duration>) {
        if self
            .state
            .compare_exchange(NOTIFIED, EMPTY, Ordering::Acquire, Ordering::Relaxed)
            .is_ok()
        {
            return;
        }
        if self
            .state
            .compare_exchange(EMPTY, POLLING, Ordering::Acquire, Ordering::Acquire)
            .is_err()
        {
            self.state.store(EMPTY, Ordering::Relaxed);
            return;
        }
        self.sleeps.fetch_add(1, Ordering::Relaxed);
        reactor.poll(timeout);
        self.state.swap(EMPTY, Ordering::Acquire);
    }

    /// Wakes the worker if it sleeps (on its futex or in `epoll_wait`), or makes its next
    /// `park` return at once.
    pub(crate) fn unpark(&self) {
        match self.state.swap(NOTIFIED, Ordering::Release) {
            PARKED => futex::wake(&self.state, 1),
            POLLING => {
                if let Some(r) = reactor::get() {
                    r.wake();
                }
            }
            _ => {}
        }
    }
}

/// The set of parked workers, one bit each, lock-free.
pub(crate) struct IdleSet {
    words: Box<[AtomicU64]>,
}

impl IdleSet {
    pub(crate) fn new(workers: usize) -> Self {
        IdleSet {
            words: (0..workers.div_ceil(64))
                .map(|_| AtomicU64::new(0))
                .collect(),
        }
    }

    pub(crate) fn insert(&self, i: usize) {
        self.words[i / 64].fetch_or(1 << (i % 64), Ordering::SeqCst);
    }

    pub(crate) fn remove(&self, i: usize) {
        let bit = 1 << (i % 64);
        let w = &self.words[i / 64];
        if w.load(Ordering::Relaxed) & bit != 0 {
            w.fetch_and(!bit, Ordering::SeqCst);
        }
    }

    /// Takes any parked worker out of the set, so two wakers never pick the same one.
    pub(crate) fn pop(&self) -> Option<usize> {
        for (wi, w) in self.words.iter().enumerate() {
            let mut cur = w.load(Ordering::SeqCst);
            while cur != 0 {
                let bit = cur.trailing_zeros() as usize;
                match w.compare_exchange_weak(
                    cur,
                    cur & !(1 << bit),
                    Ordering::SeqCst,
                    Ordering::Relaxed,
                ) {
                    Ok(_) => return Some(wi * 64 + bit),
                    Err(now) => cur = now,
                }
            }
        }
        None
    }
}
