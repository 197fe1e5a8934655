//! A scheduled task: the type-erased [`Task`] the run queues carry, its [`Header`] —
//! identity, park word (the park protocol's `ParkWord`), completion state and joiners, and
//! the fields only its home worker touches ([`HomeOnly`]).
//!
//! One allocation per submitted task holds the header, the closure and the result slot
//! (`task_cell::TaskCell`). Queues, `JoinHandle`s and `Unparker`s all share it by
//! [`TaskArc`](crate::sched::cell::TaskArc), whose memory comes from per-thread block caches.

use crate::fiber::{Coro, FiberId, FiberMeta};
use crate::join::JoinError;
use crate::park::protocol::ParkWord;
use crate::park::wait_queue::{wait, Lock, Wait, WaitList};
use crate::park::WaitOn;
use crate::sched::cell::{Inner, TaskArc};
use crate::sched::timers::TimerId;
use crate::sched::worker::Shared;
use std::any::Any;
use std::cell::UnsafeCell;
use std::panic::Location;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicU8, Ordering};
use std::sync::Arc;
use std::time::Instant;

/// How a task's fiber starts: run the closure, or publish an error without running it
/// (cancelled before it started, no stack of its size) — inside a fiber all the same, so
/// its continuations may wait like any fiber code.
pub(crate) enum Start {
    Run,
    Fail(JoinError),
}

/// How a task ended, for the worker's count of cancellations.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum Ended {
    Returned,
    Panicked,
    Cancelled,
}

/// A unit of work in the run queues: a task, unstarted or a started fiber.
///
/// # Safety
/// An implementor is `#[repr(C)]` with its [`Header`] as its first field: the worker reads
/// the header of a `dyn Task` at every switch, and `<dyn Task>::header` does it
/// without a virtual call by reading it at the value's address.
pub(crate) unsafe trait Task: Send + Sync + 'static {
    /// Runs the user's closure (or fails as `start` says) and publishes the result, all
    /// inside the task's fiber; panics and cancellation are caught here. Called once.
    fn run(&self, start: Start) -> Ended;
    /// Publishes `err` as the result from outside any fiber (the task's fiber could not be
    /// created, or was abandoned), dropping the closure if it never ran.
    fn fail(&self, err: JoinError);
}

impl dyn Task {
    /// The shared header.
    #[inline(always)]
    pub(crate) fn header(&self) -> &Header {
        // SAFETY: every implementor of `Task` is `#[repr(C)]` with its `Header` first (the
        // trait's contract), so the value's address is its header's, and the header lives as
        // long as the value borrowed here.
        unsafe { &*std::ptr::from_ref(self).cast::<Header>() }
    }
}

/// A shared reference to a task, as the run queues, the registry and unparkers hold it.
pub(crate) type TaskRef = TaskArc<dyn Task>;

/// The task in `cell`, as the run queues carry it.
#[inline(always)]
pub(crate) fn as_task_ref<J: Task>(cell: TaskArc<J>) -> TaskRef {
    // SAFETY: the identity unsizing coercion.
    unsafe { cell.unsize(|p| -> NonNull<Inner<dyn Task>> { p }) }
}

/// A slot that holds one unstarted task: a worker's `next` (the LIFO slot). Its owner puts a
/// task in and gets the one it displaces back; the owner or any thief takes the task out.
/// Each is one atomic swap of a thin pointer (a task's header), where a one-place
/// `ArrayQueue` would take three locked instructions to displace (a fence, a compare-and-swap
/// and a swap) on every spawn from a fiber.
///
/// A non-null pointer in the slot stands for one reference to the task's cell, given up by
/// [`TaskSlot::replace`] and taken back by whoever swaps it out.
pub(crate) struct TaskSlot(AtomicPtr<Header>);

impl TaskSlot {
    pub(crate) const fn new() -> TaskSlot {
        TaskSlot(AtomicPtr::new(std::ptr::null_mut()))
    }

