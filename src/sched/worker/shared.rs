//! [`Shared`], the state a scheduler's handle, its workers and every task it runs share:
//! the workers' shared halves, the injector, the phase word and the live count. Here are its
//! constructor, admission and counting out of tasks, waking workers, and `schedule_new`;
//! the shutdown's methods are in `shutdown`. It may touch every worker's `WorkerShared`, and
//! the `Worker` of the calling thread (`local_worker`).

use super::help::HelpSlot;
use super::lifecycle::CANCELLERS;
use super::queues::LOCAL_CAPACITY;
use super::shutdown::{Phase, PhaseWord};
use super::{Config, Padded, Worker, WorkerShared, WorkerStats, CURRENT_WORKER};
use crate::fiber;
use crate::park::protocol::WakerCount;
use crate::park::wait_queue::{Lock, WaitList};
use crate::sched::idle::{Idlers, WorkerSleep};
use crate::sched::injector::Injector;
use crate::sched::live::LiveCount;
use crate::sched::task::{ScheduleTask, TaskRef, TaskSlot};
use crate::sched::watchdog::{MonitorCtl, Watch};
use crossbeam_queue::{ArrayQueue, SegQueue};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread::ThreadId;
use std::time::Instant;

/// State shared by a scheduler's handle, its workers and every task it runs.
pub(crate) struct Shared {
    pub(crate) config: Config,
    pub(crate) workers: Box<[WorkerShared]>,
    pub(crate) injector: Injector,
    pub(crate) phase: PhaseWord,
    /// Tasks admitted and not yet done, on a line per worker (see `live.rs`).
    pub(super) live: LiveCount,
    pub(super) idle: Idlers,
    /// Tasks cancelled (or failed unstarted, or abandoned) by the shutdown so far.
    pub(crate) cancelled: AtomicUsize,
    /// Readiness continuations registered and not yet submitted (each is also in `live`).
    pub(crate) continuations: AtomicUsize,
    /// Tasks scheduled by threads that are not this scheduler's workers (theirs are in
    /// their statistics), for `Metrics::spawned`.
    spawned_outside: std::sync::atomic::AtomicU64,
    /// Bumped to ask every worker to print its live fibers (a shutdown that takes long).
    pub(super) report: AtomicUsize,
    /// Who waits in `wait_drained`: fibers of other schedulers park, threads block.
    pub(super) drained: Lock<WaitList<()>>,
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
                    tid: std::sync::atomic::AtomicI32::new(0),
                    reported_times: Default::default(),
                })
                .collect(),
            injector: Injector::new(),
            phase: PhaseWord::new(),
            live: LiveCount::new(n),
            idle: Idlers::new(n),
            cancelled: AtomicUsize::new(0),
            kept_deadline: parking_lot::Mutex::new(None),
            spawned_outside: std::sync::atomic::AtomicU64::new(0),
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
    pub(super) fn now_ns(&self) -> u64 {
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

    /// Tasks scheduled so far: every worker's count, then the other threads'. Each only
    /// grows, so a later call never returns less than an earlier one.
    pub(crate) fn spawned(&self) -> u64 {
        let by_workers: u64 = self.workers.iter().map(|w| w.stats.0.spawned.get()).sum();
        by_workers + self.spawned_outside.load(Ordering::Relaxed)
    }

    /// Tasks admitted and not yet done (see `LiveCount::get`).
    pub(crate) fn live(&self) -> usize {
        self.live.get()
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
    pub(crate) fn schedule_new(&self, task: TaskRef) {
        let here = self.local_worker();
        // Counted for `Metrics::spawned`: by a worker in its own statistics (a load and a
        // store on a line only it writes), by any other thread on a shared counter.
        match here {
            Some(w) => w.stats().spawned.add(1),
            None => {
                self.spawned_outside.fetch_add(1, Ordering::Relaxed);
            }
        }
        match task.header().pinned {
            Some(i) => {
                self.workers[i].inbox.push(ScheduleTask::Start(task));
                if here.map(|w| w.index) != Some(i) {
                    self.workers[i].sleep.wake();
                }
            }
            None => match here {
                // A standalone fiber's spawn goes to the injector: the standalone fiber
                // holds the worker's thread while it waits, so nobody would run `next`.
                Some(w) if fiber::in_scheduled_fiber() => w.push_next(task),
                _ => {
                    self.injector.push(task);
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
