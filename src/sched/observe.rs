//! Reading a running scheduler from outside: what `Scheduler::metrics` (in
//! `crate::metrics`) and `Scheduler::dump` (in `crate::dump`), built on the core, may read
//! of it and ask of its workers.

use super::worker::{DumpRequest, Shared};
use super::Scheduler;
use crate::metrics::{Metrics, WorkerMetrics};
use crate::sched::task::ScheduleTask;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

impl Scheduler {
    /// The state its workers share, read-only to the observers.
    pub(crate) fn shared(&self) -> &Shared {
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

impl Scheduler {
    /// A snapshot of the scheduler's figures: tasks, stacks, I/O, timers, the blocking pool,
    /// and per worker its counters (resumes, yields, parks, wakes, steals, sleeps, busy time)
    /// and queue depths. See [`Metrics`].
    ///
    /// Cheap (a few hundred nanoseconds per worker) and callable from anywhere, a fiber of
    /// this scheduler included; the workers count in memory of their own, so watching costs
    /// them nothing.
    pub fn metrics(&self) -> Metrics {
        metrics(&self.shared)
    }
}

/// Reads the figures of the scheduler behind `sh`.
pub(crate) fn metrics(sh: &Shared) -> Metrics {
    let now = crate::sys::mono_ns();
    let workers: Vec<WorkerMetrics> = sh
        .workers
        .iter()
        .enumerate()
        .map(|(index, w)| {
            let st = &w.stats.0;
            // Closed intervals plus the one in progress (a start of 0: none).
            let open = |since: u64| {
                if since == 0 {
                    0
                } else {
                    now.saturating_sub(since)
                }
            };
            let run = st.run_ns.get() + open(st.run_since.get());
            let slept = st.slept_ns.get() + open(st.asleep_since.get());
            WorkerMetrics {
                index,
                resumes: st.returned.get() + st.yields.get() + st.parks.get(),
                yields: st.yields.get(),
                parks: st.parks.get(),
                local_wakes: st.local_wakes.get(),
                remote_wakes: st.remote_wakes.get(),
                steals: st.steals.get(),
                injected: st.injected.get(),
                cedes: st.cedes.get(),
                sleeps: st.sleeps.get(),
                slept: Duration::from_nanos(slept),
                busy: Duration::from_nanos(run.saturating_sub(slept)),
                finished: st.finished.get(),
                fibers: st.fibers.get() as usize,
                ready: st.ready.get() as usize,
                inbox: w.inbox.len(),
                local: w.local.len(),
                next: w.next.0.len(),
                timers: st.timers.get() as usize,
                stacks_cached: st.stacks_cached.get() as usize,
            }
        })
        .collect();
    let finished: u64 = workers.iter().map(|w| w.finished).sum();
    let live_tasks = sh.live();
    let continuations = sh.continuations.load(Ordering::SeqCst).min(live_tasks);
    let stacks = crate::stack_stats();
    let stack_mappings = if stacks.guard.starts_with("madvise") {
        stacks.slabs
    } else {
        stacks.slabs + 2 * stacks.stacks_carved
    };
    let (io_registrations, io_waiting) = crate::io::reactor::counts();
    let (blocking_threads, blocking_busy, blocking_queued) = crate::unblock::pool_stats();
    Metrics {
        name: sh.config.name.clone(),
        uptime: sh.epoch.elapsed(),
        live_tasks,
        continuations,
        // A pending continuation has not become a task yet.
        spawned: finished + (live_tasks - continuations) as u64,
        injector: sh.injector.len(),
        stack_size: sh.config.stack_size,
        stacks_free: stacks.stacks_free,
        stacks_spare: crate::stack::spare_count(),
        stacks_carved: stacks.stacks_carved,
        stack_slabs: stacks.slabs,
        stack_reserved_bytes: stacks.reserved_bytes,
        stack_mappings,
        io_registrations,
        io_waiting,
        blocking_threads,
        blocking_busy,
        blocking_queued,
        workers,
    }
}
