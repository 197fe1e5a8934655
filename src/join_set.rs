//! [`JoinSet`]: a set of tasks joined in the order they finish.

use crate::dump::WaitOn;
use crate::fiber::FiberId;
use crate::join::{JoinError, JoinHandle};
use crate::sched::Scheduler;
use crate::sync::wait_queue::{wait, Guard, Lock, WaitList};
use std::collections::{HashMap, VecDeque};
use std::fmt;
use std::sync::Arc;

/// The token a finishing task wakes the set's waiter with.
const FINISHED: usize = 1;

struct Finished {
    ids: VecDeque<FiberId>,
    waiters: WaitList<()>,
}

/// A set of tasks, joined in the order they finish, like tokio's `JoinSet`.
///
/// [`spawn`](JoinSet::spawn) starts a task on the current scheduler (from a fiber; use
/// [`spawn_on`](JoinSet::spawn_on) from a plain thread); [`join_next`](JoinSet::join_next)
/// waits for whichever finishes first — suspending a fiber, blocking a thread — and returns
/// its result, `None` once the set is empty. Dropping the set cancels the tasks still in it
/// ([`JoinHandle::cancel`]), as [`cancel_all`](JoinSet::cancel_all) does; their results are
/// discarded.
///
/// ```
/// use std::time::Duration;
/// use fibra::JoinSet;
///
/// let sched = fibra::Scheduler::builder().threads(2).build().unwrap();
/// let order = sched.block_on(|| {
///     let mut set = JoinSet::new();
///     for ms in [30u64, 10, 20] {
///         set.spawn(move || {
///             fibra::sleep(Duration::from_millis(ms));
///             ms
///         });
///     }
///     let mut order = Vec::new();
///     while let Some(r) = set.join_next() {
///         order.push(r.unwrap());
///     }
///     order
/// });
/// assert_eq!(order, [10, 20, 30]);
/// ```
pub struct JoinSet<T> {
    tasks: HashMap<FiberId, JoinHandle<T>>,
    finished: Arc<Lock<Finished>>,
}

impl<T> Default for JoinSet<T> {
    fn default() -> Self {
        JoinSet::new()
    }
}

impl<T> JoinSet<T> {
    /// An empty set.
    pub fn new() -> JoinSet<T> {
        JoinSet {
            tasks: HashMap::new(),
            finished: Arc::new(Lock::new(Finished {
                ids: VecDeque::new(),
                waiters: WaitList::new(),
            })),
        }
    }

    /// How many tasks are in the set: spawned and not yet returned by a `join_next`.
    pub fn len(&self) -> usize {
        self.tasks.len()
    }

    /// Whether the set holds no task.
    pub fn is_empty(&self) -> bool {
        self.tasks.is_empty()
    }

    /// Cancels every task in the set ([`JoinHandle::cancel`]). They stay in the set: each
    /// is still returned by `join_next`, cancelled (or with its value, if it finished first).
    pub fn cancel_all(&mut self) {
        for h in self.tasks.values() {
            h.cancel();
        }
    }
}

