//! The watchdog: a monitor thread per scheduler that reports fibers which run too long
//! without suspending (Go's sysmon, without the preemption).
//!
//! The workers pay next to nothing for it: each stores its loop's progress tick at every
//! pass (for its peers, anyway), and the header of the fiber it switches to (one store per
//! switch, see [`enter`]). The monitor wakes every quarter of the threshold and compares: a
//! worker that is awake, with the same fiber and the same tick as at an earlier look, has
//! been running that fiber ever since. Once that has
//! lasted the threshold, the fiber is reported — once per episode — on stderr (or as a
//! `tracing` event with the `tracing` feature and a subscriber installed).
//!
//! When every worker sleeps (or, for `use_caller`'s worker 0, is not driven), the monitor
//! sleeps too, without a timeout, and the first worker to wake up wakes it: an idle
//! scheduler costs no periodic wake-ups.
//!
//! Reading the fiber's name from another thread needs the fiber to stay alive meanwhile:
//! see [`Watch::peek`] and [`Watch::retire`].

use super::task::Header;
use super::worker::Shared;
use crate::fiber::FiberId;
use crate::sys::futex;
use crate::sys::thread_view::{self, ThreadView};
use std::panic::Location;
use std::sync::atomic::{
    compiler_fence, fence, AtomicBool, AtomicPtr, AtomicU32, AtomicU64, AtomicUsize, Ordering,
};
use std::sync::{Arc, Weak};
use std::time::Duration;

/// The default of [`Builder::watchdog`](crate::Builder::watchdog).
pub const DEFAULT_WATCHDOG: Duration = Duration::from_millis(100);

/// The watchdog's half of a worker: who reads the header of the fiber the worker runs, and
/// what the monitor found. The pointer itself, `WorkerStats::current`, lives on the line
/// only the worker writes: it is stored at every switch.
pub(crate) struct Watch {
    /// Readers of `current`'s header right now (see `peek`).
    inspecting: AtomicUsize,
}

/// Whether `retire` and `peek` use the asymmetric barrier (`membarrier`).
static ASYMMETRIC: AtomicBool = AtomicBool::new(false);

/// Decides how `retire` and `peek` order their accesses, once per process: called when a
/// scheduler is built, before any of its threads exist (their spawn then makes the value
/// visible to them). `membarrier_ready` answers the same every time, so every call stores
/// the same value and both sides of the handshake always agree.
pub(crate) fn init() {
    if crate::sys::membarrier_ready() {
        ASYMMETRIC.store(true, Ordering::Relaxed);
    }
}

/// The worker is about to switch to the fiber of `header`. `current` keeps pointing at it
/// after it switches back (parked or yielded, it stays alive in the worker's registry),
/// until the next switch or `retire`: one store per switch.
#[inline(always)]
pub(crate) fn enter(current: &AtomicPtr<Header>, header: &Header) {
    current.store(std::ptr::from_ref(header).cast_mut(), Ordering::Relaxed);
}

impl Watch {
    pub(crate) fn new() -> Watch {
        Watch {
            inspecting: AtomicUsize::new(0),
        }
    }

    /// The fiber `current` points at has ended (or the worker stops driving): clears
    /// `current` and waits until no reader that may have seen the old pointer is still
    /// reading its header, so that the worker may drop its references. Readers are rare (a
    /// suspected hog, a dump that timed out) and brief.
    ///
    /// The store of `current` and the load of `inspecting` must not be reordered (a store
    /// followed by a load of another location: only a full barrier orders them). The reader
    /// pays for that barrier, with `membarrier(2)`, which makes every running thread of the
    /// process execute one (see `peek`); here a compiler fence suffices. Where the kernel
    /// lacks `membarrier`, this side issues a SeqCst fence itself (one per ended task).
    #[inline]
    pub(crate) fn retire(&self, current: &AtomicPtr<Header>) {
        current.store(std::ptr::null_mut(), Ordering::Relaxed);
        if ASYMMETRIC.load(Ordering::Relaxed) {
            compiler_fence(Ordering::SeqCst);
        } else {
            fence(Ordering::SeqCst);
        }
        while self.inspecting.load(Ordering::Acquire) != 0 {
            std::thread::yield_now();
        }
    }

