//! Helpers shared by the integration tests: generous deadlines so that a hung
//! scheduler fails a test instead of hanging the whole run.
#![allow(dead_code)]

use std::any::Any;
use std::panic;
use std::sync::mpsc::{self, RecvTimeoutError};
use std::sync::Mutex;
use std::thread;
use std::time::{Duration, Instant};

use fibra::JoinHandle;

/// Long enough that a loaded 2-core machine never reaches it; short enough
/// that a hang is reported as a failure.
pub const LIMIT: Duration = Duration::from_secs(30);

/// Runs `body` on a fresh thread and fails the test if it has not returned
/// within 60 s. A panic in `body` is propagated as the test's own panic.
pub fn with_deadline(body: impl FnOnce() + Send + 'static) {
    let (done_tx, done_rx) = mpsc::channel::<()>();
    let runner = thread::spawn(move || {
        body();
        let _ = done_tx.send(());
    });
    match done_rx.recv_timeout(2 * LIMIT) {
        Ok(()) => runner.join().expect("test body thread"),
        Err(RecvTimeoutError::Disconnected) => {
            if let Err(payload) = runner.join() {
                panic::resume_unwind(payload);
            }
        }
        Err(RecvTimeoutError::Timeout) => panic!("test body did not finish within {:?}", 2 * LIMIT),
    }
}

/// Waits (bounded by [`LIMIT`]) for a task and returns its value.
pub fn finish<T>(handle: JoinHandle<T>) -> T {
    assert!(
        handle.wait_timeout(LIMIT),
        "task {} did not finish within {LIMIT:?}",
        handle.id()
    );
    assert!(handle.is_finished());
    handle.join().expect("task failed")
}

/// Polls `cond` every millisecond until it holds; panics after [`LIMIT`].
pub fn wait_until(what: &str, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + LIMIT;
    while !cond() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        thread::sleep(Duration::from_millis(1));
    }
}

/// The message of a panic payload made by `panic!("literal")` or `panic!("{}", x)`.
pub fn panic_message(payload: &(dyn Any + Send)) -> Option<String> {
    payload
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| payload.downcast_ref::<String>().cloned())
}

/// A slot where a test keeps a value handed out by a fiber (an `Unparker`).
pub type Slot<T> = std::sync::Arc<Mutex<Option<T>>>;
