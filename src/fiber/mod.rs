//! Fibers: corosensei coroutines with an identity, and the suspend protocol every waiting
//! operation goes through.
//!
//! A fiber never publishes itself to a waker. It *suspends with a request* ([`Suspend`]):
//! `Yield` (put me at the back of the queue) or `Park` (here is a closure that registers me
//! somewhere). Whoever resumed it — a scheduler worker, or the caller of [`Fiber::resume`] —
//! acts on the request only after the switch, on its own stack (docs/design.md, "Principles"). So no
//! waker can ever see a fiber that is still running. What a `Park` request holds, and what
//! the worker does with it, is the park protocol's (`crate::park::protocol`).
//!
//! This module owns the thread-local "current fiber" pointer, fiber ids and the standalone
//! [`Fiber`]. It knows nothing of schedulers beyond the `Suspend` values it hands them.

mod local;
mod panic;

pub(crate) use local::end_of_fiber;
pub use local::FiberLocal;
pub(crate) use panic::{install_overflow_handler, install_panic_hook};

use crate::park::protocol::ParkRequest;
use crate::stack::{FiberStack, StackPool, DEFAULT_STACK_SIZE};
use std::any::Any;
use std::cell::{Cell, RefCell};
use std::fmt;
use std::marker::PhantomData;
use std::panic::AssertUnwindSafe;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// How many operations a fiber may complete without suspending before the next one yields.
///
/// Big enough that the yield costs nothing measurable next to the operations (one yield is
/// about as costly as one uncontended channel operation), small enough that a fiber woken
/// on the same worker waits at most a few microseconds of such a loop.
pub const BUDGET: u32 = 128;

/// What a resumer passes into a fiber.
pub(crate) enum Resume {
    /// Carry on.
    Run,
    /// Carry on: the timed park the fiber is in ended by its deadline.
    TimedOut,
    /// Unwind: the fiber is being cancelled (`stop_timeout`, or a dropped standalone fiber).
    Cancel,
    /// The park registration closure panicked; the panic continues in the fiber. Boxed
    /// once more so that a `Resume` is two words and passes through the switch in
    /// registers (a panic here is rare; every resumption pays for the size).
    Panic(Box<Box<dyn Any + Send>>),
}

/// What a fiber asks of its resumer when it suspends.
pub(crate) enum Suspend {
    /// Requeue me at the back of my worker's queue.
    Yield,
    /// Do what this request (it lives on my suspended stack) says: call its registration
    /// closure with my `Unparker`, wake me at its deadline if nobody else does first (the
    /// park protocol, `crate::park::protocol`). One thin pointer, so that the request
    /// travels through the switch in a register.
    Park(NonNull<ParkRequest>),
}

/// How a fiber's root function ended.
pub(crate) enum Outcome {
    Done,
    Panicked(Box<dyn Any + Send>),
    Cancelled,
}

/// The panic payload that unwinds a cancelled fiber. It goes through `resume_unwind`, so the
/// panic hook never prints it.
pub(crate) struct Cancelled;

pub(crate) type Yielder = corosensei::Yielder<Resume, Suspend>;
pub(crate) type Coro = corosensei::Coroutine<Resume, Suspend, Outcome, FiberStack>;

/// A fiber's unique id, never reused within a process.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Debug)]
pub struct FiberId(u64);

impl FiberId {
    /// The id as a number.
    pub fn as_u64(self) -> u64 {
        self.0
    }

    /// A fresh id. Threads take ids from the global counter in blocks, so creating a fiber
    /// does not touch a shared cache line.
    pub(crate) fn next() -> FiberId {
        const BLOCK: u64 = 1024;
        static NEXT_BLOCK: AtomicU64 = AtomicU64::new(1);
        thread_local! {
            static RANGE: Cell<(u64, u64)> = const { Cell::new((0, 0)) };
        }
        RANGE.with(|r| {
            let (mut next, mut end) = r.get();
            if next == end {
                next = NEXT_BLOCK.fetch_add(BLOCK, Ordering::Relaxed);
                end = next + BLOCK;
            }
            r.set((next + 1, end));
            FiberId(next)
        })
    }
}

impl fmt::Display for FiberId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "#{}", self.0)
    }
}

