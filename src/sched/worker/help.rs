//! Help with spawns: the requests for help with the task in a worker's `next` slot (the
//! asker's side, `push_next` and `ask_help`, and the idle peer's, `answer_help_request` and
//! `steal_next`), and the dealing out of a burst of spawns to idle peers. It touches this
//! worker's `next` slot and help request, and its peers' (their `next` slots, progress and
//! help requests). docs/design.md, "Fairness", tells why a spawned task waits for its
//! spawner to suspend, and when a peer takes it.

use super::Worker;
use crate::sched::task::{ScheduleTask, TaskRef};
use std::sync::atomic::{AtomicU32, AtomicU64, AtomicU8, Ordering};
use std::time::{Duration, Instant};

/// An idle worker takes the task in a peer's `next` slot only once the peer has run the
/// same fiber for this long since the task was put there: a spawner that suspends soon (a
/// chain of spawns, a spawn-and-join, a ping-pong pair) runs its task itself, with its data
/// still in cache; one that keeps running gets help. Go waits 3 µs before it steals a P's
/// `runnext`, but a goroutine taken wrongly can move back; a started fiber cannot, and a
/// spawner between its spawn and its join can spend several microseconds in page faults on
/// a fresh stack (with a grace of a few microseconds, a deep spawn-and-join chain is taken
/// over now and then, and split between two workers it runs much slower).
const NEXT_STEAL_AFTER: Duration = Duration::from_micros(50);
/// A watcher of a peer's `next` slot doubles its nap each time in a row it finds the slot
/// empty, at most this many times (`NEXT_STEAL_AFTER` × 32 = 1.6 ms; see `answer_help_request`).
const EMPTY_NAP_DOUBLINGS: u32 = 5;

const HELP_NONE: u8 = 0;
/// Being written or answered.
const HELP_CLAIMED: u8 = 1;
const HELP_ASKED: u8 = 2;

/// A request for help with the task in a worker's `next` slot: made by the worker when one of
/// its fibers spawns (the spawner may keep running), or by an idle peer on its behalf before
/// it sleeps; answered by the next idle peer that looks (see `Worker::answer_help_request`). One at
/// a time per worker: while one is open, spawns wake nobody else.
#[derive(Default)]
pub(super) struct HelpSlot {
    state: AtomicU8,
    /// The worker's progress when the request was made.
    progress: AtomicU32,
    /// When, in nanoseconds since the scheduler's epoch.
    at: AtomicU64,
}

impl HelpSlot {
    /// Claims the slot to open a request, if none is open.
    fn claim(&self) -> bool {
        self.state.load(Ordering::Relaxed) == HELP_NONE
            && self
                .state
                .compare_exchange(
                    HELP_NONE,
                    HELP_CLAIMED,
                    Ordering::Acquire,
                    Ordering::Relaxed,
                )
                .is_ok()
    }

    /// Opens the request claimed, made at `at` when the asker's progress was `progress`.
    fn open(&self, progress: u32, at: u64) {
        self.progress.store(progress, Ordering::Relaxed);
        self.at.store(at, Ordering::Relaxed);
        self.state.store(HELP_ASKED, Ordering::Release);
    }

    /// Takes the open request to answer it, if there is one: its progress and time.
    fn take(&self) -> Option<(u32, u64)> {
        let taken = self.state.load(Ordering::Acquire) == HELP_ASKED
            && self
                .state
                .compare_exchange(
                    HELP_ASKED,
                    HELP_CLAIMED,
                    Ordering::Acquire,
                    Ordering::Relaxed,
                )
                .is_ok();
        taken.then(|| {
            (
                self.progress.load(Ordering::Relaxed),
                self.at.load(Ordering::Relaxed),
            )
        })
    }

    /// Frees the slot claimed (answered, or not opened after all).
    fn close(&self) {
        self.state.store(HELP_NONE, Ordering::Release);
    }
}

/// What an idle worker found when it looked for a request for help.
pub(super) enum HelpAnswer {
    None,
    /// The asker had moved on: its task runs there.
    Stale,
    /// The request of this peer stays open, to be answered at this instant.
    Wait(Instant, usize),
    Taken(ScheduleTask),
}

/// The peers recruited to help with one fiber's spawns, and how many tasks were dealt.
#[derive(Default)]
pub(super) struct SpawnBurst {
    /// The worker's tick when the burst began: a later tick means another fiber runs.
    tick: u32,
    peers: Vec<usize>,
    dealt: usize,
}

