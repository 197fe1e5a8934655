//! Property tests of `fibra::sync`'s primitives against sequential models of their documented
//! semantics, and of their guarantees when fibers and threads use them at once.
//!
//! - **Sequential.** Random sequences of operations — the `try_` forms, the waiting forms
//!   where the model says they return at once (elsewhere their zero-timeout or `try_` form),
//!   guards and permits held and dropped, poisoning, the counts — run on a plain thread and
//!   again in a fiber, each result compared with the model's: `Semaphore` against an integer
//!   of permits, `Mutex` and `RwLock` against the guards held, the data and the poison flag
//!   (with `Condvar`'s waits that time out at once), `WaitGroup` against its handles,
//!   `OnceLock` against an `Option`, `Pool` against its idle list, checked-out connections
//!   and connection count (connections count themselves, so one leaked or dropped twice
//!   fails the property).
//! - **Concurrent.** Fibers of a two-worker scheduler and plain threads, with random yields
//!   and zero sleeps: increments under a `Mutex` or an `RwLock` all land and nobody is ever
//!   inside with a writer; a `Semaphore`'s or a `Pool`'s holders never exceed its permits
//!   (a high-water mark); a queue built on `Condvar`s loses and duplicates nothing; a
//!   `Barrier` releases each round once all arrived, with one leader; `WaitGroup::wait`
//!   returns after every other handle is gone; `OnceLock` runs one initialiser.
//!
//! Case counts are explicit and small enough for a loaded two-core machine; failures are
//! not persisted to files (see `tests/common/props.rs`).

use std::collections::BTreeSet;
use std::panic::{catch_unwind, resume_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicIsize, AtomicU32, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex as StdMutex, TryLockError};
use std::time::Duration;

use proptest::prelude::*;

use crate::props_common::{check, ctx, go, in_both_contexts, pause, pick, Ctx, Joiner};
use fibra::sync::{
    Barrier, Condvar, ManageConnection, Mutex, OnceLock, Pool, PoolError, PooledConnection, RwLock,
    Semaphore, SemaphorePermit, WaitGroup,
};
use fibra::{Fiber, Scheduler};

/// What an operation returned, as the model and fibra are compared.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Out {
    Done,
    /// Nothing to use (no guard, permit or handle held).
    Skipped,
    /// A lock was taken; whether it came as a `PoisonError`.
    Locked {
        poisoned: bool,
    },
    WouldBlock,
    Count(usize),
    Flag(bool),
    Value(Option<u32>),
    /// A `Condvar` wait: whether it timed out, and whether the relock was poisoned.
    Waited {
        timed_out: bool,
        poisoned: bool,
    },
    /// A pool's checkout: the connection's id, or why none.
    Conn(u32),
    NoConn,
    PoolTimeout {
        with_error: bool,
    },
    State {
        connections: u32,
        idle: u32,
    },
}

/// Compares one step's results.
fn same(step: usize, op: &dyn std::fmt::Debug, want: Out, got: Out) -> Result<(), String> {
    if want == got {
        Ok(())
    } else {
        Err(format!(
            "step {step} {op:?}: the model says {want:?}, fibra gave {got:?}"
        ))
    }
}

/// Drops `guard` in an unwind (not a panic: no hook, no message), which poisons its lock.
fn unwind_holding<G>(guard: G) {
    let r = catch_unwind(AssertUnwindSafe(move || {
        let _held = guard;
        resume_unwind(Box::new("unwinding while holding the guard"));
    }));
    assert!(r.is_err());
}

/// A `LockResult`/`TryLockResult` as the model sees it, the guard (if any) kept in `slot`.
fn locked<G>(r: Result<G, TryLockError<G>>, slot: impl FnOnce(G)) -> Out {
    match r {
        Ok(g) => {
            slot(g);
            Out::Locked { poisoned: false }
        }
        Err(TryLockError::Poisoned(e)) => {
            slot(e.into_inner());
            Out::Locked { poisoned: true }
        }
        Err(TryLockError::WouldBlock) => Out::WouldBlock,
    }
}

/// A `LockResult` as a `TryLockResult`.
fn waited<G>(r: std::sync::LockResult<G>) -> Result<G, TryLockError<G>> {
    r.map_err(TryLockError::Poisoned)
}

// --------------------------------------------------------------------- semaphore, sequential

#[derive(Debug, Clone)]
enum SemOp {
    /// `n` permits; `None`: the one-permit call.
    Acquire(Option<u8>),
    TryAcquire(Option<u8>),
    AcquireTimeout0(Option<u8>),
    Release(u8),
    DropPermit(u8),
    ForgetPermit(u8),
    NumPermits(u8),
    Available,
}

fn run_semaphore((initial, ops): (usize, Vec<SemOp>)) -> Result<(), String> {
    let sem = Semaphore::new(initial);
    // The model: the free permits, and the size of each permit held.
    let mut free = initial;
    let mut held_model: Vec<usize> = Vec::new();
    let mut held: Vec<SemaphorePermit<'_>> = Vec::new();
    for (step, op) in ops.iter().enumerate() {
        let n = |k: &Option<u8>| k.map_or(1, usize::from);
        let (want, got) = match op {
            SemOp::Acquire(k) | SemOp::TryAcquire(k) | SemOp::AcquireTimeout0(k) => {
                let n = n(k);
                let ok = free >= n;
                let p = match (op, k) {
                    // Waits only where the model says it returns at once.
                    (SemOp::Acquire(_), None) if ok => Some(sem.acquire()),
                    (SemOp::Acquire(_), Some(_)) if ok => Some(sem.acquire_many(n)),
                    (SemOp::TryAcquire(_), None) => sem.try_acquire(),
                    (SemOp::TryAcquire(_), Some(_)) => sem.try_acquire_many(n),
                    (_, None) => sem.acquire_timeout(Duration::ZERO),
                    (_, Some(_)) => sem.acquire_many_timeout(n, Duration::ZERO),
                };
                if ok {
                    free -= n;
                    held_model.push(n);
                }
                let got = Out::Flag(p.is_some());
                held.extend(p);
                (Out::Flag(ok), got)
            }
            SemOp::Release(k) => {
                free += usize::from(*k);
                sem.release(usize::from(*k));
                (Out::Done, Out::Done)
            }
            SemOp::DropPermit(i) | SemOp::ForgetPermit(i) => match pick(&held, *i) {
                Some(i) => {
                    let n = held_model.swap_remove(i);
                    let p = held.swap_remove(i);
                    if matches!(op, SemOp::DropPermit(_)) {
                        free += n;
                        drop(p);
                    } else {
                        p.forget();
                    }
                    (Out::Done, Out::Done)
                }
                None => (Out::Skipped, Out::Skipped),
            },
            SemOp::NumPermits(i) => match pick(&held, *i) {
                Some(i) => (Out::Count(held_model[i]), Out::Count(held[i].num_permits())),
                None => (Out::Skipped, Out::Skipped),
            },
            SemOp::Available => (Out::Count(free), Out::Count(sem.available_permits())),
        };
        same(step, op, want, got)?;
    }
    drop(held);
    let free_at_end = free + held_model.iter().sum::<usize>();
    same(
        ops.len(),
        &"the end",
        Out::Count(free_at_end),
        Out::Count(sem.available_permits()),
    )
}

