//! A select's run: try every operation from a random one; if none completes, watch every
//! channel, try again, offer the rendezvous operations and park; then take the decision
//! back and withdraw what was offered.

use super::{Op, Signal};
use crate::dump::WaitOn;
use crate::park::ParkResult;
use std::cell::Cell;
use std::panic::{catch_unwind, resume_unwind, AssertUnwindSafe};
use std::time::{Duration, Instant};

/// How long a select may wait.
#[doc(hidden)]
pub enum Mode {
    /// Until an operation completes.
    Block,
    /// Not at all (`default =>`).
    Now,
    /// At most this long (`default(timeout) =>`).
    For(Duration),
}

thread_local! {
    static RNG: Cell<u32> = const { Cell::new(0x2545_F491) };
}

/// A cheap random start, so that no ready arm is always preferred.
fn random_start(n: usize) -> usize {
    RNG.with(|r| {
        let mut x = r.get();
        x ^= x << 13;
        x ^= x >> 17;
        x ^= x << 5;
        r.set(x);
        x as usize % n
    })
}

/// Runs a select: returns the index of the operation that completed, or `None` when none
/// did in the time `mode` allows. When several are ready, one is chosen at random.
#[doc(hidden)]
pub fn run(ops: &mut [&mut dyn Op], mode: Mode) -> Option<usize> {
    run_with(ops, mode, false)
}

/// [`run`] for `select_biased!`: the operations are tried, and offered, in their order,
/// so the first that can complete does.
#[doc(hidden)]
pub fn run_biased(ops: &mut [&mut dyn Op], mode: Mode) -> Option<usize> {
    run_with(ops, mode, true)
}

fn run_with(ops: &mut [&mut dyn Op], mode: Mode, biased: bool) -> Option<usize> {
    crate::coop::spend();
    let deadline = match mode {
        Mode::For(d) => Some(crate::sys::deadline_after(d)),
        _ => None,
    };
    let n = ops.len();
    let first = || if biased { 0 } else { random_start(n.max(1)) };
    let attempt = |ops: &mut [&mut dyn Op]| -> Option<usize> {
        let start = first();
        (0..n)
            .map(|k| (start + k) % n)
            .find(|&i| ops[i].try_complete())
    };
    loop {
        if let Some(i) = attempt(ops) {
            return Some(i);
        }
        if matches!(mode, Mode::Now) || deadline.is_some_and(|d| Instant::now() >= d) {
            // The tries looked at the channels one after another: another thread may have
            // filled one already looked at and then emptied one not looked at yet, so that
            // no moment saw them all empty. A second round sees the first change, whose
            // channel only the select may empty now: a select that returns `None` could
            // not have completed anything (crossbeam's `linearizable` tests).
            return attempt(ops);
        }
        let signal = Signal::new();
        for op in ops.iter() {
            op.watch(&signal);
        }
        // From here until the unwatch, code may unwind: a send's message is evaluated when
        // first tried or offered, and a cancelled fiber unwinds out of the park. Either way
        // the offers are taken back and the channels forget the signal (else they would
        // keep it, and fire it, for ever).
        let waited = catch_unwind(AssertUnwindSafe(|| {
            let done = attempt(ops);
            if done.is_some() {
                return (done, ParkResult::Unparked);
            }
            // Nothing is ready: offer the rendezvous operations (a change since the try
            // above has fired the signal, and the park returns at once). The other side
            // takes the oldest offer, so the order of offering is the order of choosing: from
            // a random arm on, so that none is favoured (in order, biased).
            let start = first();
            for k in 0..n {
                let i = (start + k) % n;
                ops[i].offer(&signal, i);
            }
            // An arm ready by the clock (`after`, `tick`) ends the park at its time.
            let due = ops.iter().filter_map(|op| op.ready_at()).min();
            let until = match (deadline, due) {
                (Some(a), Some(b)) => Some(a.min(b)),
                (a, b) => a.or(b),
            };
            (None, signal.park(until, WaitOn::Channel("select")))
        }));
        // From here on the select decides: the other side that took an offer before this
        // completed that arm, and no other arm may complete.
        let claimed = signal.close();
        for (i, op) in ops.iter_mut().enumerate() {
            op.withdraw(&signal, i, claimed == Some(i));
        }
        for op in ops.iter() {
            op.unwatch(&signal);
        }
        // Woken, or timed out (by the select's deadline or an arm's due time): the loop
        // looks again; past the deadline, its top makes the last two rounds.
        let (done, _parked) = waited.unwrap_or_else(|unwind| {
            if let Some(i) = claimed {
                ops[i].pass_on();
            }
            resume_unwind(unwind)
        });
        if claimed.is_some() {
            return claimed;
        }
        if done.is_some() {
            return done;
        }
    }
}