impl Worker {
    /// Puts a task a fiber of this worker spawned in the `next` slot, where this worker runs
    /// it as soon as the fiber suspends. An idle peer is recruited (woken) to help in case
    /// the fiber keeps running: it takes the task only if it does (see `ask_help`).
    ///
    /// A task the new one displaces was spawned in a burst. A started fiber never moves, so
    /// where a burst of long-lived fibers starts is all the balancing they get, and leaving
    /// them all for a woken peer to steal loses the race against this worker, which starts
    /// them itself at the spawner's next yield. So the first displaced tasks of a burst are
    /// dealt out, one to each idle peer (spinning or asleep), and go to its inbox, where
    /// nobody else takes them (were they stealable, this worker would often take them back
    /// first). The rest go to the stealable queue.
    #[inline]
    pub(crate) fn push_next(&self, task: TaskRef) {
        let tick = self.tick.get();
        let mut burst = self.burst.borrow_mut();
        if burst.tick != tick {
            // The fiber that spawns now is not the one that spawned last: a new burst.
            burst.tick = tick;
            burst.peers.clear();
            burst.dealt = 0;
        }
        self.next_maybe.set(true);
        let Some(displaced) = self.own_shared().next.0.replace(task) else {
            burst.peers.extend(self.ask_help());
            return;
        };
        // One task for each peer recruited for this burst (the one woken for the first
        // spawn included), then one for each further idle peer; the rest stay here, where
        // idle peers steal them in halves (cheaper than handing them over one by one).
        let dealt = burst.dealt;
        let idle = &self.shared.idle;
        let target = match burst.peers.get(dealt) {
            Some(&i) => Some(i),
            None if dealt < self.shared.workers.len() - 1 => {
                let recruit = idle.take_spinner().or_else(|| idle.to_wake());
                burst.peers.extend(recruit);
                recruit
            }
            None => None,
        };
        if target.is_some() {
            burst.dealt += 1;
        }
        drop(burst);
        match target {
            Some(i) => {
                let peer = &self.shared.workers[i];
                peer.inbox.push(ScheduleTask::Start(displaced));
                peer.sleep.wake();
            }
            None => self.push_local(displaced),
        }
    }

    /// A fiber of this worker spawned into the `next` slot and may keep running: unless a
    /// request for help is open already, or a peer spins (it watches the slot, see
    /// `steal_next`), wake a sleeping peer to answer one (Go wakes a P on every `go`
    /// statement by the same rule). Returns the peer woken.
    ///
    /// The woken peer does not spin: it takes the task only if this worker has not moved on
    /// since (see `answer_help_request`). A chain of spawns or a ping-pong pair, whose
    /// spawner suspends at once, keeps its tasks here (tokio keeps its LIFO slot out of
    /// thieves' reach for the same reason), and no peer spins next to the
    /// busy worker (on a VM or an SMT core, a spinner takes cycles from its neighbour).
    #[inline]
    fn ask_help(&self) -> Option<usize> {
        let slot = &self.own_shared().help;
        if !slot.claim() {
            return None;
        }
        let Some(i) = self.shared.idle.to_help() else {
            slot.close();
            return None;
        };
        slot.open(self.tick.get(), self.shared.now_ns());
        self.shared.workers[i].sleep.wake();
        Some(i)
    }

    /// Opens a request for help on behalf of a peer whose `next` slot holds a task, if none
    /// is open: this worker is about to sleep, and the peer's own request may have missed
    /// its announcement. Returns when to answer it, and the peer.
    pub(super) fn ask_help_for_peer(&self) -> Option<(Instant, usize)> {
        for (v, w) in self.shared.workers.iter().enumerate() {
            if v != self.index && !w.next.0.is_empty() && w.help.claim() {
                w.help
                    .open(w.progress.0.load(Ordering::Relaxed), self.shared.now_ns());
                return Some((Instant::now() + NEXT_STEAL_AFTER, v));
            }
        }
        None
    }

