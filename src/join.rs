//! [`JoinHandle`] and [`JoinError`]: waiting for a task's result, and registering
//! continuations (`then`, `catching`, `finally`) to run with it. The task itself — the cell
//! with the closure, the result slot and the continuations' list — is the scheduler's
//! (`sched::task_cell`).

use crate::fiber::FiberId;
use crate::sched::cell::{Inner, TaskArc};
use crate::sched::task::Task;
use crate::sched::task_cell::{detached_cell, Output, TaskCell};
use std::any::Any;
use std::fmt;
use std::ptr::NonNull;
use std::time::Duration;

/// An owned permission to wait for a task's result, like [`std::thread::JoinHandle`].
///
/// Dropping it detaches the task: it still runs to completion. The value of a task that
/// has finished is dropped there, by the code dropping the handle; that of one still running
/// is dropped in the task's own fiber when it finishes. Either way the value's destructor
/// may wait (lock, sleep, send) like any fiber code; a panic in it is reported and goes no
/// further.
///
/// It is also a [`Future`](std::future::Future) of the same result, so async code (a tokio task, any executor)
/// can `.await` a fiber; the awaiting task is woken when the fiber ends:
///
/// ```
/// let sched = fibra::Scheduler::builder().threads(1).build().unwrap();
/// sched.start();
/// let fiber = sched.submit(|| 6 * 7, None).unwrap();
/// // Any executor: here fibra's own `block_on` on this plain thread.
/// assert_eq!(fibra::future::block_on(async { fiber.await.unwrap() }), 42);
/// ```
pub struct JoinHandle<T> {
    cell: TaskArc<dyn Output<T>>,
}

impl<T: Send + 'static> JoinHandle<T> {
    pub(crate) fn new<F>(cell: TaskArc<TaskCell<F, T>>) -> Self
    where
        F: FnOnce() -> T + Send + 'static,
    {
        JoinHandle {
            // SAFETY: the identity unsizing coercion.
            cell: unsafe { cell.unsize(|p| -> NonNull<Inner<dyn Output<T>>> { p }) },
        }
    }
}

impl<T> JoinHandle<T> {
    /// Waits for the task and returns its value, or why there is none. Inside a fiber this
    /// suspends only the fiber; on a plain thread it blocks the thread.
    ///
    /// # Panics
    /// When the task joins its own handle, which would wait for ever (std's `join` of the
    /// current thread fails likewise). The panic is the task's own, and reaches whoever
    /// else waits for it.
    pub fn join(self) -> Result<T, JoinError> {
        crate::coop::spend();
        self.cell.header().wait(None);
        let cell = self.into_cell();
        match cell.take() {
            Some(r) => r,
            // Unreachable in practice: `wait(None)` only returns once the result is published.
            None => Err(JoinError::cancelled()),
        }
    }

    /// Waits at most `timeout` for the task to finish; returns whether it did. The result
    /// stays available to [`join`](JoinHandle::join).
    pub fn wait_timeout(&self, timeout: Duration) -> bool {
        crate::coop::spend();
        self.cell
            .header()
            .wait(Some(crate::sys::deadline_after(timeout)))
    }

