//! `Scheduler::metrics`, `Scheduler::dump` and the watchdog.

use std::io::Read;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

use crate::common::{finish, wait_until, with_deadline, LIMIT};
use fibra::dump::{Status, WaitOn};
use fibra::{Dump, Scheduler};

fn sched(threads: usize) -> Arc<Scheduler> {
    let s = Arc::new(Scheduler::builder().threads(threads).build().unwrap());
    s.start();
    s
}

fn quiet_sched(threads: usize) -> Arc<Scheduler> {
    let s = Arc::new(
        Scheduler::builder()
            .threads(threads)
            .watchdog(Duration::ZERO)
            .build()
            .unwrap(),
    );
    s.start();
    s
}

fn entry<'a>(dump: &'a Dump, name: &str) -> &'a fibra::dump::Entry {
    dump.fibers()
        .iter()
        .find(|e| e.name() == Some(name))
        .unwrap_or_else(|| panic!("no fiber '{name}' in the dump:\n{dump}"))
}

/// Takes dumps until `name` shows `status` (a fiber reaches its park a moment after it was
/// submitted).
fn dump_until(s: &Scheduler, name: &str, status: Status) -> Dump {
    let deadline = Instant::now() + LIMIT;
    loop {
        let d = s.dump();
        if d.fibers()
            .iter()
            .any(|e| e.name() == Some(name) && e.status() == status)
        {
            return d;
        }
        assert!(
            Instant::now() < deadline,
            "'{name}' never showed {status:?}:\n{d}"
        );
        std::thread::sleep(Duration::from_millis(2));
    }
}

#[test]
fn counters_count_what_fibers_do() {
    with_deadline(|| {
        let s = sched(2);
        let before = s.metrics();
        assert_eq!(before.workers().len(), 2);
        let n = 50;
        let handles: Vec<_> = (0..n)
            .map(|_| {
                s.spawn(|| {
                    for _ in 0..10 {
                        fibra::Fiber::yield_now();
                    }
                    fibra::sleep(Duration::from_millis(1));
                })
            })
            .collect();
        for h in handles {
            finish(h);
        }
        // A task's result is out just before its worker counts it finished.
        wait_until("every task counted out", || s.metrics().live_tasks() == 0);
        let m = s.metrics();
        let d = m.delta(&before);
        let sum = |f: fn(&fibra::WorkerMetrics) -> u64| d.workers().iter().map(f).sum::<u64>();
        assert!(sum(|w| w.yields()) >= 10 * n, "{d}");
        assert!(sum(|w| w.parks()) >= n, "{d}");
        // Started, resumed after each yield and after the sleep.
        assert!(sum(|w| w.resumes()) >= 12 * n, "{d}");
        assert!(sum(|w| w.finished()) >= n, "{d}");
        // Timers fire on the home worker: local wakes.
        assert!(sum(|w| w.local_wakes()) >= n, "{d}");
        assert_eq!(m.live_tasks(), 0);
        assert_eq!(m.spawned(), n, "{m}");
        assert_eq!(d.spawned(), n);
        // Gauges are published every 64 passes and before a sleep: idle, the workers sleep.
        wait_until("the gauges to settle", || s.metrics().stacks_in_use() == 0);
        assert!(s.metrics().stacks_cached() >= 1, "{}", s.metrics());
        assert_eq!(m.timers(), 0);
        // Idle workers went to sleep, and their sleep is not busy time.
        wait_until("a worker to sleep", || {
            s.metrics().workers().iter().any(|w| w.sleeps() > 0)
        });
        let m = s.metrics();
        for w in m.workers() {
            assert!(
                w.busy() + w.slept() <= m.uptime() + Duration::from_millis(50),
                "{m}"
            );
        }
        s.stop();
    });
}

#[test]
fn gauges_show_parked_fibers_timers_and_queues() {
    with_deadline(|| {
        let s = quiet_sched(2);
        let (tx, rx) = mpsc::channel::<fibra::Unparker>();
        let parked: Vec<_> = (0..10)
            .map(|_| {
                let tx = tx.clone();
                s.submit(move || fibra::park(move |u| tx.send(u).unwrap()), Some(1))
                    .unwrap()
            })
            .collect();
        let sleepers: Vec<_> = (0..7)
            .map(|_| s.spawn(|| fibra::sleep(Duration::from_secs(600))))
            .collect();
        let unparkers: Vec<_> = (0..10).map(|_| rx.recv_timeout(LIMIT).unwrap()).collect();
        wait_until("7 timers", || s.metrics().timers() == 7);
        // Published before the workers sleep.
        wait_until("17 stacks in use", || s.metrics().stacks_in_use() == 17);
        let m = s.metrics();
        assert_eq!(m.live_tasks(), 17, "{m}");
        assert!(m.workers()[1].fibers() >= 10, "{m}");
        // Woken from this thread: remote wakes of worker 1.
        let remote_before = m.workers()[1].remote_wakes();
        for u in unparkers {
            u.unpark();
        }
        for h in parked {
            finish(h);
        }
        let m = s.metrics();
        assert!(m.workers()[1].remote_wakes() >= remote_before + 10, "{m}");
        for h in &sleepers {
            h.cancel();
        }
        for h in sleepers {
            assert!(h.join().unwrap_err().is_cancelled());
        }
        wait_until("timers to go", || s.metrics().timers() == 0);
        s.stop();
    });
}

