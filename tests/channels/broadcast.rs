//! `fibra::sync::broadcast`: tokio's broadcast channel between fibers and threads — every
//! receiver sees every message in order, a receiver that falls behind is told exactly how
//! much it missed, closing wakes waiting receivers after they drained, and a slow or
//! vanishing receiver never holds the senders back.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use crate::common::{finish, started, wait_until, with_deadline, LIMIT};
use fibra::sync::broadcast::{self, RecvError, RecvTimeoutError, SendError, TryRecvError};

fn assert_send_sync<T: Send + Sync>() {}

/// Receives until the channel closes; a lag fails the test.
fn drain(mut rx: broadcast::Receiver<u64>) -> Vec<u64> {
    let mut got = Vec::new();
    loop {
        match rx.recv() {
            Ok(v) => got.push(v),
            Err(RecvError::Closed) => return got,
            Err(RecvError::Lagged(n)) => panic!("lagged by {n}"),
        }
    }
}

#[test]
fn handles_are_send_and_sync() {
    assert_send_sync::<broadcast::Sender<String>>();
    assert_send_sync::<broadcast::Receiver<String>>();
}

#[test]
fn every_fiber_and_thread_receiver_sees_every_message_in_order() {
    with_deadline(|| {
        const N: u64 = 1_000;
        let sched = started(2);
        let (tx, rx) = broadcast::channel::<u64>(1_024);
        let fibers: Vec<_> = std::iter::once(rx)
            .chain((0..5).map(|_| tx.subscribe()))
            .map(|rx| sched.submit(move || drain(rx), None).expect("submit"))
            .collect();
        let threads: Vec<_> = (0..2)
            .map(|_| {
                let rx = tx.subscribe();
                thread::spawn(move || drain(rx))
            })
            .collect();
        assert_eq!(tx.receiver_count(), 8);
        let tx2 = tx.clone();
        let sender = sched
            .submit(
                move || {
                    for i in 0..N {
                        assert_eq!(tx2.send(i), Ok(8));
                    }
                },
                None,
            )
            .expect("submit");
        finish(sender);
        drop(tx);
        let want: Vec<u64> = (0..N).collect();
        for f in fibers {
            assert_eq!(finish(f), want);
        }
        for t in threads {
            assert_eq!(t.join().expect("receiver thread"), want);
        }
        sched.stop();
    });
}

#[test]
fn a_lagging_receiver_is_told_exactly_how_much_it_missed() {
    let (tx, mut rx) = broadcast::channel::<u32>(4);
    let mut fast = tx.subscribe();
    for i in 0..10 {
        // A slow receiver never blocks the sender.
        assert_eq!(tx.send(i), Ok(2));
        assert_eq!(fast.try_recv(), Ok(i));
    }
    assert_eq!(rx.recv(), Err(RecvError::Lagged(6)));
    assert_eq!(rx.recv(), Ok(6), "the oldest retained message comes next");
    for i in 10..13 {
        tx.send(i).unwrap();
    }
    // Retained now: 9..13; the receiver is at 7.
    assert_eq!(rx.try_recv(), Err(TryRecvError::Lagged(2)));
    assert_eq!(rx.try_recv(), Ok(9));
    for i in 13..20 {
        tx.send(i).unwrap();
    }
    assert_eq!(
        rx.recv_timeout(Duration::ZERO),
        Err(RecvTimeoutError::Lagged(6))
    );
    let rest: Vec<u32> = std::iter::from_fn(|| rx.try_recv().ok()).collect();
    assert_eq!(rest, [16, 17, 18, 19]);
    assert_eq!(rx.try_recv(), Err(TryRecvError::Empty));
    // Lagged comes before Closed: what is retained is still delivered after a close.
    for i in 20..30 {
        tx.send(i).unwrap();
    }
    drop(tx);
    assert_eq!(rx.recv(), Err(RecvError::Lagged(6)));
    assert_eq!(rx.recv(), Ok(26));
}

