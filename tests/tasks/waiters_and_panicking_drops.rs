//! Waiters and destructors at the edges of a task's life. Every waiter of one `JoinHandle`
//! (threads, fibers, continuations) wakes when the task finishes, and timed-out waits neither
//! break the others nor stay registered. A value whose `Drop` panics (a detached result, a
//! panic payload, a discarded closure or job, an unreceived `unblock` result) kills no worker,
//! looper, pool or timer thread and aborts nothing. `catching` and `finally` continuations of
//! a failed task may submit and join, or `block_on`. `stop_timeout` and a scheduler's `Drop`
//! stay bounded with fibers that never suspend, swallow their cancellation or can never be
//! woken, and name on stderr the fibers they give up on. Cancelled fibers may wait in their
//! destructors.
//!
//! Every test is bounded: a broken behaviour fails with a message saying what broke instead
//! of hanging the run. Where it is an abort, a dying worker thread or a hang that would leave
//! a scheduler stuck, the body runs in a child process (`crate::common::in_child`) and the
//! parent checks how it ended and what it wrote on stderr. A child reports a failed check on
//! stderr and exits at once (`child_fail`), so that no destructor of a broken scheduler can
//! hang its exit.

use std::env;
use std::fmt::Display;
use std::io::Write;
use std::mem::ManuallyDrop;
use std::panic;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Barrier};
use std::thread;
use std::time::{Duration, Instant};

use crate::common::{block_thread, eventually, finish, in_child, with_deadline, Counted};
use fibra::exec::{Executor, Looper, ThreadPool};
use fibra::{park, JoinHandle, Scheduler, Unparker};

/// The bound on one operation that correct code finishes in well under 2 s.
const BOUND: Duration = Duration::from_secs(20);
/// How long `stop_timeout(100 ms)` may take ("within about d plus one unwinding").
const STOP_BOUND: Duration = Duration::from_secs(10);
/// How long a waiter may take to notice that the task it waits for has finished.
const WAKE_BOUND: Duration = Duration::from_secs(10);
/// The timeout waiters pass to `wait_timeout`: far beyond `WAKE_BOUND`, so that a waiter
/// that is only released by its own timeout is caught.
const WAITER_PATIENCE: Duration = Duration::from_secs(120);

// ------------------------------------------------------------------ shared helpers

/// A value whose destructor panics. Every test makes sure it is dropped outside any other
/// unwinding (a panic in a destructor during unwinding aborts by Rust's rules, which is not
/// what these tests are about).
struct Bomb;

/// How many `Bomb`s have gone off in this process.
static BOMBS: AtomicUsize = AtomicUsize::new(0);

impl Drop for Bomb {
    fn drop(&mut self) {
        BOMBS.fetch_add(1, Ordering::SeqCst);
        panic!("bomb");
    }
}

fn started(threads: usize, name: &str) -> Scheduler {
    let sched = Scheduler::builder()
        .threads(threads)
        .name(name)
        .build()
        .expect("a valid configuration builds");
    sched.start();
    sched
}

/// Runs `f` on a helper thread; its value, or `None` if it did not return within `limit`
/// (hung, or panicked: the panic message is on stderr).
fn within<T: Send + 'static>(limit: Duration, f: impl FnOnce() -> T + Send + 'static) -> Option<T> {
    let (tx, rx) = mpsc::channel();
    thread::spawn(move || {
        let _ = tx.send(f());
    });
    rx.recv_timeout(limit).ok()
}

/// A task that stays unfinished (parked) until the returned `Unparker` is used; then it
/// returns 42.
fn gated_task(sched: &Scheduler) -> (JoinHandle<u32>, Unparker) {
    let (tx, rx) = mpsc::channel();
    let handle = sched
        .submit(
            move || {
                park(move |u| tx.send(u).expect("the test keeps the receiver"));
                42
            },
            None,
        )
        .expect("submit");
    let gate = rx.recv_timeout(BOUND).expect("the gated task parks");
    (handle, gate)
}

/// Says on `ready` that it started, waits on `handle` (for up to `WAITER_PATIENCE`), lets go
/// of the handle and sends `report(finished)` on `done`.
fn wait_and_report<M>(
    handle: Arc<JoinHandle<u32>>,
    ready: mpsc::Sender<()>,
    done: mpsc::Sender<M>,
    report: impl FnOnce(bool) -> M,
) {
    let _ = ready.send(());
    let finished = handle.wait_timeout(WAITER_PATIENCE);
    drop(handle);
    let _ = done.send(report(finished));
}

/// A plain thread that waits on `handle` ([`wait_and_report`]).
fn thread_waiter<M: Send + 'static>(
    handle: &Arc<JoinHandle<u32>>,
    ready: mpsc::Sender<()>,
    done: mpsc::Sender<M>,
    report: impl FnOnce(bool) -> M + Send + 'static,
) {
    let handle = Arc::clone(handle);
    thread::spawn(move || wait_and_report(handle, ready, done, report));
}

/// A fiber of `sched` that waits on `handle` ([`wait_and_report`]); its handle.
fn fiber_waiter<M: Send + 'static>(
    sched: &Scheduler,
    handle: &Arc<JoinHandle<u32>>,
    ready: mpsc::Sender<()>,
    done: mpsc::Sender<M>,
    report: impl FnOnce(bool) -> M + Send + 'static,
) -> JoinHandle<()> {
    let handle = Arc::clone(handle);
    sched
        .submit(move || wait_and_report(handle, ready, done, report), None)
        .expect("submit a fiber waiter")
}

/// Opens `gate` (the gated task finishes) and receives the reports `(waiter, finished)` of
/// `n` waiters from `done`, all within `WAKE_BOUND` of the release. Fails if a waiter's
/// `wait_timeout` returned false, or with `missing(woken)` if not all reported in time.
fn release_and_await_waiters<W: std::fmt::Display>(
    gate: Unparker,
    done: &mpsc::Receiver<(W, bool)>,
    n: usize,
    missing: impl FnOnce(&[W]) -> String,
) {
    gate.unpark();
    let released = Instant::now();
    let mut woken = Vec::new();
    while woken.len() < n {
        match done.recv_timeout(WAKE_BOUND.saturating_sub(released.elapsed())) {
            Ok((waiter, finished)) => {
                assert!(finished, "waiter {waiter}: wait_timeout returned false");
                woken.push(waiter);
            }
            Err(_) => panic!("{}", missing(&woken)),
        }
    }
}

