//! Lock poisoning, with std's rules: a lock whose guard is dropped while its holder panics
//! (or while its fiber is being cancelled, which unwinds the same way) is marked poisoned,
//! and later lockers get a [`std::sync::PoisonError`] that still carries the guard.
//!
//! "Panics" is the holder fiber's own unwind (`fiber::unwinding`), not the thread's: another
//! fiber of the worker suspended in the middle of its unwind neither poisons a lock nor keeps
//! a holder's panic from poisoning it.

use std::sync::atomic::{AtomicBool, Ordering};

/// A lock's poison flag.
pub(crate) struct Flag {
    failed: AtomicBool,
}

/// Whether the holder was already panicking when it took the lock: only a panic that starts
/// while the lock is held poisons it.
#[derive(Clone, Copy)]
pub(crate) struct Entry {
    panicking: bool,
}

impl Flag {
    pub(crate) const fn new() -> Flag {
        Flag {
            failed: AtomicBool::new(false),
        }
    }

    /// Called by a new holder.
    #[inline]
    pub(crate) fn enter(&self) -> Entry {
        Entry {
            panicking: crate::fiber::unwinding(),
        }
    }

    /// Called by a holder about to release the lock.
    #[inline]
    pub(crate) fn leave(&self, entry: Entry) {
        if !entry.panicking && crate::fiber::unwinding() {
            // Relaxed: the flag is advisory; the data it describes is ordered by the lock.
            self.failed.store(true, Ordering::Relaxed);
        }
    }

    #[inline]
    pub(crate) fn get(&self) -> bool {
        // Relaxed: as in `leave`.
        self.failed.load(Ordering::Relaxed)
    }

    pub(crate) fn clear(&self) {
        // Relaxed: as in `leave`.
        self.failed.store(false, Ordering::Relaxed);
    }

    /// `value` (a guard, or the data) as std hands it out: `Err` carrying it if poisoned.
    #[inline]
    pub(crate) fn result<V>(&self, value: V) -> std::sync::LockResult<V> {
        if self.get() {
            Err(std::sync::PoisonError::new(value))
        } else {
            Ok(value)
        }
    }
}
