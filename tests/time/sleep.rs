//! Non-blocking sleep and timed parking: a sleeping fiber frees its worker, sleeps never end
//! early, extreme durations are safe, and a wake racing a timeout resumes exactly once.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

fn scheduler(threads: usize) -> Arc<fibra::Scheduler> {
    let s = fibra::Scheduler::builder()
        .threads(threads)
        .build()
        .unwrap();
    s.start();
    Arc::new(s)
}

#[test]
fn a_sleeping_fiber_does_not_stop_another_on_its_only_worker() {
    let s = scheduler(1);
    let sleeper = s
        .submit(|| fibra::sleep(Duration::from_millis(300)), None)
        .unwrap();
    let started = Instant::now();
    let other = s.submit(|| 7, None).unwrap();
    assert_eq!(other.join().unwrap(), 7);
    assert!(
        started.elapsed() < Duration::from_millis(250),
        "the other fiber waited for the sleeper: {:?}",
        started.elapsed()
    );
    sleeper.join().unwrap();
}

#[test]
fn ten_thousand_sleepers_on_two_workers_overlap() {
    let s = scheduler(2);
    let started = Instant::now();
    let hs: Vec<_> = (0..10_000)
        .map(|_| {
            s.submit(|| fibra::sleep(Duration::from_millis(100)), None)
                .unwrap()
        })
        .collect();
    for h in hs {
        h.join().unwrap();
    }
    let took = started.elapsed();
    assert!(took >= Duration::from_millis(100));
    // Serially this would take 1000 s; overlapped it is ~0.1 s. 2 s is generous for CI.
    assert!(took < Duration::from_secs(2), "took {took:?}");
}

const MASS_SLEEPERS: usize = 5_000;

/// Runs `busy` fibers that yield until `MASS_SLEEPERS` fibers, all sleeping until one
/// deadline on the same single worker, have woken. Asserts that none woke early; returns how
/// many turns the busy fibers had between the first sleeper's wake-up and the last one's.
fn mass_expiry_beside(busy: usize) -> usize {
    let s = scheduler(1);
    let turns = Arc::new(AtomicUsize::new(0));
    let left = Arc::new(AtomicUsize::new(MASS_SLEEPERS));
    let busy: Vec<_> = (0..busy)
        .map(|_| {
            let (turns, left) = (turns.clone(), left.clone());
            s.submit(
                move || {
                    while left.load(Ordering::Acquire) > 0 {
                        turns.fetch_add(1, Ordering::Relaxed);
                        fibra::Fiber::yield_now();
                    }
                },
                None,
            )
            .unwrap()
        })
        .collect();
    // Far enough ahead for every sleeper to have started and parked on a loaded machine.
    let deadline = Instant::now() + Duration::from_millis(300);
    let sleepers: Vec<_> = (0..MASS_SLEEPERS)
        .map(|_| {
            let (turns, left) = (turns.clone(), left.clone());
            s.submit(
                move || {
                    fibra::sleep_until(deadline);
                    let woke = Instant::now();
                    let seen = turns.load(Ordering::Relaxed);
                    left.fetch_sub(1, Ordering::AcqRel);
                    (woke, seen)
                },
                None,
            )
            .unwrap()
        })
        .collect();
    let woke: Vec<(Instant, usize)> = sleepers.into_iter().map(|h| h.join().unwrap()).collect();
    for h in busy {
        h.join().unwrap();
    }
    assert!(
        woke.iter().all(|&(at, _)| at >= deadline),
        "a sleeper woke early"
    );
    let first = woke.iter().map(|&(_, t)| t).min().unwrap();
    let last = woke.iter().map(|&(_, t)| t).max().unwrap();
    last - first
}