// ------------------------------------------------------------------ child processes

/// In a child: reports a failed check and exits at once, running no destructor (a broken
/// scheduler's `Drop` could hang the exit).
fn child_fail(msg: impl Display) -> ! {
    eprintln!("CHILD CHECK FAILED: {msg}");
    std::process::exit(1)
}

fn check(cond: bool, msg: impl FnOnce() -> String) {
    if !cond {
        child_fail(msg())
    }
}

/// In a child: the task's result, waiting at most `BOUND` for it.
fn joined<T>(handle: JoinHandle<T>, what: &str) -> Result<T, fibra::JoinError> {
    check(handle.wait_timeout(BOUND), || {
        format!("{what}: its JoinHandle never completed (waited {BOUND:?})")
    });
    handle.join()
}

/// In a child: submits a task pinned to every worker and checks that each runs there, then
/// stops the scheduler; all bounded.
fn every_worker_still_runs_then_stop(sched: Scheduler, what: &str) {
    let handles: Vec<_> = (0..sched.threads())
        .map(|w| {
            let h = sched
                .submit(fibra::current_worker, Some(w))
                .unwrap_or_else(|_| child_fail(format!("{what}: submit to worker {w} refused")));
            (w, h)
        })
        .collect();
    for (w, h) in handles {
        check(h.wait_timeout(BOUND), || {
            format!(
                "{what}: a task pinned to worker {w} did not run within {BOUND:?} — \
                 the worker thread is dead"
            )
        });
        match h.join() {
            Ok(Some(ran_on)) if ran_on == w => {}
            other => child_fail(format!("{what}: pinned task on worker {w}: {other:?}")),
        }
    }
    check(within(BOUND, move || sched.stop()).is_some(), || {
        format!("{what}: stop() did not return within {BOUND:?}")
    });
}

// ================================================================== concurrent waiters
// Concurrent waiters on one JoinHandle all wake when the task finishes. A handle that kept a
// single waiter slot would let each new waiter overwrite the previous one, and a waiter that
// times out take whatever waiter is registered (someone else's) away: `wait_timeout` from
// several threads or fibers would return only when its own timeout expires, long after the
// task finished.

/// `n` plain threads wait on one handle; all must wake when the task finishes.
fn every_thread_waiter_wakes(n: usize) {
    let sched = ManuallyDrop::new(started(2, "waiters"));
    let (handle, gate) = gated_task(&sched);
    let handle = Arc::new(handle);
    let ready = Arc::new(Barrier::new(n + 1));
    let (done_tx, done_rx) = mpsc::channel();
    for i in 0..n {
        let (handle, ready, done_tx) = (Arc::clone(&handle), Arc::clone(&ready), done_tx.clone());
        thread::spawn(move || {
            ready.wait();
            let finished = handle.wait_timeout(WAITER_PATIENCE);
            drop(handle);
            let _ = done_tx.send((i, finished));
        });
    }
    ready.wait();
    // Let every thread get into wait_timeout before the task finishes.
    thread::sleep(Duration::from_millis(300));
    release_and_await_waiters(gate, &done_rx, n, |woken| {
        format!(
            "only {} of {n} threads in wait_timeout on one JoinHandle woke \
             within {WAKE_BOUND:?} of the task finishing (woken: {woken:?}); the others \
             sleep until their own {WAITER_PATIENCE:?} timeout",
            woken.len()
        )
    });
    let handle = Arc::try_unwrap(handle).expect("the waiters have let go of the handle");
    assert_eq!(handle.join().expect("the gated task"), 42);
    ManuallyDrop::into_inner(sched).stop();
}

// Two threads waiting on the same handle both wake (neither sleeps its full timeout).
#[test]
fn two_threads_waiting_on_one_handle_both_wake() {
    with_deadline(|| every_thread_waiter_wakes(2));
}

// Sixteen threads waiting on the same handle all wake.
#[test]
fn sixteen_threads_waiting_on_one_handle_all_wake() {
    with_deadline(|| every_thread_waiter_wakes(16));
}

// Mixed waiters: fibers (other tasks of the same scheduler) and threads wait on one handle,
// and `then` / `finally` continuations are registered on it too. Every waiter wakes and every
// continuation fires exactly once; `catching` does not fire for a success.
#[test]
fn fibers_threads_and_continuations_on_one_handle_all_fire() {
    with_deadline(|| {
        const FIBER_WAITERS: usize = 4;
        const THREAD_WAITERS: usize = 4;
        const CONTINUATIONS: usize = 3;
        let sched = ManuallyDrop::new(started(2, "mixed"));
        let (handle, gate) = gated_task(&sched);
        let handle = Arc::new(handle);

        let thens = Arc::new(AtomicUsize::new(0));
        let finallys = Arc::new(AtomicUsize::new(0));
        let catchings = Arc::new(AtomicUsize::new(0));
        for _ in 0..CONTINUATIONS {
            let (t, f, c) = (thens.clone(), finallys.clone(), catchings.clone());
            handle
                .then(move |v| {
                    assert_eq!(*v, 42);
                    t.fetch_add(1, Ordering::SeqCst);
                })
                .catching(move |_| {
                    c.fetch_add(1, Ordering::SeqCst);
                })
                .finally(move || {
                    f.fetch_add(1, Ordering::SeqCst);
                });
        }

        let (ready_tx, ready_rx) = mpsc::channel::<()>();
        let (done_tx, done_rx) = mpsc::channel::<(String, bool)>();
        let fiber_tasks: Vec<_> = (0..FIBER_WAITERS)
            .map(|i| {
                fiber_waiter(
                    &sched,
                    &handle,
                    ready_tx.clone(),
                    done_tx.clone(),
                    move |f| (format!("fiber {i}"), f),
                )
            })
            .collect();
        for i in 0..THREAD_WAITERS {
            thread_waiter(&handle, ready_tx.clone(), done_tx.clone(), move |f| {
                (format!("thread {i}"), f)
            });
        }
        for _ in 0..FIBER_WAITERS + THREAD_WAITERS {
            ready_rx.recv_timeout(BOUND).expect("every waiter starts");
        }
        thread::sleep(Duration::from_millis(300));
        release_and_await_waiters(gate, &done_rx, FIBER_WAITERS + THREAD_WAITERS, |woken| {
            format!(
                "of {FIBER_WAITERS} fiber and {THREAD_WAITERS} thread waiters on \
                 one JoinHandle only these woke within {WAKE_BOUND:?} of the task \
                 finishing: {woken:?}"
            )
        });
        assert_eq!(thens.load(Ordering::SeqCst), CONTINUATIONS, "then");
        assert_eq!(finallys.load(Ordering::SeqCst), CONTINUATIONS, "finally");
        assert_eq!(catchings.load(Ordering::SeqCst), 0, "catching on success");
        for task in fiber_tasks {
            finish(task);
        }
        let handle = Arc::try_unwrap(handle).expect("the waiters have let go of the handle");
        assert_eq!(handle.join().expect("the gated task"), 42);
        ManuallyDrop::into_inner(sched).stop();
    });
}