#[test]
fn a_spawner_that_never_yields_gets_its_tasks_stolen() {
    with_deadline(|| {
        let s = quiet_sched(2);
        let done = Arc::new(AtomicUsize::new(0));
        let d = done.clone();
        let spawner = s
            .submit(
                move || {
                    for _ in 0..100 {
                        let d = d.clone();
                        fibra::spawn(move || {
                            d.fetch_add(1, Ordering::SeqCst);
                        });
                    }
                    // Never suspends: only the other worker can run the tasks.
                    let deadline = Instant::now() + LIMIT;
                    while d.load(Ordering::SeqCst) < 100 && Instant::now() < deadline {
                        std::hint::spin_loop();
                    }
                },
                Some(0),
            )
            .unwrap();
        finish(spawner);
        assert_eq!(done.load(Ordering::SeqCst), 100);
        let m = s.metrics();
        assert!(m.workers()[1].steals() >= 1, "{m}");
        // The spinning worker was busy; busy time reaches about the spin.
        assert!(m.workers()[0].busy() > Duration::ZERO, "{m}");
        s.stop();
    });
}

#[test]
fn outside_submissions_are_counted_as_injected() {
    with_deadline(|| {
        let s = sched(2);
        let hs: Vec<_> = (0..20).map(|i| s.spawn(move || i)).collect();
        for h in hs {
            finish(h);
        }
        let m = s.metrics();
        let injected: u64 = m.workers().iter().map(|w| w.injected()).sum();
        assert!(injected >= 1, "{m}");
        assert_eq!(m.injector_depth(), 0);
        s.stop();
    });
}

#[test]
fn io_and_blocking_pool_figures() {
    with_deadline(|| {
        let s = sched(2);
        let listener = fibra::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let acceptor = s
            .task()
            .name("acceptor")
            .submit(move || listener.accept().map(|_| ()), None)
            .unwrap();
        wait_until("a fiber waiting for I/O", || s.metrics().io_waiting() >= 1);
        assert!(s.metrics().io_registrations() >= 1);
        let d = s.dump();
        assert!(
            matches!(
                entry(&d, "acceptor").status(),
                Status::Parked(WaitOn::Io {
                    fd,
                    readable: true,
                    writable: false
                }) if fd >= 0
            ),
            "{d}"
        );
        assert!(d.to_string().contains("readable"), "{d}");
        let _c = std::net::TcpStream::connect(addr).unwrap();
        finish(acceptor).unwrap();

        let (release_tx, release_rx) = mpsc::channel::<()>();
        let blocked = s
            .task()
            .name("blocked")
            .submit(
                move || fibra::unblock(move || release_rx.recv_timeout(LIMIT).is_ok()),
                None,
            )
            .unwrap();
        wait_until("a busy pool thread", || s.metrics().blocking_busy() >= 1);
        dump_until(&s, "blocked", Status::Parked(WaitOn::Blocking));
        release_tx.send(()).unwrap();
        assert!(finish(blocked));
        s.stop();
    });
}

#[test]
fn metrics_display_is_a_table_and_works_anywhere() {
    with_deadline(|| {
        let s = sched(3);
        // Not only from outside: from a fiber too.
        let s2 = s.clone();
        let text = s.block_on(move || s2.metrics().to_string());
        assert!(text.contains("scheduler 'fibra'"), "{text}");
        assert!(text.contains("resumes"), "{text}");
        assert_eq!(
            text.lines()
                .filter(|l| l.trim_start().starts_with(char::is_numeric))
                .count(),
            3,
            "{text}"
        );
        assert!(format!("{:?}", s.metrics()).contains("workers"));
        s.stop();
        // After the stop the figures are still readable.
        assert_eq!(s.metrics().live_tasks(), 0);
        // A scheduler never started.
        let idle = Scheduler::builder().threads(2).build().unwrap();
        let m = idle.metrics();
        assert_eq!(m.spawned(), 0);
        assert!(m.workers().iter().all(|w| w.resumes() == 0));
    });
}

