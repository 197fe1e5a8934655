//! [`unblock`]: run blocking code on a pool of plain threads while the calling fiber is parked
//! (often called `asyncify`), and the settings of that pool.
//!
//! This module owns the process-wide blocking pool. It touches the scheduler only through
//! [`crate::park`] and [`Unparker`]: the calling fiber waits exactly like a fiber waiting for a
//! lock or a timer, and resumes on its home worker.
//!
//! # The call
//! `unblock(f)` keeps `f`, the result slot and a small completion word in a `Call` on the
//! calling fiber's own stack — no allocation — pushes an `Entry` (a pointer to that `Call`)
//! to the pool's queue, and parks. After the switch, on the worker's stack, the registration
//! publishes the fiber's `Unparker` in the `Call` — or, if the pool has finished the call
//! already, wakes the fiber itself, on its own worker. A pool thread runs `f` (catching a
//! panic), stores the result, marks the call done and unparks the fiber if it has parked
//! by then; the fiber reads the result (or resumes the panic) on its own thread. The call is
//! thus published before the fiber suspends, but the fiber itself only after (the park
//! protocol's rule), and a quick call finished by a thread that was awake costs no
//! cross-thread wake of the worker. Because the fiber cannot continue before the call is
//! done, `f` may borrow from the caller's stack, like `std::thread::scope`. The one way a
//! parked fiber can leave early is cancellation (`Scheduler::stop_timeout`,
//! `JoinHandle::cancel`), which unwinds its stack: a guard then parks the fiber again — the
//! fiber, not its worker — until the pool thread has finished with the `Call`.
//!
//! # The pool
//! Threads are started on demand, up to [`max_threads`] (default [`DEFAULT_MAX_THREADS`]);
//! a thread idle for [`keep_alive`] (default [`DEFAULT_KEEP_ALIVE`]) exits. Wake-ups follow
//! Go's `nmspinning` rule without the spinning: a thread that has been woken or started, or
//! has just finished a call, counts as *searching* until it has looked at the queue. A
//! submitter pushes, issues a SeqCst fence and wakes a sleeping thread (or starts one) only
//! if nobody searches; a searcher that takes a call while being the last searcher, and sees
//! more queued, wakes the next thread. A burst of calls therefore costs a chain of wake-ups
//! rather than one per call, and quick calls run back to back on whichever thread is awake.
//! Idle threads sleep on a futex each, the most recently idle woken first, so the oldest
//! time out.
//!
//! # Where a woken thread runs
//! Linux puts a woken thread on the CPU it last ran on or on its waker's, and looks further
//! for an idle CPU only in some cases. A pool thread that last ran on its caller's CPU is
//! often woken there, even with another CPU idle, where it cannot run while the caller's
//! worker does: each call then costs two context switches and a futex wake and wait on one
//! CPU, several times what a call costs with the pool thread on another CPU. So a submitter
//! wakes, of the `PLACE_SCAN` most recently idle threads, the first that went to sleep on
//! another CPU than its own, and the most recently idle if none did. A pool thread that
//! hands the search on in a burst wakes the most recently idle one: no caller waits on its
//! CPU, and choosing by CPU there too only slows bursts of calls down (the `unblock`
//! benchmark).
//!
//! # Back-to-back calls
//! A fiber that makes one call after another (`read` in a loop, say) would pay two wake-ups
//! per call: its submit wakes a pool thread, which has gone to sleep since the previous call,
//! and that thread's unpark wakes the fiber's worker, which has gone idle meanwhile. So a
//! call carries a hint, *back to back*: its fiber got the result of its previous call less
//! than `BACK_TO_BACK_NS` ago. A pool thread that has served such a call and finds the queue
//! empty *spins* — looks at the queue again every microsecond or so — for up to
//! `SPIN_FOR_NS` before it sleeps (at most one thread spins at a time; it still counts as
//! searching, so the caller's next submit wakes nobody). The next call is then taken at
//! once, and often finished before the caller's worker has parked the fiber, which then
//! resumes without any wake; otherwise the worker, which spins itself for a while when idle,
//! finds the unpark in its inbox without a futex wake. Callers that are not back to back (a
//! burst of calls from different fibers, or one call now and then) get no spin. The spin
//! gives way when it does not pay:
//! - a spinner that has not looked for `AWAY_NS` (descheduled: the CPU is wanted elsewhere)
//!   ends its spin, and the first submitter to notice no longer counts on it and wakes
//!   another thread;
//! - after `FRUITLESS_SPINS` spins in a row that found nothing — the callers are slow to come
//!   back, typically because the spinner takes the CPU they need — nobody spins for
//!   `QUIET_NS`.
//!
//! An idle pool therefore costs nothing: at most one spin of `SPIN_FOR_NS` after the last
//! call, then every thread sleeps.

use crate::park::Unparker;
use crate::sys::futex;
use crate::sys::spin::SpinLock;
use crossbeam_queue::SegQueue;
use std::cell::{Cell, UnsafeCell};
use std::panic::{catch_unwind, resume_unwind, AssertUnwindSafe};
use std::ptr::NonNull;
use std::sync::atomic::{
    fence, AtomicBool, AtomicPtr, AtomicU32, AtomicU64, AtomicUsize, Ordering,
};
use std::sync::Arc;
use std::thread::Thread;
use std::time::{Duration, Instant};

