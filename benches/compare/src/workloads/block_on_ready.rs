//! block_on_ready: the fixed cost of driving a future to completion from synchronous code.
//! One caller runs `block_on(async { black_box(1) })` 1 000 000 times in a loop; the future is
//! ready at its first poll, so nothing ever waits and the figure is pure overhead: ns per call
//! (the caller's own clock around the loop).
//!
//! fibra: `fibra::future::block_on` in one fiber of a scheduler with N workers that was given
//! a tokio runtime with N workers (`Builder::tokio_handle`), so each poll enters that runtime's
//! context, as tokio's own `block_on` does. tokio: `Runtime::block_on` on the main thread, a
//! plain thread outside the runtime (multi-thread runtime, N workers): tokio cannot block on a
//! future on its own workers (it panics, "Cannot start a runtime from within a runtime"), and
//! inside a task the equivalent is `.await`, which is not a blocking call. may, Go and std
//! have no counterpart (see `skip_reason`).

use std::hint::black_box;
use std::time::{Duration, Instant};

use super::{Cfg, Peer};
use crate::measure::{ns_per, repeat};
use crate::rt;

const CALLS: usize = 1_000_000;

/// Runs block_on_ready for `peer`: one figure (ns per call) per repetition, or why the peer has none.
pub fn run(peer: Peer, cfg: Cfg) -> Result<Vec<f64>, String> {
    match peer {
        Peer::Fibra => Ok(fibra(cfg)),
        Peer::Tokio => Ok(tokio(cfg)),
        Peer::May | Peer::Std | Peer::Go | Peer::FibraNet => Err("no block_on to compare".into()),
    }
}

/// `CALLS` calls of `block_on` on a ready future; the time they took.
fn calls(mut block_on: impl FnMut() -> i32) -> Duration {
    let start = Instant::now();
    for _ in 0..CALLS {
        black_box(block_on());
    }
    start.elapsed()
}

fn fibra(cfg: Cfg) -> Vec<f64> {
    let tokio = rt::tokio(cfg.threads);
    let sched = rt::fibra_with_tokio(cfg.threads, tokio.handle().clone());
    let v = repeat(cfg.warmup, cfg.reps, || {
        let fiber = sched
            .submit(
                || calls(|| fibra::future::block_on(async { black_box(1) })),
                None,
            )
            .expect("submit");
        ns_per(fiber.join().expect("calling fiber"), CALLS)
    });
    rt::fibra_stop(sched);
    rt::tokio_stop(tokio);
    v
}

fn tokio(cfg: Cfg) -> Vec<f64> {
    let rt = rt::tokio(cfg.threads);
    let v = repeat(cfg.warmup, cfg.reps, || {
        ns_per(calls(|| rt.block_on(async { black_box(1) })), CALLS)
    });
    rt::tokio_stop(rt);
    v
}
