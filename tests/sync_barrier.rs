//! `fibra::sync::Barrier`: everybody waits for the last party, exactly one leader per
//! round, and the barrier can be reused; fibers and threads can meet at the same barrier.

mod common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread;

use common::{finish, with_deadline};
use fibra::sync::Barrier;
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
