//! Per-fiber unwinding, detached results and shutdown waits: fibers
//! beside another fiber's suspended unwind, handles dropped while their tasks finish, a
//! scheduler stopped from another's fiber. Each test is bounded.
//!
//! The helpers take `catch_first`: with it, the fiber first catches a panic of its own while
//! the other fiber's unwind is suspended, which fibra cannot see (docs/design.md, "Unwinding,
//! per fiber"); the tests run without it.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex as StdMutex};
use std::time::Duration;

use crate::common::{finish, started, with_deadline};

/// Sets `flag` and then sleeps (a fibra sleep) for `nap` when dropped: dropped during a
/// panic, it leaves its fiber suspended in the middle of that unwind.
struct SlowDrop {
    flag: Arc<AtomicBool>,
    nap: Duration,
}

impl Drop for SlowDrop {
    fn drop(&mut self) {
        self.flag.store(true, Ordering::SeqCst);
        fibra::sleep(self.nap);
    }
}

/// Installed once, before any scheduler of this process installs fibra's hook (which then
/// wraps this one, so fibra still sees every panic).
fn quiet_panics() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        // The panics below are expected; keep the output readable.
        let prev = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            let msg = info.to_string();
            if !msg.contains("expected:") {
                prev(info)
            }
        }));
    });
}

/// A fiber that panics holding a fibra Mutex while another fiber of its worker is suspended
/// in the middle of its unwind poisons the lock.
#[test]
fn a_holder_panicking_beside_a_suspended_unwind_poisons_its_lock() {
    crate::common::child_ok(|| {
        poisoning_beside_a_suspended_unwind(false);
    });
}

fn poisoning_beside_a_suspended_unwind(catch_first: bool) {
    quiet_panics();
    with_deadline(move || {
        let sched = started(1);
        let mid_unwind = Arc::new(AtomicBool::new(false));
        let flag = mid_unwind.clone();
        let f1 = sched
            .submit(
                move || {
                    let _slow = SlowDrop {
                        flag,
                        nap: Duration::from_millis(500),
                    };
                    panic!("expected: f1");
                },
                None,
            )
            .unwrap();
        let m = Arc::new(fibra::sync::Mutex::new(0u32));
        let m2 = m.clone();
        let f2 = sched
            .submit(
                move || {
                    while !mid_unwind.load(Ordering::SeqCst) {
                        fibra::sleep(Duration::from_millis(1));
                    }
                    // A panic caught: F2 goes on, not unwinding.
                    if catch_first {
                        let _ = catch_unwind(|| panic!("expected: f2 caught"));
                    }
                    // A real panic while holding the lock.
                    let _ = catch_unwind(AssertUnwindSafe(|| {
                        let _g = m2.lock().unwrap();
                        panic!("expected: f2 holding the lock");
                    }));
                    m2.is_poisoned()
                },
                None,
            )
            .unwrap();
        let poisoned = finish(f2);
        assert!(f1.wait_timeout(crate::common::LIMIT));
        sched.stop();
        assert!(
            poisoned && m.is_poisoned(),
            "a fibra Mutex whose guard was dropped during its holder's panic is not poisoned"
        );
    });
}

/// A sleeping fiber cancelled (by the destructor of another fiber, suspended in the middle of
/// that fiber's unwind) unwinds at once.
#[test]
fn a_cancellation_beside_a_suspended_unwind_is_raised_at_once() {
    crate::common::child_ok(|| {
        cancel_beside_a_suspended_unwind(false);
    });
}

