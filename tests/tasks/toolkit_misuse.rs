//! The toolkit used carelessly: `JoinHandle::cancel`, `JoinSet`, `scope`, `select!`,
//! `CancellationToken` and the cooperative budget under cancellations that race completion,
//! timeouts, deliveries and shutdown; handles and sets dropped from inside their own tasks;
//! panicking destructors; deep nesting. No message is lost or dropped twice and nothing
//! hangs.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::common::{finish, started, wait_until, with_deadline, Counted, LIMIT};
use fibra::sync::{mpmc, mpsc, CancellationToken, Mutex, SelectArms};
use fibra::{JoinHandle, JoinSet, Scheduler};

const HOUR: Duration = Duration::from_secs(3600);

fn is_cancelled<T>(h: JoinHandle<T>) -> bool {
    assert!(h.wait_timeout(LIMIT), "task {} did not finish", h.id());
    match h.join() {
        Ok(_) => false,
        Err(e) => {
            assert!(e.is_cancelled(), "unexpected error: {e:?}");
            true
        }
    }
}

// ---------------------------------------------------------------- cancel races

/// Many threads cancel a task at once while it completes on its own: exactly one outcome,
/// its value dropped exactly once, no hang.
#[test]
fn cancel_races_completion_from_many_threads() {
    with_deadline(|| {
        let sched = started(2);
        let made = Arc::new(AtomicUsize::new(0));
        let dropped = Arc::new(AtomicUsize::new(0));
        let cancellers = 3;
        let iters = if cfg!(debug_assertions) { 1500 } else { 4000 };
        let (txs, rxs): (Vec<_>, Vec<_>) = (0..cancellers)
            .map(|_| std::sync::mpsc::channel::<Arc<JoinHandle<Counted>>>())
            .unzip();
        let (ack_tx, ack_rx) = std::sync::mpsc::channel::<()>();
        let threads: Vec<_> = rxs
            .into_iter()
            .enumerate()
            .map(|(k, rx)| {
                let ack = ack_tx.clone();
                std::thread::spawn(move || {
                    for (i, h) in rx.iter().enumerate() {
                        for _ in 0..((i + k) % 7) * 20 {
                            std::hint::spin_loop();
                        }
                        h.cancel();
                        h.cancel();
                        drop(h);
                        ack.send(()).unwrap();
                    }
                })
            })
            .collect();
        let (mut ok, mut cancelled) = (0, 0);
        for i in 0..iters {
            let (m, d) = (made.clone(), dropped.clone());
            let h = Arc::new(sched.spawn(move || {
                if i % 3 == 0 {
                    fibra::Fiber::yield_now();
                }
                if i % 5 == 0 {
                    fibra::sleep(Duration::from_micros(50));
                }
                m.fetch_add(1, Ordering::SeqCst);
                Counted(d)
            }));
            for tx in &txs {
                tx.send(h.clone()).unwrap();
            }
            if i % 2 == 0 {
                h.cancel();
            }
            for _ in 0..cancellers {
                ack_rx.recv_timeout(LIMIT).expect("a canceller hung");
            }
            let h = Arc::try_unwrap(h).expect("only we hold it now");
            if is_cancelled(h) {
                cancelled += 1;
            } else {
                ok += 1;
            }
        }
        drop(txs);
        for t in threads {
            t.join().unwrap();
        }
        assert_eq!(ok + cancelled, iters);
        assert_eq!(
            made.load(Ordering::SeqCst),
            dropped.load(Ordering::SeqCst),
            "a value was lost or dropped twice (ok {ok}, cancelled {cancelled})"
        );
        sched.stop();
    });
}

/// A task cancelled while it waits in each kind of blocking call: it unwinds, and the
/// primitive it waited on still works afterwards.
#[test]
fn cancel_inside_every_kind_of_wait() {
    with_deadline(|| {
        let sched = started(2);
        let arrived = Arc::new(AtomicUsize::new(0));
        // 0 select!, 1 scope, 2 join_next, 3 cancelled(), 4 Mutex::lock, 5 mpsc recv,
        // 6 mpmc recv, 7 sleep, 8 join, 9 rendezvous send, 10 Select::wait, 11 recv_timeout
        let token = CancellationToken::new();
        let lock = Arc::new(Mutex::new(0u32));
        let guard_holder = {
            let lock = lock.clone();
            let (tx, rx) = mpsc::channel::<()>();
            let (held_tx, held_rx) = std::sync::mpsc::channel();
            let h = sched.spawn(move || {
                let _g = lock.lock().unwrap();
                held_tx.send(()).unwrap();
                rx.recv().unwrap();
            });
            held_rx.recv().unwrap();
            (h, tx)
        };
        let (mtx, mrx) = mpsc::channel::<u32>();
        let (ptx, prx) = mpmc::channel::<u32>();
        let (rtx, rrx) = mpmc::sync_channel::<u32>(0);
        let mut mrx = Some(mrx);
        let scope_release = CancellationToken::new();
        let mut handles = Vec::new();
        for kind in 0..12 {
            let a = arrived.clone();
            let token = token.clone();
            let lock = lock.clone();
            let mrx = if kind == 5 { mrx.take() } else { None };
            let prx = prx.clone();
            let rtx = rtx.clone();
            let release = scope_release.clone();
            let h = sched.spawn(move || {
                a.fetch_add(1, Ordering::SeqCst);
                match kind {
                    0 => {
                        fibra::select! {
                            recv(prx) -> _ => panic!("nothing is sent"),
                            recv(token) -> _ => panic!("never cancelled"),
                        }
                    }
                    1 => {
                        let local = AtomicUsize::new(0);
                        fibra::scope(|s| {
                            s.spawn(|| {
                                release.cancelled();
                                local.fetch_add(1, Ordering::SeqCst);
                            });
                            fibra::sleep(HOUR);
                        });
                    }
                    2 => {
                        let mut set = JoinSet::new();
                        set.spawn(|| fibra::sleep(HOUR));
                        set.join_next();
                    }
                    3 => token.cancelled(),
                    4 => drop(lock.lock()),
                    5 => drop(mrx.unwrap().recv()),
                    6 => drop(prx.recv()),
                    7 => fibra::sleep(HOUR),
                    8 => {
                        let r = release.clone();
                        drop(fibra::spawn(move || r.cancelled()).join())
                    }
                    9 => drop(rtx.send(9)),
                    10 => {
                        let mut sel = SelectArms::new();
                        sel.recv(&prx, |_| ()).recv(&token, |_| ());
                        sel.wait();
                    }
                    11 => drop(prx.recv_timeout(HOUR)),
                    _ => unreachable!(),
                }
                panic!("kind {kind} returned");
            });
            handles.push((kind, h));
        }
        wait_until("every waiter to start", || {
            arrived.load(Ordering::SeqCst) == 12
        });
        std::thread::sleep(Duration::from_millis(30));
        for (_, h) in &handles {
            h.cancel();
        }
        // The scope waits for its child: release it.
        std::thread::sleep(Duration::from_millis(30));
        scope_release.cancel();
        for (kind, h) in handles {
            assert!(h.wait_timeout(LIMIT), "kind {kind} was not cancelled");
            let e = h.join().expect_err("a cancelled waiter");
            assert!(e.is_cancelled(), "kind {kind}: {e:?}");
        }
        // Everything still works.
        guard_holder.1.send(()).unwrap();
        finish(guard_holder.0);
        *lock.lock().unwrap() += 1;
        ptx.send(5).unwrap();
        assert_eq!(prx.recv_timeout(LIMIT).unwrap(), 5);
        let r = sched.spawn(move || rrx.recv().unwrap());
        rtx.send(6).unwrap();
        assert_eq!(finish(r), 6);
        drop(mtx);
        token.cancel();
        sched.stop();
    });
}