    /// Puts `task` in the slot; returns the task it displaced.
    #[inline]
    pub(crate) fn replace(&self, task: TaskRef) -> Option<TaskRef> {
        let header = into_header(task).as_ptr();
        // Release: whoever swaps the task out sees its cell as written before (the
        // closure, the header). Acquire: the same for the task displaced.
        let old = self.0.swap(header, Ordering::AcqRel);
        // SAFETY: a pointer swapped out of the slot is ours to take back (see the type).
        unsafe { Self::task(old) }
    }

    /// Takes the task out, if there is one.
    #[inline]
    pub(crate) fn take(&self) -> Option<TaskRef> {
        if self.is_empty() {
            return None;
        }
        // Acquire: pairs with `replace`'s Release.
        let old = self.0.swap(std::ptr::null_mut(), Ordering::Acquire);
        // SAFETY: as in `replace`.
        unsafe { Self::task(old) }
    }

    /// Whether the slot is empty (racy unless only the caller fills it and nobody takes).
    #[inline]
    pub(crate) fn is_empty(&self) -> bool {
        self.0.load(Ordering::Relaxed).is_null()
    }

    /// 0 or 1.
    pub(crate) fn len(&self) -> usize {
        usize::from(!self.is_empty())
    }

    /// The task whose header `header` points to, from the reference the slot held.
    ///
    /// # Safety
    /// `header` is null or was swapped out of a slot (so it stands for one reference, now the
    /// caller's).
    #[inline(always)]
    unsafe fn task(header: *mut Header) -> Option<TaskRef> {
        // SAFETY: per the caller; the slot's pointers come from `into_header`.
        NonNull::new(header).map(|h| unsafe { from_header(h) })
    }
}

/// Gives up a task reference as one thin pointer, to its header (a [`TaskSlot`], an
/// `Unparker`), until [`from_header`] takes it back.
#[inline(always)]
pub(crate) fn into_header(task: TaskRef) -> NonNull<Header> {
    let header = NonNull::from(task.header());
    let _ = TaskArc::into_raw(task);
    header
}

/// Takes back the reference that [`into_header`] gave up.
///
/// # Safety
/// `header` came from `into_header`, and the reference it stands for is taken back once.
#[inline(always)]
pub(crate) unsafe fn from_header(header: NonNull<Header>) -> TaskRef {
    // SAFETY: the reference `header` stands for keeps the cell, and so the header, alive;
    // `this` was written before the cell was shared (`TaskCell::new`, the only maker of
    // tasks), so before `into_header` could see it.
    let cell = unsafe { *header.as_ref().this.get() };
    let cell = cell.expect("a shared task's header knows its cell");
    // SAFETY: the pointer stands for one reference (per the caller), given up by
    // `into_header` through `into_raw`; it is taken back here once.
    unsafe { TaskArc::from_raw(cell) }
}

impl Drop for TaskSlot {
    fn drop(&mut self) {
        drop(self.take());
    }
}

/// An entry of a run queue: what the worker that pops it does. A task to `Start` may run on
/// any worker unless pinned; a started task's fiber to `Resume` only on its home worker.
pub(crate) enum ScheduleTask {
    /// A task that has not run yet.
    Start(TaskRef),
    /// A started fiber to resume.
    Resume(TaskRef),
    /// `JoinHandle::cancel` of a started fiber, for its home worker to deliver.
    Cancel(TaskRef),
    /// `Scheduler::dump`: list this worker's fibers.
    Dump(Arc<crate::sched::worker::DumpRequest>),
}

/// Where a started fiber lives. Written once by the worker that starts it, before any
/// `Unparker` exists; read by unparkers after they won `ParkWord::notify`, which orders the
/// read after that write.
pub(crate) struct Placement {
    pub(crate) sched: *const Shared,
    pub(crate) worker: usize,
}

/// A started fiber's cancellation, delivered at most once.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum Cancel {
    /// Not cancelled.
    No,
    /// The next resumption unwinds the fiber.
    Requested,
    /// The fiber has been resumed with its cancellation and is unwinding (or caught it).
    /// Its waits from now on work as usual — a destructor may flush a file, sleep or lock —
    /// bounded by the grace `stop_timeout` gives before it abandons what is left.
    Delivered,
}

