//! The N:M [`Scheduler`]: N worker threads run M fibers. Its design (run queues, idle
//! protocol, shutdown) is described in `worker/mod.rs` and its children; this file is the
//! public face: `start`, `submit`, `block_on`, `stop` (the builder is `builder.rs`).

mod builder;
pub(crate) mod cell;
mod idle;
mod injector;
mod live;
mod local;
#[cfg(all(test, loom))]
mod loom_model;
mod observe;
pub(crate) mod task;
pub(crate) mod task_cell;
pub(crate) mod timers;
pub(crate) mod watchdog;
pub(crate) mod worker;

pub use builder::Builder;
pub use local::{spawn_local, spawn_local_fiber, LocalJoinHandle};
pub use watchdog::DEFAULT_WATCHDOG;

pub(crate) use worker::cancel_started;
pub use worker::current_worker;

use crate::error::{Error, SubmitError};
use crate::fiber;
use crate::join::JoinHandle;
use crate::park::{Unparker, WaitOn};
use crate::stack::check_stack_size;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use task::Header;
use task_cell::TaskCell;
use worker::{worker_main, Phase, Shared, Worker};

/// The most workers a scheduler may have.
pub const MAX_THREADS: usize = 4096;

/// How long fibers cancelled by `stop_timeout` (or a drop) may take to unwind — their
/// destructors may still wait — before the shutdown abandons those still alive.
pub const CANCEL_GRACE: Duration = Duration::from_secs(1);
/// How long dropping a scheduler that still has live tasks waits for them before it reports
/// them and cancels them.
pub const DROP_PATIENCE: Duration = Duration::from_secs(5);
/// How long `stop` waits before it reports (once) which fibers it is still waiting for.
const STOP_REPORT_AFTER: Duration = Duration::from_secs(10);
/// How long a shutdown that abandoned fibers waits for each worker thread to exit before it
/// leaves a thread that is stuck in a fiber that never suspends.
const EXIT_PATIENCE: Duration = Duration::from_secs(1);

/// How a shutdown treats what is still alive.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Shutdown {
    /// `stop`: wait for everything (reporting once if it takes long).
    Wait,
    /// `Looper::shutdown(false)`: fail queued unstarted tasks, wait for started fibers.
    Discard,
    /// `stop_timeout`: cancel at the deadline, abandon after the grace.
    Deadline(Instant),
    /// `Drop` without `stop`: wait `DROP_PATIENCE`, report, then as `Deadline`.
    Drop,
}

/// An N:M scheduler of stackful fibers.
///
/// Submit closures with [`submit`](Scheduler::submit); each runs as a fiber on one of N
/// worker threads, and blocking fibra calls inside it ([`JoinHandle::join`], [`crate::park`],
/// [`crate::sleep`]) suspend only the fiber. A fiber that has started never moves to another
/// thread, so `thread_local!` values and `Rc`s held across a suspension stay sound.
///
/// `Scheduler` is `Send + Sync`: share it with an `Arc` and submit from anywhere, including
/// from its own fibers.
///
/// Dropping it stops it: it refuses new work and waits for what is alive, like
/// [`stop`](Scheduler::stop), but only for [`DROP_PATIENCE`] (5 s). Tasks still alive then —
/// often fibers parked on something that can no longer happen — are listed on stderr and
/// cancelled as [`stop_timeout`](Scheduler::stop_timeout) cancels them. Call `stop` to wait
/// as long as it takes.
///
/// Its `Debug` output is the
/// diagnostics view: workers, live tasks, stack size and the stack guard mechanism in use
/// (`madvise(MADV_GUARD_INSTALL)`, or the `mprotect` fallback on kernels before 6.13).
///
/// ```
/// use std::time::Duration;
/// let sched = fibra::Scheduler::builder().threads(2).name("doc").build()?;
/// sched.start();
/// let h = sched.submit(|| {
///     fibra::sleep(Duration::from_millis(10)); // suspends this fiber only
///     6 * 7
/// }, None).expect("running");
/// assert_eq!(h.join().unwrap(), 42);
/// assert_eq!(sched.block_on(|| "done"), "done");
/// sched.stop();
/// # Ok::<(), fibra::Error>(())
/// ```
pub struct Scheduler {
    shared: Arc<Shared>,
    threads: parking_lot::Mutex<Vec<std::thread::JoinHandle<()>>>,
    /// With `use_caller`: worker 0's state while the building thread is not driving it.
    caller_worker: parking_lot::Mutex<Option<Box<Worker>>>,
    /// Whether every worker thread was spawned (and the watchdog started then): until then a
    /// `start` spawns the missing ones (see `spawn_workers`). Read without the lock, so that
    /// a `start` (which every `block_on` makes) costs a load once all are there.
    all_spawned: AtomicBool,
    /// Set, under the `threads` lock, once a shutdown took the worker threads to join them:
    /// a `start` racing that shutdown must not spawn them again.
    workers_joined: AtomicBool,
    /// The watchdog's monitor thread, joined at the end of a shutdown so that none of the
    /// scheduler's threads outlives it.
    monitor_thread: parking_lot::Mutex<Option<std::thread::JoinHandle<()>>>,
}