#[test]
fn semaphore_matches_the_sequential_model_on_threads_and_in_fibers() {
    check(
        128,
        || {
            let n = prop::option::of(0u8..=3);
            let i = any::<u8>();
            let op = prop_oneof![
                3 => n.clone().prop_map(SemOp::Acquire),
                3 => n.clone().prop_map(SemOp::TryAcquire),
                2 => n.prop_map(SemOp::AcquireTimeout0),
                2 => (0u8..=3).prop_map(SemOp::Release),
                3 => i.prop_map(SemOp::DropPermit),
                1 => i.prop_map(SemOp::ForgetPermit),
                1 => i.prop_map(SemOp::NumPermits),
                1 => Just(SemOp::Available),
            ];
            (0usize..=4, prop::collection::vec(op, 0..40))
        },
        |s, v| in_both_contexts(s, v, run_semaphore),
    );
}

// ------------------------------------------------------------ mutex and condvar, sequential

#[derive(Debug, Clone)]
enum MutexOp {
    Lock,
    TryLock,
    Unlock,
    Add(u8),
    Read,
    /// Unwinds while holding the guard: poisons the mutex.
    UnwindHolding,
    IsPoisoned,
    ClearPoison,
    /// `Condvar::wait_timeout` with a zero timeout, with the guard held.
    WaitTimeout0,
    /// `Condvar::wait_timeout_while` with a zero timeout and a condition that stays as
    /// given: false returns at once, without unlocking (so without a poison error, as
    /// std's); true waits, times out, and relocks.
    WaitWhile(bool),
    NotifyOne,
    NotifyAll,
}

/// The sequential model of a mutex or a reader-writer lock (std's semantics): the read
/// guards held, whether the write guard (a mutex's only guard) is held, the data, the poison
/// flag. With nobody waiting, a read lock is free unless a writer holds it, a write lock
/// unless anyone does; a lock taken while poisoned comes as a `PoisonError` carrying the
/// guard; only a writer unwinding with its guard poisons.
#[derive(Debug, Default)]
struct LockModel {
    readers: usize,
    writer: bool,
    value: u32,
    poisoned: bool,
}

fn run_mutex(ops: Vec<MutexOp>) -> Result<(), String> {
    let mut m = Mutex::new(0u32);
    let cv = Condvar::new();
    let mut model = LockModel::default();
    {
        let mut guard = None;
        for (step, op) in ops.iter().enumerate() {
            let held = model.writer;
            let (want, got) = match op {
                MutexOp::Lock | MutexOp::TryLock => {
                    let want = if held {
                        Out::WouldBlock
                    } else {
                        model.writer = true;
                        Out::Locked {
                            poisoned: model.poisoned,
                        }
                    };
                    // `lock` only where the model says it returns at once.
                    let r = if matches!(op, MutexOp::Lock) && !held {
                        waited(m.lock())
                    } else {
                        m.try_lock()
                    };
                    (want, locked(r, |g| guard = Some(g)))
                }
                MutexOp::Unlock if held => {
                    model.writer = false;
                    guard = None;
                    (Out::Done, Out::Done)
                }
                MutexOp::Add(k) if held => {
                    model.value += u32::from(*k);
                    **guard.as_mut().unwrap() += u32::from(*k);
                    (Out::Done, Out::Done)
                }
                MutexOp::Read if held => (
                    Out::Value(Some(model.value)),
                    Out::Value(Some(**guard.as_ref().unwrap())),
                ),
                MutexOp::UnwindHolding if held => {
                    model.writer = false;
                    model.poisoned = true;
                    unwind_holding(guard.take().unwrap());
                    (Out::Done, Out::Done)
                }
                MutexOp::IsPoisoned => (Out::Flag(model.poisoned), Out::Flag(m.is_poisoned())),
                MutexOp::ClearPoison => {
                    model.poisoned = false;
                    m.clear_poison();
                    (Out::Done, Out::Done)
                }
                MutexOp::WaitTimeout0 | MutexOp::WaitWhile(_) if held => {
                    let g = guard.take().unwrap();
                    let (r, relocked) = match *op {
                        MutexOp::WaitWhile(cond) => {
                            (cv.wait_timeout_while(g, Duration::ZERO, |_| cond), cond)
                        }
                        _ => (cv.wait_timeout(g, Duration::ZERO), true),
                    };
                    let (g, res, poisoned) = match r {
                        Ok((g, res)) => (g, res, false),
                        Err(e) => {
                            let (g, res) = e.into_inner();
                            (g, res, true)
                        }
                    };
                    guard = Some(g);
                    let want = Out::Waited {
                        timed_out: relocked,
                        poisoned: relocked && model.poisoned,
                    };
                    let got = Out::Waited {
                        timed_out: res.timed_out(),
                        poisoned,
                    };
                    (want, got)
                }
                MutexOp::NotifyOne => {
                    cv.notify_one();
                    (Out::Done, Out::Done)
                }
                MutexOp::NotifyAll => {
                    cv.notify_all();
                    (Out::Done, Out::Done)
                }
                _ => (Out::Skipped, Out::Skipped),
            };
            same(step, op, want, got)?;
        }
    }
    let (value, poisoned) = match m.get_mut() {
        Ok(v) => (*v, false),
        Err(e) => (*e.into_inner(), true),
    };
    // `get_mut` gives the data, as a `PoisonError` if poisoned.
    same(
        ops.len(),
        &"the end (get_mut)",
        Out::Locked {
            poisoned: model.poisoned,
        },
        Out::Locked { poisoned },
    )?;
    same(
        ops.len(),
        &"the end (get_mut)",
        Out::Value(Some(model.value)),
        Out::Value(Some(value)),
    )
}

