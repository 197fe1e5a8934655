//! `fibra::scope`: scoped fibers borrow from the caller, which waits for all of them.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use crate::common::{finish, started, with_deadline, LIMIT};

#[test]
fn scoped_fibers_borrow_and_mutate_the_callers_data() {
    with_deadline(|| {
        let sched = started(2);
        let out = sched.block_on(|| {
            let mut data = vec![0u64; 1000];
            let shared = 7u64;
            fibra::scope(|s| {
                for (i, chunk) in data.chunks_mut(100).enumerate() {
                    let shared = &shared;
                    s.spawn(move || {
                        for (j, x) in chunk.iter_mut().enumerate() {
                            *x = (i * 100 + j) as u64 * shared;
                            if j % 10 == 0 {
                                fibra::Fiber::yield_now();
                            }
                        }
                    });
                }
            });
            data
        });
        assert!(out.iter().enumerate().all(|(k, x)| *x == k as u64 * 7));
        sched.stop();
    });
}

#[test]
fn nested_spawns_and_values() {
    with_deadline(|| {
        let sched = started(2);
        let total = sched.block_on(|| {
            let counter = AtomicUsize::new(0);
            let sum = fibra::scope(|s| {
                let handles: Vec<_> = (0..100)
                    .map(|i| {
                        let counter = &counter;
                        s.spawn(move || {
                            // A scoped fiber spawns into the same scope.
                            s.spawn(move || counter.fetch_add(1, Ordering::SeqCst));
                            i
                        })
                    })
                    .collect();
                handles
                    .into_iter()
                    .map(|h| h.join().unwrap())
                    .sum::<usize>()
            });
            // Every nested fiber ended before scope returned.
            (sum, counter.load(Ordering::SeqCst))
        });
        assert_eq!(total, (4950, 100));
        sched.stop();
    });
}

#[test]
fn an_unjoined_panicking_fiber_makes_the_scope_panic_after_all_ended() {
    with_deadline(|| {
        let sched = started(2);
        let h = sched
            .submit(
                || {
                    let ended = AtomicUsize::new(0);
                    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                        fibra::scope(|s| {
                            s.spawn(|| panic!("scoped boom"));
                            for _ in 0..10 {
                                s.spawn(|| {
                                    fibra::sleep(Duration::from_millis(20));
                                    ended.fetch_add(1, Ordering::SeqCst);
                                });
                            }
                        })
                    }));
                    (r.is_err(), ended.load(Ordering::SeqCst))
                },
                None,
            )
            .unwrap();
        assert_eq!(finish(h), (true, 10));
        sched.stop();
    });
}

#[test]
fn a_joined_panic_does_not_make_the_scope_panic() {
    with_deadline(|| {
        let sched = started(2);
        let caught = sched.block_on(|| {
            fibra::scope(|s| {
                let h = s.spawn(|| -> u32 { panic!("joined boom") });
                h.join().unwrap_err().is_panic()
            })
        });
        assert!(caught);
        sched.stop();
    });
}

#[test]
fn the_scope_waits_when_its_own_body_panics() {
    with_deadline(|| {
        let sched = started(2);
        let h = sched
            .submit(
                || {
                    let ended = AtomicUsize::new(0);
                    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                        fibra::scope(|s| {
                            for _ in 0..5 {
                                s.spawn(|| {
                                    fibra::sleep(Duration::from_millis(20));
                                    ended.fetch_add(1, Ordering::SeqCst);
                                });
                            }
                            panic!("body boom");
                        })
                    }));
                    let msg = r.unwrap_err().downcast::<&str>().map(|s| *s).unwrap_or("?");
                    (msg, ended.load(Ordering::SeqCst))
                },
                None,
            )
            .unwrap();
        assert_eq!(finish(h), ("body boom", 5));
        sched.stop();
    });
}

/// The scope's caller is cancelled while four fibers borrowing its frame run: in `f` (it
/// sleeps there), or, with `f_returns`, once `f` has returned and the scope waits for them.
/// The cancellation must wait for the fibers either way. In the second case it used to
/// unwind out of the scope at once, freeing the frame its fibers still borrowed.
fn a_cancelled_scope_waits_for_its_fibers(f_ends: FEnds) {
    with_deadline(move || {
        let sched = started(2);
        let ended = Arc::new(AtomicUsize::new(0));
        let e = ended.clone();
        let (spawned, spawned_rx) = std::sync::mpsc::channel();
        let h = sched
            .submit(
                move || {
                    let local = AtomicUsize::new(0);
                    fibra::scope(|s| {
                        for _ in 0..4 {
                            s.spawn(|| {
                                fibra::sleep(Duration::from_millis(200));
                                // Borrows the cancelled fiber's frame: still alive.
                                local.fetch_add(1, Ordering::SeqCst);
                                e.fetch_add(1, Ordering::SeqCst);
                            });
                        }
                        spawned.send(()).unwrap();
                        match f_ends {
                            FEnds::Sleeping => fibra::sleep(Duration::from_secs(3600)),
                            FEnds::Returning => {}
                            FEnds::Panicking => panic!("f gives up"),
                        }
                    });
                },
                None,
            )
            .unwrap();
        spawned_rx.recv().unwrap();
        std::thread::sleep(Duration::from_millis(20));
        h.cancel();
        assert!(h.wait_timeout(LIMIT));
        let err = h.join().unwrap_err();
        assert!(
            err.is_cancelled() || (f_ends == FEnds::Panicking && err.is_panic()),
            "{err:?}"
        );
        assert_eq!(
            ended.load(Ordering::SeqCst),
            4,
            "the scope returned before its fibers"
        );
        sched.stop();
    });
}

/// Where `f` is when its caller is cancelled.
#[derive(Clone, Copy, PartialEq, Debug)]
enum FEnds {
    /// In a long sleep.
    Sleeping,
    /// Returned: the scope waits for its fibers.
    Returning,
    /// Panicked: the scope waits for its fibers, then reports the panic or the cancellation.
    Panicking,
}

#[test]
fn a_cancelled_scope_still_waits_for_its_fibers() {
    a_cancelled_scope_waits_for_its_fibers(FEnds::Sleeping);
}

#[test]
fn a_scope_cancelled_while_it_waits_for_its_fibers_still_waits() {
    a_cancelled_scope_waits_for_its_fibers(FEnds::Returning);
}

#[test]
fn a_scope_cancelled_after_f_panicked_still_waits() {
    a_cancelled_scope_waits_for_its_fibers(FEnds::Panicking);
}

#[test]
fn scope_outside_a_fiber_panics_with_a_clear_message() {
    let r = std::panic::catch_unwind(|| fibra::scope(|_| ()));
    let msg = crate::common::panic_message(&*r.unwrap_err()).unwrap_or_default();
    assert!(
        msg.contains("fibra::scope must be called from a fiber"),
        "{msg}"
    );
}
