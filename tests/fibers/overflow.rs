//! Stack overflow is reported, not silent memory corruption: a fiber that runs
//! off its stack aborts the process with a message naming the fiber, its
//! worker and its stack size, and an ordinary thread that overflows still gets
//! std's own message. Each overflow happens in a child process
//! (`crate::common::in_child`); the parent checks how it ended and its stderr.

use std::hint::black_box;
use std::thread;

use crate::common::{in_child, ChildRun, LIMIT};
use fibra::Scheduler;

/// Recurses without bound, 4 KiB of live locals per frame.
fn recurse(depth: u64) -> u64 {
    let frame = black_box([depth as u8; 4096]);
    if black_box(depth) == u64::MAX {
        return 0;
    }
    recurse(depth + 1).wrapping_add(u64::from(frame[(depth % 4096) as usize]))
}

fn overflow_a_fiber(stack_size: Option<usize>, threads: usize, worker: usize) {
    let mut builder = Scheduler::builder().threads(threads);
    if let Some(bytes) = stack_size {
        builder = builder.stack_size(bytes);
    }
    let sched = builder.build().expect("build");
    sched.start();
    let handle = sched.submit(|| recurse(0), Some(worker)).expect("submit");
    // Only reached if the overflow did not abort the process.
    let outcome = handle.wait_timeout(LIMIT);
    eprintln!("child survived the overflow: finished = {outcome}");
}

/// The stderr of a child that ended by SIGABRT; fails the test if it ended otherwise (also
/// used by the overflow tests of `stack_limits` and `stacks_at_scale`).
pub(crate) fn aborted(run: &ChildRun) -> &str {
    let status = run.exit_status();
    assert_eq!(
        run.signal(),
        Some(libc::SIGABRT),
        "status {status}, stderr:\n{}",
        run.stderr
    );
    &run.stderr
}

fn recurse_a_little(depth: u64) -> u64 {
    if depth == 0 {
        0
    } else {
        1 + recurse_a_little(black_box(depth - 1))
    }
}

#[test]
fn fiber_overflow_aborts_naming_the_fiber() {
    let run = in_child(|| overflow_a_fiber(None, 1, 0));
    let stderr = aborted(&run);
    assert!(stderr.contains("fiber"), "stderr:\n{stderr}");
    assert!(stderr.contains("overflowed its"), "stderr:\n{stderr}");
    assert!(
        stderr.contains("fiber '<unnamed>' (#"),
        "an unnamed task is called '<unnamed>', stderr:\n{stderr}"
    );
    assert!(
        stderr.contains(") on worker 0 overflowed its 256 KiB stack"),
        "stderr:\n{stderr}"
    );
}

#[test]
fn fiber_overflow_message_gives_worker_and_stack_size() {
    let run = in_child(|| overflow_a_fiber(Some(512 * 1024), 2, 1));
    let stderr = aborted(&run);
    assert!(
        stderr.contains("on worker 1 overflowed its 512 KiB stack"),
        "stderr:\n{stderr}"
    );
}

#[test]
fn thread_overflow_still_gets_std_message() {
    let run = in_child(|| {
        // Run a fiber first so that fibra's overflow handling is installed.
        let sched = Scheduler::builder().threads(1).build().expect("build");
        assert_eq!(sched.block_on(|| recurse_a_little(8)), 8);
        let plain = thread::Builder::new()
            .name("plain-overflow".into())
            .spawn(|| recurse(0))
            .expect("spawn");
        let outcome = plain.join();
        eprintln!("child survived the overflow: {}", outcome.is_ok());
    });
    let stderr = aborted(&run);
    assert!(
        // std names the thread and, since Rust 1.89, its numeric id:
        // "thread 'plain-overflow' (1234) has overflowed its stack".
        stderr.contains("thread 'plain-overflow'") && stderr.contains("has overflowed its stack"),
        "stderr:\n{stderr}"
    );
    assert!(
        !stderr.contains("fiber '"),
        "a thread's overflow is not blamed on a fiber, stderr:\n{stderr}"
    );
}