#[test]
fn a_lagging_fiber_receiver_sees_an_increasing_sequence_and_the_counts_add_up() {
    with_deadline(|| {
        const N: u64 = 20_000;
        let sched = started(2);
        let (tx, rx) = broadcast::channel::<u64>(8);
        let receivers: Vec<_> = std::iter::once(rx)
            .chain((0..3).map(|_| tx.subscribe()))
            .map(|mut rx| {
                sched
                    .submit(
                        move || {
                            let (mut seen, mut missed, mut last) = (0u64, 0u64, None);
                            loop {
                                match rx.recv() {
                                    Ok(v) => {
                                        assert!(last < Some(v), "in order");
                                        last = Some(v);
                                        seen += 1;
                                    }
                                    Err(RecvError::Lagged(n)) => missed += n,
                                    Err(RecvError::Closed) => return (seen, missed, last),
                                }
                            }
                        },
                        None,
                    )
                    .expect("submit")
            })
            .collect();
        for i in 0..N {
            tx.send(i).unwrap();
        }
        drop(tx);
        for r in receivers {
            let (seen, missed, last) = finish(r);
            assert_eq!(seen + missed, N, "every message seen or counted as missed");
            assert_eq!(last, Some(N - 1), "the last message is always retained");
        }
        sched.stop();
    });
}

#[test]
fn closed_only_after_everything_was_received() {
    let (tx, mut rx) = broadcast::channel::<&str>(8);
    let tx2 = tx.clone();
    tx.send("a").unwrap();
    tx2.send("b").unwrap();
    drop(tx);
    tx2.send("c").unwrap();
    drop(tx2);
    assert_eq!(rx.recv(), Ok("a"));
    assert_eq!(rx.try_recv(), Ok("b"));
    assert_eq!(rx.recv_timeout(Duration::MAX), Ok("c"));
    assert_eq!(rx.recv(), Err(RecvError::Closed));
    assert_eq!(rx.try_recv(), Err(TryRecvError::Closed));
    assert_eq!(
        rx.recv_timeout(Duration::ZERO),
        Err(RecvTimeoutError::Closed)
    );
    assert_eq!(rx.recv(), Err(RecvError::Closed), "closed stays closed");
}

#[test]
fn a_subscriber_sees_only_what_is_sent_after_it_subscribed() {
    let (tx, mut rx) = broadcast::channel::<u32>(8);
    tx.send(1).unwrap();
    tx.send(2).unwrap();
    let mut late = tx.subscribe();
    assert_eq!(tx.receiver_count(), 2);
    assert_eq!(late.try_recv(), Err(TryRecvError::Empty));
    assert_eq!(tx.send(3), Ok(2));
    assert_eq!(late.recv(), Ok(3));
    assert_eq!(late.try_recv(), Err(TryRecvError::Empty));
    assert_eq!([rx.recv(), rx.recv(), rx.recv()], [Ok(1), Ok(2), Ok(3)]);
    // A subscriber made by a cloned sender joins the same channel.
    let tx2 = tx.clone();
    let mut third = tx2.subscribe();
    tx.send(4).unwrap();
    assert_eq!(third.recv(), Ok(4));
    assert_eq!(late.recv(), Ok(4));
    drop(late);
    assert_eq!(tx.receiver_count(), 2);
}

#[test]
fn five_hundred_fiber_receivers_and_one_sender() {
    with_deadline(|| {
        const N: u64 = 200;
        let sched = started(2);
        let (tx, rx) = broadcast::channel::<u64>(256);
        let waiting = Arc::new(AtomicUsize::new(0));
        let receivers: Vec<_> = std::iter::once(rx)
            .chain((0..499).map(|_| tx.subscribe()))
            .map(|mut rx| {
                let waiting = waiting.clone();
                sched
                    .submit(
                        move || {
                            waiting.fetch_add(1, Ordering::SeqCst);
                            let mut sum = 0;
                            let mut count = 0;
                            while let Ok(v) = rx.recv() {
                                sum += v;
                                count += 1;
                            }
                            (count, sum)
                        },
                        None,
                    )
                    .expect("submit")
            })
            .collect();
        wait_until("receivers started", || {
            waiting.load(Ordering::SeqCst) == 500
        });
        for i in 0..N {
            assert_eq!(tx.send(i), Ok(500));
            if i % 20 == 0 {
                thread::sleep(Duration::from_millis(1));
            }
        }
        drop(tx);
        for r in receivers {
            assert_eq!(finish(r), (N, N * (N - 1) / 2));
        }
        sched.stop();
    });
}

