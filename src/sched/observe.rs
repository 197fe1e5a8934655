//! Reading a running scheduler from outside: what `Scheduler::metrics` (in
//! `crate::metrics`) and `Scheduler::dump` (in `crate::dump`), built on the core, may read
//! of it and ask of its workers.

use super::worker::{DumpRequest, Shared};
use super::Scheduler;
use crate::sched::task::ScheduleTask;
use std::sync::Arc;

impl Scheduler {
    /// The state its workers share, read-only to the observers.
    pub(crate) fn shared(&self) -> &Arc<Shared> {
        &self.shared
    }

    /// Asks every worker to list its fibers for `req` (see `Worker::answer_dump`): a worker
    /// that a thread drives finds the request in its inbox and answers between two fibers;
    /// an undriven `use_caller` worker 0 is read here, under the lock that keeps its thread
    /// from driving it meanwhile.
    pub(crate) fn ask_workers(&self, req: Arc<DumpRequest>) {
        let undriven = self.caller_worker.lock();
        if let Some(w) = undriven.as_ref() {
            w.answer_dump_now(req.clone());
        }
        for (i, w) in self.shared.workers.iter().enumerate() {
            if !(i == 0 && undriven.is_some()) {
                w.inbox.push(ScheduleTask::Dump(req.clone()));
                w.sleep.wake();
            }
        }
    }
}
