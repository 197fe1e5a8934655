//! The N:M scheduler core: where tasks run (pinning, worker thread names, a
//! started fiber never changing thread), every task running exactly once,
//! joining from fibers and from threads, panic isolation, rejected work handed
//! back, builder validation, and the start / stop / stop_timeout / block_on /
//! use_caller life cycle.

use std::cell::Cell;
use std::collections::HashSet;
use std::fs;
use std::num::NonZeroUsize;
use std::panic::{self, AssertUnwindSafe};
use std::rc::Rc;
use std::sync::atomic::{AtomicBool, AtomicU8, AtomicUsize, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::thread::{self, ThreadId};
use std::time::{Duration, Instant};

use crate::common::{
    finish, panic_message, started, wait_until, with_deadline, Counted, Slot, LIMIT,
};
use fibra::{current_worker, park, Fiber, Scheduler, SubmitError, Unparker};

fn thread_name() -> Option<String> {
    thread::current().name().map(str::to_owned)
}

/// Sets its flag when dropped, to observe that a fiber's stack was unwound.
struct SetOnDrop(Arc<AtomicBool>);

impl Drop for SetOnDrop {
    fn drop(&mut self) {
        self.0.store(true, Ordering::SeqCst);
    }
}

/// Number of live threads of this process whose name is `name`.
fn threads_named(name: &str) -> usize {
    let tasks = fs::read_dir("/proc/self/task").expect("/proc/self/task is readable");
    tasks
        .filter_map(Result::ok)
        .filter(|task| {
            fs::read_to_string(task.path().join("comm")).is_ok_and(|comm| comm.trim_end() == name)
        })
        .count()
}

// ---------------------------------------------------------------- placement

#[test]
fn pinned_tasks_run_on_their_named_worker() {
    with_deadline(|| {
        let sched = Scheduler::builder()
            .threads(4)
            .name("pin")
            .build()
            .expect("build");
        sched.start();
        assert_eq!(sched.threads(), 4);
        let handles: Vec<_> = (0..10_000)
            .map(|i| {
                let worker = i % 4;
                let handle = sched
                    .submit(|| (current_worker(), thread_name()), Some(worker))
                    .expect("submit to an existing worker");
                (worker, handle)
            })
            .collect();
        for (worker, handle) in handles {
            let (ran_on, name) = finish(handle);
            assert_eq!(ran_on, Some(worker), "task pinned to worker {worker}");
            assert_eq!(name, Some(format!("pin-{worker}")));
        }
        sched.stop();
    });
}

#[test]
fn worker_threads_are_named_fibra_by_default() {
    with_deadline(|| {
        let sched = started(2);
        for worker in 0..2 {
            let name = finish(sched.submit(thread_name, Some(worker)).expect("submit"));
            assert_eq!(name, Some(format!("fibra-{worker}")));
        }
    });
}

#[test]
fn started_fiber_never_changes_thread_across_yields() {
    with_deadline(|| {
        let sched = started(4);
        let handles: Vec<_> = (0..400)
            .map(|_| {
                sched
                    .submit(
                        || {
                            let home = thread::current().id();
                            let worker = current_worker();
                            // An Rc held across yields is only sound if the fiber stays put.
                            let resumed = Rc::new(Cell::new(0u32));
                            let mut moves = 0u32;
                            for _ in 0..200 {
                                let held = Rc::clone(&resumed);
                                Fiber::yield_now();
                                if thread::current().id() != home || current_worker() != worker {
                                    moves += 1;
                                }
                                held.set(held.get() + 1);
                            }
                            (worker, moves, resumed.get())
                        },
                        None,
                    )
                    .expect("submit")
            })
            .collect();
        for handle in handles {
            let (worker, moves, resumed) = finish(handle);
            assert!(worker.is_some(), "a task runs on a worker");
            assert_eq!(moves, 0, "a started fiber changed thread");
            assert_eq!(resumed, 200);
        }
    });
}

#[test]
fn every_task_runs_exactly_once() {
    const TASKS: usize = 100_000;
    with_deadline(|| {
        let runs: Arc<Vec<AtomicU8>> = Arc::new((0..TASKS).map(|_| AtomicU8::new(0)).collect());
        let sched = started(4);
        let handles: Vec<_> = (0..TASKS)
            .map(|i| {
                let runs = Arc::clone(&runs);
                sched
                    .submit(
                        move || {
                            runs[i].fetch_add(1, Ordering::Relaxed);
                            i
                        },
                        None,
                    )
                    .expect("submit")
            })
            .collect();
        for (i, handle) in handles.into_iter().enumerate() {
            assert_eq!(finish(handle), i);
        }
        sched.stop();
        let wrong: Vec<_> = (0..TASKS)
            .filter(|&i| runs[i].load(Ordering::Relaxed) != 1)
            .take(10)
            .map(|i| (i, runs[i].load(Ordering::Relaxed)))
            .collect();
        assert!(wrong.is_empty(), "(task, times run): {wrong:?}");
    });
}

/// Every task's closure and result are dropped exactly once, whether its handle is joined or
/// dropped first, for tasks spawned from a fiber (through the `next` slot, the stealable
/// queue and, past its capacity, the injector) and from a plain thread: a task's cell holds
/// one reference for its handle and one for the run queues from the start, and the `next`
/// slot keeps its reference as a bare pointer while it holds the task.
#[test]
fn every_spawn_path_frees_the_closure_and_the_result_once() {
    const BURST: usize = 2_000;
    with_deadline(|| {
        let sched = Arc::new(started(2));
        let (captured, results) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
        // A detached task's result is dropped with its cell, a joined one's by `join`.
        let task = || {
            let (c, r) = (Counted(captured.clone()), results.clone());
            move || {
                let _keep = c;
                Counted(r)
            }
        };
        // From a plain thread: half joined, half detached.
        let mut joined = Vec::new();
        for i in 0..BURST {
            let h = sched.submit(task(), None).expect("submit");
            if i % 2 == 0 {
                joined.push(h);
            }
        }
        for h in joined {
            drop(finish(h));
        }
        // From a fiber, in one burst (no suspension between the spawns): the same halves.
        let s = sched.clone();
        let tasks: Vec<_> = (0..BURST).map(|_| task()).collect();
        let spawned = sched
            .submit(
                move || {
                    let mut joined = Vec::new();
                    for (i, t) in tasks.into_iter().enumerate() {
                        let h = s.submit(t, None).expect("submit");
                        if i % 2 == 0 {
                            joined.push(h);
                        }
                    }
                    for h in joined {
                        drop(h.join().expect("task"));
                    }
                },
                None,
            )
            .expect("submit");
        finish(spawned);
        wait_until("every detached task's cell to be freed", || {
            results.load(Ordering::SeqCst) == 2 * BURST
        });
        assert_eq!(
            captured.load(Ordering::SeqCst),
            2 * BURST,
            "closures dropped once"
        );
        // Nothing is dropped twice afterwards (a stray reference would show here).
        Arc::into_inner(sched).expect("the only reference").stop();
        assert_eq!(captured.load(Ordering::SeqCst), 2 * BURST);
        assert_eq!(results.load(Ordering::SeqCst), 2 * BURST);
    });
}

#[test]
fn stop_runs_detached_tasks_before_returning() {
    const TASKS: usize = 10_000;
    with_deadline(|| {
        let ran = Arc::new(AtomicUsize::new(0));
        let sched = started(2);
        for _ in 0..TASKS {
            let ran = Arc::clone(&ran);
            let handle = sched
                .submit(
                    move || {
                        Fiber::yield_now();
                        ran.fetch_add(1, Ordering::Relaxed);
                    },
                    None,
                )
                .expect("submit");
            drop(handle);
        }
        sched.stop();
        assert_eq!(ran.load(Ordering::Relaxed), TASKS);
    });
}

/// One link of a chain: spawns the next link (detached) and yields, so that the next one is
/// often taken by the other worker while this one is still alive; counts itself.
fn link(left: usize, ran: Arc<AtomicUsize>, workers: Arc<Mutex<HashSet<usize>>>) {
    ran.fetch_add(1, Ordering::Relaxed);
    if let Some(w) = current_worker() {
        workers.lock().unwrap().insert(w);
    }
    if left > 0 {
        let (r, w) = (Arc::clone(&ran), Arc::clone(&workers));
        drop(fibra::spawn(move || link(left - 1, r, w)));
        Fiber::yield_now();
    }
}

/// `stop()` waits for work that fibers keep spawning while it waits, even when each task is
/// counted in on one worker and counted out on another (the scheduler's count of live tasks
/// is kept per worker): it must never see zero while a link of a chain is alive.
#[test]
fn stop_waits_for_chains_of_spawns_that_hop_between_workers() {
    const CHAINS: usize = 8;
    const LINKS: usize = 2_000;
    with_deadline(|| {
        for _ in 0..5 {
            let ran = Arc::new(AtomicUsize::new(0));
            let workers = Arc::new(Mutex::new(HashSet::new()));
            let sched = started(2);
            for _ in 0..CHAINS {
                let (r, w) = (Arc::clone(&ran), Arc::clone(&workers));
                drop(
                    sched
                        .submit(move || link(LINKS - 1, r, w), None)
                        .expect("submit"),
                );
            }
            sched.stop();
            assert_eq!(
                ran.load(Ordering::Relaxed),
                CHAINS * LINKS,
                "every link ran"
            );
            assert_eq!(sched.metrics().live_tasks(), 0);
            assert_eq!(
                workers.lock().unwrap().len(),
                2,
                "the chains ran on both workers"
            );
        }
    });
}

#[test]
fn dropping_the_scheduler_finishes_its_work() {
    with_deadline(|| {
        let ran = Arc::new(AtomicUsize::new(0));
        let sched = started(2);
        for _ in 0..100 {
            let ran = Arc::clone(&ran);
            drop(
                sched
                    .submit(
                        move || {
                            park(|u| {
                                thread::spawn(move || {
                                    thread::sleep(Duration::from_millis(50));
                                    u.unpark();
                                });
                            });
                            ran.fetch_add(1, Ordering::Relaxed);
                        },
                        None,
                    )
                    .expect("submit"),
            );
        }
        drop(sched);
        assert_eq!(ran.load(Ordering::Relaxed), 100);
    });
}

// ---------------------------------------------------------------- join

#[test]
fn join_from_plain_threads() {
    with_deadline(|| {
        let sched = Arc::new(started(2));
        let threads: Vec<_> = (0..4u64)
            .map(|t| {
                let sched = Arc::clone(&sched);
                thread::spawn(move || {
                    let handles: Vec<_> = (0..100u64)
                        .map(|i| sched.submit(move || t * 1000 + i, None).expect("submit"))
                        .collect();
                    handles.into_iter().map(finish).sum::<u64>()
                })
            })
            .collect();
        for (t, thread) in threads.into_iter().enumerate() {
            let t = t as u64;
            assert_eq!(thread.join().expect("thread"), t * 100_000 + 4950);
        }
        sched.stop();
    });
}

#[test]
fn join_from_a_fiber_suspends_only_that_fiber() {
    with_deadline(|| {
        // One worker: if join blocked the thread, the child could never run.
        let sched = Arc::new(started(1));
        let inner = Arc::clone(&sched);
        let parent = sched
            .submit(
                move || {
                    let child = inner
                        .submit(
                            || {
                                for _ in 0..10 {
                                    Fiber::yield_now();
                                }
                                current_worker()
                            },
                            Some(0),
                        )
                        .expect("submit from a fiber");
                    child.join().expect("child task")
                },
                Some(0),
            )
            .expect("submit");
        assert_eq!(finish(parent), Some(0));
        sched.stop();
    });
}

#[test]
fn join_from_a_fiber_reports_a_child_panic() {
    with_deadline(|| {
        let sched = Arc::new(started(2));
        let inner = Arc::clone(&sched);
        let parent = sched
            .submit(
                move || {
                    let child = inner
                        .submit(|| -> u8 { panic!("child failed") }, None)
                        .expect("submit from a fiber");
                    let err = child.join().expect_err("a panicking child is an Err");
                    (err.is_panic(), panic_message(&*err.into_panic()))
                },
                None,
            )
            .expect("submit");
        let (is_panic, message) = finish(parent);
        assert!(is_panic);
        assert_eq!(message.as_deref(), Some("child failed"));
        sched.stop();
    });
}

fn count_leaves(sched: Arc<Scheduler>, depth: u32) -> u32 {
    if depth == 0 {
        return 1;
    }
    let children: Vec<_> = (0..2)
        .map(|_| {
            let inner = Arc::clone(&sched);
            sched
                .submit(move || count_leaves(inner, depth - 1), None)
                .expect("nested submit")
        })
        .collect();
    children
        .into_iter()
        .map(|child| child.join().expect("child task"))
        .sum()
}

#[test]
fn fibers_submit_and_join_nested_work() {
    with_deadline(|| {
        let sched = Arc::new(started(2));
        let inner = Arc::clone(&sched);
        // 511 fibers, each interior one waiting for its two children.
        let root = sched
            .submit(move || count_leaves(inner, 8), None)
            .expect("submit");
        assert_eq!(finish(root), 256);
        sched.stop();
    });
}

// ---------------------------------------------------------------- panics

#[test]
fn panics_go_to_the_join_handle_and_every_worker_survives() {
    with_deadline(|| {
        let sched = started(4);
        for worker in 0..4 {
            let handle = sched
                .submit(
                    move || -> u32 { panic!("boom on worker {worker}") },
                    Some(worker),
                )
                .expect("submit");
            assert!(handle.wait_timeout(LIMIT));
            let err = handle.join().expect_err("a panicking task is an Err");
            assert!(err.is_panic());
            assert!(!err.is_cancelled());
            assert!(!err.to_string().is_empty());
            let payload = err.into_panic();
            assert_eq!(
                panic_message(&*payload),
                Some(format!("boom on worker {worker}"))
            );
        }
        for worker in 0..4 {
            let ran_on = finish(sched.submit(current_worker, Some(worker)).expect("submit"));
            assert_eq!(ran_on, Some(worker), "worker {worker} still runs tasks");
        }
    });
}

#[test]
fn a_panic_payload_of_any_type_is_recoverable() {
    with_deadline(|| {
        let sched = started(1);
        let handle = sched
            .submit(|| -> u32 { panic::panic_any(7_u32) }, None)
            .expect("submit");
        assert!(handle.wait_timeout(LIMIT));
        let err = handle.join().expect_err("a panicking task is an Err");
        let payload = err.try_into_panic().expect("a panic carries its payload");
        assert_eq!(payload.downcast_ref::<u32>(), Some(&7));
    });
}

// ---------------------------------------------------------------- rejected work

#[test]
fn submit_after_stop_hands_the_closure_back() {
    with_deadline(|| {
        let sched = started(2);
        sched.stop();
        for thread in [None, Some(0)] {
            let token = String::from("the same closure");
            let closure = move || token;
            match sched.submit(closure, thread) {
                Err(err @ SubmitError::Stopped(_)) => {
                    assert!(!err.to_string().is_empty());
                    let as_error: &dyn std::error::Error = &err;
                    assert!(as_error.source().is_none());
                    let closure = err.into_inner();
                    assert_eq!(closure(), "the same closure");
                }
                Err(other) => panic!("expected Stopped, got {other:?}"),
                Ok(_) => panic!("submit after stop() was accepted"),
            }
        }
    });
}

#[test]
fn submit_to_a_missing_worker_hands_the_closure_back() {
    with_deadline(|| {
        let sched = started(2);
        for thread in [2, 3, usize::MAX] {
            let token = vec![thread];
            let closure = move || token;
            match sched.submit(closure, Some(thread)) {
                Err(err @ SubmitError::NoSuchThread(_)) => {
                    assert!(!err.to_string().is_empty());
                    assert_eq!(err.into_inner()(), vec![thread]);
                }
                Err(other) => panic!("expected NoSuchThread, got {other:?}"),
                Ok(_) => panic!("submit to worker {thread} of 2 was accepted"),
            }
        }
        // The scheduler is unharmed by the rejections.
        assert_eq!(
            finish(sched.submit(current_worker, Some(1)).expect("submit")),
            Some(1)
        );
    });
}

// ---------------------------------------------------------------- builder

#[test]
fn builder_rejects_bad_configuration() {
    match Scheduler::builder().threads(0).build() {
        Err(err) => assert!(!err.to_string().is_empty()),
        Ok(_) => panic!("threads(0) must be rejected"),
    }
    match Scheduler::builder().stack_size(1024).build() {
        Err(err) => assert!(!err.to_string().is_empty()),
        Ok(_) => panic!("stack_size(1024) must be rejected"),
    }
}

#[test]
fn builder_accepts_good_configuration() {
    with_deadline(|| {
        let sched = Scheduler::builder()
            .threads(3)
            .stack_size(512 * 1024)
            .name("good")
            .build()
            .expect("a valid configuration builds");
        assert_eq!(sched.threads(), 3);
        assert_eq!(sched.block_on(|| 1 + 1), 2);

        let default = Scheduler::builder().build().expect("defaults build");
        let parallelism = thread::available_parallelism().map_or(1, NonZeroUsize::get);
        assert_eq!(default.threads(), parallelism);
    });
}

// ---------------------------------------------------------------- life cycle

#[test]
fn start_twice_is_harmless() {
    with_deadline(|| {
        let sched = Scheduler::builder()
            .threads(2)
            .name("twice")
            .build()
            .expect("build");
        sched.start();
        sched.start();
        assert_eq!(sched.threads(), 2);
        for worker in 0..2 {
            assert_eq!(
                finish(sched.submit(current_worker, Some(worker)).expect("submit")),
                Some(worker)
            );
        }
        assert_eq!(threads_named("twice-0"), 1, "one thread per worker");
        assert_eq!(threads_named("twice-1"), 1, "one thread per worker");
        assert_eq!(finish(sched.submit(|| 42, None).expect("submit")), 42);
        sched.stop();
        // A joined thread may linger in /proc for a moment while the kernel reaps it.
        wait_until("stop() to end the workers", || {
            threads_named("twice-0") + threads_named("twice-1") == 0
        });
    });
}

#[test]
fn work_submitted_before_start_runs_after_it() {
    with_deadline(|| {
        let sched = Scheduler::builder().threads(2).build().expect("build");
        let ran = Arc::new(AtomicBool::new(false));
        let flag = Arc::clone(&ran);
        let any = sched
            .submit(
                move || {
                    flag.store(true, Ordering::SeqCst);
                    7
                },
                None,
            )
            .expect("submit before start");
        let pinned = sched.submit(current_worker, Some(1)).expect("submit");
        thread::sleep(Duration::from_millis(100));
        assert!(!ran.load(Ordering::SeqCst), "ran before start()");
        assert!(!any.is_finished());
        assert!(!pinned.wait_timeout(Duration::from_millis(10)));
        sched.start();
        assert_eq!(finish(any), 7);
        assert_eq!(finish(pinned), Some(1));
    });
}

#[test]
fn use_caller_runs_worker_0_on_the_building_thread_inside_block_on() {
    with_deadline(|| {
        let me = thread::current().id();
        let sched = Arc::new(
            Scheduler::builder()
                .threads(2)
                .use_caller(true)
                .build()
                .expect("build"),
        );
        let inner = Arc::clone(&sched);
        let (ran_on, worker) = sched.block_on(move || {
            let pinned = inner
                .submit(|| (thread::current().id(), current_worker()), Some(0))
                .expect("submit");
            pinned.join().expect("pinned task")
        });
        assert_eq!(worker, Some(0));
        assert_eq!(ran_on, me, "worker 0 is the building thread");
        sched.stop();
    });
}

#[test]
fn use_caller_runs_worker_0_on_the_building_thread_inside_stop() {
    with_deadline(|| {
        let me = thread::current().id();
        let sched = Scheduler::builder()
            .threads(2)
            .use_caller(true)
            .build()
            .expect("build");
        sched.start();
        // The other worker works without the caller's help.
        let other = finish(
            sched
                .submit(|| (thread::current().id(), current_worker()), Some(1))
                .expect("submit"),
        );
        assert_eq!(other.1, Some(1));
        assert_ne!(other.0, me);

        let seen: Slot<ThreadId> = Arc::default();
        let record = Arc::clone(&seen);
        let pinned = sched
            .submit(
                move || {
                    *record.lock().unwrap() = Some(thread::current().id());
                    current_worker()
                },
                Some(0),
            )
            .expect("submit");
        sched.stop();
        assert!(
            pinned.is_finished(),
            "stop() ran the task pinned to worker 0"
        );
        assert_eq!(pinned.join().expect("pinned task"), Some(0));
        assert_eq!(*seen.lock().unwrap(), Some(me));
    });
}

#[test]
fn block_on_returns_the_value_and_resumes_a_panic() {
    with_deadline(|| {
        let sched = Scheduler::builder().threads(2).build().expect("build");
        // block_on starts the scheduler itself.
        assert_eq!(sched.block_on(|| 6 * 7), 42);
        assert!(sched.block_on(|| current_worker().is_some()));
        let caught = panic::catch_unwind(AssertUnwindSafe(|| {
            sched.block_on(|| -> u32 { panic!("block_on boom") })
        }));
        let payload = caught.expect_err("the panic of f resumes on the caller");
        assert_eq!(panic_message(&*payload).as_deref(), Some("block_on boom"));
        assert_eq!(sched.block_on(|| "still usable"), "still usable");
    });
}

#[test]
fn stop_drains_fibers_parked_and_woken_later() {
    with_deadline(|| {
        let sched = started(2);
        let done = Arc::new(AtomicUsize::new(0));
        let handles: Vec<_> = (0..8)
            .map(|i| {
                let done = Arc::clone(&done);
                sched
                    .submit(
                        move || {
                            park(|u| {
                                thread::spawn(move || {
                                    thread::sleep(Duration::from_millis(200));
                                    u.unpark();
                                });
                            });
                            done.fetch_add(1, Ordering::SeqCst);
                            i
                        },
                        None,
                    )
                    .expect("submit")
            })
            .collect();
        sched.stop();
        assert_eq!(done.load(Ordering::SeqCst), 8);
        for (i, handle) in handles.into_iter().enumerate() {
            assert!(handle.is_finished());
            assert_eq!(handle.join().expect("task"), i);
        }
    });
}

/// Once `stop` returns, none of the scheduler's threads is left: neither its workers nor
/// the watchdog's monitor, so a thread count (or a thread cap) taken next sees them gone.
#[test]
fn stop_leaves_no_thread_of_the_scheduler_behind() {
    crate::common::child_ok(|| {
        let threads = || std::fs::read_dir("/proc/self/task").unwrap().count();
        let before = threads();
        for round in 0..20 {
            let s = Scheduler::builder()
                .threads(3)
                .watchdog(Duration::from_millis(4))
                .build()
                .unwrap();
            s.start();
            crate::common::finish(s.spawn(|| ()));
            s.stop();
            // A joined thread can still be listed for a moment: `pthread_join` returns once
            // the kernel clears the thread's id, early in its exit, and the entry goes when
            // the exit completes, which a loaded machine may delay. A thread left running
            // (one `stop` did not join) stays listed.
            let deadline = Instant::now() + Duration::from_secs(2);
            while threads() != before && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(1));
            }
            assert_eq!(
                threads(),
                before,
                "threads left after stop in round {round}"
            );
        }
    });
}

