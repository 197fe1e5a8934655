//! Tasks: spawn and join (from fibers and threads), pinned submits, cancel, yield, sleep,
//! park/unpark, panics by design, `JoinSet`, `scope`, `spawn_local` (and
//! `spawn_local_fiber`), fiber-locals, continuations, `block_on`.

use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::rc::Rc;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex as StdMutex};
use std::time::{Duration, Instant};

use fibra::sync::{mpsc, oneshot, Condvar, Mutex, Semaphore};
use fibra::{Fiber, JoinSet, ParkResult, Unparker};

use crate::acct::{classify, designed_panic, wrap, Fifo, Kind, Msg, Op, Outcome, Ticket, ACCT};
use crate::rng::Rng;
use crate::Round;

/// A fiber actor's operation.
pub fn step(r: &Arc<Round>, rng: &mut Rng) -> Op {
    const OPS: [(Op, u32); 14] = [
        (Op::SpawnJoin, 10),
        (Op::Futures, 3),
        (Op::Pinned, 6),
        (Op::Cancel, 10),
        (Op::YieldSleep, 6),
        (Op::Park, 8),
        (Op::Panic, 5),
        (Op::JoinSet, 5),
        (Op::Scope, 5),
        (Op::SpawnLocal, 5),
        (Op::FiberLocal, 5),
        (Op::Continuation, 5),
        (Op::BlockOn, 2),
        (Op::SpawnJoin, 2),
    ];
    let op = OPS[rng.weighted(&OPS.map(|o| o.1))].0;
    run(op, r, rng);
    op
}

/// A thread actor's operation from this area (none of those that need a fiber).
pub fn thread_step(r: &Arc<Round>, rng: &mut Rng) -> Op {
    const OPS: [(Op, u32); 10] = [
        (Op::SpawnFromThread, 10),
        (Op::Futures, 3),
        (Op::Pinned, 5),
        (Op::Cancel, 8),
        (Op::YieldSleep, 2),
        (Op::Park, 6),
        (Op::Panic, 4),
        (Op::JoinSet, 4),
        (Op::Continuation, 4),
        (Op::BlockOn, 4),
    ];
    let op = OPS[rng.weighted(&OPS.map(|o| o.1))].0;
    run(op, r, rng);
    op
}

fn run(op: Op, r: &Arc<Round>, rng: &mut Rng) {
    match op {
        Op::SpawnJoin | Op::SpawnFromThread => spawn_join(r, rng, 0),
        Op::Pinned => pinned(r, rng),
        Op::Cancel => cancel(r, rng),
        Op::YieldSleep => yield_sleep(rng),
        Op::Park => park(r, rng),
        Op::Panic => panic(r, rng),
        Op::JoinSet => join_set(r, rng),
        Op::Scope => scope(r, rng),
        Op::SpawnLocal => spawn_local(r, rng),
        Op::FiberLocal => fiber_local(r, rng),
        Op::Continuation => continuation(r, rng),
        Op::BlockOn => block_on(r, rng),
        Op::Futures => futures(r, rng),
        _ => unreachable!("not an operation of this area: {op:?}"),
    }
}

/// A little of what tasks do: nothing, yields, a short sleep, or some computing.
pub fn work(rng: &mut Rng) -> u64 {
    match rng.below(6) {
        0 => 0,
        1 => {
            for _ in 0..rng.range(1, 5) {
                Fiber::yield_now();
            }
            1
        }
        2 => {
            fibra::sleep(Duration::from_micros(rng.range(0, 2000)));
            2
        }
        3 => {
            let mut x = rng.next_u64();
            for _ in 0..rng.range(100, 5000) {
                x = std::hint::black_box(x.wrapping_mul(6364136223846793005).wrapping_add(1));
            }
            x & 1
        }
        4 => {
            fibra::sleep(Duration::ZERO);
            4
        }
        _ => {
            let until = Instant::now() + Duration::from_micros(rng.range(0, 500));
            fibra::sleep_until(until);
            5
        }
    }
}

