//! `fibra::sync::Mutex`: a fiber holding the lock across a suspension does not deadlock its
//! worker, waiters are served in arrival order, fibers and threads exclude each other, and
//! poisoning and cancellation behave as documented.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, TryLockError};
use std::thread;
use std::time::Duration;

use crate::common::{finish, started, wait_until, with_deadline};
use fibra::sync::Mutex;
use fibra::Fiber;

#[test]
fn hundred_fibers_times_hundred_increments_across_yields_on_one_worker() {
    with_deadline(|| {
        let sched = started(1);
        let counter = Arc::new(Mutex::new(0u64));
        let handles: Vec<_> = (0..100)
            .map(|_| {
                let counter = counter.clone();
                sched
                    .submit(
                        move || {
                            for _ in 0..100 {
                                let mut n = counter.lock().expect("not poisoned");
                                let seen = *n;
                                // Every other fiber of this worker runs here; those that
                                // want the lock must wait for it without blocking the thread.
                                Fiber::yield_now();
                                *n = seen + 1;
                            }
                        },
                        None,
                    )
                    .expect("submit")
            })
            .collect();
        for h in handles {
            finish(h);
        }
        assert_eq!(*counter.lock().unwrap(), 100 * 100);
        sched.stop();
    });
}

#[test]
fn fibers_on_several_workers_and_threads_exclude_each_other() {
    with_deadline(|| {
        let sched = started(2);
        let counter = Arc::new(Mutex::new(0u64));
        let inside = Arc::new(AtomicUsize::new(0));
        let work = {
            let (counter, inside) = (counter.clone(), inside.clone());
            move || {
                for i in 0..500 {
                    let mut n = counter.lock().unwrap();
                    assert_eq!(inside.fetch_add(1, Ordering::SeqCst), 0, "two holders");
                    let seen = *n;
                    if i % 7 == 0 {
                        Fiber::yield_now();
                    }
                    *n = seen + 1;
                    inside.fetch_sub(1, Ordering::SeqCst);
                }
            }
        };
        let fibers: Vec<_> = (0..20)
            .map(|_| sched.submit(work.clone(), None).expect("submit"))
            .collect();
        let threads: Vec<_> = (0..3).map(|_| thread::spawn(work.clone())).collect();
        for f in fibers {
            finish(f);
        }
        for t in threads {
            t.join().expect("thread");
        }
        assert_eq!(*counter.lock().unwrap(), 23 * 500);
        sched.stop();
    });
}

#[test]
fn waiters_get_the_lock_in_arrival_order() {
    with_deadline(|| {
        // One worker: each fiber runs until it parks in `lock`, so submission order is
        // arrival order.
        let sched = started(1);
        let m = Arc::new(Mutex::new(Vec::new()));
        let held = m.lock().unwrap();
        let queued = Arc::new(AtomicUsize::new(0));
        let handles: Vec<_> = (0..50)
            .map(|i| {
                let (m, queued) = (m.clone(), queued.clone());
                sched
                    .submit(
                        move || {
                            queued.fetch_add(1, Ordering::SeqCst);
                            m.lock().unwrap().push(i);
                        },
                        None,
                    )
                    .expect("submit")
            })
            .collect();
        wait_until("all fibers queued", || queued.load(Ordering::SeqCst) == 50);
        // Give the last one time to park; arrival order is fixed either way on one worker.
        thread::sleep(Duration::from_millis(20));
        drop(held);
        for h in handles {
            finish(h);
        }
        assert_eq!(*m.lock().unwrap(), (0..50).collect::<Vec<_>>());
        sched.stop();
    });
}

#[test]
fn a_thread_waits_for_a_fiber_holding_the_lock_across_a_sleep() {
    with_deadline(|| {
        let sched = started(1);
        let m = Arc::new(Mutex::new(0));
        let locked = Arc::new(AtomicUsize::new(0));
        let (m2, locked2) = (m.clone(), locked.clone());
        let holder = sched
            .submit(
                move || {
                    let mut g = m2.lock().unwrap();
                    locked2.store(1, Ordering::SeqCst);
                    fibra::sleep(Duration::from_millis(50));
                    *g = 7;
                },
                None,
            )
            .expect("submit");
        wait_until("the fiber holds the lock", || {
            locked.load(Ordering::SeqCst) == 1
        });
        assert!(matches!(m.try_lock(), Err(TryLockError::WouldBlock)));
        assert_eq!(*m.lock().unwrap(), 7, "the thread waited for the fiber");
        finish(holder);
        sched.stop();
    });
}

#[test]
fn try_lock_fails_while_held_and_succeeds_after() {
    let m = Mutex::new(1);
    let g = m.lock().unwrap();
    assert!(matches!(m.try_lock(), Err(TryLockError::WouldBlock)));
    drop(g);
    assert_eq!(*m.try_lock().unwrap(), 1);
}

#[test]
fn a_panicking_holder_poisons_the_mutex_like_std() {
    with_deadline(|| {
        let sched = started(1);
        let m = Arc::new(Mutex::new(5));
        let m2 = m.clone();
        let h = sched
            .submit(
                move || {
                    let _g = m2.lock().unwrap();
                    panic!("holder panics");
                },
                None,
            )
            .expect("submit");
        assert!(h.join().unwrap_err().is_panic());
        assert!(m.is_poisoned());
        let err = m.lock().expect_err("poisoned");
        assert_eq!(**err.get_ref(), 5, "the error still carries the guard");
        drop(err);
        assert!(matches!(m.try_lock(), Err(TryLockError::Poisoned(_))));
        m.clear_poison();
        assert_eq!(*m.lock().unwrap(), 5);
        sched.stop();
    });
}

#[test]
fn static_mutex_and_into_inner_and_get_mut() {
    static LOG: Mutex<Vec<u8>> = Mutex::new(Vec::new());
    LOG.lock().unwrap().push(1);
    assert_eq!(*LOG.lock().unwrap(), [1]);
    let unsized_mutex: &Mutex<[u8]> = &Mutex::new([1, 2, 3]);
    assert_eq!(unsized_mutex.lock().unwrap().len(), 3);
    let mut m = Mutex::new(String::from("a"));
    m.get_mut().unwrap().push('b');
    assert_eq!(m.into_inner().unwrap(), "ab");
}

#[test]
fn a_cancelled_waiter_leaves_the_queue_and_the_mutex_stays_usable() {
    with_deadline(|| {
        let sched = started(1);
        let m = Arc::new(Mutex::new(0));
        let held = m.lock().unwrap();
        let entered = Arc::new(AtomicUsize::new(0));
        let handles: Vec<_> = (0..3)
            .map(|_| {
                let (m, entered) = (m.clone(), entered.clone());
                sched
                    .submit(
                        move || {
                            entered.fetch_add(1, Ordering::SeqCst);
                            *m.lock().unwrap() += 1;
                        },
                        None,
                    )
                    .expect("submit")
            })
            .collect();
        wait_until("waiters queued", || entered.load(Ordering::SeqCst) == 3);
        thread::sleep(Duration::from_millis(20));
        assert_eq!(sched.stop_timeout(Duration::from_millis(50)), 3);
        for h in handles {
            assert!(h.join().unwrap_err().is_cancelled());
        }
        drop(held);
        // No stale waiter is left in the queue: the next lock is uncontended.
        assert_eq!(*m.try_lock().expect("free"), 0);
        *m.lock().unwrap() += 1;
        assert_eq!(*m.lock().unwrap(), 1);
    });
}