// Timed-out waiters: up to 10 000 thread waits and 10 000 fiber waits that time out on
// an unfinished task must neither break a waiter registered before them nor the ones that
// come after, nor stay registered (memory that grows with every timed-out wait). Stale
// registrations are detected through the fiber waiters: each is a detached task returning a
// `Counted`, which is dropped only once nothing refers to the finished task any more.
#[test]
fn timed_out_waiters_neither_break_other_waiters_nor_pile_up() {
    with_deadline(|| {
        const HAMMER_THREADS: usize = 2;
        const THREAD_TIMEOUTS: usize = 5_000;
        const THREAD_TIMEOUT_FLOOR: usize = 500;
        const HAMMER_FOR: Duration = Duration::from_secs(3);
        const HAMMER_FIBERS: usize = 100;
        const FIBER_TIMEOUTS: usize = 100;
        let sched = ManuallyDrop::new(started(2, "timeouts"));
        let (handle, gate) = gated_task(&sched);
        let handle = Arc::new(handle);
        let (done_tx, done_rx) = mpsc::channel::<(&'static str, bool)>();

        // A waiter registered before the timed-out ones.
        let (ready_tx, ready_rx) = mpsc::channel::<()>();
        thread_waiter(&handle, ready_tx.clone(), done_tx.clone(), |f| {
            ("early thread", f)
        });
        ready_rx
            .recv_timeout(BOUND)
            .expect("the early waiter starts");
        thread::sleep(Duration::from_millis(200));

        // Up to 10 000 timed-out waits from threads (at least 1 000, for at most about 3 s)
        // and 10 000 from fibers, concurrently.
        let (hammered_tx, hammered_rx) = mpsc::channel::<usize>();
        for _ in 0..HAMMER_THREADS {
            let (handle, hammered_tx) = (Arc::clone(&handle), hammered_tx.clone());
            thread::spawn(move || {
                // Each 20 µs wait takes at least a wake-up of this thread, which a loaded
                // machine can stretch to milliseconds: past THREAD_TIMEOUT_FLOOR waits the
                // hammering stops at HAMMER_FOR, so its length does not grow with the load.
                let end = Instant::now() + HAMMER_FOR;
                let finished = (0..THREAD_TIMEOUTS)
                    .take_while(|&i| i < THREAD_TIMEOUT_FLOOR || Instant::now() < end)
                    .filter(|_| handle.wait_timeout(Duration::from_micros(20)))
                    .count();
                drop(handle);
                let _ = hammered_tx.send(finished);
            });
        }
        let freed = Arc::new(AtomicUsize::new(0));
        for _ in 0..HAMMER_FIBERS {
            let (handle, hammered_tx, freed) =
                (Arc::clone(&handle), hammered_tx.clone(), freed.clone());
            let detached = sched
                .submit(
                    move || {
                        let finished = (0..FIBER_TIMEOUTS)
                            .filter(|_| handle.wait_timeout(Duration::from_millis(1)))
                            .count();
                        drop(handle);
                        let _ = hammered_tx.send(finished);
                        Counted(freed)
                    },
                    None,
                )
                .expect("submit a hammering fiber");
            drop(detached);
        }
        for _ in 0..HAMMER_THREADS + HAMMER_FIBERS {
            let finished = hammered_rx
                .recv_timeout(BOUND)
                .expect("the timed-out waits end");
            assert_eq!(
                finished, 0,
                "wait_timeout returned true on an unfinished task"
            );
        }
        assert!(!handle.is_finished());
        // Every hammering fiber has finished and its handle is gone: nothing should refer to
        // its task any more, so its Counted result is freed — unless a stale registration
        // of one of its 100 timed-out waits is still held by the handle it waited on.
        let all_freed = eventually(WAKE_BOUND, || {
            freed.load(Ordering::SeqCst) >= HAMMER_FIBERS - 4
        });
        assert!(
            all_freed,
            "only {} of {HAMMER_FIBERS} finished fibers that timed out waiting on an \
             unfinished task were freed — timed-out waiters stay registered, so memory grows \
             with every timed-out wait",
            freed.load(Ordering::SeqCst)
        );

        // Waiters that come after, a thread and a fiber.
        thread_waiter(&handle, ready_tx.clone(), done_tx.clone(), |f| {
            ("later thread", f)
        });
        let later_fiber = fiber_waiter(&sched, &handle, ready_tx, done_tx, |f| ("later fiber", f));
        for _ in 0..2 {
            ready_rx
                .recv_timeout(BOUND)
                .expect("the later waiters start");
        }
        thread::sleep(Duration::from_millis(300));
        release_and_await_waiters(gate, &done_rx, 3, |woken| {
            format!(
                "after 20 000 timed-out waits only {woken:?} of the early \
                 thread, later thread and later fiber waiters woke within {WAKE_BOUND:?} \
                 of the task finishing — a timed-out waiter unregistered (or a new one \
                 overwrote) someone else's wake-up"
            )
        });
        finish(later_fiber);
        let handle = Arc::try_unwrap(handle).expect("the waiters have let go of the handle");
        assert_eq!(handle.join().expect("the gated task"), 42);
        ManuallyDrop::into_inner(sched).stop();
    });
}

// ================================================================== drops that panic
// A worker thread never dies when a value it drops panics in its Drop. Were the panic to
// unwind out of the worker loop, it would kill the thread: tasks pinned to that worker would
// never run again and `stop` would wait for ever, a hang after a
// "thread 'name-N' panicked at … bomb" message.

// The return value of a detached task (handle dropped before it finishes) panics
// when the worker frees it.
#[test]
fn worker_survives_a_detached_result_whose_drop_panics() {
    in_child(|| {
        let sched = started(2, "bomb-result");
        detach_on_each_worker(&sched, |gate| {
            move || {
                let _ = gate.recv();
                Bomb
            }
        });
        check(
            eventually(BOUND, || BOMBS.load(Ordering::SeqCst) == 2),
            || "the two detached results were never dropped".into(),
        );
        every_worker_still_runs_then_stop(sched, "a detached result whose Drop panics");
    })
    .assert_ok(
        "a worker thread died dropping the return value of a detached task whose \
         Drop panics",
    );
}

/// Submits `task(gate)` pinned to each of the two workers and drops its handle, then opens
/// its gate. The gate is a std channel, so the test holds no reference to the task: the
/// worker drops the last one, and with it whatever the task leaves behind.
fn detach_on_each_worker<F, T>(sched: &Scheduler, task: impl Fn(mpsc::Receiver<()>) -> F)
where
    F: FnOnce() -> T + Send + 'static,
    T: Send + 'static,
{
    for w in 0..2 {
        let (gate_tx, gate_rx) = mpsc::channel::<()>();
        drop(sched.submit(task(gate_rx), Some(w)).expect("submit"));
        gate_tx.send(()).expect("the task waits at its gate");
    }
}

// The panic payload of a detached task panics when the worker frees it.
#[test]
fn worker_survives_a_detached_panic_payload_whose_drop_panics() {
    in_child(|| {
        let sched = started(2, "bomb-payload");
        detach_on_each_worker(&sched, |gate| {
            move || -> u8 {
                let _ = gate.recv();
                panic::panic_any(Bomb)
            }
        });
        check(
            eventually(BOUND, || BOMBS.load(Ordering::SeqCst) == 2),
            || "the two panic payloads were never dropped".into(),
        );
        every_worker_still_runs_then_stop(sched, "a panic payload whose Drop panics");
    })
    .assert_ok(
        "a worker thread died dropping the panic payload of a detached task whose \
         Drop panics",
    );
}

/// A task that holds its worker's thread (never suspends) for `hold`, telling `started`
/// when it begins.
fn hog(started: mpsc::Sender<()>, hold: Duration) -> impl FnOnce() -> u32 + Send + 'static {
    move || {
        let _ = started.send(());
        block_thread(hold);
        1
    }
}

