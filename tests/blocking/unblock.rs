//! `fibra::unblock` (seed 002's asyncify): blocking work on the pool, only the fiber waits.

use crate::common::{finish, panic_message, with_deadline, LIMIT};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{mpsc, Arc};
use std::thread;
use std::time::Duration;

fn sched(threads: usize) -> fibra::Scheduler {
    let s = fibra::Scheduler::builder()
        .threads(threads)
        .build()
        .unwrap();
    s.start();
    s
}

#[test]
fn outside_a_fiber_it_runs_inline() {
    let me = thread::current().id();
    assert_eq!(fibra::unblock(|| thread::current().id()), me);
    // On a standalone fiber too: there is no scheduler to hand the thread to.
    let mut f = fibra::Fiber::new(move || {
        assert_eq!(fibra::unblock(|| thread::current().id()), me);
    });
    assert_eq!(f.resume(), fibra::FiberState::Done);
}

#[test]
fn in_a_fiber_it_runs_on_a_pool_thread_and_resumes_at_home() {
    with_deadline(|| {
        let s = sched(2);
        let h = s
            .submit(
                || {
                    let home = thread::current().id();
                    let (id, name) = fibra::unblock(|| {
                        let t = thread::current();
                        (t.id(), t.name().map(String::from))
                    });
                    assert_ne!(id, home);
                    assert!(name.unwrap().starts_with("fibra-unblock-"));
                    assert_eq!(thread::current().id(), home);
                    // Nested: a pool thread is not a fiber, so the inner call runs inline.
                    let (outer, inner) = fibra::unblock(|| {
                        (
                            thread::current().id(),
                            fibra::unblock(|| thread::current().id()),
                        )
                    });
                    assert_eq!(outer, inner);
                    42
                },
                None,
            )
            .unwrap();
        assert_eq!(finish(h), 42);
        s.stop();
    });
}

#[test]
fn it_does_not_hold_the_only_worker() {
    with_deadline(|| {
        let s = sched(1);
        let (tx, rx) = mpsc::channel::<&'static str>();
        // The first fiber blocks (in unblock) until the second has run on the same, only,
        // worker: if unblock held the worker, the second could never run.
        let blocked = s
            .submit(move || fibra::unblock(move || rx.recv_timeout(LIMIT)), None)
            .unwrap();
        let other = s
            .submit(
                move || {
                    tx.send("the other fiber ran").unwrap();
                    fibra::current_worker()
                },
                None,
            )
            .unwrap();
        assert_eq!(finish(other), Some(0));
        assert_eq!(finish(blocked), Ok("the other fiber ran"));
        s.stop();
    });
}

#[test]
fn many_fibers_in_unblock_at_once_keep_the_worker_busy() {
    with_deadline(|| {
        let s = sched(1);
        let ticks = Arc::new(AtomicUsize::new(0));
        let sleepers: Vec<_> = (0..8)
            .map(|i| {
                s.submit(
                    move || {
                        fibra::unblock(|| thread::sleep(Duration::from_millis(50)));
                        i
                    },
                    None,
                )
                .unwrap()
            })
            .collect();
        let t = ticks.clone();
        let ticker = s
            .submit(
                move || {
                    for _ in 0..10 {
                        t.fetch_add(1, Ordering::SeqCst);
                        fibra::sleep(Duration::from_millis(1));
                    }
                },
                None,
            )
            .unwrap();
        finish(ticker);
        let got: Vec<_> = sleepers.into_iter().map(finish).collect();
        assert_eq!(got, (0..8).collect::<Vec<_>>());
        assert_eq!(ticks.load(Ordering::SeqCst), 10);
        s.stop();
    });
}

#[test]
fn a_panic_resumes_in_the_caller() {
    with_deadline(|| {
        let s = sched(1);
        let caught = s
            .submit(
                || {
                    let home = thread::current().id();
                    let r = catch_unwind(|| fibra::unblock(|| -> u8 { panic!("blocking boom") }));
                    assert_eq!(thread::current().id(), home);
                    panic_message(&*r.unwrap_err())
                },
                None,
            )
            .unwrap();
        assert_eq!(finish(caught).as_deref(), Some("blocking boom"));
        // Uncaught, it fails the task like any panic of the fiber.
        let uncaught = s
            .submit(
                || fibra::unblock(|| -> u8 { panic!("uncaught boom") }),
                None,
            )
            .unwrap();
        let err = uncaught.join().unwrap_err();
        assert!(err.is_panic());
        assert_eq!(
            panic_message(&*err.into_panic()).as_deref(),
            Some("uncaught boom")
        );
        // Outside a fiber, the panic simply happens here.
        let r = catch_unwind(|| fibra::unblock(|| -> u8 { panic!("inline boom") }));
        assert_eq!(
            panic_message(&*r.unwrap_err()).as_deref(),
            Some("inline boom")
        );
        s.stop();
    });
}

