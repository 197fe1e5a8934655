//! Shutdown: the phases a scheduler goes through, and what a worker does in each (fail
//! queued tasks, cancel its fibers, abandon those that outlive the grace, exit). The
//! worker's loop catches up with the phase (`run`); the scheduler's handle moves it
//! (`Scheduler::stop`, `stop_timeout`, `Looper::shutdown`). This module touches the worker's
//! queues, registry and timers, and its own `Shared` counters.
//!
//! One state word, [`Phase`], only ever moves forward: `New → Running → Stopping →
//! Discarding → Cancelling → Abandoning → Done`. `live` counts tasks submitted and not yet
//! finished. Each worker remembers the phase it has acted on and catches up, one step at a
//! time, at the top of its loop:
//! - `Stopping` (`stop`): outside submits are refused (fibers may still spawn children while
//!   they finish); a worker exits when `live` reaches zero.
//! - `Discarding` (`Looper::shutdown(false)`): queued tasks that never started are failed
//!   (cancelled) instead of run; started fibers finish.
//! - `Cancelling` (`stop_timeout`'s deadline): unstarted tasks are failed, and every live
//!   fiber is resumed once with a cancellation that unwinds its stack on its home thread.
//!   After that one delivery its waits work as usual, so destructors may flush, sleep or lock.
//! - `Abandoning` (the grace after cancelling ran out): fibers still alive are reported on
//!   stderr, their results set to cancelled, and they are leaked — never resumed, their
//!   stacks never reused — and the worker exits. A worker whose thread did not run during
//!   the whole grace catches up with both phases at once: it resumes its fibers once, each
//!   with its cancellation, before it abandons what is left, so their destructors run.
//!
//! A failed task's result is published inside a fiber (its own, or a fresh one when it never
//! started), so `catching` and `finally` continuations may wait like any fiber code.

use super::{Shared, Worker};
use crate::join::JoinError;
use crate::park::protocol::{wake_at_home, ParkState};
use crate::park::wait_queue::{wait, Wait};
use crate::park::WaitOn;
use crate::sched::task::{Cancel, ScheduleTask, TaskRef};
use std::sync::atomic::{AtomicU8, Ordering};
use std::time::{Duration, Instant};

/// The scheduler's lifecycle, in order; the state only moves forward (see the module docs).
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Debug)]
#[repr(u8)]
pub(crate) enum Phase {
    New = 0,
    Running = 1,
    Stopping = 2,
    Discarding = 3,
    Cancelling = 4,
    Abandoning = 5,
    Done = 6,
}

impl Phase {
    pub(super) fn from_u8(v: u8) -> Phase {
        match v {
            0 => Phase::New,
            1 => Phase::Running,
            2 => Phase::Stopping,
            3 => Phase::Discarding,
            4 => Phase::Cancelling,
            5 => Phase::Abandoning,
            _ => Phase::Done,
        }
    }
}

/// The shared phase word.
pub(crate) struct PhaseWord(pub(super) AtomicU8);

impl PhaseWord {
    pub(super) fn new() -> PhaseWord {
        PhaseWord(AtomicU8::new(Phase::New as u8))
    }

    /// The current phase. SeqCst: `admit` and `stop` order it against the `live` count.
    pub(crate) fn get(&self) -> Phase {
        Phase::from_u8(self.0.load(Ordering::SeqCst))
    }

    /// Moves from `from` to `to` if the phase is `from`; returns whether it did.
    pub(crate) fn advance_from(&self, from: Phase, to: Phase) -> bool {
        debug_assert!(from < to);
        self.0
            .compare_exchange(from as u8, to as u8, Ordering::SeqCst, Ordering::SeqCst)
            .is_ok()
    }

    /// Moves forward to `to` unless the phase is already there or beyond; returns the phase
    /// before.
    pub(crate) fn advance_to(&self, to: Phase) -> Phase {
        Phase::from_u8(self.0.fetch_max(to as u8, Ordering::SeqCst))
    }
}

