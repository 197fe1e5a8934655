//! The fiber dump: [`Scheduler::dump`](crate::Scheduler::dump) lists every live fiber —
//! what it waits on, for how long, and where it was submitted — like Go's goroutine dump.
//!
//! Each worker lists its own fibers when it finds the request in its inbox (it looks there
//! at every pass of its loop), 1 024 fibers per pass, between two fibers it runs: the
//! workers answer independently, so the scheduler never stops as a whole, and no worker
//! pauses its fibers for longer than one chunk takes (the dump reports the longest pause
//! per worker). The dump waits for a worker as long as its loop moves. A worker stuck in a
//! fiber that never suspends cannot answer: once its loop has stood still for
//! [`DUMP_PATIENCE`] the dump reports it with the fiber it is stuck in.

use crate::fiber::FiberId;
use crate::metrics::Grouped;
use crate::sched::worker::{DumpRequest, Phase, WorkerShared};
use crate::sched::Scheduler;
use std::fmt;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

pub use crate::park::WaitOn;
pub use crate::sched::worker::{Entry, Status};

/// How long [`Scheduler::dump`](crate::Scheduler::dump) waits for the answer of a worker
/// whose loop does not move before it reports the worker as busy (stuck in one fiber); a
/// worker whose loop moves is waited for until it has listed all its fibers.
pub const DUMP_PATIENCE: Duration = Duration::from_millis(100);

/// How one worker answered a [`Dump`].
#[derive(Clone, Debug)]
pub struct WorkerAnswer {
    pub(crate) index: usize,
    pub(crate) fibers: usize,
    pub(crate) pause: Option<Duration>,
    pub(crate) work: Duration,
    pub(crate) stuck_in: Option<FiberId>,
    pub(crate) blocked_in: Option<String>,
}

impl WorkerAnswer {
    /// The worker's index.
    pub fn index(&self) -> usize {
        self.index
    }

    /// How many of its fibers the dump lists.
    pub fn fibers(&self) -> usize {
        self.fibers
    }

    /// The longest the worker paused its fibers to answer (it lists them in chunks of 1 024,
    /// one chunk between two fibers); `None` if it did not answer and its loop stood still for
    /// [`DUMP_PATIENCE`] (it was stuck in one fiber). A `use_caller` worker 0 that no thread drives is read
    /// by the dumping thread instead, in one go.
    pub fn pause(&self) -> Option<Duration> {
        self.pause
    }

    /// The worker's time spent on the dump, all chunks together (zero without an answer).
    pub fn work(&self) -> Duration {
        self.work
    }

    /// For a worker that did not answer: the fiber it was running, if it could tell.
    pub fn stuck_in(&self) -> Option<FiberId> {
        self.stuck_in
    }

    /// For a worker that did not answer: the system call its thread was asleep in, by name
    /// (`futex` for a std or parking_lot lock, condition variable or channel), if the kernel
    /// said it was in one (read from `/proc/self/task/<tid>/syscall`). `None` for a worker
    /// whose fiber computes, or that answered.
    pub fn blocked_in(&self) -> Option<&str> {
        self.blocked_in.as_deref()
    }
}

/// Every live fiber of a scheduler, from [`Scheduler::dump`](crate::Scheduler::dump).
///
/// `Display` prints one paragraph per fiber, sorted by id, after a header with one line per
/// worker (how long it paused to answer).
///
/// ```
/// use std::time::Duration;
/// let sched = fibra::Scheduler::builder().threads(2).build().unwrap();
/// sched.start();
/// let sleeper = sched
///     .task()
///     .name("sleeper")
///     .submit(|| fibra::sleep(Duration::from_secs(1)), None)
///     .unwrap();
/// while sched.metrics().timers() == 0 {
///     std::thread::yield_now();
/// }
/// let dump = sched.dump();
/// let entry = dump.fibers().iter().find(|e| e.name() == Some("sleeper")).unwrap();
/// assert_eq!(entry.status(), fibra::dump::Status::Parked(fibra::dump::WaitOn::Sleep));
/// println!("{dump}");
/// # sleeper.cancel();
/// ```
#[derive(Clone, Debug)]
pub struct Dump {
    pub(crate) name: String,
    pub(crate) live_tasks: usize,
    pub(crate) continuations: usize,
    pub(crate) fibers: Vec<Entry>,
    pub(crate) workers: Vec<WorkerAnswer>,
    pub(crate) taken: Duration,
}

impl Dump {
    /// The listed fibers, sorted by id.
    pub fn fibers(&self) -> &[Entry] {
        &self.fibers
    }

    /// How each worker answered, by index.
    pub fn workers(&self) -> &[WorkerAnswer] {
        &self.workers
    }

    /// Tasks submitted and not finished when the dump began: the listed fibers, tasks queued
    /// that have not started, and fibers of workers that did not answer.
    pub fn live_tasks(&self) -> usize {
        self.live_tasks
    }

    /// How long taking the dump took, all workers together (the caller's wait).
    pub fn took(&self) -> Duration {
        self.taken
    }
}

