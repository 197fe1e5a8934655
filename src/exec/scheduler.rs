//! [`Executor`] for [`Scheduler`]: jobs and fibers on any of its workers.

use super::Executor;
use crate::join::JoinHandle;
use crate::sched::Scheduler;

/// Jobs and fibers go to any worker ([`Scheduler::submit`] with no pin); a fiber stays on
/// the worker that starts it. After [`stop`](Scheduler::stop), `execute` drops the job and
/// `spawn` returns a handle that reports cancelled.
///
/// ```
/// use fibra::exec::Executor;
/// let sched = fibra::Scheduler::builder().threads(2).build().unwrap();
/// sched.start();
/// let h = sched.spawn(|| fibra::current_worker().is_some());
/// assert!(h.join().unwrap());
/// sched.stop();
/// assert!(sched.spawn(|| ()).join().unwrap_err().is_cancelled());
/// ```
impl Executor for Scheduler {
    fn execute(&self, job: Box<dyn FnOnce() + Send>) {
        drop(self.submit(job, None));
    }

    fn spawn<F, T>(&self, f: F) -> JoinHandle<T>
    where
        F: FnOnce() -> T + Send + 'static,
        T: Send + 'static,
    {
        Scheduler::spawn(self, f)
    }
}
