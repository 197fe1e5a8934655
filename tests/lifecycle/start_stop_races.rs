//! Starting and stopping under pressure: `use_caller` under a thread cap, concurrent
//! `start`s and a `start` racing `stop`, `JoinSet::cancel_all` racing finishing tasks, panic
//! payloads (and results, closures) whose `Drop` panics, and the hooks under a seccomp filter
//! that refuses `process_vm_readv`/`process_vm_writev` (with `--features hook`). Everything
//! that changes a uid, a limit or a seccomp filter runs in a child process
//! (`crate::common::in_child`).

#![cfg_attr(not(feature = "hook"), allow(dead_code, unused_imports))]

use std::collections::HashSet;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use crate::common::{cap_threads, uncap_threads, with_deadline, LIMIT};
use fibra::{JoinSet, Scheduler};

const UC_UID: libc::uid_t = 61_901;
const UC_STOP_UID: libc::uid_t = 61_902;
const UC_TIMEOUT_UID: libc::uid_t = 61_903;
const UC_DROP_UID: libc::uid_t = 61_904;
const PARTIAL_UID: libc::uid_t = 61_905;
const PARTIAL_UC_UID: libc::uid_t = 61_906;
const CONC_UID: libc::uid_t = 61_907;
const RACE_UID: libc::uid_t = 61_908;

fn msg_of(r: std::thread::Result<impl Sized>) -> String {
    match r {
        Ok(_) => "<no panic>".to_string(),
        Err(p) => {
            crate::common::panic_message(&*p).unwrap_or_else(|| "<non-string payload>".into())
        }
    }
}

/// The names of this process's threads (`comm`, 15 bytes at most).
fn thread_names() -> Vec<String> {
    let mut names = Vec::new();
    if let Ok(dir) = std::fs::read_dir("/proc/self/task") {
        for e in dir.flatten() {
            if let Ok(n) = std::fs::read_to_string(e.path().join("comm")) {
                names.push(n.trim_end().to_string());
            }
        }
    }
    names
}

/// How many live threads are named `{prefix}-{i}` for each `i` below `n`.
fn worker_threads(prefix: &str, n: usize) -> Vec<usize> {
    let names = thread_names();
    (0..n)
        .map(|i| {
            let want = format!("{prefix}-{i}");
            names.iter().filter(|n| **n == want).count()
        })
        .collect()
}

/// Runs `f` on a thread of its own and returns whether it ended within `limit`.
fn ends_within(limit: Duration, f: impl FnOnce() + Send + 'static) -> bool {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        f();
        let _ = tx.send(());
    });
    rx.recv_timeout(limit).is_ok()
}

// ================================================== 1. use_caller under a thread cap

/// A `use_caller` scheduler of `threads` workers whose `start` panicked: the OS, capped for
/// `uid` at the threads there are now, refused every worker thread.
fn use_caller_with_other_workers_refused(threads: usize, uid: libc::uid_t) -> Scheduler {
    let s = Scheduler::builder()
        .threads(threads)
        .use_caller(true)
        .build()
        .unwrap();
    cap_threads(uid, 0);
    assert!(catch_unwind(AssertUnwindSafe(|| s.start())).is_err());
    s
}

/// A `use_caller` scheduler whose other workers the OS refuses: `start` and `block_on` panic
/// saying which worker; the closure of the refused `block_on` never runs; once threads can be
/// had again `block_on` works and the pinned work runs; `stop` on the building thread ends.
#[test]
fn use_caller_start_and_block_on_under_a_thread_cap_then_retried() {
    crate::common::child_ok(|| {
        let s = Scheduler::builder()
            .threads(3)
            .name("ucc")
            .use_caller(true)
            .build()
            .unwrap();
        cap_threads(UC_UID, 0);
        let m = msg_of(catch_unwind(AssertUnwindSafe(|| s.start())));
        assert!(m.contains("cannot spawn worker thread 1"), "start: {m}");
        let ran = Arc::new(AtomicBool::new(false));
        let r = ran.clone();
        let m = msg_of(catch_unwind(AssertUnwindSafe(|| {
            s.block_on(move || {
                r.store(true, Ordering::SeqCst);
                7
            })
        })));
        assert!(m.contains("cannot spawn worker thread 1"), "block_on: {m}");
        let pinned: Vec<_> = (0..3)
            .map(|w| s.submit(fibra::current_worker, Some(w)).unwrap())
            .collect();
        assert!(!pinned[1].wait_timeout(Duration::from_millis(50)));
        uncap_threads();
        assert_eq!(s.block_on(|| 7), 7);
        for (w, h) in pinned.into_iter().enumerate() {
            if w == 0 {
                // Worker 0 runs only while the building thread drives it.
                let h = Arc::new(h);
                let h2 = h.clone();
                s.block_on(move || assert!(h2.wait_timeout(LIMIT)));
                let h = Arc::try_unwrap(h).unwrap();
                assert_eq!(h.join().unwrap(), Some(0));
            } else {
                assert_eq!(crate::common::finish(h), Some(w));
            }
        }
        assert!(
            !ran.load(Ordering::SeqCst),
            "the refused block_on's closure ran"
        );
        s.stop();
        assert_eq!(worker_threads("ucc", 3), [0, 0, 0]);
    });
}

/// `use_caller`, every other worker refused and still refused at `stop`: the stop on the
/// building thread runs worker 0's and the shared work, fails what was pinned to the missing
/// workers, and ends.
#[test]
fn use_caller_stop_while_the_other_workers_are_still_refused() {
    crate::common::child_ok(|| {
        let s = use_caller_with_other_workers_refused(3, UC_STOP_UID);
        let anywhere = s.submit(|| 1, None).unwrap();
        let on0 = s.submit(fibra::current_worker, Some(0)).unwrap();
        let on2 = s.submit(|| 2, Some(2)).unwrap();
        let sleeper = s
            .submit(
                || {
                    fibra::sleep(Duration::from_millis(50));
                    3
                },
                None,
            )
            .unwrap();
        let t = Instant::now();
        s.stop();
        assert!(t.elapsed() < LIMIT, "stop took {:?}", t.elapsed());
        assert_eq!(anywhere.join().unwrap(), 1);
        assert_eq!(on0.join().unwrap(), Some(0));
        assert_eq!(sleeper.join().unwrap(), 3);
        assert!(on2.join().unwrap_err().is_cancelled());
        assert!(matches!(
            s.submit(|| 4, None),
            Err(fibra::SubmitError::Stopped(_))
        ));
        uncap_threads();
    });
}

