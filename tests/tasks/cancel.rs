//! `JoinHandle::cancel`: one task cancelled as `stop_timeout` cancels — parked, running
//! then suspending, or never started.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::common::{finish, started, with_deadline, LIMIT};

const HOUR: Duration = Duration::from_secs(3600);

#[test]
fn cancel_wakes_a_parked_fiber_and_runs_its_destructors() {
    with_deadline(|| {
        let sched = started(2);
        let dropped = Arc::new(AtomicBool::new(false));
        struct Guard(Arc<AtomicBool>);
        impl Drop for Guard {
            fn drop(&mut self) {
                // A destructor of a cancelled fiber may still wait.
                fibra::sleep(Duration::from_millis(1));
                self.0.store(true, Ordering::SeqCst);
            }
        }
        let d = dropped.clone();
        let h = sched
            .submit(
                move || {
                    let _g = Guard(d);
                    fibra::sleep(HOUR);
                },
                None,
            )
            .unwrap();
        std::thread::sleep(Duration::from_millis(20));
        assert!(!h.is_cancelled());
        let t = Instant::now();
        h.cancel();
        assert!(h.wait_timeout(LIMIT));
        assert!(t.elapsed() < LIMIT);
        assert!(h.is_cancelled());
        assert!(dropped.load(Ordering::SeqCst));
        assert!(h.join().unwrap_err().is_cancelled());
        // User cancellations are not the shutdown's.
        assert_eq!(sched.stop_timeout(Duration::from_secs(5)), 0);
    });
}

#[test]
fn cancel_of_a_running_fiber_lands_at_its_next_suspension() {
    with_deadline(|| {
        let sched = started(2);
        let running = Arc::new(AtomicBool::new(false));
        let reached = Arc::new(AtomicUsize::new(0));
        let (r, n) = (running.clone(), reached.clone());
        let h = sched
            .submit(
                move || {
                    r.store(true, Ordering::SeqCst);
                    // Busy, calling nothing of fibra's, for a while.
                    let until = Instant::now() + Duration::from_millis(100);
                    while Instant::now() < until {
                        std::hint::spin_loop();
                    }
                    n.fetch_add(1, Ordering::SeqCst);
                    fibra::sleep(HOUR); // the cancellation lands here
                    n.fetch_add(1, Ordering::SeqCst);
                },
                None,
            )
            .unwrap();
        while !running.load(Ordering::SeqCst) {
            std::thread::yield_now();
        }
        h.cancel();
        assert!(h.wait_timeout(LIMIT), "the cancel was lost");
        assert!(h.join().unwrap_err().is_cancelled());
        assert_eq!(reached.load(Ordering::SeqCst), 1);
        sched.stop();
    });
}

#[test]
fn cancel_of_a_yielding_loop() {
    with_deadline(|| {
        let sched = started(1);
        let h = sched
            .submit(
                || loop {
                    fibra::Fiber::yield_now();
                },
                None,
            )
            .unwrap();
        std::thread::sleep(Duration::from_millis(10));
        h.cancel();
        assert!(h.wait_timeout(LIMIT));
        assert!(h.is_cancelled());
        sched.stop();
    });
}

#[test]
fn cancel_before_start_means_it_never_runs() {
    with_deadline(|| {
        let sched = fibra::Scheduler::builder().threads(1).build().unwrap();
        let ran = Arc::new(AtomicBool::new(false));
        let r = ran.clone();
        let h = sched
            .submit(move || r.store(true, Ordering::SeqCst), None)
            .unwrap();
        let continuation = Arc::new(AtomicBool::new(false));
        let c = continuation.clone();
        h.catching(move |e| c.store(e.is_cancelled(), Ordering::SeqCst));
        h.cancel();
        sched.start();
        assert!(h.wait_timeout(LIMIT));
        assert!(h.is_cancelled());
        assert!(!ran.load(Ordering::SeqCst));
        assert!(continuation.load(Ordering::SeqCst));
        sched.stop();
    });
}

