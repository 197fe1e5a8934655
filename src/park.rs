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
//! generation g". Unparking twice, late, or after the fiber moved on does nothing.

use crate::dump::WaitOn;
use crate::fiber::{current_meta, suspend, Suspend};
use crate::sched::task::JobRef;
use crate::sched::worker::Shared;
use crate::sys::futex;
use std::fmt;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Instant;

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
#[derive(Clone)]
pub struct Unparker {
    target: Target,
}

#[derive(Clone)]
enum Target {
    Fiber {
        job: JobRef,
        gen: u64,
    },
    Thread {
        slot: Arc<ThreadSlot>,
        gen: u32,
    },
    /// Wakes a worker's loop rather than a fiber: a thread driving `use_caller`'s worker 0
    /// inside `block_on` waits for its task this way.
    Worker {
        shared: Arc<Shared>,
        index: usize,
    },
    /// Wakes an async task: a future waiting on a fibra primitive registers its waker where
    /// a parked fiber would register its unparker.
    Waker(std::task::Waker),
}

impl Unparker {
    pub(crate) fn for_fiber(job: JobRef, gen: u64) -> Unparker {
        Unparker {
            target: Target::Fiber { job, gen },
        }
    }

    /// An unparker that wakes `waker`'s task (see `crate::future`).
    pub(crate) fn from_waker(waker: std::task::Waker) -> Unparker {
        Unparker {
            target: Target::Waker(waker),
        }
    }

    pub(crate) fn for_worker(shared: Arc<Shared>, index: usize) -> Unparker {
        Unparker {
            target: Target::Worker { shared, index },
        }
    }

    /// Wakes the parked fiber (on its home worker) or thread. Does nothing if it was already
    /// woken, timed out, or has moved on to another park.
    pub fn unpark(&self) {
        match &self.target {
            Target::Fiber { job, gen } => crate::sched::unpark_fiber(job, *gen),
            Target::Thread { slot, gen } => slot.unpark(*gen),
            Target::Worker { shared, index } => shared.workers[*index].sleep.wake(),
            Target::Waker(w) => w.wake_by_ref(),
        }
    }

    /// [`unpark`](Unparker::unpark), consuming the unparker: a fiber is queued with the
    /// unparker's own reference to it instead of a new one.
    pub(crate) fn unpark_owned(self) {
        match self.target {
            Target::Fiber { job, gen } => crate::sched::unpark_fiber_owned(job, gen),
            Target::Waker(w) => w.wake(),
            _ => self.unpark(),
        }
    }
}

impl fmt::Debug for Unparker {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.target {
            Target::Fiber { job, gen } => f
                .debug_struct("Unparker")
                .field("fiber", &job.header().id)
                .field("generation", gen)
                .finish(),
            Target::Worker { index, .. } => {
                f.debug_struct("Unparker").field("worker", index).finish()
            }
            Target::Thread { gen, .. } => f
                .debug_struct("Unparker")
                .field("thread", &"..")
                .field("generation", gen)
                .finish(),
            Target::Waker(w) => f.debug_struct("Unparker").field("waker", w).finish(),
        }
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
pub(crate) fn park_until(
    deadline: Option<Instant>,
    on: WaitOn,
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
            if suspend(meta, Suspend::Park(erased, deadline)) {
                ParkResult::TimedOut
            } else {
                ParkResult::Unparked
            }
        }
        _ => block_thread(deadline, register),
    }
}

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

use word::{NOTIFIED, PARKED, RUNNING as IDLE, STATE_BITS};
const GEN_MASK: u32 = u32::MAX >> STATE_BITS;

/// A thread's park word: `(generation << 2) | state`, waited on with a futex.
pub(crate) struct ThreadSlot {
    word: AtomicU32,
}

impl ThreadSlot {
    fn unpark(&self, gen: u32) {
        let parked = (gen << STATE_BITS) | PARKED;
        let notified = (gen << STATE_BITS) | NOTIFIED;
        // Release: what the waker wrote before unparking is visible to the woken thread,
        // which reads the word with Acquire.
        if self
            .word
            .compare_exchange(parked, notified, Ordering::Release, Ordering::Relaxed)
            .is_ok()
        {
            futex::wake(&self.word, 1);
        }
    }
}

thread_local! {
    static SLOT: Arc<ThreadSlot> = Arc::new(ThreadSlot { word: AtomicU32::new(IDLE) });
}

/// Restores a thread slot to idle with the next generation, even if `register` panics.
struct NextGeneration<'a> {
    slot: &'a ThreadSlot,
    gen: u32,
}

impl Drop for NextGeneration<'_> {
    fn drop(&mut self) {
        let next = (self.gen.wrapping_add(1) & GEN_MASK) << STATE_BITS;
        self.slot.word.store(next | IDLE, Ordering::Relaxed);
    }
}

fn block_thread(deadline: Option<Instant>, register: impl FnOnce(Unparker)) -> ParkResult {
    let slot = SLOT.with(Arc::clone);
    // Only this thread writes the word while it is IDLE, so a plain store is enough.
    let gen = slot.word.load(Ordering::Relaxed) >> STATE_BITS;
    let parked = (gen << STATE_BITS) | PARKED;
    let notified = (gen << STATE_BITS) | NOTIFIED;
    slot.word.store(parked, Ordering::Relaxed);
    let _next = NextGeneration { slot: &slot, gen };
    register(Unparker {
        target: Target::Thread {
            slot: slot.clone(),
            gen,
        },
    });
    loop {
        let w = slot.word.load(Ordering::Acquire);
        if w == notified {
            return ParkResult::Unparked;
        }
        let timeout = match deadline {
            None => None,
            Some(d) => {
                let now = Instant::now();
                if now >= d {
                    // Withdraw; if that fails, an unpark just won the race.
                    match slot.word.compare_exchange(
                        parked,
                        (gen << STATE_BITS) | IDLE,
                        Ordering::Acquire,
                        Ordering::Acquire,
                    ) {
                        Ok(_) => return ParkResult::TimedOut,
                        Err(_) => return ParkResult::Unparked,
                    }
                }
                Some(d - now)
            }
        };
        futex::wait(&slot.word, w, timeout);
    }
}