impl Scheduler {
    /// A builder with the defaults: one worker per available core, 256 KiB stacks.
    pub fn builder() -> Builder {
        Builder::default()
    }

    /// The number of workers N.
    pub fn threads(&self) -> usize {
        self.shared.config.threads
    }

    /// Starts the worker threads. Idempotent. Work submitted before `start` waits for it.
    ///
    /// # Panics
    /// If the OS refuses to create a thread, like [`std::thread::spawn`]. The workers that
    /// did start run; calling `start` again starts the others, and until then the work
    /// pinned to them waits. A `stop` meanwhile tries once more and, if the OS still
    /// refuses, fails their queued tasks as cancelled.
    pub fn start(&self) {
        let sh = &self.shared;
        if sh.phase.advance_from(Phase::New, Phase::Running)
            || (sh.phase.get() == Phase::Running && self.workers_missing())
        {
            if let Err(e) = self.spawn_workers() {
                panic!("{e}");
            }
        }
    }

    /// Whether some worker threads were never spawned (a `start` the OS refused threads).
    fn workers_missing(&self) -> bool {
        !self.all_spawned.load(Ordering::Acquire)
    }

    /// Spawns the worker threads not yet spawned and waits until each runs: work submitted
    /// right after `start` then finds every worker looking for it, and the first burst of
    /// spawns can spread over all of them (a started fiber never moves). On the OS's refusal
    /// the threads spawned so far keep running and the error says which worker failed.
    fn spawn_workers(&self) -> Result<(), String> {
        let first = usize::from(self.shared.config.use_caller);
        // A futex word, not a `parking_lot` condition variable: a worker that has just
        // notified may still be inside `parking_lot`'s table of parked threads when this
        // thread goes on and forks, leaving that table's lock held in the child.
        let running = Arc::new(AtomicU32::new(0));
        let mut threads = self.threads.lock();
        if self.workers_joined.load(Ordering::Relaxed) {
            // Joined by a shutdown (this `start` waited for the lock meanwhile): none is
            // missing any more, and none may start again.
            return Ok(());
        }
        let mut spawned = 0;
        let mut refused = None;
        for index in first + threads.len()..self.threads() {
            let shared = self.shared.clone();
            let running = running.clone();
            let thread = std::thread::Builder::new()
                .name(format!("{}-{index}", self.shared.config.name))
                .spawn(move || {
                    worker_main(shared, index, move || {
                        running.fetch_add(1, Ordering::SeqCst);
                        crate::sys::futex::wake(&running, i32::MAX);
                    })
                });
            match thread {
                Ok(handle) => {
                    threads.push(handle);
                    spawned += 1;
                }
                Err(e) => {
                    refused = Some(format!("fibra: cannot spawn worker thread {index}: {e}"));
                    break;
                }
            }
        }
        let complete = threads.len() == self.threads() - first;
        drop(threads);
        loop {
            let n = running.load(Ordering::SeqCst);
            if n as usize >= spawned {
                break;
            }
            crate::sys::futex::wait(&running, n, None);
        }
        if complete && !self.all_spawned.swap(true, Ordering::AcqRel) {
            *self.monitor_thread.lock() = watchdog::start(&self.shared);
        }
        refused.map_or(Ok(()), Err)
    }

