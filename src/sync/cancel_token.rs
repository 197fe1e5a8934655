//! [`CancellationToken`]: a cancellation signal shared by many tasks, with child tokens.

use super::select::{Signal, Watchers};
use super::wait_queue::{wait, Lock, Wait, WaitList};
use crate::dump::WaitOn;
use crate::sys::deadline_after;
use std::fmt;
use std::sync::atomic::AtomicBool;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

/// The token a cancellation wakes waiters with.
const CANCELLED: usize = 1;

struct State {
    waiters: WaitList<()>,
    /// Selects waiting for the cancellation (see `select`).
    watchers: Watchers,
    children: Vec<Weak<Inner>>,
    /// Live children at the last pruning of `children`.
    pruned_at: usize,
}

struct Inner {
    cancelled: AtomicBool,
    state: Lock<State>,
    /// The parent token, kept alive by its children: a parent lists its children weakly,
    /// so without this a child whose parent's handles were all dropped (`root.child_token()
    /// .child_token()`) would be cut off from the root's cancellation. Taken by `drop`,
    /// which releases a chain of ancestors iteratively.
    parent: Option<Arc<Inner>>,
}

impl Drop for Inner {
    /// Releases the ancestors that only this token kept alive, one after another: a chain
    /// of a hundred thousand tokens must not recurse that deep.
    fn drop(&mut self) {
        let mut next = self.parent.take();
        while let Some(parent) = next {
            next = match Arc::try_unwrap(parent) {
                // The last reference: take its parent before it drops (with none left).
                Ok(mut last) => last.parent.take(),
                Err(_) => None,
            };
        }
    }
}

/// A signal that some work should stop, like tokio's `CancellationToken`: cheap to clone
/// (clones share the signal), checked with [`is_cancelled`](Self::is_cancelled), awaited
/// with [`cancelled`](Self::cancelled) — which suspends a fiber, or blocks a plain thread —
/// and fired once with [`cancel`](Self::cancel). A [child token](Self::child_token) is
/// cancelled with its parent (and its own children), but cancelling it leaves the parent
/// alone.
///
/// ```
/// use fibra::sync::CancellationToken;
/// use std::time::Duration;
///
/// let sched = fibra::Scheduler::builder().threads(2).build().unwrap();
/// sched.start();
/// let token = CancellationToken::new();
/// let workers: Vec<_> = (0..4)
///     .map(|_| {
///         let token = token.child_token();
///         sched.submit(move || {
///             let mut rounds = 0;
///             while !token.is_cancelled() {
///                 rounds += 1;
///                 fibra::sleep(Duration::from_millis(1));
///             }
///             rounds
///         }, None).unwrap()
///     })
///     .collect();
/// std::thread::sleep(Duration::from_millis(20));
/// token.cancel();
/// for w in workers {
///     w.join().unwrap();
/// }
/// ```
#[derive(Clone)]
pub struct CancellationToken {
    inner: Arc<Inner>,
}

impl CancellationToken {
    /// The token's identity, the same for its clones (for `Select`).
    pub(crate) fn select_id(&self) -> *const () {
        Arc::as_ptr(&self.inner).cast()
    }
}

impl Default for CancellationToken {
    fn default() -> Self {
        CancellationToken::new()
    }
}

impl CancellationToken {
    /// A token not cancelled, with no parent.
    pub fn new() -> CancellationToken {
        CancellationToken::with_parent(None)
    }

    fn with_parent(parent: Option<Arc<Inner>>) -> CancellationToken {
        CancellationToken {
            inner: Arc::new(Inner {
                cancelled: AtomicBool::new(false),
                state: Lock::new(State {
                    waiters: WaitList::new(),
                    watchers: Watchers::default(),
                    children: Vec::new(),
                    pruned_at: 0,
                }),
                parent,
            }),
        }
    }

    /// A new token cancelled when this one is (at once, if it already is), as tokio's: also
    /// when every handle of this one is dropped meanwhile (the child keeps its ancestors
    /// alive), so `root.child_token().child_token()` is cancelled with `root`. Cancelling
    /// the child does not cancel this token. Dropped children cost nothing here for long:
    /// the parent forgets them as it gains new ones.
    pub fn child_token(&self) -> CancellationToken {
        let child = CancellationToken::with_parent(Some(self.inner.clone()));
        let mut st = self.inner.state.lock();
        if self.inner.cancelled.load(Ordering::Acquire) {
            drop(st);
            child.cancel();
            return child;
        }
        st.children.push(Arc::downgrade(&child.inner));
        if st.children.len() > 2 * st.pruned_at.max(8) {
            st.children.retain(|c| c.strong_count() > 0);
            st.pruned_at = st.children.len();
        }
        child
    }

    /// Cancels this token and, transitively, its children: every waiter in
    /// [`cancelled`](Self::cancelled) wakes. Idempotent; never blocks.
    pub fn cancel(&self) {
        let mut pending = vec![self.inner.clone()];
        while let Some(inner) = pending.pop() {
            let children = {
                let mut guard = inner.state.lock();
                if inner.cancelled.swap(true, Ordering::AcqRel) {
                    continue;
                }
                let (st, wakes) = guard.parts();
                st.waiters.wake_all(CANCELLED, wakes);
                st.watchers.notify(wakes);
                std::mem::take(&mut st.children)
                // The waiters are unparked as the guard goes, after the lock is released.
            };
            pending.extend(children.iter().filter_map(Weak::upgrade));
        }
    }

    /// Registers (or removes) a waiting select's signal.
    pub(crate) fn watch(&self, s: &Arc<Signal>, on: bool) {
        let mut st = self.inner.state.lock();
        if on {
            st.watchers.add(s);
        } else {
            st.watchers.remove(s);
        }
    }

    /// Whether the token has been cancelled.
    pub fn is_cancelled(&self) -> bool {
        self.inner.cancelled.load(Ordering::Acquire)
    }

    /// Waits until the token is cancelled: suspends a fiber, blocks a plain thread. Returns
    /// at once if it already is.
    pub fn cancelled(&self) {
        self.wait_until(None);
    }

    /// Waits at most `timeout` for the token to be cancelled; returns whether it is.
    pub fn cancelled_timeout(&self, timeout: Duration) -> bool {
        self.wait_until(Some(deadline_after(timeout)))
    }

    fn wait_until(&self, deadline: Option<Instant>) -> bool {
        crate::coop::spend();
        if self.is_cancelled() {
            return true;
        }
        let st = self.inner.state.lock();
        if self.is_cancelled() {
            return true;
        }
        match wait(
            st,
            |st| &mut st.waiters,
            (),
            deadline,
            WaitOn::Other("CancellationToken::cancelled"),
            || {},
            |_, _| {},
        ) {
            Wait::Woken(_) => true,
            Wait::TimedOut(_) => self.is_cancelled(),
        }
    }
}

impl fmt::Debug for CancellationToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CancellationToken")
            .field("cancelled", &self.is_cancelled())
            .finish()
    }
}