#[test]
fn the_blocking_function_may_borrow_from_the_fiber() {
    with_deadline(|| {
        let s = sched(2);
        let h = s
            .submit(
                || {
                    let mut v: Vec<u32> = (0..100).collect();
                    let total: u32 = fibra::unblock(|| {
                        v.iter_mut().for_each(|x| *x *= 2);
                        v.iter().sum()
                    });
                    (total, v[99])
                },
                None,
            )
            .unwrap();
        assert_eq!(finish(h), (9900, 198));
        s.stop();
    });
}

#[test]
fn thousands_of_calls_from_many_fibers() {
    with_deadline(|| {
        let s = Arc::new(sched(2));
        let handles: Vec<_> = (0..500u64)
            .map(|i| {
                s.submit(
                    move || {
                        let home = thread::current().id();
                        let mut sum = 0;
                        for k in 0..10 {
                            sum += fibra::unblock(move || i * 10 + k);
                            assert_eq!(thread::current().id(), home);
                        }
                        sum
                    },
                    None,
                )
                .unwrap()
            })
            .collect();
        let total: u64 = handles.into_iter().map(finish).sum();
        assert_eq!(total, (0..5000u64).sum::<u64>());
        s.stop();
    });
}

#[test]
fn a_fiber_cancelled_in_unblock_waits_for_the_borrowed_call() {
    with_deadline(|| cancelled_in_unblock_waits_for_the_borrowed_call(0));
}

/// A fiber makes `warm_up` quick unblock calls, then one that borrows its frame and blocks
/// for 200 ms, during which `stop_timeout` cancels it: the unwinding fiber must wait for the
/// blocking call before its frame goes away.
fn cancelled_in_unblock_waits_for_the_borrowed_call(warm_up: u32) {
    let s = sched(1);
    let finished = Arc::new(AtomicBool::new(false));
    let (started_tx, started) = mpsc::channel();
    let f = finished.clone();
    let h = s
        .submit(
            move || {
                let mut local = [0u8; 64];
                for k in 0..warm_up {
                    assert_eq!(fibra::unblock(move || k + 1), k + 1);
                }
                fibra::unblock(|| {
                    started_tx.send(()).unwrap();
                    thread::sleep(Duration::from_millis(200));
                    // Still borrowed: the cancelled fiber's frame must not be gone yet.
                    local.fill(7);
                    f.store(true, Ordering::SeqCst);
                });
                local[0]
            },
            None,
        )
        .unwrap();
    started.recv_timeout(LIMIT).unwrap();
    let cancelled = s.stop_timeout(Duration::from_millis(10));
    assert_eq!(cancelled, 1);
    // The unwinding fiber waited for the blocking call before its frame went away.
    assert!(finished.load(Ordering::SeqCst));
    assert!(h.join().unwrap_err().is_cancelled());
}

#[test]
fn unwind_safety_of_the_caller_is_its_own_business() {
    // `unblock` itself adds no unwind-safety requirement beyond what catch_unwind asks of
    // the caller: a panic leaves the caller's borrowed data as the function left it.
    with_deadline(|| {
        let s = sched(1);
        let h = s
            .submit(
                || {
                    let mut v = vec![1, 2, 3];
                    let r = catch_unwind(AssertUnwindSafe(|| {
                        fibra::unblock(|| {
                            v.push(4);
                            panic!("after a push")
                        })
                    }));
                    assert!(r.is_err());
                    v
                },
                None,
            )
            .unwrap();
        assert_eq!(finish(h), [1, 2, 3, 4]);
        s.stop();
    });
}

#[test]
fn back_to_back_calls_keep_their_results_and_panics_apart() {
    // Calls one after another are the case the pool spins for: a thread that has served
    // one looks for the next before it sleeps, and a call it finishes before the worker has
    // parked the fiber wakes it on its own worker. Every result, and every panic, must still
    // reach its own caller, at home, from fibers on every worker at once.
    with_deadline(|| {
        let s = Arc::new(sched(2));
        let handles: Vec<_> = (0..4u64)
            .map(|f| {
                s.submit(
                    move || {
                        let home = thread::current().id();
                        let mut sum = 0;
                        let mut panics = 0;
                        for k in 0..2_000u64 {
                            if k % 100 == 7 {
                                let r = catch_unwind(|| {
                                    fibra::unblock(move || -> u64 { panic!("call {f}/{k}") })
                                });
                                let msg = panic_message(&*r.unwrap_err());
                                assert_eq!(msg, Some(format!("call {f}/{k}")));
                                panics += 1;
                            } else {
                                sum += fibra::unblock(move || f * 1_000_000 + k);
                            }
                            assert_eq!(thread::current().id(), home);
                        }
                        (sum, panics)
                    },
                    Some(f as usize % 2),
                )
                .unwrap()
            })
            .collect();
        // Meanwhile, on a plain thread, the calls run inline.
        let me = thread::current().id();
        for _ in 0..100 {
            assert_eq!(fibra::unblock(|| thread::current().id()), me);
        }
        for (f, h) in handles.into_iter().enumerate() {
            let f = f as u64;
            let expected: u64 = (0..2_000u64)
                .filter(|k| k % 100 != 7)
                .map(|k| f * 1_000_000 + k)
                .sum();
            assert_eq!(finish(h), (expected, 20));
        }
        s.stop();
    });
}

