//! [`ThreadPool`]: an executor over a fixed pool of fiber workers.

use super::owned::OwnedScheduler;
use super::Executor;
use crate::error::Error;
use crate::join::JoinHandle;
use crate::sched::Scheduler;

/// Worker thread names are `pool-0`, `pool-1`, …
const NAME: &str = "pool";

/// A fixed pool of `n` threads.
///
/// Underneath it is a started [`Scheduler`] with `n` workers named `pool-<i>`: jobs and
/// fibers go to any worker, and a fiber stays on the worker that starts it. Dropping the
/// pool, or [`shutdown`](ThreadPool::shutdown), finishes everything submitted first; after
/// that `execute` drops jobs and `spawn` returns handles that report cancelled.
///
/// ```
/// use fibra::exec::{Executor, ThreadPool};
/// let pool = ThreadPool::new(2);
/// let handles: Vec<_> = (0..4u64).map(|i| pool.spawn(move || i * i)).collect();
/// let squares: Vec<u64> = handles.into_iter().map(|h| h.join().unwrap()).collect();
/// assert_eq!(squares, [0, 1, 4, 9]);
/// ```
#[derive(Debug)]
pub struct ThreadPool {
    owned: OwnedScheduler,
}

impl ThreadPool {
    /// A started pool of `n` threads.
    ///
    /// # Panics
    /// If `n` is 0 or above [`MAX_THREADS`](crate::MAX_THREADS) (use
    /// [`try_new`](ThreadPool::try_new) to get the error instead), or if the OS refuses a
    /// thread.
    pub fn new(n: usize) -> ThreadPool {
        ThreadPool::try_new(n).unwrap_or_else(|e| panic!("fibra: ThreadPool::new({n}): {e}"))
    }

    /// A started pool of `n` threads, or why `n` cannot work.
    pub fn try_new(n: usize) -> Result<ThreadPool, Error> {
        let owned = OwnedScheduler::start(Scheduler::builder().threads(n).name(NAME))?;
        Ok(ThreadPool { owned })
    }

    /// The number of threads.
    pub fn threads(&self) -> usize {
        self.owned.sched.threads()
    }

    /// Refuses new work, finishes everything submitted (fibers parked now and woken later
    /// included), and joins the threads. Inside a fiber of another scheduler the fiber
    /// parks meanwhile instead of blocking its worker; inside one of the pool's own fibers
    /// it only starts the shutdown.
    pub fn shutdown(&self) {
        self.owned.stop(false);
    }

    /// The scheduler underneath, for what `Executor` does not cover ([`Scheduler::task`]
    /// options, pinning with [`Scheduler::submit`]).
    pub fn scheduler(&self) -> &Scheduler {
        &self.owned.sched
    }
}

impl Executor for ThreadPool {
    fn execute(&self, job: Box<dyn FnOnce() + Send>) {
        self.owned.sched.execute(job)
    }

    fn spawn<F, T>(&self, f: F) -> JoinHandle<T>
    where
        F: FnOnce() -> T + Send + 'static,
        T: Send + 'static,
    {
        self.owned.sched.spawn(f)
    }
}

impl Drop for ThreadPool {
    fn drop(&mut self) {
        self.shutdown();
    }
}
