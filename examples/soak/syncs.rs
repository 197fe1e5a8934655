//! `fibra::sync`'s locks and the rest: `Mutex` (with poisoning), `RwLock`, `Condvar`,
//! `Semaphore`, `Barrier`, `WaitGroup`, `OnceLock`, `CancellationToken`. The round's actors
//! share one of each lock, whose invariants every user checks.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use fibra::sync::{
    Barrier, CancellationToken, Condvar, Mutex, MutexGuard, OnceLock, RwLock, Semaphore, WaitGroup,
};

use crate::acct::{designed_panic, fail, Op};
use crate::rng::Rng;
use crate::tasks::work;
use crate::Round;

/// The semaphore's permits.
const PERMITS: usize = 3;

/// The round's shared locks.
pub struct Shared {
    /// Two numbers that every holder keeps equal (one increments both, suspending between).
    pair: Mutex<(u64, u64)>,
    rw: RwLock<(u64, u64)>,
    queue: Mutex<VecDeque<u64>>,
    nonempty: Condvar,
    pushed: AtomicU64,
    popped: AtomicU64,
    sem: Semaphore,
    in_sem: AtomicUsize,
}

impl Shared {
    pub fn new() -> Shared {
        Shared {
            pair: Mutex::new((0, 0)),
            rw: RwLock::new((0, 0)),
            queue: Mutex::new(VecDeque::new()),
            nonempty: Condvar::new(),
            pushed: AtomicU64::new(0),
            popped: AtomicU64::new(0),
            sem: Semaphore::new(PERMITS),
            in_sem: AtomicUsize::new(0),
        }
    }
}

/// At the round's end: what was pushed was popped or is still queued.
pub fn end_of_round(r: &Round) {
    let sh = &r.sync;
    let left = lock(&sh.queue).len() as u64;
    let (pushed, popped) = (
        sh.pushed.load(Ordering::SeqCst),
        sh.popped.load(Ordering::SeqCst),
    );
    check!(
        pushed == popped + left,
        "condvar queue: {pushed} pushed, {popped} popped, {left} left"
    );
    let p = *lock(&sh.pair);
    check!(p.0 == p.1, "the shared pair ended unequal: {p:?}");
    check!(
        sh.sem.available_permits() == PERMITS,
        "the semaphore ended with {} of {PERMITS} permits",
        sh.sem.available_permits()
    );
}

/// Locks, recovering from poisoning (the soak poisons the shared pair now and then).
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

pub fn step(r: &Arc<Round>, rng: &mut Rng) -> Op {
    const OPS: [(Op, u32); 8] = [
        (Op::Mutex, 10),
        (Op::RwLock, 8),
        (Op::Condvar, 10),
        (Op::Semaphore, 6),
        (Op::Barrier, 4),
        (Op::OnceLock, 3),
        (Op::Token, 4),
        (Op::Mutex, 2),
    ];
    let op = OPS[rng.weighted(&OPS.map(|o| o.1))].0;
    match op {
        Op::Mutex => mutex(r, rng),
        Op::RwLock => rwlock(r, rng),
        Op::Condvar => condvar(r, rng),
        Op::Semaphore => semaphore(r, rng),
        Op::Barrier => barrier(r, rng),
        Op::OnceLock => once_lock(r, rng),
        _ => token(r, rng),
    }
    op
}

fn mutex(r: &Arc<Round>, rng: &mut Rng) {
    let sh = &r.sync;
    if rng.chance(5) {
        // Poison it by design: a task panics holding it; the lock still works.
        let r2 = r.clone();
        let h = r.spawn(rng, move || {
            let g = lock(&r2.sync.pair);
            check!(g.0 == g.1, "the shared pair is unequal: {:?}", *g);
            designed_panic("holding the shared Mutex")
        });
        check!(
            h.join("poison").is_panicked(),
            "a poisoning task did not panic"
        );
        let g = match sh.pair.lock() {
            Ok(g) => g, // another actor cleared it meanwhile
            Err(e) => e.into_inner(),
        };
        check!(
            g.0 == g.1,
            "the shared pair is unequal after a poisoning: {:?}",
            *g
        );
        drop(g);
        if rng.chance(50) {
            sh.pair.clear_poison();
        }
        return;
    }
    let mut g = if rng.chance(30) {
        let mut tries = 0;
        loop {
            match sh.pair.try_lock() {
                Ok(g) => break g,
                Err(std::sync::TryLockError::Poisoned(e)) => break e.into_inner(),
                Err(std::sync::TryLockError::WouldBlock) => {
                    tries += 1;
                    if tries > 20 {
                        break lock(&sh.pair);
                    }
                    fibra::Fiber::yield_now();
                }
            }
        }
    } else {
        lock(&sh.pair)
    };
    check!(g.0 == g.1, "the shared pair is unequal: {:?}", *g);
    g.0 += 1;
    if rng.chance(30) {
        work(rng);
    }
    g.1 += 1;
}