#[test]
fn stop_timeout_cancels_a_fiber_parked_forever() {
    with_deadline(|| {
        let sched = started(2);
        let kept: Slot<Unparker> = Arc::default();
        let dropped = Arc::new(AtomicBool::new(false));
        let resumed = Arc::new(AtomicBool::new(false));
        let (slot, guard, after) = (
            Arc::clone(&kept),
            Arc::clone(&dropped),
            Arc::clone(&resumed),
        );
        let forever = sched
            .submit(
                move || {
                    let _guard = SetOnDrop(guard);
                    // Keep the Unparker alive but never call it.
                    park(move |u| *slot.lock().unwrap() = Some(u));
                    after.store(true, Ordering::SeqCst);
                },
                None,
            )
            .expect("submit");
        let quick = sched.submit(|| 5, None).expect("submit");
        wait_until("the fiber to park", || kept.lock().unwrap().is_some());
        assert_eq!(finish(quick), 5);

        let begun = Instant::now();
        let cancelled = sched.stop_timeout(Duration::from_millis(200));
        let took = begun.elapsed();
        assert_eq!(cancelled, 1);
        assert!(
            took >= Duration::from_millis(150),
            "cancelled after {took:?}"
        );
        assert!(took < LIMIT, "stop_timeout took {took:?}");
        assert!(
            dropped.load(Ordering::SeqCst),
            "the fiber's stack was unwound"
        );
        assert!(!resumed.load(Ordering::SeqCst), "park returned normally");

        assert!(forever.is_finished());
        let err = forever.join().expect_err("a cancelled task is an Err");
        assert!(err.is_cancelled());
        assert!(!err.is_panic());
        let err = err
            .try_into_panic()
            .expect_err("a cancellation carries no panic payload");
        assert!(err.is_cancelled());

        // The stale Unparker of the cancelled fiber is harmless.
        kept.lock().unwrap().take().expect("unparker").unpark();
        assert!(matches!(
            sched.submit(|| (), None),
            Err(SubmitError::Stopped(_))
        ));
    });
}

