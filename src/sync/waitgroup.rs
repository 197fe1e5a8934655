//! [`WaitGroup`]: wait until a group of handles is gone (crossbeam's and marl's `WaitGroup`,
//! Go's `sync.WaitGroup` with `Add`/`Done` spelt `clone`/`drop`).
//!
//! The count of live handles is an atomic, so cloning and dropping take no lock. The drop
//! that brings it to zero takes the internal lock and wakes every waiter. A waiter checks
//! the count under that same lock before it queues; together that means the last drop either
//! happens before the waiter's check (which then sees zero) or takes the lock after the
//! waiter queued (and wakes it).

use super::deadline_after;
use super::shim::{Arc, AtomicUsize, Ordering};
use super::wait_queue::{wait, Lock, Wait, WaitList};
use crate::dump::WaitOn;
use std::fmt;
use std::panic::{RefUnwindSafe, UnwindSafe};
use std::time::{Duration, Instant};

/// The token of a waiter released because the count reached zero.
const DONE: usize = 1;

/// Waits for a group of tasks to finish: every task holds a clone, and
/// [`wait`](WaitGroup::wait) returns once all clones (but the waiters' own) are dropped.
///
/// ```
/// use fibra::sync::WaitGroup;
/// use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
/// use std::sync::Arc;
///
/// let sched = fibra::Scheduler::builder().threads(2).build()?;
/// sched.start();
/// let wg = WaitGroup::new();
/// let done = Arc::new(AtomicUsize::new(0));
/// for _ in 0..10 {
///     let (wg, done) = (wg.clone(), done.clone()); // "add"
///     drop(sched.submit(move || {
///         fibra::sleep(std::time::Duration::from_millis(1));
///         done.fetch_add(1, SeqCst);
///         drop(wg); // "done"
///     }, None).unwrap());
/// }
/// wg.wait(); // from a thread here; from a fiber it suspends the fiber
/// assert_eq!(done.load(SeqCst), 10);
/// sched.stop();
/// # Ok::<(), fibra::Error>(())
/// ```
pub struct WaitGroup {
    inner: Arc<Inner>,
}

struct Inner {
    /// Live handles.
    count: AtomicUsize,
    waiters: Lock<WaitList<()>>,
}

impl WaitGroup {
    /// A group with one handle, this one.
    pub fn new() -> WaitGroup {
        WaitGroup {
            inner: Arc::new(Inner {
                count: AtomicUsize::new(1),
                waiters: Lock::new(WaitList::new()),
            }),
        }
    }

    /// Drops this handle and waits until every other handle has been dropped, suspending a
    /// fiber (or blocking a thread). Several fibers may wait on clones of the same group;
    /// they are all released together.
    pub fn wait(self) {
        self.wait_until(None);
    }

    /// Like [`wait`](WaitGroup::wait), for at most `timeout`. Returns whether the group
    /// finished in time.
    pub fn wait_timeout(self, timeout: Duration) -> bool {
        self.wait_until(deadline_after(timeout))
    }

    fn wait_until(self, deadline: Option<Instant>) -> bool {
        crate::coop::spend();
        let inner = self.inner.clone();
        drop(self);
        let g = inner.waiters.lock();
        // Acquire: pairs with the droppers' Release decrements (see `Drop`), so their work is
        // visible once we see zero.
        if inner.count.load(Ordering::Acquire) == 0 {
            return true;
        }
        let finished = match wait(
            g,
            |list| list,
            (),
            deadline,
            WaitOn::Other("WaitGroup::wait"),
            || {},
            |_, _| {},
        ) {
            Wait::Woken(_) => true,
            Wait::TimedOut(_) => false,
        };
        finished
    }

    /// The number of live handles (a snapshot).
    pub fn count(&self) -> usize {
        // Relaxed: a snapshot for diagnostics.
        self.inner.count.load(Ordering::Relaxed)
    }
}

impl Clone for WaitGroup {
    fn clone(&self) -> WaitGroup {
        // Relaxed: like `Arc::clone`, the new handle comes from a live one, so the count
        // cannot be zero here and no ordering is needed.
        self.inner.count.fetch_add(1, Ordering::Relaxed);
        WaitGroup {
            inner: self.inner.clone(),
        }
    }
}

impl Drop for WaitGroup {
    fn drop(&mut self) {
        // AcqRel: Release publishes this handle's work to whoever sees the count reach zero;
        // Acquire (for the last one) gathers the other droppers' work, which reaches the
        // waiters through the lock below.
        if self.inner.count.fetch_sub(1, Ordering::AcqRel) == 1 {
            let mut g = self.inner.waiters.lock();
            let (list, wakes) = g.parts();
            list.wake_all(DONE, wakes);
        }
    }
}

impl Default for WaitGroup {
    fn default() -> WaitGroup {
        WaitGroup::new()
    }
}

// The internal state is consistent whenever user code runs: its lock is never held
// across a call out of this module.
impl UnwindSafe for WaitGroup {}
impl RefUnwindSafe for WaitGroup {}

impl fmt::Debug for WaitGroup {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("WaitGroup")
            .field("count", &self.count())
            .finish()
    }
}
