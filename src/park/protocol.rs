//! The park protocol: how a fiber parks on its worker, and how exactly one of the wakers
//! racing for that park wakes it. This module owns a task's park word ([`ParkWord`]) and its
//! encoding (which a thread's park slot, `park::thread`, shares), the request a parking fiber
//! hands its worker ([`ParkRequest`]), the worker's publication of the park ([`publish`]),
//! and the wakers' side ([`unpark_fiber`] and its variants, [`wake_at_home`]), which queue a
//! woken fiber on its home worker. Of the worker it uses only the few calls `Worker` offers
//! for it (`push_woken`, `note_parked`, `arm_timer`, `registered`, `home`) and a worker's
//! inbox, sleep and [`WakerCount`]; the fiber side (`park::park_with`) only builds the
//! request and suspends with it.
//!
//! # The word
//! A task's park word is `(generation << STATE_BITS) | state`, in one of three states:
//! - `Running`: the fiber runs, is ready to run, or has finished. No `Unparker` of the
//!   word's generation exists yet.
//! - `Parked`: the fiber has switched out in `park` and is published to its wakers, in
//!   generation `g`.
//! - `Notified`: a waker has won the wake of park `g`, and queues the fiber.
//!
//! ```text
//! Running(g) ──publish_parked──► Parked(g) ──notify(g)──► Notified(g) ──begin_run──► Running(g+1)
//!     └─────────────────────────── begin_run (after a yield) ──────────────────────────┘
//! ```
//!
//! Who may move the word, from which state to which:
//! - `Running → Parked` ([`ParkWord::publish_parked`]): only the home worker, once the fiber
//!   has switched out in `park` (see below). A Release store, so that the waker that wins
//!   sees everything the worker wrote before, the fiber's placement above all.
//! - `Parked(g) → Notified(g)` ([`ParkWord::notify`]): any waker of park `g` — an
//!   `Unparker` on any thread, the fiber's timer and a cancellation on its home worker, the
//!   home worker itself when the registration panics. A compare-and-swap, so exactly one of
//!   them wins, and the winner must queue the fiber on its home worker. A park's only
//!   unparker (`park::park_alone`) used on the home worker's thread wins with a plain load
//!   and store instead ([`ParkWord::notify_alone`]): every other waker of the park runs on
//!   that thread too.
//! - `Notified → Running`, and `Running → Running` after a yield
//!   ([`ParkWord::begin_run`]): only the home worker, as it resumes the fiber, with the next
//!   generation. An `Unparker` of an earlier park carries an older generation, so its
//!   compare-and-swap never matches again: a stale wake does nothing.
//!
//! Nothing but the home worker writes the word outside `Parked`, so its own moves need no
//! compare-and-swap.
//!
//! # Why publishing happens after the switch
//! A fiber never publishes itself. `park` suspends the fiber with `Suspend::Park`, one
//! pointer to a [`ParkRequest`] on the fiber's own stack (the registration closure, the
//! deadline), and the worker — back on its own stack, the fiber's switched out — stores
//! `Parked`, files the park's timer and only then calls the registration closure with the
//! fiber's `Unparker` ([`publish`]). So a waker can never find the fiber still running: a
//! wake that came before the switch would resume a stack that is still in use, on another
//! thread. (Go's `gopark` does the same with its unlock function.) The closure may hand the
//! `Unparker` anywhere, or use it at once; the fiber then simply resumes.
//!
//! # Queueing a woken fiber
//! The winner of `notify` queues the fiber on its home worker ([`unpark_fiber`]): on that
//! worker's `ready` when it runs on that worker's thread, else in the worker's inbox, waking
//! the worker. Winning means the fiber is parked and nobody else queues it, so it cannot
//! finish, nor its scheduler go away, before the push; after the push both may happen at
//! once, so a remote waker is counted in the target's [`WakerCount`] until its last touch of
//! the worker, and the scheduler's shared state waits that count out before it is freed.
//!
//! The worker's reference to the fiber goes into the `Unparker`, and a waker that owns the
//! `Unparker` queues the fiber with that same reference, so a park and wake cycle adjusts
//! no reference count; the worker's registry keeps the fiber alive meanwhile.
//!
//! docs/design.md, "The park protocol", tells the whole story; `sched::loom_model` checks
//! the word's races and the waker count under loom.