/// Thousands of timers coming due at once on a worker that runs a few other fibers: every
/// sleeper wakes, none early, and the busy fibers keep their turns while the sleepers are
/// woken (the worker wakes a few due fibers at a time, not all of them ahead of the rest).
#[test]
fn a_mass_expiry_wakes_every_sleeper_while_busy_fibers_keep_running() {
    let turns = mass_expiry_beside(3);
    // Woken all at once behind the busy fibers, the sleepers ran back to back: the busy
    // fibers got about one turn each in between. A few at a time, they share the worker.
    assert!(
        turns >= MASS_SLEEPERS / 10,
        "the busy fibers had {turns} turns while {MASS_SLEEPERS} sleepers were woken"
    );
}

/// The same behind more ready fibers than a batch of woken ones: then every due fiber is
/// woken at once, to wait its turn behind them; still every sleeper wakes, none early.
#[test]
fn a_mass_expiry_behind_many_busy_fibers_wakes_every_sleeper() {
    mass_expiry_beside(12);
}

#[test]
fn sleep_never_returns_early_in_fibers_or_threads() {
    let s = scheduler(2);
    let hs: Vec<_> = (1..=50u64)
        .map(|ms| {
            s.submit(
                move || {
                    let d = Duration::from_millis(ms);
                    let t = Instant::now();
                    fibra::sleep(d);
                    (t.elapsed(), d)
                },
                None,
            )
            .unwrap()
        })
        .collect();
    for h in hs {
        let (slept, asked) = h.join().unwrap();
        assert!(slept >= asked, "slept {slept:?} < {asked:?}");
    }
    let t = Instant::now();
    fibra::sleep(Duration::from_millis(20));
    assert!(t.elapsed() >= Duration::from_millis(20));
    let deadline = Instant::now() + Duration::from_millis(15);
    let h = s
        .submit(move || fibra::sleep_until(deadline), None)
        .unwrap();
    h.join().unwrap();
    assert!(Instant::now() >= deadline);
}

/// Deadlines are exact, not rounded to a 1 ms tick: 2 000 fibers on two workers each sleep
/// five pseudo-random durations from 1 µs to 3 ms (sub-millisecond ones included, many sharing
/// a millisecond), and park five times until a pseudo-random instant with nobody to unpark
/// them — so only the worker's timer ends that park, and it must not fire before the
/// deadline (`sleep` alone would hide an early timer: it parks again until the deadline).
/// How late they wake is a benchmark's figure (`cargo bench --bench timers --
/// sleep_precision`), not a test's.
#[test]
fn sleeps_of_any_length_never_return_early() {
    let s = scheduler(2);
    let hs: Vec<_> = (0..2_000u64)
        .map(|k| {
            s.submit(
                move || {
                    let mut x = k.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
                    let mut next = move || {
                        x ^= x << 13;
                        x ^= x >> 7;
                        x ^= x << 17;
                        Duration::from_nanos(1_000 + x % 3_000_000)
                    };
                    for _ in 0..5 {
                        let d = next();
                        let t = Instant::now();
                        fibra::sleep(d);
                        let slept = t.elapsed();
                        assert!(slept >= d, "slept {slept:?} < {d:?}");
                        let deadline = Instant::now() + next();
                        let r = fibra::park_timeout(deadline, drop);
                        assert_eq!(r, fibra::ParkResult::TimedOut);
                        assert!(Instant::now() >= deadline, "the timer fired early");
                    }
                },
                None,
            )
            .unwrap()
        })
        .collect();
    for h in hs {
        h.join().unwrap();
    }
}

