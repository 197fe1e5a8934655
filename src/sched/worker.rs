//! The worker loop, run queues, idle protocol and shutdown. docs/design.md draws the same
//! picture at more length.
//!
//! # Run queues
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
//!   half moves to the injector, in one go (see `injector`).
//! - `inbox` — anything other threads send this worker: wakes of its parked fibers and tasks
//!   pinned to it (`SegQueue`, any thread pushes). Nothing ever scans for pinned entries.
//!
//! Plus one shared `injector` for unpinned tasks submitted from outside the scheduler.
//! Only unstarted tasks move between workers; a started fiber runs on its home worker until
//! it ends (docs/design.md, "Principles").
//!
//! # One pass of the loop
//! Catch up with the shutdown phase if it moved. Then `next_task`: every `TIMER_INTERVAL`
//! ticks fire due timers, every `IO_POLL_INTERVAL` ticks take a non-blocking look at I/O,
//! every `INJECTOR_INTERVAL` ticks and after every yield take from the injector first (so
//! outside work cannot starve, and a yield goes behind it); then `next` (up to a streak) → inbox → ready/local (alternating, so yielding
//! fibers and new tasks share the thread) → `next` again → due timers → injector → steal
//! half of a peer's `local`. Nothing found: `idle`.
//!
//! # Idle
//! With nothing to do a worker *spins* for `SPIN_FOR` (at most half the workers spin at
//! once), looking at its inbox, the injector and its peers. Then it announces itself in the `IdleSet`, issues a
//! SeqCst fence, looks once more, and sleeps on its futex (or in `epoll_wait`, if no other
//! worker polls for I/O) until the next timer deadline, or indefinitely. A submitter pushes,
//! fences, and wakes one idle worker only if nobody is spinning — the fences on both sides
//! make sure that either the submitter sees the idle worker or the worker sees the work (Go's
//! protocol). Pinned work and fiber wakes unpark their target worker directly. There is no
//! periodic polling: an idle scheduler sleeps.
//!
//! # Shutdown
//! One state word, [`Phase`], only ever moves forward: `New → Running → Stopping →
//! Discarding → Cancelling → Abandoning → Done`. `live` counts tasks submitted and not yet
//! finished. Each worker remembers the phase it has acted on and catches up, one step at a
//! time, at the top of its loop:
//! - `Stopping` (`stop`): outside submits are refused (fibers may still spawn children while
//!   they finish); a worker exits when `live` reaches zero.
//! - `Discarding` (`Looper::shutdown(false)`): queued tasks that never started are failed
//!   (cancelled) instead of run; started fibers finish.
//! - `Cancelling` (`stop_timeout`'s deadline): unstarted tasks are failed, and every live
//!   fiber is resumed once with a cancellation that unwinds its stack on its home thread.
//!   After that one delivery its waits work as usual, so destructors may flush, sleep or lock.
//! - `Abandoning` (the grace after cancelling ran out): fibers still alive are reported on
//!   stderr, their results set to cancelled, and they are leaked — never resumed, their
//!   stacks never reused — and the worker exits. A worker whose thread did not run during
//!   the whole grace catches up with both phases at once: it resumes its fibers once, each
//!   with its cancellation, before it abandons what is left, so their destructors run.
//!
//! A failed task's result is published inside a fiber (its own, or a fresh one when it never
//! started), so `catching` and `finally` continuations may wait like any fiber code.

use crate::dump::{DumpRequest, Entry, Status, WaitOn};
use crate::fiber::{self, fiber_root, Coro, FiberMeta, Outcome, Resume, Suspend, Yielder};
use crate::join::JoinError;
use crate::metrics::WorkerStats;
use crate::park::protocol::{self, ParkState, WakerCount};
use crate::sched::cell::TaskArc;
use crate::sched::idle::{Idlers, WorkerSleep};
use crate::sched::injector::Injector;
use crate::sched::live::LiveCount;
use crate::sched::task::{
    Cancel, Ended, HomeOnly, Job, JobRef, Placement, ScheduleTask, Start, TaskSlot,
};
use crate::sched::timers::TimerId;
use crate::sched::timers::TimerWheel;
use crate::sched::watchdog::{self, MonitorCtl, Watch};
use crate::stack::{FiberStack, StackPool};
use crate::sync::wait_queue::{wait, Lock, Wait, WaitList};
use crossbeam_queue::{ArrayQueue, SegQueue};
use std::cell::{Cell, RefCell};
use std::collections::VecDeque;
use std::mem::ManuallyDrop;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicU8, AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread::ThreadId;
use std::time::{Duration, Instant};

/// A fiber parked with a deadline, and the park generation its timer may end.
type Timer = (JobRef, u64);

/// The scheduler's lifecycle, in order; the state only moves forward (see the module docs).
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Debug)]
#[repr(u8)]
pub(crate) enum Phase {
    New = 0,
    Running = 1,
    Stopping = 2,
    Discarding = 3,
    Cancelling = 4,
    Abandoning = 5,
    Done = 6,
}

impl Phase {
    fn from_u8(v: u8) -> Phase {
        match v {
            0 => Phase::New,
            1 => Phase::Running,
            2 => Phase::Stopping,
            3 => Phase::Discarding,
            4 => Phase::Cancelling,
            5 => Phase::Abandoning,
            _ => Phase::Done,
        }
    }
}

/// The shared phase word.
pub(crate) struct PhaseWord(AtomicU8);

impl PhaseWord {
    fn new() -> PhaseWord {
        PhaseWord(AtomicU8::new(Phase::New as u8))
    }

    /// The current phase. SeqCst: `admit` and `stop` order it against the `live` count.
    pub(crate) fn get(&self) -> Phase {
        Phase::from_u8(self.0.load(Ordering::SeqCst))
    }

    /// Moves from `from` to `to` if the phase is `from`; returns whether it did.
    pub(crate) fn advance_from(&self, from: Phase, to: Phase) -> bool {
        debug_assert!(from < to);
        self.0
            .compare_exchange(from as u8, to as u8, Ordering::SeqCst, Ordering::SeqCst)
            .is_ok()
    }

    /// Moves forward to `to` unless the phase is already there or beyond; returns the phase
    /// before.
    pub(crate) fn advance_to(&self, to: Phase) -> Phase {
        Phase::from_u8(self.0.fetch_max(to as u8, Ordering::SeqCst))
    }
}

/// Capacity of a worker's stealable queue of unstarted tasks.
const LOCAL_CAPACITY: usize = 256;
/// Every this many ticks a worker takes from the injector before its own queues.
const INJECTOR_INTERVAL: u32 = 61;
/// Every this many ticks a busy worker checks its timers.
const TIMER_INTERVAL: u32 = 16;
/// How many fibers whose timers are due a worker wakes at a time, the next batch once those
/// have run, while fewer other fibers are ready (see `fire_timers`). Waking all of a large
/// burst of due timers first (thousands of sleeps expiring together) delays the first
/// resumption by a miss or two on every fiber's header, and prefetches more stacks than the
/// cache holds, so the first are evicted again before their fiber runs. Firing a few at a
/// time, with their stacks prefetched, wakes due sleepers sooner than either all at once or
/// one at a time.
const FIRE_BATCH: usize = 8;
/// Every this many ticks (a multiple of `TIMER_INTERVAL`) a worker refreshes its coarse
/// clock (when fibers switched out, for the dump; about 5 ns) and its ready gauge.
const CLOCK_INTERVAL: u32 = 64;
/// How many fibers a worker lists for a dump per chunk (one chunk every `TIMER_INTERVAL`
/// passes, or whenever it is idle): about 0.1 ms of work.
const DUMP_CHUNK: usize = 1024;
/// After a yield, the least loaded worker takes a task from the injector first at every
/// yield while at most this many fibers are ready on it, at every other one beyond (see
/// `next_task`).
pub(crate) const YIELD_PULL_READY_MAX: usize = 8;
/// Up to this many live fibers a worker takes outside submissions at a yield without looking
/// at its peers' loads (see `least_loaded`).
const FEW_FIBERS: u64 = 8;
/// A worker that has not run out of its own work for this many passes takes a share of a
/// busier peer's unstarted tasks (see `Worker::rebalance`).
const REBALANCE_AFTER: u32 = 128;
/// How many tasks in a row a worker takes from its `next` slot before looking elsewhere.
const MAX_NEXT_STREAK: u32 = 3;
/// A watcher of a peer's `next` slot doubles its nap each time in a row it finds the slot
/// empty, at most this many times (`NEXT_STEAL_AFTER` × 32 = 1.6 ms; see `answer_help_request`).
const EMPTY_NAP_DOUBLINGS: u32 = 5;
/// At most this many cache lines of a task's cell are prefetched when it starts.
const CELL_LINES: usize = 12;
/// An idle worker takes the task in a peer's `next` slot only once the peer has run the
/// same fiber for this long since the task was put there: a spawner that suspends soon (a
/// chain of spawns, a spawn-and-join, a ping-pong pair) runs its task itself, with its data
/// still in cache; one that keeps running gets help. Go waits 3 µs before it steals a P's
/// `runnext`, but a goroutine taken wrongly can move back; a started fiber cannot, and a
/// spawner between its spawn and its join can spend several microseconds in page faults on
/// a fresh stack (with a grace of a few microseconds, a deep spawn-and-join chain is taken
/// over now and then, and split between two workers it runs much slower).
const NEXT_STEAL_AFTER: Duration = Duration::from_micros(50);
/// Every this many ticks a busy worker takes a non-blocking look at I/O readiness, while
/// fibers wait for I/O and no idle worker is polling.
const IO_POLL_INTERVAL: u32 = 61;
/// How long a peer worker on this worker's CPU may wait for it, awake and with tasks queued,
/// before this worker yields the CPU (see `Worker::cede_cpu`).
const CEDE_AFTER_NS: u64 = 250_000;
/// How long a peer woken from its sleep may go without running, while unstarted tasks it
/// could take wait on this worker's queue, before this worker makes room on its CPU for it.
/// A wake-up on an idle CPU takes microseconds; much longer means it is queued behind a
/// busy thread, likely this one. (For outside submissions the wait is `CEDE_AFTER_NS`:
/// ceding this early for them slows down a stream of submissions from a plain thread, as in
/// `spawn_remote`.)
const ROUSED_AFTER_NS: u64 = 50_000;
/// At most this many `sched_yield`s in a row per cede, each of which came straight back
/// (see `cede_to`).
const CEDE_TRIES: u32 = 16;
/// A `sched_yield` that takes this long gave the CPU to some thread.
const CEDE_QUICK_NS: u64 = 20_000;
/// An idle worker releases burst stacks only if no timer is due within this long.
const TRIM_QUIET: Duration = Duration::from_millis(50);
/// How many idle stacks a worker releases per sleep, and how long it sleeps between batches.
const TRIM_BATCH: usize = 64;
const TRIM_PAUSE: Duration = Duration::from_millis(5);
/// Empty slabs of task cells (2 MiB each) an idle worker unmaps at a time.
const TRIM_SLABS: usize = 8;
/// How long an idle worker looks for work before it sleeps: the first half with a short
/// pause between looks, so work a busy peer queues is taken within a microsecond or two
/// (before the peer gets to it itself), the second half yielding the thread between looks.
const SPIN_FOR: Duration = Duration::from_micros(50);
/// Pause instructions between two looks of a spinning worker.
const SPIN_PAUSES: u32 = 32;

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
}

