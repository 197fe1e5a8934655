//! Executors and continuations at scale and at their edges: ten thousand continuations and
//! chained tasks, continuations submitting to stopped executors, pools shut down with
//! continuations pending, bad pool sizes.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::thread;
use std::time::Duration;

use crate::common::{finish, started, wait_until, LIMIT};
use fibra::exec::{Executor, Inline, Looper, NewThread, ThreadPool};

// ---------------------------------------------------------------------------------------
// 3. exec and continuations
// ---------------------------------------------------------------------------------------

/// 10 000 then/catching/finally on one pending handle, registered from 8 threads while the
/// task completes; then 10 000 more on the finished handle. Every one runs once.
#[test]
fn exec_ten_thousand_continuations_from_many_threads() {
    crate::common::with_deadline(|| {
        let sched = Arc::new(started(2));
        let (tx, rx) = mpsc::channel::<()>();
        let rx = Mutex::new(rx);
        let h = Arc::new(sched.spawn(move || {
            let _ = rx.lock().unwrap().recv_timeout(Duration::from_millis(20));
            fibra::sleep(Duration::from_millis(5));
            7u64
        }));
        let thens = Arc::new(AtomicUsize::new(0));
        let finals = Arc::new(AtomicUsize::new(0));
        let catches = Arc::new(AtomicUsize::new(0));
        let regs: Vec<_> = (0..8)
            .map(|_| {
                let (h, thens, finals, catches) =
                    (h.clone(), thens.clone(), finals.clone(), catches.clone());
                thread::spawn(move || {
                    for _ in 0..1250 {
                        let t = thens.clone();
                        let f = finals.clone();
                        let c = catches.clone();
                        h.then(move |v| {
                            assert_eq!(*v, 7);
                            t.fetch_add(1, Ordering::SeqCst);
                        })
                        .finally(move || {
                            f.fetch_add(1, Ordering::SeqCst);
                        })
                        .catching(move |_| {
                            c.fetch_add(1, Ordering::SeqCst);
                        });
                    }
                })
            })
            .collect();
        drop(tx);
        for r in regs {
            r.join().unwrap();
        }
        assert!(h.wait_timeout(LIMIT));
        wait_until("all continuations", || {
            thens.load(Ordering::SeqCst) == 10_000 && finals.load(Ordering::SeqCst) == 10_000
        });
        for _ in 0..10_000 {
            let t = thens.clone();
            h.then(move |_| {
                t.fetch_add(1, Ordering::SeqCst);
            });
        }
        assert_eq!(thens.load(Ordering::SeqCst), 20_000);
        assert_eq!(catches.load(Ordering::SeqCst), 0);
        sched.stop();
    });
}

/// A chain of 10 000 tasks, each started by the `then` of the previous one, on a Scheduler,
/// a ThreadPool and a Looper: finishes, no stack growth (each runs in its own fiber).
#[test]
fn exec_chain_of_ten_thousand_tasks_via_then() {
    crate::common::with_deadline(|| {
        fn step<E: Executor + Send + Sync + 'static>(
            e: Arc<E>,
            left: usize,
            done: mpsc::Sender<usize>,
        ) {
            let e2 = e.clone();
            let h = e.spawn(move || left);
            h.then(move |&l| {
                if l == 0 {
                    done.send(0).unwrap();
                } else {
                    step(e2, l - 1, done);
                }
            });
        }
        let (tx, rx) = mpsc::channel();
        let s = Arc::new(started(2));
        step(s.clone(), 10_000, tx.clone());
        assert_eq!(rx.recv_timeout(LIMIT).unwrap(), 0);
        let p = Arc::new(ThreadPool::new(2));
        step(p.clone(), 10_000, tx.clone());
        assert_eq!(rx.recv_timeout(LIMIT).unwrap(), 0);
        let l = Arc::new(Looper::new());
        step(l.clone(), 10_000, tx.clone());
        assert_eq!(rx.recv_timeout(LIMIT).unwrap(), 0);
        s.stop();
        p.shutdown();
        l.shutdown(true);
    });
}

/// Inline: a chain of continuations where each `then` is on an already-finished handle runs
/// each at once, nested. 10 000 deep on a thread with an 8 MiB stack.
#[test]
fn exec_inline_chain_ten_thousand_deep() {
    let t = thread::Builder::new()
        .stack_size(64 << 20)
        .spawn(|| {
            fn step(left: usize, count: Arc<AtomicUsize>) {
                let h = Inline.spawn(move || left);
                let c = count.clone();
                h.then(move |&l| {
                    c.fetch_add(1, Ordering::SeqCst);
                    if l > 0 {
                        step(l - 1, c);
                    }
                });
            }
            let count = Arc::new(AtomicUsize::new(0));
            step(10_000, count.clone());
            count.load(Ordering::SeqCst)
        })
        .unwrap();
    assert_eq!(t.join().unwrap(), 10_001);
}

