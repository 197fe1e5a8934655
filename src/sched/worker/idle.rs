//! The worker's side of the idle protocol: what a worker does when its pass found nothing to
//! run. It answers a peer's request for help, spins looking for work, announces itself idle,
//! looks once more, trims spare memory and sleeps (on its futex, or in `epoll_wait` when no
//! other worker polls for I/O). The protocol's shared half — the idle set, the spinner
//! count, a worker's sleep — is `crate::sched::idle`; this module touches those through
//! their methods, and this worker's queues, timers and stack pool.
//!
//! With nothing to do a worker *spins* for `SPIN_FOR` (at most half the workers spin at
//! once), looking at its inbox, the injector and its peers. Then it announces itself in the
//! `IdleSet`, issues a SeqCst fence, looks once more, and sleeps on its futex (or in
//! `epoll_wait`, if no other worker polls for I/O) until the next timer deadline, or
//! indefinitely. A submitter pushes, fences, and wakes one idle worker only if nobody is
//! spinning — the fences on both sides make sure that either the submitter sees the idle
//! worker or the worker sees the work (Go's protocol). Pinned work and fiber wakes unpark
//! their target worker directly. There is no periodic polling: an idle scheduler sleeps.

use super::help::HelpAnswer;
use super::Worker;
use crate::sched::task::ScheduleTask;
use std::time::{Duration, Instant};

/// An idle worker releases burst stacks only if no timer is due within this long.
const TRIM_QUIET: Duration = Duration::from_millis(50);
/// How many idle stacks a worker releases per sleep, and how long it sleeps between batches.
const TRIM_BATCH: usize = 64;
const TRIM_PAUSE: Duration = Duration::from_millis(5);
/// Empty slabs of task cells (2 MiB each) an idle worker unmaps at a time.
const TRIM_SLABS: usize = 8;
/// How long an idle worker looks for work before it sleeps: for the first `PAUSE_FOR` with a
/// short pause between looks, so work a busy peer queues is taken within a microsecond or two
/// (before the peer gets to it itself), then yielding the thread between looks.
const SPIN_FOR: Duration = Duration::from_micros(50);
/// The pausing part of `SPIN_FOR`, kept short: a pausing worker holds its CPU, and the
/// thread it has just woken (the joiner of the task it finished, on a plain thread; the peer
/// it asked for help) is often queued on that very CPU, which the kernel does not leave for
/// an idle one that fast. There it waits until the pausing ends: where the two shared a CPU,
/// a plain thread's spawn and join of an empty task took 27 µs with half of `SPIN_FOR`
/// pausing, and takes 7 with this (about 1 where they do not). Not pausing at all would
/// yield to whatever else runs on the CPU at every look, and a server sharing its CPUs with
/// its load generator lost requests that way.
const PAUSE_FOR: Duration = Duration::from_micros(5);
/// Pause instructions between two looks of a spinning worker.
const SPIN_PAUSES: u32 = 32;

impl Worker {
    /// Whether there is anything this worker could run right now.
    fn has_work(&self) -> bool {
        let sh = &self.shared;
        !self.own_shared().inbox.is_empty()
            || !self.ready.borrow().is_empty()
            || !sh.injector.is_empty()
            || !self.own_shared().next.0.is_empty()
            || sh.workers.iter().any(|w| !w.local.is_empty())
            || self
                .timers
                .borrow()
                .next_deadline()
                .is_some_and(|d| d <= Instant::now())
    }

