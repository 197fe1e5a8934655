//! The task cell, [`TaskCell`]: the one allocation behind a submitted task — its
//! [`Header`], the closure, the result slot and the continuations — and the only
//! implementor of [`Task`], so the body the worker runs. Made by `submit` (and the
//! executors), run by a worker, read by the task's `JoinHandle` through [`Output`], which
//! hides the closure's type; all three meet in this file.

use crate::fiber::Cancelled;
use crate::join::JoinError;
use crate::report::drop_catching;
use crate::sched::cell::{Inner, TaskArc};
use crate::sched::task::{as_task_ref, Ended, Header, Start, Task, TaskRef};
use crate::sys::spin::SpinLock;
use std::cell::UnsafeCell;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::ptr::NonNull;

/// A continuation registered with [`JoinHandle::then`](crate::JoinHandle::then), `catching`
/// or `finally`.
pub(crate) type Callback<T> = Box<dyn FnOnce(&Result<T, JoinError>) + Send>;

/// The allocation behind one submitted task: header, closure, result, continuations.
///
/// `repr(C)` with the header first, as [`Task`] requires.
#[repr(C)]
pub(crate) struct TaskCell<F, T> {
    header: Header,
    func: UnsafeCell<Option<F>>,
    /// Written once, under the `callbacks` lock, by whoever publishes the result.
    result: UnsafeCell<Option<Result<T, JoinError>>>,
    /// Continuations not run yet; `None` once the result is published (later ones run at
    /// once, on the thread that registers them).
    callbacks: SpinLock<Option<Vec<Callback<T>>>>,
}

// SAFETY: a TaskCell moves between threads in a `TaskArc`; it owns an `F` and a `T`, both Send.
unsafe impl<F: Send, T: Send> Send for TaskCell<F, T> {}
// SAFETY: what threads reach through a shared TaskCell:
// - `func` is taken exactly once, by the worker that starts the task (or the thread that
//   fails it unstarted): queues hand a task to one taker.
// - `result` is written once, under the `callbacks` lock, which also marks it published
//   (the list becomes `None`). After that it is read by reference from several threads at
//   once: by continuations on the publishing thread, and by continuations registered later
//   on their own threads (`on_complete`). Those hand out `&T` only through
//   `JoinHandle::then`, which requires `T: Sync`, and `&JoinError`, which is Sync.
//   `take` moves it out only through `JoinHandle::join(self)`, which owns the only handle,
//   after completion (Acquire on `done`), so no reference from `on_complete` can be live.
// - `callbacks` is behind a mutex; each callback is `Send` and runs once.
unsafe impl<F: Send, T: Send> Sync for TaskCell<F, T> {}

