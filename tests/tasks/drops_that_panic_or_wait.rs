//! Values whose `Drop` panics or blocks (parks the fiber: sleeps, locks a fibra mutex, sends
//! on a full channel) flowing through fibra's toolkit — task results, closures, payloads,
//! channel messages, scoped results — and dropped by fibra for the user: such a destructor
//! runs in a fiber (it may lock, spawn, wait), its panic is not lost, and neither is a
//! cancellation that lands in it or beside it.
//!
//! Every wait is bounded; a case that would leave a worker stuck leaks its scheduler rather
//! than hang the test binary.

use std::panic::{self, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{mpsc as stdmpsc, Arc};
use std::thread;
use std::time::{Duration, Instant};

use crate::common::{started, with_deadline};
use fibra::sync::Mutex as FMutex;
use fibra::Fiber;

/// Generous bound for what correct code does in well under a second.
const BOUND: Duration = Duration::from_secs(20);

/// Where a destructor ran: inside a fiber or not, and on which worker.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Place {
    in_fiber: bool,
    worker: Option<usize>,
}

fn here() -> Place {
    Place {
        in_fiber: Fiber::current().is_some(),
        worker: fibra::current_worker(),
    }
}

/// A task result whose destructor locks a fibra mutex: a fiber's destructor may wait like
/// any fiber code.
struct LocksOnDrop {
    m: Arc<FMutex<u32>>,
    seen: stdmpsc::Sender<Place>,
}

impl Drop for LocksOnDrop {
    fn drop(&mut self) {
        let _ = self.seen.send(here());
        *self.m.lock().unwrap() += 1;
    }
}

/// A detached task's result is dropped by fibra. Its destructor locks a fibra mutex that a
/// fiber of the same worker holds across a short sleep. In a fiber, the destructor would
/// park until the holder unlocks; dropped on the worker thread outside any fiber, the lock
/// blocks the worker thread itself, so the holder (homed on that worker) never runs again:
/// the worker, and every fiber on it, is stuck for good.
#[test]
fn a_detached_results_destructor_that_locks_does_not_freeze_its_worker() {
    with_deadline(|| {
        let sched = started(1);
        let m = Arc::new(FMutex::new(0u32));
        let (locked_tx, locked_rx) = stdmpsc::channel();
        // The holder keeps the mutex until told to let go (a fibra wait: it parks).
        let (release_tx, release_rx) = fibra::sync::oneshot::channel::<()>();
        let holder = {
            let m = m.clone();
            sched.spawn(move || {
                let g = m.lock().unwrap();
                locked_tx.send(()).unwrap();
                let mut release_rx = release_rx;
                let _ = release_rx.recv_timeout(BOUND);
                drop(g);
                "holder done"
            })
        };
        locked_rx.recv_timeout(BOUND).unwrap();
        let (seen_tx, seen_rx) = stdmpsc::channel();
        let m2 = m.clone();
        // The task ends only once its handle is gone: a handle dropped after the task ended
        // drops the result itself, on this thread (as std's and tokio's do), and this
        // thread's lock would then wait for a holder that waits for this thread.
        let (go_tx, go_rx) = fibra::sync::oneshot::channel::<()>();
        let detached = sched.spawn(move || {
            let mut go_rx = go_rx;
            go_rx.recv_timeout(BOUND).expect("told to finish");
            LocksOnDrop {
                m: m2,
                seen: seen_tx,
            }
        });
        drop(detached);
        go_tx.send(()).unwrap();
        let place = seen_rx.recv_timeout(BOUND).expect("the result was dropped");
        // The destructor now waits for the mutex; let the holder go.
        thread::sleep(Duration::from_millis(50));
        release_tx.send(()).unwrap();
        let ok = holder.wait_timeout(Duration::from_secs(10));
        if !ok {
            // The worker is blocked for good. Does a bounded shutdown still end?
            let sched = Arc::new(sched);
            let (done_tx, done_rx) = stdmpsc::channel();
            let s = sched.clone();
            thread::spawn(move || {
                let t = Instant::now();
                let n = s.stop_timeout(Duration::from_millis(100));
                let _ = done_tx.send((n, t.elapsed()));
            });
            let stopped = done_rx.recv_timeout(Duration::from_secs(15)).ok();
            // Leak the scheduler rather than hang in its drop.
            std::mem::forget(sched);
            panic!(
                "the holder fiber never finished: the detached result's destructor ran at \
                 {place:?} and blocked the worker thread on the fibra mutex; \
                 stop_timeout(100 ms) then returned (cancelled, elapsed): {stopped:?}"
            );
        }
        assert_eq!(holder.join().unwrap(), "holder done");
        assert!(
            place.in_fiber,
            "the detached result was dropped outside a fiber: {place:?}"
        );
        crate::common::wait_until("the destructor's lock", || *m.lock().unwrap() == 1);
        sched.stop();
    });
}