#[test]
fn receivers_dropped_while_the_sender_sends() {
    with_deadline(|| {
        let sched = started(2);
        let (tx, rx) = broadcast::channel::<Arc<u64>>(16);
        let receivers: Vec<_> = std::iter::once(rx)
            .chain((0..19).map(|_| tx.subscribe()))
            .enumerate()
            .map(|(k, mut rx)| {
                sched
                    .submit(
                        move || {
                            // Receiver k leaves after k * 50 messages (or a lag).
                            let mut got = 0;
                            while got < k * 50 {
                                match rx.recv() {
                                    Ok(_) => got += 1,
                                    Err(RecvError::Lagged(n)) => got += n as usize,
                                    Err(RecvError::Closed) => break,
                                }
                            }
                        },
                        None,
                    )
                    .expect("submit")
            })
            .collect();
        let token = Arc::new(0u64);
        let mut last_count = usize::MAX;
        let start = Instant::now();
        let mut sent = 0;
        loop {
            match tx.send(token.clone()) {
                Ok(n) => {
                    assert!(n <= last_count, "receivers only leave");
                    last_count = n;
                    sent += 1;
                }
                Err(SendError(back)) => {
                    assert!(Arc::ptr_eq(&back, &token), "the value comes back");
                    break;
                }
            }
            assert!(start.elapsed() < LIMIT, "receivers never all left");
            if sent % 64 == 0 {
                thread::sleep(Duration::from_millis(1));
            }
        }
        for r in receivers {
            finish(r);
        }
        assert_eq!(tx.receiver_count(), 0);
        // Every copy of the message has been dropped: the ring keeps no value that no
        // receiver will read.
        assert_eq!(Arc::strong_count(&token), 1);
        sched.stop();
    });
}

#[test]
fn a_message_is_dropped_once_every_receiver_has_seen_it() {
    let (tx, mut a) = broadcast::channel::<Arc<()>>(8);
    let mut b = tx.subscribe();
    let token = Arc::new(());
    tx.send(token.clone()).unwrap();
    assert_eq!(Arc::strong_count(&token), 2, "the ring holds one copy");
    let from_a = a.recv().unwrap();
    assert_eq!(Arc::strong_count(&token), 3);
    let from_b = b.recv().unwrap();
    drop((from_a, from_b));
    assert_eq!(
        Arc::strong_count(&token),
        1,
        "seen by all: dropped from the ring"
    );
    tx.send(token.clone()).unwrap();
    drop(a.recv().unwrap());
    assert_eq!(Arc::strong_count(&token), 2, "b has not seen it yet");
    drop(b);
    assert_eq!(Arc::strong_count(&token), 1, "b left: nobody needs it");
    // Overwritten messages are dropped too.
    for _ in 0..20 {
        tx.send(token.clone()).unwrap();
    }
    assert_eq!(Arc::strong_count(&token), 9);
    drop(a);
    assert_eq!(Arc::strong_count(&token), 1);
    assert_eq!(tx.send(token.clone()).map_err(|e| e.0), Err(token.clone()));
}

