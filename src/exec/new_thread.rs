//! [`NewThread`]: an executor that starts a new thread for every job.

use super::Executor;
use crate::join::JoinHandle;
use crate::sched::Scheduler;

/// Name of the threads [`NewThread`] starts (`new-thread` for jobs, `new-thread-0` for a
/// fiber's one-worker scheduler).
const NAME: &str = "new-thread";

/// A new thread for every job.
///
/// [`execute`](Executor::execute) runs the job on a fresh, detached OS thread.
/// [`spawn`](Executor::spawn) gives the fiber a thread of its own that lives exactly as long
/// as the fiber: a one-worker [`Scheduler`] that shuts down when the fiber ends. Fibers the
/// fiber itself spawns on *other* executors do not keep that thread alive.
///
/// # Panics
/// Both methods panic if the OS refuses to create a thread, like [`std::thread::spawn`].
///
/// ```
/// use fibra::exec::{Executor, NewThread};
/// let here = std::thread::current().id();
/// let a = NewThread.spawn(|| std::thread::current().id());
/// let b = NewThread.spawn(|| std::thread::current().id());
/// let (a, b) = (a.join().unwrap(), b.join().unwrap());
/// assert!(a != here && b != here && a != b);
/// ```
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct NewThread;

impl Executor for NewThread {
    fn execute(&self, job: Box<dyn FnOnce() + Send>) {
        std::thread::Builder::new()
            .name(NAME.to_string())
            .spawn(job)
            .unwrap_or_else(|e| panic!("fibra: NewThread cannot spawn a thread: {e}"));
    }

    fn spawn<F, T>(&self, f: F) -> JoinHandle<T>
    where
        F: FnOnce() -> T + Send + 'static,
        T: Send + 'static,
    {
        let sched = Scheduler::builder()
            .threads(1)
            .name(NAME)
            .build()
            .expect("one worker with default settings is a valid scheduler");
        sched.start();
        let handle = match sched.submit(f, Some(0)) {
            Ok(h) => h,
            Err(_) => unreachable!("a scheduler just started accepts work"),
        };
        // The scheduler goes when the fiber ends. Usually this runs inside the fiber, where
        // dropping it only starts the shutdown and its worker exits once the fiber is gone;
        // if the fiber has already ended, it runs here and joins the worker.
        handle.finally(move || drop(sched));
        handle
    }
}
