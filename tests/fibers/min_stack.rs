//! A fiber with the smallest stack fibra allows (`MIN_STACK_SIZE`) can panic with
//! `RUST_BACKTRACE=1` or `full`: the panic report, backtrace capture and symbolisation
//! included, fits on its stack, whether fibra prints the report (std's default hook in place)
//! or std's default hook does under an application's hook. Before, 16 KiB overflowed there and
//! aborted the process, so each case runs in a child process (one test per case and
//! `RUST_BACKTRACE` value) and the parent checks how it ended and what it printed.

use std::os::unix::process::ExitStatusExt;
use std::time::Duration;

use crate::common::in_child_with;
use fibra::{Fiber, FiberState, Scheduler, MIN_STACK_SIZE};

const MESSAGE: &str = "min_stack: a panic on the smallest stack";

/// A panic in a scheduled task whose stack is `MIN_STACK_SIZE`.
fn panic_in_a_task() {
    let sched = Scheduler::builder().threads(1).build().expect("build");
    sched.start();
    let h = sched
        .task()
        .name("small")
        .stack_size(MIN_STACK_SIZE)
        .submit(|| -> u32 { panic!("{MESSAGE}") }, None)
        .expect("submit");
    assert!(h.wait_timeout(Duration::from_secs(30)), "the task ended");
    assert!(h.join().expect_err("the task panicked").is_panic());
    sched.stop();
}

/// A panic in a standalone fiber whose stack is `MIN_STACK_SIZE`.
fn panic_in_a_standalone_fiber() {
    let mut fiber =
        Fiber::with_options(|| panic!("{MESSAGE}"), Some("small"), MIN_STACK_SIZE).expect("fiber");
    assert_eq!(fiber.resume(), FiberState::Panicked);
}

/// The usual wrapper of an application: do something, then let std's default hook print the
/// report; then a panic in a task and one in a standalone fiber, both on `MIN_STACK_SIZE`.
fn panic_under_a_wrapped_default_hook() {
    let std_default = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        eprintln!("child: application hook");
        std_default(info);
    }));
    panic_in_a_task();
    panic_in_a_standalone_fiber();
}

/// Runs `panics` in a child process with `RUST_BACKTRACE=backtrace` and checks the child
/// ended on its own and printed `reports` panic reports with a backtrace.
fn check(backtrace: &str, reports: usize, panics: fn()) {
    let run = in_child_with(&[("RUST_BACKTRACE", backtrace)], || {
        panics();
        eprintln!("child: survived");
    });
    let status = run.exit_status();
    let stderr = &run.stderr;
    let context = format!("RUST_BACKTRACE={backtrace}: status {status}, stderr:\n{stderr}");
    assert_eq!(status.signal(), None, "killed by a signal: {context}");
    assert!(status.success(), "{context}");
    assert!(stderr.contains("child: survived"), "{context}");
    assert_eq!(stderr.matches(MESSAGE).count(), reports, "{context}");
    assert_eq!(
        stderr.matches("stack backtrace:").count(),
        reports,
        "{context}"
    );
    assert!(
        stderr.contains("   0: ") && stderr.contains("corosensei"),
        "a symbolised backtrace of the fiber's stack: {context}"
    );
    assert!(!stderr.contains("overflow"), "{context}");
}

#[test]
fn a_task_on_the_minimum_stack_can_panic_with_rust_backtrace_1() {
    check("1", 1, panic_in_a_task);
}

#[test]
fn a_task_on_the_minimum_stack_can_panic_with_rust_backtrace_full() {
    check("full", 1, panic_in_a_task);
}

#[test]
fn a_standalone_fiber_on_the_minimum_stack_can_panic_with_rust_backtrace_1() {
    check("1", 1, panic_in_a_standalone_fiber);
}

#[test]
fn a_standalone_fiber_on_the_minimum_stack_can_panic_with_rust_backtrace_full() {
    check("full", 1, panic_in_a_standalone_fiber);
}

#[test]
fn std_default_hook_under_an_application_hook_fits_the_minimum_stack_with_rust_backtrace_1() {
    check("1", 2, panic_under_a_wrapped_default_hook);
}

#[test]
fn std_default_hook_under_an_application_hook_fits_the_minimum_stack_with_rust_backtrace_full() {
    check("full", 2, panic_under_a_wrapped_default_hook);
}
