//! Fiber-aware synchronisation: locks, condition variables, semaphores, barriers, wait
//! groups and channels that suspend a waiting *fiber* instead of blocking its worker thread.
//!
//! Names and behaviour follow `std::sync` (and Boost.Fiber, which mirrors the C++ standard
//! library), so there is nothing new to learn: [`Mutex`] (with std's poisoning),
//! [`RwLock`], [`Condvar`], [`Barrier`], [`OnceLock`], [`mpsc`] with std's very error
//! types; plus [`Semaphore`], [`WaitGroup`], [`oneshot`] and [`CancellationToken`], which
//! std lacks, [`mpmc`] (std's channel API with cloneable receivers, as crossbeam-channel's)
//! and [`broadcast`] (tokio's: every receiver sees every message); and [`Pool`], a
//! connection pool in r2d2's shape for blocking clients shared by many fibers.
//!
//! Why not std's? A fiber that waits on a `std::sync::Mutex` blocks its whole worker thread,
//! and if the holder is a fiber of the same worker that yielded, the worker deadlocks. These
//! primitives park the fiber with [`crate::park`] and let the worker run others.
//!
//! # Guarantees
//! - **Fibers and threads alike.** Every primitive works from scheduled fibers, from plain
//!   threads, and between the two: a waiting fiber is suspended, a waiting thread blocked.
//! - **First come, first served.** Waiters queue in a FIFO and are served in arrival order;
//!   locks and permits are *handed over* to the next waiter, so a newcomer cannot overtake
//!   it and nobody starves.
//! - **One waiting mechanism.** Everything waits through [`crate::park`] /
//!   [`crate::park_timeout`] and wakes through [`crate::Unparker`]: a woken fiber resumes on
//!   its own worker. Internal state is guarded by short critical sections under a spin lock
//!   (`wait_queue::Lock`) that are never held across a park.
//! - **Timeouts are never early**, and a wake that races with a deadline wins (a lock or
//!   a message it carried is not lost).
//! - **Cancellation-safe.** A fiber cancelled by [`Scheduler::stop_timeout`] while it waits
//!   leaves its queue cleanly, and passes on a lock, permits or a message it was just given.
//!
//! [`OnceLock`] exists because std's is not enough in one case that matters here: std blocks
//! the *threads* of callers waiting for a running initialiser, so an initialiser that
//! suspends its fiber while a fiber of the same worker waits for it deadlocks that worker.
//! (std's `LazyLock` has the same limit; wrap a fibra `OnceLock` for lazy statics whose
//! initialiser suspends.)
//!
//! [`Scheduler::stop_timeout`]: crate::Scheduler::stop_timeout
//!
//! # Implementation map
//! `wait_queue` is the FIFO every primitive waits in (intrusive nodes on the waiters'
//! stacks; its module docs give the handshake), part of the core's waiting machinery in
//! `crate::park` and used here by that name. `mutex` adds a one-byte lock word with
//! atomic fast paths, `oneshot` a lock-free single-waiter slot; `chan` is the channel core
//! that `mpsc` and `mpmc` are built on. `shim` (also `crate::park`'s) gathers the atomics,
//! cells and park so that `RUSTFLAGS="--cfg loom"` can model-check them (`ci/loom.sh`).

