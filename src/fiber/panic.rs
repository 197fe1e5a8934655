//! The panic hook: a panic inside a fiber is reported like std reports a thread panic, but
//! naming the fiber (`fiber 'conn-42' panicked at src/x.rs:1:2:`). Outside fibers the hook
//! installed before ours (std's default, or the user's) runs unchanged.

use super::current_meta;
use std::sync::Once;

static INSTALL: Once = Once::new();

/// Wraps the current panic hook once per process.
pub(crate) fn install_panic_hook() {
    INSTALL.call_once(|| {
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            let Some(meta) = current_meta() else {
                return previous(info);
            };
            let name = meta.name.as_deref().unwrap_or("<unnamed>");
            let msg = info.payload_as_str().unwrap_or("Box<dyn Any>");
            let location = info
                .location()
                .map(|l| format!("{}:{}:{}", l.file(), l.line(), l.column()))
                .unwrap_or_else(|| "<unknown>".to_string());
            let place = match meta.worker {
                Some(w) => format!("fiber {} on worker {w}", meta.id),
                None => format!("fiber {}", meta.id),
            };
            let backtrace = std::backtrace::Backtrace::capture();
            // eprint! (not io::stderr) so test harnesses capture it like std's own message.
            if backtrace.status() == std::backtrace::BacktraceStatus::Captured {
                eprint!(
                    "\nfiber '{name}' panicked at {location}:\n{msg}\nnote: {place}\nstack backtrace:\n{backtrace}\n"
                );
            } else {
                eprint!(
                    "\nfiber '{name}' panicked at {location}:\n{msg}\nnote: {place}; run with `RUST_BACKTRACE=1` environment variable to display a backtrace\n"
                );
            }
        }));
    });
}
