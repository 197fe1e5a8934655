//! [`JoinHandle`] and [`JoinError`]: a task's result and the one waiter for it.

use crate::fiber::FiberId;
use crate::sched::task::{Header, Job};
use std::any::Any;
use std::cell::UnsafeCell;
use std::fmt;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// A continuation registered with [`JoinHandle::then`], `catching` or `finally`.
type Callback<T> = Box<dyn FnOnce(&Result<T, JoinError>) + Send>;

/// The allocation behind one submitted task: header, closure, result, continuations.
pub(crate) struct JoinCell<F, T> {
    header: Header,
    func: UnsafeCell<Option<F>>,
    result: UnsafeCell<Option<Result<T, JoinError>>>,
    /// Continuations not run yet; `None` once they have run (later ones run at once).
    callbacks: parking_lot::Mutex<Option<Vec<Callback<T>>>>,
}

// SAFETY: `func` is taken exactly once, by the worker that starts the task (or the one that
// cancels it unstarted); `result` is written once before `Header::complete` (Release) and
// read only by the `JoinHandle` after it observed completion (Acquire). F and T are Send.
unsafe impl<F: Send, T: Send> Send for JoinCell<F, T> {}
// SAFETY: as above; no `&F` or `&T` is ever shared between threads.
unsafe impl<F: Send, T: Send> Sync for JoinCell<F, T> {}

impl<F, T> JoinCell<F, T>
where
    F: FnOnce() -> T + Send + 'static,
    T: Send + 'static,
{
    #[inline(always)]
    pub(crate) fn new(f: F, header: Header) -> Arc<Self> {
        Arc::new(JoinCell {
            header,
            func: UnsafeCell::new(Some(f)),
            result: UnsafeCell::new(None),
            callbacks: parking_lot::Mutex::new(Some(Vec::new())),
        })
    }

    fn publish(&self, r: Result<T, JoinError>) {
        if self.header.is_done() {
            return;
        }
        // SAFETY: only the worker owning the task publishes, once (checked above, and the
        // task reaches at most one of run/fail).
        unsafe { *self.result.get() = Some(r) };
        // Continuations run before `complete`, so no `join` can take the result meanwhile.
        let callbacks = self.callbacks.lock().take().unwrap_or_default();
        if !callbacks.is_empty() {
            // SAFETY: written just above; nobody takes it before `complete`.
            let result = unsafe { (*self.result.get()).as_ref() }.expect("just written");
            for cb in callbacks {
                run_callback(cb, result);
            }
        }
        self.header.complete();
    }
}

impl<F, T> Job for JoinCell<F, T>
where
    F: FnOnce() -> T + Send + 'static,
    T: Send + 'static,
{
    fn header(&self) -> &Header {
        &self.header
    }

    fn run(&self) {
        // SAFETY: the starting worker is the only one touching `func` (see the Sync impl).
        let f = unsafe { (*self.func.get()).take() };
        if let Some(f) = f {
            let value = f();
            self.publish(Ok(value));
        }
    }

    fn fail(&self, err: JoinError) {
        // SAFETY: as in `run`; a task that never started still owns its closure.
        drop(unsafe { (*self.func.get()).take() });
        self.publish(Err(err));
    }
}

/// Runs one continuation; its panic (already reported by the panic hook) must not unwind
/// into a worker or the task that completed.
fn run_callback<T>(cb: Callback<T>, result: &Result<T, JoinError>) {
    let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| cb(result)));
}

/// Trait object view of a task that yields a `T`, so `JoinHandle<T>` does not name the closure.
trait Output<T>: Send + Sync {
    fn header(&self) -> &Header;
    fn take(&self) -> Option<Result<T, JoinError>>;
    /// Runs `cb` with the result when the task completes, or now if it has.
    fn on_complete(&self, cb: Callback<T>);
}

