//! [`RwLock`]: many readers or one writer, served in arrival order.
//!
//! The reader count, the writer flag and one FIFO of waiting readers and writers share the
//! internal lock (Boost.Fiber's design, with no lock-free fast path). Fairness is
//! *phase-fair FIFO*:
//! - a reader gets in at once only if no writer holds the lock *and nobody waits*; a reader
//!   arriving behind a waiting writer queues behind it, so writers cannot starve;
//! - when the lock frees up, the front of the queue is granted: a writer alone, or the whole
//!   run of consecutive readers at the front together. Grants are handed over: the woken
//!   waiter already holds the lock when it returns.

use super::poison;
use super::shim::UnsafeCell;
use super::wait_queue::{wait_granted, Guard, Lock, WaitList};
use crate::dump::WaitOn;
use std::fmt;
use std::marker::PhantomData;
use std::ops::{Deref, DerefMut};
use std::panic::{RefUnwindSafe, UnwindSafe};
use std::sync::{LockResult, TryLockError, TryLockResult};

/// The token of a waiter that has been granted the lock.
const GRANTED: usize = 1;

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Access {
    Read,
    Write,
}

impl Access {
    fn wait_on(self) -> WaitOn {
        match self {
            Access::Read => WaitOn::Lock("RwLock::read"),
            Access::Write => WaitOn::Lock("RwLock::write"),
        }
    }
}

/// A reader–writer lock for fibers and threads, like [`std::sync::RwLock`].
///
/// Any number of readers, or one writer, at a time. Waiting suspends a fiber (or blocks a
/// thread); waiters are served in arrival order, and a reader arriving while a writer waits
/// queues behind that writer, so neither side starves.
///
/// # Poisoning
/// As std's: a writer that panics (or whose fiber is cancelled) while holding the lock
/// poisons it; later `read`/`write` calls return an error carrying the guard. Readers do not
/// poison.
///
/// ```
/// use fibra::sync::RwLock;
/// use std::sync::Arc;
///
/// let sched = fibra::Scheduler::builder().threads(2).build()?;
/// sched.start();
/// let config = Arc::new(RwLock::new(String::from("v1")));
/// let c = config.clone();
/// let reader = sched.submit(move || c.read().unwrap().clone(), None).unwrap();
/// assert!(["v1", "v2"].contains(&reader.join().unwrap().as_str()));
/// *config.write().unwrap() = String::from("v2");
/// assert_eq!(*config.read().unwrap(), "v2");
/// sched.stop();
/// # Ok::<(), fibra::Error>(())
/// ```
pub struct RwLock<T: ?Sized> {
    state: Lock<State>,
    poison: poison::Flag,
    data: UnsafeCell<T>,
}

struct State {
    readers: usize,
    writer: bool,
    waiters: WaitList<Access>,
}

// SAFETY: as std's: the lock hands `T` to one writer, or shares `&T` among readers on any
// threads, so `Send` needs `T: Send` and `Sync` needs `T: Send + Sync`.
unsafe impl<T: ?Sized + Send> Send for RwLock<T> {}
// SAFETY: as above.
unsafe impl<T: ?Sized + Send + Sync> Sync for RwLock<T> {}

// Poisoning reports a panic during a write, as with std.
impl<T: ?Sized> UnwindSafe for RwLock<T> {}
impl<T: ?Sized> RefUnwindSafe for RwLock<T> {}

/// Shared access to an [`RwLock`]'s data; dropping it releases the read lock.
#[must_use = "if unused the RwLock will immediately unlock"]
pub struct RwLockReadGuard<'a, T: ?Sized + 'a> {
    lock: &'a RwLock<T>,
    _not_send: PhantomData<*const ()>,
}

/// Exclusive access to an [`RwLock`]'s data; dropping it releases the write lock.
#[must_use = "if unused the RwLock will immediately unlock"]
pub struct RwLockWriteGuard<'a, T: ?Sized + 'a> {
    lock: &'a RwLock<T>,
    poison: poison::Entry,
    _not_send: PhantomData<*const ()>,
}

impl<T> RwLock<T> {
    const_unless_loom! {
        /// Creates an unlocked `RwLock`. `const`, so it can initialise a `static`.
        pub fn new(value: T) -> RwLock<T> {
            RwLock {
                state: Lock::new(State {
                    readers: 0,
                    writer: false,
                    waiters: WaitList::new(),
                }),
                poison: poison::Flag::new(),
                data: UnsafeCell::new(value),
            }
        }
    }
}

lock_api! {
    RwLock, try_read, [RwLockReadGuard, RwLockWriteGuard];
    /// Consumes the lock and returns its data; `Err` (with the data) if poisoned.
    fn into_inner;
    /// Whether a writer panicked while holding the lock.
    fn is_poisoned;
    /// Clears the poison flag.
    fn clear_poison;
    /// The data, through `&mut self` (no locking needed); `Err` if poisoned.
    fn get_mut;
}

