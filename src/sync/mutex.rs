//! [`Mutex`]: mutual exclusion that suspends a waiting fiber, not its thread.
//!
//! # The lock word
//! One byte: `LOCKED` (somebody holds the mutex) and `QUEUED` (its wait list is not empty).
//! - Uncontended `lock` is one compare-and-swap `0 → LOCKED`; uncontended `unlock` one
//!   compare-and-swap `LOCKED → 0`. No allocation, no internal lock.
//! - A contended `lock` takes the wait queue's internal lock and looks again: a free mutex is
//!   taken; otherwise it sets `QUEUED` and waits at the back of the FIFO.
//! - An `unlock` that finds `QUEUED` takes the internal lock and *hands the mutex over* to the
//!   first waiter: `LOCKED` stays set and ownership moves to the woken waiter, which returns
//!   from `lock` owning it. `QUEUED` is cleared when the last waiter leaves the list.
//!
//! Invariants: `QUEUED` implies `LOCKED`, and `QUEUED` changes only under the internal lock.
//! Since a mutex with waiters never looks free, a newcomer cannot overtake them: waiters are
//! served strictly in arrival order and none starves. The price is the classic lock convoy
//! under heavy contention (each hand-over waits for its new owner to be scheduled), the same
//! trade Boost.Fiber's mutex and Go's starvation mode make.

use super::poison;
use super::shim::{AtomicU8, Ordering, UnsafeCell};
use super::wait_queue::{wait_granted, Guard, Lock, WaitList};
use crate::dump::WaitOn;
use std::fmt;
use std::marker::PhantomData;
use std::ops::{Deref, DerefMut};
use std::panic::{RefUnwindSafe, UnwindSafe};
use std::sync::{LockResult, TryLockError, TryLockResult};

const UNLOCKED: u8 = 0;
const LOCKED: u8 = 1;
const QUEUED: u8 = 2;

/// The token a waiter is woken with: the mutex is now its.
const HANDED_OVER: usize = 1;

/// A mutual exclusion lock for fibers and threads, like [`std::sync::Mutex`].
///
/// A fiber that waits for the lock is suspended and its worker runs other fibers; a plain
/// thread blocks. Holding the guard across a suspension ([`Fiber::yield_now`],
/// [`sleep`](crate::sleep), a channel receive, another lock) is fine — with
/// `std::sync::Mutex` it would deadlock a worker as soon as a second fiber of that worker
/// asked for the lock. Waiters get the lock in the order they asked for it; an unlock hands
/// it directly to the longest waiter, so nobody starves.
///
/// Uncontended, `lock` and `unlock` are one atomic instruction each and allocate nothing.
///
/// # Poisoning
/// As with std: if a holder panics, the mutex is *poisoned* when its guard is dropped during
/// the unwind, and every later [`lock`](Mutex::lock) and [`try_lock`](Mutex::try_lock)
/// returns an error carrying the guard (take it with [`PoisonError::into_inner`](std::sync::PoisonError::into_inner) if the data
/// is still fine). The same happens when [`Scheduler::stop_timeout`] cancels a fiber holding
/// the guard, since cancellation unwinds the fiber. [`clear_poison`](Mutex::clear_poison)
/// resets it.
///
/// [`Fiber::yield_now`]: crate::Fiber::yield_now
/// [`Scheduler::stop_timeout`]: crate::Scheduler::stop_timeout
///
/// ```
/// use fibra::sync::Mutex;
/// use std::sync::Arc;
///
/// let sched = fibra::Scheduler::builder().threads(2).build()?;
/// sched.start();
/// let counter = Arc::new(Mutex::new(0));
/// let tasks: Vec<_> = (0..10)
///     .map(|_| {
///         let counter = counter.clone();
///         sched.submit(move || {
///             let mut n = counter.lock().unwrap();
///             fibra::Fiber::yield_now(); // holding the lock across a yield is fine
///             *n += 1;
///         }, None).unwrap()
///     })
///     .collect();
/// for t in tasks {
///     t.join().unwrap();
/// }
/// assert_eq!(*counter.lock().unwrap(), 10); // from a plain thread too
/// sched.stop();
/// # Ok::<(), fibra::Error>(())
/// ```
pub struct Mutex<T: ?Sized> {
    state: AtomicU8,
    waiters: Lock<WaitList<()>>,
    poison: poison::Flag,
    data: UnsafeCell<T>,
}

