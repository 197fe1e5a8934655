//! [`Looper`]: an executor of one thread running jobs in FIFO order.

use super::owned::OwnedScheduler;
use super::Executor;
use crate::join::JoinHandle;
use crate::sched::Scheduler;
use crate::sync::{Condvar, Mutex};
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::PoisonError;
use std::thread::ThreadId;

/// The looper thread's name is `looper-0`.
const NAME: &str = "looper";

/// What `Looper::requested` holds: no shutdown yet, one that runs the queued jobs, one that
/// drops them. It only moves up: a later `shutdown(false)` still drops what is queued.
const NOT_REQUESTED: u8 = 0;
const KEEP_QUEUED: u8 = 1;
const DROP_QUEUED: u8 = 2;

/// One thread that runs jobs in the order they arrive: the event loop of a UI or of a
/// NodeJS-style program.
///
/// Every job and every fiber [`spawn`](Executor::spawn)ed here runs on the looper thread,
/// and jobs *start* in submission order (FIFO). Unlike a plain event loop, a job is a fiber: when
/// it waits (`sleep`, `join`, a lock, [`unblock`](crate::unblock())), the next job starts, and
/// the waiting one later resumes — on the looper thread, always.
///
/// Underneath it is a one-worker [`Scheduler`] whose jobs are all pinned to that worker,
/// so they pass through its FIFO inbox.
///
/// # Shutting down
/// [`shutdown(true)`](Looper::shutdown) refuses new jobs and runs everything queued;
/// `shutdown(false)` drops the jobs that have not started (their handles report
/// [`is_cancelled`](crate::JoinError::is_cancelled)); fibers that have started run to
/// completion either way. After shutdown, `execute` drops jobs and `spawn` returns
/// cancelled handles. [`join`](Looper::join) waits for the looper thread to exit after a
/// shutdown requested anywhere — typically by one of its own jobs. Dropping the looper is
/// `shutdown(true)` followed by `join`: queued work is never lost silently.
///
/// ```
/// use fibra::exec::{Executor, Looper};
/// use std::sync::{Arc, Mutex};
///
/// let looper = Looper::new();
/// let order = Arc::new(Mutex::new(Vec::new()));
/// for i in 0..5 {
///     let order = order.clone();
///     looper.execute(Box::new(move || order.lock().unwrap().push(i)));
/// }
/// let on_looper = looper.spawn(|| std::thread::current().name().map(String::from));
/// assert_eq!(on_looper.join().unwrap().as_deref(), Some("looper-0"));
/// looper.shutdown(true);
/// assert_eq!(*order.lock().unwrap(), [0, 1, 2, 3, 4]);
/// ```
#[derive(Debug)]
pub struct Looper {
    owned: OwnedScheduler,
    /// `NOT_REQUESTED`, `KEEP_QUEUED` or `DROP_QUEUED`. An atomic, not a lock: a job that
    /// calls `shutdown` must not park before the scheduler's phase has moved, or the next
    /// queued job would start meanwhile.
    requested: AtomicU8,
    /// Held only around `join`'s check of `requested` and the notification that follows a
    /// request, so that `join` cannot miss it.
    requested_lock: Mutex<()>,
    shutdown_requested: Condvar,
}

impl Looper {
    /// Starts the looper thread.
    ///
    /// # Panics
    /// If the OS refuses to create the thread, like [`std::thread::spawn`].
    pub fn new() -> Looper {
        let owned = OwnedScheduler::start(Scheduler::builder().threads(1).name(NAME))
            .expect("one worker with default settings is a valid scheduler");
        Looper {
            owned,
            requested: AtomicU8::new(NOT_REQUESTED),
            requested_lock: Mutex::new(()),
            shutdown_requested: Condvar::new(),
        }
    }

    /// The id of the looper thread.
    pub fn thread_id(&self) -> ThreadId {
        self.owned.home_thread()
    }

    /// Stops the looper: no new jobs; with `wait_for_complete` the queued jobs still run,
    /// without it they are dropped (their handles report cancelled). Jobs that have already
    /// started run to completion either way.
    ///
    /// Called from outside the looper, it returns once the looper thread has exited (a
    /// calling fiber parks meanwhile). Called from one of the looper's own jobs, it only
    /// starts the shutdown and returns; the thread exits when the job and the rest of the
    /// work are done, and [`join`](Looper::join) waits for that. Calling it again is
    /// harmless; `false` after `true` still drops what is queued then.
    pub fn shutdown(&self, wait_for_complete: bool) {
        let asked = if wait_for_complete {
            KEEP_QUEUED
        } else {
            DROP_QUEUED
        };
        let discard = self.requested.fetch_max(asked, Ordering::SeqCst).max(asked) == DROP_QUEUED;
        // The scheduler's phase first: from one of the looper's own jobs this only moves it
        // (nothing here parks), so no queued job starts after the call began, even if the
        // notification below waits for the lock a joining thread holds.
        self.owned.stop(discard);
        drop(
            self.requested_lock
                .lock()
                .unwrap_or_else(PoisonError::into_inner),
        );
        self.shutdown_requested.notify_all();
    }

    /// Waits until the looper has been shut down (by [`shutdown`](Looper::shutdown), from
    /// anywhere) and its thread has exited. A fiber parks meanwhile; a thread blocks.
    ///
    /// # Panics
    /// If called on the looper thread itself, which would wait for ever.
    pub fn join(&self) {
        assert!(
            !self.owned.is_home(),
            "Looper::join on the looper thread would wait for itself"
        );
        {
            let guard = self
                .requested_lock
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            let _requested = self
                .shutdown_requested
                .wait_while(guard, |_| {
                    self.requested.load(Ordering::SeqCst) == NOT_REQUESTED
                })
                .unwrap_or_else(PoisonError::into_inner);
        }
        self.owned
            .stop(self.requested.load(Ordering::SeqCst) == DROP_QUEUED);
    }
}

impl Default for Looper {
    fn default() -> Self {
        Looper::new()
    }
}

impl Executor for Looper {
    fn execute(&self, job: Box<dyn FnOnce() + Send>) {
        drop(self.owned.sched.submit(job, Some(0)));
    }

    fn spawn<F, T>(&self, f: F) -> JoinHandle<T>
    where
        F: FnOnce() -> T + Send + 'static,
        T: Send + 'static,
    {
        self.owned
            .sched
            .submit(f, Some(0))
            .unwrap_or_else(|refused| crate::join::cancelled(refused.into_inner()))
    }
}

impl Drop for Looper {
    fn drop(&mut self) {
        let discard = *self.requested.get_mut() == DROP_QUEUED;
        self.owned.stop(discard);
    }
}
