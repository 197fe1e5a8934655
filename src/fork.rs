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
//! `prepare` takes the locks in one fixed order, and no code path takes two of them in
//! another: the reactor's creation lock (first, so that concurrent forks take turns), its
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

use std::sync::atomic::{AtomicBool, Ordering};

/// Registers the handlers, once per process. Called before the first use of each
/// process-wide structure, outside all their locks: `fork` holds the C library's handler
/// list while the handlers run, so registering under one of the locks could deadlock with
/// a `fork` whose `prepare` waits for that lock.
///
/// A flag, not a `Once`: a fork while another thread registers would leave a `Once` in the
/// middle of its initialisation in the child, where the next call waits for ever. A caller
/// that loses the race goes on before the winner's call returns, as it would have a moment
/// earlier.
pub(crate) fn register() {
    static REGISTERED: AtomicBool = AtomicBool::new(false);
    if !REGISTERED.load(Ordering::Acquire) && !REGISTERED.swap(true, Ordering::AcqRel) {
        // SAFETY: registers three plain functions without preconditions; they run around
        // each later `fork`, on the forking thread.
        unsafe { libc::pthread_atfork(Some(prepare), Some(parent), Some(child)) };
    }
}

extern "C" fn prepare() {
    crate::io::reactor::fork_hold();
    crate::unblock::fork_hold();
    crate::stack::fork_hold();
    crate::sched::cell::fork_hold();
}

extern "C" fn parent() {
    crate::sched::cell::fork_release();
    crate::stack::fork_release();
    crate::unblock::fork_release(false);
    crate::io::reactor::fork_release(false);
}

extern "C" fn child() {
    crate::sched::worker::forked_in_child();
    crate::sched::cell::fork_release();
    crate::stack::fork_release();
    crate::unblock::fork_release(true);
    crate::io::reactor::fork_release(true);
}
