//! `JoinSet`: tasks joined in the order they finish; cancel-all and cancel-on-drop.

mod common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use common::{finish, started, with_deadline, LIMIT};
use fibra::JoinSet;

#[test]
fn join_next_returns_results_in_completion_order() {
    with_deadline(|| {
        let sched = started(2);
        let h = sched
            .submit(
                || {
                    let mut set = JoinSet::new();
                    // Released one after another in this order, whatever the spawn order.
                    let gates: Vec<_> = (0..5).map(|_| fibra::sync::oneshot::channel()).collect();
                    let mut senders = Vec::new();
                    for (i, (tx, rx)) in gates.into_iter().enumerate() {
                        senders.push(tx);
                        set.spawn(move || {
                            rx.recv().unwrap();
                            i
                        });
                    }
                    assert_eq!(set.len(), 5);
                    let mut order = Vec::new();
                    for (k, tx) in senders.into_iter().enumerate().rev() {
                        tx.send(()).unwrap();
                        order.push(set.join_next().unwrap().unwrap());
                        assert_eq!(set.len(), k);
                    }
                    assert!(set.join_next().is_none());
                    assert!(set.is_empty());
                    order
                },
                None,
            )
            .unwrap();
        assert_eq!(finish(h), [4, 3, 2, 1, 0]);
        sched.stop();
    });
}

#[test]
fn panics_cancellations_and_values_all_come_back() {
    with_deadline(|| {
        let sched = started(2);
        let mut set = JoinSet::new();
        set.spawn_on(&sched, || 1);
        set.spawn_on(&sched, || panic!("boom"));
        let sleeper = set.spawn_on(&sched, || {
            fibra::sleep(Duration::from_secs(3600));
            2
        });
        let (mut ok, mut panicked, mut cancelled) = (0, 0, 0);
        // From a plain thread: join_next blocks the thread.
        for _ in 0..2 {
            match set.join_next().unwrap() {
                Ok(1) => ok += 1,
                Err(e) if e.is_panic() => panicked += 1,
                other => panic!("unexpected {other:?}"),
            }
        }
        set.cancel_all();
        let (id, r) = set.join_next_with_id().unwrap();
        assert_eq!(id, sleeper);
        if r.unwrap_err().is_cancelled() {
            cancelled += 1;
        }
        assert_eq!((ok, panicked, cancelled), (1, 1, 1));
        assert!(set.join_next().is_none());
        sched.stop();
    });
}

#[test]
fn dropping_the_set_cancels_what_is_left() {
    with_deadline(|| {
        let sched = started(2);
        let dropped = Arc::new(AtomicUsize::new(0));
        struct Count(Arc<AtomicUsize>);
        impl Drop for Count {
            fn drop(&mut self) {
                self.0.fetch_add(1, Ordering::SeqCst);
            }
        }
        {
            let mut set = JoinSet::new();
            for _ in 0..50 {
                let c = Count(dropped.clone());
                set.spawn_on(&sched, move || {
                    let _c = c;
                    fibra::sleep(Duration::from_secs(3600));
                });
            }
        }
        common::wait_until("the dropped set's tasks to be cancelled", || {
            dropped.load(Ordering::SeqCst) == 50
        });
        // They were cancelled by the drop, not by the shutdown.
        assert_eq!(sched.stop_timeout(LIMIT), 0);
    });
}

#[test]
fn try_join_next_and_join_all() {
    with_deadline(|| {
        let sched = started(2);
        let mut set = JoinSet::new();
        assert!(set.try_join_next().is_none());
        for i in 0..1000u64 {
            set.spawn_on(&sched, move || i);
        }
        common::wait_until("a task to finish", || {
            // A finished task shows up without waiting.
            set.try_join_next().is_some()
        });
        let rest = set.join_all();
        assert_eq!(rest.len(), 999);
        assert!(rest.iter().all(|r| r.is_ok()));
        sched.stop();
    });
}

#[test]
fn a_set_whose_scheduler_stopped_reports_cancelled() {
    with_deadline(|| {
        let sched = started(1);
        sched.stop();
        let mut set = JoinSet::new();
        set.spawn_on(&sched, || 1);
        assert!(set.join_next().unwrap().unwrap_err().is_cancelled());
    });
}
