//! A fiber's life on its home worker: its start (a stack, a coroutine, a place in the
//! registry), every resumption and what the fiber asks when it comes back (a yield, a park,
//! its end), the delivery of `JoinHandle::cancel` to a started fiber, and its end. It
//! touches this worker's registry, stack pool, timers and ready queue, and the home-only
//! state of the fibers homed here. A park goes on in the park protocol
//! (`crate::park::protocol`), which calls back the narrow methods at the end of this module.

use super::shutdown::Phase;
use super::{Worker, FORKED};
use crate::fiber::{self, fiber_root, Coro, FiberMeta, Outcome, Resume, Suspend, Yielder};
use crate::join::JoinError;
use crate::park::protocol;
use crate::sched::cell::TaskArc;
use crate::sched::task::{Cancel, Ended, HomeOnly, Placement, ScheduleTask, Start, Task, TaskRef};
use crate::sched::timers::TimerId;
use crate::sched::watchdog;
use crate::stack::FiberStack;
use std::cell::Cell;
use std::mem::ManuallyDrop;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Instant;

/// At most this many cache lines of a task's cell are prefetched when it starts.
const CELL_LINES: usize = 12;

/// The worker's reference to the fiber it resumes: counted, or an alias of the registry's.
pub(super) enum ResumeRef {
    /// A counted reference of the worker's own: the one a run queue held (and that moves
    /// on to `ready`, an `Unparker` or `finish`).
    Counted(TaskRef),
    /// A new task's first run: the registry's reference, aliased without a count. A
    /// reference of its own is cloned only if the fiber suspends; a task that ends in its
    /// first run (most short ones) has its count touched once, by the registry's drop,
    /// instead of three times (a clone for the registry, and two drops).
    RegistryAlias(ManuallyDrop<TaskRef>),
}

impl ResumeRef {
    /// An alias of `task`'s reference.
    ///
    /// # Safety
    /// `task` goes into the registry before the alias is used, and stays there until `finish`
    /// has made its last use of the alias (it keeps the unregistered reference to the end).
    #[inline(always)]
    unsafe fn alias_of_registered(task: &TaskRef) -> ResumeRef {
        // SAFETY: an alias that is never dropped (`ManuallyDrop`), so it takes back nothing;
        // per the caller, the cell outlives it.
        ResumeRef::RegistryAlias(ManuallyDrop::new(unsafe {
            TaskArc::from_raw(TaskArc::cell_ptr(task))
        }))
    }

    /// A reference of the worker's own: the one it holds, or a new one.
    #[inline(always)]
    fn into_owned(self) -> TaskRef {
        match self {
            ResumeRef::Counted(task) => task,
            ResumeRef::RegistryAlias(alias) => TaskRef::clone(&alias),
        }
    }
}

impl std::ops::Deref for ResumeRef {
    type Target = TaskRef;

    #[inline(always)]
    fn deref(&self) -> &TaskRef {
        match self {
            ResumeRef::Counted(task) => task,
            ResumeRef::RegistryAlias(alias) => alias,
        }
    }
}

/// Threads between their check that a task is not done and their last touch of its home
/// worker in `cancel_started`, across every scheduler (cancels are rare); `Shared`'s
/// destructor waits them out.
pub(super) static CANCELLERS: AtomicUsize = AtomicUsize::new(0);

/// `JoinHandle::cancel` of a started task: its home worker delivers it, between fibers (see
/// `Worker::deliver_cancel`). A task not done yet keeps its scheduler's shared state alive
/// (see `park::protocol::unpark_fiber`), and from our check on `CANCELLERS` keeps that state's destructor
/// waiting: it comes after the task's completion, which comes after our check in the SeqCst
/// order, so it sees our count.
pub(crate) fn cancel_started(task: TaskRef) {
    CANCELLERS.fetch_add(1, Ordering::SeqCst);
    let h = task.header();
    if !h.is_done_seqcst() {
        // SAFETY: the task has started, so its placement was written before the STARTED
        // bit our caller saw (Acquire), and the shared state is alive (see above).
        let (sched, worker) = unsafe {
            let p = &*h.placement.get();
            (&*p.sched, p.worker)
        };
        let target = &sched.workers[worker];
        target.inbox.push(ScheduleTask::Cancel(task));
        target.sleep.wake();
    }
    CANCELLERS.fetch_sub(1, Ordering::SeqCst);
}

impl Worker {
    /// Gives an unstarted task a fiber homed on this worker and runs it.
    pub(super) fn start(&self, task: TaskRef) {
        // A task is often made on another thread (a spawner, a peer whose queue it came
        // from) or long ago, so its cell (about 8 lines, most of them the header) is in
        // another core's cache or out of this one's. Ask for all of it at once rather than a
        // line at each first touch, one miss after another. (The size comes from the
        // vtable; the line before the value holds the counts.) For a cell made here just
        // before, these are hits, a few cycles.
        let value: *const dyn Task = TaskArc::as_ptr(&task);
        let len = std::mem::size_of_val::<dyn Task>(&*task);
        crate::sys::prefetch(value.cast::<u8>().wrapping_sub(64), len + 64, CELL_LINES);
        if self.phase.get() >= Phase::Discarding {
            self.start_failed(task, JoinError::cancelled());
            return;
        }
        let stack = self.stacks.borrow_mut().take(task.header().stack_size);
        match stack {
            Ok(stack) => self.launch(task, stack, Start::Run),
            Err(e) => self.start_failed(task, JoinError::no_stack(e)),
        }
    }

