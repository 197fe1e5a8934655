//! The one waiting primitive: [`park`] and [`Unparker`].
//!
//! Every blocking operation in fibra (join, sleep, sync primitives, I/O readiness) is built
//! on this. Inside a scheduled fiber, `park` suspends the fiber and only then — back on the
//! worker's stack — calls the registration closure with an `Unparker` (publish after
//! suspend; docs/design.md, "Principles"). On a plain thread (or in a standalone fiber, which has no
//! scheduler) it blocks the thread on a futex instead.
//!
//! An `Unparker` wakes exactly the park it was made for: each park has a generation, and an
//! `unpark` only succeeds with a compare-and-swap from "parked, generation g" to "notified,
//! generation g". Unparking twice, late, or after the fiber moved on does nothing. (A park
//! whose unparker is its only one, `fibra::sync`'s, is won with a plain store when it is
//! used on the fiber's own worker, where no other waker can run at the same time: see
//! `park_alone`.)
//!
//! This module is the API: `park`, `park_timeout`, `Unparker`, and [`WaitOn`] (what a parked
//! fiber waits for). How a scheduled fiber parks and is woken — the park word, the request,
//! the worker's publication, the wakers — is [`protocol`]; how a plain thread parks is
//! `thread`. Built on it: [`wait_queue`], the FIFO that every waiter who queues for
//! something (a lock, a message, a task's end) waits in, with `shim`, the seam where the
//! loom model checker replaces park and the atomics.

// The shim first: its `const_unless_loom!` is used by the wait queue, and (through
// `#[macro_use] mod park` in lib.rs) by `fibra::sync`.
#[macro_use]
pub(crate) mod shim;
pub(crate) mod protocol;
mod thread;
mod wait_on;
pub(crate) mod wait_queue;

pub use wait_on::WaitOn;

use crate::fiber::{current_meta, suspend, Suspend};
use crate::sched::task::TaskRef;
use crate::sched::worker::Shared;
use protocol::ParkRequest;
use std::fmt;
use std::mem::ManuallyDrop;
use std::num::NonZeroUsize;
use std::ptr::NonNull;
use std::sync::Arc;
use std::task::RawWakerVTable;
use std::time::Instant;
use thread::{block_thread, ThreadSlot};

/// How a [`park_timeout`] ended.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum ParkResult {
    /// An [`Unparker`] woke it.
    Unparked,
    /// The deadline passed first.
    TimedOut,
}

/// A handle that wakes one particular [`park`] call. `Send + Sync`, cheap to clone;
/// [`unpark`](Unparker::unpark) is idempotent.
///
/// Two words, so that it travels in registers through the wait queues: `ptr` is what it
/// wakes, with its kind in the two low bits (every target is at least 4-aligned), and
/// `word` the park's generation (or the worker's index, or a waker's data pointer). It owns
/// one reference to its target (the task, the thread's slot, the scheduler, the waker).
pub struct Unparker {
    ptr: NonNull<u8>,
    word: u64,
}

/// The kinds of target, in `ptr`'s low bits.
/// A parked fiber: `ptr` is its task's header (`task::into_header`), `word` the generation,
/// with `ALONE` set if this is the park's only unparker (see [`park_alone`]).
const FIBER: usize = 0;
/// A blocked thread: `ptr` is its `Arc<ThreadSlot>` (`Arc::into_raw`), `word` the generation.
const THREAD: usize = 1;
/// A worker's loop rather than a fiber: a thread driving `use_caller`'s worker 0 inside
/// `block_on` waits for its task this way. `ptr` is the `Arc<Shared>`, `word` the index.
const WORKER: usize = 2;
/// An async task: a future waiting on a fibra primitive registers its waker where a parked
/// fiber would register its unparker. `ptr` is the waker's vtable, `word` its data pointer
/// (its provenance exposed).
const WAKER: usize = 3;
const KIND: usize = 3;
/// In a fiber's `word`: generations stay below 2^62 (the park word shifts them by two).
const ALONE: u64 = 1 << 63;

const _: () = assert!(
    align_of::<crate::sched::task::Header>() > KIND
        && align_of::<ThreadSlot>() > KIND
        && align_of::<Shared>() > KIND
        && align_of::<RawWakerVTable>() > KIND
);

// SAFETY: an `Unparker` owns a `TaskRef`, an `Arc<ThreadSlot>`, an `Arc<Shared>` or a
// `Waker`, each of which is `Send` and `Sync`; it only ever reaches them through `&`.
unsafe impl Send for Unparker {}
// SAFETY: as for `Send`.
unsafe impl Sync for Unparker {}

/// What an `Unparker` owns, taken apart.
enum Target {
    /// The task, the generation, and whether this is the park's only unparker.
    Fiber(TaskRef, u64, bool),
    Thread(Arc<ThreadSlot>, u32),
    Worker(Arc<Shared>, usize),
    Waker(std::task::Waker),
}