/// The default cap on blocking threads (tokio's default too).
pub const DEFAULT_MAX_THREADS: usize = 512;
/// How long an idle blocking thread waits for work before it exits, by default.
pub const DEFAULT_KEEP_ALIVE: Duration = Duration::from_secs(10);
/// Pool thread names are `fibra-unblock-<n>`.
const THREAD_NAME: &str = "fibra-unblock";
/// A call is back to back when its fiber got the result of its previous call less than this
/// long ago.
const BACK_TO_BACK_NS: u64 = 5_000;
/// How long a pool thread that has served a back-to-back call looks for the caller's next
/// call before it sleeps. It covers the caller's way back: its worker finding the unpark
/// (or being woken), resuming the fiber, and the fiber's next submit.
const SPIN_FOR_NS: u64 = 20_000;
/// Pause instructions between two looks of a spinning pool thread (about a microsecond).
const SPIN_PAUSES: u32 = 32;
/// A spinner that has not looked at the queue for this long has been descheduled.
const AWAY_NS: u64 = 10_000;
/// After this many spins in a row that found nothing, nobody spins for `QUIET_NS`.
const FRUITLESS_SPINS: u32 = 3;
const QUIET_NS: u64 = 2_000_000;

/// How many of the most recently idle pool threads a submitter looks through for one that
/// last ran on another CPU than its own (see the module docs).
const PLACE_SCAN: usize = 4;
/// `Sleeper::cpu` of a thread whose CPU the kernel could not tell.
const NO_CPU: u32 = u32::MAX;