    /// In a shutdown: spawns the workers a refused `start` left out, so that they run what
    /// is queued for them. If the OS still refuses, their queued tasks (none of which can
    /// have started) fail as cancelled, from this thread, and the shutdown goes on.
    ///
    /// With no worker at all (none spawned, no `use_caller` worker 0), nothing will take the
    /// shared injector either: this thread fails its tasks too, until none is queued (a
    /// submit admitted just before the shutdown may push its task a moment later).
    fn spawn_workers_for_shutdown(&self) {
        let Err(e) = self.spawn_workers() else {
            return;
        };
        eprintln!("{e}; failing the tasks queued for the workers that never started");
        let sh = &self.shared;
        let first = usize::from(sh.config.use_caller);
        let started = first + self.threads.lock().len();
        for index in started..self.threads() {
            // SeqCst, with the fence, against `submit_to`'s push and look (see there).
            sh.workers[index].absent.store(true, Ordering::SeqCst);
            std::sync::atomic::fence(Ordering::SeqCst);
            worker::fail_queued_of_absent(sh, index);
        }
        if started == 0 {
            // Readiness continuations still waiting for their socket are not queued anywhere.
            let queued = || sh.live() > sh.continuations.load(Ordering::SeqCst);
            while queued() {
                worker::fail_injected(sh);
                for index in 0..self.threads() {
                    worker::fail_queued_of_absent(sh, index);
                }
                if queued() {
                    std::thread::sleep(Duration::from_millis(1));
                }
            }
        }
    }

    /// Runs `f` as a fiber and returns a handle to its result.
    ///
    /// `thread: None` lets any worker run it (from inside one of this scheduler's fibers it
    /// goes to the current worker's queue, where idle peers may steal it before it starts);
    /// `Some(i)` pins it to worker `i`. Once started, the fiber stays on the worker that
    /// started it. `F: Send` only because the closure crosses to its worker; what it creates
    /// inside (an `Rc`, a `RefCell`) never has to be `Send`.
    ///
    /// Refusals hand the closure back: [`SubmitError::Stopped`] after `stop` (from
    /// outside; fibers still finishing may submit), [`SubmitError::NoSuchThread`] when `i` is
    /// not below [`threads`](Scheduler::threads).
    #[track_caller]
    pub fn submit<F, T>(&self, f: F, thread: Option<usize>) -> Result<JoinHandle<T>, SubmitError<F>>
    where
        F: FnOnce() -> T + Send + 'static,
        T: Send + 'static,
    {
        submit_to(&self.shared, f, thread, None, self.shared.config.stack_size)
    }