#[test]
fn stop_timeout_cancels_nothing_when_work_finishes_in_time() {
    with_deadline(|| {
        let sched = started(2);
        let handles: Vec<_> = (0..8)
            .map(|i| {
                sched
                    .submit(
                        move || {
                            park(|u| {
                                thread::spawn(move || {
                                    thread::sleep(Duration::from_millis(100));
                                    u.unpark();
                                });
                            });
                            i
                        },
                        None,
                    )
                    .expect("submit")
            })
            .collect();
        let begun = Instant::now();
        assert_eq!(sched.stop_timeout(LIMIT), 0);
        let took = begun.elapsed();
        assert!(
            took < LIMIT / 2,
            "stop_timeout waited {took:?} with nothing left"
        );
        for (i, handle) in handles.into_iter().enumerate() {
            assert_eq!(finish(handle), i);
        }
    });
}

#[test]
fn wait_timeout_and_is_finished_follow_the_task() {
    with_deadline(|| {
        let sched = started(2);
        let (unparker_tx, unparker_rx) = mpsc::channel::<Unparker>();
        let handle = sched
            .submit(
                move || {
                    park(move |u| unparker_tx.send(u).expect("the test is listening"));
                    "woken"
                },
                None,
            )
            .expect("submit");
        let unparker = unparker_rx.recv_timeout(LIMIT).expect("the task parks");
        assert!(!handle.wait_timeout(Duration::from_millis(50)));
        assert!(!handle.is_finished());
        unparker.unpark();
        assert!(handle.wait_timeout(LIMIT));
        assert!(handle.is_finished());
        assert!(handle.wait_timeout(Duration::ZERO), "already finished");
        assert_eq!(handle.join().expect("task"), "woken");
    });
}

