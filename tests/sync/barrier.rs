//! `fibra::sync::Barrier`: everybody waits for the last party, exactly one leader per
//! round, and the barrier can be reused; fibers and threads can meet at the same barrier.
//! `wait_timeout` times out no earlier than asked and a party that timed out (or was
//! cancelled) no longer counts as arrived.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use crate::common::{finish, with_deadline, LIMIT};
use fibra::sync::{Barrier, BarrierWaitResult};
use fibra::Scheduler;

#[test]
fn one_leader_per_round_over_many_rounds_with_fibers_and_a_thread() {
    with_deadline(|| {
        const ROUNDS: usize = 50;
        const FIBERS: usize = 9;
        let sched = Scheduler::builder().threads(2).build().expect("build");
        sched.start();
        let barrier = Arc::new(Barrier::new(FIBERS + 1));
        let leaders = Arc::new(AtomicUsize::new(0));
        let arrived = Arc::new(AtomicUsize::new(0));
        let party = {
            let (barrier, leaders, arrived) = (barrier.clone(), leaders.clone(), arrived.clone());
            move || {
                for round in 0..ROUNDS {
                    arrived.fetch_add(1, Ordering::SeqCst);
                    if barrier.wait().is_leader() {
                        leaders.fetch_add(1, Ordering::SeqCst);
                    }
                    // Nobody passes before every party of this round has arrived.
                    assert!(arrived.load(Ordering::SeqCst) >= (round + 1) * (FIBERS + 1));
                }
            }
        };
        let fibers: Vec<_> = (0..FIBERS)
            .map(|_| sched.submit(party.clone(), None).expect("submit"))
            .collect();
        let thread = thread::spawn(party);
        for f in fibers {
            finish(f);
        }
        thread.join().unwrap();
        assert_eq!(leaders.load(Ordering::SeqCst), ROUNDS);
        assert_eq!(arrived.load(Ordering::SeqCst), ROUNDS * (FIBERS + 1));
        sched.stop();
    });
}

#[test]
fn a_barrier_of_one_never_waits() {
    let b = Barrier::new(1);
    assert!(b.wait().is_leader());
    assert!(b.wait().is_leader());
    assert!(Barrier::new(0).wait().is_leader());
}

// --- wait_timeout -------------------------------------------------------------------------

/// `wait_timeout` on a fiber of `sched`, returning its result and how long it took.
fn fiber_wait_timeout(
    sched: &Scheduler,
    barrier: &Arc<Barrier>,
    timeout: Duration,
) -> fibra::JoinHandle<(Option<BarrierWaitResult>, Duration)> {
    let b = barrier.clone();
    sched
        .submit(
            move || {
                let start = Instant::now();
                (b.wait_timeout(timeout), start.elapsed())
            },
            None,
        )
        .expect("submit")
}

#[test]
fn wait_timeout_alone_times_out_no_earlier_than_asked_on_a_thread_and_a_fiber() {
    with_deadline(|| {
        let sched = crate::common::started(1);
        let barrier = Arc::new(Barrier::new(2));
        let timeout = Duration::from_millis(60);
        let start = Instant::now();
        assert!(barrier.wait_timeout(timeout).is_none());
        assert!(start.elapsed() >= timeout);
        let (r, took) = finish(fiber_wait_timeout(&sched, &barrier, timeout));
        assert!(r.is_none());
        assert!(took >= timeout);
        // Both took their arrivals back: the next round still needs two parties.
        assert!(barrier.wait_timeout(Duration::from_millis(20)).is_none());
        let fiber = fiber_wait_timeout(&sched, &barrier, LIMIT);
        let mine = barrier.wait_timeout(LIMIT).expect("released");
        let (theirs, _) = finish(fiber);
        assert!(mine.is_leader() != theirs.expect("released").is_leader());
        sched.stop();
    });
}