    /// Starts a task with options: a name (shown by [`Fiber::current`](crate::Fiber::current),
    /// in panic and overflow reports) and a stack size. `submit(f, thread)` is the short form.
    ///
    /// ```
    /// let sched = fibra::Scheduler::builder().threads(1).build().unwrap();
    /// sched.start();
    /// let h = sched
    ///     .task()
    ///     .name("conn-42")
    ///     .stack_size(1 << 20)
    ///     .submit(|| fibra::Fiber::current().unwrap().name().map(String::from), None)
    ///     .unwrap();
    /// assert_eq!(h.join().unwrap().as_deref(), Some("conn-42"));
    /// ```
    pub fn task(&self) -> TaskBuilder<'_> {
        TaskBuilder {
            sched: self,
            name: None,
            stack_size: Ok(self.shared.config.stack_size),
        }
    }

    /// Runs `f` as a fiber on any worker, like [`std::thread::spawn`]: the short form of
    /// `submit(f, None)`. After a stop, the closure is dropped unrun and the handle reports
    /// [`is_cancelled`](crate::JoinError::is_cancelled) (use [`submit`](Scheduler::submit) to
    /// get a refused closure back).
    ///
    /// ```
    /// let sched = fibra::Scheduler::builder().threads(2).build().unwrap();
    /// sched.start();
    /// let h = sched.spawn(|| 6 * 7);
    /// assert_eq!(h.join().unwrap(), 42);
    /// sched.stop();
    /// assert!(sched.spawn(|| ()).join().unwrap_err().is_cancelled());
    /// ```
    #[track_caller]
    pub fn spawn<F, T>(&self, f: F) -> JoinHandle<T>
    where
        F: FnOnce() -> T + Send + 'static,
        T: Send + 'static,
    {
        spawn_on(&self.shared, f)
    }

    /// Runs `f` as a fiber and waits for its value; a panic in `f` resumes on the caller.
    ///
    /// Starts the scheduler if needed. Inside a fiber this suspends the fiber. With
    /// `use_caller`, the building thread runs worker 0's work while it waits. On a stopped
    /// scheduler `f` runs directly on the calling thread.
    ///
    /// # Panics
    /// With `f`'s panic; or if `stop_timeout` cancels `f` before it finishes.
    #[track_caller]
    pub fn block_on<F, T>(&self, f: F) -> T
    where
        F: FnOnce() -> T + Send + 'static,
        T: Send + 'static,
    {
        if let Err(refused) =
            std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| self.start()))
        {
            // Started before `f` is queued: a worker that did start must not run it (and a
            // later `start` neither) while the caller gets the refusal.
            crate::report::drop_catching(f);
            std::panic::resume_unwind(refused);
        }
        let handle = match self.submit(f, None) {
            Ok(h) => h,
            Err(refused) => return refused.into_inner()(),
        };
        if self.drives_caller_worker() {
            // The continuation runs once the result is in (just before joiners are woken):
            // enough for this thread to stop driving worker 0 and join.
            let finished = Arc::new(std::sync::atomic::AtomicBool::new(false));
            let (flag, waiter) = (
                finished.clone(),
                Unparker::for_worker(self.shared.clone(), 0),
            );
            handle.on_complete(move || {
                flag.store(true, Ordering::Release);
                waiter.unpark();
            });
            self.drive_caller_worker(&|| finished.load(Ordering::Acquire), None);
        }
        match handle.join() {
            Ok(v) => v,
            Err(e) => match e.try_into_panic() {
                Ok(p) => std::panic::resume_unwind(p),
                Err(e) => panic!("fibra: block_on: {e}"),
            },
        }
    }

    /// Stops the scheduler: refuses new work from outside, waits for everything submitted
    /// to finish (fibers parked now and woken later included), then joins the workers.
    ///
    /// It waits as long as that takes; if that is more than 10 s, it lists the fibers it is
    /// still waiting for on stderr, once.
    ///
    /// Called from one of this scheduler's own fibers it cannot wait for itself: it starts
    /// the shutdown and returns; the workers exit once the work has drained.
    pub fn stop(&self) {
        self.shutdown(Shutdown::Wait);
    }

    /// Like [`stop`](Scheduler::stop), but fibers still alive after `timeout` are cancelled:
    /// each unwinds from its suspension point (destructors run, on its own thread) and its
    /// `JoinHandle` reports [`is_cancelled`](crate::JoinError::is_cancelled); queued tasks
    /// that never started are failed likewise. Returns how many tasks were cancelled.
    ///
    /// A fiber is cancelled once: while it unwinds, its waits work as usual, so a destructor
    /// may flush a file, sleep or take a lock. Fibers that are still alive [`CANCEL_GRACE`]
    /// (1 s) after the cancellation — a destructor that waits for something that never
    /// comes, code that catches the cancellation and carries on — are listed on stderr and
    /// abandoned: their handles report cancelled and they are never resumed (their stacks
    /// are leaked). A fiber that never suspends (a busy loop) cannot be cancelled at all;
    /// its worker thread is left running and reported. So `stop_timeout(d)` returns within
    /// about `d` plus the grace.
    ///
    /// A destructor that panics while a cancellation unwinds its fiber aborts the process:
    /// Rust turns any panic during an unwind into an abort, and a cancellation is an unwind.
    ///
    /// Called from one of this scheduler's own fibers it cannot wait: it starts the
    /// shutdown and returns 0 at once, and a thread of its own keeps the deadline (cancels
    /// what is alive then, the calling fiber included, and abandons after the grace).
    pub fn stop_timeout(&self, timeout: Duration) -> usize {
        self.shutdown(Shutdown::Deadline(crate::sys::deadline_after(timeout)))
    }

    /// Stops like [`stop`](Scheduler::stop), except that tasks still queued and not started
    /// are dropped (their handles report cancelled); started fibers run to completion.
    /// Returns how many were dropped. (`Looper::shutdown(false)`.)
    pub(crate) fn stop_discarding_queued(&self) -> usize {
        self.shutdown(Shutdown::Discard)
    }

    /// The shutdown state machine's driver (the phases are described in `worker/shutdown.rs`).
    fn shutdown(&self, how: Shutdown) -> usize {
        let sh = &self.shared;
        if sh.phase.advance_from(Phase::New, Phase::Stopping) {
            // Never started. SeqCst against `admit`: a racing submit either sees Stopping and
            // is refused, or is counted in `live` here and its task gets workers to run it.
            if sh.live() == 0 {
                sh.phase.advance_to(Phase::Done);
                return 0;
            }
            self.spawn_workers_for_shutdown();
        } else {
            let missing = sh.phase.get() == Phase::Running && self.workers_missing();
            sh.phase.advance_from(Phase::Running, Phase::Stopping);
            if missing {
                self.spawn_workers_for_shutdown();
            }
        }
        if how == Shutdown::Discard {
            sh.phase.advance_to(Phase::Discarding);
        }
        sh.wake_all();
        if sh.phase.get() == Phase::Done {
            return 0;
        }
        if sh.local_worker().is_some() {
            // A fiber of this scheduler cannot wait for the others (nor for itself): a
            // thread of its own keeps the deadline.
            if let Shutdown::Deadline(deadline) = how {
                keep_deadline_elsewhere(sh, deadline);
            }
            return 0;
        }
        let drained = match how {
            Shutdown::Wait | Shutdown::Discard => {
                let drained = self.wait_until(Some(Instant::now() + STOP_REPORT_AFTER));
                if !drained && sh.phase.get() < Phase::Abandoning {
                    eprintln!(
                        "fibra: stop() of scheduler '{}' has waited {} s for {} task(s) still \
                         alive ({} of them readiness continuations); still waiting",
                        sh.config.name,
                        STOP_REPORT_AFTER.as_secs(),
                        sh.live(),
                        sh.continuations.load(Ordering::SeqCst)
                    );
                    sh.request_report();
                    self.wait_until(None)
                } else {
                    drained
                }
            }
            Shutdown::Deadline(deadline) => self.wait_until(Some(deadline)),
            Shutdown::Drop => {
                let drained = self.wait_until(Some(Instant::now() + DROP_PATIENCE));
                if !drained && sh.phase.get() < Phase::Cancelling {
                    eprintln!(
                        "fibra: scheduler '{}' dropped without stop() while {} task(s) are \
                         alive; after waiting {} s, cancelling them (stop() waits for them)",
                        sh.config.name,
                        sh.live(),
                        DROP_PATIENCE.as_secs()
                    );
                    sh.request_report();
                }
                drained
            }
        };
        if !drained {
            sh.begin_cancelling();
            if !self.wait_until(Some(Instant::now() + CANCEL_GRACE)) {
                sh.begin_abandoning();
                // Worker 0 of `use_caller`, if its thread is not driving it, cannot act on
                // the phase itself: abandon its fibers from here (it never runs them).
                let undriven = self.caller_worker.lock().take();
                if let Some(worker) = undriven {
                    worker.abandon_from_outside();
                }
            }
        }
        self.join_workers();
        sh.phase.advance_to(Phase::Done);
        sh.monitor.stop();
        self.join_monitor();
        if how == Shutdown::Wait {
            // `stop` reports no count; leave it to a racing `stop_timeout` that cancelled.
            0
        } else {
            sh.cancelled.swap(0, Ordering::SeqCst)
        }
    }

    /// Waits until no task is alive, `deadline` passes, or the shutdown is abandoning;
    /// returns whether drained. On `use_caller`'s building thread it runs worker 0 meanwhile.
    fn wait_until(&self, deadline: Option<Instant>) -> bool {
        let sh = &self.shared;
        if self.drives_caller_worker() {
            let until = || {
                sh.live() == 0
                    || deadline.is_some_and(|d| Instant::now() >= d)
                    || sh.phase.get() >= Phase::Abandoning
            };
            if !self.drive_caller_worker(&until, deadline) {
                // Another thread holds worker 0 (it is in `block_on`): wait like others.
                return sh.wait_drained(deadline);
            }
            return sh.live() == 0;
        }
        sh.wait_drained(deadline)
    }

    /// Joins the worker threads. After an abandon, a thread still inside a fiber that never
    /// suspends cannot exit: it is reported and left running.
    ///
    /// Inside a fiber (of another scheduler) it sleeps the fiber, not its worker, until a
    /// thread has exited. On one of the workers itself (a thread-local's destructor there
    /// dropped the last handle to the scheduler) that worker's own thread is left alone.
    fn join_workers(&self) {
        let threads = {
            let mut g = self.threads.lock();
            self.workers_joined.store(true, Ordering::Relaxed);
            std::mem::take(&mut *g)
        };
        let abandoning = self.shared.phase.get() >= Phase::Abandoning;
        let patience = Instant::now() + EXIT_PATIENCE;
        let in_fiber = fiber::in_scheduled_fiber();
        let me = std::thread::current().id();
        for t in threads {
            if t.thread().id() == me {
                // Exiting already: it is the thread running this.
                continue;
            }
            // Wait for the exit before joining when a fiber must not block its worker in
            // `join`, or when the thread may never exit (it runs an abandoned fiber).
            if in_fiber || abandoning {
                while !(t.is_finished() || abandoning && Instant::now() >= patience) {
                    if in_fiber {
                        nap_fiber(Duration::from_millis(1));
                    } else {
                        std::thread::sleep(Duration::from_millis(1));
                    }
                }
            }
            if !t.is_finished() && abandoning {
                eprintln!(
                    "fibra: worker thread '{}' did not exit: a fiber on it runs without \
                     suspending; leaving the thread running",
                    t.thread().name().unwrap_or("<unnamed>")
                );
                continue;
            }
            let _ = t.join();
        }
    }

    /// Joins the watchdog's monitor thread, told to end just before: it exits at once, and a
    /// shutdown that returns leaves no thread of the scheduler behind (a caller counting its
    /// process's threads, or capping them, sees them all gone). Inside a fiber it sleeps the
    /// fiber, not its worker, until the thread has exited.
    fn join_monitor(&self) {
        let Some(t) = self.monitor_thread.lock().take() else {
            return;
        };
        if t.thread().id() == std::thread::current().id() {
            return;
        }
        if fiber::in_scheduled_fiber() {
            while !t.is_finished() {
                nap_fiber(Duration::from_millis(1));
            }
        }
        let _ = t.join();
    }

    /// Whether the calling code should run worker 0 itself (`use_caller`, on the building
    /// thread, not inside a scheduled fiber). A standalone fiber the building thread resumes
    /// drives it on its own stack: it would otherwise block the one thread that can run
    /// worker 0's work, for ever.
    fn drives_caller_worker(&self) -> bool {
        self.shared.owner == Some(std::thread::current().id()) && !fiber::in_scheduled_fiber()
    }

    /// Runs worker 0 on this thread until `until()`; false if worker 0 was not available.
    fn drive_caller_worker(&self, until: &dyn Fn() -> bool, wake_at: Option<Instant>) -> bool {
        let worker = self.caller_worker.lock().take();
        match worker {
            Some(worker) => {
                worker.run(&until, wake_at);
                *self.caller_worker.lock() = Some(worker);
                true
            }
            None => false,
        }
    }
}