use super::Unparker;
use crate::sched::task::{Cancel, ScheduleTask, TaskRef};
use crate::sched::worker::{this_thread_worker, Worker};
use std::panic::AssertUnwindSafe;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;

#[cfg(loom)]
use loom::sync::atomic::AtomicU64;
#[cfg(not(loom))]
use std::sync::atomic::AtomicU64;

/// The park word's encoding, shared by a task's `ParkWord` (64 bits) and a thread's
/// `ThreadSlot` (32 bits, for the futex): `(generation << STATE_BITS) | state`.
pub(crate) mod word {
    /// Not parked: running, ready, or (a thread) between parks.
    pub(crate) const RUNNING: u32 = 0;
    /// Parked and published to wakers.
    pub(crate) const PARKED: u32 = 1;
    /// A waker won the wake of this park.
    pub(crate) const NOTIFIED: u32 = 2;
    /// How many low bits hold the state.
    pub(crate) const STATE_BITS: u32 = 2;
}

use word::STATE_BITS;
const STATE_MASK: u64 = (1 << STATE_BITS) - 1;
const RUNNING: u64 = word::RUNNING as u64;
const PARKED: u64 = word::PARKED as u64;
const NOTIFIED: u64 = word::NOTIFIED as u64;

/// The park word's state, in its low two bits.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum ParkState {
    /// Running, ready to run, or finished: no `Unparker` of this generation can act.
    Running,
    /// Suspended in `park`, published to wakers.
    Parked,
    /// A waker (unparker, timer, canceller) won the wake and queues the fiber.
    Notified,
}

/// A task's park word: `(generation << 2) | state` (see the module docs).
///
/// Every resumption starts a new generation, and an `Unparker` carries the generation of
/// the park it was made for, so a stale one (from an earlier park) never wakes a later park.
/// Of all the wakers racing for one park — unparkers, the timer, cancellation — exactly one
/// wins [`notify`](ParkWord::notify) and must queue the fiber. Only the home worker moves
/// the word out of `Notified` or `Running`.
pub(crate) struct ParkWord(AtomicU64);

impl ParkWord {
    pub(crate) fn new() -> ParkWord {
        ParkWord(AtomicU64::new(RUNNING))
    }

    fn split(word: u64) -> (u64, ParkState) {
        let state = match word & STATE_MASK {
            RUNNING => ParkState::Running,
            PARKED => ParkState::Parked,
            NOTIFIED => ParkState::Notified,
            other => unreachable!("park word in state {other}"),
        };
        (word >> STATE_BITS, state)
    }

    /// The home worker is about to resume the fiber: a new generation, `Running`. Every
    /// `Unparker` made before is stale from now on.
    #[inline]
    pub(crate) fn begin_run(&self) {
        // Relaxed: only the home worker writes the word outside `Parked`, and it got the
        // fiber (from its own queue, or from a waker through the inbox's Release/Acquire)
        // after the word left `Parked`.
        let (gen, state) = Self::split(self.0.load(Ordering::Relaxed));
        debug_assert_ne!(state, ParkState::Parked, "resuming a fiber still parked");
        self.0
            .store(((gen + 1) << STATE_BITS) | RUNNING, Ordering::Relaxed);
    }

    /// The home worker publishes a fiber that has just switched out in `park`. Returns the
    /// generation its `Unparker` must carry.
    #[inline]
    pub(crate) fn publish_parked(&self) -> u64 {
        let (gen, state) = Self::split(self.0.load(Ordering::Relaxed));
        debug_assert_eq!(
            state,
            ParkState::Running,
            "parking a fiber that is not running"
        );
        // Release: a waker that wins `notify` on this value sees everything the worker wrote
        // before (the task's placement above all).
        self.0
            .store((gen << STATE_BITS) | PARKED, Ordering::Release);
        gen
    }