    /// Runs `f` with the task's value when it completes successfully — on the thread that
    /// completes it (inside the task's fiber), or at once on this thread if it already has.
    /// Returns `&self` for chaining. `f` may do anything a fiber may (join other tasks,
    /// sleep, lock) but must not wait for this same task.
    ///
    /// Continuations registered from several threads may run at the same time, each with a
    /// `&T`, so `T` must be `Sync` (as for sharing a `&T` between threads anywhere):
    ///
    /// ```compile_fail
    /// # let sched = fibra::Scheduler::builder().threads(1).build().unwrap();
    /// let h = sched.submit(|| std::cell::Cell::new(0u64), None).unwrap();
    /// h.then(|c| c.set(c.get() + 1)); // error: `Cell<u64>` cannot be shared between threads
    /// ```
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
    pub fn then(&self, f: impl FnOnce(&T) + Send + 'static) -> &Self
    where
        T: Sync,
    {
        self.cell.on_complete(Box::new(move |r| {
            if let Ok(v) = r {
                f(v)
            }
        }));
        self
    }

    /// Runs `f` with the error when the task fails (panics, is cancelled, or cannot start) —
    /// Same rules as [`then`](JoinHandle::then): it runs inside a
    /// fiber (the failed task's own, or one started to report the failure of a task that
    /// never ran), so it may join, sleep or lock. The exception is a stopping scheduler that
    /// gives up: the continuations of a task it abandons (it did not end when cancelled; see
    /// [`Scheduler::stop_timeout`](crate::Scheduler::stop_timeout)) or of one that never
    /// started run on the worker thread as it leaves, where a wait blocks that thread.
    pub fn catching(&self, f: impl FnOnce(&JoinError) + Send + 'static) -> &Self {
        self.cell.on_complete(Box::new(move |r| {
            if let Err(e) = r {
                f(e)
            }
        }));
        self
    }

    /// Runs `f` when the task completes either way. Same rules as
    /// [`catching`](JoinHandle::catching), abandoned tasks included.
    pub fn finally(&self, f: impl FnOnce() + Send + 'static) -> &Self {
        self.cell.on_complete(Box::new(move |_| f()));
        self
    }

    /// Whether the task has finished (its result, value or error, is ready).
    pub fn is_finished(&self) -> bool {
        self.cell.header().is_done()
    }

    /// Waits until the task has finished, keeping the handle (and its result) whatever
    /// happens to the waiter.
    pub(crate) fn wait_finished(&self) {
        self.cell.header().wait(None);
    }

    /// The result of a task that has finished, taken without suspending: no budget yield,
    /// so no cancellation can come between the caller's taking the handle and this.
    pub(crate) fn into_finished(self) -> Result<T, JoinError> {
        debug_assert!(self.is_finished());
        self.into_cell()
            .take()
            .unwrap_or_else(|| Err(JoinError::cancelled()))
    }

    /// Cancels the task, as `stop_timeout` cancels what is still alive: a task that has not
    /// started never runs; a started fiber unwinds from its next suspension — at once if it
    /// is parked (waiting for a lock, a message, I/O, a sleep), else when it next parks or
    /// yields (fibra's operations yield now and then, see [`crate::coop`]). Its destructors
    /// run and may still wait. The handle then reports [`JoinError::is_cancelled`] (also
    /// [`is_cancelled`](JoinHandle::is_cancelled)). The fiber gets the cancellation once: if
    /// it catches the unwind and returns a value, that is its result. A finished task is not
    /// affected; cancelling twice is the same as once. Never blocks.
    ///
    /// The cancellation is an unwind, so a destructor that panics while it runs aborts the
    /// process, as any panic during an unwind does in Rust.
    ///
    /// ```
    /// use std::time::Duration;
    /// let sched = fibra::Scheduler::builder().threads(1).build().unwrap();
    /// sched.start();
    /// let sleeper = sched.submit(|| fibra::sleep(Duration::from_secs(3600)), None).unwrap();
    /// sleeper.cancel();
    /// assert!(sleeper.join().unwrap_err().is_cancelled());
    /// ```
    pub fn cancel(&self) {
        let h = self.cell.header();
        if !h.is_done() && h.request_cancel() {
            crate::sched::cancel_started(self.cell.task());
        }
    }

    /// Whether the task has finished cancelled (by [`cancel`](JoinHandle::cancel) or by the
    /// scheduler's shutdown). False while it runs.
    pub fn is_cancelled(&self) -> bool {
        self.cell.header().is_done() && self.cell.ended_cancelled()
    }

    /// Runs `f` (with no access to the result) when the task completes, or at once.
    pub(crate) fn on_complete(&self, f: impl FnOnce() + Send + 'static) {
        self.cell.on_complete(Box::new(move |_| f()));
    }

    /// Runs `f` with the result once the task has one (at once if it has).
    pub(crate) fn on_result(&self, f: impl FnOnce(&Result<T, JoinError>) + Send + 'static) {
        self.cell.on_complete(Box::new(f));
    }

    /// The id of the task's fiber (assigned at submit, before it starts).
    pub fn id(&self) -> FiberId {
        self.cell.header().id
    }
}

impl<T> JoinHandle<T> {
    /// The cell, without the handle's drop: for a caller that takes the result itself.
    fn into_cell(self) -> TaskArc<dyn Output<T>> {
        let this = std::mem::ManuallyDrop::new(self);
        // SAFETY: `this` is never dropped nor used again, so the cell is moved out once.
        unsafe { std::ptr::read(&this.cell) }
    }
}

impl<T> Drop for JoinHandle<T> {
    /// Detaches the task; a finished task's result is dropped here (see `Output::detach`).
    fn drop(&mut self) {
        self.cell.detach();
    }
}

impl<T> std::future::Future for JoinHandle<T> {
    type Output = Result<T, JoinError>;

