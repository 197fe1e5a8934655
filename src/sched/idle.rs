//! Idle workers: a per-worker futex [`WorkerSleep`], the [`IdleSet`] of parked workers that
//! `submit` picks one from to wake, and [`Idlers`], the two halves of the idle protocol.
//!
//! Under `--cfg loom` the atomics are loom's and the futex sleep is a loom condition
//! variable, so `loom_model.rs` checks this very code.

use crate::io::reactor::{self, Reactor};
#[cfg(loom)]
use loom::sync::atomic::{fence, AtomicI32, AtomicU32, AtomicU64, AtomicUsize};
use std::sync::atomic::Ordering;
#[cfg(not(loom))]
use std::sync::atomic::{fence, AtomicI32, AtomicU32, AtomicU64, AtomicUsize};
use std::time::Duration;

/// The idle protocol's shared half: who sleeps, and how many look for work.
///
/// A worker that found nothing either *spins* (looks again for a while; at most half the
/// workers at once) or *announces* itself in the idle set, issues a SeqCst fence and looks
/// once more before it sleeps. A submitter pushes its work, issues a SeqCst fence, and wakes
/// an announced worker only if nobody spins. The two fences make sure that either the
/// submitter sees the announcement or the worker sees the work (Go's protocol): a wake-up is
/// never lost, and a burst of submits does not wake every worker.
pub(crate) struct Idlers {
    set: IdleSet,
    spinning: AtomicUsize,
    /// Which workers spin, for a spawner that hands one of them a task directly.
    spinners: IdleSet,
    workers: usize,
}

impl Idlers {
    pub(crate) fn new(workers: usize) -> Idlers {
        Idlers {
            set: IdleSet::new(workers),
            spinning: AtomicUsize::new(0),
            spinners: IdleSet::new(workers),
            workers,
        }
    }

    /// A submitter, after pushing shareable work: the announced worker to wake, if any and
    /// if nobody spins (a spinner will find the work).
    pub(crate) fn to_wake(&self) -> Option<usize> {
        // Pairs with the fence in `announce`.
        fence(Ordering::SeqCst);
        if self.spinning.load(Ordering::SeqCst) != 0 {
            return None;
        }
        self.set.pop()
    }

    /// A fiber spawned a task into its worker's `next` slot and may keep running: the
    /// announced worker to wake so it can help, if any and if nobody spins. The same
    /// protocol as `to_wake`, after a look without a fence (a spawn is frequent, and mostly
    /// there is nobody to wake): a worker going to sleep either is seen here, or sees the
    /// occupied slot after its own announcement and opens a request for it itself.
    pub(crate) fn to_help(&self) -> Option<usize> {
        if self.spinning.load(Ordering::Relaxed) != 0 || self.set.is_empty() {
            return None;
        }
        self.to_wake()
    }

    /// A worker about to sleep. The caller must look for work once more afterwards, and
    /// `withdraw` if it finds some (or when it wakes).
    pub(crate) fn announce(&self, worker: usize) {
        self.set.insert(worker);
        // Pairs with the fence in `to_wake`.
        fence(Ordering::SeqCst);
    }

    pub(crate) fn withdraw(&self, worker: usize) {
        self.set.remove(worker);
    }

    /// Starts spinning, unless half the workers spin already.
    pub(crate) fn try_spin(&self, worker: usize) -> bool {
        if 2 * self.spinning.load(Ordering::Relaxed) < self.workers {
            self.spinning.fetch_add(1, Ordering::SeqCst);
            self.spinners.insert(worker);
            true
        } else {
            false
        }
    }

    /// Stops spinning; true for the last spinner.
    pub(crate) fn stop_spinning(&self, worker: usize) -> bool {
        self.spinners.remove(worker);
        self.spinning.fetch_sub(1, Ordering::SeqCst) == 1
    }