    /// The id, name and submission place of the fiber `current` points at, if any: from
    /// any thread.
    pub(crate) fn peek(
        &self,
        current: &AtomicPtr<Header>,
    ) -> Option<(FiberId, Option<Arc<str>>, &'static Location<'static>)> {
        self.inspecting.fetch_add(1, Ordering::SeqCst);
        let ordered = !ASYMMETRIC.load(Ordering::Relaxed) || crate::sys::membarrier();
        // Without the barrier we cannot know the header is alive: read nothing.
        let p = if ordered {
            current.load(Ordering::SeqCst)
        } else {
            std::ptr::null_mut()
        };
        // SAFETY: a non-null `current` is the header of a fiber the worker started and has
        // not retired: it is alive while it is in the worker's registry, which it leaves
        // only when it ends, and its worker retires it (`retire`, in `finish`, and when a
        // drive ends) before dropping its references. `retire` clears `current`, then (after
        // a barrier) loads `inspecting`; we incremented `inspecting`, then (after a barrier)
        // load `current`. With the symmetric fences both sides' barriers are SeqCst fences
        // or operations: if our load saw the pointer it precedes `retire`'s fence in the
        // SeqCst order, and so does our increment, which `retire` then sees. With
        // `membarrier`, the worker's CPU executes a full barrier while we are in the call:
        // either that barrier comes after its store of null, which is then visible to our
        // load after the call, or before its load of `inspecting`, which then sees our
        // increment (made visible before the call). Either way, if we see the pointer,
        // `retire` waits for the decrement below, which comes after our last touch of it.
        let seen = unsafe { p.as_ref() }.map(|h| (h.id, h.name.clone(), h.location));
        self.inspecting.fetch_sub(1, Ordering::Release);
        seen
    }
}

/// The monitor's sleep, shared by the scheduler (which wakes it) and the monitor thread.
///
/// A futex word, not a `parking_lot` condition variable: the monitor sleeps and wakes all
/// the time, and a `fork` while it is inside `parking_lot`'s table of parked threads would
/// leave that table's lock held in the child, for whatever parks there next (a fresh
/// scheduler's own waits, say).
pub(crate) struct MonitorCtl {
    /// The monitor sleeps without a timeout until a worker wakes up.
    parked: AtomicBool,
    stop: AtomicBool,
    /// Bumped by every wake-up; the monitor sleeps while it holds the value it read.
    word: AtomicU32,
}

impl MonitorCtl {
    pub(crate) fn new() -> MonitorCtl {
        MonitorCtl {
            parked: AtomicBool::new(false),
            stop: AtomicBool::new(false),
            word: AtomicU32::new(0),
        }
    }

    fn wake(&self) {
        self.word.fetch_add(1, Ordering::SeqCst);
        futex::wake(&self.word, 1);
    }

    /// A worker woke up or began a drive (after a SeqCst operation that made it visible as
    /// awake): wakes the monitor if it sleeps without a timeout.
    #[inline]
    pub(crate) fn nudge(&self) {
        if self.parked.load(Ordering::SeqCst) && self.parked.swap(false, Ordering::SeqCst) {
            self.wake();
        }
    }

    /// Ends the monitor thread (the scheduler stopped).
    pub(crate) fn stop(&self) {
        self.stop.store(true, Ordering::SeqCst);
        self.wake();
    }

    /// Sleeps `period` (or, with `None`, until nudged); false once stopped. The word is read
    /// before the flags, so a wake-up between the two makes the wait return at once.
    fn sleep(&self, period: Option<Duration>) -> bool {
        match period {
            Some(p) => {
                let seen = self.word.load(Ordering::SeqCst);
                if !self.stop.load(Ordering::SeqCst) {
                    futex::wait(&self.word, seen, Some(p));
                }
            }
            None => loop {
                let seen = self.word.load(Ordering::SeqCst);
                if !self.parked.load(Ordering::SeqCst) || self.stop.load(Ordering::SeqCst) {
                    break;
                }
                futex::wait(&self.word, seen, None);
            },
        }
        !self.stop.load(Ordering::SeqCst)
    }
}