#[test]
fn dump_names_what_each_fiber_waits_on() {
    with_deadline(|| {
        let s = quiet_sched(2);
        // A sleeper, with its deadline.
        let sleeper_line = line!() + 4;
        let sleeper = s
            .task()
            .name("sleeper")
            .submit(|| fibra::sleep(Duration::from_secs(600)), None)
            .unwrap();
        // A fiber waiting for a lock held by another.
        let lock = Arc::new(fibra::sync::Mutex::new(()));
        let (held_tx, held_rx) = mpsc::channel();
        let (release_tx, release_rx) = fibra::sync::oneshot::channel::<()>();
        let l = lock.clone();
        let holder = s
            .task()
            .name("holder")
            .submit(
                move || {
                    let _g = l.lock().unwrap();
                    held_tx.send(()).unwrap();
                    let _ = release_rx.recv();
                },
                None,
            )
            .unwrap();
        held_rx.recv_timeout(LIMIT).unwrap();
        let l = lock.clone();
        let locker = s
            .task()
            .name("locker")
            .submit(move || drop(l.lock().unwrap()), None)
            .unwrap();
        // A receiver on an empty channel.
        let (msg_tx, msg_rx) = fibra::sync::mpsc::channel::<u32>();
        let receiver = s
            .task()
            .name("receiver")
            .submit(move || msg_rx.recv().unwrap(), None)
            .unwrap();
        // A joiner of the sleeper.
        let sleeper_id = sleeper.id();
        let sleeper = Arc::new(parking_lot::Mutex::new(Some(sleeper)));
        let sl = sleeper.clone();
        let joiner = s
            .task()
            .name("joiner")
            .submit(
                move || {
                    let h = sl.lock().take().unwrap();
                    h.join().unwrap_err().is_cancelled()
                },
                None,
            )
            .unwrap();
        // A plain park, and a future.
        let (utx, urx) = mpsc::channel::<fibra::Unparker>();
        let parker = s
            .task()
            .name("parker")
            .submit(move || fibra::park(move |u| utx.send(u).unwrap()), None)
            .unwrap();
        let (ftx, frx) = fibra::sync::oneshot::channel::<u8>();
        let awaiter = s
            .task()
            .name("awaiter")
            .submit(move || fibra::future::block_on(frx).unwrap(), None)
            .unwrap();
        // A fiber that keeps yielding: ready or running whenever looked at.
        let stop = Arc::new(AtomicBool::new(false));
        let st = stop.clone();
        let yielder = s
            .task()
            .name("yielder")
            .submit(
                move || {
                    while !st.load(Ordering::Relaxed) {
                        fibra::Fiber::yield_now();
                    }
                },
                None,
            )
            .unwrap();

        dump_until(&s, "sleeper", Status::Parked(WaitOn::Sleep));
        dump_until(&s, "locker", Status::Parked(WaitOn::Lock("Mutex::lock")));
        dump_until(
            &s,
            "receiver",
            Status::Parked(WaitOn::Channel("mpsc::Receiver::recv")),
        );
        dump_until(
            &s,
            "holder",
            Status::Parked(WaitOn::Channel("oneshot::Receiver::recv")),
        );
        dump_until(&s, "joiner", Status::Parked(WaitOn::Join(sleeper_id)));
        dump_until(&s, "parker", Status::Parked(WaitOn::Park));
        let d = dump_until(&s, "awaiter", Status::Parked(WaitOn::Future));

        let e = entry(&d, "sleeper");
        assert!(e.deadline().unwrap() > Instant::now() + Duration::from_secs(500));
        assert_eq!(e.location().file(), file!());
        assert_eq!(e.location().line(), sleeper_line);
        assert!(e.duration().is_some());
        assert!(!e.is_cancelled());
        assert_eq!(entry(&d, "yielder").status(), Status::Ready);
        assert!(d.fibers().windows(2).all(|w| w[0].id() < w[1].id()));
        assert_eq!(d.workers().len(), 2);
        assert!(d.workers().iter().all(|w| w.pause().is_some()), "{d}");
        assert_eq!(
            d.workers().iter().map(|w| w.fibers()).sum::<usize>(),
            d.fibers().len()
        );

        let text = d.to_string();
        for needle in [
            "'sleeper'",
            "sleeping, until",
            "waiting for a lock (Mutex::lock)",
            "waiting on a channel (mpsc::Receiver::recv)",
            &format!("joining fiber {sleeper_id}"),
            "parked (fibra::park)",
            "awaiting a future",
            &format!("submitted at {}:{sleeper_line}", file!()),
        ] {
            assert!(text.contains(needle), "no '{needle}' in:\n{text}");
        }

        // Let everything go.
        msg_tx.send(7).unwrap();
        assert_eq!(finish(receiver), 7);
        release_tx.send(()).unwrap();
        finish(holder);
        finish(locker);
        urx.recv_timeout(LIMIT).unwrap().unpark();
        finish(parker);
        ftx.send(1).unwrap();
        assert_eq!(finish(awaiter), 1);
        stop.store(true, Ordering::Relaxed);
        finish(yielder);
        // Cancelling the sleeper ends the joiner's join.
        let cancelled = s.stop_timeout(Duration::from_millis(10));
        assert!(cancelled >= 1);
        // The joiner is cancelled too, or sees the sleeper's cancellation first.
        match joiner.join() {
            Ok(saw_cancelled) => assert!(saw_cancelled),
            Err(e) => assert!(e.is_cancelled()),
        }
    });
}

