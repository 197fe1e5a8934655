//! Time: [`sleep`] and [`sleep_until`] that suspend only the calling fiber, and the
//! standalone delayed executor [`Timer`]. The timers live
//! on the fiber's home worker (`sched/timers.rs`), so expiry never moves a fiber.

mod timer;

pub use timer::{Timer, TimerHandle};

use crate::fiber::Fiber;
use crate::sys::deadline_after;
use std::time::{Duration, Instant};

/// Sleeps for `duration`. Inside a scheduled fiber only the fiber sleeps and its worker runs
/// other fibers; elsewhere the thread sleeps. Never returns early. `Duration::ZERO` yields
/// once; huge durations saturate (effectively forever, still cancellable by `stop_timeout`).
///
/// # Precision
///
/// The deadline is kept to the nanosecond, not rounded to a tick: the fiber becomes
/// runnable at the first moment its worker sees the deadline passed. An idle worker sleeps
/// until exactly that deadline, so the sleep overshoots by the thread's wake-up latency —
/// the kernel's timer slack (50 µs by default) plus the return from the futex or
/// `epoll_pwait2`, the same as for [`std::thread::sleep`], so a loop of `sleep(1 ms)` runs
/// a little below 1 kHz. A deadline that falls within the 50 µs an idle worker spins before
/// it sleeps is met within a few microseconds. A busy worker looks at its timers every 16
/// tasks and whenever it runs out of work, so a sleep ends later if the worker is running
/// other fibers, and after a fiber that runs without yielding. On a kernel older than 5.11
/// (no `epoll_pwait2`), the worker that sleeps in the I/O poller rounds its timeout up to
/// the next millisecond. `cargo bench --bench timers -- sleep_precision` measures it.
///
/// ```
/// use std::time::{Duration, Instant};
/// let start = Instant::now();
/// fibra::sleep(Duration::from_millis(5));
/// assert!(start.elapsed() >= Duration::from_millis(5));
/// ```
pub fn sleep(duration: Duration) {
    if duration.is_zero() {
        yield_once(crate::fiber::in_scheduled_fiber());
        return;
    }
    sleep_until(deadline_after(duration));
}

/// Sleeps until `deadline`; a deadline in the past yields once and returns. Never returns
/// before `deadline`; how soon after it is described under [`sleep`]'s precision.
pub fn sleep_until(deadline: Instant) {
    let scheduled = crate::fiber::in_scheduled_fiber();
    if Instant::now() >= deadline {
        yield_once(scheduled);
        return;
    }
    if !scheduled {
        while let Some(left) = deadline.checked_duration_since(Instant::now()) {
            if left.is_zero() {
                break;
            }
            std::thread::sleep(left);
        }
        return;
    }
    // Nobody else holds the Unparker, so only the deadline ends the park.
    while Instant::now() < deadline {
        crate::park::park_until(Some(deadline), crate::park::WaitOn::Sleep, drop);
    }
}

/// A sleep with nothing to wait for: a scheduled fiber yields to its worker's others; a
/// standalone fiber, like a plain thread, yields the thread (a standalone fiber's yield
/// would return to whoever resumed it, which a sleep must not do: its waits block the
/// thread).
fn yield_once(scheduled: bool) {
    if scheduled {
        Fiber::yield_now();
    } else {
        std::thread::yield_now();
    }
}
