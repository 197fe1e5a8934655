//! The worker loop: `Worker::run`, one pass of it (`next_task`, the order in which a worker
//! looks at its queues), the chores of every few passes (timers, I/O, the gauges, the
//! dump in progress), and the loop's catch-up with the shutdown phase. It calls into every
//! other concern of the worker; only the choice of what runs next is made here.
//!
//! # One pass of the loop
//! Catch up with the shutdown phase if it moved. Then `next_task`: every `TIMER_INTERVAL`
//! ticks fire due timers, every `IO_POLL_INTERVAL` ticks take a non-blocking look at I/O,
//! every `INJECTOR_INTERVAL` ticks and after every yield take from the injector first (so
//! outside work cannot starve, and a yield goes behind it); then `next` (up to a streak) →
//! inbox → ready/local (alternating, so yielding fibers and new tasks share the thread) →
//! `next` again → due timers → injector → steal half of a peer's `local`. Nothing found:
//! `idle`.

use super::lifecycle::ResumeRef;
use super::queues::REBALANCE_AFTER;
use super::shutdown::Phase;
use super::{Worker, CURRENT_WORKER};
use crate::fiber::{self, FiberMeta};
use crate::sched::task::{ScheduleTask, TaskRef};
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

/// Every this many ticks a worker takes from the injector before its own queues.
const INJECTOR_INTERVAL: u32 = 61;
/// Every this many ticks a busy worker checks its timers.
const TIMER_INTERVAL: u32 = 16;
/// How many fibers whose timers are due a worker wakes at a time, the next batch once those
/// have run, while fewer other fibers are ready (see `fire_timers`). Waking all of a large
/// burst of due timers first (thousands of sleeps expiring together) delays the first
/// resumption by a miss or two on every fiber's header, and prefetches more stacks than the
/// cache holds, so the first are evicted again before their fiber runs. Firing a few at a
/// time, with their stacks prefetched, wakes due sleepers sooner than either all at once or
/// one at a time.
const FIRE_BATCH: usize = 8;
/// Every this many ticks (a multiple of `TIMER_INTERVAL`) a worker publishes its gauges
/// (the ready queue's and the stack cache's sizes).
const GAUGE_INTERVAL: u32 = 64;
/// After a yield, the least loaded worker takes a task from the injector first at every
/// yield while at most this many fibers are ready on it, at every other one beyond (see
/// `next_task`).
pub(crate) const YIELD_PULL_READY_MAX: usize = 8;
/// How many tasks in a row a worker takes from its `next` slot before looking elsewhere.
const MAX_NEXT_STREAK: u32 = 3;
/// Every this many ticks a busy worker takes a non-blocking look at I/O readiness, while
/// fibers wait for I/O and no idle worker is polling.
const IO_POLL_INTERVAL: u32 = 61;

impl Worker {
    /// Handles I/O readiness that is already there, without blocking: of this worker's own
    /// epoll instance if its fibers wait there, and of the shared one if fds there are
    /// waited for and no worker is blocked in its `epoll_wait` already.
    pub(super) fn poll_io_now(&self) {
        let Some(reactor) = crate::io::reactor::get() else {
            return;
        };
        if let Some(home) = self.own_shared().sleep.home_waited() {
            home.poll(reactor, Some(Duration::ZERO), false);
        }
        if reactor.has_waiters() && reactor.try_begin_poll() {
            reactor.poll(Some(Duration::ZERO));
            reactor.end_poll();
        }
    }
}

/// Restores `CURRENT_WORKER` when a drive ends, even by unwinding, and counts the drive's
/// time.
struct ExitWorker<'a>(*const Worker, &'a Worker, *const FiberMeta);

impl Drop for ExitWorker<'_> {
    fn drop(&mut self) {
        CURRENT_WORKER.with(|c| c.set(self.0));
        fiber::leave(self.2);
        // This thread no longer polls for anyone: make sure somebody does.
        if let Some(reactor) = crate::io::reactor::get() {
            reactor.hand_off();
        }
        let st = self.1.stats();
        // Until the next drive, the last fiber may end elsewhere (abandoned) or its worker
        // be dropped: nobody may read it through `current` any more.
        self.1.own_shared().watch.retire(&st.current);
        st.update_times(|st| {
            let since = st.run_since.get();
            st.run_ns.add(crate::sys::mono_ns().saturating_sub(since));
            st.run_since.set_seqcst(0);
        });
    }
}

