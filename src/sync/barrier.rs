//! [`Barrier`]: `n` parties meet, then all go on; reusable, like std's.
//!
//! The arrival count and the waiters share the internal lock. The `n`-th arrival is the
//! leader: it resets the count for the next round and wakes the `n - 1` waiters (in arrival
//! order) without waiting itself. A waiter that leaves early (a timeout, a cancellation)
//! takes its arrival back under the same lock; it can only still be queued while its round
//! is open, because the leader empties the queue when it closes the round.

use super::deadline_after;
use super::wait_queue::{wait, Lock, Wait, WaitList};
use crate::dump::WaitOn;
use std::fmt;
use std::panic::{RefUnwindSafe, UnwindSafe};
use std::time::{Duration, Instant};

/// The token of a waiter released by its round's leader.
const RELEASED: usize = 1;

/// A rendezvous of `n` fibers or threads, like [`std::sync::Barrier`].
///
/// ```
/// use fibra::sync::Barrier;
/// use std::sync::Arc;
///
/// let sched = fibra::Scheduler::builder().threads(2).build()?;
/// sched.start();
/// let barrier = Arc::new(Barrier::new(10));
/// let tasks: Vec<_> = (0..10)
///     .map(|_| {
///         let b = barrier.clone();
///         sched.submit(move || b.wait().is_leader(), None).unwrap()
///     })
///     .collect();
/// let leaders = tasks.into_iter().map(|t| t.join().unwrap());
/// assert_eq!(leaders.filter(|&leader| leader).count(), 1);
/// sched.stop();
/// # Ok::<(), fibra::Error>(())
/// ```
pub struct Barrier {
    parties: usize,
    state: Lock<State>,
}

struct State {
    /// Parties that arrived in the current round.
    arrived: usize,
    waiters: WaitList<()>,
}

/// What [`Barrier::wait`] and [`Barrier::wait_timeout`] return; like [`std::sync::BarrierWaitResult`].
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct BarrierWaitResult(bool);

impl BarrierWaitResult {
    /// `true` for exactly one party per round: the last to arrive.
    pub fn is_leader(&self) -> bool {
        self.0
    }
}

impl Barrier {
    const_unless_loom! {
        /// A barrier for `n` parties. With `n` of 0 or 1 every `wait` returns at once, as the
        /// leader.
        pub fn new(n: usize) -> Barrier {
            Barrier {
                parties: n,
                state: Lock::new(State {
                    arrived: 0,
                    waiters: WaitList::new(),
                }),
            }
        }
    }

    /// Waits until all `n` parties have called `wait` in this round, suspending a fiber (or
    /// blocking a thread). Then every party returns; the last to arrive is the leader.
    pub fn wait(&self) -> BarrierWaitResult {
        match self.wait_until(None) {
            Some(r) => r,
            None => unreachable!("a barrier wait without a deadline cannot time out"),
        }
    }

    /// Like [`wait`](Barrier::wait), but gives up after `timeout`: `None` if the round this
    /// call arrived in was not released within `timeout`.
    ///
    /// - A call whose arrival completes the round returns `Some` at once, as the leader,
    ///   whatever `timeout` (even [`Duration::ZERO`]).
    /// - A release that races with the deadline wins: if the round was released, the call
    ///   returns `Some` (not the leader), even if it returns after the deadline.
    /// - On `None` the caller has left the barrier cleanly: its arrival is taken back, as if
    ///   it had never called. The round stays open and still needs `n` parties; the parties
    ///   still waiting keep waiting, undisturbed (nothing is "broken", unlike Java's
    ///   `CyclicBarrier`), and are released once enough others arrive. Calling again is a
    ///   new arrival.
    /// - With [`Duration::ZERO`] a call that does not complete the round leaves again as
    ///   soon as its deadline is noticed (a thread first watches for a few microseconds, as
    ///   every wait does; a fiber parks until its worker's next look at its timers); a
    ///   release in between still wins. A `timeout` too large for an [`Instant`]
    ///   ([`Duration::MAX`]) waits for ever.
    ///
    /// ```
    /// use fibra::sync::Barrier;
    /// use std::time::Duration;
    ///
    /// let barrier = Barrier::new(2);
    /// // Alone: times out, and takes its arrival back.
    /// assert!(barrier.wait_timeout(Duration::from_millis(10)).is_none());
    /// let sched = fibra::Scheduler::builder().threads(1).build()?;
    /// sched.start();
    /// let b = std::sync::Arc::new(barrier);
    /// let other = b.clone();
    /// let fiber = sched.submit(move || other.wait_timeout(Duration::MAX), None).unwrap();
    /// // The fiber and this thread are the two parties of the next release.
    /// let mine = b.wait_timeout(Duration::from_secs(60)).expect("released");
    /// let theirs = fiber.join().unwrap().expect("released");
    /// assert!(mine.is_leader() != theirs.is_leader());
    /// sched.stop();
    /// # Ok::<(), fibra::Error>(())
    /// ```
    pub fn wait_timeout(&self, timeout: Duration) -> Option<BarrierWaitResult> {
        self.wait_until(deadline_after(timeout))
    }

    fn wait_until(&self, deadline: Option<Instant>) -> Option<BarrierWaitResult> {
        crate::coop::spend();
        let mut st = self.state.lock();
        st.arrived += 1;
        if st.arrived >= self.parties {
            st.arrived = 0;
            let (st, wakes) = st.parts();
            st.waiters.wake_all(RELEASED, wakes);
            return Some(BarrierWaitResult(true));
        }
        match wait(
            st,
            |st| &mut st.waiters,
            (),
            deadline,
            WaitOn::Other("Barrier::wait"),
            || {},
            |st, token| {
                if token.is_none() {
                    // A cancelled fiber leaves the round it had not completed.
                    st.arrived -= 1;
                }
            },
        ) {
            Wait::Woken(_) => Some(BarrierWaitResult(false)),
            // Still queued, so its round is still open (the leader empties the queue when
            // it closes a round): take the arrival back.
            Wait::TimedOut(mut st) => {
                st.arrived -= 1;
                None
            }
        }
    }
}

// The internal state is consistent whenever user code runs: its lock is never held
// across a call out of this module.
impl UnwindSafe for Barrier {}
impl RefUnwindSafe for Barrier {}

impl fmt::Debug for Barrier {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Barrier")
            .field("parties", &self.parties)
            .finish_non_exhaustive()
    }
}

impl fmt::Debug for BarrierWaitResult {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BarrierWaitResult")
            .field("is_leader", &self.0)
            .finish()
    }
}
