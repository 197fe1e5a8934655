//! The panic hook fibra installs (once, when the first scheduler or standalone fiber is
//! built), chained to the hook that was in place before it.
//!
//! - If that hook was std's default, a panic inside a fiber is reported like std reports a
//!   thread panic, but naming the fiber (`fiber 'conn-42' panicked at src/x.rs:1:2:`), and a
//!   panic outside fibers goes to std's default hook unchanged.
//! - If the application had installed its own hook (error reporting, tracing), every panic,
//!   in a fiber or not, goes to that hook, once. Inside it, [`Fiber::current`] names the
//!   panicking fiber.
//!
//! The cancellation of a fiber unwinds with `resume_unwind`, which runs no hook at all.
//!
//! A stack overflow is not a panic, but it is reported here too: the overflow handler
//! (`crate::stack::overflow`) asks [`describe_overflow`] whether a fault hit the running
//! fiber's guard page, and which fiber that is.
//!
//! [`Fiber::current`]: crate::Fiber::current

use super::{current_meta, FiberMeta};
use std::backtrace::{Backtrace, BacktraceStatus};
use std::panic::PanicHookInfo;
use std::sync::Once;

static INSTALL: Once = Once::new();

/// A panic hook, as `std::panic::take_hook` returns it.
type Hook = Box<dyn Fn(&PanicHookInfo<'_>) + Sync + Send + 'static>;

/// Wraps the current panic hook, once per process.
///
/// A thread that is already panicking cannot touch the hook (`take_hook` would panic), so a
/// call from one installs nothing and leaves the job to the next call.
pub(crate) fn install_panic_hook() {
    if std::thread::panicking() {
        return;
    }
    INSTALL.call_once(|| {
        let previous = std::panic::take_hook();
        let fibra_reports = is_std_default(&previous);
        std::panic::set_hook(Box::new(move |info| {
            let meta = current_meta();
            if let Some(meta) = meta {
                // The fiber's own unwind starts (see `fiber::unwinding`).
                super::note_unwind(meta);
            }
            match meta {
                Some(meta) if fibra_reports => report(meta, info),
                _ => previous(info),
            }
        }));
    });
}

/// Whether `hook`, just taken with `take_hook`, is std's default hook.
///
/// std has no API for this. But `take_hook` leaves the default hook installed, and a second
/// `take_hook` hands that default out as a box of std's private `default_hook` function: a
/// zero-sized value (so its data pointer is the dangling address every zero-sized box of that
/// alignment has) with the vtable of that function's type. If the first hook was the default,
/// it is the same kind of box, with the same data pointer and vtable.
///
/// - A false positive would need an application hook with that very vtable: a value of that
///   private function type, which only std can make (an application that re-installed the
///   hook `take_hook` gave it has std's default in place, so that is no false positive), or
///   a vtable the linker folded with it because every entry is identical code, that is, a
///   hook that behaves exactly like the default. Either way fibra's fiber report replaces
///   the same behaviour.
/// - A false negative (rustc emitting the vtable twice) is harmless: fiber panics would then
///   go to std's default hook, reported as `thread '<worker>' panicked at` instead of
///   `fiber '<name>' panicked at`.
fn is_std_default(hook: &Hook) -> bool {
    // The slot keeps std's default after this `take_hook` too, until the caller's `set_hook`.
    let default = std::panic::take_hook();
    // `ptr::eq` on wide pointers compares the data pointers and the vtables.
    std::ptr::eq::<dyn Fn(&PanicHookInfo<'_>) + Sync + Send>(&**hook, &*default)
}

/// Reports a panic in the fiber `meta` the way std's default hook reports a thread panic.
fn report(meta: &FiberMeta, info: &PanicHookInfo<'_>) {
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
    #[cfg(feature = "tracing")]
    if tracing::dispatcher::has_been_set() {
        tracing::error!(
            target: "fibra",
            kind = "panic",
            fiber.id = meta.id.as_u64(),
            fiber.name = name,
            worker = meta.worker,
            location,
            "fiber '{name}' panicked: {msg}"
        );
        return;
    }
    let backtrace = Backtrace::capture();
    // eprint! (not io::stderr) so test harnesses capture it like std's own message.
    if backtrace.status() == BacktraceStatus::Captured {
        eprint!(
            "\nfiber '{name}' panicked at {location}:\n{msg}\nnote: {place}\nstack backtrace:\n{backtrace}\n"
        );
    } else {
        eprint!(
            "\nfiber '{name}' panicked at {location}:\n{msg}\nnote: {place}; run with `RUST_BACKTRACE=1` environment variable to display a backtrace\n"
        );
    }
}

/// Installs the stack overflow handler, once per process, naming fibers with
/// [`describe_overflow`].
pub(crate) fn install_overflow_handler() {
    crate::stack::overflow::install_handler(describe_overflow);
}

/// Whether `addr` lies in the guard page under the running fiber's stack; if it does, writes
/// which fiber overflowed to `out`. Runs in the overflow signal handler: reads the running
/// fiber's meta (a thread-local pointer) and formats into `out`, allocating nothing.
fn describe_overflow(addr: usize, out: &mut dyn std::fmt::Write) -> bool {
    let Some(meta) = current_meta() else {
        return false;
    };
    let (lo, hi) = meta.guard;
    if addr < lo || addr >= hi {
        return false;
    }
    let name = meta.name.as_deref().unwrap_or("<unnamed>");
    let _ = write!(out, "\nfiber '{name}' ({}) ", meta.id);
    if let Some(w) = meta.worker {
        let _ = write!(out, "on worker {w} ");
    }
    let _ = write!(out, "overflowed its {} KiB stack", meta.stack_size / 1024);
    true
}