/// Spawns a few tasks (some of which spawn and join their own), joins them, checks values.
fn spawn_join(r: &Arc<Round>, rng: &mut Rng, depth: u32) {
    let n = rng.range(1, 8);
    let handles: Vec<_> = (0..n)
        .map(|i| {
            let mut trng = rng.fork();
            let nested = depth < 2 && rng.chance(15);
            let r2 = r.clone();
            r.spawn(rng, move || {
                work(&mut trng);
                if nested {
                    spawn_join(&r2, &mut trng, depth + 1);
                }
                i * i
            })
        })
        .collect();
    for (i, h) in (0..n).zip(handles) {
        match h.join("spawn+join") {
            Outcome::Completed(v) => check!(v == i * i, "spawn+join: task {i} returned {v}"),
            _ => crate::acct::fail("spawn+join: a plain task did not complete".into()),
        }
    }
}

/// Submits pinned tasks and checks they run, and stay, on their worker.
fn pinned(r: &Arc<Round>, rng: &mut Rng) {
    let n = rng.range(1, 4);
    let handles: Vec<_> = (0..n)
        .map(|_| {
            let w = rng.below(r.sched.threads() as u64) as usize;
            let mut trng = rng.fork();
            let h = r.submit(Some(w), move || {
                let before = (fibra::current_worker(), std::thread::current().id());
                work(&mut trng);
                work(&mut trng);
                let after = (fibra::current_worker(), std::thread::current().id());
                (before, after)
            });
            (w, h)
        })
        .collect();
    for (w, h) in handles {
        if let Some((before, after)) = h.join("pinned").completed() {
            check!(
                before.0 == Some(w),
                "a task pinned to worker {w} ran on {:?}",
                before.0
            );
            check!(
                before == after,
                "a started fiber changed thread: {before:?} then {after:?}"
            );
        } else {
            crate::acct::fail("pinned: a plain task did not complete".into());
        }
    }
}

/// What a victim of `cancel` does.
const VICTIMS: u64 = 11;

/// Cancels a task at a random moment of one of several waits. A task that waits for ever
/// must end cancelled; where the caller gives it what it waits for (a lock, a message, a
/// condition, permits) just before or just after the cancel, it may complete instead, and a
/// lock or permits handed to it as it was cancelled must be passed on: afterwards all is
/// free again.
fn cancel(r: &Arc<Round>, rng: &mut Rng) {
    let kind = rng.below(VICTIMS);
    let lock = Arc::new(Mutex::new(0u64));
    let mut held = Some(lock.lock().expect("a fresh lock"));
    let (tx, rx) = mpsc::channel::<Msg>();
    let cv = Arc::new((Mutex::new(false), Condvar::new()));
    let sem = Arc::new(Semaphore::new(2));
    let mut permits = Some(sem.acquire_many(2));
    let (l2, cv2, s2) = (lock.clone(), cv.clone(), sem.clone());
    let mut trng = rng.fork();
    let r2 = r.clone();
    let victim = r.spawn(rng, move || match kind {
        0 => fibra::park(drop), // its unparker is gone: only the cancel ends it
        1 => fibra::sleep(Duration::from_secs(3600)),
        2 => {
            if let Ok(m) = rx.recv() {
                m.received();
            }
        }
        3 => {
            let _g = l2.lock();
        }
        4 => {
            for _ in 0..trng.range(1, 300) {
                Fiber::yield_now();
            }
        }
        5 => {}
        6 => fibra::unblock(|| std::thread::sleep(Duration::from_micros(trng.range(0, 3000)))),
        7 => {
            // Waits for a short-lived task of its own.
            let child = r2.spawn(&mut trng, || fibra::sleep(Duration::from_millis(2)));
            let _ = child.join("a cancelled task's child");
        }
        8 => {
            let never = fibra::sync::never::<u8>();
            let far = fibra::sync::after(Duration::from_secs(3600));
            fibra::select! {
                recv(never) -> _ => {},
                recv(far) -> _ => {},
            }
        }
        9 => {
            let (m, c) = &*cv2;
            let g = m.lock().expect("not poisoned");
            let _g = c.wait_while(g, |ready| !*ready);
        }
        _ => {
            let _p = s2.acquire();
        }
    });
    // 0: what it waits for comes only after the join; 1: just before the cancel; 2: just
    // after it.
    let give_at = rng.below(3);
    let mut give = || match kind {
        2 => {
            if let Err(e) = tx.send(Msg::new(Kind::Mpsc, 0, 0)) {
                e.0.refused();
            }
        }
        3 => drop(held.take()),
        9 => {
            *cv.0.lock().expect("not poisoned") = true;
            cv.1.notify_one();
        }
        10 => drop(permits.take()),
        _ => {}
    };
    match rng.below(4) {
        0 => {}
        1 => Fiber::yield_now(),
        _ => fibra::sleep(Duration::from_micros(rng.range(0, 2000))),
    }
    if give_at == 1 {
        give();
    }
    victim.handle.cancel();
    if give_at == 2 {
        give();
    }
    if rng.chance(20) {
        victim.handle.cancel(); // twice is once
    }
    let outcome = victim.join("cancel");
    let waits_for_ever =
        matches!(kind, 0 | 1 | 8) || matches!(kind, 2 | 3 | 9 | 10) && give_at == 0;
    check!(
        outcome.is_cancelled() || !waits_for_ever && !outcome.is_panicked(),
        "cancel: a victim of kind {kind} that waits for ever was not cancelled"
    );
    if give_at == 0 {
        give();
    }
    // Whatever the victim did not wait for is released now too.
    drop(held.take());
    drop(permits.take());
    drop(tx);
    // The cancelled waiter left the lock's queue, or passed on what it was handed.
    check!(
        lock.try_lock().is_ok(),
        "cancel: a lock a cancelled fiber waited for is not free (kind {kind}, given {give_at})"
    );
    check!(
        cv.0.try_lock().is_ok(),
        "cancel: a condvar's lock is held after its waiter was cancelled"
    );
    check!(
        sem.available_permits() == 2,
        "cancel: {} of 2 permits free after a waiter for one was cancelled (given {give_at})",
        sem.available_permits()
    );
}