    /// A task that will not run: its failure is published inside a fiber of the default
    /// stack size, so its continuations may wait like any fiber code; if not even that
    /// stack can be had, from here.
    pub(super) fn start_failed(&self, task: TaskRef, err: JoinError) {
        let stack = self.stacks.borrow_mut().take(self.shared.config.stack_size);
        match stack {
            Ok(stack) => self.launch(task, stack, Start::Fail(err)),
            Err(_) => {
                if err.is_cancelled() {
                    self.shared.cancelled.fetch_add(1, Ordering::Relaxed);
                }
                task.fail(err);
                self.stats().finished.add(1);
                self.shared.task_done(Some(self.index));
            }
        }
    }

    /// Creates the task's fiber on `stack`, homed here, and runs it.
    fn launch(&self, task: TaskRef, stack: FiberStack, start: Start) {
        // SAFETY: the task was just taken from a queue and has never run, so this worker is
        // its only owner; no Unparker for it exists yet, and it is published (to unparkers,
        // via the park word) only after this write.
        unsafe {
            *task.header().placement.get() = Placement {
                sched: Arc::as_ptr(&self.shared),
                worker: self.index,
            }
        };
        let start = match start {
            // `JoinHandle::cancel` before the start: the body never runs.
            Start::Run if task.header().mark_started() => Start::Fail(JoinError::cancelled()),
            Start::Run => Start::Run,
            fail => {
                task.header().mark_started();
                fail
            }
        };
        let home = self.home(&*task);
        home.meta.worker = Some(self.index);
        home.meta.set_stack(&stack);
        // Raw pointers for the fiber, to the metadata (read while it runs) and its `ended`,
        // taken from the cell itself rather than from a `&mut` that a later `home` call
        // would invalidate.
        let cell = task.header().home.get();
        // SAFETY: only place projections: `cell` points to the live home state in `task`.
        let (meta, ended): (*const FiberMeta, *mut Ended) =
            unsafe { (&raw const (*cell).meta, &raw mut (*cell).ended) };
        let job_ptr: *const dyn Task = TaskArc::as_ptr(&task);
        let coro = Coro::with_stack(stack, move |y: &Yielder, first: Resume| {
            fiber_root(meta, y, first, move || {
                // SAFETY: the registry holds an Arc to the task until the fiber has ended; the
                // fiber runs on its home thread, where nothing else touches `ended` while it
                // runs (see `Worker::home`).
                unsafe { *ended = (*job_ptr).run(start) };
            })
        });
        let held = {
            let mut registry = self.registry.borrow_mut();
            let home = self.home(&*task);
            home.fiber = Some(coro);
            home.slot = registry.len();
            // SAFETY: the registry holds `task`'s reference from here until `finish`, which
            // outlives every use of the alias (see `ResumeRef`).
            let held = unsafe { ResumeRef::alias_of_registered(&task) };
            registry.push(task);
            self.stats().fibers.set(registry.len() as u64);
            held
        };
        self.resume(held);
    }

    /// Switches to a fiber homed here and acts on what it asks when it comes back.
    #[inline(always)]
    pub(super) fn resume(&self, task: ResumeRef) {
        let home = self.home(&**task);
        if let Some(id) = home.timer.take() {
            // Woken before its deadline: the timer can never fire for this park.
            let mut timers = self.timers.borrow_mut();
            timers.remove(id);
            self.stats().timers.set(timers.len() as u64);
        }
        let timed_out = std::mem::take(&mut home.timed_out);
        if timed_out {
            self.timer_woken
                .set(self.timer_woken.get().saturating_sub(1));
        }
        home.meta.budget.set(fiber::BUDGET);
        let input = if let Some(p) = home.pending_panic.take() {
            Resume::Panic(Box::new(p))
        } else if home.cancel == Cancel::Requested {
            home.cancel = Cancel::Delivered;
            Resume::Cancel
        } else if timed_out {
            Resume::TimedOut
        } else {
            Resume::Run
        };
        let header = task.header();
        header.park.begin_run();
        let meta: *const FiberMeta = &home.meta;
        let coro = home.fiber.as_mut().expect("a queued fiber has a coroutine");
        watchdog::enter(&self.stats().current, header);
        #[cfg(feature = "tracing")]
        let span = header.span.enter();
        let prev = fiber::enter(meta);
        let result = coro.resume(input);
        fiber::leave(prev);
        #[cfg(feature = "tracing")]
        drop(span);
        match result {
            corosensei::CoroutineResult::Yield(Suspend::Yield) => {
                self.ready.borrow_mut().push_back(task.into_owned());
                self.yielded.set(true);
                self.stats().yields.add(1);
            }
            corosensei::CoroutineResult::Yield(Suspend::Park(request)) => {
                // SAFETY: the request lives on the suspended fiber's stack, which stays
                // valid and untouched until the fiber resumes, after `protocol::publish`.
                let request = unsafe { request.as_ref() };
                protocol::publish(self, task.into_owned(), request);
            }
            corosensei::CoroutineResult::Return(outcome) => self.finish(task, outcome),
        }
    }