#[test]
fn mutex_and_condvar_match_the_sequential_model_on_threads_and_in_fibers() {
    check(
        128,
        || {
            let op = prop_oneof![
                3 => Just(MutexOp::Lock),
                3 => Just(MutexOp::TryLock),
                3 => Just(MutexOp::Unlock),
                2 => (0u8..5).prop_map(MutexOp::Add),
                1 => Just(MutexOp::Read),
                1 => Just(MutexOp::UnwindHolding),
                1 => Just(MutexOp::IsPoisoned),
                1 => Just(MutexOp::ClearPoison),
                1 => Just(MutexOp::WaitTimeout0),
                1 => any::<bool>().prop_map(MutexOp::WaitWhile),
                1 => Just(MutexOp::NotifyOne),
                1 => Just(MutexOp::NotifyAll),
            ];
            prop::collection::vec(op, 0..40)
        },
        |s, v| in_both_contexts(s, v, run_mutex),
    );
}

// ---------------------------------------------------------------------- rwlock, sequential

#[derive(Debug, Clone)]
enum RwOp {
    Read,
    TryRead,
    Write,
    TryWrite,
    DropRead(u8),
    DropWrite,
    Add(u8),
    Get(u8),
    /// Unwinds while holding the write guard: poisons the lock.
    UnwindWriting,
    /// Unwinds while holding a read guard: readers do not poison.
    UnwindReading(u8),
    IsPoisoned,
    ClearPoison,
}

fn run_rwlock(ops: Vec<RwOp>) -> Result<(), String> {
    let mut lock = RwLock::new(0u32);
    let mut model = LockModel::default();
    {
        let mut readers = Vec::new();
        let mut writer = None;
        for (step, op) in ops.iter().enumerate() {
            let (want, got) = match op {
                RwOp::Read | RwOp::TryRead => {
                    let free = !model.writer;
                    let want = if free {
                        model.readers += 1;
                        Out::Locked {
                            poisoned: model.poisoned,
                        }
                    } else {
                        Out::WouldBlock
                    };
                    let r = if matches!(op, RwOp::Read) && free {
                        waited(lock.read())
                    } else {
                        lock.try_read()
                    };
                    (want, locked(r, |g| readers.push(g)))
                }
                RwOp::Write | RwOp::TryWrite => {
                    let free = !model.writer && model.readers == 0;
                    let want = if free {
                        model.writer = true;
                        Out::Locked {
                            poisoned: model.poisoned,
                        }
                    } else {
                        Out::WouldBlock
                    };
                    let r = if matches!(op, RwOp::Write) && free {
                        waited(lock.write())
                    } else {
                        lock.try_write()
                    };
                    (want, locked(r, |g| writer = Some(g)))
                }
                RwOp::DropRead(i) | RwOp::UnwindReading(i) if !readers.is_empty() => {
                    let g = readers.swap_remove(pick(&readers, *i).unwrap());
                    model.readers -= 1;
                    if matches!(op, RwOp::UnwindReading(_)) {
                        unwind_holding(g);
                    }
                    (Out::Done, Out::Done)
                }
                RwOp::DropWrite if model.writer => {
                    model.writer = false;
                    writer = None;
                    (Out::Done, Out::Done)
                }
                RwOp::UnwindWriting if model.writer => {
                    model.writer = false;
                    model.poisoned = true;
                    unwind_holding(writer.take().unwrap());
                    (Out::Done, Out::Done)
                }
                RwOp::Add(k) if model.writer => {
                    model.value += u32::from(*k);
                    **writer.as_mut().unwrap() += u32::from(*k);
                    (Out::Done, Out::Done)
                }
                RwOp::Get(i) if !readers.is_empty() => (
                    Out::Value(Some(model.value)),
                    Out::Value(Some(*readers[pick(&readers, *i).unwrap()])),
                ),
                RwOp::IsPoisoned => (Out::Flag(model.poisoned), Out::Flag(lock.is_poisoned())),
                RwOp::ClearPoison => {
                    model.poisoned = false;
                    lock.clear_poison();
                    (Out::Done, Out::Done)
                }
                _ => (Out::Skipped, Out::Skipped),
            };
            same(step, op, want, got)?;
        }
    }
    let (value, poisoned) = match lock.get_mut() {
        Ok(v) => (*v, false),
        Err(e) => (*e.into_inner(), true),
    };
    same(
        ops.len(),
        &"the end (get_mut)",
        Out::Locked {
            poisoned: model.poisoned,
        },
        Out::Locked { poisoned },
    )?;
    same(
        ops.len(),
        &"the end (get_mut)",
        Out::Value(Some(model.value)),
        Out::Value(Some(value)),
    )
}

#[test]
fn rwlock_matches_the_sequential_model_on_threads_and_in_fibers() {
    check(
        128,
        || {
            let i = any::<u8>();
            let op = prop_oneof![
                3 => Just(RwOp::Read),
                3 => Just(RwOp::TryRead),
                3 => Just(RwOp::Write),
                3 => Just(RwOp::TryWrite),
                3 => i.prop_map(RwOp::DropRead),
                3 => Just(RwOp::DropWrite),
                2 => (0u8..5).prop_map(RwOp::Add),
                1 => i.prop_map(RwOp::Get),
                1 => Just(RwOp::UnwindWriting),
                1 => i.prop_map(RwOp::UnwindReading),
                1 => Just(RwOp::IsPoisoned),
                1 => Just(RwOp::ClearPoison),
            ];
            prop::collection::vec(op, 0..40)
        },
        |s, v| in_both_contexts(s, v, run_rwlock),
    );
}

