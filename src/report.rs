//! Where fibra's own reports go (the watchdog, panics of fibers): stderr, or — with the
//! `tracing` feature, when the application has installed a subscriber — a `tracing` event.
//! And [`drop_catching`], for the places where a panic must be reported and go no further.

use std::panic::{catch_unwind, AssertUnwindSafe};

/// Reports `msg` as a warning of kind `kind` ("watchdog", "panic", …).
pub(crate) fn warn(kind: &'static str, msg: &str) {
    #[cfg(feature = "tracing")]
    if tracing::dispatcher::has_been_set() {
        tracing::warn!(target: "fibra", kind, "{msg}");
        return;
    }
    eprintln!("fibra: {kind}: {msg}");
}

/// Drops `value`; a panic in its destructor is reported by the panic hook like any panic
/// and goes no further. (The payload of that panic is leaked: its own destructor may panic.)
pub(crate) fn drop_catching<V>(value: V) {
    if let Err(payload) = catch_unwind(AssertUnwindSafe(move || drop(value))) {
        std::mem::forget(payload);
    }
}