/// `use_caller` under the cap: `stop_timeout` on the building thread cancels a fiber that
/// sleeps for ever on worker 0 and returns within its bound.
#[test]
fn use_caller_stop_timeout_under_a_thread_cap() {
    crate::common::child_ok(|| {
        let s = use_caller_with_other_workers_refused(2, UC_TIMEOUT_UID);
        let dropped = Arc::new(AtomicUsize::new(0));
        let d = dropped.clone();
        let forever = s
            .submit(
                move || {
                    let _c = crate::common::Counted(d);
                    fibra::sleep(Duration::from_secs(3600));
                },
                Some(0),
            )
            .unwrap();
        let pinned1 = s.submit(|| 1, Some(1)).unwrap();
        let t = Instant::now();
        let n = s.stop_timeout(Duration::from_millis(200));
        let took = t.elapsed();
        assert!(took < Duration::from_secs(15), "stop_timeout took {took:?}");
        assert!(n >= 1, "cancelled {n}");
        assert!(forever.join().unwrap_err().is_cancelled());
        assert_eq!(dropped.load(Ordering::SeqCst), 1, "the fiber unwound");
        assert!(pinned1.join().unwrap_err().is_cancelled());
        uncap_threads();
    });
}

/// `use_caller` under the cap, dropped on the building thread without `stop` while a task
/// queued for worker 0 and one for a refused worker wait: the drop ends (worker 0's task
/// runs, the other fails).
#[test]
fn use_caller_drop_under_a_thread_cap() {
    crate::common::child_ok(|| {
        let s = use_caller_with_other_workers_refused(2, UC_DROP_UID);
        let on0 = s.submit(|| 5, Some(0)).unwrap();
        let on1 = s.submit(|| 6, Some(1)).unwrap();
        let t = Instant::now();
        drop(s);
        assert!(t.elapsed() < LIMIT, "drop took {:?}", t.elapsed());
        assert_eq!(on0.join().unwrap(), 5);
        assert!(on1.join().unwrap_err().is_cancelled());
        uncap_threads();
    });
}

/// `block_on` on a scheduler the OS let start only some of its workers: `block_on` panics
/// (the OS refused a worker) — and then the closure it was given must not run, since nobody
/// waits for it any more (block_on's own comment: "it must not run later ... with nobody
/// waiting for it"). A worker that did start runs it at once, and the panic's cancellation
/// then unwinds it from its first wait: the closure ran half-way, unseen.
#[test]
fn refused_block_on_does_not_run_its_closure_on_the_workers_that_started() {
    crate::common::child_ok(|| refused_block_on_leaves_its_closure_unrun(false));
}

/// The same with `use_caller`: the building thread would drive worker 0, worker 1 starts
/// and worker 2 is refused.
#[test]
fn refused_use_caller_block_on_does_not_run_its_closure_on_the_workers_that_started() {
    crate::common::child_ok(|| refused_block_on_leaves_its_closure_unrun(true));
}

/// The body of the refused-`block_on` tests (in a child process: it caps the threads): one
/// worker thread may start, the next is refused; `block_on` panics and its closure never
/// starts.
fn refused_block_on_leaves_its_closure_unrun(use_caller: bool) {
    let s = Scheduler::builder()
        .threads(if use_caller { 3 } else { 2 })
        .use_caller(use_caller)
        .build()
        .unwrap();
    // One worker thread may start, the next is refused.
    cap_threads(
        if use_caller {
            PARTIAL_UC_UID
        } else {
            PARTIAL_UID
        },
        1,
    );
    let started = Arc::new(AtomicBool::new(false));
    let finished = Arc::new(AtomicBool::new(false));
    let (st, fi) = (started.clone(), finished.clone());
    let r = catch_unwind(AssertUnwindSafe(|| {
        s.block_on(move || {
            st.store(true, Ordering::SeqCst);
            fibra::sleep(Duration::from_millis(300));
            fi.store(true, Ordering::SeqCst);
            1
        })
    }));
    let m = msg_of(r);
    assert!(m.contains("cannot spawn worker thread"), "{m}");
    std::thread::sleep(Duration::from_millis(800));
    let (st, fi) = (
        started.load(Ordering::SeqCst),
        finished.load(Ordering::SeqCst),
    );
    eprintln!("block_on panicked ({m}); its closure started: {st}, finished: {fi}");
    assert!(
        !st,
        "block_on panicked, yet its closure ran on a worker that did start (finished: {fi})"
    );
    uncap_threads();
    s.stop();
}

// ================================================== 2. concurrent starts

/// Several threads call `start` at once: every worker thread is spawned exactly once, and
/// `stop` ends and joins them all.
#[test]
fn concurrent_starts_spawn_each_worker_once() {
    with_deadline(|| {
        for round in 0..20 {
            let name = format!("cs{round}");
            let s = Arc::new(Scheduler::builder().threads(6).name(&name).build().unwrap());
            let go = Arc::new(Barrier::new(4));
            let starters: Vec<_> = (0..4)
                .map(|_| {
                    let (s, go) = (s.clone(), go.clone());
                    std::thread::spawn(move || {
                        go.wait();
                        s.start();
                        // Every start returns with the workers there.
                        s.submit(|| 1, Some(5)).unwrap().join().unwrap()
                    })
                })
                .collect();
            for t in starters {
                assert_eq!(t.join().unwrap(), 1);
            }
            assert_eq!(worker_threads(&name, 6), [1; 6], "round {round}");
            crate::common::every_worker_runs(&s);
            assert!(ends_within(LIMIT, {
                let s = s.clone();
                move || s.stop()
            }));
            assert_eq!(worker_threads(&name, 6), [0; 6], "round {round}: joined");
        }
    });
}

/// The same under a thread cap that lets only some workers start: each start that gets no
/// thread panics; the workers that run are distinct; after the cap is lifted one `start`
/// spawns the rest, each exactly once, and `stop` ends.
#[test]
fn concurrent_starts_under_a_thread_cap() {
    crate::common::child_ok(|| {
        let s = Arc::new(Scheduler::builder().threads(8).name("cc").build().unwrap());
        let go = Arc::new(Barrier::new(5));
        let starters: Vec<_> = (0..4)
            .map(|_| {
                let (s, go) = (s.clone(), go.clone());
                std::thread::spawn(move || {
                    go.wait();
                    catch_unwind(AssertUnwindSafe(|| s.start())).is_ok()
                })
            })
            .collect();
        // The starters exist, blocked on the barrier's last party: cap at 3 more threads.
        cap_threads(CONC_UID, 3);
        go.wait();
        let ok: Vec<bool> = starters.into_iter().map(|t| t.join().unwrap()).collect();
        assert!(
            ok.iter().all(|ok| !ok),
            "every start under the cap panics: {ok:?}"
        );
        let running = worker_threads("cc", 8);
        assert!(running.iter().all(|&n| n <= 1), "{running:?}");
        uncap_threads();
        s.start();
        assert_eq!(worker_threads("cc", 8), [1; 8]);
        crate::common::every_worker_runs(&s);
        assert!(ends_within(LIMIT, {
            let s = s.clone();
            move || s.stop()
        }));
        assert_eq!(worker_threads("cc", 8), [0; 8]);
    });
}