// SAFETY: the mutex hands out access to `T` to one holder at a time, on any thread, so it
// needs only `T: Send` (as std's).
unsafe impl<T: ?Sized + Send> Send for Mutex<T> {}
// SAFETY: as above.
unsafe impl<T: ?Sized + Send> Sync for Mutex<T> {}

// Poisoning reports a panic during a critical section, as with std.
impl<T: ?Sized> UnwindSafe for Mutex<T> {}
impl<T: ?Sized> RefUnwindSafe for Mutex<T> {}

/// Access to a locked [`Mutex`]'s data; dropping it unlocks the mutex.
///
/// Like std's, the guard is `!Send`: it stays with the fiber or thread that locked.
#[must_use = "if unused the Mutex will immediately unlock"]
pub struct MutexGuard<'a, T: ?Sized + 'a> {
    lock: &'a Mutex<T>,
    poison: poison::Entry,
    _not_send: PhantomData<*const ()>,
}

impl<T> Mutex<T> {
    const_unless_loom! {
        /// Creates an unlocked mutex. `const`, so it can initialise a `static`.
        ///
        /// ```
        /// static LOG: fibra::sync::Mutex<Vec<String>> = fibra::sync::Mutex::new(Vec::new());
        /// LOG.lock().unwrap().push("hello".into());
        /// assert_eq!(LOG.lock().unwrap().len(), 1);
        /// ```
        pub fn new(value: T) -> Mutex<T> {
            Mutex {
                state: AtomicU8::new(UNLOCKED),
                waiters: Lock::new(WaitList::new()),
                poison: poison::Flag::new(),
                data: UnsafeCell::new(value),
            }
        }
    }
}

lock_api! {
    Mutex, try_lock, [MutexGuard];
    /// Consumes the mutex and returns its data; `Err` (with the data) if it is poisoned.
    fn into_inner;
    /// Whether the mutex is poisoned (a holder panicked). Another thread may poison it at any
    /// moment, so a `false` is only a hint.
    fn is_poisoned;
    /// Clears the poison flag, for when the data has been checked or repaired.
    ///
    /// ```
    /// use fibra::sync::Mutex;
    /// let m = Mutex::new(1);
    /// let _ = std::panic::catch_unwind(|| {
    ///     let _g = m.lock().unwrap();
    ///     panic!("while holding the lock");
    /// });
    /// assert!(m.is_poisoned());
    /// m.clear_poison();
    /// assert_eq!(*m.lock().unwrap(), 1);
    /// ```
    fn clear_poison;
    /// The data, through `&mut self` (no locking needed); `Err` if poisoned.
    fn get_mut;
}