/// Starts the monitor thread of the scheduler behind `shared`, if its watchdog is on, and
/// returns it for the shutdown to join.
pub(crate) fn start(shared: &Arc<Shared>) -> Option<std::thread::JoinHandle<()>> {
    let threshold = shared.config.watchdog;
    if threshold.is_zero() {
        return None;
    }
    let weak = Arc::downgrade(shared);
    let ctl = shared.monitor.clone();
    let spawned = std::thread::Builder::new()
        .name(format!("{}-watchdog", shared.config.name))
        .spawn(move || monitor(weak, ctl, threshold));
    match spawned {
        Ok(t) => Some(t),
        Err(e) => {
            eprintln!("fibra: cannot start the watchdog thread, running without it: {e}");
            None
        }
    }
}

/// What the monitor remembers of a worker between two looks.
#[derive(Clone, Copy, Default)]
struct Seen {
    progress: u32,
    current: usize,
    since: u64,
    reported: bool,
    /// What the kernel said of the worker's thread at the first look that found it stuck,
    /// and when: the report compares its run and wait times since.
    kernel: Option<(ThreadView, u64)>,
}

fn monitor(weak: Weak<Shared>, ctl: Arc<MonitorCtl>, threshold: Duration) {
    let period = (threshold / 4).clamp(Duration::from_millis(1), Duration::from_millis(250));
    let threshold_ns = u64::try_from(threshold.as_nanos()).unwrap_or(u64::MAX);
    let mut seen: Vec<Seen> = Vec::new();
    let mut park = false;
    loop {
        if !ctl.sleep((!park).then_some(period)) {
            return;
        }
        let Some(sh) = weak.upgrade() else { return };
        if sh.phase.get() >= super::worker::Phase::Done {
            return;
        }
        if park {
            // Nudged: start the episodes afresh.
            seen.clear();
            park = false;
        }
        seen.resize(sh.workers.len(), Seen::default());
        let now = crate::sys::mono_ns();
        let mut running = false;
        for (i, w) in sh.workers.iter().enumerate() {
            let progress = w.progress();
            // `current` outlives the fiber's run (see `enter`): a worker runs it only while
            // it is neither asleep nor undriven.
            let current = if w.is_quiet() {
                0
            } else {
                w.stats.0.current.load(Ordering::Relaxed) as usize
            };
            let s = &mut seen[i];
            if current != 0 && progress == s.progress && current == s.current {
                set_if_changed(&w.stats.0.stuck_since, s.since);
                let tid = w.tid.load(Ordering::Relaxed);
                if s.kernel.is_none() {
                    s.kernel = thread_view::of(tid).map(|v| (v, now));
                }
                let ran = now.saturating_sub(s.since);
                if ran >= threshold_ns && !s.reported {
                    s.reported = true;
                    let kernel = s
                        .kernel
                        .and_then(|(then, at)| Some((then, thread_view::of(tid)?, now - at)));
                    report(&sh, i, Duration::from_nanos(ran), kernel);
                }
            } else {
                set_if_changed(&w.stats.0.stuck_since, 0);
                *s = Seen {
                    progress,
                    current,
                    since: now,
                    reported: false,
                    kernel: None,
                };
            }
            running |= current != 0;
        }
        if !running {
            // Park if every worker sleeps: SeqCst against the workers' wake-up (see
            // `MonitorCtl::nudge`): either we see one awake, or it sees us parked.
            // (`running` is only a hint: a spinning worker counts as quiet here.)
            ctl.parked.store(true, Ordering::SeqCst);
            if sh.workers.iter().all(|w| w.is_quiet()) {
                park = true;
            } else {
                ctl.parked.store(false, Ordering::SeqCst);
            }
        }
    }
}

