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
fn an_out_of_range_stack_size_is_refused_with_the_closure_and_the_scheduler_goes_on() {
    let s = scheduler();
    // 1 EiB is more address space than a 64-bit Linux process has: refused like the builder.
    match s.task().stack_size(1 << 60).submit(|| 1, None) {
        Err(fibra::SubmitError::InvalidStackSize(f, e)) => {
            assert_eq!(f(), 1, "the closure comes back");
            assert!(matches!(e, fibra::Error::StackTooLarge { .. }), "{e:?}");
        }
        other => panic!("expected InvalidStackSize, got {:?}", other.map(|_| ())),
    }
    match s.task().stack_size(1).submit(|| 1, None) {
        Err(e @ fibra::SubmitError::InvalidStackSize(..)) => {
            assert!(e.to_string().contains("below the minimum"), "{e}");
        }
        other => panic!("expected InvalidStackSize, got {:?}", other.map(|_| ())),
    }
    let ok = s.submit(|| 2, None).unwrap();
    assert!(ok.wait_timeout(Duration::from_secs(30)));
    assert_eq!(ok.join().unwrap(), 2);
}