    /// A spinning worker to hand a task to directly, taken out of the spinner set so that
    /// nobody else picks it too. It keeps spinning, and looks at its inbox every round.
    pub(crate) fn take_spinner(&self) -> Option<usize> {
        self.spinners.pop()
    }
}

const EMPTY: u32 = 0;
const SLEEPING: u32 = 1;
const WOKEN: u32 = 2;
/// Blocked in the reactor's `epoll_wait` instead of on the futex.
const POLLING: u32 = 3;
/// Blocked in `epoll_wait` on the worker's own epoll instance (`HomePoll`).
const AT_HOME: u32 = 4;

/// A worker's sleep: a token like `std::thread::park`'s. `wake` before `sleep` makes the
/// next `sleep` return at once, so a wake is never lost. (Not to be confused with a fiber's
/// park: this puts the worker *thread* to sleep.)
///
/// On a cache line of its own: peers read `state` and `waiting` every few passes (see
/// [`is_roused`](WorkerSleep::is_roused)), and only sleeps and wakes write them.
#[repr(align(128))]
pub(crate) struct WorkerSleep {
    state: AtomicU32,
    /// The worker's thread is between going to sleep and coming back (a hint for peers,
    /// never part of the token protocol).
    waiting: std::sync::atomic::AtomicBool,
    /// Diagnostics: how many times this worker went to sleep.
    pub(crate) sleeps: AtomicI32,
    /// The worker's own epoll instance, made the first time one of its fibers waits for an
    /// fd (see `crate::io::home`).
    home: std::sync::OnceLock<std::sync::Arc<crate::io::home::HomePoll>>,
    #[cfg(loom)]
    futex_model: (loom::sync::Mutex<()>, loom::sync::Condvar),
}

#[cfg(not(loom))]
use crate::sys::futex;

/// The futex calls, modelled for loom with a lock and a condition variable (a futex wait
/// checks the word and sleeps atomically with respect to a wake; so does this).
#[cfg(loom)]
mod futex {
    use super::{AtomicU32, Duration, Ordering};

    pub(super) fn wait(
        parker: &super::WorkerSleep,
        word: &AtomicU32,
        expected: u32,
        _: Option<Duration>,
    ) {
        let mut g = parker.futex_model.0.lock().unwrap();
        while word.load(Ordering::SeqCst) == expected {
            g = parker.futex_model.1.wait(g).unwrap();
        }
    }

    pub(super) fn wake(parker: &super::WorkerSleep, _: &AtomicU32, _: i32) {
        let _g = parker.futex_model.0.lock().unwrap();
        parker.futex_model.1.notify_all();
    }
}

impl WorkerSleep {
    pub(crate) fn new() -> Self {
        WorkerSleep {
            state: AtomicU32::new(EMPTY),
            waiting: std::sync::atomic::AtomicBool::new(false),
            sleeps: AtomicI32::new(0),
            home: std::sync::OnceLock::new(),
            #[cfg(loom)]
            futex_model: (loom::sync::Mutex::new(()), loom::sync::Condvar::new()),
        }
    }

    /// Sleeps until `wake` or `timeout`. Spurious returns are possible; callers re-check.
    pub(crate) fn sleep(&self, timeout: Option<Duration>) {
        self.sleep_as(SLEEPING, || {
            #[cfg(not(loom))]
            futex::wait(&self.state, SLEEPING, timeout);
            #[cfg(loom)]
            futex::wait(self, &self.state, SLEEPING, timeout);
        });
    }

    /// Like [`sleep`](WorkerSleep::sleep), but sleeps in the reactor's `epoll_wait` (the
    /// caller holds the poller role), handling I/O readiness while it waits.
    pub(crate) fn sleep_polling(&self, reactor: &Reactor, timeout: Option<Duration>) {
        self.sleep_as(POLLING, || reactor.poll(timeout));
    }

