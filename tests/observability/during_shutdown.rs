//! Observability while things end: metrics and dumps during and after shutdown, a dump of
//! many parked fibers while others end, a dump that must wake a worker blocked in epoll,
//! and the watchdog on a `use_caller` worker and after stop.

use std::collections::HashSet;
use std::io::{Read, Write};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use crate::common::{finish, started, wait_until};
use fibra::dump::{Status, WaitOn};
use fibra::exec::Executor;
use fibra::net::unix::UnixStream;
use fibra::{Scheduler, MIN_STACK_SIZE};

/// Whether the fiber of `id` is parked on what `on` accepts, by this scheduler's dump (the
/// reactor's and the pool's counters are the whole process's, which other tests share).
fn parked_on(sched: &Scheduler, id: fibra::FiberId, on: impl Fn(&WaitOn) -> bool) -> bool {
    sched
        .dump()
        .fibers()
        .iter()
        .any(|e| e.id() == id && matches!(e.status(), Status::Parked(w) if on(&w)))
}

fn io(w: &WaitOn) -> bool {
    matches!(w, WaitOn::Io { .. })
}

// ---------------------------------------------------------------------------------------
// 4. observability
// ---------------------------------------------------------------------------------------

/// metrics and dump from a fiber of the scheduler while it is stopping, from a thread, and on
/// a stopped one: all return, bounded.
#[test]
fn observe_during_and_after_shutdown_from_fibers_and_threads() {
    crate::common::with_deadline(|| {
        let sched = Arc::new(started(2));
        let s2 = sched.clone();
        let hs: Vec<_> = (0..20)
            .map(|i| {
                let s = s2.clone();
                sched.spawn(move || {
                    for _ in 0..20 {
                        let d = s.dump();
                        assert!(d.fibers().iter().any(|e| e.worker() < 2));
                        let m = s.metrics();
                        assert_eq!(m.workers().len(), 2);
                        fibra::sleep(Duration::from_millis(i % 3));
                    }
                })
            })
            .collect();
        let s3 = sched.clone();
        let stopper = thread::spawn(move || s3.stop());
        for _ in 0..20 {
            let t = Instant::now();
            let _ = sched.dump().to_string();
            let _ = sched.metrics().to_string();
            assert!(t.elapsed() < Duration::from_secs(5));
        }
        stopper.join().unwrap();
        for h in hs {
            finish(h);
        }
        let t = Instant::now();
        let d = sched.dump();
        assert!(d.fibers().is_empty());
        assert_eq!(sched.metrics().live_tasks(), 0);
        assert!(t.elapsed() < Duration::from_secs(1));
        // Drop the Arc (its last reference) from inside another scheduler's fiber.
        let other = started(1);
        finish(other.spawn(move || drop(sched)));
        other.stop();
    });
}

/// A dump of a scheduler with many parked fibers (min stack), taken while a stream of fibers
/// ends: every parked fiber is listed once, and the dump is bounded in time.
#[test]
fn observe_dump_of_many_parked_fibers_while_others_end() {
    crate::common::with_deadline(|| {
        let n: usize = std::env::var("FIBRA_TEST_PARKED_FIBERS")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(200_000);
        let sched = Scheduler::builder()
            .threads(2)
            .stack_size(MIN_STACK_SIZE)
            .build()
            .unwrap();
        sched.start();
        let unparkers = Arc::new(Mutex::new(Vec::with_capacity(n)));
        let mut handles = Vec::with_capacity(n);
        for _ in 0..n {
            let u = unparkers.clone();
            handles.push(sched.spawn(move || fibra::park(|x| u.lock().unwrap().push(x))));
        }
        let deadline = Instant::now() + Duration::from_secs(120);
        while unparkers.lock().unwrap().len() < n {
            assert!(Instant::now() < deadline, "fibers did not all park");
            thread::sleep(Duration::from_millis(10));
        }
        let churner = {
            let hs: Vec<_> = (0..5000).map(|i| sched.spawn(move || i)).collect();
            hs
        };
        let t = Instant::now();
        let d = sched.dump();
        let took = t.elapsed();
        eprintln!("dump of {} fibers took {took:?}", d.fibers().len());
        let ids: HashSet<_> = d.fibers().iter().map(|e| e.id()).collect();
        assert_eq!(ids.len(), d.fibers().len(), "a fiber listed twice");
        let parked = d
            .fibers()
            .iter()
            .filter(|e| matches!(e.status(), fibra::dump::Status::Parked(_)))
            .count();
        assert!(parked >= n, "{parked} parked listed of {n}");
        assert!(took < Duration::from_secs(30), "{took:?}");
        for h in churner {
            finish(h);
        }
        let t = Instant::now();
        let _ = sched.metrics();
        assert!(t.elapsed() < Duration::from_secs(1));
        for u in unparkers.lock().unwrap().drain(..) {
            u.unpark();
        }
        for h in handles {
            finish(h);
        }
        sched.stop();
    });
}