/// A closure that owns a Bomb. If it ever ran it would defuse the bomb, so a Bomb going off
/// always means the closure was dropped unrun.
fn bomb_closure() -> impl FnOnce() -> u32 + Send + 'static {
    let bomb = Bomb;
    move || {
        std::mem::forget(bomb);
        2
    }
}

// `stop_timeout` discards the unstarted closure of a task queued behind a long-running
// pinned task on a one-worker scheduler; the closure owns a Bomb. The worker survives the
// discarding: the task queued after it completes (cancelled) and stop_timeout returns.
#[test]
fn stop_timeout_survives_discarding_a_closure_whose_drop_panics() {
    in_child(|| {
        let sched = started(1, "bomb-discard");
        let (started_tx, started_rx) = mpsc::channel();
        let hog = sched
            .submit(hog(started_tx, Duration::from_millis(1500)), Some(0))
            .expect("submit");
        check(started_rx.recv_timeout(BOUND).is_ok(), || {
            "the long-running task never started".into()
        });
        let bomb = sched.submit(bomb_closure(), Some(0)).expect("submit");
        let after = sched.submit(|| 3_u32, Some(0)).expect("submit");
        let cancelled = within(BOUND, move || {
            let n = sched.stop_timeout(Duration::from_millis(50));
            drop(sched);
            n
        });
        let Some(cancelled) = cancelled else {
            child_fail(format!(
                "stop_timeout(50 ms) did not return within {BOUND:?} after discarding \
             a closure whose Drop panics — the worker died while discarding"
            ));
        };
        check(BOMBS.load(Ordering::SeqCst) == 1, || {
            "the queued closure was not dropped".into()
        });
        check(cancelled >= 2, || {
            format!("stop_timeout counted {cancelled} cancelled tasks, expected at least 2")
        });
        check(
            matches!(joined(hog, "the long-running task"), Ok(1)),
            || "the running task did not finish normally".into(),
        );
        check(
            joined(bomb, "the discarded task").is_err_and(|e| e.is_cancelled()),
            || "the discarded task does not report cancelled".into(),
        );
        check(
            joined(after, "the task queued after the bomb").is_err_and(|e| e.is_cancelled()),
            || "the task queued after the bomb does not report cancelled".into(),
        );
    })
    .assert_ok(
        "stop_timeout discarding an unstarted closure whose Drop panics killed the \
         worker",
    );
}

// The same through `fibra::exec::Looper::shutdown(false)`, which drops the jobs
// that have not started.
#[test]
fn looper_shutdown_survives_discarding_a_job_whose_drop_panics() {
    in_child(|| {
        let looper = Arc::new(Looper::new());
        let (started_tx, started_rx) = mpsc::channel();
        let hog = looper.spawn(hog(started_tx, Duration::from_millis(1500)));
        check(started_rx.recv_timeout(BOUND).is_ok(), || {
            "the long-running job never started".into()
        });
        let bomb = looper.spawn(bomb_closure());
        let after = looper.spawn(|| 3_u32);
        let stopper = Arc::clone(&looper);
        check(
            within(BOUND, move || stopper.shutdown(false)).is_some(),
            || {
                format!(
                    "Looper::shutdown(false) did not return within {BOUND:?} after \
                 dropping a queued job whose Drop panics — the looper thread died"
                )
            },
        );
        check(BOMBS.load(Ordering::SeqCst) == 1, || {
            "the queued job was not dropped".into()
        });
        check(
            matches!(joined(hog, "the long-running task"), Ok(1)),
            || "the running job did not finish normally".into(),
        );
        check(
            joined(bomb, "the discarded task").is_err_and(|e| e.is_cancelled()),
            || "the dropped job does not report cancelled".into(),
        );
        check(
            joined(after, "the task queued after the bomb").is_err_and(|e| e.is_cancelled()),
            || "the job queued after the bomb does not report cancelled".into(),
        );
        check(within(BOUND, move || drop(looper)).is_some(), || {
            "dropping the shut-down looper hangs".into()
        });
    })
    .assert_ok(
        "Looper::shutdown(false) dropping a queued job whose Drop panics killed the \
         looper thread",
    );
}