#[test]
fn a_fiber_can_dump_its_own_scheduler() {
    with_deadline(|| {
        // One worker: the dumping fiber's own worker must answer while it waits.
        let s = quiet_sched(1);
        let sleeper = s
            .task()
            .name("nap")
            .submit(|| fibra::sleep(Duration::from_secs(600)), None)
            .unwrap();
        let s2 = s.clone();
        let d = finish(
            s.task()
                .name("dumper")
                .submit(move || s2.dump(), None)
                .unwrap(),
        );
        assert_eq!(entry(&d, "dumper").status(), Status::Running, "{d}");
        assert!(d.workers()[0].pause().is_some(), "{d}");
        assert!(d.fibers().iter().any(|e| e.id() == sleeper.id()), "{d}");
        sleeper.cancel();
        s.stop();
    });
}

#[test]
fn dump_of_a_scheduler_that_is_not_running_is_empty_and_immediate() {
    with_deadline(|| {
        let s = Scheduler::builder().threads(2).build().unwrap();
        let queued = s.spawn(|| 1);
        let d = s.dump();
        assert!(d.fibers().is_empty());
        assert_eq!(d.live_tasks(), 1);
        assert!(d.took() < LIMIT);
        assert!(d.to_string().contains("1 live tasks"), "{d}");
        s.start();
        assert_eq!(finish(queued), 1);
        s.stop();
        let d = s.dump();
        assert!(d.fibers().is_empty() && d.workers().is_empty());
    });
}

#[test]
fn a_worker_stuck_in_a_fiber_is_reported_by_the_dump() {
    with_deadline(|| {
        let s = Arc::new(
            Scheduler::builder()
                .threads(2)
                .watchdog(Duration::from_millis(20))
                .build()
                .unwrap(),
        );
        s.start();
        let stop = Arc::new(AtomicBool::new(false));
        let st = stop.clone();
        let (started_tx, started_rx) = mpsc::channel();
        let hog = s
            .task()
            .name("spinner")
            .submit(
                move || {
                    started_tx.send(()).unwrap();
                    let deadline = Instant::now() + LIMIT;
                    while !st.load(Ordering::Relaxed) && Instant::now() < deadline {
                        std::hint::spin_loop();
                    }
                },
                Some(1),
            )
            .unwrap();
        started_rx.recv_timeout(LIMIT).unwrap();
        std::thread::sleep(Duration::from_millis(60));
        let d = s.dump();
        let w = &d.workers()[1];
        assert!(w.pause().is_none(), "{d}");
        assert_eq!(w.stuck_in(), Some(hog.id()), "{d}");
        let e = entry(&d, "spinner");
        assert_eq!(e.status(), Status::Running);
        assert!(e.duration().is_some(), "the watchdog knows how long: {d}");
        assert!(d.workers()[0].pause().is_some(), "{d}");
        assert!(d.took() >= fibra::dump::DUMP_PATIENCE);
        assert!(d.to_string().contains("stuck in fiber"), "{d}");
        stop.store(true, Ordering::Relaxed);
        finish(hog);
        s.stop();
    });
}