/// Yields and sleeps; a sleep is never short.
fn yield_sleep(rng: &mut Rng) {
    for _ in 0..rng.range(0, 5) {
        Fiber::yield_now();
    }
    let d = Duration::from_micros(rng.range(0, 3000));
    let t0 = Instant::now();
    if rng.chance(50) {
        fibra::sleep(d);
    } else {
        fibra::sleep_until(t0 + d);
    }
    let took = t0.elapsed();
    check!(took >= d, "a sleep of {d:?} returned after {took:?}");
}

/// A parking spot: the unparker a parked fiber (or thread) published, and whether its waker
/// has fired.
#[derive(Default)]
struct Spot {
    unparker: StdMutex<Option<Unparker>>,
    fired: AtomicBool,
}

impl Spot {
    /// The waker's side: waits (briefly, yielding or sleeping) for the unparker, then fires.
    fn wake(&self, rng: &mut Rng) {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let u = self
                .unparker
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .take();
            if let Some(u) = u {
                if rng.chance(50) {
                    work(rng);
                }
                self.fired.store(true, Ordering::SeqCst);
                u.unpark();
                if rng.chance(10) {
                    u.unpark(); // a second unpark does nothing
                }
                return;
            }
            if Instant::now() > deadline {
                crate::acct::fail("park: the parker never published its unparker".into());
                return;
            }
            if fibra::Fiber::current().is_some() {
                Fiber::yield_now();
            } else {
                std::thread::sleep(Duration::from_micros(50));
            }
        }
    }
}