impl Worker {
    /// Runs the loop until `until()` holds or the scheduler has shut down. `wake_at` bounds
    /// every sleep, for a caller that must look at the clock (`stop_timeout` on worker 0).
    pub(crate) fn run(&self, until: &impl Fn() -> bool, wake_at: Option<Instant>) {
        let prev = CURRENT_WORKER.with(|c| c.replace(self));
        // Driven from a standalone fiber (`use_caller`'s `block_on` in one): the loop is
        // worker code, not that fiber's; it is the current fiber again when the loop ends.
        let outer = fiber::leave_all();
        let _restore = ExitWorker(prev, self, outer);
        // The tokio runtime's context, for the whole drive: every fiber may make, poll and
        // drop tokio futures anywhere (a guard per poll, held by fibers that interleave on
        // this thread, would be dropped out of order).
        #[cfg(feature = "tokio")]
        let _tokio = self.shared.config.tokio.as_ref().map(|h| h.enter());
        crate::stack::overflow::ensure_alt_stack(false);
        self.own_shared().tid.store(
            crate::sys::thread_view::gettid(),
            std::sync::atomic::Ordering::Relaxed,
        );
        self.stats()
            .update_times(|st| st.run_since.set_seqcst(crate::sys::mono_ns().max(1)));
        self.shared.monitor.nudge();
        loop {
            if until() {
                return;
            }
            if self.shutdown_pending() {
                self.catch_up();
                if self.phase.get() >= Phase::Abandoning {
                    return;
                }
            }
            if let Some(task) = self.next_task() {
                self.run_task(task);
                continue;
            }
            if self.should_exit() {
                return;
            }
            self.idle(until, wake_at);
        }
    }

    /// Whether the shutdown phase moved past what this worker acted on. (A report request is
    /// looked at only on the way to sleep: it comes from a shutdown waiting for idle workers,
    /// and the busy loop should not load one more shared word per task.)
    #[inline]
    pub(super) fn shutdown_pending(&self) -> bool {
        Phase::from_u8(self.shared.phase.0.load(Ordering::Relaxed)) > self.phase.get()
    }

    pub(super) fn report_pending(&self) -> bool {
        self.shared.report.load(Ordering::Relaxed) != self.reported.get()
    }

    /// Acts on every shutdown phase this worker has not acted on yet, in order.
    pub(super) fn catch_up(&self) {
        let report = self.shared.report.load(Ordering::SeqCst);
        if report != self.reported.get() {
            self.reported.set(report);
            self.report_live("still alive");
        }
        let target = self.shared.phase.get();
        while self.phase.get() < target.min(Phase::Abandoning) {
            let next = Phase::from_u8(self.phase.get() as u8 + 1);
            self.phase.set(next);
            match next {
                Phase::Discarding => self.discard_queued(),
                Phase::Cancelling => {
                    self.discard_queued();
                    self.cancel_all();
                    if target >= Phase::Abandoning {
                        // This worker comes late (its thread did not run during the whole
                        // grace): its fibers still get their cancellation, once, before
                        // they are abandoned, so their destructors run.
                        self.deliver_cancellations_now();
                    }
                }
                Phase::Abandoning => self.abandon_all(),
                _ => {}
            }
        }
    }

    /// Resumes, once each, the fibers queued on this worker now (those `cancel_all` just
    /// woke, and those already ready), so that each gets its cancellation before the
    /// worker abandons what is left. Woken ones queued meanwhile wait for the abandon.
    fn deliver_cancellations_now(&self) {
        let queued: Vec<TaskRef> = self.ready.borrow_mut().drain(..).collect();
        for task in queued {
            self.resume(ResumeRef::Counted(task));
        }
        // What is in the inbox now, not what other threads keep sending.
        for _ in 0..self.own_shared().inbox.len() {
            let Some(task) = self.pop_inbox() else {
                break;
            };
            self.run_task(task);
        }
    }