impl<F, T> Output<T> for JoinCell<F, T>
where
    F: FnOnce() -> T + Send + 'static,
    T: Send + 'static,
{
    fn header(&self) -> &Header {
        &self.header
    }

    fn take(&self) -> Option<Result<T, JoinError>> {
        if !self.header.is_done() {
            return None;
        }
        // SAFETY: the result was written before `done` was set (observed above with
        // Acquire); the JoinHandle is the only reader, and `take` needs it by value.
        unsafe { (*self.result.get()).take() }
    }

    fn on_complete(&self, cb: Callback<T>) {
        let mut callbacks = self.callbacks.lock();
        match callbacks.as_mut() {
            Some(list) => list.push(cb),
            None => {
                drop(callbacks);
                // SAFETY: the list is gone only after `publish` wrote the result (the mutex
                // orders that write before us), and it cannot have been taken: `take` needs
                // the JoinHandle by value, and the caller borrows it.
                if let Some(result) = unsafe { (*self.result.get()).as_ref() } {
                    run_callback(cb, result);
                }
            }
        }
    }
}

/// An owned permission to wait for a task's result, like [`std::thread::JoinHandle`].
///
/// Dropping it detaches the task: it still runs to completion.
pub struct JoinHandle<T> {
    cell: Arc<dyn Output<T>>,
}

impl<T: Send + 'static> JoinHandle<T> {
    pub(crate) fn new<F>(cell: Arc<JoinCell<F, T>>) -> Self
    where
        F: FnOnce() -> T + Send + 'static,
    {
        JoinHandle { cell }
    }
}

impl<T> JoinHandle<T> {
    /// Waits for the task and returns its value, or why there is none. Inside a fiber this
    /// suspends only the fiber; on a plain thread it blocks the thread.
    pub fn join(self) -> Result<T, JoinError> {
        self.cell.header().wait(None);
        match self.cell.take() {
            Some(r) => r,
            // Unreachable in practice: `wait(None)` only returns once the result is published.
            None => Err(JoinError::cancelled()),
        }
    }

    /// Waits at most `timeout` for the task to finish; returns whether it did. The result
    /// stays available to [`join`](JoinHandle::join).
    pub fn wait_timeout(&self, timeout: Duration) -> bool {
        let deadline = Instant::now().checked_add(timeout);
        self.cell.header().wait(deadline.or(Some(far_future())))
    }

    /// Runs `f` with the task's value when it completes successfully — on the thread that
    /// completes it, or at once on this thread if it already has (seed 003's `then`).
    /// Returns `&self` for chaining. `f` must not wait for this same task.
    ///
    /// ```
    /// use std::sync::mpsc;
    /// let sched = fibra::Scheduler::builder().threads(1).build().unwrap();
    /// sched.start();
    /// let (tx, rx) = mpsc::channel();
    /// let (tx2, tx3) = (tx.clone(), tx.clone());
    /// let h = sched.submit(|| 1 + 2 + 3, None).unwrap();
    /// h.then(move |v| tx.send(format!("then {v}")).unwrap())
    ///     .catching(move |e| tx2.send(format!("caught {e}")).unwrap())
    ///     .finally(move || tx3.send("finally".into()).unwrap());
    /// assert_eq!(h.join().unwrap(), 6);
    /// assert_eq!(rx.try_iter().collect::<Vec<_>>(), ["then 6", "finally"]);
    /// ```
    pub fn then(&self, f: impl FnOnce(&T) + Send + 'static) -> &Self {
        self.cell.on_complete(Box::new(move |r| {
            if let Ok(v) = r {
                f(v)
            }
        }));
        self
    }

    /// Runs `f` with the error when the task fails (panics, is cancelled, or cannot start) —
    /// seed 003's `catching`. Same rules as [`then`](JoinHandle::then).
    pub fn catching(&self, f: impl FnOnce(&JoinError) + Send + 'static) -> &Self {
        self.cell.on_complete(Box::new(move |r| {
            if let Err(e) = r {
                f(e)
            }
        }));
        self
    }

    /// Runs `f` when the task completes either way — seed 003's `finally`. Same rules as
    /// [`then`](JoinHandle::then).
    pub fn finally(&self, f: impl FnOnce() + Send + 'static) -> &Self {
        self.cell.on_complete(Box::new(move |_| f()));
        self
    }

