//! The toolkit and `fibra::sync` misused, beyond the per-primitive tests:
//! panicking continuations, continuations on stopped executors, `JoinSet` from a plain
//! thread, a scope in a cancelled fiber, `OnceLock`, `Condvar`, `Barrier` and `Semaphore`
//! at their edges, broadcast receivers dropped mid-stream, token trees, a tokio runtime shut
//! down under waiting fibers, stale wakers, and hooked calls on dup'd descriptors and in the
//! destructors of cancelled fibers.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex as StdMutex};
use std::time::{Duration, Instant};

use crate::common::{finish, started, with_deadline, Counted, LIMIT};
use fibra::sync::{mpsc, CancellationToken};
#[cfg(feature = "tokio")]
use fibra::Scheduler;

// ------------------------------------------------------------------ toolkit: continuations

/// A panicking `then` registered before completion must not stop the later `finally` nor
/// change the task's result; the same registered after completion must not unwind into the
/// registering caller.
#[test]
fn panicking_continuations_before_and_after_completion() {
    with_deadline(|| {
        let sched = started(2);
        let ran = Arc::new(AtomicUsize::new(0));
        let (go_tx, go_rx) = mpsc::channel::<()>();
        let h = sched.spawn(move || {
            go_rx.recv().unwrap();
            7u32
        });
        let r = ran.clone();
        h.then(|_| panic!("continuation panics")).finally(move || {
            r.fetch_add(1, Ordering::SeqCst);
        });
        go_tx.send(()).unwrap();
        assert!(h.wait_timeout(LIMIT));
        crate::common::wait_until("finally ran", || ran.load(Ordering::SeqCst) == 1);
        // After completion: runs at once here; its panic must stay inside.
        let r = ran.clone();
        let res = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            h.then(|_| panic!("late continuation panics"))
                .finally(move || {
                    r.fetch_add(1, Ordering::SeqCst);
                });
        }));
        assert!(
            res.is_ok(),
            "a late continuation's panic unwound into the caller"
        );
        assert_eq!(ran.load(Ordering::SeqCst), 2);
        assert_eq!(h.join().unwrap(), 7);
        sched.stop();
    });
}

/// Continuations of a task refused by a stopped executor: `catching` and `finally` run
/// (cancelled), `then` does not; registered after the refusal, from a plain thread.
#[test]
fn continuations_on_stopped_executors_run_with_the_cancellation() {
    use fibra::exec::{Executor, Looper, ThreadPool};
    with_deadline(|| {
        let looper = Looper::new();
        looper.shutdown(true);
        let pool = ThreadPool::new(1);
        pool.shutdown();
        let sched = started(1);
        sched.stop();
        let hs = vec![
            looper.spawn(|| 1u32),
            pool.spawn(|| 2u32),
            fibra::exec::Executor::spawn(&sched, || 3u32),
        ];
        for (i, h) in hs.into_iter().enumerate() {
            let (tx, rx) = std::sync::mpsc::channel::<&'static str>();
            let (t1, t2, t3) = (tx.clone(), tx.clone(), tx);
            h.then(move |_| t1.send("then").unwrap())
                .catching(move |e| {
                    assert!(e.is_cancelled());
                    t2.send("catching").unwrap()
                })
                .finally(move || t3.send("finally").unwrap());
            let mut got: Vec<_> = (0..2)
                .map(|_| rx.recv_timeout(LIMIT).unwrap_or("missing"))
                .collect();
            got.sort();
            assert_eq!(got, ["catching", "finally"], "executor {i}");
            assert!(
                rx.recv_timeout(Duration::from_millis(50)).is_err(),
                "executor {i}: then ran"
            );
            assert!(h.join().unwrap_err().is_cancelled());
        }
    });
}

// ------------------------------------------------------------------ toolkit: JoinSet, scope