    #[inline(always)]
    fn next_task(&self) -> Option<ScheduleTask> {
        let tick = self.tick.get().wrapping_add(1);
        self.tick.set(tick);
        self.own_shared().progress.0.store(tick, Ordering::Relaxed);
        // A yield goes behind outside submissions too, on the least loaded worker (see
        // `least_loaded`); with many fibers ready, at every other yield, so that they keep
        // running while a stream of submissions lasts.
        if self.yielded.replace(false)
            && !self.shared.injector.is_empty()
            && (tick & 1 == 0 || self.ready.borrow().len() <= YIELD_PULL_READY_MAX)
            && self.least_loaded()
        {
            if let Some(task) = self.take_injected() {
                return Some(ScheduleTask::Start(task));
            }
        }
        if tick.is_multiple_of(TIMER_INTERVAL) {
            self.fire_timers();
            self.every_few_passes(tick);
        } else {
            if self.timers_capped.get() {
                self.fire_timers();
            }
            if self.dumps.active() {
                // A dump in progress takes a chunk at every pass, so that a worker running
                // fibers that each take a while still answers within a few of them per chunk.
                self.dump_step();
            }
        }
        if tick.is_multiple_of(IO_POLL_INTERVAL) {
            self.poll_io_now();
        }
        if tick.is_multiple_of(INJECTOR_INTERVAL)
            && (tick.is_multiple_of(4 * INJECTOR_INTERVAL) || self.least_loaded())
        {
            if let Some(task) = self.take_injected() {
                return Some(ScheduleTask::Start(task));
            }
        }
        if self.next_streak.get() < MAX_NEXT_STREAK {
            if let Some(task) = self.pop_next() {
                self.next_streak.set(self.next_streak.get() + 1);
                return Some(ScheduleTask::Start(task));
            }
        }
        self.next_streak.set(0);
        if let Some(task) = self.pop_inbox() {
            return Some(task);
        }
        let from_ready = || {
            self.ready
                .borrow_mut()
                .pop_front()
                .map(ScheduleTask::Resume)
        };
        let from_local = || self.pop_own_local().map(ScheduleTask::Start);
        let local = if tick & 1 == 0 {
            from_ready().or_else(from_local)
        } else {
            from_local().or_else(from_ready)
        };
        if local.is_some() {
            return local;
        }
        if let Some(task) = self.pop_next() {
            return Some(ScheduleTask::Start(task));
        }
        if self.fire_timers() {
            return self
                .ready
                .borrow_mut()
                .pop_front()
                .map(ScheduleTask::Resume);
        }
        self.dry_tick.set(tick);
        self.take_injected()
            .map(ScheduleTask::Start)
            .or_else(|| self.steal())
    }

    /// The chores of every `TIMER_INTERVAL`-th pass: the next chunk of a dump in progress
    /// (the other passes take one too), every `GAUGE_INTERVAL` ticks the gauges, and the look for a
    /// peer waiting for this worker's CPU (`cede_cpu`).
    #[inline]
    fn every_few_passes(&self, tick: u32) {
        if self.dumps.active() {
            self.dump_step();
        }
        if tick.is_multiple_of(GAUGE_INTERVAL) {
            self.publish_gauges();
        }
        if self.shared.workers.len() > 1 {
            if tick.wrapping_sub(self.dry_tick.get()) >= REBALANCE_AFTER {
                self.rebalance();
            }
            self.cede_cpu();
        }
    }

    #[inline]
    pub(super) fn run_task(&self, task: ScheduleTask) {
        match task {
            ScheduleTask::Start(task) => self.start(task),
            ScheduleTask::Resume(task) => self.resume(ResumeRef::Counted(task)),
            ScheduleTask::Cancel(task) => self.deliver_cancel(&task),
            ScheduleTask::Dump(req) => self.answer_dump(req),
        }
    }

    /// Wakes fibers whose deadline has passed; returns whether any woke. It wakes them
    /// [`FIRE_BATCH`] at a time, the next batch once the last has been resumed, leaving the
    /// rest due for later passes of the loop (see `timers_capped`; an idle pass does not
    /// sleep while a timer is due), unless as many other fibers are ready: then every due
    /// one is woken, to wait its turn behind them as every other wake does.
    fn fire_timers(&self) -> bool {
        if self.timers.borrow().is_empty() {
            self.timers_capped.set(false);
            return false;
        }
        let ready = self.ready.borrow().len();
        // Each one counted is in `ready` until it is resumed (and uncounted, in `resume`).
        debug_assert!(self.timer_woken.get() <= ready);
        // Never more than are ready, whatever happens: with none ready, a batch is due.
        let queued = self.timer_woken.get().min(ready);
        let others = ready - queued;
        let limit = if others >= FIRE_BATCH {
            usize::MAX
        } else if queued == 0 {
            FIRE_BATCH
        } else {
            0
        };
        if limit == 0 {
            self.timers_capped.set(true);
            return false;
        }
        let now = Instant::now();
        let mut woken = 0;
        while woken < limit {
            let due = self.timers.borrow_mut().pop_due(now);
            let Some((task, gen)) = due else { break };
            let home = self.home(&*task);
            // The timer is gone, so the resumption must not cancel it again.
            home.timer = None;
            if task.header().park.notify(gen) {
                // The resumption tells the fiber its park timed out.
                home.timed_out = true;
                // Start bringing the stack in now, so that resuming the batch does not wait
                // for one miss after another.
                crate::stack::prefetch_near(home.meta.suspended_at.get());
                self.push_woken(task);
                woken += 1;
            }
        }
        self.timer_woken.set(queued + woken);
        self.timers_capped.set(woken == limit);
        self.stats().timers.set(self.timers.borrow().len() as u64);
        woken > 0
    }
}
