//! [`Condvar`]: wait for a condition under a [`Mutex`], suspending the fiber.
//!
//! A waiter joins the condvar's FIFO *before* it releases the mutex (the mutex is released in
//! `wait`'s `before_park` step, after the node is linked), so a notification sent by anyone
//! who takes the mutex after that point finds it: no lost wake-ups. `notify_one` wakes the
//! longest waiter; the woken waiter then queues for the mutex like any other locker.

use super::deadline_after;
use super::mutex::{Mutex, MutexGuard};
use super::wait_queue::{wait, Lock, Wait, WaitList};
use crate::dump::WaitOn;
use std::fmt;
use std::panic::{RefUnwindSafe, UnwindSafe};
use std::sync::LockResult;
use std::time::{Duration, Instant};

/// The token of a waiter woken by `notify_all`. One woken by `notify_one` gets
/// `one(bound)`, odd: its notification may be passed on only to a waiter whose ticket is
/// below `bound`, one that was already waiting when `notify_one` was called.
const NOTIFIED_ALL: usize = 2;

fn one(bound: u64) -> usize {
    ((bound as usize) << 1) | 1
}

/// The waiters, each with its ticket (the order it started waiting in), and the next ticket.
struct Waiters {
    list: WaitList<u64>,
    next: u64,
}

impl Waiters {
    /// Passes on the notification a cancelled waiter took (`token`): only `notify_one`'s,
    /// and only to a waiter that was already waiting when it was called, so that no waiter
    /// wakes that no notification was meant for.
    fn pass_on(&mut self, token: usize, wakes: &mut super::wait_queue::Wakeups) {
        if token & 1 == 1 && self.list.front().is_some_and(|t| t < (token >> 1) as u64) {
            self.list.wake_front(token, wakes);
        }
    }
}

/// A condition variable for fibers and threads, like [`std::sync::Condvar`], used with a
/// [`fibra::sync::Mutex`](Mutex).
///
/// Waiting suspends a fiber (or blocks a thread) and releases the mutex; it is reacquired
/// before `wait` returns. Waiters are notified in the order they started waiting. Unlike
/// std's, a fibra condvar has no spurious wake-ups, but the idiom of re-checking the
/// condition (or using [`wait_while`](Condvar::wait_while)) is still the right one: another
/// waiter may have changed the state between the notification and the relock.
///
/// ```
/// use fibra::sync::{Condvar, Mutex};
/// use std::sync::Arc;
///
/// let sched = fibra::Scheduler::builder().threads(2).build()?;
/// sched.start();
/// let pair = Arc::new((Mutex::new(false), Condvar::new()));
/// let p = pair.clone();
/// let waiter = sched.submit(move || {
///     let (ready, cv) = &*p;
///     let ready = cv.wait_while(ready.lock().unwrap(), |ready| !*ready).unwrap();
///     assert!(*ready);
/// }, None).unwrap();
///
/// let (ready, cv) = &*pair;
/// *ready.lock().unwrap() = true;
/// cv.notify_one();
/// waiter.join().unwrap();
/// sched.stop();
/// # Ok::<(), fibra::Error>(())
/// ```
pub struct Condvar {
    waiters: Lock<Waiters>,
}

/// Whether a timed wait on a [`Condvar`] returned because its time ran out; like
/// [`std::sync::WaitTimeoutResult`].
#[derive(Debug, PartialEq, Eq, Copy, Clone)]
pub struct WaitTimeoutResult(bool);

impl WaitTimeoutResult {
    /// `true` if the wait ended because the timeout elapsed (for the `_while` forms: and the
    /// condition still held).
    pub fn timed_out(&self) -> bool {
        self.0
    }
}

impl Condvar {
    const_unless_loom! {
        /// Creates a condition variable with no waiters. `const`, so it can be a `static`.
        pub fn new() -> Condvar {
            Condvar {
                waiters: Lock::new(Waiters {
                    list: WaitList::new(),
                    next: 0,
                }),
            }
        }
    }