#[test]
fn a_fiber_cancelled_after_back_to_back_calls_waits_for_the_borrowed_call() {
    // Like the test above, with the pool warmed by back-to-back calls, so that the blocking
    // call is taken by a thread that was spinning for it.
    with_deadline(|| cancelled_in_unblock_waits_for_the_borrowed_call(1_000));
}

/// A fiber cancelled by `JoinHandle::cancel` inside a long `unblock` call waits for the call
/// as a fiber: the rest of its worker runs meanwhile (it used to block the worker thread for
/// the rest of the call).
#[test]
fn a_fiber_cancelled_in_unblock_leaves_its_worker_running() {
    with_deadline(|| {
        let s = sched(1);
        let (started, running) = mpsc::channel();
        let release = Arc::new(AtomicBool::new(false));
        let r = release.clone();
        let h = s
            .submit(
                move || {
                    started.send(()).unwrap();
                    fibra::unblock(|| {
                        while !r.load(Ordering::SeqCst) {
                            thread::sleep(Duration::from_millis(1));
                        }
                    });
                },
                None,
            )
            .unwrap();
        running.recv_timeout(LIMIT).unwrap();
        thread::sleep(Duration::from_millis(20));
        h.cancel();
        // The call goes on until released; a task on the same worker runs meanwhile.
        let probe = s.submit(|| 7, Some(0)).unwrap();
        assert_eq!(finish(probe), 7);
        assert!(
            !h.is_finished(),
            "the cancelled fiber still waits for its call"
        );
        release.store(true, Ordering::SeqCst);
        assert!(h.wait_timeout(LIMIT));
        assert!(h.join().unwrap_err().is_cancelled());
        s.stop();
    });
}

/// `stop_timeout` while a fiber waits in a call that outlives the grace: the worker still
/// cancels the fiber parked beside it and abandons the one in the call, so both handles
/// resolve (cancelled) and the count has both, long before the call ends; the late call
/// writes into the abandoned fiber's frame harmlessly, and the pool serves a new scheduler.
#[test]
fn stop_timeout_abandons_a_fiber_whose_call_outlives_the_grace() {
    with_deadline(|| {
        let s = sched(1);
        let release = Arc::new(AtomicBool::new(false));
        let done = Arc::new(AtomicBool::new(false));
        let (r, d) = (release.clone(), done.clone());
        let (started, running) = mpsc::channel();
        let h = s
            .submit(
                move || {
                    let mut frame = [0u8; 4096];
                    started.send(()).unwrap();
                    fibra::unblock(|| {
                        while !r.load(Ordering::SeqCst) {
                            thread::sleep(Duration::from_millis(1));
                        }
                        frame.fill(7);
                        d.store(true, Ordering::SeqCst);
                    });
                    frame[17]
                },
                None,
            )
            .unwrap();
        let beside = s.submit(|| fibra::park(drop), Some(0)).unwrap();
        running.recv_timeout(LIMIT).unwrap();
        crate::common::wait_until("both fibers parked", || {
            s.metrics().workers()[0].fibers() == 2
        });
        let n = s.stop_timeout(Duration::from_millis(50));
        assert_eq!(n, 2, "both fibers cancelled or abandoned");
        assert!(
            h.wait_timeout(Duration::ZERO),
            "abandoned: resolved at once"
        );
        assert!(beside.wait_timeout(Duration::ZERO));
        assert!(h.join().unwrap_err().is_cancelled());
        assert!(beside.join().unwrap_err().is_cancelled());
        assert!(!done.load(Ordering::SeqCst), "the call was still running");
        drop(s);
        release.store(true, Ordering::SeqCst);
        crate::common::wait_until("the late call", || done.load(Ordering::SeqCst));
        let again = sched(1);
        assert_eq!(again.block_on(|| fibra::unblock(|| 41) + 1), 42);
        again.stop();
    });
}
