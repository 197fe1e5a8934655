//! Tasks and their handles: joining from fibers and threads, continuations, cancellation,
//! `scope`, `JoinSet`, the executors, and values whose `Drop` panics or waits.

#[path = "../common/mod.rs"]
mod common;

mod cancel;
mod drops_that_panic_or_wait;
mod executor_edge_cases;
mod executors;
mod join_set;
mod local;
mod scope;
mod thousands_cancelled;
mod toolkit_misuse;
mod unwinding_and_detached_results;
mod waiters_and_panicking_drops;
