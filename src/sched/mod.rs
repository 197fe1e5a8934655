//! The N:M [`Scheduler`]: N worker threads run M fibers. Its design (run queues, idle
//! protocol, shutdown) is described at the top of `worker.rs`; this file is the public face:
//! the builder, `start`, `submit`, `block_on`, `stop`.

mod idle;
pub(crate) mod task;
pub(crate) mod timers;
pub(crate) mod worker;

pub use worker::current_worker;
pub(crate) use worker::unpark_fiber;

use crate::error::{Error, SubmitError};
use crate::fiber;
use crate::join::{far_future, JoinCell, JoinHandle};
use crate::park::Unparker;
use crate::stack::{round_size, DEFAULT_STACK_SIZE, MIN_STACK_SIZE};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};
use task::Header;
use worker::{worker_main, Config, Shared, CANCEL, DONE, NEW, RUNNING_STATE, STOPPING};

/// The most workers a scheduler may have.
pub const MAX_THREADS: usize = 4096;
/// The largest fiber stack fibra will map, 1 GiB.
const MAX_STACK_SIZE: usize = 1 << 30;

/// Configures a [`Scheduler`]; from [`Scheduler::builder`].
#[derive(Debug, Clone)]
pub struct Builder {
    threads: Option<usize>,
    name: String,
    stack_size: usize,
    stack_cache: usize,
    use_caller: bool,
}

impl Builder {
    /// The number of worker threads N. Default: the available parallelism.
    pub fn threads(mut self, n: usize) -> Self {
        self.threads = Some(n);
        self
    }

    /// The worker thread name prefix: workers are named `name-0`, `name-1`, …
    /// Default: `"fibra"`.
    pub fn name(mut self, name: impl Into<String>) -> Self {
        self.name = name.into();
        self
    }

    /// The stack size of each fiber, in bytes (rounded up to whole pages). Default
    /// [`DEFAULT_STACK_SIZE`](crate::DEFAULT_STACK_SIZE) (256 KiB); at least
    /// [`MIN_STACK_SIZE`](crate::MIN_STACK_SIZE).
    pub fn stack_size(mut self, bytes: usize) -> Self {
        self.stack_size = bytes;
        self
    }

    /// How many idle stacks (per stack size) each worker keeps with their memory, for reuse
    /// while still in cache. Beyond this, when the worker is idle, the oldest give their
    /// memory back to the kernel and go to a free list shared by all threads. Default
    /// [`DEFAULT_STACK_CACHE`](crate::DEFAULT_STACK_CACHE) (256).
    pub fn stack_cache(mut self, stacks: usize) -> Self {
        self.stack_cache = stacks;
        self
    }

    /// sylar's `use_caller`: the thread that calls `build()` becomes worker 0. No thread is
    /// spawned for it; it runs worker 0's fibers (tasks pinned to 0, fibers started there)
    /// while it is inside [`Scheduler::block_on`] or [`Scheduler::stop`]. Call those on the
    /// building thread: from other threads they cannot run worker 0's work and wait for it.
    pub fn use_caller(mut self, yes: bool) -> Self {
        self.use_caller = yes;
        self
    }

    /// Checks the configuration and creates the scheduler (not started).
    pub fn build(self) -> Result<Scheduler, Error> {
        let threads = match self.threads {
            Some(n) => n,
            None => std::thread::available_parallelism().map_or(1, |n| n.get()),
        };
        if threads == 0 {
            return Err(Error::NoThreads);
        }
        if threads > MAX_THREADS {
            return Err(Error::TooManyThreads {
                requested: threads,
                maximum: MAX_THREADS,
            });
        }
        if self.stack_size < MIN_STACK_SIZE {
            return Err(Error::StackTooSmall {
                requested: self.stack_size,
                minimum: MIN_STACK_SIZE,
            });
        }
        if self.stack_size > MAX_STACK_SIZE {
            return Err(Error::StackTooLarge {
                requested: self.stack_size,
            });
        }
        if self.name.contains('\0') {
            return Err(Error::InvalidName(self.name));
        }
        fiber::install_panic_hook();
        crate::stack::overflow::install_handler();
        let shared = Shared::new(Config {
            threads,
            name: self.name,
            stack_size: round_size(self.stack_size),
            stack_cache: self.stack_cache,
            use_caller: self.use_caller,
        });
        Ok(Scheduler {
            shared,
            threads: parking_lot::Mutex::new(Vec::new()),
        })
    }
}