    /// Releases the mutex behind `guard`, waits for a notification, and relocks the mutex.
    ///
    /// # Errors
    /// If the mutex is poisoned when relocked; the error carries the guard.
    pub fn wait<'a, T: ?Sized>(&self, guard: MutexGuard<'a, T>) -> LockResult<MutexGuard<'a, T>> {
        self.wait_until(guard, None).0
    }

    /// Waits while `condition` returns `true` for the guarded data, re-checking after every
    /// notification; returns with the mutex held and the condition false.
    ///
    /// # Errors
    /// If the mutex is poisoned when relocked.
    pub fn wait_while<'a, T: ?Sized, F: FnMut(&mut T) -> bool>(
        &self,
        mut guard: MutexGuard<'a, T>,
        mut condition: F,
    ) -> LockResult<MutexGuard<'a, T>> {
        while condition(&mut *guard) {
            guard = self.wait(guard)?;
        }
        Ok(guard)
    }

    /// Like [`wait`](Condvar::wait), but gives up after `timeout`. The wait is never shorter
    /// than `timeout` when it reports a timeout.
    ///
    /// ```
    /// use fibra::sync::{Condvar, Mutex};
    /// use std::time::Duration;
    /// let (m, cv) = (Mutex::new(()), Condvar::new());
    /// let (_guard, res) = cv.wait_timeout(m.lock().unwrap(), Duration::from_millis(10)).unwrap();
    /// assert!(res.timed_out());
    /// ```
    ///
    /// # Errors
    /// If the mutex is poisoned when relocked.
    #[allow(clippy::type_complexity)] // std's signature
    pub fn wait_timeout<'a, T: ?Sized>(
        &self,
        guard: MutexGuard<'a, T>,
        timeout: Duration,
    ) -> LockResult<(MutexGuard<'a, T>, WaitTimeoutResult)> {
        let (guard, timed_out) = self.wait_until(guard, deadline_after(timeout));
        match guard {
            Ok(g) => Ok((g, WaitTimeoutResult(timed_out))),
            Err(e) => Err(std::sync::PoisonError::new((
                e.into_inner(),
                WaitTimeoutResult(timed_out),
            ))),
        }
    }

    /// Like [`wait_while`](Condvar::wait_while), but gives up after `timeout` in total;
    /// then the result says `timed_out()` and the condition may still hold.
    ///
    /// # Errors
    /// If the mutex is poisoned when relocked.
    #[allow(clippy::type_complexity)] // std's signature
    pub fn wait_timeout_while<'a, T: ?Sized, F: FnMut(&mut T) -> bool>(
        &self,
        mut guard: MutexGuard<'a, T>,
        timeout: Duration,
        mut condition: F,
    ) -> LockResult<(MutexGuard<'a, T>, WaitTimeoutResult)> {
        let deadline = deadline_after(timeout);
        loop {
            if !condition(&mut *guard) {
                return Ok((guard, WaitTimeoutResult(false)));
            }
            let (g, timed_out) = self.wait_until(guard, deadline);
            guard = match g {
                Ok(g) => g,
                Err(e) => {
                    return Err(std::sync::PoisonError::new((
                        e.into_inner(),
                        WaitTimeoutResult(timed_out),
                    )))
                }
            };
            if timed_out {
                let still = condition(&mut *guard);
                return Ok((guard, WaitTimeoutResult(still)));
            }
        }
    }

    /// Wakes the longest-waiting fiber or thread, if any.
    pub fn notify_one(&self) {
        let mut g = self.waiters.lock();
        let (st, wakes) = g.parts();
        st.list.wake_front(one(st.next), wakes);
    }

    /// Wakes every waiter, in the order they started waiting.
    pub fn notify_all(&self) {
        let mut g = self.waiters.lock();
        let (st, wakes) = g.parts();
        st.list.wake_all(NOTIFIED_ALL, wakes);
    }

    /// Waits (until `deadline`, if any) and relocks; returns whether it timed out.
    fn wait_until<'a, T: ?Sized>(
        &self,
        guard: MutexGuard<'a, T>,
        deadline: Option<Instant>,
    ) -> (LockResult<MutexGuard<'a, T>>, bool) {
        let (mutex, entry): (&'a Mutex<T>, _) = guard.into_raw();
        let mut g = self.waiters.lock();
        let ticket = g.next;
        g.next += 1;
        let (token, timed_out) = match wait(
            g,
            |st| &mut st.list,
            ticket,
            deadline,
            WaitOn::Other("Condvar::wait"),
            // Linked first, unlocked second: a notifier that takes the mutex after this
            // finds our node.
            || mutex.raw_unlock(),
            |g, token| {
                if let Some(token) = token {
                    // We were notified but are being cancelled: pass it on, so that a
                    // `notify_one` still wakes somebody.
                    let (st, wakes) = g.parts();
                    st.pass_on(token, wakes);
                }
            },
        ) {
            Wait::Woken(token) => (Some(token), false),
            Wait::TimedOut(g) => {
                drop(g);
                (None, true)
            }
        };
        // Notified, then cancelled while waiting for the mutex: the notification is passed
        // on here too.
        let pass_on = PassOn {
            condvar: self,
            token,
        };
        mutex.raw_lock();
        std::mem::forget(pass_on);
        (MutexGuard::from_raw(mutex, entry), timed_out)
    }
}

/// Passes a notification this waiter took (`token`) on, if dropped (unwinding): see
/// [`Waiters::pass_on`].
struct PassOn<'a> {
    condvar: &'a Condvar,
    token: Option<usize>,
}

impl Drop for PassOn<'_> {
    fn drop(&mut self) {
        if let Some(token) = self.token {
            let mut g = self.condvar.waiters.lock();
            let (st, wakes) = g.parts();
            st.pass_on(token, wakes);
        }
    }
}

impl Default for Condvar {
    fn default() -> Condvar {
        Condvar::new()
    }
}

// The internal state is consistent whenever user code runs: its lock is never held
// across a call out of this module.
impl UnwindSafe for Condvar {}
impl RefUnwindSafe for Condvar {}

impl fmt::Debug for Condvar {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Condvar").finish_non_exhaustive()
    }
}