fn cancel_beside_a_suspended_unwind(catch_first: bool) {
    quiet_panics();
    with_deadline(move || {
        let sched = started(1);
        let mid_unwind = Arc::new(AtomicBool::new(false));
        let f2_ready = Arc::new(AtomicBool::new(false));
        let slot: Arc<StdMutex<Option<fibra::JoinHandle<&'static str>>>> =
            Arc::new(StdMutex::new(None));
        let outcome = Arc::new(StdMutex::new(None::<String>));

        struct Teardown {
            mid_unwind: Arc<AtomicBool>,
            f2_ready: Arc<AtomicBool>,
            slot: Arc<StdMutex<Option<fibra::JoinHandle<&'static str>>>>,
            outcome: Arc<StdMutex<Option<String>>>,
        }
        impl Drop for Teardown {
            fn drop(&mut self) {
                self.mid_unwind.store(true, Ordering::SeqCst);
                while !self.f2_ready.load(Ordering::SeqCst) {
                    fibra::sleep(Duration::from_millis(1));
                }
                let h = self.slot.lock().unwrap().take().unwrap();
                h.cancel();
                let r = h.join();
                *self.outcome.lock().unwrap() = Some(match r {
                    Ok(v) => format!("Ok({v})"),
                    Err(e) if e.is_cancelled() => "cancelled".into(),
                    Err(e) => format!("Err({e})"),
                });
            }
        }

        let (mu, fr, sl, oc) = (
            mid_unwind.clone(),
            f2_ready.clone(),
            slot.clone(),
            outcome.clone(),
        );
        let f2 = sched
            .submit(
                move || {
                    while !mu.load(Ordering::SeqCst) {
                        fibra::sleep(Duration::from_millis(1));
                    }
                    if catch_first {
                        let _ = catch_unwind(|| panic!("expected: f2 caught"));
                    }
                    fr.store(true, Ordering::SeqCst);
                    // Cancelled during this sleep: it must unwind from here.
                    fibra::sleep(Duration::from_secs(3));
                    "f2 slept its full sleep: the cancellation was not raised"
                },
                None,
            )
            .unwrap();
        *slot.lock().unwrap() = Some(f2);
        let f1 = sched
            .submit(
                move || {
                    let _t = Teardown {
                        mid_unwind,
                        f2_ready,
                        slot: sl,
                        outcome: oc,
                    };
                    panic!("expected: f1");
                },
                None,
            )
            .unwrap();
        assert!(f1.wait_timeout(crate::common::LIMIT), "f1 never ended");
        sched.stop();
        let got = outcome.lock().unwrap().clone();
        assert_eq!(got.as_deref(), Some("cancelled"), "F2's result");
    });
}

// ---------------------------------------------------------------- what passed (kept)

/// Thousands of tasks whose handles are dropped from several threads while they complete,
/// with continuations registered before the drop: each result is dropped exactly once.
#[test]
fn detached_results_race_completion_and_are_dropped_once() {
    crate::common::child_ok(|| {
        with_deadline(|| {
            let sched = Arc::new(started(4));
            let drops = Arc::new(AtomicUsize::new(0));
            let conts = Arc::new(AtomicUsize::new(0));
            const N: usize = 4000;
            let mut threads = Vec::new();
            for t in 0..4 {
                let (sched, drops, conts) = (sched.clone(), drops.clone(), conts.clone());
                threads.push(std::thread::spawn(move || {
                    for i in 0..N / 4 {
                        let d = drops.clone();
                        let h = sched
                            .submit(move || crate::common::Counted(d), None)
                            .unwrap();
                        let c = conts.clone();
                        h.then(move |_v| {
                            c.fetch_add(1, Ordering::SeqCst);
                        });
                        match (i + t) % 4 {
                            0 => drop(h),
                            1 => {
                                std::thread::yield_now();
                                drop(h)
                            }
                            2 => drop(h.join().unwrap()),
                            _ => drop(fibra::future::block_on(h).unwrap()),
                        }
                    }
                }));
            }
            for t in threads {
                t.join().unwrap();
            }
            sched.stop();
            assert_eq!(conts.load(Ordering::SeqCst), N);
            assert_eq!(drops.load(Ordering::SeqCst), N);
        });
    });
}

/// A handle dropped by its own task's continuation, and by its own task: dropped once.
#[test]
fn a_handle_dropped_in_its_own_continuation_or_fiber() {
    crate::common::child_ok(|| {
        with_deadline(|| {
            let sched = started(2);
            let drops = Arc::new(AtomicUsize::new(0));
            for own_fiber in [false, true] {
                let (tx, rx) = std::sync::mpsc::channel::<()>();
                let slot: Arc<StdMutex<Option<fibra::JoinHandle<crate::common::Counted>>>> =
                    Arc::new(StdMutex::new(None));
                let (d, s2) = (drops.clone(), slot.clone());
                let h = sched
                    .submit(
                        move || {
                            let _ = fibra::unblock(move || rx.recv());
                            if own_fiber {
                                drop(s2.lock().unwrap().take());
                            }
                            crate::common::Counted(d)
                        },
                        None,
                    )
                    .unwrap();
                let s3 = slot.clone();
                h.finally(move || drop(s3.lock().unwrap().take()));
                *slot.lock().unwrap() = Some(h);
                tx.send(()).unwrap();
            }
            crate::common::wait_until("both results dropped", || drops.load(Ordering::SeqCst) >= 2);
            sched.stop();
            assert_eq!(drops.load(Ordering::SeqCst), 2);
        });
    });
}

