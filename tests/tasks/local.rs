//! What fibers that never change thread allow: `spawn_local` for `!Send` closures and
//! results, and `fiber_local!` values per fiber.

use std::cell::{Cell, RefCell};
use std::rc::Rc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use crate::common::{panic_message, started, with_deadline};

#[test]
fn thousands_of_local_fibers_share_rc_refcell_state_across_yields_and_sleeps() {
    with_deadline(|| {
        let s = started(2);
        let (total, everywhere_home) = s.block_on(|| {
            let home = fibra::current_worker();
            let log = Rc::new(RefCell::new(Vec::new()));
            let fibers: Vec<_> = (0..2_000u32)
                .map(|i| {
                    let log = log.clone();
                    fibra::spawn_local(move || {
                        let mut home_every_time = true;
                        for round in 0..5u32 {
                            log.borrow_mut().push(i * 5 + round);
                            if round % 2 == 0 {
                                fibra::Fiber::yield_now();
                            } else {
                                fibra::sleep(Duration::from_millis(1));
                            }
                            home_every_time &= fibra::current_worker() == home;
                        }
                        home_every_time
                    })
                })
                .collect();
            let home_every_time = fibers.into_iter().all(|h| h.join().unwrap());
            let mut seen = log.borrow().clone();
            seen.sort_unstable();
            assert_eq!(Rc::strong_count(&log), 1, "every fiber's clone dropped");
            (seen, home_every_time)
        });
        assert_eq!(total, (0..10_000).collect::<Vec<u32>>());
        assert!(everywhere_home);
        s.stop();
    });
}

#[test]
fn spawn_local_outside_a_scheduled_fiber_panics_with_a_message() {
    let p = std::thread::spawn(|| drop(fibra::spawn_local(|| ())))
        .join()
        .unwrap_err();
    let msg = panic_message(&*p).unwrap();
    assert!(
        msg.contains("fibra::spawn_local must be called from a fiber"),
        "{msg}"
    );
    // In a standalone fiber, even inside a scheduled one: no worker of its own.
    let s = started(1);
    let msg = s.block_on(|| {
        let mut f = fibra::Fiber::new(|| drop(fibra::spawn_local(|| ())));
        f.resume();
        f.take_panic()
            .and_then(|p| panic_message(&*p))
            .unwrap_or_default()
    });
    assert!(
        msg.contains("fibra::spawn_local must be called from a fiber"),
        "{msg}"
    );
    s.stop();
}

/// Counts its drops in a shared counter, from any thread.
struct Counted(Arc<AtomicUsize>);

impl Drop for Counted {
    fn drop(&mut self) {
        self.0.fetch_add(1, Ordering::SeqCst);
    }
}

#[test]
fn a_local_fiber_panics_is_cancelled_or_detached_and_its_values_are_dropped_at_home() {
    with_deadline(|| {
        let s = started(2);
        s.block_on(|| {
            // A panic reaches the handle.
            let h = fibra::spawn_local(|| -> Rc<u8> { panic!("local boom") });
            let e = h.join().unwrap_err();
            assert_eq!(
                panic_message(&*e.into_panic()).as_deref(),
                Some("local boom")
            );

            // A cancelled fiber drops what it captured; its handle says cancelled.
            let held = Rc::new(());
            let h = {
                let held = held.clone();
                fibra::spawn_local(move || {
                    fibra::sleep(Duration::from_secs(3600));
                    drop(held);
                })
            };
            fibra::Fiber::yield_now();
            assert!(!h.is_finished());
            h.cancel();
            assert!(h.join().unwrap_err().is_cancelled());
            assert_eq!(Rc::strong_count(&held), 1);

            // A detached fiber runs to its end, and its `!Send` result is dropped at home.
            let home = fibra::current_worker();
            let result_home = Rc::new(Cell::new(None));
            struct Reports(Rc<Cell<Option<Option<usize>>>>);
            impl Drop for Reports {
                fn drop(&mut self) {
                    self.0.set(Some(fibra::current_worker()));
                }
            }
            let r = result_home.clone();
            drop(fibra::spawn_local(move || Reports(r)));
            while result_home.get().is_none() {
                fibra::sleep(Duration::from_millis(1));
            }
            assert_eq!(result_home.get(), Some(home));

            // Local fibers spawn local fibers.
            let inner = fibra::spawn_local(|| fibra::spawn_local(|| Rc::new(7)).join().unwrap());
            assert_eq!(*inner.join().unwrap(), 7);
        });
        s.stop();
    });
}

