//! The panic hook: fibra chains to the hook that was installed before it. An application's
//! own hook sees every panic, in fibers (where `Fiber::current()` names the fiber) and
//! outside, exactly once, and never a cancellation; with std's default hook in place, a fiber
//! panic keeps fibra's `fiber '<name>' panicked at` report. The panic hook is process-wide,
//! so each case runs in a child process.

use std::panic::{self, AssertUnwindSafe};
use std::sync::Mutex;
use std::time::Duration;

use fibra::{Fiber, FiberState, Scheduler};

use crate::common::in_child;

/// What the application's hook saw of one panic.
#[derive(Debug, Clone)]
struct Seen {
    message: String,
    file: String,
    /// `Fiber::current()` inside the hook: the fiber's id and name.
    fiber: Option<(u64, Option<String>)>,
}

static SEEN: Mutex<Vec<Seen>> = Mutex::new(Vec::new());

fn seen() -> Vec<Seen> {
    SEEN.lock().unwrap_or_else(|e| e.into_inner()).clone()
}

/// Installs the application's hook: it records each panic and prints nothing.
fn install_recording_hook() {
    panic::set_hook(Box::new(|info| {
        let seen = Seen {
            message: info.payload_as_str().unwrap_or("<non-string>").to_string(),
            file: info
                .location()
                .map(|l| l.file().to_string())
                .unwrap_or_default(),
            fiber: Fiber::current().map(|f| (f.id().as_u64(), f.name().map(String::from))),
        };
        SEEN.lock().unwrap_or_else(|e| e.into_inner()).push(seen);
    }));
}

#[test]
fn an_application_hook_sees_fiber_panics_once() {
    let child = in_child(|| {
        install_recording_hook();
        let sched = Scheduler::builder().threads(2).build().expect("build");
        sched.start();

        // A panic in a scheduled fiber.
        let h = sched
            .task()
            .name("reporter")
            .submit(|| -> u32 { panic!("boom in a scheduled fiber") }, None)
            .expect("submit");
        let id = h.id().as_u64();
        assert!(h.wait_timeout(Duration::from_secs(30)), "the task ended");
        assert!(h.join().expect_err("the task panicked").is_panic());
        let s = seen();
        assert_eq!(s.len(), 1, "the hook saw the fiber panic once: {s:?}");
        assert_eq!(s[0].message, "boom in a scheduled fiber");
        assert!(s[0].file.ends_with("panic_hook.rs"), "{s:?}");
        assert_eq!(
            s[0].fiber,
            Some((id, Some("reporter".to_string()))),
            "Fiber::current() in the hook names the fiber"
        );

        // A panic in a standalone fiber.
        let mut fiber = Fiber::with_options(
            || panic!("boom in a standalone fiber"),
            Some("alone"),
            fibra::DEFAULT_STACK_SIZE,
        )
        .expect("fiber");
        let fid = fiber.id().as_u64();
        assert_eq!(fiber.resume(), FiberState::Panicked);
        let s = seen();
        assert_eq!(s.len(), 2, "{s:?}");
        assert_eq!(s[1].message, "boom in a standalone fiber");
        assert_eq!(s[1].fiber, Some((fid, Some("alone".to_string()))));

        // A panic outside any fiber still reaches the hook, once.
        let caught = panic::catch_unwind(|| panic!("boom on a thread"));
        assert!(caught.is_err());
        let s = seen();
        assert_eq!(s.len(), 3, "{s:?}");
        assert_eq!(s[2].message, "boom on a thread");
        assert_eq!(s[2].fiber, None);

        // Cancellations reach no hook: a parked task cancelled by stop_timeout, and a suspended
        // standalone fiber unwound by its drop.
        let mut suspended = Fiber::new(Fiber::yield_now);
        assert_eq!(suspended.resume(), FiberState::Suspended);
        drop(suspended);
        let parked = sched
            .submit(|| fibra::park(std::mem::forget), None)
            .expect("submit");
        std::thread::sleep(Duration::from_millis(50));
        assert_eq!(sched.stop_timeout(Duration::from_millis(100)), 1);
        assert!(parked.join().expect_err("cancelled").is_cancelled());
        let s = seen();
        assert_eq!(s.len(), 3, "cancellations are not panics to report: {s:?}");
        eprintln!("child: the application hook saw {} panics", s.len());
    });
    child.assert_ok("the child failed");
    let stderr = &child.stderr;
    assert!(
        stderr.contains("child: the application hook saw 3 panics"),
        "stderr:\n{stderr}"
    );
    assert!(
        !stderr.contains("panicked at"),
        "the application's hook replaces fibra's report: stderr:\n{stderr}"
    );
}

#[test]
fn with_std_default_hook_fiber_panics_keep_fibra_report() {
    let child = in_child(|| {
        let sched = Scheduler::builder().threads(1).build().expect("build");
        sched.start();
        let h = sched
            .task()
            .name("plain")
            .submit(|| -> u32 { panic!("boom under the default hook") }, None)
            .expect("submit");
        assert!(h.wait_timeout(Duration::from_secs(30)), "the task ended");
        eprintln!("child: task id {}", h.id());
        assert!(h.join().expect_err("the task panicked").is_panic());
        let caught = panic::catch_unwind(AssertUnwindSafe(|| panic!("boom outside fibers")));
        assert!(caught.is_err());
        sched.stop();
    });
    child.assert_ok("the child failed");
    let stderr = &child.stderr;
    let id = stderr
        .lines()
        .find_map(|l| l.strip_prefix("child: task id "))
        .expect("the child printed the task id");
    assert!(
        stderr.contains("fiber 'plain' panicked at tests/fibers/panic_hook.rs:")
            && stderr.contains("boom under the default hook\nnote: fiber ")
            && stderr.contains(&format!("note: fiber {id} on worker 0")),
        "fibra's report of a fiber panic, stderr:\n{stderr}"
    );
    assert_eq!(
        stderr.matches("panicked at").count(),
        2,
        "one report per panic, stderr:\n{stderr}"
    );
    let reports: Vec<&str> = stderr
        .lines()
        .filter(|l| l.contains("panicked at"))
        .collect();
    assert!(
        reports[0].starts_with("fiber 'plain' panicked at")
            && reports[1].starts_with(
                "thread 'panic_hook::with_std_default_hook_fiber_panics_keep_fibra_report'",
            )
            && stderr.contains("boom outside fibers"),
        "std's own report outside fibers, stderr:\n{stderr}"
    );
}