#[test]
fn closing_wakes_waiting_fiber_and_thread_receivers() {
    with_deadline(|| {
        let sched = started(2);
        let (tx, rx) = broadcast::channel::<u8>(4);
        let tx2 = tx.clone();
        let waiting = Arc::new(AtomicUsize::new(0));
        let fibers: Vec<_> = std::iter::once(rx)
            .chain((0..4).map(|_| tx.subscribe()))
            .map(|mut rx| {
                let waiting = waiting.clone();
                sched
                    .submit(
                        move || {
                            waiting.fetch_add(1, Ordering::SeqCst);
                            (rx.recv(), rx.try_recv())
                        },
                        None,
                    )
                    .expect("submit")
            })
            .collect();
        let threads: Vec<_> = (0..2)
            .map(|_| {
                let (mut rx, waiting) = (tx.subscribe(), waiting.clone());
                thread::spawn(move || {
                    waiting.fetch_add(1, Ordering::SeqCst);
                    rx.recv_timeout(Duration::MAX)
                })
            })
            .collect();
        wait_until("receivers waiting", || waiting.load(Ordering::SeqCst) == 7);
        thread::sleep(Duration::from_millis(20));
        drop(tx);
        thread::sleep(Duration::from_millis(20));
        assert!(
            fibers.iter().all(|f| !f.is_finished()),
            "one sender is still alive"
        );
        drop(tx2);
        for f in fibers {
            assert_eq!(
                finish(f),
                (Err(RecvError::Closed), Err(TryRecvError::Closed))
            );
        }
        for t in threads {
            assert_eq!(t.join().unwrap(), Err(RecvTimeoutError::Closed));
        }
        sched.stop();
    });
}

#[test]
fn a_send_wakes_every_waiting_receiver() {
    with_deadline(|| {
        let sched = started(2);
        let (tx, rx) = broadcast::channel::<u8>(1);
        let waiting = Arc::new(AtomicUsize::new(0));
        let fibers: Vec<_> = std::iter::once(rx)
            .chain((0..9).map(|_| tx.subscribe()))
            .map(|mut rx| {
                let waiting = waiting.clone();
                sched
                    .submit(
                        move || {
                            waiting.fetch_add(1, Ordering::SeqCst);
                            rx.recv_timeout(LIMIT)
                        },
                        None,
                    )
                    .expect("submit")
            })
            .collect();
        let mut thread_rx = tx.subscribe();
        let thread = thread::spawn(move || thread_rx.recv());
        wait_until("receivers waiting", || waiting.load(Ordering::SeqCst) == 10);
        thread::sleep(Duration::from_millis(20));
        assert_eq!(tx.send(7), Ok(11));
        for f in fibers {
            assert_eq!(finish(f), Ok(7));
        }
        assert_eq!(thread.join().unwrap(), Ok(7));
        sched.stop();
    });
}

#[test]
fn recv_timeouts_are_never_early_and_zero_and_max_work() {
    with_deadline(|| {
        let sched = started(1);
        let timeout = Duration::from_millis(30);
        let check = move || {
            let (tx, mut rx) = broadcast::channel::<u8>(2);
            let start = Instant::now();
            assert_eq!(rx.recv_timeout(timeout), Err(RecvTimeoutError::Timeout));
            let waited = start.elapsed();
            assert!(waited >= timeout, "woke early: {waited:?}");
            assert!(waited < LIMIT);
            assert_eq!(
                rx.recv_timeout(Duration::ZERO),
                Err(RecvTimeoutError::Timeout)
            );
            tx.send(3).unwrap();
            assert_eq!(rx.recv_timeout(Duration::ZERO), Ok(3));
            tx.send(4).unwrap();
            assert_eq!(rx.recv_timeout(Duration::MAX), Ok(4));
            drop(tx);
            assert_eq!(rx.recv_timeout(timeout), Err(RecvTimeoutError::Closed));
        };
        finish(sched.submit(check, None).expect("submit"));
        check();
        sched.stop();
    });
}

#[test]
fn a_timed_waiter_receives_what_is_sent_meanwhile() {
    with_deadline(|| {
        let sched = started(2);
        let (tx, mut rx) = broadcast::channel::<u32>(4);
        let receiver = sched
            .submit(move || rx.recv_timeout(LIMIT), None)
            .expect("submit");
        thread::sleep(Duration::from_millis(10));
        tx.send(9).unwrap();
        assert_eq!(finish(receiver), Ok(9));
        sched.stop();
    });
}

#[test]
#[should_panic(expected = "capacity")]
fn capacity_zero_panics() {
    let _ = broadcast::channel::<u8>(0);
}