/// Thread creations counted while `COUNTING` is set: `pthread_create` is interposed here,
/// as fibra's hooks interpose libc's calls, and passes every call on to libc's.
static COUNTING: AtomicBool = AtomicBool::new(false);
static CREATED: AtomicUsize = AtomicUsize::new(0);

type PthreadCreate = unsafe extern "C" fn(
    *mut libc::pthread_t,
    *const libc::pthread_attr_t,
    extern "C" fn(*mut libc::c_void) -> *mut libc::c_void,
    *mut libc::c_void,
) -> libc::c_int;

/// Counts a thread creation, then creates it with libc's `pthread_create`.
///
/// # Safety
/// The caller's arguments, as libc's `pthread_create` requires them.
#[no_mangle]
pub unsafe extern "C" fn pthread_create(
    t: *mut libc::pthread_t,
    attr: *const libc::pthread_attr_t,
    f: extern "C" fn(*mut libc::c_void) -> *mut libc::c_void,
    arg: *mut libc::c_void,
) -> libc::c_int {
    static REAL: AtomicUsize = AtomicUsize::new(0);
    let mut real = REAL.load(Ordering::Relaxed);
    if real == 0 {
        // SAFETY: a symbol lookup with a valid name.
        real = unsafe { libc::dlsym(libc::RTLD_NEXT, c"pthread_create".as_ptr()) } as usize;
        REAL.store(real, Ordering::Relaxed);
    }
    if COUNTING.load(Ordering::SeqCst) {
        CREATED.fetch_add(1, Ordering::SeqCst);
    }
    // SAFETY: libc's own pthread_create, with the caller's arguments.
    unsafe { std::mem::transmute::<usize, PthreadCreate>(real)(t, attr, f, arg) }
}

/// Both threads spin until `flag` turns true, then run, so they start within nanoseconds.
fn spin_until(flag: &AtomicBool) {
    while !flag.load(Ordering::Acquire) {
        std::hint::spin_loop();
    }
}

/// After a `start` the OS refused a worker, the cap is lifted and, at once, one thread
/// retries `start` while another calls `stop`. The missing worker must be spawned once, and
/// nothing else: `spawn_workers` picks the indices from `threads.len()`, and `join_workers`
/// empties that vector, so a `start` (or a second `stop`) still waiting for the lock when the
/// stop takes the vector spawns every worker again, after the stop, and nobody joins them.
#[test]
fn start_retried_while_stop_runs_spawns_no_worker_twice() {
    crate::common::child_ok(|| start_races_stop(false));
}

/// The same race on a scheduler never started: `start` and `stop` at once.
#[test]
fn start_racing_stop_on_a_new_scheduler_spawns_no_worker_twice() {
    let run = crate::common::in_child(|| start_races_stop(true));
    let lines: Vec<&str> = run
        .stderr
        .lines()
        .filter(|l| l.contains("rounds"))
        .collect();
    assert!(run.passed(), "{:?}\n{}", run.status, lines.join("\n"));
}

