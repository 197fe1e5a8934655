//! [`spawn_local`]: a fiber on the calling fiber's own worker, for closures and results
//! that are not `Send`. A started fiber never changes thread, and a local task is pinned to
//! the worker that spawns it, so its closure, its fiber and its result all stay on that one
//! thread: `Rc` and `RefCell` state shared by the fibers of a worker needs no lock.
//!
//! The task goes through the scheduler's own machinery, which requires `Send`: the closure
//! and the result travel in a [`Local`], which is `Send` because it lets its value be used
//! only on the thread that made it (and leaks it, rather than drop it, anywhere else).

use super::{submit_to, worker};
use crate::fiber::current_meta;
use crate::{FiberId, JoinError, JoinHandle};
use std::cell::Cell;
use std::marker::PhantomData;
use std::mem::ManuallyDrop;
use std::sync::atomic::{AtomicU64, Ordering};

/// A value that may be used only on the thread that made it.
struct Local<V> {
    value: ManuallyDrop<V>,
    owner: u64,
}

thread_local! {
    /// This thread's number (see [`thread_key`]), 0 until asked.
    static KEY: Cell<u64> = const { Cell::new(0) };
}

/// The next thread number.
static NEXT_KEY: AtomicU64 = AtomicU64::new(1);

/// A number for the calling thread that no other thread of the process ever has (unlike a
/// thread-local's address, which a later thread may reuse), in a read of a thread-local
/// once given: `std::thread::current().id()` costs a reference count each time.
fn thread_key() -> u64 {
    KEY.with(|k| match k.get() {
        0 => {
            let key = NEXT_KEY.fetch_add(1, Ordering::Relaxed);
            k.set(key);
            key
        }
        key => key,
    })
}

// SAFETY: the value is reached only on its owner thread: `into_inner` checks the thread
// before it hands the value out (and panics, leaving it in place, elsewhere), and `drop`
// drops it there only, leaking it anywhere else. Moving the wrapper itself to another thread
// moves the bytes of `V`, never touching them.
unsafe impl<V> Send for Local<V> {}

impl<V> Local<V> {
    fn new(value: V) -> Self {
        Local {
            value: ManuallyDrop::new(value),
            owner: thread_key(),
        }
    }

    fn on_owner(&self) -> bool {
        thread_key() == self.owner
    }

    /// The value, on its owner thread.
    ///
    /// # Panics
    /// On any other thread (the value is then leaked, never dropped there).
    fn into_inner(self) -> V {
        assert!(
            self.on_owner(),
            "fibra: a spawn_local task's closure or result reached another thread"
        );
        let mut this = ManuallyDrop::new(self);
        // SAFETY: taken once, from a wrapper whose own drop will not run.
        unsafe { ManuallyDrop::take(&mut this.value) }
    }
}

impl<V> Drop for Local<V> {
    fn drop(&mut self) {
        if self.on_owner() {
            // SAFETY: dropped once, here, on the thread that owns the value.
            unsafe { ManuallyDrop::drop(&mut self.value) }
        }
        // Elsewhere (a queue drained by another thread at shutdown): leaked, not touched.
    }
}

/// Runs `f` as a new fiber on the calling fiber's worker, like [`spawn`](crate::spawn),
/// but with no `Send` bound on `f` or its result: the fiber runs on this worker's thread
/// and nowhere else, and so does everything it owns. The fibers of one worker can share
/// `Rc<RefCell<…>>` state without a lock (a borrow must not be held across a suspension:
/// another fiber of the worker may run there).
///
/// The handle does not leave the worker's thread either: it is `!Send`. Its handle reports
/// cancelled if the scheduler is shutting down and refuses new work.
///
/// # Panics
/// Outside a fiber of a [`Scheduler`](crate::Scheduler), with a message that says so.
///
/// ```
/// use std::{cell::RefCell, rc::Rc};
/// let sched = fibra::Scheduler::builder().threads(2).build().unwrap();
/// let total = sched.block_on(|| {
///     let seen = Rc::new(RefCell::new(Vec::new()));
///     let fibers: Vec<_> = (0..10)
///         .map(|i| {
///             let seen = seen.clone();
///             fibra::spawn_local(move || {
///                 fibra::Fiber::yield_now();
///                 seen.borrow_mut().push(i);
///             })
///         })
///         .collect();
///     fibers.into_iter().for_each(|h| h.join().unwrap());
///     let total: i32 = seen.borrow().iter().sum();
///     total
/// });
/// assert_eq!(total, 45);
/// ```
///
/// The handle of a `!Send` result cannot go to another thread:
/// ```compile_fail
/// let sched = fibra::Scheduler::builder().threads(1).build().unwrap();
/// sched.block_on(|| {
///     let h = fibra::spawn_local(|| std::rc::Rc::new(1));
///     std::thread::spawn(move || h.join());
/// });
/// ```
#[track_caller]
pub fn spawn_local<F, T>(f: F) -> LocalJoinHandle<T>
where
    F: FnOnce() -> T + 'static,
    T: 'static,
{
    let here = current_meta().and_then(|m| m.worker);
    let (shared, index) = match (worker::current_shared(), here) {
        (Some(shared), Some(index)) => (shared, index),
        _ => panic!(
            "fibra::spawn_local must be called from a fiber of a fibra Scheduler: it runs the \
             closure on that fiber's worker"
        ),
    };
    let f = Local::new(f);
    let body = move || Local::new(f.into_inner()());
    let inner = submit_to(&shared, body, Some(index), None, shared.config.stack_size)
        .unwrap_or_else(|refused| crate::join::cancelled(refused.into_inner()));
    LocalJoinHandle {
        inner,
        _not_send: PhantomData,
    }
}

