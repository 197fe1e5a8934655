//! A worker's timers: fibers parked with a deadline. Entries live on the fiber's home worker,
//! so expiry never moves a fiber. A timer whose fiber was woken earlier is discarded lazily
//! when it reaches the top: its park generation no longer matches.

use crate::sched::task::Job;
use std::cmp::Ordering;
use std::collections::BinaryHeap;
use std::sync::Arc;
use std::time::Instant;

pub(crate) struct TimerEntry {
    pub(crate) deadline: Instant,
    seq: u64,
    pub(crate) job: Arc<dyn Job>,
    pub(crate) gen: u64,
}

impl PartialEq for TimerEntry {
    fn eq(&self, other: &Self) -> bool {
        self.deadline == other.deadline && self.seq == other.seq
    }
}
impl Eq for TimerEntry {}
impl PartialOrd for TimerEntry {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for TimerEntry {
    /// Reversed, so the max-heap pops the earliest deadline (then the earliest inserted).
    fn cmp(&self, other: &Self) -> Ordering {
        other
            .deadline
            .cmp(&self.deadline)
            .then_with(|| other.seq.cmp(&self.seq))
    }
}

/// The deadline-ordered timers of one worker.
#[derive(Default)]
pub(crate) struct TimerHeap {
    heap: BinaryHeap<TimerEntry>,
    seq: u64,
}

impl TimerHeap {
    pub(crate) fn push(&mut self, deadline: Instant, job: Arc<dyn Job>, gen: u64) {
        self.seq += 1;
        self.heap.push(TimerEntry {
            deadline,
            seq: self.seq,
            job,
            gen,
        });
    }

    /// The earliest deadline, if any.
    pub(crate) fn next_deadline(&self) -> Option<Instant> {
        self.heap.peek().map(|e| e.deadline)
    }

    /// Removes and returns a timer due at `now`.
    pub(crate) fn pop_due(&mut self, now: Instant) -> Option<TimerEntry> {
        if self.heap.peek()?.deadline <= now {
            self.heap.pop()
        } else {
            None
        }
    }

    pub(crate) fn len(&self) -> usize {
        self.heap.len()
    }
}
