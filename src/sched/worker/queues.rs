//! The run queues of a worker: taking work from them (its own `next` slot, stealable queue
//! and inbox, the shared injector, a peer's stealable queue) and queueing unstarted tasks on
//! them. It touches this worker's queues and reads its peers' (`local`, their load gauges);
//! the order in which a pass looks at the queues is `run`'s (`next_task`), the `next` slot's
//! requests for help are `help`'s.
//!
//! Each worker has four queues:
//! - `ready` — started fibers of this worker that may run (yielded, or woken from this
//!   thread). Owner only, no synchronisation.
//! - `next` — the task a fiber of this worker spawned last (a LIFO slot, like Go's `runnext`
//!   and tokio's LIFO slot). It runs as soon as the spawning fiber suspends, while what it
//!   shares with its parent is still in cache, and a chain of spawns or a ping-pong pair stays
//!   on one worker instead of bouncing between cores. At most `MAX_NEXT_STREAK` tasks in a
//!   row come from it, so it cannot starve the other queues. A spinning peer takes it only
//!   when this worker has run one fiber for `NEXT_STEAL_AFTER` (its spawner keeps running;
//!   see `push_next` and docs/design.md, "Fairness"). A `TaskSlot`: one atomic swap to put
//!   a task in (getting the displaced one back) or take it out.
//! - `local` — unstarted tasks submitted from this worker's fibers (what `next` displaced).
//!   A bounded lock-free queue (`ArrayQueue`) so idle peers can steal from it; on overflow
//!   half moves to the injector, in one go (see `push_local`).
//! - `inbox` — anything other threads send this worker: wakes of its parked fibers and tasks
//!   pinned to it (`SegQueue`, any thread pushes). Nothing ever scans for pinned entries.
//!
//! Plus one shared `injector` for unpinned tasks submitted from outside the scheduler.
//! Only unstarted tasks move between workers; a started fiber runs on its home worker until
//! it ends (docs/design.md, "Principles").

use super::Worker;
use crate::sched::task::{ScheduleTask, TaskRef};
use crossbeam_queue::{ArrayQueue, SegQueue};
use std::cell::Cell;

/// Capacity of a worker's stealable queue of unstarted tasks.
pub(super) const LOCAL_CAPACITY: usize = 256;
/// Up to this many live fibers a worker takes outside submissions at a yield without looking
/// at its peers' loads (see `least_loaded`).
const FEW_FIBERS: u64 = 8;
/// A worker that has not run out of its own work for this many passes takes a share of a
/// busier peer's unstarted tasks (see `Worker::rebalance`).
pub(super) const REBALANCE_AFTER: u32 = 128;

/// Pops from a `SegQueue`, looking first: crossbeam's `pop` issues a SeqCst fence when it
/// finds the queue empty, and an empty inbox or injector is the common case on the hot path.
/// A push racing with the look is found on the next pass; sleeping is guarded separately by
/// the idle protocol's fences.
#[inline]
pub(in crate::sched) fn pop<T>(q: &SegQueue<T>) -> Option<T> {
    if q.is_empty() {
        None
    } else {
        q.pop()
    }
}

/// [`pop`] for the bounded local queue, whose `pop` fences on empty likewise.
#[inline]
fn pop_local<T>(q: &ArrayQueue<T>) -> Option<T> {
    if q.is_empty() {
        None
    } else {
        q.pop()
    }
}

/// Pops a queue of this worker's that only it pushes to, unless `maybe` says it has found it
/// empty since its last push; clears `maybe` when it finds it empty.
#[inline]
fn pop_own<T>(maybe: &Cell<bool>, pop: impl FnOnce() -> Option<T>) -> Option<T> {
    if !maybe.get() {
        return None;
    }
    let item = pop();
    if item.is_none() {
        maybe.set(false);
    }
    item
}

impl Worker {
    /// Pops this worker's `next` slot, unless it is known empty.
    #[inline]
    pub(super) fn pop_next(&self) -> Option<TaskRef> {
        pop_own(&self.next_maybe, || self.own_shared().next.0.take())
    }

    /// Pops this worker's stealable queue, unless it is known empty.
    #[inline]
    pub(super) fn pop_own_local(&self) -> Option<TaskRef> {
        pop_own(&self.local_maybe, || pop_local(&self.own_shared().local))
    }

    /// Pops the inbox, counting the wakes of fibers that came from other threads.
    #[inline(always)]
    pub(super) fn pop_inbox(&self) -> Option<ScheduleTask> {
        let task = pop(&self.own_shared().inbox)?;
        if matches!(task, ScheduleTask::Resume(_)) {
            self.stats().remote_wakes.add(1);
        }
        Some(task)
    }