/// Sleeps the calling scheduled fiber (not its worker) for `d`, as `time::sleep` does in
/// one: a shutdown run inside a fiber waits for threads this way.
fn nap_fiber(d: Duration) {
    // Nobody else holds the Unparker, so only the deadline (or a cancellation) ends the park.
    crate::park::park_until(Some(crate::sys::deadline_after(d)), WaitOn::Sleep, drop);
}

/// Queues `f` as a new task of the scheduler behind `shared`.
#[track_caller]
fn submit_to<F, T>(
    shared: &Shared,
    f: F,
    thread: Option<usize>,
    name: Option<Arc<str>>,
    stack_size: usize,
) -> Result<JoinHandle<T>, SubmitError<F>>
where
    F: FnOnce() -> T + Send + 'static,
    T: Send + 'static,
{
    if thread.is_some_and(|i| i >= shared.config.threads) {
        return Err(SubmitError::NoSuchThread(f));
    }
    // A worker a stopping scheduler could not start runs nothing: refuse, as stopped.
    let absent = |i: usize| shared.workers[i].absent.load(Ordering::SeqCst);
    if thread.is_some_and(absent) || !shared.admit() {
        return Err(SubmitError::Stopped(f));
    }
    // Outside the closure, which would be the caller of `caller` otherwise.
    let location = std::panic::Location::caller();
    let (cell, task) = TaskCell::new_pair(f, || Header::new(name, stack_size, thread, location));
    shared.schedule_new(task);
    if let Some(i) = thread {
        // The shutdown may have marked the worker absent and drained its queue between our
        // look and our push: with the fences, it saw our task or we see its mark.
        std::sync::atomic::fence(Ordering::SeqCst);
        if absent(i) {
            worker::fail_queued_of_absent(shared, i);
        }
    }
    Ok(JoinHandle::new(cell))
}