impl Unparker {
    #[inline(always)]
    fn make<T>(target: NonNull<T>, kind: usize, word: u64) -> Unparker {
        Unparker {
            ptr: target.cast::<u8>().map_addr(|a| a | kind),
            word,
        }
    }

    #[inline(always)]
    fn kind(&self) -> usize {
        self.ptr.addr().get() & KIND
    }

    #[inline(always)]
    fn target<T>(&self) -> NonNull<T> {
        // The target is non-null and its low bits are zero, so clearing them leaves it
        // non-null.
        self.ptr
            .map_addr(|a| NonZeroUsize::new(a.get() & !KIND).expect("a non-null target"))
            .cast()
    }

    /// `alone`: the park's only unparker, which is never cloned (see [`park_alone`]).
    #[inline(always)]
    pub(crate) fn for_fiber(task: TaskRef, gen: u64, alone: bool) -> Unparker {
        let word = if alone { gen | ALONE } else { gen };
        Unparker::make(crate::sched::task::into_header(task), FIBER, word)
    }

    /// An unparker that wakes `waker`'s task (see `crate::future`).
    pub(crate) fn from_waker(waker: std::task::Waker) -> Unparker {
        let waker = ManuallyDrop::new(waker);
        Unparker::make(
            NonNull::from(waker.vtable()),
            WAKER,
            waker.data().expose_provenance() as u64,
        )
    }

    pub(crate) fn for_worker(shared: Arc<Shared>, index: usize) -> Unparker {
        let shared = NonNull::new(Arc::into_raw(shared).cast_mut()).expect("non-null");
        Unparker::make(shared, WORKER, index as u64)
    }

    fn for_thread(slot: Arc<ThreadSlot>, gen: u32) -> Unparker {
        let slot = NonNull::new(Arc::into_raw(slot).cast_mut()).expect("non-null");
        Unparker::make(slot, THREAD, u64::from(gen))
    }

    /// Takes the unparker apart into what it owns.
    #[inline(always)]
    fn into_target(self) -> Target {
        let this = ManuallyDrop::new(self);
        // In every arm: `ptr` was made by the constructor of its kind from a reference given
        // up there (`into_header`, `Arc::into_raw`, a forgotten `Waker`), and `this` is
        // forgotten, so that reference is taken back exactly once, here.
        match this.kind() {
            FIBER => {
                // SAFETY: see above; `for_fiber` made it with `into_header`.
                let task = unsafe { crate::sched::task::from_header(this.target()) };
                Target::Fiber(task, this.word & !ALONE, this.word & ALONE != 0)
            }
            THREAD => {
                // SAFETY: see above; `for_thread` made it with `Arc::into_raw`.
                let slot = unsafe { Arc::from_raw(this.target::<ThreadSlot>().as_ptr()) };
                Target::Thread(slot, this.word as u32)
            }
            WORKER => {
                // SAFETY: see above; `for_worker` made it with `Arc::into_raw`.
                let shared = unsafe { Arc::from_raw(this.target::<Shared>().as_ptr()) };
                Target::Worker(shared, this.word as usize)
            }
            _ => {
                let data = std::ptr::with_exposed_provenance(this.word as usize);
                // SAFETY: see above; `from_waker` kept the waker's data pointer (exposed)
                // and its vtable, a `&'static`, and forgot the waker.
                let w = unsafe {
                    std::task::Waker::new(data, this.target::<RawWakerVTable>().as_ref())
                };
                Target::Waker(w)
            }
        }
    }

    /// Runs `f` on what the unparker owns, borrowed: it is taken apart and put back
    /// unchanged (nothing is dropped or cloned, whatever `f` does or panics with).
    #[inline(always)]
    fn with_target<R>(&self, f: impl FnOnce(&Target) -> R) -> R {
        // SAFETY: the bitwise copy is taken apart into a second owner of the same
        // references, which is never dropped (`ManuallyDrop`): `self` remains their owner.
        let copy = ManuallyDrop::new(
            Unparker {
                ptr: self.ptr,
                word: self.word,
            }
            .into_target(),
        );
        f(&copy)
    }

    /// Wakes the parked fiber (on its home worker) or thread. Does nothing if it was already
    /// woken, timed out, or has moved on to another park.
    pub fn unpark(&self) {
        self.with_target(|t| match t {
            Target::Fiber(task, gen, _) => protocol::unpark_fiber(task, *gen),
            Target::Thread(slot, gen) => slot.unpark(*gen),
            Target::Worker(shared, index) => shared.workers[*index].sleep.wake(),
            Target::Waker(w) => wake_foreign(|| w.wake_by_ref()),
        });
    }