/// A cancellation that comes while a fiber is suspended mid-unwind (a panic it catches) is
/// raised at its next suspension after the catch, once.
#[test]
fn a_deferred_cancellation_comes_once_after_the_catch() {
    crate::common::child_ok(|| {
        quiet_panics();
        with_deadline(|| {
            let sched = started(1);
            let mid = Arc::new(AtomicBool::new(false));
            let flag = mid.clone();
            let h = sched
                .submit(
                    move || {
                        let _ = catch_unwind(AssertUnwindSafe(|| {
                            let _s = SlowDrop {
                                flag,
                                nap: Duration::from_millis(300),
                            };
                            panic!("expected: inner");
                        }));
                        let first = catch_unwind(|| fibra::sleep(Duration::from_millis(10)));
                        let second = catch_unwind(|| fibra::sleep(Duration::from_millis(10)));
                        (first.is_err(), second.is_err())
                    },
                    None,
                )
                .unwrap();
            crate::common::wait_until("mid unwind", || mid.load(Ordering::SeqCst));
            h.cancel();
            let r = finish(h);
            sched.stop();
            assert_eq!(
                r,
                (true, false),
                "(first sleep cancelled, second cancelled)"
            );
        });
    });
}

/// A standalone fiber suspended in the middle of its unwind, dropped: no abort, the
/// destructor completes.
#[test]
fn a_standalone_fiber_dropped_mid_unwind() {
    crate::common::child_ok(|| {
        quiet_panics();
        with_deadline(|| {
            let done = Arc::new(AtomicUsize::new(0));
            let d = done.clone();
            struct YieldDrop(Arc<AtomicUsize>);
            impl Drop for YieldDrop {
                fn drop(&mut self) {
                    fibra::Fiber::yield_now();
                    fibra::Fiber::yield_now();
                    self.0.fetch_add(1, Ordering::SeqCst);
                }
            }
            let mut f = fibra::Fiber::new(move || {
                let _y = YieldDrop(d);
                panic!("expected: standalone");
            });
            f.resume();
            drop(f);
            assert_eq!(done.load(Ordering::SeqCst), 1);
        });
    });
}

/// B is dropped (stopped) from a fiber of A (one worker) while B's fiber waits for another
/// fiber of A: the stop parks A's fiber, so A's other fiber runs and B drains.
#[test]
fn scheduler_b_stopped_in_a_fiber_of_a_while_b_waits_on_a() {
    crate::common::child_ok(|| {
        with_deadline(|| {
            let a = started(1);
            let b = started(1);
            let (tx, rx) = fibra::sync::oneshot::channel::<u32>();
            let waiter = b.submit(move || rx.recv().unwrap(), None).unwrap();
            let stopper = a
                .submit(
                    move || {
                        b.stop();
                        drop(b);
                    },
                    None,
                )
                .unwrap();
            let sender = a
                .submit(
                    move || {
                        fibra::sleep(Duration::from_millis(50));
                        tx.send(7).unwrap();
                    },
                    None,
                )
                .unwrap();
            finish(sender);
            finish(stopper);
            assert_eq!(finish(waiter), 7);
            a.stop();
        });
    });
}

/// A fiber of A waits in B.stop() (B's task never ends); A.stop_timeout cancels it and
/// returns; B, stopped with a timeout later, ends too.
#[test]
fn a_fiber_waiting_in_another_schedulers_stop_is_cancelled() {
    crate::common::child_ok(|| {
        with_deadline(|| {
            let a = started(1);
            let b = Arc::new(started(1));
            let _forever = b
                .submit(|| fibra::sleep(Duration::from_secs(3600)), None)
                .unwrap();
            let b2 = b.clone();
            let stopper = a.submit(move || b2.stop(), None).unwrap();
            std::thread::sleep(Duration::from_millis(50));
            let t = std::time::Instant::now();
            let n = a.stop_timeout(Duration::from_millis(50));
            assert!(
                t.elapsed() < Duration::from_secs(5),
                "A's stop_timeout took {:?}",
                t.elapsed()
            );
            assert_eq!(n, 1);
            assert!(stopper.join().unwrap_err().is_cancelled());
            assert_eq!(b.stop_timeout(Duration::from_millis(50)), 1);
        });
    });
}