impl<F, T> TaskCell<F, T>
where
    F: FnOnce() -> T + Send + 'static,
    T: Send + 'static,
{
    /// A new cell for `f`, with the header `header` makes (built in the cell, see
    /// `TaskArc::new`).
    #[inline(always)]
    pub(crate) fn new(f: F, header: impl FnOnce() -> Header) -> TaskArc<Self> {
        let cell = TaskArc::new(|| Self::value(f, header()));
        Self::known(&cell);
        cell
    }

    /// A new cell, with two references to it: one for a `JoinHandle`, one for the run
    /// queues.
    #[inline(always)]
    pub(crate) fn new_pair(f: F, header: impl FnOnce() -> Header) -> (TaskArc<Self>, TaskRef) {
        let (cell, task) = TaskArc::new_pair(|| Self::value(f, header()));
        Self::known(&cell);
        (cell, as_task_ref(task))
    }

    #[inline(always)]
    fn value(f: F, header: Header) -> Self {
        TaskCell {
            header,
            func: UnsafeCell::new(Some(f)),
            result: UnsafeCell::new(None),
            callbacks: SpinLock::new(Some(Vec::new())),
        }
    }

    /// Tells a new cell's header where the cell is (see `Header::set_cell`).
    #[inline(always)]
    fn known(cell: &TaskArc<Self>) {
        let this: NonNull<Inner<dyn Task>> = TaskArc::<Self>::cell_ptr(cell);
        // SAFETY: `this` is the cell around this header (unsized to `dyn Task`, which reads
        // the header first), and the cell has not left our caller yet.
        unsafe { cell.header.set_cell(this) };
    }

    /// Stores the result, runs the continuations, then wakes the joiners. Only the first
    /// publication counts; a later one (an abandoned fiber that was in the middle of its
    /// continuations) only makes sure the joiners are woken.
    fn publish(&self, r: Result<T, JoinError>) {
        let callbacks = {
            let mut callbacks = self.callbacks.lock();
            match callbacks.take() {
                Some(list) => {
                    // SAFETY: the list was still there, so nobody published before us, and
                    // nobody reads the slot until the list is gone (see the Sync impl).
                    unsafe { *self.result.get() = Some(r) };
                    Some(list)
                }
                None => {
                    drop(callbacks);
                    drop_catching(r);
                    None
                }
            }
        };
        if let Some(list) = callbacks {
            if !list.is_empty() {
                // SAFETY: written just above; only `join` takes it, after `complete`.
                let result = unsafe { (*self.result.get()).as_ref() }.expect("just written");
                for cb in list {
                    run_callback(cb, result);
                }
            }
        }
        // Continuations ran before `complete`, so no `join` can take the result meanwhile.
        if self.header.complete() {
            // The handle went first: nobody will take the result, so it is dropped here, in
            // the task's fiber (or on the thread that failed the task), not on a worker's own
            // stack whenever the last reference goes.
            // SAFETY: published, continuations run, the handle gone (no `join`, no
            // `on_complete`), and `complete` tells only this side to drop it.
            drop_catching(unsafe { (*self.result.get()).take() });
        }
    }
}

// SAFETY: `TaskCell` is `repr(C)` with its `Header` first.
unsafe impl<F, T> Task for TaskCell<F, T>
where
    F: FnOnce() -> T + Send + 'static,
    T: Send + 'static,
{
    fn run(&self, start: Start) -> Ended {
        // SAFETY: the starting worker is the only one touching `func` (see the Sync impl).
        let f = unsafe { (*self.func.get()).take() };
        let (result, ended) = match (start, f) {
            (Start::Run, Some(f)) => {
                let r = catch_unwind(AssertUnwindSafe(f));
                // The fiber's fiber-locals go as its body ends, inside it, before anyone
                // can see the result; a destructor's panic fails a task that returned.
                let dropped = self.header.end_of_fiber();
                match (r, dropped) {
                    (Ok(value), None) => (Ok(value), Ended::Returned),
                    (Ok(value), Some(p)) => {
                        drop_catching(value);
                        (Err(JoinError::panic(p)), Ended::Panicked)
                    }
                    (Err(p), dropped) => {
                        drop_catching(dropped);
                        if p.is::<Cancelled>() {
                            drop_catching(p);
                            (Err(JoinError::cancelled()), Ended::Cancelled)
                        } else {
                            (Err(JoinError::panic(p)), Ended::Panicked)
                        }
                    }
                }
            }
            (Start::Fail(err), f) => {
                drop_catching(f);
                let ended = if err.is_cancelled() {
                    Ended::Cancelled
                } else {
                    Ended::Panicked
                };
                (Err(err), ended)
            }
            (Start::Run, None) => unreachable!("a task runs once"),
        };
        self.publish(result);
        ended
    }

    fn fail(&self, err: JoinError) {
        // SAFETY: as in `run`; a task that never started still owns its closure.
        drop_catching(unsafe { (*self.func.get()).take() });
        self.publish(Err(err));
    }
}

impl<F, T> Drop for TaskCell<F, T> {
    /// Drops the closure, the result and any continuations not run, catching a panic in
    /// their destructors: the last reference is often a worker's, and a worker never dies.
    fn drop(&mut self) {
        drop_catching(self.func.get_mut().take());
        drop_catching(self.result.get_mut().take());
        drop_catching(self.callbacks.get_mut().take());
    }
}

