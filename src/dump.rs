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
pub use crate::park::WaitOn;
use std::fmt;
use std::panic::Location;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// A dump in progress: what the workers answer to.
pub(crate) struct DumpRequest {
    /// The fiber taking the dump, if it is one (it is listed as running).
    pub(crate) requester: Option<FiberId>,
    answers: crate::sync::mpsc::Sender<Answer>,
}

/// A worker's answer: its index, its fibers, its longest pause and its total time.
pub(crate) type Answer = (usize, Vec<Entry>, Duration, Duration);

impl DumpRequest {
    pub(crate) fn new(
        requester: Option<FiberId>,
    ) -> (DumpRequest, crate::sync::mpsc::Receiver<Answer>) {
        let (answers, rx) = crate::sync::mpsc::channel();
        (DumpRequest { requester, answers }, rx)
    }

    /// Worker `index`'s fibers, listed in pauses of at most `pause`, `work` in all. A late
    /// answer, after the dump gave up waiting, is dropped.
    pub(crate) fn answer(
        &self,
        index: usize,
        entries: Vec<Entry>,
        pause: Duration,
        work: Duration,
    ) {
        let _ = self.answers.send((index, entries, pause, work));
    }
}

/// How long [`Scheduler::dump`](crate::Scheduler::dump) waits for the answer of a worker
/// whose loop does not move before it reports the worker as busy (stuck in one fiber); a
/// worker whose loop moves is waited for until it has listed all its fibers.
pub const DUMP_PATIENCE: Duration = Duration::from_millis(100);

/// A fiber's state in a [`Dump`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Status {
    /// Running on its worker: the fiber that took the dump, or one its worker is stuck in.
    Running,
    /// Ready to run (yielded, or woken and not resumed yet).
    Ready,
    /// Suspended until something wakes it.
    Parked(WaitOn),
}

/// One live fiber in a [`Dump`].
#[derive(Clone, Debug)]
pub struct Entry {
    pub(crate) id: FiberId,
    pub(crate) name: Option<Arc<str>>,
    pub(crate) worker: usize,
    pub(crate) status: Status,
    pub(crate) for_: Option<Duration>,
    pub(crate) deadline: Option<Instant>,
    pub(crate) location: &'static Location<'static>,
    pub(crate) cancelled: bool,
}

impl Entry {
    /// The fiber's id.
    pub fn id(&self) -> FiberId {
        self.id
    }

    /// Its name, if it was given one.
    pub fn name(&self) -> Option<&str> {
        self.name.as_deref()
    }

    /// The worker it lives on.
    pub fn worker(&self) -> usize {
        self.worker
    }

    /// Running, ready, or parked on what.
    pub fn status(&self) -> Status {
        self.status
    }

    /// How long it has been in its status: parked since it parked; running for at least
    /// this long (known only when the watchdog watches its worker); `None` for a ready
    /// fiber. Read from a coarse clock that its worker refreshes every 64 fibers it runs:
    /// accurate to a few milliseconds, unless the fiber parked right after a fiber that ran
    /// long without suspending on a scheduler without a watchdog (with one, the worker
    /// refreshes its clock after such a fiber).
    pub fn duration(&self) -> Option<Duration> {
        self.for_
    }

    /// When its park times out (a sleep's end, a timed wait's deadline), if it does.
    pub fn deadline(&self) -> Option<Instant> {
        self.deadline
    }

    /// Where the task was submitted (the caller of `submit`, `spawn`, …).
    pub fn location(&self) -> &'static Location<'static> {
        self.location
    }

    /// Whether it has been cancelled (it is unwinding, or will at its next resumption).
    pub fn is_cancelled(&self) -> bool {
        self.cancelled
    }
}

/// How one worker answered a [`Dump`].
#[derive(Clone, Debug)]
pub struct WorkerAnswer {
    pub(crate) index: usize,
    pub(crate) fibers: usize,
    pub(crate) pause: Option<Duration>,
    pub(crate) work: Duration,
    pub(crate) stuck_in: Option<FiberId>,
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
                (None, Some(id)) => writeln!(
                    f,
                    "  worker {}: no answer within {}: stuck in fiber {id}, which does not \
                     suspend",
                    w.index,
                    Human(DUMP_PATIENCE)
                )?,
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