/// `join_next` from a plain thread while tasks panic, get cancelled and park; dropping the
/// set with parked tasks cancels them and runs their destructors.
#[test]
fn join_set_from_a_plain_thread_with_panics_cancels_and_drop() {
    with_deadline(|| {
        let sched = Arc::new(started(2));
        let drops = Arc::new(AtomicUsize::new(0));
        let mut set = fibra::JoinSet::new();
        for i in 0..30u32 {
            let d = drops.clone();
            set.spawn_on(&sched, move || {
                let _c = Counted(d);
                match i % 3 {
                    0 => i,
                    1 => panic!("task {i}"),
                    _ => {
                        fibra::sleep(Duration::from_secs(3600));
                        i
                    }
                }
            });
        }
        let mut ok = 0;
        let mut panics = 0;
        for _ in 0..20 {
            match set.join_next().expect("tasks left") {
                Ok(_) => ok += 1,
                Err(e) => {
                    assert!(e.is_panic());
                    panics += 1
                }
            }
        }
        assert_eq!((ok, panics), (10, 10));
        assert_eq!(set.len(), 10);
        drop(set);
        crate::common::wait_until("the sleepers' destructors", || {
            drops.load(Ordering::SeqCst) == 30
        });
        sched.stop();
    });
}

/// A scope in a fiber that is cancelled while its scoped fibers borrow its data and wait:
/// the scope must not return (unwind) before its children ended — they borrow its stack.
#[test]
fn scope_in_a_cancelled_fiber_waits_for_borrowing_children() {
    with_deadline(|| {
        let sched = started(2);
        let ended = Arc::new(AtomicUsize::new(0));
        let e = ended.clone();
        let h = sched.spawn(move || {
            let data = vec![1u64; 1000];
            fibra::scope(|s| {
                for _ in 0..4 {
                    let e = e.clone();
                    let data = &data;
                    s.spawn(move || {
                        let t = Instant::now();
                        while t.elapsed() < Duration::from_millis(100) {
                            fibra::sleep(Duration::from_millis(5));
                        }
                        let sum: u64 = data.iter().sum();
                        assert_eq!(sum, 1000);
                        e.fetch_add(1, Ordering::SeqCst);
                    });
                }
                fibra::sleep(Duration::from_secs(3600));
            });
        });
        std::thread::sleep(Duration::from_millis(20));
        h.cancel();
        assert!(h.wait_timeout(LIMIT));
        assert!(h.join().is_err());
        // Either the children were cancelled too, or they finished; none is left running
        // on a freed borrow: all four ended (counted) or were cancelled before finishing.
        std::thread::sleep(Duration::from_millis(150));
        let n = ended.load(Ordering::SeqCst);
        assert!(
            n == 0 || n == 4,
            "{n} children finished after the scope was gone"
        );
        sched.stop();
    });
}

// ------------------------------------------------------------------ sync primitives

/// OnceLock: an initialiser that sleeps and then panics while fibers and a thread wait;
/// exactly one later initialiser runs and everyone sees its value. Then an initialiser that
/// is cancelled while it sleeps: the waiters go on.
#[test]
fn once_lock_panicking_and_cancelled_initialisers_with_waiters() {
    with_deadline(|| {
        let sched = started(2);
        let cell = Arc::new(fibra::sync::OnceLock::<u32>::new());
        let inits = Arc::new(AtomicUsize::new(0));
        let c = cell.clone();
        let first = sched.spawn(move || {
            c.get_or_init(|| {
                fibra::sleep(Duration::from_millis(30));
                panic!("init fails")
            });
        });
        std::thread::sleep(Duration::from_millis(5));
        let mut hs = Vec::new();
        for k in 0..6u32 {
            let (c, n) = (cell.clone(), inits.clone());
            hs.push(sched.spawn(move || {
                *c.get_or_init(|| {
                    n.fetch_add(1, Ordering::SeqCst);
                    fibra::sleep(Duration::from_millis(2));
                    100 + k
                })
            }));
        }
        let (c, n) = (cell.clone(), inits.clone());
        let th = std::thread::spawn(move || {
            *c.get_or_init(|| {
                n.fetch_add(1, Ordering::SeqCst);
                99
            })
        });
        assert!(first.wait_timeout(LIMIT));
        assert!(first.join().unwrap_err().is_panic());
        let v: Vec<u32> = hs.into_iter().map(finish).collect();
        let t = th.join().unwrap();
        assert!(v.iter().all(|&x| x == t), "{v:?} vs {t}");
        assert_eq!(inits.load(Ordering::SeqCst), 1);
        // Cancelled initialiser.
        let cell = Arc::new(fibra::sync::OnceLock::<u32>::new());
        let c = cell.clone();
        let first = sched.spawn(move || {
            c.get_or_init(|| {
                fibra::sleep(Duration::from_secs(3600));
                1
            });
        });
        std::thread::sleep(Duration::from_millis(10));
        let c = cell.clone();
        let second = sched.spawn(move || *c.get_or_init(|| 2));
        std::thread::sleep(Duration::from_millis(10));
        first.cancel();
        assert_eq!(finish(second), 2);
        sched.stop();
    });
}