fn rwlock(r: &Arc<Round>, rng: &mut Rng) {
    let rw = &r.sync.rw;
    match rng.below(4) {
        0 | 1 => {
            let g = rw.read().unwrap_or_else(|e| e.into_inner());
            check!(g.0 == g.1, "the shared RwLock's pair is unequal: {:?}", *g);
            if rng.chance(30) {
                work(rng);
            }
            check!(
                g.0 == g.1,
                "the shared RwLock's pair changed under a reader"
            );
        }
        2 => {
            let mut g = rw.write().unwrap_or_else(|e| e.into_inner());
            check!(g.0 == g.1, "the shared RwLock's pair is unequal: {:?}", *g);
            g.0 += 1;
            if rng.chance(30) {
                work(rng);
            }
            g.1 += 1;
        }
        _ => {
            if let Ok(g) = rw.try_read() {
                check!(g.0 == g.1, "the shared RwLock's pair is unequal: {:?}", *g);
            }
            if let Ok(mut g) = rw.try_write() {
                g.0 += 1;
                g.1 += 1;
            }
        }
    }
}

fn condvar(r: &Arc<Round>, rng: &mut Rng) {
    let sh = &r.sync;
    match rng.below(3) {
        0 => {
            let n = rng.range(1, 4);
            lock(&sh.queue).extend((0..n).map(|_| rng.next_u64()));
            sh.pushed.fetch_add(n, Ordering::SeqCst);
            if rng.chance(50) {
                sh.nonempty.notify_one();
            } else {
                sh.nonempty.notify_all();
            }
        }
        1 => {
            let d = Duration::from_micros(rng.range(0, 10_000));
            let t0 = Instant::now();
            let g = lock(&sh.queue);
            let (mut g, res) = sh
                .nonempty
                .wait_timeout_while(g, d, |q| q.is_empty())
                .unwrap_or_else(|e| e.into_inner());
            if let Some(_v) = g.pop_front() {
                sh.popped.fetch_add(1, Ordering::SeqCst);
            } else {
                check!(
                    res.timed_out(),
                    "a condvar wait_timeout_while woke to an empty queue"
                );
                check!(
                    t0.elapsed() >= d,
                    "a condvar wait of {d:?} timed out after {:?}",
                    t0.elapsed()
                );
            }
        }
        _ => ping_pong(r, rng),
    }
}

/// Two sides take turns through one condition variable, with untimed waits.
fn ping_pong(r: &Arc<Round>, rng: &mut Rng) {
    let turns = rng.range(1, 20);
    let state = Arc::new((Mutex::new(0u64), Condvar::new()));
    let s2 = state.clone();
    let mut trng = rng.fork();
    let other = r.spawn(rng, move || {
        let (m, cv) = &*s2;
        for t in 0..turns {
            let g = m.lock().expect("never poisoned");
            let mut g = cv.wait_while(g, |n| *n % 2 == 0).expect("never poisoned");
            check!(
                *g == 2 * t + 1,
                "ping-pong: the other side saw {} at turn {t}",
                *g
            );
            *g += 1;
            cv.notify_all();
            drop(g);
            if trng.chance(20) {
                work(&mut trng);
            }
        }
    });
    let (m, cv) = &*state;
    for t in 0..turns {
        let g = m.lock().expect("never poisoned");
        let mut g = cv.wait_while(g, |n| *n % 2 == 1).expect("never poisoned");
        check!(*g == 2 * t, "ping-pong: this side saw {} at turn {t}", *g);
        *g += 1;
        cv.notify_one();
    }
    check!(
        other.join("ping-pong").completed().is_some(),
        "ping-pong: the other side did not complete"
    );
    check!(
        *lock(m) == 2 * turns,
        "ping-pong: {} turns of {}",
        *lock(m),
        2 * turns
    );
}