impl<T: Send + 'static> JoinSet<T> {
    /// Starts `f` as a fiber of the scheduler whose fiber calls this (see [`crate::spawn`]),
    /// and adds it to the set. Returns the task's id.
    ///
    /// # Panics
    /// Outside a fiber of a scheduler; use [`spawn_on`](JoinSet::spawn_on) there.
    #[track_caller]
    pub fn spawn<F>(&mut self, f: F) -> FiberId
    where
        F: FnOnce() -> T + Send + 'static,
    {
        self.insert(crate::spawn(f))
    }

    /// Starts `f` as a fiber of `sched` and adds it to the set; works from any thread. If
    /// `sched` refuses new work, the task is in the set, cancelled.
    #[track_caller]
    pub fn spawn_on<F>(&mut self, sched: &Scheduler, f: F) -> FiberId
    where
        F: FnOnce() -> T + Send + 'static,
    {
        self.insert(sched.spawn(f))
    }

    fn insert(&mut self, h: JoinHandle<T>) -> FiberId {
        let id = h.id();
        let finished = self.finished.clone();
        h.on_complete(move || {
            let mut g = finished.lock();
            g.ids.push_back(id);
            let (st, wakes) = g.parts();
            st.waiters.wake_front(FINISHED, wakes);
        });
        self.tasks.insert(id, h);
        id
    }

    /// Waits for the next task to finish and returns its result (a cancelled or panicked
    /// task's too); `None` if the set is empty. Inside a fiber only the fiber waits.
    pub fn join_next(&mut self) -> Option<Result<T, JoinError>> {
        self.join_next_with_id().map(|(_, r)| r)
    }

    /// [`join_next`](JoinSet::join_next), with the finished task's id.
    pub fn join_next_with_id(&mut self) -> Option<(FiberId, Result<T, JoinError>)> {
        crate::coop::spend();
        loop {
            if self.tasks.is_empty() {
                return None;
            }
            let g = self.finished.lock();
            match g.ids.front() {
                Some(&id) => {
                    drop(g);
                    // A task queues its id from its last continuation, a moment before it
                    // is marked finished. Wait for that with the id still queued and the
                    // handle still in the set: if this wait is cancelled, nothing is lost.
                    if let Some(h) = self.tasks.get(&id) {
                        h.wait_finished();
                    }
                    if let Some(r) = self.take_front(id) {
                        return Some(r);
                    }
                }
                None => {
                    let _ = wait(
                        g,
                        |st| &mut st.waiters,
                        (),
                        None,
                        WaitOn::Other("JoinSet::join_next"),
                        || {},
                        pass_on,
                    );
                }
            }
        }
    }

    /// Returns the result of a task that has finished, if any, without waiting. A task that
    /// is finishing at this very moment is left to the next call.
    pub fn try_join_next(&mut self) -> Option<Result<T, JoinError>> {
        crate::coop::spend();
        loop {
            let id = *self.finished.lock().ids.front()?;
            if self.tasks.get(&id).is_some_and(|h| !h.is_finished()) {
                return None;
            }
            if let Some(r) = self.take_front(id) {
                return Some(r.1);
            }
        }
    }

    /// Waits for every task, in the order they finish, and returns their results.
    pub fn join_all(mut self) -> Vec<Result<T, JoinError>> {
        let mut all = Vec::with_capacity(self.len());
        while let Some(r) = self.join_next() {
            all.push(r);
        }
        all
    }

    /// Takes the finished task `id`, the front of the queue, out of the queue and the set,
    /// with its result; nothing here suspends, so a cancellation cannot drop the result
    /// halfway. `None` if it had already left the set.
    fn take_front(&mut self, id: FiberId) -> Option<(FiberId, Result<T, JoinError>)> {
        let popped = self.finished.lock().ids.pop_front();
        debug_assert_eq!(popped, Some(id), "only `&mut self` pops the queue");
        let h = self.tasks.remove(&id)?;
        Some((id, h.into_finished()))
    }
}

/// A waiter of `join_next` unwound (cancelled) after a finishing task picked it: the next
/// waiter, if any, gets the wake-up instead. The finished id itself stays queued.
fn pass_on(g: &mut Guard<'_, Finished>, token: Option<usize>) {
    if token.is_some() {
        let (st, wakes) = g.parts();
        st.waiters.wake_front(FINISHED, wakes);
    }
}

impl<T> Drop for JoinSet<T> {
    /// Cancels the tasks still in the set; their results are dropped when they finish.
    fn drop(&mut self) {
        self.cancel_all();
    }
}

impl<T> fmt::Debug for JoinSet<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("JoinSet").field("len", &self.len()).finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Mutex;

    /// Queues `id` as finished, as a finishing task's continuation does just before the task
    /// is marked finished: the moment a `join_next` can find it.
    fn queue_early(set: &JoinSet<u32>, id: FiberId) {
        set.finished.lock().ids.push_back(id);
    }

    #[test]
    fn a_join_next_cancelled_while_its_task_finishes_loses_nothing() {
        let sched = Scheduler::builder().threads(1).build().unwrap();
        sched.start();
        let (tx, rx) = crate::sync::oneshot::channel::<()>();
        let set = Arc::new(Mutex::new(JoinSet::new()));
        let id = set.lock().unwrap().spawn_on(&sched, move || {
            let _ = rx.recv();
            7u32
        });
        queue_early(&set.lock().unwrap(), id);
        assert!(
            set.lock().unwrap().try_join_next().is_none(),
            "try_join_next does not wait for a task that is finishing"
        );
        let waiter = {
            let set = set.clone();
            sched.spawn(move || set.lock().unwrap().join_next().map(|r| r.ok()))
        };
        // Both fibers park: the task in `recv`, the waiter in `join_next`.
        let start = std::time::Instant::now();
        while sched.metrics().workers()[0].parks() < 2 {
            assert!(start.elapsed().as_secs() < 30, "the fibers never parked");
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        waiter.cancel();
        assert!(waiter.join().unwrap_err().is_cancelled());
        let mut set = set.lock().unwrap_or_else(|e| e.into_inner());
        assert_eq!(set.len(), 1, "the task is still in the set");
        tx.send(()).unwrap();
        let (got, r) = set.join_next_with_id().unwrap();
        assert_eq!((got, r.unwrap()), (id, 7));
        assert!(set.join_next().is_none());
    }
}