/// Parks (a fiber, or a thread actor's thread) and is woken by another task, a thread, or
/// itself; with or without a deadline. No spurious wake-ups: a park that returns unparked
/// was fired.
fn park(r: &Arc<Round>, rng: &mut Rng) {
    ACCT.parks.inc();
    if rng.chance(10) {
        fibra::park(|u| u.unpark()); // woken by its own registration
        return;
    }
    let spot = Arc::new(Spot::default());
    let s2 = spot.clone();
    let mut wrng = rng.fork();
    enum Waker {
        Task(crate::acct::Tracked<()>),
        Thread(std::thread::JoinHandle<()>),
    }
    let waker = if rng.chance(80) {
        Waker::Task(r.spawn(rng, move || s2.wake(&mut wrng)))
    } else {
        Waker::Thread(
            std::thread::Builder::new()
                .name("soak-waker".into())
                .spawn(move || s2.wake(&mut wrng))
                .expect("a waker thread"),
        )
    };
    let publish = |u: Unparker| {
        *spot.unparker.lock().unwrap_or_else(|e| e.into_inner()) = Some(u);
    };
    if rng.chance(30) {
        let deadline = Instant::now() + Duration::from_micros(rng.range(0, 3000));
        match fibra::park_timeout(deadline, publish) {
            ParkResult::Unparked => check!(
                spot.fired.load(Ordering::SeqCst),
                "park_timeout returned Unparked before its waker fired"
            ),
            ParkResult::TimedOut => {
                ACCT.parks_timed_out.inc();
                check!(
                    Instant::now() >= deadline,
                    "park_timeout timed out before its deadline"
                );
            }
        }
    } else {
        fibra::park(publish);
        check!(
            spot.fired.load(Ordering::SeqCst),
            "park returned before its waker fired"
        );
    }
    match waker {
        Waker::Task(t) => {
            let _ = t.join("a park's waker");
        }
        Waker::Thread(t) => {
            let _ = t.join();
        }
    }
}

/// Tasks that panic by design, in several ways; their handles report it.
fn panic(r: &Arc<Round>, rng: &mut Rng) {
    let mut trng = rng.fork();
    match rng.below(5) {
        0 => {
            let h = r.spawn(rng, move || {
                work(&mut trng);
                designed_panic("a task")
            });
            check!(
                h.join("panic").is_panicked(),
                "a panicking task did not panic"
            );
        }
        1 => {
            // Holding a lock: it is poisoned, and recovers.
            let m = Arc::new(Mutex::new(7u64));
            let m2 = m.clone();
            let h = r.spawn(rng, move || {
                let _g = m2.lock().expect("a fresh lock");
                work(&mut trng);
                designed_panic("holding a Mutex")
            });
            check!(
                h.join("panic").is_panicked(),
                "a panicking task did not panic"
            );
            check!(
                m.is_poisoned(),
                "a lock held by a panicking fiber is not poisoned"
            );
            match m.lock() {
                Ok(_) => crate::acct::fail("a poisoned lock locked without error".into()),
                Err(e) => check!(*e.into_inner() == 7, "a poisoned lock lost its value"),
            }
            m.clear_poison();
            check!(!m.is_poisoned(), "clear_poison left the lock poisoned");
        }
        2 => {
            // A parent joins its panicking child and completes.
            let r2 = r.clone();
            let h = r.spawn(rng, move || {
                let child = r2.spawn(&mut trng, || designed_panic("a child task"));
                child.join("panic (child)").is_panicked()
            });
            check!(
                h.join("panic (parent)").completed() == Some(true),
                "a parent of a panicking child did not see the panic, or did not complete"
            );
        }
        3 => {
            // In the blocking pool: resumes in the task.
            let h = r.spawn(rng, || fibra::unblock(|| designed_panic("in unblock")));
            check!(
                h.join("panic").is_panicked(),
                "unblock's panic did not reach its task"
            );
        }
        _ => {
            // Caught where it happens, in a fiber or on a thread.
            let p = std::panic::catch_unwind(|| designed_panic("caught"));
            check!(
                p.is_err_and(|p| p.is::<crate::acct::Designed>()),
                "a caught panic by design had another payload"
            );
        }
    }
}

