//! [`Builder`]: a scheduler's configuration, checked by `build`.

use super::worker::{Config, Shared, Worker};
use super::{watchdog, Scheduler, DEFAULT_WATCHDOG, MAX_THREADS};
use crate::error::Error;
use crate::fiber;
use crate::stack::{check_stack_size, DEFAULT_STACK_SIZE};
use std::sync::atomic::AtomicBool;
use std::time::Duration;

/// Configures a [`Scheduler`]; from [`Scheduler::builder`].
#[derive(Debug, Clone)]
pub struct Builder {
    threads: Option<usize>,
    name: String,
    stack_size: usize,
    stack_cache: usize,
    use_caller: bool,
    #[cfg(feature = "tokio")]
    tokio: Option<tokio::runtime::Handle>,
    watchdog: Duration,
    time_slice: Duration,
}

impl Builder {
    /// The kernel time slice of each worker thread fibra spawns: how long it runs before a
    /// thread waiting for its CPU gets it, and how soon it preempts a thread there when it
    /// wakes. Default `Duration::ZERO`: the kernel's (about 3 ms on Linux 6.6 and later).
    /// Otherwise 100 µs to 100 ms, else [`Error::InvalidTimeSlice`].
    ///
    /// Set with `sched_setattr`'s `sched_runtime`, which the kernel's EEVDF scheduler takes
    /// as a fair-class thread's slice since Linux 6.12, without privileges; older kernels
    /// ignore it, and a kernel or sandbox that refuses the call leaves the slice as it was.
    /// Real-time threads and a `use_caller` thread (the caller's own) are left alone.
    ///
    /// What it is for: a worker whose CPU another process shares (a load generator on the
    /// same machine, say) keeps its fibers waiting while the kernel runs the other
    /// process; a short slice shortens those waits, at the cost of more context switches.
    /// It is off by default because on the machine fibra is measured on it did not pay:
    /// see docs/design.md, "Sharing a CPU".
    ///
    /// ```
    /// use std::time::Duration;
    /// let sched = fibra::Scheduler::builder()
    ///     .threads(2)
    ///     .time_slice(Duration::from_micros(500))
    ///     .build()
    ///     .unwrap();
    /// sched.start();
    /// assert_eq!(sched.block_on(|| 2 + 2), 4);
    /// assert!(fibra::Scheduler::builder().time_slice(Duration::from_micros(10)).build().is_err());
    /// ```
    pub fn time_slice(mut self, slice: Duration) -> Self {
        self.time_slice = slice;
        self
    }

    /// How long a fiber may run without suspending before the watchdog reports it on
    /// stderr (or, with the `tracing` feature and a subscriber, as a `tracing` warning):
    /// its name and id, its worker, how long so far, and how many tasks wait on that
    /// worker — once per episode. Default [`DEFAULT_WATCHDOG`](crate::DEFAULT_WATCHDOG)
    /// (100 ms); `Duration::ZERO` turns the watchdog off.
    ///
    /// A fiber that never suspends keeps every other fiber of its worker waiting (fibra
    /// does not preempt). The watchdog is a monitor thread that looks every quarter of
    /// this duration at counters the workers publish anyway, so it costs the workers
    /// nothing; it sleeps while every worker sleeps.
    ///
    /// ```
    /// use std::time::Duration;
    /// let sched = fibra::Scheduler::builder()
    ///     .threads(1)
    ///     .watchdog(Duration::from_millis(500))
    ///     .build()
    ///     .unwrap();
    /// sched.start();
    /// sched.block_on(|| std::hint::black_box(1 + 1)); // far below 500 ms: no report
    /// ```
    pub fn watchdog(mut self, threshold: Duration) -> Self {
        self.watchdog = threshold;
        self
    }

