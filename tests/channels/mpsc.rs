//! `fibra::sync::mpsc`: std's channel API between fibers and threads — nothing lost or
//! duplicated, bounded channels block and hand over in order, disconnection wakes the other
//! side with std's errors, and timeouts time out, never early.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use crate::common::{finish, started, wait_until, with_deadline, LIMIT};
use fibra::current_worker;
use fibra::sync::mpsc::{self, RecvError, RecvTimeoutError, SendError, TryRecvError, TrySendError};

#[test]
fn ten_fiber_producers_and_one_thread_producer_sum_exactly() {
    with_deadline(|| {
        const PER: u64 = 10_000;
        let sched = started(2);
        let (tx, rx) = mpsc::channel::<u64>();
        let consumer = sched
            .submit(move || rx.iter().sum::<u64>(), None)
            .expect("submit");
        let producers: Vec<_> = (0..10u64)
            .map(|p| {
                let tx = tx.clone();
                sched
                    .submit(
                        move || {
                            for i in 0..PER {
                                tx.send(p * PER + i).unwrap();
                                if i % 100 == 0 {
                                    fibra::Fiber::yield_now();
                                }
                            }
                        },
                        None,
                    )
                    .expect("submit")
            })
            .collect();
        let thread_tx = tx.clone();
        let thread_producer = thread::spawn(move || {
            for i in 0..PER {
                thread_tx.send(10 * PER + i).unwrap();
            }
        });
        drop(tx);
        for p in producers {
            finish(p);
        }
        thread_producer.join().expect("thread producer");
        let n = 11 * PER;
        assert_eq!(finish(consumer), n * (n - 1) / 2);
        sched.stop();
    });
}

#[test]
fn bounded_channel_of_capacity_one_between_two_fibers_on_one_worker() {
    with_deadline(|| {
        let sched = started(1);
        let (tx, rx) = mpsc::sync_channel::<u32>(1);
        let received = Arc::new(AtomicUsize::new(0));
        let r = received.clone();
        let producer = sched
            .submit(
                move || {
                    let mut most_ahead = 0;
                    for i in 0..1_000 {
                        tx.send(i).unwrap();
                        // A returned send left its message in the one-place buffer, or in
                        // the hands of a receiver that has not returned yet.
                        let ahead = i as usize + 1 - r.load(Ordering::SeqCst);
                        most_ahead = most_ahead.max(ahead);
                    }
                    (most_ahead, current_worker())
                },
                None,
            )
            .expect("submit");
        let consumer = sched
            .submit(
                move || {
                    let mut expect = 0;
                    for v in rx.iter() {
                        assert_eq!(v, expect, "in order");
                        expect += 1;
                        received.fetch_add(1, Ordering::SeqCst);
                    }
                    (expect, current_worker())
                },
                None,
            )
            .expect("submit");
        let (most_ahead, worker) = finish(producer);
        assert_eq!(worker, Some(0));
        assert!(
            most_ahead <= 2,
            "the producer ran {most_ahead} messages ahead"
        );
        assert_eq!(finish(consumer), (1_000, Some(0)));
        sched.stop();
    });
}

#[test]
fn a_rendezvous_send_waits_for_the_receiver() {
    with_deadline(|| {
        let sched = started(1);
        let (tx, rx) = mpsc::sync_channel::<u32>(0);
        assert_eq!(
            tx.try_send(1),
            Err(TrySendError::Full(1)),
            "nobody receives"
        );
        let taken = Arc::new(AtomicUsize::new(0));
        let t = taken.clone();
        let sender = sched
            .submit(
                move || {
                    tx.send(7).unwrap();
                    // The receiver has the message by the time send returns.
                    t.load(Ordering::SeqCst)
                },
                None,
            )
            .expect("submit");
        thread::sleep(Duration::from_millis(20));
        assert!(!sender.is_finished(), "send waits for a receiver");
        assert_eq!(rx.recv(), Ok(7));
        taken.store(1, Ordering::SeqCst);
        finish(sender);
        sched.stop();
    });
}

#[test]
fn dropping_the_senders_wakes_a_blocked_fiber_receiver_with_an_error() {
    with_deadline(|| {
        let sched = started(1);
        let (tx, rx) = mpsc::channel::<u32>();
        let tx2 = tx.clone();
        let receiver = sched
            .submit(move || (rx.recv(), rx.try_recv()), None)
            .expect("submit");
        thread::sleep(Duration::from_millis(20));
        assert!(!receiver.is_finished());
        drop(tx);
        thread::sleep(Duration::from_millis(20));
        assert!(!receiver.is_finished(), "one sender is still alive");
        drop(tx2);
        assert_eq!(
            finish(receiver),
            (Err(RecvError), Err(TryRecvError::Disconnected))
        );
        sched.stop();
    });
}

