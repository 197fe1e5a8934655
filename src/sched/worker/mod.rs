//! A scheduler's workers: the state they share with each other and with the scheduler's
//! handle ([`Shared`], one [`WorkerShared`] per worker), one worker's private state
//! ([`Worker`]), and the thread-local "worker on this thread". docs/design.md draws the same
//! picture at more length.
//!
//! A worker is one thread running a loop over its run queues: it starts unstarted tasks as
//! fibers homed on it, resumes its own fibers when they are woken, and sleeps when there is
//! nothing to do. Each child module adds one concern's methods to `Worker` (they all see its
//! private fields; what one calls of another is `pub(super)`):
//!
//! | module | concern |
//! |---|---|
//! | `run` | the loop, one pass of it (`next_task`), and its catch-up with the shutdown phase |
//! | `queues` | the run queues: popping, the injector, stealing, `rebalance` |
//! | `help` | the `next` slot's requests for help, and dealing out a burst of spawns |
//! | `cede` | yielding the CPU to a peer that waits for it |
//! | `idle` | the worker's side of the idle protocol (spin, announce, sleep, trim) |
//! | `lifecycle` | a fiber's start, resumption, cancellation and end |
//! | `shutdown` | the phases, failing queued tasks, abandoning, exit |
//! | `dump` | answering `Scheduler::dump`, a chunk of fibers per pass |
//! | `shared` | [`Shared`]: admission, the live count, waking workers, `schedule_new` |
//!
//! Parking and waking a fiber is the park protocol's (`crate::park::protocol`): the worker
//! hands it a fiber that switched out in `park`, and it queues a woken fiber back on its
//! home worker through `Worker::push_woken` or the worker's inbox. The idle protocol's shared
//! half (`Idlers`, `WorkerSleep`) is `crate::sched::idle`.
//!
//! This module may touch everything of a scheduler's workers; other modules reach it through
//! `Shared`, `WorkerShared` and the few `pub(crate)` methods of `Worker`.

mod cede;
mod dump;
mod help;
mod idle;
mod lifecycle;
mod queues;
mod run;
mod shared;
mod shutdown;
mod stats;

pub(crate) use dump::DumpRequest;
// Public as `fibra::dump::{Entry, Status}`.
pub use dump::{Entry, Status};
pub(crate) use lifecycle::cancel_started;
pub(super) use queues::pop;
pub(crate) use shared::Shared;
pub(crate) use shutdown::{fail_injected, fail_queued_of_absent, Phase};
pub(crate) use stats::WorkerStats;

use crate::park::protocol::WakerCount;
use crate::sched::idle::WorkerSleep;
use crate::sched::task::{HomeOnly, ScheduleTask, Task, TaskRef, TaskSlot};
use crate::sched::timers::TimerWheel;
use crate::sched::watchdog::Watch;
use crate::stack::StackPool;
use cede::PeerSeen;
use crossbeam_queue::{ArrayQueue, SegQueue};
use dump::DumpsInProgress;
use help::{HelpSlot, SpawnBurst};
use std::cell::{Cell, RefCell};
use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// A fiber parked with a deadline, and the park generation its timer may end.
type Timer = (TaskRef, u64);

/// Scheduler configuration, validated by the builder.
pub(crate) struct Config {
    pub(crate) threads: usize,
    pub(crate) name: String,
    pub(crate) stack_size: usize,
    pub(crate) stack_cache: usize,
    pub(crate) use_caller: bool,
    /// The tokio runtime whose context `future::block_on` enters in this scheduler's fibers.
    #[cfg(feature = "tokio")]
    pub(crate) tokio: Option<tokio::runtime::Handle>,
    /// How long a fiber may run without suspending before the watchdog reports it; zero:
    /// no watchdog.
    pub(crate) watchdog: Duration,
    /// The kernel time slice of the worker threads fibra spawns (`Builder::time_slice`).
    pub(crate) time_slice: Option<Duration>,
}