#[test]
fn cancelled_waiting_receivers_leave_the_channel_consistent() {
    with_deadline(|| {
        let sched = started(2);
        let (tx, rx) = broadcast::channel::<Arc<()>>(4);
        let waiting = Arc::new(AtomicUsize::new(0));
        let handles: Vec<_> = (0..4)
            .map(|_| {
                let (mut rx, waiting) = (tx.subscribe(), waiting.clone());
                sched
                    .submit(
                        move || {
                            waiting.fetch_add(1, Ordering::SeqCst);
                            rx.recv()
                        },
                        None,
                    )
                    .expect("submit")
            })
            .collect();
        wait_until("receivers waiting", || waiting.load(Ordering::SeqCst) == 4);
        thread::sleep(Duration::from_millis(20));
        assert_eq!(sched.stop_timeout(Duration::from_millis(50)), 4);
        for h in handles {
            assert!(h.join().unwrap_err().is_cancelled());
        }
        // The cancelled receivers unwound and were dropped: only `rx` is left.
        assert_eq!(tx.receiver_count(), 1);
        let token = Arc::new(());
        assert_eq!(tx.send(token.clone()), Ok(1));
        let mut rx = rx;
        drop(rx.try_recv().unwrap());
        assert_eq!(Arc::strong_count(&token), 1);
    });
}

#[test]
fn a_panicking_clone_skips_that_message_for_that_receiver_only() {
    #[derive(Debug, PartialEq)]
    struct Fragile(u32);
    impl Clone for Fragile {
        fn clone(&self) -> Fragile {
            if self.0 == 1 {
                panic!("clone fails");
            }
            Fragile(self.0)
        }
    }
    let (tx, mut a) = broadcast::channel::<Fragile>(4);
    let mut b = tx.subscribe();
    for i in 0..3 {
        tx.send(Fragile(i)).unwrap();
    }
    assert_eq!(a.recv(), Ok(Fragile(0)));
    assert!(catch_unwind(AssertUnwindSafe(|| a.recv())).is_err());
    assert_eq!(a.recv(), Ok(Fragile(2)));
    // b is the last to see message 1: it moves the value out without cloning.
    assert_eq!(b.recv(), Ok(Fragile(0)));
    assert_eq!(b.recv(), Ok(Fragile(1)));
    assert_eq!(b.recv(), Ok(Fragile(2)));
    assert_eq!(a.try_recv(), Err(TryRecvError::Empty));
}

#[test]
fn a_panicking_drop_of_an_overwritten_message_leaves_the_channel_usable() {
    #[derive(Clone)]
    struct Bomb(bool);
    impl Drop for Bomb {
        fn drop(&mut self) {
            if self.0 {
                self.0 = false;
                panic!("boom");
            }
        }
    }
    let (tx, mut rx) = broadcast::channel::<Bomb>(1);
    tx.send(Bomb(true)).unwrap();
    // Overwriting it drops it, outside the internal lock: the panic reaches the sender,
    // after the new message was sent.
    assert!(catch_unwind(AssertUnwindSafe(|| tx.send(Bomb(false)))).is_err());
    assert_eq!(
        rx.recv().map(|b| b.0).map_err(|e| e.to_string()),
        Err("channel lagged by 1".into())
    );
    assert!(!rx.recv().unwrap().0);
    tx.send(Bomb(false)).unwrap();
    assert!(!rx.recv().unwrap().0);
}