/// Condvar: `notify_one` racing the cancellation of the notified waiter is passed on to the
/// next waiter, many rounds.
#[test]
fn condvar_notify_one_racing_a_cancel_is_not_lost() {
    with_deadline(|| {
        let sched = started(2);
        for round in 0..200u32 {
            let pair = Arc::new((fibra::sync::Mutex::new(0u32), fibra::sync::Condvar::new()));
            let waiting = Arc::new(AtomicUsize::new(0));
            let mk = |pair: Arc<(fibra::sync::Mutex<u32>, fibra::sync::Condvar)>,
                      w: Arc<AtomicUsize>| {
                move || {
                    let (m, cv) = &*pair;
                    let mut g = m.lock().unwrap();
                    w.fetch_add(1, Ordering::SeqCst);
                    while *g == 0 {
                        g = cv.wait(g).unwrap();
                    }
                    *g -= 1;
                }
            };
            let a = sched.spawn(mk(pair.clone(), waiting.clone()));
            crate::common::wait_until("a waits", || waiting.load(Ordering::SeqCst) == 1);
            let b = sched.spawn(mk(pair.clone(), waiting.clone()));
            crate::common::wait_until("b waits", || waiting.load(Ordering::SeqCst) == 2);
            // Make sure both are parked in wait: take the lock once.
            drop(pair.0.lock().unwrap());
            *pair.0.lock().unwrap() += 1;
            if round % 2 == 0 {
                pair.1.notify_one();
                a.cancel();
            } else {
                a.cancel();
                pair.1.notify_one();
            }
            assert!(a.wait_timeout(LIMIT));
            let a_res = a.join();
            if a_res.is_ok() {
                // a consumed it; b still waits: release it.
                *pair.0.lock().unwrap() += 1;
                pair.1.notify_one();
            }
            assert!(
                b.wait_timeout(Duration::from_secs(10)),
                "round {round}: the notification was lost with the cancelled waiter"
            );
            b.join().unwrap();
        }
        sched.stop();
    });
}

/// Barrier of 0 and 1 never wait; a cancelled waiter of a 2-barrier takes its arrival back.
#[test]
fn barrier_edges_and_cancelled_waiters() {
    with_deadline(|| {
        let sched = started(2);
        assert!(fibra::sync::Barrier::new(0).wait().is_leader());
        assert!(fibra::sync::Barrier::new(1).wait().is_leader());
        let b = Arc::new(fibra::sync::Barrier::new(2));
        let b1 = b.clone();
        let h = sched.spawn(move || {
            b1.wait();
        });
        std::thread::sleep(Duration::from_millis(20));
        h.cancel();
        assert!(h.wait_timeout(LIMIT));
        assert!(h.join().unwrap_err().is_cancelled());
        // Alone now: times out (its arrival was taken back).
        assert!(b.wait_timeout(Duration::from_millis(30)).is_none());
        let b2 = b.clone();
        let h = sched.spawn(move || b2.wait().is_leader());
        let mine = b.wait_timeout(LIMIT).expect("released").is_leader();
        assert!(mine != finish(h));
        sched.stop();
    });
}

