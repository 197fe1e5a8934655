//! Runtime metrics: [`Scheduler::metrics`](crate::Scheduler::metrics) takes a [`Metrics`]
//! snapshot — scheduler-wide figures and one [`WorkerMetrics`] per worker.
//!
//! Each worker counts its own events in a cache line of its own that only it writes (a load
//! and a store per event, never a read-modify-write on a shared line); a snapshot reads
//! those lines from any thread. Counters only grow; [`Metrics::delta`] turns two snapshots
//! into rates. The figures of one snapshot are read one after the other while the workers
//! run, so they are consistent only to within the events of those few microseconds.

use crate::sched::worker::Shared;
use crate::sched::Scheduler;
use std::fmt;
use std::sync::atomic::Ordering;
use std::time::Duration;

/// A snapshot of a scheduler's figures, from [`Scheduler::metrics`](crate::Scheduler::metrics).
///
/// `Display` prints a compact table (one line per worker); `Debug` every field.
///
/// ```
/// let sched = fibra::Scheduler::builder().threads(2).build().unwrap();
/// sched.start();
/// let before = sched.metrics();
/// sched.block_on(|| fibra::Fiber::yield_now());
/// // The worker counts a fiber's last run just after its result is out: look until it has.
/// let resumes = |m: &fibra::Metrics| m.workers().iter().map(|w| w.resumes()).sum::<u64>();
/// let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
/// let mut m = sched.metrics();
/// while resumes(&m) < 2 && std::time::Instant::now() < deadline {
///     std::thread::sleep(std::time::Duration::from_millis(1));
///     m = sched.metrics();
/// }
/// assert!(m.spawned() >= 1);
/// assert!(resumes(&m) >= 2); // started, and resumed after the yield
/// println!("{}", m.delta(&before));
/// ```
#[derive(Clone, Debug)]
pub struct Metrics {
    pub(crate) name: String,
    pub(crate) uptime: Duration,
    pub(crate) live_tasks: usize,
    pub(crate) continuations: usize,
    pub(crate) spawned: u64,
    pub(crate) injector: usize,
    pub(crate) stack_size: usize,
    pub(crate) stacks_free: usize,
    pub(crate) stacks_spare: usize,
    pub(crate) stacks_carved: usize,
    pub(crate) stack_slabs: usize,
    pub(crate) stack_reserved_bytes: usize,
    pub(crate) stack_mappings: usize,
    pub(crate) io_registrations: usize,
    pub(crate) io_waiting: usize,
    pub(crate) blocking_threads: usize,
    pub(crate) blocking_busy: usize,
    pub(crate) blocking_queued: usize,
    pub(crate) workers: Vec<WorkerMetrics>,
}

/// One worker's figures in a [`Metrics`] snapshot. Counters count since the scheduler was
/// built. Gauges are current: the queue depths and `timers` exactly; `fibers`,
/// `ready_depth` and `stacks_cached` as the worker publishes them, every 64 passes of its
/// loop and before it sleeps (a busy worker's are at most a few microseconds old).
#[derive(Clone, Debug, Default)]
pub struct WorkerMetrics {
    pub(crate) index: usize,
    pub(crate) resumes: u64,
    pub(crate) yields: u64,
    pub(crate) parks: u64,
    pub(crate) local_wakes: u64,
    pub(crate) remote_wakes: u64,
    pub(crate) steals: u64,
    pub(crate) injected: u64,
    pub(crate) cedes: u64,
    pub(crate) sleeps: u64,
    pub(crate) slept: Duration,
    pub(crate) busy: Duration,
    pub(crate) finished: u64,
    pub(crate) fibers: usize,
    pub(crate) ready: usize,
    pub(crate) inbox: usize,
    pub(crate) local: usize,
    pub(crate) next: usize,
    pub(crate) timers: usize,
    pub(crate) stacks_cached: usize,
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
        metrics(self.shared())
    }
}