// ------------------------------------------------------------ waitgroup and oncelock, sequential

#[derive(Debug, Clone)]
enum WgOp {
    Clone(u8),
    Drop(u8),
    Count(u8),
    /// `wait` (where the model says it returns: the last handle), else `wait_timeout(0)`.
    Wait(u8),
    WaitTimeout0(u8),
}

fn run_waitgroup(ops: Vec<WgOp>) -> Result<(), String> {
    let mut handles = vec![WaitGroup::new()];
    for (step, op) in ops.iter().enumerate() {
        let (WgOp::Clone(i)
        | WgOp::Drop(i)
        | WgOp::Count(i)
        | WgOp::Wait(i)
        | WgOp::WaitTimeout0(i)) = op;
        let Some(i) = pick(&handles, *i) else {
            break;
        };
        // The model: the count is the number of handles.
        let n = handles.len();
        let (want, got) = match op {
            WgOp::Clone(_) => {
                handles.push(handles[i].clone());
                (Out::Done, Out::Done)
            }
            WgOp::Drop(_) => {
                handles.swap_remove(i);
                (Out::Done, Out::Done)
            }
            WgOp::Count(_) => (Out::Count(n), Out::Count(handles[i].count())),
            WgOp::Wait(_) if n == 1 => {
                handles.swap_remove(i).wait();
                (Out::Done, Out::Done)
            }
            WgOp::Wait(_) | WgOp::WaitTimeout0(_) => {
                let done = handles.swap_remove(i).wait_timeout(Duration::ZERO);
                (Out::Flag(n == 1), Out::Flag(done))
            }
        };
        same(step, op, want, got)?;
    }
    Ok(())
}

#[test]
fn waitgroup_matches_the_sequential_model_on_threads_and_in_fibers() {
    check(
        128,
        || {
            let i = any::<u8>();
            let op = prop_oneof![
                3 => i.prop_map(WgOp::Clone),
                2 => i.prop_map(WgOp::Drop),
                2 => i.prop_map(WgOp::Count),
                1 => i.prop_map(WgOp::Wait),
                1 => i.prop_map(WgOp::WaitTimeout0),
            ];
            prop::collection::vec(op, 0..30)
        },
        |s, v| in_both_contexts(s, v, run_waitgroup),
    );
}

#[derive(Debug, Clone)]
enum OnceOp {
    Get,
    Set(u32),
    GetOrInit(u32),
    /// `get_or_init` whose initialiser unwinds: the cell stays as it was.
    GetOrInitUnwinds,
    Take,
    AddThroughGetMut(u32),
}

fn run_once_lock(ops: Vec<OnceOp>) -> Result<(), String> {
    let mut cell = OnceLock::new();
    let mut model: Option<u32> = None;
    for (step, op) in ops.iter().enumerate() {
        let (want, got) = match *op {
            OnceOp::Get => (Out::Value(model), Out::Value(cell.get().copied())),
            OnceOp::Set(v) => {
                let want = match model {
                    None => {
                        model = Some(v);
                        Out::Done
                    }
                    Some(_) => Out::Value(Some(v)),
                };
                let got = match cell.set(v) {
                    Ok(()) => Out::Done,
                    Err(back) => Out::Value(Some(back)),
                };
                (want, got)
            }
            OnceOp::GetOrInit(v) => {
                let want = *model.get_or_insert(v);
                (
                    Out::Value(Some(want)),
                    Out::Value(Some(*cell.get_or_init(|| v))),
                )
            }
            OnceOp::GetOrInitUnwinds => {
                let r = catch_unwind(AssertUnwindSafe(|| {
                    *cell.get_or_init(|| resume_unwind(Box::new("the initialiser fails")))
                }));
                (Out::Value(model), Out::Value(r.ok()))
            }
            OnceOp::Take => (Out::Value(model.take()), Out::Value(cell.take())),
            OnceOp::AddThroughGetMut(k) => {
                if let Some(v) = model.as_mut() {
                    *v += k;
                }
                if let Some(v) = cell.get_mut() {
                    *v += k;
                }
                (Out::Value(model), Out::Value(cell.get().copied()))
            }
        };
        same(step, op, want, got)?;
    }
    same(
        ops.len(),
        &"the end (into_inner)",
        Out::Value(model),
        Out::Value(cell.into_inner()),
    )
}

#[test]
fn once_lock_matches_the_sequential_model_on_threads_and_in_fibers() {
    check(
        128,
        || {
            let v = 0u32..100;
            let op = prop_oneof![
                Just(OnceOp::Get),
                v.clone().prop_map(OnceOp::Set),
                v.clone().prop_map(OnceOp::GetOrInit),
                Just(OnceOp::GetOrInitUnwinds),
                Just(OnceOp::Take),
                v.prop_map(OnceOp::AddThroughGetMut),
            ];
            prop::collection::vec(op, 0..20)
        },
        |s, v| in_both_contexts(s, v, run_once_lock),
    );
}

// ------------------------------------------------------------------------ pool, sequential

/// The server a pool's connections go to: `connect` fails the next `fail` times, and
/// `is_valid` fails for the connections in `invalid` (as after a restart); `live` counts
/// the connections that exist.
#[derive(Default)]
struct Server {
    next: AtomicU32,
    fail: AtomicU32,
    invalid: StdMutex<BTreeSet<u32>>,
    live: AtomicIsize,
}

/// A connection: its id, and whether its user broke it.
struct Conn {
    id: u32,
    broken: bool,
    server: Arc<Server>,
}

impl Drop for Conn {
    fn drop(&mut self) {
        self.server.live.fetch_sub(1, Ordering::SeqCst);
    }
}

/// The pool's manager, sharing the server with the test.
struct Conns(Arc<Server>);

impl ManageConnection for Conns {
    type Connection = Conn;
    type Error = std::io::Error;

