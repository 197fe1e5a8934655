//! Executors: where a job runs, and where a fiber lives.
//!
//! An [`Executor`] runs a job somewhere (`execute`) and starts fibers homed there
//! ([`Executor::spawn`]). A fiber that has started never changes thread (docs/design.md,
//! "Principles"), so after every `sleep`, `join`, `yield_now`, lock, channel receive or
//! [`unblock`](crate::unblock()) it resumes on its *home* thread, the executor's — and so do
//! its continuations: [`JoinHandle::then`], [`catching`](JoinHandle::catching) and
//! [`finally`](JoinHandle::finally). [`join`](JoinHandle::join) waits for its result.
//!
//! | executor | `execute(job)` | `spawn(f)`: the fiber's home |
//! |---|---|---|
//! | [`Inline`] | at once, on the calling thread | none: `f` runs at once, directly |
//! | [`NewThread`] | on a new thread | a new thread that lives as long as the fiber |
//! | [`ThreadPool`] | on a pool thread | one of the pool's threads |
//! | [`Looper`] | on the looper thread, FIFO | the looper thread |
//! | [`Scheduler`](crate::Scheduler) | on a worker | one of the workers |
//!
//! This module owns only these adapters; the fibers themselves are the scheduler's.
//!
//! ```
//! use fibra::exec::{Executor, Looper, NewThread, ThreadPool};
//! use std::time::Duration;
//!
//! let looper = Looper::new();
//! let pool = std::sync::Arc::new(ThreadPool::new(2));
//! let p = pool.clone();
//! let task = looper.spawn(move || {
//!     let home = std::thread::current().id();
//!     fibra::sleep(Duration::from_millis(10));
//!     let two = p.spawn(|| 2).join().unwrap();
//!     let three = NewThread.spawn(|| 3).join().unwrap();
//!     assert_eq!(std::thread::current().id(), home); // every continuation back home
//!     1 + two + three
//! });
//! task.then(|v| assert_eq!(*v, 6));
//! assert_eq!(task.join().unwrap(), 6);
//! looper.shutdown(true);
//! ```

mod inline;
mod looper;
mod new_thread;
mod owned;
mod scheduler;
mod thread_pool;

pub use inline::Inline;
pub use looper::Looper;
pub use new_thread::NewThread;
pub use thread_pool::ThreadPool;

use crate::join::{JoinError, JoinHandle};
use crate::sched::cell::TaskArc;
use crate::sched::task::{Start, Task};
use crate::sched::task_cell::{detached_cell, TaskCell};
use std::sync::Arc;

/// Something that runs jobs: a thread, a pool, an event loop, or a scheduler.
///
/// Implement [`execute`](Executor::execute) and you get a working
/// [`spawn`](Executor::spawn); fibra's own executors override `spawn` to run the closure
/// as a fiber homed on the executor's thread. The trait is object safe (`spawn` needs
/// `Self: Sized`), so `&dyn Executor` and `Box<dyn Executor>` can `execute`.
///
/// ```
/// use fibra::exec::{Executor, Inline, Looper};
/// use std::sync::mpsc;
///
/// let looper = Looper::new();
/// let executors: [&dyn Executor; 2] = [&Inline, &looper];
/// let (tx, rx) = mpsc::channel();
/// for (i, e) in executors.iter().enumerate() {
///     let tx = tx.clone();
///     e.execute(Box::new(move || tx.send(i).unwrap()));
/// }
/// let mut got: Vec<_> = rx.iter().take(2).collect();
/// got.sort();
/// assert_eq!(got, [0, 1]);
/// ```
pub trait Executor {
    /// Runs `job` on this executor, some time from now (or at once, for [`Inline`]).
    ///
    /// An executor that has shut down drops the job without running it; use [`Scheduler::submit`](crate::Scheduler::submit) where the
    /// refused closure must come back.
    fn execute(&self, job: Box<dyn FnOnce() + Send>);

    /// Runs `f` on this executor and returns a handle to its result.
    ///
    /// fibra's executors run `f` as a fiber homed on their thread: wherever `f` waits
    /// (`sleep`, `join`, sync primitives, [`unblock`](crate::unblock())), it resumes there.
    /// This provided version runs `f` as a plain job through
    /// [`execute`](Executor::execute), where fibra's blocking calls block that thread. A
    /// panic in `f` goes to the handle; if the executor drops the job (it has shut down),
    /// the handle reports [`JoinError::is_cancelled`].
    fn spawn<F, T>(&self, f: F) -> JoinHandle<T>
    where
        F: FnOnce() -> T + Send + 'static,
        T: Send + 'static,
        Self: Sized,
    {
        let cell = detached_cell(f);
        let handle = JoinHandle::new(cell.clone());
        let job = RunOnce(Some(cell));
        self.execute(Box::new(move || job.run()));
        handle
    }
}

/// Forwards `Executor` from `E` to each pointer type named (`&E`, `Arc<E>`), like std's
/// impls for its own traits: one impl per type, since a blanket impl over `Deref` would
/// overlap the concrete executors' impls.
macro_rules! forward_executor {
    ($($ptr:ty),+) => {$(
        impl<E: Executor> Executor for $ptr {
            fn execute(&self, job: Box<dyn FnOnce() + Send>) {
                (**self).execute(job)
            }

            fn spawn<F, T>(&self, f: F) -> JoinHandle<T>
            where
                F: FnOnce() -> T + Send + 'static,
                T: Send + 'static,
            {
                (**self).spawn(f)
            }
        }
    )+};
}

forward_executor!(&E, Arc<E>);

/// Runs a detached task once, outside any fiber; dropped unrun (its executor refused or
/// discarded the job), it fails the task as cancelled so that nobody waits for ever.
struct RunOnce<F, T>(Option<TaskArc<TaskCell<F, T>>>)
where
    F: FnOnce() -> T + Send + 'static,
    T: Send + 'static;

impl<F, T> RunOnce<F, T>
where
    F: FnOnce() -> T + Send + 'static,
    T: Send + 'static,
{
    fn run(mut self) {
        let Some(cell) = self.0.take() else { return };
        // `run` catches the task's panic and publishes it.
        cell.run(Start::Run);
    }
}

impl<F, T> Drop for RunOnce<F, T>
where
    F: FnOnce() -> T + Send + 'static,
    T: Send + 'static,
{
    fn drop(&mut self) {
        if let Some(cell) = self.0.take() {
            cell.fail(JoinError::cancelled());
        }
    }
}
