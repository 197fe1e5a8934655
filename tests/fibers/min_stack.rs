//! A fiber with the smallest stack fibra allows (`MIN_STACK_SIZE`) can panic with
//! `RUST_BACKTRACE=1` or `full`: the panic report, backtrace capture and symbolisation
//! included, fits on its stack, whether fibra prints the report (std's default hook in place)
//! or std's default hook does under an application's hook. Before, 16 KiB overflowed there and
//! aborted the process, so each case runs in a child process and the parent checks how it
//! ended and what it printed.

/// Names the helper a child process is asked to run.
const CHILD_ENV: &str = "FIBRA_TEST_CHILD";

fn is_child(helper: &str) -> bool {
    crate::common::is_child(CHILD_ENV, helper)
}

fn run_child(helper: &str, envs: &[(&str, &str)]) -> (std::process::ExitStatus, String) {
    crate::common::run_child_with(CHILD_ENV, helper, envs)
}

use std::os::unix::process::ExitStatusExt;
use std::time::Duration;

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

#[test]
#[ignore = "child process of a_task_on_the_minimum_stack_can_panic_with_a_backtrace"]
fn child_task_panics() {
    if is_child("child_task_panics") {
        panic_in_a_task();
        eprintln!("child: survived");
    }
}

#[test]
#[ignore = "child process of a_standalone_fiber_on_the_minimum_stack_can_panic_with_a_backtrace"]
fn child_standalone_fiber_panics() {
    if is_child("child_standalone_fiber_panics") {
        panic_in_a_standalone_fiber();
        eprintln!("child: survived");
    }
}

#[test]
#[ignore = "child process of std_default_hook_under_an_application_hook_fits_the_minimum_stack"]
fn child_wrapped_default_hook() {
    if is_child("child_wrapped_default_hook") {
        // The usual wrapper: do something, then let std's default hook print the report.
        let std_default = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            eprintln!("child: application hook");
            std_default(info);
        }));
        panic_in_a_task();
        panic_in_a_standalone_fiber();
        eprintln!("child: survived");
    }
}

/// Runs `helper` with `RUST_BACKTRACE=1` and `=full` and checks each child ended on its own
/// and printed `reports` panic reports with a backtrace.
fn check(helper: &str, reports: usize) {
    for backtrace in ["1", "full"] {
        let (status, stderr) = run_child(helper, &[("RUST_BACKTRACE", backtrace)]);
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
}

#[test]
fn a_task_on_the_minimum_stack_can_panic_with_a_backtrace() {
    check("child_task_panics", 1);
}

#[test]
fn a_standalone_fiber_on_the_minimum_stack_can_panic_with_a_backtrace() {
    check("child_standalone_fiber_panics", 1);
}

#[test]
fn std_default_hook_under_an_application_hook_fits_the_minimum_stack() {
    check("child_wrapped_default_hook", 2);
}