/// Waits in its destructor (parks its fiber) until told to go, or `BOUND`.
struct WaitsOnDrop(Option<fibra::sync::oneshot::Receiver<()>>);

impl WaitsOnDrop {
    fn new() -> (fibra::sync::oneshot::Sender<()>, WaitsOnDrop) {
        let (tx, rx) = fibra::sync::oneshot::channel();
        (tx, WaitsOnDrop(Some(rx)))
    }
}

impl Drop for WaitsOnDrop {
    fn drop(&mut self) {
        if let Some(mut rx) = self.0.take() {
            let _ = rx.recv_timeout(BOUND);
        }
    }
}

/// `scope` promises that a cancellation of its caller that arrives while it waits for its
/// fibers is raised once they have all ended. It decides whether to raise it with
/// `std::thread::panicking()`, which is per thread: while *another* fiber of the same worker
/// is suspended in the middle of its own cancellation unwind (a destructor that sleeps), the
/// check reads `true`, the cancellation is dropped, and the cancelled caller carries on and
/// returns a value as if never cancelled.
#[test]
fn a_scope_raises_its_callers_cancellation_while_another_fiber_unwinds() {
    with_deadline(|| {
        // Control: alone on its worker, the cancelled caller ends cancelled.
        let alone = scope_caller_cancelled(false);
        assert_eq!(alone, Err(true), "control: the caller alone");
        let r = scope_caller_cancelled(true);
        assert!(
            r == Err(true),
            "the scope's caller was cancelled while it waited, yet `scope` returned and the \
             task finished {r:?} (Ok(true): the code after the scope ran) while another fiber \
             of its worker was suspended in its own cancellation unwind"
        );
    });
}

/// Cancels a fiber waiting in `scope` for its child, optionally while another fiber of the
/// same (only) worker is suspended in the middle of its cancellation unwind. `Err(true)`:
/// the caller ended cancelled; `Ok(after)`: it returned (`after`: it ran code after the
/// scope).
fn scope_caller_cancelled(with_unwinder: bool) -> Result<bool, bool> {
    let sched = started(1);
    let (in_scope_tx, in_scope_rx) = stdmpsc::channel();
    let (child_go, child_wait) = fibra::sync::oneshot::channel::<()>();
    let after_scope = Arc::new(AtomicBool::new(false));
    let after = after_scope.clone();
    let caller = sched.spawn(move || {
        fibra::scope(|s| {
            s.spawn(move || {
                let mut w = child_wait;
                let _ = w.recv_timeout(BOUND);
            });
            in_scope_tx.send(()).unwrap();
        });
        // Reached only if the cancellation was not raised.
        after.store(true, Ordering::SeqCst);
    });
    in_scope_rx.recv_timeout(BOUND).unwrap();
    // A second fiber, cancelled, whose destructor waits during its unwind until released.
    let unwinder = with_unwinder.then(|| {
        let (parked_tx, parked_rx) = stdmpsc::channel();
        let (unwinder_go, slow) = WaitsOnDrop::new();
        let unwinder = sched.spawn(move || {
            let _slow = slow;
            parked_tx.send(()).unwrap();
            fibra::sleep(Duration::from_secs(3600));
        });
        parked_rx.recv_timeout(BOUND).unwrap();
        thread::sleep(Duration::from_millis(50));
        unwinder.cancel();
        (unwinder, unwinder_go)
    });
    thread::sleep(Duration::from_millis(100));
    // The scope's caller is cancelled while it waits for its child; then the child ends.
    caller.cancel();
    thread::sleep(Duration::from_millis(100));
    child_go.send(()).unwrap();
    assert!(caller.wait_timeout(BOUND), "the scope's caller did not end");
    let r = caller.join();
    if let Some((u, go)) = unwinder {
        go.send(()).unwrap();
        assert!(u.wait_timeout(BOUND), "the unwinder did not end");
        assert!(u.join().unwrap_err().is_cancelled());
    }
    sched.stop();
    match r {
        Ok(()) => Ok(after_scope.load(Ordering::SeqCst)),
        Err(e) => Err(e.is_cancelled()),
    }
}