impl Scheduler {
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
        let sh = self.shared();
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
        // A fibra channel: a fiber taking the dump parks, and its worker goes on answering.
        let (tx, answers) = crate::sync::mpsc::channel();
        let req = DumpRequest::new(requester, move |answer| {
            // A late answer, after the dump gave up waiting, is dropped.
            let _ = tx.send(answer);
        });
        let progress: Vec<u32> = sh.workers.iter().map(|w| w.progress()).collect();
        let n = sh.workers.len();
        let mut got: Vec<Option<(Vec<Entry>, Duration, Duration)>> = (0..n).map(|_| None).collect();
        let mut pending = n;
        // The last worker to answer drops the request, and its sender with it.
        self.ask_workers(Arc::new(req));
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
                        blocked_in: None,
                    });
                    dump.fibers.extend(entries);
                }
                None => {
                    let stuck = stuck_fiber(w, i, seen[i].0);
                    let blocked_in = stuck.as_ref().and_then(|_| {
                        let tid = w.tid.load(Ordering::Relaxed);
                        let nr = crate::sys::thread_view::of(tid)?.blocked_in?;
                        Some(
                            crate::sys::thread_view::syscall_name(nr)
                                .map_or_else(|| format!("system call {nr}"), String::from),
                        )
                    });
                    dump.workers.push(WorkerAnswer {
                        index: i,
                        fibers: usize::from(stuck.is_some()),
                        pause: None,
                        work: Duration::ZERO,
                        stuck_in: stuck.as_ref().map(|e| e.id),
                        blocked_in,
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

/// `d` in the unit that suits it: `850 µs`, `12.3 ms`, `4.05 s`, `3 min 12 s`.
pub(crate) struct Human(pub(crate) Duration);

impl fmt::Display for Human {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let d = self.0;
        if d < Duration::from_millis(1) {
            write!(f, "{} µs", d.as_micros())
        } else if d < Duration::from_secs(1) {
            write!(f, "{:.1} ms", d.as_secs_f64() * 1e3)
        } else if d < Duration::from_secs(120) {
            write!(f, "{:.2} s", d.as_secs_f64())
        } else {
            write!(f, "{} min {} s", d.as_secs() / 60, d.as_secs() % 60)
        }
    }
}

impl fmt::Display for Dump {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let listed = self.fibers.len();
        writeln!(
            f,
            "fibra dump of scheduler '{}': {} live tasks, {} fibers listed, taken in {}",
            self.name,
            Grouped(self.live_tasks as u64),
            Grouped(listed as u64),
            Human(self.taken)
        )?;
        for w in &self.workers {
            match (w.pause, w.stuck_in) {
                (Some(p), _) => writeln!(
                    f,
                    "  worker {}: {} fibers, listed in {} (longest pause {})",
                    w.index,
                    Grouped(w.fibers as u64),
                    Human(w.work),
                    Human(p)
                )?,
                (None, Some(id)) => match &w.blocked_in {
                    Some(call) => writeln!(
                        f,
                        "  worker {}: no answer within {}: stuck in fiber {id}, whose thread \
                         is blocked in the kernel in `{call}`",
                        w.index,
                        Human(DUMP_PATIENCE)
                    )?,
                    None => writeln!(
                        f,
                        "  worker {}: no answer within {}: stuck in fiber {id}, which does not \
                         suspend",
                        w.index,
                        Human(DUMP_PATIENCE)
                    )?,
                },
                (None, None) => writeln!(
                    f,
                    "  worker {}: no answer within {}",
                    w.index,
                    Human(DUMP_PATIENCE)
                )?,
            }
        }
        let unlisted = self.live_tasks.saturating_sub(listed + self.continuations);
        if self.continuations > 0 {
            writeln!(
                f,
                "  {} readiness continuations: waiting for their sockets, with no fiber",
                Grouped(self.continuations as u64)
            )?;
        }
        if unlisted > 0 {
            writeln!(
                f,
                "  {} more tasks: queued and not started, or on a worker that did not answer",
                Grouped(unlisted as u64)
            )?;
        }
        let now = Instant::now();
        for e in &self.fibers {
            writeln!(f)?;
            write!(f, "fiber {}", e.id)?;
            if let Some(name) = &e.name {
                write!(f, " '{name}'")?;
            }
            write!(f, " on worker {}: ", e.worker)?;
            match e.status {
                Status::Running => f.write_str("running")?,
                Status::Ready => f.write_str("ready")?,
                Status::Parked(on) => write!(f, "{on}")?,
            }
            if let Some(d) = e.deadline {
                match d.checked_duration_since(now) {
                    Some(left) => write!(f, ", until {} from now", Human(left))?,
                    None => f.write_str(", deadline passed")?,
                }
            }
            if let Some(d) = e.for_ {
                match e.status {
                    Status::Running => write!(f, ", for at least {}", Human(d))?,
                    Status::Ready | Status::Parked(_) => write!(f, ", for {}", Human(d))?,
                }
            }
            if e.cancelled {
                f.write_str(" (cancelled)")?;
            }
            writeln!(f)?;
            writeln!(f, "    submitted at {}", e.location)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn human_durations() {
        assert_eq!(Human(Duration::ZERO).to_string(), "0 µs");
        assert_eq!(Human(Duration::from_micros(850)).to_string(), "850 µs");
        assert_eq!(Human(Duration::from_micros(12_340)).to_string(), "12.3 ms");
        assert_eq!(Human(Duration::from_millis(4_050)).to_string(), "4.05 s");
        assert_eq!(Human(Duration::from_secs(192)).to_string(), "3 min 12 s");
        assert!(Human(Duration::MAX).to_string().ends_with(" s"));
    }
}