/// Queues `f` as a detached task of the scheduler behind `shared`, which has counted it in
/// `live` already (a readiness continuation's unit, see `io::reactor::Continuation`): it is
/// never refused, as a parked fiber woken during a shutdown is not.
pub(crate) fn submit_admitted(
    shared: &Shared,
    f: Box<dyn FnOnce() + Send>,
    location: &'static std::panic::Location<'static>,
) {
    let cell = TaskCell::new(f, || {
        Header::new(None, shared.config.stack_size, None, location)
    });
    shared.schedule_new(task::as_task_ref(cell));
}

/// `spawn`'s body: submit to any worker, or a cancelled handle if refused.
#[track_caller]
pub(crate) fn spawn_on<F, T>(shared: &Shared, f: F) -> JoinHandle<T>
where
    F: FnOnce() -> T + Send + 'static,
    T: Send + 'static,
{
    submit_to(shared, f, None, None, shared.config.stack_size)
        .unwrap_or_else(|refused| crate::join::cancelled(refused.into_inner()))
}

/// Runs `f` as a new fiber of the scheduler whose fiber calls it (on any of its workers),
/// like `tokio::spawn`. Its handle reports cancelled if that scheduler is shutting down and
/// refuses new work.
///
/// # Panics
/// Outside a fiber of a [`Scheduler`] (on a plain thread, in a standalone [`Fiber`](crate::Fiber)),
/// with a message that says so: there is no scheduler to spawn on. Use
/// [`Scheduler::spawn`] there.
///
/// ```
/// let sched = fibra::Scheduler::builder().threads(2).build().unwrap();
/// let sum = sched.block_on(|| {
///     let parts: Vec<_> = (1..=4u64).map(|i| fibra::spawn(move || i * i)).collect();
///     parts.into_iter().map(|h| h.join().unwrap()).sum::<u64>()
/// });
/// assert_eq!(sum, 30);
/// ```
#[track_caller]
pub fn spawn<F, T>(f: F) -> JoinHandle<T>
where
    F: FnOnce() -> T + Send + 'static,
    T: Send + 'static,
{
    match worker::current_shared() {
        Some(shared) if fiber::in_scheduled_fiber() => spawn_on(&shared, f),
        _ => panic!(
            "fibra::spawn must be called from a fiber of a fibra Scheduler; \
             use Scheduler::spawn or Scheduler::submit elsewhere"
        ),
    }
}