/// Semaphore: MAX_PERMITS, zero-permit requests while others wait, a huge request that
/// never fits and is cancelled lets smaller ones behind it through.
#[test]
fn semaphore_extremes() {
    with_deadline(|| {
        let sched = started(2);
        let max = fibra::sync::Semaphore::MAX_PERMITS;
        let s = fibra::sync::Semaphore::new(max);
        let p = s.acquire_many(max);
        assert_eq!(s.available_permits(), 0);
        drop(p);
        assert_eq!(s.available_permits(), max);
        assert!(std::panic::catch_unwind(|| fibra::sync::Semaphore::new(usize::MAX)).is_err());
        let sem = Arc::new(fibra::sync::Semaphore::new(1));
        let s2 = sem.clone();
        let huge = sched.spawn(move || {
            let _p = s2.acquire_many(usize::MAX);
        });
        std::thread::sleep(Duration::from_millis(20));
        // Behind the huge request: waits, even for 0 permits (FIFO).
        assert!(sem.try_acquire().is_none());
        let s3 = sem.clone();
        let small =
            sched.spawn(move || s3.acquire_many(0).num_permits() + s3.acquire().num_permits());
        std::thread::sleep(Duration::from_millis(20));
        assert!(!small.is_finished());
        huge.cancel();
        assert!(huge.wait_timeout(LIMIT));
        assert_eq!(finish(small), 1);
        assert_eq!(sem.available_permits(), 1);
        sched.stop();
    });
}

/// Broadcast: receivers dropped mid-stream on both workers while lagging; messages (a
/// shared refcount) are all released once the receivers are gone and the sender keeps going.
#[test]
fn broadcast_lagging_receivers_dropped_mid_stream_release_messages() {
    use fibra::sync::broadcast;
    with_deadline(|| {
        let sched = started(2);
        let live = Arc::new(AtomicUsize::new(0));
        #[derive(Debug)]
        struct Msg(Arc<AtomicUsize>);
        impl Clone for Msg {
            fn clone(&self) -> Self {
                self.0.fetch_add(1, Ordering::SeqCst);
                Msg(self.0.clone())
            }
        }
        impl Drop for Msg {
            fn drop(&mut self) {
                self.0.fetch_sub(1, Ordering::SeqCst);
            }
        }
        let (tx, rx) = broadcast::channel::<Msg>(4);
        let mut hs = Vec::new();
        for k in 0..8usize {
            let mut rx = tx.subscribe();
            hs.push(sched.spawn(move || {
                let mut seen = 0;
                let mut lagged = 0;
                loop {
                    match rx.recv_timeout(Duration::from_secs(5)) {
                        Ok(_m) => {
                            seen += 1;
                            if seen == 10 + k * 7 {
                                return (seen, lagged);
                            }
                            if k % 2 == 0 {
                                fibra::sleep(Duration::from_micros(200));
                            }
                        }
                        Err(broadcast::RecvTimeoutError::Lagged(n)) => lagged += n,
                        Err(e) => panic!("{e:?}"),
                    }
                }
            }));
        }
        drop(rx);
        for _ in 0..2000 {
            live.fetch_add(1, Ordering::SeqCst);
            let _ = tx.send(Msg(live.clone()));
            if hs.iter().all(|h| h.is_finished()) {
                break;
            }
            std::thread::sleep(Duration::from_micros(50));
        }
        for h in hs {
            finish(h);
        }
        // Nobody receives any more: what the ring still holds is at most its capacity.
        for _ in 0..10 {
            live.fetch_add(1, Ordering::SeqCst);
            let _ = tx.send(Msg(live.clone()));
        }
        assert!(
            live.load(Ordering::SeqCst) <= 4,
            "{} messages alive with no receiver",
            live.load(Ordering::SeqCst)
        );
        drop(tx);
        assert_eq!(live.load(Ordering::SeqCst), 0);
        sched.stop();
    });
}