/// The identity of the running fiber, from [`Fiber::current`].
#[derive(Clone, Debug)]
pub struct FiberInfo {
    id: FiberId,
    name: Option<Arc<str>>,
}

impl FiberInfo {
    /// The fiber's id.
    pub fn id(&self) -> FiberId {
        self.id
    }

    /// The fiber's name, if it was given one.
    pub fn name(&self) -> Option<&str> {
        self.name.as_deref()
    }
}

/// Everything the running code, the panic hook and the overflow handler need to know about a
/// fiber. Lives at a stable address (inside a scheduled task or a standalone fiber's box) for
/// as long as the fiber can run.
///
/// `repr(C)`, with what every switch touches first (the yielder, the budget, the flags): in a
/// task cell it follows the rest of the switch's fields (see `HomeOnly`), so that a yield reads
/// and writes two or three cache lines of the cell rather than five.
#[repr(C)]
pub(crate) struct FiberMeta {
    /// Set by the fiber itself when it first runs.
    pub(crate) yielder: Cell<*const Yielder>,
    /// Operations left before the next one yields (see `crate::coop`); reset by the worker
    /// at every resumption.
    pub(crate) budget: Cell<u32>,
    /// The fiber has raised its cancellation (it is unwinding, or caught it).
    pub(crate) cancelled: Cell<bool>,
    /// `OTHERS_UNWINDING`, `UNWIND_HINT` and `CANCEL_DEFERRED` (see [`unwinding`]): one byte,
    /// so that the fields every switch touches keep their places.
    pub(crate) unwind: Cell<u8>,
    /// Inside `coop::unconstrained`: a spent budget is refilled instead of yielding.
    pub(crate) unconstrained: Cell<bool>,
    /// Inside `hook::without`: the C library calls are the real ones.
    #[cfg(feature = "hook")]
    pub(crate) hooks_off: Cell<bool>,
    /// Inside a hooked call: its cancellation must not unwind into C frames.
    #[cfg(feature = "hook")]
    pub(crate) in_hook: Cell<bool>,
    /// A hooked call caught the fiber's cancellation: raise it at the next suspension
    /// outside hooks.
    #[cfg(feature = "hook")]
    pub(crate) hook_cancel: Cell<bool>,
    /// An address in the fiber's stack where it last suspended (a local of `suspend`), or 0:
    /// the worker that resumes it later can prefetch that part of the stack (see
    /// `crate::stack::prefetch_near`).
    pub(crate) suspended_at: Cell<usize>,
    pub(crate) id: FiberId,
    pub(crate) name: Option<Arc<str>>,
    /// Guard page range of the fiber's stack.
    pub(crate) guard: (usize, usize),
    /// Usable stack bytes.
    pub(crate) stack_size: usize,
    /// Home worker index; `None` for a standalone fiber.
    pub(crate) worker: Option<usize>,
    /// What the fiber waits on, written as it parks (for `Scheduler::dump`).
    pub(crate) wait: Cell<crate::park::WaitOn>,
    /// The fiber's [`FiberLocal`] values (a scheduled fiber's only).
    pub(crate) locals: local::Locals,
}

impl FiberMeta {
    #[inline(always)]
    pub(crate) fn new(id: FiberId, name: Option<Arc<str>>, worker: Option<usize>) -> Self {
        FiberMeta {
            id,
            name,
            guard: (0, 0),
            stack_size: 0,
            worker,
            yielder: Cell::new(std::ptr::null()),
            cancelled: Cell::new(false),
            unwind: Cell::new(0),
            budget: Cell::new(BUDGET),
            unconstrained: Cell::new(false),
            suspended_at: Cell::new(0),
            wait: Cell::new(crate::park::WaitOn::Park),
            locals: local::Locals::new(),
            #[cfg(feature = "hook")]
            hooks_off: Cell::new(false),
            #[cfg(feature = "hook")]
            in_hook: Cell::new(false),
            #[cfg(feature = "hook")]
            hook_cancel: Cell::new(false),
        }
    }

    pub(crate) fn set_stack(&mut self, stack: &FiberStack) {
        self.guard = stack.guard_range();
        self.stack_size = stack.size();
    }
}

thread_local! {
    /// The fiber running on this thread, or null. Const-initialised and without destructor,
    /// so the signal handler may read it.
    static CURRENT: Cell<*const FiberMeta> = const { Cell::new(std::ptr::null()) };
}