    /// [`ParkWord::notify`] by the only waker that can act now: the home worker's thread,
    /// holding a park's only unparker (`park::park_alone`), while every other waker of the
    /// park runs on that thread too. A plain load and store: nothing else writes the word
    /// meanwhile (a stale unparker's compare-and-swap fails without writing).
    #[inline]
    pub(crate) fn notify_alone(&self, gen: u64) -> bool {
        let parked = (gen << STATE_BITS) | PARKED;
        // Relaxed: the fiber resumes on this thread, after this store in program order.
        if self.0.load(Ordering::Relaxed) != parked {
            return false;
        }
        self.0
            .store((gen << STATE_BITS) | NOTIFIED, Ordering::Relaxed);
        true
    }

    /// A waker's move from "parked in generation `gen`" to `Notified`. True for exactly one
    /// of the racing wakers, which must then queue the fiber on its home worker.
    #[inline]
    pub(crate) fn notify(&self, gen: u64) -> bool {
        let parked = (gen << STATE_BITS) | PARKED;
        let notified = (gen << STATE_BITS) | NOTIFIED;
        // AcqRel: Acquire pairs with `publish_parked`'s Release (the winner sees the
        // placement); Release publishes the waker's own writes to the fiber, which the home
        // worker acquires through the queue it pops the fiber from.
        self.0
            .compare_exchange(parked, notified, Ordering::AcqRel, Ordering::Relaxed)
            .is_ok()
    }

    /// The generation of the current park, if the fiber is parked and nobody won its wake.
    pub(crate) fn parked(&self) -> Option<u64> {
        // Acquire: as in `notify`, for a caller that goes on to notify.
        match Self::split(self.0.load(Ordering::Acquire)) {
            (gen, ParkState::Parked) => Some(gen),
            _ => None,
        }
    }

    /// The current state, for diagnostics.
    pub(crate) fn state(&self) -> ParkState {
        Self::split(self.0.load(Ordering::Relaxed)).1
    }
}

