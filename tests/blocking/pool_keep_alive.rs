//! The blocking pool's keep-alive at its extremes: zero (every idle thread exits at once, so
//! a submitter's pick races an exit at almost every call) and `Duration::MAX` (idle threads
//! never time out). Calls come from four workers at once, back to back and with gaps. Alone
//! in its process: the keep-alive is process-wide, and threads kept for ever would outlive
//! any other test's expectations.

use crate::common::{finish, wait_until, with_deadline};
use std::time::Duration;

/// Runs 12 fibers on `sched` that each make 200 calls, every fourth after a gap of up to
/// 0.5 ms, and checks every result.
fn calls(sched: &fibra::Scheduler) {
    let handles: Vec<_> = (0..12u64)
        .map(|f| {
            sched
                .submit(
                    move || {
                        for i in 0..200u64 {
                            if i.is_multiple_of(4) {
                                fibra::sleep(Duration::from_micros((i * 13 + f * 41) % 500));
                            }
                            assert_eq!(fibra::unblock(move || f * 1_000 + i), f * 1_000 + i);
                        }
                    },
                    None,
                )
                .unwrap()
        })
        .collect();
    handles.into_iter().for_each(finish);
}

#[test]
fn zero_and_unbounded_keep_alives_lose_no_call() {
    crate::common::child_ok(|| {
        with_deadline(|| {
            let sched = fibra::Scheduler::builder().threads(4).build().unwrap();
            sched.start();

            fibra::unblock::set_keep_alive(Duration::ZERO);
            assert_eq!(fibra::unblock::keep_alive(), Duration::ZERO);
            calls(&sched);
            wait_until("every idle pool thread to exit at once", || {
                fibra::unblock::threads() == 0
            });

            fibra::unblock::set_keep_alive(Duration::MAX);
            assert_eq!(fibra::unblock::keep_alive(), Duration::from_nanos(u64::MAX));
            calls(&sched);
            // Nobody times out: the threads that served the calls are all still there.
            std::thread::sleep(Duration::from_millis(50));
            assert!(fibra::unblock::threads() > 0);

            sched.stop();
        });
    });
}
