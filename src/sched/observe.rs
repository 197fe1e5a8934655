//! `Scheduler::metrics` and `Scheduler::dump`: reading a running scheduler from outside.

use super::worker::{Phase, Shared, WorkerShared};
use super::Scheduler;
use crate::dump::{Dump, DumpRequest, Entry, Status, WorkerAnswer, DUMP_PATIENCE};
use crate::metrics::{Metrics, WorkerMetrics};
use crate::sched::task::ScheduleTask;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

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

    /// Every live fiber of this scheduler: id, name, worker, state — running, ready, or
    /// parked and on what (a sleep and until when, fd N readable or writable, a lock, a
    /// channel, the join of another task, a plain `park`) — for how long, and where it was
    /// submitted. `Display` prints it like Go's goroutine dump. See [`Dump`].
    ///
    /// Each worker lists its own fibers, 1 024 at a time between two fibers it runs, so the
    /// scheduler never stops as a whole and no worker stops for long (about 0.1 ms per
    /// chunk; the dump reports each worker's longest pause). The dump waits for a worker as
    /// long as its loop moves, so a worker with a million fibers, or one whose fibers each
    /// run a while before they suspend, is listed in full, in as many passes as it takes. A
    /// worker stuck in a fiber that never suspends cannot answer: once its loop has not
    /// moved for [`DUMP_PATIENCE`] (100 ms) it is reported with that fiber, and its other
    /// fibers are missing from the dump.
    ///
    /// Callable from any thread and from a fiber (of this scheduler too: the fiber waits for
    /// the answers, and is listed as running). On a scheduler that is not running (not
    /// started, or stopped) no fiber is alive to list.
    pub fn dump(&self) -> Dump {
        let sh = &self.shared;
        let start = Instant::now();
        let live_tasks = sh.live();
        let phase = sh.phase.get();
        let mut dump = Dump {
            name: sh.config.name.clone(),
            live_tasks,
            continuations: sh.continuations.load(Ordering::SeqCst),
            fibers: Vec::new(),
            workers: Vec::new(),
            taken: Duration::ZERO,
        };
        if phase == Phase::New || phase == Phase::Done {
            dump.taken = start.elapsed();
            return dump;
        }
        let requester = crate::fiber::current_meta()
            .filter(|m| m.worker.is_some())
            .map(|m| m.id);
        let (req, answers) = DumpRequest::new(requester);
        let progress: Vec<u32> = sh.workers.iter().map(|w| w.progress()).collect();
        let req = std::sync::Arc::new(req);
        let n = sh.workers.len();
        let mut got: Vec<Option<(Vec<Entry>, Duration, Duration)>> = (0..n).map(|_| None).collect();
        let mut pending = n;
        {
            // An undriven `use_caller` worker 0 is read here, under the lock that keeps its
            // thread from driving it meanwhile.
            let undriven = self.caller_worker.lock();
            if let Some(w) = undriven.as_ref() {
                w.answer_dump_now(req.clone());
            }
            for (i, w) in sh.workers.iter().enumerate() {
                if !(i == 0 && undriven.is_some()) {
                    w.inbox.push(ScheduleTask::Dump(req.clone()));
                    w.sleep.wake();
                }
            }
        }
        drop(req);
        // A worker is waited for as long as its loop moves (listing many fibers, a chunk per
        // pass, between fibers that each run a while, takes as long as it takes); one whose
        // loop has not moved for `DUMP_PATIENCE` is stuck in a fiber, and given up on.
        let mut seen: Vec<(u32, Instant)> = progress.iter().map(|&p| (p, start)).collect();
        while pending > 0 {
            match answers.recv_timeout(DUMP_PATIENCE / 10) {
                Ok((i, entries, pause, work)) => {
                    if got[i].is_none() {
                        pending -= 1;
                    }
                    got[i] = Some((entries, pause, work));
                }
                Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {
                    let now = Instant::now();
                    let mut waiting = false;
                    for (i, w) in sh.workers.iter().enumerate() {
                        if got[i].is_some() {
                            continue;
                        }
                        let p = w.progress();
                        if p != seen[i].0 {
                            seen[i] = (p, now);
                        }
                        waiting |= now.duration_since(seen[i].1) < DUMP_PATIENCE;
                    }
                    if !waiting {
                        break;
                    }
                }
                Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => break,
            }
        }
        for (i, answer) in got.into_iter().enumerate() {
            let w = &sh.workers[i];
            match answer {
                Some((mut entries, pause, work)) => {
                    // A fiber moved within the worker's registry while it answered may be
                    // listed twice (see `Worker::dump_step`).
                    entries.sort_unstable_by_key(|e| e.id);
                    entries.dedup_by_key(|e| e.id);
                    dump.workers.push(WorkerAnswer {
                        index: i,
                        fibers: entries.len(),
                        pause: Some(pause),
                        work,
                        stuck_in: None,
                    });
                    dump.fibers.extend(entries);
                }
                None => {
                    let stuck = stuck_fiber(w, i, seen[i].0);
                    dump.workers.push(WorkerAnswer {
                        index: i,
                        fibers: usize::from(stuck.is_some()),
                        pause: None,
                        work: Duration::ZERO,
                        stuck_in: stuck.as_ref().map(|e| e.id),
                    });
                    dump.fibers.extend(stuck);
                }
            }
        }
        dump.fibers.sort_unstable_by_key(|e| e.id);
        dump.taken = start.elapsed();
        dump
    }
}

/// The fiber a worker that did not answer a dump is running, if it runs one.
/// It is stuck if its loop has not moved since before the request (`progress`) and it is
/// awake: then it is inside the fiber it switched to last.
fn stuck_fiber(w: &WorkerShared, index: usize, progress: u32) -> Option<Entry> {
    if w.progress() != progress || w.is_quiet() {
        return None;
    }
    let (id, name, location) = w.peek()?;
    let since = w
        .stats
        .0
        .stuck_since
        .load(std::sync::atomic::Ordering::Relaxed);
    let for_ =
        (since != 0).then(|| Duration::from_nanos(crate::sys::mono_ns().saturating_sub(since)));
    Some(Entry {
        id,
        name,
        worker: index,
        status: Status::Running,
        for_,
        deadline: None,
        location,
        cancelled: false,
    })
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