impl Shared {
    /// Fails a task that never started as cancelled by the shutdown (counted for
    /// `stop_timeout`'s return) and counts it out, on the line of `worker` (see `task_done`).
    pub(crate) fn fail_unstarted(&self, task: TaskRef, worker: Option<usize>) {
        self.cancelled.fetch_add(1, Ordering::Relaxed);
        task.fail(JoinError::cancelled());
        self.task_done(worker);
    }

    /// Waits until no task is alive, or until `deadline`. Returns whether drained.
    ///
    /// Inside a fiber (of another scheduler: this one's own fibers do not wait for the
    /// others) it parks the fiber, which may be cancelled meanwhile; on a thread it blocks.
    pub(crate) fn wait_drained(&self, deadline: Option<Instant>) -> bool {
        loop {
            let g = self.drained.lock();
            if self.live() == 0 {
                return true;
            }
            let r = wait(
                g,
                |list| list,
                (),
                deadline,
                WaitOn::Other("a scheduler's stop"),
                || {},
                |_, _| {},
            );
            if let Wait::TimedOut(_) = r {
                return self.live() == 0;
            }
        }
    }

    /// Wakes whoever waits in `wait_drained` to look at the clock or the phase again.
    pub(crate) fn notify_drained(&self) {
        let mut g = self.drained.lock();
        let (list, wakes) = g.parts();
        list.wake_all(0, wakes);
    }

    /// `stop_timeout`'s deadline passed: every live fiber is to be cancelled once, and
    /// readiness continuations (no fiber to unwind) are dropped here.
    pub(crate) fn begin_cancelling(&self) {
        self.phase.advance_to(Phase::Cancelling);
        if let Some(r) = crate::io::reactor::get() {
            let n = r.cancel_continuations(self);
            self.cancelled.fetch_add(n, Ordering::SeqCst);
        }
        self.wake_all();
        self.notify_drained();
    }

    /// The grace after cancelling ran out: fibers still alive are abandoned.
    pub(crate) fn begin_abandoning(&self) {
        self.phase.advance_to(Phase::Abandoning);
        self.wake_all();
        self.notify_drained();
    }

    /// Asks every worker to print its live fibers on stderr.
    pub(crate) fn request_report(&self) {
        self.report.fetch_add(1, Ordering::SeqCst);
        self.wake_all();
    }
}

impl Worker {
    pub(super) fn should_exit(&self) -> bool {
        let phase = self.shared.phase.get();
        (phase >= Phase::Stopping && self.shared.live() == 0) || phase >= Phase::Abandoning
    }

    /// Pops every queued unstarted task this worker can reach: its own queues and the
    /// injector. Wakes of started fibers found in the inbox go to `ready`.
    fn pop_unstarted(&self) -> Option<TaskRef> {
        while let Some(task) = self.own_shared().inbox.pop() {
            match task {
                ScheduleTask::Start(task) => return Some(task),
                ScheduleTask::Resume(task) => {
                    self.ready.borrow_mut().push_back(task);
                    self.stats().remote_wakes.add(1);
                }
                ScheduleTask::Cancel(task) => self.deliver_cancel(&task),
                ScheduleTask::Dump(req) => self.answer_dump_now(req),
            }
        }
        self.own_shared()
            .local
            .pop()
            .or_else(|| self.own_shared().next.0.take())
            .or_else(|| self.shared.injector.pop(false))
    }

    /// Fails every queued unstarted task this worker can reach (their continuations run in
    /// fibers, see `start_failed`).
    pub(super) fn discard_queued(&self) {
        while let Some(task) = self.pop_unstarted() {
            self.start_failed(task, JoinError::cancelled());
        }
    }

    /// `stop_timeout`'s deadline passed: each live fiber homed here unwinds at its next
    /// resumption — once; a parked one is woken for it.
    pub(super) fn cancel_all(&self) {
        let fibers: Vec<TaskRef> = self.registry.borrow().clone();
        for task in fibers {
            let home = self.home(&*task);
            if home.cancel != Cancel::No {
                continue;
            }
            home.cancel = Cancel::Requested;
            if let Some(gen) = task.header().park.parked() {
                wake_at_home(self, &task, gen);
            }
        }
    }

