//! `fibra::sync::Condvar`: notify_all releases every waiting fiber (counted with a
//! `WaitGroup`), notify_one serves waiters in arrival order, and timed waits time out, never
//! early.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use crate::common::{finish, started, wait_until, with_deadline, LIMIT};
use fibra::sync::{Condvar, Mutex, WaitGroup};

#[test]
fn condvar_and_waitgroup_release_fifty_waiting_fibers() {
    with_deadline(|| {
        let sched = started(2);
        let state = Arc::new((Mutex::new((false, 0usize)), Condvar::new()));
        let all_waiting = WaitGroup::new();
        let all_done = WaitGroup::new();
        for _ in 0..50 {
            let state = state.clone();
            let waiting = all_waiting.clone();
            let done = all_done.clone();
            drop(
                sched
                    .submit(
                        move || {
                            let (m, cv) = &*state;
                            let mut g = m.lock().unwrap();
                            g.1 += 1;
                            drop(waiting); // counted as waiting once it holds the lock
                            let mut g = cv.wait_while(g, |(go, _)| !*go).unwrap();
                            g.1 -= 1;
                            drop(done);
                        },
                        None,
                    )
                    .expect("submit"),
            );
        }
        // Every fiber has taken the lock; since they release it only by waiting, taking it
        // here means all 50 are in the condvar's queue.
        all_waiting.wait();
        {
            let (m, cv) = &*state;
            let mut g = m.lock().unwrap();
            assert_eq!(g.1, 50);
            g.0 = true;
            cv.notify_all();
        }
        assert!(all_done.wait_timeout(LIMIT), "every waiter was released");
        assert_eq!(state.0.lock().unwrap().1, 0);
        sched.stop();
    });
}

#[test]
fn notify_one_wakes_waiters_in_arrival_order() {
    with_deadline(|| {
        let sched = started(1);
        let state = Arc::new((Mutex::new(Vec::new()), Condvar::new()));
        let queued = Arc::new(AtomicUsize::new(0));
        let handles: Vec<_> = (0..20)
            .map(|i| {
                let (state, queued) = (state.clone(), queued.clone());
                sched
                    .submit(
                        move || {
                            let (m, cv) = &*state;
                            let g = m.lock().unwrap();
                            queued.fetch_add(1, Ordering::SeqCst);
                            let mut g = cv.wait(g).unwrap();
                            g.push(i);
                        },
                        None,
                    )
                    .expect("submit")
            })
            .collect();
        wait_until("all waiting", || queued.load(Ordering::SeqCst) == 20);
        let (m, cv) = &*state;
        for n in 1..=20 {
            // The waiter count under the lock proves the previous wake-up has completed.
            drop(m.lock().unwrap());
            cv.notify_one();
            wait_until("one more woke", || m.lock().unwrap().len() == n);
        }
        for h in handles {
            finish(h);
        }
        assert_eq!(*m.lock().unwrap(), (0..20).collect::<Vec<_>>());
        sched.stop();
    });
}

#[test]
fn wait_timeout_times_out_never_early_in_a_fiber_and_a_thread() {
    with_deadline(|| {
        let sched = started(1);
        let timeout = Duration::from_millis(30);
        let check = move || {
            let (m, cv) = (Mutex::new(0), Condvar::new());
            let start = Instant::now();
            let (g, res) = cv.wait_timeout(m.lock().unwrap(), timeout).unwrap();
            let waited = start.elapsed();
            assert!(res.timed_out());
            assert!(waited >= timeout, "woke early: {waited:?}");
            assert!(waited < LIMIT);
            assert_eq!(*g, 0, "the mutex is held again");
        };
        finish(sched.submit(check, None).expect("submit"));
        check();
        sched.stop();
    });
}

#[test]
fn wait_timeout_while_returns_as_soon_as_the_condition_is_met() {
    with_deadline(|| {
        let sched = started(2);
        let state = Arc::new((Mutex::new(0), Condvar::new()));
        let s = state.clone();
        let waiter = sched
            .submit(
                move || {
                    let (m, cv) = &*s;
                    let (g, res) = cv
                        .wait_timeout_while(m.lock().unwrap(), LIMIT, |n| *n < 3)
                        .unwrap();
                    (*g, res.timed_out())
                },
                None,
            )
            .expect("submit");
        for _ in 0..3 {
            thread::sleep(Duration::from_millis(5));
            let (m, cv) = &*state;
            *m.lock().unwrap() += 1;
            cv.notify_all();
        }
        assert_eq!(finish(waiter), (3, false));
        sched.stop();
    });
}

