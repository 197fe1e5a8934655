//! Where fibra's own reports go (the watchdog, panics of fibers): stderr, or — with the
//! `tracing` feature, when the application has installed a subscriber — a `tracing` event.

/// Reports `msg` as a warning of kind `kind` ("watchdog", "panic", …).
pub(crate) fn warn(kind: &'static str, msg: &str) {
    #[cfg(feature = "tracing")]
    if tracing::dispatcher::has_been_set() {
        tracing::warn!(target: "fibra", kind, "{msg}");
        return;
    }
    eprintln!("fibra: {kind}: {msg}");
}