/// A continuation that submits to a stopped executor (Looper, ThreadPool, Scheduler) gets a
/// cancelled handle; `execute` drops the job (its captures dropped once).
#[test]
fn exec_continuation_submitting_to_stopped_executors() {
    crate::common::with_deadline(|| {
        let looper = Arc::new(Looper::new());
        let pool = Arc::new(ThreadPool::new(1));
        let sched = Arc::new(started(1));
        looper.shutdown(true);
        pool.shutdown();
        sched.stop();
        let host = started(1);
        let drops = Arc::new(AtomicUsize::new(0));
        let (tx, rx) = mpsc::channel();
        let (l, p, s, d) = (looper.clone(), pool.clone(), sched.clone(), drops.clone());
        let h = host.spawn(|| 1);
        h.then(move |_| {
            let a = l.spawn(|| 1).join().unwrap_err().is_cancelled();
            let b = p.spawn(|| 1).join().unwrap_err().is_cancelled();
            let c = Executor::spawn(&*s, || 1)
                .join()
                .unwrap_err()
                .is_cancelled();
            let c1 = crate::common::Counted(d.clone());
            let c2 = crate::common::Counted(d.clone());
            let c3 = crate::common::Counted(d.clone());
            l.execute(Box::new(move || drop(c1)));
            p.execute(Box::new(move || drop(c2)));
            s.execute(Box::new(move || drop(c3)));
            tx.send((a, b, c)).unwrap();
        });
        assert_eq!(rx.recv_timeout(LIMIT).unwrap(), (true, true, true));
        assert_eq!(drops.load(Ordering::SeqCst), 3);
        host.stop();
    });
}

/// Looper::shutdown(false) with 1 000 queued jobs whose handles have `catching`: each
/// catching sees a cancellation and, as documented, runs inside a fiber.
#[test]
fn exec_looper_discard_runs_catching_in_a_fiber() {
    crate::common::with_deadline(|| {
        let looper = Looper::new();
        let (gate_tx, gate_rx) = mpsc::channel::<()>();
        let (running_tx, running) = mpsc::channel::<()>();
        let blocker = looper.spawn(move || {
            running_tx.send(()).unwrap();
            // Blocks the looper thread so the rest stays queued.
            let _ = gate_rx.recv_timeout(Duration::from_secs(2));
        });
        // Started before the shutdown, so it is not among the discarded.
        running.recv_timeout(LIMIT).unwrap();
        let in_fiber = Arc::new(AtomicUsize::new(0));
        let caught = Arc::new(AtomicUsize::new(0));
        let handles: Vec<_> = (0..1000)
            .map(|_| {
                let h = looper.spawn(|| ());
                let (f, c) = (in_fiber.clone(), caught.clone());
                h.catching(move |e| {
                    assert!(e.is_cancelled());
                    c.fetch_add(1, Ordering::SeqCst);
                    if fibra::Fiber::current().is_some() {
                        f.fetch_add(1, Ordering::SeqCst);
                    }
                });
                h
            })
            .collect();
        let t = thread::spawn(move || {
            thread::sleep(Duration::from_millis(50));
            drop(gate_tx);
        });
        looper.shutdown(false);
        t.join().unwrap();
        finish(blocker);
        for h in handles {
            assert!(h.join().unwrap_err().is_cancelled());
        }
        assert_eq!(caught.load(Ordering::SeqCst), 1000);
        assert_eq!(
            in_fiber.load(Ordering::SeqCst),
            1000,
            "catching ran outside a fiber"
        );
    });
}

/// A ThreadPool shut down (from another thread) while a task with pending continuations is
/// parked: shutdown waits for it, the continuations run, shutdown returns.
#[test]
fn exec_pool_shutdown_with_pending_continuations() {
    crate::common::with_deadline(|| {
        let pool = Arc::new(ThreadPool::new(2));
        let (tx, rx) = mpsc::channel::<u32>();
        let rx = Arc::new(Mutex::new(rx));
        let r2 = rx.clone();
        let h = pool.spawn(move || {
            // Park, not block: fibra's channels would do, this uses an unblock.
            fibra::unblock(|| r2.lock().unwrap().recv().unwrap())
        });
        let ran = Arc::new(AtomicUsize::new(0));
        for _ in 0..100 {
            let r = ran.clone();
            h.then(move |v| {
                assert_eq!(*v, 9);
                // A continuation that spawns on the pool being shut down: may be refused
                // (cancelled) or run, never hang.
                r.fetch_add(1, Ordering::SeqCst);
            });
        }
        let p2 = pool.clone();
        let stopper = thread::spawn(move || p2.shutdown());
        thread::sleep(Duration::from_millis(50));
        assert!(!stopper.is_finished());
        tx.send(9).unwrap();
        stopper.join().unwrap();
        assert_eq!(ran.load(Ordering::SeqCst), 100);
        assert_eq!(h.join().unwrap(), 9);
    });
}

/// NewThread.spawn from inside continuations and fibers: a thousand of them, each on its own
/// thread, all joined; threads do not pile up afterwards.
#[test]
fn exec_new_thread_spawns_from_continuations() {
    crate::common::with_deadline(|| {
        let sched = started(2);
        let (tx, rx) = mpsc::channel();
        for i in 0..200u64 {
            let tx = tx.clone();
            sched.spawn(move || i).then(move |&i| {
                let h = NewThread.spawn(move || {
                    fibra::sleep(Duration::from_millis(1));
                    i * 2
                });
                tx.send(h.join().unwrap()).unwrap();
            });
        }
        drop(tx);
        let mut got: Vec<u64> = rx.iter().take(200).collect();
        got.sort();
        assert_eq!(got, (0..200).map(|i| i * 2).collect::<Vec<_>>());
        sched.stop();
    });
}

/// Executors' constructors: invalid sizes are errors (try_new), never a hang.
#[test]
fn exec_thread_pool_bad_sizes() {
    assert!(ThreadPool::try_new(0).is_err());
    assert!(ThreadPool::try_new(fibra::MAX_THREADS + 1).is_err());
    let p = ThreadPool::try_new(1).unwrap();
    assert_eq!(p.threads(), 1);
    p.shutdown();
    p.shutdown();
    assert!(p.spawn(|| 1).join().unwrap_err().is_cancelled());
}