    /// Answers an open request for help: takes the asker's `next` task if the asker has not
    /// moved on for `NEXT_STEAL_AFTER`; closes the request if the asker has not moved on but
    /// its slot is empty (it is idle, or runs a fiber that spawned nothing), and at once if
    /// the asker sleeps with an empty slot (its loop moves its progress at every wake-up, so
    /// it would look busy). Never spins:
    /// woken before the grace, or finding that the asker moved on (it is busy, perhaps with a
    /// fiber that keeps running now), it keeps the request open — with the asker's progress
    /// of now — and naps until it can answer. Meanwhile the asker's spawns wake nobody: a
    /// worker busy with a chain of spawns costs its watcher one timer wake per grace, and
    /// pays no wake of a sleeping thread per spawn (a futex wake costs microseconds, more on
    /// a VM).
    pub(super) fn answer_help_request(&self) -> HelpAnswer {
        let sh = &self.shared;
        let grace = NEXT_STEAL_AFTER.as_nanos() as u64;
        for (v, w) in sh.workers.iter().enumerate() {
            let slot = &w.help;
            let Some((progress, at)) = (v != self.index).then(|| slot.take()).flatten() else {
                continue;
            };
            if w.next.0.is_empty() && w.is_quiet() {
                // The asker sleeps with nothing to hand out: nothing to watch. (Its loop
                // moves its progress at every wake-up, so watching it would look busy.)
                slot.close();
                continue;
            }
            let now_progress = w.progress.0.load(Ordering::Relaxed);
            let now = sh.now_ns();
            let (progress, at) = if now_progress == progress {
                if now >= at + grace {
                    let taken = w.next.0.take();
                    slot.close();
                    return match taken {
                        Some(task) => HelpAnswer::Taken(ScheduleTask::Start(task)),
                        None => HelpAnswer::Stale,
                    };
                }
                (progress, at)
            } else {
                // Moved on: still busy, so keep watching (a wake of a sleeping worker per
                // spawn would cost the asker more than a timed nap here costs anyone).
                (now_progress, now)
            };
            // A busy asker whose slot stays empty has nothing for us to take: each look in a
            // row that finds it so doubles the nap, up to `EMPTY_NAP_DOUBLINGS` times. (With
            // a fixed 50 µs nap, watching a fiber that computes without spawning would wake
            // this worker thousands of times a second for as long as the fiber runs.) A look
            // that finds a task there starts over. The price: a task spawned during a long
            // nap by a fiber that then keeps running waits for the nap's end (at most 1.6 ms,
            // not 50 µs).
            let (asker, looks) = self.empty_looks.get();
            let looks = if !w.next.0.is_empty() {
                0
            } else if asker == v {
                looks.saturating_add(1)
            } else {
                1
            };
            self.empty_looks.set((v, looks));
            slot.open(progress, at);
            let nap = grace << looks.min(EMPTY_NAP_DOUBLINGS);
            let wait = Duration::from_nanos((at + nap).saturating_sub(now));
            return HelpAnswer::Wait(Instant::now() + wait, v);
        }
        HelpAnswer::None
    }

    /// Takes the task in a peer's `next` slot if that peer has been running one fiber for
    /// `NEXT_STEAL_AFTER` since `watch` first saw the task there (see `NEXT_STEAL_AFTER`).
    /// `watch` remembers the peer, its progress and when, across the rounds of one spin.
    pub(super) fn steal_next(
        &self,
        watch: &mut Option<(usize, u32, Instant)>,
    ) -> Option<ScheduleTask> {
        let workers = &self.shared.workers;
        if let Some((v, progress, since)) = *watch {
            let w = &workers[v];
            if !w.next.0.is_empty() && w.progress.0.load(Ordering::Relaxed) == progress {
                if since.elapsed() < NEXT_STEAL_AFTER {
                    return None;
                }
                *watch = None;
                let taken = w.next.0.take().map(ScheduleTask::Start);
                self.stats().steals.add(u64::from(taken.is_some()));
                return taken;
            }
            *watch = None;
        }
        let n = workers.len();
        let start = self.rng.get() as usize % n;
        for k in 0..n {
            let v = (start + k) % n;
            let w = &workers[v];
            if v != self.index && !w.next.0.is_empty() {
                *watch = Some((v, w.progress.0.load(Ordering::Relaxed), Instant::now()));
                break;
            }
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A peer that asked for help and then went quiet with nothing in its `next` slot has
    /// nothing to hand out: an idle worker closes its request instead of napping to watch
    /// it (napping would keep a worker that has just ended a spawn-and-join chain from
    /// spinning for the next submission). A peer that is still running is still watched.
    #[test]
    fn a_quiet_askers_empty_request_is_closed_and_a_running_ones_is_watched() {
        let sched = crate::Scheduler::builder().threads(2).build().unwrap();
        let shared = sched.shared.clone();
        let w0 = Worker::new(shared.clone(), 0);
        let asker = &shared.workers[1];
        let progress = asker.progress.0.load(Ordering::Relaxed);

        // Not driven by any thread (never started): quiet.
        assert!(asker.is_quiet());
        assert!(asker.help.claim());
        asker.help.open(progress, shared.now_ns());
        assert!(matches!(w0.answer_help_request(), HelpAnswer::None));
        assert!(asker.help.claim(), "the request was closed");
        asker.help.close();

        // Running a fiber, as far as its peers can tell: its request is watched.
        asker.stats.0.run_since.set_seqcst(1);
        assert!(!asker.is_quiet());
        assert!(asker.help.claim());
        asker.help.open(progress, shared.now_ns());
        assert!(matches!(w0.answer_help_request(), HelpAnswer::Wait(_, 1)));
        asker.stats.0.run_since.set_seqcst(0);
    }
}
