//! The few building blocks the wait queue (`wait_queue`) and `fibra::sync` are made of,
//! gathered here so the model checker can swap them (tokio's `loom` shim, in small).
//!
//! In a normal build these are std's atomics and `Arc`, a spin lock (`RawLock`) for the short
//! internal critical sections, a thin `UnsafeCell`, and the crate's one waiting primitive
//! ([`crate::park`]). Under `RUSTFLAGS="--cfg loom"` (see `ci/loom.sh`) they are loom's
//! instrumented equivalents, and `park` is modelled on `loom::thread::park` with the same
//! contract: `register` runs after the waiter is committed to waiting, an `Unparker` wakes
//! exactly its own park once, and a deadline may pass at any moment. Nothing but the wait
//! queue and `src/sync` uses this module, and neither reaches past it for these things.
//! It also declares `const_unless_loom!`, for their constructors.

/// Declares a constructor `const` in normal builds. loom's instrumented types cannot be
/// created in a const context, so under `cfg(loom)` it is a plain `fn`.
macro_rules! const_unless_loom {
    ($(#[$attr:meta])* $vis:vis fn $name:ident $($rest:tt)*) => {
        #[cfg(not(loom))]
        $(#[$attr])*
        $vis const fn $name $($rest)*

        #[cfg(loom)]
        $(#[$attr])*
        $vis fn $name $($rest)*
    };
}

pub(crate) use imp::*;

#[cfg(not(loom))]
mod imp {
    pub(crate) use crate::park::{ParkResult, Unparker};
    pub(crate) use std::sync::atomic::{AtomicU64, AtomicU8, AtomicUsize, Ordering};
    pub(crate) use std::sync::Arc;
    use std::time::Instant;

    /// Suspends the calling fiber (or blocks the thread) until the `Unparker` given to
    /// `register` fires, or until `deadline`. See [`crate::park_timeout`]. The unparker
    /// must stay the park's only one: `register` keeps it, never clones it, and hands it
    /// to at most one waker (see `crate::park::park_alone`).
    #[inline]
    pub(crate) fn park(
        deadline: Option<Instant>,
        on: crate::park::WaitOn,
        register: impl FnOnce(Unparker),
    ) -> ParkResult {
        crate::park::park_alone(deadline, on, register)
    }

    /// Whether a waiter may spin briefly before parking: only a thread (or a standalone
    /// fiber, which blocks its thread), whose park is a futex sleep. A scheduled fiber parks
    /// cheaply (a context switch), and spinning would keep the other fibers of its worker —
    /// maybe the very one it waits for — from running.
    #[inline]
    pub(crate) fn may_spin() -> bool {
        !crate::fiber::in_scheduled_fiber()
    }

    /// `core::cell::UnsafeCell` with loom's closure-based accessors.
    #[repr(transparent)]
    pub(crate) struct UnsafeCell<T: ?Sized>(std::cell::UnsafeCell<T>);

    impl<T> UnsafeCell<T> {
        pub(crate) const fn new(value: T) -> UnsafeCell<T> {
            UnsafeCell(std::cell::UnsafeCell::new(value))
        }

        pub(crate) fn into_inner(self) -> T {
            self.0.into_inner()
        }
    }

    impl<T: ?Sized> UnsafeCell<T> {
        #[inline(always)]
        pub(crate) fn with<R>(&self, f: impl FnOnce(*const T) -> R) -> R {
            f(self.0.get())
        }

        #[inline(always)]
        pub(crate) fn with_mut<R>(&self, f: impl FnOnce(*mut T) -> R) -> R {
            f(self.0.get())
        }

        /// The value, through `&mut self` (no other access can exist).
        #[inline(always)]
        pub(crate) fn exclusive(&mut self) -> &mut T {
            self.0.get_mut()
        }
    }

    /// The internal lock (see [`crate::sys::spin`]).
    pub(crate) use crate::sys::spin::{SpinGuard as RawGuard, SpinLock as RawLock};
}

#[cfg(loom)]
mod imp {
    pub(crate) use loom::sync::atomic::{AtomicU64, AtomicU8, AtomicUsize, Ordering};
    pub(crate) use loom::sync::Arc;
    use std::time::Instant;

    pub(crate) use crate::park::ParkResult;

    const PARKED: u8 = 0;
    const NOTIFIED: u8 = 1;
    const TIMED_OUT: u8 = 2;

    struct Slot {
        state: AtomicU8,
        thread: loom::thread::Thread,
    }

    /// The model's `Unparker`: one slot per park, so a stale unparker can never wake a
    /// later park (the generation check of the real one).
    #[derive(Clone)]
    pub(crate) struct Unparker {
        slot: Arc<Slot>,
    }

    impl Unparker {
        pub(crate) fn unpark(&self) {
            // Release: the waker's writes are visible to the woken thread (Acquire below).
            if self
                .slot
                .state
                .compare_exchange(PARKED, NOTIFIED, Ordering::Release, Ordering::Relaxed)
                .is_ok()
            {
                self.slot.thread.unpark();
            }
        }

        /// As the real one's: `unpark`, consuming the unparker.
        pub(crate) fn unpark_owned(self) {
            self.unpark();
        }
    }

    /// The model's park. A deadline is modelled as "may pass at any moment": after `register`
    /// the waiter races its wakers to withdraw, and loom explores both outcomes.
    pub(crate) fn park(
        deadline: Option<Instant>,
        _on: crate::park::WaitOn,
        register: impl FnOnce(Unparker),
    ) -> ParkResult {
        let slot = Arc::new(Slot {
            state: AtomicU8::new(PARKED),
            thread: loom::thread::current(),
        });
        register(Unparker { slot: slot.clone() });
        if deadline.is_some() {
            // Acquire (both ways): if an unpark won, its waker's writes are visible.
            return match slot.state.compare_exchange(
                PARKED,
                TIMED_OUT,
                Ordering::Acquire,
                Ordering::Acquire,
            ) {
                Ok(_) => ParkResult::TimedOut,
                Err(_) => ParkResult::Unparked,
            };
        }
        // Acquire: pairs with the unparker's Release.
        while slot.state.load(Ordering::Acquire) != NOTIFIED {
            loom::thread::park();
        }
        ParkResult::Unparked
    }

    /// Spinning would only multiply the interleavings loom explores.
    pub(crate) fn may_spin() -> bool {
        false
    }

    /// loom's tracked cell, with the accessors of the normal build's.
    pub(crate) struct UnsafeCell<T: ?Sized>(loom::cell::UnsafeCell<T>);

    impl<T> UnsafeCell<T> {
        #[track_caller]
        pub(crate) fn new(value: T) -> UnsafeCell<T> {
            UnsafeCell(loom::cell::UnsafeCell::new(value))
        }

        pub(crate) fn into_inner(self) -> T {
            self.0.into_inner()
        }
    }

    impl<T: ?Sized> UnsafeCell<T> {
        #[track_caller]
        pub(crate) fn with<R>(&self, f: impl FnOnce(*const T) -> R) -> R {
            self.0.with(f)
        }

        #[track_caller]
        pub(crate) fn with_mut<R>(&self, f: impl FnOnce(*mut T) -> R) -> R {
            self.0.with_mut(f)
        }

        pub(crate) fn exclusive(&mut self) -> &mut T {
            // SAFETY: `&mut self` proves exclusive access.
            self.0.with_mut(|p| unsafe { &mut *p })
        }
    }

    pub(crate) struct RawLock<T>(loom::sync::Mutex<T>);

    pub(crate) type RawGuard<'a, T> = loom::sync::MutexGuard<'a, T>;

    impl<T> RawLock<T> {
        pub(crate) fn new(value: T) -> RawLock<T> {
            RawLock(loom::sync::Mutex::new(value))
        }

        pub(crate) fn lock(&self) -> RawGuard<'_, T> {
            self.0
                .lock()
                .expect("fibra::sync never panics holding its internal lock")
        }
    }
}