/// A scoped fiber whose handle was dropped unjoined and whose *result's* destructor panics:
/// the panic happens in the scoped fiber (after its closure, when its result is dropped),
/// its task reports a panic, yet `scope` returns normally, as if no scoped fiber had
/// panicked. `scope` documents: "if a scoped fiber panicked and its handle was not joined,
/// this panics" (std's scope aborts the process for this very case rather than lose it).
#[test]
fn a_scoped_fibers_panicking_result_destructor_is_not_lost() {
    with_deadline(|| {
        struct Bomb;
        impl Drop for Bomb {
            fn drop(&mut self) {
                panic!("scoped result bomb");
            }
        }
        let sched = started(1);
        let r = sched.block_on(|| {
            panic::catch_unwind(AssertUnwindSafe(|| {
                fibra::scope(|s| {
                    let h = s.spawn(|| {
                        fibra::sleep(Duration::from_millis(30));
                        Bomb
                    });
                    drop(h); // unjoined, before the fiber ends
                    7
                })
            }))
        });
        crate::common::every_worker_runs(&sched);
        sched.stop();
        assert!(
            r.is_err(),
            "scope returned {:?} although a scoped fiber panicked (its result's destructor) \
             and its handle was not joined",
            r.ok()
        );
    });
}

/// The detached result's destructor (run by fibra for the user) calls `fibra::spawn`, which
/// is documented to work in any fiber; dropped outside a fiber, it panics instead and the
/// spawn is lost.
#[test]
fn a_detached_results_destructor_can_spawn() {
    with_deadline(|| {
        struct SpawnsOnDrop(stdmpsc::Sender<Result<Place, String>>);
        impl Drop for SpawnsOnDrop {
            fn drop(&mut self) {
                let place = here();
                let tx = self.0.clone();
                let r = panic::catch_unwind(AssertUnwindSafe(|| {
                    drop(fibra::spawn(|| ()));
                }));
                let _ = tx.send(r.map(|()| place).map_err(|p| {
                    format!(
                        "{} (dropped at {place:?})",
                        crate::common::panic_message(&*p).unwrap_or_default()
                    )
                }));
            }
        }
        let sched = started(1);
        let (tx, rx) = stdmpsc::channel();
        // Ends only once its handle is gone (see the first test).
        let (go_tx, go_rx) = fibra::sync::oneshot::channel::<()>();
        let h = sched.spawn(move || {
            let mut go_rx = go_rx;
            go_rx.recv_timeout(BOUND).expect("told to finish");
            SpawnsOnDrop(tx)
        });
        drop(h);
        go_tx.send(()).unwrap();
        let r = rx.recv_timeout(BOUND).expect("the result was dropped");
        crate::common::every_worker_runs(&sched);
        sched.stop();
        if let Err(msg) = r {
            panic!("fibra::spawn in a detached result's destructor failed: {msg}");
        }
    });
}

/// A fiber drops a finished task's `JoinHandle`; the task's result has a destructor that
/// waits (a receive here; a flush, a lock or a send in practice), which fibra runs under
/// `drop_catching` (`JoinCell::drop`). The fiber is cancelled while it waits there: the
/// cancellation unwinds out of the destructor and `drop_catching` swallows it (it catches
/// every unwind, the fiber's one cancellation included), so the cancelled fiber carries on
/// and finishes `Ok`, as if it had never been cancelled.
#[test]
fn a_cancellation_inside_a_results_destructor_is_not_swallowed() {
    with_deadline(|| {
        let sched = started(1);
        let (dropping_tx, dropping_rx) = stdmpsc::channel();
        let after = Arc::new(AtomicBool::new(false));
        let a = after.clone();
        let (go, waits) = WaitsOnDrop::new();
        let x = sched.spawn(move || {
            let h = fibra::spawn(move || waits);
            assert!(h.wait_timeout(BOUND));
            dropping_tx.send(Instant::now()).unwrap();
            drop(h); // the result's destructor sleeps in this fiber
            a.store(true, Ordering::SeqCst);
            "carried on after its cancellation"
        });
        let t0 = dropping_rx.recv_timeout(BOUND).unwrap();
        thread::sleep(Duration::from_millis(100));
        x.cancel();
        assert!(x.wait_timeout(BOUND), "the cancelled fiber did not end");
        let took = t0.elapsed();
        let r = x.join();
        drop(go);
        sched.stop();
        match r {
            Err(e) => assert!(e.is_cancelled(), "{e}"),
            Ok(v) => panic!(
                "the fiber was cancelled while a result's destructor waited in it, yet it \
                 finished Ok({v:?}) after {took:?} (code after the drop ran: {})",
                after.load(Ordering::SeqCst)
            ),
        }
    });
}

