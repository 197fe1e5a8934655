//! Ceding the CPU: a worker that finds a peer waiting for the CPU it runs on (a peer on the
//! same CPU, or one woken from its sleep that has not run since, while work it could take
//! waits) yields its thread until the peer has run; and a worker that naps to watch a busy
//! peer holds itself on its own CPU meanwhile. It reads its peers' progress, CPU, sleep
//! state and load, and writes only this worker's CPU and its record of its peers.
//! docs/design.md, "Sharing a CPU", tells why.

use super::{Worker, WorkerShared};
use std::sync::atomic::Ordering;

/// How long a peer worker on this worker's CPU may wait for it, awake and with tasks queued,
/// before this worker yields the CPU (see `Worker::cede_cpu`).
const CEDE_AFTER_NS: u64 = 250_000;
/// How long a peer woken from its sleep may go without running, while unstarted tasks it
/// could take wait on this worker's queue, before this worker makes room on its CPU for it.
/// A wake-up on an idle CPU takes microseconds; much longer means it is queued behind a
/// busy thread, likely this one. (For outside submissions the wait is `CEDE_AFTER_NS`:
/// ceding this early for them slows down a stream of submissions from a plain thread, as in
/// `spawn_remote`.)
const ROUSED_AFTER_NS: u64 = 50_000;
/// At most this many `sched_yield`s in a row per cede, each of which came straight back
/// (see `cede_to`).
const CEDE_TRIES: u32 = 16;
/// A `sched_yield` that takes this long gave the CPU to some thread.
const CEDE_QUICK_NS: u64 = 20_000;

/// Yields this thread's CPU until `peer` has moved on from `progress`, that is, until it ran.
/// A yield that comes straight back gave the CPU to nobody: the kernel picked this thread
/// again, and each further yield moves it back in the kernel's order (EEVDF pushes a yielding
/// task's virtual deadline back by a slice), so a few more reach the peer. A yield that took
/// a while gave the CPU to some thread: if the peer has not moved, it was another one, the
/// peer waits on another CPU (moved there before it could publish that), and more yields
/// would only feed that thread.
fn cede_to(peer: &WorkerShared, progress: u32) {
    for _ in 0..CEDE_TRIES {
        let before = crate::sys::mono_ns();
        // SAFETY: a system call without arguments.
        unsafe { libc::sched_yield() };
        if peer.progress() != progress
            || crate::sys::mono_ns().saturating_sub(before) >= CEDE_QUICK_NS
        {
            return;
        }
    }
}

/// What a worker saw of a peer the last time it looked for one waiting for its CPU.
#[derive(Clone, Copy)]
pub(super) struct PeerSeen {
    /// The peer's `progress`, and when (`CLOCK_MONOTONIC` ns) this worker saw it change.
    progress: u32,
    since: u64,
    /// This worker yielded its CPU to the peer since then.
    ceded: bool,
}

impl PeerSeen {
    /// A progress no peer has yet: the first look at a peer only starts its clock.
    pub(super) const UNSEEN: PeerSeen = PeerSeen {
        progress: u32::MAX,
        since: 0,
        ceded: false,
    };
}

impl Worker {
    /// Yields this thread's CPU to a peer worker that waits for it.
    ///
    /// A started fiber never moves, so while the kernel keeps a worker thread off its CPU,
    /// that worker's fibers wait, however idle the others are. When two workers share one
    /// CPU (more runnable threads than CPUs: a load generator on the same machine, other
    /// processes; or a kernel that packs threads onto few CPUs), the kernel alternates them
    /// in slices of a few milliseconds, and the waiting one's fibers see that as latency.
    /// So a worker that finds a peer on its own CPU, awake, with tasks waiting and no
    /// progress for `CEDE_AFTER_NS`, calls `sched_yield` until the peer runs (`cede_to`),
    /// once per wait; that peer does the same in turn. So it does for a peer woken from its
    /// sleep whose thread has not run since, wherever it last ran, while work that peer
    /// could take waits: for `CEDE_AFTER_NS` while outside submissions wait, for
    /// `ROUSED_AFTER_NS` while a burst of tasks spawned on this worker waits on its
    /// stealable queue. The kernel may have queued it on this CPU, and it can publish
    /// neither that nor the work (not in its queues); left waiting, it would see this
    /// worker start all of it, and started fibers never move. (Not otherwise: a peer woken
    /// elsewhere, behind some other thread, gains nothing from this worker's yield, which
    /// may hand this CPU to that other thread; nor for the work in its own queues, which
    /// only it can run.) Workers busy on separate CPUs never cede, and pay a `sched_getcpu`
    /// (a few ns through rseq) and two cached loads per peer: a peer's CPU is in a line it
    /// rewrites only when it moves, its sleep state in one written only by sleeps and
    /// wakes. See docs/design.md, "Sharing a CPU".
    pub(super) fn cede_cpu(&self) {
        let Some(cpu) = self.publish_cpu() else {
            return;
        };
        for (j, peer) in self.shared.workers.iter().enumerate() {
            if j == self.index {
                continue;
            }
            let roused = self.cede_after_for_woken_peer(peer);
            if (peer.cpu.0.load(Ordering::Relaxed) == cpu || roused.is_some())
                && self.cede_if_waiting(j, peer, roused)
            {
                return;
            }
        }
    }