/// The running fiber's metadata, if any.
#[inline]
pub(crate) fn current_meta() -> Option<&'static FiberMeta> {
    let p = CURRENT.with(|c| c.get());
    // SAFETY: CURRENT is only non-null between `enter` and the matching restore, during which
    // the meta it points to is kept alive by whoever resumed the fiber. The 'static is a lie we
    // never let escape a fiber's own execution: callers use it immediately.
    unsafe { p.as_ref() }
}

/// Whether the calling code runs inside a fiber of a scheduler (whose waits suspend the
/// fiber; a standalone fiber's block its thread).
#[inline]
pub(crate) fn in_scheduled_fiber() -> bool {
    current_meta().is_some_and(|m| m.worker.is_some())
}

/// Runs `f` with one of the running fiber's flags set (the one `flag` picks), restoring its
/// previous value when `f` returns or unwinds. Outside a fiber it just calls `f`.
pub(crate) fn with_flag<R>(flag: fn(&FiberMeta) -> &Cell<bool>, f: impl FnOnce() -> R) -> R {
    struct Restore(Option<(&'static Cell<bool>, bool)>);
    impl Drop for Restore {
        fn drop(&mut self) {
            if let Some((cell, prev)) = self.0 {
                cell.set(prev);
            }
        }
    }
    // The meta outlives this call: `f` runs on this fiber's stack, which the meta belongs to.
    let _restore = Restore(current_meta().map(|m| {
        let cell = flag(m);
        (cell, cell.replace(true))
    }));
    f()
}

/// Marks `meta` as the running fiber for the duration of a resume; returns the previous one.
#[inline]
pub(crate) fn enter(meta: *const FiberMeta) -> *const FiberMeta {
    // SAFETY: the resumer keeps the meta alive for the resume (see `current_meta`), and only
    // the thread that resumes the fiber touches its cells.
    unsafe { (*meta).set_unwind(OTHERS_UNWINDING, std::thread::panicking()) };
    CURRENT.with(|c| c.replace(meta))
}

/// `FiberMeta::unwind`: the thread was already unwinding when the fiber was last resumed
/// (some other fiber of this thread is suspended in the middle of its unwind).
const OTHERS_UNWINDING: u8 = 1;
/// `FiberMeta::unwind`: the fiber itself was last known to unwind.
const UNWIND_HINT: u8 = 2;
/// `FiberMeta::unwind`: a cancellation came while the fiber was unwinding (raising it there
/// would abort the process); raised at the first suspension after that unwind.
const CANCEL_DEFERRED: u8 = 4;

impl FiberMeta {
    #[inline(always)]
    fn unwind_has(&self, bit: u8) -> bool {
        self.unwind.get() & bit != 0
    }

    #[inline(always)]
    fn set_unwind(&self, bit: u8, on: bool) {
        let v = self.unwind.get();
        self.unwind.set(if on { v | bit } else { v & !bit });
    }
}

/// Whether the calling code is unwinding: its fiber's own unwind, not another's.
///
/// `std::thread::panicking()` counts the thread's unwinds, and a fiber suspended in the middle
/// of one (a destructor that sleeps, locks or joins) keeps its count on the thread while other
/// fibers run there. So the resumer records whether the thread was unwinding just before the
/// switch (`enter`): if not, `panicking()` inside the fiber is the fiber's own answer, exactly.
/// If it was, the fiber's own answer is its last known one, which the panic hook (a panic
/// starts) and the cancellation (its unwind starts) set, and a later exact answer corrects.
/// (A payload a fiber rethrows with `resume_unwind` while another fiber's unwind is suspended
/// passes unseen, as does a hook installed after fibra's; both read as not unwinding there.)
///
/// Outside fibers it is `panicking()`: on a worker's own stack, between fibers, that reads true
/// while a fiber's unwind is suspended, and callers treat it as the careful answer.
#[inline]
pub(crate) fn unwinding() -> bool {
    if !std::thread::panicking() {
        return false;
    }
    match current_meta() {
        Some(meta) => meta_unwinding(meta),
        None => true,
    }
}

/// [`unwinding`] for the running fiber `meta`, while the thread is unwinding.
fn meta_unwinding(meta: &FiberMeta) -> bool {
    if meta.unwind_has(OTHERS_UNWINDING) {
        meta.unwind_has(UNWIND_HINT)
    } else {
        // Exact: nothing else on this thread was unwinding when the fiber was resumed.
        meta.set_unwind(UNWIND_HINT, true);
        true
    }
}

/// Notes that the running fiber starts to unwind (the panic hook, a raised cancellation).
pub(crate) fn note_unwind(meta: &FiberMeta) {
    meta.set_unwind(UNWIND_HINT, true);
}

/// Notes that fibra code caught the running fiber's cancellation and goes on: the fiber no
/// longer unwinds. (A cancellation is raised only in a fiber that is not unwinding, see
/// [`suspend`], so the catch brings it back to that.)
pub(crate) fn caught_cancelled() {
    if let Some(meta) = current_meta() {
        meta.set_unwind(UNWIND_HINT, false);
    }
}

/// Raises `payload`, a caught [`Cancelled`], again, unless the caller is unwinding: a second
/// unwind out of a destructor would abort the process, so the running fiber then raises it at
/// its next suspension after that unwind. (Outside fibers it is dropped there.)
pub(crate) fn raise_cancelled(payload: Box<dyn std::any::Any + Send>) {
    debug_assert!(payload.is::<Cancelled>());
    caught_cancelled();
    if !unwinding() {
        if let Some(meta) = current_meta() {
            note_unwind(meta);
        }
        std::panic::resume_unwind(payload);
    }
    if let Some(meta) = current_meta() {
        meta.set_unwind(CANCEL_DEFERRED, true);
    }
}

/// Clears the running-fiber pointer (a worker's loop driven from inside a standalone fiber);
/// returns it for [`leave`] to restore.
#[inline]
pub(crate) fn leave_all() -> *const FiberMeta {
    CURRENT.with(|c| c.replace(std::ptr::null()))
}

/// Restores the running-fiber pointer saved by [`enter`].
#[inline]
pub(crate) fn leave(prev: *const FiberMeta) {
    CURRENT.with(|c| c.set(prev));
}

/// Suspends the running fiber with `req` and acts on what its resumer passed back:
/// returns whether a timed park ended by its deadline, unwinds for a cancellation, or
/// continues a forwarded panic. Must only be called inside a fiber.
///
/// A fiber raises its cancellation once. A second one (a destructor that suspends while the
/// first unwinds, and whose resumer cancels again) is not raised: a panic escaping a
/// destructor during unwinding aborts the process, and the fiber is on its way out anyway.
/// A first one that comes while the fiber unwinds from a panic is deferred for the same
/// reason, and raised at the first suspension after that unwind was caught. Both are tracked
/// per fiber (see [`unwinding`]): `std::thread::panicking()` would also be true while
/// *another* fiber of the same thread is suspended in the middle of its unwind.
#[inline]
pub(crate) fn suspend(meta: &FiberMeta, req: Suspend) -> bool {
    #[cfg(feature = "hook")]
    if meta.hook_cancel.get() && !meta.in_hook.get() {
        raise_hook_cancel(meta);
    }
    if meta.unwind.get() != 0 {
        unwind_at_suspend(meta);
    }
    let y = meta.yielder.get();
    // Where this stack is, for a worker about to resume the fiber to prefetch.
    let here = 0u8;
    meta.suspended_at.set(std::ptr::addr_of!(here) as usize);
    // SAFETY: the yielder was stored by this fiber's root function and lives on this fiber's
    // stack, which is the stack we are running on.
    let resumed = unsafe { (*y).suspend(req) };
    match resumed {
        Resume::Run => false,
        Resume::TimedOut => true,
        other => resumed_to_unwind(meta, other),
    }
}

/// A hooked call caught this fiber's cancellation (it could not unwind through the C frames
/// above it): raised here instead of suspending, unless the fiber unwinds already.
#[cfg(feature = "hook")]
#[cold]
#[inline(never)]
fn raise_hook_cancel(meta: &FiberMeta) {
    if !unwinding() {
        meta.hook_cancel.set(false);
        note_unwind(meta);
        std::panic::resume_unwind(Box::new(Cancelled));
    }
}

/// The resumer passed a cancellation or a panic: unwinds, or returns `false` for a
/// cancellation that is not raised (see [`suspend`]). Out of line, so that `suspend`, inlined
/// into every wait, stays a switch and two compares.
#[cold]
#[inline(never)]
fn resumed_to_unwind(meta: &FiberMeta, resumed: Resume) -> bool {
    match resumed {
        Resume::Run => false,
        Resume::TimedOut => true,
        Resume::Cancel if meta.cancelled.get() => false,
        Resume::Cancel if unwinding() => {
            // Unwinding already (a destructor waits during a panic): a second unwind out of
            // that destructor would abort the process. Raised once this one is over.
            meta.set_unwind(CANCEL_DEFERRED, true);
            false
        }
        Resume::Cancel => {
            meta.cancelled.set(true);
            note_unwind(meta);
            std::panic::resume_unwind(Box::new(Cancelled))
        }
        Resume::Panic(p) => {
            note_unwind(meta);
            std::panic::resume_unwind(*p)
        }
    }
}

/// The rare part of [`suspend`]: raises a deferred cancellation whose unwind is over, and
/// corrects the hint while the thread's answer is this fiber's own.
#[cold]
#[inline(never)]
fn unwind_at_suspend(meta: &FiberMeta) {
    if meta.unwind_has(CANCEL_DEFERRED) && !unwinding() {
        // Cancelled while it unwound; that unwind is over (caught), so raise it now.
        meta.set_unwind(CANCEL_DEFERRED, false);
        note_unwind(meta);
        std::panic::resume_unwind(Box::new(Cancelled));
    }
    if meta.unwind_has(UNWIND_HINT) && !meta.unwind_has(OTHERS_UNWINDING) {
        meta.set_unwind(UNWIND_HINT, std::thread::panicking());
    }
}

/// The root of every fiber: records the yielder, runs `body` and turns its end into an
/// [`Outcome`]. A cancellation arriving before the first run skips the body entirely.
#[inline]
pub(crate) fn fiber_root<F: FnOnce()>(
    meta: *const FiberMeta,
    y: &Yielder,
    first: Resume,
    body: F,
) -> Outcome {
    // SAFETY: the meta outlives the fiber (see FiberMeta); only this fiber writes `yielder`.
    unsafe { (*meta).yielder.set(y) };
    match first {
        Resume::Run | Resume::TimedOut => {}
        Resume::Cancel => return Outcome::Cancelled,
        Resume::Panic(p) => return Outcome::Panicked(*p),
    }
    match std::panic::catch_unwind(AssertUnwindSafe(body)) {
        Ok(()) => Outcome::Done,
        Err(p) if p.is::<Cancelled>() => Outcome::Cancelled,
        Err(p) => Outcome::Panicked(p),
    }
}

/// The state of a standalone [`Fiber`].
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum FiberState {
    /// Created, never resumed.
    Ready,
    /// Running right now (only observable from inside the fiber).
    Running,
    /// Suspended in [`Fiber::yield_now`]; `resume` continues it.
    Suspended,
    /// Returned normally.
    Done,
    /// Ended by a panic; the payload is available from [`Fiber::take_panic`].
    Panicked,
}

thread_local! {
    static STANDALONE_STACKS: RefCell<StackPool> = RefCell::new(StackPool::default());
}

/// How many idle stacks a standalone fiber's end may release at once.
const TRIM_BATCH: usize = 8;

/// How many times dropping a suspended fiber asks it to unwind before giving up on it.
const DROP_CANCEL_ATTEMPTS: usize = 16;

/// A stackful coroutine: a closure with its own stack that can suspend itself with
/// [`Fiber::yield_now`] and be continued with [`Fiber::resume`].
///
/// On its own (this type), a fiber is an asymmetric coroutine driven by the thread that owns
/// it; it is `!Send` because values on its stack may be `!Send`. Inside a
/// [`Scheduler`](crate::Scheduler), fibers are created for you by `submit`.
///
/// `std::thread::panicking()` is per thread, not per fiber: while a fiber that is unwinding
/// is suspended (a destructor that sleeps, locks or joins), other fibers running on the same
/// thread see `panicking() == true`, and a std mutex guard they drop meanwhile poisons its
/// mutex. std offers no way to save and restore the panic count on a switch. fibra's own
/// locks and cancellations tell the fibers apart; avoid waiting in destructors that may run
/// during unwinding where std's are involved.
///
/// Blocking fibra calls inside a standalone fiber (join, park, sleep) block the owning thread:
/// a standalone fiber has no scheduler to switch to.
///
/// ```
/// use fibra::{Fiber, FiberState};
/// use std::{cell::RefCell, rc::Rc};
///
/// let log = Rc::new(RefCell::new(Vec::new()));
/// let l = log.clone();
/// let mut fiber = Fiber::new(move || {
///     l.borrow_mut().push(1);
///     Fiber::yield_now();
///     l.borrow_mut().push(3);
/// });
/// assert_eq!(fiber.resume(), FiberState::Suspended);
/// log.borrow_mut().push(2);
/// assert_eq!(fiber.resume(), FiberState::Done);
/// assert_eq!(*log.borrow(), [1, 2, 3]);
/// ```
pub struct Fiber {
    coro: Option<Coro>,
    meta: Box<FiberMeta>,
    state: FiberState,
    panic: Option<Box<dyn Any + Send>>,
    _not_send: PhantomData<*const ()>,
}

impl Fiber {
    /// Creates a fiber that will run `f` on a stack of the default size when first resumed.
    ///
    /// # Panics
    /// If no stack can be mapped (the address space or `vm.max_map_count` is exhausted).
    /// Use [`Fiber::try_new`] to get that as an error.
    pub fn new<F: FnOnce() + 'static>(f: F) -> Fiber {
        match Fiber::try_new(f) {
            Ok(fiber) => fiber,
            Err(e) => panic!("fibra: cannot allocate a fiber stack: {e}"),
        }
    }

    /// Creates a fiber, or returns the error that prevented allocating its stack.
    pub fn try_new<F: FnOnce() + 'static>(f: F) -> std::io::Result<Fiber> {
        Fiber::build(f, None, DEFAULT_STACK_SIZE)
    }

    /// Creates a fiber with a name (shown by [`Fiber::current`], in panic and overflow
    /// messages) and a stack size, rounded up to whole pages. A size below
    /// [`MIN_STACK_SIZE`](crate::MIN_STACK_SIZE) or above 1 GiB is refused with an
    /// [`InvalidInput`](std::io::ErrorKind::InvalidInput) error, as the builders refuse it.
    pub fn with_options<F: FnOnce() + 'static>(
        f: F,
        name: Option<&str>,
        stack_size: usize,
    ) -> std::io::Result<Fiber> {
        Fiber::build(f, name.map(Arc::from), stack_size)
    }

    fn build<F: FnOnce() + 'static>(
        f: F,
        name: Option<Arc<str>>,
        stack_size: usize,
    ) -> std::io::Result<Fiber> {
        install_panic_hook();
        install_overflow_handler();
        crate::stack::overflow::ensure_alt_stack(true);
        let size = crate::stack::check_stack_size(stack_size)
            .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidInput, e))?;
        // A fiber made in a thread-local destructor, after this thread's pool is gone, takes
        // its stack from the process's (and `recycle` gives it back there).
        let stack = match STANDALONE_STACKS.try_with(|p| p.borrow_mut().take(size)) {
            Ok(stack) => stack?,
            Err(_) => StackPool::default().take(size)?,
        };
        let mut meta = Box::new(FiberMeta::new(FiberId::next(), name, None));
        meta.set_stack(&stack);
        let meta_ptr: *const FiberMeta = &*meta;
        let coro = Coro::with_stack(stack, move |y: &Yielder, first: Resume| {
            fiber_root(meta_ptr, y, first, f)
        });
        Ok(Fiber {
            coro: Some(coro),
            meta,
            state: FiberState::Ready,
            panic: None,
            _not_send: PhantomData,
        })
    }

    /// Runs the fiber until it yields or ends, and returns its new state. Resuming a fiber
    /// that has ended does nothing and returns its final state.
    #[inline]
    pub fn resume(&mut self) -> FiberState {
        self.drive(Resume::Run)
    }

    #[inline]
    fn drive(&mut self, input: Resume) -> FiberState {
        let Some(coro) = self.coro.as_mut() else {
            return self.state;
        };
        self.state = FiberState::Running;
        let prev = enter(&*self.meta);
        let result = coro.resume(input);
        leave(prev);
        match result {
            corosensei::CoroutineResult::Yield(Suspend::Yield) => {
                self.state = FiberState::Suspended;
            }
            corosensei::CoroutineResult::Yield(Suspend::Park(..)) => {
                // `park` never suspends a standalone fiber (it blocks the thread instead).
                unreachable!("standalone fibers do not park by switching");
            }
            corosensei::CoroutineResult::Return(outcome) => {
                self.state = match outcome {
                    Outcome::Done | Outcome::Cancelled => FiberState::Done,
                    Outcome::Panicked(p) => {
                        self.panic = Some(p);
                        FiberState::Panicked
                    }
                };
                if let Some(coro) = self.coro.take() {
                    Fiber::recycle(coro);
                }
            }
        }
        self.state
    }

    /// Hands the stack of a finished coroutine back to this thread's pool (or, while the
    /// thread is exiting and its pool is gone, to the global free list).
    fn recycle(coro: Coro) {
        let mut stack = Some(coro.into_stack());
        let _ = STANDALONE_STACKS.try_with(|p| {
            if let Some(stack) = stack.take() {
                let mut pool = p.borrow_mut();
                pool.give(stack);
                pool.trim(TRIM_BATCH);
            }
        });
        if let Some(stack) = stack {
            crate::stack::release(stack);
        }
    }

    /// The fiber's current state.
    pub fn state(&self) -> FiberState {
        self.state
    }

    /// The fiber's id.
    pub fn id(&self) -> FiberId {
        self.meta.id
    }

    /// Takes the payload of the panic that ended the fiber, if it panicked (once).
    pub fn take_panic(&mut self) -> Option<Box<dyn Any + Send>> {
        self.panic.take()
    }

    /// Suspends the running fiber.
    ///
    /// In a standalone fiber, control returns to the caller of [`Fiber::resume`]. Outside any
    /// fiber this is [`std::thread::yield_now`].
    ///
    /// In a scheduled fiber, the fiber goes behind everything runnable on its worker (a
    /// started fiber never changes worker). Before it runs again, its worker runs:
    /// - every fiber that was ready on it, in order — woken fibers included, whether woken
    ///   from this worker or from another thread;
    /// - the task this fiber (or the one before it) spawned last, if it has not started;
    /// - one task submitted from outside the scheduler, if any waits in the shared queue
    ///   and this worker runs at most 8 fibers or no other worker has fewer live fibers
    ///   than this one less one (one busy worker must not start a whole batch of it, one
    ///   task per yield, while its peers wake up — a started fiber never moves); with more
    ///   than 8 fibers ready, only at every other yield. Otherwise the worker takes outside
    ///   work about every 61st pass. Idle workers take from the shared queue too.
    ///
    /// Unstarted tasks spawned earlier on this worker take turns with the ready fibers, so
    /// some of them may run after the yielded fiber. If nothing else is runnable, the fiber
    /// continues at once. fibra's own operations yield the same way when the fiber's
    /// cooperative budget is spent (see [`crate::coop`]).
    ///
    /// ```
    /// use std::sync::{Arc, Mutex};
    /// let sched = fibra::Scheduler::builder().threads(1).build().unwrap();
    /// let log = Arc::new(Mutex::new(Vec::new()));
    /// let tasks: Vec<_> = (0..3)
    ///     .map(|i| {
    ///         let log = log.clone();
    ///         let step = move || {
    ///             for _ in 0..2 {
    ///                 log.lock().unwrap().push(i);
    ///                 fibra::Fiber::yield_now();
    ///             }
    ///         };
    ///         sched.submit(step, None).unwrap()
    ///     })
    ///     .collect();
    /// sched.start();
    /// tasks.into_iter().for_each(|t| t.join().unwrap());
    /// assert_eq!(*log.lock().unwrap(), [0, 1, 2, 0, 1, 2]);
    /// ```
    #[inline]
    pub fn yield_now() {
        match current_meta() {
            Some(meta) => {
                suspend(meta, Suspend::Yield);
            }
            None => std::thread::yield_now(),
        }
    }

    /// The id and name of the running fiber, or `None` outside a fiber.
    ///
    /// It answers inside a panic hook too, which is how an application's hook tells which
    /// fiber panicked. fibra wraps the panic hook in place when the first
    /// [`Scheduler`](crate::Scheduler) or standalone fiber is built: if that hook is std's
    /// default, a fiber panic is reported as `fiber '<name>' panicked at <file:line:col>:`
    /// with the fiber's id and worker; if the application installed its own hook before, that
    /// hook gets every panic, in fibers as well, once, and runs on the panicking fiber. (A hook
    /// set after fibra's replaces it, as `std::panic::set_hook` always does.) Cancelling a
    /// fiber unwinds it without running any hook.
    ///
    /// ```
    /// use fibra::{Fiber, FiberState};
    /// use std::sync::Mutex;
    ///
    /// static PANICKED_IN: Mutex<Option<String>> = Mutex::new(None);
    /// std::panic::set_hook(Box::new(|_info| {
    ///     let fiber = Fiber::current().map(|f| format!("{} {:?}", f.id(), f.name()));
    ///     *PANICKED_IN.lock().unwrap() = fiber;
    /// }));
    ///
    /// let mut fiber = Fiber::with_options(|| panic!("oops"), Some("worker-7"), 64 * 1024)?;
    /// assert_eq!(fiber.resume(), FiberState::Panicked);
    /// let expected = format!("{} Some(\"worker-7\")", fiber.id());
    /// assert_eq!(PANICKED_IN.lock().unwrap().as_deref(), Some(expected.as_str()));
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn current() -> Option<FiberInfo> {
        current_meta().map(|m| FiberInfo {
            id: m.id,
            name: m.name.clone(),
        })
    }
}