/// A worker with many parked fibers and one that computes for 5 ms between yields (not a
/// hog) needs many chunks, one per pass, to list them: the dump waits for it as long as its
/// loop moves, and lists every fiber (it used to give up after 100 ms and list none).
#[test]
fn a_dump_waits_for_a_worker_that_answers_slowly_but_moves() {
    with_deadline(|| {
        const N: usize = 50_000;
        let s = Arc::new(
            Scheduler::builder()
                .threads(1)
                .stack_size(fibra::MIN_STACK_SIZE)
                .build()
                .unwrap(),
        );
        s.start();
        let unparkers = Arc::new(std::sync::Mutex::new(Vec::with_capacity(N)));
        for _ in 0..N {
            let u = unparkers.clone();
            drop(s.spawn(move || fibra::park(|x| u.lock().unwrap().push(x))));
        }
        wait_until("all parked", || unparkers.lock().unwrap().len() == N);
        let stop = Arc::new(AtomicBool::new(false));
        let st = stop.clone();
        let cruncher = s
            .task()
            .name("polite-cruncher")
            .submit(
                move || {
                    while !st.load(Ordering::SeqCst) {
                        crate::common::block_thread(Duration::from_millis(5));
                        fibra::Fiber::yield_now();
                    }
                },
                None,
            )
            .unwrap();
        std::thread::sleep(Duration::from_millis(20));
        let d = s.dump();
        stop.store(true, Ordering::SeqCst);
        let w = &d.workers()[0];
        assert!(
            w.pause().is_some() && w.stuck_in().is_none(),
            "{:?}",
            w.pause()
        );
        assert_eq!(
            d.fibers().len(),
            N + 1,
            "listed {} of {}",
            d.fibers().len(),
            N + 1
        );
        finish(cruncher);
        for u in unparkers.lock().unwrap().drain(..) {
            u.unpark();
        }
        wait_until("drained", || s.metrics().live_tasks() == 0);
        s.stop();
    });
}

#[test]
fn use_caller_worker_0_is_listed_while_not_driven() {
    with_deadline(|| {
        let s = Scheduler::builder()
            .threads(2)
            .use_caller(true)
            .watchdog(Duration::ZERO)
            .build()
            .unwrap();
        s.start();
        let (tx, rx) = mpsc::channel::<fibra::Unparker>();
        let parked = s
            .task()
            .name("on-zero")
            .submit(move || fibra::park(move |u| tx.send(u).unwrap()), Some(0))
            .unwrap();
        // Worker 0 runs only while this thread drives it: in block_on.
        s.block_on(|| ());
        let u = loop {
            if let Ok(u) = rx.try_recv() {
                break u;
            }
            s.block_on(|| ());
        };
        let d = s.dump();
        assert_eq!(entry(&d, "on-zero").status(), Status::Parked(WaitOn::Park));
        assert_eq!(entry(&d, "on-zero").worker(), 0);
        assert!(d.workers().iter().all(|w| w.pause().is_some()), "{d}");
        u.unpark();
        s.block_on(|| ());
        assert!(parked.wait_timeout(LIMIT));
        s.stop();
    });
}

#[test]
fn concurrent_dumps_and_metrics_while_fibers_churn() {
    with_deadline(|| {
        let s = quiet_sched(2);
        // Long-lived fibers that every dump must list, while others come and go around
        // them (the dump lists 1 024 fibers per pass: the registry changes in between).
        let keepers = 3000;
        let release = Arc::new(fibra::sync::Barrier::new(keepers + 1));
        let kept: Vec<_> = (0..keepers)
            .map(|_| {
                let r = release.clone();
                s.task()
                    .name("keeper")
                    .submit(
                        move || {
                            r.wait();
                        },
                        None,
                    )
                    .unwrap()
            })
            .collect();
        wait_until("the keepers to park", || {
            s.dump()
                .fibers()
                .iter()
                .filter(|e| e.name() == Some("keeper"))
                .count()
                == keepers
        });
        let stop = Arc::new(AtomicBool::new(false));
        let churn: Vec<_> = (0..4)
            .map(|_| {
                let stop = stop.clone();
                s.spawn(move || {
                    while !stop.load(Ordering::Relaxed) {
                        let hs: Vec<_> = (0..20)
                            .map(|i| {
                                fibra::spawn(move || {
                                    fibra::sleep(Duration::from_micros(100));
                                    i
                                })
                            })
                            .collect();
                        for h in hs {
                            h.join().unwrap();
                        }
                    }
                })
            })
            .collect();
        let watchers: Vec<_> = (0..3)
            .map(|_| {
                let s = s.clone();
                std::thread::spawn(move || {
                    let end = Instant::now() + Duration::from_millis(300);
                    let mut dumps = 0;
                    while Instant::now() < end {
                        let d = s.dump();
                        assert!(d.workers().iter().all(|w| w.pause().is_some()), "{d}");
                        let listed = d
                            .fibers()
                            .iter()
                            .filter(|e| e.name() == Some("keeper"))
                            .count();
                        assert_eq!(listed, keepers);
                        assert!(d.fibers().windows(2).all(|w| w[0].id() < w[1].id()));
                        let _ = d.to_string();
                        let _ = s.metrics().to_string();
                        dumps += 1;
                    }
                    dumps
                })
            })
            .collect();
        for w in watchers {
            assert!(w.join().unwrap() > 0);
        }
        stop.store(true, Ordering::Relaxed);
        for h in churn {
            finish(h);
        }
        release.wait();
        for h in kept {
            finish(h);
        }
        wait_until("every task counted out", || s.metrics().live_tasks() == 0);
        s.stop();
    });
}