/// The body of the start/stop race tests (in a child process: it caps the threads and
/// counts thread creations): `LIFECYCLE_RACE_ROUNDS` rounds (3000 by default) of a `start`
/// and a `stop` let go at once, on a scheduler whose `start` the OS refused one worker
/// (`fresh` false) or on one never started (`fresh` true); each round must create the
/// missing workers once, and nothing else.
fn start_races_stop(fresh: bool) {
    let t0 = Instant::now();
    let rounds: usize = std::env::var("LIFECYCLE_RACE_ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(3000);
    // Fresh: start and stop race on a scheduler never started (no cap); the workers are
    // spawned once (2) or not at all (the stop came first).
    type Job = (Arc<Scheduler>, Arc<AtomicBool>, u32);
    let (work_tx, work_rx) = std::sync::mpsc::channel::<Job>();
    let (done_tx, done_rx) = std::sync::mpsc::channel::<String>();
    let starter = std::thread::spawn(move || {
        for (s, go, delay) in work_rx {
            spin_until(&go);
            for _ in 0..delay {
                std::hint::spin_loop();
            }
            let _ = done_tx.send(msg_of(catch_unwind(AssertUnwindSafe(|| s.start()))));
        }
    });
    let (stop_tx, stop_rx) = std::sync::mpsc::channel::<Job>();
    let (sdone_tx, sdone_rx) = std::sync::mpsc::channel::<()>();
    let stopper = std::thread::spawn(move || {
        for (s, go, delay) in stop_rx {
            spin_until(&go);
            for _ in 0..delay {
                std::hint::spin_loop();
            }
            s.stop();
            let _ = sdone_tx.send(());
        }
    });
    let mut bad = Vec::new();
    let mut skipped = 0;
    let mut seed = 0x1234_5678u32;
    for round in 0..rounds {
        let s = Arc::new(
            Scheduler::builder()
                .threads(2)
                .name(format!("r{round}"))
                .watchdog(Duration::ZERO)
                .build()
                .unwrap(),
        );
        let expected = if fresh {
            2
        } else {
            cap_threads(RACE_UID, 1);
            let refused = catch_unwind(AssertUnwindSafe(|| s.start())).is_err();
            uncap_threads();
            if !refused {
                // The cap counts this process's threads when it is set; one that was still
                // exiting then (an earlier round's) left room for a second worker. Not the
                // case under test: next round.
                s.stop();
                skipped += 1;
                continue;
            }
            1
        };
        let go = Arc::new(AtomicBool::new(false));
        seed ^= seed << 13;
        seed ^= seed >> 17;
        seed ^= seed << 5;
        let delays = (seed % 200, (seed >> 8) % 200);
        work_tx.send((s.clone(), go.clone(), delays.0)).unwrap();
        stop_tx.send((s.clone(), go.clone(), delays.1)).unwrap();
        std::thread::sleep(Duration::from_millis(1));
        CREATED.store(0, Ordering::SeqCst);
        COUNTING.store(true, Ordering::SeqCst);
        go.store(true, Ordering::Release);
        let started = done_rx.recv_timeout(LIMIT).expect("start returned");
        sdone_rx.recv_timeout(LIMIT).expect("stop returned");
        COUNTING.store(false, Ordering::SeqCst);
        let created = CREATED.load(Ordering::SeqCst);
        if created != expected && !(fresh && created == 0) {
            // Whether a worker thread of this scheduler is still alive now that `stop`
            // returned (it joined every worker it knew of).
            let alive = worker_threads(&format!("r{round}"), 2);
            bad.push((round, created, started, delays, alive));
        }
        drop(s);
    }
    drop((work_tx, stop_tx));
    starter.join().unwrap();
    stopper.join().unwrap();
    eprintln!(
        "{rounds} rounds in {:?} ({skipped} skipped: the cap let the start through)",
        t0.elapsed()
    );
    assert!(
        skipped < rounds / 2,
        "too few rounds raced: {skipped} skipped"
    );
    eprintln!(
        "{} of {rounds} rounds spawned other threads than the missing workers, once: {:?}",
        bad.len(),
        &bad[..bad.len().min(10)]
    );
    assert!(
        bad.is_empty(),
        "worker threads spawned twice: {:?}",
        &bad[..bad.len().min(10)]
    );
}

// ================================================== 3. JoinSet::cancel_all racing finishes

/// A small xorshift for the tests' random choices.
fn next(seed: &mut u64) -> u64 {
    *seed ^= *seed << 13;
    *seed ^= *seed >> 7;
    *seed ^= *seed << 17;
    *seed
}

/// Fills a set with tasks that finish at scattered moments (at once, after yields, after
/// short sleeps); `cancel_all` lands while they finish, with `try_join_next` draining around
/// it; then `join_next` to the end. Every task comes back exactly once, with its own value or
/// cancelled; every value is dropped exactly once; nothing waits for ever.
fn cancel_all_while_finishing(sched: &Scheduler, seed: &mut u64, in_fiber: bool) {
    const N: usize = 48;
    let made = Arc::new(AtomicUsize::new(0));
    let dropped = Arc::new(AtomicUsize::new(0));
    let mut set: JoinSet<(usize, crate::common::Counted)> = JoinSet::new();
    let mut ids = std::collections::HashMap::new();
    for i in 0..N {
        let how = next(seed) % 4;
        let (made, dropped) = (made.clone(), dropped.clone());
        let f = move || {
            match how {
                0 => {}
                1 => fibra::Fiber::yield_now(),
                2 => fibra::sleep(Duration::from_micros(200)),
                _ => fibra::sleep(Duration::from_millis(2)),
            }
            made.fetch_add(1, Ordering::SeqCst);
            (i, crate::common::Counted(dropped))
        };
        let id = if in_fiber {
            set.spawn(f)
        } else {
            set.spawn_on(sched, f)
        };
        ids.insert(id, i);
    }
    let mut seen = HashSet::new();
    let mut values = 0;
    let mut cancelled = 0;
    let mut take =
        |id: fibra::FiberId, r: Result<(usize, crate::common::Counted), fibra::JoinError>| {
            assert!(seen.insert(id), "task {id} returned twice");
            match r {
                Ok((i, c)) => {
                    assert_eq!(ids[&id], i, "task {id} returned another's value");
                    values += 1;
                    drop(c);
                }
                Err(e) => {
                    assert!(e.is_cancelled(), "{e}");
                    cancelled += 1;
                }
            }
        };
    let spins = next(seed) % 3000;
    let t = Instant::now();
    while t.elapsed() < Duration::from_micros(spins) {
        if next(seed).is_multiple_of(2) {
            if let Some(r) = set.try_join_next() {
                // try_join_next gives no id: recover it by elimination below.
                let (i, c) = r.expect("no cancellation yet");
                let id = *ids.iter().find(|(_, v)| **v == i).unwrap().0;
                take(id, Ok((i, c)));
            }
        }
        if in_fiber {
            fibra::Fiber::yield_now();
        }
    }
    set.cancel_all();
    set.cancel_all();
    // try_join_next names no task: its cancellations are counted apart.
    let mut anonymous = 0;
    while let Some(r) = set.try_join_next() {
        match r {
            Ok((i, c)) => {
                let id = *ids.iter().find(|(_, v)| **v == i).unwrap().0;
                take(id, Ok((i, c)));
            }
            Err(e) => {
                assert!(e.is_cancelled(), "{e}");
                anonymous += 1;
            }
        }
        if next(seed).is_multiple_of(3) {
            break;
        }
    }
    set.cancel_all();
    while let Some((id, r)) = set.join_next_with_id() {
        take(id, r);
    }
    assert!(set.is_empty());
    assert!(set.join_next().is_none());
    assert_eq!(seen.len() + anonymous, N, "every task accounted for");
    assert_eq!(values + cancelled + anonymous, N);
    assert!(values <= made.load(Ordering::SeqCst), "values returned");
    // Every value made is dropped exactly once (by us here; a task makes its value after its
    // last suspension, so a cancellation never comes between making and returning it).
    wait_until_eq(&dropped, made.load(Ordering::SeqCst));
}

fn wait_until_eq(n: &AtomicUsize, want: usize) {
    crate::common::wait_until("every value dropped once", || {
        n.load(Ordering::SeqCst) >= want
    });
    std::thread::sleep(Duration::from_millis(5));
    assert_eq!(
        n.load(Ordering::SeqCst),
        want,
        "values dropped exactly once"
    );
}

#[test]
fn join_set_cancel_all_while_tasks_finish_from_a_thread() {
    with_deadline(|| {
        let s = crate::common::started(2);
        let mut seed = 0x9E37_79B9_7F4A_7C15;
        for _ in 0..150 {
            cancel_all_while_finishing(&s, &mut seed, false);
        }
        s.stop();
    });
}

#[test]
fn join_set_cancel_all_while_tasks_finish_in_a_fiber() {
    with_deadline(|| {
        let s = crate::common::started(2);
        let s2 = Arc::new(Scheduler::builder().threads(1).build().unwrap());
        s.block_on(move || {
            let mut seed = 0xDEAD_BEEF_1234_5678;
            for _ in 0..150 {
                cancel_all_while_finishing(&s2, &mut seed, true);
            }
        });
        s.stop();
    });
}

/// A set dropped while its tasks finish: each value made is dropped exactly once (by the
/// set's cancel or by fibra), and every closure once.
#[test]
fn join_set_dropped_while_tasks_finish_drops_each_value_once() {
    with_deadline(|| {
        let s = crate::common::started(2);
        let mut seed = 77u64;
        for _ in 0..200 {
            let values = Arc::new(AtomicUsize::new(0));
            let closures = Arc::new(AtomicUsize::new(0));
            let made = Arc::new(AtomicUsize::new(0));
            let mut set = JoinSet::new();
            for _ in 0..16 {
                let how = next(&mut seed) % 3;
                let (v, m) = (values.clone(), made.clone());
                let cl = crate::common::Counted(closures.clone());
                set.spawn_on(&s, move || {
                    let _cl = cl;
                    match how {
                        0 => {}
                        1 => fibra::Fiber::yield_now(),
                        _ => fibra::sleep(Duration::from_micros(300)),
                    }
                    m.fetch_add(1, Ordering::SeqCst);
                    crate::common::Counted(v)
                });
            }
            std::thread::sleep(Duration::from_micros(next(&mut seed) % 600));
            drop(set);
            wait_until_eq(&closures, 16);
            wait_until_eq(&values, made.load(Ordering::SeqCst));
        }
        s.stop();
    });
}

// ================================================== 4. payloads whose Drop panics

/// A value whose destructor panics.
struct PanicsOnDrop(Arc<AtomicUsize>);

impl Drop for PanicsOnDrop {
    fn drop(&mut self) {
        self.0.fetch_add(1, Ordering::SeqCst);
        panic!("PanicsOnDrop dropped");
    }
}

/// Takes a payload that must be a `PanicsOnDrop` and leaks it (its drop would panic here).
fn leak_pod(p: Box<dyn std::any::Any + Send>) {
    assert!(p.is::<PanicsOnDrop>(), "the task's own payload");
    std::mem::forget(p);
}

#[test]
fn panic_payload_that_panics_on_drop_joined_detached_and_in_block_on() {
    with_deadline(|| {
        let s = crate::common::started(2);
        let drops = Arc::new(AtomicUsize::new(0));
        // Joined.
        let d = drops.clone();
        let h = s
            .submit(move || std::panic::panic_any(PanicsOnDrop(d)), None)
            .unwrap();
        let e = h.join().unwrap_err();
        assert!(e.is_panic());
        assert!(!format!("{e} {e:?}").is_empty());
        leak_pod(e.into_panic());
        // Detached before it finishes, and after.
        for before in [true, false] {
            let d = drops.clone();
            let h = s
                .submit(
                    move || {
                        fibra::sleep(Duration::from_millis(20));
                        std::panic::panic_any(PanicsOnDrop(d))
                    },
                    None,
                )
                .unwrap();
            if !before {
                assert!(h.wait_timeout(LIMIT));
            }
            let before_drops = drops.load(Ordering::SeqCst);
            let r = catch_unwind(AssertUnwindSafe(|| drop(h)));
            assert!(r.is_ok(), "dropping a detached handle does not panic");
            crate::common::wait_until("the payload dropped", || {
                drops.load(Ordering::SeqCst) > before_drops
            });
        }
        // block_on: the payload reaches the caller.
        let d = drops.clone();
        let r = catch_unwind(AssertUnwindSafe(|| {
            s.block_on(move || std::panic::panic_any(PanicsOnDrop(d)))
        }));
        leak_pod(r.unwrap_err());
        crate::common::every_worker_runs(&s);
        assert_eq!(s.block_on(|| 5), 5);
        s.stop();
    });
}

#[test]
fn panic_payload_that_panics_on_drop_in_join_set() {
    with_deadline(|| {
        let s = crate::common::started(2);
        let drops = Arc::new(AtomicUsize::new(0));
        let mut set = JoinSet::new();
        for i in 0..8 {
            let d = drops.clone();
            set.spawn_on(&s, move || {
                if i % 2 == 0 {
                    std::panic::panic_any(PanicsOnDrop(d));
                }
                i
            });
        }
        let mut ok = 0;
        let mut panics = 0;
        while let Some(r) = set.join_next() {
            match r {
                Ok(_) => ok += 1,
                Err(e) => {
                    panics += 1;
                    leak_pod(e.into_panic());
                }
            }
        }
        assert_eq!((ok, panics), (4, 4));
        // A set dropped with panicking tasks still in it (finished and not).
        let mut set = JoinSet::new();
        for i in 0..8u64 {
            let d = drops.clone();
            set.spawn_on(&s, move || {
                fibra::sleep(Duration::from_millis(i * 3));
                std::panic::panic_any(PanicsOnDrop(d))
            });
        }
        std::thread::sleep(Duration::from_millis(12));
        let before = drops.load(Ordering::SeqCst);
        let r = catch_unwind(AssertUnwindSafe(|| drop(set)));
        assert!(r.is_ok(), "dropping the set does not panic");
        let _ = before;
        crate::common::every_worker_runs(&s);
        s.stop();
    });
}

#[test]
fn panic_payload_that_panics_on_drop_in_scope() {
    with_deadline(|| {
        let s = crate::common::started(2);
        let drops = Arc::new(AtomicUsize::new(0));
        // Joined: the scope returns normally.
        let d = drops.clone();
        let v = s.block_on(move || {
            fibra::scope(|sc| {
                let h = sc.spawn(move || -> u32 { std::panic::panic_any(PanicsOnDrop(d)) });
                let e = h.join().unwrap_err();
                leak_pod(e.into_panic());
                9
            })
        });
        assert_eq!(v, 9);
        // Not joined, handle dropped before the fiber ends: the scope panics, saying so.
        let d = drops.clone();
        let r = catch_unwind(AssertUnwindSafe(|| {
            s.block_on(move || {
                fibra::scope(|sc| {
                    drop(sc.spawn(move || {
                        fibra::sleep(Duration::from_millis(20));
                        std::panic::panic_any(PanicsOnDrop(d))
                    }));
                    1
                })
            })
        }));
        let m = msg_of(r);
        assert!(m.contains("scoped fiber panicked"), "{m}");
        // Not joined, handle kept to the end of the scope's closure.
        let d = drops.clone();
        let r = catch_unwind(AssertUnwindSafe(|| {
            s.block_on(move || {
                fibra::scope(|sc| {
                    let h = sc.spawn(move || -> u32 { std::panic::panic_any(PanicsOnDrop(d)) });
                    while !h.is_finished() {
                        fibra::Fiber::yield_now();
                    }
                    std::mem::forget(h);
                    1
                })
            })
        }));
        let m = msg_of(r);
        assert!(m.contains("scoped fiber panicked"), "{m}");
        crate::common::every_worker_runs(&s);
        s.stop();
    });
}

#[test]
fn panic_payload_that_panics_on_drop_in_continuations() {
    with_deadline(|| {
        let s = crate::common::started(2);
        let drops = Arc::new(AtomicUsize::new(0));
        let ran = Arc::new(AtomicUsize::new(0));
        for registered_late in [false, true] {
            let d = drops.clone();
            let (tx, rx) = std::sync::mpsc::channel::<()>();
            let h = s
                .submit(
                    move || -> u32 {
                        let _ = fibra::unblock(move || rx.recv_timeout(LIMIT));
                        std::panic::panic_any(PanicsOnDrop(d))
                    },
                    None,
                )
                .unwrap();
            let mut tx = Some(tx);
            if registered_late {
                drop(tx.take());
                assert!(h.wait_timeout(LIMIT));
            }
            let (r1, r2, r3) = (ran.clone(), ran.clone(), ran.clone());
            let (d1, d2, d3) = (drops.clone(), drops.clone(), drops.clone());
            let carried = PanicsOnDrop(drops.clone());
            let r = catch_unwind(AssertUnwindSafe(|| {
                h.then(move |_| {
                    let _c = &carried;
                    r1.fetch_add(100, Ordering::SeqCst);
                })
                .catching(move |e| {
                    assert!(e.is_panic());
                    r2.fetch_add(1, Ordering::SeqCst);
                    std::panic::panic_any(PanicsOnDrop(d1))
                })
                .finally(move || {
                    r3.fetch_add(1, Ordering::SeqCst);
                    let _p = PanicsOnDrop(d2);
                    let _q = d3;
                });
            }));
            assert!(r.is_ok(), "registering continuations does not panic");
            drop(tx);
            let e = h.join().unwrap_err();
            leak_pod(e.into_panic());
        }
        assert_eq!(
            ran.load(Ordering::SeqCst),
            4,
            "catching and finally ran, then did not"
        );
        crate::common::every_worker_runs(&s);
        s.stop();
    });
}

/// A result whose Drop panics, its handle dropped unjoined (before and after it finished);
/// a closure whose Drop panics, refused by a stopped scheduler (`submit` hands it back,
/// `spawn` and `JoinSet::spawn_on` report cancelled) or failed unstarted by `stop_timeout`.
#[test]
fn results_and_closures_that_panic_on_drop() {
    with_deadline(|| {
        let s = crate::common::started(1);
        let drops = Arc::new(AtomicUsize::new(0));
        for before in [true, false] {
            let d = drops.clone();
            let h = s
                .submit(
                    move || {
                        fibra::sleep(Duration::from_millis(10));
                        PanicsOnDrop(d)
                    },
                    None,
                )
                .unwrap();
            if !before {
                assert!(h.wait_timeout(LIMIT));
            }
            let n = drops.load(Ordering::SeqCst);
            assert!(catch_unwind(AssertUnwindSafe(|| drop(h))).is_ok());
            crate::common::wait_until("the result dropped", || drops.load(Ordering::SeqCst) > n);
        }
        crate::common::every_worker_runs(&s);
        // Queued behind a fiber that blocks the worker's thread, failed by stop_timeout.
        let blocker = s
            .submit(
                || crate::common::block_thread(Duration::from_millis(300)),
                Some(0),
            )
            .unwrap();
        std::thread::sleep(Duration::from_millis(30));
        let queued: Vec<_> = (0..4)
            .map(|_| {
                let p = PanicsOnDrop(drops.clone());
                s.submit(
                    move || {
                        let _p = &p;
                        1
                    },
                    Some(0),
                )
                .unwrap()
            })
            .collect();
        let n0 = drops.load(Ordering::SeqCst);
        let t = Instant::now();
        let _ = s.stop_timeout(Duration::from_millis(50));
        assert!(t.elapsed() < LIMIT);
        blocker.join().unwrap();
        for h in queued {
            let r = h.join();
            assert!(r.as_ref().is_err_and(|e| e.is_cancelled()), "{:?}", r.err());
        }
        assert_eq!(
            drops.load(Ordering::SeqCst),
            n0 + 4,
            "each closure dropped once"
        );
        // Refused after the stop.
        let p = PanicsOnDrop(drops.clone());
        match s.submit(move || drop(p), None) {
            Err(fibra::SubmitError::Stopped(f)) => std::mem::forget(f),
            other => panic!("not refused: {:?}", other.is_ok()),
        }
        let p = PanicsOnDrop(drops.clone());
        let r = catch_unwind(AssertUnwindSafe(|| s.spawn(move || drop(p))));
        let h = r.expect("spawn on a stopped scheduler does not panic");
        assert!(h.join().unwrap_err().is_cancelled());
        let p = PanicsOnDrop(drops.clone());
        let mut set = JoinSet::new();
        let r = catch_unwind(AssertUnwindSafe(|| set.spawn_on(&s, move || drop(p))));
        assert!(
            r.is_ok(),
            "JoinSet::spawn_on on a stopped scheduler does not panic"
        );
        assert!(set.join_next().unwrap().unwrap_err().is_cancelled());
    });
}

// ================================================== 5. hooks under seccomp

/// Installs, on this thread (and so on every thread it creates from now on), a seccomp filter
/// that fails `process_vm_readv` and `process_vm_writev` with `EPERM`, as container runtimes'
/// default profiles do.
#[cfg(feature = "hook")]
fn refuse_process_vm() {
    const AUDIT_ARCH_X86_64: u32 = 0xC000_003E;
    let stmt = |code: u16, k: u32| libc::sock_filter {
        code,
        jt: 0,
        jf: 0,
        k,
    };
    let jeq = |k: u32, jt: u8, jf: u8| libc::sock_filter {
        code: (libc::BPF_JMP | libc::BPF_JEQ | libc::BPF_K) as u16,
        jt,
        jf,
        k,
    };
    let ld = (libc::BPF_LD | libc::BPF_W | libc::BPF_ABS) as u16;
    let ret = (libc::BPF_RET | libc::BPF_K) as u16;
    let mut prog = [
        stmt(ld, 4), // arch
        jeq(AUDIT_ARCH_X86_64, 0, 4),
        stmt(ld, 0), // syscall number
        jeq(libc::SYS_process_vm_readv as u32, 2, 0),
        jeq(libc::SYS_process_vm_writev as u32, 1, 0),
        stmt(ret, libc::SECCOMP_RET_ALLOW),
        stmt(ret, libc::SECCOMP_RET_ERRNO | libc::EPERM as u32),
    ];
    let fprog = libc::sock_fprog {
        len: prog.len() as u16,
        filter: prog.as_mut_ptr(),
    };
    // SAFETY: plain prctl/seccomp calls with a live program.
    unsafe {
        assert_eq!(libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), 0);
        assert_eq!(
            libc::syscall(
                libc::SYS_seccomp,
                libc::SECCOMP_SET_MODE_FILTER,
                0,
                &fprog as *const libc::sock_fprog
            ),
            0,
            "seccomp: {}",
            std::io::Error::last_os_error()
        );
    }
    // The filter bites.
    let mut buf = [0u8; 8];
    let src = [1u8; 8];
    let local = libc::iovec {
        iov_base: buf.as_mut_ptr().cast(),
        iov_len: 8,
    };
    let remote = libc::iovec {
        iov_base: src.as_ptr().cast_mut().cast(),
        iov_len: 8,
    };
    // SAFETY: valid iovecs of our own memory.
    let r = unsafe { libc::process_vm_readv(libc::getpid(), &local, 1, &remote, 1, 0) };
    assert_eq!((r, crate::common::errno()), (-1, libc::EPERM));
}