impl fmt::Debug for Fiber {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Fiber")
            .field("id", &self.meta.id)
            .field("name", &self.meta.name)
            .field("state", &self.state)
            .finish()
    }
}

impl Drop for Fiber {
    /// Dropping a suspended fiber unwinds its stack, so its destructors run; dropping a fiber
    /// that never ran drops its closure without running it. Either way, and when it has
    /// ended, its stack goes back to the pool.
    fn drop(&mut self) {
        if self.state == FiberState::Suspended {
            for _ in 0..DROP_CANCEL_ATTEMPTS {
                // An end (done, cancelled, panicked) recycles the stack in `drive`.
                if self.drive(Resume::Cancel) != FiberState::Suspended {
                    break;
                }
            }
        }
        let Some(mut coro) = self.coro.take() else {
            return;
        };
        if !coro.started() {
            // Never resumed: for an unstarted coroutine, `force_unwind` only drops the
            // initial closure in place (it runs nothing on the fiber's stack) and marks the
            // coroutine done, so its stack can be taken out.
            let dropped = std::panic::catch_unwind(AssertUnwindSafe(|| coro.force_unwind()));
            if let Err(payload) = dropped {
                // A destructor of something the closure captured panicked. Drop glue has
                // still dropped the rest of the closure, but corosensei left the coroutine
                // marked unstarted, and dropping it so would drop the closure a second time.
                // SAFETY: the coroutine never ran, so the closure was the only object on its
                // stack, and it has been dropped: no object there needs its `Drop` any more,
                // which is `force_reset`'s precondition.
                unsafe { coro.force_reset() };
                Fiber::recycle(coro);
                std::panic::resume_unwind(payload);
            }
        }
        if coro.done() {
            Fiber::recycle(coro);
        } else {
            // The fiber keeps catching its cancellation. Leak its stack rather than free
            // memory that live frames still point into.
            std::mem::forget(coro);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_suspended_fiber_records_an_address_in_its_own_stack() {
        let mut fiber = Fiber::new(|| {
            Fiber::yield_now();
            Fiber::yield_now();
        });
        assert_eq!(fiber.meta.suspended_at.get(), 0, "not suspended yet");
        let (guard_start, guard_end) = fiber.meta.guard;
        let usable = guard_end..guard_end + fiber.meta.stack_size;
        assert!(guard_start < guard_end);
        for _ in 0..2 {
            assert_eq!(fiber.resume(), FiberState::Suspended);
            let at = fiber.meta.suspended_at.get();
            assert!(usable.contains(&at), "{at:#x} outside {usable:#x?}");
            // Near the top: a shallow fiber suspends within a few KiB of its stack's base.
            assert!(usable.end - at < 16 * 1024, "{at:#x} deep in {usable:#x?}");
            crate::stack::prefetch_near(at);
        }
        assert_eq!(fiber.resume(), FiberState::Done);
    }
}
