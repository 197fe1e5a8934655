//! A scheduled task: the type-erased [`Job`] the run queues carry, and its [`Header`] —
//! identity, park word, completion state, and the fields only its home worker touches.
//!
//! One allocation per submitted task holds the header, the closure and the result slot
//! (`join::JoinCell`). Queues, `JoinHandle`s and `Unparker`s all share it by `Arc`.

use crate::fiber::{Coro, FiberId, FiberMeta};
use crate::join::JoinError;
use crate::park::{park_inner, ParkResult, Unparker};
use crate::sched::timers::TimerId;
use crate::sched::worker::Shared;
use std::any::Any;
use std::cell::UnsafeCell;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

/// Park word states, in the low two bits; the generation is the rest.
pub(crate) const RUNNING: u64 = 0;
pub(crate) const PARKED: u64 = 1;
pub(crate) const NOTIFIED: u64 = 2;
pub(crate) const STATE_BITS: u32 = 2;
pub(crate) const STATE_MASK: u64 = (1 << STATE_BITS) - 1;

/// A unit of work in the run queues: a task, unstarted or a started fiber.
pub(crate) trait Job: Send + Sync + 'static {
    /// The shared header.
    fn header(&self) -> &Header;
    /// Runs the user's closure and publishes its value. Called once, inside the fiber.
    fn run(&self);
    /// Publishes `err` as the result instead (panic, cancellation, no stack), dropping the
    /// closure if it never ran.
    fn fail(&self, err: JoinError);
}

/// What the run queues carry: sylar's `ScheduleTask` (fiber or callback). Unstarted tasks
/// (`Closure`) may run on any worker unless pinned; a started `Fiber` only on its home worker.
pub(crate) enum ScheduleTask {
    /// A task that has not run yet.
    Closure(Arc<dyn Job>),
    /// A started fiber to resume.
    Fiber(Arc<dyn Job>),
}

/// Where a started fiber lives. Written once by the worker that starts it, before any
/// `Unparker` exists; read by unparkers after their compare-and-swap on the park word, which
/// orders the read after that write.
pub(crate) struct Placement {
    pub(crate) sched: *const Shared,
    pub(crate) worker: usize,
}

/// State that only the home worker thread (and the fiber itself, on that thread) touches.
pub(crate) struct Home {
    /// The coroutine; `None` before start and after the end.
    pub(crate) fiber: Option<Coro>,
    /// Identity and stack bounds for `Fiber::current`, the panic hook and the overflow handler.
    pub(crate) meta: FiberMeta,
    /// Index in the home worker's registry of live fibers.
    pub(crate) slot: usize,
    /// Cancellation requested: every resume unwinds the fiber.
    pub(crate) cancel: bool,
    /// A panic of the park registration closure, to continue inside the fiber.
    pub(crate) pending_panic: Option<Box<dyn Any + Send>>,
    /// The timer of the current timed park, cancelled if something else wakes the fiber.
    pub(crate) timer: Option<TimerId>,
}

/// The part of a task every holder can see.
pub(crate) struct Header {
    pub(crate) id: FiberId,
    pub(crate) name: Option<Arc<str>>,
    pub(crate) stack_size: usize,
    /// Task pinned to a worker (never stolen), or free to run anywhere.
    pub(crate) pinned: Option<usize>,
    /// `(generation << 2) | RUNNING | PARKED | NOTIFIED`.
    pub(crate) park: AtomicU64,
    done: AtomicBool,
    /// Set once a joiner has stored its `Unparker`, so completion skips the lock otherwise.
    has_waiter: AtomicBool,
    waiter: parking_lot::Mutex<Option<Unparker>>,
    pub(crate) placement: UnsafeCell<Placement>,
    pub(crate) home: UnsafeCell<Home>,
}

// SAFETY: the shared fields are atomics or behind a mutex. `placement` is written once by the
// starting worker before it is published (see Placement). `home`, which holds the !Send
// coroutine, is only touched by the home worker thread: a started fiber never changes thread
// (DESIGN principle 2), and the worker keeps the fiber in its registry until it has ended,
// so the coroutine is created, resumed and dropped on that one thread.
unsafe impl Send for Header {}
// SAFETY: as for Send.
unsafe impl Sync for Header {}

impl Header {
    #[inline(always)]
    pub(crate) fn new(name: Option<Arc<str>>, stack_size: usize, pinned: Option<usize>) -> Header {
        let id = FiberId::next();
        Header {
            id,
            name: name.clone(),
            stack_size,
            pinned,
            park: AtomicU64::new(RUNNING),
            done: AtomicBool::new(false),
            has_waiter: AtomicBool::new(false),
            waiter: parking_lot::Mutex::new(None),
            placement: UnsafeCell::new(Placement {
                sched: std::ptr::null(),
                worker: 0,
            }),
            home: UnsafeCell::new(Home {
                fiber: None,
                meta: FiberMeta::new(id, name, None),
                slot: 0,
                cancel: false,
                pending_panic: None,
                timer: None,
            }),
        }
    }

    /// Moves the park word from "parked in generation `gen`" to "notified". Exactly one of
    /// the racing wakers (unparker, timer, canceller) wins and must queue the fiber.
    pub(crate) fn try_notify(&self, gen: u64) -> bool {
        let parked = (gen << STATE_BITS) | PARKED;
        let notified = (gen << STATE_BITS) | NOTIFIED;
        // AcqRel: Acquire pairs with the worker's Release store of PARKED (so `placement` is
        // visible to the winner); Release publishes the waker's writes to the fiber.
        self.park
            .compare_exchange(parked, notified, Ordering::AcqRel, Ordering::Relaxed)
            .is_ok()
    }

    /// Whether the result has been published.
    pub(crate) fn is_done(&self) -> bool {
        self.done.load(Ordering::Acquire)
    }

    /// Marks the result published and wakes the joiner, if one waits. The result slot must
    /// be written before this call.
    pub(crate) fn complete(&self) {
        // SeqCst (a Release store at least, so the result written before is visible to
        // whoever sees `done`): with the SeqCst store of `has_waiter` in `set_waiter`, either
        // we see the waiter flag or the waiter sees `done` (or both; unpark is idempotent).
        self.done.store(true, Ordering::SeqCst);
        if self.has_waiter.load(Ordering::SeqCst) {
            let waiter = self.waiter.lock().take();
            if let Some(u) = waiter {
                u.unpark();
            }
        }
    }

    /// Hands the joiner's `Unparker` to the task, to be used when it completes. Returns
    /// false (and drops it) if the task has already completed.
    pub(crate) fn set_waiter(&self, u: Unparker) -> bool {
        *self.waiter.lock() = Some(u);
        self.has_waiter.store(true, Ordering::SeqCst);
        if self.done.load(Ordering::SeqCst) {
            // Completion may have missed the flag; take the Unparker back ourselves.
            self.waiter.lock().take();
            return false;
        }
        true
    }

    /// Waits for the result (suspending a fiber, blocking a thread) until `deadline`.
    /// Returns whether the task finished.
    pub(crate) fn wait(&self, deadline: Option<Instant>) -> bool {
        loop {
            if self.is_done() {
                return true;
            }
            let r = park_inner(deadline, |u| {
                if !self.set_waiter(u.clone()) {
                    u.unpark();
                }
            });
            if r == ParkResult::TimedOut {
                self.waiter.lock().take();
                return self.is_done();
            }
        }
    }
}