/// What std's `Mutex` and `RwLock` have alike, written once for fibra's two: the poisoning
/// accessors (with the docs each type gives them here), `Debug` of the lock (through
/// `$try_shared`, which takes shared access without waiting), `Default` and `From`; and for
/// each guard type, `Sync` when `T` is, `Debug` and `Display`. Expanded inside the lock's
/// module, whose lock has `poison` (a `poison::Flag`) and `data` fields, and where `fmt`,
/// `LockResult` and `TryLockError` are in scope.
macro_rules! lock_api {
    (
        $lock:ident, $try_shared:ident, [$($guard:ident),+];
        $(#[$into_inner:meta])* fn into_inner;
        $(#[$is_poisoned:meta])* fn is_poisoned;
        $(#[$clear_poison:meta])* fn clear_poison;
        $(#[$get_mut:meta])* fn get_mut;
    ) => {
        impl<T> $lock<T> {
            $(#[$into_inner])*
            pub fn into_inner(self) -> LockResult<T> {
                let poison = self.poison;
                poison.result(self.data.into_inner())
            }
        }

        impl<T: ?Sized> $lock<T> {
            $(#[$is_poisoned])*
            pub fn is_poisoned(&self) -> bool {
                self.poison.get()
            }

            $(#[$clear_poison])*
            pub fn clear_poison(&self) {
                self.poison.clear();
            }

            $(#[$get_mut])*
            pub fn get_mut(&mut self) -> LockResult<&mut T> {
                self.poison.result(self.data.exclusive())
            }
        }

        impl<T: ?Sized + fmt::Debug> fmt::Debug for $lock<T> {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                let mut d = f.debug_struct(stringify!($lock));
                match self.$try_shared() {
                    Ok(guard) => d.field("data", &&*guard),
                    Err(TryLockError::Poisoned(err)) => d.field("data", &&**err.get_ref()),
                    Err(TryLockError::WouldBlock) => d.field("data", &format_args!("<locked>")),
                };
                d.field("poisoned", &self.poison.get());
                d.finish_non_exhaustive()
            }
        }

        impl<T: Default> Default for $lock<T> {
            fn default() -> $lock<T> {
                $lock::new(T::default())
            }
        }

        impl<T> From<T> for $lock<T> {
            fn from(value: T) -> $lock<T> {
                $lock::new(value)
            }
        }

        $(
            // SAFETY: a shared guard only gives `&T`.
            unsafe impl<T: ?Sized + Sync> Sync for $guard<'_, T> {}

            impl<T: ?Sized + fmt::Debug> fmt::Debug for $guard<'_, T> {
                fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                    fmt::Debug::fmt(&**self, f)
                }
            }

            impl<T: ?Sized + fmt::Display> fmt::Display for $guard<'_, T> {
                fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                    (**self).fmt(f)
                }
            }
        )+
    };
}

mod barrier;
pub mod broadcast;
mod cancel_token;
#[macro_use]
mod chan;
mod condvar;
pub mod mpmc;
pub mod mpsc;
mod mutex;
mod once_lock;
pub mod oneshot;
mod poison;
mod pool;
mod rwlock;
pub mod select;
mod semaphore;
mod timed;
mod waitgroup;

#[cfg(all(test, loom))]
mod loom_model;

pub use barrier::{Barrier, BarrierWaitResult};
pub use cancel_token::CancellationToken;
pub use condvar::{Condvar, WaitTimeoutResult};
pub use mutex::{Mutex, MutexGuard};
pub use once_lock::OnceLock;
pub use pool::{ManageConnection, Pool, PoolBuilder, PoolError, PoolState, PooledConnection};
pub use rwlock::{RwLock, RwLockReadGuard, RwLockWriteGuard};
pub use select::{
    ReadyTimeoutError, Select, SelectArms, SelectTimeoutError, SelectedOperation, TryReadyError,
    TrySelectError,
};
pub use semaphore::{Semaphore, SemaphorePermit};
pub use timed::{after, never, tick, After, Never, Tick};
pub use waitgroup::WaitGroup;

// The wait queue every primitive here waits in, and the loom shim under it, are the core's
// (`crate::park`): the scheduler's joiners and drain waiters queue in the same lists.
use crate::park::shim;
pub(crate) use crate::park::wait_queue;

use std::time::{Duration, Instant};

/// The deadline `timeout` from now; `None` (wait for ever) if it is too far away to be an
/// `Instant`.
fn deadline_after(timeout: Duration) -> Option<Instant> {
    Instant::now().checked_add(timeout)
}

/// A `try_recv` result as a receiving future sees it: `Some` once the future is ready.
pub(crate) fn ready<T>(r: Result<T, mpsc::TryRecvError>) -> Option<Result<T, mpsc::RecvError>> {
    match r {
        Ok(v) => Some(Ok(v)),
        Err(mpsc::TryRecvError::Disconnected) => Some(Err(mpsc::RecvError)),
        Err(mpsc::TryRecvError::Empty) => None,
    }
}