/// What other threads may touch of a worker.
pub(crate) struct WorkerShared {
    pub(crate) inbox: SegQueue<ScheduleTask>,
    pub(crate) local: ArrayQueue<TaskRef>,
    /// The LIFO slot, on a cache line of its own: idle peers poll it, and the owner writes
    /// it at every spawn.
    pub(crate) next: Padded<TaskSlot>,
    pub(crate) sleep: WorkerSleep,
    /// The worker's tick, published at every pass of its loop: a spinning peer that sees it
    /// unchanged for `NEXT_STEAL_AFTER` knows the worker is stuck in one fiber, and may take
    /// the task waiting in its `next` slot.
    progress: Padded<AtomicU32>,
    /// The CPU this worker's thread last ran on (`u32::MAX`: not known yet), rewritten only
    /// when it changes, so peers read it from their cache (see `Worker::cede_cpu`).
    cpu: Padded<AtomicU32>,
    /// An open request for help with the task in this worker's `next` slot.
    help: HelpSlot,
    /// Wakers from other threads between their push into `inbox` and their last touch of
    /// this worker (see `park::protocol::unpark_fiber`); the shared state is not freed
    /// while any is.
    pub(crate) wakers: WakerCount,
    /// Counters and gauges for `Scheduler::metrics`, written by this worker only.
    pub(crate) stats: Padded<WorkerStats>,
    /// The fiber this worker runs, for the watchdog and the dump.
    pub(crate) watch: Watch,
    /// Set by a shutdown that could not spawn this worker's thread (the OS refused it at
    /// `start` and again then): nothing will ever run here, and what is queued fails.
    pub(crate) absent: AtomicBool,
    /// The OS thread id of the thread driving this worker (0: none yet), for the
    /// watchdog's look at what the kernel says it does.
    pub(crate) tid: std::sync::atomic::AtomicI32,
    /// The largest `busy` and `slept` (ns) any `metrics()` has reported, so that no later
    /// one reports less: the worker's clock reads and a reader's are a few ns apart.
    pub(crate) reported_times: [std::sync::atomic::AtomicU64; 2],
}

impl WorkerShared {
    /// The worker's loop tick, published at every pass.
    pub(crate) fn progress(&self) -> u32 {
        self.progress.0.load(Ordering::Relaxed)
    }

    /// Tasks waiting to run on this worker: ready fibers (as of its last pass), its inbox,
    /// its stealable queue and `next` slot.
    pub(crate) fn waiting(&self) -> usize {
        self.stats.0.ready.get() as usize + self.inbox.len() + self.local.len() + self.next.0.len()
    }

    /// The fiber this worker runs (or ran last): see `Watch::peek`.
    pub(crate) fn peek(
        &self,
    ) -> Option<(
        crate::fiber::FiberId,
        Option<Arc<str>>,
        &'static std::panic::Location<'static>,
    )> {
        self.watch.peek(&self.stats.0.current)
    }

    /// Asleep, or (`use_caller`'s worker 0) not driven by any thread: it runs no fiber
    /// until it wakes up or a drive begins, both of which nudge the monitor. SeqCst: see
    /// `MonitorCtl::nudge`.
    pub(crate) fn is_quiet(&self) -> bool {
        self.stats.0.run_since.get_seqcst() == 0 || self.sleep.is_sleeping()
    }
}

/// A value on a cache line of its own, so the owner's writes do not slow its neighbours.
#[repr(align(128))]
pub(crate) struct Padded<T>(pub(crate) T);

thread_local! {
    /// The worker whose loop runs on this thread, or null.
    static CURRENT_WORKER: Cell<*const Worker> = const { Cell::new(std::ptr::null()) };
    /// This thread is a worker's copied into the child of a `fork` (see `forked_in_child`).
    static FORKED: Cell<bool> = const { Cell::new(false) };
}

/// The workers' `fork` handlers (`crate::fork::Slot::Workers`): nothing to lock; in the
/// child, `forked_in_child`. Registered when a scheduler is built.
pub(crate) static FORK: crate::fork::Handlers = crate::fork::Handlers {
    prepare: || {},
    release: |in_child| {
        if in_child {
            forked_in_child();
        }
    },
};

/// In the child of a `fork`, on the forking thread. If it is a worker thread, it is the copy
/// of one worker of a scheduler whose other threads the child does not have, with copies of
/// that scheduler's fibers in its queues: running them would repeat their effects (a copied
/// fiber accepted the parent's connection, say). So the fiber that forked goes on as code on
/// a plain thread would (no fiber is current: its waits block the thread, `spawn` panics),
/// and the worker loop never runs again: when that fiber ends, the child exits (`_exit`,
/// status 0, or 101 if it panicked).
fn forked_in_child() {
    if !CURRENT_WORKER.with(Cell::get).is_null() {
        FORKED.with(|f| f.set(true));
        crate::fiber::leave_all();
    }
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
    // SAFETY: see `Shared::local_worker`.
    unsafe { w.as_ref() }.map(|w| w.index)
}