/// Runs the blocking function `f` on the blocking pool and returns its value, parking only
/// the calling fiber meanwhile.
///
/// Inside a scheduled fiber, `f` runs on a pool thread while the fiber is suspended, so its
/// worker keeps running other fibers; the fiber then resumes on its own worker with the
/// value. A panic in `f` resumes in the caller, as if `f` had run there. Anywhere else (a
/// plain thread, a standalone [`Fiber`](crate::Fiber), a pool thread) `f` simply runs inline.
///
/// `f` may borrow from the caller (it need not be `'static`): the caller cannot continue
/// before `f` has returned. Use it for calls that block the thread — file I/O, DNS lookups,
/// `std` locks, CPU-heavy work — never for fibra's own waits, which already suspend only the
/// fiber. Every call suspends the fiber, so other fibers get their turn even when the call is
/// quick. A call costs a microsecond or two when made back to back with the fiber's previous
/// one (a pool thread waits briefly for it; see the module docs), several when a pool thread
/// or the worker must be woken; batch small calls.
///
/// The pool is process-wide and grows on demand up to [`max_threads`]; calls beyond that
/// queue in FIFO order. A blocking function that waits for another `unblock` call to finish
/// can therefore deadlock once every pool thread waits like it.
///
/// ```
/// let sched = fibra::Scheduler::builder().threads(1).build().unwrap();
/// sched.start();
/// let len = sched.block_on(|| {
///     let mut buf = Vec::new();
///     // Borrows `buf`; the worker runs other fibers while the pool thread works.
///     let n = fibra::unblock(|| {
///         buf.extend_from_slice(b"blocking work");
///         std::thread::current().name().map(String::from)
///     });
///     assert_eq!(n.as_deref().map(|n| n.starts_with("fibra-unblock")), Some(true));
///     buf.len()
/// });
/// assert_eq!(len, 13);
/// assert_eq!(fibra::unblock(|| 6 * 7), 42); // not in a fiber: runs inline
/// ```
pub fn unblock<F, T>(f: F) -> T
where
    F: FnOnce() -> T + Send,
    T: Send,
{
    let fiber = match crate::fiber::current_meta() {
        Some(meta) if meta.worker.is_some() => meta.id.as_u64(),
        _ => return f(), // not in a scheduled fiber
    };
    let call = Call {
        func: UnsafeCell::new(Some(f)),
        result: UnsafeCell::new(None),
        completion: Completion::new(),
    };
    let guard = AwaitCompletion(&call);
    let job: &(dyn Run + '_) = &call;
    let job: *const (dyn Run + '_) = job;
    // SAFETY: only the lifetime is erased. The `Call` lives on this fiber's stack until it
    // returns; the pool reads it only between the push below and `Completion::complete`, and
    // the fiber cannot leave this frame before that: it returns only after seeing DONE
    // (`wait_done` below), and an unwinding cancellation waits in `AwaitCompletion::drop`.
    let job: *const (dyn Run + 'static) = unsafe { std::mem::transmute(job) };
    call.completion.state.store(QUEUED, Ordering::Relaxed);
    let back_to_back = LAST_CALL.with(|last| {
        let (last_fiber, returned) = last.get();
        last_fiber == fiber && crate::sys::mono_ns().saturating_sub(returned) < BACK_TO_BACK_NS
    });
    // The call goes to the pool now, before the fiber suspends; only the fiber's `Unparker`
    // waits for the suspension (the registration below). A call the pool finishes before
    // the worker gets to the registration then needs no cross-thread wake at all.
    pool().submit(Entry {
        job: NonNull::new(job.cast_mut()).expect("a reference is never null"),
        completion: NonNull::from(&call.completion),
        back_to_back,
    });
    crate::park::park_until(None, crate::dump::WaitOn::Blocking, |u| {
        call.completion.park(u);
    });
    // Done, normally (the park ended with the pool's unpark, or the registration's own when
    // the call was done by then); should the park ever end otherwise, this blocks the thread
    // until it is, like the guard would.
    call.completion.wait_done();
    std::mem::forget(guard);
    LAST_CALL.with(|last| last.set((fiber, crate::sys::mono_ns())));
    // SAFETY: the pool thread wrote the result before its Release store of DONE, which
    // `wait_done` observed (Acquire); nobody else touches it any more.
    let result = unsafe { (*call.result.get()).take() };
    match result.expect("unblock: the pool completes every call before waking its caller") {
        Ok(v) => v,
        Err(panic) => resume_unwind(panic),
    }
}

thread_local! {
    /// The fiber (its id) whose `unblock` call returned last on this thread, and when
    /// (`mono_ns`): whether its next call is back to back. Fiber ids start at 1.
    static LAST_CALL: Cell<(u64, u64)> = const { Cell::new((0, 0)) };
}

/// Caps the number of blocking threads (default [`DEFAULT_MAX_THREADS`]). Lowering it does
/// not stop busy threads; surplus ones exit when they next go idle.
///
/// # Panics
/// If `n` is 0: the pool needs at least one thread.
pub fn set_max_threads(n: usize) {
    assert!(
        n > 0,
        "fibra::unblock::set_max_threads(0): the pool needs a thread"
    );
    pool().max_threads.store(n, Ordering::SeqCst);
}

/// The cap on blocking threads.
pub fn max_threads() -> usize {
    pool().max_threads.load(Ordering::SeqCst)
}

/// How long an idle blocking thread waits for work before it exits (default
/// [`DEFAULT_KEEP_ALIVE`]). Applies at once, also to threads idle now (counted from when
/// each went idle). Zero makes every thread exit as soon as it finds no work; a keep-alive
/// beyond `u64::MAX` nanoseconds (about 584 years, `Duration::MAX` included) is kept as that,
/// so idle threads never exit.
pub fn set_keep_alive(idle: Duration) {
    let ns = u64::try_from(idle.as_nanos()).unwrap_or(u64::MAX);
    pool().keep_alive_ns.store(ns, Ordering::SeqCst);
    // Idle threads wait with the keep-alive they read: make them read it again. The word
    // changes, so a sleeper about to wait does not miss it; a submitter's `NOTIFIED` (it
    // takes a sleeper out of this list, under this lock) overrides it.
    let idle = pool().idle.lock();
    for s in &idle.sleepers {
        if s.word
            .compare_exchange(EMPTY, RECHECK, Ordering::AcqRel, Ordering::Relaxed)
            .is_ok()
        {
            futex::wake(&s.word, 1);
        }
    }
}

/// How long an idle blocking thread waits for work before it exits.
pub fn keep_alive() -> Duration {
    Duration::from_nanos(pool().keep_alive_ns.load(Ordering::SeqCst))
}

/// How many blocking threads exist right now (busy or idle).
///
/// ```
/// assert!(fibra::unblock::threads() <= fibra::unblock::max_threads());
/// ```
pub fn threads() -> usize {
    pool().idle.lock().threads
}

/// The blocking pool's threads, those busy (running a call or about to look for one), and
/// the calls queued: for `Scheduler::metrics`.
pub(crate) fn pool_stats() -> (usize, usize, usize) {
    let idle = pool().idle.lock();
    let (threads, sleeping) = (idle.threads, idle.sleepers.len());
    drop(idle);
    (
        threads,
        threads.saturating_sub(sleeping),
        pool().queue().len(),
    )
}

/// Completion word states: `IDLE → QUEUED → (PARKED →) DONE`, or, for a caller that must
/// wait again (a cancelled one, unwinding), `QUEUED/PARKED → WAITING → DONE`.
const IDLE: u32 = 0;
/// Handed to the pool; the caller has not published its `Unparker` (yet).
const QUEUED: u32 = 1;
/// The caller's fiber is parked and its `Unparker` is in `Completion::unparker`.
const PARKED: u32 = 2;
/// The pool is done with the call (the last touch of the caller's stack).
const DONE: u32 = 3;
/// The caller waits again until `DONE`; how to wake it is in `Completion::waiter`.
const WAITING: u32 = 4;

/// Who waits in state `WAITING`: an unwinding fiber, parked again, or a blocked thread.
enum Waiter {
    Fiber(Unparker),
    Thread(Thread),
}

/// One `unblock` call, on the caller's stack.
struct Call<F, T> {
    func: UnsafeCell<Option<F>>,
    result: UnsafeCell<Option<std::thread::Result<T>>>,
    completion: Completion,
}

/// The type-erased part a pool thread runs.
trait Run {
    /// Runs the function once and stores its result (or panic).
    fn run(&self);
}

impl<F: FnOnce() -> T, T> Run for Call<F, T> {
    fn run(&self) {
        // SAFETY: exactly one pool thread runs an entry, once; the caller does not touch
        // `func` or `result` until the call completes.
        let f = unsafe { (*self.func.get()).take() }.expect("an unblock call runs once");
        let r = catch_unwind(AssertUnwindSafe(f));
        // SAFETY: as above.
        unsafe { *self.result.get() = Some(r) };
    }
}

/// Whether a call is done, and how its caller is told.
struct Completion {
    state: AtomicU32,
    /// The parked fiber to wake in state `PARKED`; written by the registration before it
    /// moves to `PARKED`, taken by the pool thread only after it has seen `PARKED`.
    unparker: UnsafeCell<Option<Unparker>>,
    /// Whom to wake in state `WAITING`; written by the caller before it moves to
    /// `WAITING`, read by the pool thread only after it has seen `WAITING`.
    waiter: UnsafeCell<Option<Waiter>>,
}

impl Completion {
    fn new() -> Self {
        Completion {
            state: AtomicU32::new(IDLE),
            unparker: UnsafeCell::new(None),
            waiter: UnsafeCell::new(None),
        }
    }

    /// The park registration (on the worker's stack, the fiber suspended): publishes the
    /// fiber's `Unparker` for the pool, or, if the call is done already, wakes the fiber at
    /// once (on its own worker: no cross-thread wake).
    fn park(&self, u: Unparker) {
        // SAFETY: the pool reads `unparker` only after seeing PARKED, which we set below;
        // until then nobody else touches it.
        unsafe { *self.unparker.get() = Some(u) };
        // Release: the pool that sees PARKED sees the unparker.
        if self
            .state
            .compare_exchange(QUEUED, PARKED, Ordering::Release, Ordering::Relaxed)
            .is_err()
        {
            // DONE already (the only other move from QUEUED): the pool never reads the slot
            // now, so take the unparker back and wake the fiber here. The fiber reads the
            // result after its own Acquire look at DONE (`wait_done`).
            // SAFETY: as above; the pool touches `unparker` only in state PARKED.
            if let Some(u) = unsafe { (*self.unparker.get()).take() } {
                u.unpark_owned();
            }
        }
    }

    /// Marks the call done: the pool thread's last access to the caller's stack. Returns
    /// the parked caller's `Unparker`, for the pool thread to wake it.
    ///
    /// # Safety
    /// `this` points to the live `Completion` of a call that has run; after this returns,
    /// the caller may pop its frame at any time, so `this` must not be used again.
    unsafe fn complete(this: NonNull<Completion>) -> Option<Unparker> {
        // SAFETY: live until the state below is DONE (see the function's contract).
        let c = unsafe { this.as_ref() };
        let mut state = c.state.load(Ordering::Acquire);
        loop {
            // Release on every way to DONE: the result written before is visible to a
            // caller that sees DONE.
            match state {
                QUEUED => match c.state.compare_exchange(
                    QUEUED,
                    DONE,
                    Ordering::Release,
                    Ordering::Acquire,
                ) {
                    Ok(_) => return None,
                    Err(now) => state = now,
                },
                PARKED => {
                    // Taken before DONE: after DONE the frame may be gone (a cancellation
                    // unwinding the parked fiber returns once it sees DONE).
                    // SAFETY: written before the registration's Release CAS to PARKED, which
                    // our Acquire observed; the caller does not touch it again until DONE.
                    let unparker = unsafe { (*c.unparker.get()).take() };
                    match c.state.compare_exchange(
                        PARKED,
                        DONE,
                        Ordering::Release,
                        Ordering::Acquire,
                    ) {
                        Ok(_) => return unparker,
                        // WAITING: the fiber is being cancelled; the unparker is not needed.
                        Err(now) => state = now,
                    }
                }
                WAITING => {
                    // SAFETY: written before the caller's Release CAS to WAITING, which our
                    // Acquire observed; the caller does not touch it again until DONE.
                    let waiter = unsafe { (*c.waiter.get()).take() };
                    c.state.store(DONE, Ordering::Release);
                    return match waiter {
                        Some(Waiter::Fiber(u)) => Some(u),
                        Some(Waiter::Thread(t)) => {
                            t.unpark();
                            None
                        }
                        None => None,
                    };
                }
                other => unreachable!("unblock: completion in state {other}"),
            }
        }
    }

    /// Blocks the thread until the pool is done with the call, if it was ever queued and is
    /// not done yet.
    fn wait_done(&self) {
        let state = self.state.load(Ordering::Acquire);
        if state != QUEUED && state != PARKED {
            return; // DONE, or never queued
        }
        if !self.wait_as(state, Waiter::Thread(std::thread::current())) {
            return;
        }
        while self.state.load(Ordering::Acquire) != DONE {
            std::thread::park();
        }
    }

    /// Parks the calling fiber — not its worker — until the pool is done with the call, if
    /// it was ever queued and is not done yet: an unwinding cancelled caller, whose earlier
    /// park ended without the pool's wake.
    fn park_until_done(&self) {
        let state = self.state.load(Ordering::Acquire);
        if state != QUEUED && state != PARKED {
            return; // DONE, or never queued
        }
        crate::park::park_until(None, crate::dump::WaitOn::Blocking, |u| {
            if !self.wait_as(state, Waiter::Fiber(u)) {
                // DONE meanwhile: the pool never reads `waiter` now.
                // SAFETY: as in `wait_as`; the pool touches `waiter` only in WAITING.
                if let Some(Waiter::Fiber(u)) = unsafe { (*self.waiter.get()).take() } {
                    u.unpark_owned();
                }
            }
        });
        // The pool wakes the fiber only once DONE; nothing else does (a cancellation is
        // delivered once). Should that ever change, wait here rather than leave early.
        while self.state.load(Ordering::Acquire) != DONE {
            std::thread::yield_now();
        }
    }

    /// Publishes `waiter` and moves from `state` (QUEUED or PARKED) to WAITING; false if
    /// the call was done meanwhile (the waiter is then left in its slot, unread).
    fn wait_as(&self, state: u32, waiter: Waiter) -> bool {
        // SAFETY: the pool reads `waiter` only after seeing WAITING, which we set below.
        unsafe { *self.waiter.get() = Some(waiter) };
        // Release: the pool that sees WAITING sees the waiter. A failure means DONE (the
        // only other move from QUEUED or PARKED).
        self.state
            .compare_exchange(state, WAITING, Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
    }
}

/// Keeps the caller's frame alive until the pool is done with it, when the parked caller is
/// unwound (`stop_timeout` or `JoinHandle::cancel` cancels it): parks the fiber again until
/// the running function returns. Then drops what the caller will never receive — the closure if it never ran, the
/// result or its panic — catching a panic in their destructors, which would otherwise abort
/// the process in the middle of the caller's unwind.
struct AwaitCompletion<'a, F, T>(&'a Call<F, T>);

impl<F, T> Drop for AwaitCompletion<'_, F, T> {
    fn drop(&mut self) {
        // Only the fiber waits: its worker goes on running the others, and acts on the
        // shutdown (a fiber still waiting here when the grace runs out is abandoned, its
        // stack never reused, so the pool's late writes still land in mapped memory).
        self.0.completion.park_until_done();
        // SAFETY: the pool is done with the call (or never had it), so this thread is the
        // only one touching it.
        let (func, result) =
            unsafe { ((*self.0.func.get()).take(), (*self.0.result.get()).take()) };
        crate::report::drop_catching((func, result));
    }
}

/// A queued call: what to run, what to mark done (which says whom to wake), and whether its
/// caller calls back to back (then the thread that serves it spins for the next call).
struct Entry {
    job: NonNull<dyn Run>,
    completion: NonNull<Completion>,
    back_to_back: bool,
}

// SAFETY: an entry hands a call to exactly one pool thread. The `Call` is `Send` in
// substance: `unblock` requires `F: Send` and `T: Send`, and the caller does not touch the
// call while the entry exists (see `unblock`).
unsafe impl Send for Entry {}

impl Entry {
    /// Runs the call and marks it done; a parked caller must then be woken with the
    /// returned `Unparker` (left to the pool thread, which first gets ready for the next
    /// call).
    #[must_use]
    fn run(self) -> Option<Unparker> {
        // SAFETY: the call is live until `complete` (see `unblock`).
        unsafe { self.job.as_ref().run() };
        if FORKED.with(Cell::get) {
            // A call that forked returned in the child: its caller is a fiber of a
            // scheduler inherited from the parent, which never runs here, and completing
            // the call would reach into that scheduler's state (whose locks parent threads
            // may have held). As a forking fiber's child does when the fiber ends, the
            // child exits.
            // SAFETY: ends the process at once.
            unsafe { libc::_exit(0) };
        }
        // SAFETY: the call has run; `completion` is not used after this.
        unsafe { Completion::complete(self.completion) }
    }
}

/// The process-wide blocking pool.
static POOL: Pool = Pool::new();

/// The pool, its `fork` handlers registered first: a fork must hold the pool's lock and
/// reset its state in the child from the first moment anything uses it. Every use goes
/// through here but the handlers themselves. (Registering only when the first thread was
/// started left a window: a fork then could copy a pool that counted a thread the child
/// does not have, and the child's calls waited for ever.)
#[inline]
fn pool() -> &'static Pool {
    crate::fork::register(crate::fork::Slot::Pool, &FORK);
    &POOL
}

thread_local! {
    /// Whether this thread is a pool thread.
    static IN_POOL: Cell<bool> = const { Cell::new(false) };
    /// This pool thread made a call that forked, and this is the child (see `Entry::run`).
    static FORKED: Cell<bool> = const { Cell::new(false) };
}

/// The pool's first queue, `Pool::queue` until a `fork`.
static FIRST_QUEUE: SegQueue<Entry> = SegQueue::new();

/// The pool's `fork` handlers (`crate::fork::Slot::Pool`).
static FORK: crate::fork::Handlers = crate::fork::Handlers {
    prepare: fork_hold,
    release: fork_release,
};

/// Takes the pool's idle lock before a `fork` (see `crate::fork`).
fn fork_hold() {
    POOL.idle.fork_hold();
}

/// Releases what [`fork_hold`] took. The child has none of the parent's pool threads: it
/// forgets them (sleepers, count, spinner) and starts its own when a call comes. It also gets
/// a fresh queue: the calls queued are the parent's (their callers are frames of parent
/// fibers or threads, which do not run here, and running them would repeat their effects),
/// and a push a parent thread was in the middle of would keep every later pop waiting.
fn fork_release(in_child: bool) {
    if in_child {
        // SAFETY: `fork_hold` locked `idle` on this thread, the only one here.
        let idle = unsafe { POOL.idle.fork_held() };
        // Forgotten, not dropped: nothing of them is needed, and no thread waits on them.
        std::mem::forget(std::mem::take(&mut idle.sleepers));
        // The forking thread itself, if a pool thread (a call that forks), finishes the
        // call here and then ends the child (see `Entry::run`); it counts until then.
        let forker = IN_POOL.with(Cell::get);
        FORKED.with(|f| f.set(forker));
        idle.threads = usize::from(forker);
        // The parent's queue and its calls are leaked, as the calls must not run or drop.
        POOL.queue
            .store(Box::into_raw(Box::new(SegQueue::new())), Ordering::Release);
        POOL.searching.store(0, Ordering::SeqCst);
        POOL.spinning.store(false, Ordering::SeqCst);
        POOL.spinner_seen.store(0, Ordering::SeqCst);
    }
    // SAFETY: `fork_hold` locked it on this thread; nothing released it since.
    unsafe { POOL.idle.fork_release() };
}

struct Pool {
    /// The queue of calls: `FIRST_QUEUE`, or in the child of a `fork` a fresh one (leaked),
    /// never freed.
    queue: AtomicPtr<SegQueue<Entry>>,
    /// Pool threads about to look at the queue: woken or started and not yet looking, or
    /// done with a call and looking again. A submitter wakes nobody while this is non-zero.
    searching: AtomicUsize,
    /// Sleeping threads and the thread count, under one lock so that a thread that exits
    /// and a submitter that finds no sleeper agree on whether a new thread is needed.
    idle: SpinLock<Idle>,
    max_threads: AtomicUsize,
    keep_alive_ns: AtomicU64,
    names: AtomicUsize,
    /// Whether a thread spins (at most one does).
    spinning: AtomicBool,
    /// When the spinning thread last looked at the queue (`mono_ns`); 0 when none spins, or
    /// when a submitter has found it away and stopped counting on it.
    spinner_seen: AtomicU64,
    /// Spins in a row that found nothing.
    fruitless: AtomicU32,
    /// No spin starts before this time (`mono_ns`).
    quiet_until: AtomicU64,
}

struct Idle {
    /// Sleepers, most recently idle last.
    sleepers: Vec<Arc<Sleeper>>,
    /// Live pool threads.
    threads: usize,
}

/// A sleeping pool thread's futex word: `EMPTY`, `RECHECK` by `set_keep_alive`, or
/// `NOTIFIED` by the submitter that took it out of the idle list.
struct Sleeper {
    word: AtomicU32,
    /// The CPU the thread went to sleep on (`NO_CPU` if unknown): one of the two the kernel
    /// considers when it wakes the thread.
    cpu: AtomicU32,
}

const EMPTY: u32 = 0;
const NOTIFIED: u32 = 1;
/// Set by `set_keep_alive` on a listed sleeper: read the keep-alive again.
const RECHECK: u32 = 2;

/// How a pool thread's sleep ended.
enum Woke {
    /// Handed work (counted as searching by whoever woke it).
    Notified,
    /// Idle for the whole keep-alive (or the pool shrank): the thread is counted out.
    Exit,
}

impl Pool {
    const fn new() -> Pool {
        Pool {
            queue: AtomicPtr::new(&raw const FIRST_QUEUE as *mut SegQueue<Entry>),
            searching: AtomicUsize::new(0),
            idle: SpinLock::new(Idle {
                sleepers: Vec::new(),
                threads: 0,
            }),
            max_threads: AtomicUsize::new(DEFAULT_MAX_THREADS),
            keep_alive_ns: AtomicU64::new(DEFAULT_KEEP_ALIVE.as_secs() * 1_000_000_000),
            names: AtomicUsize::new(0),
            spinning: AtomicBool::new(false),
            spinner_seen: AtomicU64::new(0),
            fruitless: AtomicU32::new(0),
            quiet_until: AtomicU64::new(0),
        }
    }

    /// The queue of calls.
    #[inline]
    fn queue(&self) -> &SegQueue<Entry> {
        // SAFETY: the pointer is `FIRST_QUEUE` or a leaked box, both live for ever; it only
        // changes in a `fork` child's handler, before anything else runs there.
        unsafe { &*self.queue.load(Ordering::Acquire) }
    }

    /// Queues a call and makes sure a thread will look at it. Runs on the calling fiber's
    /// stack; it never blocks (apart from starting a thread).
    fn submit(&'static self, entry: Entry) {
        self.queue().push(entry);
        // Pairs with the fence of a thread going to sleep (`sleep`): either it sees this
        // entry, or we see it no longer searching and wake someone.
        fence(Ordering::SeqCst);
        if self.searching.load(Ordering::SeqCst) == 0 || self.spinner_away() {
            self.wake_one(true);
        }
    }

    /// Whether a spinning thread, counted among the searchers, has not looked at the queue
    /// for `AWAY_NS` — descheduled, it may not look again for a whole time slice. The first
    /// submitter to notice stops counting on it (and wakes another thread); it ends its spin
    /// when it runs again.
    fn spinner_away(&self) -> bool {
        let seen = self.spinner_seen.load(Ordering::Relaxed);
        seen != 0
            && crate::sys::mono_ns().saturating_sub(seen) > AWAY_NS
            && self
                .spinner_seen
                .compare_exchange(seen, 0, Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
    }

    /// Wakes the most recently idle thread (with `spread`, of the few most recently idle,
    /// one that last ran on another CPU than this one: see `pick_sleeper`), or starts one if
    /// none sleeps and the cap allows; either way the thread counts as searching from here
    /// on. With every thread busy, the queue waits for the first one that finishes.
    fn wake_one(&'static self, spread: bool) {
        let here = if spread {
            crate::sys::current_cpu()
        } else {
            None
        };
        let mut idle = self.idle.lock();
        let pick = pick_sleeper(
            idle.sleepers.iter().map(|s| s.cpu.load(Ordering::Relaxed)),
            here,
        );
        if let Some(i) = pick {
            let s = idle.sleepers.remove(i);
            self.searching.fetch_add(1, Ordering::SeqCst);
            drop(idle);
            s.word.store(NOTIFIED, Ordering::Release);
            futex::wake(&s.word, 1);
            return;
        }
        if idle.threads >= self.max_threads.load(Ordering::Relaxed) {
            return;
        }
        idle.threads += 1;
        self.searching.fetch_add(1, Ordering::SeqCst);
        drop(idle);
        let n = self.names.fetch_add(1, Ordering::Relaxed);
        let spawned = std::thread::Builder::new()
            .name(format!("{THREAD_NAME}-{n}"))
            .spawn(move || self.thread_main());
        if spawned.is_err() {
            let mut idle = self.idle.lock();
            self.searching.fetch_sub(1, Ordering::SeqCst);
            idle.threads -= 1;
            let none = idle.threads == 0;
            drop(idle);
            if none {
                // The OS refuses threads and the pool has none: run the queue here rather
                // than leave callers parked for ever.
                while let Some(e) = self.queue().pop() {
                    if let Some(caller) = e.run() {
                        caller.unpark_owned();
                    }
                }
            }
        }
    }

    /// A pool thread. It starts counted as searching.
    fn thread_main(&'static self) {
        IN_POOL.with(|p| p.set(true));
        let me = Arc::new(Sleeper {
            word: AtomicU32::new(EMPTY),
            cpu: AtomicU32::new(NO_CPU),
        });
        // Whether the call just served was back to back: then spin before sleeping.
        let mut spin = false;
        loop {
            if let Some(entry) = self.queue().pop() {
                // The last searcher going to work hands the search on if more work waits
                // (Go's rule), so a burst costs a chain of wake-ups, not one per call.
                if self.searching.fetch_sub(1, Ordering::SeqCst) == 1 && !self.queue().is_empty() {
                    self.wake_one(false);
                }
                spin = entry.back_to_back;
                let caller = entry.run();
                // Search again *before* waking the caller: a call it makes right away then
                // finds this thread and wakes nobody.
                self.searching.fetch_add(1, Ordering::SeqCst);
                if let Some(caller) = caller {
                    caller.unpark_owned();
                }
                continue;
            }
            if std::mem::take(&mut spin) && self.spin() {
                continue;
            }
            match self.sleep(&me) {
                Woke::Notified => continue,
                Woke::Exit => return,
            }
        }
    }

    /// Looks at the queue for up to `SPIN_FOR_NS`, still counted as searching, unless
    /// another thread spins or spinning is quiet (see the module docs); true if a call came.
    ///
    /// Pauses, not `sched_yield`, between looks: a yield hands the CPU to anyone runnable
    /// for a whole slice (and, on Linux's EEVDF, pushes the yielder's next turn back by a
    /// slice each time), which makes back-to-back calls slower than no spin at all. The spin
    /// is short instead, and gives up when it is descheduled or keeps finding nothing.
    fn spin(&self) -> bool {
        let start = crate::sys::mono_ns();
        if start < self.quiet_until.load(Ordering::Relaxed)
            || self.spinning.swap(true, Ordering::Acquire)
        {
            return false;
        }
        self.spinner_seen.store(start, Ordering::Relaxed);
        let mut seen = start;
        let found = loop {
            if !self.queue().is_empty() {
                break true;
            }
            for _ in 0..SPIN_PAUSES {
                std::hint::spin_loop();
            }
            let now = crate::sys::mono_ns();
            // Checked before `spinner_seen` is refreshed: a spinner that was away (and may
            // have been given up on by a submitter) ends here at its next look.
            if now.saturating_sub(seen) > AWAY_NS || now.saturating_sub(start) >= SPIN_FOR_NS {
                break false;
            }
            seen = now;
            self.spinner_seen.store(now, Ordering::Relaxed);
        };
        self.spinner_seen.store(0, Ordering::Relaxed);
        self.spinning.store(false, Ordering::Release);
        if found {
            self.fruitless.store(0, Ordering::Relaxed);
        } else if self.fruitless.fetch_add(1, Ordering::Relaxed) + 1 >= FRUITLESS_SPINS {
            self.fruitless.store(0, Ordering::Relaxed);
            self.quiet_until
                .store(crate::sys::mono_ns() + QUIET_NS, Ordering::Relaxed);
        }
        found
    }

    /// Stops searching and sleeps until handed work, or until the keep-alive runs out.
    fn sleep(&self, me: &Arc<Sleeper>) -> Woke {
        {
            // Under the lock, so that a submitter that sees us no longer searching finds us
            // in the list (and wakes us) instead of starting another thread.
            let mut idle = self.idle.lock();
            self.searching.fetch_sub(1, Ordering::SeqCst);
            if idle.threads > self.max_threads.load(Ordering::Relaxed) {
                idle.threads -= 1;
                return Woke::Exit;
            }
            me.word.store(EMPTY, Ordering::Relaxed);
            let cpu = crate::sys::current_cpu().unwrap_or(NO_CPU);
            me.cpu.store(cpu, Ordering::Relaxed);
            idle.sleepers.push(me.clone());
        }
        // Pairs with the fence in `submit` (see there).
        fence(Ordering::SeqCst);
        if !self.queue().is_empty() && self.withdraw(me) {
            self.searching.fetch_add(1, Ordering::SeqCst);
            return Woke::Notified;
        }
        let since = Instant::now();
        loop {
            match me.word.load(Ordering::Acquire) {
                NOTIFIED => return Woke::Notified,
                RECHECK => {
                    // A failure means `NOTIFIED` came meanwhile: the next look returns.
                    let _ = me.word.compare_exchange(
                        RECHECK,
                        EMPTY,
                        Ordering::AcqRel,
                        Ordering::Acquire,
                    );
                    continue;
                }
                _ => {}
            }
            // Read again at every wake-up: `set_keep_alive` wakes idle threads.
            let keep_alive = Duration::from_nanos(self.keep_alive_ns.load(Ordering::SeqCst));
            let left = since
                .checked_add(keep_alive)
                .map(|d| d.saturating_duration_since(Instant::now()));
            if left == Some(Duration::ZERO) {
                let mut idle = self.idle.lock();
                if let Some(i) = idle.sleepers.iter().rposition(|s| Arc::ptr_eq(s, me)) {
                    idle.sleepers.remove(i);
                    idle.threads -= 1;
                    return Woke::Exit;
                }
                // A submitter took us out of the list: its notification is on the way.
                drop(idle);
                while me.word.load(Ordering::Acquire) != NOTIFIED {
                    futex::wait(&me.word, EMPTY, None);
                }
                return Woke::Notified;
            }
            futex::wait(&me.word, EMPTY, left);
        }
    }

    /// Takes `me` out of the idle list; false if a submitter already took it (and will
    /// notify it).
    fn withdraw(&self, me: &Arc<Sleeper>) -> bool {
        let mut idle = self.idle.lock();
        match idle.sleepers.iter().rposition(|s| Arc::ptr_eq(s, me)) {
            Some(i) => {
                idle.sleepers.remove(i);
                true
            }
            None => false,
        }
    }
}

/// Which sleeper to wake, given their CPUs from the least to the most recently idle: of the
/// last `PLACE_SCAN`, the most recently idle that went to sleep on another CPU than `here`,
/// else the most recently idle; `None` if nobody sleeps. Without `here`, the most recently
/// idle.
fn pick_sleeper<I>(cpus: I, here: Option<u32>) -> Option<usize>
where
    I: DoubleEndedIterator<Item = u32> + ExactSizeIterator,
{
    let last = cpus.len().checked_sub(1)?;
    let Some(here) = here else {
        return Some(last);
    };
    let elsewhere = cpus.rev().take(PLACE_SCAN).position(|cpu| cpu != here);
    Some(elsewhere.map_or(last, |k| last - k))
}

#[cfg(test)]
mod tests {
    use super::{pick_sleeper, NO_CPU, PLACE_SCAN};

    fn pick(cpus: &[u32], here: Option<u32>) -> Option<usize> {
        pick_sleeper(cpus.iter().copied(), here)
    }

    #[test]
    fn nobody_to_wake_when_nobody_sleeps() {
        assert_eq!(pick(&[], Some(0)), None);
        assert_eq!(pick(&[], None), None);
    }

    #[test]
    fn the_most_recently_idle_one_that_slept_on_another_cpu_is_woken() {
        assert_eq!(pick(&[1, 0, 0], Some(0)), Some(0));
        assert_eq!(pick(&[1, 0, 1, 0], Some(0)), Some(2));
        assert_eq!(pick(&[1, 0, 1, 0], Some(1)), Some(3));
        // A thread whose CPU is unknown counts as elsewhere.
        assert_eq!(pick(&[0, NO_CPU, 0], Some(0)), Some(1));
    }

    #[test]
    fn the_most_recently_idle_one_is_woken_when_all_slept_here_or_the_cpu_is_unknown() {
        assert_eq!(pick(&[3], Some(3)), Some(0));
        assert_eq!(pick(&[3, 3, 3], Some(3)), Some(2));
        assert_eq!(pick(&[1, 0, 1], None), Some(2));
    }

    #[test]
    fn only_the_most_recently_idle_few_are_looked_at() {
        // One elsewhere, just beyond the scan: the oldest keep timing out.
        let mut cpus = vec![1];
        cpus.extend(std::iter::repeat_n(0, PLACE_SCAN));
        assert_eq!(pick(&cpus, Some(0)), Some(PLACE_SCAN));
        // Just within it.
        let mut cpus = vec![0, 1];
        cpus.extend(std::iter::repeat_n(0, PLACE_SCAN - 1));
        assert_eq!(pick(&cpus, Some(0)), Some(1));
    }
}
