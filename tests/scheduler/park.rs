//! `fibra::park` and `Unparker`, the one wait/wake primitive everything else
//! is built on: a parked fiber resumes on its own OS thread, a wake that comes
//! before the fiber has really suspended is not lost, every park is woken
//! exactly once and only by its own Unparker, and on a plain thread `park`
//! blocks the thread.

use std::panic::AssertUnwindSafe;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc};
use std::thread;
use std::time::Duration;

use crate::common::{finish, started, wait_until, with_deadline, Slot, LIMIT};
use fibra::{current_worker, park, Fiber, Unparker};

/// Long enough for a wrongly woken fiber to have run on; only ever used to
/// check that something did *not* happen, so load cannot make it flaky.
const STILL_PARKED: Duration = Duration::from_millis(100);

fn assert_clone_send_sync<T: Clone + Send + Sync>() {}

#[test]
fn unparker_is_clone_send_and_sync() {
    assert_clone_send_sync::<Unparker>();
}

#[test]
fn unpark_from_another_thread_resumes_the_fiber_on_its_own_thread() {
    with_deadline(|| {
        let sched = started(4);
        let (unparker_tx, unparker_rx) = mpsc::channel::<Unparker>();
        let handles: Vec<_> = (0..200)
            .map(|_| {
                let unparker_tx = unparker_tx.clone();
                sched
                    .submit(
                        move || {
                            let home = (thread::current().id(), current_worker());
                            park(move |u| unparker_tx.send(u).expect("the test is listening"));
                            home == (thread::current().id(), current_worker())
                        },
                        None,
                    )
                    .expect("submit")
            })
            .collect();
        let mut unparkers: Vec<Unparker> = (0..200)
            .map(|_| unparker_rx.recv_timeout(LIMIT).expect("every task parks"))
            .collect();
        thread::sleep(STILL_PARKED);
        assert!(
            handles.iter().all(|h| !h.is_finished()),
            "a fiber returned from park before being unparked"
        );
        // Wake them in reverse order, from several threads.
        unparkers.reverse();
        let wakers: Vec<_> = unparkers
            .chunks(50)
            .map(|chunk| {
                let chunk = chunk.to_vec();
                thread::spawn(move || chunk.iter().for_each(Unparker::unpark))
            })
            .collect();
        for waker in wakers {
            waker.join().expect("waker thread");
        }
        for handle in handles {
            assert!(finish(handle), "the fiber resumed on another thread");
        }
    });
}

#[test]
fn unpark_inside_register_resumes_exactly_once() {
    with_deadline(|| {
        let sched = started(2);
        let last: Slot<Unparker> = Arc::default();
        let slot = Arc::clone(&last);
        let handle = sched
            .submit(
                move || {
                    let mut resumed = 0u32;
                    for _ in 0..1000 {
                        // Woken before the fiber has even been published.
                        park(|u| u.unpark());
                        resumed += 1;
                    }
                    // A leftover wake from above would end this park early.
                    park(move |u| *slot.lock().unwrap() = Some(u));
                    resumed
                },
                None,
            )
            .expect("submit");
        wait_until("the final park", || last.lock().unwrap().is_some());
        thread::sleep(STILL_PARKED);
        assert!(!handle.is_finished(), "a stale wake ended the final park");
        last.lock().unwrap().take().expect("unparker").unpark();
        assert_eq!(finish(handle), 1000);
    });
}

#[test]
fn concurrent_unparks_wake_a_park_once() {
    with_deadline(|| {
        let sched = started(2);
        let (unparker_tx, unparker_rx) = mpsc::channel::<Unparker>();
        let past_first = Arc::new(AtomicBool::new(false));
        let past_second = Arc::new(AtomicBool::new(false));
        let (first_flag, second_flag) = (Arc::clone(&past_first), Arc::clone(&past_second));
        let handle = sched
            .submit(
                move || {
                    let second_tx = unparker_tx.clone();
                    park(move |u| unparker_tx.send(u).expect("listening"));
                    first_flag.store(true, Ordering::SeqCst);
                    park(move |u| second_tx.send(u).expect("listening"));
                    second_flag.store(true, Ordering::SeqCst);
                },
                None,
            )
            .expect("submit");
        let first = unparker_rx.recv_timeout(LIMIT).expect("first park");
        let wakers: Vec<_> = (0..8)
            .map(|_| {
                let first = first.clone();
                thread::spawn(move || {
                    for _ in 0..100 {
                        first.unpark();
                    }
                })
            })
            .collect();
        let second = unparker_rx.recv_timeout(LIMIT).expect("second park");
        for waker in wakers {
            waker.join().expect("waker thread");
        }
        assert!(past_first.load(Ordering::SeqCst));
        thread::sleep(STILL_PARKED);
        assert!(
            !past_second.load(Ordering::SeqCst),
            "unparks of the first park woke the second"
        );
        second.unpark();
        finish(handle);
        assert!(past_second.load(Ordering::SeqCst));
    });
}