#[test]
fn dump_of_many_fibers_lists_every_one() {
    with_deadline(|| {
        let s = quiet_sched(2);
        let n = 20_000;
        let gate = Arc::new(fibra::sync::Barrier::new(n + 1));
        let hs: Vec<_> = (0..n)
            .map(|_| {
                let g = gate.clone();
                s.spawn(move || {
                    g.wait();
                })
            })
            .collect();
        wait_until("every fiber parked", || {
            s.metrics()
                .workers()
                .iter()
                .map(|w| w.fibers())
                .sum::<usize>()
                == n
        });
        let d = s.dump();
        assert_eq!(d.fibers().len(), n, "{}", d.workers().len());
        assert!(d
            .fibers()
            .iter()
            .all(|e| e.status() == Status::Parked(WaitOn::Other("Barrier::wait"))));
        for w in d.workers() {
            // Generous: the figure itself is stated by `examples/monitor.rs --dump-bench`.
            assert!(w.pause().unwrap() < Duration::from_secs(2), "{d:?}");
        }
        gate.wait();
        for h in hs {
            finish(h);
        }
        s.stop();
    });
}

/// Spins for `d` without suspending.
fn spin(d: Duration) {
    let end = Instant::now() + d;
    while Instant::now() < end {
        std::hint::spin_loop();
    }
}

/// The only watchdog report in a child's `stderr`, which must name fiber `name`.
fn the_one_report<'a>(stderr: &'a str, name: &str) -> &'a str {
    let reports: Vec<&str> = stderr
        .lines()
        .filter(|l| l.contains("fibra: watchdog:"))
        .collect();
    assert_eq!(reports.len(), 1, "{stderr}");
    assert!(reports[0].contains(&format!("fiber '{name}'")), "{stderr}");
    reports[0]
}

/// A scheduler of `threads` workers whose watchdog reports after 50 ms, started.
fn watched(threads: usize) -> Scheduler {
    let s = Scheduler::builder()
        .threads(threads)
        .watchdog(Duration::from_millis(50))
        .build()
        .unwrap();
    s.start();
    s
}

/// A fiber that runs without suspending for longer than the watchdog's limit is reported
/// once per episode, by name, with its worker and the number of tasks waiting behind it;
/// a fiber that keeps yielding, and a scheduler with the watchdog off, are not reported.
/// The child's stderr holds the reports.
#[test]
fn watchdog_reports_a_hog_once_by_name() {
    let run = crate::common::in_child(|| {
        let s = watched(2);
        // Three tasks wait behind the hog on worker 1 (pinned there, so never stolen).
        let (spinning_tx, spinning_rx) = mpsc::channel::<()>();
        let hog = s
            .task()
            .name("busy-bee")
            .submit(
                move || {
                    spinning_tx.send(()).unwrap();
                    spin(Duration::from_millis(400));
                    // A second episode after one suspension (the waiting tasks run in between).
                    fibra::Fiber::yield_now();
                    spin(Duration::from_millis(400));
                },
                Some(1),
            )
            .unwrap();
        spinning_rx.recv().unwrap();
        let waiting: Vec<_> = (0..3).map(|_| s.submit(|| (), Some(1)).unwrap()).collect();
        let polite = s
            .task()
            .name("polite")
            .submit(
                move || {
                    let end = Instant::now() + Duration::from_millis(300);
                    while Instant::now() < end {
                        spin(Duration::from_millis(5));
                        fibra::Fiber::yield_now();
                    }
                },
                Some(0),
            )
            .unwrap();
        hog.join().unwrap();
        polite.join().unwrap();
        for h in waiting {
            h.join().unwrap();
        }
        s.stop();
        let off = Scheduler::builder()
            .threads(1)
            .watchdog(Duration::ZERO)
            .build()
            .unwrap();
        off.start();
        off.task()
            .name("unwatched")
            .submit(move || spin(Duration::from_millis(300)), None)
            .unwrap()
            .join()
            .unwrap();
        off.stop();
    });
    run.assert_ok("the watchdog child failed");
    let err = &run.stderr;
    let reports: Vec<&str> = err.lines().filter(|l| l.contains("watchdog")).collect();
    assert_eq!(
        reports.len(),
        2,
        "one report per episode, two episodes:\n{err}"
    );
    for r in &reports {
        assert!(r.contains("fiber 'busy-bee'"), "{err}");
        assert!(r.contains("held worker 1"), "{err}");
        // Computing; on a loaded machine the OS may have kept it off its CPU for most of
        // the episode, which the report then says instead. Never blocked in the kernel.
        assert!(
            r.contains("It is computing") || r.contains("keeps it off its CPU"),
            "{err}"
        );
        assert!(r.contains("without suspending"), "{err}");
    }
    assert!(reports[0].contains("3 task(s) wait"), "{err}");
    // The ready count is published every 64 passes: the hog itself, just yielded, may
    // still be in it.
    assert!(
        reports[1].contains("0 task(s) wait") || reports[1].contains("1 task(s) wait"),
        "{err}"
    );
    // The polite fiber that yields, and the scheduler with the watchdog off, are not
    // reported.
    assert!(!err.contains("polite"), "{err}");
    assert!(!err.contains("unwatched"), "{err}");
}