fn semaphore(r: &Arc<Round>, rng: &mut Rng) {
    let sh = &r.sync;
    let n = rng.range_usize(1, PERMITS);
    let permit = match rng.below(3) {
        0 => Some(sh.sem.acquire_many(n)),
        1 => sh
            .sem
            .acquire_many_timeout(n, Duration::from_micros(rng.range(0, 5000))),
        _ => sh.sem.try_acquire_many(n),
    };
    let Some(permit) = permit else {
        return;
    };
    let inside = sh.in_sem.fetch_add(n, Ordering::SeqCst) + n;
    check!(
        inside <= PERMITS,
        "{inside} permits of a {PERMITS}-permit semaphore are held"
    );
    if rng.chance(50) {
        work(rng);
    }
    sh.in_sem.fetch_sub(n, Ordering::SeqCst);
    drop(permit);
}

/// A barrier of a few tasks and the caller (one leader), or a wait group.
fn barrier(r: &Arc<Round>, rng: &mut Rng) {
    let k = rng.range(1, 5);
    if rng.chance(50) {
        let b = Arc::new(Barrier::new(k as usize + 1));
        let leaders = Arc::new(AtomicU32::new(0));
        let handles: Vec<_> = (0..k)
            .map(|_| {
                let (b, l) = (b.clone(), leaders.clone());
                let mut trng = rng.fork();
                r.spawn(rng, move || {
                    work(&mut trng);
                    if b.wait().is_leader() {
                        l.fetch_add(1, Ordering::SeqCst);
                    }
                })
            })
            .collect();
        if b.wait().is_leader() {
            leaders.fetch_add(1, Ordering::SeqCst);
        }
        for h in handles {
            let _ = h.join("barrier");
        }
        check!(
            leaders.load(Ordering::SeqCst) == 1,
            "a barrier had {} leaders",
            leaders.load(Ordering::SeqCst)
        );
    } else {
        let wg = WaitGroup::new();
        let done = Arc::new(AtomicU32::new(0));
        let handles: Vec<_> = (0..k)
            .map(|_| {
                let (wg, d) = (wg.clone(), done.clone());
                let mut trng = rng.fork();
                r.spawn(rng, move || {
                    work(&mut trng);
                    d.fetch_add(1, Ordering::SeqCst);
                    drop(wg);
                })
            })
            .collect();
        wg.wait();
        check!(
            done.load(Ordering::SeqCst) == k as u32,
            "a wait group returned with {} of {k} done",
            done.load(Ordering::SeqCst)
        );
        for h in handles {
            let _ = h.join("wait group");
        }
    }
}

/// Tasks race to initialise a `OnceLock`: one initialiser runs, all see its value.
fn once_lock(r: &Arc<Round>, rng: &mut Rng) {
    let cell = Arc::new(OnceLock::new());
    let inits = Arc::new(AtomicU32::new(0));
    let k = rng.range(1, 5);
    let handles: Vec<_> = (0..k)
        .map(|i| {
            let (c, n) = (cell.clone(), inits.clone());
            let mut trng = rng.fork();
            r.spawn(rng, move || {
                *c.get_or_init(|| {
                    n.fetch_add(1, Ordering::SeqCst);
                    work(&mut trng);
                    i
                })
            })
        })
        .collect();
    let values: Vec<_> = handles
        .into_iter()
        .filter_map(|h| h.join("OnceLock").completed())
        .collect();
    check!(
        inits.load(Ordering::SeqCst) == 1 && values.iter().all(|v| Some(v) == cell.get()),
        "OnceLock: {} initialisers ran; values {values:?}, the cell {:?}",
        inits.load(Ordering::SeqCst),
        cell.get()
    );
}

/// A tree of cancellation tokens: waiters on the children end when the parent is cancelled.
fn token(r: &Arc<Round>, rng: &mut Rng) {
    let parent = CancellationToken::new();
    let k = rng.range(1, 4);
    let handles: Vec<_> = (0..k)
        .map(|_| {
            let child = parent.child_token();
            let how = rng.below(3);
            r.spawn(rng, move || {
                match how {
                    0 => child.cancelled(),
                    1 => while !child.cancelled_timeout(Duration::from_millis(1)) {},
                    _ => {
                        let never = fibra::sync::never::<u8>();
                        fibra::select! {
                            recv(child) -> r => check!(r.is_ok(), "a token's select arm failed"),
                            recv(never) -> _ => fail("never delivered".into()),
                        }
                    }
                }
                child.is_cancelled()
            })
        })
        .collect();
    work(rng);
    parent.cancel();
    for h in handles {
        check!(
            h.join("token").completed() == Some(true),
            "a child token's waiter did not see the cancel"
        );
    }
}