#[test]
fn messages_a_receiver_took_but_never_returned_are_dropped_with_it() {
    // A receive takes every waiting message under one lock (up to 16) and returns the first;
    // the others must still be dropped exactly once, with the receiver.
    let (tx, mut a) = broadcast::channel::<Arc<()>>(8);
    let mut b = tx.subscribe();
    let token = Arc::new(());
    for _ in 0..5 {
        tx.send(token.clone()).unwrap();
    }
    assert_eq!(Arc::strong_count(&token), 6);
    drop(a.recv().unwrap());
    drop(a);
    assert_eq!(Arc::strong_count(&token), 6, "b has seen none of them");
    let got: Vec<_> = (0..5).map(|_| b.recv().unwrap()).collect();
    assert_eq!(
        Arc::strong_count(&token),
        6,
        "b holds them now; the ring none"
    );
    drop((got, b));
    assert_eq!(Arc::strong_count(&token), 1);

    // The last receiver to see messages moves them out of the ring when it takes them.
    let mut c = tx.subscribe();
    let mut d = tx.subscribe();
    for _ in 0..5 {
        tx.send(token.clone()).unwrap();
    }
    drop((0..5).map(|_| c.recv().unwrap()).collect::<Vec<_>>());
    assert_eq!(Arc::strong_count(&token), 6, "d has seen none of them");
    drop(d.recv().unwrap());
    assert_eq!(Arc::strong_count(&token), 5, "d took the other four");
    drop(d);
    assert_eq!(Arc::strong_count(&token), 1);
    assert_eq!(c.try_recv(), Err(TryRecvError::Empty));
}

#[test]
fn a_panicking_drop_of_a_taken_then_overwritten_message_loses_no_count() {
    #[derive(Clone)]
    struct Bomb(u32, bool);
    impl Drop for Bomb {
        fn drop(&mut self) {
            if self.1 {
                self.1 = false;
                panic!("boom {}", self.0);
            }
        }
    }
    let (tx, mut rx) = broadcast::channel::<Bomb>(2);
    tx.send(Bomb(0, false)).unwrap();
    tx.send(Bomb(1, true)).unwrap();
    // Takes both (it is the only receiver, so it moves them out of the ring) and returns 0.
    assert_eq!(rx.recv().unwrap().0, 0);
    // Overwrites position 1, which only this receiver holds now: not dropped by the sender.
    tx.send(Bomb(2, false)).unwrap();
    tx.send(Bomb(3, false)).unwrap();
    // The receiver finds it overwritten and drops it: the panic reaches the receiver...
    assert!(catch_unwind(AssertUnwindSafe(|| rx.recv())).is_err());
    // ...and the miss is still reported, before what remains.
    assert_eq!(rx.recv().map(|b| b.0), Err(RecvError::Lagged(1)));
    assert_eq!(rx.recv().map(|b| b.0), Ok(2));
    assert_eq!(rx.recv().map(|b| b.0), Ok(3));
    drop(tx);
    assert_eq!(rx.recv().map(|b| b.0), Err(RecvError::Closed));
}

#[test]
fn a_clone_may_use_its_own_channel() {
    use std::cell::RefCell;
    thread_local! {
        static SENDER: RefCell<Option<broadcast::Sender<Echo>>> = const { RefCell::new(None) };
    }
    /// Each clone of a first-generation message sends a second-generation one on the very
    /// channel it is received from, and looks at the receiver count.
    #[derive(Debug)]
    struct Echo(u32);
    impl Clone for Echo {
        fn clone(&self) -> Echo {
            if self.0 < 100 {
                SENDER.with(|s| {
                    let s = s.borrow();
                    let tx = s.as_ref().expect("sender set");
                    assert_eq!(tx.receiver_count(), 2);
                    tx.send(Echo(self.0 + 100)).unwrap();
                });
            }
            Echo(self.0)
        }
    }
    let (tx, mut a) = broadcast::channel::<Echo>(64);
    let mut b = tx.subscribe();
    for i in 0..3 {
        tx.send(Echo(i)).unwrap();
    }
    SENDER.with(|s| *s.borrow_mut() = Some(tx));
    // a is not the last to see 0, 1 and 2, so it clones each: three echoes are sent while a
    // holds what it took; it takes them next.
    let got: Vec<u32> = (0..6).map(|_| a.recv().unwrap().0).collect();
    assert_eq!(got, [0, 1, 2, 100, 101, 102]);
    // b is the last to see every message: it moves them out without cloning.
    let got: Vec<u32> = (0..6).map(|_| b.recv().unwrap().0).collect();
    assert_eq!(got, [0, 1, 2, 100, 101, 102]);
    SENDER.with(|s| s.borrow_mut().take());
    assert_eq!(a.recv().map(|e| e.0), Err(RecvError::Closed));
    assert_eq!(b.recv().map(|e| e.0), Err(RecvError::Closed));
}

