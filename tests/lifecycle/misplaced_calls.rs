//! Calls made where they cannot do what they do elsewhere: a task joining itself,
//! `stop_timeout` from inside the scheduler's own fiber, a zero sleep in a standalone fiber,
//! the first socket wait of a process out of descriptors, a `use_caller` scheduler built
//! inside a fiber. Each must end with a clear error or do its documented job — never wait
//! for ever in silence.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

use crate::common::{finish, started, with_deadline, LIMIT};
use fibra::JoinHandle;

/// A task may wait for itself with a deadline: the wait simply times out.
#[test]
fn a_task_waiting_for_itself_with_a_deadline_times_out() {
    with_deadline(|| {
        let sched = started(1);
        let (give, me) = fibra::sync::oneshot::channel::<JoinHandle<u32>>();
        let h = sched
            .submit(
                move || {
                    let me = me.recv().unwrap();
                    let t = Instant::now();
                    assert!(!me.wait_timeout(Duration::from_millis(10)));
                    assert!(t.elapsed() >= Duration::from_millis(10));
                    7
                },
                None,
            )
            .unwrap();
        let (watch_tx, watch) = mpsc::channel();
        h.then(move |v| watch_tx.send(*v).unwrap());
        give.send(h).ok().unwrap();
        assert_eq!(watch.recv_timeout(LIMIT), Ok(7));
        sched.stop();
    });
}

/// A task that joins its own handle panics — std's `join` of the current thread fails too —
/// with a message naming the task, instead of waiting for ever.
#[test]
fn the_self_join_panic_names_the_task() {
    with_deadline(|| {
        let sched = started(1);
        let (give, me) =
            fibra::sync::oneshot::channel::<Arc<std::sync::Mutex<Option<JoinHandle<()>>>>>();
        let h = sched
            .submit(
                move || {
                    let slot = me.recv().unwrap();
                    let mine = slot.lock().unwrap().take().unwrap();
                    mine.join().unwrap();
                },
                None,
            )
            .unwrap();
        let id = h.id();
        let slot = Arc::new(std::sync::Mutex::new(None));
        // The task cannot be joined from here once its handle is inside it; watch its end.
        let (end_tx, end) = mpsc::channel();
        h.catching(move |e| end_tx.send(e.to_string()).unwrap());
        *slot.lock().unwrap() = Some(h);
        give.send(slot).ok().unwrap();
        let msg = end.recv_timeout(LIMIT).expect("the task ended");
        assert!(
            msg.contains(&id.to_string()) && msg.contains("itself"),
            "{msg}"
        );
        sched.stop();
    });
}

/// `stop_timeout` called inside one of the scheduler's own fibers returns at once, and its
/// deadline still holds: a fiber parked for ever is cancelled soon after it.
#[test]
fn stop_timeout_inside_a_fiber_keeps_its_deadline() {
    with_deadline(|| {
        let sched = Arc::new(started(2));
        let forever = sched.submit(|| fibra::park(drop), Some(0)).unwrap();
        let s = sched.clone();
        let t = Instant::now();
        let stopper = sched
            .submit(move || s.stop_timeout(Duration::from_millis(50)), Some(1))
            .unwrap();
        assert_eq!(finish(stopper), 0, "it cannot wait, so it counts nothing");
        assert!(
            forever.wait_timeout(LIMIT),
            "the parked fiber was never cancelled"
        );
        assert!(forever.join().unwrap_err().is_cancelled());
        assert!(
            t.elapsed() >= Duration::from_millis(50),
            "cancelled before the deadline"
        );
        // Stopping from outside afterwards returns at once: nothing is left.
        let t = Instant::now();
        sched.stop();
        assert!(t.elapsed() < LIMIT);
    });
}