/// Options for one task; from [`Scheduler::task`].
#[derive(Debug)]
pub struct TaskBuilder<'a> {
    sched: &'a Scheduler,
    name: Option<Arc<str>>,
    stack_size: Result<usize, Error>,
}

impl TaskBuilder<'_> {
    /// The fiber's name.
    pub fn name(mut self, name: impl AsRef<str>) -> Self {
        self.name = Some(Arc::from(name.as_ref()));
        self
    }

    /// The fiber's stack size in bytes, rounded up to whole pages. Checked like
    /// [`Builder::stack_size`]: below [`MIN_STACK_SIZE`](crate::MIN_STACK_SIZE) or above
    /// 1 GiB, [`submit`](TaskBuilder::submit) refuses the task with
    /// [`SubmitError::InvalidStackSize`]. If no stack of a valid size can be mapped, the
    /// task's [`JoinHandle`] reports [`JoinError::is_no_stack`](crate::JoinError::is_no_stack).
    pub fn stack_size(mut self, bytes: usize) -> Self {
        self.stack_size = check_stack_size(bytes);
        self
    }

    /// Submits the task, as [`Scheduler::submit`] does.
    #[track_caller]
    pub fn submit<F, T>(self, f: F, thread: Option<usize>) -> Result<JoinHandle<T>, SubmitError<F>>
    where
        F: FnOnce() -> T + Send + 'static,
        T: Send + 'static,
    {
        match self.stack_size {
            Ok(size) => submit_to(&self.sched.shared, f, thread, self.name, size),
            Err(e) => Err(SubmitError::InvalidStackSize(f, e)),
        }
    }
}

