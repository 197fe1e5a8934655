//! A standalone fiber's stack goes back to the pool however the fiber ends: never resumed,
//! done, panicked, or dropped while suspended (the cancellation unwinds it). Thousands of
//! create-and-drop cycles therefore reuse a handful of stacks: the allocator's carved-stack
//! count and reserved address space stay flat instead of growing with the count.
//!
//! The stack figures are process-wide and the tests of this file run in parallel, each on its
//! own thread with its own pool; the bounds leave room for every test's first refill.

use std::cell::Cell;
use std::panic::{self, AssertUnwindSafe};
use std::rc::Rc;

use crate::common::{in_child, ChildRun};
use fibra::{Fiber, FiberState};

const CYCLES: usize = 20_000;

/// More than the stacks the other tests' pools can take at their first refill, far fewer than
/// the cycles of any test.
const MAX_NEW_STACKS: usize = 256;

/// Two slabs of address space.
const MAX_NEW_RESERVED: usize = 128 << 20;

/// Runs `cycles` create-and-drop cycles of `one` and fails if they carved stacks or reserved
/// address space in proportion to the count.
fn assert_stacks_reused(what: &str, cycles: usize, mut one: impl FnMut()) {
    // The first fiber on this thread fills its pool; count from there.
    one();
    let before = fibra::stack_stats();
    for _ in 0..cycles {
        one();
    }
    let after = fibra::stack_stats();
    let carved = after.stacks_carved - before.stacks_carved;
    let reserved = after.reserved_bytes - before.reserved_bytes;
    eprintln!("{what}: {cycles} cycles carved {carved} stacks, reserved {reserved} bytes");
    assert!(
        carved <= MAX_NEW_STACKS,
        "{what}: {cycles} cycles carved {carved} new stacks ({before:?} -> {after:?})"
    );
    assert!(
        reserved <= MAX_NEW_RESERVED,
        "{what}: {cycles} cycles reserved {reserved} more bytes ({before:?} -> {after:?})"
    );
}

/// Resident memory of this process, in bytes.
fn rss() -> usize {
    let statm = std::fs::read_to_string("/proc/self/statm").expect("Linux /proc");
    let pages: usize = statm
        .split_whitespace()
        .nth(1)
        .and_then(|p| p.parse().ok())
        .expect("statm's resident field");
    // Page size 4 KiB on the platforms fibra supports (x86_64; aarch64 and riscv64 kernels
    // may use larger pages, which only makes the bound below looser in pages).
    pages * 4096
}

/// Fails unless the child exited with status 0 and wrote `line` on stderr.
fn assert_child_said(run: &ChildRun, line: &str) {
    let (status, stderr) = (run.exit_status(), &run.stderr);
    assert!(status.success(), "status {status}, stderr:\n{stderr}");
    assert!(stderr.contains(line), "stderr:\n{stderr}");
}

/// Counts the drops of the value a fiber's closure captures.
struct CountDrop(Rc<Cell<usize>>);

impl Drop for CountDrop {
    fn drop(&mut self) {
        self.0.set(self.0.get() + 1);
    }
}

#[test]
fn never_resumed_fibers_give_their_stacks_back() {
    crate::common::child_ok(|| {
        let ran = Rc::new(Cell::new(0usize));
        let drops = Rc::new(Cell::new(0usize));
        let rss_before = rss();
        assert_stacks_reused("never resumed", CYCLES, || {
            let captured = CountDrop(drops.clone());
            let ran = ran.clone();
            let fiber = Fiber::new(move || {
                let _keep = &captured;
                ran.set(ran.get() + 1);
            });
            assert_eq!(fiber.state(), FiberState::Ready);
            drop(fiber);
        });
        let grown = rss().saturating_sub(rss_before);
        assert_eq!(ran.get(), 0, "dropping a fiber never runs its closure");
        assert_eq!(drops.get(), CYCLES + 1, "each closure is dropped once");
        // Without reuse, each cycle leaves the first page of a fresh stack resident (80 MiB).
        assert!(
            grown < 32 << 20,
            "RSS grew by {grown} bytes over {CYCLES} cycles"
        );
    });
}

#[test]
fn finished_fibers_give_their_stacks_back() {
    crate::common::child_ok(|| {
        assert_stacks_reused("done", CYCLES, || {
            let mut fiber = Fiber::new(|| {});
            assert_eq!(fiber.resume(), FiberState::Done);
        });
    });
}

#[test]
fn fibers_dropped_while_suspended_give_their_stacks_back() {
    crate::common::child_ok(|| {
        let unwound = Rc::new(Cell::new(0usize));
        assert_stacks_reused("dropped while suspended", CYCLES, || {
            let guard = CountDrop(unwound.clone());
            let mut fiber = Fiber::new(move || {
                let _guard = guard;
                Fiber::yield_now();
                unreachable!("the fiber is dropped while suspended");
            });
            assert_eq!(fiber.resume(), FiberState::Suspended);
            drop(fiber);
        });
        assert_eq!(unwound.get(), CYCLES + 1, "every drop unwound its fiber");
    });
}

/// Each panic is reported, so this runs in a child process without backtraces: that keeps
/// the reports out of this process and symbolisation's memory out of the RSS figure of
/// `never_resumed_fibers_give_their_stacks_back`.
#[test]
fn panicked_fibers_give_their_stacks_back() {
    let run = in_child(|| {
        assert_stacks_reused("panicked", 2_000, || {
            let mut fiber = Fiber::new(|| panic!("fiber_stacks: expected panic"));
            assert_eq!(fiber.resume(), FiberState::Panicked);
            assert!(fiber.take_panic().is_some());
        });
        eprintln!("child: panicked fibers checked");
    });
    assert_child_said(&run, "child: panicked fibers checked");
}

/// Panics when dropped.
struct PanicOnDrop;

impl Drop for PanicOnDrop {
    fn drop(&mut self) {
        panic!("fiber_stacks: a captured value's drop panics");
    }
}

/// A captured value's panicking drop, when a never-resumed fiber is dropped, reaches the
/// dropper once, the values captured around it are dropped once, and the stack goes back
/// to the pool. Were the panic turned into a double panic (as corosensei's own drop of such
/// a coroutine would), the process would abort, so this runs in a child process.
#[test]
fn a_panicking_closure_drop_reaches_the_dropper_once_and_frees_the_stack() {
    let run = in_child(|| {
        let drops = Rc::new(Cell::new(0usize));
        assert_stacks_reused("never resumed, closure drop panics", 300, || {
            let first = CountDrop(drops.clone());
            let bomb = PanicOnDrop;
            let last = CountDrop(drops.clone());
            let fiber = Fiber::new(move || {
                let _all = (&first, &bomb, &last);
            });
            let dropped = panic::catch_unwind(AssertUnwindSafe(|| drop(fiber)));
            let payload = dropped.expect_err("the closure's drop panic reaches the dropper");
            assert_eq!(
                payload.downcast_ref::<&str>(),
                Some(&"fiber_stacks: a captured value's drop panics")
            );
        });
        assert_eq!(
            drops.get(),
            2 * 301,
            "the captured values around the panicking one are dropped, once"
        );
        eprintln!("child: closure drops checked");
    });
    assert_child_said(&run, "child: closure drops checked");
}