/// A message sent to a receiver while it is cancelled is never lost: the fiber either got
/// it, or it is still in the channel.
#[test]
fn cancel_racing_a_delivery_loses_no_message() {
    with_deadline(|| {
        let sched = started(2);
        let (tx, rx) = mpmc::channel::<u64>();
        let iters = 1000u64;
        let mut got = 0u64;
        for i in 0..iters {
            let rx2 = rx.clone();
            let select = i % 2 == 0;
            let h = sched.spawn(move || {
                if select {
                    fibra::select! { recv(rx2) -> m => m.unwrap() }
                } else {
                    rx2.recv().unwrap()
                }
            });
            if i % 3 == 0 {
                std::thread::yield_now();
            }
            tx.send(i).unwrap();
            h.cancel();
            assert!(h.wait_timeout(LIMIT));
            match h.join() {
                Ok(v) => {
                    assert_eq!(v, i);
                    got += 1;
                }
                Err(e) => {
                    assert!(e.is_cancelled());
                    assert_eq!(rx.try_recv().ok(), Some(i), "message {i} lost");
                    got += 1;
                }
            }
        }
        assert_eq!(got, iters);
        assert!(rx.try_recv().is_err());
        sched.stop();
    });
}

/// Cancel racing a timed wait's own deadline.
#[test]
fn cancel_racing_a_timeout() {
    with_deadline(|| {
        let sched = started(2);
        let (_tx, rx) = mpmc::channel::<u32>();
        for i in 0..500 {
            let rx = rx.clone();
            let h = sched.spawn(move || {
                if i % 2 == 0 {
                    fibra::select! {
                        recv(rx) -> _ => 1,
                        default(Duration::from_micros(200)) => 2,
                    }
                } else {
                    fibra::sleep(Duration::from_micros(200));
                    3
                }
            });
            std::thread::sleep(Duration::from_micros((i % 5) * 80));
            h.cancel();
            assert!(h.wait_timeout(LIMIT), "iteration {i} hung");
            if let Err(e) = h.join() {
                assert!(e.is_cancelled());
            }
        }
        sched.stop();
    });
}

/// Cancels while `stop_timeout` cancels the same fibers.
#[test]
fn cancel_during_stop_timeout_and_after_drop() {
    with_deadline(|| {
        for round in 0..5 {
            let sched = started(2);
            let handles: Vec<_> = (0..200)
                .map(|_| Arc::new(sched.spawn(|| fibra::sleep(HOUR))))
                .collect();
            std::thread::sleep(Duration::from_millis(10));
            let hs = handles.clone();
            let canceller = std::thread::spawn(move || {
                for (i, h) in hs.iter().enumerate() {
                    if i % 2 == round % 2 {
                        h.cancel();
                    }
                }
                for h in hs.iter().rev() {
                    h.cancel();
                }
            });
            let t = Instant::now();
            sched.stop_timeout(Duration::from_millis(5));
            assert!(t.elapsed() < LIMIT);
            canceller.join().unwrap();
            drop(sched);
            for h in handles {
                h.cancel(); // after the scheduler is gone
                let h = Arc::try_unwrap(h).unwrap();
                assert!(is_cancelled(h));
            }
        }
    });
}

/// A scheduler dropped while other threads cancel its tasks as they finish.
#[test]
fn cancel_racing_scheduler_drop() {
    with_deadline(|| {
        for i in 0..300 {
            let sched = started(1);
            let h = Arc::new(sched.spawn(move || {
                if i % 2 == 0 {
                    fibra::Fiber::yield_now();
                }
                i
            }));
            let h2 = h.clone();
            let c = std::thread::spawn(move || {
                for _ in 0..(i % 10) * 10 {
                    std::hint::spin_loop();
                }
                h2.cancel();
            });
            drop(sched);
            c.join().unwrap();
            let h = Arc::try_unwrap(h).unwrap();
            match h.join() {
                Ok(v) => assert_eq!(v, i),
                Err(e) => assert!(e.is_cancelled()),
            }
        }
    });
}