/// A `JoinSet`: some results joined, the rest cancelled by `cancel_all` or the set's drop.
fn join_set(r: &Arc<Round>, rng: &mut Rng) {
    let mut set = JoinSet::new();
    let mut stubs = HashMap::new();
    let n = rng.range(1, 8);
    let in_fiber = r.in_fiber();
    for i in 0..n {
        let (ticket, stub) = Ticket::new(&r.counts);
        let mut trng = rng.fork();
        let kind = rng.below(10);
        let body = wrap(ticket, move || {
            match kind {
                0 => designed_panic("a JoinSet task"),
                1 => fibra::sleep(Duration::from_secs(3600)),
                _ => {
                    work(&mut trng);
                }
            }
            i
        });
        let id = if in_fiber && rng.chance(50) {
            set.spawn(body)
        } else {
            set.spawn_on(&r.sched, body)
        };
        stubs.insert(id, (stub, kind));
    }
    let joins = rng.range(0, n);
    for _ in 0..joins {
        // A task that sleeps for an hour would hold this up: cancel those first.
        if stubs.values().all(|(_, k)| *k == 1) {
            break;
        }
        let Some((id, res)) = set.join_next_with_id() else {
            crate::acct::fail("JoinSet: join_next found no task in a non-empty set".into());
            return;
        };
        let Some((stub, kind)) = stubs.remove(&id) else {
            crate::acct::fail("JoinSet: join_next returned an id it never spawned".into());
            return;
        };
        let o = classify(res, &stub, "JoinSet");
        check!(
            kind != 1 || o.is_cancelled(),
            "JoinSet: a task that sleeps for an hour ended without a cancel"
        );
    }
    if rng.chance(50) {
        set.cancel_all();
        while let Some((id, res)) = set.join_next_with_id() {
            match stubs.remove(&id) {
                Some((stub, _)) => {
                    classify(res, &stub, "JoinSet after cancel_all");
                }
                None => crate::acct::fail("JoinSet: an unknown id after cancel_all".into()),
            }
        }
        check!(
            set.is_empty(),
            "JoinSet: not empty after joining everything"
        );
    }
    // The rest are cancelled by the drop; their tickets say how they ended.
    drop(set);
}

/// Scoped fibers borrowing the caller's data.
fn scope(r: &Arc<Round>, rng: &mut Rng) {
    if !r.in_fiber() {
        return;
    }
    let k = rng.range_usize(1, 6);
    let chunk = rng.range_usize(1, 64);
    let mut data = vec![0u64; k * chunk];
    let panicker = if rng.chance(20) {
        rng.below(k as u64) as usize
    } else {
        usize::MAX
    };
    let seeds: Vec<Rng> = (0..k).map(|_| rng.fork()).collect();
    let counts = r.counts.clone();
    fibra::scope(|s| {
        let handles: Vec<_> = data
            .chunks_mut(chunk)
            .zip(seeds)
            .enumerate()
            .map(|(i, (c, mut trng))| {
                let (ticket, stub) = Ticket::new(&counts);
                let h = s.spawn(wrap(ticket, move || {
                    work(&mut trng);
                    if i == panicker {
                        designed_panic("a scoped fiber");
                    }
                    for x in c.iter_mut() {
                        *x = i as u64 + 1;
                    }
                    c.len()
                }));
                (h, stub)
            })
            .collect();
        for (i, (h, stub)) in handles.into_iter().enumerate() {
            let o = classify(h.join(), &stub, "scope");
            check!(
                (i == panicker) == o.is_panicked(),
                "scope: fiber {i} (panicker {panicker}) ended otherwise than planned"
            );
        }
    });
    for (i, c) in data.chunks(chunk).enumerate() {
        let want = if i == panicker { 0 } else { i as u64 + 1 };
        check!(
            c.iter().all(|&x| x == want),
            "scope: chunk {i} was not written as planned"
        );
    }
}

