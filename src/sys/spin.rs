//! A test-and-test-and-set spin lock for critical sections of a few instructions that never
//! span a park or a suspension: `fibra::sync`'s internal lock, a few of the scheduler's, and
//! the locks of the process-wide structures that a `fork` holds (see `crate::fork`: a spin
//! lock is released with a store, which works in a `fork` child whatever other threads were
//! doing at the fork).
//!
//! Unlocking is a plain release store, where a lock whose waiters may sleep must use a locked
//! instruction to learn whether any do (`parking_lot`'s mutex, used before, did). A waiter
//! spins with a growing pause, then yields its thread until the lock is free: only a holder
//! the kernel preempted keeps it waiting long, and yielding is how that holder gets its CPU
//! back. `sched_yield` is never interposed by the hooks.

use std::sync::atomic::Ordering;

/// A spin lock around a `T` (see the module docs).
pub(crate) struct SpinLock<T> {
    locked: std::sync::atomic::AtomicBool,
    value: std::cell::UnsafeCell<T>,
}

// SAFETY: the value is reached only through a guard, and one guard exists at a time (the
// flag), so sharing the lock shares `T` between threads one at a time: `T: Send`.
unsafe impl<T: Send> Sync for SpinLock<T> {}
// SAFETY: as for Sync.
unsafe impl<T: Send> Send for SpinLock<T> {}

/// Access to a [`SpinLock`]'s value; dropping it unlocks.
pub(crate) struct SpinGuard<'a, T> {
    lock: &'a SpinLock<T>,
    /// Unlocked on the thread that locked it, as `MutexGuard`s are: not `Send`.
    _not_send: std::marker::PhantomData<*const ()>,
}

impl<T> SpinLock<T> {
    pub(crate) const fn new(value: T) -> SpinLock<T> {
        SpinLock {
            locked: std::sync::atomic::AtomicBool::new(false),
            value: std::cell::UnsafeCell::new(value),
        }
    }

    /// The value, through `&mut self` (no guard can exist).
    pub(crate) fn get_mut(&mut self) -> &mut T {
        self.value.get_mut()
    }

    #[inline]
    pub(crate) fn lock(&self) -> SpinGuard<'_, T> {
        if self
            .locked
            .compare_exchange_weak(false, true, Ordering::Acquire, Ordering::Relaxed)
            .is_err()
        {
            self.lock_contended();
        }
        SpinGuard {
            lock: self,
            _not_send: std::marker::PhantomData,
        }
    }

    /// Locks for the duration of a `fork`, without a guard: [`SpinLock::fork_release`]
    /// unlocks, in the parent or in the child (see `crate::fork`).
    pub(crate) fn fork_hold(&self) {
        std::mem::forget(self.lock());
    }

    /// The value, while this thread holds the lock through [`SpinLock::fork_hold`].
    ///
    /// # Safety
    /// This thread took the lock with `fork_hold` and has not released it, and no other
    /// reference from this call is alive.
    #[allow(clippy::mut_from_ref)]
    pub(crate) unsafe fn fork_held(&self) -> &mut T {
        // SAFETY: per the contract the lock is held here and this is the only access.
        unsafe { &mut *self.value.get() }
    }

    /// Unlocks what [`SpinLock::fork_hold`] locked, in the parent or the child of the
    /// `fork`: a plain store, as no thread ever sleeps on the word (a `parking_lot` lock's
    /// unlock may look up its parked waiters in a process-wide table whose locks a parent
    /// thread may have held at the fork).
    ///
    /// # Safety
    /// This thread took the lock with `fork_hold` and has not released it.
    pub(crate) unsafe fn fork_release(&self) {
        self.locked.store(false, Ordering::Release);
    }

    #[cold]
    fn lock_contended(&self) {
        let mut step = 0u32;
        loop {
            while self.locked.load(Ordering::Relaxed) {
                if step < 7 {
                    for _ in 0..1u32 << step {
                        std::hint::spin_loop();
                    }
                    step += 1;
                } else {
                    std::thread::yield_now();
                }
            }
            if self
                .locked
                .compare_exchange_weak(false, true, Ordering::Acquire, Ordering::Relaxed)
                .is_ok()
            {
                return;
            }
        }
    }
}

impl<T> std::ops::Deref for SpinGuard<'_, T> {
    type Target = T;

    #[inline(always)]
    fn deref(&self) -> &T {
        // SAFETY: the guard holds the lock, so no `&mut` to the value exists elsewhere.
        unsafe { &*self.lock.value.get() }
    }
}

impl<T> std::ops::DerefMut for SpinGuard<'_, T> {
    #[inline(always)]
    fn deref_mut(&mut self) -> &mut T {
        // SAFETY: the guard holds the lock, and `&mut self` makes this the only access.
        unsafe { &mut *self.lock.value.get() }
    }
}

impl<T> Drop for SpinGuard<'_, T> {
    #[inline(always)]
    fn drop(&mut self) {
        // Release: what the holder did happens before the next locker's Acquire.
        self.lock.locked.store(false, Ordering::Release);
    }
}

#[cfg(test)]
mod tests {
    use super::SpinLock;
    use std::sync::Arc;

    /// More threads than cores increment under the lock: every increment counts, so no
    /// two held it at once, and a preempted holder did not keep the others out for good.
    #[test]
    fn oversubscribed_threads_exclude_each_other() {
        const THREADS: usize = 8;
        const EACH: usize = 20_000;
        let lock = Arc::new(SpinLock::new((0usize, false)));
        let threads: Vec<_> = (0..THREADS)
            .map(|_| {
                let lock = lock.clone();
                std::thread::spawn(move || {
                    for _ in 0..EACH {
                        let mut g = lock.lock();
                        assert!(!g.1, "two holders at once");
                        g.1 = true;
                        g.0 += 1;
                        g.1 = false;
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().expect("thread");
        }
        assert_eq!(lock.lock().0, THREADS * EACH);
    }
}
