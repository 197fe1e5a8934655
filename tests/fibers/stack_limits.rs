//! Stacks at their limits: recursion close to the requested size, misuse of the task
//! builder refused with the closure handed back, an overflow in a minimum-size named fiber.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use crate::common::{finish, in_child, started};
use crate::overflow::aborted;
use fibra::MIN_STACK_SIZE;

/// Recursion using most of a task's stack works at MIN_STACK_SIZE, 1 MiB and 64 MiB: the
/// requested size is usable (minus a small margin).
#[test]
fn stacks_recursion_close_to_the_requested_size() {
    crate::common::with_deadline(|| {
        #[inline(never)]
        fn recurse(depth: usize) -> u64 {
            let mut frame = [0u8; 1024];
            std::hint::black_box(&mut frame);
            if depth == 0 {
                return frame[0] as u64;
            }
            recurse(depth - 1) + std::hint::black_box(frame[depth % 1024]) as u64
        }
        let sched = started(2);
        for (size, margin_kib) in [(MIN_STACK_SIZE, 40), (1 << 20, 64), (64 << 20, 64)] {
            // Frames are a little over 1 KiB in debug builds: use ~ (size - margin) / 1.3 KiB.
            let depth = (size / 1024 - margin_kib) * 10 / 14;
            let h = sched
                .task()
                .name(format!("deep-{size}"))
                .stack_size(size)
                .submit(move || recurse(depth), None)
                .unwrap();
            assert_eq!(finish(h), 0, "size {size}");
        }
        sched.stop();
    });
}

/// Stack size and pin misuse: each refusal hands the closure back, the scheduler goes on.
#[test]
fn stacks_builder_misuse_is_refused_with_the_closure() {
    crate::common::with_deadline(|| {
        let sched = started(2);
        let drops = Arc::new(AtomicUsize::new(0));
        for (size, pin) in [
            (MIN_STACK_SIZE - 1, None),
            (0, None),
            (usize::MAX, None),
            ((1 << 30) + 1, None),
            (MIN_STACK_SIZE, Some(2)),
            (MIN_STACK_SIZE, Some(usize::MAX)),
        ] {
            let c = crate::common::Counted(drops.clone());
            let r = sched
                .task()
                .name("x".repeat(10_000))
                .stack_size(size)
                .submit(move || drop(c), pin);
            match r {
                Err(e) => {
                    let f = e.into_inner();
                    f();
                }
                Ok(_) => panic!("size {size} pin {pin:?} accepted"),
            }
        }
        assert_eq!(drops.load(Ordering::SeqCst), 6);
        // Names with odd content work.
        for name in ["", "a\0b", "ünï\ncode", &"y".repeat(100_000)] {
            let n2 = name.to_string();
            let h = sched
                .task()
                .name(name)
                .submit(
                    move || fibra::Fiber::current().unwrap().name().map(String::from),
                    Some(1),
                )
                .unwrap();
            assert_eq!(finish(h).as_deref(), Some(n2.as_str()));
        }
        // The largest accepted stack size runs.
        let h = sched.task().stack_size(1 << 30).submit(|| 1, None).unwrap();
        let r = h.join();
        assert!(
            r.as_ref().map_or_else(|e| e.is_no_stack(), |&v| v == 1),
            "{r:?}"
        );
        sched.stop();
    });
}

/// A stack overflow in a named fiber on the minimum stack size: the report names the fiber
/// and the process aborts (SIGABRT), even with so small a stack.
#[test]
fn an_overflow_in_a_named_fiber_on_the_minimum_stack_aborts_naming_it() {
    let run = in_child(|| {
        #[inline(never)]
        #[allow(unconditional_recursion)]
        fn recurse(d: u64) -> u64 {
            let mut frame = [0u8; 512];
            std::hint::black_box(&mut frame);
            recurse(d + 1) + frame[d as usize % 512] as u64
        }
        let sched = started(2);
        let h = sched
            .task()
            .name("tiny-overflow")
            .stack_size(MIN_STACK_SIZE)
            .submit(|| recurse(0), Some(1))
            .unwrap();
        let _ = h.join();
        eprintln!("UNREACHABLE: the overflow did not abort");
    });
    let err = aborted(&run);
    assert!(err.contains("tiny-overflow"), "{err}");
    assert!(err.contains("overflow"), "{err}");
}