/// The deadline thread cancels the calling fiber too when it is still alive, and abandons a
/// fiber whose cancellation never ends after the grace.
#[test]
fn stop_timeout_inside_a_fiber_cancels_the_caller_and_abandons_the_stubborn() {
    struct Stubborn;
    impl Drop for Stubborn {
        fn drop(&mut self) {
            fibra::park(drop); // waits for ever while its fiber is cancelled
        }
    }
    with_deadline(|| {
        let sched = Arc::new(started(1));
        let stubborn = sched
            .submit(
                || {
                    let _s = Stubborn;
                    fibra::park(drop);
                },
                None,
            )
            .unwrap();
        let s = sched.clone();
        let alive = Arc::new(AtomicBool::new(true));
        let a = alive.clone();
        let caller = sched
            .submit(
                move || {
                    s.stop_timeout(Duration::from_millis(20));
                    fibra::park(drop); // the caller itself waits for ever
                    a.store(false, Ordering::SeqCst);
                },
                None,
            )
            .unwrap();
        assert!(caller.wait_timeout(LIMIT));
        assert!(caller.join().unwrap_err().is_cancelled());
        assert!(stubborn.wait_timeout(LIMIT), "abandoned after the grace");
        assert!(stubborn.join().unwrap_err().is_cancelled());
        assert!(
            alive.load(Ordering::SeqCst),
            "the caller unwound, it did not return"
        );
        sched.stop();
    });
}

/// A zero sleep, or a sleep until a past instant, inside a standalone `Fiber` does not hand
/// control back to the caller of `resume`: a standalone fiber's waits block its thread.
#[test]
fn a_zero_sleep_in_a_standalone_fiber_does_not_suspend_it() {
    let mut f = fibra::Fiber::new(|| {
        fibra::sleep(Duration::ZERO);
        fibra::sleep_until(Instant::now() - Duration::from_millis(1));
        fibra::sleep(Duration::from_micros(10));
    });
    assert_eq!(f.resume(), fibra::FiberState::Done);
}

/// The first socket wait of a process whose descriptor table is full cannot create the
/// reactor: it fails with EMFILE like any socket call (it used to panic), and the next wait,
/// with descriptors free, works. In a child process of its own, where no fibra socket has
/// waited yet (the reactor does not exist) and the descriptor table is full.
#[test]
fn the_first_socket_wait_out_of_descriptors_is_an_error() {
    use std::io::{Read, Write};
    crate::common::in_child(|| {
        let sched = started(1);
        let (a, mut b) = std::os::unix::net::UnixStream::pair().unwrap();
        let a = Arc::new(fibra::net::unix::UnixStream::from(a));
        let filler = crate::common::fill_descriptor_table(0);
        let a2 = a.clone();
        let h = sched
            .submit(
                move || {
                    let mut buf = [0u8; 4];
                    (&*a2).read(&mut buf).map_err(|e| e.raw_os_error())
                },
                None,
            )
            .unwrap();
        let first = h.join();
        drop(filler);
        // With descriptors free again, the next wait creates the reactor and works.
        b.write_all(b"x").unwrap();
        let second = sched
            .submit(
                move || {
                    let mut buf = [0u8; 4];
                    (&*a).read(&mut buf).map_err(|e| e.raw_os_error())
                },
                None,
            )
            .unwrap()
            .join();
        sched.stop();
        match (first, second) {
            (Ok(Err(Some(libc::EMFILE))), Ok(Ok(1))) => {}
            other => panic!("unexpected: {other:?}"),
        }
    })
    .assert_ok("the first socket wait out of descriptors did not fail with EMFILE, then work");
}