    /// Ready with the task's result once it has finished.
    ///
    /// # Panics
    /// If polled again after it returned the result.
    fn poll(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Self::Output> {
        if !self.cell.header().poll_done(cx.waker()) {
            return std::task::Poll::Pending;
        }
        match self.cell.take() {
            Some(r) => std::task::Poll::Ready(r),
            None => panic!("a fibra JoinHandle was polled after it returned its result"),
        }
    }
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

/// A handle whose task was refused (its scheduler or executor has shut down): reports
/// cancelled.
#[track_caller]
pub(crate) fn cancelled<F, T>(f: F) -> JoinHandle<T>
where
    F: FnOnce() -> T + Send + 'static,
    T: Send + 'static,
{
    let cell = detached_cell(f);
    cell.fail(JoinError::cancelled());
    JoinHandle::new(cell)
}

/// Why a task produced no value: it panicked, it was cancelled, or it could not start.
///
/// `Send + Sync`: the panic payload inside is reachable only by value
/// ([`into_panic`](JoinError::into_panic)), never by reference.
pub struct JoinError {
    repr: Repr,
}

enum Repr {
    Panic(Payload),
    Cancelled,
    /// Cancelled, and abandoned by the scheduler without ending: the fiber is leaked, alive,
    /// with whatever its frames borrow (reported as cancelled).
    Abandoned,
    NoStack(std::io::Error),
}

impl JoinError {
    pub(crate) fn panic(p: Box<dyn Any + Send>) -> Self {
        JoinError {
            repr: Repr::Panic(Payload(p)),
        }
    }

    pub(crate) fn cancelled() -> Self {
        JoinError {
            repr: Repr::Cancelled,
        }
    }

    pub(crate) fn abandoned() -> Self {
        JoinError {
            repr: Repr::Abandoned,
        }
    }

    /// The task's fiber did not end: the scheduler gave up on it after cancelling it (see
    /// `Scheduler::stop_timeout`), and it stays alive, leaked.
    pub(crate) fn is_abandoned(&self) -> bool {
        matches!(self.repr, Repr::Abandoned)
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
    /// That includes a fiber that did not end once cancelled, which the scheduler abandoned
    /// (it is leaked, never resumed).
    pub fn is_cancelled(&self) -> bool {
        matches!(self.repr, Repr::Cancelled | Repr::Abandoned)
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
            Repr::Panic(p) => Ok(p.0),
            other => Err(JoinError { repr: other }),
        }
    }
}

/// A panic payload: `Box<dyn Any + Send>` is not `Sync`, so `JoinError` holds it in this
/// wrapper, which never lends it out by reference.
struct Payload(Box<dyn Any + Send>);

// SAFETY: a shared `&Payload` gives access only to `message`, which reads the payload as a
// `&str` or `String` — both `Sync` — and to nothing else; the box itself is only ever moved
// out by value (`try_into_panic(self)`), which needs the error owned.
unsafe impl Sync for Payload {}

impl Payload {
    fn message(&self) -> &str {
        panic_message(&*self.0)
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
            Repr::Panic(p) => write!(f, "JoinError::Panic({:?})", p.message()),
            Repr::Cancelled => f.write_str("JoinError::Cancelled"),
            Repr::Abandoned => f.write_str("JoinError::Cancelled (abandoned)"),
            Repr::NoStack(e) => write!(f, "JoinError::NoStack({e:?})"),
        }
    }
}

impl fmt::Display for JoinError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.repr {
            Repr::Panic(p) => write!(f, "task panicked: {}", p.message()),
            Repr::Cancelled => f.write_str("task was cancelled"),
            Repr::Abandoned => {
                f.write_str("task was cancelled and did not end: its fiber was abandoned")
            }
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