    fn connect(&self) -> std::io::Result<Conn> {
        let server = &self.0;
        if server
            .fail
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |f| f.checked_sub(1))
            .is_ok()
        {
            return Err(std::io::Error::other("refused"));
        }
        server.live.fetch_add(1, Ordering::SeqCst);
        Ok(Conn {
            id: server.next.fetch_add(1, Ordering::SeqCst),
            broken: false,
            server: server.clone(),
        })
    }

    fn is_valid(&self, conn: &mut Conn) -> std::io::Result<()> {
        if self.0.invalid.lock().unwrap().contains(&conn.id) {
            Err(std::io::Error::other("invalid"))
        } else {
            Ok(())
        }
    }

    fn has_broken(&self, conn: &mut Conn) -> bool {
        conn.broken
    }
}

#[derive(Debug, Clone)]
enum PoolOp {
    /// `get` where the model says it returns at once, else `get_timeout(0)`.
    Get,
    GetTimeout0,
    TryGet,
    Return(u8),
    ReturnBroken(u8),
    FailConnects(u8),
    InvalidateIdle,
    State,
    MaxSize,
}

/// The sequential model of a pool, from its docs: at most `max` checked out (a permit
/// each); a checkout takes the most recently returned idle connection, dropping those that
/// fail the check-out test (with `test_on_check_out`), or makes one; `try_get` never
/// makes one; a connection that comes back broken is dropped, any other goes idle.
#[derive(Debug)]
struct PoolModel {
    max: usize,
    test: bool,
    idle: Vec<u32>,
    out: Vec<u32>,
    connections: u32,
    next: u32,
    fail: u32,
    invalid: BTreeSet<u32>,
}

impl PoolModel {
    /// An idle connection that passes the test, the others found before it dropped.
    fn idle_one(&mut self) -> Option<u32> {
        while let Some(id) = self.idle.pop() {
            if self.test && self.invalid.contains(&id) {
                self.connections -= 1;
                continue;
            }
            return Some(id);
        }
        None
    }

    fn try_get(&mut self) -> Out {
        if self.out.len() == self.max {
            return Out::NoConn;
        }
        match self.idle_one() {
            Some(id) => {
                self.out.push(id);
                Out::Conn(id)
            }
            None => Out::NoConn,
        }
    }

    /// A checkout with a deadline already passed: no retry of a failed `connect`.
    fn get_now(&mut self) -> Out {
        if self.out.len() == self.max {
            return Out::PoolTimeout { with_error: false };
        }
        let id = match self.idle_one() {
            Some(id) => id,
            None if self.fail > 0 => {
                self.fail -= 1;
                return Out::PoolTimeout { with_error: true };
            }
            None => {
                self.connections += 1;
                self.next += 1;
                self.next - 1
            }
        };
        self.out.push(id);
        Out::Conn(id)
    }

    /// Whether `get` returns at once: a permit is free, and an idle connection passes the
    /// test or `connect` will not fail (a failed one is retried after a pause).
    fn get_is_quick(&self) -> bool {
        self.out.len() < self.max
            && (self.fail == 0
                || self
                    .idle
                    .iter()
                    .any(|id| !self.test || !self.invalid.contains(id)))
    }
}

fn checkout(
    r: Result<PooledConnection<Conns>, PoolError>,
    out: &mut Vec<PooledConnection<Conns>>,
) -> Out {
    match r {
        Ok(c) => {
            let id = c.id;
            out.push(c);
            Out::Conn(id)
        }
        Err(PoolError::Timeout { last_error }) => Out::PoolTimeout {
            with_error: last_error.is_some(),
        },
        Err(e) => panic!("unexpected pool error {e}"),
    }
}

fn run_pool((max, min_idle, test, ops): (u32, u32, bool, Vec<PoolOp>)) -> Result<(), String> {
    let min_idle = min_idle.min(max);
    let server = Arc::new(Server::default());
    // A `get` is made only where the model says it returns at once; should the model be
    // wrong, a short connection timeout makes that a quick mismatch, not 30 s of retries.
    let pool = Pool::builder()
        .max_size(max)
        .min_idle(Some(min_idle))
        .test_on_check_out(test)
        .connection_timeout(Duration::from_millis(200))
        .build(Conns(server.clone()))
        .map_err(|e| format!("build: {e}"))?;
    let mut model = PoolModel {
        max: max as usize,
        test,
        idle: (0..min_idle).collect(),
        out: Vec::new(),
        connections: min_idle,
        next: min_idle,
        fail: 0,
        invalid: BTreeSet::new(),
    };
    let mut out: Vec<PooledConnection<Conns>> = Vec::new();
    for (step, op) in ops.iter().enumerate() {
        let (want, got) = match op {
            PoolOp::Get if model.get_is_quick() => {
                (model.get_now(), checkout(pool.get(), &mut out))
            }
            PoolOp::Get | PoolOp::GetTimeout0 => (
                model.get_now(),
                checkout(pool.get_timeout(Duration::ZERO), &mut out),
            ),
            PoolOp::TryGet => {
                let want = model.try_get();
                let got = match pool.try_get() {
                    Some(c) => checkout(Ok(c), &mut out),
                    None => Out::NoConn,
                };
                (want, got)
            }
            PoolOp::Return(i) | PoolOp::ReturnBroken(i) if !out.is_empty() => {
                let i = pick(&out, *i).unwrap();
                let id = model.out.swap_remove(i);
                let mut c = out.swap_remove(i);
                if matches!(op, PoolOp::ReturnBroken(_)) {
                    c.broken = true;
                    model.connections -= 1;
                } else {
                    model.idle.push(id);
                }
                drop(c);
                (Out::Done, Out::Done)
            }
            PoolOp::FailConnects(n) => {
                model.fail += u32::from(*n);
                server.fail.fetch_add(u32::from(*n), Ordering::SeqCst);
                (Out::Done, Out::Done)
            }
            PoolOp::InvalidateIdle => {
                model.invalid.extend(model.idle.iter().copied());
                server
                    .invalid
                    .lock()
                    .unwrap()
                    .extend(model.idle.iter().copied());
                (Out::Done, Out::Done)
            }
            PoolOp::State => {
                let s = pool.state();
                (
                    Out::State {
                        connections: model.connections,
                        idle: model.idle.len() as u32,
                    },
                    Out::State {
                        connections: s.connections,
                        idle: s.idle_connections,
                    },
                )
            }
            PoolOp::MaxSize => (
                Out::Count(max as usize),
                Out::Count(pool.max_size() as usize),
            ),
            _ => (Out::Skipped, Out::Skipped),
        };
        same(step, op, want, got)?;
        let live = server.live.load(Ordering::SeqCst);
        if live != model.connections as isize {
            return Err(format!(
                "after step {step} {op:?}: {live} connections alive, the model has {}",
                model.connections
            ));
        }
    }
    drop(out);
    drop(pool);
    same(
        ops.len(),
        &"the end: connections alive",
        Out::Count(0),
        Out::Count(server.live.load(Ordering::SeqCst) as usize),
    )
}