/// A started fiber's home-only state: what only its home worker thread (and the fiber
/// itself, on that thread) touches.
///
/// `repr(C)`, in the order a resumption and a yield touch it: the coroutine, the park's
/// timer and outcome, then `meta`, whose own hot fields come first; with `Header::park` just
/// before, the fields of a switch lie in about 110 consecutive bytes of the cell. Left to
/// the compiler they spread over five cache lines, and a worker cycling through a hundred
/// yielding fibers pays for the extra lines in misses.
#[repr(C)]
pub(crate) struct HomeOnly {
    /// The coroutine; `None` before start and after the end.
    pub(crate) fiber: Option<Coro>,
    /// The timer of the current timed park, cancelled if something else wakes the fiber.
    pub(crate) timer: Option<TimerId>,
    /// A panic of the park registration closure, to continue inside the fiber.
    pub(crate) pending_panic: Option<Box<dyn Any + Send>>,
    /// The current park ended by its deadline; the next resumption says so.
    pub(crate) timed_out: bool,
    pub(crate) cancel: Cancel,
    /// How the task's body ended, written by the fiber as its last act.
    pub(crate) ended: Ended,
    /// Identity and stack bounds for `Fiber::current`, the panic hook and the overflow handler.
    pub(crate) meta: FiberMeta,
    /// Index in the home worker's registry of live fibers.
    pub(crate) slot: usize,
    /// When the fiber last switched out (coarse `CLOCK_MONOTONIC` ns), and the deadline of
    /// its current park: for `Scheduler::dump`.
    pub(crate) since: u64,
    pub(crate) deadline: Option<Instant>,
    /// Set when the fiber is abandoned: keeps its scheduler's shared state alive for as long
    /// as anything (an `Unparker` in the middle of a wake) can still reach the task.
    pub(crate) keep_alive: Option<Arc<Shared>>,
}

/// The waiters of `join`/`wait_timeout`: an intrusive FIFO, nodes on the waiters' stacks.
/// Who waits for a task's result: fibers and threads in `list`, and at most one async task
/// (the `JoinHandle` is unique, so one future polls it).
pub(crate) struct Joiners {
    list: WaitList<()>,
    waker: Option<std::task::Waker>,
}

const STARTED: u8 = 1;
const CANCEL_REQUESTED: u8 = 2;
/// `Header::done`: the result is published.
const DONE: u8 = 1;
/// `Header::done`: the `JoinHandle` is gone.
const DETACHED: u8 = 2;

/// The token a completing task wakes its joiners with.
const COMPLETED: usize = 1;

/// The part of a task every holder can see. `repr(C)`, for the order of `park` and `home`.
#[repr(C)]
pub(crate) struct Header {
    pub(crate) id: FiberId,
    pub(crate) name: Option<Arc<str>>,
    pub(crate) stack_size: usize,
    /// Task pinned to a worker (never stolen), or free to run anywhere.
    pub(crate) pinned: Option<usize>,
    /// Where the task was submitted, for `Scheduler::dump`.
    pub(crate) location: &'static Location<'static>,
    /// The cell this header is in, as the run queues see it: written once, by
    /// `TaskCell::new` before the cell is shared, so that a [`TaskSlot`] can hold a task as
    /// one thin pointer (to this header) and make a [`TaskRef`] of it again.
    this: UnsafeCell<Option<NonNull<Inner<dyn Task>>>>,
    /// The fiber's span, entered while it runs; a child of the span current where it was
    /// submitted.
    #[cfg(feature = "tracing")]
    pub(crate) span: tracing::Span,
    /// `STARTED` once a worker has placed the task, `CANCEL_REQUESTED` once
    /// `JoinHandle::cancel` was called: one word, so that exactly one of the two sees the
    /// other (a cancel before the start fails the start; after it, the home worker is told).
    run_state: AtomicU8,
    /// `DONE` once the result is published, `DETACHED` once the `JoinHandle` is gone: one
    /// word, so that of the two `fetch_or`s the later sees the earlier, and its side drops
    /// the result (see `TaskCell::publish`).
    done: AtomicU8,
    /// Set once a joiner has queued (under `joiners`' lock), so completion skips the lock
    /// otherwise.
    has_joiners: AtomicBool,
    joiners: Lock<Joiners>,
    pub(crate) placement: UnsafeCell<Placement>,
    /// Written at every resumption and park: kept next to `home` (see `HomeOnly`).
    pub(crate) park: ParkWord,
    pub(crate) home: UnsafeCell<HomeOnly>,
}

