//! Answering `Scheduler::dump`: a worker lists its live fibers for a `DumpRequest`, a chunk
//! of them per pass of its loop, and sends the list when it is complete. It reads this
//! worker's registry and its fibers' home-only state, and touches nothing else.
//!
//! Here is what the workers produce — the request they answer, the [`Entry`] of each fiber
//! and its [`Status`] — and nothing of the dump itself: the public `Dump`, its `Display` and
//! `Scheduler::dump`, which asks the workers and waits for their answers, are
//! `crate::dump`'s, built on this.

use super::Worker;
use crate::fiber::FiberId;
use crate::park::protocol::ParkState;
use crate::park::WaitOn;
use crate::sched::task::Cancel;
use std::cell::{Cell, RefCell};
use std::panic::Location;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// A dump in progress: what the workers answer to.
pub(crate) struct DumpRequest {
    /// The fiber taking the dump, if it is one (it is listed as running).
    pub(crate) requester: Option<FiberId>,
    /// Takes each worker's answer to the dump taking it (`Scheduler::dump`, in
    /// `crate::dump`, gives a channel's sender).
    answers: Box<dyn Fn(Answer) + Send + Sync>,
}

/// A worker's answer: its index, its fibers, its longest pause and its total time.
pub(crate) type Answer = (usize, Vec<Entry>, Duration, Duration);

impl DumpRequest {
    pub(crate) fn new(
        requester: Option<FiberId>,
        answers: impl Fn(Answer) + Send + Sync + 'static,
    ) -> DumpRequest {
        DumpRequest {
            requester,
            answers: Box::new(answers),
        }
    }

    /// Worker `index`'s fibers, listed in pauses of at most `pause`, `work` in all. A late
    /// answer, after the dump gave up waiting, is dropped.
    pub(crate) fn answer(
        &self,
        index: usize,
        entries: Vec<Entry>,
        pause: Duration,
        work: Duration,
    ) {
        (self.answers)((index, entries, pause, work));
    }
}

/// A fiber's state in a [`Dump`](crate::dump::Dump).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Status {
    /// Running on its worker: the fiber that took the dump, or one its worker is stuck in.
    Running,
    /// Ready to run (yielded, or woken and not resumed yet).
    Ready,
    /// Suspended until something wakes it.
    Parked(WaitOn),
}

/// One live fiber in a [`Dump`](crate::dump::Dump).
#[derive(Clone, Debug)]
pub struct Entry {
    pub(crate) id: FiberId,
    pub(crate) name: Option<Arc<str>>,
    pub(crate) worker: usize,
    pub(crate) status: Status,
    pub(crate) for_: Option<Duration>,
    pub(crate) deadline: Option<Instant>,
    pub(crate) location: &'static Location<'static>,
    pub(crate) cancelled: bool,
}

impl Entry {
    /// The fiber's id.
    pub fn id(&self) -> FiberId {
        self.id
    }

    /// Its name, if it was given one.
    pub fn name(&self) -> Option<&str> {
        self.name.as_deref()
    }

    /// The worker it lives on.
    pub fn worker(&self) -> usize {
        self.worker
    }

    /// Running, ready, or parked on what.
    pub fn status(&self) -> Status {
        self.status
    }

    /// How long it has been in its status: parked since it parked; running for at least
    /// this long (known only when the watchdog watches its worker); `None` for a ready
    /// fiber. The park is stamped from the coarse monotonic clock, read at the park:
    /// accurate to a few milliseconds (the kernel's tick).
    pub fn duration(&self) -> Option<Duration> {
        self.for_
    }

    /// When its park times out (a sleep's end, a timed wait's deadline), if it does.
    pub fn deadline(&self) -> Option<Instant> {
        self.deadline
    }

    /// Where the task was submitted (the caller of `submit`, `spawn`, …).
    pub fn location(&self) -> &'static Location<'static> {
        self.location
    }

    /// Whether it has been cancelled (it is unwinding, or will at its next resumption).
    pub fn is_cancelled(&self) -> bool {
        self.cancelled
    }
}