/// One step's result, the same shape for both channels.
#[derive(Debug, PartialEq)]
enum Step {
    Sent(Option<usize>),
    Got(Option<u64>),
    Lagged(u64),
    Empty,
    Closed,
}

/// Random sequences of sends, receives, subscriptions, receiver drops and a final close,
/// played on this channel and on tokio's with the same power-of-two capacity: every result
/// must be the same, lag counts included (receives take several messages under one lock
/// here, and must still report exactly what a receive that looks at the ring would).
#[test]
fn random_sequences_give_the_same_results_as_tokio() {
    use tokio::sync::broadcast as tb;
    let mut seed: u64 = 0x9e37_79b9_7f4a_7c15;
    let mut rand = move |n: u64| {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed % n
    };
    for round in 0..200 {
        let capacity = 1usize << rand(6);
        let (ftx, frx) = broadcast::channel::<u64>(capacity);
        let (ttx, trx) = tb::channel::<u64>(capacity);
        let (mut ftx, mut ttx) = (Some(ftx), Some(ttx));
        let mut receivers = vec![(frx, trx)];
        let mut next = 0u64;
        let steps = 50 + rand(400);
        for step in 0..steps {
            let (ours, theirs) = match rand(100) {
                // Sends, in bursts that overrun small capacities.
                0..=34 => {
                    let burst = 1 + rand(3 * capacity as u64);
                    let mut last = (Step::Empty, Step::Empty);
                    for _ in 0..burst {
                        let (Some(f), Some(t)) = (&ftx, &ttx) else {
                            break;
                        };
                        next += 1;
                        last = (Step::Sent(f.send(next).ok()), Step::Sent(t.send(next).ok()));
                        assert_eq!(last.0, last.1, "round {round} step {step}: send {next}");
                    }
                    last
                }
                35..=84 if !receivers.is_empty() => {
                    let k = rand(receivers.len() as u64) as usize;
                    let (f, t) = &mut receivers[k];
                    let ours = match f.try_recv() {
                        Ok(v) => Step::Got(Some(v)),
                        Err(TryRecvError::Lagged(n)) => Step::Lagged(n),
                        Err(TryRecvError::Empty) => Step::Empty,
                        Err(TryRecvError::Closed) => Step::Closed,
                    };
                    let theirs = match t.try_recv() {
                        Ok(v) => Step::Got(Some(v)),
                        Err(tb::error::TryRecvError::Lagged(n)) => Step::Lagged(n),
                        Err(tb::error::TryRecvError::Empty) => Step::Empty,
                        Err(tb::error::TryRecvError::Closed) => Step::Closed,
                    };
                    (ours, theirs)
                }
                85..=92 => match (&ftx, &ttx) {
                    (Some(f), Some(t)) => {
                        receivers.push((f.subscribe(), t.subscribe()));
                        (Step::Empty, Step::Empty)
                    }
                    _ => (Step::Empty, Step::Empty),
                },
                93..=98 if !receivers.is_empty() => {
                    let k = rand(receivers.len() as u64) as usize;
                    drop(receivers.swap_remove(k));
                    let counts = match (&ftx, &ttx) {
                        (Some(f), Some(t)) => (f.receiver_count(), t.receiver_count()),
                        _ => (0, 0),
                    };
                    (Step::Sent(Some(counts.0)), Step::Sent(Some(counts.1)))
                }
                _ if step > steps / 2 => {
                    ftx = None;
                    ttx = None;
                    (Step::Closed, Step::Closed)
                }
                _ => (Step::Empty, Step::Empty),
            };
            assert_eq!(
                ours, theirs,
                "round {round} step {step}, capacity {capacity}"
            );
        }
        // Drain every receiver: the same messages, lags and end.
        drop((ftx, ttx));
        for (k, (mut f, mut t)) in receivers.into_iter().enumerate() {
            loop {
                let ours = f.try_recv();
                let theirs = t.try_recv();
                match (ours, theirs) {
                    (Ok(a), Ok(b)) => assert_eq!(a, b, "round {round} receiver {k}"),
                    (Err(TryRecvError::Lagged(a)), Err(tb::error::TryRecvError::Lagged(b))) => {
                        assert_eq!(a, b, "round {round} receiver {k}")
                    }
                    (Err(TryRecvError::Closed), Err(tb::error::TryRecvError::Closed)) => break,
                    (a, b) => panic!("round {round} receiver {k}: {a:?} against {b:?}"),
                }
            }
        }
    }
}