/// A task pinned to `use_caller`'s worker 0, cancelled from another thread while nobody
/// drives worker 0; the next `block_on` delivers it.
#[test]
fn cancel_of_a_task_on_use_caller_worker_0() {
    with_deadline(|| {
        let sched = Scheduler::builder()
            .threads(2)
            .use_caller(true)
            .build()
            .unwrap();
        sched.start();
        let h = Arc::new(sched.submit(|| fibra::sleep(HOUR), Some(0)).unwrap());
        // Worker 0 runs only inside block_on: let the task start and park.
        sched.block_on(|| fibra::sleep(Duration::from_millis(20)));
        let h2 = h.clone();
        std::thread::spawn(move || h2.cancel()).join().unwrap();
        assert!(!h.is_finished() || h.is_cancelled());
        // A pinned, never started task cancelled from outside too.
        let never = sched.submit(|| 5, Some(0)).unwrap();
        never.cancel();
        sched.block_on(|| fibra::sleep(Duration::from_millis(20)));
        assert!(h.wait_timeout(LIMIT));
        let h = Arc::try_unwrap(h).unwrap();
        assert!(is_cancelled(h));
        assert!(is_cancelled(never));
        sched.stop();
    });
}

// ---------------------------------------------------------------- select

#[test]
fn select_with_the_same_channel_in_two_arms() {
    with_deadline(|| {
        let sched = started(2);
        let (tx, rx) = mpsc::channel::<u32>();
        let h = sched.spawn(move || {
            let mut got = Vec::new();
            for _ in 0..200 {
                fibra::select! {
                    recv(rx) -> m => got.push(m.unwrap()),
                    recv(rx) -> m => got.push(m.unwrap() + 1000),
                }
            }
            (got, rx)
        });
        for i in 0..200 {
            tx.send(i).unwrap();
            if i % 17 == 0 {
                std::thread::sleep(Duration::from_millis(1));
            }
        }
        let (got, rx) = finish(h);
        assert_eq!(got.len(), 200);
        assert!(rx.try_recv().is_err());
        // Same sender twice with room for one: exactly one send.
        let (stx, srx) = mpsc::sync_channel::<u32>(1);
        fibra::select! {
            send(stx, 1) -> r => r.unwrap(),
            send(stx, 2) -> r => r.unwrap(),
        }
        assert_eq!(srx.try_iter().count(), 1);
        // ... and with no room, a receiver makes room for exactly one.
        stx.send(0).unwrap();
        let h = sched.spawn(move || {
            fibra::select! {
                send(stx, 1) -> r => r.unwrap(),
                send(stx, 2) -> r => r.unwrap(),
            }
            stx
        });
        std::thread::sleep(Duration::from_millis(10));
        assert_eq!(srx.recv_timeout(LIMIT).unwrap(), 0);
        let stx = finish(h);
        drop(stx);
        assert_eq!(srx.iter().count(), 1);
        sched.stop();
    });
}

#[test]
fn select_wakes_when_the_senders_drop_while_it_waits() {
    with_deadline(|| {
        let sched = started(2);
        for threads in [false, true] {
            let (tx, rx) = mpsc::channel::<u32>();
            let (tx2, rx2) = mpmc::sync_channel::<u32>(0);
            let body = move || {
                let a = fibra::select! { recv(rx) -> m => m.is_err() };
                let b = fibra::select! { recv(rx2) -> m => m.is_err() };
                a && b
            };
            let h: Box<dyn FnOnce() -> bool + Send> = if threads {
                let t = std::thread::spawn(body);
                Box::new(move || t.join().unwrap())
            } else {
                let h = sched.spawn(body);
                Box::new(move || finish(h))
            };
            std::thread::sleep(Duration::from_millis(20));
            let tx_clone = tx.clone();
            drop(tx);
            std::thread::sleep(Duration::from_millis(5));
            drop(tx_clone);
            std::thread::sleep(Duration::from_millis(20));
            drop(tx2);
            assert!(h(), "a disconnected receive did not report RecvError");
        }
        sched.stop();
    });
}

#[test]
fn select_with_default_duration_max_is_a_blocking_select() {
    with_deadline(|| {
        let sched = started(2);
        let (tx, rx) = mpsc::channel::<u32>();
        let h = sched.spawn(move || {
            fibra::select! {
                recv(rx) -> m => m.unwrap(),
                default(Duration::MAX) => 0,
            }
        });
        std::thread::sleep(Duration::from_millis(20));
        tx.send(9).unwrap();
        assert_eq!(finish(h), 9);
        // From a plain thread too.
        let (tx, rx) = mpsc::channel::<u32>();
        let t = std::thread::spawn(move || {
            fibra::select! {
                recv(rx) -> m => m.unwrap(),
                default(Duration::MAX) => 0,
            }
        });
        std::thread::sleep(Duration::from_millis(20));
        tx.send(8).unwrap();
        assert_eq!(t.join().unwrap(), 8);
        // A Select with wait_timeout(MAX).
        let (tx, rx) = mpsc::channel::<u32>();
        let h = sched.spawn(move || {
            let mut s = SelectArms::new();
            s.recv(&rx, |m| m.unwrap());
            s.wait_timeout(Duration::MAX)
        });
        std::thread::sleep(Duration::from_millis(20));
        tx.send(7).unwrap();
        assert_eq!(finish(h), Some(7));
        sched.stop();
    });
}