// ================================================================== continuations of a failed task
// `catching` and `finally` continuations of a failed task may do what `then` may: park,
// submit and join, block_on. Run on the bare worker stack, outside any fiber, a join there
// would block the worker thread — and with one worker, the task it waits for could never
// run: the scheduler would freeze for ever.

#[derive(Clone, Copy, Debug)]
enum Continuation {
    Catching,
    Finally,
}

#[derive(Clone, Copy, Debug)]
enum Action {
    SubmitAndJoin,
    BlockOn,
}

fn continuation_of_a_panicked_task(kind: Continuation, action: Action) {
    let what = format!("a {kind:?} continuation doing {action:?}");
    let sched = Arc::new(started(1, "continuation"));
    let (gate_tx, gate_rx) = mpsc::channel::<Unparker>();
    let failing = sched
        .submit(
            move || -> u32 {
                park(move |u| gate_tx.send(u).expect("the test keeps the receiver"));
                panic!("this task fails on purpose")
            },
            None,
        )
        .expect("submit");
    let gate = gate_rx
        .recv_timeout(BOUND)
        .unwrap_or_else(|_| child_fail("the failing task never parked"));

    let (done_tx, done_rx) = mpsc::channel::<u32>();
    let inner = Arc::clone(&sched);
    let body = move || {
        let value = match action {
            Action::SubmitAndJoin => inner
                .submit(|| 7_u32, None)
                .expect("submit from a continuation")
                .join()
                .expect("the task submitted by the continuation"),
            Action::BlockOn => inner.block_on(|| 7_u32),
        };
        let _ = done_tx.send(value);
    };
    // Registered while the task is parked, so they run when it fails (on the worker), not
    // here at registration.
    match kind {
        Continuation::Catching => {
            failing.catching(move |e| {
                assert!(e.is_panic(), "catching got {e:?}");
                body();
            });
        }
        Continuation::Finally => {
            failing.finally(body);
        }
    }
    gate.unpark();
    drop(gate);
    match done_rx.recv_timeout(BOUND) {
        Ok(7) => {}
        Ok(other) => child_fail(format!("{what}: got {other}")),
        Err(mpsc::RecvTimeoutError::Timeout) => child_fail(format!(
            "{what}: the continuation did not complete within {BOUND:?} — it deadlocked \
             the only worker"
        )),
        Err(mpsc::RecvTimeoutError::Disconnected) => {
            child_fail(format!("{what}: the continuation never ran, or panicked"))
        }
    }
    check(failing.wait_timeout(BOUND), || {
        format!("{what}: the failed task's handle never completed")
    });
    check(failing.join().is_err_and(|e| e.is_panic()), || {
        format!("{what}: the failed task does not report its panic")
    });
    check(within(BOUND, move || sched.stop()).is_some(), || {
        format!("{what}: stop() did not return within {BOUND:?}")
    });
}

// A `catching` continuation of a panicked task submits a task and joins it, on a
// one-worker scheduler.
#[test]
fn catching_after_a_panic_may_submit_and_join() {
    in_child(|| continuation_of_a_panicked_task(Continuation::Catching, Action::SubmitAndJoin))
        .assert_ok("a catching continuation that submits and joins a task deadlocks the worker");
}

// A `catching` continuation of a panicked task calls `block_on`.
#[test]
fn catching_after_a_panic_may_block_on() {
    in_child(|| continuation_of_a_panicked_task(Continuation::Catching, Action::BlockOn))
        .assert_ok("a catching continuation that calls block_on deadlocks the worker");
}

// A `finally` continuation of a panicked task submits a task and joins it.
#[test]
fn finally_after_a_panic_may_submit_and_join() {
    in_child(|| continuation_of_a_panicked_task(Continuation::Finally, Action::SubmitAndJoin))
        .assert_ok(
            "a finally continuation (after a panic) that submits and joins a task \
         deadlocks the worker",
        );
}

// A `finally` continuation of a panicked task calls `block_on`.
#[test]
fn finally_after_a_panic_may_block_on() {
    in_child(|| continuation_of_a_panicked_task(Continuation::Finally, Action::BlockOn)).assert_ok(
        "a finally continuation (after a panic) that calls block_on deadlocks the \
         worker",
    );
}

// ================================================================== bounded stop_timeout
// `stop_timeout(d)` is bounded: it returns within about d plus one unwinding; what refuses to
// die is reported (how many, which names) on stderr and abandoned, never waited for.