impl<T: ?Sized> Mutex<T> {
    /// Acquires the mutex, suspending the calling fiber (or blocking the calling thread)
    /// until it is available. Waiters are served first come, first served.
    ///
    /// Locking a mutex the caller already holds deadlocks, as with std.
    ///
    /// # Errors
    /// If the mutex is poisoned; the error still carries the guard.
    #[inline]
    pub fn lock(&self) -> LockResult<MutexGuard<'_, T>> {
        crate::coop::spend();
        self.raw_lock();
        self.guard()
    }

    /// Acquires the mutex only if nobody holds it or waits for it, without waiting.
    ///
    /// # Errors
    /// [`TryLockError::WouldBlock`] if it is taken; [`TryLockError::Poisoned`] if poisoned.
    pub fn try_lock(&self) -> TryLockResult<MutexGuard<'_, T>> {
        crate::coop::spend();
        // Acquire: pairs with the Release of the previous unlock, so its writes are visible.
        if self
            .state
            .compare_exchange(UNLOCKED, LOCKED, Ordering::Acquire, Ordering::Relaxed)
            .is_ok()
        {
            Ok(self.guard()?)
        } else {
            Err(TryLockError::WouldBlock)
        }
    }

    fn guard(&self) -> LockResult<MutexGuard<'_, T>> {
        MutexGuard::from_raw(self, self.poison.enter())
    }

    #[inline]
    pub(crate) fn raw_lock(&self) {
        // Acquire: pairs with the Release of the previous unlock, so its writes are visible.
        if self
            .state
            .compare_exchange(UNLOCKED, LOCKED, Ordering::Acquire, Ordering::Relaxed)
            .is_err()
        {
            self.lock_contended();
        }
    }

    #[cold]
    fn lock_contended(&self) {
        let g = self.waiters.lock();
        loop {
            // Relaxed: QUEUED only changes under the lock we hold; LOCKED is re-checked by
            // the compare-and-swaps below.
            let s = self.state.load(Ordering::Relaxed);
            if s & LOCKED == 0 {
                // Acquire: as in `raw_lock`.
                if self
                    .state
                    .compare_exchange(s, s | LOCKED, Ordering::Acquire, Ordering::Relaxed)
                    .is_ok()
                {
                    return;
                }
                continue;
            }
            // Relaxed: from here on the holder and we communicate through the internal lock.
            // What matters is that the holder's fast-path unlock (LOCKED → 0) now fails and
            // sends it to `unlock_contended`, which needs the lock we hold, so it will find us.
            if s & QUEUED != 0
                || self
                    .state
                    .compare_exchange(s, s | QUEUED, Ordering::Relaxed, Ordering::Relaxed)
                    .is_ok()
            {
                break;
            }
        }
        // Returns once the holder handed the mutex over to us; its writes happen before.
        wait_granted(
            g,
            |list| list,
            (),
            WaitOn::Lock("Mutex::lock"),
            HANDED_OVER,
            |g, token| self.cancelled_waiter(g, token),
        );
    }

    /// Releases the mutex (the guard's drop, and Condvar before it parks).
    #[inline]
    pub(crate) fn raw_unlock(&self) {
        // Release: this holder's writes become visible to the next one, which takes the lock
        // with Acquire (or through the hand-over's Release/Acquire).
        if self
            .state
            .compare_exchange(LOCKED, UNLOCKED, Ordering::Release, Ordering::Relaxed)
            .is_err()
        {
            self.unlock_contended();
        }
    }

    #[cold]
    fn unlock_contended(&self) {
        let mut g = self.waiters.lock();
        self.hand_over(&mut g);
    }

    /// Gives the held mutex to the first waiter, or frees it if none is left.
    fn hand_over(&self, g: &mut Guard<'_, WaitList<()>>) {
        let (list, wakes) = g.parts();
        match list.len() {
            0 => {
                // The waiters that set QUEUED were cancelled and left; the last one cleared
                // it. Release: as in `raw_unlock`.
                self.state.store(UNLOCKED, Ordering::Release);
            }
            n => {
                if n == 1 {
                    // The last waiter leaves the list: clear QUEUED, keep LOCKED for it.
                    // Relaxed: the word cannot change under us (it is LOCKED and we hold the
                    // internal lock); the new owner is synchronised by the wake itself.
                    self.state.store(LOCKED, Ordering::Relaxed);
                }
                list.wake_front(HANDED_OVER, wakes);
            }
        }
    }

    /// A waiting fiber is being cancelled (unwound out of its wait).
    fn cancelled_waiter(&self, g: &mut Guard<'_, WaitList<()>>, token: Option<usize>) {
        match token {
            // It had just been handed the mutex: pass it on.
            Some(_) => self.hand_over(g),
            None => {
                if g.is_empty() {
                    // Relaxed: QUEUED only changes under the internal lock we hold.
                    self.state.fetch_and(!QUEUED, Ordering::Relaxed);
                }
            }
        }
    }
}

impl<'a, T: ?Sized> MutexGuard<'a, T> {
    /// The mutex this guard locks, and the guard's poison entry, without unlocking.
    pub(crate) fn into_raw(self) -> (&'a Mutex<T>, poison::Entry) {
        let parts = (self.lock, self.poison);
        std::mem::forget(self);
        parts
    }

    /// A guard for a mutex the caller has just (re)locked.
    pub(crate) fn from_raw(lock: &'a Mutex<T>, poison: poison::Entry) -> LockResult<Self> {
        let guard = MutexGuard {
            lock,
            poison,
            _not_send: PhantomData,
        };
        lock.poison.result(guard)
    }
}

impl<T: ?Sized> Deref for MutexGuard<'_, T> {
    type Target = T;

    #[inline]
    fn deref(&self) -> &T {
        // SAFETY: the guard proves the mutex is held, so no `&mut T` exists elsewhere.
        self.lock.data.with(|p| unsafe { &*p })
    }
}

impl<T: ?Sized> DerefMut for MutexGuard<'_, T> {
    #[inline]
    fn deref_mut(&mut self) -> &mut T {
        // SAFETY: the guard proves the mutex is held, and `&mut self` that this is the only
        // access through it.
        self.lock.data.with_mut(|p| unsafe { &mut *p })
    }
}

impl<T: ?Sized> Drop for MutexGuard<'_, T> {
    #[inline]
    fn drop(&mut self) {
        self.lock.poison.leave(self.poison);
        self.lock.raw_unlock();
    }
}