#[cfg(feature = "hook")]
mod seccomp_calls {
    use super::*;
    use std::io::{Read, Write};
    use std::os::fd::AsRawFd;
    use std::os::unix::net::UnixStream;

    pub fn nanosleep_sleeps() -> (i32, bool) {
        let ts = libc::timespec {
            tv_sec: 0,
            tv_nsec: 30_000_000,
        };
        let mut rem = libc::timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        let t = Instant::now();
        // SAFETY: valid timespecs.
        let r = unsafe { libc::nanosleep(&ts, &mut rem) };
        (r, t.elapsed() >= Duration::from_millis(30))
    }

    pub fn clock_nanosleep_sleeps() -> (i32, bool) {
        let ts = libc::timespec {
            tv_sec: 0,
            tv_nsec: 30_000_000,
        };
        let t = Instant::now();
        // SAFETY: a valid timespec.
        let r =
            unsafe { libc::clock_nanosleep(libc::CLOCK_MONOTONIC, 0, &ts, std::ptr::null_mut()) };
        (r, t.elapsed() >= Duration::from_millis(30))
    }

    pub fn std_sleep() -> bool {
        let t = Instant::now();
        std::thread::sleep(Duration::from_millis(30));
        t.elapsed() >= Duration::from_millis(30)
    }

