//! The blocking pool behind `fibra::unblock`: it grows on demand up to its cap and idle
//! threads exit after the keep-alive. One test, alone in its process, because the pool and
//! its settings are process-wide.

use crate::common::{finish, wait_until, with_deadline};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::Duration;

/// Runs `calls` concurrent unblock calls that each block for `hold`; returns the most that
/// ran at once.
fn burst(sched: &fibra::Scheduler, calls: usize, hold: Duration) -> usize {
    peak_of(sched, calls, 1, hold)
}

/// Runs `fibers` fibers that each make `calls` quick unblock calls one after another;
/// returns the most that ran at once.
fn back_to_back(sched: &fibra::Scheduler, fibers: usize, calls: usize) -> usize {
    peak_of(sched, fibers, calls, Duration::ZERO)
}

/// Runs `fibers` fibers that each make `calls` unblock calls one after another, each
/// blocking for `hold` (not at all if zero); returns the most that ran at once.
fn peak_of(sched: &fibra::Scheduler, fibers: usize, calls: usize, hold: Duration) -> usize {
    let running = Arc::new(AtomicUsize::new(0));
    let peak = Arc::new(AtomicUsize::new(0));
    let handles: Vec<_> = (0..fibers)
        .map(|_| {
            let (running, peak) = (running.clone(), peak.clone());
            sched
                .submit(
                    move || {
                        for _ in 0..calls {
                            fibra::unblock(|| {
                                let now = running.fetch_add(1, Ordering::SeqCst) + 1;
                                peak.fetch_max(now, Ordering::SeqCst);
                                if !hold.is_zero() {
                                    thread::sleep(hold);
                                }
                                running.fetch_sub(1, Ordering::SeqCst);
                            })
                        }
                    },
                    None,
                )
                .unwrap()
        })
        .collect();
    handles.into_iter().for_each(finish);
    peak.load(Ordering::SeqCst)
}

#[test]
fn grows_on_demand_to_its_cap_and_shrinks_when_idle() {
    crate::common::child_ok(|| {
        with_deadline(|| {
            assert_eq!(
                fibra::unblock::max_threads(),
                fibra::unblock::DEFAULT_MAX_THREADS
            );
            assert_eq!(
                fibra::unblock::keep_alive(),
                fibra::unblock::DEFAULT_KEEP_ALIVE
            );
            assert_eq!(
                fibra::unblock::threads(),
                0,
                "no thread before the first call"
            );
            let sched = fibra::Scheduler::builder().threads(2).build().unwrap();
            sched.start();

            // Blocking calls that all wait at once get a thread each: the pool grows.
            let peak = burst(&sched, 8, Duration::from_millis(100));
            assert!(peak >= 4, "8 blocking calls ran at most {peak} at a time");
            assert!(fibra::unblock::threads() >= peak);

            // Idle threads leave after the keep-alive. (Threads already asleep apply the new
            // keep-alive from their next wait, so wake them all with one more burst first.)
            fibra::unblock::set_keep_alive(Duration::from_millis(100));
            assert_eq!(fibra::unblock::keep_alive(), Duration::from_millis(100));
            burst(&sched, 8, Duration::from_millis(20));
            wait_until("idle blocking threads to exit", || {
                fibra::unblock::threads() == 0
            });

            // With a cap of 2, calls beyond two wait their turn; all of them complete.
            fibra::unblock::set_max_threads(2);
            assert_eq!(fibra::unblock::max_threads(), 2);
            let peak = burst(&sched, 6, Duration::from_millis(30));
            assert!(peak <= 2, "cap 2, but {peak} calls ran at once");
            assert!(fibra::unblock::threads() <= 2);

            // Back-to-back calls, which a pool thread spins for between them, keep to the cap
            // as well, and their threads still leave after the keep-alive.
            wait_until("idle blocking threads to exit", || {
                fibra::unblock::threads() == 0
            });
            fibra::unblock::set_max_threads(1);
            let peak = back_to_back(&sched, 4, 300);
            assert_eq!(peak, 1, "cap 1, but {peak} calls ran at once");
            assert!(fibra::unblock::threads() <= 1);
            wait_until("the blocking thread to exit", || {
                fibra::unblock::threads() == 0
            });
            sched.stop();
        });
    });
}

#[test]
#[should_panic(expected = "needs a thread")]
fn a_cap_of_zero_is_refused() {
    fibra::unblock::set_max_threads(0);
}