    /// [`unpark`](Unparker::unpark), consuming the unparker: a fiber is queued with the
    /// unparker's own reference to it instead of a new one.
    #[inline]
    pub(crate) fn unpark_owned(self) {
        match self.into_target() {
            Target::Fiber(task, gen, true) => protocol::unpark_fiber_alone(task, gen),
            Target::Fiber(task, gen, false) => protocol::unpark_fiber_owned(task, gen),
            Target::Thread(slot, gen) => slot.unpark(gen),
            Target::Worker(shared, index) => shared.workers[index].sleep.wake(),
            Target::Waker(w) => wake_foreign(|| w.wake()),
        }
    }
}

/// Runs a foreign waker's `wake`, user code that may panic. While this thread is already
/// unwinding (a cancelled fiber's destructors: a `Sender` dropped, a message passed on), a
/// second panic would abort the process, so then the panic ends here, reported by the
/// panic hook; otherwise it goes on to the caller.
#[inline(always)]
fn wake_foreign(wake: impl FnOnce()) {
    if !crate::fiber::unwinding() {
        return wake();
    }
    if let Err(p) = std::panic::catch_unwind(std::panic::AssertUnwindSafe(wake)) {
        crate::report::drop_catching(p);
    }
}

impl Clone for Unparker {
    fn clone(&self) -> Unparker {
        self.with_target(|t| match t {
            Target::Fiber(task, gen, alone) => {
                debug_assert!(!alone, "the only unparker of a park is never cloned");
                Unparker::for_fiber(task.clone(), *gen, false)
            }
            Target::Thread(slot, gen) => Unparker::for_thread(slot.clone(), *gen),
            Target::Worker(shared, index) => Unparker::for_worker(shared.clone(), *index),
            Target::Waker(w) => Unparker::from_waker(w.clone()),
        })
    }
}

impl Drop for Unparker {
    fn drop(&mut self) {
        drop(
            Unparker {
                ptr: self.ptr,
                word: self.word,
            }
            .into_target(),
        );
    }
}

impl fmt::Debug for Unparker {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.with_target(|t| match t {
            Target::Fiber(task, gen, _) => f
                .debug_struct("Unparker")
                .field("fiber", &task.header().id)
                .field("generation", gen)
                .finish(),
            Target::Worker(_, index) => f.debug_struct("Unparker").field("worker", index).finish(),
            Target::Thread(_, gen) => f
                .debug_struct("Unparker")
                .field("thread", &"..")
                .field("generation", gen)
                .finish(),
            Target::Waker(w) => f.debug_struct("Unparker").field("waker", w).finish(),
        })
    }
}

/// Suspends the current fiber (or blocks the current thread) until the [`Unparker`] handed
/// to `register` is used.
///
/// `register` runs after the fiber has fully suspended, on the worker's own stack, so it can
/// publish the `Unparker` anywhere (a wait list, another thread) without racing the fiber.
/// It may even call `unpark` itself; the fiber then simply resumes. It must not block.
/// A panic in `register` continues in the parked fiber.
///
/// There are no spurious wake-ups: `park` returns only after its `Unparker` fired (or, for a
/// fiber, when the scheduler cancels it in `stop_timeout`, by unwinding).
///
/// ```
/// let sched = fibra::Scheduler::builder().threads(1).build().unwrap();
/// sched.start();
/// let (tx, rx) = std::sync::mpsc::channel();
/// let h = sched.submit(move || fibra::park(move |u| tx.send(u).unwrap()), None).unwrap();
/// rx.recv().unwrap().unpark();
/// h.join().unwrap();
/// ```
pub fn park(register: impl FnOnce(Unparker)) {
    park_until(None, WaitOn::Park, register);
}

/// Like [`park`], but gives up at `deadline`. A wake and a timeout racing at the same instant
/// resume the caller exactly once, and the result says which one won.
pub fn park_timeout(deadline: Instant, register: impl FnOnce(Unparker)) -> ParkResult {
    park_until(Some(deadline), WaitOn::Park, register)
}

/// [`park_timeout`] without a deadline when `deadline` is `None`; `on` says what the fiber
/// waits for (for `Scheduler::dump`).
#[inline(always)]
pub(crate) fn park_until(
    deadline: Option<Instant>,
    on: WaitOn,
    register: impl FnOnce(Unparker),
) -> ParkResult {
    park_with(deadline, on, false, register)
}

/// [`park_until`] for a caller whose `register` keeps the `Unparker` to itself: it is never
/// cloned, and it is the only one of this park (`fibra::sync`'s wait queues and oneshots,
/// which hand it to one waker under their own synchronization). A fiber's other wakers —
/// its timer, a cancellation — all run on its home worker, so when the unparker is used
/// there too, nothing else can race for the wake and it is won with a plain store
/// (`protocol::ParkWord::notify_alone`) instead of a compare-and-swap.
// Under loom, `fibra::sync` parks with the model's `park` instead.
#[cfg_attr(loom, allow(dead_code))]
#[inline(always)]
pub(crate) fn park_alone(
    deadline: Option<Instant>,
    on: WaitOn,
    register: impl FnOnce(Unparker),
) -> ParkResult {
    park_with(deadline, on, true, register)
}

