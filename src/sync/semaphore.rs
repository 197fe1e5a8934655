//! [`Semaphore`]: a counted set of permits, handed out first come, first served.
//!
//! The count and the FIFO of waiters share the internal lock. A release grants permits to
//! waiters at the front of the queue for as long as the front request fits, and hands them
//! over directly (the woken waiter owns them, nobody can take them in between). A large
//! request at the front therefore holds back smaller ones behind it: no request starves.

use super::deadline_after;
use super::wait_queue::{wait, Guard, Lock, Wait, WaitList};
use crate::dump::WaitOn;
use std::fmt;
use std::panic::{RefUnwindSafe, UnwindSafe};
use std::time::{Duration, Instant};

/// The token of a waiter that has been given its permits.
const GRANTED: usize = 1;

/// A counting semaphore for fibers and threads (Boost.Fiber's and tokio's, with std-style
/// blocking calls).
///
/// [`acquire`](Semaphore::acquire) takes a permit, suspending the fiber (or blocking the
/// thread) while none is available; the returned [`SemaphorePermit`] gives it back when
/// dropped. Waiters are served in arrival order.
///
/// ```
/// use fibra::sync::Semaphore;
/// use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
/// use std::sync::Arc;
///
/// let sched = fibra::Scheduler::builder().threads(2).build()?;
/// sched.start();
/// let sem = Arc::new(Semaphore::new(3)); // at most 3 at a time
/// let (inside, most) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
/// let tasks: Vec<_> = (0..20)
///     .map(|_| {
///         let (sem, inside, most) = (sem.clone(), inside.clone(), most.clone());
///         sched.submit(move || {
///             let _permit = sem.acquire();
///             most.fetch_max(inside.fetch_add(1, SeqCst) + 1, SeqCst);
///             fibra::Fiber::yield_now();
///             inside.fetch_sub(1, SeqCst);
///         }, None).unwrap()
///     })
///     .collect();
/// for t in tasks {
///     t.join().unwrap();
/// }
/// assert!(most.load(SeqCst) <= 3);
/// assert_eq!(sem.available_permits(), 3);
/// sched.stop();
/// # Ok::<(), fibra::Error>(())
/// ```
pub struct Semaphore {
    state: Lock<State>,
}

struct State {
    permits: usize,
    /// Each waiter's request: how many permits it wants.
    waiters: WaitList<usize>,
}

/// Permits taken from a [`Semaphore`]; dropping it releases them.
#[must_use = "the permits are released as soon as the permit is dropped"]
pub struct SemaphorePermit<'a> {
    sem: &'a Semaphore,
    permits: usize,
}

impl Semaphore {
    /// The most permits a semaphore can hold.
    pub const MAX_PERMITS: usize = usize::MAX >> 1;

    const_unless_loom! {
        /// Creates a semaphore with `permits` permits. `const`, so it can be a `static`.
        ///
        /// # Panics
        /// If `permits` exceeds [`Semaphore::MAX_PERMITS`].
        pub fn new(permits: usize) -> Semaphore {
            assert!(permits <= Self::MAX_PERMITS, "too many permits for a semaphore");
            Semaphore {
                state: Lock::new(State {
                    permits,
                    waiters: WaitList::new(),
                }),
            }
        }
    }

