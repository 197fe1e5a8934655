//! [`Barrier`]: `n` parties meet, then all go on; reusable, like std's.
//!
//! The arrival count and the waiters share the internal lock. The `n`-th arrival is the
//! leader: it resets the count for the next round and wakes the `n - 1` waiters (in arrival
//! order) without waiting itself.

use super::wait_queue::{wait, Lock, Wait, WaitList};
use std::fmt;
use std::panic::{RefUnwindSafe, UnwindSafe};

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

/// What [`Barrier::wait`] returns; like [`std::sync::BarrierWaitResult`].
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
        crate::coop::spend();
        let mut st = self.state.lock();
        st.arrived += 1;
        if st.arrived >= self.parties {
            st.arrived = 0;
            let (st, wakes) = st.parts();
            st.waiters.wake_all(RELEASED, wakes);
            return BarrierWaitResult(true);
        }
        match wait(
            st,
            |st| &mut st.waiters,
            (),
            None,
            || {},
            |st, token| {
                if token.is_none() {
                    // A cancelled fiber leaves the round it had not completed.
                    st.arrived -= 1;
                }
            },
        ) {
            Wait::Woken(_) => BarrierWaitResult(false),
            Wait::TimedOut(_) => unreachable!("barrier waits have no deadline"),
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