    /// The tokio runtime for async code run in this scheduler's fibers (feature `tokio`):
    /// the worker threads are inside its context while they run fibers, so futures that need
    /// one (tokio's sockets and timers, reqwest, hyper, tonic) work in
    /// [`future::block_on`](crate::future::block_on), and may be made and dropped anywhere in
    /// a fiber. The runtime's own threads drive its reactor and timers; the fiber only
    /// waits.
    ///
    /// ```
    /// let rt = tokio::runtime::Builder::new_multi_thread()
    ///     .worker_threads(1)
    ///     .enable_time()
    ///     .build()
    ///     .unwrap();
    /// let sched = fibra::Scheduler::builder()
    ///     .threads(1)
    ///     .tokio_handle(rt.handle().clone())
    ///     .build()
    ///     .unwrap();
    /// sched.start();
    /// let slept = sched.block_on(|| {
    ///     let t = std::time::Instant::now();
    ///     // tokio's `sleep` needs the context as soon as it is made: the fiber has it.
    ///     let sleep = tokio::time::sleep(std::time::Duration::from_millis(10));
    ///     fibra::future::block_on(sleep);
    ///     t.elapsed()
    /// });
    /// assert!(slept >= std::time::Duration::from_millis(10));
    /// ```
    #[cfg(feature = "tokio")]
    pub fn tokio_handle(mut self, handle: tokio::runtime::Handle) -> Self {
        self.tokio = Some(handle);
        self
    }

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
    /// while still in cache. Beyond this, the oldest go, memory and all, to a spare list
    /// shared by all workers, which reuse them before they fault in new stacks
    /// ([`Metrics::stacks_spare`](crate::Metrics::stacks_spare)); once none has been taken or
    /// handed over for 50 ms, idle workers give their memory back to the kernel and the stacks
    /// go to a free list shared by all threads. Default
    /// [`DEFAULT_STACK_CACHE`](crate::DEFAULT_STACK_CACHE) (256).
    pub fn stack_cache(mut self, stacks: usize) -> Self {
        self.stack_cache = stacks;
        self
    }

    /// The thread that calls `build()` becomes worker 0. No thread is
    /// spawned for it; it runs worker 0's fibers (tasks pinned to 0, fibers started there)
    /// while it is inside [`Scheduler::block_on`] or [`Scheduler::stop`]. Call those on the
    /// building thread (or in a standalone [`Fiber`](crate::Fiber) it resumes, which then
    /// runs worker 0 on its own stack): from other threads they cannot run worker 0's work
    /// and wait for it.
    /// Inside a fiber of a scheduler `build` refuses it with [`Error::UseCallerInFiber`]:
    /// that thread is a worker, and code there never runs outside a fiber, where worker 0
    /// would be driven.
    pub fn use_caller(mut self, yes: bool) -> Self {
        self.use_caller = yes;
        self
    }

    /// Checks the configuration and creates the scheduler (not started).
    pub fn build(self) -> Result<Scheduler, Error> {
        crate::link_above_core();
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
        let stack_size = check_stack_size(self.stack_size)?;
        if self.name.contains('\0') {
            return Err(Error::InvalidName(self.name));
        }
        if self.use_caller && fiber::in_scheduled_fiber() {
            return Err(Error::UseCallerInFiber);
        }
        let slice = self.time_slice;
        if !slice.is_zero()
            && !(crate::sys::slice::MIN_SLICE..=crate::sys::slice::MAX_SLICE).contains(&slice)
        {
            return Err(Error::InvalidTimeSlice { requested: slice });
        }
        // Outside every lock (see `crate::fork::register`).
        crate::fork::register(crate::fork::Slot::Workers, &super::worker::FORK);
        fiber::install_panic_hook();
        fiber::install_overflow_handler();
        watchdog::init();
        let shared = Shared::new(Config {
            threads,
            name: self.name,
            stack_size,
            stack_cache: self.stack_cache,
            use_caller: self.use_caller,
            #[cfg(feature = "tokio")]
            tokio: self.tokio,
            watchdog: self.watchdog,
            time_slice: (!slice.is_zero()).then_some(slice),
        });
        let caller_worker = self
            .use_caller
            .then(|| Box::new(Worker::new(shared.clone(), 0)));
        Ok(Scheduler {
            shared,
            threads: parking_lot::Mutex::new(Vec::new()),
            caller_worker: parking_lot::Mutex::new(caller_worker),
            all_spawned: AtomicBool::new(false),
            workers_joined: AtomicBool::new(false),
            monitor_thread: parking_lot::Mutex::new(None),
        })
    }
}

impl Default for Builder {
    fn default() -> Self {
        Builder {
            threads: None,
            name: "fibra".to_string(),
            stack_size: DEFAULT_STACK_SIZE,
            stack_cache: crate::stack::DEFAULT_STACK_CACHE,
            use_caller: false,
            #[cfg(feature = "tokio")]
            tokio: None,
            watchdog: DEFAULT_WATCHDOG,
            time_slice: Duration::ZERO,
        }
    }
}