    /// Nothing found to run: spin for a while, then announce this worker idle and sleep
    /// until there is work, a timer is due, or `wake_at` (see the module docs).
    pub(super) fn idle(&self, until: &dyn Fn() -> bool, wake_at: Option<Instant>) {
        let sh = &self.shared;
        if self.dumps.active() {
            // Nothing else to do: list the next chunk of the dump in progress.
            self.dump_step();
            return;
        }
        if self.report_pending() {
            self.catch_up();
        }
        self.poll_io_now();
        if !self.ready.borrow().is_empty() || !self.own_shared().inbox.is_empty() {
            return;
        }
        let (answered, answer_at) = match self.answer_help_request() {
            HelpAnswer::Taken(task) => {
                self.stats().steals.add(1);
                self.run_task(task);
                return;
            }
            HelpAnswer::Wait(at, v) => (true, Some((at, v))),
            HelpAnswer::Stale => (true, None),
            HelpAnswer::None => (false, None),
        };
        // A request for help means the peers are busy with work they keep to themselves (a
        // chain of spawns, say): spinning would only slow them down. Sleep.
        if !answered && sh.idle.try_spin(self.index) {
            let mut watch = None;
            let start = Instant::now();
            // Timers fire exactly: a deadline within the spin ends it (then `has_work`).
            let due = self.timers.borrow().next_deadline();
            loop {
                let found = self
                    .pop_inbox()
                    .or_else(|| self.take_injected().map(ScheduleTask::Start))
                    .or_else(|| self.steal())
                    .or_else(|| self.steal_next(&mut watch));
                if let Some(task) = found {
                    let last_spinner = sh.idle.stop_spinning(self.index);
                    if last_spinner && !sh.injector.is_empty() {
                        // More shared work than one worker: get another one looking.
                        sh.notify_one();
                    }
                    self.run_task(task);
                    return;
                }
                let spun = start.elapsed();
                if spun >= SPIN_FOR || due.is_some_and(|d| start + spun >= d) {
                    break;
                } else if spun < PAUSE_FOR {
                    for _ in 0..SPIN_PAUSES {
                        std::hint::spin_loop();
                    }
                } else {
                    std::thread::yield_now();
                }
            }
            sh.idle.stop_spinning(self.index);
        }
        sh.idle.announce(self.index);
        if self.has_work()
            || until()
            || self.should_exit()
            || self.shutdown_pending()
            || self.report_pending()
        {
            sh.idle.withdraw(self.index);
            return;
        }
        let now = Instant::now();
        let mut deadline = match (self.timers.borrow().next_deadline(), wake_at) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        // A peer's request for help may have missed this worker's announcement (see
        // `Idlers::to_help`): ask on its behalf, and answer after a nap.
        let watched = answer_at.or_else(|| self.ask_help_for_peer());
        if let Some((answer_at, _)) = watched {
            deadline = Some(deadline.map_or(answer_at, |d| d.min(answer_at)));
        }
        // Give burst memory back only when truly idle (no timer due soon), a batch at a time,
        // coming back for the next batch after a pause: trimming never delays due work. This
        // worker's own excess first, then spare stacks (any worker's) once none has gone in
        // or out of the spare list for as long: a peer may be in the middle of a burst. The
        // empty slabs of task cells likewise.
        if deadline.is_none_or(|d| d > now + TRIM_QUIET) {
            let stacks = if self.stacks.borrow_mut().trim(TRIM_BATCH) {
                Some(TRIM_PAUSE)
            } else {
                crate::stack::trim_spare(TRIM_BATCH, TRIM_QUIET).map(|w| w.max(TRIM_PAUSE))
            };
            let cells =
                crate::sched::cell::trim_slabs(TRIM_SLABS, TRIM_QUIET).map(|w| w.max(TRIM_PAUSE));
            let again = match (stacks, cells) {
                (Some(a), Some(b)) => Some(a.min(b)),
                (a, b) => a.or(b),
            };
            if let Some(wait) = again {
                let again = now + wait;
                deadline = Some(deadline.map_or(again, |d| d.min(again)));
            }
        }
        let timeout = deadline.map(|d| d.saturating_duration_since(now));
        if timeout.is_none_or(|t| !t.is_zero()) {
            self.publish_gauges();
            let _held = watched.and_then(|(_, peer)| self.hold_apart_from(peer));
            let mut before = 0;
            self.stats().update_times(|st| {
                before = crate::sys::mono_ns();
                st.asleep_since.set(before);
            });
            let sleep = &self.own_shared().sleep;
            // Fibers of this worker wait for fds in its own epoll instance: it sleeps there,
            // so that the kernel wakes it for their readiness (see `crate::io::home`).
            let home = sleep.home_waited();
            match crate::io::reactor::get() {
                // Nobody polls the shared instance, and this worker need not watch its own
                // or fds in the shared one are waited for: this worker polls the shared one,
                // sleeping in epoll_wait there (at home, with the shared one nested, if it
                // must watch both).
                Some(reactor)
                    if (home.is_none() || reactor.has_waiters()) && reactor.try_begin_poll() =>
                {
                    match home {
                        Some(home) => sleep.sleep_at_home(home, reactor, true, timeout),
                        None => sleep.sleep_polling(reactor, timeout),
                    }
                    reactor.end_poll();
                }
                // Another worker polls the shared instance, perhaps one of another
                // scheduler, or nobody needs to: sleep (at home if fibers wait there) on the
                // standby list, to be woken if that worker's thread leaves its loop or the
                // shared instance gets its first waiter. If the role was freed meanwhile
                // while fds there are waited for, do not sleep: the next pass takes it.
                Some(reactor) => {
                    if let Some(_standby) = reactor.stand_by(&self.shared, self.index) {
                        match home {
                            Some(home) => sleep.sleep_at_home(home, reactor, false, timeout),
                            None => sleep.sleep(timeout),
                        }
                    }
                }
                None => sleep.sleep(timeout),
            }
            // Awake (the sleep's SeqCst exchange made it visible): the monitor watches again.
            sh.monitor.nudge();
            let st = self.stats();
            st.sleeps.add(1);
            st.update_times(|st| {
                st.slept_ns
                    .add(crate::sys::mono_ns().saturating_sub(before));
                st.asleep_since.set(0);
            });
            // A sleep is where the kernel most often moves a thread.
            self.publish_cpu();
        }
        sh.idle.withdraw(self.index);
        // Woken, perhaps for shared work, but with work of its own to do first (a pinned
        // task, a woken fiber): have another worker take the shared work.
        if !sh.injector.is_empty()
            && (!self.own_shared().inbox.is_empty() || !self.ready.borrow().is_empty())
        {
            sh.notify_one();
        }
    }
}
