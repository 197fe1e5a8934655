//! Per-task options through `Scheduler::task()`: names, stack sizes, and a clear error (not
//! a panic or an abort) when no stack can be had.

use std::time::Duration;

fn scheduler() -> fibra::Scheduler {
    let s = fibra::Scheduler::builder().threads(2).build().unwrap();
    s.start();
    s
}

#[test]
fn a_named_task_sees_its_name() {
    let s = scheduler();
    let h = s
        .task()
        .name("conn-42")
        .submit(
            || fibra::Fiber::current().map(|f| f.name().map(String::from)),
            None,
        )
        .unwrap();
    assert_eq!(h.join().unwrap(), Some(Some("conn-42".to_string())));
    let unnamed = s.submit(|| fibra::Fiber::current().unwrap().name().is_none(), None);
    assert!(unnamed.unwrap().join().unwrap());
}

#[test]
fn a_big_stack_allows_deep_recursion() {
    fn depth(n: u64) -> u64 {
        // A 1 KiB frame the optimiser cannot drop, and no tail call.
        let pad = std::hint::black_box([0u8; 1024]);
        if n == 0 {
            0
        } else {
            1 + depth(n - 1) + u64::from(std::hint::black_box(pad)[n as usize % 1024])
        }
    }
    let s = scheduler();
    // About 2 MiB of frames: far beyond the 256 KiB default, well inside 8 MiB.
    let h = s
        .task()
        .stack_size(8 << 20)
        .submit(|| depth(2000), Some(1))
        .unwrap();
    assert_eq!(h.join().unwrap(), 2000);
}

#[test]
fn no_stack_is_an_error_on_the_handle_and_the_scheduler_goes_on() {
    let s = scheduler();
    // 1 EiB is more address space than a 64-bit Linux process has.
    let h = s.task().stack_size(1 << 60).submit(|| 1, None).unwrap();
    let err = h.join().unwrap_err();
    assert!(err.is_no_stack(), "{err:?}");
    assert!(!err.is_panic() && !err.is_cancelled());
    assert!(err.to_string().contains("no fiber stack"), "{err}");
    let ok = s.submit(|| 2, None).unwrap();
    assert!(ok.wait_timeout(Duration::from_secs(30)));
    assert_eq!(ok.join().unwrap(), 2);
}