/// Hands a standalone [`Fiber`](crate::Fiber), made in the calling fiber, to its worker:
/// the worker resumes it now and again after each of its yields, running its other fibers
/// in between, and the handle's [`join`](LocalJoinHandle::join) waits until it has ended (a
/// panic in it reaches the handle). This is the fiber half of `submit`: a coroutine written
/// by hand, scheduled like a task. A fiber already resumed part-way goes on from its last
/// yield; one that has ended is done at once.
///
/// Only its yields give the worker back: inside a standalone fiber, fibra's waits (`sleep`,
/// locks, sockets) block the worker's thread, as on a plain thread.
///
/// # Panics
/// Outside a fiber of a [`Scheduler`](crate::Scheduler), as [`spawn_local`].
///
/// ```
/// use std::{cell::RefCell, rc::Rc};
/// let sched = fibra::Scheduler::builder().threads(1).build().unwrap();
/// let log = sched.block_on(|| {
///     let log = Rc::new(RefCell::new(Vec::new()));
///     let l = log.clone();
///     let fiber = fibra::Fiber::new(move || {
///         for i in 0..3 {
///             l.borrow_mut().push(format!("fiber {i}"));
///             fibra::Fiber::yield_now();
///         }
///     });
///     let h = fibra::spawn_local_fiber(fiber);
///     for i in 0..3 {
///         log.borrow_mut().push(format!("caller {i}"));
///         fibra::Fiber::yield_now();
///     }
///     h.join().unwrap();
///     log.take()
/// });
/// // The caller and the handed-over fiber took turns on the worker.
/// assert_eq!(log[..4], ["caller 0", "fiber 0", "caller 1", "fiber 1"]);
/// ```
#[track_caller]
pub fn spawn_local_fiber(fiber: crate::Fiber) -> LocalJoinHandle<()> {
    spawn_local(move || {
        let mut fiber = fiber;
        loop {
            match fiber.resume() {
                crate::FiberState::Suspended => crate::Fiber::yield_now(),
                crate::FiberState::Panicked => {
                    if let Some(p) = fiber.take_panic() {
                        std::panic::resume_unwind(p);
                    }
                    // Its panic was taken before it was handed over: it has ended.
                    return;
                }
                _ => return,
            }
        }
    })
}

/// The handle of a fiber made by [`spawn_local`]: as a [`JoinHandle`], but it stays on the
/// thread of the worker that runs the fiber (`!Send`).
#[must_use = "dropping a LocalJoinHandle detaches the fiber; join() waits for it"]
pub struct LocalJoinHandle<T> {
    inner: JoinHandle<Local<T>>,
    _not_send: PhantomData<*const ()>,
}

impl<T> LocalJoinHandle<T> {
    /// Waits for the fiber to end and returns its result, as [`JoinHandle::join`]: parks
    /// the calling fiber until then.
    pub fn join(self) -> Result<T, JoinError> {
        self.inner.join().map(Local::into_inner)
    }

    /// Whether the fiber has ended (its result is ready).
    pub fn is_finished(&self) -> bool {
        self.inner.is_finished()
    }

    /// Cancels the fiber, as [`JoinHandle::cancel`].
    pub fn cancel(&self) {
        self.inner.cancel()
    }

    /// The fiber's id.
    pub fn id(&self) -> FiberId {
        self.inner.id()
    }
}

impl<T> std::fmt::Debug for LocalJoinHandle<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LocalJoinHandle")
            .field("id", &self.id())
            .field("finished", &self.is_finished())
            .finish()
    }
}