/// `spawn_local` fibers sharing an `Rc<RefCell<…>>` on the caller's worker, and a standalone
/// `Fiber` handed to the worker with `spawn_local_fiber`.
fn spawn_local(r: &Arc<Round>, rng: &mut Rng) {
    if !r.in_fiber() {
        return;
    }
    let here = fibra::current_worker();
    let seen = Rc::new(RefCell::new(Vec::new()));
    let n = rng.range(1, 6);
    let panicker = if rng.chance(20) {
        rng.below(n)
    } else {
        u64::MAX
    };
    let handles: Vec<_> = (0..n)
        .map(|i| {
            let (ticket, stub) = Ticket::new(&r.counts);
            let seen = seen.clone();
            let yields = rng.range(0, 3);
            let h = fibra::spawn_local(wrap(ticket, move || {
                for _ in 0..yields {
                    Fiber::yield_now();
                }
                check!(
                    fibra::current_worker() == here,
                    "spawn_local: ran on worker {:?}, not its caller's {here:?}",
                    fibra::current_worker()
                );
                if i == panicker {
                    designed_panic("a spawn_local fiber");
                }
                seen.borrow_mut().push(i);
            }));
            (h, stub)
        })
        .collect();
    for (i, (h, stub)) in (0..n).zip(handles) {
        let o = classify(h.join(), &stub, "spawn_local");
        check!(
            (i == panicker) == o.is_panicked(),
            "spawn_local: fiber {i} ended otherwise than planned"
        );
    }
    let mut got = seen.take();
    got.sort_unstable();
    let want: Vec<u64> = (0..n).filter(|&i| i != panicker).collect();
    check!(got == want, "spawn_local: saw {got:?}, wanted {want:?}");

    // A standalone fiber, resumed by the worker at its yields (it cannot carry a ticket of
    // its own: the soak counts the task `spawn_local_fiber` makes).
    let steps = rng.range(0, 4);
    let log = Rc::new(Cell::new(0u64));
    let l2 = log.clone();
    let (ticket, stub) = Ticket::new(&r.counts);
    let body = wrap(ticket, move || {
        for _ in 0..steps {
            l2.set(l2.get() + 1);
            Fiber::yield_now();
        }
    });
    let fiber = Fiber::new(body);
    let o = classify(
        fibra::spawn_local_fiber(fiber).join(),
        &stub,
        "spawn_local_fiber",
    );
    check!(
        o.completed().is_some() && log.get() == steps,
        "spawn_local_fiber: {} of {steps} steps",
        log.get()
    );
}

/// A value per fiber that counts how many are made and dropped.
pub struct Local {
    owner: Cell<u64>,
}

impl Default for Local {
    fn default() -> Local {
        ACCT.locals_made.inc();
        Local {
            owner: Cell::new(0),
        }
    }
}

impl Drop for Local {
    fn drop(&mut self) {
        ACCT.locals_dropped.inc();
    }
}

fibra::fiber_local! {
    static LOCAL: Local = Local::default();
}

/// Fiber-locals: each fiber sees its own value across suspensions, and every value made is
/// dropped, however its fiber ends (returned, panicked, cancelled).
fn fiber_local(r: &Arc<Round>, rng: &mut Rng) {
    let n = rng.range(1, 6);
    let handles: Vec<_> = (0..n)
        .map(|i| {
            let mut trng = rng.fork();
            let fate = rng.below(5);
            let h = r.spawn(rng, move || {
                let me = trng.next_u64() | 1;
                LOCAL.with(|l| {
                    check!(
                        l.owner.get() == 0,
                        "fiber_local: a new fiber found a used value"
                    );
                    l.owner.set(me)
                });
                work(&mut trng);
                check!(
                    LOCAL.with(|l| l.owner.get()) == me,
                    "fiber_local: a fiber's value changed across a suspension"
                );
                match fate {
                    0 => designed_panic("a fiber with a fiber-local"),
                    1 => {
                        fibra::sleep(Duration::from_secs(3600)); // cancelled below
                        i
                    }
                    _ => i,
                }
            });
            (fate, h)
        })
        .collect();
    for (fate, h) in handles {
        if fate == 1 {
            h.handle.cancel();
        }
        let o = h.join("fiber_local");
        check!(
            match fate {
                0 => o.is_panicked(),
                1 => o.is_cancelled(),
                _ => o.completed().is_some(),
            },
            "fiber_local: a task of fate {fate} ended otherwise"
        );
    }
}