#[test]
fn dropping_the_receiver_fails_blocked_senders_with_their_messages() {
    with_deadline(|| {
        let sched = started(1);
        let (tx, rx) = mpsc::sync_channel::<String>(1);
        tx.send("buffered".into()).unwrap();
        let blocked = Arc::new(AtomicUsize::new(0));
        let handles: Vec<_> = (0..3)
            .map(|i| {
                let (tx, blocked) = (tx.clone(), blocked.clone());
                sched
                    .submit(
                        move || {
                            blocked.fetch_add(1, Ordering::SeqCst);
                            tx.send(format!("m{i}"))
                        },
                        None,
                    )
                    .expect("submit")
            })
            .collect();
        wait_until("senders blocked", || blocked.load(Ordering::SeqCst) == 3);
        thread::sleep(Duration::from_millis(20));
        drop(rx);
        for (i, h) in handles.into_iter().enumerate() {
            assert_eq!(finish(h), Err(SendError(format!("m{i}"))));
        }
        assert_eq!(tx.send("late".into()), Err(SendError("late".into())));
        sched.stop();
    });
}

#[test]
fn blocked_senders_are_served_in_arrival_order() {
    with_deadline(|| {
        let sched = started(1);
        let (tx, rx) = mpsc::sync_channel::<usize>(2);
        tx.send(100).unwrap();
        tx.send(101).unwrap();
        let queued = Arc::new(AtomicUsize::new(0));
        let handles: Vec<_> = (0..20)
            .map(|i| {
                let (tx, queued) = (tx.clone(), queued.clone());
                sched
                    .submit(
                        move || {
                            queued.fetch_add(1, Ordering::SeqCst);
                            tx.send(i).unwrap();
                        },
                        None,
                    )
                    .expect("submit")
            })
            .collect();
        wait_until("senders queued", || queued.load(Ordering::SeqCst) == 20);
        thread::sleep(Duration::from_millis(20));
        drop(tx);
        let got: Vec<usize> = rx.iter().collect();
        let mut want = vec![100, 101];
        want.extend(0..20);
        assert_eq!(got, want);
        for h in handles {
            finish(h);
        }
        sched.stop();
    });
}

#[test]
fn recv_timeout_times_out_never_early_in_a_fiber_and_a_thread() {
    with_deadline(|| {
        let sched = started(1);
        let timeout = Duration::from_millis(30);
        let check = move || {
            let (tx, rx) = mpsc::channel::<u8>();
            let start = Instant::now();
            assert_eq!(rx.recv_timeout(timeout), Err(RecvTimeoutError::Timeout));
            let waited = start.elapsed();
            assert!(waited >= timeout, "woke early: {waited:?}");
            assert!(waited < LIMIT);
            tx.send(3).unwrap();
            assert_eq!(rx.recv_timeout(timeout), Ok(3));
            drop(tx);
            assert_eq!(
                rx.recv_timeout(timeout),
                Err(RecvTimeoutError::Disconnected)
            );
        };
        finish(sched.submit(check, None).expect("submit"));
        check();
        sched.stop();
    });
}