// A use_caller scheduler stopped with stop_timeout from a thread other than its builder,
// while a fiber on worker 0 (the builder's) sleeps for an hour. Nobody else runs worker 0:
// stop_timeout still returns in time, its sleeping fiber counted, instead of waiting for ever
// for that fiber to be cancelled.
#[test]
fn stop_timeout_of_a_use_caller_scheduler_from_another_thread_is_bounded() {
    in_child(|| {
        let sched = Scheduler::builder()
            .threads(2)
            .use_caller(true)
            .name("caller-stop")
            .build()
            .expect("build");
        let asleep = Arc::new(AtomicBool::new(false));
        let flag = Arc::clone(&asleep);
        let sleeper = sched
            .task()
            .name("sleeper-on-worker-0")
            .submit(
                move || {
                    flag.store(true, Ordering::SeqCst);
                    fibra::sleep(Duration::from_secs(3600));
                },
                Some(0),
            )
            .expect("submit");
        // block_on drives worker 0 on this thread until the sleeper has started there.
        let flag = Arc::clone(&asleep);
        let started = sched.block_on(move || {
            let since = Instant::now();
            while !flag.load(Ordering::SeqCst) && since.elapsed() < BOUND {
                fibra::sleep(Duration::from_millis(1));
            }
            flag.load(Ordering::SeqCst)
        });
        check(started, || {
            "the fiber pinned to worker 0 never started".into()
        });
        drop(sleeper);

        let sched = Arc::new(sched);
        let (tx, rx) = mpsc::channel();
        thread::spawn(move || {
            let begun = Instant::now();
            let n = sched.stop_timeout(Duration::from_millis(100));
            let _ = tx.send((n, begun.elapsed()));
            drop(sched);
            let _ = tx.send((usize::MAX, begun.elapsed()));
        });
        let Ok((cancelled, took)) = rx.recv_timeout(STOP_BOUND) else {
            child_fail(format!(
                "stop_timeout(100 ms) called from another thread on a use_caller \
             scheduler did not return within {STOP_BOUND:?} — nobody runs worker 0, so its \
             sleeping fiber is never cancelled"
            ));
        };
        eprintln!("stop_timeout(100 ms) from another thread: {cancelled} cancelled in {took:?}");
        check(cancelled >= 1, || {
            format!("stop_timeout returned {cancelled}: the fiber it gave up on is not counted")
        });
        check(rx.recv_timeout(BOUND).is_ok(), || {
            "dropping the scheduler after stop_timeout hangs".into()
        });
    })
    .assert_ok("stop_timeout on a use_caller scheduler from another thread is unbounded");
}

// A fiber that catches its cancellation unwind and sleeps again, for ever. stop_timeout does
// not keep cancelling it (spinning a worker at 100% and never returning): it gives up after
// one unwinding, says on stderr that "stubborn" did not die, counts it, and returns.
#[test]
fn stop_timeout_abandons_a_fiber_that_swallows_its_cancellation() {
    let run = in_child(|| {
        let sched = started(1, "stop-stubborn");
        let (started_tx, started_rx) = mpsc::channel();
        let stubborn = sched
            .task()
            .name("stubborn")
            .submit(
                move || {
                    let _ = started_tx.send(());
                    loop {
                        let _ = panic::catch_unwind(|| fibra::sleep(Duration::from_secs(3600)));
                    }
                },
                None,
            )
            .expect("submit");
        check(started_rx.recv_timeout(BOUND).is_ok(), || {
            "the stubborn fiber never started".into()
        });
        drop(stubborn);
        let (tx, rx) = mpsc::channel();
        thread::spawn(move || {
            let begun = Instant::now();
            let n = sched.stop_timeout(Duration::from_millis(100));
            let _ = tx.send((n, begun.elapsed()));
            drop(sched);
            let _ = tx.send((usize::MAX, begun.elapsed()));
        });
        let Ok((cancelled, took)) = rx.recv_timeout(STOP_BOUND) else {
            child_fail(format!(
                "stop_timeout(100 ms) did not return within {STOP_BOUND:?} with a fiber \
             that catches its cancellation — it keeps cancelling it for ever"
            ));
        };
        eprintln!("stop_timeout(100 ms) with a stubborn fiber: {cancelled} in {took:?}");
        check(cancelled >= 1, || {
            format!("stop_timeout returned {cancelled}: the abandoned fiber is not counted")
        });
        check(rx.recv_timeout(BOUND).is_ok(), || {
            "dropping the scheduler after stop_timeout hangs (it waits for the abandoned fiber)"
                .into()
        });
    });
    run.assert_ok("stop_timeout never returns while a fiber swallows its cancellation");
    assert!(
        run.stderr.contains("stubborn"),
        "stop_timeout gave up on a fiber without naming it on stderr; stderr:\n{}",
        run.stderr
    );
}

// ================================================================== dropping without stop
// Dropping a Scheduler without calling stop, while a fiber is parked with no way to be woken.
// Drop does not wait for it for ever, silently: it waits a while (about 5 s), then prints
// which fibers are still alive (by name) and cancels them.
#[test]
fn dropping_a_scheduler_with_an_orphaned_fiber_names_and_cancels_it() {
    let run = in_child(|| {
        let sched = started(2, "drop-orphan");
        let (parked_tx, parked_rx) = mpsc::channel();
        let orphan = sched
            .task()
            .name("orphan")
            .submit(
                move || {
                    park(move |u| {
                        let _ = parked_tx.send(());
                        drop(u); // nobody can ever wake this fiber
                    });
                },
                None,
            )
            .expect("submit");
        check(parked_rx.recv_timeout(BOUND).is_ok(), || {
            "the orphan never parked".into()
        });
        let took = within(Duration::from_secs(30), move || {
            let begun = Instant::now();
            drop(sched);
            begun.elapsed()
        });
        let Some(took) = took else {
            child_fail(
                "dropping a scheduler with a fiber parked for ever did not return \
             within 30 s — Drop waits for it silently, for ever",
            );
        };
        eprintln!("drop with an orphaned fiber took {took:?}");
        check(orphan.wait_timeout(BOUND), || {
            "the orphaned task's handle never completed".into()
        });
        check(orphan.join().is_err_and(|e| e.is_cancelled()), || {
            "the orphaned task does not report cancelled".into()
        });
    });
    run.assert_ok("dropping a scheduler hangs on a fiber that can never be woken");
    assert!(
        run.stderr.contains("orphan"),
        "Drop gave up on a fiber without naming it on stderr; stderr:\n{}",
        run.stderr
    );
}

// ================================================================== destructors that wait
// Cancellation plus destructors that wait. A cancelled fiber unwinds; a destructor that
// sleeps, or a BufWriter<fibra::fs::File> that flushes, parks during that unwinding. Were
// the park answered with another cancellation unwind from inside the destructor, Rust would
// abort the process: "panic in a destructor during cleanup". Instead the waits in destructors
// complete, stop_timeout returns, the data reaches the file.

/// Sleeps (a fiber wait) in its destructor, then sets its flag.
struct SleepyGuard(Arc<AtomicBool>);

impl Drop for SleepyGuard {
    fn drop(&mut self) {
        fibra::sleep(Duration::from_millis(20));
        self.0.store(true, Ordering::SeqCst);
    }
}