#[test]
fn zero_timeout_returns_at_once_and_can_complete_a_round() {
    with_deadline(|| {
        // Parties of 0 or 1 (and so any timeout) release at once, as the leader.
        assert!(Barrier::new(0)
            .wait_timeout(Duration::ZERO)
            .unwrap()
            .is_leader());
        assert!(Barrier::new(1)
            .wait_timeout(Duration::ZERO)
            .unwrap()
            .is_leader());
        let sched = crate::common::started(2);
        let barrier = Arc::new(Barrier::new(2));
        assert!(barrier.wait_timeout(Duration::ZERO).is_none());
        let (r, _) = finish(fiber_wait_timeout(&sched, &barrier, Duration::ZERO));
        assert!(r.is_none());
        // A party waiting for ever (`Duration::MAX`), on a fiber; zero-timeout calls from
        // this thread come and go until one of them arrives after it and completes the
        // round, as the leader. None of the failed ones counts.
        let waiter = fiber_wait_timeout(&sched, &barrier, Duration::MAX);
        let deadline = Instant::now() + LIMIT;
        let mine = loop {
            if let Some(r) = barrier.wait_timeout(Duration::ZERO) {
                break r;
            }
            assert!(Instant::now() < deadline, "the waiting fiber never arrived");
            thread::sleep(Duration::from_millis(1));
        };
        // Usually this call is the leader; a thread watches its node for a few microseconds
        // even with a zero timeout, so the fiber may arrive meanwhile and lead instead.
        let (theirs, _) = finish(waiter);
        assert!(mine.is_leader() != theirs.expect("released").is_leader());
        // The same the other way round: a thread waits for ever, a fiber polls with zero.
        let b = barrier.clone();
        let waiter = thread::spawn(move || b.wait_timeout(Duration::MAX));
        let b = barrier.clone();
        let poller = sched
            .submit(
                move || {
                    let deadline = Instant::now() + LIMIT;
                    loop {
                        if let Some(r) = b.wait_timeout(Duration::ZERO) {
                            return r;
                        }
                        assert!(
                            Instant::now() < deadline,
                            "the waiting thread never arrived"
                        );
                        fibra::sleep(Duration::from_millis(1));
                    }
                },
                None,
            )
            .expect("submit");
        // As above, a zero-timeout wait may still be released by an arrival that comes
        // before its timer fires; either way exactly one of the two leads.
        let polled = finish(poller);
        assert!(polled.is_leader() != waiter.join().unwrap().expect("released").is_leader());
        sched.stop();
    });
}

#[test]
fn enough_parties_release_fibers_and_threads_over_many_rounds() {
    with_deadline(|| {
        const ROUNDS: usize = 30;
        const FIBERS: usize = 6;
        const THREADS: usize = 2;
        let sched = crate::common::started(2);
        let barrier = Arc::new(Barrier::new(FIBERS + THREADS));
        let leaders = Arc::new(AtomicUsize::new(0));
        let arrived = Arc::new(AtomicUsize::new(0));
        let party = {
            let (barrier, leaders, arrived) = (barrier.clone(), leaders.clone(), arrived.clone());
            move || {
                for round in 0..ROUNDS {
                    arrived.fetch_add(1, Ordering::SeqCst);
                    let r = barrier.wait_timeout(LIMIT).expect("released in time");
                    if r.is_leader() {
                        leaders.fetch_add(1, Ordering::SeqCst);
                    }
                    assert!(arrived.load(Ordering::SeqCst) >= (round + 1) * (FIBERS + THREADS));
                }
            }
        };
        let fibers: Vec<_> = (0..FIBERS)
            .map(|_| sched.submit(party.clone(), None).expect("submit"))
            .collect();
        let threads: Vec<_> = (0..THREADS).map(|_| thread::spawn(party.clone())).collect();
        fibers.into_iter().for_each(finish);
        threads.into_iter().for_each(|t| t.join().unwrap());
        assert_eq!(leaders.load(Ordering::SeqCst), ROUNDS);
        sched.stop();
    });
}

