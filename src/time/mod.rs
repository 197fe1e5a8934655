//! Time: [`sleep`] and [`sleep_until`] that suspend only the calling fiber, and the
//! standalone delayed executor [`Timer`]. The timers live
//! on the fiber's home worker (`sched/timers.rs`), so expiry never moves a fiber.

mod timer;

pub use timer::{Timer, TimerHandle};

use crate::fiber::Fiber;
use std::time::{Duration, Instant};

/// Sleeps for `duration`. Inside a scheduled fiber only the fiber sleeps and its worker runs
/// other fibers; elsewhere the thread sleeps. Never returns early. `Duration::ZERO` yields
/// once; huge durations saturate (effectively forever, still cancellable by `stop_timeout`).
///
/// ```
/// use std::time::{Duration, Instant};
/// let start = Instant::now();
/// fibra::sleep(Duration::from_millis(5));
/// assert!(start.elapsed() >= Duration::from_millis(5));
/// ```
pub fn sleep(duration: Duration) {
    if duration.is_zero() {
        Fiber::yield_now();
        return;
    }
    sleep_until(deadline_after(duration));
}

/// Sleeps until `deadline`; a deadline in the past yields once and returns.
pub fn sleep_until(deadline: Instant) {
    let scheduled = crate::fiber::in_scheduled_fiber();
    if Instant::now() >= deadline {
        Fiber::yield_now();
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
        crate::park::park_until(Some(deadline), crate::dump::WaitOn::Sleep, drop);
    }
}

/// The instant `d` from now, saturating about thirty years away instead of overflowing.
pub(crate) fn deadline_after(d: Duration) -> Instant {
    let now = Instant::now();
    now.checked_add(d).unwrap_or_else(|| far_future_from(now))
}

/// A deadline that saturates instead of overflowing (about thirty years away).
pub(crate) fn far_future() -> Instant {
    far_future_from(Instant::now())
}

fn far_future_from(now: Instant) -> Instant {
    now.checked_add(Duration::from_secs(30 * 365 * 24 * 3600))
        .unwrap_or(now)
}
