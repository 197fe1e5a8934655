//! A `use_caller(true)` scheduler is freed when it is dropped, with every fiber stack worker 0
//! used. Worker 0's state, kept in the scheduler's shared state between drives, must not
//! hold an `Arc` back to that shared state: such a cycle would keep both alive for ever, and
//! a program that builds a scheduler per request, per test or per job would leak ~100 stacks
//! (and their touched pages) every time.
//!
//! `fibra::stack_stats()` is process-wide, so the test runs in a child process of its own:
//! nothing else carves stacks while it counts.

use std::sync::Arc;

use crate::common::with_deadline;
use fibra::sync::Barrier;
use fibra::Scheduler;

const ROUNDS: usize = 30;
const FIBERS: usize = 100;

/// What a user would see of a leak: memory (fiber stacks, `stacks_carved`) growing by ~100
/// stacks per scheduler built with `use_caller(true)` and dropped. Dropping gives the stacks
/// back and the next scheduler reuses them, so the count stays flat after the first round.
#[test]
fn dropped_use_caller_schedulers_give_their_fiber_stacks_back() {
    crate::common::child_ok(|| {
        with_deadline(|| {
            let before = fibra::stack_stats().stacks_carved;
            for round in 0..ROUNDS {
                // The building thread (this one) is worker 0.
                let sched = Scheduler::builder()
                    .threads(2)
                    .use_caller(true)
                    .name("caller-drop")
                    .build()
                    .expect("build");
                // All FIBERS fibers alive at once, on worker 0: each waits at the barrier until
                // the last one arrives, so each needs a stack of its own.
                let barrier = Arc::new(Barrier::new(FIBERS));
                let handles: Vec<_> = (0..FIBERS)
                    .map(|_| {
                        let barrier = Arc::clone(&barrier);
                        sched
                            .submit(
                                move || {
                                    barrier.wait();
                                },
                                Some(0),
                            )
                            .expect("submit")
                    })
                    .collect();
                // block_on drives worker 0 on this thread until every fiber has finished.
                let finished = sched.block_on(move || {
                    handles
                        .into_iter()
                        .map(|h| h.join().is_ok())
                        .filter(|ok| *ok)
                        .count()
                });
                assert_eq!(finished, FIBERS, "round {round}: every fiber ran");
                sched.stop();
                drop(sched);
            }
            let carved = fibra::stack_stats().stacks_carved - before;
            eprintln!("{ROUNDS} use_caller schedulers x {FIBERS} fibers: {carved} stacks carved");
            assert!(
                carved < 1000,
                "{carved} fiber stacks carved for {ROUNDS} rounds of {FIBERS} fibers — \
                 a dropped use_caller scheduler never gives worker 0's stacks back (Arc cycle \
                 between the shared state and worker 0), so every round carves new ones"
            );
        });
    });
}