#[test]
fn error_types_display_like_tokio() {
    assert_eq!(RecvError::Closed.to_string(), "channel closed");
    assert_eq!(RecvError::Lagged(3).to_string(), "channel lagged by 3");
    assert_eq!(TryRecvError::Empty.to_string(), "channel empty");
    assert_eq!(TryRecvError::Lagged(1), TryRecvError::Lagged(1).clone());
    assert_eq!(
        RecvTimeoutError::Timeout.to_string(),
        "timed out waiting on channel"
    );
    let e = SendError(5);
    assert_eq!(e.to_string(), "channel closed");
    assert_eq!(format!("{e:?}"), "SendError { .. }");
    let errors: [&dyn std::error::Error; 4] = [
        &e,
        &RecvError::Closed,
        &TryRecvError::Closed,
        &RecvTimeoutError::Closed,
    ];
    assert_eq!(errors.len(), 4);
}

/// A value that counts the live copies of itself: `Clone` adds one, `Drop` takes one away.
struct Counted(Arc<AtomicUsize>);

impl Clone for Counted {
    fn clone(&self) -> Counted {
        self.0.fetch_add(1, Ordering::Relaxed);
        Counted(self.0.clone())
    }
}

impl Drop for Counted {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

/// Each message is shared by its receivers through one count of references: receivers
/// pinned on both workers and on plain threads take their references at the same time,
/// release them from their own threads, lag behind a small ring (the sender releases the
/// references of those that never took an overwritten message), and leave with messages
/// taken but not returned. Every copy made is dropped exactly once, and none is left over.
#[test]
fn receivers_on_every_thread_release_each_message_exactly_once() {
    with_deadline(|| {
        const MESSAGES: usize = 20_000;
        let sched = started(2);
        let live = Arc::new(AtomicUsize::new(0));
        let (tx, rx) = broadcast::channel::<Counted>(8);
        // Receiver k leaves after k * 1 500 messages (never, for k = 0).
        let run = |k: usize, mut rx: broadcast::Receiver<Counted>| {
            let mut seen = 0;
            loop {
                match rx.recv() {
                    Ok(v) => {
                        seen += 1;
                        drop(v);
                    }
                    Err(RecvError::Lagged(n)) => seen += n as usize,
                    Err(RecvError::Closed) => return,
                }
                if k > 0 && seen >= k * 1_500 {
                    return;
                }
            }
        };
        let mut fibers = Vec::new();
        let mut threads = Vec::new();
        let receivers: Vec<_> = std::iter::once(rx)
            .chain((1..12).map(|_| tx.subscribe()))
            .collect();
        for (k, rx) in receivers.into_iter().enumerate() {
            if k % 3 == 2 {
                threads.push(thread::spawn(move || run(k, rx)));
            } else {
                let h = sched.submit(move || run(k, rx), Some(k % 2));
                fibers.push(h.expect("submit"));
            }
        }
        for i in 0..MESSAGES {
            live.fetch_add(1, Ordering::Relaxed);
            if tx.send(Counted(live.clone())).is_err() {
                unreachable!("receiver 0 never leaves");
            }
            if i % 256 == 255 {
                thread::yield_now();
            }
        }
        drop(tx);
        for f in fibers {
            finish(f);
        }
        for t in threads {
            t.join().expect("thread receiver");
        }
        assert_eq!(
            live.load(Ordering::Relaxed),
            0,
            "every copy dropped exactly once"
        );
        sched.stop();
    });
}