// ================================================================ messages whose Drop panics

/// Panics when dropped, unless the thread already unwinds (a second panic would abort).
struct Bomb(u32, Arc<AtomicUsize>);

impl Drop for Bomb {
    fn drop(&mut self) {
        self.1.fetch_add(1, Ordering::SeqCst);
        if !thread::panicking() {
            panic!("bomb {}", self.0);
        }
    }
}

impl Clone for Bomb {
    fn clone(&self) -> Self {
        Bomb(self.0, self.1.clone())
    }
}

/// A channel's send, type-erased over mpsc and mpmc.
type SendBomb = Box<dyn Fn(Bomb) -> Result<(), Bomb> + Send + Sync>;
/// Drops a channel's receiver.
type DropReceiver = Box<dyn FnOnce() + Send>;

/// A bounded channel's receiver dropped in a fiber with a bomb buffered and two
/// senders blocked: the drop panics, both senders get their messages back, the channel's
/// state stays consistent.
#[test]
fn a_receiver_dropped_with_a_panicking_message_gives_blocked_senders_theirs_back() {
    with_deadline(|| {
        let sched = started(2);
        let drops = Arc::new(AtomicUsize::new(0));
        for mpmc in [false, true] {
            let d = drops.clone();
            let r = sched.block_on(move || {
                let (tx, rx_drop): (SendBomb, DropReceiver) = if mpmc {
                    let (tx, rx) = fibra::sync::mpmc::sync_channel::<Bomb>(1);
                    (
                        Box::new(move |b| tx.send(b).map_err(|e| e.0)),
                        Box::new(move || drop(rx)),
                    )
                } else {
                    let (tx, rx) = fibra::sync::mpsc::sync_channel::<Bomb>(1);
                    (
                        Box::new(move |b| tx.send(b).map_err(|e| e.0)),
                        Box::new(move || drop(rx)),
                    )
                };
                let tx = Arc::new(tx);
                tx(Bomb(0, d.clone())).ok().unwrap();
                let blocked: Vec<_> = (1..=2)
                    .map(|i| {
                        let (tx, d) = (tx.clone(), d.clone());
                        fibra::spawn(move || match tx(Bomb(i, d)) {
                            Err(b) => {
                                std::mem::forget(b);
                                true
                            }
                            Ok(()) => false,
                        })
                    })
                    .collect();
                fibra::sleep(Duration::from_millis(30));
                let dropped = panic::catch_unwind(AssertUnwindSafe(rx_drop)).is_err();
                let back: Vec<bool> = blocked.into_iter().map(|h| h.join().unwrap()).collect();
                (dropped, back)
            });
            assert_eq!(r, (true, vec![true, true]), "mpmc: {mpmc}");
        }
        crate::common::every_worker_runs(&sched);
        sched.stop();
        assert_eq!(drops.load(Ordering::SeqCst), 2);
    });
}

/// A broadcast send that overwrites a message whose destructor panics: the panic
/// reaches the sender after the new message is in; receivers see the lag and every later
/// message.
#[test]
fn a_broadcast_send_overwriting_a_panicking_message_panics_after_the_new_one_is_in() {
    with_deadline(|| {
        let drops = Arc::new(AtomicUsize::new(0));
        let (tx, mut rx) = fibra::sync::broadcast::channel::<Option<Bomb>>(1);
        tx.send(Some(Bomb(0, drops.clone()))).unwrap();
        let sent = panic::catch_unwind(AssertUnwindSafe(|| tx.send(None)));
        assert!(
            sent.is_err(),
            "the overwritten bomb's panic reaches the sender"
        );
        assert_eq!(drops.load(Ordering::SeqCst), 1);
        assert_eq!(
            rx.try_recv().err(),
            Some(fibra::sync::broadcast::TryRecvError::Lagged(1))
        );
        assert!(matches!(rx.try_recv(), Ok(None)));
        tx.send(None).unwrap();
        assert!(matches!(rx.try_recv(), Ok(None)));
    });
}
