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

/// A valid stack size that cannot be mapped (the address space is capped with `RLIMIT_AS`,
/// which is process-wide: so in a child process) is an error on the task's handle, its
/// continuations still run, and the scheduler goes on.
#[test]
fn no_stack_is_an_error_on_the_handle_and_the_scheduler_goes_on() {
    crate::common::in_child(|| {
        let s = scheduler();
        // Warm up: the default stacks this test needs are carved before the cap.
        let warm: Vec<_> = (0..4).map(|_| s.spawn(|| 1)).collect();
        for h in warm {
            h.join().unwrap();
        }
        // Room for 256 MiB more address space: enough for default stacks, not for a 1 GiB one.
        let cap = 256 << 20;
        let used = std::fs::read_to_string("/proc/self/statm")
            .ok()
            .and_then(|m| m.split_whitespace().next()?.parse::<usize>().ok())
            .expect("statm")
            * 4096;
        let limit = libc::rlimit {
            rlim_cur: (used + cap) as libc::rlim_t,
            rlim_max: libc::RLIM_INFINITY,
        };
        // SAFETY: setrlimit with a valid pointer to a live struct.
        assert_eq!(unsafe { libc::setrlimit(libc::RLIMIT_AS, &limit) }, 0);
        let (tx, rx) = std::sync::mpsc::channel();
        let h = s
            .task()
            .stack_size(1 << 30)
            .submit(|| 1, None)
            .expect("a valid size is accepted");
        h.catching(move |e| tx.send(e.is_no_stack()).unwrap());
        assert!(h.wait_timeout(Duration::from_secs(30)));
        let err = h.join().unwrap_err();
        assert!(err.is_no_stack(), "{err:?}");
        assert!(!err.is_panic() && !err.is_cancelled());
        assert!(err.to_string().contains("no fiber stack"), "{err}");
        assert_eq!(rx.recv_timeout(Duration::from_secs(30)), Ok(true));
        let ok = s.submit(|| 2, None).unwrap();
        assert!(ok.wait_timeout(Duration::from_secs(30)));
        assert_eq!(ok.join().unwrap(), 2);
    })
    .assert_ok("a task without a stack failed the child process");
}