#[test]
fn pool_matches_the_sequential_model_on_threads_and_in_fibers() {
    check(
        128,
        || {
            let i = any::<u8>();
            let op = prop_oneof![
                3 => Just(PoolOp::Get),
                2 => Just(PoolOp::GetTimeout0),
                2 => Just(PoolOp::TryGet),
                3 => i.prop_map(PoolOp::Return),
                1 => i.prop_map(PoolOp::ReturnBroken),
                1 => (1u8..=2).prop_map(PoolOp::FailConnects),
                1 => Just(PoolOp::InvalidateIdle),
                1 => Just(PoolOp::State),
                1 => Just(PoolOp::MaxSize),
            ];
            // Independent parts (`min_idle` clamped to `max_size` in the run): a strategy
            // flat-mapped on `max_size` shrinks very slowly.
            (
                1u32..=3,
                0u32..=3,
                any::<bool>(),
                prop::collection::vec(op, 0..40),
            )
        },
        |s, v| in_both_contexts(s, v, run_pool),
    );
}

// ------------------------------------------------------------------------------- concurrent

/// A task of a concurrent case: where it runs, how many times it goes round, which of the
/// primitive's ways of waiting it uses (`how`, taken modulo their number), and how often
/// it pauses (see `pause`).
#[derive(Debug, Clone)]
struct Task {
    ctx: Ctx,
    count: u32,
    how: u8,
    pause: u8,
}

fn tasks(most: usize, rounds: u32) -> impl Strategy<Value = Vec<Task>> {
    let t = (ctx(), 0..=rounds, any::<u8>(), 0u8..4).prop_map(|(ctx, count, how, pause)| Task {
        ctx,
        count,
        how,
        pause,
    });
    prop::collection::vec(t, 1..=most)
}

/// Starts one fiber or thread per task, running `body(task index, task)`, and joins them.
fn run_tasks<T: Send + 'static>(
    sched: &Scheduler,
    tasks: &[Task],
    body: impl Fn(usize, Task) -> T + Clone + Send + 'static,
) -> Vec<T> {
    let started: Vec<Joiner<T>> = tasks
        .iter()
        .enumerate()
        .map(|(i, t)| {
            let (body, t) = (body.clone(), t.clone());
            go(sched, t.ctx, move || body(i, t))
        })
        .collect();
    started.into_iter().map(Joiner::join).collect()
}

/// Retries `attempt` (a `try_` form, or a wait with a short timeout) until it succeeds,
/// yielding between tries.
fn retry<T>(mut attempt: impl FnMut() -> Option<T>) -> T {
    loop {
        if let Some(v) = attempt() {
            return v;
        }
        Fiber::yield_now();
    }
}

/// Counts the holders inside a critical section and remembers the most there were at once.
#[derive(Default)]
struct Inside {
    now: AtomicUsize,
    most: AtomicUsize,
}

impl Inside {
    fn enter(&self, n: usize) {
        let now = self.now.fetch_add(n, Ordering::SeqCst) + n;
        self.most.fetch_max(now, Ordering::SeqCst);
    }

    fn leave(&self, n: usize) {
        self.now.fetch_sub(n, Ordering::SeqCst);
    }

    fn most(&self) -> usize {
        self.most.load(Ordering::SeqCst)
    }
}

#[test]
fn mutex_excludes_and_every_increment_lands_under_concurrency() {
    check(
        48,
        || tasks(6, 30),
        |sched, tasks| {
            let shared = Arc::new((Mutex::new(0u32), Inside::default()));
            let s = shared.clone();
            run_tasks(sched, &tasks, move |_, t| {
                let (m, inside) = &*s;
                for i in 0..t.count {
                    let mut g = match t.how % 3 {
                        0 => m.lock().unwrap(),
                        1 => retry(|| m.try_lock().ok()),
                        // A lock held across a yield, a sleep, a receive: waiters must wait.
                        _ => {
                            let g = m.lock().unwrap();
                            fibra::sleep(Duration::ZERO);
                            g
                        }
                    };
                    inside.enter(1);
                    // Read, pause, write: an increment lost to a second holder shows at the end.
                    let v = *g;
                    pause(t.pause, i);
                    *g = v + 1;
                    inside.leave(1);
                    drop(g);
                    pause(t.pause, i + 1);
                }
            });
            let (m, inside) = &*shared;
            prop_assert_eq!(
                inside.most(),
                1.min(tasks.iter().map(|t| t.count).sum::<u32>() as usize)
            );
            prop_assert_eq!(
                *m.lock().unwrap(),
                tasks.iter().map(|t| t.count).sum::<u32>()
            );
            Ok(())
        },
    );
}

