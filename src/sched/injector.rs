//! The scheduler's shared queue of unstarted tasks that no worker holds: submissions from
//! outside the scheduler, and the overflow of workers' full stealable queues.
//!
//! A worker whose stealable queue (256 places) is full moves half of it here, like Go's
//! `runqputslow`, and a fiber that spawns thousands in a row moves almost all of them that
//! way. The overflow goes into a list of its own under a lock, the whole half in one
//! locking: pushed one task at a time into a `SegQueue`, each would cost five locked
//! instructions on top of the stealable queue's own (the pop out of it, two for the push
//! here, two for the pop from here). Tasks leave it one at a time, in order.
//!
//! The whole half does not go into the taker's stealable queue at once (as Go and tokio
//! take batches from their global queues): the taker would start those tasks next to the
//! fibers they spawn, so in a tree of spawns and joins (`skynet`) many more fibers would be
//! alive at once, and the tree would run slower. One at a time, an overflowed task starts
//! only when its taker has nothing else to run, or at its periodic look here.

use super::task::TaskRef;
use super::worker::pop;
use crate::sys::spin::SpinLock;
use crossbeam_queue::SegQueue;
use std::collections::VecDeque;
use std::sync::atomic::{AtomicUsize, Ordering};

pub(crate) struct Injector {
    /// Tasks submitted from outside the scheduler.
    tasks: SegQueue<TaskRef>,
    /// The overflow of full stealable queues, oldest first.
    spill: SpinLock<VecDeque<TaskRef>>,
    /// How many tasks `spill` holds: written under its lock, read without (an empty look
    /// takes no lock).
    spilled: AtomicUsize,
}

impl Injector {
    pub(crate) fn new() -> Injector {
        Injector {
            tasks: SegQueue::new(),
            spill: SpinLock::new(VecDeque::new()),
            spilled: AtomicUsize::new(0),
        }
    }

    /// Queues one task.
    pub(crate) fn push(&self, task: TaskRef) {
        self.tasks.push(task);
    }

    /// Queues the overflow of a stealable queue, oldest first, in one locking; leaves
    /// `batch` empty (its allocation is the caller's to reuse).
    pub(crate) fn spill(&self, batch: &mut Vec<TaskRef>) {
        if batch.is_empty() {
            return;
        }
        let mut spill = self.spill.lock();
        spill.extend(batch.drain(..));
        // Under the lock, so a plain store: no lost update.
        self.spilled.store(spill.len(), Ordering::Relaxed);
    }

    /// Whether nothing is queued (racy, as any queue's).
    pub(crate) fn is_empty(&self) -> bool {
        self.tasks.is_empty() && self.spilled.load(Ordering::Relaxed) == 0
    }

    /// How many tasks are queued (racy).
    pub(crate) fn len(&self) -> usize {
        self.tasks.len() + self.spilled.load(Ordering::Relaxed)
    }

    /// Takes one task. `spill_first` says which kind to look at first: callers alternate it,
    /// so that neither a stream of outside submissions nor a deep overflow keeps the other
    /// waiting.
    pub(crate) fn pop(&self, spill_first: bool) -> Option<TaskRef> {
        if spill_first {
            self.unspill().or_else(|| pop(&self.tasks))
        } else {
            pop(&self.tasks).or_else(|| self.unspill())
        }
    }

    fn unspill(&self) -> Option<TaskRef> {
        if self.spilled.load(Ordering::Relaxed) == 0 {
            return None;
        }
        let mut spill = self.spill.lock();
        let task = spill.pop_front();
        self.spilled.store(spill.len(), Ordering::Relaxed);
        task
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use crate::sched::task::Header;
    use crate::sched::task_cell::TaskCell;
    use std::collections::HashSet;
    use std::panic::Location;

    fn task() -> TaskRef {
        TaskCell::new_pair(|| {}, || Header::new(None, 0, None, Location::caller())).1
    }

    fn id(task: &TaskRef) -> crate::FiberId {
        task.header().id
    }

    #[test]
    fn overflow_leaves_in_order_taking_turns_with_outside_tasks() {
        let inj = Injector::new();
        let mut batch: Vec<TaskRef> = (0..3).map(|_| task()).collect();
        let spilled: Vec<_> = batch.iter().map(id).collect();
        inj.spill(&mut batch);
        assert!(batch.is_empty(), "the batch is taken");
        inj.spill(&mut batch);
        let outside = task();
        let outside_id = id(&outside);
        inj.push(outside);
        assert_eq!(inj.len(), 4);
        assert_eq!(inj.pop(true).map(|j| id(&j)), Some(spilled[0]));
        assert_eq!(inj.pop(false).map(|j| id(&j)), Some(outside_id));
        assert_eq!(
            inj.pop(false).map(|j| id(&j)),
            Some(spilled[1]),
            "then the spill"
        );
        assert_eq!(inj.pop(true).map(|j| id(&j)), Some(spilled[2]));
        assert_eq!(inj.len(), 0);
        assert!(inj.is_empty() && inj.pop(true).is_none());
    }

    /// Threads spilling and pushing while others take: every task comes out once.
    #[test]
    fn concurrent_spills_pushes_and_takes_lose_nothing() {
        const PER_THREAD: usize = 5_000;
        let inj = std::sync::Arc::new(Injector::new());
        let pushers: Vec<_> = (0..2)
            .map(|t| {
                let inj = inj.clone();
                std::thread::spawn(move || {
                    let mut ids = Vec::new();
                    let mut batch = Vec::new();
                    for i in 0..PER_THREAD {
                        let task = task();
                        ids.push(id(&task));
                        if t == 0 && i % 3 == 0 {
                            inj.push(task);
                        } else {
                            batch.push(task);
                            if batch.len() == 7 {
                                inj.spill(&mut batch);
                            }
                        }
                    }
                    inj.spill(&mut batch);
                    ids
                })
            })
            .collect();
        let done = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let takers: Vec<_> = (0..2)
            .map(|_| {
                let (inj, done) = (inj.clone(), done.clone());
                std::thread::spawn(move || {
                    let mut got = Vec::new();
                    let mut turn = false;
                    loop {
                        let finished = done.load(Ordering::Acquire);
                        turn = !turn;
                        match inj.pop(turn) {
                            Some(task) => got.push(id(&task)),
                            None if finished => break,
                            None => {}
                        }
                    }
                    got
                })
            })
            .collect();
        let mut pushed = HashSet::new();
        for p in pushers {
            pushed.extend(p.join().expect("pusher"));
        }
        done.store(true, Ordering::Release);
        let mut got = Vec::new();
        for t in takers {
            got.extend(t.join().expect("taker"));
        }
        assert_eq!(got.len(), 2 * PER_THREAD, "each task once");
        assert_eq!(got.into_iter().collect::<HashSet<_>>(), pushed);
        assert_eq!(inj.len(), 0);
        assert!(inj.is_empty());
    }
}