/// CancellationToken: cancel from a Drop that runs during another token's cancel-wakeup;
/// children created after the cancel are born cancelled; the grandchild of a dropped child.
#[test]
fn cancellation_token_drop_cancels_and_late_children() {
    with_deadline(|| {
        let sched = started(2);
        struct CancelOnDrop(CancellationToken);
        impl Drop for CancelOnDrop {
            fn drop(&mut self) {
                self.0.cancel();
                assert!(self.0.child_token().is_cancelled());
            }
        }
        let a = CancellationToken::new();
        let b = CancellationToken::new();
        let (a1, b1) = (a.child_token(), b.clone());
        let h = sched.spawn(move || {
            let _g = CancelOnDrop(b1);
            a1.cancelled();
        });
        let b2 = b.child_token();
        let w = sched.spawn(move || b2.cancelled_timeout(LIMIT));
        std::thread::sleep(Duration::from_millis(10));
        a.cancel();
        finish(h);
        assert!(finish(w));
        assert!(b.is_cancelled());
        sched.stop();
    });
}

// ------------------------------------------------------------------ async interop

/// A tokio runtime shut down while a fiber awaits a tokio sleep in `block_on`: the fiber
/// ends (panic from tokio, or wakes), it does not hang for ever.
#[cfg(feature = "tokio")]
#[test]
fn tokio_runtime_shut_down_under_a_waiting_fiber() {
    with_deadline(|| {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap();
        let sched = Scheduler::builder()
            .threads(1)
            .tokio_handle(rt.handle().clone())
            .build()
            .unwrap();
        sched.start();
        let h = sched.spawn(|| {
            fibra::future::block_on(async { tokio::time::sleep(Duration::from_secs(3600)).await });
        });
        let (tx, rx) = tokio::sync::oneshot::channel::<u32>();
        let h2 = sched.spawn(move || fibra::future::block_on(rx));
        std::thread::sleep(Duration::from_millis(50));
        rt.shutdown_timeout(Duration::from_secs(1));
        drop(tx);
        assert!(
            h.wait_timeout(Duration::from_secs(20)),
            "a fiber hangs after the runtime shut down"
        );
        let _ = h.join();
        assert!(h2.wait_timeout(LIMIT));
        assert!(h2.join().unwrap().is_err());
        // New fibers that use tokio after the shutdown fail, they do not hang.
        let h3 = sched.spawn(|| {
            fibra::future::block_on(async { tokio::time::sleep(Duration::from_millis(1)).await });
        });
        assert!(
            h3.wait_timeout(Duration::from_secs(20)),
            "a new tokio sleep hangs"
        );
        let _ = h3.join();
        sched.stop();
    });
}