#[test]
fn cancel_after_the_end_changes_nothing_and_twice_is_once() {
    with_deadline(|| {
        let sched = started(2);
        let h = sched.submit(|| 42, None).unwrap();
        assert!(h.wait_timeout(LIMIT));
        h.cancel();
        h.cancel();
        assert!(!h.is_cancelled());
        assert_eq!(h.join().unwrap(), 42);

        let h = sched.submit(|| fibra::sleep(HOUR), None).unwrap();
        for _ in 0..3 {
            h.cancel();
        }
        assert!(h.join().unwrap_err().is_cancelled());
        sched.stop();
    });
}

#[test]
fn a_fiber_that_catches_its_cancellation_returns_its_value() {
    with_deadline(|| {
        let sched = started(1);
        let h = sched
            .submit(
                || {
                    let r = std::panic::catch_unwind(|| fibra::sleep(HOUR));
                    // Cancelled once: waits work as usual afterwards.
                    fibra::sleep(Duration::from_millis(1));
                    r.is_err()
                },
                None,
            )
            .unwrap();
        std::thread::sleep(Duration::from_millis(10));
        h.cancel();
        assert!(finish(h));
        sched.stop();
    });
}

#[test]
fn cancel_from_fibers_threads_and_itself() {
    with_deadline(|| {
        let sched = started(2);
        // From another fiber, on either worker.
        for worker in [0, 1] {
            let victim = sched.submit(|| fibra::sleep(HOUR), Some(0)).unwrap();
            let canceller = sched
                .submit(
                    move || {
                        victim.cancel();
                        victim.join().unwrap_err().is_cancelled()
                    },
                    Some(worker),
                )
                .unwrap();
            assert!(finish(canceller));
        }
        // A fiber cancelling itself (through its own handle) unwinds at its next suspension.
        let (tx, rx) = fibra::sync::oneshot::channel::<fibra::JoinHandle<()>>();
        let unwound = Arc::new(AtomicBool::new(false));
        struct Flag(Arc<AtomicBool>);
        impl Drop for Flag {
            fn drop(&mut self) {
                self.0.store(true, Ordering::SeqCst);
            }
        }
        let u = unwound.clone();
        let me = sched
            .submit(
                move || {
                    let _flag = Flag(u);
                    let own = rx.recv().unwrap();
                    own.cancel();
                    fibra::sleep(HOUR);
                },
                None,
            )
            .unwrap();
        tx.send(me).unwrap();
        crate::common::wait_until("the self-cancelled fiber to unwind", || {
            unwound.load(Ordering::SeqCst)
        });
        sched.stop();
    });
}

#[test]
fn cancelling_a_lock_waiter_leaves_the_lock_usable() {
    with_deadline(|| {
        let sched = started(2);
        let m = Arc::new(fibra::sync::Mutex::new(0u32));
        let guard_holder = {
            let m = m.clone();
            sched
                .submit(
                    move || {
                        let mut g = m.lock().unwrap();
                        fibra::sleep(Duration::from_millis(50));
                        *g += 1;
                    },
                    Some(0),
                )
                .unwrap()
        };
        std::thread::sleep(Duration::from_millis(10));
        let waiters: Vec<_> = (0..4)
            .map(|i| {
                let m = m.clone();
                sched
                    .submit(
                        move || {
                            *m.lock().unwrap() += 10;
                        },
                        Some(i % 2),
                    )
                    .unwrap()
            })
            .collect();
        std::thread::sleep(Duration::from_millis(10));
        waiters[1].cancel();
        waiters[2].cancel();
        finish(guard_holder);
        let mut cancelled = 0;
        for w in waiters {
            match w.join() {
                Ok(()) => {}
                Err(e) => {
                    assert!(e.is_cancelled());
                    cancelled += 1;
                }
            }
        }
        let total = *m.lock().unwrap();
        assert_eq!(total, 1 + 10 * (4 - cancelled));
        sched.stop();
    });
}