// SAFETY: the shared fields are atomics or behind a lock. `placement` is written once by the
// starting worker before it is published (see Placement). `home`, which holds the !Send
// coroutine and the fiber's fiber-locals, is only touched by the home worker thread: a started fiber never changes thread
// (docs/design.md, "Principles"), and the worker keeps the fiber in its registry until it has
// ended, so the coroutine is created, resumed and dropped on that one thread. The one
// exception is abandonment of `use_caller`'s worker 0 by another thread, which happens only
// while no thread drives that worker and never runs or drops the coroutine (it is leaked).
unsafe impl Send for Header {}
// SAFETY: as for Send.
unsafe impl Sync for Header {}

impl Header {
    #[inline(always)]
    pub(crate) fn new(
        name: Option<Arc<str>>,
        stack_size: usize,
        pinned: Option<usize>,
        location: &'static Location<'static>,
    ) -> Header {
        let id = FiberId::next();
        Header {
            id,
            name: name.clone(),
            stack_size,
            pinned,
            location,
            this: UnsafeCell::new(None),
            #[cfg(feature = "tracing")]
            span: tracing::info_span!("fiber", id = id.as_u64(), name = name.as_deref()),
            park: ParkWord::new(),
            run_state: AtomicU8::new(0),
            done: AtomicU8::new(0),
            has_joiners: AtomicBool::new(false),
            joiners: Lock::new(Joiners {
                list: WaitList::new(),
                waker: None,
            }),
            placement: UnsafeCell::new(Placement {
                sched: std::ptr::null(),
                worker: 0,
            }),
            home: UnsafeCell::new(HomeOnly {
                fiber: None,
                meta: FiberMeta::new(id, name, None),
                slot: 0,
                cancel: Cancel::No,
                pending_panic: None,
                timer: None,
                timed_out: false,
                since: 0,
                deadline: None,
                ended: Ended::Returned,
                keep_alive: None,
            }),
        }
    }

    /// Drops the fiber-locals of this task's fiber, if the caller runs in that fiber (a
    /// task an executor runs by hand has none of its own): `Some(payload)` if a destructor
    /// panicked. See `crate::fiber::end_of_fiber`.
    pub(crate) fn end_of_fiber(&self) -> Option<Box<dyn std::any::Any + Send>> {
        // SAFETY: a place projection only.
        let meta: *const FiberMeta = unsafe { &raw const (*self.home.get()).meta };
        // Most fibers have no fiber-local: one look at the table's length, no thread-local.
        // SAFETY: the table is written only by the fiber it belongs to, on its home thread,
        // which is this thread if the caller is that fiber; a task run by hand has no fiber
        // of its own, and nothing ever writes its table.
        if unsafe { (*meta).locals.is_empty() } {
            return None;
        }
        let current = crate::fiber::current_meta()?;
        if !std::ptr::eq(current, meta) {
            return None;
        }
        crate::fiber::end_of_fiber(current)
    }

    /// Records the cell this header is in (see `this`).
    ///
    /// # Safety
    /// `cell` is the cell whose value starts with this header, and no other thread can reach
    /// the cell yet.
    #[inline(always)]
    pub(crate) unsafe fn set_cell(&self, cell: NonNull<Inner<dyn Task>>) {
        // SAFETY: per the caller, nothing else reads or writes `this` now.
        unsafe { *self.this.get() = Some(cell) };
    }

