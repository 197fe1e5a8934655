//! Time: `sleep` and timed parking that never end early, and the `Timer` delayed executor.

#[path = "../common/mod.rs"]
mod common;

mod sleep;
mod timer;