/// Selects on threads and fibers compete for one mpmc channel: every message once.
#[test]
fn selects_from_threads_and_fibers_mixed() {
    with_deadline(|| {
        let sched = started(2);
        let (tx, rx) = mpmc::sync_channel::<u64>(4);
        let (stop_tx, stop_rx) = mpmc::channel::<()>();
        let n = 20_000u64;
        let take = move || {
            let mut sum = 0u64;
            let mut count = 0u64;
            loop {
                fibra::select! {
                    recv(rx) -> m => match m {
                        Ok(v) => { sum += v; count += 1; }
                        Err(_) => break,
                    },
                    recv(stop_rx) -> _ => break,
                }
            }
            (sum, count)
        };
        let mut fibers = Vec::new();
        let mut threads = Vec::new();
        for k in 0..6 {
            let take = take.clone();
            if k % 2 == 0 {
                fibers.push(sched.spawn(take));
            } else {
                threads.push(std::thread::spawn(take));
            }
        }
        drop(take);
        // Senders: a select send from a fiber and a plain send from a thread.
        let tx2 = tx.clone();
        let s1 = sched.spawn(move || {
            for i in 0..n / 2 {
                fibra::select! { send(tx2, i) -> r => r.unwrap() }
            }
        });
        for i in n / 2..n {
            tx.send(i).unwrap();
        }
        finish(s1);
        drop(tx);
        let mut sum = 0;
        let mut count = 0;
        for h in fibers {
            let (s, c) = finish(h);
            sum += s;
            count += c;
        }
        for t in threads {
            let (s, c) = t.join().unwrap();
            sum += s;
            count += c;
        }
        drop(stop_tx);
        assert_eq!(count, n);
        assert_eq!(sum, n * (n - 1) / 2);
        sched.stop();
    });
}

/// Many selects that wait on a channel which rarely fires: registration must not pile up.
#[test]
fn many_selects_on_a_rarely_firing_channel_stay_fast() {
    with_deadline(|| {
        // One worker: the ping-pong is fiber switches on one thread, whose pace other load
        // on the machine changes little (across two workers, every message is a thread
        // wake-up, which a loaded 2-core machine delays by milliseconds).
        let sched = started(1);
        let (_rare_tx, rare) = mpmc::channel::<u32>();
        let (ping_tx, ping_rx) = mpsc::sync_channel::<u32>(0);
        let (pong_tx, pong_rx) = mpsc::sync_channel::<u32>(0);
        let n = if cfg!(debug_assertions) {
            40_000
        } else {
            100_000
        };
        let rare2 = rare.clone();
        let partner = sched.spawn(move || {
            while let Ok(v) = ping_rx.recv() {
                pong_tx.send(v).unwrap();
            }
        });
        let h = sched.spawn(move || {
            let mut halves = [Duration::ZERO; 2];
            let t0 = Instant::now();
            for i in 0..n {
                ping_tx.send(i).unwrap();
                fibra::select! {
                    recv(pong_rx) -> m => assert_eq!(m.unwrap(), i),
                    recv(rare2) -> _ => panic!("rare fired"),
                }
                if i == n / 2 {
                    halves[0] = t0.elapsed();
                }
            }
            halves[1] = t0.elapsed() - halves[0];
            halves
        });
        let [first, second] = finish(h);
        finish(partner);
        assert!(
            second < first * 4 + Duration::from_secs(2),
            "select slowed down: first half {first:?}, second {second:?}"
        );
        // Timed selects that time out register and unregister too.
        let t = Instant::now();
        for _ in 0..2000 {
            let r = fibra::select! {
                recv(rare) -> _ => 1,
                default(Duration::from_micros(1)) => 0,
            };
            assert_eq!(r, 0);
        }
        assert!(t.elapsed() < LIMIT);
        sched.stop();
    });
}

/// A select send on one side of a rendezvous channel and a select recv on the other.
#[test]
fn select_send_meets_select_recv_on_a_rendezvous_channel() {
    with_deadline(|| {
        let sched = started(2);
        for kind in 0..2 {
            let (ok_tx, ok_rx) = std::sync::mpsc::channel::<&'static str>();
            let ok = ok_tx.clone();
            let (a, b) = if kind == 0 {
                let (tx, rx) = mpsc::sync_channel::<u32>(0);
                let a = sched.spawn(move || {
                    fibra::select! {
                        send(tx, 1) -> r => if r.is_err() { let _ = ok.send("send side: receiver gone after 10 s"); },
                        default(Duration::from_secs(10)) => { let _ = ok.send("send side timed out"); },
                    }
                });
                let ok = ok_tx.clone();
                let b = sched.spawn(move || {
                    fibra::select! {
                        recv(rx) -> r => assert_eq!(r.unwrap(), 1),
                        default(Duration::from_secs(10)) => { let _ = ok.send("recv side timed out"); },
                    }
                });
                (a, b)
            } else {
                let (tx, rx) = mpmc::sync_channel::<u32>(0);
                let a = sched.spawn(move || {
                    fibra::select! {
                        send(tx, 1) -> r => if r.is_err() { let _ = ok.send("mpmc send side: receiver gone after 10 s"); },
                        default(Duration::from_secs(10)) => { let _ = ok.send("mpmc send side timed out"); },
                    }
                });
                let ok = ok_tx.clone();
                let b = sched.spawn(move || {
                    fibra::select! {
                        recv(rx) -> r => assert_eq!(r.unwrap(), 1),
                        default(Duration::from_secs(10)) => { let _ = ok.send("mpmc recv side timed out"); },
                    }
                });
                (a, b)
            };
            finish(a);
            finish(b);
            drop(ok_tx);
            let failures: Vec<_> = ok_rx.iter().collect();
            assert!(failures.is_empty(), "kind {kind}: {failures:?}");
        }
        sched.stop();
    });
}