    /// Whether the task has finished (its result, value or error, is ready).
    pub fn is_finished(&self) -> bool {
        self.cell.header().is_done()
    }

    pub(crate) fn header(&self) -> &Header {
        self.cell.header()
    }

    /// The id of the task's fiber (assigned at submit, before it starts).
    pub fn id(&self) -> FiberId {
        self.cell.header().id
    }
}

/// A deadline that saturates instead of overflowing (about thirty years away).
pub(crate) fn far_future() -> Instant {
    let now = Instant::now();
    now.checked_add(Duration::from_secs(30 * 365 * 24 * 3600))
        .unwrap_or(now)
}

impl<T> fmt::Debug for JoinHandle<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let h = self.cell.header();
        f.debug_struct("JoinHandle")
            .field("id", &h.id)
            .field("name", &h.name)
            .field("finished", &h.is_done())
            .finish()
    }
}

/// Why a task produced no value: it panicked, it was cancelled, or it could not start.
pub struct JoinError {
    repr: Repr,
}

enum Repr {
    Panic(Box<dyn Any + Send>),
    Cancelled,
    NoStack(std::io::Error),
}

impl JoinError {
    pub(crate) fn panic(p: Box<dyn Any + Send>) -> Self {
        JoinError {
            repr: Repr::Panic(p),
        }
    }

    pub(crate) fn cancelled() -> Self {
        JoinError {
            repr: Repr::Cancelled,
        }
    }

    pub(crate) fn no_stack(e: std::io::Error) -> Self {
        JoinError {
            repr: Repr::NoStack(e),
        }
    }

    /// The task panicked.
    pub fn is_panic(&self) -> bool {
        matches!(self.repr, Repr::Panic(_))
    }

    /// The task was cancelled (by `stop_timeout`) before it finished, or never started.
    pub fn is_cancelled(&self) -> bool {
        matches!(self.repr, Repr::Cancelled)
    }

    /// No fiber stack could be allocated for the task, so it never ran. The closure was
    /// dropped; the cause is in [`std::error::Error::source`].
    pub fn is_no_stack(&self) -> bool {
        matches!(self.repr, Repr::NoStack(_))
    }

    /// The panic payload, to inspect or re-raise with [`std::panic::resume_unwind`].
    ///
    /// # Panics
    /// If the error is not a panic; use [`try_into_panic`](JoinError::try_into_panic) to check.
    pub fn into_panic(self) -> Box<dyn Any + Send> {
        match self.try_into_panic() {
            Ok(p) => p,
            Err(e) => panic!("JoinError::into_panic on an error that is not a panic: {e}"),
        }
    }

    /// The panic payload, or the error itself if it is not a panic.
    pub fn try_into_panic(self) -> Result<Box<dyn Any + Send>, JoinError> {
        match self.repr {
            Repr::Panic(p) => Ok(p),
            other => Err(JoinError { repr: other }),
        }
    }
}

fn panic_message(p: &(dyn Any + Send)) -> &str {
    if let Some(s) = p.downcast_ref::<&str>() {
        s
    } else if let Some(s) = p.downcast_ref::<String>() {
        s
    } else {
        "Box<dyn Any>"
    }
}

impl fmt::Debug for JoinError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.repr {
            Repr::Panic(p) => write!(f, "JoinError::Panic({:?})", panic_message(&**p)),
            Repr::Cancelled => f.write_str("JoinError::Cancelled"),
            Repr::NoStack(e) => write!(f, "JoinError::NoStack({e:?})"),
        }
    }
}

impl fmt::Display for JoinError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.repr {
            Repr::Panic(p) => write!(f, "task panicked: {}", panic_message(&**p)),
            Repr::Cancelled => f.write_str("task was cancelled"),
            Repr::NoStack(e) => write!(f, "task could not start: no fiber stack: {e}"),
        }
    }
}

impl std::error::Error for JoinError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match &self.repr {
            Repr::NoStack(e) => Some(e),
            _ => None,
        }
    }
}