/// Drops `value` for the code dropping a `JoinHandle`: a panic in its destructor is reported
/// and goes no further, as in [`drop_catching`], but the cancellation of a fiber waiting in
/// that destructor is raised in the fiber (see `fiber::raise_cancelled`).
fn drop_in_caller<V>(value: V) {
    if let Err(payload) = catch_unwind(AssertUnwindSafe(move || drop(value))) {
        if payload.is::<Cancelled>() {
            crate::fiber::raise_cancelled(payload);
        } else {
            std::mem::forget(payload);
        }
    }
}

/// Runs one continuation; its panic (already reported by the panic hook) must not unwind
/// into a worker or the task that completed.
fn run_callback<T>(cb: Callback<T>, result: &Result<T, JoinError>) {
    if let Err(payload) = catch_unwind(AssertUnwindSafe(|| cb(result))) {
        drop_catching(payload);
    }
}

/// Trait object view of a task that yields a `T`, so `JoinHandle<T>` does not name the closure.
pub(crate) trait Output<T>: Send + Sync {
    fn header(&self) -> &Header;
    fn take(&self) -> Option<Result<T, JoinError>>;
    /// Runs `cb` with the result when the task completes, or now if it has.
    fn on_complete(&self, cb: Callback<T>);
    /// The task, as the run queues carry it.
    fn task(&self) -> TaskRef;
    /// Whether the published result is a cancellation.
    fn ended_cancelled(&self) -> bool;
    /// The handle is dropped: the result, now or when it comes, is dropped by whichever of
    /// the two comes later.
    fn detach(&self);
}

impl<F, T> Output<T> for TaskCell<F, T>
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
        // Acquire); `take` is only called by `JoinHandle::join`, which owns the one handle,
        // and by its `poll`, which borrows it mutably: no `&T` from `then` can be live.
        unsafe { (*self.result.get()).take() }
    }

    fn task(&self) -> TaskRef {
        // SAFETY: every TaskCell lives in a TaskArc (`TaskCell::new`), and `self` is reached
        // through one; the coercion is the identity.
        as_task_ref(unsafe { TaskArc::from_value(self) })
    }

    fn ended_cancelled(&self) -> bool {
        let callbacks = self.callbacks.lock();
        // SAFETY: the list is gone only after the result was written under this lock; a
        // `take` (by `join`, which owns the one handle) cannot run while the caller borrows
        // the handle.
        callbacks.is_none()
            && matches!(unsafe { &*self.result.get() }, Some(Err(e)) if e.is_cancelled())
    }

    fn detach(&self) {
        if self.header.detach() {
            // Done: dropped here, by the handle's owner, as the value would have been after a
            // `join`. A destructor that waits suspends the owner's fiber, not a worker.
            // SAFETY: published and its continuations run (`complete` came after them);
            // this handle, going now, was the only way to `join` or `on_complete`; and
            // `detach` tells only this side to drop it.
            drop_in_caller(unsafe { (*self.result.get()).take() });
        }
    }

    fn on_complete(&self, cb: Callback<T>) {
        let mut callbacks = self.callbacks.lock();
        match callbacks.as_mut() {
            Some(list) => list.push(cb),
            None => {
                drop(callbacks);
                // SAFETY: the list is gone only after the result was written under the same
                // lock, and it cannot have been taken: `take` needs the JoinHandle by value,
                // and the caller borrows it. Other threads may read it at the same time
                // (see the Sync impl).
                if let Some(result) = unsafe { (*self.result.get()).as_ref() } {
                    run_callback(cb, result);
                }
            }
        }
    }
}

/// A task cell that no scheduler owns: run by hand (the executors' `RunOnce`) or failed at
/// once ([`crate::join::cancelled`]).
#[track_caller]
pub(crate) fn detached_cell<F, T>(f: F) -> TaskArc<TaskCell<F, T>>
where
    F: FnOnce() -> T + Send + 'static,
    T: Send + 'static,
{
    let location = std::panic::Location::caller();
    TaskCell::new(f, || {
        Header::new(None, crate::stack::DEFAULT_STACK_SIZE, None, location)
    })
}