#[test]
fn a_thread_waits_and_a_fiber_notifies() {
    with_deadline(|| {
        let sched = started(1);
        let state = Arc::new((Mutex::new(false), Condvar::new()));
        let s = state.clone();
        let notifier = sched
            .submit(
                move || {
                    fibra::sleep(Duration::from_millis(10));
                    *s.0.lock().unwrap() = true;
                    s.1.notify_one();
                },
                None,
            )
            .expect("submit");
        let (m, cv) = &*state;
        let g = cv.wait_while(m.lock().unwrap(), |ready| !*ready).unwrap();
        assert!(*g);
        drop(g);
        finish(notifier);
        sched.stop();
    });
}

/// `notify_one` wakes fiber A, which then waits for the mutex the notifier still holds, and
/// A is cancelled there. Its notification goes on to the next waiter (a thread), as it does
/// when a notified waiter is cancelled before it resumes; it used to be lost, and the
/// thread waited until its timeout.
#[test]
fn a_notified_waiter_cancelled_while_relocking_passes_the_notification_on() {
    with_deadline(|| {
        let sched = started(1);
        let pair = Arc::new((Mutex::new(()), Condvar::new()));
        let p = pair.clone();
        let a = sched
            .submit(
                move || {
                    let (m, c) = &*p;
                    let g = m.lock().unwrap();
                    let _g = c.wait(g).unwrap();
                },
                None,
            )
            .unwrap();
        wait_until("fiber A to wait", || {
            sched.metrics().workers()[0].parks() > 0
        });
        let p = pair.clone();
        let (waiting, waiting_rx) = std::sync::mpsc::channel();
        let b = thread::spawn(move || {
            let (m, c) = &*p;
            let g = m.lock().unwrap();
            waiting.send(()).unwrap();
            let (_g, r) = c.wait_timeout(g, LIMIT).unwrap();
            !r.timed_out()
        });
        waiting_rx.recv().unwrap();
        {
            // The thread is in its wait once it has let go of the mutex.
            let _g = pair.0.lock().unwrap();
            // Counted before the notification: A may park again at once.
            let parks = sched.metrics().workers()[0].parks();
            pair.1.notify_one();
            // A is woken and now waits for this guard; cancel it there.
            wait_until("fiber A to wait for the mutex", || {
                sched.metrics().workers()[0].parks() > parks
            });
            a.cancel();
            assert!(a.wait_timeout(LIMIT));
        }
        assert!(b.join().unwrap(), "the thread waited until its timeout");
        sched.stop();
    });
}

/// `notify_all` wakes W1 and W2, which then wait for the mutex the notifier H holds; H
/// cancels W1, then waits on the condvar itself. W1's cancellation must not wake H: H
/// started waiting after the only notification, and a fibra condvar has no spurious
/// wake-ups. (A cancelled waiter used to pass on whatever woke it, to whoever waited.)
fn notify_all_then_a_cancelled_waiter(threads: usize) -> (bool, usize) {
    let sched = started(threads);
    let pair = Arc::new((Mutex::new(0u32), Condvar::new()));
    let returned = Arc::new(AtomicUsize::new(0));
    let waiting = Arc::new(AtomicUsize::new(0));
    let mut ws = Vec::new();
    for _ in 0..2 {
        let (p, r, w) = (pair.clone(), returned.clone(), waiting.clone());
        // All on worker 0, so that the order below is the worker's.
        let h = sched.submit(
            move || {
                let (m, cv) = &*p;
                let g = m.lock().unwrap();
                w.fetch_add(1, Ordering::SeqCst);
                let _g = cv.wait(g).unwrap();
                r.fetch_add(1, Ordering::SeqCst);
            },
            Some(0),
        );
        ws.push(Arc::new(h.unwrap()));
    }
    wait_until("both waiting", || waiting.load(Ordering::SeqCst) == 2);
    thread::sleep(Duration::from_millis(20));
    let (p, w1) = (pair.clone(), ws[0].clone());
    let h = sched
        .submit(
            move || {
                let (m, cv) = &*p;
                let g = m.lock().unwrap();
                cv.notify_all();
                // W1 and W2 run and queue for the mutex held here (or are about to).
                fibra::sleep(Duration::from_millis(20));
                w1.cancel();
                let (_g, res) = cv.wait_timeout(g, Duration::from_millis(300)).unwrap();
                res.timed_out()
            },
            Some(0),
        )
        .unwrap();
    let timed_out = finish(h);
    for w in &ws {
        assert!(w.wait_timeout(LIMIT));
    }
    sched.stop();
    (timed_out, returned.load(Ordering::SeqCst))
}

#[test]
fn a_waiter_cancelled_after_notify_all_wakes_no_later_waiter() {
    with_deadline(|| {
        for threads in [1, 2] {
            for round in 0..3 {
                let (timed_out, returned) = notify_all_then_a_cancelled_waiter(threads);
                assert_eq!(returned, 1, "W2 returned, W1 was cancelled");
                assert!(
                    timed_out,
                    "{threads} workers, round {round}: a waiter that began after notify_all \
                     was woken by a cancelled waiter"
                );
            }
        }
    });
}