    /// `JoinHandle::cancel` of a fiber homed here: it unwinds at its next resumption, and a
    /// parked one is woken for it — as `stop_timeout` cancels, once. Runs between fibers,
    /// so the fiber is parked, ready, or finished.
    pub(super) fn deliver_cancel(&self, task: &TaskRef) {
        let home = self.home(&**task);
        if home.fiber.is_none() || home.cancel != Cancel::No {
            return;
        }
        home.cancel = Cancel::Requested;
        if let Some(gen) = task.header().park.parked() {
            protocol::wake_at_home(self, task, gen);
        }
    }

    /// Takes a fiber out of the registry.
    fn unregister(&self, task: &TaskRef) -> TaskRef {
        let slot = self.home(&**task).slot;
        let mut registry = self.registry.borrow_mut();
        let removed = registry.swap_remove(slot);
        self.stats().fibers.set(registry.len() as u64);
        if let Some(moved) = registry.get(slot) {
            self.home(&**moved).slot = slot;
        }
        removed
    }

    /// A fiber ended: recycle its stack, forget it, count it out.
    #[inline(never)]
    fn finish(&self, task: ResumeRef, outcome: Outcome) {
        if FORKED.with(Cell::get) {
            // SAFETY: ends the process at once (see `forked_in_child`).
            unsafe {
                libc::_exit(if matches!(outcome, Outcome::Done) {
                    0
                } else {
                    101
                })
            };
        }
        let home = self.home(&**task);
        let (coro, ended) = (home.fiber.take(), home.ended);
        if let Some(coro) = coro {
            self.stacks.borrow_mut().give(coro.into_stack());
        }
        // Nobody may still be reading the header from another thread when we drop our
        // references below (see `Watch::peek`).
        self.own_shared().watch.retire(&self.stats().current);
        // Kept to the end: `task` may be an alias of it.
        let registered = self.unregister(&task);
        self.stats().finished.add(1);
        self.stats().returned.add(1);
        // The task's body publishes its own result and catches every unwind; the fiber root
        // sees an unwind only if the very first resumption cancels, which `start` never does.
        let cancelled = match outcome {
            Outcome::Done => ended == Ended::Cancelled,
            Outcome::Panicked(p) => {
                task.fail(JoinError::panic(p));
                false
            }
            Outcome::Cancelled => {
                task.fail(JoinError::cancelled());
                true
            }
        };
        // Only the shutdown's cancellations count (`stop_timeout` returns them), not those
        // of `JoinHandle::cancel`.
        if cancelled && self.phase.get() >= Phase::Discarding {
            self.shared.cancelled.fetch_add(1, Ordering::Relaxed);
        }
        self.shared.task_done(Some(self.index));
        drop(task);
        drop(registered);
    }
}

/// What the park protocol (`crate::park::protocol`) asks of a fiber's home worker: the
/// narrow calls it makes while it publishes a park and when it queues a woken fiber.
impl Worker {
    /// Queues a fiber of this worker woken on this worker (whoever won its wake).
    #[inline]
    pub(crate) fn push_woken(&self, task: TaskRef) {
        self.ready.borrow_mut().push_back(task);
        self.stats().local_wakes.add(1);
    }

    /// Notes a park of `task`, which has just switched out: when (for the dump, with the
    /// park's `deadline`), and one park more in the counters. Returns the fiber's home-only
    /// state.
    #[inline(always)]
    pub(crate) fn note_parked<'j>(
        &self,
        task: &'j TaskRef,
        deadline: Option<Instant>,
    ) -> &'j mut HomeOnly {
        let home = self.home(&**task);
        // The coarse clock (a read of the vDSO's page, a few ns): a reading cached for
        // several passes was behind by as long as the fibers between ran.
        home.since = crate::sys::coarse_ns();
        home.deadline = deadline;
        self.stats().parks.add(1);
        home
    }

    /// Files the timer of a park with a deadline: at `deadline` it wakes `task` from park
    /// generation `gen`, unless something else woke it first (see `fire_timers`).
    #[inline(always)]
    pub(crate) fn arm_timer(&self, deadline: Instant, task: TaskRef, gen: u64) -> TimerId {
        let mut timers = self.timers.borrow_mut();
        let id = timers.insert(deadline, (task, gen));
        self.stats().timers.set(timers.len() as u64);
        id
    }

    /// The registry's reference to the fiber in slot `slot`.
    pub(crate) fn registered(&self, slot: usize) -> TaskRef {
        self.registry.borrow()[slot].clone()
    }
}