#[test]
fn rwlock_excludes_writers_and_every_write_lands_under_concurrency() {
    check(
        48,
        || tasks(6, 20),
        |sched, tasks| {
            // The lock, the readers and the writers inside, and what went wrong.
            let shared = Arc::new((
                RwLock::new(0u32),
                AtomicUsize::new(0),
                AtomicUsize::new(0),
                StdMutex::new(Vec::new()),
            ));
            let s = shared.clone();
            run_tasks(sched, &tasks, move |task, t| {
                let (lock, readers, writers, wrong) = &*s;
                let mut last = 0;
                for i in 0..t.count {
                    if t.how % 2 == 0 {
                        let mut g = if t.how % 4 == 0 {
                            lock.write().unwrap()
                        } else {
                            retry(|| lock.try_write().ok())
                        };
                        // Counted in, then the others looked at (both SeqCst): of a writer and
                        // anyone else inside at once, one sees the other.
                        let (w, r) = (
                            writers.fetch_add(1, Ordering::SeqCst),
                            readers.load(Ordering::SeqCst),
                        );
                        if w != 0 || r != 0 {
                            wrong
                                .lock()
                                .unwrap()
                                .push(format!("writer {task}: {w} writers, {r} readers inside"));
                        }
                        let v = *g;
                        pause(t.pause, i);
                        *g = v + 1;
                        writers.fetch_sub(1, Ordering::SeqCst);
                    } else {
                        let g = if t.how % 4 == 1 {
                            lock.read().unwrap()
                        } else {
                            retry(|| lock.try_read().ok())
                        };
                        readers.fetch_add(1, Ordering::SeqCst);
                        let w = writers.load(Ordering::SeqCst);
                        if w != 0 {
                            wrong
                                .lock()
                                .unwrap()
                                .push(format!("reader {task}: {w} writers inside"));
                        }
                        if *g < last {
                            wrong
                                .lock()
                                .unwrap()
                                .push(format!("reader {task}: {} after {last}", *g));
                        }
                        last = *g;
                        pause(t.pause, i);
                        readers.fetch_sub(1, Ordering::SeqCst);
                        drop(g);
                    }
                    pause(t.pause, i + 1);
                }
            });
            let (lock, _, _, wrong) = &*shared;
            let wrong = wrong.lock().unwrap();
            prop_assert!(wrong.is_empty(), "{:?}", *wrong);
            let writes: u32 = tasks
                .iter()
                .filter(|t| t.how % 2 == 0)
                .map(|t| t.count)
                .sum();
            prop_assert_eq!(*lock.read().unwrap(), writes);
            Ok(())
        },
    );
}

#[test]
fn semaphore_never_lets_more_than_its_permits_in_under_concurrency() {
    check(
        48,
        || (1usize..=4, tasks(6, 20)),
        |sched, (permits, tasks)| {
            let shared = Arc::new((Semaphore::new(permits), Inside::default()));
            let s = shared.clone();
            run_tasks(sched, &tasks, move |_, t| {
                let (sem, inside) = &*s;
                // Each task asks for 1 to `permits` permits at a time.
                let n = 1 + usize::from(t.how / 8) % permits;
                for i in 0..t.count {
                    let p = match t.how % 4 {
                        0 => sem.acquire_many(n),
                        1 => retry(|| sem.try_acquire_many(n)),
                        2 => retry(|| sem.acquire_many_timeout(n, Duration::from_millis(1))),
                        _ if n == 1 => sem.acquire(),
                        _ => retry(|| sem.acquire_many_timeout(n, Duration::ZERO)),
                    };
                    inside.enter(n);
                    pause(t.pause, i);
                    inside.leave(n);
                    if t.how % 3 == 0 {
                        // Kept out of the semaphore, then given back by hand.
                        p.forget();
                        sem.release(n);
                    } else {
                        drop(p);
                    }
                    pause(t.pause, i + 1);
                }
            });
            let (sem, inside) = &*shared;
            prop_assert!(
                inside.most() <= permits,
                "{} permits held of {}",
                inside.most(),
                permits
            );
            prop_assert_eq!(sem.available_permits(), permits);
            Ok(())
        },
    );
}

#[test]
fn a_condvar_queue_loses_and_duplicates_nothing_under_concurrency() {
    check(
        48,
        || (1usize..=3, tasks(3, 30), tasks(3, 0)),
        |sched, (capacity, producers, consumers)| {
            // The queue and how many producers are still going; "not empty", "not full".
            type Queue = (
                Mutex<(std::collections::VecDeque<(usize, u32)>, usize)>,
                Condvar,
                Condvar,
            );
            let q: Arc<Queue> = Arc::new((
                Mutex::new((Default::default(), producers.len())),
                Condvar::new(),
                Condvar::new(),
            ));
            let qc = q.clone();
            let consuming: Vec<_> = consumers
                .iter()
                .map(|t| {
                    let (q, t) = (qc.clone(), t.clone());
                    go(sched, t.ctx, move || {
                        let (m, not_empty, not_full) = &*q;
                        let mut got = Vec::new();
                        loop {
                            let wait =
                                |s: &mut (std::collections::VecDeque<(usize, u32)>, usize)| {
                                    s.0.is_empty() && s.1 > 0
                                };
                            let mut g = if t.how % 2 == 0 {
                                not_empty.wait_while(m.lock().unwrap(), wait).unwrap()
                            } else {
                                // Short timed waits, looked at again each time.
                                let mut g = m.lock().unwrap();
                                while wait(&mut g) {
                                    g = not_empty
                                        .wait_timeout(g, Duration::from_millis(1))
                                        .unwrap()
                                        .0;
                                }
                                g
                            };
                            let Some(item) = g.0.pop_front() else {
                                return got;
                            };
                            drop(g);
                            not_full.notify_one();
                            got.push(item);
                            pause(t.pause, got.len() as u32);
                        }
                    })
                })
                .collect();
            let qp = q.clone();
            run_tasks(sched, &producers, move |p, t| {
                let (m, not_empty, not_full) = &*qp;
                for seq in 0..t.count {
                    let mut g = not_full
                        .wait_while(m.lock().unwrap(), |s| s.0.len() >= capacity)
                        .unwrap();
                    g.0.push_back((p, seq));
                    drop(g);
                    if t.how % 2 == 0 {
                        not_empty.notify_one();
                    } else {
                        not_empty.notify_all();
                    }
                    pause(t.pause, seq);
                }
                m.lock().unwrap().1 -= 1;
                not_empty.notify_all();
            });
            let got: Vec<Vec<(usize, u32)>> = consuming.into_iter().map(Joiner::join).collect();
            for (c, items) in got.iter().enumerate() {
                for p in 0..producers.len() {
                    let seqs: Vec<u32> = items.iter().filter(|m| m.0 == p).map(|m| m.1).collect();
                    prop_assert!(
                        seqs.windows(2).all(|w| w[0] < w[1]),
                        "consumer {} got {:?} of producer {}",
                        c,
                        seqs,
                        p
                    );
                }
            }
            let mut all: Vec<(usize, u32)> = got.into_iter().flatten().collect();
            all.sort_unstable();
            let sent: Vec<(usize, u32)> = producers
                .iter()
                .enumerate()
                .flat_map(|(p, t)| (0..t.count).map(move |seq| (p, seq)))
                .collect();
            prop_assert_eq!(all, sent);
            Ok(())
        },
    );
}