/// Two selects, each offering to send on the other's rendezvous channel and to receive on
/// its own: one exchange must happen.
#[test]
fn two_selects_sending_to_each_others_rendezvous_channels() {
    with_deadline(|| {
        let sched = started(2);
        let (to_b, b_rx) = mpsc::sync_channel::<&'static str>(0);
        let (to_a, a_rx) = mpsc::sync_channel::<&'static str>(0);
        let a = sched.spawn(move || {
            fibra::select! {
                send(to_b, "from a") -> r => if r.is_ok() { "a sent" } else { "a: b gone" },
                recv(a_rx) -> m => { m.unwrap(); "a received" },
                default(Duration::from_secs(10)) => "a timed out",
            }
        });
        let b = sched.spawn(move || {
            fibra::select! {
                send(to_a, "from b") -> r => if r.is_ok() { "b sent" } else { "b: a gone" },
                recv(b_rx) -> m => { m.unwrap(); "b received" },
                default(Duration::from_secs(10)) => "b timed out",
            }
        });
        let (ra, rb) = (finish(a), finish(b));
        assert!(
            (ra == "a sent" && rb == "b received") || (ra == "a received" && rb == "b sent"),
            "{ra}, {rb}"
        );
        sched.stop();
    });
}

struct PanicOnDrop(u32);
impl Drop for PanicOnDrop {
    fn drop(&mut self) {
        if !std::thread::panicking() {
            panic!("PanicOnDrop({})", self.0);
        }
    }
}

/// A send's message is made only when that send can complete or is offered: a select that
/// completes another operation at once never makes it. A waiting select that offered it on
/// a rendezvous channel and then completes another operation drops it, and that drop's
/// panic reaches the select's caller; the channels stay usable and no watcher is left
/// behind (a later select still wakes).
#[test]
fn a_panicking_drop_of_an_unselected_message() {
    with_deadline(|| {
        let sched = started(2);
        let (ready_tx, ready_rx) = mpsc::channel::<u32>();
        let (full_tx, full_rx) = mpsc::sync_channel::<PanicOnDrop>(0);
        let (later_tx, later_rx) = mpsc::channel::<(u32, mpsc::Sender<u32>)>();
        let h = sched.spawn(move || {
            ready_tx.send(1).unwrap();
            // The receive is ready and nobody waits on the rendezvous channel: the send's
            // message is never made.
            let r = fibra::select! {
                recv(ready_rx) -> m => m.unwrap(),
                send(full_tx, PanicOnDrop(7)) -> _ => 2,
            };
            assert_eq!(r, 1);
            // Nothing ready: the select offers the send (making the message), then the
            // receive completes; the withdrawn message panics as it is dropped.
            later_tx.send((0, ready_tx.clone())).unwrap();
            let r = catch_unwind(AssertUnwindSafe(|| {
                fibra::select! {
                    recv(ready_rx) -> m => m.unwrap(),
                    send(full_tx, PanicOnDrop(6)) -> _ => 2,
                }
            }));
            assert!(
                r.is_err(),
                "the withdrawn message panicked as it was dropped"
            );
            // A waiting select on the same channels still wakes.
            let r = fibra::select! {
                recv(ready_rx) -> m => m.unwrap(),
                send(full_tx, PanicOnDrop(8)) -> r => { std::mem::forget(r); 99 },
            };
            (r, ready_tx)
        });
        // Once the second select waits, its receive gets a message.
        let (_, tx) = later_rx.recv_timeout(LIMIT).unwrap();
        std::thread::sleep(Duration::from_millis(20));
        tx.send(5).unwrap();
        std::thread::sleep(Duration::from_millis(20));
        // Take the rendezvous send: the third select completes with 99.
        let m = full_rx.recv_timeout(LIMIT).unwrap();
        std::mem::forget(m);
        let (r, _tx) = finish(h);
        assert_eq!(r, 99);
        // A receiver dropped with a buffered message that panics on drop.
        let (tx, rx) = mpmc::channel::<PanicOnDrop>();
        tx.send(PanicOnDrop(1)).unwrap();
        let r = catch_unwind(AssertUnwindSafe(move || drop(rx)));
        assert!(r.is_err());
        sched.stop();
    });
}

#[test]
fn a_select_in_a_fiber_and_one_on_a_thread_on_the_same_token() {
    with_deadline(|| {
        let sched = started(2);
        let token = CancellationToken::new();
        let t = token.clone();
        let f = sched.spawn(move || {
            fibra::select! {
                recv(t) -> r => r.is_ok(),
                recv(t) -> r => r.is_ok(),
            }
        });
        let t = token.clone();
        let th = std::thread::spawn(move || {
            fibra::select! {
                recv(t) -> r => r.is_ok(),
            }
        });
        std::thread::sleep(Duration::from_millis(20));
        token.cancel();
        assert!(finish(f));
        assert!(th.join().unwrap());
        sched.stop();
    });
}

// ---------------------------------------------------------------- scope

#[test]
fn scope_children_spawn_grandchildren_and_nested_scopes() {
    with_deadline(|| {
        let sched = started(2);
        let total = sched.block_on(|| {
            let counter = AtomicUsize::new(0);
            fibra::scope(|s| {
                for _ in 0..8 {
                    s.spawn(|| {
                        for _ in 0..8 {
                            s.spawn(|| {
                                counter.fetch_add(1, Ordering::SeqCst);
                                fibra::scope(|inner| {
                                    for _ in 0..3 {
                                        inner.spawn(|| {
                                            fibra::Fiber::yield_now();
                                            counter.fetch_add(1, Ordering::SeqCst);
                                        });
                                    }
                                });
                            });
                        }
                    });
                }
            });
            counter.load(Ordering::SeqCst)
        });
        assert_eq!(total, 8 * 8 * 4);
        sched.stop();
    });
}

