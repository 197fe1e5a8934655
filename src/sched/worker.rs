//! The worker loop, run queues, idle protocol and shutdown.
//!
//! # Run queues
//! Each worker owns three queues:
//! - `ready` — started fibers of this worker that may run (yielded, or woken from this
//!   thread). Owner only, no synchronisation.
//! - `next` — the task a fiber of this worker spawned last (a LIFO slot, like Go's `runnext`
//!   and tokio's LIFO slot). It runs as soon as the spawning fiber suspends, while what it
//!   shares with its parent is still in cache, and a chain of spawns or a ping-pong pair stays
//!   on one worker instead of bouncing between cores. At most `MAX_NEXT_STREAK` tasks in a
//!   row come from it, so it cannot starve the other queues. Spinning peers may steal it.
//! - `local` — unstarted tasks submitted from this worker's fibers (what `next` displaced).
//!   A bounded lock-free queue (`ArrayQueue`) so idle peers can steal from it; on overflow
//!   half moves to the injector.
//! - `inbox` — anything other threads send this worker: wakes of its parked fibers and tasks
//!   pinned to it (`SegQueue`, any thread pushes). Nothing ever scans for pinned entries.
//!
//! Plus one shared `injector` for unpinned tasks submitted from outside the scheduler.
//! Only unstarted tasks move between workers; a started fiber runs on its home worker until
//! it ends (DESIGN principle 2).
//!
//! # One pass of the loop
//! Fire due timers (every few ticks), look at the injector first every `INJECTOR_INTERVAL`
//! ticks (so outside work cannot starve), then: `next` → inbox → ready/local (alternating, so
//! yielding fibers and new tasks share the thread fairly) → injector → steal half of a peer's
//! `local`.
//!
//! # Idle
//! With nothing to do a worker *spins* a little (at most half the workers spin at once),
//! looking at the injector and its peers. Then it announces itself in the `IdleSet`, issues a
//! SeqCst fence, looks once more, and sleeps on its futex until the next timer deadline, or
//! indefinitely. A submitter pushes, fences, and wakes one idle worker only if nobody is
//! spinning — the fences on both sides make sure that either the submitter sees the idle
//! worker or the worker sees the work (Go's protocol). Pinned work and fiber wakes unpark
//! their target worker directly. There is no periodic polling: an idle scheduler sleeps.
//!
//! # Shutdown
//! `live` counts tasks submitted and not yet finished. `stop()` moves the state to STOPPING
//! (outside submits are refused; fibers may still spawn children while they finish) and
//! waits until `live` reaches zero; every worker exits when it sees STOPPING and zero live
//! tasks. `stop_timeout` moves to CANCEL at its deadline: each worker fails its queued
//! unstarted tasks and resumes each of its live fibers with a cancellation that unwinds
//! the fiber's stack, running destructors on its home thread.

use crate::fiber::{self, fiber_root, Coro, FiberMeta, Outcome, Resume, Suspend, Yielder};
use crate::join::JoinError;
use crate::park::Unparker;
use crate::sched::idle::{IdleSet, Parker};
use crate::sched::task::{Job, Placement, ScheduleTask, PARKED, RUNNING, STATE_BITS, STATE_MASK};
use crate::sched::timers::TimerWheel;