    /// The grace after cancelling ran out: report the fibers still alive, give their handles
    /// a cancelled result, and leak them — never resumed, their stacks never reused (their
    /// frames may still be borrowed, by a blocking-pool call for instance). Unstarted tasks
    /// are failed without a fiber: this worker is leaving.
    pub(super) fn abandon_all(&self) {
        while let Some(task) = self.pop_unstarted() {
            self.stats().finished.add(1);
            self.shared.fail_unstarted(task, Some(self.index));
        }
        self.ready.borrow_mut().clear();
        self.timer_woken.set(0);
        let fibers = std::mem::take(&mut *self.registry.borrow_mut());
        self.stats().fibers.set(0);
        if fibers.is_empty() {
            return;
        }
        self.report(
            &fibers,
            "abandoning (leaked, never resumed) fibers that did not end after their cancellation",
        );
        for task in fibers {
            let h = task.header();
            // Win the wake of a parked fiber, so no Unparker queues it from now on; one that
            // already won will queue it in an inbox nobody reads, which `keep_alive` allows.
            if let Some(gen) = h.park.parked() {
                h.park.notify(gen);
            }
            let home = self.home(&*task);
            if let Some(id) = home.timer.take() {
                self.timers.borrow_mut().remove(id);
            }
            home.keep_alive = Some(self.shared.clone());
            // Leaked, so nothing on its stack runs or is dropped, on any thread.
            if let Some(coro) = home.fiber.take() {
                std::mem::forget(coro);
            }
            self.shared.cancelled.fetch_add(1, Ordering::Relaxed);
            task.fail(JoinError::abandoned());
            self.stats().finished.add(1);
            self.shared.task_done(Some(self.index));
        }
        self.publish_gauges();
    }

    /// Prints this worker's live fibers (a shutdown that takes long).
    pub(super) fn report_live(&self, what: &str) {
        let fibers = self.registry.borrow().clone();
        if !fibers.is_empty() {
            self.report(&fibers, what);
        }
    }

    fn report(&self, fibers: &[TaskRef], what: &str) {
        use std::fmt::Write;
        let mut msg = format!(
            "fibra: scheduler '{}', worker {}: {what}:\n",
            self.shared.config.name, self.index
        );
        for task in fibers {
            let h = task.header();
            let state = match h.park.state() {
                ParkState::Parked => "parked",
                ParkState::Notified | ParkState::Running => "ready",
            };
            let _ = writeln!(
                msg,
                "  fiber '{}' ({}): {state}",
                h.name.as_deref().unwrap_or("<unnamed>"),
                h.id
            );
        }
        eprint!("{msg}");
    }

    /// Abandons worker 0 of a `use_caller` scheduler from the thread stopping it, which is
    /// not the building thread, so cannot run it (see `abandon_all`).
    pub(crate) fn abandon_from_outside(&self) {
        self.phase.set(Phase::Abandoning);
        self.abandon_all();
    }
}

/// Fails the tasks queued for worker `index`, which is `absent` (its thread never started,
/// and never will), from whichever thread finds them: the shutdown that marked it, and a
/// submit that queued a task for it and then saw the mark (so that a task queued while the
/// shutdown drained is not left behind). No fiber ever started there, so there is none to
/// wake or cancel; a dump gets an empty answer.
pub(crate) fn fail_queued_of_absent(shared: &Shared, index: usize) {
    let worker = &shared.workers[index];
    debug_assert!(worker.absent.load(Ordering::Relaxed));
    loop {
        let task = match worker.inbox.pop() {
            Some(ScheduleTask::Start(task)) => task,
            Some(ScheduleTask::Dump(req)) => {
                req.answer(index, Vec::new(), Duration::ZERO, Duration::ZERO);
                continue;
            }
            Some(ScheduleTask::Resume(_) | ScheduleTask::Cancel(_)) => continue,
            None => match worker.local.pop().or_else(|| worker.next.0.take()) {
                Some(task) => task,
                None => return,
            },
        };
        shared.fail_unstarted(task, Some(index));
    }
}

/// Fails the tasks of the shared injector, from a shutdown that found no worker to take
/// them (see `Scheduler::spawn_workers_for_shutdown`).
pub(crate) fn fail_injected(shared: &Shared) {
    while let Some(task) = shared.injector.pop(false) {
        shared.fail_unstarted(task, None);
    }
}