/// A park's request to its worker, on the parking fiber's stack (see `park::park_with`):
/// what `Suspend::Park` points to.
pub(crate) struct ParkRequest {
    /// The registration closure, also on that stack; its lifetime is erased.
    pub(crate) register: *mut (dyn FnMut(Unparker) + 'static),
    pub(crate) deadline: Option<Instant>,
    /// The unparker will be the park's only one (`park::park_alone`).
    pub(crate) alone: bool,
}

/// The worker half of `park`: publishes the fiber `task`, homed on `worker`, now that it has
/// switched out with `request` — the word moves to `Parked`, the park's timer is filed, and
/// the registration closure gets the fiber's `Unparker`.
#[inline(never)]
pub(crate) fn publish(worker: &Worker, task: TaskRef, request: &ParkRequest) {
    let (register, deadline) = (request.register, request.deadline);
    let gen = task.header().park.publish_parked();
    let home = worker.note_parked(&task, deadline);
    if home.cancel == Cancel::Requested {
        wake_at_home(worker, &task, gen);
        return;
    }
    if let Some(d) = deadline {
        home.timer = Some(worker.arm_timer(d, task.clone(), gen));
    }
    // The unparker takes this reference (a wake then queues it as it is); the registry
    // keeps the fiber alive meanwhile, and gives it back should `register` panic.
    let slot = home.slot;
    let unparker = Unparker::for_fiber(task, gen, request.alone);
    // SAFETY: the closure lives on the suspended fiber's stack (see `park_with`) and is
    // called exactly once, here, before the fiber can resume.
    let r = std::panic::catch_unwind(AssertUnwindSafe(|| unsafe { (*register)(unparker) }));
    if let Err(p) = r {
        // Nothing runs between the fiber's suspension and here that could end a fiber,
        // so its registry slot is unchanged.
        let task = worker.registered(slot);
        worker.home(&*task).pending_panic = Some(p);
        wake_at_home(worker, &task, gen);
    }
}

/// Wakes a fiber homed on `worker` from that worker's own thread, between fibers (a
/// cancellation, a failed registration).
pub(crate) fn wake_at_home(worker: &Worker, task: &TaskRef, gen: u64) {
    if task.header().park.notify(gen) {
        worker.push_woken(task.clone());
    }
}

/// Wakes a parked fiber: the `Unparker` side of the park protocol.
///
/// Winning `notify` means the fiber is parked and has not been queued by anybody else, so it
/// cannot finish before we queue it, and its scheduler's shared state stays alive until then:
/// `stop` waits for every task, and a fiber abandoned meanwhile keeps that state alive itself
/// (`HomeOnly::keep_alive`), while we hold the task. After the push the fiber may run,
/// finish, and the scheduler be dropped at once, so from just before the push to our last
/// touch of the worker we are counted in its `wakers`, which `Shared`'s destructor waits out.
pub(crate) fn unpark_fiber(task: &TaskRef, gen: u64) {
    if task.header().park.notify(gen) {
        queue_woken(task.clone());
    }
}

/// [`unpark_fiber`] for a caller that gives up its reference: the woken fiber is queued with
/// it, so a wake costs no reference count increment and decrement.
pub(crate) fn unpark_fiber_owned(task: TaskRef, gen: u64) {
    if task.header().park.notify(gen) {
        queue_woken(task);
    }
}

/// [`unpark_fiber_owned`] with the park's only unparker (`park::park_alone`). Called on the
/// fiber's home worker, it wins the wake with a plain store: every other waker of this park
/// (the fiber's timer, a cancellation) runs on that worker too, so none runs meanwhile.
pub(crate) fn unpark_fiber_alone(task: TaskRef, gen: u64) {
    let h = task.header();
    // SAFETY: the placement was written before the fiber first parked, and our unparker was
    // made after that and reached us through the park's registration, which orders the
    // write before this read. Only the pointer is compared; nothing behind it is read.
    let p = unsafe { &*h.placement.get() };
    let w = this_thread_worker();
    // SAFETY: see `Shared::local_worker`.
    if let Some(w) = unsafe { w.as_ref() } {
        if w.index == p.worker && std::ptr::eq(Arc::as_ptr(&w.shared), p.sched) {
            if h.park.notify_alone(gen) {
                w.push_woken(task);
            }
            return;
        }
    }
    unpark_fiber_owned(task, gen);
}

/// Queues a fiber whose `park.notify` the caller won: on its home worker's `ready` when
/// called there, else in that worker's inbox.
fn queue_woken(task: TaskRef) {
    let h = task.header();
    // SAFETY: written before the fiber first parked (see Placement), and the winner of
    // `notify` has acquired it; the shared state is alive (see `unpark_fiber`).
    let (sched, worker) = unsafe {
        let p = &*h.placement.get();
        (&*p.sched, p.worker)
    };
    if let Some(w) = sched.local_worker() {
        if w.index == worker {
            w.push_woken(task);
            return;
        }
    }
    let target = &sched.workers[worker];
    target.wakers.enter();
    target.inbox.push(ScheduleTask::Resume(task));
    target.sleep.wake();
    target.wakers.leave();
}

/// Counts the wakers in the middle of a remote wake of one worker, so that the memory they
/// touch outlives them (see `unpark_fiber`).
pub(crate) struct WakerCount(WakerAtomic);

#[cfg(loom)]
type WakerAtomic = loom::sync::atomic::AtomicUsize;
#[cfg(not(loom))]
type WakerAtomic = std::sync::atomic::AtomicUsize;

impl WakerCount {
    pub(crate) fn new() -> WakerCount {
        WakerCount(WakerAtomic::new(0))
    }

    /// Before the push that makes the woken fiber runnable.
    pub(crate) fn enter(&self) {
        // Relaxed: the push that follows (Release) carries the increment to whoever pops
        // the fiber, and from there along the chain that ends in `wait_out`.
        self.0.fetch_add(1, Ordering::Relaxed);
    }

    /// After the waker's last touch of the worker.
    pub(crate) fn leave(&self) {
        // Release: the waker's touches happen before `wait_out`'s Acquire load sees it gone.
        self.0.fetch_sub(1, Ordering::Release);
    }

    /// Waits until no waker is inside (a few instructions each), before the memory goes.
    pub(crate) fn wait_out(&self) {
        while self.0.load(Ordering::Acquire) != 0 {
            #[cfg(loom)]
            loom::thread::yield_now();
            #[cfg(not(loom))]
            std::thread::yield_now();
        }
    }
}
