//! [`OwnedScheduler`]: the started scheduler behind a [`ThreadPool`](super::ThreadPool) or a
//! [`Looper`](super::Looper), and stopping it safely from wherever the caller is.

use crate::error::Error;
use crate::sched::{Builder, Scheduler};
use std::thread::ThreadId;

/// A started scheduler that an executor owns, with the ids of its worker threads.
///
/// Stopping waits for every task, so where it is called from matters: on one of the
/// scheduler's own threads it may only *start* the shutdown (waiting there would wait for
/// itself); in a fiber of another scheduler it should park the fiber, not block its worker.
#[derive(Debug)]
pub(super) struct OwnedScheduler {
    pub(super) sched: Scheduler,
    threads: Box<[ThreadId]>,
}

impl OwnedScheduler {
    /// Builds and starts the scheduler, and learns its threads by running one pinned task on
    /// each worker.
    pub(super) fn start(builder: Builder) -> Result<OwnedScheduler, Error> {
        let sched = builder.build()?;
        sched.start();
        let probes: Vec<_> = (0..sched.threads())
            .map(|i| {
                sched
                    .submit(|| std::thread::current().id(), Some(i))
                    .unwrap_or_else(|_| unreachable!("a started scheduler accepts work"))
            })
            .collect();
        let threads = probes
            .into_iter()
            .map(|h| h.join().expect("a probe returns its thread id"))
            .collect();
        Ok(OwnedScheduler { sched, threads })
    }

    /// The first worker's thread (a looper's only one).
    pub(super) fn home_thread(&self) -> ThreadId {
        self.threads[0]
    }

    /// Whether the calling code runs on one of the scheduler's threads.
    pub(super) fn is_home(&self) -> bool {
        self.threads.contains(&std::thread::current().id())
    }

    /// Stops the scheduler (dropping queued, unstarted tasks if `discard_queued`) and, unless
    /// called from its own threads, waits for it: parking a calling fiber through
    /// [`unblock`](crate::unblock()), blocking a calling thread.
    pub(super) fn stop(&self, discard_queued: bool) {
        let stop = || {
            if discard_queued {
                self.sched.stop_discarding_queued();
            } else {
                self.sched.stop();
            }
        };
        if self.is_home() {
            stop(); // from its own fiber: starts the shutdown and returns
        } else {
            crate::unblock(stop);
        }
    }
}