/// The deadline of a `stop_timeout` called inside one of the scheduler's own fibers, which
/// cannot wait: one thread per scheduler waits for the drain until the earliest such
/// deadline (a later call may bring it forward; the thread looks every 10 ms), then
/// cancels, and abandons what is still alive after the grace, as the call would from
/// outside. A fiber calling it again and again starts no more threads.
fn keep_deadline_elsewhere(sh: &Arc<Shared>, deadline: Instant) {
    {
        let mut kept = sh.kept_deadline.lock();
        match *kept {
            Some(d) => {
                *kept = Some(d.min(deadline));
                return;
            }
            None => *kept = Some(deadline),
        }
    }
    let shared = sh.clone();
    let spawned = std::thread::Builder::new()
        .name(format!("{}-stop", sh.config.name))
        .spawn(move || {
            let drained = loop {
                let deadline = shared.kept_deadline.lock().expect("set before the spawn");
                let now = Instant::now();
                if now >= deadline {
                    break shared.live() == 0;
                }
                let look = deadline.min(now + Duration::from_millis(10));
                if shared.wait_drained(Some(look)) {
                    break true;
                }
            };
            if !drained {
                shared.begin_cancelling();
                if !shared.wait_drained(Some(Instant::now() + CANCEL_GRACE)) {
                    shared.begin_abandoning();
                }
            }
        });
    if let Err(e) = spawned {
        *sh.kept_deadline.lock() = None;
        eprintln!(
            "fibra: stop_timeout inside a fiber of scheduler '{}' cannot start the thread that \
             keeps its deadline ({e}); it stops without one",
            sh.config.name
        );
    }
}

impl Drop for Scheduler {
    fn drop(&mut self) {
        self.shutdown(Shutdown::Drop);
    }
}

impl std::fmt::Debug for Scheduler {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Scheduler")
            .field("name", &self.shared.config.name)
            .field("threads", &self.threads())
            .field("live_tasks", &self.shared.live())
            .field("stack_size", &self.shared.config.stack_size)
            .field("stack_guard", &crate::guard_kind())
            .finish()
    }
}