// ---------------------------------------------------------------- identity

fn assert_send_sync<T: Send + Sync>() {}

#[test]
fn scheduler_is_send_and_sync() {
    assert_send_sync::<Scheduler>();
}

fn assert_unpin<T: Unpin>() {}

/// A handle moves between threads and may be polled by reference, whatever its value type
/// (task cells are reference-counted by fibra itself, not by `Arc`).
#[test]
fn join_handles_are_send_sync_and_unpin() {
    assert_send_sync::<fibra::JoinHandle<String>>();
    assert_unpin::<fibra::JoinHandle<std::marker::PhantomPinned>>();
    assert_send_sync::<fibra::Unparker>();
}

#[test]
fn fiber_current_identifies_the_running_task() {
    assert!(Fiber::current().is_none(), "the test thread is no fiber");
    let plain = thread::spawn(|| Fiber::current().is_none()).join();
    assert!(plain.expect("thread"), "a plain thread is no fiber");
    with_deadline(|| {
        let sched = started(2);
        let handles: Vec<_> = (0..100)
            .map(|_| {
                sched
                    .submit(
                        || {
                            Fiber::yield_now();
                            Fiber::current().map(|info| info.id().as_u64())
                        },
                        None,
                    )
                    .expect("submit")
            })
            .collect();
        let mut seen = HashSet::new();
        for handle in handles {
            let expected = handle.id().as_u64();
            let id = finish(handle).expect("Fiber::current() inside a task");
            assert_eq!(id, expected, "JoinHandle::id() names the task's fiber");
            assert!(seen.insert(id), "fiber id {id} seen twice");
        }
    });
}