    /// Whether the result has been published.
    pub(crate) fn is_done(&self) -> bool {
        self.done.load(Ordering::Acquire) & DONE != 0
    }

    /// The starting worker, after writing the placement: marks the task started. Returns
    /// whether a cancellation was requested before.
    pub(crate) fn mark_started(&self) -> bool {
        // AcqRel: Release publishes the placement to a canceller that sees STARTED; Acquire
        // pairs with its request.
        self.run_state.fetch_or(STARTED, Ordering::AcqRel) & CANCEL_REQUESTED != 0
    }

    /// Requests cancellation. Returns whether the task had started (its home worker must be
    /// told then; an unstarted task fails when it starts).
    pub(crate) fn request_cancel(&self) -> bool {
        self.run_state.fetch_or(CANCEL_REQUESTED, Ordering::AcqRel) & STARTED != 0
    }

    /// Whether the result has been published, in the SeqCst order `complete` stores it in
    /// (see `sched::cancel_started`).
    pub(crate) fn is_done_seqcst(&self) -> bool {
        self.done.load(Ordering::SeqCst) & DONE != 0
    }

    /// Marks the result published and wakes every joiner. The result slot must be written
    /// before this call. Idempotent. Returns whether this first publication found the handle
    /// gone (`detach` came first): the publisher then drops the result.
    pub(crate) fn complete(&self) -> bool {
        // SeqCst (Release at least, so the result written before is visible to whoever sees
        // `done`): with the SeqCst store of `has_joiners` in `wait`, either we see the flag
        // or the joiner sees `done` (or both).
        let prev = self.done.fetch_or(DONE, Ordering::SeqCst);
        if self.has_joiners.load(Ordering::SeqCst) {
            let mut g = self.joiners.lock();
            let (joiners, wakes) = g.parts();
            joiners.list.wake_all(COMPLETED, wakes);
            let waker = joiners.waker.take();
            drop(g);
            if let Some(w) = waker {
                // A waker whose `wake` panics (reported by the panic hook) must not unwind
                // into whoever completed the task: a worker, which would die, or the code
                // that failed it, which would skip its own bookkeeping.
                crate::report::drop_catching(std::panic::catch_unwind(
                    std::panic::AssertUnwindSafe(|| w.wake()),
                ));
            }
        }
        prev & (DONE | DETACHED) == DETACHED
    }

    /// The `JoinHandle` is dropped. Returns whether the result is published already: the
    /// caller then drops it (else the publisher will, see `complete`).
    pub(crate) fn detach(&self) -> bool {
        // SeqCst, as `complete`'s: the two `fetch_or`s are ordered, the later sees the other.
        self.done.fetch_or(DETACHED, Ordering::SeqCst) & DONE != 0
    }

    /// The async side of [`wait`](Header::wait): whether the task is done; if not, `waker`
    /// is woken when it is (replacing the waker of an earlier poll).
    pub(crate) fn poll_done(&self, waker: &std::task::Waker) -> bool {
        if self.is_done() {
            return true;
        }
        let mut g = self.joiners.lock();
        self.has_joiners.store(true, Ordering::SeqCst);
        if self.done.load(Ordering::SeqCst) & DONE != 0 {
            return true;
        }
        let (joiners, _) = g.parts();
        match &mut joiners.waker {
            Some(w) if w.will_wake(waker) => {}
            slot => *slot = Some(waker.clone()),
        }
        false
    }

    /// Waits for the result (suspending a fiber, blocking a thread) until `deadline`.
    /// Returns whether the task finished. Any number of joiners may wait at once.
    pub(crate) fn wait(&self, deadline: Option<Instant>) -> bool {
        if self.is_done() {
            return true;
        }
        if deadline.is_none() && crate::fiber::current_meta().is_some_and(|m| m.id == self.id) {
            // std's `JoinHandle::join` fails the same way on the current thread (EDEADLK).
            panic!(
                "task {} waits for itself to finish without a deadline: it would wait for ever",
                self.id
            );
        }
        let g = self.joiners.lock();
        self.has_joiners.store(true, Ordering::SeqCst);
        if self.done.load(Ordering::SeqCst) & DONE != 0 {
            return true;
        }
        match wait(
            g,
            |j| &mut j.list,
            (),
            deadline,
            WaitOn::Join(self.id),
            || {},
            |_, _| {},
        ) {
            Wait::Woken(_) => true,
            Wait::TimedOut(_) => self.is_done(),
        }
    }
}
#[cfg(test)]
mod layout {
    use super::*;
    use crate::fiber::FiberMeta;
    use std::mem::offset_of;