#[test]
fn a_timed_out_party_leaves_its_round_open_for_n_others() {
    with_deadline(|| {
        let sched = crate::common::started(2);
        let barrier = Arc::new(Barrier::new(3));
        // Round 1: a fiber waits; a thread arrives and times out; the round must still need
        // two more parties, so one more arrival does not release it.
        let first = fiber_wait_timeout(&sched, &barrier, LIMIT);
        assert!(barrier.wait_timeout(Duration::from_millis(30)).is_none());
        // Had the timed-out arrival stayed counted, this one would complete the round.
        let (r, _) = finish(fiber_wait_timeout(
            &sched,
            &barrier,
            Duration::from_millis(30),
        ));
        assert!(r.is_none(), "a timed-out party still counted as arrived");
        assert!(!first.is_finished());
        // Two more parties, a thread and this thread, complete it with the first.
        let b = barrier.clone();
        let second = thread::spawn(move || b.wait_timeout(LIMIT));
        let third = barrier.wait_timeout(LIMIT).expect("released");
        let results = [
            third,
            finish(first).0.expect("released"),
            second.join().unwrap().expect("released"),
        ];
        assert_eq!(results.iter().filter(|r| r.is_leader()).count(), 1);
        // Round 2 works as any other, with `wait` and `wait_timeout` mixed.
        let b = barrier.clone();
        let a = thread::spawn(move || b.wait());
        let b = barrier.clone();
        let f = sched.submit(move || b.wait(), None).expect("submit");
        let mine = barrier.wait_timeout(LIMIT).expect("released");
        let leaders = [mine, a.join().unwrap(), finish(f)];
        assert_eq!(leaders.iter().filter(|r| r.is_leader()).count(), 1);
        sched.stop();
    });
}

#[test]
fn short_timeouts_retried_against_a_waiting_partner_keep_rounds_aligned() {
    // One party retries 1 ms timeouts until released, the other waits: timeouts race with
    // releases all the time, and every round must still pair exactly one arrival of each.
    fn run(retrier_on_fiber: bool) {
        const ROUNDS: usize = 100;
        let sched = crate::common::started(2);
        let barrier = Arc::new(Barrier::new(2));
        let passed = Arc::new([AtomicUsize::new(0), AtomicUsize::new(0)]);
        let retrier = {
            let (b, passed) = (barrier.clone(), passed.clone());
            move || {
                let deadline = Instant::now() + LIMIT;
                let mut leaders = 0;
                for round in 0..ROUNDS {
                    let r = loop {
                        if let Some(r) = b.wait_timeout(Duration::from_millis(1)) {
                            break r;
                        }
                        assert!(Instant::now() < deadline, "round {round} never released");
                    };
                    passed[0].fetch_add(1, Ordering::SeqCst);
                    // The partner cannot be more than a round ahead or behind.
                    let other = passed[1].load(Ordering::SeqCst);
                    assert!(
                        other.abs_diff(round + 1) <= 1,
                        "round {round}: partner at {other}"
                    );
                    leaders += r.is_leader() as usize;
                }
                leaders
            }
        };
        let waiter = {
            let (b, passed) = (barrier.clone(), passed.clone());
            move || {
                let mut leaders = 0;
                for round in 0..ROUNDS {
                    let r = b.wait();
                    passed[1].fetch_add(1, Ordering::SeqCst);
                    let other = passed[0].load(Ordering::SeqCst);
                    assert!(
                        other.abs_diff(round + 1) <= 1,
                        "round {round}: partner at {other}"
                    );
                    leaders += r.is_leader() as usize;
                }
                leaders
            }
        };
        let leaders = if retrier_on_fiber {
            let f = sched.submit(retrier, None).expect("submit");
            let t = thread::spawn(waiter);
            t.join().unwrap() + finish(f)
        } else {
            let f = sched.submit(waiter, None).expect("submit");
            let t = thread::spawn(retrier);
            t.join().unwrap() + finish(f)
        };
        assert_eq!(leaders, ROUNDS);
        sched.stop();
    }
    with_deadline(|| {
        run(true);
        run(false);
    });
}

#[test]
fn a_cancelled_wait_timeout_takes_its_arrival_back() {
    with_deadline(|| {
        let sched = crate::common::started(1);
        let barrier = Arc::new(Barrier::new(2));
        let arrived = Arc::new(AtomicUsize::new(0));
        let (b, a) = (barrier.clone(), arrived.clone());
        let fiber = sched
            .submit(
                move || {
                    a.store(1, Ordering::SeqCst);
                    b.wait_timeout(Duration::MAX)
                },
                None,
            )
            .expect("submit");
        crate::common::wait_until("the fiber to start", || arrived.load(Ordering::SeqCst) == 1);
        // Cancels the fiber in its wait.
        sched.stop_timeout(Duration::from_millis(50));
        assert!(fiber.join().is_err());
        // Its arrival is gone: a lone party times out instead of completing a round.
        assert!(barrier.wait_timeout(Duration::from_millis(20)).is_none());
    });
}
