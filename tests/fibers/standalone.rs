//! Standalone fibers (`Fiber::new`): an asymmetric coroutine on the current
//! thread. Pins down its states, that values flow in order across yields, that
//! a panic ends the fiber instead of unwinding into the resumer, that dropping
//! a suspended fiber unwinds its stack, and that `yield_now` returns to the
//! resumer (or just yields the thread outside any fiber).

use std::cell::{Cell, RefCell};
use std::collections::VecDeque;
use std::panic::{self, AssertUnwindSafe};
use std::rc::Rc;

use crate::common::{finish, with_deadline};
use fibra::{current_worker, Fiber, FiberState, Scheduler};

/// Sets its flag when dropped, to observe that a fiber's stack was unwound.
struct SetOnDrop(Rc<Cell<bool>>);

impl Drop for SetOnDrop {
    fn drop(&mut self) {
        self.0.set(true);
    }
}

#[test]
fn states_go_ready_suspended_done() {
    // The closure captures an Rc: a standalone fiber needs no Send.
    let steps = Rc::new(Cell::new(0));
    let inner = Rc::clone(&steps);
    let mut fiber = Fiber::new(move || {
        inner.set(1);
        Fiber::yield_now();
        inner.set(2);
    });
    assert_eq!(fiber.state(), FiberState::Ready);
    assert_eq!(steps.get(), 0, "Fiber::new does not run the closure");

    assert_eq!(fiber.resume(), FiberState::Suspended);
    assert_eq!(fiber.state(), FiberState::Suspended);
    assert_eq!(steps.get(), 1);

    assert_eq!(fiber.resume(), FiberState::Done);
    assert_eq!(fiber.state(), FiberState::Done);
    assert_eq!(steps.get(), 2);
}

#[test]
fn resuming_a_done_fiber_stays_done() {
    let runs = Rc::new(Cell::new(0));
    let inner = Rc::clone(&runs);
    let mut fiber = Fiber::new(move || inner.set(inner.get() + 1));
    assert_eq!(fiber.resume(), FiberState::Done);
    for _ in 0..3 {
        assert_eq!(fiber.resume(), FiberState::Done);
        assert_eq!(fiber.state(), FiberState::Done);
    }
    assert_eq!(runs.get(), 1, "the closure ran once");
}

#[test]
fn a_panic_ends_the_fiber_without_unwinding_into_the_caller() {
    let mut fiber = Fiber::new(|| {
        Fiber::yield_now();
        panic!("standalone boom");
    });
    assert_eq!(fiber.resume(), FiberState::Suspended);
    let outcome = panic::catch_unwind(AssertUnwindSafe(|| fiber.resume()));
    let state = outcome.expect("the panic stays inside the fiber");
    assert_eq!(state, FiberState::Panicked);
    assert_eq!(fiber.state(), FiberState::Panicked);

    let again = panic::catch_unwind(AssertUnwindSafe(|| fiber.resume()));
    assert_eq!(
        again.expect("resuming a panicked fiber does not panic"),
        FiberState::Panicked
    );
}

#[test]
fn yield_now_outside_a_fiber_just_returns() {
    // Outside a fiber this is a thread yield, which can take a whole time
    // slice on a loaded machine: keep the count small.
    for _ in 0..10 {
        Fiber::yield_now();
    }
    assert!(Fiber::current().is_none());
    assert_eq!(current_worker(), None);
}

#[test]
fn values_flow_in_order_across_yields() {
    let inbox = Rc::new(RefCell::new(VecDeque::new()));
    let outbox = Rc::new(RefCell::new(Vec::new()));
    let (fiber_in, fiber_out) = (Rc::clone(&inbox), Rc::clone(&outbox));
    let mut fiber = Fiber::new(move || {
        for _ in 0..5 {
            let value: u32 = fiber_in.borrow_mut().pop_front().expect("a value was sent");
            fiber_out.borrow_mut().push(value * 10);
            Fiber::yield_now();
        }
    });
    for i in 0..5 {
        inbox.borrow_mut().push_back(i);
        assert_eq!(fiber.resume(), FiberState::Suspended);
        let expected: Vec<u32> = (0..=i).map(|v| v * 10).collect();
        assert_eq!(*outbox.borrow(), expected);
    }
    assert_eq!(fiber.resume(), FiberState::Done);
    assert_eq!(*outbox.borrow(), vec![0, 10, 20, 30, 40]);
}

#[test]
fn dropping_a_suspended_fiber_unwinds_its_stack() {
    let dropped = Rc::new(Cell::new(false));
    let resumed = Rc::new(Cell::new(false));
    let (guard, after) = (Rc::clone(&dropped), Rc::clone(&resumed));
    let mut fiber = Fiber::new(move || {
        let _guard = SetOnDrop(guard);
        Fiber::yield_now();
        after.set(true);
    });
    assert_eq!(fiber.resume(), FiberState::Suspended);
    assert!(!dropped.get());
    drop(fiber);
    assert!(dropped.get(), "a value on the fiber's stack was dropped");
    assert!(!resumed.get(), "the fiber did not run on past its yield");
}