#[test]
fn scope_with_a_cancelled_child() {
    with_deadline(|| {
        let sched = started(2);
        let (running, cancelled_unstarted, ok) = sched.block_on(|| {
            let data = [1, 2, 3];
            fibra::scope(|s| {
                let sleeper = s.spawn(|| {
                    fibra::sleep(HOUR);
                    data.len()
                });
                let fine = s.spawn(|| data.iter().sum::<i32>());
                fibra::sleep(Duration::from_millis(10));
                sleeper.cancel();
                sleeper.cancel();
                // Cancelled right after spawning: perhaps before it started.
                let early = s.spawn(|| data[0]);
                early.cancel();
                (
                    sleeper.join().unwrap_err().is_cancelled(),
                    early.join().map_or_else(|e| e.is_cancelled(), |v| v == 1),
                    fine.join().unwrap() == 6,
                )
            })
        });
        assert!(running && cancelled_unstarted && ok);
        // A child that cancels itself, through a handle it was sent.
        let ok = sched.block_on(|| {
            fibra::scope(|s| {
                let (tx, rx) = mpsc::channel::<Arc<fibra::ScopedJoinHandle<'_, ()>>>();
                let h = Arc::new(s.spawn(move || {
                    let me = rx.recv().unwrap();
                    me.cancel();
                    fibra::sleep(HOUR);
                }));
                tx.send(h.clone()).unwrap();
                // Wait until the child has dropped its clone.
                while Arc::strong_count(&h) > 1 {
                    fibra::sleep(Duration::from_millis(1));
                }
                Arc::try_unwrap(h)
                    .ok()
                    .unwrap()
                    .join()
                    .unwrap_err()
                    .is_cancelled()
            })
        });
        assert!(ok);
        sched.stop();
    });
}

/// One worker: the scope body busy-loops with `consume_budget` until its children ran.
#[test]
fn scope_on_one_worker_with_a_busy_body() {
    with_deadline(|| {
        let sched = started(1);
        let n = sched.block_on(|| {
            let done = AtomicUsize::new(0);
            fibra::scope(|s| {
                for _ in 0..10 {
                    s.spawn(|| {
                        fibra::Fiber::yield_now();
                        done.fetch_add(1, Ordering::SeqCst);
                    });
                }
                let deadline = Instant::now() + LIMIT;
                while done.load(Ordering::SeqCst) < 10 {
                    assert!(Instant::now() < deadline, "children starved");
                    fibra::coop::consume_budget();
                }
            });
            done.load(Ordering::SeqCst)
        });
        assert_eq!(n, 10);
        sched.stop();
    });
}

/// A scope whose body panics while a child panics too, and whose children are stopped by
/// `stop_timeout` while the scope waits.
#[test]
fn scope_under_stop_timeout() {
    with_deadline(|| {
        let sched = started(2);
        let ended = Arc::new(AtomicUsize::new(0));
        let e = ended.clone();
        let h = sched.spawn(move || {
            let local = vec![0u8; 16];
            fibra::scope(|s| {
                for _ in 0..4 {
                    s.spawn(|| {
                        struct Bump<'a>(&'a Arc<AtomicUsize>, &'a [u8]);
                        impl Drop for Bump<'_> {
                            fn drop(&mut self) {
                                assert_eq!(self.1.len(), 16);
                                self.0.fetch_add(1, Ordering::SeqCst);
                            }
                        }
                        let _b = Bump(&e, &local);
                        fibra::sleep(HOUR);
                    });
                }
                fibra::sleep(HOUR);
            });
        });
        std::thread::sleep(Duration::from_millis(20));
        sched.stop_timeout(Duration::from_millis(10));
        assert!(is_cancelled(h));
        assert_eq!(ended.load(Ordering::SeqCst), 4);
    });
}

// ---------------------------------------------------------------- JoinSet

/// The set is handed to one of its own tasks, which drops it (cancelling itself).
#[test]
fn join_set_dropped_from_inside_its_own_task() {
    with_deadline(|| {
        let sched = started(2);
        let (tx, rx) = mpsc::channel::<JoinSet<u32>>();
        let rx = Arc::new(std::sync::Mutex::new(Some(rx)));
        let reached = Arc::new(AtomicBool::new(false));
        let r = reached.clone();
        let dropped = sched.block_on(move || {
            let mut set = JoinSet::new();
            let rx2 = rx.clone();
            set.spawn(move || {
                let rx = rx2.lock().unwrap().take().unwrap();
                let set = rx.recv().unwrap();
                assert_eq!(set.len(), 5);
                drop(set); // cancels us too
                fibra::sleep(Duration::from_millis(50));
                r.store(true, Ordering::SeqCst);
                1
            });
            for _ in 0..4 {
                set.spawn(|| {
                    fibra::sleep(HOUR);
                    2
                });
            }
            tx.send(set).unwrap();
            true
        });
        assert!(dropped);
        // Every task ends (cancelled) so stop returns.
        let t = Instant::now();
        sched.stop();
        assert!(t.elapsed() < LIMIT);
        assert!(!reached.load(Ordering::SeqCst), "the self-cancel was lost");
    });
}