#[test]
fn a_barrier_releases_each_round_once_everyone_arrived_with_one_leader() {
    check(
        48,
        || (tasks(5, 0), 1usize..=4),
        |sched, (parties, rounds)| {
            let n = parties.len();
            // The barrier, and for each round the arrivals and the leaders.
            let shared = Arc::new((
                Barrier::new(n),
                (0..rounds)
                    .map(|_| (AtomicUsize::new(0), AtomicUsize::new(0)))
                    .collect::<Vec<_>>(),
            ));
            let s = shared.clone();
            let early = run_tasks(sched, &parties, move |_, t| {
                let (barrier, per_round) = &*s;
                let mut early = Vec::new();
                for (r, (arrived, leaders)) in per_round.iter().enumerate() {
                    arrived.fetch_add(1, Ordering::SeqCst);
                    pause(t.pause, r as u32);
                    let res = barrier.wait();
                    let seen = arrived.load(Ordering::SeqCst);
                    if seen != n {
                        early.push((r, seen));
                    }
                    if res.is_leader() {
                        leaders.fetch_add(1, Ordering::SeqCst);
                    }
                }
                early
            });
            prop_assert!(
                early.iter().all(Vec::is_empty),
                "released before all arrived: {:?}",
                early
            );
            for (r, (_, leaders)) in shared.1.iter().enumerate() {
                prop_assert_eq!(leaders.load(Ordering::SeqCst), 1, "round {}", r);
            }
            Ok(())
        },
    );
}

#[test]
fn waitgroup_wait_returns_once_every_other_handle_is_gone() {
    check(
        48,
        || (tasks(5, 4), tasks(2, 0)),
        |sched, (workers, waiters)| {
            let wg = WaitGroup::new();
            let done = Arc::new(AtomicUsize::new(0));
            let waiting: Vec<_> = waiters
                .iter()
                .map(|t| {
                    let (wg, done, how) = (wg.clone(), done.clone(), t.how);
                    go(sched, t.ctx, move || {
                        let finished = if how % 2 == 0 {
                            wg.wait();
                            true
                        } else {
                            wg.wait_timeout(Duration::from_secs(30))
                        };
                        (finished, done.load(Ordering::SeqCst))
                    })
                })
                .collect();
            let handles: Vec<_> = workers.iter().map(|_| wg.clone()).collect();
            drop(wg);
            let d = done.clone();
            let handles = Arc::new(StdMutex::new(
                handles.into_iter().map(Some).collect::<Vec<_>>(),
            ));
            run_tasks(sched, &workers, move |i, t| {
                let mine = handles.lock().unwrap()[i].take();
                for k in 0..t.count {
                    pause(t.pause, k);
                }
                d.fetch_add(1, Ordering::SeqCst);
                drop(mine);
            });
            for w in waiting {
                prop_assert_eq!(w.join(), (true, workers.len()));
            }
            Ok(())
        },
    );
}

#[test]
fn once_lock_runs_one_initialiser_and_everyone_sees_its_value() {
    check(
        48,
        || tasks(6, 3),
        |sched, racers| {
            // The cell, and how many initialisers ran or `set`s succeeded.
            let shared = Arc::new((OnceLock::new(), AtomicUsize::new(0)));
            let s = shared.clone();
            let seen = run_tasks(sched, &racers, move |i, t| {
                let (cell, wins) = &*s;
                if t.how % 2 == 0 {
                    Some(*cell.get_or_init(|| {
                        wins.fetch_add(1, Ordering::SeqCst);
                        for k in 0..t.count {
                            pause(t.pause, k);
                        }
                        i
                    }))
                } else {
                    if cell.set(i).is_ok() {
                        wins.fetch_add(1, Ordering::SeqCst);
                    }
                    cell.get().copied()
                }
            });
            let (cell, wins) = &*shared;
            prop_assert_eq!(wins.load(Ordering::SeqCst), 1);
            let value = *cell.get().unwrap();
            prop_assert!(
                seen.iter().all(|v| *v == Some(value)),
                "{:?}, then {}",
                seen,
                value
            );
            Ok(())
        },
    );
}

#[test]
fn pool_never_hands_out_more_than_max_size_under_concurrency() {
    check(
        48,
        || (1u32..=3, 0u32..=3, tasks(6, 10)),
        |sched, (max, min_idle, users)| {
            let server = Arc::new(Server::default());
            let pool = Pool::builder()
                .max_size(max)
                .min_idle(Some(min_idle.min(max)))
                .build(Conns(server.clone()))
                .unwrap();
            let inside = Arc::new(Inside::default());
            let (p, ins) = (pool.clone(), inside.clone());
            run_tasks(sched, &users, move |_, t| {
                for i in 0..t.count {
                    let mut conn = match t.how % 3 {
                        0 => p.get().unwrap(),
                        1 => retry(|| p.try_get().or_else(|| p.get_timeout(Duration::ZERO).ok())),
                        _ => retry(|| p.get_timeout(Duration::from_millis(1)).ok()),
                    };
                    ins.enter(1);
                    pause(t.pause, i);
                    ins.leave(1);
                    // Now and then it comes back broken, and is dropped instead of kept.
                    conn.broken = t.how % 5 == 0 && i % 2 == 0;
                    drop(conn);
                    pause(t.pause, i + 1);
                }
            });
            prop_assert!(
                inside.most() <= max as usize,
                "{} checked out of {}",
                inside.most(),
                max
            );
            let state = pool.state();
            prop_assert!(state.connections <= max);
            prop_assert_eq!(state.idle_connections, state.connections, "all back");
            prop_assert_eq!(
                server.live.load(Ordering::SeqCst),
                state.connections as isize
            );
            drop(pool);
            prop_assert_eq!(server.live.load(Ordering::SeqCst), 0);
            Ok(())
        },
    );
}