#[test]
fn a_message_sent_to_a_timed_waiter_arrives() {
    with_deadline(|| {
        let sched = started(2);
        let (tx, rx) = mpsc::channel::<u32>();
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
fn try_send_try_recv_and_try_iter() {
    let (tx, rx) = mpsc::sync_channel::<u8>(2);
    assert_eq!(rx.try_recv(), Err(TryRecvError::Empty));
    tx.try_send(1).unwrap();
    tx.try_send(2).unwrap();
    assert_eq!(tx.try_send(3), Err(TrySendError::Full(3)));
    assert_eq!(rx.try_iter().collect::<Vec<_>>(), [1, 2]);
    drop(rx);
    assert_eq!(tx.try_send(4), Err(TrySendError::Disconnected(4)));
}

#[test]
fn a_thread_receives_from_fibers_through_the_owning_iterator() {
    with_deadline(|| {
        let sched = started(2);
        let (tx, rx) = mpsc::sync_channel::<u64>(4);
        for p in 0..4u64 {
            let tx = tx.clone();
            drop(
                sched
                    .submit(
                        move || {
                            for i in 0..1_000 {
                                tx.send(p * 1_000 + i).unwrap();
                            }
                        },
                        None,
                    )
                    .expect("submit"),
            );
        }
        drop(tx);
        let sum: u64 = rx.into_iter().sum();
        assert_eq!(sum, 3_999 * 4_000 / 2);
        sched.stop();
    });
}

/// Far more threads than cores, plus fibers, all on one channel: a holder of the channel's
/// internal lock is often preempted, and its waiters must get it back to it (the lock's
/// waiters spin, then yield their threads) without losing or duplicating a message. A
/// bounded channel of 4 keeps senders blocking and waking too.
#[test]
fn oversubscribed_threads_and_fibers_share_one_channel() {
    with_deadline(|| {
        const THREADS: u64 = 16;
        const FIBERS: u64 = 16;
        const PER: u64 = 2_000;
        let sched = started(2);
        let (tx, rx) = mpsc::sync_channel::<u64>(4);
        let consumer =
            thread::spawn(move || rx.iter().fold((0u64, 0u64), |(n, s), v| (n + 1, s + v)));
        let threads: Vec<_> = (0..THREADS)
            .map(|t| {
                let tx = tx.clone();
                thread::spawn(move || {
                    for i in 0..PER {
                        tx.send(t * PER + i).expect("receiver alive");
                    }
                })
            })
            .collect();
        let fibers: Vec<_> = (THREADS..THREADS + FIBERS)
            .map(|t| {
                let tx = tx.clone();
                sched
                    .submit(
                        move || {
                            for i in 0..PER {
                                tx.send(t * PER + i).expect("receiver alive");
                            }
                        },
                        None,
                    )
                    .expect("submit")
            })
            .collect();
        drop(tx);
        for t in threads {
            t.join().expect("sender thread");
        }
        for f in fibers {
            finish(f);
        }
        let all = (THREADS + FIBERS) * PER;
        assert_eq!(
            consumer.join().expect("consumer"),
            (all, all * (all - 1) / 2)
        );
        sched.stop();
    });
}

/// A message that adds its value to a sink when dropped, received or not: the sink's total
/// shows every message was dropped exactly once (none lost, none duplicated).
struct Summed {
    v: u64,
    sink: Arc<AtomicUsize>,
}

impl Drop for Summed {
    fn drop(&mut self) {
        self.sink.fetch_add(self.v as usize, Ordering::SeqCst);
    }
}

/// Wakes from the receivers' own worker (won with a plain store: the park's only unparker,
/// used on the fiber's home worker) and from another worker (a compare-and-swap) race each
/// other, the receivers' short deadlines and their cancellation from a plain thread. Every
/// message is dropped exactly once, received or left in its channel, and each receiver ends
/// either by disconnection or cancelled.
#[test]
fn local_and_remote_wakes_race_deadlines_and_cancellations() {
    with_deadline(|| {
        const RX: usize = 48;
        const ROUNDS: usize = 150;
        let sched = started(2);
        let sink = Arc::new(AtomicUsize::new(0));
        let received = Arc::new(AtomicUsize::new(0));
        let mut txs = Vec::new();
        let mut receivers = Vec::new();
        for i in 0..RX {
            let (tx, rx) = mpsc::channel::<Summed>();
            txs.push(tx);
            let received = received.clone();
            let patience = Duration::from_micros(20 + (i as u64 * 37) % 300);
            let h = sched
                .submit(
                    move || loop {
                        match rx.recv_timeout(patience) {
                            Ok(m) => {
                                received.fetch_add(1, Ordering::SeqCst);
                                drop(m);
                            }
                            Err(RecvTimeoutError::Timeout) => {}
                            Err(RecvTimeoutError::Disconnected) => return current_worker(),
                        }
                    },
                    Some(0),
                )
                .expect("submit");
            receivers.push(h);
        }
        // One sender on the receivers' worker, one on the other; the values of each are
        // distinct: (sender, round, receiver) + 1.
        let senders: Vec<_> = (0..2usize)
            .map(|s| {
                let (txs, sink) = (txs.clone(), sink.clone());
                sched
                    .submit(
                        move || {
                            for round in 0..ROUNDS {
                                for (i, tx) in txs.iter().enumerate() {
                                    let v = ((s * ROUNDS + round) * RX + i + 1) as u64;
                                    // A gone receiver hands the message back; it drops here.
                                    let _ = tx.send(Summed {
                                        v,
                                        sink: sink.clone(),
                                    });
                                    if i % 8 == 0 {
                                        fibra::Fiber::yield_now();
                                    }
                                }
                            }
                        },
                        Some(s),
                    )
                    .expect("submit")
            })
            .collect();
        drop(txs);
        // Cancel every fourth receiver while the senders run.
        for h in receivers.iter().step_by(4) {
            thread::sleep(Duration::from_micros(300));
            h.cancel();
        }
        for s in senders {
            finish(s);
        }
        let mut cancelled = 0;
        for h in receivers {
            match h.join() {
                Ok(worker) => assert_eq!(worker, Some(0), "a fiber never moves"),
                Err(e) => {
                    assert!(e.is_cancelled(), "{e}");
                    cancelled += 1;
                }
            }
        }
        sched.stop();
        let n = (2 * ROUNDS * RX) as u64;
        assert_eq!(sink.load(Ordering::SeqCst) as u64, n * (n + 1) / 2);
        assert!(received.load(Ordering::SeqCst) > 0);
        assert!(cancelled <= RX.div_ceil(4));
    });
}

/// The first of two receivers waiting on one shared `&Receiver` (a fiber), and the message
/// a send put in its slot: the fiber is cancelled before it resumes (a fiber of its worker
/// sends and cancels, so the cancel is handled first). The message must go on to the
/// second waiter. It used to go back into the buffer with nobody woken: the waiting thread
/// timed out while `try_recv` found the message.
fn a_cancelled_receivers_message_reaches(
    second: impl FnOnce(Arc<mpsc::Receiver<u32>>) -> thread::JoinHandle<Option<u32>>,
) {
    let sched = started(1);
    let (tx, rx) = mpsc::channel::<u32>();
    let rx = Arc::new(rx);
    let mut second_waiter = None;
    let _tx = crate::common::cancel_a_receiver_holding_a_message(&sched, tx, &rx, 7, || {
        second_waiter = Some(second(rx.clone()));
        thread::sleep(Duration::from_millis(20));
    });
    let second = second_waiter.expect("started");
    assert_eq!(
        second.join().unwrap(),
        Some(7),
        "the second waiter missed the message; left in the channel: {:?}",
        rx.try_recv()
    );
    sched.stop();
}

#[test]
fn a_cancelled_receivers_message_goes_to_the_next_waiting_thread() {
    with_deadline(|| {
        a_cancelled_receivers_message_reaches(|rx| {
            thread::spawn(move || rx.recv_timeout(LIMIT).ok())
        });
    });
}

/// The same with a `select!` waiting on the receiver: it must be woken for the message put
/// back, not find it only at its deadline (without one it would wait for ever).
#[test]
fn a_cancelled_receivers_message_wakes_a_select_on_the_same_receiver() {
    with_deadline(|| {
        a_cancelled_receivers_message_reaches(|rx| {
            thread::spawn(move || {
                let start = Instant::now();
                let got = fibra::select! {
                    recv(*rx) -> m => m.ok(),
                    default(LIMIT) => None,
                };
                assert!(start.elapsed() < LIMIT / 2, "the select was not woken");
                got
            })
        });
    });
}

/// A receiver cancelled with a message in hand puts it back in front of the messages sent
/// after it, also when another receiver sharing the `Receiver` has already moved those into
/// its batch: one sender's messages still arrive in the order sent.
#[test]
fn a_message_put_back_comes_before_a_shared_receivers_batch() {
    with_deadline(|| {
        let sched = started(2);
        let (tx, rx) = mpsc::channel::<u32>();
        let rx = Arc::new(rx);
        let first = {
            let rx = rx.clone();
            sched.submit(move || rx.recv().ok(), Some(0)).unwrap()
        };
        wait_until("the first receiver to wait", || {
            sched.dump().to_string().contains("mpsc::Receiver::recv")
        });
        // Worker 0 is held by a task blocking its thread, so the first receiver handles its
        // cancellation only once it is let go.
        let (release, held) = std::sync::mpsc::channel::<()>();
        let (holding, is_holding) = std::sync::mpsc::channel::<()>();
        let holder = sched
            .submit(
                move || {
                    holding.send(()).unwrap();
                    held.recv().unwrap();
                },
                Some(0),
            )
            .unwrap();
        is_holding.recv().unwrap();
        first.cancel();
        // 1 goes into the first receiver's hand, 2..=5 into the buffer.
        for m in 1..=5 {
            tx.send(m).unwrap();
        }
        // A second receiver takes 2 and moves 3..=5 into the shared batch.
        let second = {
            let rx = rx.clone();
            sched.submit(move || rx.recv().unwrap(), Some(1)).unwrap()
        };
        assert_eq!(finish(second), 2);
        release.send(()).unwrap();
        finish(holder);
        assert!(first.join().unwrap_err().is_cancelled());
        let rest = {
            let rx = rx.clone();
            sched
                .submit(move || rx.try_iter().collect::<Vec<_>>(), Some(1))
                .unwrap()
        };
        assert_eq!(finish(rest), [1, 3, 4, 5]);
        sched.stop();
    });
}
