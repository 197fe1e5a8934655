//! Hostile calls around the scheduler's lifecycle, each bounded or answered: panicking
//! destructors in captures, results and payloads; zero, past and `Duration::MAX` timeouts
//! on every wait; fiber-only calls on plain threads; pins out of range; schedulers dropped
//! by their own workers or nested in fibers; unparkers of abandoned fibers; timers far
//! ahead and cancelled; the blocking pool and files under EMFILE; sockets with zero and
//! huge timeouts, reset peers and a shutdown under a parked reader; cancellation
//! destructors that lock, join, spawn, unblock, sleep or spin. Every wait is bounded;
//! where a defect would abort or leave a scheduler stuck, the body runs in a child process
//! (`crate::common::in_child`).

use std::io::{Read, Write};
use std::os::fd::FromRawFd;
use std::panic::{self, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use crate::common::{
    block_thread, eventually, every_worker_runs, finish, held_task, named, panic_message, started,
    with_deadline,
};
use fibra::{Fiber, FiberState, JoinHandle, ParkResult, Scheduler, SubmitError, Unparker};

/// Generous bound for things that correct code does in well under a second.
const BOUND: Duration = Duration::from_secs(20);

/// A value whose destructor panics.
struct Bomb;

impl Drop for Bomb {
    fn drop(&mut self) {
        panic!("bomb");
    }
}

/// Number of live threads of this process whose name is `name`.
fn threads_named(name: &str) -> usize {
    std::fs::read_dir("/proc/self/task")
        .expect("/proc/self/task")
        .filter_map(Result::ok)
        .filter(|t| {
            std::fs::read_to_string(t.path().join("comm")).is_ok_and(|c| c.trim_end() == name)
        })
        .count()
}

// =============================================================== panics and Drop bombs

/// A closure's captured state whose Drop panics when the closure has run: the panic is the
/// task's, reported on its handle; the worker lives on.
#[test]
fn captured_state_bomb_is_a_panic_on_the_handle() {
    with_deadline(|| {
        let sched = started(2);
        let hs: Vec<_> = (0..2)
            .map(|w| {
                let bomb = Bomb;
                sched
                    .submit(
                        move || {
                            let _b = &bomb;
                            5u32
                        },
                        Some(w),
                    )
                    .unwrap()
            })
            .collect();
        for h in hs {
            assert!(h.wait_timeout(BOUND));
            let e = h.join().expect_err("the bomb went off in the task");
            assert!(e.is_panic());
            assert_eq!(panic_message(&*e.into_panic()).as_deref(), Some("bomb"));
        }
        every_worker_runs(&sched);
        sched.stop();
    });
}

/// `JoinHandle::cancel` of a task that has not started, whose closure owns a Bomb, from a plain
/// thread: `cancel` never panics in the caller ("never blocks"), the worker survives, the
/// handle reports cancelled.
#[test]
fn cancel_of_an_unstarted_task_whose_closure_is_a_bomb() {
    with_deadline(|| {
        let sched = started(1);
        let (tx, rx) = mpsc::channel();
        let hog = sched
            .submit(
                move || {
                    tx.send(()).unwrap();
                    block_thread(Duration::from_millis(300));
                },
                Some(0),
            )
            .unwrap();
        rx.recv_timeout(BOUND).unwrap();
        let bomb = Bomb;
        let victim = sched
            .submit(
                move || {
                    std::mem::forget(bomb);
                    1
                },
                Some(0),
            )
            .unwrap();
        let r = panic::catch_unwind(AssertUnwindSafe(|| victim.cancel()));
        assert!(r.is_ok(), "JoinHandle::cancel panicked in the caller");
        assert!(victim.wait_timeout(BOUND));
        assert!(victim.join().unwrap_err().is_cancelled());
        finish(hog);
        every_worker_runs(&sched);
        sched.stop();
    });
}

/// Continuations that capture a Bomb and are dropped unrun (`then` on a panicked task), and one
/// registered after completion from a plain thread: nobody's thread dies, nothing panics
/// into the registering caller.
#[test]
fn continuations_capturing_bombs() {
    with_deadline(|| {
        let sched = started(1);
        let h = sched
            .submit(|| -> u32 { panic!("task fails") }, None)
            .unwrap();
        let b = Bomb;
        h.then(move |_| {
            let _ = &b;
        });
        assert!(h.wait_timeout(BOUND));
        let b2 = Bomb;
        let r = panic::catch_unwind(AssertUnwindSafe(|| {
            h.then(move |_| {
                let _ = &b2;
            });
        }));
        assert!(
            r.is_ok(),
            "registering a continuation on a finished task panicked the caller"
        );
        assert!(h.join().unwrap_err().is_panic());
        every_worker_runs(&sched);
        sched.stop();
    });
}

/// A panic payload whose own Drop panics, from a task joined by another fiber that drops the
/// JoinError; and the result of a *joined-then-dropped* handle whose value is a Bomb, dropped
/// inside a fiber: the joining fiber's panic reaches its own handle, workers live.
#[test]
fn bomb_payloads_and_values_dropped_by_joining_fibers() {
    with_deadline(|| {
        let sched = Arc::new(started(2));
        let s = sched.clone();
        let outer = sched
            .submit(
                move || {
                    let inner = s
                        .submit(|| -> u32 { panic::panic_any(Bomb) }, Some(1))
                        .unwrap();
                    let e = inner.join().unwrap_err();
                    assert!(e.is_panic());
                    drop(e); // the Bomb payload goes off here, in this fiber
                    7u32
                },
                Some(0),
            )
            .unwrap();
        assert!(outer.wait_timeout(BOUND));
        let e = outer.join().unwrap_err();
        assert!(e.is_panic(), "the joiner's own panic reaches its handle");
        every_worker_runs(&sched);
        sched.stop();
    });
}

// =============================================================== zero and MAX timeouts

/// Zero, past, MAX and far-future timeouts on every timed wait, in a fiber and on a thread.
#[test]
fn timeouts_of_zero_and_max_everywhere() {
    fn body() {
        use fibra::sync::{oneshot, CancellationToken, Condvar, Semaphore, WaitGroup};
        // park_timeout in the past / now: times out at once.
        assert_eq!(
            fibra::park_timeout(Instant::now(), drop),
            ParkResult::TimedOut
        );
        // park_timeout far in the future, unparked by another thread.
        let far = Instant::now()
            .checked_add(Duration::from_secs(200 * 365 * 24 * 3600))
            .unwrap_or_else(|| Instant::now() + Duration::from_secs(30 * 365 * 24 * 3600));
        let slot: Arc<Mutex<Option<Unparker>>> = Arc::default();
        let s = slot.clone();
        let waker = thread::spawn(move || {
            let u = loop {
                if let Some(u) = s.lock().unwrap().take() {
                    break u;
                }
                thread::sleep(Duration::from_millis(1));
            };
            thread::sleep(Duration::from_millis(20));
            u.unpark();
        });
        let r = fibra::park_timeout(far, |u| *slot.lock().unwrap() = Some(u));
        assert_eq!(r, ParkResult::Unparked);
        waker.join().unwrap();

        // oneshot
        let (tx, mut rx) = oneshot::channel::<u32>();
        assert_eq!(
            rx.recv_timeout(Duration::ZERO),
            Err(std::sync::mpsc::RecvTimeoutError::Timeout)
        );
        let t = thread::spawn(move || {
            thread::sleep(Duration::from_millis(20));
            tx.send(9).unwrap();
        });
        assert_eq!(rx.recv_timeout(Duration::MAX), Ok(9));
        t.join().unwrap();

        // Condvar
        let pair = Arc::new((fibra::sync::Mutex::new(false), Condvar::new()));
        let p = pair.clone();
        let g = pair.0.lock().unwrap();
        let (g, r) = pair.1.wait_timeout(g, Duration::ZERO).unwrap();
        assert!(r.timed_out());
        drop(g);
        let t = thread::spawn(move || {
            thread::sleep(Duration::from_millis(20));
            *p.0.lock().unwrap() = true;
            p.1.notify_all();
        });
        let g = pair.0.lock().unwrap();
        let (g, r) = pair
            .1
            .wait_timeout_while(g, Duration::MAX, |ready| !*ready)
            .unwrap();
        assert!(!r.timed_out() && *g);
        drop(g);
        t.join().unwrap();

        // Semaphore
        let sem = Arc::new(Semaphore::new(0));
        assert!(sem.acquire_timeout(Duration::ZERO).is_none());
        assert!(sem.acquire_many_timeout(0, Duration::ZERO).is_some());
        let s2 = sem.clone();
        let t = thread::spawn(move || {
            thread::sleep(Duration::from_millis(20));
            s2.release(1);
        });
        assert!(sem.acquire_timeout(Duration::MAX).is_some());
        t.join().unwrap();

        // CancellationToken
        let tok = CancellationToken::new();
        assert!(!tok.cancelled_timeout(Duration::ZERO));
        let t2 = tok.clone();
        let t = thread::spawn(move || {
            thread::sleep(Duration::from_millis(20));
            t2.cancel();
        });
        assert!(tok.cancelled_timeout(Duration::MAX));
        t.join().unwrap();

        // WaitGroup
        let wg = WaitGroup::new();
        let other = wg.clone();
        assert!(!wg.clone().wait_timeout(Duration::ZERO));
        let t = thread::spawn(move || {
            thread::sleep(Duration::from_millis(20));
            drop(other);
        });
        assert!(wg.wait_timeout(Duration::MAX));
        t.join().unwrap();

        // sleep_until in the past, sleep(ZERO)
        let now = Instant::now();
        fibra::sleep_until(now - Duration::from_millis(5).min(now.elapsed()));
        fibra::sleep(Duration::ZERO);
    }
    with_deadline(|| {
        body(); // a plain thread
        let sched = started(2);
        let h = sched.submit(body, None).unwrap();
        finish(h);
        // JoinHandle::wait_timeout(ZERO) on an unfinished task, MAX on one that finishes,
        // from a thread and from a fiber.
        let (tx, slow) = held_task(&sched, 3, BOUND);
        assert!(!slow.wait_timeout(Duration::ZERO));
        let s = slow.clone();
        let fiber_waiter = sched
            .submit(
                move || {
                    (
                        s.wait_timeout(Duration::ZERO),
                        s.wait_timeout(Duration::MAX),
                    )
                },
                None,
            )
            .unwrap();
        thread::sleep(Duration::from_millis(30));
        tx.send(()).unwrap();
        assert!(slow.wait_timeout(Duration::MAX));
        assert_eq!(finish(fiber_waiter), (false, true));
        sched.stop();
    });
}

/// Sleeps until an instant centuries away (and `Duration::MAX`), cancelled through their
/// handles: every one ends cancelled, no timer is left behind, the scheduler stops at once.
#[test]
fn far_future_sleeps_cancelled_by_handle_leave_no_timer() {
    with_deadline(|| {
        let sched = started(2);
        let far = Instant::now()
            .checked_add(Duration::from_secs(300 * 365 * 24 * 3600))
            .expect("Instant reaches 300 years on Linux");
        let hs: Vec<JoinHandle<()>> = (0..400)
            .map(|i| {
                sched
                    .submit(
                        move || {
                            if i % 2 == 0 {
                                fibra::sleep_until(far)
                            } else {
                                fibra::sleep(Duration::MAX)
                            }
                        },
                        None,
                    )
                    .unwrap()
            })
            .collect();
        assert!(
            eventually(BOUND, || sched.metrics().timers() == 400),
            "timers: {}",
            sched.metrics().timers()
        );
        for h in &hs {
            h.cancel();
        }
        for h in hs {
            assert!(h.wait_timeout(BOUND));
            assert!(h.join().unwrap_err().is_cancelled());
        }
        assert!(
            eventually(BOUND, || sched.metrics().timers() == 0),
            "timers left after cancelling every sleeper: {}",
            sched.metrics().timers()
        );
        let t = Instant::now();
        sched.stop();
        assert!(t.elapsed() < BOUND);
    });
}

// =============================================================== fiber-only APIs elsewhere

/// Fiber APIs on a plain thread return (no panic, no hang).
#[test]
fn fiber_apis_on_a_plain_thread() {
    with_deadline(|| {
        Fiber::yield_now();
        fibra::sleep(Duration::ZERO);
        fibra::sleep(Duration::from_millis(1));
        fibra::sleep_until(Instant::now());
        for _ in 0..1000 {
            fibra::coop::consume_budget();
        }
        assert!(fibra::coop::has_budget_remaining());
        assert!(Fiber::current().is_none());
        assert_eq!(fibra::current_worker(), None);
        assert_eq!(fibra::unblock(|| 4), 4);
        assert!(std::panic::catch_unwind(|| fibra::spawn(|| ())).is_err());
    });
}

/// A standalone fiber's budget never yields, even after thousands of budgeted operations.
#[test]
fn standalone_fiber_budgeted_operations_never_yield() {
    let mut f = Fiber::new(|| {
        let m = fibra::sync::Mutex::new(0);
        for _ in 0..(4 * fibra::coop::BUDGET) {
            *m.lock().unwrap() += 1;
            fibra::coop::consume_budget();
        }
    });
    assert_eq!(f.resume(), FiberState::Done);
}

/// The last `Arc<Scheduler>` is a detached task's result, dropped by its worker outside any
/// fiber: the scheduler shuts down, its workers exit, nothing hangs or dies.
#[test]
fn last_scheduler_reference_dropped_by_its_own_worker() {
    with_deadline(|| {
        let name = "al-lastref";
        let sched = Arc::new(named(2, name));
        let s = sched.clone();
        let (tx, rx) = mpsc::channel::<()>();
        let done = Arc::new(AtomicBool::new(false));
        let d = done.clone();
        let h = sched
            .submit(
                move || {
                    let _ = fibra::unblock(move || rx.recv_timeout(BOUND));
                    d.store(true, Ordering::SeqCst);
                    s
                },
                None,
            )
            .unwrap();
        drop(h);
        drop(sched);
        tx.send(()).unwrap();
        assert!(eventually(BOUND, || done.load(Ordering::SeqCst)));
        assert!(
            eventually(BOUND, || threads_named(&format!("{name}-0"))
                + threads_named(&format!("{name}-1"))
                == 0),
            "workers of a scheduler whose last reference a worker dropped are still alive"
        );
    });
}

/// Nested schedulers: a fiber of A builds B, uses it, and stops it with a fiber parked for
/// ever in B (stop_timeout), then drops it — bounded.
#[test]
fn nested_scheduler_stopped_and_dropped_inside_a_fiber() {
    with_deadline(|| {
        let a = started(2);
        let h = a
            .submit(
                || {
                    let b = Scheduler::builder()
                        .threads(2)
                        .name("al-nested")
                        .build()
                        .unwrap();
                    assert_eq!(b.block_on(|| 5), 5);
                    let forever = b.submit(|| fibra::park(drop), None).unwrap();
                    let v = b.block_on(|| fibra::spawn(|| 6).join().unwrap());
                    let t = Instant::now();
                    let n = b.stop_timeout(Duration::from_millis(20));
                    let took = t.elapsed();
                    assert!(forever.join().unwrap_err().is_cancelled());
                    drop(b);
                    (v, n, took)
                },
                None,
            )
            .unwrap();
        let (v, n, took) = finish(h);
        assert_eq!((v, n), (6, 1));
        assert!(
            took < Duration::from_secs(5),
            "nested stop_timeout took {took:?}"
        );
        a.stop();
    });
}

/// Pinning out of range, through every door, before and after stop: the closure comes back.
#[test]
fn out_of_range_pins_and_stack_sizes_hand_the_closure_back() {
    with_deadline(|| {
        let sched = started(2);
        for i in [2usize, 3, usize::MAX] {
            match sched.submit(move || i, Some(i)) {
                Err(SubmitError::NoSuchThread(f)) => assert_eq!(f(), i),
                other => panic!("pin {i}: {:?}", other.map(|_| ())),
            }
            match sched.task().name("x").submit(move || i, Some(i)) {
                Err(e @ SubmitError::NoSuchThread(_)) => {
                    assert!(e.to_string().contains("no worker"));
                    assert_eq!(e.into_inner()(), i)
                }
                other => panic!("task pin {i}: {:?}", other.map(|_| ())),
            }
        }
        for size in [0usize, 1, usize::MAX, (1 << 30) + 1] {
            match sched.task().stack_size(size).submit(move || size, None) {
                Err(SubmitError::InvalidStackSize(f, _)) => assert_eq!(f(), size),
                other => panic!("stack {size}: {:?}", other.map(|_| ())),
            }
        }
        let s = Arc::new(sched);
        let s2 = s.clone();
        let from_fiber = s
            .submit(
                move || {
                    matches!(
                        s2.submit(|| (), Some(99)),
                        Err(SubmitError::NoSuchThread(_))
                    )
                },
                None,
            )
            .unwrap();
        assert!(finish(from_fiber));
        s.stop();
        assert!(matches!(
            s.submit(|| 1, Some(5)),
            Err(SubmitError::NoSuchThread(_)) | Err(SubmitError::Stopped(_))
        ));
        match s.submit(|| 1, Some(0)) {
            Err(SubmitError::Stopped(f)) => assert_eq!(f(), 1),
            other => panic!("after stop: {:?}", other.map(|_| ())),
        }
    });
}

// =============================================================== blocking pool and files

/// An abandoned fiber's Unparkers, used after its scheduler has been stopped and dropped.
#[test]
fn unparkers_of_abandoned_fibers_used_after_the_scheduler_is_gone() {
    with_deadline(|| {
        struct Stubborn(Arc<Mutex<Vec<Unparker>>>);
        impl Drop for Stubborn {
            fn drop(&mut self) {
                let slot = self.0.clone();
                // Parks for ever during its cancellation: abandoned after the grace.
                fibra::park(move |u| slot.lock().unwrap().push(u));
            }
        }
        let sched = started(2);
        let unparkers: Arc<Mutex<Vec<Unparker>>> = Arc::default();
        let hs: Vec<_> = (0..4)
            .map(|_| {
                let u = unparkers.clone();
                sched
                    .submit(
                        move || {
                            let _s = Stubborn(u.clone());
                            fibra::park(move |x| u.lock().unwrap().push(x));
                        },
                        None,
                    )
                    .unwrap()
            })
            .collect();
        assert!(eventually(BOUND, || unparkers.lock().unwrap().len() == 4));
        let t = Instant::now();
        let n = sched.stop_timeout(Duration::from_millis(20));
        assert!(
            t.elapsed() < Duration::from_secs(8),
            "stop_timeout took {:?}",
            t.elapsed()
        );
        assert_eq!(n, 4);
        for h in hs {
            assert!(h.join().unwrap_err().is_cancelled());
        }
        drop(sched);
        let us = std::mem::take(&mut *unparkers.lock().unwrap());
        assert_eq!(us.len(), 8, "each fiber parked twice");
        for u in &us {
            u.unpark();
        }
        for u in &us {
            let u = u.clone();
            thread::spawn(move || u.unpark()).join().unwrap();
        }
        drop(us);
        // The process is still sound: a new scheduler works.
        let again = started(2);
        assert_eq!(again.block_on(|| 3), 3);
        again.stop();
    });
}

/// fibra::fs on a descriptor that is not open: errors, not panics or hangs.
#[test]
fn fs_on_a_closed_descriptor_is_an_error() {
    with_deadline(|| {
        let sched = started(1);
        let r = sched.block_on(|| {
            // A number above any descriptor table this process can have: never open, and
            // never reused by another thread (a closed low number could be, by a parallel test).
            let fd = libc::c_int::MAX - 1;
            let std_file = unsafe { std::fs::File::from_raw_fd(fd) };
            let f = fibra::fs::File::from(std_file);
            let meta = f.metadata().map(|_| ()).map_err(|e| e.raw_os_error());
            let sync = f.sync_all().map_err(|e| e.raw_os_error());
            let mut buf = [0u8; 8];
            let read = (&f)
                .read(&mut buf)
                .map(|_| ())
                .map_err(|e| e.raw_os_error());
            std::mem::forget(f.into_std());
            (meta, sync, read)
        });
        // Another thread may have reused the number; then the calls succeed on it, which is
        // fine. If it is still closed, each must be EBADF.
        for (what, res) in [("metadata", r.0), ("sync_all", r.1), ("read", r.2)] {
            if let Err(code) = res {
                assert_eq!(code, Some(libc::EBADF), "{what}");
            }
        }
        sched.stop();
    });
}

/// In a child: EMFILE for files through fibra::fs and the pool is an error, not a panic;
/// the pool still runs closures, and files open again once descriptors are free.
#[test]
fn emfile_for_fs_is_an_error() {
    crate::common::in_child(|| {
        let sched = started(1);
        let dir =
            std::env::temp_dir().join(format!("fibra-lifecycle-emfile-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("f");
        std::fs::write(&path, b"data").unwrap();
        let filler = crate::common::fill_descriptor_table(0);
        let p = path.clone();
        let (open, read, unb) = sched.block_on(move || {
            let open = fibra::fs::File::open(&p)
                .map(|_| ())
                .map_err(|e| e.raw_os_error());
            let read = fibra::fs::read(&p)
                .map(|_| ())
                .map_err(|e| e.raw_os_error());
            let unb = fibra::unblock(|| 5);
            (open, read, unb)
        });
        drop(filler);
        assert_eq!(open, Err(Some(libc::EMFILE)));
        assert_eq!(read, Err(Some(libc::EMFILE)));
        assert_eq!(unb, 5);
        assert_eq!(
            sched.block_on(move || fibra::fs::read(&path).unwrap()),
            b"data"
        );
        let _ = std::fs::remove_dir_all(&dir);
        sched.stop();
    })
    .assert_ok("EMFILE through fibra::fs failed the child");
}

// =============================================================== net

/// Read timeouts: zero is refused as in std and leaves the old one; MAX waits for data.
#[test]
fn read_timeouts_zero_and_max() {
    with_deadline(|| {
        let sched = started(2);
        let (listener, mut client) = crate::common::listener_and_client();
        let (server, _) = listener.accept().unwrap();
        server
            .set_read_timeout(Some(Duration::from_secs(7)))
            .unwrap();
        let e = server.set_read_timeout(Some(Duration::ZERO)).unwrap_err();
        assert_eq!(e.kind(), std::io::ErrorKind::InvalidInput);
        assert_eq!(server.read_timeout().unwrap(), Some(Duration::from_secs(7)));
        server.set_read_timeout(Some(Duration::MAX)).unwrap();
        server.set_write_timeout(Some(Duration::MAX)).unwrap();
        let reader = sched
            .submit(
                move || {
                    let mut buf = [0u8; 5];
                    (&server)
                        .read_exact(&mut buf)
                        .map(|_| buf)
                        .map_err(|e| e.to_string())
                },
                None,
            )
            .unwrap();
        thread::sleep(Duration::from_millis(50));
        client.write_all(b"hello").unwrap();
        assert_eq!(finish(reader).unwrap(), *b"hello");
        // connect_timeout MAX
        let l = fibra::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        let c = sched
            .block_on(move || fibra::net::TcpStream::connect_timeout(&addr, Duration::MAX).is_ok());
        assert!(c);
        sched.stop();
    });
}

/// `shutdown(Read)` through a clone wakes a fiber parked reading the original, with EOF.
#[test]
fn shutdown_read_through_a_clone_wakes_a_parked_reader() {
    with_deadline(|| {
        let sched = started(1);
        let (listener, _client) = crate::common::listener_and_client();
        let (server, _) = listener.accept().unwrap();
        let clone = server.try_clone().unwrap();
        let (tx, rx) = mpsc::channel();
        let reader = sched
            .submit(
                move || {
                    tx.send(()).unwrap();
                    let mut buf = [0u8; 8];
                    (&server).read(&mut buf).map_err(|e| e.to_string())
                },
                None,
            )
            .unwrap();
        rx.recv_timeout(BOUND).unwrap();
        thread::sleep(Duration::from_millis(50));
        clone.shutdown(std::net::Shutdown::Read).unwrap();
        assert!(
            reader.wait_timeout(Duration::from_secs(10)),
            "a fiber parked reading was not woken by shutdown(Read) of a clone"
        );
        assert_eq!(reader.join().unwrap(), Ok(0));
        sched.stop();
    });
}

/// Writing to a peer that vanished, from many fibers at once, then reading: errors, never a
/// hang or a signal.
#[test]
fn io_on_a_vanished_peer_from_several_fibers() {
    with_deadline(|| {
        let sched = started(2);
        let (listener, client) = crate::common::listener_and_client();
        let (server, _) = listener.accept().unwrap();
        crate::common::reset(client);
        let server = Arc::new(server);
        let hs: Vec<_> = (0..4)
            .map(|_| {
                let s = server.clone();
                sched
                    .submit(
                        move || {
                            let chunk = [1u8; 16 * 1024];
                            for _ in 0..1000 {
                                if (&*s).write(&chunk).is_err() {
                                    return true;
                                }
                            }
                            false
                        },
                        None,
                    )
                    .unwrap()
            })
            .collect();
        for h in hs {
            assert!(finish(h), "writes to a reset peer kept succeeding");
        }
        let s = server.clone();
        let r = sched.block_on(move || {
            let mut b = [0u8; 4];
            (&*s).read(&mut b).map_err(|e| e.kind())
        });
        assert!(matches!(r, Ok(0) | Err(_)), "{r:?}");
        sched.stop();
    });
}

// =============================================================== shutdown

/// Cancelled fibers whose destructors lock a fibra Mutex held by another cancelled fiber, join
/// another cancelled fiber, spawn and join a task, call the blocking pool and sleep: every
/// destructor completes and stop_timeout returns in its bound.
#[test]
fn cancellation_destructors_that_lock_join_spawn_and_unblock() {
    with_deadline(|| {
        let sched = Arc::new(started(2));
        let log: Arc<Mutex<Vec<String>>> = Arc::default();
        let lock = Arc::new(fibra::sync::Mutex::new(0u32));

        struct OnDrop<F: FnMut()>(F);
        impl<F: FnMut()> Drop for OnDrop<F> {
            fn drop(&mut self) {
                (self.0)()
            }
        }

        // Holds the lock and parks for ever.
        let (ltx, lrx) = mpsc::channel();
        let l = lock.clone();
        let holder = sched
            .submit(
                move || {
                    let _g = l.lock().unwrap();
                    ltx.send(()).unwrap();
                    fibra::park(drop);
                },
                Some(0),
            )
            .unwrap();
        lrx.recv_timeout(BOUND).unwrap();
        let holder = Arc::new(Mutex::new(Some(holder)));

        let mut hs = Vec::new();
        {
            let (l, log) = (lock.clone(), log.clone());
            hs.push(
                sched
                    .submit(
                        move || {
                            let _d = OnDrop(move || {
                                let v = match l.lock() {
                                    Ok(g) => *g,
                                    Err(p) => *p.into_inner(),
                                };
                                log.lock().unwrap().push(format!("locked {v}"));
                            });
                            fibra::park(drop);
                        },
                        Some(1),
                    )
                    .unwrap(),
            );
        }
        {
            let (holder, log) = (holder.clone(), log.clone());
            hs.push(
                sched
                    .submit(
                        move || {
                            let _d = OnDrop(move || {
                                let h = holder.lock().unwrap().take().unwrap();
                                let r = h.join();
                                log.lock().unwrap().push(format!(
                                    "joined cancelled={}",
                                    r.is_err_and(|e| e.is_cancelled())
                                ));
                            });
                            fibra::park(drop);
                        },
                        Some(1),
                    )
                    .unwrap(),
            );
        }
        {
            let log = log.clone();
            hs.push(
                sched
                    .submit(
                        move || {
                            let _d = OnDrop(move || {
                                let r = fibra::spawn(|| 1).join();
                                log.lock().unwrap().push(format!(
                                    "spawned {}",
                                    r.map_or_else(|e| e.to_string(), |v| v.to_string())
                                ));
                            });
                            fibra::park(drop);
                        },
                        Some(0),
                    )
                    .unwrap(),
            );
        }
        {
            let log = log.clone();
            hs.push(
                sched
                    .submit(
                        move || {
                            let _d = OnDrop(move || {
                                let v = fibra::unblock(|| {
                                    thread::sleep(Duration::from_millis(20));
                                    9
                                });
                                fibra::sleep(Duration::from_millis(10));
                                log.lock().unwrap().push(format!("unblocked {v}"));
                            });
                            fibra::park(drop);
                        },
                        Some(1),
                    )
                    .unwrap(),
            );
        }
        assert!(eventually(BOUND, || sched
            .metrics()
            .workers()
            .iter()
            .map(|w| w.fibers())
            .sum::<usize>()
            == 5));
        thread::sleep(Duration::from_millis(20));
        let t = Instant::now();
        let n = sched.stop_timeout(Duration::from_millis(20));
        let took = t.elapsed();
        let mut log = log.lock().unwrap().clone();
        log.sort();
        assert!(took < Duration::from_secs(8), "stop_timeout took {took:?}");
        assert_eq!(n, 5, "{log:?}");
        for prefix in [
            "joined cancelled=true",
            "locked 0",
            "spawned",
            "unblocked 9",
        ] {
            assert!(
                log.iter().any(|l| l.starts_with(prefix)),
                "cancellation destructor '{prefix}' did not complete: {log:?}"
            );
        }
        eprintln!("destructor log: {log:?}");
        for h in hs {
            assert!(h.join().unwrap_err().is_cancelled());
        }
    });
}

/// A cancellation destructor that runs for 8 s without suspending: stop_timeout still returns
/// within deadline + grace + the wait for the thread (about 2 s; bounded at 6.5 s for a loaded
/// machine), and the process survives the fiber's late end on its abandoned worker.
#[test]
fn cancellation_destructor_that_never_suspends_is_bounded() {
    with_deadline(|| {
        let name = "al-busydrop";
        let sched = named(1, name);
        struct Spin(Arc<AtomicBool>);
        impl Drop for Spin {
            fn drop(&mut self) {
                block_thread(Duration::from_secs(8));
                self.0.store(true, Ordering::SeqCst);
            }
        }
        let ended = Arc::new(AtomicBool::new(false));
        let e = ended.clone();
        let h = sched
            .submit(
                move || {
                    let _s = Spin(e);
                    fibra::park(drop);
                },
                None,
            )
            .unwrap();
        assert!(eventually(BOUND, || sched.metrics().workers()[0].fibers() == 1));
        thread::sleep(Duration::from_millis(20));
        let t = Instant::now();
        let _n = sched.stop_timeout(Duration::from_millis(50));
        let took = t.elapsed();
        assert!(
            took < Duration::from_millis(6500),
            "stop_timeout took {took:?}"
        );
        assert!(h.wait_timeout(BOUND));
        assert!(h.join().unwrap_err().is_cancelled());
        drop(sched);
        assert!(eventually(BOUND, || ended.load(Ordering::SeqCst)));
        assert!(
            eventually(BOUND, || threads_named(&format!("{name}-0")) == 0),
            "the worker did not exit after the busy destructor ended"
        );
    });
}

/// `stop_timeout(ZERO)` with a fiber that is still running (never yielded yet, spinning on the
/// other worker) and fibers parked: bounded; the parked ones are cancelled.
#[test]
fn stop_timeout_zero_with_a_spinning_fiber_and_parked_ones() {
    with_deadline(|| {
        let sched = named(2, "al-spin0");
        let stop = Arc::new(AtomicBool::new(false));
        let s = stop.clone();
        let (tx, rx) = mpsc::channel();
        let spinner = sched
            .submit(
                move || {
                    tx.send(()).unwrap();
                    let end = Instant::now() + Duration::from_secs(6);
                    while !s.load(Ordering::SeqCst) && Instant::now() < end {
                        std::hint::spin_loop();
                    }
                },
                Some(0),
            )
            .unwrap();
        rx.recv_timeout(BOUND).unwrap();
        let parked: Vec<_> = (0..10)
            .map(|_| sched.submit(|| fibra::park(drop), Some(1)).unwrap())
            .collect();
        assert!(eventually(BOUND, || sched.metrics().workers()[1].fibers() == 10));
        let t = Instant::now();
        let n = sched.stop_timeout(Duration::ZERO);
        let took = t.elapsed();
        stop.store(true, Ordering::SeqCst);
        assert!(
            took < Duration::from_secs(5),
            "stop_timeout(0) took {took:?}"
        );
        assert!(n >= 10, "cancelled {n}");
        for h in parked {
            assert!(h.join().unwrap_err().is_cancelled());
        }
        assert!(spinner.wait_timeout(BOUND));
        drop(sched);
    });
}

/// A scope's caller A on worker 0 lends `data` to its scoped fibers; one of them, B, on
/// worker 1, sits in `unblock` with a closure that borrows it. Worker 0's thread is held
/// (a fiber that does not suspend) through `stop_timeout`'s deadline and grace, so worker 1
/// abandons B while A's worker is late. B's abandonment used to count as its end: it woke
/// A, which worker 0, catching up, resumed; A left the scope and dropped `data` while the
/// pool thread still borrowed it (a use after free). An abandoned scoped fiber must keep
/// the scope waiting, so A is abandoned in turn and `data` stays.
#[test]
fn an_abandoned_scoped_fiber_keeps_its_scope_waiting() {
    use std::sync::atomic::AtomicU64;
    crate::common::in_child(|| {
        static DROPPED: AtomicBool = AtomicBool::new(false);
        static CLAIMED: AtomicBool = AtomicBool::new(false);
        struct Canary(AtomicU64);
        impl Drop for Canary {
            fn drop(&mut self) {
                DROPPED.store(true, Ordering::SeqCst);
            }
        }
        let sched = started(2);
        let (in_pool, in_pool_rx) = mpsc::channel::<()>();
        let (release, release_rx) = mpsc::channel::<()>();
        let (seen, seen_rx) = mpsc::channel::<(bool, u64)>();
        let release_rx = Arc::new(Mutex::new(release_rx));
        let a = sched
            .submit(
                move || {
                    let data = Canary(AtomicU64::new(7));
                    let r = &data;
                    fibra::scope(|s| {
                        for _ in 0..8 {
                            let (in_pool, release_rx, seen) =
                                (in_pool.clone(), release_rx.clone(), seen.clone());
                            s.spawn(move || {
                                if fibra::current_worker() == Some(1)
                                    && !CLAIMED.swap(true, Ordering::SeqCst)
                                {
                                    fibra::unblock(move || {
                                        in_pool.send(()).unwrap();
                                        let _ = release_rx.lock().unwrap().recv();
                                        let dropped = DROPPED.load(Ordering::SeqCst);
                                        seen.send((dropped, r.0.load(Ordering::SeqCst))).unwrap();
                                    });
                                }
                            });
                        }
                        // Holds worker 0, so that worker 1 takes some of the scoped fibers.
                        block_thread(Duration::from_millis(300));
                    });
                },
                Some(0),
            )
            .unwrap();
        in_pool_rx
            .recv_timeout(BOUND)
            .expect("a scoped fiber of worker 1 in unblock");
        // Worker 0 late: its thread held past the deadline and the grace.
        let hold = fibra::CANCEL_GRACE + Duration::from_millis(1500);
        let (held, held_rx) = mpsc::channel();
        sched
            .submit(
                move || {
                    held.send(()).unwrap();
                    block_thread(hold);
                },
                Some(0),
            )
            .unwrap();
        held_rx.recv_timeout(BOUND).unwrap();
        sched.stop_timeout(Duration::from_millis(50));
        // Let worker 0 come back and do what it would with A.
        thread::sleep(hold);
        assert!(a.wait_timeout(BOUND), "A's handle reports its end");
        release.send(()).unwrap();
        let (dropped, value) = seen_rx.recv_timeout(BOUND).unwrap();
        assert!(
            !dropped && value == 7,
            "the scope's caller dropped data that an abandoned scoped fiber still borrowed"
        );
    })
    .assert_ok("an abandoned scoped fiber let its scope end");
}

// =============================================================== aborts (child processes)

/// A standalone fiber's overflow names the fiber (the child process is ended by it).
#[test]
fn standalone_fiber_overflow_names_the_fiber() {
    let run = crate::common::in_child(|| {
        #[allow(unconditional_recursion)]
        fn recurse(d: u64) -> u64 {
            let buf = [d as u8; 4096];
            std::hint::black_box(&buf);
            recurse(d + 1) + u64::from(std::hint::black_box(buf)[7])
        }
        let mut f = Fiber::with_options(
            || {
                recurse(0);
            },
            Some("lonely-7"),
            64 * 1024,
        )
        .unwrap();
        f.resume();
        eprintln!("survived?");
    });
    let (status, stderr) = (run.exit_status(), &run.stderr);
    assert!(!status.success());
    assert!(
        stderr.contains("lonely-7") && stderr.contains("overflowed"),
        "{status}\n{stderr}"
    );
}

// =============================================================== the delayed executor

/// `Timer`: a job at `Duration::MAX` does not hold back a later-scheduled short one; a job
/// that shuts down its own timer (joining the timer thread from itself) does not hang;
/// `shutdown_now` drops the far job promptly.
#[test]
fn timer_far_jobs_and_self_shutdown() {
    with_deadline(|| {
        let timer = fibra::time::Timer::new();
        let (tx, rx) = mpsc::channel();
        let far = timer.schedule(Duration::MAX, || unreachable!("never due"));
        let t2 = tx.clone();
        timer.schedule(Duration::from_millis(10), move || t2.send("short").unwrap());
        assert_eq!(rx.recv_timeout(BOUND), Ok("short"));
        assert_eq!(timer.pending(), 1);
        assert!(far.cancel());
        let t = Instant::now();
        timer.schedule(Duration::MAX, || ());
        assert_eq!(timer.shutdown_now(), 1);
        assert!(t.elapsed() < BOUND);

        // A job that shuts its own timer down.
        let slot: Arc<Mutex<Option<fibra::time::Timer>>> =
            Arc::new(Mutex::new(Some(fibra::time::Timer::new())));
        let s = slot.clone();
        let t3 = tx.clone();
        slot.lock()
            .unwrap()
            .as_ref()
            .unwrap()
            .schedule(Duration::from_millis(5), move || {
                let timer = s.lock().unwrap().take().unwrap();
                let r = panic::catch_unwind(AssertUnwindSafe(|| timer.shutdown()));
                t3.send(if r.is_ok() { "shut" } else { "panicked" })
                    .unwrap();
            });
        let got = rx.recv_timeout(Duration::from_secs(10));
        assert!(
            got.is_ok(),
            "a Timer job that shuts down its own timer hung"
        );
    });
}