impl<T: ?Sized> RwLock<T> {
    /// Takes a shared read lock, waiting while a writer holds or waits for the lock.
    ///
    /// # Errors
    /// If the lock is poisoned; the error carries the guard.
    pub fn read(&self) -> LockResult<RwLockReadGuard<'_, T>> {
        crate::coop::spend();
        self.acquire(Access::Read);
        self.read_guard()
    }

    /// Takes a read lock only if that needs no waiting.
    ///
    /// # Errors
    /// [`TryLockError::WouldBlock`] or [`TryLockError::Poisoned`].
    pub fn try_read(&self) -> TryLockResult<RwLockReadGuard<'_, T>> {
        crate::coop::spend();
        if self.try_acquire(Access::Read) {
            Ok(self.read_guard()?)
        } else {
            Err(TryLockError::WouldBlock)
        }
    }

    /// Takes the exclusive write lock, waiting for current readers and earlier waiters.
    ///
    /// # Errors
    /// If the lock is poisoned; the error carries the guard.
    pub fn write(&self) -> LockResult<RwLockWriteGuard<'_, T>> {
        crate::coop::spend();
        self.acquire(Access::Write);
        self.write_guard()
    }

    /// Takes the write lock only if that needs no waiting.
    ///
    /// # Errors
    /// [`TryLockError::WouldBlock`] or [`TryLockError::Poisoned`].
    pub fn try_write(&self) -> TryLockResult<RwLockWriteGuard<'_, T>> {
        crate::coop::spend();
        if self.try_acquire(Access::Write) {
            Ok(self.write_guard()?)
        } else {
            Err(TryLockError::WouldBlock)
        }
    }

    fn read_guard(&self) -> LockResult<RwLockReadGuard<'_, T>> {
        let guard = RwLockReadGuard {
            lock: self,
            _not_send: PhantomData,
        };
        self.poison.result(guard)
    }

    fn write_guard(&self) -> LockResult<RwLockWriteGuard<'_, T>> {
        let guard = RwLockWriteGuard {
            lock: self,
            poison: self.poison.enter(),
            _not_send: PhantomData,
        };
        self.poison.result(guard)
    }

    fn try_acquire(&self, access: Access) -> bool {
        let mut st = self.state.lock();
        take_if_free(&mut st, access)
    }

    fn acquire(&self, access: Access) {
        let mut st = self.state.lock();
        if take_if_free(&mut st, access) {
            return;
        }
        // Returns once handed over: the releaser counted us in; its writes happen before.
        wait_granted(
            st,
            |st| &mut st.waiters,
            access,
            access.wait_on(),
            GRANTED,
            |st, token| {
                if token.is_some() {
                    // Granted, but the fiber is being cancelled: give the lock back.
                    release(st, access);
                } else {
                    // A writer leaving the front may let the readers behind it in.
                    grant(st);
                }
            },
        );
    }

    fn release(&self, access: Access) {
        let mut st = self.state.lock();
        release(&mut st, access);
    }
}

/// Takes the lock for `access` if it is free for it and nobody is waiting.
fn take_if_free(st: &mut State, access: Access) -> bool {
    if !st.waiters.is_empty() || st.writer {
        return false;
    }
    match access {
        Access::Read => st.readers += 1,
        Access::Write if st.readers == 0 => st.writer = true,
        Access::Write => return false,
    }
    true
}

/// Gives up a held lock and grants the front of the queue.
fn release(st: &mut Guard<'_, State>, access: Access) {
    match access {
        Access::Read => st.readers -= 1,
        Access::Write => st.writer = false,
    }
    grant(st);
}

/// Hands the lock to the front of the queue: one writer, or every reader up to the first
/// waiting writer.
fn grant(st: &mut Guard<'_, State>) {
    let (st, wakes) = st.parts();
    while let Some(access) = st.waiters.front() {
        match access {
            Access::Write if st.readers == 0 && !st.writer => {
                st.writer = true;
                st.waiters.wake_front(GRANTED, wakes);
                return;
            }
            Access::Read if !st.writer => {
                st.readers += 1;
                st.waiters.wake_front(GRANTED, wakes);
            }
            _ => return,
        }
    }
}

impl<T: ?Sized> Deref for RwLockReadGuard<'_, T> {
    type Target = T;

    fn deref(&self) -> &T {
        // SAFETY: a read guard proves no writer holds the lock.
        self.lock.data.with(|p| unsafe { &*p })
    }
}

impl<T: ?Sized> Drop for RwLockReadGuard<'_, T> {
    fn drop(&mut self) {
        self.lock.release(Access::Read);
    }
}

impl<T: ?Sized> Deref for RwLockWriteGuard<'_, T> {
    type Target = T;

    fn deref(&self) -> &T {
        // SAFETY: a write guard proves exclusive access.
        self.lock.data.with(|p| unsafe { &*p })
    }
}

impl<T: ?Sized> DerefMut for RwLockWriteGuard<'_, T> {
    fn deref_mut(&mut self) -> &mut T {
        // SAFETY: a write guard proves exclusive access, and `&mut self` uniqueness.
        self.lock.data.with_mut(|p| unsafe { &mut *p })
    }
}

impl<T: ?Sized> Drop for RwLockWriteGuard<'_, T> {
    fn drop(&mut self) {
        self.lock.poison.leave(self.poison);
        self.lock.release(Access::Write);
    }
}