/// The worker whose loop runs on this thread, of whichever scheduler, or null. While its
/// loop is on this thread's stack it stays alive (see `Shared::local_worker`).
#[inline(always)]
pub(crate) fn this_thread_worker() -> *const Worker {
    CURRENT_WORKER.with(|c| c.get())
}

/// Calls `f` with the own epoll instance of the worker whose loop runs on this thread, made
/// now if it has none (see `crate::io::home`): `None` on other threads, or if the kernel
/// refuses one. Borrowed, not counted: `f` must not park.
pub(crate) fn with_current_home<R>(
    f: impl FnOnce(Option<&Arc<crate::io::home::HomePoll>>) -> R,
) -> R {
    let w = CURRENT_WORKER.with(|c| c.get());
    // SAFETY: see `Shared::local_worker`; the worker stays alive while its loop is below us
    // on this thread, and `f` does not leave this thread (it may not park).
    let w = unsafe { w.as_ref() };
    f(w.and_then(|w| w.own_shared().sleep.home()))
}

/// The shared state of the scheduler whose worker runs on this thread, if any.
pub(crate) fn current_shared() -> Option<Arc<Shared>> {
    let w = CURRENT_WORKER.with(|c| c.get());
    // SAFETY: see `Shared::local_worker`.
    unsafe { w.as_ref() }.map(|w| w.shared.clone())
}

/// One worker's private state. Lives on its thread (or, for `use_caller`'s worker 0, in the
/// `Scheduler` between drives).
pub(crate) struct Worker {
    pub(crate) shared: Arc<Shared>,
    pub(crate) index: usize,
    ready: RefCell<VecDeque<TaskRef>>,
    /// Every live fiber homed here, so cancellation can find parked ones.
    registry: RefCell<Vec<TaskRef>>,
    stacks: RefCell<StackPool>,
    timers: RefCell<TimerWheel<Timer>>,
    tick: Cell<u32>,
    /// The last `fire_timers` stopped at its limit: more timers may be due, and the loop
    /// looks again at every pass until none is.
    timers_capped: Cell<bool>,
    /// Fibers woken by their timers and queued in `ready`, not yet resumed.
    timer_woken: Cell<usize>,
    next_streak: Cell<u32>,
    /// The peer whose help request this worker answers, and how many times in a row it has
    /// found that peer's `next` slot empty (see `answer_help_request`).
    empty_looks: Cell<(usize, u32)>,
    /// The tick at which this worker last ran out of its own work and looked at the
    /// injector and its peers (see `rebalance`).
    dry_tick: Cell<u32>,
    /// The last fiber run yielded: before it runs again, the worker looks at the injector
    /// (a yield goes behind outside submissions too, when no idle peer takes them).
    yielded: Cell<bool>,
    /// This worker may have queued a task in its `next` slot / stealable queue since it last
    /// found them empty (only it pushes there; peers only take), so an empty look is skipped.
    next_maybe: Cell<bool>,
    /// Whether this worker's last take from the injector looked at the overflow first (it
    /// alternates, see `Injector::pop`).
    spill_first: Cell<bool>,
    /// Where `push_local` gathers the half it moves to the injector (kept for its
    /// allocation).
    spill_buf: RefCell<Vec<TaskRef>>,
    local_maybe: Cell<bool>,
    /// What this worker saw of each peer (see `cede_cpu`).
    peers_seen: RefCell<Box<[PeerSeen]>>,
    /// The burst of spawns of the fiber running now (see `push_next`).
    burst: RefCell<SpawnBurst>,
    /// The shutdown phase this worker has acted on.
    phase: Cell<Phase>,
    /// The last report request this worker answered.
    reported: Cell<usize>,
    rng: Cell<u32>,
    /// Dumps being answered, a chunk per pass (see `dump_step`).
    dumps: DumpsInProgress,
    /// This worker's part of `shared` (one load away instead of an indexed lookup: its
    /// queues and counters are touched several times per switch).
    own_shared: OwnSharedPtr,
}

/// A pointer to a worker's own `WorkerShared` inside its `Arc<Shared>` (see
/// `Worker::own_shared`).
struct OwnSharedPtr(std::ptr::NonNull<WorkerShared>);

// SAFETY: it points into the `Shared` that the same `Worker` keeps alive through its `Arc`,
// so it moves between threads together with that `Arc`; `WorkerShared` is shared by all
// threads anyway (it is `Sync`), and only shared references are made from it.
unsafe impl Send for OwnSharedPtr {}