    /// Takes one permit, waiting for it if none is free.
    pub fn acquire(&self) -> SemaphorePermit<'_> {
        self.acquire_many(1)
    }

    /// Takes `n` permits at once, waiting until all `n` can be had. Waiting for more permits
    /// than the semaphore will ever hold waits forever.
    pub fn acquire_many(&self, n: usize) -> SemaphorePermit<'_> {
        self.acquire_until(n, None)
            .expect("a wait without deadline does not time out")
    }

    /// Takes one permit if one is free and nobody is waiting ahead; never waits.
    ///
    /// ```
    /// let sem = fibra::sync::Semaphore::new(1);
    /// let p = sem.try_acquire().unwrap();
    /// assert!(sem.try_acquire().is_none());
    /// drop(p);
    /// assert!(sem.try_acquire().is_some());
    /// ```
    pub fn try_acquire(&self) -> Option<SemaphorePermit<'_>> {
        self.try_acquire_many(1)
    }

    /// Takes `n` permits if they are free and nobody is waiting ahead; never waits.
    pub fn try_acquire_many(&self, n: usize) -> Option<SemaphorePermit<'_>> {
        crate::coop::spend();
        let mut st = self.state.lock();
        if st.waiters.is_empty() && st.permits >= n {
            st.permits -= n;
            Some(self.permit(n))
        } else {
            None
        }
    }

    /// Takes one permit, waiting at most `timeout`; `None` if the time ran out first.
    pub fn acquire_timeout(&self, timeout: Duration) -> Option<SemaphorePermit<'_>> {
        self.acquire_until(1, deadline_after(timeout))
    }

    /// Takes `n` permits, waiting at most `timeout`; `None` if the time ran out first.
    pub fn acquire_many_timeout(&self, n: usize, timeout: Duration) -> Option<SemaphorePermit<'_>> {
        self.acquire_until(n, deadline_after(timeout))
    }

    /// Adds `n` permits (also how a [`SemaphorePermit::forget`]ed permit is given back),
    /// waking waiters whose requests now fit, in order.
    ///
    /// # Panics
    /// If the total would exceed [`Semaphore::MAX_PERMITS`].
    pub fn release(&self, n: usize) {
        let mut st = self.state.lock();
        let total = st.permits.checked_add(n);
        assert!(
            total.is_some_and(|t| t <= Self::MAX_PERMITS),
            "too many permits for a semaphore"
        );
        st.permits += n;
        grant(&mut st);
    }

    /// How many permits are free right now.
    pub fn available_permits(&self) -> usize {
        self.state.lock().permits
    }

    fn acquire_until(&self, n: usize, deadline: Option<Instant>) -> Option<SemaphorePermit<'_>> {
        crate::coop::spend();
        let mut st = self.state.lock();
        if st.waiters.is_empty() && st.permits >= n {
            st.permits -= n;
            return Some(self.permit(n));
        }
        let res = wait(
            st,
            |st| &mut st.waiters,
            n,
            deadline,
            WaitOn::Lock("Semaphore::acquire"),
            || {},
            |st, token| match token {
                // Granted, but the fiber is being cancelled: give the permits back.
                Some(_) => {
                    st.permits += n;
                    grant(st);
                }
                // Its leaving may let the requests behind it through.
                None => grant(st),
            },
        );
        match res {
            Wait::Woken(GRANTED) => Some(self.permit(n)),
            Wait::Woken(t) => unreachable!("semaphore waiter woken with token {t}"),
            Wait::TimedOut(mut st) => {
                grant(&mut st);
                None
            }
        }
    }

    fn permit(&self, permits: usize) -> SemaphorePermit<'_> {
        SemaphorePermit { sem: self, permits }
    }
}

/// Hands free permits to the waiters at the front whose requests fit, in order.
fn grant(st: &mut Guard<'_, State>) {
    let (st, wakes) = st.parts();
    while let Some(n) = st.waiters.front() {
        if n > st.permits {
            break;
        }
        st.permits -= n;
        st.waiters.wake_front(GRANTED, wakes);
    }
}

impl SemaphorePermit<'_> {
    /// How many permits this holds.
    pub fn num_permits(&self) -> usize {
        self.permits
    }

    /// Keeps the permits out of the semaphore for good (until someone calls
    /// [`Semaphore::release`]).
    pub fn forget(mut self) {
        self.permits = 0;
    }
}

impl Drop for SemaphorePermit<'_> {
    fn drop(&mut self) {
        if self.permits > 0 {
            self.sem.release(self.permits);
        }
    }
}

// The internal state is consistent whenever user code runs: its lock is never held
// across a call out of this module.
impl UnwindSafe for Semaphore {}
impl RefUnwindSafe for Semaphore {}

impl fmt::Debug for Semaphore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let st = self.state.lock();
        f.debug_struct("Semaphore")
            .field("permits", &st.permits)
            .field("waiters", &st.waiters.len())
            .finish()
    }
}

impl fmt::Debug for SemaphorePermit<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SemaphorePermit")
            .field("permits", &self.permits)
            .finish_non_exhaustive()
    }
}