#[test]
fn spawn_local_once_the_scheduler_cancels_reports_cancelled_and_drops_the_closure() {
    // While a scheduler drains, its fibers may still spawn; once it cancels, it refuses.
    with_deadline(|| {
        let s = started(1);
        let dropped = Arc::new(AtomicUsize::new(0));
        let refused = Arc::new(AtomicUsize::new(0));
        /// Spawns a local fiber as the cancelled fiber unwinds.
        struct SpawnsOnUnwind(Arc<AtomicUsize>, Arc<AtomicUsize>);
        impl Drop for SpawnsOnUnwind {
            fn drop(&mut self) {
                let c = Counted(self.0.clone());
                let rc = Rc::new(());
                let h = fibra::spawn_local(move || drop((c, rc)));
                if h.join().is_err_and(|e| e.is_cancelled()) {
                    self.1.fetch_add(1, Ordering::SeqCst);
                }
            }
        }
        let guard = SpawnsOnUnwind(dropped.clone(), refused.clone());
        let h = s.spawn(move || {
            let _guard = guard;
            fibra::sleep(Duration::from_secs(3600));
        });
        crate::common::wait_until("the sleeper to park", || s.metrics().timers() > 0);
        s.stop_timeout(Duration::from_millis(10));
        assert!(h.join().unwrap_err().is_cancelled());
        assert_eq!(refused.load(Ordering::SeqCst), 1);
        assert_eq!(dropped.load(Ordering::SeqCst), 1);
    });
}

fibra::fiber_local! {
    static LOG: RefCell<Vec<u32>> = RefCell::new(Vec::new());
    static MADE: Cell<u32> = {
        INITS.fetch_add(1, Ordering::SeqCst);
        Cell::new(0)
    };
}

static INITS: AtomicUsize = AtomicUsize::new(0);

#[test]
fn each_fiber_has_its_own_value_made_lazily() {
    with_deadline(|| {
        let s = started(2);
        let before = INITS.load(Ordering::SeqCst);
        let handles: Vec<_> = (0..1_000u32)
            .map(|i| {
                s.spawn(move || {
                    for k in 0..3 {
                        LOG.with(|l| l.borrow_mut().push(i + k));
                        fibra::Fiber::yield_now();
                    }
                    if i % 2 == 0 {
                        MADE.with(|m| m.set(i));
                    }
                    LOG.with(|l| l.borrow().clone())
                })
            })
            .collect();
        for (i, h) in handles.into_iter().enumerate() {
            let i = i as u32;
            assert_eq!(h.join().unwrap(), vec![i, i + 1, i + 2]);
        }
        // Made only by the fibers that asked.
        assert_eq!(INITS.load(Ordering::SeqCst) - before, 500);
        s.stop();
    });
}

fibra::fiber_local! {
    static DROPS: RefCell<Option<Counted>> = RefCell::new(None);
}

#[test]
fn values_are_dropped_when_their_fiber_ends_however_it_ends() {
    with_deadline(|| {
        let s = started(2);
        let n = Arc::new(AtomicUsize::new(0));
        let hold = |n: &Arc<AtomicUsize>| {
            let c = Counted(n.clone());
            DROPS.with(|d| *d.borrow_mut() = Some(c));
        };
        // Returned: dropped before the join returns.
        let m = n.clone();
        s.spawn(move || hold(&m)).join().unwrap();
        assert_eq!(n.load(Ordering::SeqCst), 1);
        // Panicked.
        let m = n.clone();
        let e = s.spawn(move || {
            hold(&m);
            panic!("after a value");
        });
        assert!(e.join().unwrap_err().is_panic());
        assert_eq!(n.load(Ordering::SeqCst), 2);
        // Cancelled while parked.
        let m = n.clone();
        let h = s.spawn(move || {
            hold(&m);
            fibra::sleep(Duration::from_secs(3600));
        });
        crate::common::wait_until("the sleeper to park", || s.metrics().timers() > 0);
        h.cancel();
        assert!(h.join().unwrap_err().is_cancelled());
        assert_eq!(n.load(Ordering::SeqCst), 3);
        // A plain thread's value is its own, dropped as the thread exits.
        let m = n.clone();
        std::thread::spawn(move || hold(&m)).join().unwrap();
        assert_eq!(n.load(Ordering::SeqCst), 4);
        s.stop();
    });
}