#[test]
fn cancelled_fibers_may_wait_in_destructors() {
    in_child(|| {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos());
        let dir = env::temp_dir().join(format!(
            "fibra-waiting-destructors-{}-{nanos}",
            std::process::id()
        ));
        std::fs::create_dir_all(&dir).expect("create a temporary directory");
        let path = dir.join("buffered.txt");

        let sched = started(2, "cancel-dtor");
        let slept = Arc::new(AtomicBool::new(false));
        let (ready_tx, ready_rx) = mpsc::channel::<()>();
        let sleepy = {
            let (slept, ready_tx) = (Arc::clone(&slept), ready_tx.clone());
            sched
                .submit(
                    move || {
                        let _guard = SleepyGuard(slept);
                        let _ = ready_tx.send(());
                        fibra::sleep(Duration::from_secs(3600));
                    },
                    None,
                )
                .expect("submit")
        };
        let writer = {
            let path = path.clone();
            sched
                .submit(
                    move || {
                        let file = fibra::fs::File::create(&path).expect("create the file");
                        let mut out = std::io::BufWriter::new(file);
                        out.write_all(&[b'x'; 1000]).expect("buffered write");
                        let _ = ready_tx.send(());
                        fibra::sleep(Duration::from_secs(3600));
                        drop(out);
                    },
                    None,
                )
                .expect("submit")
        };
        for _ in 0..2 {
            check(ready_rx.recv_timeout(BOUND).is_ok(), || {
                "a fiber never got to its long sleep".into()
            });
        }
        let Some(cancelled) = within(BOUND, move || {
            let n = sched.stop_timeout(Duration::from_millis(100));
            drop(sched);
            n
        }) else {
            child_fail(format!(
                "stop_timeout(100 ms) did not return within {BOUND:?} with fibers whose \
             destructors wait"
            ));
        };
        check(cancelled == 2, || {
            format!("stop_timeout cancelled {cancelled} tasks, expected 2")
        });
        check(slept.load(Ordering::SeqCst), || {
            "the guard's destructor did not complete its sleep".into()
        });
        let written = std::fs::read(&path).map(|b| b.len());
        let _ = std::fs::remove_dir_all(&dir);
        check(matches!(written, Ok(1000)), || {
            format!(
                "the BufWriter of a cancelled fiber did not flush its 1000 bytes: \
             {written:?}"
            )
        });
        check(
            joined(sleepy, "the sleepy task").is_err_and(|e| e.is_cancelled()),
            || "the sleepy task does not report cancelled".into(),
        );
        check(
            joined(writer, "the writer task").is_err_and(|e| e.is_cancelled()),
            || "the writer task does not report cancelled".into(),
        );
    })
    .assert_ok(
        "cancelling fibers whose destructors wait (a sleep, a BufWriter flush to a \
         fibra::fs::File) aborts the process or hangs",
    );
}

// ================================================================== other threads fibra owns
// The timer, looper and pool threads and the blocking pool, with user Drops that panic there.

// A `fibra::time::Timer` job that panics with a payload whose Drop panics leaves the timer
// thread alive. Were the payload dropped outside the catch_unwind around the job, the panic
// would kill the thread: every later job would silently never run, `pending()` would stay
// non-zero and `shutdown` would return without running them.
#[test]
fn timer_thread_survives_a_panic_payload_whose_drop_panics() {
    with_deadline(|| {
        let timer = fibra::time::Timer::new();
        timer.schedule(Duration::ZERO, || panic::panic_any(Bomb));
        let (tx, rx) = mpsc::channel();
        timer.schedule(Duration::from_millis(50), move || {
            let _ = tx.send(());
        });
        let ran = rx.recv_timeout(BOUND).is_ok();
        let pending = timer.pending();
        assert!(
            within(BOUND, move || timer.shutdown()).is_some(),
            "Timer::shutdown hangs"
        );
        assert!(
            ran,
            "the fibra-timer thread died dropping a job's panic payload whose Drop \
             panics; the next job never ran ({pending} still pending)"
        );
    });
}

// As with a detached task's panic payload above, reached through the Executor API: a Looper
// job given to `execute` (its handle is dropped at once) that panics with a payload whose
// Drop panics leaves the looper thread alive; the next job runs (a dead looper thread would
// leave every later job waiting for ever).
#[test]
fn looper_execute_survives_a_job_whose_panic_payload_panics_on_drop() {
    in_child(|| {
        let looper = Looper::new();
        looper.execute(Box::new(|| panic::panic_any(Bomb)));
        let later = looper.spawn(|| 5_u32);
        check(later.wait_timeout(BOUND), || {
            "the looper thread died dropping a job's panic payload; the next job never ran".into()
        });
        check(
            within(BOUND, move || looper.shutdown(true)).is_some(),
            || "Looper::shutdown hangs".into(),
        );
    })
    .assert_ok(
        "Looper::execute of a job panicking with a payload whose Drop panics kills the \
         looper thread",
    );
}

// The same through `ThreadPool::execute`: the pool thread survives and runs the next job.
#[test]
fn thread_pool_execute_survives_a_job_whose_panic_payload_panics_on_drop() {
    in_child(|| {
        let pool = ThreadPool::new(1);
        pool.execute(Box::new(|| panic::panic_any(Bomb)));
        let later = pool.spawn(|| 5_u32);
        check(later.wait_timeout(BOUND), || {
            "the pool thread died dropping a job's panic payload; the next job never ran".into()
        });
        check(within(BOUND, move || pool.shutdown()).is_some(), || {
            "ThreadPool::shutdown hangs".into()
        });
    })
    .assert_ok(
        "ThreadPool::execute of a job panicking with a payload whose Drop panics kills \
         the pool thread",
    );
}