/// A fiber holds a `std::sync::Mutex` across `fibra::sleep`; a sibling on the same (only)
/// worker locks it and blocks the worker's thread in the kernel, for good (the holder can
/// never resume). The watchdog names the sibling, says `futex`, and points at fibra::sync
/// rather than at computing; a dump says the same of the worker. The child ends itself
/// once the report is out.
#[test]
fn watchdog_names_a_fiber_blocked_in_futex() {
    let run = crate::common::in_child(|| {
        static SHARED: std::sync::Mutex<u32> = std::sync::Mutex::new(0);
        let s = watched(1);
        let (held_tx, held_rx) = mpsc::channel::<()>();
        s.task()
            .name("holder")
            .submit(
                move || {
                    let mut g = SHARED.lock().unwrap();
                    held_tx.send(()).unwrap();
                    fibra::sleep(Duration::from_millis(200));
                    *g += 1;
                },
                None,
            )
            .unwrap();
        held_rx.recv().unwrap();
        s.task()
            .name("sibling")
            .submit(|| *SHARED.lock().unwrap() += 1, None)
            .unwrap();
        // The worker is stuck for good: a dump names the call it is stuck in; then leave,
        // without stopping the scheduler (the child's exit ends its threads).
        std::thread::sleep(Duration::from_millis(300));
        let dump = s.dump();
        let w = &dump.workers()[0];
        assert_eq!(w.blocked_in(), Some("futex"), "{dump}");
        assert!(w.stuck_in().is_some(), "{dump}");
        eprintln!("{dump}");
        std::mem::forget(s);
    });
    run.assert_ok("the futex child failed");
    let err = &run.stderr;
    let r = the_one_report(err, "sibling");
    assert!(r.contains("blocked in the kernel in `futex`"), "{err}");
    assert!(r.contains("fibra::sync"), "{err}");
    assert!(!r.contains("computing"), "{err}");
    assert!(
        err.contains("whose thread is blocked in the kernel in `futex`"),
        "the dump: {err}"
    );
}

/// A fiber computes while the OS keeps its worker's thread off its CPU: the thread is
/// `SCHED_IDLE` and shares one CPU with a plain thread that spins. The report says the
/// thread waited for a CPU, not that the fiber computes that long.
#[test]
fn watchdog_tells_a_worker_kept_off_its_cpu_from_a_fiber_that_computes() {
    let run = crate::common::in_child(|| {
        // The first CPU this process may use (not always CPU 0 in a container).
        // SAFETY: a zeroed cpu_set_t is a valid empty set, filled by the call.
        let first = unsafe {
            let mut allowed: libc::cpu_set_t = std::mem::zeroed();
            let size = std::mem::size_of::<libc::cpu_set_t>();
            assert_eq!(libc::sched_getaffinity(0, size, &mut allowed), 0);
            (0..libc::CPU_SETSIZE as usize)
                .find(|&c| libc::CPU_ISSET(c, &allowed))
                .expect("a CPU")
        };
        let pin_to_first_cpu = move || {
            // SAFETY: a zeroed cpu_set_t is a valid empty set; CPU_SET writes within it; the
            // call changes only the calling thread.
            unsafe {
                let mut set: libc::cpu_set_t = std::mem::zeroed();
                libc::CPU_SET(first, &mut set);
                assert_eq!(
                    libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set),
                    0
                );
            }
        };
        // The competitor first: spinning on that CPU before the fiber starts, and until after
        // its episode.
        let (hog_tx, hog_rx) = mpsc::channel::<()>();
        let hog = std::thread::spawn(move || {
            pin_to_first_cpu();
            hog_tx.send(()).unwrap();
            spin(Duration::from_millis(700));
        });
        hog_rx.recv().unwrap();
        let s = watched(1);
        let starved = s
            .task()
            .name("starved")
            .submit(
                move || {
                    pin_to_first_cpu();
                    let param = libc::sched_param { sched_priority: 0 };
                    // SAFETY: a valid sched_param; changes only this (worker) thread.
                    let r = unsafe { libc::sched_setscheduler(0, libc::SCHED_IDLE, &param) };
                    assert_eq!(r, 0, "SCHED_IDLE");
                    spin(Duration::from_millis(400));
                },
                None,
            )
            .unwrap();
        starved.join().unwrap();
        hog.join().unwrap();
        s.stop();
    });
    run.assert_ok("the starved child failed");
    let err = &run.stderr;
    let r = the_one_report(err, "starved");
    assert!(r.contains("keeps it off its CPU"), "{err}");
    assert!(!r.contains("computing:"), "{err}");
}

