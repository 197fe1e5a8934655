//! `fibra::sync::oneshot`: one value from a thread to a fiber and back, disconnection on
//! either side, and receive timeouts that are never early.

use std::sync::mpsc::{RecvError, RecvTimeoutError, TryRecvError};
use std::thread;
use std::time::{Duration, Instant};

use crate::common::{finish, started, with_deadline, LIMIT};
use fibra::sync::oneshot;

#[test]
fn from_a_thread_to_a_waiting_fiber() {
    with_deadline(|| {
        let sched = started(2);
        for delay in [0, 1, 5] {
            let (tx, rx) = oneshot::channel::<String>();
            let fiber = sched.submit(move || rx.recv(), None).expect("submit");
            let sender = thread::spawn(move || {
                thread::sleep(Duration::from_millis(delay));
                tx.send("hello".into()).unwrap();
            });
            assert_eq!(finish(fiber), Ok("hello".into()));
            sender.join().unwrap();
        }
        sched.stop();
    });
}

#[test]
fn from_a_fiber_to_a_waiting_thread() {
    with_deadline(|| {
        let sched = started(1);
        let (tx, rx) = oneshot::channel::<u32>();
        let fiber = sched
            .submit(
                move || {
                    fibra::sleep(Duration::from_millis(10));
                    tx.send(5)
                },
                None,
            )
            .expect("submit");
        assert_eq!(rx.recv(), Ok(5));
        assert_eq!(finish(fiber), Ok(()));
        sched.stop();
    });
}

#[test]
fn many_pairs_of_fibers_round_trip() {
    with_deadline(|| {
        let sched = std::sync::Arc::new(started(2));
        let s = sched.clone();
        let total = sched.block_on(move || {
            let pairs: Vec<_> = (0..500u64)
                .map(|i| {
                    let s2 = s.clone();
                    s.submit(
                        move || {
                            let (ping_tx, ping_rx) = oneshot::channel::<u64>();
                            let (pong_tx, pong_rx) = oneshot::channel::<u64>();
                            let partner = s2
                                .submit(
                                    move || pong_tx.send(ping_rx.recv().unwrap() + 1).unwrap(),
                                    None,
                                )
                                .unwrap();
                            ping_tx.send(i).unwrap();
                            let v = pong_rx.recv().unwrap();
                            partner.join().unwrap();
                            v
                        },
                        None,
                    )
                    .unwrap()
                })
                .collect();
            pairs.into_iter().map(|h| h.join().unwrap()).sum::<u64>()
        });
        assert_eq!(total, (1..=500).sum::<u64>());
        sched.stop();
    });
}

#[test]
fn dropping_the_sender_wakes_a_blocked_fiber_with_an_error() {
    with_deadline(|| {
        let sched = started(1);
        let (tx, rx) = oneshot::channel::<u32>();
        let fiber = sched.submit(move || rx.recv(), None).expect("submit");
        thread::sleep(Duration::from_millis(20));
        assert!(!fiber.is_finished());
        drop(tx);
        assert_eq!(finish(fiber), Err(RecvError));
        sched.stop();
    });
}

#[test]
fn recv_timeout_times_out_never_early_then_still_receives() {
    with_deadline(|| {
        let sched = started(1);
        let timeout = Duration::from_millis(30);
        let check = move || {
            let (tx, mut rx) = oneshot::channel::<u32>();
            let start = Instant::now();
            assert_eq!(rx.recv_timeout(timeout), Err(RecvTimeoutError::Timeout));
            let waited = start.elapsed();
            assert!(waited >= timeout, "woke early: {waited:?}");
            assert!(waited < LIMIT);
            tx.send(1).unwrap();
            assert_eq!(rx.recv_timeout(timeout), Ok(1));
            assert_eq!(rx.try_recv(), Err(TryRecvError::Disconnected));
        };
        finish(sched.submit(check, None).expect("submit"));
        check();
        sched.stop();
    });
}

#[test]
fn a_value_sent_to_a_timed_waiter_arrives() {
    with_deadline(|| {
        let sched = started(2);
        let (tx, mut rx) = oneshot::channel::<u32>();
        let fiber = sched
            .submit(move || rx.recv_timeout(LIMIT), None)
            .expect("submit");
        thread::sleep(Duration::from_millis(10));
        tx.send(8).unwrap();
        assert_eq!(finish(fiber), Ok(8));
        sched.stop();
    });
}

#[test]
fn send_to_a_dropped_receiver_gives_the_value_back() {
    let (tx, rx) = oneshot::channel::<String>();
    assert!(!tx.is_closed());
    drop(rx);
    assert!(tx.is_closed());
    assert_eq!(tx.send("back".into()), Err("back".into()));
}

#[test]
fn try_recv_sees_empty_then_the_value_then_disconnected() {
    let (tx, mut rx) = oneshot::channel::<u8>();
    assert_eq!(rx.try_recv(), Err(TryRecvError::Empty));
    tx.send(4).unwrap();
    assert_eq!(rx.try_recv(), Ok(4));
    assert_eq!(rx.try_recv(), Err(TryRecvError::Disconnected));
    let (tx, mut rx) = oneshot::channel::<u8>();
    drop(tx);
    assert_eq!(rx.try_recv(), Err(TryRecvError::Disconnected));
}