/// A waker stored by a future is woken many times from many threads after the fiber that
/// block_on'd it was cancelled, and after the scheduler stopped.
#[test]
fn stale_wakers_woken_from_many_threads_after_cancel_and_stop() {
    with_deadline(|| {
        let sched = started(2);
        let slot: Arc<StdMutex<Option<std::task::Waker>>> = Arc::new(StdMutex::new(None));
        let s = slot.clone();
        let h = sched.spawn(move || {
            fibra::future::block_on(std::future::poll_fn(|cx| {
                *s.lock().unwrap() = Some(cx.waker().clone());
                std::task::Poll::<()>::Pending
            }))
        });
        crate::common::wait_until("the waker", || slot.lock().unwrap().is_some());
        // Keep other fibers busy on the workers so that a stale wake hits reused slots.
        let busy: Vec<_> = (0..20)
            .map(|_| {
                sched.spawn(|| {
                    for _ in 0..200 {
                        fibra::sleep(Duration::from_micros(100))
                    }
                })
            })
            .collect();
        h.cancel();
        assert!(h.wait_timeout(LIMIT));
        let w = slot.lock().unwrap().clone().unwrap();
        let threads: Vec<_> = (0..4)
            .map(|_| {
                let w = w.clone();
                std::thread::spawn(move || {
                    for _ in 0..10_000 {
                        w.wake_by_ref();
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        for b in busy {
            finish(b);
        }
        sched.stop();
        w.wake_by_ref();
        w.wake();
    });
}

// ------------------------------------------------------------------ hooks

/// With hooks: fiber A waits in a blocking std read on a dup of a socket; fiber B closes
/// the original fd. A keeps waiting on its own (still open) fd and gets the data written
/// later; a third fiber waiting on the closed fd fails with EBADF.
#[cfg(feature = "hook")]
#[test]
fn hooked_read_on_a_dup_survives_closing_the_original() {
    use std::io::{Read, Write};
    use std::os::fd::{AsRawFd, FromRawFd, IntoRawFd};
    with_deadline(|| {
        let sched = started(2);
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let mut peer = std::net::TcpStream::connect(addr).unwrap();
        let (server, _) = listener.accept().unwrap();
        let fd = server.into_raw_fd();
        let reader = sched.spawn(move || {
            // SAFETY: dup of a live fd.
            let d = unsafe { libc::dup(fd) };
            assert!(d >= 0);
            // SAFETY: d is ours.
            let mut s = unsafe { std::net::TcpStream::from_raw_fd(d) };
            let mut buf = [0u8; 5];
            let t = Instant::now();
            let r = s.read_exact(&mut buf);
            (r.map(|()| buf), t.elapsed())
        });
        std::thread::sleep(Duration::from_millis(50));
        let closer = sched.spawn(move || {
            // SAFETY: the original fd, closed once.
            unsafe { libc::close(fd) }
        });
        assert_eq!(finish(closer), 0);
        std::thread::sleep(Duration::from_millis(50));
        peer.write_all(b"hello").unwrap();
        assert!(
            reader.wait_timeout(Duration::from_secs(10)),
            "the dup's reader never woke for its data"
        );
        let (r, _) = reader.join().unwrap();
        assert_eq!(r.unwrap(), *b"hello");
        let _ = peer.as_raw_fd();
        sched.stop();
    });
}

/// With hooks: std::net accept/read and thread::sleep in many fibers on one worker, with
/// read timeouts; a Drop that makes a hooked sleep and a hooked write while the fiber is
/// being cancelled does not wait (ECANCELED / real call).
#[cfg(feature = "hook")]
#[test]
fn hooked_calls_in_a_drop_of_a_cancelled_fiber_return() {
    use std::io::Write;
    with_deadline(|| {
        let sched = started(1);
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        struct Guard(std::net::TcpStream);
        impl Drop for Guard {
            fn drop(&mut self) {
                std::thread::sleep(Duration::from_millis(5));
                let _ = self.0.write_all(b"bye");
                let mut b = [0u8; 1];
                let _ = self.0.set_read_timeout(Some(Duration::from_secs(3600)));
                let _ = std::io::Read::read(&mut self.0, &mut b);
            }
        }
        let h = sched.spawn(move || {
            let s = std::net::TcpStream::connect(addr).unwrap();
            let _g = Guard(s);
            std::thread::sleep(Duration::from_secs(3600));
        });
        let (mut srv, _) = listener.accept().unwrap();
        std::thread::sleep(Duration::from_millis(30));
        h.cancel();
        assert!(
            h.wait_timeout(Duration::from_secs(10)),
            "the cancelled fiber's Drop waits"
        );
        let mut b = [0u8; 3];
        srv.set_read_timeout(Some(LIMIT)).unwrap();
        std::io::Read::read_exact(&mut srv, &mut b).unwrap();
        assert_eq!(&b, b"bye");
        sched.stop();
    });
}