#[test]
fn the_watchdog_sleeps_while_the_scheduler_is_idle() {
    crate::common::child_ok(|| {
        with_deadline(|| {
            let s = Scheduler::builder()
                .threads(2)
                .name("idlewatch")
                .watchdog(Duration::from_millis(20))
                .build()
                .unwrap();
            s.start();
            // Thread names are cut to 15 bytes.
            let find = || -> Option<u64> {
                // Threads of other tests come and go while we look: skip those gone.
                for task in std::fs::read_dir("/proc/self/task").unwrap().flatten() {
                    let dir = task.path();
                    let Ok(comm) = std::fs::read_to_string(dir.join("comm")) else {
                        continue;
                    };
                    if comm.trim() == "idlewatch-watch" {
                        let mut status = String::new();
                        std::fs::File::open(dir.join("status"))
                            .ok()?
                            .read_to_string(&mut status)
                            .ok()?;
                        return status
                            .lines()
                            .find_map(|l| l.strip_prefix("voluntary_ctxt_switches:"))
                            .and_then(|n| n.trim().parse().ok());
                    }
                }
                None
            };
            // The monitor thread names itself as it starts.
            wait_until("the watchdog thread", || find().is_some());
            let monitor = || find().expect("the watchdog thread");
            // Busy: the monitor looks every 5 ms.
            let busy = s.spawn(|| {
                let end = Instant::now() + Duration::from_millis(200);
                while Instant::now() < end {
                    fibra::Fiber::yield_now();
                }
            });
            let before = monitor();
            finish(busy);
            let during = monitor() - before;
            assert!(
                during >= 5,
                "the monitor looked only {during} times in 200 ms"
            );
            // Idle: after its last look it sleeps until a worker wakes up.
            std::thread::sleep(Duration::from_millis(100));
            let before = monitor();
            std::thread::sleep(Duration::from_millis(500));
            let idle = monitor() - before;
            assert!(idle <= 2, "the monitor woke {idle} times in an idle 500 ms");
            // And it watches again once there is work.
            let busy = s.spawn(|| {
                let end = Instant::now() + Duration::from_millis(100);
                while Instant::now() < end {
                    fibra::Fiber::yield_now();
                }
            });
            let before = monitor();
            finish(busy);
            assert!(monitor() - before >= 3);
            s.stop();
        });
    });
}

#[test]
fn dumps_during_a_shutdown_and_from_a_destructor_do_not_hang() {
    with_deadline(|| {
        let s = quiet_sched(2);
        // A fiber whose destructor, run by the cancellation's unwind, dumps its scheduler.
        struct DumpOnDrop(Arc<Scheduler>, mpsc::Sender<usize>);
        impl Drop for DumpOnDrop {
            fn drop(&mut self) {
                let d = self.0.dump();
                let _ = self.1.send(d.fibers().len());
            }
        }
        let (tx, rx) = mpsc::channel();
        let s2 = s.clone();
        let _victim = s
            .task()
            .name("victim")
            .submit(
                move || {
                    let _d = DumpOnDrop(s2, tx);
                    fibra::sleep(Duration::from_secs(600));
                },
                None,
            )
            .unwrap();
        dump_until(&s, "victim", Status::Parked(WaitOn::Sleep));
        // Dumps from another thread while the scheduler stops.
        let s3 = s.clone();
        let dumper = std::thread::spawn(move || {
            let end = Instant::now() + Duration::from_millis(300);
            while Instant::now() < end {
                let _ = s3.dump().to_string();
                let _ = s3.metrics();
            }
        });
        assert_eq!(s.stop_timeout(Duration::from_millis(50)), 1);
        assert!(rx.recv_timeout(LIMIT).unwrap() >= 1);
        dumper.join().unwrap();
        assert!(s.dump().fibers().is_empty());
    });
}

#[test]
fn watchdog_extremes_build_and_run() {
    with_deadline(|| {
        for d in [Duration::from_nanos(1), Duration::MAX] {
            let s = Scheduler::builder()
                .threads(1)
                .name("extreme")
                .watchdog(d)
                .build()
                .unwrap();
            s.start();
            assert_eq!(s.block_on(|| 6 * 7), 42);
            s.stop();
        }
    });
}