/// An N:M scheduler of stackful fibers.
///
/// Submit closures with [`submit`](Scheduler::submit); each runs as a fiber on one of N
/// worker threads, and blocking fibra calls inside it ([`JoinHandle::join`], [`crate::park`],
/// [`crate::sleep`]) suspend only the fiber. A fiber that has started never moves to another
/// thread, so `thread_local!` values and `Rc`s held across a suspension stay sound.
///
/// `Scheduler` is `Send + Sync`: share it with an `Arc` and submit from anywhere, including
/// from its own fibers. Dropping it calls [`stop`](Scheduler::stop). Its `Debug` output is the
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
}

impl Default for Builder {
    fn default() -> Self {
        Builder {
            threads: None,
            name: "fibra".to_string(),
            stack_size: DEFAULT_STACK_SIZE,
            stack_cache: crate::stack::DEFAULT_STACK_CACHE,
            use_caller: false,
        }
    }
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
    /// If the OS refuses to create a thread, like [`std::thread::spawn`].
    pub fn start(&self) {
        if self
            .shared
            .state
            .compare_exchange(NEW, RUNNING_STATE, Ordering::SeqCst, Ordering::SeqCst)
            .is_err()
        {
            return;
        }
        self.spawn_workers();
    }

    fn spawn_workers(&self) {
        let first = usize::from(self.shared.config.use_caller);
        let mut threads = self.threads.lock();
        for index in first..self.threads() {
            let shared = self.shared.clone();
            let handle = std::thread::Builder::new()
                .name(format!("{}-{index}", self.shared.config.name))
                .spawn(move || worker_main(shared, index))
                .unwrap_or_else(|e| panic!("fibra: cannot spawn worker thread {index}: {e}"));
            threads.push(handle);
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
    pub fn submit<F, T>(&self, f: F, thread: Option<usize>) -> Result<JoinHandle<T>, SubmitError<F>>
    where
        F: FnOnce() -> T + Send + 'static,
        T: Send + 'static,
    {
        self.submit_with(f, thread, None, self.shared.config.stack_size)
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
            stack_size: self.shared.config.stack_size,
        }
    }

    pub(crate) fn submit_with<F, T>(
        &self,
        f: F,
        thread: Option<usize>,
        name: Option<Arc<str>>,
        stack_size: usize,
    ) -> Result<JoinHandle<T>, SubmitError<F>>
    where
        F: FnOnce() -> T + Send + 'static,
        T: Send + 'static,
    {
        if thread.is_some_and(|i| i >= self.threads()) {
            return Err(SubmitError::NoSuchThread(f));
        }
        if !self.shared.admit() {
            return Err(SubmitError::Stopped(f));
        }
        let cell = JoinCell::new(f, Header::new(name, stack_size, thread));
        self.shared.schedule_new(cell.clone());
        Ok(JoinHandle::new(cell))
    }

    /// Runs `f` as a fiber and waits for its value; a panic in `f` resumes on the caller.
    ///
    /// Starts the scheduler if needed. Inside a fiber this suspends the fiber. With
    /// `use_caller`, the building thread runs worker 0's work while it waits. On a stopped
    /// scheduler `f` runs directly on the calling thread.
    ///
    /// # Panics
    /// With `f`'s panic; or if `stop_timeout` cancels `f` before it finishes.
    pub fn block_on<F, T>(&self, f: F) -> T
    where
        F: FnOnce() -> T + Send + 'static,
        T: Send + 'static,
    {
        let handle = match self.submit(f, None) {
            Ok(h) => h,
            Err(refused) => return refused.into_inner()(),
        };
        self.start();
        if self.drives_caller_worker() {
            let waiter = Unparker::for_worker(self.shared.clone(), 0);
            if handle.header().set_waiter(waiter) {
                self.drive_caller_worker(&|| handle.is_finished(), None);
            }
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
    /// Called from one of this scheduler's own fibers it cannot wait for itself: it starts
    /// the shutdown and returns; the workers exit once the work has drained.
    pub fn stop(&self) {
        self.stop_inner(None);
    }

    /// Like [`stop`](Scheduler::stop), but fibers still alive after `timeout` are cancelled:
    /// each unwinds from its suspension point (destructors run, on its own thread) and its
    /// `JoinHandle` reports [`is_cancelled`](crate::JoinError::is_cancelled); queued tasks
    /// that never started are dropped likewise. Returns how many tasks were cancelled.
    ///
    /// A fiber that never suspends (a busy loop) cannot be cancelled; `stop_timeout` waits
    /// for it.
    pub fn stop_timeout(&self, timeout: Duration) -> usize {
        self.stop_inner(Some(timeout))
    }

    /// Stops like [`stop`](Scheduler::stop), except that tasks still queued and not started
    /// are dropped (their handles report cancelled); started fibers run to completion.
    /// Returns how many were dropped. (The seed's `LooperExecutor::shutdown(false)`.)
    pub(crate) fn stop_discarding_queued(&self) -> usize {
        self.shared.discard_queued.store(true, Ordering::SeqCst);
        self.stop_inner(None)
    }

    fn stop_inner(&self, timeout: Option<Duration>) -> usize {
        let sh = &self.shared;
        let deadline = timeout.map(|d| Instant::now().checked_add(d).unwrap_or_else(far_future));
        if sh
            .state
            .compare_exchange(NEW, STOPPING, Ordering::SeqCst, Ordering::SeqCst)
            .is_ok()
        {
            // Never started. SeqCst against `admit`: a racing submit either sees STOPPING and
            // is refused, or is counted in `live` here and its task gets workers to run it.
            if sh.live() == 0 {
                sh.state.store(DONE, Ordering::SeqCst);
                return 0;
            }
            self.spawn_workers();
        }
        let _ =
            sh.state
                .compare_exchange(RUNNING_STATE, STOPPING, Ordering::SeqCst, Ordering::SeqCst);
        sh.wake_all();
        if sh.current_worker().is_some() {
            return 0;
        }
        let cancel = || {
            sh.state.fetch_max(CANCEL, Ordering::SeqCst);
            sh.wake_all();
        };
        if self.drives_caller_worker() {
            let until = || {
                if deadline.is_some_and(|d| Instant::now() >= d)
                    && sh.state.load(Ordering::SeqCst) < CANCEL
                {
                    cancel();
                }
                false
            };
            self.drive_caller_worker(&until, deadline);
        } else if !sh.wait_drained(deadline) {
            cancel();
        }
        sh.wait_drained(None);
        let threads = std::mem::take(&mut *self.threads.lock());
        for t in threads {
            let _ = t.join();
        }
        sh.state.store(DONE, Ordering::SeqCst);
        sh.cancelled.swap(0, Ordering::SeqCst)
    }

    /// Whether the calling code should run worker 0 itself (`use_caller`, on the building
    /// thread, not inside a fiber).
    fn drives_caller_worker(&self) -> bool {
        self.shared.owner == Some(std::thread::current().id()) && !fiber::in_fiber()
    }

    fn drive_caller_worker(&self, until: &dyn Fn() -> bool, wake_at: Option<Instant>) {
        let worker = self.shared.caller_worker.lock().take();
        if let Some(worker) = worker {
            worker.run(until, wake_at);
            *self.shared.caller_worker.lock() = Some(worker);
        }
    }
}

/// Options for one task; from [`Scheduler::task`].
#[derive(Debug)]
pub struct TaskBuilder<'a> {
    sched: &'a Scheduler,
    name: Option<Arc<str>>,
    stack_size: usize,
}

impl TaskBuilder<'_> {
    /// The fiber's name.
    pub fn name(mut self, name: impl AsRef<str>) -> Self {
        self.name = Some(Arc::from(name.as_ref()));
        self
    }

    /// The fiber's stack size in bytes, rounded up to whole pages and to at least
    /// [`MIN_STACK_SIZE`](crate::MIN_STACK_SIZE). If no stack of that size can be mapped, the
    /// task's [`JoinHandle`] reports [`JoinError::is_no_stack`](crate::JoinError::is_no_stack).
    pub fn stack_size(mut self, bytes: usize) -> Self {
        self.stack_size = round_size(bytes.max(MIN_STACK_SIZE));
        self
    }

    /// Submits the task, as [`Scheduler::submit`] does.
    pub fn submit<F, T>(self, f: F, thread: Option<usize>) -> Result<JoinHandle<T>, SubmitError<F>>
    where
        F: FnOnce() -> T + Send + 'static,
        T: Send + 'static,
    {
        self.sched
            .submit_with(f, thread, self.name, self.stack_size)
    }
}

impl Drop for Scheduler {
    fn drop(&mut self) {
        self.stop();
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