/// `then`, `catching` and `finally` on a task that completes, panics, or is cancelled: they
/// have run by the time `join` returns, exactly the right ones.
fn continuation(r: &Arc<Round>, rng: &mut Rng) {
    let fate = rng.below(3);
    let mut trng = rng.fork();
    let h = r.spawn(rng, move || {
        work(&mut trng);
        match fate {
            0 => 42u64,
            1 => designed_panic("a task with continuations"),
            _ => {
                fibra::sleep(Duration::from_secs(3600));
                0
            }
        }
    });
    let then = Arc::new(AtomicU32::new(0));
    let caught = Arc::new(AtomicU32::new(0));
    let finally = Arc::new(AtomicU32::new(0));
    let (t, c, f) = (then.clone(), caught.clone(), finally.clone());
    let panics = rng.chance(10);
    h.handle
        .then(move |v| {
            check!(*v == 42, "then: saw {v}");
            t.fetch_add(1, Ordering::SeqCst);
        })
        .catching(move |_| {
            c.fetch_add(1, Ordering::SeqCst);
            if panics {
                designed_panic("a catching continuation");
            }
        })
        .finally(move || {
            f.fetch_add(1, Ordering::SeqCst);
        });
    if fate == 2 {
        h.handle.cancel();
    }
    let o = h.join("continuation");
    let completed = o.completed().is_some();
    check!(
        then.load(Ordering::SeqCst) == u32::from(completed)
            && caught.load(Ordering::SeqCst) == u32::from(!completed)
            && finally.load(Ordering::SeqCst) == 1,
        "continuations after a task of fate {fate}: then {}, catching {}, finally {}",
        then.load(Ordering::SeqCst),
        caught.load(Ordering::SeqCst),
        finally.load(Ordering::SeqCst)
    );
}

/// `Scheduler::block_on`, from a thread or a fiber; a panic in it resumes in the caller.
fn block_on(r: &Arc<Round>, rng: &mut Rng) {
    let mut trng = rng.fork();
    let panics = rng.chance(15);
    let (ticket, stub) = Ticket::new(&r.counts);
    let body = wrap(ticket, move || {
        work(&mut trng);
        if panics {
            designed_panic("in block_on");
        }
        7u64
    });
    let sched = r.sched.clone();
    let res = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| sched.block_on(body)));
    match res {
        Ok(v) => check!(!panics && v == 7, "block_on returned {v}"),
        Err(p) => check!(
            panics && p.is::<crate::acct::Designed>(),
            "block_on: {}",
            crate::acct::describe(&*p)
        ),
    }
    // The ticket was resolved before block_on returned (the body ended in its fiber).
    let want = if panics { "panicked" } else { "completed" };
    check!(
        crate::acct::stub_says(&stub) == want,
        "block_on: the task's ticket says {}, not {want}",
        crate::acct::stub_says(&stub)
    );
}

/// Async code in `future::block_on` (on a thread, or in a fiber): an mpsc receiver's
/// `recv_async`, a oneshot receiver and a `JoinHandle` awaited as futures.
fn futures(r: &Arc<Round>, rng: &mut Rng) {
    let mut trng = rng.fork();
    let task = r.spawn(rng, move || {
        work(&mut trng);
        11u64
    });
    let (tx, rx) = mpsc::channel::<Msg>();
    let (otx, orx) = oneshot::channel::<Msg>();
    let n = rng.range(0, 10);
    let mut prng = rng.fork();
    let producer = r.spawn(rng, move || {
        for seq in 0..n {
            if let Err(e) = tx.send(Msg::new(Kind::Mpsc, 0, seq)) {
                e.0.refused();
            }
            if prng.chance(20) {
                work(&mut prng);
            }
        }
        if let Err(m) = otx.send(Msg::new(Kind::Oneshot, 0, 0)) {
            m.refused();
        }
    });
    let crate::acct::Tracked { handle, stub } = task;
    let (got, one, res) = fibra::future::block_on(async {
        let mut fifo = Fifo::default();
        let mut got = 0;
        while got < n {
            match rx.recv_async().await {
                Ok(m) => {
                    fifo.receive(m, "recv_async");
                    got += 1;
                }
                Err(_) => break,
            }
        }
        let one = match orx.await {
            Ok(m) => {
                m.received();
                true
            }
            Err(_) => false,
        };
        (got, one, handle.await)
    });
    check!(
        got == n && one,
        "futures: {got} of {n} messages and {one} for the oneshot"
    );
    check!(
        classify(res, &stub, "an awaited JoinHandle").completed() == Some(11),
        "futures: an awaited task did not return its value"
    );
    check!(
        producer.join("a futures producer").completed().is_some(),
        "futures: the producer failed"
    );
}
