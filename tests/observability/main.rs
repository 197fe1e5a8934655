//! Seeing inside a running scheduler: `metrics()`, `dump()` and the watchdog, also while
//! it shuts down.

#[path = "../common/mod.rs"]
mod common;

mod during_shutdown;
mod exact;
mod metrics_dump_watchdog;