/// What other threads may touch of a worker.
pub(crate) struct WorkerShared {
    pub(crate) inbox: SegQueue<ScheduleTask>,
    pub(crate) local: ArrayQueue<JobRef>,
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

const HELP_NONE: u8 = 0;
/// Being written or answered.
const HELP_CLAIMED: u8 = 1;
const HELP_ASKED: u8 = 2;

/// A request for help with the task in a worker's `next` slot: made by the worker when one of
/// its fibers spawns (the spawner may keep running), or by an idle peer on its behalf before
/// it sleeps; answered by the next idle peer that looks (see `Worker::answer_help_request`). One at
/// a time per worker: while one is open, spawns wake nobody else.
#[derive(Default)]
struct HelpSlot {
    state: AtomicU8,
    /// The worker's progress when the request was made.
    progress: AtomicU32,
    /// When, in nanoseconds since the scheduler's epoch.
    at: AtomicU64,
}

impl HelpSlot {
    /// Claims the slot to open a request, if none is open.
    fn claim(&self) -> bool {
        self.state.load(Ordering::Relaxed) == HELP_NONE
            && self
                .state
                .compare_exchange(
                    HELP_NONE,
                    HELP_CLAIMED,
                    Ordering::Acquire,
                    Ordering::Relaxed,
                )
                .is_ok()
    }

    /// Opens the request claimed, made at `at` when the asker's progress was `progress`.
    fn open(&self, progress: u32, at: u64) {
        self.progress.store(progress, Ordering::Relaxed);
        self.at.store(at, Ordering::Relaxed);
        self.state.store(HELP_ASKED, Ordering::Release);
    }

    /// Takes the open request to answer it, if there is one: its progress and time.
    fn take(&self) -> Option<(u32, u64)> {
        let taken = self.state.load(Ordering::Acquire) == HELP_ASKED
            && self
                .state
                .compare_exchange(
                    HELP_ASKED,
                    HELP_CLAIMED,
                    Ordering::Acquire,
                    Ordering::Relaxed,
                )
                .is_ok();
        taken.then(|| {
            (
                self.progress.load(Ordering::Relaxed),
                self.at.load(Ordering::Relaxed),
            )
        })
    }

    /// Frees the slot claimed (answered, or not opened after all).
    fn close(&self) {
        self.state.store(HELP_NONE, Ordering::Release);
    }
}

/// What an idle worker found when it looked for a request for help.
enum HelpAnswer {
    None,
    /// The asker had moved on: its task runs there.
    Stale,
    /// The request of this peer stays open, to be answered at this instant.
    Wait(Instant, usize),
    Taken(ScheduleTask),
}

/// A value on a cache line of its own, so the owner's writes do not slow its neighbours.
#[repr(align(128))]
pub(crate) struct Padded<T>(pub(crate) T);

/// State shared by a scheduler's handle, its workers and every task it runs.
pub(crate) struct Shared {
    pub(crate) config: Config,
    pub(crate) workers: Box<[WorkerShared]>,
    pub(crate) injector: Injector,
    pub(crate) phase: PhaseWord,
    /// Tasks admitted and not yet done, on a line per worker (see `live.rs`).
    live: LiveCount,
    idle: Idlers,
    /// Tasks cancelled (or failed unstarted, or abandoned) by the shutdown so far.
    pub(crate) cancelled: AtomicUsize,
    /// Readiness continuations registered and not yet submitted (each is also in `live`).
    pub(crate) continuations: AtomicUsize,
    /// Bumped to ask every worker to print its live fibers (a shutdown that takes long).
    report: AtomicUsize,
    /// Who waits in `wait_drained`: fibers of other schedulers park, threads block.
    drained: Lock<WaitList<()>>,
    /// With `use_caller`: the thread that is worker 0.
    pub(crate) owner: Option<ThreadId>,
    /// The origin of the help requests' clock; when the scheduler was built.
    pub(crate) epoch: Instant,
    /// The watchdog's monitor thread's sleep.
    pub(crate) monitor: Arc<MonitorCtl>,
    /// The earliest deadline of the `stop_timeout` calls made inside this scheduler's own
    /// fibers, kept by one thread (see `sched::keep_deadline_elsewhere`).
    pub(crate) kept_deadline: parking_lot::Mutex<Option<Instant>>,
}

impl Shared {
    pub(crate) fn new(config: Config) -> Arc<Shared> {
        let n = config.threads;
        let owner = config.use_caller.then(|| std::thread::current().id());
        Arc::new(Shared {
            workers: (0..n)
                .map(|_| WorkerShared {
                    inbox: SegQueue::new(),
                    local: ArrayQueue::new(LOCAL_CAPACITY),
                    next: Padded(TaskSlot::new()),
                    sleep: WorkerSleep::new(),
                    progress: Padded(AtomicU32::new(0)),
                    cpu: Padded(AtomicU32::new(u32::MAX)),
                    help: HelpSlot::default(),
                    wakers: WakerCount::new(),
                    stats: Padded(WorkerStats::default()),
                    watch: Watch::new(),
                    absent: AtomicBool::new(false),
                })
                .collect(),
            injector: Injector::new(),
            phase: PhaseWord::new(),
            live: LiveCount::new(n),
            idle: Idlers::new(n),
            cancelled: AtomicUsize::new(0),
            kept_deadline: parking_lot::Mutex::new(None),
            continuations: AtomicUsize::new(0),
            report: AtomicUsize::new(0),
            drained: Lock::new(WaitList::new()),
            owner,
            config,
            epoch: Instant::now(),
            monitor: Arc::new(MonitorCtl::new()),
        })
    }

    /// Nanoseconds since `epoch`.
    fn now_ns(&self) -> u64 {
        u64::try_from(self.epoch.elapsed().as_nanos()).unwrap_or(u64::MAX)
    }

    /// Counts a new task in, unless the scheduler refuses work. Fibers of this scheduler may
    /// still submit while it drains (they are finishing submitted work).
    pub(crate) fn admit(&self) -> bool {
        let here = self.local_worker().map(|w| w.index);
        self.live.admit(here);
        let phase = self.phase.get();
        let ok = phase < Phase::Stopping
            || (phase == Phase::Stopping && fiber::in_scheduled_fiber() && here.is_some());
        if !ok {
            self.task_done(here);
        }
        ok
    }

    /// Fails a task that never started as cancelled by the shutdown (counted for
    /// `stop_timeout`'s return) and counts it out, on the line of `worker` (see `task_done`).
    pub(crate) fn fail_unstarted(&self, job: JobRef, worker: Option<usize>) {
        self.cancelled.fetch_add(1, Ordering::Relaxed);
        job.fail(JoinError::cancelled());
        self.task_done(worker);
    }

    /// Counts a task out, on the line of `worker` (the calling thread's worker of this
    /// scheduler, which its callers know; `None` elsewhere); the last one during shutdown
    /// lets everybody go.
    pub(crate) fn task_done(&self, worker: Option<usize>) {
        self.live.done(worker);
        // Tasks that end at once may each see zero here, and each wake everybody: harmless.
        // The last of them sees every other's count-out (all are SeqCst), so one does.
        if self.phase.get() >= Phase::Stopping && self.live() == 0 {
            self.wake_all();
            self.notify_drained();
        }
    }

    /// Tasks admitted and not yet done (see `LiveCount::get`).
    pub(crate) fn live(&self) -> usize {
        self.live.get()
    }

    /// Waits until no task is alive, or until `deadline`. Returns whether drained.
    ///
    /// Inside a fiber (of another scheduler: this one's own fibers do not wait for the
    /// others) it parks the fiber, which may be cancelled meanwhile; on a thread it blocks.
    pub(crate) fn wait_drained(&self, deadline: Option<Instant>) -> bool {
        loop {
            let g = self.drained.lock();
            if self.live() == 0 {
                return true;
            }
            let r = wait(
                g,
                |list| list,
                (),
                deadline,
                WaitOn::Other("a scheduler's stop"),
                || {},
                |_, _| {},
            );
            if let Wait::TimedOut(_) = r {
                return self.live() == 0;
            }
        }
    }

    /// Wakes whoever waits in `wait_drained` to look at the clock or the phase again.
    pub(crate) fn notify_drained(&self) {
        let mut g = self.drained.lock();
        let (list, wakes) = g.parts();
        list.wake_all(0, wakes);
    }

    /// `stop_timeout`'s deadline passed: every live fiber is to be cancelled once, and
    /// readiness continuations (no fiber to unwind) are dropped here.
    pub(crate) fn begin_cancelling(&self) {
        self.phase.advance_to(Phase::Cancelling);
        if let Some(r) = crate::io::reactor::get() {
            let n = r.cancel_continuations(self);
            self.cancelled.fetch_add(n, Ordering::SeqCst);
        }
        self.wake_all();
        self.notify_drained();
    }

    /// The grace after cancelling ran out: fibers still alive are abandoned.
    pub(crate) fn begin_abandoning(&self) {
        self.phase.advance_to(Phase::Abandoning);
        self.wake_all();
        self.notify_drained();
    }

    /// Asks every worker to print its live fibers on stderr.
    pub(crate) fn request_report(&self) {
        self.report.fetch_add(1, Ordering::SeqCst);
        self.wake_all();
    }

    pub(crate) fn wake_all(&self) {
        for w in self.workers.iter() {
            w.sleep.wake();
        }
    }

    /// Wakes one sleeping worker for new shareable work, unless a spinning one will find it.
    pub(crate) fn notify_one(&self) {
        if let Some(i) = self.idle.to_wake() {
            self.workers[i].sleep.wake();
        }
    }

    /// The worker of *this* scheduler running on the current thread, if any.
    pub(crate) fn local_worker(&self) -> Option<&Worker> {
        let w = CURRENT_WORKER.with(|c| c.get());
        // SAFETY: CURRENT_WORKER is non-null only while `Worker::run` is on the stack of this
        // thread, which keeps the worker alive.
        let w = unsafe { w.as_ref() }?;
        std::ptr::eq(Arc::as_ptr(&w.shared), self).then_some(w)
    }