    /// Whether no peer has fewer live fibers than this worker, less one (as each last
    /// published): only then does a yield pull an outside submission ahead of the fibers
    /// ready here. A started fiber never moves, so where outside submissions start is all the
    /// balancing they get; without this, whichever worker yields more often would take most
    /// of a burst of yielding fibers submitted from a plain thread. The pull every
    /// `INJECTOR_INTERVAL` passes and an idle
    /// worker's take are unconditional, so outside work never starves.
    ///
    /// A worker with at most `FEW_FIBERS` counts as least loaded whatever its peers run: a
    /// small group submitted together (producers and consumers of one channel, say) then
    /// starts on one worker, where they hand over to each other without cross-thread wakes,
    /// at a fraction of the cost per message of the same group spread over two workers.
    #[inline]
    pub(super) fn least_loaded(&self) -> bool {
        let mine = self.registry.borrow().len() as u64;
        mine <= FEW_FIBERS
            || self
                .shared
                .workers
                .iter()
                .all(|w| w.stats.0.fibers.get() + 1 >= mine)
    }

    /// Takes a task submitted from outside, or one that a full stealable queue moved out
    /// (see `Injector`). If more wait, gets another idle worker looking (unless one spins
    /// already): a worker woken for the first of a batch must not end up starting them all,
    /// since a started fiber never moves (Go's spinning-M handoff).
    pub(super) fn take_injected(&self) -> Option<TaskRef> {
        let spill_first = !self.spill_first.get();
        self.spill_first.set(spill_first);
        let task = self.shared.injector.pop(spill_first)?;
        self.stats().injected.add(1);
        if !self.shared.injector.is_empty() {
            self.shared.notify_one();
        }
        Some(task)
    }

    /// Takes a task from a random peer's stealable queue, and up to half of the rest.
    pub(super) fn steal(&self) -> Option<ScheduleTask> {
        let workers = &self.shared.workers;
        let n = workers.len();
        if n == 1 {
            return None;
        }
        // xorshift: cheap, good enough to spread victims.
        let mut x = self.rng.get();
        x ^= x << 13;
        x ^= x >> 17;
        x ^= x << 5;
        self.rng.set(x);
        let start = x as usize % n;
        for k in 0..n {
            let v = (start + k) % n;
            if v == self.index {
                continue;
            }
            if let Some(first) = self.steal_from(v) {
                return Some(ScheduleTask::Start(first));
            }
        }
        None
    }

    /// Takes a task from peer `v`'s stealable queue and half of the rest into this worker's.
    #[inline]
    fn steal_from(&self, v: usize) -> Option<TaskRef> {
        let victim = &self.shared.workers[v].local;
        let available = victim.len();
        let first = pop_local(victim)?;
        let mut taken = 1;
        if available > 1 {
            // Half of the rest comes here below.
            self.local_maybe.set(true);
        }
        for _ in 0..available / 2 {
            let Some(task) = victim.pop() else { break };
            taken += 1;
            if let Err(task) = self.own_shared().local.push(task) {
                self.shared.injector.push(task);
            }
        }
        self.stats().steals.add(taken);
        Some(first)
    }

    /// A busy worker's share of a peer's burst: while this worker's own stealable queue is
    /// empty, it takes half of the unstarted tasks queued on a peer that runs more fibers
    /// than it does (and more than a small group's `FEW_FIBERS`). An idle worker steals
    /// anyway; this is for one kept busy by a few fibers of its own, which otherwise
    /// would look at its peers only once they were done, while the peer started the rest of
    /// the burst itself, and started fibers never move (pairs spawned by one fiber, in
    /// `ping_pong_mpsc`'s shape, would end up mostly on the spawner's worker).
    ///
    /// Called only by a worker that has not run dry for `REBALANCE_AFTER` passes: one that
    /// did lately looks at its peers when it does again, and so does one without ready
    /// fibers, soon. Only one that has kept busy for a while reads its peers' queues and
    /// gauges here: those lines move with every spawn and start of theirs, and reading them
    /// often slows down workloads whose workers run dry all the time (`ping_pong`). Out of
    /// line: it is rarely called, and its call inlined into the loop changes the hot loop's
    /// code layout, which alone slows down workloads that never get this far (`spawn_many`).
    #[cold]
    #[inline(never)]
    pub(super) fn rebalance(&self) {
        if self.ready.borrow().is_empty() || !self.own_shared().local.is_empty() {
            return;
        }
        let mine = self.registry.borrow().len() as u64;
        for (v, peer) in self.shared.workers.iter().enumerate() {
            // The queue first: its lines move only with its pushes and pops, where the
            // gauge shares a line with counters its worker writes at every pass.
            if v != self.index && peer.local.len() > 1 && {
                let theirs = peer.stats.0.fibers.get();
                theirs > FEW_FIBERS && theirs > mine + 1
            } {
                if let Some(first) = self.steal_from(v) {
                    self.push_local(first);
                }
                return;
            }
        }
    }

    /// Queues an unstarted task on this worker's stealable queue.
    pub(super) fn push_local(&self, task: TaskRef) {
        self.local_maybe.set(true);
        if let Err(task) = self.own_shared().local.push(task) {
            // Full: move half to the injector, in one go, so peers can help (Go's
            // runqputslow).
            let mut batch = self.spill_buf.borrow_mut();
            batch.extend(
                std::iter::from_fn(|| self.own_shared().local.pop()).take(LOCAL_CAPACITY / 2),
            );
            batch.push(task);
            self.shared.injector.spill(&mut batch);
        }
    }
}