/// A fiber parked with a deadline, and the park generation its timer may end.
type Timer = (Arc<dyn Job>, u64);
use crate::stack::StackPool;
use crossbeam_queue::{ArrayQueue, SegQueue};
use std::cell::{Cell, RefCell};
use std::collections::VecDeque;
use std::panic::AssertUnwindSafe;
use std::sync::atomic::{fence, AtomicBool, AtomicU8, AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread::ThreadId;
use std::time::{Duration, Instant};

/// Scheduler lifecycle states, in order; the state only moves forward.
pub(crate) const NEW: u8 = 0;
pub(crate) const RUNNING_STATE: u8 = 1;
pub(crate) const STOPPING: u8 = 2;
pub(crate) const CANCEL: u8 = 3;
pub(crate) const DONE: u8 = 4;

/// Capacity of a worker's stealable queue of unstarted tasks.
const LOCAL_CAPACITY: usize = 256;
/// Every this many ticks a worker takes from the injector before its own queues.
const INJECTOR_INTERVAL: u32 = 61;
/// Every this many ticks a busy worker checks its timers.
const TIMER_INTERVAL: u32 = 16;
/// How many tasks in a row a worker takes from its `next` slot before looking elsewhere.
const MAX_NEXT_STREAK: u32 = 3;
/// From this spin round on, an idle worker may take a peer's `next` slot: the owner had
/// a grace period to run it itself.
const STEAL_NEXT_ROUND: u32 = 3;
/// Every this many ticks a busy worker takes a non-blocking look at I/O readiness, while
/// fibers wait for I/O and no idle worker is polling.
const IO_POLL_INTERVAL: u32 = 61;
/// An idle worker releases burst stacks only if no timer is due within this long.
const TRIM_QUIET: Duration = Duration::from_millis(50);
/// How many idle stacks a worker releases per sleep, and how long it sleeps between batches.
const TRIM_BATCH: usize = 64;
const TRIM_PAUSE: Duration = Duration::from_millis(5);
/// How many rounds an idle worker looks for work before it sleeps.
const SPIN_ROUNDS: u32 = 12;

/// Scheduler configuration, validated by the builder.
pub(crate) struct Config {
    pub(crate) threads: usize,
    pub(crate) name: String,
    pub(crate) stack_size: usize,
    pub(crate) stack_cache: usize,
    pub(crate) use_caller: bool,
}

/// What other threads may touch of a worker.
pub(crate) struct WorkerShared {
    pub(crate) inbox: SegQueue<ScheduleTask>,
    pub(crate) local: ArrayQueue<Arc<dyn Job>>,
    /// The LIFO slot (capacity 1).
    pub(crate) next: ArrayQueue<Arc<dyn Job>>,
    pub(crate) parker: Parker,
}

/// State shared by a scheduler's handle, its workers and every task it runs.
pub(crate) struct Shared {
    pub(crate) config: Config,
    pub(crate) workers: Box<[WorkerShared]>,
    pub(crate) injector: SegQueue<Arc<dyn Job>>,
    pub(crate) state: AtomicU8,
    live: AtomicUsize,
    spinning: AtomicUsize,
    idle: IdleSet,
    pub(crate) cancelled: AtomicUsize,
    /// Shutting down without running queued unstarted tasks (`Looper::shutdown(false)`).
    pub(crate) discard_queued: AtomicBool,
    drained: (parking_lot::Mutex<()>, parking_lot::Condvar),
    /// With `use_caller`: worker 0's state while its thread is not inside `block_on`/`stop`.
    pub(crate) caller_worker: parking_lot::Mutex<Option<Box<Worker>>>,
    /// With `use_caller`: the thread that is worker 0.
    pub(crate) owner: Option<ThreadId>,
}

impl Shared {
    pub(crate) fn new(config: Config) -> Arc<Shared> {
        let n = config.threads;
        let owner = config.use_caller.then(|| std::thread::current().id());
        let shared = Arc::new(Shared {
            workers: (0..n)
                .map(|_| WorkerShared {
                    inbox: SegQueue::new(),
                    local: ArrayQueue::new(LOCAL_CAPACITY),
                    next: ArrayQueue::new(1),
                    parker: Parker::new(),
                })
                .collect(),
            injector: SegQueue::new(),
            state: AtomicU8::new(NEW),
            live: AtomicUsize::new(0),
            spinning: AtomicUsize::new(0),
            idle: IdleSet::new(n),
            cancelled: AtomicUsize::new(0),
            discard_queued: AtomicBool::new(false),
            drained: (parking_lot::Mutex::new(()), parking_lot::Condvar::new()),
            caller_worker: parking_lot::Mutex::new(None),
            owner,
            config,
        });
        if shared.config.use_caller {
            *shared.caller_worker.lock() = Some(Box::new(Worker::new(shared.clone(), 0)));
        }
        shared
    }

    /// Counts a new task in, unless the scheduler refuses work. Fibers of this scheduler may
    /// still submit while it drains (they are finishing submitted work).
    pub(crate) fn admit(&self) -> bool {
        self.live.fetch_add(1, Ordering::SeqCst);
        let st = self.state.load(Ordering::SeqCst);
        let ok = st < STOPPING
            || (st == STOPPING && fiber::in_fiber() && self.current_worker().is_some());
        if !ok {
            self.task_done();
        }
        ok
    }

    /// Counts a task out; the last one during shutdown lets everybody go.
    pub(crate) fn task_done(&self) {
        if self.live.fetch_sub(1, Ordering::SeqCst) == 1
            && self.state.load(Ordering::SeqCst) >= STOPPING
        {
            self.wake_all();
            let _g = self.drained.0.lock();
            self.drained.1.notify_all();
        }
    }

    pub(crate) fn live(&self) -> usize {
        self.live.load(Ordering::SeqCst)
    }

    /// Waits until no task is alive, or until `deadline`. Returns whether drained.
    pub(crate) fn wait_drained(&self, deadline: Option<Instant>) -> bool {
        let mut g = self.drained.0.lock();
        loop {
            if self.live() == 0 {
                return true;
            }
            match deadline {
                None => self.drained.1.wait(&mut g),
                Some(d) => {
                    if self.drained.1.wait_until(&mut g, d).timed_out() {
                        return self.live() == 0;
                    }
                }
            }
        }
    }

    pub(crate) fn wake_all(&self) {
        for w in self.workers.iter() {
            w.parker.unpark();
        }
    }

    /// Wakes one sleeping worker for new shareable work, unless a spinning one will find it.
    pub(crate) fn notify_one(&self) {
        // Pairs with the fence a worker issues after announcing itself idle (see module docs).
        fence(Ordering::SeqCst);
        if self.spinning.load(Ordering::SeqCst) != 0 {
            return;
        }
        if let Some(i) = self.idle.pop() {
            self.workers[i].parker.unpark();
        }
    }

    /// The worker of *this* scheduler running on the current thread, if any.
    pub(crate) fn current_worker(&self) -> Option<&Worker> {
        let w = CURRENT_WORKER.with(|c| c.get());
        // SAFETY: CURRENT_WORKER is non-null only while `Worker::run` is on the stack of this
        // thread, which keeps the worker alive.
        let w = unsafe { w.as_ref() }?;
        std::ptr::eq(Arc::as_ptr(&w.shared), self).then_some(w)
    }

    /// Queues a task that has never run.
    pub(crate) fn schedule_new(&self, job: Arc<dyn Job>) {
        let here = self.current_worker();
        match job.header().pinned {
            Some(i) => {
                self.workers[i].inbox.push(ScheduleTask::Closure(job));
                if here.map(|w| w.index) != Some(i) {
                    self.workers[i].parker.unpark();
                }
            }
            None => match here {
                Some(w) if fiber::in_fiber() => w.push_next(job),
                _ => {
                    self.injector.push(job);
                    self.notify_one();
                }
            },
        }
    }
}

thread_local! {
    /// The worker whose loop runs on this thread, or null.
    static CURRENT_WORKER: Cell<*const Worker> = const { Cell::new(std::ptr::null()) };
}

/// The index of the worker running the calling code: `Some(i)` inside a fiber of a scheduler
/// (or anywhere on a worker thread), `None` on other threads.
///
/// ```
/// let sched = fibra::Scheduler::builder().threads(2).build().unwrap();
/// sched.start();
/// let h = sched.submit(fibra::current_worker, Some(1)).unwrap();
/// assert_eq!(h.join().unwrap(), Some(1));
/// assert_eq!(fibra::current_worker(), None);
/// ```
pub fn current_worker() -> Option<usize> {
    let w = CURRENT_WORKER.with(|c| c.get());
    // SAFETY: see `Shared::current_worker`.
    unsafe { w.as_ref() }.map(|w| w.index)
}

/// Wakes a parked fiber: the `Unparker` side of the park protocol.
pub(crate) fn unpark_fiber(job: &Arc<dyn Job>, gen: u64) {
    let h = job.header();
    if !h.try_notify(gen) {
        return;
    }
    // SAFETY: written before the fiber first parked (see Placement); the fiber is parked, so
    // its scheduler is alive (it outlives every unfinished task).
    let (sched, worker) = unsafe {
        let p = &*h.placement.get();
        (&*p.sched, p.worker)
    };
    if let Some(w) = sched.current_worker() {
        if w.index == worker {
            w.ready.borrow_mut().push_back(job.clone());
            return;
        }
    }
    let target = &sched.workers[worker];
    target.inbox.push(ScheduleTask::Fiber(job.clone()));
    target.parker.unpark();
}

/// Pops from a `SegQueue`, looking first: crossbeam's `pop` issues a SeqCst fence when it
/// finds the queue empty, and an empty inbox or injector is the common case on the hot path.
/// A push racing with the look is found on the next pass; sleeping is guarded separately by
/// the idle protocol's fences.
#[inline]
fn pop<T>(q: &SegQueue<T>) -> Option<T> {
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

/// Handles I/O readiness that is already there, without blocking, if fibers wait for I/O
/// and no worker is blocked in `epoll_wait` already.
fn poll_io_now() {
    if let Some(reactor) = crate::io::reactor::get() {
        if reactor.has_waiters() && reactor.try_begin_poll() {
            reactor.poll(Some(Duration::ZERO));
            reactor.end_poll();
        }
    }
}

/// One worker's private state. Lives on its thread (or, for `use_caller`'s worker 0, in
/// `Shared::caller_worker` between drives).
pub(crate) struct Worker {
    pub(crate) shared: Arc<Shared>,
    pub(crate) index: usize,
    ready: RefCell<VecDeque<Arc<dyn Job>>>,
    /// Every live fiber homed here, so cancellation can find parked ones.
    registry: RefCell<Vec<Arc<dyn Job>>>,
    stacks: RefCell<StackPool>,
    timers: RefCell<TimerWheel<Timer>>,
    tick: Cell<u32>,
    next_streak: Cell<u32>,
    cancelled_all: Cell<bool>,
    /// This worker has dropped its queued unstarted tasks (`discard_queued` shutdown).
    discarded: Cell<bool>,
    rng: Cell<u32>,
}

/// Restores `CURRENT_WORKER` when a drive ends, even by unwinding.
struct ExitWorker(*const Worker);

impl Drop for ExitWorker {
    fn drop(&mut self) {
        CURRENT_WORKER.with(|c| c.set(self.0));
    }
}

impl Worker {
    pub(crate) fn new(shared: Arc<Shared>, index: usize) -> Worker {
        let stacks = StackPool::new(shared.config.stack_cache);
        Worker {
            shared,
            index,
            ready: RefCell::new(VecDeque::new()),
            registry: RefCell::new(Vec::new()),
            stacks: RefCell::new(stacks),
            timers: RefCell::new(TimerWheel::default()),
            tick: Cell::new(0),
            next_streak: Cell::new(0),
            cancelled_all: Cell::new(false),
            discarded: Cell::new(false),
            rng: Cell::new(0x9E37_79B9 ^ (index as u32).wrapping_mul(0x85EB_CA6B) | 1),
        }
    }

    fn me(&self) -> &WorkerShared {
        &self.shared.workers[self.index]
    }

    /// Runs the loop until `until()` holds or the scheduler has shut down. `wake_at` bounds
    /// every sleep, for a caller that must look at the clock (`stop_timeout` on worker 0).
    pub(crate) fn run(&self, until: &dyn Fn() -> bool, wake_at: Option<Instant>) {
        let prev = CURRENT_WORKER.with(|c| c.replace(self));
        let _restore = ExitWorker(prev);
        crate::stack::overflow::ensure_alt_stack();
        loop {
            if until() {
                return;
            }
            let state = self.shared.state.load(Ordering::Relaxed);
            if state >= STOPPING {
                if state == CANCEL && !self.cancelled_all.get() {
                    self.cancel_all();
                } else if !self.discarded.get() && self.shared.discard_queued.load(Ordering::SeqCst)
                {
                    self.discard_queued();
                }
            }
            if let Some(task) = self.next_task() {
                self.run_task(task);
                continue;
            }
            if self.should_exit() {
                return;
            }
            self.idle(until, wake_at);
        }
    }

    fn should_exit(&self) -> bool {
        self.shared.state.load(Ordering::SeqCst) >= STOPPING && self.shared.live() == 0
    }

    #[inline]
    fn next_task(&self) -> Option<ScheduleTask> {
        let tick = self.tick.get().wrapping_add(1);
        self.tick.set(tick);
        if tick.is_multiple_of(TIMER_INTERVAL) {
            self.fire_timers();
        }
        if tick.is_multiple_of(IO_POLL_INTERVAL) {
            poll_io_now();
        }
        if tick.is_multiple_of(INJECTOR_INTERVAL) {
            if let Some(job) = pop(&self.shared.injector) {
                return Some(ScheduleTask::Closure(job));
            }
        }
        if self.next_streak.get() < MAX_NEXT_STREAK {
            if let Some(job) = pop_local(&self.me().next) {
                self.next_streak.set(self.next_streak.get() + 1);
                return Some(ScheduleTask::Closure(job));
            }
        }
        self.next_streak.set(0);
        if let Some(task) = pop(&self.me().inbox) {
            return Some(task);
        }
        let from_ready = || self.ready.borrow_mut().pop_front().map(ScheduleTask::Fiber);
        let from_local = || pop_local(&self.me().local).map(ScheduleTask::Closure);
        let local = if tick & 1 == 0 {
            from_ready().or_else(from_local)
        } else {
            from_local().or_else(from_ready)
        };
        if local.is_some() {
            return local;
        }
        if let Some(job) = pop_local(&self.me().next) {
            return Some(ScheduleTask::Closure(job));
        }
        if self.fire_timers() {
            return self.ready.borrow_mut().pop_front().map(ScheduleTask::Fiber);
        }
        pop(&self.shared.injector)
            .map(ScheduleTask::Closure)
            .or_else(|| self.steal(false))
    }

    /// Wakes the fibers whose deadline has passed; returns whether any woke.
    fn fire_timers(&self) -> bool {
        if self.timers.borrow().is_empty() {
            return false;
        }
        let now = Instant::now();
        let mut woke = false;
        loop {
            let due = self.timers.borrow_mut().pop_due(now);
            let Some((job, gen)) = due else { break };
            let h = job.header();
            let home = h.home.get();
            // SAFETY: home-worker-only state of a fiber homed here; the timer is gone, so the
            // resumption must not cancel it again.
            unsafe { (*home).timer = None };
            if h.try_notify(gen) {
                // SAFETY: as above; the fiber is suspended and reads the flag only after it
                // resumes on this thread.
                unsafe { (*home).meta.timed_out.set(true) };
                self.ready.borrow_mut().push_back(job);
                woke = true;
            }
        }
        woke
    }

    /// Takes a task from a random peer's stealable queue, and up to half of the rest; with
    /// `take_next`, a peer's `next` slot too.
    fn steal(&self, take_next: bool) -> Option<ScheduleTask> {
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
            let victim = &workers[v].local;
            let available = victim.len();
            let Some(first) = pop_local(victim) else {
                if take_next {
                    if let Some(job) = pop_local(&workers[v].next) {
                        return Some(ScheduleTask::Closure(job));
                    }
                }
                continue;
            };
            for _ in 0..available / 2 {
                let Some(job) = victim.pop() else { break };
                if let Err(job) = self.me().local.push(job) {
                    self.shared.injector.push(job);
                }
            }
            return Some(ScheduleTask::Closure(first));
        }
        None
    }

    /// Puts a task a fiber of this worker spawned in the `next` slot; the task it displaces
    /// moves to the stealable queue, and an idle peer is woken to help with it.
    pub(crate) fn push_next(&self, job: Arc<dyn Job>) {
        if let Some(displaced) = self.me().next.force_push(job) {
            self.push_local(displaced);
            self.shared.notify_one();
        }
    }

    /// Queues an unstarted task on this worker's stealable queue.
    fn push_local(&self, job: Arc<dyn Job>) {
        if let Err(job) = self.me().local.push(job) {
            // Full: move half to the injector so peers can help, like Go's runqputslow.
            for _ in 0..LOCAL_CAPACITY / 2 {
                match self.me().local.pop() {
                    Some(j) => self.shared.injector.push(j),
                    None => break,
                }
            }
            self.shared.injector.push(job);
        }
    }

    /// Whether there is anything this worker could run right now.
    fn has_work(&self) -> bool {
        let sh = &self.shared;
        !self.me().inbox.is_empty()
            || !self.ready.borrow().is_empty()
            || !sh.injector.is_empty()
            || !self.me().next.is_empty()
            || sh.workers.iter().any(|w| !w.local.is_empty())
            || self
                .timers
                .borrow()
                .next_deadline()
                .is_some_and(|d| d <= Instant::now())
    }

    fn idle(&self, until: &dyn Fn() -> bool, wake_at: Option<Instant>) {
        let sh = &self.shared;
        poll_io_now();
        if !self.ready.borrow().is_empty() || !self.me().inbox.is_empty() {
            return;
        }
        if 2 * sh.spinning.load(Ordering::Relaxed) < sh.workers.len() {
            sh.spinning.fetch_add(1, Ordering::SeqCst);
            for round in 0..SPIN_ROUNDS {
                let found = self
                    .me()
                    .inbox
                    .pop()
                    .or_else(|| sh.injector.pop().map(ScheduleTask::Closure))
                    .or_else(|| self.steal(round >= STEAL_NEXT_ROUND));
                if let Some(task) = found {
                    let last_spinner = sh.spinning.fetch_sub(1, Ordering::SeqCst) == 1;
                    if last_spinner && !sh.injector.is_empty() {
                        // More shared work than one worker: get another one looking.
                        sh.notify_one();
                    }
                    self.run_task(task);
                    return;
                }
                if round < SPIN_ROUNDS / 2 {
                    for _ in 0..(32 << round) {
                        std::hint::spin_loop();
                    }
                } else {
                    std::thread::yield_now();
                }
            }
            sh.spinning.fetch_sub(1, Ordering::SeqCst);
        }
        sh.idle.insert(self.index);
        fence(Ordering::SeqCst);
        let cancel_pending = (sh.state.load(Ordering::SeqCst) == CANCEL
            && !self.cancelled_all.get())
            || (sh.discard_queued.load(Ordering::SeqCst) && !self.discarded.get());
        if self.has_work() || until() || self.should_exit() || cancel_pending {
            sh.idle.remove(self.index);
            return;
        }
        let now = Instant::now();
        let mut deadline = match (self.timers.borrow().next_deadline(), wake_at) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        // Give burst memory back only when truly idle (no timer due soon), a batch at a time,
        // coming back for the next batch after a pause: trimming never delays due work.
        if deadline.is_none_or(|d| d > now + TRIM_QUIET)
            && self.stacks.borrow_mut().trim(TRIM_BATCH)
        {
            let again = now + TRIM_PAUSE;
            deadline = Some(deadline.map_or(again, |d| d.min(again)));
        }
        let timeout = deadline.map(|d| d.saturating_duration_since(now));
        if timeout.is_none_or(|t| !t.is_zero()) {
            match crate::io::reactor::get() {
                // Nobody polls for I/O: this worker does, sleeping in epoll_wait.
                Some(reactor) if reactor.try_begin_poll() => {
                    self.me().parker.park_polling(reactor, timeout);
                    reactor.end_poll();
                }
                _ => self.me().parker.park(timeout),
            }
        }
        sh.idle.remove(self.index);
    }

    #[inline]
    fn run_task(&self, task: ScheduleTask) {
        match task {
            ScheduleTask::Closure(job) => self.start(job),
            ScheduleTask::Fiber(job) => self.resume(job),
        }
    }

    /// Gives an unstarted task a fiber homed on this worker and runs it.
    fn start(&self, job: Arc<dyn Job>) {
        if self.cancelled_all.get() {
            self.drop_unstarted(job);
            return;
        }
        let h = job.header();
        let stack = match self.stacks.borrow_mut().take(h.stack_size) {
            Ok(stack) => stack,
            Err(e) => {
                job.fail(JoinError::no_stack(e));
                self.shared.task_done();
                return;
            }
        };
        let home = h.home.get();
        // SAFETY: the task was just taken from a queue and has never run, so this worker is
        // its only owner; no Unparker for it exists yet, and it is published (to unparkers,
        // via the park word) only after these writes.
        unsafe {
            *h.placement.get() = Placement {
                sched: Arc::as_ptr(&self.shared),
                worker: self.index,
            };
            (*home).meta.worker = Some(self.index);
            (*home).meta.set_stack(&stack);
        }
        // SAFETY: `home` is valid (the header lives in `job`).
        let meta: *const FiberMeta = unsafe { &raw const (*home).meta };
        let job_ptr: *const dyn Job = Arc::as_ptr(&job);
        let coro = Coro::with_stack(stack, move |y: &Yielder, first: Resume| {
            fiber_root(meta, y, first, || {
                // SAFETY: the registry holds an Arc to the job until the fiber has ended.
                unsafe { (*job_ptr).run() }
            })
        });
        {
            let mut registry = self.registry.borrow_mut();
            // SAFETY: home-worker-only fields, as above.
            unsafe {
                (*home).fiber = Some(coro);
                (*home).slot = registry.len();
            }
            registry.push(job.clone());
        }
        self.resume(job);
    }

    /// Switches to a fiber homed here and acts on what it asks when it comes back.
    #[inline(always)]
    fn resume(&self, job: Arc<dyn Job>) {
        let h = job.header();
        let home = h.home.get();
        // SAFETY: `job` is a live fiber homed on this worker (only its home worker ever
        // queues it for resumption); its home-only fields are ours to touch on this thread.
        let input = unsafe {
            if let Some(id) = (*home).timer.take() {
                // Woken before its deadline: the timer can never fire for this park.
                self.timers.borrow_mut().remove(id);
            }
            match (*home).pending_panic.take() {
                Some(p) => Resume::Panic(p),
                None if (*home).cancel => Resume::Cancel,
                None => Resume::Run,
            }
        };
        // A new generation: every Unparker of an earlier park is now stale.
        let s = h.park.load(Ordering::Relaxed);
        h.park.store(
            (((s >> STATE_BITS) + 1) << STATE_BITS) | RUNNING,
            Ordering::Relaxed,
        );
        // SAFETY: as above; the coroutine is only ever resumed from this thread.
        let coro = unsafe { (*home).fiber.as_mut() }.expect("a queued fiber has a coroutine");
        // SAFETY: as above.
        let prev = fiber::enter(unsafe { &raw const (*home).meta });
        let result = coro.resume(input);
        fiber::leave(prev);
        match result {
            corosensei::CoroutineResult::Yield(Suspend::Yield) => {
                self.ready.borrow_mut().push_back(job);
            }
            corosensei::CoroutineResult::Yield(Suspend::Park(register, deadline)) => {
                self.park(job, register, deadline);
            }
            corosensei::CoroutineResult::Return(outcome) => self.finish(job, outcome),
        }
    }

    /// The worker half of `park`: publish the fiber now that it is off the CPU.
    #[inline(never)]
    fn park(
        &self,
        job: Arc<dyn Job>,
        register: *mut (dyn FnMut(Unparker) + 'static),
        deadline: Option<Instant>,
    ) {
        let h = job.header();
        let gen = h.park.load(Ordering::Relaxed) >> STATE_BITS;
        // Release: an unparker that wins its CAS on this value sees `placement`.
        h.park
            .store((gen << STATE_BITS) | PARKED, Ordering::Release);
        let home = h.home.get();
        // SAFETY: home-worker-only field.
        if unsafe { (*home).cancel } {
            self.wake_own(&job, gen);
            return;
        }
        if let Some(d) = deadline {
            let id = self.timers.borrow_mut().insert(d, (job.clone(), gen));
            // SAFETY: home-worker-only field.
            unsafe { (*home).timer = Some(id) };
        }
        let unparker = Unparker::for_fiber(job.clone(), gen);
        // SAFETY: the closure lives on the suspended fiber's stack (see `park_inner`) and is
        // called exactly once, here, before the fiber can resume.
        let r = std::panic::catch_unwind(AssertUnwindSafe(|| unsafe { (*register)(unparker) }));
        if let Err(p) = r {
            // SAFETY: home-worker-only field.
            unsafe { (*home).pending_panic = Some(p) };
            self.wake_own(&job, gen);
        }
    }

    /// Wakes a fiber of this worker from this worker (cancellation, failed registration).
    fn wake_own(&self, job: &Arc<dyn Job>, gen: u64) {
        if job.header().try_notify(gen) {
            self.ready.borrow_mut().push_back(job.clone());
        }
    }

    /// A fiber ended: recycle its stack, forget it, publish errors, count it out.
    #[inline(never)]
    fn finish(&self, job: Arc<dyn Job>, outcome: Outcome) {
        let h = job.header();
        let home = h.home.get();
        // SAFETY: home-worker-only fields of a fiber that has just ended here.
        let (coro, slot) = unsafe { ((*home).fiber.take(), (*home).slot) };
        if let Some(coro) = coro {
            self.stacks.borrow_mut().give(coro.into_stack());
        }
        let removed = {
            let mut registry = self.registry.borrow_mut();
            let removed = registry.swap_remove(slot);
            if let Some(moved) = registry.get(slot) {
                // SAFETY: `moved` is another live fiber homed here.
                unsafe { (*moved.header().home.get()).slot = slot };
            }
            removed
        };
        drop(removed);
        match outcome {
            Outcome::Done => {}
            Outcome::Panicked(p) => job.fail(JoinError::panic(p)),
            Outcome::Cancelled => {
                self.shared.cancelled.fetch_add(1, Ordering::Relaxed);
                job.fail(JoinError::cancelled());
            }
        }
        self.shared.task_done();
    }

    fn drop_unstarted(&self, job: Arc<dyn Job>) {
        self.shared.cancelled.fetch_add(1, Ordering::Relaxed);
        job.fail(JoinError::cancelled());
        self.shared.task_done();
    }

    /// Fails every queued unstarted task this worker can reach (its own queues and the
    /// injector); wakes of started fibers stay queued.
    fn discard_queued(&self) {
        self.discarded.set(true);
        while let Some(task) = self.me().inbox.pop() {
            match task {
                ScheduleTask::Closure(job) => self.drop_unstarted(job),
                ScheduleTask::Fiber(job) => self.ready.borrow_mut().push_back(job),
            }
        }
        while let Some(job) = self.me().local.pop().or_else(|| self.me().next.pop()) {
            self.drop_unstarted(job);
        }
        while let Some(job) = self.shared.injector.pop() {
            self.drop_unstarted(job);
        }
    }

    /// `stop_timeout`'s deadline passed: fail every queued unstarted task this worker can
    /// reach and make each of its live fibers unwind at its next resumption.
    fn cancel_all(&self) {
        self.cancelled_all.set(true);
        self.discard_queued();
        let fibers: Vec<Arc<dyn Job>> = self.registry.borrow().clone();
        for job in fibers {
            let h = job.header();
            // SAFETY: home-worker-only field of a fiber homed here.
            unsafe { (*h.home.get()).cancel = true };
            let s = h.park.load(Ordering::Acquire);
            if s & STATE_MASK == PARKED {
                self.wake_own(&job, s >> STATE_BITS);
            }
        }
    }
}

/// The body of a worker thread.
pub(crate) fn worker_main(shared: Arc<Shared>, index: usize) {
    let worker = Worker::new(shared, index);
    worker.run(&|| false, None);
}
