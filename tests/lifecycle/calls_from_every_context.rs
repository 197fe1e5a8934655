//! A "careless user" matrix: each public blocking or lifecycle call, made from each context
//! (plain thread, after every scheduler is gone, a scheduled fiber, a standalone fiber on a
//! plain thread and inside a scheduled fiber, a continuation, a fiber of a stopping scheduler,
//! a destructor in a panic unwind, a destructor in a cancellation unwind, with a fibra lock
//! held, inside `coop::unconstrained`). Each cell runs with a deadline; a cell either works
//! or fails with the panic the documentation promises.

use std::io::{Read, Write};
use std::panic::{self, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use crate::common::panic_message;
use fibra::sync::{
    broadcast, mpmc, oneshot, Barrier, CancellationToken, Condvar, OnceLock, RwLock, Semaphore,
    WaitGroup,
};
use fibra::{Fiber, FiberState, ParkResult, Scheduler, Unparker};

/// Per cell.
const CELL_LIMIT: Duration = Duration::from_secs(10);

fn later(ms: u64, f: impl FnOnce() + Send + 'static) -> thread::JoinHandle<()> {
    thread::spawn(move || {
        thread::sleep(Duration::from_millis(ms));
        f()
    })
}

fn sched(threads: usize) -> Arc<Scheduler> {
    let s = Scheduler::builder().threads(threads).build().unwrap();
    s.start();
    Arc::new(s)
}

/// What the context offers the call: the scheduler whose fiber runs it, if any.
#[derive(Clone)]
struct Env {
    sched: Option<Arc<Scheduler>>,
}

type Op = fn(&Env);

// ----------------------------------------------------------------------------- the calls

fn op_sleep(_: &Env) {
    let t = Instant::now();
    fibra::sleep(Duration::from_millis(3));
    assert!(t.elapsed() >= Duration::from_millis(3), "sleep too short");
    fibra::sleep(Duration::ZERO);
    fibra::sleep_until(Instant::now());
}

fn op_park(_: &Env) {
    let slot: Arc<Mutex<Option<Unparker>>> = Arc::default();
    let s = slot.clone();
    let t = thread::spawn(move || loop {
        if let Some(u) = s.lock().unwrap().take() {
            thread::sleep(Duration::from_millis(2));
            u.unpark();
            u.unpark();
            return;
        }
        thread::sleep(Duration::from_millis(1));
    });
    fibra::park(|u| *slot.lock().unwrap() = Some(u));
    t.join().unwrap();
    let r = fibra::park_timeout(Instant::now() + Duration::from_millis(3), drop);
    assert_eq!(r, ParkResult::TimedOut);
    assert_eq!(
        fibra::park_timeout(Instant::now(), drop),
        ParkResult::TimedOut
    );
    // Unparked by register itself.
    fibra::park(|u| u.unpark());
}

fn op_yield(_: &Env) {
    for _ in 0..3 {
        Fiber::yield_now();
    }
}

fn op_mutex(_: &Env) {
    let m = Arc::new(fibra::sync::Mutex::new(0u32));
    let (tx, rx) = mpsc::channel();
    let m2 = m.clone();
    let t = thread::spawn(move || {
        let mut g = m2.lock().unwrap();
        tx.send(()).unwrap();
        thread::sleep(Duration::from_millis(5));
        *g += 1;
    });
    rx.recv().unwrap();
    *m.lock().unwrap() += 1;
    t.join().unwrap();
    assert_eq!(*m.lock().unwrap(), 2);
    assert!(m.try_lock().is_ok());
}

fn op_rwlock(_: &Env) {
    let l = Arc::new(RwLock::new(0u32));
    let (tx, rx) = mpsc::channel();
    let l2 = l.clone();
    let t = thread::spawn(move || {
        let mut g = l2.write().unwrap();
        tx.send(()).unwrap();
        thread::sleep(Duration::from_millis(5));
        *g += 1;
    });
    rx.recv().unwrap();
    assert_eq!(*l.read().unwrap(), 1);
    *l.write().unwrap() += 1;
    t.join().unwrap();
    assert_eq!(*l.read().unwrap(), 2);
}

fn op_condvar(_: &Env) {
    let pair = Arc::new((fibra::sync::Mutex::new(false), Condvar::new()));
    let p = pair.clone();
    let t = later(3, move || {
        *p.0.lock().unwrap() = true;
        p.1.notify_all();
    });
    let mut g = pair.0.lock().unwrap();
    while !*g {
        g = pair.1.wait(g).unwrap();
    }
    drop(g);
    let g = pair.0.lock().unwrap();
    let (_g, r) = pair.1.wait_timeout(g, Duration::from_millis(2)).unwrap();
    assert!(r.timed_out());
    t.join().unwrap();
}

fn op_semaphore(_: &Env) {
    let s = Arc::new(Semaphore::new(0));
    let s2 = s.clone();
    let t = later(3, move || s2.release(1));
    drop(s.acquire());
    assert!(s.acquire_timeout(Duration::ZERO).is_some());
    t.join().unwrap();
}

fn op_barrier(_: &Env) {
    let b = Arc::new(Barrier::new(2));
    let b2 = b.clone();
    let t = thread::spawn(move || b2.wait().is_leader());
    let me = b.wait().is_leader();
    assert!(me != t.join().unwrap());
    assert!(Barrier::new(2)
        .wait_timeout(Duration::from_millis(2))
        .is_none());
}

fn op_waitgroup(_: &Env) {
    let wg = WaitGroup::new();
    let w2 = wg.clone();
    let t = later(3, move || drop(w2));
    wg.wait();
    t.join().unwrap();
}

fn op_once_lock(_: &Env) {
    let o = Arc::new(OnceLock::new());
    let o2 = o.clone();
    let (tx, rx) = mpsc::channel();
    let t = thread::spawn(move || {
        *o2.get_or_init(|| {
            tx.send(()).unwrap();
            thread::sleep(Duration::from_millis(5));
            7u32
        })
    });
    rx.recv().unwrap();
    assert_eq!(*o.get_or_init(|| 8), 7);
    assert_eq!(t.join().unwrap(), 7);
}

fn op_oneshot(_: &Env) {
    let (tx, mut rx) = oneshot::channel::<u32>();
    let t = later(3, move || tx.send(5).unwrap());
    assert_eq!(rx.recv_timeout(Duration::MAX), Ok(5));
    t.join().unwrap();
}

fn op_mpsc(_: &Env) {
    let (tx, rx) = fibra::sync::mpsc::channel::<u32>();
    assert!(rx.recv_timeout(Duration::ZERO).is_err());
    let t = later(3, move || {
        tx.send(1).unwrap();
        tx.send(2).unwrap();
    });
    assert_eq!(rx.recv(), Ok(1));
    assert_eq!(rx.recv_timeout(Duration::MAX), Ok(2));
    assert!(rx.recv().is_err());
    t.join().unwrap();
}

fn op_mpmc(_: &Env) {
    let (tx, rx) = mpmc::sync_channel::<u32>(1);
    tx.send(1).unwrap();
    let t = later(3, move || {
        assert_eq!(rx.recv(), Ok(1));
        assert_eq!(rx.recv(), Ok(2));
    });
    tx.send(2).unwrap(); // waits for the thread to take 1
    t.join().unwrap();
}

fn op_broadcast(_: &Env) {
    let (tx, mut rx) = broadcast::channel::<u32>(4);
    let t = later(3, move || {
        tx.send(9).unwrap();
    });
    assert_eq!(rx.recv(), Ok(9));
    t.join().unwrap();
}

fn op_select(_: &Env) {
    let (tx1, rx1) = fibra::sync::mpsc::channel::<u32>();
    let (_tx2, rx2) = fibra::sync::mpsc::channel::<u32>();
    let got = fibra::select! {
        recv(rx1) -> m => m.ok(),
        recv(rx2) -> m => m.ok(),
        default(Duration::from_millis(2)) => None,
    };
    assert_eq!(got, None);
    let t = later(3, move || tx1.send(4).unwrap());
    let got = fibra::select! {
        recv(rx1) -> m => m.ok(),
        recv(rx2) -> m => m.ok(),
    };
    assert_eq!(got, Some(4));
    t.join().unwrap();
}

fn op_token(_: &Env) {
    let tok = CancellationToken::new();
    let child = tok.child_token();
    let t2 = tok.clone();
    let t = later(3, move || t2.cancel());
    child.cancelled();
    assert!(tok.cancelled_timeout(Duration::ZERO));
    t.join().unwrap();
}

fn op_tcp(_: &Env) {
    let l = fibra::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    let t = later(3, move || {
        let mut c = std::net::TcpStream::connect(addr).unwrap();
        c.write_all(b"ping").unwrap();
        let mut b = [0u8; 4];
        c.read_exact(&mut b).unwrap();
        assert_eq!(&b, b"pong");
    });
    let (mut s, _) = l.accept().unwrap();
    let mut b = [0u8; 4];
    s.read_exact(&mut b).unwrap();
    assert_eq!(&b, b"ping");
    s.write_all(b"pong").unwrap();
    t.join().unwrap();
    // connect side
    let sl = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = sl.local_addr().unwrap();
    let t = thread::spawn(move || {
        let (mut c, _) = sl.accept().unwrap();
        thread::sleep(Duration::from_millis(3));
        c.write_all(b"x").unwrap();
    });
    let mut c = fibra::net::TcpStream::connect(addr).unwrap();
    let mut b = [0u8; 1];
    c.read_exact(&mut b).unwrap();
    t.join().unwrap();
}

fn op_udp(_: &Env) {
    let a = fibra::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    let addr = a.local_addr().unwrap();
    let t = later(3, move || {
        let s = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        s.send_to(b"hi", addr).unwrap();
    });
    let mut b = [0u8; 8];
    let (n, _) = a.recv_from(&mut b).unwrap();
    assert_eq!(&b[..n], b"hi");
    t.join().unwrap();
}

fn op_fs(_: &Env) {
    use std::sync::atomic::{AtomicUsize, Ordering};
    static N: AtomicUsize = AtomicUsize::new(0);
    let p = std::env::temp_dir().join(format!(
        "fibra-ctx-{}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    ));
    fibra::fs::write(&p, b"abc").unwrap();
    assert_eq!(fibra::fs::read(&p).unwrap(), b"abc");
    let mut f = fibra::fs::File::open(&p).unwrap();
    let mut s = String::new();
    f.read_to_string(&mut s).unwrap();
    assert_eq!(s, "abc");
    fibra::fs::remove_file(&p).unwrap();
}

fn op_unblock(_: &Env) {
    assert_eq!(
        fibra::unblock(|| {
            thread::sleep(Duration::from_millis(2));
            7
        }),
        7
    );
}

fn op_future(_: &Env) {
    let (tx, rx) = oneshot::channel::<u32>();
    let t = later(3, move || tx.send(3).unwrap());
    let v = fibra::future::block_on(async move { rx.await.unwrap() + 1 });
    assert_eq!(v, 4);
    t.join().unwrap();
}

fn op_exec(_: &Env) {
    use fibra::exec::{Executor, Inline, Looper, NewThread, ThreadPool};
    assert_eq!(Inline.spawn(|| 1).join().unwrap(), 1);
    assert_eq!(NewThread.spawn(|| 2).join().unwrap(), 2);
    let p = ThreadPool::new(1);
    assert_eq!(p.spawn(|| 3).join().unwrap(), 3);
    p.shutdown();
    let l = Looper::new();
    assert_eq!(l.spawn(|| 4).join().unwrap(), 4);
    l.shutdown(true);
}

/// A second, private scheduler: its whole lifecycle.
fn op_other_sched(_: &Env) {
    let s = Scheduler::builder().threads(2).build().unwrap();
    s.start();
    s.start();
    assert_eq!(s.block_on(|| 5), 5);
    assert_eq!(s.submit(|| 6, Some(1)).unwrap().join().unwrap(), 6);
    assert_eq!(s.submit(|| 7, None).unwrap().join().unwrap(), 7);
    assert_eq!(s.spawn(|| 8).join().unwrap(), 8);
    let _ = s.dump();
    let _ = s.metrics();
    // A parked task: wait_timeout ZERO, cancel, then continuations after the end.
    let h = s.spawn(|| fibra::park(drop));
    assert!(!h.wait_timeout(Duration::ZERO));
    h.cancel();
    assert!(h.wait_timeout(Duration::MAX));
    let (tx, rx) = mpsc::channel();
    let tx2 = tx.clone();
    h.catching(move |e| tx.send(e.is_cancelled()).unwrap())
        .finally(move || tx2.send(true).unwrap());
    assert!(rx.recv_timeout(CELL_LIMIT).unwrap());
    assert!(rx.recv_timeout(CELL_LIMIT).unwrap());
    assert!(h.join().unwrap_err().is_cancelled());
    // A JoinSet on it.
    let mut set = fibra::JoinSet::new();
    for i in 0..3u32 {
        set.spawn_on(&s, move || i);
    }
    let mut got: Vec<u32> = set.join_all().into_iter().map(|r| r.unwrap()).collect();
    got.sort();
    assert_eq!(got, [0, 1, 2]);
    let parked = s.spawn(|| fibra::park(drop));
    assert_eq!(s.stop_timeout(Duration::from_millis(10)), 1);
    assert!(parked.join().unwrap_err().is_cancelled());
    s.stop();
    assert_eq!(s.stop_timeout(Duration::MAX), 0);
    assert!(s.submit(|| (), None).is_err());
    assert!(s.spawn(|| ()).join().unwrap_err().is_cancelled());
    // block_on on a stopped scheduler runs on the caller.
    assert_eq!(s.block_on(|| 9), 9);
}

/// Calls that need a fiber of a scheduler: `fibra::spawn`, `scope`, `JoinSet::spawn`; and
/// `block_on`/`submit` on the context's own scheduler.
fn op_ctx_spawn(_: &Env) {
    assert_eq!(fibra::spawn(|| 3).join().unwrap(), 3);
}

fn op_ctx_scope(_: &Env) {
    let data = [1u64, 2, 3];
    let sum = fibra::scope(|s| {
        let a = s.spawn(|| data[..2].iter().sum::<u64>());
        let b = s.spawn(|| data[2]);
        a.join().unwrap() + b.join().unwrap()
    });
    assert_eq!(sum, 6);
}

fn op_ctx_joinset(_: &Env) {
    let mut set = fibra::JoinSet::new();
    set.spawn(|| 1u32);
    set.spawn(|| 2u32);
    let mut n = 0;
    while let Some(r) = set.join_next() {
        n += r.unwrap();
    }
    assert_eq!(n, 3);
}

fn op_ctx_block_on(env: &Env) {
    let s = env.sched.as_ref().expect("a scheduler");
    assert_eq!(s.block_on(|| 11), 11);
}

fn op_ctx_submit(env: &Env) {
    let s = env.sched.as_ref().expect("a scheduler");
    assert_eq!(s.submit(|| 12, None).unwrap().join().unwrap(), 12);
    assert_eq!(s.submit(|| 13, Some(0)).unwrap().join().unwrap(), 13);
    let h = s.spawn(|| 14);
    assert!(h.wait_timeout(Duration::MAX));
    assert_eq!(h.join().unwrap(), 14);
    let _ = s.dump();
    let _ = s.metrics();
}

/// A standalone fiber made and driven here: one that panics, one dropped while suspended
/// with a destructor that waits (sleeps, locks a contended fibra mutex).
fn op_standalone(_: &Env) {
    let mut f = Fiber::new(|| panic!("standalone boom"));
    assert_eq!(f.resume(), FiberState::Panicked);
    assert!(f.take_panic().is_some());
    let ran = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let r = ran.clone();
    let mut f = Fiber::new(move || {
        struct W(Arc<std::sync::atomic::AtomicBool>);
        impl Drop for W {
            fn drop(&mut self) {
                fibra::sleep(Duration::from_millis(2));
                let m = Arc::new(fibra::sync::Mutex::new(()));
                let m2 = m.clone();
                let g = m.lock().unwrap();
                let t = thread::spawn(move || drop(m2.lock().unwrap()));
                thread::sleep(Duration::from_millis(2));
                drop(g);
                t.join().unwrap();
                self.0.store(true, std::sync::atomic::Ordering::SeqCst);
            }
        }
        let _w = W(r);
        Fiber::yield_now();
        unreachable!("resumed after the drop");
    });
    assert_eq!(f.resume(), FiberState::Suspended);
    drop(f);
    assert!(ran.load(std::sync::atomic::Ordering::SeqCst));
}

/// (name, op, needs a fiber of a scheduler)
const OPS: &[(&str, Op, bool)] = &[
    ("sleep", op_sleep, false),
    ("park", op_park, false),
    ("yield_now", op_yield, false),
    ("mutex", op_mutex, false),
    ("rwlock", op_rwlock, false),
    ("condvar", op_condvar, false),
    ("semaphore", op_semaphore, false),
    ("barrier", op_barrier, false),
    ("waitgroup", op_waitgroup, false),
    ("once_lock", op_once_lock, false),
    ("oneshot", op_oneshot, false),
    ("mpsc", op_mpsc, false),
    ("mpmc", op_mpmc, false),
    ("broadcast", op_broadcast, false),
    ("select", op_select, false),
    ("token", op_token, false),
    ("tcp", op_tcp, false),
    ("udp", op_udp, false),
    ("fs", op_fs, false),
    ("unblock", op_unblock, false),
    ("future_block_on", op_future, false),
    ("exec", op_exec, false),
    ("other_sched", op_other_sched, false),
    ("standalone", op_standalone, false),
    ("ctx_spawn", op_ctx_spawn, true),
    ("ctx_scope", op_ctx_scope, true),
    ("ctx_joinset", op_ctx_joinset, true),
];

/// Ops that use the context's own scheduler (only where the context has one).
const SCHED_OPS: &[(&str, Op)] = &[
    ("ctx_block_on", op_ctx_block_on),
    ("ctx_submit", op_ctx_submit),
];

// ---------------------------------------------------------------------------- the contexts

type Outcome = Result<(), String>;

fn catch(op: Op, env: &Env) -> Outcome {
    panic::catch_unwind(AssertUnwindSafe(|| op(env)))
        .map_err(|p| panic_message(&*p).unwrap_or_else(|| "<non-string panic>".into()))
}

/// Runs `body` (which reports through the sender) on a fresh thread; the outcome, or a hang.
fn deadline(body: impl FnOnce(mpsc::Sender<Outcome>) + Send + 'static) -> Outcome {
    let (tx, rx) = mpsc::channel();
    let t2 = tx.clone();
    thread::spawn(move || {
        body(tx);
        drop(t2);
    });
    match rx.recv_timeout(CELL_LIMIT) {
        Ok(o) => o,
        Err(mpsc::RecvTimeoutError::Timeout) => Err("HANG".into()),
        Err(mpsc::RecvTimeoutError::Disconnected) => Err("no outcome reported".into()),
    }
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum Ctx {
    PlainThread,
    ScheduledFiber,
    StandaloneOnThread,
    StandaloneInFiber,
    Continuation,
    StoppingFiber,
    DropInPanic,
    DropInCancel,
    GuardHeld,
    Unconstrained,
}

impl Ctx {
    fn has_sched_fiber(self) -> bool {
        !matches!(
            self,
            Ctx::PlainThread | Ctx::StandaloneOnThread | Ctx::StandaloneInFiber
        )
    }
}

/// Runs `op` in a fiber of a fresh scheduler (`workers` workers), wrapped by `wrap`.
fn in_fiber(workers: usize, op: Op, wrap: fn(Op, &Env) -> Outcome) -> Outcome {
    deadline(move |tx| {
        let s = sched(workers);
        let env = Env {
            sched: Some(s.clone()),
        };
        let h = s.spawn(move || wrap(op, &env));
        let o = h
            .join()
            .unwrap_or_else(|e| Err(format!("task failed: {e}")));
        s.stop();
        let _ = tx.send(o);
    })
}

fn run_cell(ctx: Ctx, op: Op) -> Outcome {
    match ctx {
        Ctx::PlainThread => deadline(move |tx| {
            let _ = tx.send(catch(op, &Env { sched: None }));
        }),
        Ctx::ScheduledFiber => in_fiber(1, op, catch),
        Ctx::StandaloneOnThread => deadline(move |tx| {
            let out: Arc<Mutex<Option<Outcome>>> = Arc::default();
            let o = out.clone();
            let mut f = Fiber::new(move || {
                *o.lock().unwrap() = Some(catch(op, &Env { sched: None }));
            });
            while f.resume() == FiberState::Suspended {}
            let r = out.lock().unwrap().take();
            let _ = tx.send(r.unwrap_or_else(|| Err("no outcome".into())));
        }),
        Ctx::StandaloneInFiber => in_fiber(1, op, |op, env| {
            let out: Arc<Mutex<Option<Outcome>>> = Arc::default();
            let o = out.clone();
            let env = env.clone();
            let mut f = Fiber::new(move || {
                *o.lock().unwrap() = Some(catch(op, &env));
            });
            while f.resume() == FiberState::Suspended {}
            let r = out.lock().unwrap().take();
            r.unwrap_or_else(|| Err("no outcome".into()))
        }),
        Ctx::Continuation => deadline(move |tx| {
            let s = sched(1);
            let env = Env {
                sched: Some(s.clone()),
            };
            // The task ends only once the first continuation is registered: one registered
            // before the end (run in the task's fiber), one after it (run by the caller).
            // Without the gate a loaded machine could end the task first.
            let gate = Arc::new(AtomicBool::new(false));
            let g = gate.clone();
            let h = s.spawn(move || {
                while !g.load(Ordering::SeqCst) {
                    fibra::sleep(Duration::from_millis(1));
                }
                1u32
            });
            let tx2 = tx.clone();
            let env2 = env.clone();
            h.then(move |_| {
                let _ = tx2.send(catch(op, &env2).map_err(|e| format!("then: {e}")));
            });
            gate.store(true, Ordering::SeqCst);
            let (dtx, drx) = mpsc::channel();
            h.then(move |_| dtx.send(()).unwrap());
            drx.recv().unwrap();
            let (ftx, frx) = mpsc::channel();
            h.finally(move || {
                let _ = ftx.send(catch(op, &env).map_err(|e| format!("finally: {e}")));
            });
            let second = frx.recv().unwrap();
            let _ = tx.send(second);
            s.stop();
        }),
        Ctx::StoppingFiber => deadline(move |tx| {
            let s = sched(1);
            let env = Env {
                sched: Some(s.clone()),
            };
            let slot: Arc<Mutex<Option<Unparker>>> = Arc::default();
            let sl = slot.clone();
            let h = s.spawn(move || {
                fibra::park(|u| *sl.lock().unwrap() = Some(u));
                catch(op, &env)
            });
            crate::common::wait_until("parked", || slot.lock().unwrap().is_some());
            let s2 = s.clone();
            let stopper = thread::spawn(move || s2.stop());
            thread::sleep(Duration::from_millis(20));
            slot.lock().unwrap().take().unwrap().unpark();
            let o = h
                .join()
                .unwrap_or_else(|e| Err(format!("task failed: {e}")));
            stopper.join().unwrap();
            let _ = tx.send(o);
        }),
        Ctx::DropInPanic => in_fiber(1, op, |op, env| {
            struct D(Op, Env, Arc<Mutex<Option<Outcome>>>);
            impl Drop for D {
                fn drop(&mut self) {
                    *self.2.lock().unwrap() = Some(catch(self.0, &self.1));
                }
            }
            let out: Arc<Mutex<Option<Outcome>>> = Arc::default();
            let o = out.clone();
            let env = env.clone();
            let r = panic::catch_unwind(AssertUnwindSafe(move || {
                let _d = D(op, env, o);
                panic!("boom");
            }));
            assert!(r.is_err());
            let r = out.lock().unwrap().take();
            r.unwrap_or_else(|| Err("no outcome".into()))
        }),
        Ctx::DropInCancel => deadline(move |tx| {
            struct D(Op, Env, mpsc::Sender<Outcome>);
            impl Drop for D {
                fn drop(&mut self) {
                    let _ = self.2.send(catch(self.0, &self.1));
                }
            }
            let s = sched(1);
            let env = Env {
                sched: Some(s.clone()),
            };
            let (ptx, prx) = mpsc::channel();
            let tx2 = tx.clone();
            let h = s.spawn(move || {
                let _d = D(op, env, tx2);
                fibra::park(|u| ptx.send(u).unwrap());
            });
            let _u = prx.recv().unwrap();
            h.cancel();
            let r = h.join();
            if !r.as_ref().is_err_and(|e| e.is_cancelled()) {
                let _ = tx.send(Err(format!("cancelled task ended {:?}", r.err())));
            }
            s.stop();
        }),
        Ctx::GuardHeld => in_fiber(1, op, |op, env| {
            let m = fibra::sync::Mutex::new(());
            let _g = m.lock().unwrap();
            catch(op, env)
        }),
        Ctx::Unconstrained => in_fiber(1, op, |op, env| {
            fibra::coop::unconstrained(|| catch(op, env))
        }),
    }
}

fn check(ctx: Ctx, name: &str, needs: bool, o: Outcome, failures: &mut Vec<String>) {
    let ok = match (&o, needs && !ctx.has_sched_fiber()) {
        (Ok(()), false) => true,
        // Documented: panics outside a fiber of a scheduler.
        (Err(m), true) => m.contains("must be called from a fiber"),
        _ => false,
    };
    if !ok {
        failures.push(format!("{ctx:?} / {name}: {o:?}"));
    }
}

fn matrix(ctxs: &[Ctx]) {
    let mut failures = Vec::new();
    let mut passed = 0;
    for &ctx in ctxs {
        for &(name, op, needs) in OPS {
            let o = run_cell(ctx, op);
            let before = failures.len();
            check(ctx, name, needs, o, &mut failures);
            passed += usize::from(failures.len() == before);
        }
        if ctx.has_sched_fiber() {
            for &(name, op) in SCHED_OPS {
                let o = run_cell(ctx, op);
                let before = failures.len();
                check(ctx, name, false, o, &mut failures);
                passed += usize::from(failures.len() == before);
            }
        }
    }
    eprintln!("{passed} cells passed");
    assert!(
        failures.is_empty(),
        "failing cells:\n{}",
        failures.join("\n")
    );
}

#[test]
fn every_call_returns_or_panics_as_documented_on_a_plain_thread_and_in_a_scheduled_fiber() {
    matrix(&[Ctx::PlainThread, Ctx::ScheduledFiber]);
}

#[test]
fn every_call_returns_or_panics_as_documented_in_a_standalone_fiber_on_a_thread() {
    matrix(&[Ctx::StandaloneOnThread]);
}

#[test]
fn every_call_returns_or_panics_as_documented_in_a_continuation_and_a_fiber_of_a_stopping_scheduler(
) {
    matrix(&[Ctx::Continuation, Ctx::StoppingFiber]);
}

#[test]
fn every_call_returns_or_panics_as_documented_in_destructors_of_a_panic_or_cancellation() {
    matrix(&[Ctx::DropInPanic, Ctx::DropInCancel]);
}

#[test]
fn every_call_returns_or_panics_as_documented_with_a_fibra_lock_held_and_in_unconstrained() {
    matrix(&[Ctx::GuardHeld, Ctx::Unconstrained]);
}

/// (b): in a child process, after the only scheduler was stopped and dropped, every call
/// from a plain thread and from a standalone fiber on it.
#[test]
fn every_call_returns_or_panics_as_documented_after_every_scheduler_was_dropped() {
    crate::common::child_ok(|| {
        let s = sched(2);
        assert_eq!(s.block_on(|| 1), 1);
        s.stop();
        drop(s);
        matrix(&[Ctx::PlainThread, Ctx::StandaloneOnThread]);
    });
}

/// (d2): a standalone fiber resumed from inside a scheduled fiber (one worker). The
/// documentation of `fibra::spawn` (and of `scope`, `JoinSet::spawn`) promises a panic "in a
/// standalone Fiber"; every other call blocks the thread, which is documented.
#[test]
fn every_call_returns_or_panics_as_documented_in_a_standalone_fiber_inside_a_scheduled_fiber() {
    matrix(&[Ctx::StandaloneInFiber]);
}

/// The short form of the cells above that fail: `fibra::spawn`, `fibra::scope` and
/// `JoinSet::spawn` in a standalone `Fiber` that a scheduled fiber resumes. Their docs
/// promise a panic there ("Outside a fiber of a Scheduler (on a plain thread, in a
/// standalone Fiber), with a message that says so"); instead they spawn onto the worker's
/// local slot, and the standalone fiber's join then blocks the one worker that could run
/// the task (the matrix cells report HANG).
#[test]
fn scheduler_only_calls_in_a_standalone_fiber_inside_a_scheduled_fiber_panic() {
    use std::cell::RefCell;
    use std::rc::Rc;
    let s = sched(1);
    let h = s.spawn(|| {
        let verdicts: Rc<RefCell<Vec<String>>> = Rc::default();
        let v = verdicts.clone();
        let mut f = Fiber::new(move || {
            let say = |what: &str, r: Result<(), Box<dyn std::any::Any + Send>>| {
                v.borrow_mut().push(match r {
                    Ok(()) => format!("{what}: no panic"),
                    Err(p) => format!("{what}: panicked: {:?}", panic_message(&*p)),
                })
            };
            let r = panic::catch_unwind(|| drop(fibra::spawn(|| 1)));
            say("fibra::spawn", r);
            let r = panic::catch_unwind(|| fibra::scope(|_| ()));
            say("fibra::scope", r);
            let r = panic::catch_unwind(|| {
                let mut set = fibra::JoinSet::new();
                set.spawn(|| 1);
                drop(set);
            });
            say("JoinSet::spawn", r);
        });
        assert_eq!(f.resume(), FiberState::Done);
        let v = verdicts.borrow().clone();
        v
    });
    let verdicts = h.join().unwrap();
    s.stop();
    for v in &verdicts {
        eprintln!("{v}");
    }
    assert!(
        verdicts
            .iter()
            .all(|v| v.contains("must be called from a fiber")),
        "documented panics missing: {verdicts:#?}"
    );
}

/// `use_caller`: the building thread runs worker 0 inside `block_on`. The same `block_on`
/// called from a standalone `Fiber` that the building thread resumes (a plain thread's
/// standalone fiber, context (d1)) must still drive worker 0 (or fail clearly); with one
/// worker nobody else can run `f`.
#[test]
fn use_caller_block_on_from_a_standalone_fiber_on_the_building_thread() {
    let o = deadline(|tx| {
        let s = Scheduler::builder()
            .threads(1)
            .use_caller(true)
            .build()
            .unwrap();
        assert_eq!(s.block_on(|| 1), 1, "plain block_on");
        let s = Rc::new(s);
        let s2 = s.clone();
        let mut f = Fiber::new(move || {
            let _ = tx.send(catch_any(|| assert_eq!(s2.block_on(|| 2), 2)));
        });
        f.resume();
    });
    assert_eq!(o, Ok(()));
}

use std::rc::Rc;

fn catch_any(f: impl FnOnce()) -> Outcome {
    panic::catch_unwind(AssertUnwindSafe(f))
        .map_err(|p| panic_message(&*p).unwrap_or_else(|| "<non-string panic>".into()))
}
