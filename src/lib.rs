//! # fibra — an N:M scheduler of stackful fibers
//!
//! N OS threads run M fibers, each on its own guarded stack ([corosensei] coroutines). Code in
//! a fiber is plain blocking-style Rust — `join` a task, [`sleep`], wait on a lock — and only
//! the fiber waits, never the thread.
//!
//! ```
//! use std::sync::Arc;
//! use std::time::Duration;
//!
//! let sched = Arc::new(fibra::Scheduler::builder().threads(2).build()?);
//! sched.start();
//!
//! // Pinned and unpinned tasks; a fiber can submit more work and join it.
//! let s = sched.clone();
//! let total = sched.block_on(move || {
//!     let parts: Vec<_> = (0..10u64)
//!         .map(|i| s.submit(move || { fibra::sleep(Duration::from_millis(1)); i * i }, None).unwrap())
//!         .collect();
//!     parts.into_iter().map(|h| h.join().unwrap()).sum::<u64>()
//! });
//! assert_eq!(total, 285);
//!
//! let on_one = sched.submit(fibra::current_worker, Some(1)).unwrap();
//! assert_eq!(on_one.join().unwrap(), Some(1));
//! sched.stop();
//! # Ok::<(), fibra::Error>(())
//! ```
//!
//! ## Guarantees
//! - **A started fiber never changes thread.** Unstarted tasks balance across workers; once
//!   a fiber has run, it resumes only on the worker that started it, so `thread_local!`s and
//!   `Rc`s held across a suspension are sound.
//! - **Publish after suspend.** A waiting fiber becomes visible to its waker only after it has
//!   switched out ([`park`]); a wake never finds it still running.
//! - **No busy waiting.** Idle workers spin briefly, then sleep on a futex until work or the
//!   next timer deadline arrives.
//! - **Nothing lost.** A refused closure comes back in [`SubmitError`]; a panic reaches the
//!   task's [`JoinHandle`] and the panic hook the application installed before fibra's
//!   ([`Fiber::current`] names the fiber there); a worker never dies; a stack overflow names
//!   the fiber and aborts.
//!
//! [corosensei]: https://docs.rs/corosensei

#![deny(missing_docs)]
#![warn(clippy::undocumented_unsafe_blocks)]

pub mod coop;
pub mod dump;
mod error;
pub mod exec;
mod fiber;
mod fork;
pub mod fs;
pub mod future;
#[cfg(feature = "hook")]
pub mod hook;
pub mod io;
mod join;
mod join_set;
mod metrics;
pub mod net;
#[macro_use]
mod park;
mod report;
mod sched;
mod scope;
mod stack;
pub mod sync;
mod sys;
pub mod time;
pub mod unblock;

/// What a program that builds a scheduler must have linked from the modules above the core,
/// which the core does not name (its imports go one way: docs/design.md, "Layers"):
/// `Builder::build` calls this. Only the hooks need it (see `hook::link`).
#[inline(always)]
pub(crate) fn link_above_core() {
    #[cfg(feature = "hook")]
    hook::link();
}

/// Internals exposed only so `benches/` can measure them. Not part of the API: no stability
/// promise, hidden from the documentation.
#[doc(hidden)]
pub mod __bench {
    pub use crate::sched::timers::{TimerId, TimerWheel};
}

pub use dump::Dump;
pub use error::{Error, SubmitError, WhenReadableError};
pub use fiber::{Fiber, FiberId, FiberInfo, FiberLocal, FiberState};
pub use join::{JoinError, JoinHandle};
pub use join_set::JoinSet;
pub use metrics::{Metrics, WorkerMetrics};
pub use park::{park, park_timeout, ParkResult, Unparker};
pub use sched::{
    current_worker, spawn, spawn_local, spawn_local_fiber, Builder, LocalJoinHandle, Scheduler,
    TaskBuilder, CANCEL_GRACE, DEFAULT_WATCHDOG, DROP_PATIENCE, MAX_THREADS,
};
pub use scope::{scope, Scope, ScopedJoinHandle};
pub use stack::{
    guard_kind, stack_stats, StackStats, DEFAULT_STACK_CACHE, DEFAULT_STACK_SIZE, MIN_STACK_SIZE,
};
pub use time::{sleep, sleep_until};
pub use unblock::unblock;
