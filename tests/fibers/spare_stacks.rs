//! Idle stacks beyond a worker's cache go to a shared spare list with their memory, so that a
//! burst that comes back on another worker reuses them instead of faulting in new pages; the
//! spare list gives its memory back once unused, and at once when the scheduler stops.
//!
//! One test in this binary: the counters it reads (page faults, spare stacks) are
//! process-wide.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

const FIBERS: usize = 1_000;

/// Minor page faults of the whole process so far.
fn minor_faults() -> i64 {
    // SAFETY: getrusage writes the struct it is given, which is valid and zeroed.
    unsafe {
        let mut u: libc::rusage = std::mem::zeroed();
        assert_eq!(libc::getrusage(libc::RUSAGE_SELF, &mut u), 0);
        u.ru_minflt
    }
}

/// `FIBERS` fibers pinned to `worker`, alive at once, each touching 12 KiB of its stack.
fn burst(s: &fibra::Scheduler, worker: usize) {
    crate::common::park_burst::<12>(s, FIBERS, Some(worker), || {});
}

/// Keeps a timer due within 50 ms on `worker` until `stop`: a worker trims idle stacks only
/// when none is, so nothing is given back between the bursts, however slow the machine.
fn keep_busy(s: &fibra::Scheduler, worker: usize, stop: &Arc<AtomicBool>) -> fibra::JoinHandle<()> {
    let stop = stop.clone();
    s.submit(
        move || {
            while !stop.load(Ordering::Relaxed) {
                fibra::sleep(Duration::from_millis(5));
            }
        },
        Some(worker),
    )
    .unwrap()
}

#[test]
fn a_burst_on_another_worker_reuses_spare_stacks_and_spares_are_given_back() {
    crate::common::child_ok(|| {
        let s = fibra::Scheduler::builder()
            .threads(2)
            .stack_cache(16)
            .build()
            .unwrap();
        s.start();
        let stop = Arc::new(AtomicBool::new(false));
        let sleepers = [keep_busy(&s, 0, &stop), keep_busy(&s, 1, &stop)];

        burst(&s, 0);
        let spare = s.metrics().stacks_spare();
        // Worker 0 keeps at most 16 + 63 idle stacks; the rest went to the spare list.
        assert!(
            spare >= FIBERS - 100,
            "{spare} spare stacks\n{}",
            s.metrics()
        );

        // A plain thread that runs a standalone fiber and exits takes at most one batch of spare
        // stacks and leaves the rest for the workers.
        std::thread::spawn(|| {
            let mut fiber = fibra::Fiber::new(fibra::Fiber::yield_now);
            while fiber.resume() != fibra::FiberState::Done {}
        })
        .join()
        .unwrap();
        let left = s.metrics().stacks_spare();
        assert!(left + 32 >= spare, "{left} of {spare} spare stacks left");

        // Worker 1's pool is empty: it takes the spare stacks, whose pages are still there.
        // Without them it faults in three pages per fiber (12 KiB each).
        let before = minor_faults();
        burst(&s, 1);
        let faults = minor_faults() - before;
        assert!(
            faults < (FIBERS as i64),
            "{faults} page faults for a burst of {FIBERS} fibers on spare stacks\n{}",
            s.metrics()
        );

        // Once nothing uses them, idle workers give the spare stacks' memory back.
        stop.store(true, Ordering::Relaxed);
        for h in sleepers {
            h.join().unwrap();
        }
        crate::common::wait_until("idle workers to trim the spare stacks", || {
            s.metrics().stacks_spare() == 0
        });
        assert!(fibra::stack_stats().stacks_free >= FIBERS - 100);

        // A stopping scheduler's workers give back every spare stack at once.
        let stop = Arc::new(AtomicBool::new(false));
        let sleepers = [keep_busy(&s, 0, &stop), keep_busy(&s, 1, &stop)];
        burst(&s, 0);
        assert!(s.metrics().stacks_spare() > 0, "{}", s.metrics());
        stop.store(true, Ordering::Relaxed);
        for h in sleepers {
            h.join().unwrap();
        }
        s.stop();
        assert_eq!(s.metrics().stacks_spare(), 0, "{}", s.metrics());

        // The cache's extremes: keeping every idle stack hands none over (and the cap plus the
        // slack does not overflow); keeping none hands over all but the slack.
        for (cache, spare) in [(usize::MAX, false), (0, true)] {
            let s = fibra::Scheduler::builder()
                .threads(2)
                .stack_cache(cache)
                .build()
                .unwrap();
            s.start();
            let stop = Arc::new(AtomicBool::new(false));
            let sleeper = keep_busy(&s, 0, &stop);
            burst(&s, 0);
            let m = s.metrics();
            assert_eq!(m.stacks_spare() > 0, spare, "stack_cache({cache})\n{m}");
            if !spare {
                // The cache's size is a gauge the worker publishes before it sleeps, which it
                // does within 5 ms (its sleeper's timer): wait for it.
                crate::common::wait_until("the cache's size to be published", || {
                    s.metrics().stacks_cached() >= FIBERS
                });
            }
            stop.store(true, Ordering::Relaxed);
            sleeper.join().unwrap();
            s.stop();
            assert_eq!(s.metrics().stacks_spare(), 0, "{}", s.metrics());
        }
    });
}