/// Panics as it is dropped.
struct PanicsOnDrop;

impl Drop for PanicsOnDrop {
    fn drop(&mut self) {
        panic!("a fiber-local's destructor");
    }
}

fibra::fiber_local! {
    static BAD: RefCell<Option<PanicsOnDrop>> = RefCell::new(None);
    static AGAIN: Cell<u32> = Cell::new(0);
    static REMAKES: RefCell<Option<Remakes>> = RefCell::new(None);
}

/// Reaches its own fiber-local again from its destructor, which makes a fresh one.
struct Remakes(Arc<AtomicUsize>);

impl Drop for Remakes {
    fn drop(&mut self) {
        self.0.fetch_add(1, Ordering::SeqCst);
        let again = Remakes(self.0.clone());
        REMAKES.with(|r| *r.borrow_mut() = Some(again));
    }
}

#[test]
fn destructors_that_panic_or_make_new_values_end_cleanly() {
    with_deadline(|| {
        let s = started(1);
        // A destructor's panic fails a task that returned; the worker goes on.
        let h = s.spawn(|| {
            BAD.with(|b| *b.borrow_mut() = Some(PanicsOnDrop));
            5
        });
        let e = h.join().unwrap_err();
        assert_eq!(
            panic_message(&*e.into_panic()).as_deref(),
            Some("a fiber-local's destructor")
        );
        // A task that panicked keeps its own panic.
        let h = s.spawn(|| {
            BAD.with(|b| *b.borrow_mut() = Some(PanicsOnDrop));
            panic!("the body's own")
        });
        let e = h.join().unwrap_err();
        assert_eq!(
            panic_message(&*e.into_panic()).as_deref(),
            Some("the body's own")
        );
        // A destructor that keeps making values is bounded: a few rounds, then leaked.
        let n = Arc::new(AtomicUsize::new(0));
        let m = n.clone();
        s.spawn(move || REMAKES.with(|r| *r.borrow_mut() = Some(Remakes(m))))
            .join()
            .unwrap();
        let rounds = n.load(Ordering::SeqCst);
        assert!((1..=16).contains(&rounds), "{rounds} rounds");
        // Nested access and an initialiser that reaches another fiber-local.
        let v = s.block_on(|| {
            AGAIN.with(|a| {
                a.set(3);
                MADE.with(|m| m.set(a.get() + 1));
                MADE.with(Cell::get)
            })
        });
        assert_eq!(v, 4);
        assert_eq!(s.block_on(|| 1 + 1), 2, "the worker still runs");
        s.stop();
    });
}

#[test]
fn a_standalone_fiber_handed_to_the_worker_runs_between_its_yields_to_its_end() {
    with_deadline(|| {
        let s = started(2);
        s.block_on(|| {
            // Resumed part-way by hand, then handed over: it goes on from its last yield.
            let steps = Rc::new(Cell::new(0));
            let st = steps.clone();
            let mut fiber = fibra::Fiber::new(move || {
                for _ in 0..5 {
                    st.set(st.get() + 1);
                    fibra::Fiber::yield_now();
                }
            });
            fiber.resume();
            assert_eq!(steps.get(), 1);
            let h = fibra::spawn_local_fiber(fiber);
            h.join().unwrap();
            assert_eq!(steps.get(), 5);

            // A panic inside reaches the handle.
            let fiber = fibra::Fiber::new(|| {
                fibra::Fiber::yield_now();
                panic!("in the standalone fiber");
            });
            let e = fibra::spawn_local_fiber(fiber).join().unwrap_err();
            assert_eq!(
                panic_message(&*e.into_panic()).as_deref(),
                Some("in the standalone fiber")
            );

            // Cancelled while it is suspended: the handle says so, and what the fiber held is
            // dropped.
            let held = Rc::new(());
            let h2 = held.clone();
            let fiber = fibra::Fiber::new(move || {
                let _h = h2;
                loop {
                    fibra::Fiber::yield_now();
                }
            });
            let h = fibra::spawn_local_fiber(fiber);
            fibra::Fiber::yield_now();
            h.cancel();
            assert!(h.join().unwrap_err().is_cancelled());
            assert_eq!(Rc::strong_count(&held), 1);

            // One that has ended is done at once.
            let mut ended = fibra::Fiber::new(|| ());
            assert_eq!(ended.resume(), fibra::FiberState::Done);
            fibra::spawn_local_fiber(ended).join().unwrap();
        });
        s.stop();
    });
}
