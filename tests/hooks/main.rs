//! The `hook` feature: blocking C library calls made by std or any crate in a fiber park
//! only that fiber, with libc's semantics (errors, `errno`, blocking modes) everywhere else.
//! Without the feature only the linking check runs: `cargo test --features hook --test hooks`
//! runs them all.

#[path = "../common/mod.rs"]
mod common;

mod blocking_code;
mod calls;
#[cfg(feature = "hook")]
mod differential;
mod fd_modes;
mod fuzz_corpus;
mod fuzz_findings;
mod interference;
mod linking;
mod std_calls;
mod transfers;
