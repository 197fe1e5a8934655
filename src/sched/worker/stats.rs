//! A worker's counters and gauges ([`WorkerStats`]): what it counts of its own events for
//! `Scheduler::metrics` (in `crate::metrics`, which reads them), in a cache line only it
//! writes — a load and a store per event, never a read-modify-write on a shared line.

use std::sync::atomic::{AtomicU64, Ordering};

/// A figure only its worker writes: a load and a store, no read-modify-write.
#[derive(Default)]
pub(crate) struct Counter(AtomicU64);

impl Counter {
    /// Adds `n`. Only the owning worker calls this (and `set`), so no update is lost.
    #[inline(always)]
    pub(crate) fn add(&self, n: u64) {
        self.0.store(
            self.0.load(Ordering::Relaxed).wrapping_add(n),
            Ordering::Relaxed,
        );
    }

    #[inline(always)]
    pub(crate) fn set(&self, v: u64) {
        self.0.store(v, Ordering::Relaxed);
    }

    pub(crate) fn get(&self) -> u64 {
        self.0.load(Ordering::Relaxed)
    }

    /// A store in the SeqCst order, for the watchdog's handshake (see `MonitorCtl::nudge`).
    pub(crate) fn set_seqcst(&self, v: u64) {
        self.0.store(v, Ordering::SeqCst);
    }

    pub(crate) fn get_seqcst(&self) -> u64 {
        self.0.load(Ordering::SeqCst)
    }
}

/// One worker's counters and gauges, written by that worker only (see the module docs).
#[derive(Default)]
pub(crate) struct WorkerStats {
    /// Fibers that returned to the worker: with `yields` and `parks`, every resumption
    /// (each ends in exactly one of the three), so resumptions need no counter of their own.
    pub(crate) returned: Counter,
    pub(crate) yields: Counter,
    pub(crate) parks: Counter,
    pub(crate) local_wakes: Counter,
    pub(crate) remote_wakes: Counter,
    pub(crate) steals: Counter,
    pub(crate) injected: Counter,
    pub(crate) cedes: Counter,
    pub(crate) sleeps: Counter,
    /// Tasks this worker's thread scheduled (see `Shared::schedule_new`).
    pub(crate) spawned: Counter,
    pub(crate) slept_ns: Counter,
    pub(crate) finished: Counter,
    /// Gauges, as of the worker's last pass or change.
    pub(crate) ready: Counter,
    pub(crate) fibers: Counter,
    pub(crate) stacks_cached: Counter,
    pub(crate) timers: Counter,
    /// Time spent in the worker loop, closed drives only, and when the current drive began
    /// (`CLOCK_MONOTONIC` ns; 0 when the loop is not running).
    pub(crate) run_ns: Counter,
    pub(crate) run_since: Counter,
    /// When the current sleep began (ns), 0 while awake.
    pub(crate) asleep_since: Counter,
    /// Odd while the worker updates the four time figures above, bumped before and after:
    /// readers take them from one moment ([`WorkerStats::read_times`]), so that `busy` and
    /// `slept` never go backwards between two reads.
    time_seq: Counter,
    /// Written by the watchdog's monitor (only when it changes): since when
    /// (`CLOCK_MONOTONIC` ns) the worker has run its current fiber without a pass of its
    /// loop; 0 when it is not known to. The worker reads it at every park.
    pub(crate) stuck_since: std::sync::atomic::AtomicU64,
    /// The header of the fiber the worker runs or ran last (see `sched::watchdog::Watch`):
    /// here, on the line only the worker writes, because it is stored at every switch.
    pub(crate) current: std::sync::atomic::AtomicPtr<crate::sched::task::Header>,
}

/// The time figures of a worker from one moment (see [`WorkerStats::read_times`]).
pub(crate) struct Times {
    pub(crate) run_ns: u64,
    pub(crate) run_since: u64,
    pub(crate) slept_ns: u64,
    pub(crate) asleep_since: u64,
}

impl WorkerStats {
    /// Runs `f`, which updates the time figures (`run_ns`, `run_since`, `slept_ns`,
    /// `asleep_since`), as one step for [`read_times`](WorkerStats::read_times): a sequence
    /// lock, whose only writer is the worker.
    #[inline]
    pub(crate) fn update_times(&self, f: impl FnOnce(&Self)) {
        let seq = self.time_seq.get();
        self.time_seq
            .0
            .store(seq.wrapping_add(1), Ordering::Relaxed);
        // The odd number is visible before any figure changes.
        std::sync::atomic::fence(Ordering::Release);
        f(self);
        self.time_seq
            .0
            .store(seq.wrapping_add(2), Ordering::Release);
    }

    /// The time figures as of one moment between the worker's updates.
    pub(crate) fn read_times(&self) -> Times {
        let mut spins = 0u32;
        loop {
            let seq = self.time_seq.0.load(Ordering::Acquire);
            if seq.is_multiple_of(2) {
                let t = Times {
                    run_ns: self.run_ns.get(),
                    run_since: self.run_since.get(),
                    slept_ns: self.slept_ns.get(),
                    asleep_since: self.asleep_since.get(),
                };
                std::sync::atomic::fence(Ordering::Acquire);
                if self.time_seq.0.load(Ordering::Relaxed) == seq {
                    return t;
                }
            }
            // The worker is inside an update, a few stores long (unless its thread was
            // preempted there): look again.
            spins += 1;
            if spins.is_multiple_of(64) {
                std::thread::yield_now();
            } else {
                std::hint::spin_loop();
            }
        }
    }
}