    /// Queues a task that has never run.
    pub(crate) fn schedule_new(&self, job: JobRef) {
        let here = self.local_worker();
        match job.header().pinned {
            Some(i) => {
                self.workers[i].inbox.push(ScheduleTask::New(job));
                if here.map(|w| w.index) != Some(i) {
                    self.workers[i].sleep.wake();
                }
            }
            None => match here {
                // A standalone fiber's spawn goes to the injector: the standalone fiber
                // holds the worker's thread while it waits, so nobody would run `next`.
                Some(w) if fiber::in_scheduled_fiber() => w.push_next(job),
                _ => {
                    self.injector.push(job);
                    self.notify_one();
                }
            },
        }
    }
}

impl Drop for Shared {
    /// Waits out wakers still touching a worker (see
    /// `park::protocol::unpark_fiber`): a few instructions.
    fn drop(&mut self) {
        self.monitor.stop();
        for w in self.workers.iter() {
            w.wakers.wait_out();
        }
        while CANCELLERS.load(Ordering::SeqCst) != 0 {
            std::thread::yield_now();
        }
    }
}

/// The worker's reference to the fiber it resumes: counted, or an alias of the registry's.
enum ResumeRef {
    /// A counted reference of the worker's own: the one a run queue held (and that moves
    /// on to `ready`, an `Unparker` or `finish`).
    Counted(JobRef),
    /// A new task's first run: the registry's reference, aliased without a count. A
    /// reference of its own is cloned only if the fiber suspends; a task that ends in its
    /// first run (most short ones) has its count touched once, by the registry's drop,
    /// instead of three times (a clone for the registry, and two drops).
    RegistryAlias(ManuallyDrop<JobRef>),
}

impl ResumeRef {
    /// An alias of `job`'s reference.
    ///
    /// # Safety
    /// `job` goes into the registry before the alias is used, and stays there until `finish`
    /// has made its last use of the alias (it keeps the unregistered reference to the end).
    #[inline(always)]
    unsafe fn alias_of_registered(job: &JobRef) -> ResumeRef {
        // SAFETY: an alias that is never dropped (`ManuallyDrop`), so it takes back nothing;
        // per the caller, the cell outlives it.
        ResumeRef::RegistryAlias(ManuallyDrop::new(unsafe {
            TaskArc::from_raw(TaskArc::cell_ptr(job))
        }))
    }

    /// A reference of the worker's own: the one it holds, or a new one.
    #[inline(always)]
    fn into_owned(self) -> JobRef {
        match self {
            ResumeRef::Counted(job) => job,
            ResumeRef::RegistryAlias(alias) => JobRef::clone(&alias),
        }
    }
}

impl std::ops::Deref for ResumeRef {
    type Target = JobRef;

