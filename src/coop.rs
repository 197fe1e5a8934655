//! Cooperative budget: how fibra keeps a busy fiber from starving the others on its worker.
//!
//! Fibers are not preempted and a started fiber never changes worker, so a fiber that keeps
//! running holds its worker. Most busy loops are built from fibra's own operations, though:
//! a `try_recv` loop, a `send` loop on an unbounded channel, an `accept` loop that keeps
//! failing. Each of those operations may suspend, but when it can complete at once it does
//! not — and then a fiber woken on the same worker, or a task waiting there, never runs.
//!
//! So every such operation spends one unit of the running fiber's *budget*, and when the
//! budget is spent the next one first yields, exactly as [`Fiber::yield_now`] does. The
//! budget is [`BUDGET`] operations, refilled whenever the fiber is resumed (after any
//! suspension: a park, a yield, a wait). The same idea as tokio's `coop`.
//!
//! What spends: channel `send`/`recv` and their `try_` and timed forms (`mpsc`, `mpmc`,
//! `broadcast`, `oneshot`), `Mutex::lock`/`try_lock`, `RwLock`'s four acquisitions,
//! `Semaphore`'s acquisitions, `Barrier::wait` and `wait_timeout`, `WaitGroup::wait`,
//! `CancellationToken::cancelled`, `JoinHandle::join` and `wait_timeout`, `JoinSet`'s joins,
//! every socket operation (`accept`, `connect`,
//! `read`, `write`, `send`, `recv`, … — including those that fail at once, so an `accept`
//! loop under `EMFILE` yields), [`crate::io::wait_readable`]/[`wait_writable`](crate::io::wait_writable),
//! and a `sleep` whose deadline has passed. Calls from plain threads and from standalone
//! [`Fiber`]s spend nothing and never yield (a standalone fiber's yield would return to
//! whoever resumed it, which the caller does not expect).
//!
//! What remains unfair: a fiber that runs without calling into fibra (a pure computation,
//! a spin on an atomic, a blocking call into another library) holds its worker for as long
//! as it runs; fibers homed on that worker, including those woken meanwhile, wait for it.
//! Put [`Fiber::yield_now`] or [`consume_budget`] into such loops, or move the work to
//! [`unblock`](crate::unblock()).
//!
//! [`Fiber::yield_now`]: crate::Fiber::yield_now
//! [`Fiber`]: crate::Fiber

use crate::fiber::{current_meta, suspend, FiberMeta, Suspend};

// A fiber starts with it and its worker refills it at every resumption, so the constant is
// the fiber layer's; this module spends it.
pub use crate::fiber::BUDGET;

/// Spends one unit of the running fiber's budget, yielding first if it is spent. Called at
/// the start of every fibra operation that may suspend.
#[inline]
pub(crate) fn spend() {
    if let Some(meta) = current_meta() {
        let left = meta.budget.get();
        if left != 0 {
            meta.budget.set(left - 1);
        } else {
            spent(meta);
        }
    }
}

/// The budget ran out: yield (in a scheduled fiber, unless unconstrained), or refill.
#[cold]
#[inline(never)]
fn spent(meta: &FiberMeta) {
    if meta.worker.is_some() && !meta.unconstrained.get() {
        // The worker refills the budget when it resumes us.
        suspend(meta, Suspend::Yield);
    }
    meta.budget.set(BUDGET - 1);
}

/// Spends one unit of the running fiber's budget, as fibra's own operations do: when it is
/// spent, this yields (see [`Fiber::yield_now`](crate::Fiber::yield_now)). For a long
/// computation that calls nothing of fibra's, a cheap way to let other fibers run now and
/// then without yielding on every iteration. On a plain thread, in a standalone fiber and
/// inside [`unconstrained`] it never yields.
///
/// ```
/// let sched = fibra::Scheduler::builder().threads(1).build().unwrap();
/// sched.start();
/// let sum = sched.block_on(|| {
///     let mut sum = 0u64;
///     for i in 0..1_000_000u64 {
///         sum = sum.wrapping_add(i * i);
///         if i % 1024 == 0 {
///             fibra::coop::consume_budget();
///         }
///     }
///     sum
/// });
/// assert_eq!(sum, (0..1_000_000u64).map(|i| i * i).sum::<u64>());
/// ```
pub fn consume_budget() {
    spend();
}

/// Whether the running fiber's next budgeted operation would go ahead without yielding.
/// Always true outside a scheduled fiber and inside [`unconstrained`].
pub fn has_budget_remaining() -> bool {
    current_meta()
        .is_none_or(|m| m.worker.is_none() || m.unconstrained.get() || m.budget.get() != 0)
}

/// Runs `f` with the running fiber's budget turned off: fibra operations inside `f` never
/// yield because of it (they still suspend when they must wait). The escape hatch for code
/// that must not be interleaved with other fibers of its worker between two operations that
/// complete at once — at the price of the fairness the budget gives. Nests; restores the
/// previous setting when `f` returns or unwinds. Outside a fiber it just calls `f`.
///
/// ```
/// use fibra::sync::mpsc;
/// let sched = fibra::Scheduler::builder().threads(1).build().unwrap();
/// sched.start();
/// let sent = sched.block_on(|| {
///     let (tx, rx) = mpsc::channel();
///     // 10 000 sends complete at once; unconstrained, none of them yields.
///     fibra::coop::unconstrained(|| (0..10_000).for_each(|i| tx.send(i).unwrap()));
///     rx.try_iter().count()
/// });
/// assert_eq!(sent, 10_000);
/// ```
pub fn unconstrained<R>(f: impl FnOnce() -> R) -> R {
    crate::fiber::with_flag(|m| &m.unconstrained, f)
}