    /// poll on a pair: one end readable after a late write, the other writable.
    pub fn poll_late_data() -> (i32, i16, i16) {
        let (a, b) = UnixStream::pair().unwrap();
        let (c, _d) = UnixStream::pair().unwrap();
        let w = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(30));
            (&b).write_all(b"x").unwrap();
            b
        });
        let mut fds = [
            libc::pollfd {
                fd: a.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            },
            libc::pollfd {
                fd: c.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            },
        ];
        // SAFETY: a live array of two pollfds.
        let r = unsafe { libc::poll(fds.as_mut_ptr(), 2, 5000) };
        drop(w.join());
        (r, fds[0].revents, fds[1].revents)
    }

    pub fn poll_times_out() -> (i32, i16, bool) {
        let (a, _b) = UnixStream::pair().unwrap();
        let mut fds = [libc::pollfd {
            fd: a.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        }];
        let t = Instant::now();
        // SAFETY: a live pollfd.
        let r = unsafe { libc::poll(fds.as_mut_ptr(), 1, 40) };
        (r, fds[0].revents, t.elapsed() >= Duration::from_millis(40))
    }

    /// select: a read set (late data on one fd, none on the other) and a write set; the
    /// result sets and the time left are written back.
    pub fn select_late_data() -> (i32, bool, bool, bool, bool) {
        let (a, b) = UnixStream::pair().unwrap();
        let (c, _d) = UnixStream::pair().unwrap();
        let w = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(30));
            (&b).write_all(b"x").unwrap();
            b
        });
        // SAFETY: zeroed fd_sets are empty; fds below FD_SETSIZE.
        let r = unsafe {
            let mut rs: libc::fd_set = std::mem::zeroed();
            libc::FD_SET(a.as_raw_fd(), &mut rs);
            libc::FD_SET(c.as_raw_fd(), &mut rs);
            let mut tv = libc::timeval {
                tv_sec: 5,
                tv_usec: 0,
            };
            let n = a.as_raw_fd().max(c.as_raw_fd()) + 1;
            let r = libc::select(
                n,
                &mut rs,
                std::ptr::null_mut(),
                std::ptr::null_mut(),
                &mut tv,
            );
            (
                r,
                libc::FD_ISSET(a.as_raw_fd(), &rs),
                libc::FD_ISSET(c.as_raw_fd(), &rs),
                // Linux writes back the time left.
                tv.tv_sec < 5 && tv.tv_sec >= 4,
                tv.tv_sec == 5 && tv.tv_usec == 0,
            )
        };
        drop(w.join());
        r
    }

    pub fn select_times_out() -> (i32, bool, libc::time_t, libc::suseconds_t) {
        let (a, _b) = UnixStream::pair().unwrap();
        // SAFETY: as above.
        unsafe {
            let mut rs: libc::fd_set = std::mem::zeroed();
            libc::FD_SET(a.as_raw_fd(), &mut rs);
            let mut tv = libc::timeval {
                tv_sec: 0,
                tv_usec: 40_000,
            };
            let r = libc::select(
                a.as_raw_fd() + 1,
                &mut rs,
                std::ptr::null_mut(),
                std::ptr::null_mut(),
                &mut tv,
            );
            (r, libc::FD_ISSET(a.as_raw_fd(), &rs), tv.tv_sec, tv.tv_usec)
        }
    }

    /// writev of more than the socket buffer holds on a blocking stream socket: all of it
    /// goes (a reader drains late), as the kernel's blocking writev does.
    pub fn writev_all() -> (isize, usize) {
        let (a, b) = UnixStream::pair().unwrap();
        let reader = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(30));
            let mut all = Vec::new();
            (&b).read_to_end(&mut all).unwrap();
            all.len()
        });
        let one = vec![7u8; 600_000];
        let two = vec![9u8; 400_000];
        let iov = [
            libc::iovec {
                iov_base: one.as_ptr().cast_mut().cast(),
                iov_len: one.len(),
            },
            libc::iovec {
                iov_base: two.as_ptr().cast_mut().cast(),
                iov_len: two.len(),
            },
        ];
        // SAFETY: live buffers.
        let r = unsafe { libc::writev(a.as_raw_fd(), iov.as_ptr(), 2) };
        drop(a);
        (r, reader.join().unwrap())
    }

    /// sendmsg of more than the buffer holds; recvmsg with MSG_WAITALL of two iovecs, its data
    /// arriving in two late parts.
    pub fn sendmsg_recvmsg_waitall() -> (isize, isize, bool) {
        let (a, b) = UnixStream::pair().unwrap();
        let sender = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(20));
            (&b).write_all(&[1u8; 3000]).unwrap();
            std::thread::sleep(Duration::from_millis(20));
            (&b).write_all(&[2u8; 5000]).unwrap();
            b
        });
        let mut one = vec![0u8; 4000];
        let mut two = vec![0u8; 4000];
        let mut iov = [
            libc::iovec {
                iov_base: one.as_mut_ptr().cast(),
                iov_len: one.len(),
            },
            libc::iovec {
                iov_base: two.as_mut_ptr().cast(),
                iov_len: two.len(),
            },
        ];
        // SAFETY: a zeroed msghdr is valid; live buffers.
        let r = unsafe {
            let mut msg: libc::msghdr = std::mem::zeroed();
            msg.msg_iov = iov.as_mut_ptr();
            msg.msg_iovlen = 2;
            libc::recvmsg(a.as_raw_fd(), &mut msg, libc::MSG_WAITALL)
        };
        let b = sender.join().unwrap();
        let ok = one.iter().take(3000).all(|&x| x == 1)
            && one[3000..].iter().all(|&x| x == 2)
            && two.iter().all(|&x| x == 2);
        // sendmsg back, more than the buffer, with a late reader.
        let reader = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(30));
            let mut all = vec![0u8; 1_000_000];
            (&b).read_exact(&mut all).unwrap();
            b
        });
        let big = vec![5u8; 1_000_000];
        let siov = [libc::iovec {
            iov_base: big.as_ptr().cast_mut().cast(),
            iov_len: big.len(),
        }];
        // SAFETY: as above.
        let s = unsafe {
            let mut msg: libc::msghdr = std::mem::zeroed();
            msg.msg_iov = siov.as_ptr().cast_mut();
            msg.msg_iovlen = 1;
            libc::sendmsg(a.as_raw_fd(), &msg, 0)
        };
        drop(reader.join());
        (r, s, ok)
    }
}

