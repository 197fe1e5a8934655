//! [`LiveCount`]: how many tasks a scheduler has admitted and not yet finished, counted on
//! one cache line per worker instead of one line for all.
//!
//! Every submit counts a task in and every finished task counts itself out. With one shared
//! counter, each of those is a read-modify-write of a line that all workers take turns
//! owning: the count-out alone takes a cache miss per task, a large part of what ending a
//! short task costs, and on N workers the line only gets hotter. Here each worker counts on
//! its own line (and every thread that is not one of the scheduler's workers on one more,
//! shared line), so the hot paths touch lines that stay in their core's cache. Only readers
//! — the shutdown waiting for zero, metrics — add up all the lines.
//!
//! # Reading a sum of moving counters
//! A task may be counted in on one line and out on another (a fiber spawns on worker 0 and
//! its child, stolen, ends on worker 1), so one signed counter per line could add up to
//! zero while a task lives: read line 0 before the spawn there, line 1 after the child ended
//! there, and the child's count-out cancels the parent's count-in. So each line keeps two counters that only
//! grow, `admitted` and `done`, and a reader adds up every `done` *before* any `admitted`.
//! A task's count-in happens before its count-out (the task is handed over through a queue
//! in between), so every count-out the reader saw has its count-in visible to the later
//! reads: the difference is never below the number of tasks live when the `done` pass
//! ended, and it is zero only if all tasks counted in by then had ended. During a shutdown
//! only live tasks may count new ones in, so zero then stays zero; `loom_model.rs` checks
//! this (and that adding up each line's own difference would fail it). All accesses are
//! SeqCst, which keeps the admit-versus-stop handshake of `Shared::admit` the same as with
//! one counter: count in, then read the phase; the stopper sets the phase, then reads the
//! count; in the single order of SeqCst operations one of them sees the other. (loom does
//! not model SeqCst loads and read-modify-writes that strongly, so that part is not in the
//! model.)

use super::worker::Padded;
#[cfg(loom)]
use loom::sync::atomic::AtomicUsize;
#[cfg(not(loom))]
use std::sync::atomic::AtomicUsize;
use std::sync::atomic::Ordering;

/// One line's two counters (each line `Padded` to a cache line of its own).
struct Line {
    admitted: AtomicUsize,
    done: AtomicUsize,
}

/// Tasks admitted and not yet done, over one line per worker plus one for other threads.
pub(crate) struct LiveCount {
    lines: Box<[Padded<Line>]>,
}

impl LiveCount {
    /// A count of zero with a line for each of `workers` workers and one for other threads.
    pub(crate) fn new(workers: usize) -> LiveCount {
        LiveCount {
            lines: (0..=workers)
                .map(|_| {
                    Padded(Line {
                        admitted: AtomicUsize::new(0),
                        done: AtomicUsize::new(0),
                    })
                })
                .collect(),
        }
    }

    /// The line of worker `worker`, or the shared one of other threads (`None`, or an
    /// index past the workers).
    fn line(&self, worker: Option<usize>) -> &Line {
        let last = self.lines.len() - 1;
        &self.lines[worker.map_or(last, |w| w.min(last))].0
    }

    /// Counts a task in, on the line of `worker` (the calling thread's worker, if it is one).
    pub(crate) fn admit(&self, worker: Option<usize>) {
        self.line(worker).admitted.fetch_add(1, Ordering::SeqCst);
    }

    /// Counts a task out, on the line of `worker` (the calling thread's worker, if it is one).
    pub(crate) fn done(&self, worker: Option<usize>) {
        self.line(worker).done.fetch_add(1, Ordering::SeqCst);
    }

    /// Tasks admitted and not done: never less than those live when the call began (see the
    /// module docs), and 0 only if every task admitted before the call had ended.
    pub(crate) fn get(&self) -> usize {
        // Every `done` first, then every `admitted` (see the module docs).
        let done: usize = self
            .lines
            .iter()
            .map(|l| l.0.done.load(Ordering::SeqCst))
            .fold(0, usize::wrapping_add);
        let admitted: usize = self
            .lines
            .iter()
            .map(|l| l.0.admitted.load(Ordering::SeqCst))
            .fold(0, usize::wrapping_add);
        // Wrapping: the counters only grow, and may wrap on a 32-bit target after 2^32
        // tasks; their difference is still exact.
        admitted.wrapping_sub(done)
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use std::sync::mpsc;
    use std::sync::Arc;

    #[test]
    fn tasks_counted_in_and_out_on_different_lines_add_up() {
        let live = LiveCount::new(2);
        assert_eq!(live.get(), 0);
        live.admit(Some(0));
        live.admit(None);
        live.admit(Some(7)); // past the workers: the shared line
        assert_eq!(live.get(), 3);
        live.done(Some(1));
        live.done(Some(1));
        assert_eq!(live.get(), 1);
        live.done(None);
        assert_eq!(live.get(), 0);
    }

    /// Tasks handed from thread to thread, each counted in on its sender's line and out on
    /// its receiver's, while a reader checks that the count never drops below the tasks it
    /// knows are still live (the root task, until the very end).
    #[test]
    fn a_reader_never_sees_zero_while_a_task_lives() {
        const HOPS: usize = 20_000;
        let live = Arc::new(LiveCount::new(2));
        // The root task: counted in on line 0, out when everything else is done.
        live.admit(Some(0));
        let (to_1, from_0) = mpsc::channel::<()>();
        let (to_0, from_1) = mpsc::channel::<()>();
        let w0 = {
            let live = live.clone();
            std::thread::spawn(move || {
                for _ in 0..HOPS {
                    live.admit(Some(0));
                    to_1.send(()).unwrap();
                    from_1.recv().unwrap();
                    live.done(Some(0));
                }
            })
        };
        let w1 = {
            let live = live.clone();
            std::thread::spawn(move || {
                for _ in 0..HOPS {
                    from_0.recv().unwrap();
                    live.done(Some(1));
                    live.admit(Some(1));
                    to_0.send(()).unwrap();
                }
            })
        };
        while !w0.is_finished() || !w1.is_finished() {
            assert!(live.get() >= 1, "the root task is live");
        }
        w0.join().unwrap();
        w1.join().unwrap();
        assert_eq!(live.get(), 1);
        live.done(None);
        assert_eq!(live.get(), 0);
    }
}
