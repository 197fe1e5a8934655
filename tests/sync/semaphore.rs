//! `fibra::sync::Semaphore`: never more holders than permits, permits handed out in
//! arrival order (a large request is not starved by small ones), timeouts never early.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use crate::common::{finish, started, wait_until, with_deadline, LIMIT};
use fibra::sync::{Mutex, Semaphore};
use fibra::Fiber;

#[test]
fn at_most_permits_holders_at_once_from_fibers_and_threads() {
    with_deadline(|| {
        let sched = started(2);
        let sem = Arc::new(Semaphore::new(3));
        let inside = Arc::new(AtomicUsize::new(0));
        let most = Arc::new(AtomicUsize::new(0));
        let work = {
            let (sem, inside, most) = (sem.clone(), inside.clone(), most.clone());
            move || {
                for _ in 0..100 {
                    let permit = sem.acquire();
                    assert_eq!(permit.num_permits(), 1);
                    let n = inside.fetch_add(1, Ordering::SeqCst) + 1;
                    most.fetch_max(n, Ordering::SeqCst);
                    Fiber::yield_now();
                    inside.fetch_sub(1, Ordering::SeqCst);
                }
            }
        };
        let fibers: Vec<_> = (0..20)
            .map(|_| sched.submit(work.clone(), None).expect("submit"))
            .collect();
        let threads: Vec<_> = (0..2).map(|_| thread::spawn(work.clone())).collect();
        for f in fibers {
            finish(f);
        }
        for t in threads {
            t.join().unwrap();
        }
        assert!(most.load(Ordering::SeqCst) <= 3);
        assert_eq!(sem.available_permits(), 3);
        sched.stop();
    });
}

#[test]
fn waiters_are_served_in_arrival_order_and_a_big_request_is_not_starved() {
    with_deadline(|| {
        let sched = started(1);
        let sem = Arc::new(Semaphore::new(0));
        let log = Arc::new(Mutex::new(Vec::new()));
        let queued = Arc::new(AtomicUsize::new(0));
        // Requests, in arrival order: 1, 3 (the big one), 1, 1.
        let handles: Vec<_> = [1usize, 3, 1, 1]
            .into_iter()
            .enumerate()
            .map(|(i, n)| {
                let (sem, log, queued) = (sem.clone(), log.clone(), queued.clone());
                sched
                    .submit(
                        move || {
                            queued.fetch_add(1, Ordering::SeqCst);
                            let p = sem.acquire_many(n);
                            log.lock().unwrap().push(i);
                            p.forget(); // keep them out, to watch the order
                        },
                        None,
                    )
                    .expect("submit")
            })
            .collect();
        wait_until("all waiting", || queued.load(Ordering::SeqCst) == 4);
        thread::sleep(Duration::from_millis(20));
        // Two permits: the first waiter gets one; the big request does not fit yet, and the
        // small ones behind it must not overtake it.
        sem.release(2);
        wait_until("first served", || log.lock().unwrap().len() == 1);
        thread::sleep(Duration::from_millis(20));
        assert_eq!(*log.lock().unwrap(), [0]);
        assert_eq!(sem.available_permits(), 1);
        assert!(sem.try_acquire().is_none(), "waiters go first");
        sem.release(4);
        for h in handles {
            finish(h);
        }
        assert_eq!(*log.lock().unwrap(), [0, 1, 2, 3]);
        assert_eq!(sem.available_permits(), 0);
        sched.stop();
    });
}

#[test]
fn acquire_timeout_gives_up_never_early() {
    with_deadline(|| {
        let sched = started(1);
        let timeout = Duration::from_millis(30);
        let check = move || {
            let sem = Semaphore::new(1);
            let held = sem.acquire();
            let start = Instant::now();
            assert!(sem.acquire_timeout(timeout).is_none());
            let waited = start.elapsed();
            assert!(waited >= timeout, "woke early: {waited:?}");
            assert!(waited < LIMIT);
            drop(held);
            assert!(sem.acquire_timeout(timeout).is_some());
        };
        finish(sched.submit(check, None).expect("submit"));
        check();
        sched.stop();
    });
}

#[test]
fn try_acquire_and_release_count_permits() {
    let sem = Semaphore::new(2);
    let a = sem.try_acquire().unwrap();
    let b = sem.try_acquire_many(1).unwrap();
    assert!(sem.try_acquire().is_none());
    drop(a);
    assert_eq!(sem.available_permits(), 1);
    b.forget();
    assert_eq!(sem.available_permits(), 1);
    sem.release(2);
    assert_eq!(sem.try_acquire_many(3).map(|p| p.num_permits()), Some(3));
}