#[test]
fn zero_and_past_deadlines_yield_once_and_return() {
    // Both tasks are queued before the worker starts, so neither can finish before the other
    // exists and the interleaving below is the only possible one.
    let s = fibra::Scheduler::builder().threads(1).build().unwrap();
    let log = Arc::new(Mutex::new(Vec::new()));
    let (a, b) = (log.clone(), log.clone());
    let h1 = s
        .submit(
            move || {
                a.lock().unwrap().push("a1");
                fibra::sleep(Duration::ZERO);
                a.lock().unwrap().push("a2");
            },
            Some(0),
        )
        .unwrap();
    let h2 = s
        .submit(
            move || {
                b.lock().unwrap().push("b1");
                fibra::sleep_until(Instant::now() - Duration::from_millis(5));
                b.lock().unwrap().push("b2");
            },
            Some(0),
        )
        .unwrap();
    s.start();
    h1.join().unwrap();
    h2.join().unwrap();
    assert_eq!(*log.lock().unwrap(), ["a1", "b1", "a2", "b2"]);
}

#[test]
fn sleeping_forever_saturates_and_stop_timeout_cancels_it() {
    let s = fibra::Scheduler::builder().threads(1).build().unwrap();
    s.start();
    let h = s.submit(|| fibra::sleep(Duration::MAX), None).unwrap();
    assert!(!h.wait_timeout(Duration::from_millis(50)));
    assert_eq!(s.stop_timeout(Duration::from_millis(50)), 1);
    assert!(h.join().unwrap_err().is_cancelled());
}

#[test]
fn wait_timeout_inside_a_fiber_parks_with_a_deadline() {
    let s = scheduler(1);
    let s2 = s.clone();
    let r = s
        .submit(
            move || {
                let slow = s2
                    .submit(|| fibra::sleep(Duration::from_millis(200)), None)
                    .unwrap();
                let t = Instant::now();
                let early = slow.wait_timeout(Duration::from_millis(20));
                let waited = t.elapsed();
                let late = slow.wait_timeout(Duration::from_secs(30));
                (early, waited, late)
            },
            None,
        )
        .unwrap()
        .join()
        .unwrap();
    assert!(!r.0, "the slow task cannot have finished in 20 ms");
    assert!(r.1 >= Duration::from_millis(20));
    assert!(r.2);
}

#[test]
fn a_wake_racing_a_timeout_resumes_exactly_once() {
    let s = scheduler(2);
    let resumed = Arc::new(AtomicUsize::new(0));
    let mut hs = Vec::new();
    for i in 0..500u64 {
        let resumed = resumed.clone();
        hs.push(
            s.submit(
                move || {
                    let deadline = Instant::now() + Duration::from_micros(i % 50);
                    let r = fibra::park_timeout(deadline, |u| {
                        // Unpark from another thread at about the deadline.
                        std::thread::spawn(move || {
                            std::thread::sleep(Duration::from_micros(i % 50));
                            u.unpark();
                        });
                    });
                    resumed.fetch_add(1, Ordering::SeqCst);
                    r
                },
                None,
            )
            .unwrap(),
        );
    }
    // Either outcome is legal; what matters is that each fiber resumed once (a second
    // resumption would run past its end and corrupt the count) and said which side won.
    for h in hs {
        let _won: fibra::ParkResult = h.join().unwrap();
    }
    assert_eq!(resumed.load(Ordering::SeqCst), 500);
}

#[test]
fn a_forever_sleeper_does_not_stall_its_worker_after_time_has_passed() {
    // The worker's timer wheel has moved on by the time the fiber sleeps forever; the
    // far-future timer must be filed ahead, not re-filed on every pass (a busy worker that
    // never runs anything else).
    let s = fibra::Scheduler::builder().threads(1).build().unwrap();
    s.start();
    let forever = s
        .submit(
            || {
                fibra::sleep(Duration::from_millis(120));
                fibra::sleep(Duration::MAX);
            },
            Some(0),
        )
        .unwrap();
    std::thread::sleep(Duration::from_millis(250));
    let other = s.submit(|| 7, Some(0)).unwrap();
    assert!(
        other.wait_timeout(Duration::from_secs(30)),
        "worker stalled"
    );
    assert_eq!(other.join().unwrap(), 7);
    assert!(!forever.is_finished());
    assert_eq!(s.stop_timeout(Duration::from_millis(10)), 1);
}
