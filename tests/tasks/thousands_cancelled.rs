//! JoinSet and scope with thousands of tasks cancelled midway, and a cancellation racing a
//! task's start.

use std::collections::HashSet;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use crate::common::{started, wait_until, LIMIT};
use fibra::exec::Executor;
use fibra::{JoinSet, Scheduler};

/// JoinSet with 5 000 tasks, cancel_all mid-way: every task comes back exactly once, value
/// or cancelled; dropping a set of 5 000 parked tasks cancels them all promptly.
#[test]
fn tasks_join_set_thousands_with_cancel_mid_way() {
    crate::common::with_deadline(|| {
        const N: usize = 5000;
        let sched = started(2);
        let (values, cancelled, ids) = sched.block_on(|| {
            let mut set = JoinSet::new();
            for i in 0..N {
                set.spawn(move || {
                    if i % 2 == 0 {
                        fibra::sleep(Duration::from_secs(3600));
                    }
                    i
                });
            }
            let mut ids = HashSet::new();
            let (mut values, mut cancelled) = (0, 0);
            // Take some results, then cancel the rest.
            for _ in 0..N / 4 {
                let (id, r) = set.join_next_with_id().unwrap();
                assert!(ids.insert(id));
                assert!(r.unwrap() % 2 == 1);
                values += 1;
            }
            set.cancel_all();
            while let Some((id, r)) = set.join_next_with_id() {
                assert!(ids.insert(id), "returned twice");
                match r {
                    Ok(_) => values += 1,
                    Err(e) => {
                        assert!(e.is_cancelled());
                        cancelled += 1
                    }
                }
            }
            assert!(set.is_empty());
            (values, cancelled, ids.len())
        });
        assert_eq!(ids, N);
        assert_eq!(values + cancelled, N);
        assert!(cancelled >= N / 2, "{cancelled}");
        // Dropping a full set of sleepers.
        let t = Instant::now();
        let drops = Arc::new(AtomicUsize::new(0));
        let d2 = drops.clone();
        sched.block_on(move || {
            let mut set = JoinSet::new();
            for _ in 0..N {
                let c = crate::common::Counted(d2.clone());
                set.spawn(move || {
                    let _c = c;
                    fibra::sleep(Duration::from_secs(3600));
                });
            }
            fibra::sleep(Duration::from_millis(10));
            drop(set);
        });
        wait_until("every dropped set task unwinds", || {
            drops.load(Ordering::SeqCst) == N
        });
        assert!(t.elapsed() < LIMIT);
        wait_until("nothing live", || sched.metrics().live_tasks() == 0);
        sched.stop();
    });
}

/// A scope with 5 000 fibers borrowing the caller's data, half cancelled mid-way through
/// their handles: the scope waits for all, the borrowed data outlives them, and it returns.
#[test]
fn tasks_scope_thousands_with_cancellation() {
    crate::common::with_deadline(|| {
        const N: usize = 5000;
        let sched = started(2);
        let (done, cancelled) = sched.block_on(|| {
            let data: Vec<u64> = (0..N as u64).collect();
            let sum = AtomicUsize::new(0);
            let mut cancelled = 0;
            fibra::scope(|s| {
                let hs: Vec<_> = data
                    .iter()
                    .map(|x| {
                        let sum = &sum;
                        s.spawn(move || {
                            if x % 2 == 0 {
                                fibra::sleep(Duration::from_secs(3600));
                            }
                            sum.fetch_add(*x as usize, Ordering::SeqCst);
                        })
                    })
                    .collect();
                fibra::sleep(Duration::from_millis(20));
                for (i, h) in hs.iter().enumerate() {
                    if i % 2 == 0 {
                        h.cancel();
                    }
                }
                for h in hs {
                    if let Err(e) = h.join() {
                        assert!(e.is_cancelled());
                        cancelled += 1;
                    }
                }
            });
            (sum.load(Ordering::SeqCst), cancelled)
        });
        let odd: usize = (0..N).filter(|x| x % 2 == 1).sum();
        assert_eq!(done, odd);
        assert_eq!(cancelled, N / 2);
        sched.stop();
    });
}

/// `cancel` racing with the start of the task, from another thread, 2 000 times, some before
/// `start` (scheduler not started yet): each join is the value or cancelled, never a hang;
/// a `catching` of a cancelled one runs in a fiber.
#[test]
fn tasks_cancel_racing_the_start() {
    crate::common::with_deadline(|| {
        let sched = Arc::new(Scheduler::builder().threads(2).build().unwrap());
        let early: Vec<_> = (0..100).map(|i| sched.spawn(move || i)).collect();
        for h in &early {
            h.cancel();
        }
        sched.start();
        let in_fiber = Arc::new(AtomicUsize::new(0));
        for h in early {
            let f = in_fiber.clone();
            h.catching(move |_| {
                if fibra::current_worker().is_some() {
                    f.fetch_add(1, Ordering::SeqCst);
                }
            });
            assert!(h.join().unwrap_err().is_cancelled());
        }
        let (mut ok, mut cancelled) = (0, 0);
        for i in 0..2000u32 {
            let h = Arc::new(sched.spawn(move || {
                if i % 3 == 0 {
                    fibra::Fiber::yield_now();
                }
                i
            }));
            let h2 = h.clone();
            let t = thread::spawn(move || h2.cancel());
            t.join().unwrap();
            assert!(h.wait_timeout(LIMIT), "task {i} never finished");
            let h = Arc::try_unwrap(h).ok().unwrap();
            match h.join() {
                Ok(v) => {
                    assert_eq!(v, i);
                    ok += 1
                }
                Err(e) => {
                    assert!(e.is_cancelled());
                    cancelled += 1
                }
            }
        }
        eprintln!(
            "ok {ok} cancelled {cancelled}; early catching in fiber: {}",
            in_fiber.load(Ordering::SeqCst)
        );
        sched.stop();
    });
}
