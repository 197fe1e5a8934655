//! `fibra::sync::RwLock`: readers share the lock at the same time, a writer has it alone,
//! and a waiting writer is not starved by readers arriving after it.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, TryLockError};
use std::thread;
use std::time::Duration;

use crate::common::{finish, started, wait_until, with_deadline};
use fibra::sync::{Barrier, RwLock};
use fibra::Fiber;

#[test]
fn readers_hold_the_lock_concurrently() {
    with_deadline(|| {
        // Ten fibers on one worker meet at a barrier *while holding* the read lock: that can
        // only complete if all ten hold it at once.
        let sched = started(1);
        let lock = Arc::new(RwLock::new(5));
        let meet = Arc::new(Barrier::new(10));
        let handles: Vec<_> = (0..10)
            .map(|_| {
                let (lock, meet) = (lock.clone(), meet.clone());
                sched
                    .submit(
                        move || {
                            let r = lock.read().unwrap();
                            meet.wait();
                            *r
                        },
                        None,
                    )
                    .expect("submit")
            })
            .collect();
        for h in handles {
            assert_eq!(finish(h), 5);
        }
        sched.stop();
    });
}

#[test]
fn a_writer_is_exclusive() {
    with_deadline(|| {
        let sched = started(2);
        let lock = Arc::new(RwLock::new(0u64));
        let readers_inside = Arc::new(AtomicUsize::new(0));
        let writers_inside = Arc::new(AtomicUsize::new(0));
        let handles: Vec<_> = (0..20)
            .map(|i| {
                let (lock, ri, wi) = (lock.clone(), readers_inside.clone(), writers_inside.clone());
                sched
                    .submit(
                        move || {
                            for _ in 0..200 {
                                if i % 4 == 0 {
                                    let mut w = lock.write().unwrap();
                                    assert_eq!(wi.fetch_add(1, Ordering::SeqCst), 0);
                                    assert_eq!(ri.load(Ordering::SeqCst), 0);
                                    let v = *w;
                                    Fiber::yield_now();
                                    *w = v + 1;
                                    wi.fetch_sub(1, Ordering::SeqCst);
                                } else {
                                    let _r = lock.read().unwrap();
                                    ri.fetch_add(1, Ordering::SeqCst);
                                    assert_eq!(wi.load(Ordering::SeqCst), 0);
                                    Fiber::yield_now();
                                    ri.fetch_sub(1, Ordering::SeqCst);
                                }
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
        assert_eq!(*lock.read().unwrap(), 5 * 200);
        sched.stop();
    });
}

#[test]
fn a_waiting_writer_goes_before_readers_that_arrive_after_it() {
    with_deadline(|| {
        let sched = started(1);
        let lock = Arc::new(RwLock::new(Vec::new()));
        let first_reader = lock.read().unwrap();
        let queued = Arc::new(AtomicUsize::new(0));
        let (l, q) = (lock.clone(), queued.clone());
        let writer = sched
            .submit(
                move || {
                    q.fetch_add(1, Ordering::SeqCst);
                    l.write().unwrap().push("writer");
                },
                None,
            )
            .expect("submit");
        wait_until("writer queued", || queued.load(Ordering::SeqCst) == 1);
        thread::sleep(Duration::from_millis(20));
        assert!(
            matches!(lock.try_read(), Err(TryLockError::WouldBlock)),
            "a new reader must not overtake the waiting writer"
        );
        let (l, q) = (lock.clone(), queued.clone());
        let late_reader = sched
            .submit(
                move || {
                    q.fetch_add(1, Ordering::SeqCst);
                    l.read().unwrap().clone()
                },
                None,
            )
            .expect("submit");
        wait_until("reader queued", || queued.load(Ordering::SeqCst) == 2);
        drop(first_reader);
        finish(writer);
        assert_eq!(
            finish(late_reader),
            ["writer"],
            "the reader came after the writer"
        );
        sched.stop();
    });
}

#[test]
fn threads_and_fibers_share_one_lock() {
    with_deadline(|| {
        let sched = started(2);
        let lock = Arc::new(RwLock::new(0u64));
        let l = lock.clone();
        let fiber = sched
            .submit(
                move || {
                    for _ in 0..1_000 {
                        *l.write().unwrap() += 1;
                    }
                },
                None,
            )
            .expect("submit");
        let l = lock.clone();
        let thread = thread::spawn(move || {
            for _ in 0..1_000 {
                *l.write().unwrap() += 1;
                let _ = *l.read().unwrap();
            }
        });
        finish(fiber);
        thread.join().unwrap();
        let lock = Arc::try_unwrap(lock).expect("the last handle");
        assert_eq!(lock.into_inner().unwrap(), 2_000);
        sched.stop();
    });
}

#[test]
fn a_panicking_writer_poisons_readers_do_not() {
    let lock = RwLock::new(1);
    let _ = std::panic::catch_unwind(|| {
        let _r = lock.read().unwrap();
        panic!("reader panics");
    });
    assert!(!lock.is_poisoned());
    let _ = std::panic::catch_unwind(|| {
        let _w = lock.write().unwrap();
        panic!("writer panics");
    });
    assert!(lock.is_poisoned());
    assert_eq!(**lock.read().unwrap_err().get_ref(), 1);
    lock.clear_poison();
    assert_eq!(*lock.write().unwrap(), 1);
}