impl Drop for Worker {
    /// Unmaps the empty slabs of task cells: this worker may have been the last that would
    /// have trimmed them while idle (its stack pool's drop does the same for spare stacks).
    fn drop(&mut self) {
        crate::sched::cell::trim_slabs(usize::MAX, Duration::ZERO);
    }
}

impl Worker {
    pub(crate) fn new(shared: Arc<Shared>, index: usize) -> Worker {
        let stacks = StackPool::spilling(shared.config.stack_cache);
        let reported = shared.report.load(Ordering::Relaxed);
        let own_shared = OwnSharedPtr(std::ptr::NonNull::from(&shared.workers[index]));
        let peers_seen =
            RefCell::new(vec![PeerSeen::UNSEEN; shared.workers.len()].into_boxed_slice());
        Worker {
            own_shared,
            shared,
            index,
            ready: RefCell::new(VecDeque::new()),
            registry: RefCell::new(Vec::new()),
            stacks: RefCell::new(stacks),
            timers: RefCell::new(TimerWheel::default()),
            tick: Cell::new(0),
            timers_capped: Cell::new(false),
            timer_woken: Cell::new(0),
            next_streak: Cell::new(0),
            empty_looks: Cell::new((0, 0)),
            dry_tick: Cell::new(0),
            yielded: Cell::new(false),
            next_maybe: Cell::new(false),
            spill_first: Cell::new(false),
            spill_buf: RefCell::new(Vec::new()),
            local_maybe: Cell::new(false),
            peers_seen,
            burst: RefCell::new(SpawnBurst::default()),
            phase: Cell::new(Phase::Running),
            reported: Cell::new(reported),
            rng: Cell::new(0x9E37_79B9 ^ (index as u32).wrapping_mul(0x85EB_CA6B) | 1),
            dumps: DumpsInProgress::default(),
        }
    }

    #[inline(always)]
    pub(super) fn own_shared(&self) -> &WorkerShared {
        // SAFETY: points into `self.shared`, which this worker keeps alive (and an `Arc`'s
        // contents never move); only shared references are made.
        unsafe { self.own_shared.0.as_ref() }
    }

    #[inline(always)]
    pub(super) fn stats(&self) -> &WorkerStats {
        &self.own_shared().stats.0
    }

    /// Publishes the sizes of the ready queue and the stack pool: every `GAUGE_INTERVAL`
    /// passes and before a sleep, not at every change. (The registry's size, which placement
    /// reads, is published at every change: see `launch`, `unregister`, `abandon_all`.)
    pub(super) fn publish_gauges(&self) {
        let st = self.stats();
        st.ready.set(self.ready.borrow().len() as u64);
        st.stacks_cached.set(self.stacks.borrow().cached() as u64);
    }

    /// The home-only state of `task`, a task this worker has started (see `HomeOnly`).
    ///
    /// Every touch of that state goes through here. Each use is a short borrow that ends
    /// before anything else can reach the same state: the worker is single-threaded, and
    /// the fiber itself runs (and writes its `ended`, through a raw pointer to that field
    /// alone) only inside `resume`, while the worker holds nothing of it but the coroutine.
    #[allow(clippy::mut_from_ref)]
    #[inline(always)]
    pub(crate) fn home<'j>(&self, task: &'j dyn Task) -> &'j mut HomeOnly {
        let h = task.header();
        // SAFETY: `placement` is written once, by this worker, before any call of `home`.
        let placement = unsafe { &*h.placement.get() };
        debug_assert!(
            std::ptr::eq(placement.sched, Arc::as_ptr(&self.shared))
                && placement.worker == self.index,
            "home state touched by a worker that is not the task's home"
        );
        // SAFETY: `task` is homed on this worker (asserted above), and only its home worker
        // touches its home state: on the worker's own thread, or — worker 0 of `use_caller`
        // abandoned by the stopping thread — while no thread drives this worker. No other
        // borrow of it is alive (see above), so this `&mut` is unique for its short life.
        unsafe { &mut *h.home.get() }
    }
}

/// The body of a worker thread.
/// `ready` runs once the worker is set up, just before its loop.
pub(crate) fn worker_main(shared: Arc<Shared>, index: usize, ready: impl FnOnce()) {
    if let Some(slice) = shared.config.time_slice {
        // Best effort, as documented: a kernel that refuses leaves the slice as it was.
        let _ = crate::sys::slice::set_time_slice(slice);
    }
    let worker = Worker::new(shared, index);
    crate::stack::overflow::ensure_alt_stack(false);
    ready();
    worker.run(&|| false, None);
}