    /// The worker's own epoll instance, made now if it has none (`None` if the kernel
    /// refuses one: its fds then stay in the shared instance). Called on the worker's thread.
    pub(crate) fn home(&self) -> Option<&std::sync::Arc<crate::io::home::HomePoll>> {
        if let Some(h) = self.home.get() {
            return Some(h);
        }
        let made = crate::io::home::HomePoll::new().ok()?;
        Some(self.home.get_or_init(|| made))
    }

    /// The worker's own epoll instance if fibers wait for fds in it.
    pub(crate) fn home_waited(&self) -> Option<&crate::io::home::HomePoll> {
        self.home.get().map(|h| &**h).filter(|h| h.has_waiters())
    }

    /// Like [`sleep`](WorkerSleep::sleep), but sleeps in `epoll_wait` on the worker's own
    /// epoll instance, handling the readiness of its fds (and, with `shared`, of the shared
    /// instance: the caller holds the poller role) while it waits.
    pub(crate) fn sleep_at_home(
        &self,
        home: &crate::io::home::HomePoll,
        reactor: &Reactor,
        shared: bool,
        timeout: Option<Duration>,
    ) {
        self.sleep_as(AT_HOME, || home.poll(reactor, timeout, shared));
    }

    /// The token protocol around one way of sleeping: `state` (SLEEPING or POLLING) tells a
    /// waker how to reach us while `wait` runs.
    fn sleep_as(&self, state: u32, wait: impl FnOnce()) {
        // Consume a pending wake without sleeping. Acquire pairs with the Release in `wake`,
        // so work pushed before the wake is visible.
        if self
            .state
            .compare_exchange(WOKEN, EMPTY, Ordering::Acquire, Ordering::Relaxed)
            .is_ok()
        {
            return;
        }
        if self
            .state
            .compare_exchange(EMPTY, state, Ordering::Acquire, Ordering::Acquire)
            .is_err()
        {
            // Raced with a wake: it is WOKEN now.
            self.state.store(EMPTY, Ordering::Relaxed);
            return;
        }
        self.sleeps.fetch_add(1, Ordering::Relaxed);
        self.waiting.store(true, Ordering::Relaxed);
        wait();
        self.waiting.store(false, Ordering::Relaxed);
        // Whether woken, timed out or interrupted, leave EMPTY; Acquire makes the waker's
        // pushes visible if it was a wake. SeqCst for the watchdog's monitor, which parks
        // only while it sees every worker asleep (see `MonitorCtl::nudge`).
        self.state.swap(EMPTY, Ordering::SeqCst);
    }

    /// Whether the worker was woken while it slept and its thread has not run since: it
    /// waits for a CPU. A hint: it may have returned a moment ago.
    pub(crate) fn is_roused(&self) -> bool {
        self.state.load(Ordering::Relaxed) == WOKEN && self.waiting.load(Ordering::Relaxed)
    }

    /// Whether the worker is asleep (on its futex or in `epoll_wait`).
    pub(crate) fn is_sleeping(&self) -> bool {
        matches!(
            self.state.load(Ordering::SeqCst),
            SLEEPING | POLLING | AT_HOME
        )
    }

    /// Wakes the worker if it sleeps (on its futex or in `epoll_wait`), or makes its next
    /// `sleep` return at once.
    pub(crate) fn wake(&self) {
        match self.state.swap(WOKEN, Ordering::Release) {
            #[cfg(not(loom))]
            SLEEPING => futex::wake(&self.state, 1),
            #[cfg(loom)]
            SLEEPING => futex::wake(self, &self.state, 1),
            POLLING => {
                if let Some(r) = reactor::get() {
                    r.wake();
                }
            }
            AT_HOME => {
                if let Some(h) = self.home.get() {
                    h.wake();
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

    /// Whether the set looks empty (without ordering: a hint).
    pub(crate) fn is_empty(&self) -> bool {
        self.words.iter().all(|w| w.load(Ordering::Relaxed) == 0)
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