#[test]
fn dropping_an_unstarted_fiber_drops_its_closure() {
    let dropped = Rc::new(Cell::new(false));
    let guard = SetOnDrop(Rc::clone(&dropped));
    let ran = Rc::new(Cell::new(false));
    let inner = Rc::clone(&ran);
    let fiber = Fiber::new(move || {
        let _guard = guard;
        inner.set(true);
    });
    assert_eq!(fiber.state(), FiberState::Ready);
    drop(fiber);
    assert!(dropped.get(), "the captured value was dropped");
    assert!(!ran.get(), "the closure never ran");
}

#[test]
fn fibers_have_distinct_ids_and_know_themselves() {
    let seen = Rc::new(Cell::new(None));
    let inner = Rc::clone(&seen);
    let mut first = Fiber::new(move || inner.set(Fiber::current().map(|info| info.id())));
    let second = Fiber::new(|| {});
    assert_ne!(first.id(), second.id());
    assert_eq!(first.id().to_string(), format!("#{}", first.id().as_u64()));

    assert_eq!(first.resume(), FiberState::Done);
    assert_eq!(
        seen.get(),
        Some(first.id()),
        "Fiber::current() inside a fiber"
    );
    assert!(Fiber::current().is_none(), "back on the plain thread");
}

#[test]
fn yield_returns_to_the_resumer_of_a_nested_fiber() {
    let log = Rc::new(RefCell::new(Vec::new()));
    let outer_log = Rc::clone(&log);
    let mut outer = Fiber::new(move || {
        let outer_id = Fiber::current().map(|info| info.id());
        let inner_log = Rc::clone(&outer_log);
        let mut inner = Fiber::new(move || {
            inner_log.borrow_mut().push("inner 1");
            Fiber::yield_now();
            inner_log.borrow_mut().push("inner 2");
        });
        let inner_id = inner.id();
        outer_log.borrow_mut().push("outer start");
        let first = inner.resume();
        outer_log.borrow_mut().push("outer between");
        Fiber::yield_now();
        let second = inner.resume();
        outer_log.borrow_mut().push("outer end");
        assert_eq!((first, second), (FiberState::Suspended, FiberState::Done));
        assert_eq!(Fiber::current().map(|info| info.id()), outer_id);
        assert_ne!(outer_id, Some(inner_id));
    });
    assert_eq!(outer.resume(), FiberState::Suspended);
    assert_eq!(*log.borrow(), ["outer start", "inner 1", "outer between"]);
    assert_eq!(outer.resume(), FiberState::Done);
    assert_eq!(
        *log.borrow(),
        [
            "outer start",
            "inner 1",
            "outer between",
            "inner 2",
            "outer end"
        ]
    );
}

#[test]
fn a_standalone_fiber_inside_a_task_yields_to_the_task() {
    with_deadline(|| {
        let sched = Scheduler::builder().threads(1).build().expect("build");
        sched.start();
        let handle = sched
            .submit(
                || {
                    let steps = Rc::new(Cell::new(0));
                    let inner = Rc::clone(&steps);
                    let mut fiber = Fiber::new(move || {
                        inner.set(1);
                        Fiber::yield_now();
                        inner.set(2);
                    });
                    let first = fiber.resume();
                    let between = steps.get();
                    // The task itself yields to its worker in between.
                    Fiber::yield_now();
                    let second = fiber.resume();
                    (first, between, second, steps.get())
                },
                None,
            )
            .expect("submit");
        assert_eq!(
            finish(handle),
            (FiberState::Suspended, 1, FiberState::Done, 2)
        );
    });
}

#[test]
fn many_suspended_fibers_coexist() {
    const FIBERS: usize = 10_000;
    let finished = Rc::new(Cell::new(0));
    let mut fibers: Vec<Fiber> = (0..FIBERS)
        .map(|_| {
            let finished = Rc::clone(&finished);
            Fiber::new(move || {
                Fiber::yield_now();
                finished.set(finished.get() + 1);
            })
        })
        .collect();
    for fiber in &mut fibers {
        assert_eq!(fiber.resume(), FiberState::Suspended);
    }
    for fiber in &mut fibers {
        assert_eq!(fiber.resume(), FiberState::Done);
    }
    assert_eq!(finished.get(), FIBERS);
}

#[test]
fn an_out_of_range_stack_size_is_an_invalid_input_error() {
    for size in [0, 1, fibra::MIN_STACK_SIZE - 1, 1 << 40] {
        let err = Fiber::with_options(|| {}, None, size).expect_err("refused");
        assert_eq!(
            err.kind(),
            std::io::ErrorKind::InvalidInput,
            "{size}: {err}"
        );
    }
    let mut ok = Fiber::with_options(|| {}, Some("ok"), fibra::MIN_STACK_SIZE).expect("minimum");
    assert_eq!(ok.resume(), fibra::FiberState::Done);
}
