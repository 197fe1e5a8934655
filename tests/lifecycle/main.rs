//! The scheduler's lifecycle and the calls around it: `start`, `stop`, `stop_timeout` and
//! drop racing each other and everything else; every call from every context; values at
//! their extremes; calls made where they cannot do what they do elsewhere.

#[path = "../common/mod.rs"]
mod common;

mod calls_from_every_context;
mod extreme_values;
mod hostile_calls;
mod misplaced_calls;
mod start_stop_races;