    /// The fields a switch touches (`Header::park` up to `FiberMeta::suspended_at`, which
    /// every suspension writes) stay within 128 bytes, two or three cache lines however the
    /// cell is placed (see `HomeOnly`).
    #[test]
    fn a_switchs_fields_are_close_together() {
        let first = offset_of!(Header, park);
        let end = offset_of!(Header, home)
            + offset_of!(HomeOnly, meta)
            + offset_of!(FiberMeta, suspended_at)
            + std::mem::size_of::<usize>();
        assert!(first < end, "park comes first");
        assert!(
            end - first <= 128,
            "a switch's fields span {} bytes",
            end - first
        );
    }
}

#[cfg(all(test, not(loom)))]
mod slot {
    use super::*;
    use crate::sched::task_cell::TaskCell;
    use std::collections::HashSet;
    use std::sync::atomic::AtomicBool;

    fn task(f: impl FnOnce() + Send + 'static) -> TaskRef {
        let (_handle, task) =
            TaskCell::new_pair(f, || Header::new(None, 0, None, Location::caller()));
        task
    }

    #[test]
    fn a_slot_hands_back_what_it_displaced_and_gives_up_what_it_holds() {
        let slot = TaskSlot::new();
        assert!(slot.is_empty() && slot.take().is_none());
        let (a, b) = (task(|| {}), task(|| {}));
        let (a_id, b_id) = (a.header().id, b.header().id);
        assert!(slot.replace(a).is_none());
        assert_eq!(slot.len(), 1);
        let displaced = slot.replace(b).expect("a was there");
        assert_eq!(displaced.header().id, a_id);
        assert_eq!(slot.take().expect("b is there").header().id, b_id);
        assert!(slot.is_empty() && slot.take().is_none());
    }

    #[test]
    fn a_dropped_slot_drops_the_task_it_holds() {
        let token = Arc::new(());
        let held = token.clone();
        {
            let slot = TaskSlot::new();
            assert!(slot.replace(task(move || drop(held))).is_none());
            assert_eq!(
                Arc::strong_count(&token),
                2,
                "the closure is in the slot's task"
            );
        }
        assert_eq!(
            Arc::strong_count(&token),
            1,
            "the slot's reference was the last"
        );
    }

    /// The owner keeps displacing while a thief keeps taking: every task comes out exactly
    /// once, displaced, stolen or left over.
    #[test]
    fn owner_and_thief_get_every_task_once() {
        const TASKS: usize = 20_000;
        let slot = Arc::new(TaskSlot::new());
        let stop = Arc::new(AtomicBool::new(false));
        let thief = {
            let (slot, stop) = (slot.clone(), stop.clone());
            std::thread::spawn(move || {
                let mut stolen = Vec::new();
                while !stop.load(Ordering::Acquire) {
                    stolen.extend(slot.take().map(|j| j.header().id));
                }
                stolen
            })
        };
        let mut ids = HashSet::new();
        let mut out = Vec::new();
        for _ in 0..TASKS {
            let task = task(|| {});
            ids.insert(task.header().id);
            out.extend(slot.replace(task).map(|j| j.header().id));
        }
        stop.store(true, Ordering::Release);
        out.extend(thief.join().expect("thief"));
        out.extend(slot.take().map(|j| j.header().id));
        assert_eq!(out.len(), TASKS, "each task once");
        assert_eq!(out.into_iter().collect::<HashSet<_>>(), ids);
    }
}
