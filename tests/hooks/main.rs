//! The `hook` feature: blocking C library calls made by std or any crate in a fiber park
//! only that fiber, with libc's semantics (errors, `errno`, blocking modes) everywhere else.
//! Run with `cargo test --features hook`; without it only the linking check runs.

#[path = "../common/mod.rs"]
mod common;

mod blocking_code;
mod calls;
mod fd_modes;
mod linking;
mod misuse;
mod std_calls;