#[test]
fn a_stale_unparker_does_not_wake_a_later_park() {
    with_deadline(|| {
        let sched = started(2);
        let first: Slot<Unparker> = Arc::default();
        let second: Slot<Unparker> = Arc::default();
        let past_second = Arc::new(AtomicBool::new(false));
        let (first_slot, second_slot, flag) = (
            Arc::clone(&first),
            Arc::clone(&second),
            Arc::clone(&past_second),
        );
        let handle = sched
            .submit(
                move || {
                    park(move |u| *first_slot.lock().unwrap() = Some(u));
                    // Yield in between so the fiber goes through its worker's queue.
                    Fiber::yield_now();
                    park(move |u| *second_slot.lock().unwrap() = Some(u));
                    flag.store(true, Ordering::SeqCst);
                },
                None,
            )
            .expect("submit");
        wait_until("the first park", || first.lock().unwrap().is_some());
        let stale = first.lock().unwrap().clone().expect("first unparker");
        stale.unpark();
        stale.unpark(); // twice: idempotent
        wait_until("the second park", || second.lock().unwrap().is_some());
        stale.unpark();
        stale.clone().unpark();
        thread::sleep(STILL_PARKED);
        assert!(
            !past_second.load(Ordering::SeqCst),
            "the first park's Unparker woke the second park"
        );
        assert!(!handle.is_finished());
        second
            .lock()
            .unwrap()
            .take()
            .expect("second unparker")
            .unpark();
        finish(handle);
        assert!(past_second.load(Ordering::SeqCst));
    });
}

#[test]
fn park_on_a_plain_thread_blocks_it_until_unparked() {
    with_deadline(|| {
        let (unparker_tx, unparker_rx) = mpsc::channel::<Unparker>();
        let woke = Arc::new(AtomicBool::new(false));
        let flag = Arc::clone(&woke);
        let parked = thread::spawn(move || {
            park(move |u| unparker_tx.send(u).expect("listening"));
            flag.store(true, Ordering::SeqCst);
        });
        let unparker = unparker_rx.recv_timeout(LIMIT).expect("the thread parks");
        // A std unpark of the thread is not a fibra wake.
        parked.thread().unpark();
        thread::sleep(STILL_PARKED);
        assert!(!woke.load(Ordering::SeqCst), "park returned before unpark");
        unparker.unpark();
        wait_until("the thread to wake", || woke.load(Ordering::SeqCst));
        parked.join().expect("parked thread");
    });
}

#[test]
fn park_on_a_plain_thread_woken_inside_register_returns() {
    with_deadline(|| {
        for _ in 0..1000 {
            park(|u| u.unpark());
        }
        assert_eq!(current_worker(), None);
    });
}

#[test]
fn a_stale_unparker_does_not_wake_a_later_park_on_a_plain_thread() {
    with_deadline(|| {
        let (unparker_tx, unparker_rx) = mpsc::channel::<Unparker>();
        let past_second = Arc::new(AtomicBool::new(false));
        let flag = Arc::clone(&past_second);
        let parked = thread::spawn(move || {
            let second_tx = unparker_tx.clone();
            park(move |u| unparker_tx.send(u).expect("listening"));
            park(move |u| second_tx.send(u).expect("listening"));
            flag.store(true, Ordering::SeqCst);
        });
        let stale = unparker_rx.recv_timeout(LIMIT).expect("first park");
        stale.unpark();
        stale.unpark();
        let second = unparker_rx.recv_timeout(LIMIT).expect("second park");
        stale.unpark();
        thread::sleep(STILL_PARKED);
        assert!(
            !past_second.load(Ordering::SeqCst),
            "the first park's Unparker woke the second park"
        );
        second.unpark();
        parked.join().expect("parked thread");
        assert!(past_second.load(Ordering::SeqCst));
    });
}