/// Watchdog in a child: a named fiber hogging a use_caller worker 0 driven by block_on is
/// reported once, by name; a hog in an unnamed continuation-free fiber is reported with an
/// id; a stopped scheduler's watchdog says nothing more.
#[test]
fn observe_watchdog_hog_on_use_caller_worker_and_after_stop() {
    let run = crate::common::in_child(|| {
        let s = Scheduler::builder()
            .threads(2)
            .use_caller(true)
            .watchdog(Duration::from_millis(40))
            .build()
            .unwrap();
        // block_on's fiber can go anywhere: submit pinned to worker 0 and block_on a join.
        let h = s
            .task()
            .name("caller-hog")
            .submit(
                || crate::common::block_thread(Duration::from_millis(400)),
                Some(0),
            )
            .unwrap();
        s.block_on(move || h.join().unwrap());
        // An unnamed hog on worker 1.
        let h = s
            .submit(
                || crate::common::block_thread(Duration::from_millis(400)),
                Some(1),
            )
            .unwrap();
        s.block_on(move || h.join().unwrap());
        s.stop();
        // After stop nothing runs; a submit is refused.
        assert!(s
            .task()
            .name("after-stop")
            .submit(
                || crate::common::block_thread(Duration::from_millis(300)),
                None
            )
            .is_err());
        thread::sleep(Duration::from_millis(200));
    });
    run.assert_ok("the watchdog child failed");
    let err = &run.stderr;
    let reports: Vec<&str> = err.lines().filter(|l| l.contains("watchdog")).collect();
    assert_eq!(reports.len(), 2, "{err}");
    assert!(reports[0].contains("'caller-hog'"), "{err}");
    assert!(!err.contains("after-stop"), "{err}");
}

/// A worker asleep in epoll (the poller: its only fiber waits on a socket, no timers) must
/// answer a dump from a thread, listing the fiber as waiting on its fd, repeatedly.
#[test]
fn observe_dump_wakes_a_worker_blocked_in_epoll() {
    crate::common::with_deadline(|| {
        let sched = started(1);
        let (a, mut b) = std::os::unix::net::UnixStream::pair().unwrap();
        let a = UnixStream::from(a);
        let h = sched.spawn(move || {
            let mut buf = [0u8; 1];
            (&a).read_exact(&mut buf).map(|_| buf[0])
        });
        wait_until("the fiber waits on I/O", || parked_on(&sched, h.id(), io));
        for i in 0..20 {
            thread::sleep(Duration::from_millis(5));
            let d = sched.dump();
            assert_eq!(d.fibers().len(), 1, "round {i}: {d}");
            assert!(d.workers()[0].pause().is_some(), "round {i}: {d}");
            let s = d.to_string();
            assert!(s.contains("readable"), "{s}");
        }
        b.write_all(&[42]).unwrap();
        assert_eq!(finish(h).unwrap(), 42);
        sched.stop();
    });
}