/// Under a seccomp filter that refuses `process_vm_readv`/`process_vm_writev` (the hooks fall
/// back to reading and writing the caller's memory directly), hooked sleeps, `poll`,
/// `select`, `writev`, `sendmsg` and `recvmsg` with valid pointers behave as libc's, in
/// fibers and on plain threads.
#[cfg(feature = "hook")]
#[test]
fn hooks_under_a_seccomp_filter_refusing_process_vm_calls() {
    crate::common::child_ok(|| {
        use seccomp_calls::*;
        refuse_process_vm();
        fn check<T: std::fmt::Debug + PartialEq + Send + 'static>(
            what: &str,
            f: fn() -> T,
            want: T,
        ) {
            let (fib, plain) = crate::common::both(f);
            eprintln!("{what}: fiber {fib:?}, thread {plain:?}");
            assert_eq!(plain, want, "{what}: the plain thread");
            assert_eq!(fib, want, "{what}: the fiber");
        }
        check("nanosleep", nanosleep_sleeps, (0, true));
        check("clock_nanosleep", clock_nanosleep_sleeps, (0, true));
        check("std sleep", std_sleep, true);
        check("poll late data", poll_late_data, (1, libc::POLLIN, 0));
        check("poll timeout", poll_times_out, (0, 0, true));
        check(
            "select late data",
            select_late_data,
            (1, true, false, true, false),
        );
        check("select timeout", select_times_out, (0, false, 0, 0));
        check("writev", writev_all, (1_000_000, 1_000_000));
        check(
            "sendmsg/recvmsg",
            sendmsg_recvmsg_waitall,
            (8000, 1_000_000, true),
        );
    });
}