/// How many fibers a worker lists for a dump per chunk (one chunk every `TIMER_INTERVAL`
/// passes, or whenever it is idle): about 0.1 ms of work.
const DUMP_CHUNK: usize = 1024;

/// A dump this worker is answering.
struct PartialDump {
    req: Arc<DumpRequest>,
    /// Registry slots below this are still to be listed.
    cursor: usize,
    entries: Vec<Entry>,
    /// The longest chunk and all chunks together, in ns.
    longest: u64,
    total: u64,
}

/// The dumps a worker is answering, oldest first, and whether there are any (looked at
/// every pass, so a flag rather than the vector's length behind its `RefCell`).
#[derive(Default)]
pub(super) struct DumpsInProgress {
    list: RefCell<Vec<PartialDump>>,
    active: Cell<bool>,
}

impl DumpsInProgress {
    /// Whether a dump is being answered.
    #[inline(always)]
    pub(super) fn active(&self) -> bool {
        self.active.get()
    }
}

impl Worker {
    /// Starts listing this worker's fibers for a dump. The list is made `DUMP_CHUNK` fibers
    /// at a time, one chunk per pass of the loop (see `dump_step`), so a worker with many
    /// fibers never stops its fibers for long.
    pub(crate) fn answer_dump(&self, req: Arc<DumpRequest>) {
        let cursor = self.registry.borrow().len();
        self.dumps.list.borrow_mut().push(PartialDump {
            req,
            cursor,
            entries: Vec::with_capacity(cursor),
            longest: 0,
            total: 0,
        });
        self.dumps.active.set(true);
        self.dump_step();
    }

    /// Lists the next chunk of fibers for the oldest dump in progress; sends the list when
    /// it is complete. The registry is walked from its end: a fiber that ends meanwhile is
    /// replaced in its slot by the last one (already listed), so a fiber alive all along is
    /// listed at least once, and the dump drops the duplicates.
    pub(super) fn dump_step(&self) {
        let start = crate::sys::mono_ns();
        let mut dumps = self.dumps.list.borrow_mut();
        let Some(d) = dumps.first_mut() else {
            self.dumps.active.set(false);
            return;
        };
        let registry = self.registry.borrow();
        let top = d.cursor.min(registry.len());
        let bottom = top.saturating_sub(DUMP_CHUNK);
        for task in registry[bottom..top].iter().rev() {
            let h = task.header();
            let home = self.home(&**task);
            let parked = h.park.state() == ParkState::Parked;
            let status = if d.req.requester == Some(h.id) {
                Status::Running
            } else if parked {
                Status::Parked(home.meta.wait.get())
            } else {
                Status::Ready
            };
            // Only a park is stamped (a yield is not: it is too frequent to pay for).
            let for_ = (parked && status != Status::Running && home.since != 0)
                .then(|| Duration::from_nanos(start.saturating_sub(home.since)));
            d.entries.push(Entry {
                id: h.id,
                name: h.name.clone(),
                worker: self.index,
                status,
                for_,
                deadline: if parked { home.deadline } else { None },
                location: h.location,
                cancelled: home.cancel != Cancel::No,
            });
        }
        drop(registry);
        d.cursor = bottom;
        let took = crate::sys::mono_ns().saturating_sub(start);
        d.longest = d.longest.max(took);
        d.total += took;
        if bottom == 0 {
            let d = dumps.remove(0);
            self.dumps.active.set(!dumps.is_empty());
            drop(dumps);
            d.req.answer(
                self.index,
                d.entries,
                Duration::from_nanos(d.longest),
                Duration::from_nanos(d.total),
            );
        }
    }

    /// Lists this worker's fibers all at once, for a dump made while no thread drives it
    /// (`use_caller`'s worker 0) or while it shuts down.
    pub(crate) fn answer_dump_now(&self, req: Arc<DumpRequest>) {
        self.answer_dump(req);
        while self.dumps.active() {
            self.dump_step();
        }
    }
}