// `fibra::unblock` whose caller is cancelled by stop_timeout while the blocking function
// runs: the function's return value, which nobody will ever receive and whose Drop panics,
// does not abort the process. Dropped inside the cancelled fiber's unwinding (the `Call` on
// its stack), that panic would abort the whole process ("panic in a destructor during
// cleanup"); the user never held that value in a live frame, so it is dropped where a panic
// can be caught. The caller reports cancelled and the blocking pool still works.
#[test]
fn an_unreceived_unblock_result_whose_drop_panics_does_not_abort() {
    in_child(|| {
        let sched = started(1, "unblock-bomb");
        let (started_tx, started_rx) = mpsc::channel();
        let caller = sched
            .submit(
                move || {
                    let _value = fibra::unblock(move || {
                        let _ = started_tx.send(());
                        thread::sleep(Duration::from_millis(500));
                        Bomb
                    });
                },
                None,
            )
            .expect("submit");
        check(started_rx.recv_timeout(BOUND).is_ok(), || {
            "the blocking function never started".into()
        });
        let cancelled = within(BOUND, move || {
            let n = sched.stop_timeout(Duration::from_millis(50));
            drop(sched);
            n
        });
        check(cancelled == Some(1), || {
            format!("stop_timeout(50 ms) returned {cancelled:?}, expected Some(1)")
        });
        check(
            joined(caller, "the unblock caller").is_err_and(|e| e.is_cancelled()),
            || "the caller does not report cancelled".into(),
        );
        // The blocking pool still works.
        let sched = started(1, "unblock-after");
        let got = within(BOUND, move || {
            let v = sched.block_on(|| fibra::unblock(|| 5_u32));
            sched.stop();
            v
        });
        check(got == Some(5), || format!("unblock afterwards: {got:?}"));
    })
    .assert_ok(
        "the unreceived return value of an unblock call whose caller was cancelled is \
         dropped during the fiber's unwinding; its panicking Drop aborts the process",
    );
}

// ------------------------------------------------------------------ shutdown edges

/// A fiber that never suspends cannot be cancelled; `stop_timeout` still returns (within the
/// deadline, the grace and the wait for threads to exit), reports the stuck worker, and the
/// fibers parked on the *other* worker are cancelled normally.
#[test]
fn stop_timeout_returns_with_a_fiber_that_never_suspends() {
    in_child(|| {
        let sched = started(2, "busy");
        let spinning = Arc::new(AtomicBool::new(false));
        let busy = {
            let spinning = spinning.clone();
            sched
                .submit(
                    move || {
                        spinning.store(true, Ordering::SeqCst);
                        loop {
                            std::hint::spin_loop();
                        }
                    },
                    Some(0),
                )
                .expect("submit")
        };
        let sleeper = sched
            .submit(|| fibra::sleep(Duration::from_secs(3600)), Some(1))
            .expect("submit");
        check(
            eventually(BOUND, || spinning.load(Ordering::SeqCst)),
            || "the busy fiber never started".into(),
        );
        let Some(n) = within(STOP_BOUND, move || {
            let n = sched.stop_timeout(Duration::from_millis(50));
            // The scheduler's memory stays with the stuck worker thread; dropping is instant.
            drop(sched);
            n
        }) else {
            child_fail("stop_timeout(50 ms) did not return with a fiber that never suspends");
        };
        check(n >= 1, || format!("stop_timeout returned {n}"));
        check(
            sleeper
                .wait_timeout(Duration::ZERO)
                .then(|| sleeper.join())
                .is_some_and(|r| r.is_err_and(|e| e.is_cancelled())),
            || "the sleeper on the free worker was not cancelled".into(),
        );
        check(!busy.is_finished(), || {
            "the busy fiber cannot have finished".into()
        });
        std::mem::forget(busy);
        // The busy worker thread keeps spinning: the child leaves without waiting for it (the
        // process exits once this body returns).
    })
    .assert_ok("stop_timeout with a busy-looping fiber");
}

/// `stop_timeout` with zero and with `Duration::MAX`; `stop` and `stop_timeout` racing from
/// two threads; `block_on` and `submit` after a stop.
#[test]
fn stop_timeout_extremes_and_racing_stops() {
    with_deadline(|| {
        // Zero: parked fibers are cancelled at once; the count says how many.
        let sched = started(2, "zero");
        let parked: Vec<_> = (0..4)
            .map(|_| {
                sched
                    .submit(|| fibra::sleep(Duration::from_secs(3600)), None)
                    .expect("submit")
            })
            .collect();
        assert!(eventually(BOUND, || parked
            .iter()
            .all(|h| !h.is_finished())));
        thread::sleep(Duration::from_millis(20));
        assert_eq!(sched.stop_timeout(Duration::ZERO), 4);
        for h in parked {
            assert!(h.join().unwrap_err().is_cancelled());
        }
        // After the stop: submit refuses with the closure, block_on runs inline.
        assert!(sched.submit(|| 1, None).is_err());
        assert_eq!(sched.block_on(|| 7), 7);

        // Duration::MAX with nothing to cancel returns as soon as the work is done.
        let sched = started(2, "max");
        let h = sched.submit(|| 5, None).expect("submit");
        let begun = Instant::now();
        assert_eq!(sched.stop_timeout(Duration::MAX), 0);
        assert!(begun.elapsed() < BOUND);
        assert_eq!(h.join().unwrap(), 5);

        // stop() and stop_timeout() racing: the timeout escalates, both return.
        let sched = Arc::new(started(2, "race"));
        let (h, _gate) = gated_task(&sched);
        let waiter = {
            let sched = sched.clone();
            thread::spawn(move || sched.stop())
        };
        thread::sleep(Duration::from_millis(20));
        let n = sched.stop_timeout(Duration::from_millis(20));
        assert_eq!(n, 1);
        waiter.join().expect("stop() returned");
        assert!(h.join().unwrap_err().is_cancelled());
    });
}

/// The last `Arc<Scheduler>` dropped inside one of its own fibers: the drop cannot wait for
/// itself, so it starts the shutdown and returns; the remaining work still completes.
#[test]
fn dropping_the_scheduler_from_its_own_fiber_does_not_hang() {
    with_deadline(|| {
        let sched = Arc::new(started(2, "self-drop"));
        let (tx, rx) = mpsc::channel();
        let other = sched
            .submit(
                || {
                    fibra::sleep(Duration::from_millis(30));
                    3
                },
                None,
            )
            .expect("submit");
        let s = sched.clone();
        drop(sched);
        let last = Arc::downgrade(&s);
        // Detached: the handle is dropped at once.
        drop(
            s.clone()
                .submit(
                    move || {
                        drop(s);
                        let _ = tx.send(());
                    },
                    None,
                )
                .expect("submit"),
        );
        rx.recv_timeout(BOUND)
            .expect("the fiber dropped the scheduler and went on");
        assert_eq!(finish(other), 3);
        assert!(eventually(BOUND, || last.strong_count() == 0));
    });
}
