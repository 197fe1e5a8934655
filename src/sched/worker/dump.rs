//! Answering `Scheduler::dump`: a worker lists its live fibers for a `DumpRequest`, a chunk
//! of them per pass of its loop, and sends the list when it is complete. It reads this
//! worker's registry and its fibers' home-only state, and touches nothing else.

use super::Worker;
use crate::dump::{DumpRequest, Entry, Status};
use crate::park::protocol::ParkState;
use crate::sched::task::Cancel;
use std::cell::{Cell, RefCell};
use std::sync::Arc;
use std::time::Duration;

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
        for job in registry[bottom..top].iter().rev() {
            let h = job.header();
            let home = self.home(&**job);
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