#[test]
fn current_worker_is_none_on_plain_threads() {
    assert_eq!(current_worker(), None);
    let plain = thread::spawn(current_worker).join().expect("thread");
    assert_eq!(plain, None);
    with_deadline(|| {
        let sched = started(2);
        assert_eq!(
            current_worker(),
            None,
            "building a scheduler changes nothing"
        );
        let inside = finish(sched.submit(current_worker, None).expect("submit"));
        assert!(matches!(inside, Some(0 | 1)), "got {inside:?}");
    });
}

#[test]
fn stop_from_another_thread_waits_for_running_work() {
    with_deadline(|| {
        let sched = Arc::new(started(2));
        let finished = Arc::new(Mutex::new(Vec::new()));
        for i in 0..4 {
            let finished = Arc::clone(&finished);
            drop(
                sched
                    .submit(
                        move || {
                            for _ in 0..100 {
                                Fiber::yield_now();
                            }
                            finished.lock().unwrap().push(i);
                        },
                        None,
                    )
                    .expect("submit"),
            );
        }
        let stopper = Arc::clone(&sched);
        thread::spawn(move || stopper.stop())
            .join()
            .expect("stop from another thread");
        let mut finished = finished.lock().unwrap().clone();
        finished.sort_unstable();
        assert_eq!(finished, vec![0, 1, 2, 3]);
    });
}

#[test]
fn spawn_from_a_fiber_uses_its_scheduler_and_panics_elsewhere() {
    let sched = fibra::Scheduler::builder().threads(2).build().unwrap();
    sched.start();
    let inner = sched.block_on(|| {
        let h = fibra::spawn(|| fibra::current_worker().is_some());
        h.join().unwrap()
    });
    assert!(
        inner,
        "fibra::spawn ran the task on a worker of the calling fiber's scheduler"
    );
    assert_eq!(sched.spawn(|| 5).join().unwrap(), 5);
    let outside = std::panic::catch_unwind(|| fibra::spawn(|| ()));
    let msg = outside.expect_err("fibra::spawn outside a fiber panics");
    let msg = msg
        .downcast_ref::<String>()
        .cloned()
        .or_else(|| msg.downcast_ref::<&str>().map(|s| s.to_string()))
        .unwrap_or_default();
    assert!(msg.contains("fiber of a fibra Scheduler"), "{msg}");
    sched.stop();
    assert!(sched.spawn(|| ()).join().unwrap_err().is_cancelled());
}