    /// `cede_cpu` for peer `j`, which shares this worker's CPU or was woken and has not run
    /// yet (`roused`: how long it may wait, see `cede_after_for_woken_peer`): cedes it if the peer waits
    /// for it (see there); whether it did. A peer's wait starts when this worker first sees
    /// it with no new progress: every pass of a worker's loop, the one after a wake-up
    /// included, moves its progress on.
    #[cold]
    #[inline(never)]
    fn cede_if_waiting(&self, j: usize, peer: &WorkerShared, roused: Option<u64>) -> bool {
        let now = crate::sys::mono_ns();
        let progress = peer.progress();
        let s = &mut self.peers_seen.borrow_mut()[j];
        if s.progress != progress || peer.is_quiet() || (peer.waiting() == 0 && roused.is_none()) {
            *s = PeerSeen {
                progress,
                since: now,
                ceded: false,
            };
            return false;
        }
        let after = roused.unwrap_or(CEDE_AFTER_NS);
        if s.ceded || now.saturating_sub(s.since) < after {
            return false;
        }
        // Once per wait: a peer that has not moved after `cede_to` waits elsewhere.
        s.ceded = true;
        self.stats().cedes.add(1);
        cede_to(peer, progress);
        true
    }

    /// If `peer` was woken from its sleep and has not run since while work it could take
    /// waits, how long it may go on waiting before this worker yields to it (it may be
    /// queued on this CPU, see `cede_cpu`): `ROUSED_AFTER_NS` while unstarted tasks wait on
    /// this worker's stealable queue (a burst spawned here, which this worker starts at
    /// every other pass meanwhile), else `CEDE_AFTER_NS` while outside submissions wait
    /// (any idle worker may take those, and a yield may give this CPU to their submitter).
    /// `None` otherwise, work in its own queues alone included (a wake of one of its fibers,
    /// a pinned task): only it can run that, wherever it waits, and a peer that woke it has
    /// no share to lose.
    fn cede_after_for_woken_peer(&self, peer: &WorkerShared) -> Option<u64> {
        if !peer.sleep.is_roused() {
            None
        } else if !self.own_shared().local.is_empty() {
            Some(ROUSED_AFTER_NS)
        } else if !self.shared.injector.is_empty() {
            Some(CEDE_AFTER_NS)
        } else {
            None
        }
    }

    /// Publishes the CPU this thread runs on, if it changed, and returns it (`None` if the
    /// kernel cannot tell).
    pub(super) fn publish_cpu(&self) -> Option<u32> {
        let cpu = crate::sys::current_cpu()?;
        let slot = &self.own_shared().cpu.0;
        if slot.load(Ordering::Relaxed) != cpu {
            slot.store(cpu, Ordering::Relaxed);
        }
        Some(cpu)
    }

    /// Holds this worker on its CPU for a nap that watches `peer`, busy on another CPU, so
    /// that the nap's end cannot land on the peer's CPU and preempt it. A kernel that packs
    /// threads onto few CPUs may wake a watcher on its busy peer's CPU again and again,
    /// preempting a chain of spawns there while the watcher's own CPU idles (see
    /// docs/design.md, "A watcher naps on its own CPU"). On a kernel that wakes a thread on
    /// its idle CPU, the hold changes nothing. No
    /// hold where the CPUs are unknown or the same.
    pub(super) fn hold_apart_from(&self, peer: usize) -> Option<crate::sys::CpuHold> {
        let mine = self.publish_cpu()?;
        let theirs = self.shared.workers[peer].cpu.0.load(Ordering::Relaxed);
        if theirs == u32::MAX || theirs == mine {
            return None;
        }
        crate::sys::CpuHold::on(mine)
    }
}
