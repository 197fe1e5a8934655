//! `JoinSet`: tasks joined in the order they finish; cancel-all and cancel-on-drop.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex as StdMutex};
use std::time::Duration;

use crate::common::{finish, started, with_deadline, LIMIT};
use fibra::{JoinHandle, JoinSet};

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
        crate::common::wait_until("the dropped set's tasks to be cancelled", || {
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
        crate::common::wait_until("a task to finish", || {
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

/// Brings the running fiber's coop budget to exactly `n` (`n` below `BUDGET` − 1): the `n + 1`-th
/// budgeted operation from here yields.
fn budget_to(n: usize) {
    let full = fibra::coop::BUDGET as usize - 1;
    while fibra::coop::has_budget_remaining() {
        fibra::coop::consume_budget();
    }
    fibra::coop::consume_budget(); // yields; the budget is full again, less this one
    let mut left = 0;
    // `full` are left after the yield.
    while left < full - n {
        fibra::coop::consume_budget();
        left += 1;
    }
}

/// A `join_next` whose fiber is cancelled at each of its first budget yields (its own, and
/// any inside the take of the task's result): either it returns the task's value, or it
/// unwinds and the task stays in the set for the next call. Never is the value lost.
#[test]
fn join_next_cancelled_at_its_budget_yield_keeps_the_task() {
    for left in 0..3 {
        cancelled_at_a_budget_yield(left, |set| set.join_next());
    }
}

/// The same for `try_join_next`.
#[test]
fn try_join_next_cancelled_at_its_budget_yield_keeps_the_task() {
    for left in 0..3 {
        cancelled_at_a_budget_yield(left, |set| set.try_join_next());
    }
}

type Taker = fn(&mut JoinSet<u32>) -> Option<Result<u32, fibra::JoinError>>;

/// Where a fiber finds its own handle.
type SelfHandle = Arc<StdMutex<Option<Arc<JoinHandle<Option<u32>>>>>>;

fn cancelled_at_a_budget_yield(left: usize, take: Taker) {
    with_deadline(move || {
        let sched = started(1);
        let set: Arc<StdMutex<JoinSet<u32>>> = Arc::new(StdMutex::new(JoinSet::new()));
        let me: SelfHandle = Arc::new(StdMutex::new(None));
        let (s2, m2) = (set.clone(), me.clone());
        let joiner = Arc::new(sched.spawn(move || {
            let me = loop {
                if let Some(h) = m2.lock().unwrap().clone() {
                    break h;
                }
                fibra::sleep(Duration::from_millis(1));
            };
            let mut set = s2.lock().unwrap();
            set.spawn(|| 7u32);
            // Let the task finish.
            fibra::sleep(Duration::from_millis(50));
            // The `left + 1`-th budgeted operation yields, and the worker cancels this
            // fiber there.
            budget_to(left);
            me.cancel();
            take(&mut set).map(|r| r.unwrap())
        }));
        *me.lock().unwrap() = Some(joiner.clone());
        assert!(joiner.wait_timeout(LIMIT));
        drop(me.lock().unwrap().take());
        let joiner = Arc::into_inner(joiner).expect("the fiber let its handle go");
        let mut set = set.lock().unwrap_or_else(|e| e.into_inner());
        match joiner.join() {
            Ok(got) => {
                assert_eq!(got, Some(7), "budget {left}: returned the value");
                assert!(set.is_empty());
            }
            Err(e) => {
                assert!(e.is_cancelled());
                assert_eq!(
                    set.len(),
                    1,
                    "budget {left}: the finished task stays in the set"
                );
                assert_eq!(set.try_join_next().map(|r| r.unwrap()), Some(7));
            }
        }
        drop(set);
        sched.stop();
    });
}