mod token {
    use super::*;
    use fibra::sync::CancellationToken;

    #[test]
    fn cancel_wakes_fibers_and_threads_waiting_on_the_token_and_its_children() {
        with_deadline(|| {
            let sched = started(2);
            let root = CancellationToken::new();
            let child = root.child_token();
            let grandchild = child.child_token();
            let mut fibers = Vec::new();
            for t in [&root, &child, &grandchild] {
                for _ in 0..20 {
                    let t = t.clone();
                    fibers.push(sched.submit(move || t.cancelled(), None).unwrap());
                }
            }
            let threads: Vec<_> = (0..4)
                .map(|_| {
                    let t = grandchild.clone();
                    std::thread::spawn(move || t.cancelled())
                })
                .collect();
            std::thread::sleep(Duration::from_millis(20));
            assert!(!grandchild.is_cancelled());
            root.cancel();
            assert!(child.is_cancelled() && grandchild.is_cancelled());
            fibers.into_iter().for_each(finish);
            threads.into_iter().for_each(|t| t.join().unwrap());
            // Already cancelled: returns at once; a child made now starts cancelled.
            root.cancelled();
            assert!(root.child_token().is_cancelled());
            sched.stop();
        });
    }

    /// As with tokio's tokens, a child is cancelled with its ancestors even when the handles
    /// of the tokens between them were all dropped.
    #[test]
    fn a_grandchild_of_dropped_tokens_is_cancelled_with_the_root() {
        let root = CancellationToken::new();
        let grandchild = root.child_token().child_token();
        let mut deep = root.clone();
        for _ in 0..10 {
            deep = deep.child_token();
        }
        assert!(!grandchild.is_cancelled() && !deep.is_cancelled());
        root.cancel();
        assert!(grandchild.is_cancelled() && deep.is_cancelled());
    }

    #[test]
    fn a_child_cancels_alone() {
        let root = CancellationToken::new();
        let a = root.child_token();
        let b = root.child_token();
        let a1 = a.child_token();
        a.cancel();
        assert!(a.is_cancelled() && a1.is_cancelled());
        assert!(!root.is_cancelled() && !b.is_cancelled());
        a.cancel(); // idempotent
        root.cancel();
        assert!(b.is_cancelled());
    }

    #[test]
    fn timeouts_and_dropped_children() {
        with_deadline(|| {
            let t = CancellationToken::new();
            assert!(!t.cancelled_timeout(Duration::ZERO));
            let start = Instant::now();
            assert!(!t.cancelled_timeout(Duration::from_millis(20)));
            assert!(
                start.elapsed() >= Duration::from_millis(20),
                "a timeout came early"
            );
            // Many children made and dropped: the parent keeps working (and forgets them).
            for _ in 0..100_000 {
                drop(t.child_token());
            }
            let kept = t.child_token();
            let waiter = {
                let t = t.clone();
                std::thread::spawn(move || t.cancelled_timeout(Duration::MAX))
            };
            std::thread::sleep(Duration::from_millis(10));
            t.cancel();
            assert!(waiter.join().unwrap());
            assert!(kept.is_cancelled());
        });
    }

    #[test]
    fn a_cancelled_fiber_leaves_the_token_consistent() {
        with_deadline(|| {
            let sched = started(1);
            let t = CancellationToken::new();
            let (t1, t2) = (t.clone(), t.clone());
            let a = sched.submit(move || t1.cancelled(), None).unwrap();
            let b = sched.submit(move || t2.cancelled(), None).unwrap();
            std::thread::sleep(Duration::from_millis(10));
            a.cancel();
            assert!(a.join().unwrap_err().is_cancelled());
            t.cancel();
            finish(b);
            sched.stop();
        });
    }
}
