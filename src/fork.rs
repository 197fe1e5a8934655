//! What a `fork` does to fibra's process-wide state.
//!
//! The child of a `fork` has one thread, the one that forked, and a copy of the parent's
//! memory in which every lock another thread held at that moment stays held for ever, and
//! whatever that thread was changing under it stays half-changed. A program that forks
//! while its schedulers run and then builds a fresh scheduler in the child (or calls
//! `unblock`, or opens a socket there) goes through fibra's process-wide structures: the
//! task-cell depot and slabs, the stack slabs, the reactor, the blocking pool. So, as the C
//! library does for `malloc`, one handler registered with `pthread_atfork` takes all their
//! locks before the fork (`prepare`) and releases them on both sides after it. The child
//! then finds them free and consistent, and each subsystem drops what belongs to the
//! parent's threads (the reactor's waiters, the pool's sleepers and queue).
//!
//! This module knows none of those subsystems' code: each one registers its handlers
//! ([`register`]) before its first use of its structures, into a [`Slot`] of its own, and the
//! order below is the slots' order, written here once, whatever order they register in.
//!
//! `prepare` takes the locks in one fixed order, and no code path takes two of them in
//! another: the table of handlers (first, so that concurrent forks take turns, and a
//! registration waits for a fork in progress; a registration takes no other lock under it);
//! then the reactor's creation lock (the first of the subsystems'), its
//! registrations before each registration's waiters before its standby list (a registration
//! that replaces a stale record wakes that record's waiters under the registrations' lock,
//! and a woken continuation allocates a task cell); the blocking pool's idle list; the stack
//! slabs before the pidfd they advise through; last the task-cell depot and then its slabs,
//! which are leaves (the depot is released before the slabs are taken). Every other lock of
//! fibra's belongs to one scheduler, which the child does not run: if the forking thread is
//! a worker's, its fiber goes on in the child as on a plain thread and the child exits when
//! it ends (`sched::worker::forked_in_child`).
//!
//! What stays out of reach: a `OnceLock` or `Once` that a parent thread was initialising at
//! the fork, and the bucket locks of `parking_lot`'s global table of parked threads, which a
//! parent thread may hold for the few instructions of a park or unpark. A child that needs
//! either waits for ever; both windows are short and rare. A child should still `exec` soon,
//! as POSIX advises for any multithreaded parent.

use crate::sys::spin::SpinLock;
use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};

/// The subsystems with fork handlers, in the order `prepare` takes their locks (the order
/// above); the parent and the child release them in the reverse order. The order is this
/// enum's, whatever order the subsystems register in.
#[derive(Clone, Copy)]
pub(crate) enum Slot {
    /// The reactor (`io::reactor`): its creation lock, registrations, waiters, standby list.
    Reactor,
    /// The blocking pool (`unblock`): its idle list.
    Pool,
    /// The stack slabs (`stack::slab`) and the pidfd they advise through.
    Stacks,
    /// The task-cell depot and its slabs (`sched::cell`).
    Cells,
    /// The workers (`sched::worker`): no lock; in the child, a worker's thread copied there
    /// stops being one (`forked_in_child`), before the others release.
    Workers,
}

const SLOTS: usize = Slot::Workers as usize + 1;

/// One subsystem's handlers.
pub(crate) struct Handlers {
    /// Takes the subsystem's locks, in its own fixed order, before the fork.
    pub(crate) prepare: fn(),
    /// Releases them after the fork: in the parent (`false`) or in the child (`true`), where
    /// the subsystem also drops what belongs to the parent's threads.
    pub(crate) release: fn(bool),
}

/// The registered handlers, by slot. Locked by `prepare` first of all and released last,
/// after the other handlers: a registration waits for a fork in progress, so the handlers a
/// fork releases are exactly those it took, and a subsystem registered once its
/// registration returns is held by every later fork.
static TABLE: SpinLock<[Option<&'static Handlers>; SLOTS]> = SpinLock::new([None; SLOTS]);

/// A bit per slot in `TABLE`, set once: `register`'s fast path, read without the lock.
static REGISTERED: AtomicU8 = AtomicU8::new(0);

/// Registers `handlers` for `slot`, once per process, before the subsystem's first use of
/// its process-wide structures. Called outside all their locks: `fork` holds the C
/// library's handler list while the handlers run, so registering under one of the locks
/// could deadlock with a `fork` whose `prepare` waits for that lock.
#[inline]
pub(crate) fn register(slot: Slot, handlers: &'static Handlers) {
    if REGISTERED.load(Ordering::Acquire) & (1 << slot as u8) == 0 {
        register_slow(slot, handlers);
    }
}

#[cold]
fn register_slow(slot: Slot, handlers: &'static Handlers) {
    install();
    let mut table = TABLE.lock();
    table[slot as usize] = Some(handlers);
    REGISTERED.fetch_or(1 << slot as u8, Ordering::Release);
}

/// Registers the `pthread_atfork` handlers, once per process.
///
/// A flag, not a `Once`: a fork while another thread registers would leave a `Once` in the
/// middle of its initialisation in the child, where the next call waits for ever. A caller
/// that loses the race goes on before the winner's call returns, as it would have a moment
/// earlier.
fn install() {
    static INSTALLED: AtomicBool = AtomicBool::new(false);
    if !INSTALLED.load(Ordering::Acquire) && !INSTALLED.swap(true, Ordering::AcqRel) {
        // SAFETY: registers three plain functions without preconditions; they run around
        // each later `fork`, on the forking thread.
        unsafe { libc::pthread_atfork(Some(prepare), Some(parent), Some(child)) };
    }
}

extern "C" fn prepare() {
    TABLE.fork_hold();
    // SAFETY: held just above, on this thread, until `release`; nothing else borrows it.
    let table = unsafe { TABLE.fork_held() };
    for handlers in table.iter().flatten() {
        (handlers.prepare)();
    }
}

extern "C" fn parent() {
    release(false);
}

extern "C" fn child() {
    release(true);
}

/// Releases, in reverse order, what `prepare` took; the table last.
fn release(in_child: bool) {
    // SAFETY: `prepare` took the table's lock on this thread (the forking one: in the child
    // the only one) and nothing released it since; nothing else borrows it.
    let table = unsafe { TABLE.fork_held() };
    for handlers in table.iter().rev().flatten() {
        (handlers.release)(in_child);
    }
    // SAFETY: as above.
    unsafe { TABLE.fork_release() };
}