    #[inline(always)]
    fn deref(&self) -> &JobRef {
        match self {
            ResumeRef::Counted(job) => job,
            ResumeRef::RegistryAlias(alias) => alias,
        }
    }
}

thread_local! {
    /// The worker whose loop runs on this thread, or null.
    static CURRENT_WORKER: Cell<*const Worker> = const { Cell::new(std::ptr::null()) };
    /// This thread is a worker's copied into the child of a `fork` (see `forked_in_child`).
    static FORKED: Cell<bool> = const { Cell::new(false) };
}

/// In the child of a `fork`, on the forking thread. If it is a worker thread, it is the copy
/// of one worker of a scheduler whose other threads the child does not have, with copies of
/// that scheduler's fibers in its queues: running them would repeat their effects (a copied
/// fiber accepted the parent's connection, say). So the fiber that forked goes on as code on
/// a plain thread would (no fiber is current: its waits block the thread, `spawn` panics),
/// and the worker loop never runs again: when that fiber ends, the child exits (`_exit`,
/// status 0, or 101 if it panicked).
pub(crate) fn forked_in_child() {
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

/// Calls `f` with the shared state of the scheduler whose worker runs on this thread, if any,
/// borrowed (no reference count taken). `f` must not park the calling fiber.
#[cfg(feature = "tokio")]
pub(crate) fn with_current_shared<R>(f: impl FnOnce(Option<&Shared>) -> R) -> R {
    let w = CURRENT_WORKER.with(|c| c.get());
    // SAFETY: see `Shared::local_worker`; the worker, which owns a reference to the shared
    // state, stays alive while its loop is below us on this thread, and `f` does not leave
    // this thread (it may not park).
    f(unsafe { w.as_ref() }.map(|w| &*w.shared))
}

/// The worker whose loop runs on this thread, of whichever scheduler, or null. While its
/// loop is on this thread's stack it stays alive (see `Shared::local_worker`).
#[inline(always)]
pub(crate) fn this_thread_worker() -> *const Worker {
    CURRENT_WORKER.with(|c| c.get())
}

/// The shared state of the scheduler whose worker runs on this thread, if any.
pub(crate) fn current_shared() -> Option<Arc<Shared>> {
    let w = CURRENT_WORKER.with(|c| c.get());
    // SAFETY: see `Shared::local_worker`.
    unsafe { w.as_ref() }.map(|w| w.shared.clone())
}

/// Fails the tasks queued for worker `index`, which is `absent` (its thread never started,
/// and never will), from whichever thread finds them: the shutdown that marked it, and a
/// submit that queued a task for it and then saw the mark (so that a task queued while the
/// shutdown drained is not left behind). No fiber ever started there, so there is none to
/// wake or cancel; a dump gets an empty answer.
pub(crate) fn fail_queued_of_absent(shared: &Shared, index: usize) {
    let worker = &shared.workers[index];
    debug_assert!(worker.absent.load(Ordering::Relaxed));
    loop {
        let job = match worker.inbox.pop() {
            Some(ScheduleTask::New(job)) => job,
            Some(ScheduleTask::Dump(req)) => {
                req.answer(index, Vec::new(), Duration::ZERO, Duration::ZERO);
                continue;
            }
            Some(ScheduleTask::Fiber(_) | ScheduleTask::Cancel(_)) => continue,
            None => match worker.local.pop().or_else(|| worker.next.0.take()) {
                Some(job) => job,
                None => return,
            },
        };
        shared.fail_unstarted(job, Some(index));
    }
}

/// Fails the tasks of the shared injector, from a shutdown that found no worker to take
/// them (see `Scheduler::spawn_workers_for_shutdown`).
pub(crate) fn fail_injected(shared: &Shared) {
    while let Some(job) = shared.injector.pop(false) {
        shared.fail_unstarted(job, None);
    }
}

/// Threads between their check that a task is not done and their last touch of its home
/// worker in `cancel_started`, across every scheduler (cancels are rare); `Shared`'s
/// destructor waits them out.
static CANCELLERS: AtomicUsize = AtomicUsize::new(0);

/// `JoinHandle::cancel` of a started task: its home worker delivers it, between fibers (see
/// `Worker::deliver_cancel`). A task not done yet keeps its scheduler's shared state alive
/// (see `park::protocol::unpark_fiber`), and from our check on `CANCELLERS` keeps that state's destructor
/// waiting: it comes after the task's completion, which comes after our check in the SeqCst
/// order, so it sees our count.
pub(crate) fn cancel_started(job: JobRef) {
    CANCELLERS.fetch_add(1, Ordering::SeqCst);
    let h = job.header();
    if !h.is_done_seqcst() {
        // SAFETY: the task has started, so its placement was written before the STARTED
        // bit our caller saw (Acquire), and the shared state is alive (see above).
        let (sched, worker) = unsafe {
            let p = &*h.placement.get();
            (&*p.sched, p.worker)
        };
        let target = &sched.workers[worker];
        target.inbox.push(ScheduleTask::Cancel(job));
        target.sleep.wake();
    }
    CANCELLERS.fetch_sub(1, Ordering::SeqCst);
}

/// Pops from a `SegQueue`, looking first: crossbeam's `pop` issues a SeqCst fence when it
/// finds the queue empty, and an empty inbox or injector is the common case on the hot path.
/// A push racing with the look is found on the next pass; sleeping is guarded separately by
/// the idle protocol's fences.
#[inline]
pub(super) fn pop<T>(q: &SegQueue<T>) -> Option<T> {
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

/// Yields this thread's CPU until `peer` has moved on from `progress`, that is, until it ran.
/// A yield that comes straight back gave the CPU to nobody: the kernel picked this thread
/// again, and each further yield moves it back in the kernel's order (EEVDF pushes a yielding
/// task's virtual deadline back by a slice), so a few more reach the peer. A yield that took
/// a while gave the CPU to some thread: if the peer has not moved, it was another one, the
/// peer waits on another CPU (moved there before it could publish that), and more yields
/// would only feed that thread.
fn cede_to(peer: &WorkerShared, progress: u32) {
    for _ in 0..CEDE_TRIES {
        let before = crate::sys::mono_ns();
        // SAFETY: a system call without arguments.
        unsafe { libc::sched_yield() };
        if peer.progress() != progress
            || crate::sys::mono_ns().saturating_sub(before) >= CEDE_QUICK_NS
        {
            return;
        }
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

/// What a worker saw of a peer the last time it looked for one waiting for its CPU.
#[derive(Clone, Copy)]
struct PeerSeen {
    /// The peer's `progress`, and when (`CLOCK_MONOTONIC` ns) this worker saw it change.
    progress: u32,
    since: u64,
    /// This worker yielded its CPU to the peer since then.
    ceded: bool,
}

/// One worker's private state. Lives on its thread (or, for `use_caller`'s worker 0, in the
/// `Scheduler` between drives).
pub(crate) struct Worker {
    pub(crate) shared: Arc<Shared>,
    pub(crate) index: usize,
    ready: RefCell<VecDeque<JobRef>>,
    /// Every live fiber homed here, so cancellation can find parked ones.
    registry: RefCell<Vec<JobRef>>,
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
    spill_buf: RefCell<Vec<JobRef>>,
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
    /// A coarse `CLOCK_MONOTONIC` reading (ns), refreshed every `CLOCK_INTERVAL` ticks and
    /// after a sleep: when fibers switched out, for the dump.
    clock: Cell<u64>,
    /// Dumps being answered, a chunk per pass (see `dump_step`); `dumping` while any is.
    dumps: RefCell<Vec<PartialDump>>,
    dumping: Cell<bool>,
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

/// A dump this worker is answering.
struct PartialDump {
    req: Arc<DumpRequest>,
    /// Registry slots below this are still to be listed.
    cursor: usize,
    entries: Vec<Entry>,
    /// The longest chunk and all chunks together, in ns.
    longest: u64,
    total: u64,
}

/// The peers recruited to help with one fiber's spawns, and how many tasks were dealt.
#[derive(Default)]
struct SpawnBurst {
    /// The worker's tick when the burst began: a later tick means another fiber runs.
    tick: u32,
    peers: Vec<usize>,
    dealt: usize,
}

/// Restores `CURRENT_WORKER` when a drive ends, even by unwinding, and counts the drive's
/// time.
struct ExitWorker<'a>(*const Worker, &'a Worker, *const FiberMeta);

impl Drop for ExitWorker<'_> {
    fn drop(&mut self) {
        CURRENT_WORKER.with(|c| c.set(self.0));
        fiber::leave(self.2);
        // This thread no longer polls for anyone: make sure somebody does.
        if let Some(reactor) = crate::io::reactor::get() {
            reactor.hand_off();
        }
        let st = self.1.stats();
        // Until the next drive, the last fiber may end elsewhere (abandoned) or its worker
        // be dropped: nobody may read it through `current` any more.
        self.1.own_shared().watch.retire(&st.current);
        let since = st.run_since.get();
        st.run_ns.add(crate::sys::mono_ns().saturating_sub(since));
        st.run_since.set_seqcst(0);
    }
}

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
        // A progress no peer has yet: the first look at a peer only starts its clock.
        let unseen = PeerSeen {
            progress: u32::MAX,
            since: 0,
            ceded: false,
        };
        let peers_seen = RefCell::new(vec![unseen; shared.workers.len()].into_boxed_slice());
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
            clock: Cell::new(crate::sys::coarse_ns()),
            dumps: RefCell::new(Vec::new()),
            dumping: Cell::new(false),
        }
    }

    #[inline(always)]
    fn own_shared(&self) -> &WorkerShared {
        // SAFETY: points into `self.shared`, which this worker keeps alive (and an `Arc`'s
        // contents never move); only shared references are made.
        unsafe { self.own_shared.0.as_ref() }
    }

    #[inline(always)]
    fn stats(&self) -> &WorkerStats {
        &self.own_shared().stats.0
    }

    /// Publishes the sizes of the ready queue and the stack pool: every `CLOCK_INTERVAL`
    /// passes and before a sleep, not at every change. (The registry's size, which placement
    /// reads, is published at every change: see `launch`, `unregister`, `abandon_all`.)
    fn publish_gauges(&self) {
        let st = self.stats();
        st.ready.set(self.ready.borrow().len() as u64);
        st.stacks_cached.set(self.stacks.borrow().cached() as u64);
    }

    /// The home-only state of `job`, a task this worker has started (see `HomeOnly`).
    ///
    /// Every touch of that state goes through here. Each use is a short borrow that ends
    /// before anything else can reach the same state: the worker is single-threaded, and
    /// the fiber itself runs (and writes its `ended`, through a raw pointer to that field
    /// alone) only inside `resume`, while the worker holds nothing of it but the coroutine.
    #[allow(clippy::mut_from_ref)]
    #[inline(always)]
    pub(crate) fn home<'j>(&self, job: &'j dyn Job) -> &'j mut HomeOnly {
        let h = job.header();
        // SAFETY: `placement` is written once, by this worker, before any call of `home`.
        let placement = unsafe { &*h.placement.get() };
        debug_assert!(
            std::ptr::eq(placement.sched, Arc::as_ptr(&self.shared))
                && placement.worker == self.index,
            "home state touched by a worker that is not the task's home"
        );
        // SAFETY: `job` is homed on this worker (asserted above), and only its home worker
        // touches its home state: on the worker's own thread, or — worker 0 of `use_caller`
        // abandoned by the stopping thread — while no thread drives this worker. No other
        // borrow of it is alive (see above), so this `&mut` is unique for its short life.
        unsafe { &mut *h.home.get() }
    }

    /// Runs the loop until `until()` holds or the scheduler has shut down. `wake_at` bounds
    /// every sleep, for a caller that must look at the clock (`stop_timeout` on worker 0).
    pub(crate) fn run(&self, until: &impl Fn() -> bool, wake_at: Option<Instant>) {
        let prev = CURRENT_WORKER.with(|c| c.replace(self));
        // Driven from a standalone fiber (`use_caller`'s `block_on` in one): the loop is
        // worker code, not that fiber's; it is the current fiber again when the loop ends.
        let outer = fiber::leave_all();
        let _restore = ExitWorker(prev, self, outer);
        crate::stack::overflow::ensure_alt_stack(false);
        self.stats()
            .run_since
            .set_seqcst(crate::sys::mono_ns().max(1));
        self.shared.monitor.nudge();
        loop {
            if until() {
                return;
            }
            if self.shutdown_pending() {
                self.catch_up();
                if self.phase.get() >= Phase::Abandoning {
                    return;
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

    /// Whether the shutdown phase moved past what this worker acted on. (A report request is
    /// looked at only on the way to sleep: it comes from a shutdown waiting for idle workers,
    /// and the busy loop should not load one more shared word per task.)
    #[inline]
    fn shutdown_pending(&self) -> bool {
        Phase::from_u8(self.shared.phase.0.load(Ordering::Relaxed)) > self.phase.get()
    }

    fn report_pending(&self) -> bool {
        self.shared.report.load(Ordering::Relaxed) != self.reported.get()
    }

    /// Acts on every shutdown phase this worker has not acted on yet, in order.
    fn catch_up(&self) {
        let report = self.shared.report.load(Ordering::SeqCst);
        if report != self.reported.get() {
            self.reported.set(report);
            self.report_live("still alive");
        }
        let target = self.shared.phase.get();
        while self.phase.get() < target.min(Phase::Abandoning) {
            let next = Phase::from_u8(self.phase.get() as u8 + 1);
            self.phase.set(next);
            match next {
                Phase::Discarding => self.discard_queued(),
                Phase::Cancelling => {
                    self.discard_queued();
                    self.cancel_all();
                    if target >= Phase::Abandoning {
                        // This worker comes late (its thread did not run during the whole
                        // grace): its fibers still get their cancellation, once, before
                        // they are abandoned, so their destructors run.
                        self.deliver_cancellations_now();
                    }
                }
                Phase::Abandoning => self.abandon_all(),
                _ => {}
            }
        }
    }

    /// Resumes, once each, the fibers queued on this worker now (those `cancel_all` just
    /// woke, and those already ready), so that each gets its cancellation before the
    /// worker abandons what is left. Woken ones queued meanwhile wait for the abandon.
    fn deliver_cancellations_now(&self) {
        let queued: Vec<JobRef> = self.ready.borrow_mut().drain(..).collect();
        for job in queued {
            self.resume(ResumeRef::Counted(job));
        }
        // What is in the inbox now, not what other threads keep sending.
        for _ in 0..self.own_shared().inbox.len() {
            let Some(task) = self.pop_inbox() else {
                break;
            };
            self.run_task(task);
        }
    }

    fn should_exit(&self) -> bool {
        let phase = self.shared.phase.get();
        (phase >= Phase::Stopping && self.shared.live() == 0) || phase >= Phase::Abandoning
    }

    #[inline(always)]
    fn next_task(&self) -> Option<ScheduleTask> {
        let tick = self.tick.get().wrapping_add(1);
        self.tick.set(tick);
        self.own_shared().progress.0.store(tick, Ordering::Relaxed);
        // A yield goes behind outside submissions too, on the least loaded worker (see
        // `least_loaded`); with many fibers ready, at every other yield, so that they keep
        // running while a stream of submissions lasts.
        if self.yielded.replace(false)
            && !self.shared.injector.is_empty()
            && (tick & 1 == 0 || self.ready.borrow().len() <= YIELD_PULL_READY_MAX)
            && self.least_loaded()
        {
            if let Some(job) = self.take_injected() {
                return Some(ScheduleTask::New(job));
            }
        }
        if tick.is_multiple_of(TIMER_INTERVAL) {
            self.fire_timers();
            self.every_few_passes(tick);
        } else {
            if self.timers_capped.get() {
                self.fire_timers();
            }
            if self.dumping.get() {
                // A dump in progress takes a chunk at every pass, so that a worker running
                // fibers that each take a while still answers within a few of them per chunk.
                self.dump_step();
            }
        }
        if tick.is_multiple_of(IO_POLL_INTERVAL) {
            poll_io_now();
        }
        if tick.is_multiple_of(INJECTOR_INTERVAL)
            && (tick.is_multiple_of(4 * INJECTOR_INTERVAL) || self.least_loaded())
        {
            if let Some(job) = self.take_injected() {
                return Some(ScheduleTask::New(job));
            }
        }
        if self.next_streak.get() < MAX_NEXT_STREAK {
            if let Some(job) = self.pop_next() {
                self.next_streak.set(self.next_streak.get() + 1);
                return Some(ScheduleTask::New(job));
            }
        }
        self.next_streak.set(0);
        if let Some(task) = self.pop_inbox() {
            return Some(task);
        }
        let from_ready = || self.ready.borrow_mut().pop_front().map(ScheduleTask::Fiber);
        let from_local = || self.pop_own_local().map(ScheduleTask::New);
        let local = if tick & 1 == 0 {
            from_ready().or_else(from_local)
        } else {
            from_local().or_else(from_ready)
        };
        if local.is_some() {
            return local;
        }
        if let Some(job) = self.pop_next() {
            return Some(ScheduleTask::New(job));
        }
        if self.fire_timers() {
            return self.ready.borrow_mut().pop_front().map(ScheduleTask::Fiber);
        }
        self.dry_tick.set(tick);
        self.take_injected()
            .map(ScheduleTask::New)
            .or_else(|| self.steal())
    }

    /// Pops this worker's `next` slot, unless it is known empty.
    #[inline]
    fn pop_next(&self) -> Option<JobRef> {
        pop_own(&self.next_maybe, || self.own_shared().next.0.take())
    }

    /// Pops this worker's stealable queue, unless it is known empty.
    #[inline]
    fn pop_own_local(&self) -> Option<JobRef> {
        pop_own(&self.local_maybe, || pop_local(&self.own_shared().local))
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
    fn least_loaded(&self) -> bool {
        let mine = self.registry.borrow().len() as u64;
        mine <= FEW_FIBERS
            || self
                .shared
                .workers
                .iter()
                .all(|w| w.stats.0.fibers.get() + 1 >= mine)
    }

    /// The chores of every `TIMER_INTERVAL`-th pass: the next chunk of a dump in progress
    /// (the other passes take one too), every `CLOCK_INTERVAL` ticks the coarse clock and the ready gauge, and the look for a
    /// peer waiting for this worker's CPU (`cede_cpu`).
    #[inline]
    fn every_few_passes(&self, tick: u32) {
        if self.dumping.get() {
            self.dump_step();
        }
        if tick.is_multiple_of(CLOCK_INTERVAL) {
            self.clock.set(crate::sys::coarse_ns());
            self.publish_gauges();
        }
        if self.shared.workers.len() > 1 {
            if tick.wrapping_sub(self.dry_tick.get()) >= REBALANCE_AFTER {
                self.rebalance();
            }
            self.cede_cpu();
        }
    }

    /// Yields this thread's CPU to a peer worker that waits for it.
    ///
    /// A started fiber never moves, so while the kernel keeps a worker thread off its CPU,
    /// that worker's fibers wait, however idle the others are. When two workers share one
    /// CPU (more runnable threads than CPUs: a load generator on the same machine, other
    /// processes; or a kernel that packs threads onto few CPUs), the kernel alternates them
    /// in slices of a few milliseconds, and the waiting one's fibers see that as latency.
    /// So a worker that finds a peer on its own CPU, awake, with tasks waiting and no
    /// progress for `CEDE_AFTER_NS`, calls `sched_yield` until the peer runs (`cede_to`),
    /// once per wait; that peer does the same in turn. So it does for a peer woken from its
    /// sleep whose thread has not run since, wherever it last ran, while work that peer
    /// could take waits: for `CEDE_AFTER_NS` while outside submissions wait, for
    /// `ROUSED_AFTER_NS` while a burst of tasks spawned on this worker waits on its
    /// stealable queue. The kernel may have queued it on this CPU, and it can publish
    /// neither that nor the work (not in its queues); left waiting, it would see this
    /// worker start all of it, and started fibers never move. (Not otherwise: a peer woken
    /// elsewhere, behind some other thread, gains nothing from this worker's yield, which
    /// may hand this CPU to that other thread; nor for the work in its own queues, which
    /// only it can run.) Workers busy on separate CPUs never cede, and pay a `sched_getcpu`
    /// (a few ns through rseq) and two cached loads per peer: a peer's CPU is in a line it
    /// rewrites only when it moves, its sleep state in one written only by sleeps and
    /// wakes. See docs/design.md, "Sharing a CPU".
    fn cede_cpu(&self) {
        let Some(cpu) = self.publish_cpu() else {
            return;
        };
        for (j, peer) in self.shared.workers.iter().enumerate() {
            if j == self.index {
                continue;
            }
            let roused = self.cede_after_for_woken_peer(peer);
            if (peer.cpu.0.load(Ordering::Relaxed) == cpu || roused.is_some())
                && self.cede_if_waiting(j, peer, roused)
            {
                return;
            }
        }
    }

    /// `cede_cpu` for peer `j`, which shares this worker's CPU or was woken and has not run
    /// yet (`roused`: how long it may wait, see `cede_after_for_woken_peer`): cedes it if the peer waits
    /// for it (see there); whether it did. A peer's wait starts when this worker first sees
    /// it with no new progress: every pass of a worker's loop, the one after a wake-up
    /// included, moves its progress on.
    #[cold]
    #[inline(never)]
    fn cede_if_waiting(&self, j: usize, peer: &WorkerShared, roused: Option<u64>) -> bool {
        let now = crate::sys::mono_ns();
        let progress = peer.progress();
        let s = &mut self.peers_seen.borrow_mut()[j];
        if s.progress != progress || peer.is_quiet() || (peer.waiting() == 0 && roused.is_none()) {
            *s = PeerSeen {
                progress,
                since: now,
                ceded: false,
            };
            return false;
        }
        let after = roused.unwrap_or(CEDE_AFTER_NS);
        if s.ceded || now.saturating_sub(s.since) < after {
            return false;
        }
        // Once per wait: a peer that has not moved after `cede_to` waits elsewhere.
        s.ceded = true;
        self.stats().cedes.add(1);
        cede_to(peer, progress);
        true
    }

    /// If `peer` was woken from its sleep and has not run since while work it could take
    /// waits, how long it may go on waiting before this worker yields to it (it may be
    /// queued on this CPU, see `cede_cpu`): `ROUSED_AFTER_NS` while unstarted tasks wait on
    /// this worker's stealable queue (a burst spawned here, which this worker starts at
    /// every other pass meanwhile), else `CEDE_AFTER_NS` while outside submissions wait
    /// (any idle worker may take those, and a yield may give this CPU to their submitter).
    /// `None` otherwise, work in its own queues alone included (a wake of one of its fibers,
    /// a pinned task): only it can run that, wherever it waits, and a peer that woke it has
    /// no share to lose.
    fn cede_after_for_woken_peer(&self, peer: &WorkerShared) -> Option<u64> {
        if !peer.sleep.is_roused() {
            None
        } else if !self.own_shared().local.is_empty() {
            Some(ROUSED_AFTER_NS)
        } else if !self.shared.injector.is_empty() {
            Some(CEDE_AFTER_NS)
        } else {
            None
        }
    }

    /// Publishes the CPU this thread runs on, if it changed, and returns it (`None` if the
    /// kernel cannot tell).
    fn publish_cpu(&self) -> Option<u32> {
        let cpu = crate::sys::current_cpu()?;
        let slot = &self.own_shared().cpu.0;
        if slot.load(Ordering::Relaxed) != cpu {
            slot.store(cpu, Ordering::Relaxed);
        }
        Some(cpu)
    }

    /// Takes a task submitted from outside, or one that a full stealable queue moved out
    /// (see `Injector`). If more wait, gets another idle worker looking (unless one spins
    /// already): a worker woken for the first of a batch must not end up starting them all,
    /// since a started fiber never moves (Go's spinning-M handoff).
    fn take_injected(&self) -> Option<JobRef> {
        let spill_first = !self.spill_first.get();
        self.spill_first.set(spill_first);
        let job = self.shared.injector.pop(spill_first)?;
        self.stats().injected.add(1);
        if !self.shared.injector.is_empty() {
            self.shared.notify_one();
        }
        Some(job)
    }

    /// Wakes fibers whose deadline has passed; returns whether any woke. It wakes them
    /// [`FIRE_BATCH`] at a time, the next batch once the last has been resumed, leaving the
    /// rest due for later passes of the loop (see `timers_capped`; an idle pass does not
    /// sleep while a timer is due), unless as many other fibers are ready: then every due
    /// one is woken, to wait its turn behind them as every other wake does.
    fn fire_timers(&self) -> bool {
        if self.timers.borrow().is_empty() {
            self.timers_capped.set(false);
            return false;
        }
        let ready = self.ready.borrow().len();
        // Each one counted is in `ready` until it is resumed (and uncounted, in `resume`).
        debug_assert!(self.timer_woken.get() <= ready);
        // Never more than are ready, whatever happens: with none ready, a batch is due.
        let queued = self.timer_woken.get().min(ready);
        let others = ready - queued;
        let limit = if others >= FIRE_BATCH {
            usize::MAX
        } else if queued == 0 {
            FIRE_BATCH
        } else {
            0
        };
        if limit == 0 {
            self.timers_capped.set(true);
            return false;
        }
        let now = Instant::now();
        let mut woken = 0;
        while woken < limit {
            let due = self.timers.borrow_mut().pop_due(now);
            let Some((job, gen)) = due else { break };
            let home = self.home(&*job);
            // The timer is gone, so the resumption must not cancel it again.
            home.timer = None;
            if job.header().park.notify(gen) {
                // The resumption tells the fiber its park timed out.
                home.timed_out = true;
                // Start bringing the stack in now, so that resuming the batch does not wait
                // for one miss after another.
                crate::stack::prefetch_near(home.meta.suspended_at.get());
                self.push_woken(job);
                woken += 1;
            }
        }
        self.timer_woken.set(queued + woken);
        self.timers_capped.set(woken == limit);
        self.stats().timers.set(self.timers.borrow().len() as u64);
        woken > 0
    }

    /// Takes a task from a random peer's stealable queue, and up to half of the rest.
    fn steal(&self) -> Option<ScheduleTask> {
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
                return Some(ScheduleTask::New(first));
            }
        }
        None
    }

    /// Takes a task from peer `v`'s stealable queue and half of the rest into this worker's.
    #[inline]
    fn steal_from(&self, v: usize) -> Option<JobRef> {
        let victim = &self.shared.workers[v].local;
        let available = victim.len();
        let first = pop_local(victim)?;
        let mut taken = 1;
        if available > 1 {
            // Half of the rest comes here below.
            self.local_maybe.set(true);
        }
        for _ in 0..available / 2 {
            let Some(job) = victim.pop() else { break };
            taken += 1;
            if let Err(job) = self.own_shared().local.push(job) {
                self.shared.injector.push(job);
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
    fn rebalance(&self) {
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

    /// Takes the task in a peer's `next` slot if that peer has been running one fiber for
    /// `NEXT_STEAL_AFTER` since `watch` first saw the task there (see `NEXT_STEAL_AFTER`).
    /// `watch` remembers the peer, its progress and when, across the rounds of one spin.
    fn steal_next(&self, watch: &mut Option<(usize, u32, Instant)>) -> Option<ScheduleTask> {
        let workers = &self.shared.workers;
        if let Some((v, progress, since)) = *watch {
            let w = &workers[v];
            if !w.next.0.is_empty() && w.progress.0.load(Ordering::Relaxed) == progress {
                if since.elapsed() < NEXT_STEAL_AFTER {
                    return None;
                }
                *watch = None;
                let taken = w.next.0.take().map(ScheduleTask::New);
                self.stats().steals.add(u64::from(taken.is_some()));
                return taken;
            }
            *watch = None;
        }
        let n = workers.len();
        let start = self.rng.get() as usize % n;
        for k in 0..n {
            let v = (start + k) % n;
            let w = &workers[v];
            if v != self.index && !w.next.0.is_empty() {
                *watch = Some((v, w.progress.0.load(Ordering::Relaxed), Instant::now()));
                break;
            }
        }
        None
    }

    /// A fiber of this worker spawned into the `next` slot and may keep running: unless a
    /// request for help is open already, or a peer spins (it watches the slot, see
    /// `steal_next`), wake a sleeping peer to answer one (Go wakes a P on every `go`
    /// statement by the same rule). Returns the peer woken.
    ///
    /// The woken peer does not spin: it takes the task only if this worker has not moved on
    /// since (see `answer_help_request`). A chain of spawns or a ping-pong pair, whose
    /// spawner suspends at once, keeps its tasks here (tokio keeps its LIFO slot out of
    /// thieves' reach for the same reason), and no peer spins next to the
    /// busy worker (on a VM or an SMT core, a spinner takes cycles from its neighbour).
    fn ask_help(&self) -> Option<usize> {
        let slot = &self.own_shared().help;
        if !slot.claim() {
            return None;
        }
        let Some(i) = self.shared.idle.to_help() else {
            slot.close();
            return None;
        };
        slot.open(self.tick.get(), self.shared.now_ns());
        self.shared.workers[i].sleep.wake();
        Some(i)
    }

    /// Opens a request for help on behalf of a peer whose `next` slot holds a task, if none
    /// is open: this worker is about to sleep, and the peer's own request may have missed
    /// its announcement. Returns when to answer it, and the peer.
    fn ask_help_for_peer(&self) -> Option<(Instant, usize)> {
        for (v, w) in self.shared.workers.iter().enumerate() {
            if v != self.index && !w.next.0.is_empty() && w.help.claim() {
                w.help
                    .open(w.progress.0.load(Ordering::Relaxed), self.shared.now_ns());
                return Some((Instant::now() + NEXT_STEAL_AFTER, v));
            }
        }
        None
    }

    /// Holds this worker on its CPU for a nap that watches `peer`, busy on another CPU, so
    /// that the nap's end cannot land on the peer's CPU and preempt it. A kernel that packs
    /// threads onto few CPUs may wake a watcher on its busy peer's CPU again and again,
    /// preempting a chain of spawns there while the watcher's own CPU idles (see
    /// docs/design.md, "A watcher naps on its own CPU"). On a kernel that wakes a thread on
    /// its idle CPU, the hold changes nothing. No
    /// hold where the CPUs are unknown or the same.
    fn hold_apart_from(&self, peer: usize) -> Option<crate::sys::CpuHold> {
        let mine = self.publish_cpu()?;
        let theirs = self.shared.workers[peer].cpu.0.load(Ordering::Relaxed);
        if theirs == u32::MAX || theirs == mine {
            return None;
        }
        crate::sys::CpuHold::on(mine)
    }

    /// Answers an open request for help: takes the asker's `next` task if the asker has not
    /// moved on for `NEXT_STEAL_AFTER`; closes the request if the asker has not moved on but
    /// its slot is empty (it is idle, or runs a fiber that spawned nothing), and at once if
    /// the asker sleeps with an empty slot (its loop moves its progress at every wake-up, so
    /// it would look busy). Never spins:
    /// woken before the grace, or finding that the asker moved on (it is busy, perhaps with a
    /// fiber that keeps running now), it keeps the request open — with the asker's progress
    /// of now — and naps until it can answer. Meanwhile the asker's spawns wake nobody: a
    /// worker busy with a chain of spawns costs its watcher one timer wake per grace, and
    /// pays no wake of a sleeping thread per spawn (a futex wake costs microseconds, more on
    /// a VM).
    fn answer_help_request(&self) -> HelpAnswer {
        let sh = &self.shared;
        let grace = NEXT_STEAL_AFTER.as_nanos() as u64;
        for (v, w) in sh.workers.iter().enumerate() {
            let slot = &w.help;
            let Some((progress, at)) = (v != self.index).then(|| slot.take()).flatten() else {
                continue;
            };
            if w.next.0.is_empty() && w.is_quiet() {
                // The asker sleeps with nothing to hand out: nothing to watch. (Its loop
                // moves its progress at every wake-up, so watching it would look busy.)
                slot.close();
                continue;
            }
            let now_progress = w.progress.0.load(Ordering::Relaxed);
            let now = sh.now_ns();
            let (progress, at) = if now_progress == progress {
                if now >= at + grace {
                    let taken = w.next.0.take();
                    slot.close();
                    return match taken {
                        Some(job) => HelpAnswer::Taken(ScheduleTask::New(job)),
                        None => HelpAnswer::Stale,
                    };
                }
                (progress, at)
            } else {
                // Moved on: still busy, so keep watching (a wake of a sleeping worker per
                // spawn would cost the asker more than a timed nap here costs anyone).
                (now_progress, now)
            };
            // A busy asker whose slot stays empty has nothing for us to take: each look in a
            // row that finds it so doubles the nap, up to `EMPTY_NAP_DOUBLINGS` times. (With
            // a fixed 50 µs nap, watching a fiber that computes without spawning would wake
            // this worker thousands of times a second for as long as the fiber runs.) A look
            // that finds a task there starts over. The price: a task spawned during a long
            // nap by a fiber that then keeps running waits for the nap's end (at most 1.6 ms,
            // not 50 µs).
            let (asker, looks) = self.empty_looks.get();
            let looks = if !w.next.0.is_empty() {
                0
            } else if asker == v {
                looks.saturating_add(1)
            } else {
                1
            };
            self.empty_looks.set((v, looks));
            slot.open(progress, at);
            let nap = grace << looks.min(EMPTY_NAP_DOUBLINGS);
            let wait = Duration::from_nanos((at + nap).saturating_sub(now));
            return HelpAnswer::Wait(Instant::now() + wait, v);
        }
        HelpAnswer::None
    }

    /// Puts a task a fiber of this worker spawned in the `next` slot, where this worker runs
    /// it as soon as the fiber suspends. An idle peer is recruited (woken) to help in case
    /// the fiber keeps running: it takes the task only if it does (see `ask_help`).
    ///
    /// A task the new one displaces was spawned in a burst. A started fiber never moves, so
    /// where a burst of long-lived fibers starts is all the balancing they get, and leaving
    /// them all for a woken peer to steal loses the race against this worker, which starts
    /// them itself at the spawner's next yield. So the first displaced tasks of a burst are
    /// dealt out, one to each idle peer (spinning or asleep), and go to its inbox, where
    /// nobody else takes them (were they stealable, this worker would often take them back
    /// first). The rest go to the stealable queue.
    pub(crate) fn push_next(&self, job: JobRef) {
        let tick = self.tick.get();
        let mut burst = self.burst.borrow_mut();
        if burst.tick != tick {
            // The fiber that spawns now is not the one that spawned last: a new burst.
            burst.tick = tick;
            burst.peers.clear();
            burst.dealt = 0;
        }
        self.next_maybe.set(true);
        let Some(displaced) = self.own_shared().next.0.replace(job) else {
            burst.peers.extend(self.ask_help());
            return;
        };
        // One task for each peer recruited for this burst (the one woken for the first
        // spawn included), then one for each further idle peer; the rest stay here, where
        // idle peers steal them in halves (cheaper than handing them over one by one).
        let dealt = burst.dealt;
        let idle = &self.shared.idle;
        let target = match burst.peers.get(dealt) {
            Some(&i) => Some(i),
            None if dealt < self.shared.workers.len() - 1 => {
                let recruit = idle.take_spinner().or_else(|| idle.to_wake());
                burst.peers.extend(recruit);
                recruit
            }
            None => None,
        };
        if target.is_some() {
            burst.dealt += 1;
        }
        drop(burst);
        match target {
            Some(i) => {
                let peer = &self.shared.workers[i];
                peer.inbox.push(ScheduleTask::New(displaced));
                peer.sleep.wake();
            }
            None => self.push_local(displaced),
        }
    }

    /// Queues an unstarted task on this worker's stealable queue.
    fn push_local(&self, job: JobRef) {
        self.local_maybe.set(true);
        if let Err(job) = self.own_shared().local.push(job) {
            // Full: move half to the injector, in one go, so peers can help (Go's
            // runqputslow).
            let mut batch = self.spill_buf.borrow_mut();
            batch.extend(
                std::iter::from_fn(|| self.own_shared().local.pop()).take(LOCAL_CAPACITY / 2),
            );
            batch.push(job);
            self.shared.injector.spill(&mut batch);
        }
    }

    /// Whether there is anything this worker could run right now.
    fn has_work(&self) -> bool {
        let sh = &self.shared;
        !self.own_shared().inbox.is_empty()
            || !self.ready.borrow().is_empty()
            || !sh.injector.is_empty()
            || !self.own_shared().next.0.is_empty()
            || sh.workers.iter().any(|w| !w.local.is_empty())
            || self
                .timers
                .borrow()
                .next_deadline()
                .is_some_and(|d| d <= Instant::now())
    }

    fn idle(&self, until: &dyn Fn() -> bool, wake_at: Option<Instant>) {
        let sh = &self.shared;
        if self.dumping.get() {
            // Nothing else to do: list the next chunk of the dump in progress.
            self.dump_step();
            return;
        }
        if self.report_pending() {
            self.catch_up();
        }
        poll_io_now();
        if !self.ready.borrow().is_empty() || !self.own_shared().inbox.is_empty() {
            return;
        }
        let (answered, answer_at) = match self.answer_help_request() {
            HelpAnswer::Taken(task) => {
                self.stats().steals.add(1);
                self.run_task(task);
                return;
            }
            HelpAnswer::Wait(at, v) => (true, Some((at, v))),
            HelpAnswer::Stale => (true, None),
            HelpAnswer::None => (false, None),
        };
        // A request for help means the peers are busy with work they keep to themselves (a
        // chain of spawns, say): spinning would only slow them down. Sleep.
        if !answered && sh.idle.try_spin(self.index) {
            let mut watch = None;
            let start = Instant::now();
            // Timers fire exactly: a deadline within the spin ends it (then `has_work`).
            let due = self.timers.borrow().next_deadline();
            loop {
                let found = self
                    .pop_inbox()
                    .or_else(|| self.take_injected().map(ScheduleTask::New))
                    .or_else(|| self.steal())
                    .or_else(|| self.steal_next(&mut watch));
                if let Some(task) = found {
                    let last_spinner = sh.idle.stop_spinning(self.index);
                    if last_spinner && !sh.injector.is_empty() {
                        // More shared work than one worker: get another one looking.
                        sh.notify_one();
                    }
                    self.run_task(task);
                    return;
                }
                let spun = start.elapsed();
                if spun >= SPIN_FOR || due.is_some_and(|d| start + spun >= d) {
                    break;
                } else if spun < SPIN_FOR / 2 {
                    for _ in 0..SPIN_PAUSES {
                        std::hint::spin_loop();
                    }
                } else {
                    std::thread::yield_now();
                }
            }
            sh.idle.stop_spinning(self.index);
        }
        sh.idle.announce(self.index);
        if self.has_work()
            || until()
            || self.should_exit()
            || self.shutdown_pending()
            || self.report_pending()
        {
            sh.idle.withdraw(self.index);
            return;
        }
        let now = Instant::now();
        let mut deadline = match (self.timers.borrow().next_deadline(), wake_at) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        // A peer's request for help may have missed this worker's announcement (see
        // `Idlers::to_help`): ask on its behalf, and answer after a nap.
        let watched = answer_at.or_else(|| self.ask_help_for_peer());
        if let Some((answer_at, _)) = watched {
            deadline = Some(deadline.map_or(answer_at, |d| d.min(answer_at)));
        }
        // Give burst memory back only when truly idle (no timer due soon), a batch at a time,
        // coming back for the next batch after a pause: trimming never delays due work. This
        // worker's own excess first, then spare stacks (any worker's) once none has gone in
        // or out of the spare list for as long: a peer may be in the middle of a burst. The
        // empty slabs of task cells likewise.
        if deadline.is_none_or(|d| d > now + TRIM_QUIET) {
            let stacks = if self.stacks.borrow_mut().trim(TRIM_BATCH) {
                Some(TRIM_PAUSE)
            } else {
                crate::stack::trim_spare(TRIM_BATCH, TRIM_QUIET).map(|w| w.max(TRIM_PAUSE))
            };
            let cells =
                crate::sched::cell::trim_slabs(TRIM_SLABS, TRIM_QUIET).map(|w| w.max(TRIM_PAUSE));
            let again = match (stacks, cells) {
                (Some(a), Some(b)) => Some(a.min(b)),
                (a, b) => a.or(b),
            };
            if let Some(wait) = again {
                let again = now + wait;
                deadline = Some(deadline.map_or(again, |d| d.min(again)));
            }
        }
        let timeout = deadline.map(|d| d.saturating_duration_since(now));
        if timeout.is_none_or(|t| !t.is_zero()) {
            self.publish_gauges();
            let _held = watched.and_then(|(_, peer)| self.hold_apart_from(peer));
            let before = crate::sys::mono_ns();
            self.stats().asleep_since.set(before);
            match crate::io::reactor::get() {
                // Nobody polls for I/O: this worker does, sleeping in epoll_wait.
                Some(reactor) if reactor.try_begin_poll() => {
                    self.own_shared().sleep.sleep_polling(reactor, timeout);
                    reactor.end_poll();
                }
                // Another worker polls, perhaps one of another scheduler: sleep on the
                // standby list, to be woken if that worker's thread leaves its loop. If the
                // role was freed meanwhile, do not sleep: the next pass takes it.
                Some(reactor) => {
                    if let Some(_standby) = reactor.stand_by(&self.shared, self.index) {
                        self.own_shared().sleep.sleep(timeout);
                    }
                }
                None => self.own_shared().sleep.sleep(timeout),
            }
            // Awake (the sleep's SeqCst exchange made it visible): the monitor watches again.
            sh.monitor.nudge();
            let after = crate::sys::mono_ns();
            let st = self.stats();
            st.sleeps.add(1);
            st.slept_ns.add(after.saturating_sub(before));
            st.asleep_since.set(0);
            self.clock.set(after);
            // A sleep is where the kernel most often moves a thread.
            self.publish_cpu();
        }
        sh.idle.withdraw(self.index);
        // Woken, perhaps for shared work, but with work of its own to do first (a pinned
        // task, a woken fiber): have another worker take the shared work.
        if !sh.injector.is_empty()
            && (!self.own_shared().inbox.is_empty() || !self.ready.borrow().is_empty())
        {
            sh.notify_one();
        }
    }

    #[inline]
    fn run_task(&self, task: ScheduleTask) {
        match task {
            ScheduleTask::New(job) => self.start(job),
            ScheduleTask::Fiber(job) => self.resume(ResumeRef::Counted(job)),
            ScheduleTask::Cancel(job) => self.deliver_cancel(&job),
            ScheduleTask::Dump(req) => self.answer_dump(req),
        }
    }

    /// Pops the inbox, counting the wakes of fibers that came from other threads.
    #[inline(always)]
    fn pop_inbox(&self) -> Option<ScheduleTask> {
        let task = pop(&self.own_shared().inbox)?;
        if matches!(task, ScheduleTask::Fiber(_)) {
            self.stats().remote_wakes.add(1);
        }
        Some(task)
    }

    /// Starts listing this worker's fibers for a dump. The list is made `DUMP_CHUNK` fibers
    /// at a time, one chunk per pass of the loop (see `dump_step`), so a worker with many
    /// fibers never stops its fibers for long.
    pub(crate) fn answer_dump(&self, req: Arc<DumpRequest>) {
        let cursor = self.registry.borrow().len();
        self.dumps.borrow_mut().push(PartialDump {
            req,
            cursor,
            entries: Vec::with_capacity(cursor),
            longest: 0,
            total: 0,
        });
        self.dumping.set(true);
        self.dump_step();
    }

    /// Lists the next chunk of fibers for the oldest dump in progress; sends the list when
    /// it is complete. The registry is walked from its end: a fiber that ends meanwhile is
    /// replaced in its slot by the last one (already listed), so a fiber alive all along is
    /// listed at least once, and the dump drops the duplicates.
    fn dump_step(&self) {
        let start = crate::sys::mono_ns();
        let mut dumps = self.dumps.borrow_mut();
        let Some(d) = dumps.first_mut() else {
            self.dumping.set(false);
            return;
        };
        let registry = self.registry.borrow();
        let top = d.cursor.min(registry.len());
        let bottom = top.saturating_sub(DUMP_CHUNK);
        for job in registry[bottom..top].iter().rev() {
            let h = job.header();
            let home = self.home(&**job);
            let parked = h.park.state() == ParkState::Parked;
            let status = if d.req.requester == Some(h.id) {
                Status::Running
            } else if parked {
                Status::Parked(home.meta.wait.get())
            } else {
                Status::Ready
            };
            // Only a park is stamped (a yield is not: it is too frequent to pay for).
            let for_ = (parked && status != Status::Running && home.since != 0)
                .then(|| Duration::from_nanos(start.saturating_sub(home.since)));
            d.entries.push(Entry {
                id: h.id,
                name: h.name.clone(),
                worker: self.index,
                status,
                for_,
                deadline: if parked { home.deadline } else { None },
                location: h.location,
                cancelled: home.cancel != Cancel::No,
            });
        }
        drop(registry);
        d.cursor = bottom;
        let took = crate::sys::mono_ns().saturating_sub(start);
        d.longest = d.longest.max(took);
        d.total += took;
        if bottom == 0 {
            let d = dumps.remove(0);
            self.dumping.set(!dumps.is_empty());
            drop(dumps);
            d.req.answer(
                self.index,
                d.entries,
                Duration::from_nanos(d.longest),
                Duration::from_nanos(d.total),
            );
        }
    }

    /// Lists this worker's fibers all at once, for a dump made while no thread drives it
    /// (`use_caller`'s worker 0) or while it shuts down.
    pub(crate) fn answer_dump_now(&self, req: Arc<DumpRequest>) {
        self.answer_dump(req);
        while self.dumping.get() {
            self.dump_step();
        }
    }

    /// Gives an unstarted task a fiber homed on this worker and runs it.
    fn start(&self, job: JobRef) {
        // A task is often made on another thread (a spawner, a peer whose queue it came
        // from) or long ago, so its cell (about 8 lines, most of them the header) is in
        // another core's cache or out of this one's. Ask for all of it at once rather than a
        // line at each first touch, one miss after another. (The size comes from the
        // vtable; the line before the value holds the counts.) For a cell made here just
        // before, these are hits, a few cycles.
        let value: *const dyn Job = TaskArc::as_ptr(&job);
        let len = std::mem::size_of_val::<dyn Job>(&*job);
        crate::sys::prefetch(value.cast::<u8>().wrapping_sub(64), len + 64, CELL_LINES);
        if self.phase.get() >= Phase::Discarding {
            self.start_failed(job, JoinError::cancelled());
            return;
        }
        let stack = self.stacks.borrow_mut().take(job.header().stack_size);
        match stack {
            Ok(stack) => self.launch(job, stack, Start::Run),
            Err(e) => self.start_failed(job, JoinError::no_stack(e)),
        }
    }

    /// A task that will not run: its failure is published inside a fiber of the default
    /// stack size, so its continuations may wait like any fiber code; if not even that
    /// stack can be had, from here.
    fn start_failed(&self, job: JobRef, err: JoinError) {
        let stack = self.stacks.borrow_mut().take(self.shared.config.stack_size);
        match stack {
            Ok(stack) => self.launch(job, stack, Start::Fail(err)),
            Err(_) => {
                if err.is_cancelled() {
                    self.shared.cancelled.fetch_add(1, Ordering::Relaxed);
                }
                job.fail(err);
                self.stats().finished.add(1);
                self.shared.task_done(Some(self.index));
            }
        }
    }

    /// Creates the task's fiber on `stack`, homed here, and runs it.
    fn launch(&self, job: JobRef, stack: FiberStack, start: Start) {
        // SAFETY: the task was just taken from a queue and has never run, so this worker is
        // its only owner; no Unparker for it exists yet, and it is published (to unparkers,
        // via the park word) only after this write.
        unsafe {
            *job.header().placement.get() = Placement {
                sched: Arc::as_ptr(&self.shared),
                worker: self.index,
            }
        };
        let start = match start {
            // `JoinHandle::cancel` before the start: the body never runs.
            Start::Run if job.header().mark_started() => Start::Fail(JoinError::cancelled()),
            Start::Run => Start::Run,
            fail => {
                job.header().mark_started();
                fail
            }
        };
        let home = self.home(&*job);
        home.meta.worker = Some(self.index);
        home.meta.set_stack(&stack);
        // Raw pointers for the fiber, to the metadata (read while it runs) and its `ended`,
        // taken from the cell itself rather than from a `&mut` that a later `home` call
        // would invalidate.
        let cell = job.header().home.get();
        // SAFETY: only place projections: `cell` points to the live home state in `job`.
        let (meta, ended): (*const FiberMeta, *mut Ended) =
            unsafe { (&raw const (*cell).meta, &raw mut (*cell).ended) };
        let job_ptr: *const dyn Job = TaskArc::as_ptr(&job);
        let coro = Coro::with_stack(stack, move |y: &Yielder, first: Resume| {
            fiber_root(meta, y, first, move || {
                // SAFETY: the registry holds an Arc to the job until the fiber has ended; the
                // fiber runs on its home thread, where nothing else touches `ended` while it
                // runs (see `Worker::home`).
                unsafe { *ended = (*job_ptr).run(start) };
            })
        });
        let held = {
            let mut registry = self.registry.borrow_mut();
            let home = self.home(&*job);
            home.fiber = Some(coro);
            home.slot = registry.len();
            // SAFETY: the registry holds `job`'s reference from here until `finish`, which
            // outlives every use of the alias (see `ResumeRef`).
            let held = unsafe { ResumeRef::alias_of_registered(&job) };
            registry.push(job);
            self.stats().fibers.set(registry.len() as u64);
            held
        };
        self.resume(held);
    }

    /// Switches to a fiber homed here and acts on what it asks when it comes back.
    #[inline(always)]
    fn resume(&self, job: ResumeRef) {
        let home = self.home(&**job);
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
        home.meta.budget.set(crate::coop::BUDGET);
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
        let header = job.header();
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
                self.ready.borrow_mut().push_back(job.into_owned());
                self.yielded.set(true);
                self.stats().yields.add(1);
            }
            corosensei::CoroutineResult::Yield(Suspend::Park(request)) => {
                // SAFETY: the request lives on the suspended fiber's stack, which stays
                // valid and untouched until the fiber resumes, after `protocol::publish`.
                let request = unsafe { request.as_ref() };
                protocol::publish(self, job.into_owned(), request);
            }
            corosensei::CoroutineResult::Return(outcome) => self.finish(job, outcome),
        }
    }

    /// `JoinHandle::cancel` of a fiber homed here: it unwinds at its next resumption, and a
    /// parked one is woken for it — as `stop_timeout` cancels, once. Runs between fibers,
    /// so the fiber is parked, ready, or finished.
    fn deliver_cancel(&self, job: &JobRef) {
        let home = self.home(&**job);
        if home.fiber.is_none() || home.cancel != Cancel::No {
            return;
        }
        home.cancel = Cancel::Requested;
        if let Some(gen) = job.header().park.parked() {
            protocol::wake_at_home(self, job, gen);
        }
    }

    /// Takes a fiber out of the registry.
    fn unregister(&self, job: &JobRef) -> JobRef {
        let slot = self.home(&**job).slot;
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
    fn finish(&self, job: ResumeRef, outcome: Outcome) {
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
        let home = self.home(&**job);
        let (coro, ended) = (home.fiber.take(), home.ended);
        if let Some(coro) = coro {
            self.stacks.borrow_mut().give(coro.into_stack());
        }
        // Nobody may still be reading the header from another thread when we drop our
        // references below (see `Watch::peek`).
        self.own_shared().watch.retire(&self.stats().current);
        // Kept to the end: `job` may be an alias of it.
        let registered = self.unregister(&job);
        self.stats().finished.add(1);
        self.stats().returned.add(1);
        // The task's body publishes its own result and catches every unwind; the fiber root
        // sees an unwind only if the very first resumption cancels, which `start` never does.
        let cancelled = match outcome {
            Outcome::Done => ended == Ended::Cancelled,
            Outcome::Panicked(p) => {
                job.fail(JoinError::panic(p));
                false
            }
            Outcome::Cancelled => {
                job.fail(JoinError::cancelled());
                true
            }
        };
        // Only the shutdown's cancellations count (`stop_timeout` returns them), not those
        // of `JoinHandle::cancel`.
        if cancelled && self.phase.get() >= Phase::Discarding {
            self.shared.cancelled.fetch_add(1, Ordering::Relaxed);
        }
        self.shared.task_done(Some(self.index));
        drop(job);
        drop(registered);
    }

    /// Pops every queued unstarted task this worker can reach: its own queues and the
    /// injector. Wakes of started fibers found in the inbox go to `ready`.
    fn pop_unstarted(&self) -> Option<JobRef> {
        while let Some(task) = self.own_shared().inbox.pop() {
            match task {
                ScheduleTask::New(job) => return Some(job),
                ScheduleTask::Fiber(job) => {
                    self.ready.borrow_mut().push_back(job);
                    self.stats().remote_wakes.add(1);
                }
                ScheduleTask::Cancel(job) => self.deliver_cancel(&job),
                ScheduleTask::Dump(req) => self.answer_dump_now(req),
            }
        }
        self.own_shared()
            .local
            .pop()
            .or_else(|| self.own_shared().next.0.take())
            .or_else(|| self.shared.injector.pop(false))
    }

    /// Fails every queued unstarted task this worker can reach (their continuations run in
    /// fibers, see `start_failed`).
    fn discard_queued(&self) {
        while let Some(job) = self.pop_unstarted() {
            self.start_failed(job, JoinError::cancelled());
        }
    }

    /// `stop_timeout`'s deadline passed: each live fiber homed here unwinds at its next
    /// resumption — once; a parked one is woken for it.
    fn cancel_all(&self) {
        let fibers: Vec<JobRef> = self.registry.borrow().clone();
        for job in fibers {
            let home = self.home(&*job);
            if home.cancel != Cancel::No {
                continue;
            }
            home.cancel = Cancel::Requested;
            if let Some(gen) = job.header().park.parked() {
                protocol::wake_at_home(self, &job, gen);
            }
        }
    }

    /// The grace after cancelling ran out: report the fibers still alive, give their handles
    /// a cancelled result, and leak them — never resumed, their stacks never reused (their
    /// frames may still be borrowed, by a blocking-pool call for instance). Unstarted tasks
    /// are failed without a fiber: this worker is leaving.
    fn abandon_all(&self) {
        while let Some(job) = self.pop_unstarted() {
            self.stats().finished.add(1);
            self.shared.fail_unstarted(job, Some(self.index));
        }
        self.ready.borrow_mut().clear();
        self.timer_woken.set(0);
        let fibers = std::mem::take(&mut *self.registry.borrow_mut());
        self.stats().fibers.set(0);
        if fibers.is_empty() {
            return;
        }
        self.report(
            &fibers,
            "abandoning (leaked, never resumed) fibers that did not end after their cancellation",
        );
        for job in fibers {
            let h = job.header();
            // Win the wake of a parked fiber, so no Unparker queues it from now on; one that
            // already won will queue it in an inbox nobody reads, which `keep_alive` allows.
            if let Some(gen) = h.park.parked() {
                h.park.notify(gen);
            }
            let home = self.home(&*job);
            if let Some(id) = home.timer.take() {
                self.timers.borrow_mut().remove(id);
            }
            home.keep_alive = Some(self.shared.clone());
            // Leaked, so nothing on its stack runs or is dropped, on any thread.
            if let Some(coro) = home.fiber.take() {
                std::mem::forget(coro);
            }
            self.shared.cancelled.fetch_add(1, Ordering::Relaxed);
            job.fail(JoinError::abandoned());
            self.stats().finished.add(1);
            self.shared.task_done(Some(self.index));
        }
        self.publish_gauges();
    }

    /// Prints this worker's live fibers (a shutdown that takes long).
    fn report_live(&self, what: &str) {
        let fibers = self.registry.borrow().clone();
        if !fibers.is_empty() {
            self.report(&fibers, what);
        }
    }

    fn report(&self, fibers: &[JobRef], what: &str) {
        use std::fmt::Write;
        let mut msg = format!(
            "fibra: scheduler '{}', worker {}: {what}:\n",
            self.shared.config.name, self.index
        );
        for job in fibers {
            let h = job.header();
            let state = match h.park.state() {
                ParkState::Parked => "parked",
                ParkState::Notified | ParkState::Running => "ready",
            };
            let _ = writeln!(
                msg,
                "  fiber '{}' ({}): {state}",
                h.name.as_deref().unwrap_or("<unnamed>"),
                h.id
            );
        }
        eprint!("{msg}");
    }

    /// Abandons worker 0 of a `use_caller` scheduler from the thread stopping it, which is
    /// not the building thread, so cannot run it (see `abandon_all`).
    pub(crate) fn abandon_from_outside(&self) {
        self.phase.set(Phase::Abandoning);
        self.abandon_all();
    }
}

/// What the park protocol (`crate::park::protocol`) asks of a fiber's home worker: the
/// narrow calls it makes while it publishes a park and when it queues a woken fiber.
impl Worker {
    /// Queues a fiber of this worker woken on this worker (whoever won its wake).
    #[inline]
    pub(crate) fn push_woken(&self, job: JobRef) {
        self.ready.borrow_mut().push_back(job);
        self.stats().local_wakes.add(1);
    }

    /// Notes a park of `job`, which has just switched out: when (for the dump, with the
    /// park's `deadline`), and one park more in the counters. Returns the fiber's home-only
    /// state.
    #[inline(always)]
    pub(crate) fn note_parked<'j>(
        &self,
        job: &'j JobRef,
        deadline: Option<Instant>,
    ) -> &'j mut HomeOnly {
        if self.stats().stuck_since.load(Ordering::Relaxed) != 0 {
            // The watchdog saw this worker inside one fiber for a while: the coarse clock,
            // refreshed only every `CLOCK_INTERVAL` passes, is that much behind.
            self.clock.set(crate::sys::coarse_ns());
        }
        let home = self.home(&**job);
        home.since = self.clock.get();
        home.deadline = deadline;
        self.stats().parks.add(1);
        home
    }

    /// Files the timer of a park with a deadline: at `deadline` it wakes `job` from park
    /// generation `gen`, unless something else woke it first (see `fire_timers`).
    #[inline(always)]
    pub(crate) fn arm_timer(&self, deadline: Instant, job: JobRef, gen: u64) -> TimerId {
        let mut timers = self.timers.borrow_mut();
        let id = timers.insert(deadline, (job, gen));
        self.stats().timers.set(timers.len() as u64);
        id
    }

    /// The registry's reference to the fiber in slot `slot`.
    pub(crate) fn registered(&self, slot: usize) -> JobRef {
        self.registry.borrow()[slot].clone()
    }
}

/// The body of a worker thread.
/// `ready` runs once the worker is set up, just before its loop.
pub(crate) fn worker_main(shared: Arc<Shared>, index: usize, ready: impl FnOnce()) {
    let worker = Worker::new(shared, index);
    crate::stack::overflow::ensure_alt_stack(false);
    ready();
    worker.run(&|| false, None);
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A peer that asked for help and then went quiet with nothing in its `next` slot has
    /// nothing to hand out: an idle worker closes its request instead of napping to watch
    /// it (napping would keep a worker that has just ended a spawn-and-join chain from
    /// spinning for the next submission). A peer that is still running is still watched.
    #[test]
    fn a_quiet_askers_empty_request_is_closed_and_a_running_ones_is_watched() {
        let sched = crate::Scheduler::builder().threads(2).build().unwrap();
        let shared = sched.shared.clone();
        let w0 = Worker::new(shared.clone(), 0);
        let asker = &shared.workers[1];
        let progress = asker.progress.0.load(Ordering::Relaxed);

        // Not driven by any thread (never started): quiet.
        assert!(asker.is_quiet());
        assert!(asker.help.claim());
        asker.help.open(progress, shared.now_ns());
        assert!(matches!(w0.answer_help_request(), HelpAnswer::None));
        assert!(asker.help.claim(), "the request was closed");
        asker.help.close();

        // Running a fiber, as far as its peers can tell: its request is watched.
        asker.stats.0.run_since.set_seqcst(1);
        assert!(!asker.is_quiet());
        assert!(asker.help.claim());
        asker.help.open(progress, shared.now_ns());
        assert!(matches!(w0.answer_help_request(), HelpAnswer::Wait(_, 1)));
        asker.stats.0.run_since.set_seqcst(0);
    }
}
