//! The panic hook: quiet for the soak's own panics by design, loud (and failing the run) for
//! any other.
//!
//! It is installed before the first scheduler is built, so fibra's hook, installed then,
//! chains to it: every panic reaches it once, and `fibra::Fiber::current()` names the
//! panicking fiber (fibra's cancellation unwinds without running any hook).

use crate::acct::{fail, Designed, ACCT};

/// Installs the hook; the hook that was in place before gets every panic not by design.
pub fn install() {
    let previous = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        if info.payload().is::<Designed>() {
            ACCT.panics_hooked.inc();
            return;
        }
        ACCT.panics_unexpected.inc();
        let fiber = fibra::Fiber::current()
            .map(|f| format!("fiber #{} '{}'", f.id().as_u64(), f.name().unwrap_or("")))
            .unwrap_or_else(|| "no fiber".into());
        let thread = std::thread::current();
        fail(format!(
            "an unexpected panic on thread '{}' ({fiber}): {info}",
            thread.name().unwrap_or("<unnamed>")
        ));
        previous(info);
    }));
}