/// Stores `v` unless it is there already: the worker reads this word after every fiber it
/// runs, and a store would take the line from its cache at every look.
fn set_if_changed(word: &AtomicU64, v: u64) {
    if word.load(Ordering::Relaxed) != v {
        word.store(v, Ordering::Relaxed);
    }
}

/// Reports worker `i`'s fiber, which has held its worker for `ran` without suspending.
/// `kernel`: what the kernel said of the worker's thread at the first stuck look, what it
/// says now, and the wall time between: the report says which of three things happened.
/// - The thread sleeps in a system call: a blocking call that parks the thread, not the
///   fiber; `futex` is a std or parking_lot lock, condvar or channel, whose holder may be a
///   fiber of this very worker.
/// - It ran for less than half of that time, runnable the rest: the OS kept it off its CPU
///   (more runnable threads than cores), not the fiber's doing.
/// - Otherwise the fiber computes.
fn report(sh: &Shared, i: usize, ran: Duration, kernel: Option<(ThreadView, ThreadView, u64)>) {
    let w = &sh.workers[i];
    let Some((id, name, _)) = w.peek() else {
        return;
    };
    let waiting = w.waiting();
    let name = name.as_deref().map_or(String::new(), |n| format!("'{n}' "));
    let ms = ran.as_millis();
    let sched = &sh.config.name;
    let held = format!(
        "fiber {name}({id}) has held worker {i} of scheduler '{sched}' for {ms} ms without \
         suspending; {waiting} task(s) wait on that worker."
    );
    let msg = match kernel {
        Some((_, now, _)) if now.blocked_in.is_some() => {
            let nr = now.blocked_in.unwrap_or(-1);
            let call = thread_view::syscall_name(nr)
                .map_or(format!("system call {nr}"), |n| format!("`{n}`"));
            let advice = if nr == libc::SYS_futex {
                "a std or parking_lot lock, condition variable or channel (or r2d2, \
                 crossbeam-channel) blocks the worker's thread, and its holder may be a \
                 fiber of this very worker, which cannot run until it returns: share state \
                 between fibers with fibra::sync (Mutex, channels, Pool)"
            } else {
                "a blocking call that parks the thread, not the fiber: use fibra's own I/O \
                 (fibra::net, fibra::fs), the hook feature, or fibra::unblock"
            };
            format!("{held} Its thread is blocked in the kernel in {call}: {advice}")
        }
        Some((then, now, wall)) if is_kept_off_cpu(&then, &now, wall) => {
            let ran_ms = now.on_cpu_ns.saturating_sub(then.on_cpu_ns) / 1_000_000;
            format!(
                "{held} Its thread ran only {ran_ms} ms of the last {} ms, the rest waiting for \
                 a CPU: the OS keeps it off its CPU (more runnable threads than cores); the \
                 fiber is not computing that long",
                wall / 1_000_000
            )
        }
        _ => {
            let ran = kernel.map_or(String::new(), |(then, now, wall)| {
                format!(
                    " (its thread ran {} ms of the last {} ms)",
                    now.on_cpu_ns.saturating_sub(then.on_cpu_ns) / 1_000_000,
                    wall / 1_000_000
                )
            });
            format!(
                "{held} It is computing{ran}: move long computations to fibra::unblock, or \
                 call fibra::Fiber::yield_now() in long loops"
            )
        }
    };
    crate::report::warn("watchdog", &msg);
}

/// Whether a thread seen as `then` and `now`, `wall` ns apart, not asleep in a system call,
/// ran for less than half that time: runnable the rest, it waited for a CPU. (The kernel's
/// own wait count, `schedstat`'s second field, grows only when a wait ends, so it cannot
/// tell of a wait still going on.)
fn is_kept_off_cpu(then: &ThreadView, now: &ThreadView, wall: u64) -> bool {
    let ran = now.on_cpu_ns.saturating_sub(then.on_cpu_ns);
    wall > 0 && ran < wall / 2
}