#[inline(always)]
fn park_with(
    deadline: Option<Instant>,
    on: WaitOn,
    alone: bool,
    register: impl FnOnce(Unparker),
) -> ParkResult {
    match current_meta() {
        Some(meta) if meta.worker.is_some() => {
            meta.wait.set(on);
            let mut register = Some(register);
            let mut call = |u: Unparker| {
                if let Some(r) = register.take() {
                    r(u)
                }
            };
            let erased: *mut (dyn FnMut(Unparker) + '_) = &mut call;
            // SAFETY: only the lifetime is erased. The closure lives on this fiber's stack,
            // which stays valid and untouched while the fiber is suspended; the worker calls
            // it exactly once, before the fiber can be resumed.
            let erased: *mut (dyn FnMut(Unparker) + 'static) =
                unsafe { std::mem::transmute(erased) };
            let mut request = ParkRequest {
                register: erased,
                deadline,
                alone,
            };
            if suspend(meta, Suspend::Park(NonNull::from(&mut request))) {
                ParkResult::TimedOut
            } else {
                ParkResult::Unparked
            }
        }
        _ => block_thread(deadline, register),
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::task::{Wake, Waker};
    use std::time::Duration;

    struct CountWakes(AtomicUsize);

    /// Two words, sent and shared between threads; `None` costs nothing.
    #[test]
    fn an_unparker_is_two_words_and_send_and_sync() {
        fn send_sync<T: Send + Sync>() {}
        send_sync::<Unparker>();
        assert!(size_of::<Unparker>() <= 2 * size_of::<u64>());
        assert_eq!(size_of::<Option<Unparker>>(), size_of::<Unparker>());
    }

    impl Wake for CountWakes {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }

    /// A waker's unparker owns one waker: cloning and dropping it clone and drop wakers,
    /// `unpark` wakes through a borrow, `unpark_owned` consumes it; nothing leaks.
    #[test]
    fn a_waker_unparker_owns_exactly_one_waker() {
        let count = Arc::new(CountWakes(AtomicUsize::new(0)));
        let u = Unparker::from_waker(Waker::from(count.clone()));
        assert_eq!(Arc::strong_count(&count), 2);
        let u2 = u.clone();
        assert_eq!(Arc::strong_count(&count), 3);
        assert!(format!("{u2:?}").contains("waker"));
        u2.unpark();
        assert_eq!(count.0.load(Ordering::SeqCst), 1);
        assert_eq!(Arc::strong_count(&count), 3);
        u2.unpark_owned();
        assert_eq!(count.0.load(Ordering::SeqCst), 2);
        assert_eq!(Arc::strong_count(&count), 2);
        drop(u);
        assert_eq!(Arc::strong_count(&count), 1);
        // A waker whose data pointer is null (the no-op waker's) survives the round trip.
        let noop = Unparker::from_waker(Waker::noop().clone());
        noop.clone().unpark_owned();
        noop.unpark();
    }

    /// A fiber's unparker holds one reference to its task, so clones outliving the task are
    /// still safe to use; the result of the detached task is dropped when the task ends (in
    /// its fiber), not when the last of those references goes.
    #[test]
    fn a_fiber_unparker_outlives_its_task_and_a_detached_result_goes_at_the_end() {
        struct Dropped(Arc<AtomicUsize>);
        impl Drop for Dropped {
            fn drop(&mut self) {
                self.0.fetch_add(1, Ordering::SeqCst);
            }
        }
        let sched = crate::Scheduler::builder().threads(1).build().unwrap();
        sched.start();
        let drops = Arc::new(AtomicUsize::new(0));
        let (tx, rx) = std::sync::mpsc::channel();
        let d = drops.clone();
        let h = sched
            .submit(
                move || {
                    park(|u| tx.send(u).unwrap());
                    Dropped(d)
                },
                None,
            )
            .unwrap();
        drop(h);
        let u = rx.recv().unwrap();
        assert!(format!("{u:?}").contains("fiber"));
        let clones = [u.clone(), u.clone()];
        u.unpark_owned();
        let deadline = Instant::now() + Duration::from_secs(20);
        while drops.load(Ordering::SeqCst) == 0 {
            assert!(
                Instant::now() < deadline,
                "the detached result was never dropped"
            );
            std::thread::sleep(Duration::from_millis(1));
        }
        // Stale wakes of the ended task: they find it gone and do nothing.
        for c in &clones {
            c.unpark();
        }
        drop(clones);
        sched.stop();
        assert_eq!(drops.load(Ordering::SeqCst), 1);
    }
}
