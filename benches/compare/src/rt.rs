//! Building and tearing down each peer's runtime with the same number of worker threads, plus the
//! one place where may's `unsafe` spawn is wrapped.

use std::sync::Arc;
use std::time::Duration;

/// A started fibra scheduler with `threads` workers, shared so that fibers can submit more work.
pub fn fibra(threads: usize) -> Arc<fibra::Scheduler> {
    start(fibra::Scheduler::builder().threads(threads))
}

/// Like [`fibra`], with `tokio` as the scheduler's tokio runtime: `fibra::future::block_on`
/// in its fibers enters that runtime's context around each poll, so tokio's channels, timers
/// and sockets work there. The runtime's own threads come on top of the `threads` workers.
pub fn fibra_with_tokio(threads: usize, tokio: tokio::runtime::Handle) -> Arc<fibra::Scheduler> {
    start(
        fibra::Scheduler::builder()
            .threads(threads)
            .tokio_handle(tokio),
    )
}

fn start(builder: fibra::Builder) -> Arc<fibra::Scheduler> {
    let sched = builder
        .name("fibra-bench")
        .build()
        .expect("build fibra scheduler");
    sched.start();
    Arc::new(sched)
}

/// Stops the scheduler (drains everything and joins its workers) before the last handle is
/// dropped, so that no fiber ever ends up running `Scheduler::drop` on a worker.
pub fn fibra_stop(sched: Arc<fibra::Scheduler>) {
    if std::env::var_os("FIBRA_COMPARE_METRICS").is_some() {
        // What the scheduler did over the warm-up and the repetitions: per worker, parks,
        // local and remote wakes, sleeps, steals (on stderr; stdout carries the figures).
        eprintln!("{}", sched.metrics());
    }
    sched.stop();
    drop(sched);
}

/// A tokio multi-thread runtime with `threads` workers and timers enabled.
pub fn tokio(threads: usize) -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(threads)
        .enable_all()
        .build()
        .expect("build tokio runtime")
}

/// Shuts a tokio runtime down, giving stragglers a bounded time to finish.
pub fn tokio_stop(rt: tokio::runtime::Runtime) {
    rt.shutdown_timeout(Duration::from_secs(5));
}

/// Configures may's global scheduler. Must run before the first coroutine is spawned; may's
/// runtime is process-global and is never torn down, which is one reason every workload runs in
/// a fresh child process.
pub fn may(threads: usize) {
    may::config().set_workers(threads);
}

/// Spawns a may coroutine.
///
/// Every closure handed to this function in this crate owns only `Send + 'static` data (atomics,
/// `Arc`s, may channels, std channels with room for every message, so a send never blocks), keeps
/// no reference to thread-local storage across a switch, and uses only a few hundred bytes of
/// stack.
pub fn may_go<F, T>(f: F) -> may::coroutine::JoinHandle<T>
where
    F: FnOnce() -> T + Send + 'static,
    T: Send + 'static,
{
    // SAFETY: may's spawn is unsafe because a coroutine may migrate between worker threads (so
    // cached thread-local addresses would dangle) and because its stack is small and fixed. The
    // closures spawned by this crate access no thread-local storage across a yield and stay far
    // below may's default 32 KiB stack (see the function docs), so neither hazard applies.
    unsafe { may::coroutine::spawn(f) }
}
