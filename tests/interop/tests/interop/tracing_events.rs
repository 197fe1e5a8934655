//! The `tracing` feature: a span per fiber, and fibra's reports as events. Run with
//! `cargo test -p fibra-interop --features tracing`.
#![cfg(feature = "tracing")]

use std::io::Write;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use crate::common::{finish, with_deadline};
use fibra::Scheduler;

/// Everything the global subscriber writes, for the assertions.
#[derive(Clone, Default)]
struct Sink(Arc<Mutex<Vec<u8>>>);

impl Write for Sink {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// One global subscriber for the whole test binary (fibers log from worker threads, so a
/// thread-local default would not see them).
fn sink() -> &'static Sink {
    static SINK: OnceLock<Sink> = OnceLock::new();
    SINK.get_or_init(|| {
        let sink = Sink::default();
        let writer = sink.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_writer(move || writer.clone())
            .with_ansi(false)
            .with_max_level(tracing::Level::TRACE)
            .finish();
        tracing::subscriber::set_global_default(subscriber).unwrap();
        sink
    })
}

fn logged() -> String {
    String::from_utf8_lossy(&sink().0.lock().unwrap()).into_owned()
}

#[test]
fn events_in_a_fiber_carry_its_span_across_suspensions() {
    with_deadline(|| {
        sink();
        let s = Scheduler::builder().threads(2).build().unwrap();
        s.start();
        let h = s
            .task()
            .name("traced-one")
            .submit(
                || {
                    tracing::info!("before the sleep");
                    fibra::sleep(Duration::from_millis(5));
                    fibra::Fiber::yield_now();
                    tracing::info!("after the sleep");
                    fibra::Fiber::current().unwrap().id().as_u64()
                },
                None,
            )
            .unwrap();
        let id = finish(h);
        // An event outside fibers carries no fiber span.
        tracing::info!("outside any fiber");
        s.stop();
        let log = logged();
        for msg in ["before the sleep", "after the sleep"] {
            let line = log
                .lines()
                .find(|l| l.contains(msg))
                .unwrap_or_else(|| panic!("'{msg}' not logged:\n{log}"));
            assert!(
                line.contains(&format!("fiber{{id={id} name=\"traced-one\"}}")),
                "{line}"
            );
        }
        let outside = log
            .lines()
            .find(|l| l.contains("outside any fiber"))
            .unwrap();
        assert!(!outside.contains("fiber{"), "{outside}");
    });
}

#[test]
fn a_fibers_span_is_a_child_of_the_span_it_was_submitted_in() {
    with_deadline(|| {
        sink();
        let s = Scheduler::builder().threads(1).build().unwrap();
        s.start();
        let h = {
            let _request = tracing::info_span!("request", n = 42).entered();
            s.spawn(|| tracing::info!("handling it"))
        };
        finish(h);
        s.stop();
        let log = logged();
        let line = log.lines().find(|l| l.contains("handling it")).unwrap();
        assert!(line.contains("request{n=42}:fiber{"), "{line}");
    });
}

#[test]
fn watchdog_report_is_a_warning_event() {
    with_deadline(|| {
        sink();
        let s = Scheduler::builder()
            .threads(1)
            .watchdog(Duration::from_millis(20))
            .build()
            .unwrap();
        s.start();
        let hog = s
            .task()
            .name("traced-hog")
            .submit(
                || {
                    let end = Instant::now() + Duration::from_millis(200);
                    while Instant::now() < end {
                        std::hint::spin_loop();
                    }
                },
                None,
            )
            .unwrap();
        finish(hog);
        s.stop();
        let log = logged();
        let report = log
            .lines()
            .find(|l| l.contains("traced-hog") && l.contains("without suspending"))
            .unwrap_or_else(|| panic!("no watchdog event:\n{log}"));
        assert!(
            report.contains("WARN") && report.contains("kind=\"watchdog\""),
            "{report}"
        );
    });
}

/// The panic hook is process-wide and the test harness's output capture gets in its way:
/// the panic is checked in a child process.
#[test]
fn a_fiber_panic_is_an_error_event() {
    let child = crate::common::in_child(|| {
        let subscriber = tracing_subscriber::fmt()
            .with_writer(std::io::stderr)
            .with_ansi(false)
            .finish();
        tracing::subscriber::set_global_default(subscriber).unwrap();
        let s = Scheduler::builder().threads(1).build().unwrap();
        s.start();
        let panicker = s
            .task()
            .name("traced-panic")
            .submit(|| panic!("deliberate"), None)
            .unwrap();
        assert!(panicker.join().unwrap_err().is_panic());
        s.stop();
    });
    child.assert_ok("the child failed");
    let err = &child.stderr;
    let event = err
        .lines()
        .find(|l| l.contains("deliberate"))
        .unwrap_or_else(|| panic!("no panic event:\n{err}"));
    assert!(event.contains("ERROR"), "{err}");
    assert!(event.contains("fiber 'traced-panic' panicked"), "{err}");
    assert!(event.contains("kind=\"panic\""), "{err}");
    // Reported once, as the event only.
    assert!(!err.contains("panicked at"), "{err}");
}