/// A `use_caller` scheduler built inside a scheduler's fiber could never run worker 0 (its
/// building thread only drives it outside fibers, and that thread is another scheduler's
/// worker): `build` refuses it with a clear error. Built in a standalone fiber and used on
/// the thread afterwards, it works.
#[test]
fn use_caller_inside_a_fiber_is_refused() {
    with_deadline(|| {
        let build = || {
            fibra::Scheduler::builder()
                .threads(2)
                .use_caller(true)
                .build()
                .err()
        };
        let sched = started(1);
        assert_eq!(sched.block_on(build), Some(fibra::Error::UseCallerInFiber));
        sched.stop();
        let e = fibra::Error::UseCallerInFiber.to_string();
        assert!(e.contains("use_caller") && e.contains("fiber"), "{e}");
        let built = Arc::new(std::sync::Mutex::new(None));
        let b = built.clone();
        let mut standalone = fibra::Fiber::new(move || {
            let s = fibra::Scheduler::builder()
                .threads(1)
                .use_caller(true)
                .build()
                .unwrap();
            *b.lock().unwrap() = Some(s);
        });
        assert_eq!(standalone.resume(), fibra::FiberState::Done);
        let on_thread = built.lock().unwrap().take().unwrap();
        assert_eq!(on_thread.block_on(|| 5), 5);
        on_thread.stop();
    });
}

/// `stop_timeout` called again and again inside fibers keeps one deadline thread, and a
/// later call with an earlier deadline brings the deadline forward.
#[test]
fn repeated_stop_timeouts_inside_fibers_keep_the_earliest_deadline_on_one_thread() {
    with_deadline(|| {
        let name = "hc-repeat";
        let sched = Arc::new(
            fibra::Scheduler::builder()
                .threads(2)
                .name(name)
                .build()
                .unwrap(),
        );
        sched.start();
        let forever = sched.submit(|| fibra::park(drop), Some(0)).unwrap();
        let s = sched.clone();
        let caller = sched
            .submit(
                move || {
                    for _ in 0..200 {
                        s.stop_timeout(Duration::from_secs(3600));
                    }
                    s.stop_timeout(Duration::from_millis(30));
                },
                Some(1),
            )
            .unwrap();
        finish(caller);
        let keepers = std::fs::read_dir("/proc/self/task")
            .unwrap()
            .filter_map(|t| std::fs::read_to_string(t.ok()?.path().join("comm")).ok())
            .filter(|comm| comm.trim() == format!("{name}-stop"))
            .count();
        assert!(keepers <= 1, "{keepers} deadline threads");
        assert!(
            forever.wait_timeout(LIMIT),
            "the earliest deadline was not kept"
        );
        assert!(forever.join().unwrap_err().is_cancelled());
        sched.stop();
    });
}

/// A worker that does not get to run during `stop_timeout`'s whole grace (here: a fiber on
/// it blocks the thread) still delivers the cancellation to its parked fibers, once, before
/// it abandons them: their destructors run (they used to be abandoned unresumed).
#[test]
fn a_worker_late_for_the_cancellation_still_delivers_it_before_abandoning() {
    with_deadline(|| {
        let sched = started(1);
        let dropped = Arc::new(AtomicBool::new(false));
        struct Flag(Arc<AtomicBool>);
        impl Drop for Flag {
            fn drop(&mut self) {
                self.0.store(true, Ordering::SeqCst);
            }
        }
        let d = dropped.clone();
        let parked = sched
            .submit(
                move || {
                    let _f = Flag(d);
                    fibra::park(drop);
                },
                None,
            )
            .unwrap();
        crate::common::wait_until("the fiber parked", || {
            sched.metrics().workers()[0].fibers() == 1
        });
        // Holds the only worker's thread past the deadline and the grace.
        let (running, is_running) = mpsc::channel();
        let blocker = sched
            .submit(
                move || {
                    running.send(()).unwrap();
                    crate::common::block_thread(Duration::from_millis(1600));
                },
                None,
            )
            .unwrap();
        is_running.recv_timeout(LIMIT).unwrap();
        sched.stop_timeout(Duration::from_millis(20));
        assert!(parked.wait_timeout(LIMIT) && blocker.wait_timeout(LIMIT));
        assert!(parked.join().unwrap_err().is_cancelled());
        assert!(
            crate::common::eventually(LIMIT, || dropped.load(Ordering::SeqCst)),
            "the parked fiber was abandoned without its cancellation"
        );
    });
}
