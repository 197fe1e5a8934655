//! An idle worker's watch over a busy peer costs little CPU: in a process of its own, so
//! that no other test's scheduler runs beside it.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::common::{finish, started, with_deadline};

/// An idle worker that watches a busy peer's `next` slot (a help request from the peer's
/// burst) backs off while the slot stays empty: after a burst spawned on worker 1, whose
/// other fiber then keeps yielding without spawning, worker 0 wakes a few hundred times a
/// second at most. It woke every 50–150 µs (7 000 times a second) for as long as the peer
/// stayed busy.
#[test]
fn an_idle_worker_backs_off_watching_a_busy_peer_that_spawns_nothing() {
    crate::common::child_ok(|| {
        with_deadline(|| {
            const WINDOW: Duration = Duration::from_millis(300);
            let sched = Arc::new(started(2));
            let stop = Arc::new(AtomicBool::new(false));
            let stop2 = stop.clone();
            let busy = sched
                .submit(
                    move || {
                        while !stop2.load(Ordering::Relaxed) {
                            fibra::Fiber::yield_now();
                        }
                    },
                    Some(1),
                )
                .unwrap();
            let sleeps = |s: &fibra::Scheduler| s.metrics().workers()[0].sleeps();
            let mut worst = 0;
            for _ in 0..3 {
                let s = sched.clone();
                let burst = move || {
                    (0..200)
                        .map(|_| {
                            s.spawn(|| {
                                let until = Instant::now() + Duration::from_micros(20);
                                while Instant::now() < until {
                                    std::hint::spin_loop();
                                }
                            })
                        })
                        .collect::<Vec<_>>()
                };
                for h in finish(sched.submit(burst, Some(1)).unwrap()) {
                    finish(h);
                }
                let before = sleeps(&sched);
                std::thread::sleep(WINDOW);
                worst = worst.max(sleeps(&sched) - before);
            }
            stop.store(true, Ordering::Relaxed);
            finish(busy);
            eprintln!("worker 0's most wake-ups in {WINDOW:?} after a burst: {worst}");
            // 3 000 a second: a loaded machine only stretches the naps.
            assert!(worst < 900, "worker 0 woke {worst} times in {WINDOW:?}");
            sched.stop();
        });
    });
}