/// Two fibers share a set through a Mutex and both call join_next.
#[test]
fn join_next_from_two_fibers_through_a_mutex() {
    with_deadline(|| {
        let sched = started(2);
        let set = Arc::new(Mutex::new(JoinSet::new()));
        {
            let mut g = set.lock().unwrap();
            for i in 0..200u64 {
                g.spawn_on(&sched, move || {
                    if i % 3 == 0 {
                        fibra::sleep(Duration::from_micros(100));
                    }
                    i
                });
            }
        }
        let joiner = |set: Arc<Mutex<JoinSet<u64>>>| {
            move || {
                let mut sum = 0;
                let mut n = 0;
                loop {
                    let r = set.lock().unwrap().join_next();
                    match r {
                        Some(r) => {
                            sum += r.unwrap();
                            n += 1;
                        }
                        None => return (sum, n),
                    }
                }
            }
        };
        let a = sched.spawn(joiner(set.clone()));
        let b = sched.spawn(joiner(set.clone()));
        let c = std::thread::spawn(joiner(set.clone()));
        let (sa, na) = finish(a);
        let (sb, nb) = finish(b);
        let (sc, nc) = c.join().unwrap();
        assert_eq!(na + nb + nc, 200);
        assert_eq!(sa + sb + sc, 199 * 200 / 2);
        sched.stop();
    });
}

/// A fiber cancelled while it waits in join_next, while a task finishes at the same time:
/// the wake-up is passed on to the other waiter (a thread) — no result lost.
#[test]
fn cancelled_join_next_waiter_passes_the_wakeup_on() {
    with_deadline(|| {
        let sched = started(2);
        for i in 0..200 {
            let set = Arc::new(std::sync::Mutex::new(JoinSet::<u32>::new()));
            let (go_tx, go_rx) = mpmc::channel::<()>();
            set.lock().unwrap().spawn_on(&sched, move || {
                let _ = go_rx.recv();
                i
            });
            // Waiters need &mut: give a raw-pointer-free share by taking the set out.
            let mut owned = std::mem::take(&mut *set.lock().unwrap());
            let h = sched.spawn(move || {
                let r = owned.join_next();
                (r.map(|r| r.unwrap()), owned)
            });
            std::thread::sleep(Duration::from_micros(50 * u64::from(i % 5)));
            go_tx.send(()).unwrap();
            h.cancel();
            assert!(h.wait_timeout(LIMIT), "round {i} hung");
            match h.join() {
                Ok((v, _)) => assert_eq!(v, Some(i)),
                Err(e) => assert!(e.is_cancelled()),
            }
        }
        sched.stop();
    });
}

#[test]
fn join_set_cancel_all_races_completions_and_drop() {
    with_deadline(|| {
        let sched = started(2);
        for round in 0..50 {
            let mut set = JoinSet::new();
            for i in 0..50u32 {
                set.spawn_on(&sched, move || {
                    if i % 2 == 0 {
                        fibra::Fiber::yield_now();
                    }
                    i
                });
            }
            if round % 2 == 0 {
                set.cancel_all();
                let all = set.join_all();
                assert_eq!(all.len(), 50);
                for r in all {
                    if let Err(e) = r {
                        assert!(e.is_cancelled());
                    }
                }
            } else {
                let _ = set.try_join_next();
                drop(set);
            }
        }
        sched.stop();
    });
}

// ---------------------------------------------------------------- coop

#[test]
fn unconstrained_nested_with_panics_restores() {
    with_deadline(|| {
        let sched = started(1);
        sched.block_on(|| {
            for _ in 0..3 {
                let r = catch_unwind(AssertUnwindSafe(|| {
                    fibra::coop::unconstrained(|| {
                        let r = catch_unwind(AssertUnwindSafe(|| {
                            fibra::coop::unconstrained(|| {
                                fibra::coop::unconstrained(|| panic!("inner"));
                            })
                        }));
                        assert!(r.is_err());
                        for _ in 0..1000 {
                            fibra::coop::consume_budget();
                            assert!(fibra::coop::has_budget_remaining());
                        }
                        panic!("outer");
                    })
                }));
                assert!(r.is_err());
                // Constrained again: the budget runs out and yields.
                let mut saw_empty = false;
                for _ in 0..2 * fibra::coop::BUDGET {
                    if !fibra::coop::has_budget_remaining() {
                        saw_empty = true;
                    }
                    fibra::coop::consume_budget();
                }
                assert!(saw_empty, "still unconstrained after a panic");
            }
        });
        sched.stop();
    });
}

/// A cancelled fiber's destructor burns through its budget (yielding) and waits.
#[test]
fn budget_exhaustion_inside_drop_during_cancellation() {
    with_deadline(|| {
        let sched = started(1);
        let finished_drop = Arc::new(AtomicBool::new(false));
        let (tx, rx) = mpsc::channel::<u32>();
        struct Heavy(Arc<AtomicBool>, Option<mpsc::Receiver<u32>>);
        impl Drop for Heavy {
            fn drop(&mut self) {
                for _ in 0..10 * fibra::coop::BUDGET {
                    fibra::coop::consume_budget();
                }
                let rx = self.1.take().unwrap();
                for _ in 0..1000 {
                    let _ = rx.try_recv();
                }
                // A real wait, after the one cancellation.
                assert_eq!(rx.recv_timeout(LIMIT).unwrap(), 42);
                fibra::coop::unconstrained(|| {
                    for _ in 0..1000 {
                        fibra::coop::consume_budget();
                    }
                });
                self.0.store(true, Ordering::SeqCst);
            }
        }
        let f = finished_drop.clone();
        let h = sched.spawn(move || {
            let _h = Heavy(f, Some(rx));
            fibra::sleep(HOUR);
        });
        // A fiber on the same (only) worker that must still get to run.
        let other = sched.spawn(move || {
            fibra::sleep(Duration::from_millis(50));
            tx.send(42).unwrap();
        });
        std::thread::sleep(Duration::from_millis(10));
        h.cancel();
        assert!(is_cancelled(h));
        assert!(finished_drop.load(Ordering::SeqCst));
        finish(other);
        sched.stop();
    });
}

// ---------------------------------------------------------------- CancellationToken