/// A registration closure that keeps the unparker and then panics, in one of many fibers
/// parked on one worker: the panicking fiber resumes with its panic, the kept unparker does
/// not wake it a second time, and every other fiber is woken by its own unparker.
/// A plain thread's `register` closure that waits itself (on a `fibra::sync::Barrier`)
/// while the unparker it was given is used from another thread: the unpark ends the outer
/// park only. It used to end the inner wait too (both took the thread's one generation),
/// whose barrier then returned with one party of two and, released later, wrote into the
/// frame that wait had left.
#[test]
fn a_wait_inside_a_threads_register_is_not_woken_by_the_outer_unparker() {
    with_deadline(|| {
        let barrier = Arc::new(fibra::sync::Barrier::new(2));
        let (left, left_rx) = mpsc::channel();
        let b = barrier.clone();
        let t = thread::spawn(move || {
            let start = std::time::Instant::now();
            let r = fibra::park_timeout(start + LIMIT, |u| {
                thread::spawn(move || {
                    thread::sleep(Duration::from_millis(20));
                    u.unpark();
                });
                let leader = b.wait().is_leader();
                left.send(leader).unwrap();
            });
            // The outer park was unparked long before its deadline, so it ends as soon as
            // `register` returns.
            assert_eq!(r, fibra::ParkResult::Unparked);
            assert!(
                start.elapsed() < LIMIT / 2,
                "the outer park lost its wake-up"
            );
        });
        assert!(
            left_rx.recv_timeout(STILL_PARKED * 3).is_err(),
            "the inner wait returned with one party of two"
        );
        let leader = barrier.wait().is_leader();
        let other = left_rx.recv().unwrap();
        assert!(leader != other, "exactly one leader");
        t.join().unwrap();
    });
}

#[test]
fn a_panic_in_register_among_many_parked_fibers_resumes_only_that_fiber() {
    with_deadline(|| {
        let sched = started(1);
        let kept: Arc<std::sync::Mutex<Vec<Unparker>>> = Arc::default();
        let handles: Vec<_> = (0..9)
            .map(|i| {
                let kept = kept.clone();
                sched
                    .submit(
                        move || {
                            std::panic::catch_unwind(AssertUnwindSafe(|| {
                                park(|u| {
                                    kept.lock().unwrap().push(u);
                                    if i == 4 {
                                        panic!("register of fiber 4");
                                    }
                                })
                            }))
                            .is_err()
                        },
                        None,
                    )
                    .expect("submit")
            })
            .collect();
        wait_until("every fiber registered", || kept.lock().unwrap().len() == 9);
        // Fiber 4 resumed with its panic; its unparker, kept, must not wake it again later.
        let mut results = handles.into_iter().map(Some).collect::<Vec<_>>();
        assert!(
            finish(results[4].take().unwrap()),
            "fiber 4 caught its panic"
        );
        for u in kept.lock().unwrap().drain(..) {
            u.unpark();
        }
        for (i, h) in results.into_iter().enumerate() {
            if let Some(h) = h {
                assert!(!finish(h), "fiber {i} was woken, not panicked");
            }
        }
        assert_eq!(finish(sched.submit(|| 7, None).expect("submit")), 7);
        sched.stop();
    });
}

/// A panic in the registration closure continues in the parked fiber, which may catch it;
/// a timed park's timer is taken back, and the worker goes on with its other fibers.
#[test]
fn a_panic_in_register_continues_in_the_fiber_and_leaves_no_timer() {
    with_deadline(|| {
        let sched = started(1);
        let handle = sched
            .submit(
                || {
                    let untimed = std::panic::catch_unwind(|| park(|_| panic!("register 1")));
                    let deadline = std::time::Instant::now() + Duration::from_secs(3600);
                    let timed = std::panic::catch_unwind(|| {
                        fibra::park_timeout(deadline, |_| panic!("register 2"))
                    });
                    let text = |r: Box<dyn std::any::Any + Send>| {
                        r.downcast_ref::<&str>().map(|s| s.to_string())
                    };
                    (
                        untimed.err().and_then(text),
                        timed.err().and_then(text),
                        current_worker(),
                    )
                },
                None,
            )
            .expect("submit");
        let (untimed, timed, worker) = finish(handle);
        assert_eq!(untimed.as_deref(), Some("register 1"));
        assert_eq!(timed.as_deref(), Some("register 2"));
        assert_eq!(worker, Some(0), "resumed on its own worker");
        assert_eq!(
            sched.metrics().timers(),
            0,
            "the timed park's timer is gone"
        );
        // The worker lives on: an uncaught one reaches its handle, and the next task runs.
        let uncaught = sched
            .submit(|| park(|_| panic!("register 3")), None)
            .expect("submit");
        assert!(uncaught.join().is_err(), "the panic reaches the handle");
        assert_eq!(finish(sched.submit(|| 7, None).expect("submit")), 7);
        sched.stop();
    });
}