const NO_WORKER_UID: libc::uid_t = 61_910;

/// No worker thread at all (the OS refused every one): `stop` fails the queued tasks from the
/// stopping thread. Their closures' captures panic when dropped, and so do their `catching`
/// continuations (with a payload that panics on drop too): `stop` still returns normally.
#[test]
fn stop_failing_queued_tasks_whose_drops_and_continuations_panic() {
    crate::common::child_ok(|| {
        let s = Scheduler::builder().threads(2).build().unwrap();
        cap_threads(NO_WORKER_UID, 0);
        assert!(catch_unwind(AssertUnwindSafe(|| s.start())).is_err());
        let drops = Arc::new(AtomicUsize::new(0));
        let caught = Arc::new(AtomicUsize::new(0));
        let handles: Vec<_> = (0..6)
            .map(|i| {
                let p = PanicsOnDrop(drops.clone());
                let h = s
                    .submit(
                        move || {
                            let _p = &p;
                            1
                        },
                        if i % 2 == 0 { None } else { Some(1) },
                    )
                    .unwrap();
                let (c, d) = (caught.clone(), drops.clone());
                h.catching(move |e| {
                    assert!(e.is_cancelled());
                    c.fetch_add(1, Ordering::SeqCst);
                    std::panic::panic_any(PanicsOnDrop(d))
                });
                h
            })
            .collect();
        let r = catch_unwind(AssertUnwindSafe(|| s.stop()));
        assert!(r.is_ok(), "stop panicked: {}", msg_of(r));
        for h in handles {
            assert!(h.join().unwrap_err().is_cancelled());
        }
        assert_eq!(caught.load(Ordering::SeqCst), 6);
        assert_eq!(
            drops.load(Ordering::SeqCst),
            12,
            "6 closures and 6 payloads dropped"
        );
        uncap_threads();
    });
}

/// `use_caller`'s `block_on` with a panic payload whose Drop panics, and a task on worker 0
/// whose result panics when dropped unjoined: the payload reaches the caller; worker 0 keeps
/// working.
#[test]
fn use_caller_block_on_with_a_payload_that_panics_on_drop() {
    with_deadline(|| {
        let s = Scheduler::builder()
            .threads(2)
            .use_caller(true)
            .build()
            .unwrap();
        let drops = Arc::new(AtomicUsize::new(0));
        let d = drops.clone();
        let r = catch_unwind(AssertUnwindSafe(|| {
            s.block_on(move || -> u32 { std::panic::panic_any(PanicsOnDrop(d)) })
        }));
        leak_pod(r.unwrap_err());
        let d = drops.clone();
        let h = s.submit(move || PanicsOnDrop(d), Some(0)).unwrap();
        let n = drops.load(Ordering::SeqCst);
        assert_eq!(s.block_on(|| 3), 3);
        drop(s.submit(|| (), Some(0)).unwrap());
        assert!(catch_unwind(AssertUnwindSafe(|| drop(h))).is_ok());
        let w: Vec<_> = (0..2)
            .map(|w| s.submit(fibra::current_worker, Some(w)).unwrap())
            .collect();
        let got = s.block_on(move || w.into_iter().map(|h| h.join().unwrap()).collect::<Vec<_>>());
        assert_eq!(got, [Some(0), Some(1)]);
        assert!(drops.load(Ordering::SeqCst) > n);
        s.stop();
    });
}