#[test]
fn token_chain_ten_thousand_deep() {
    with_deadline(|| {
        // Kept alive: cancel walks all of them.
        let root = CancellationToken::new();
        let mut chain = vec![root.clone()];
        for _ in 0..10_000 {
            let c = chain.last().unwrap().child_token();
            chain.push(c);
        }
        root.cancel();
        assert!(chain.iter().all(|t| t.is_cancelled()));
        drop(chain);
        // Only the leaf kept: it keeps the middle tokens alive, so the root's cancellation
        // reaches it (as tokio's does); dropping it must not recurse.
        let root = CancellationToken::new();
        let mut t = root.clone();
        for _ in 0..100_000 {
            t = t.child_token();
        }
        root.cancel();
        assert!(t.is_cancelled(), "the leaf missed the root's cancellation");
        drop(t);
        // The same chain dropped from the leaf before any cancellation, and on a thread
        // with a small stack: the ancestors are released one after another.
        let root = CancellationToken::new();
        let mut t = root.clone();
        for _ in 0..100_000 {
            t = t.child_token();
        }
        std::thread::Builder::new()
            .stack_size(64 * 1024)
            .spawn(move || drop(t))
            .unwrap()
            .join()
            .unwrap();
        root.cancel();
        // A deep chain dropped from the leaf side with everything alive.
        let root = CancellationToken::new();
        let mut chain = vec![root.clone()];
        for _ in 0..100_000 {
            let c = chain.last().unwrap().child_token();
            chain.push(c);
        }
        while chain.pop().is_some() {}
        root.cancel();
        // A child of a cancelled token is born cancelled.
        assert!(root.child_token().child_token().is_cancelled());
        // Cancelling a deep chain from a fiber with a small stack.
        let sched = Scheduler::builder()
            .threads(1)
            .stack_size(fibra::MIN_STACK_SIZE)
            .build()
            .unwrap();
        let root = CancellationToken::new();
        let mut chain = vec![root.clone()];
        for _ in 0..50_000 {
            let c = chain.last().unwrap().child_token();
            chain.push(c);
        }
        let leaf = chain.last().unwrap().clone();
        sched.block_on(move || root.cancel());
        assert!(leaf.is_cancelled());
        sched.stop();
    });
}

/// A waiter, woken by the cancellation, cancels other tokens that have waiters, including
/// its parent and the token it just waited on; and a fiber cancels the token it then waits on.
#[test]
fn cancel_from_inside_a_waiters_fiber() {
    with_deadline(|| {
        let sched = started(2);
        let root = CancellationToken::new();
        let other = CancellationToken::new();
        let child = root.child_token();
        let mut hs = Vec::new();
        for k in 0..20 {
            let (root, other, child) = (root.clone(), other.clone(), child.clone());
            hs.push(sched.spawn(move || {
                if k == 0 {
                    child.cancelled();
                    child.cancel();
                    root.cancel();
                    other.cancel();
                } else if k % 2 == 0 {
                    fibra::select! {
                        recv(other) -> _ => (),
                        recv(child) -> _ => { root.cancel(); other.cancel(); },
                    }
                } else {
                    other.cancelled();
                    other.cancel();
                }
                assert!(other.is_cancelled());
            }));
        }
        std::thread::sleep(Duration::from_millis(20));
        let waiters_token = CancellationToken::new();
        let w = waiters_token.clone();
        hs.push(sched.spawn(move || {
            w.cancel();
            w.cancelled();
            fibra::select! { recv(w) -> r => r.unwrap() }
        }));
        child.cancel();
        for h in hs {
            finish(h);
        }
        assert!(root.is_cancelled());
        sched.stop();
    });
}

/// `cancelled_timeout` racing `cancel` from many threads.
#[test]
fn token_cancel_races_waiters() {
    with_deadline(|| {
        let sched = started(2);
        for _ in 0..300 {
            let t = CancellationToken::new();
            let mut hs = Vec::new();
            for k in 0..4 {
                let t = t.child_token();
                hs.push(sched.spawn(move || {
                    if k % 2 == 0 {
                        t.cancelled_timeout(LIMIT)
                    } else {
                        fibra::select! { recv(t) -> r => r.is_ok(), default(LIMIT) => false }
                    }
                }));
            }
            let threads: Vec<_> = (0..2)
                .map(|_| {
                    let t = t.clone();
                    std::thread::spawn(move || t.cancel())
                })
                .collect();
            for th in threads {
                th.join().unwrap();
            }
            for h in hs {
                assert!(finish(h));
            }
        }
        sched.stop();
    });
}

/// A select blocked sending on a full channel is cancelled: its message was never made (a
/// send's message is made only when that send can complete), and the channel's room later
/// goes to others.
#[test]
fn cancelled_select_send_drops_its_message_once() {
    with_deadline(|| {
        let sched = started(2);
        let dropped = Arc::new(AtomicUsize::new(0));
        let (tx, rx) = mpmc::sync_channel::<Counted>(1);
        tx.send(Counted(dropped.clone())).unwrap();
        let mut hs = Vec::new();
        for _ in 0..50 {
            let (tx, d) = (tx.clone(), dropped.clone());
            hs.push(sched.spawn(move || {
                fibra::select! { send(tx, Counted(d)) -> r => r.is_ok() }
            }));
        }
        std::thread::sleep(Duration::from_millis(20));
        for h in &hs {
            h.cancel();
        }
        let mut sent = 0;
        for h in hs {
            assert!(h.wait_timeout(LIMIT));
            if h.join().is_ok() {
                sent += 1;
            }
        }
        assert_eq!(sent, 0, "nobody made room");
        assert_eq!(dropped.load(Ordering::SeqCst), 0, "no message was made");
        drop(rx.recv().unwrap());
        tx.send(Counted(dropped.clone())).unwrap();
        drop(rx);
        drop(tx);
        assert_eq!(dropped.load(Ordering::SeqCst), 2);
        sched.stop();
    });
}