/// Reads the figures of the scheduler behind `sh`.
fn metrics(sh: &Shared) -> Metrics {
    let workers: Vec<WorkerMetrics> = sh
        .workers
        .iter()
        .enumerate()
        .map(|(index, w)| {
            let st = &w.stats.0;
            // The four from one moment, then the clock: every interval open then is closed
            // now, at or after its start (`busy` and `slept` only grow, read after read).
            let t = st.read_times();
            let now = crate::sys::mono_ns();
            // Closed intervals plus the one in progress (a start of 0: none).
            let open = |since: u64| {
                if since == 0 {
                    0
                } else {
                    now.saturating_sub(since)
                }
            };
            let run = t.run_ns + open(t.run_since);
            // Never less than an earlier report (see `reported_times`).
            let at_least = |i: usize, v: u64| {
                let prev = w.reported_times[i].fetch_max(v, Ordering::Relaxed);
                v.max(prev)
            };
            let slept = t.slept_ns + open(t.asleep_since);
            let busy = at_least(0, run.saturating_sub(slept));
            let slept = at_least(1, slept);
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
                busy: Duration::from_nanos(busy),
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
    let live_tasks = sh.live();
    // Its own counters, which only grow (a pending continuation is not a task yet).
    let spawned = sh.spawned();
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
        spawned,
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

impl Metrics {
    /// The scheduler's name (its worker thread prefix).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Time since the scheduler was built, when the snapshot was taken (for a
    /// [`delta`](Metrics::delta): the interval between the two snapshots).
    pub fn uptime(&self) -> Duration {
        self.uptime
    }

    /// Tasks submitted and not finished yet: queued, running, ready or parked, and readiness
    /// continuations not yet submitted.
    pub fn live_tasks(&self) -> usize {
        self.live_tasks
    }

    /// Readiness continuations registered (`spawn_when_readable` on
    /// [`TcpStream`](crate::net::TcpStream) or `UnixStream`) and not yet submitted: waits for
    /// I/O that hold no fiber. Counted in [`live_tasks`](Metrics::live_tasks) too.
    pub fn continuations(&self) -> usize {
        self.continuations
    }

    /// Tasks submitted so far (finished ones and [`live_tasks`](Metrics::live_tasks)).
    pub fn spawned(&self) -> u64 {
        self.spawned
    }

    /// One entry per worker, by index.
    pub fn workers(&self) -> &[WorkerMetrics] {
        &self.workers
    }

    /// Unstarted tasks in the shared queue that outside submissions go to.
    pub fn injector_depth(&self) -> usize {
        self.injector
    }

    /// The scheduler's default fiber stack size, in bytes.
    pub fn stack_size(&self) -> usize {
        self.stack_size
    }

    /// Stacks in use by this scheduler's live fibers.
    pub fn stacks_in_use(&self) -> usize {
        self.workers.iter().map(|w| w.fibers).sum()
    }

    /// Idle stacks this scheduler's workers keep, memory and all, for reuse.
    pub fn stacks_cached(&self) -> usize {
        self.workers.iter().map(|w| w.stacks_cached).sum()
    }

    /// Process-wide: idle stacks whose memory was given back, in the shared free list.
    pub fn stacks_free(&self) -> usize {
        self.stacks_free
    }

    /// Process-wide: idle stacks that workers handed over beyond their
    /// [`stack_cache`](crate::Builder::stack_cache), memory and all, for any worker to reuse
    /// before it faults in new ones. Idle workers give their memory back once none has been
    /// handed over or taken for 50 ms; a stopping scheduler's workers give it back at once.
    pub fn stacks_spare(&self) -> usize {
        self.stacks_spare
    }

    /// Process-wide: stacks carved from slabs so far.
    pub fn stacks_carved(&self) -> usize {
        self.stacks_carved
    }

    /// Process-wide: address space reserved for stacks, in bytes (committed only when touched).
    pub fn stack_reserved_bytes(&self) -> usize {
        self.stack_reserved_bytes
    }

    /// Process-wide: kernel memory mappings the stacks cost — one per slab with
    /// `madvise(MADV_GUARD_INSTALL)` guards; with the `mprotect` fallback each guard page
    /// splits its slab, about two more per stack carved (an upper bound).
    pub fn stack_mappings(&self) -> usize {
        self.stack_mappings
    }

    /// Process-wide: file descriptors registered with the I/O reactor.
    pub fn io_registrations(&self) -> usize {
        self.io_registrations
    }

    /// Process-wide: fibers (and threads) waiting for I/O readiness right now.
    pub fn io_waiting(&self) -> usize {
        self.io_waiting
    }

    /// Fibers parked with a deadline (sleeps, timed waits), on all workers.
    pub fn timers(&self) -> usize {
        self.workers.iter().map(|w| w.timers).sum()
    }

    /// Process-wide: threads of the blocking pool ([`unblock`](crate::unblock())).
    pub fn blocking_threads(&self) -> usize {
        self.blocking_threads
    }

    /// Process-wide: blocking-pool threads running a call (or about to look for one).
    pub fn blocking_busy(&self) -> usize {
        self.blocking_busy
    }

    /// Process-wide: blocking calls queued for a pool thread.
    pub fn blocking_queued(&self) -> usize {
        self.blocking_queued
    }

    /// The change from `earlier` (a snapshot of the same scheduler) to this one: counters
    /// and `uptime` become differences, gauges stay as in `self`. `Display` of the result
    /// reads as rates over the interval.
    pub fn delta(&self, earlier: &Metrics) -> Metrics {
        let mut d = self.clone();
        d.uptime = self.uptime.saturating_sub(earlier.uptime);
        d.spawned = self.spawned.saturating_sub(earlier.spawned);
        for (w, e) in d.workers.iter_mut().zip(&earlier.workers) {
            // Each counter of `w`, less its value in `e`: one list of the workers' counters.
            macro_rules! since {
                ($($counter:ident),+) => {$(
                    w.$counter = w.$counter.saturating_sub(e.$counter);
                )+};
            }
            since!(
                resumes,
                yields,
                parks,
                local_wakes,
                remote_wakes,
                steals,
                injected,
                cedes,
                sleeps,
                slept,
                busy,
                finished
            );
        }
        d
    }
}

impl WorkerMetrics {
    /// The worker's index.
    pub fn index(&self) -> usize {
        self.index
    }

    /// Fiber resumptions (starts included) that have switched back to the worker: each
    /// ended in a yield, a park, or the fiber's return.
    pub fn resumes(&self) -> u64 {
        self.resumes
    }

    /// Times a fiber yielded ([`Fiber::yield_now`](crate::Fiber::yield_now), a spent budget).
    pub fn yields(&self) -> u64 {
        self.yields
    }

    /// Times a fiber parked (waited on anything: a lock, I/O, a timer, a join).
    pub fn parks(&self) -> u64 {
        self.parks
    }

    /// Wakes of this worker's fibers made on this worker (by its fibers, timers, cancels).
    pub fn local_wakes(&self) -> u64 {
        self.local_wakes
    }

    /// Wakes of this worker's fibers that came from other threads (through its inbox).
    pub fn remote_wakes(&self) -> u64 {
        self.remote_wakes
    }

    /// Unstarted tasks this worker took from its peers.
    pub fn steals(&self) -> u64 {
        self.steals
    }

    /// Unstarted tasks this worker took from the shared injector (outside submissions, and
    /// the overflow of full stealable queues).
    pub fn injected(&self) -> u64 {
        self.injected
    }

    /// Times the worker thread yielded its CPU to a peer worker that the kernel had kept
    /// waiting for that CPU, once per wait of the peer (see "Sharing a CPU" in the design
    /// notes, `docs/design.md`): a started fiber never moves, so a worker off its CPU holds
    /// up its fibers.
    pub fn cedes(&self) -> u64 {
        self.cedes
    }

    /// Times the worker thread went to sleep with nothing to do.
    pub fn sleeps(&self) -> u64 {
        self.sleeps
    }

    /// Time the worker thread slept.
    pub fn slept(&self) -> Duration {
        self.slept
    }

    /// Time the worker loop ran and did not sleep: running fibers, and looking for work
    /// (spinning) before a sleep.
    pub fn busy(&self) -> Duration {
        self.busy
    }

    /// Tasks that ended on this worker (returned, panicked or were cancelled).
    pub fn finished(&self) -> u64 {
        self.finished
    }

    /// Live fibers homed on this worker (each holds a stack).
    pub fn fibers(&self) -> usize {
        self.fibers
    }

    /// Started fibers ready to run here (yielded or woken).
    pub fn ready_depth(&self) -> usize {
        self.ready
    }

    /// Entries in the worker's inbox: wakes from other threads and pinned tasks.
    pub fn inbox_depth(&self) -> usize {
        self.inbox
    }

    /// Unstarted tasks in the worker's stealable queue, plus its `next` slot (0 or 1).
    pub fn local_depth(&self) -> usize {
        self.local + self.next
    }

    /// Fibers parked here with a deadline.
    pub fn timers(&self) -> usize {
        self.timers
    }

    /// Idle stacks this worker keeps for reuse.
    pub fn stacks_cached(&self) -> usize {
        self.stacks_cached
    }

    /// Everything waiting to run on this worker: ready fibers, inbox, local queue.
    pub fn waiting(&self) -> usize {
        self.ready + self.inbox + self.local + self.next
    }
}

/// `1234567` as `1 234 567`: tables of counters stay readable.
pub(crate) struct Grouped(pub(crate) u64);

impl fmt::Display for Grouped {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let digits = self.0.to_string();
        let mut out = String::with_capacity(digits.len() + digits.len() / 3);
        for (i, c) in digits.chars().enumerate() {
            if i > 0 && (digits.len() - i).is_multiple_of(3) {
                out.push(' ');
            }
            out.push(c);
        }
        f.pad(&out)
    }
}

/// A byte count in the largest binary unit that keeps it at least 1.
pub(crate) fn bytes(n: usize) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = n as f64;
    let mut unit = 0;
    while v >= 1024.0 && unit < UNITS.len() - 1 {
        v /= 1024.0;
        unit += 1;
    }
    if unit == 0 {
        format!("{n} B")
    } else {
        format!("{v:.1} {}", UNITS[unit])
    }
}

impl fmt::Display for Metrics {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let g = |n: usize| Grouped(n as u64);
        writeln!(
            f,
            "scheduler '{}': {} workers, {} live tasks ({} readiness continuations), {} spawned, \
             over {:.3} s",
            self.name,
            self.workers.len(),
            g(self.live_tasks),
            g(self.continuations),
            Grouped(self.spawned),
            self.uptime.as_secs_f64()
        )?;
        writeln!(
            f,
            "stacks: {} in use, {} cached ({} each); process: {} spare, {} free, {} carved, \
             {} reserved in {} slabs, {} mappings",
            g(self.stacks_in_use()),
            g(self.stacks_cached()),
            bytes(self.stack_size),
            g(self.stacks_spare),
            g(self.stacks_free),
            g(self.stacks_carved),
            bytes(self.stack_reserved_bytes),
            g(self.stack_slabs),
            g(self.stack_mappings),
        )?;
        writeln!(
            f,
            "io: {} registered, {} waiting; timers: {}; blocking pool: {} threads, {} busy, {} \
             queued; injector: {}",
            g(self.io_registrations),
            g(self.io_waiting),
            g(self.timers()),
            g(self.blocking_threads),
            g(self.blocking_busy),
            g(self.blocking_queued),
            g(self.injector),
        )?;
        writeln!(
            f,
            "{:>6} {:>11} {:>11} {:>11} {:>10} {:>10} {:>8} {:>8} {:>7} {:>6} {:>8} {:>6} {:>6} \
             {:>6} {:>7}",
            "worker",
            "resumes",
            "yields",
            "parks",
            "wakes",
            "remote",
            "steals",
            "injected",
            "sleeps",
            "busy",
            "fibers",
            "ready",
            "inbox",
            "local",
            "timers"
        )?;
        for w in &self.workers {
            let busy = if self.uptime.is_zero() {
                0.0
            } else {
                100.0 * w.busy.as_secs_f64() / self.uptime.as_secs_f64()
            };
            writeln!(
                f,
                "{:>6} {:>11} {:>11} {:>11} {:>10} {:>10} {:>8} {:>8} {:>7} {:>5.1}% {:>8} {:>6} \
                 {:>6} {:>6} {:>7}",
                w.index,
                Grouped(w.resumes),
                Grouped(w.yields),
                Grouped(w.parks),
                Grouped(w.local_wakes),
                Grouped(w.remote_wakes),
                Grouped(w.steals),
                Grouped(w.injected),
                Grouped(w.sleeps),
                busy.min(100.0),
                g(w.fibers),
                g(w.ready),
                g(w.inbox),
                g(w.local + w.next),
                g(w.timers),
            )?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grouped_digits() {
        assert_eq!(Grouped(0).to_string(), "0");
        assert_eq!(Grouped(999).to_string(), "999");
        assert_eq!(Grouped(1000).to_string(), "1 000");
        assert_eq!(Grouped(1_234_567).to_string(), "1 234 567");
        assert_eq!(Grouped(u64::MAX).to_string(), "18 446 744 073 709 551 615");
        assert_eq!(format!("{:>7}", Grouped(1000)), "  1 000");
    }

    #[test]
    fn byte_units() {
        assert_eq!(bytes(0), "0 B");
        assert_eq!(bytes(1023), "1023 B");
        assert_eq!(bytes(1024), "1.0 KiB");
        assert_eq!(bytes(256 << 10), "256.0 KiB");
        assert_eq!(bytes(3 << 30), "3.0 GiB");
        assert_eq!(bytes(usize::MAX), "16777216.0 TiB");
    }
}
