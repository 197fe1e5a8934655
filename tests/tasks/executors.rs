//! Executors: where jobs run, where spawned fibers live, and the
//! continuations of their handles.

use crate::common::{finish, with_deadline, LIMIT};
use fibra::exec::{Executor, Inline, Looper, NewThread, ThreadPool};
use fibra::sync::{oneshot, Condvar, Mutex};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{mpsc, Arc};
use std::thread::{self, ThreadId};
use std::time::Duration;

fn here() -> ThreadId {
    thread::current().id()
}

/// A task on a Looper sleeps, awaits task2 on a ThreadPool and task3 on a
/// NewThread, and returns 1 + 2 + 3; every step of it runs on the looper thread.
#[test]
fn a_looper_task_awaiting_pool_and_new_thread_tasks_runs_every_step_on_the_looper() {
    with_deadline(|| {
        let looper = Looper::new();
        let pool = Arc::new(ThreadPool::new(2));
        let looper_thread = looper.thread_id();
        let (steps_tx, steps) = mpsc::channel::<(&'static str, ThreadId)>();
        let p = pool.clone();
        let task = looper.spawn(move || {
            let step = |name| steps_tx.send((name, here())).unwrap();
            step("task start");
            fibra::sleep(Duration::from_millis(100));
            step("after sleep");
            let two = p
                .spawn(|| {
                    let start = here();
                    fibra::sleep(Duration::from_millis(50));
                    assert_eq!(here(), start, "task2 resumed on its own pool thread");
                    (2, start)
                })
                .join()
                .unwrap();
            step("returns from task2");
            let three = NewThread
                .spawn(|| {
                    let start = here();
                    fibra::sleep(Duration::from_millis(20));
                    assert_eq!(here(), start, "task3 resumed on its own thread");
                    (3, start)
                })
                .join()
                .unwrap();
            step("returns from task3");
            assert_ne!(two.1, here());
            assert_ne!(three.1, here());
            assert_ne!(two.1, three.1);
            1 + two.0 + three.0
        });
        let (then_tx, then_rx) = mpsc::channel();
        task.then(move |v| then_tx.send((*v, here())).unwrap())
            .catching(|e| panic!("unexpected failure: {e}"));
        assert!(task.wait_timeout(LIMIT));
        let (v, then_thread) = then_rx.recv_timeout(LIMIT).unwrap();
        assert_eq!(v, 6);
        // `then` runs on the completing thread: the looper's.
        assert_eq!(then_thread, looper_thread);
        assert_eq!(task.join().unwrap(), 6);
        let steps: Vec<_> = steps.try_iter().collect();
        assert_eq!(
            steps.iter().map(|s| s.0).collect::<Vec<_>>(),
            [
                "task start",
                "after sleep",
                "returns from task2",
                "returns from task3"
            ]
        );
        for (name, thread) in steps {
            assert_eq!(
                thread, looper_thread,
                "step {name:?} ran off the looper thread"
            );
        }
        looper.shutdown(true);
    });
}

/// Waits of every kind, each followed by a check that the fiber is still on `home`.
fn wait_everywhere(home: ThreadId, partner: &dyn Fn(Box<dyn FnOnce() + Send>)) -> usize {
    let mut checks = 0;
    let mut check = |what: &str| {
        assert_eq!(here(), home, "resumed off the home thread after {what}");
        checks += 1;
    };
    fibra::sleep(Duration::from_millis(5));
    check("sleep");
    fibra::Fiber::yield_now();
    check("yield_now");
    let (tx, rx) = oneshot::channel();
    partner(Box::new(move || {
        thread::sleep(Duration::from_millis(5));
        tx.send(7).unwrap();
    }));
    assert_eq!(rx.recv().unwrap(), 7);
    check("oneshot recv");
    let pair = Arc::new((Mutex::new(false), Condvar::new()));
    let p = pair.clone();
    let held = pair.0.lock().unwrap();
    partner(Box::new(move || {
        let mut ready = p.0.lock().unwrap(); // waits for the fiber's guard
        *ready = true;
        p.1.notify_one();
    }));
    let ready = pair.1.wait_while(held, |r| !*r).unwrap();
    assert!(*ready);
    drop(ready);
    check("mutex and condvar");
    let joined = NewThread.spawn(here).join().unwrap();
    assert_ne!(joined, home);
    check("join");
    let off = fibra::unblock(here);
    assert_ne!(off, home);
    check("unblock");
    checks
}

/// Runs `wait_everywhere` in fibers spawned on `exec`, with a partner thread doing the other
/// side of each wait; returns the home threads seen.
fn homes_stay<E: Executor>(exec: &E, fibers: usize) -> Vec<ThreadId> {
    let handles: Vec<_> = (0..fibers)
        .map(|_| {
            exec.spawn(|| {
                let home = here();
                let partner = |job: Box<dyn FnOnce() + Send>| {
                    thread::spawn(job);
                };
                assert_eq!(wait_everywhere(home, &partner), 6);
                home
            })
        })
        .collect();
    handles.into_iter().map(finish).collect()
}

#[test]
fn fibers_resume_on_their_home_thread_on_every_executor() {
    with_deadline(|| {
        let looper = Looper::new();
        for home in homes_stay(&looper, 4) {
            assert_eq!(home, looper.thread_id());
        }
        let pool = ThreadPool::new(2);
        let homes = homes_stay(&pool, 6);
        assert!(homes.iter().all(|h| *h != here()));
        let sched = fibra::Scheduler::builder().threads(2).build().unwrap();
        sched.start();
        homes_stay(&sched, 6);
        let news = homes_stay(&NewThread, 3);
        assert!(news[0] != news[1] && news[1] != news[2] && news[0] != news[2]);
        sched.stop();
    });
}

#[test]
fn catching_sees_a_panic_and_then_does_not_run() {
    with_deadline(|| {
        let looper = Looper::new();
        let (tx, rx) = mpsc::channel();
        let (tx2, tx3) = (tx.clone(), tx.clone());
        let h = looper.spawn(|| -> u32 {
            fibra::sleep(Duration::from_millis(20));
            panic!("task failed on purpose")
        });
        h.then(move |v| tx.send(format!("then {v}")).unwrap())
            .catching(move |e| {
                tx2.send(format!("caught panic={} {e}", e.is_panic()))
                    .unwrap()
            })
            .finally(move || tx3.send("finally".to_string()).unwrap());
        let err = h.join().unwrap_err();
        assert!(err.is_panic());
        let got: Vec<_> = rx.iter().take(2).collect();
        assert_eq!(
            got,
            [
                "caught panic=true task panicked: task failed on purpose",
                "finally"
            ]
        );
        // The looper thread survived the panic.
        assert_eq!(finish(looper.spawn(|| 1)), 1);
    });
}

#[test]
fn then_on_a_finished_task_runs_at_once_on_the_caller() {
    with_deadline(|| {
        let pool = ThreadPool::new(1);
        let h = pool.spawn(|| 41);
        assert!(h.wait_timeout(LIMIT));
        let seen = Arc::new(std::sync::Mutex::new(Vec::new()));
        let (s1, s2, s3) = (seen.clone(), seen.clone(), seen.clone());
        h.then(move |v| s1.lock().unwrap().push((v + 1, here())))
            .catching(move |_| s2.lock().unwrap().push((0, here())))
            .finally(move || s3.lock().unwrap().push((-1, here())));
        // Already ran, before `then` returned, on this very thread.
        assert_eq!(*seen.lock().unwrap(), [(42, here()), (-1, here())]);
        assert_eq!(h.join().unwrap(), 41);
    });
}

#[test]
fn looper_runs_jobs_in_fifo_order() {
    with_deadline(|| {
        let looper = Looper::new();
        let order = Arc::new(std::sync::Mutex::new(Vec::new()));
        let (tx, rx) = mpsc::channel::<()>();
        // Hold the looper thread so that everything below queues up behind this job.
        looper.execute(Box::new(move || {
            let _ = rx.recv_timeout(LIMIT);
        }));
        for i in 0..200 {
            let order = order.clone();
            if i % 2 == 0 {
                looper.execute(Box::new(move || order.lock().unwrap().push(i)));
            } else {
                drop(looper.spawn(move || order.lock().unwrap().push(i)));
            }
        }
        tx.send(()).unwrap();
        looper.shutdown(true);
        assert_eq!(*order.lock().unwrap(), (0..200).collect::<Vec<_>>());
    });
}

/// A job of `looper` that blocks its thread (not just its fiber) until released, so that
/// jobs submitted meanwhile stay queued.
fn hold(looper: &Looper) -> (fibra::JoinHandle<()>, mpsc::Sender<()>) {
    let (release, released) = mpsc::channel::<()>();
    let (started_tx, started) = mpsc::channel::<()>();
    let h = looper.spawn(move || {
        started_tx.send(()).unwrap();
        released.recv_timeout(LIMIT).expect("released");
    });
    started.recv_timeout(LIMIT).expect("the holding job starts");
    (h, release)
}

fn queue_counters(looper: &Looper, n: usize, ran: &Arc<AtomicUsize>) -> Vec<fibra::JoinHandle<()>> {
    (0..n)
        .map(|_| {
            let ran = ran.clone();
            looper.spawn(move || {
                ran.fetch_add(1, Ordering::SeqCst);
            })
        })
        .collect()
}

#[test]
fn looper_shutdown_false_drops_queued_jobs() {
    with_deadline(|| {
        let looper = Arc::new(Looper::new());
        let (holder, release) = hold(&looper);
        let ran = Arc::new(AtomicUsize::new(0));
        let queued = queue_counters(&looper, 5, &ran);
        let executed = Arc::new(AtomicUsize::new(0));
        let e = executed.clone();
        looper.execute(Box::new(move || {
            e.fetch_add(1, Ordering::SeqCst);
        }));
        let l = looper.clone();
        let stopper = thread::spawn(move || l.shutdown(false));
        // Once new work is refused, the discarding shutdown is under way. (Probes queued
        // before that are dropped with the rest.)
        loop {
            let probe = looper.spawn(|| ());
            if probe.is_finished() {
                assert!(probe.join().unwrap_err().is_cancelled());
                break;
            }
            thread::sleep(Duration::from_millis(1));
        }
        release.send(()).unwrap();
        stopper.join().unwrap();
        finish(holder); // the started job ran to completion
        for h in queued {
            assert!(h.join().unwrap_err().is_cancelled());
        }
        assert_eq!(ran.load(Ordering::SeqCst), 0);
        assert_eq!(executed.load(Ordering::SeqCst), 0);
        // After shutdown: spawn reports cancelled, execute drops the job.
        assert!(looper.spawn(|| 1).join().unwrap_err().is_cancelled());
        looper.execute(Box::new(|| panic!("must not run")));
        looper.join(); // already down: returns at once
    });
}

#[test]
fn looper_shutdown_from_its_own_job_and_join() {
    with_deadline(|| {
        for wait_for_complete in [false, true] {
            let looper = Arc::new(Looper::new());
            let (go_tx, go) = mpsc::channel::<()>();
            let l = looper.clone();
            let first = looper.spawn(move || {
                go.recv_timeout(LIMIT).expect("queue filled");
                l.shutdown(wait_for_complete); // only starts the shutdown, from inside
                "first"
            });
            let ran = Arc::new(AtomicUsize::new(0));
            let queued = queue_counters(&looper, 5, &ran);
            go_tx.send(()).unwrap();
            looper.join();
            assert_eq!(first.join().unwrap(), "first");
            let results: Vec<_> = queued.into_iter().map(|h| h.join()).collect();
            if wait_for_complete {
                assert!(results.iter().all(|r| r.is_ok()));
                assert_eq!(ran.load(Ordering::SeqCst), 5);
            } else {
                assert!(results
                    .iter()
                    .all(|r| r.as_ref().unwrap_err().is_cancelled()));
                assert_eq!(ran.load(Ordering::SeqCst), 0);
            }
        }
    });
}

/// `shutdown(false)` from one of the looper's own jobs, while other threads are in `join`
/// (which takes the looper's own lock to wait for the request): however the call meets them,
/// no queued job starts after it began — the jobs queued behind the caller are all dropped.
#[test]
fn looper_shutdown_false_from_a_job_beside_joining_threads_starts_no_queued_job() {
    with_deadline(|| {
        for round in 0..100 {
            let looper = Arc::new(Looper::new());
            let (go_tx, go) = mpsc::channel::<()>();
            let l = looper.clone();
            let first = looper.spawn(move || {
                go.recv_timeout(LIMIT).expect("queue filled");
                l.shutdown(false);
            });
            let ran = Arc::new(AtomicUsize::new(0));
            let queued = queue_counters(&looper, 5, &ran);
            let joiners: Vec<_> = (0..4)
                .map(|_| {
                    let l = looper.clone();
                    thread::spawn(move || l.join())
                })
                .collect();
            go_tx.send(()).unwrap();
            looper.join();
            for j in joiners {
                j.join().unwrap();
            }
            first.join().unwrap();
            for h in queued {
                assert!(
                    h.join().is_err_and(|e| e.is_cancelled()),
                    "round {round}: a job queued behind shutdown(false) was not dropped"
                );
            }
            assert_eq!(
                ran.load(Ordering::SeqCst),
                0,
                "round {round}: a queued job ran"
            );
        }
    });
}

#[test]
fn looper_shutdown_true_runs_queued_jobs_and_waits() {
    with_deadline(|| {
        let looper = Looper::new();
        let (holder, release) = hold(&looper);
        let ran = Arc::new(AtomicUsize::new(0));
        let queued = queue_counters(&looper, 5, &ran);
        let sleepers: Vec<_> = (0..3)
            .map(|_| {
                let ran = ran.clone();
                looper.spawn(move || {
                    fibra::sleep(Duration::from_millis(30));
                    ran.fetch_add(1, Ordering::SeqCst);
                })
            })
            .collect();
        release.send(()).unwrap();
        looper.shutdown(true);
        // Everything finished before shutdown returned.
        assert_eq!(ran.load(Ordering::SeqCst), 8);
        assert!(holder.is_finished());
        for h in queued.into_iter().chain(sleepers) {
            assert!(h.is_finished());
            h.join().unwrap();
        }
    });
}

#[test]
fn looper_shutdown_from_a_fiber_of_another_scheduler_parks_it() {
    with_deadline(|| {
        let looper = Arc::new(Looper::new());
        let sched = fibra::Scheduler::builder().threads(1).build().unwrap();
        sched.start();
        // The looper cannot finish until a second fiber of `sched` sends, and that fiber
        // runs only after the first is inside `shutdown`: if shutdown blocked the only
        // worker instead of parking the fiber, this would never end.
        let (tx, rx) = oneshot::channel::<()>();
        let waiting = looper.spawn(move || rx.recv().unwrap());
        let stopping = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let (l, s) = (looper.clone(), stopping.clone());
        let stopper = sched
            .submit(
                move || {
                    s.store(true, Ordering::SeqCst);
                    l.shutdown(true);
                },
                None,
            )
            .unwrap();
        let sender = sched
            .submit(
                move || {
                    while !stopping.load(Ordering::SeqCst) {
                        fibra::Fiber::yield_now();
                    }
                    tx.send(()).unwrap();
                },
                None,
            )
            .unwrap();
        finish(sender);
        finish(stopper);
        finish(waiting);
        sched.stop();
    });
}

#[test]
fn inline_runs_at_once_on_the_caller() {
    let ran_on = Arc::new(std::sync::Mutex::new(None));
    let r = ran_on.clone();
    Inline.execute(Box::new(move || *r.lock().unwrap() = Some(here())));
    assert_eq!(*ran_on.lock().unwrap(), Some(here()));
    let h = Inline.spawn(here);
    assert!(h.is_finished());
    assert_eq!(h.join().unwrap(), here());
    let p = Inline.spawn(|| -> u8 { panic!("inline panic") });
    assert!(p.is_finished());
    assert!(p.join().unwrap_err().is_panic());
}

#[test]
fn new_thread_gives_each_job_and_fiber_a_thread_of_its_own() {
    with_deadline(|| {
        let (tx, rx) = mpsc::channel();
        for _ in 0..3 {
            let tx = tx.clone();
            NewThread.execute(Box::new(move || {
                tx.send((here(), thread::current().name().map(String::from)))
                    .unwrap()
            }));
        }
        let jobs: Vec<_> = rx.iter().take(3).collect();
        assert!(jobs
            .iter()
            .all(|(t, n)| *t != here() && n.as_deref() == Some("new-thread")));
        let fibers: Vec<_> = (0..3)
            .map(|_| NewThread.spawn(|| thread::current().name().map(String::from)))
            .collect();
        for f in fibers {
            assert_eq!(finish(f).as_deref(), Some("new-thread-0"));
        }
        // A panicking fiber reaches its handle (and its thread still goes away).
        let p = NewThread.spawn(|| -> u8 { panic!("new thread panic") });
        assert!(p.join().unwrap_err().is_panic());
    });
}

#[test]
fn spawn_on_a_stopped_executor_reports_cancelled() {
    with_deadline(|| {
        let pool = ThreadPool::new(1);
        pool.shutdown();
        assert!(pool.spawn(|| 1).join().unwrap_err().is_cancelled());
        pool.execute(Box::new(|| panic!("must not run")));
        let looper = Looper::new();
        looper.shutdown(false);
        assert!(looper.spawn(|| 1).join().unwrap_err().is_cancelled());
    });
}

/// An executor written by a user: only `execute`; `spawn` comes from the trait.
struct OnAThread;

impl Executor for OnAThread {
    fn execute(&self, job: Box<dyn FnOnce() + Send>) {
        thread::spawn(job);
    }
}

/// Drops every job.
struct BlackHole;

impl Executor for BlackHole {
    fn execute(&self, job: Box<dyn FnOnce() + Send>) {
        drop(job);
    }
}

#[test]
fn the_provided_spawn_works_for_any_executor() {
    with_deadline(|| {
        let h = OnAThread.spawn(|| 6 * 7);
        assert_eq!(finish(h), 42);
        let p = OnAThread.spawn(|| -> u8 { panic!("user executor panic") });
        assert!(p.join().unwrap_err().is_panic());
        // A job the executor drops never leaves its handle waiting.
        assert!(BlackHole.spawn(|| 1).join().unwrap_err().is_cancelled());
    });
}

#[test]
fn executors_behind_references_and_arcs() {
    with_deadline(|| {
        fn on<E: Executor>(e: E) -> ThreadId {
            finish(e.spawn(here))
        }
        let looper = Arc::new(Looper::new());
        assert_eq!(on(looper.clone()), looper.thread_id());
        assert_eq!(on(&*looper), looper.thread_id());
        let dynamic: Vec<Box<dyn Executor>> = vec![Box::new(Inline), Box::new(NewThread)];
        let count = Arc::new(AtomicUsize::new(0));
        for e in &dynamic {
            let c = count.clone();
            e.execute(Box::new(move || {
                c.fetch_add(1, Ordering::SeqCst);
            }));
        }
        crate::common::wait_until("both jobs", || count.load(Ordering::SeqCst) == 2);
    });
}
