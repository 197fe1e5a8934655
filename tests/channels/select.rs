//! `fibra::select!`: the first of several channel operations, fairly chosen, with
//! `default` and timeouts, from fibers and threads.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::common::{finish, started, with_deadline, LIMIT};
use fibra::sync::{mpmc, mpsc, CancellationToken};

#[test]
fn the_ready_arm_runs_and_others_do_not_complete() {
    let (tx1, rx1) = mpsc::channel::<u32>();
    let (_tx2, rx2) = mpsc::channel::<u32>();
    tx1.send(7).unwrap();
    let got = fibra::select! {
        recv(rx1) -> m => m.unwrap(),
        recv(rx2) -> m => m.unwrap() + 100,
    };
    assert_eq!(got, 7);
    // Two sends with room: exactly one happens.
    let (a, ra) = mpsc::sync_channel::<u32>(1);
    let (b, rb) = mpsc::sync_channel::<u32>(1);
    fibra::select! {
        send(a, 1) -> r => r.unwrap(),
        send(b, 2) -> r => r.unwrap(),
    }
    let sent = ra.try_iter().count() + rb.try_iter().count();
    assert_eq!(sent, 1);
}

#[test]
fn ready_arms_are_chosen_fairly() {
    let (tx1, rx1) = mpsc::channel::<u8>();
    let (tx2, rx2) = mpsc::channel::<u8>();
    let mut counts = [0u32; 2];
    for _ in 0..10_000 {
        tx1.send(0).unwrap();
        tx2.send(1).unwrap();
        let i = fibra::select! {
            recv(rx1) -> m => m.unwrap(),
            recv(rx2) -> m => m.unwrap(),
        };
        counts[i as usize] += 1;
        // Drain the other, so both are ready next round.
        let _ = rx1.try_recv();
        let _ = rx2.try_recv();
    }
    assert!(counts.iter().all(|&c| c > 3_000), "unfair: {counts:?}");
}

#[test]
fn default_runs_when_nothing_is_ready_and_timeouts_are_never_early() {
    let (_tx, rx) = mpsc::channel::<u32>();
    let r = fibra::select! {
        recv(rx) -> _ => "recv",
        default => "default",
    };
    assert_eq!(r, "default");
    let start = Instant::now();
    let r = fibra::select! {
        recv(rx) -> _ => "recv",
        default(Duration::from_millis(30)) => "timeout",
    };
    assert_eq!(r, "timeout");
    assert!(start.elapsed() >= Duration::from_millis(30), "came early");
    // Zero timeout behaves like `default`.
    let r = fibra::select! {
        recv(rx) -> _ => 1,
        default(Duration::ZERO) => 2,
    };
    assert_eq!(r, 2);
}

#[test]
fn disconnection_completes_at_once() {
    let (tx, rx) = mpsc::channel::<u32>();
    drop(tx);
    fibra::select! {
        recv(rx) -> m => assert!(m.is_err()),
        default(LIMIT) => panic!("a disconnected receive must not wait"),
    }
    let (tx, rx) = mpsc::sync_channel::<String>(0);
    drop(rx);
    fibra::select! {
        send(tx, "back".to_string()) -> r => assert_eq!(r.unwrap_err().0, "back"),
        default(LIMIT) => panic!("a send to a gone receiver must not wait"),
    }
}

#[test]
fn a_waiting_select_wakes_for_messages_room_rendezvous_and_tokens() {
    with_deadline(|| {
        let sched = started(2);
        // A select in a fiber wakes when a thread sends, and when the senders are gone.
        let (tx, rx) = mpsc::channel::<u32>();
        let h = sched
            .submit(
                move || {
                    let mut sum = 0;
                    loop {
                        fibra::select! {
                            recv(rx) -> m => match m {
                                Ok(v) => sum += v,
                                Err(_) => break,
                            },
                        }
                    }
                    sum
                },
                None,
            )
            .unwrap();
        for i in 1..=100 {
            tx.send(i).unwrap();
            if i % 10 == 0 {
                std::thread::sleep(Duration::from_millis(1));
            }
        }
        drop(tx);
        assert_eq!(finish(h), 5050);
        // ... and when a token is cancelled (from a plain thread).
        let (_idle_tx, idle) = mpsc::channel::<u32>();
        let stop = CancellationToken::new();
        let s = stop.clone();
        let h = sched
            .submit(
                move || {
                    fibra::select! {
                        recv(idle) -> _ => "message",
                        recv(s) -> r => { r.unwrap(); "cancelled" },
                    }
                },
                None,
            )
            .unwrap();
        std::thread::sleep(Duration::from_millis(10));
        stop.cancel();
        assert_eq!(finish(h), "cancelled");

        // A send waiting for room on a full bounded channel, and a rendezvous.
        for bound in [1usize, 0] {
            let (tx, rx) = mpsc::sync_channel::<u32>(bound);
            if bound == 1 {
                tx.send(0).unwrap();
            }
            let sender = sched
                .submit(
                    move || {
                        fibra::select! {
                            send(tx, 42) -> r => r.unwrap(),
                            default(LIMIT) => panic!("never got room"),
                        }
                    },
                    None,
                )
                .unwrap();
            std::thread::sleep(Duration::from_millis(10));
            let mut got = Vec::new();
            while got.len() < if bound == 1 { 2 } else { 1 } {
                got.push(rx.recv_timeout(LIMIT).unwrap());
            }
            finish(sender);
            assert_eq!(*got.last().unwrap(), 42);
        }
        sched.stop();
    });
}

#[test]
fn competing_selects_on_an_mpmc_channel_take_each_message_once() {
    with_deadline(|| {
        let sched = started(2);
        let (tx, rx) = mpmc::channel::<u32>();
        let (_idle_tx, idle_rx) = mpmc::channel::<u32>();
        let taken = Arc::new(AtomicUsize::new(0));
        let stop = CancellationToken::new();
        let mut workers = Vec::new();
        for _ in 0..8 {
            let (rx, idle_rx, taken, stop) =
                (rx.clone(), idle_rx.clone(), taken.clone(), stop.clone());
            workers.push(
                sched
                    .submit(
                        move || {
                            let mut mine = Vec::new();
                            loop {
                                fibra::select! {
                                    recv(rx) -> m => match m {
                                        Ok(v) => {
                                            taken.fetch_add(1, Ordering::SeqCst);
                                            mine.push(v);
                                        }
                                        Err(_) => break,
                                    },
                                    recv(idle_rx) -> _ => unreachable!(),
                                    recv(stop) -> _ => break,
                                }
                            }
                            mine
                        },
                        None,
                    )
                    .unwrap(),
            );
        }
        for i in 0..5_000 {
            tx.send(i).unwrap();
        }
        drop(tx);
        let mut all: Vec<u32> = workers.into_iter().flat_map(finish).collect();
        all.sort_unstable();
        assert_eq!(all, (0..5_000).collect::<Vec<_>>());
        assert_eq!(taken.load(Ordering::SeqCst), 5_000);
        stop.cancel();
        sched.stop();
    });
}

#[test]
fn arm_bodies_control_the_surrounding_code() {
    let (tx, rx) = mpsc::channel::<u32>();
    for i in 0..10 {
        tx.send(i).unwrap();
    }
    drop(tx);
    let mut odd = 0;
    let mut steps = 0;
    let r: Result<(), ()> = (|| {
        loop {
            steps += 1;
            fibra::select! {
                recv(rx) -> m => {
                    let Ok(v) = m else { break };
                    if v % 2 == 0 {
                        continue;
                    }
                    odd += 1;
                }
            }
        }
        Err(())?;
        Ok(())
    })();
    assert!(r.is_err());
    assert_eq!((odd, steps), (5, 11));
}

#[test]
fn a_cancelled_select_leaves_no_watcher_behind() {
    with_deadline(|| {
        let sched = started(1);
        let (tx, rx) = mpmc::channel::<u32>();
        for _ in 0..100 {
            let rx = rx.clone();
            let h = sched
                .submit(
                    move || {
                        fibra::select! {
                            recv(rx) -> _ => (),
                        }
                    },
                    None,
                )
                .unwrap();
            std::thread::sleep(Duration::from_millis(1));
            h.cancel();
            assert!(h.join().unwrap_err().is_cancelled());
        }
        // The channel still works after 100 selects were cancelled while waiting on it.
        tx.send(5).unwrap();
        assert_eq!(rx.recv().unwrap(), 5);
        sched.stop();
    });
}

#[test]
fn a_dynamic_select_over_many_channels() {
    with_deadline(|| {
        let sched = started(2);
        let channels: Vec<_> = (0..64).map(|_| mpmc::sync_channel::<usize>(0)).collect();
        let senders: Vec<_> = channels.iter().map(|(tx, _)| tx.clone()).collect();
        let receivers: Vec<_> = channels.into_iter().map(|(_, rx)| rx).collect();
        // One message on channel 41, sent by a fiber later (a rendezvous).
        let tx41 = senders[41].clone();
        let h = sched
            .submit(
                move || {
                    fibra::sleep(Duration::from_millis(10));
                    tx41.send(4100).unwrap();
                },
                None,
            )
            .unwrap();
        let mut sel = fibra::sync::SelectArms::new();
        for (i, rx) in receivers.iter().enumerate() {
            sel.recv(rx, move |m| (i, m.unwrap()));
        }
        assert_eq!(sel.len(), 64);
        assert_eq!(sel.wait(), (41, 4100));
        finish(h);
        // Nothing ready: try_wait and wait_timeout say so.
        let mut sel = fibra::sync::SelectArms::new();
        sel.recv(&receivers[0], |_| ());
        assert!(sel.try_wait().is_none());
        let mut sel = fibra::sync::SelectArms::new();
        sel.recv(&receivers[0], |_| ());
        sel.send(&senders[1], 5, |_| ());
        assert!(sel.wait_timeout(Duration::from_millis(5)).is_none());
        assert!(fibra::sync::SelectArms::<()>::new().try_wait().is_none());
        sched.stop();
    });
}

/// Selects on both ends of rendezvous channels, many rounds: a waiting select offers its
/// send, the other side takes it, and each round makes exactly one exchange (no round waits
/// out its timeout, none makes two).
#[test]
fn selects_meet_on_rendezvous_channels_round_after_round() {
    with_deadline(|| {
        let sched = started(2);
        const ROUNDS: u32 = 2000;
        let (to_b, b_rx) = mpsc::sync_channel::<u32>(0);
        let (to_a, a_rx) = mpsc::sync_channel::<u32>(0);
        let side = |me: u32, tx: mpsc::SyncSender<u32>, rx: mpsc::Receiver<u32>| {
            move || {
                let (mut sent, mut received) = (Vec::new(), Vec::new());
                for round in 0..ROUNDS {
                    fibra::select! {
                        send(tx, me * 1_000_000 + round) -> r => { r.unwrap(); sent.push(round) },
                        recv(rx) -> m => received.push(m.unwrap()),
                        default(LIMIT) => panic!("side {me}: round {round} found no partner"),
                    }
                }
                (sent, received)
            }
        };
        let check = |((a_sent, a_got), (b_sent, b_got)): Sides| {
            // Every round, one side sent and the other received that very message.
            assert_eq!(a_sent.len() + a_got.len(), ROUNDS as usize);
            assert_eq!(a_sent.len(), b_got.len());
            assert_eq!(b_sent.len(), a_got.len());
            assert!(b_got.iter().zip(&a_sent).all(|(&m, &r)| m == 1_000_000 + r));
            assert!(a_got.iter().zip(&b_sent).all(|(&m, &r)| m == 2_000_000 + r));
        };
        type Sides = ((Vec<u32>, Vec<u32>), (Vec<u32>, Vec<u32>));
        let a = sched.spawn(side(1, to_b, a_rx));
        let b = sched.spawn(side(2, to_a, b_rx));
        check((finish(a), finish(b)));
        // Plain threads, which wake and try truly at the same time.
        let (to_b, b_rx) = mpsc::sync_channel::<u32>(0);
        let (to_a, a_rx) = mpsc::sync_channel::<u32>(0);
        let a = std::thread::spawn(side(1, to_b, a_rx));
        let b = std::thread::spawn(side(2, to_a, b_rx));
        check((a.join().unwrap(), b.join().unwrap()));
        sched.stop();
    });
}

/// Many selects sending and many selects receiving on one rendezvous mpmc channel, fibers
/// and plain threads mixed, with short timeouts: every send that reported success was
/// received exactly once, no timed-out send's message was received, and nothing was lost.
#[test]
fn offered_sends_are_received_once_and_timed_out_ones_never() {
    with_deadline(|| {
        let sched = started(2);
        let (tx, rx) = mpmc::sync_channel::<u64>(0);
        let received = Arc::new(std::sync::Mutex::new(Vec::new()));
        let mut senders = Vec::new();
        let mut receivers = Vec::new();
        let sender = |id: u64, tx: mpmc::SyncSender<u64>| {
            move || {
                let mut ok = Vec::new();
                for i in 0..300u64 {
                    let m = id << 32 | i;
                    fibra::select! {
                        send(tx, m) -> r => { r.unwrap(); ok.push(m) },
                        default(Duration::from_micros(50 * (i % 4))) => {},
                    }
                }
                ok
            }
        };
        let receiver = |rx: mpmc::Receiver<u64>, got: Arc<std::sync::Mutex<Vec<u64>>>| {
            move || loop {
                fibra::select! {
                    recv(rx) -> m => match m {
                        Ok(m) => got.lock().unwrap().push(m),
                        Err(_) => break,
                    },
                    default(Duration::from_micros(200)) => {},
                }
            }
        };
        for id in 0..4 {
            senders.push(sched.spawn(sender(id, tx.clone())));
            receivers.push(sched.spawn(receiver(rx.clone(), received.clone())));
        }
        // Two plain threads on each side too: they park on the same offers.
        let threads: Vec<_> = (4..6)
            .map(|id| std::thread::spawn(sender(id, tx.clone())))
            .collect();
        let thread_rx: Vec<_> = (0..2)
            .map(|_| std::thread::spawn(receiver(rx.clone(), received.clone())))
            .collect();
        drop((tx, rx));
        let mut sent: Vec<u64> = senders.into_iter().flat_map(finish).collect();
        for t in threads {
            sent.extend(t.join().unwrap());
        }
        for r in receivers {
            finish(r);
        }
        for t in thread_rx {
            t.join().unwrap();
        }
        let mut got = std::mem::take(&mut *received.lock().unwrap());
        sent.sort_unstable();
        got.sort_unstable();
        assert!(!sent.is_empty(), "no send ever met a receiver");
        assert_eq!(got, sent, "received ≠ reported sent");
        sched.stop();
    });
}

/// A select offering a rendezvous send while its other arm gets ready at the same moment:
/// exactly one of the two completes, and the other's message stays where it was.
#[test]
fn an_offered_send_and_another_arm_never_both_complete() {
    with_deadline(|| {
        let sched = started(2);
        let (mut sends, mut recvs) = (0, 0);
        for round in 0..500u32 {
            let (tx0, rx0) = mpsc::sync_channel::<u32>(0);
            let (tx1, rx1) = mpsc::channel::<u32>();
            let sel = sched.spawn(move || {
                fibra::select! {
                    send(tx0, round) -> r => { r.unwrap(); (0, rx1) },
                    recv(rx1) -> m => { assert_eq!(m.unwrap(), round + 1); (1, rx1) },
                    default(LIMIT) => panic!("round {round}: nothing completed"),
                }
            });
            // The receive and the message on the other channel race with each other.
            let taker = sched.spawn(move || rx0.recv_timeout(Duration::from_millis(20)).ok());
            let feeder = sched.spawn(move || tx1.send(round + 1).unwrap());
            finish(feeder);
            let (arm, rx1) = finish(sel);
            let took = finish(taker);
            match arm {
                0 => {
                    sends += 1;
                    assert_eq!(
                        took,
                        Some(round),
                        "round {round}: send chosen, not received"
                    );
                    // The receive arm did not complete: its message is still there.
                    assert_eq!(rx1.try_recv(), Ok(round + 1), "round {round}");
                }
                _ => {
                    recvs += 1;
                    assert_eq!(took, None, "round {round}: both arms completed");
                }
            }
        }
        eprintln!("send chosen {sends}×, receive {recvs}×");
        sched.stop();
    });
}

/// The message of a send that is offered and not taken goes back to the select: dropped
/// exactly once when the select times out (outside the channel's lock: its destructor uses
/// the channel), given back in the error when the receiver goes away meanwhile, and dropped
/// once by a select cancelled while it offers.
#[test]
fn an_offered_message_is_given_back_or_dropped_exactly_once() {
    struct UsesChannel(Arc<AtomicUsize>, Option<mpsc::SyncSender<UsesChannel>>);
    impl Drop for UsesChannel {
        fn drop(&mut self) {
            // Deadlocks if dropped under the channel's lock.
            if let Some(tx) = self.1.take() {
                let _ = tx.try_send(UsesChannel(Arc::new(AtomicUsize::new(0)), None));
            }
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }
    with_deadline(|| {
        let sched = started(2);
        // Timed out.
        let (tx, rx) = mpsc::sync_channel::<UsesChannel>(0);
        let drops = Arc::new(AtomicUsize::new(0));
        let d = drops.clone();
        let h = sched.spawn(move || {
            let m = UsesChannel(d, Some(tx.clone()));
            fibra::select! {
                send(tx, m) -> _ => panic!("nobody receives"),
                default(Duration::from_millis(30)) => {},
            }
        });
        finish(h);
        assert_eq!(drops.load(Ordering::SeqCst), 1);
        drop(rx);
        // The receiver is dropped while the select offers: the message comes back.
        let (tx, rx) = mpsc::sync_channel::<u32>(0);
        let h = sched.spawn(move || {
            fibra::select! {
                send(tx, 77) -> r => r.unwrap_err().0,
                default(LIMIT) => panic!("the receiver's drop wakes the select"),
            }
        });
        std::thread::sleep(Duration::from_millis(30));
        drop(rx);
        assert_eq!(finish(h), 77);
        // Cancelled while it offers.
        let (tx, rx) = mpmc::sync_channel::<crate::common::Counted>(0);
        let drops = Arc::new(AtomicUsize::new(0));
        let d = drops.clone();
        let h = sched.spawn(move || {
            let m = crate::common::Counted(d);
            fibra::select! {
                send(tx, m) -> _ => panic!("nobody receives"),
            }
        });
        std::thread::sleep(Duration::from_millis(30));
        h.cancel();
        assert!(h.wait_timeout(LIMIT));
        assert!(h.join().is_err(), "cancelled");
        assert_eq!(drops.load(Ordering::SeqCst), 1);
        assert!(
            rx.try_recv().is_err(),
            "the cancelled select's offer is gone"
        );
        sched.stop();
    });
}

/// A rendezvous send offered by a select on a plain thread is taken by `try_recv`, by a
/// `recv` that starts later, and by `recv_async`.
#[test]
fn plain_receives_take_an_offered_send() {
    with_deadline(|| {
        let (tx, rx) = mpsc::sync_channel::<u32>(0);
        let offer = std::thread::spawn(move || {
            for i in 0..3 {
                fibra::select! {
                    send(tx, i) -> r => r.unwrap(),
                    default(LIMIT) => panic!("offer {i} not taken"),
                }
            }
        });
        let deadline = Instant::now() + LIMIT;
        let first = loop {
            if let Ok(m) = rx.try_recv() {
                break m;
            }
            assert!(Instant::now() < deadline, "try_recv never found the offer");
            std::thread::yield_now();
        };
        assert_eq!(first, 0);
        assert_eq!(rx.recv(), Ok(1));
        assert_eq!(fibra::future::block_on(rx.recv_async()), Ok(2));
        offer.join().unwrap();
    });
}

/// One select offering two sends on the same rendezvous channel (and, through `Select`, a
/// third on another): the receiver gets the message of the arm the select reports, and the
/// other messages stay with the select.
#[test]
fn several_offers_of_one_select_keep_their_own_messages() {
    with_deadline(|| {
        let sched = started(2);
        for round in 0..200u32 {
            let (tx, rx) = mpmc::sync_channel::<u32>(0);
            let (tx2, rx2) = mpsc::sync_channel::<u32>(0);
            let sel = sched.spawn(move || {
                let mut s = fibra::sync::SelectArms::new();
                s.send(&tx, 10, |r| r.map(|()| 10))
                    .send(&tx, 20, |r| r.map(|()| 20))
                    .send(&tx2, 30, |r| r.map(|()| 30));
                s.wait_timeout(LIMIT).expect("a receiver comes").unwrap()
            });
            if round % 2 == 0 {
                std::thread::sleep(Duration::from_micros(100));
            }
            let got = rx.recv_timeout(LIMIT).unwrap();
            assert_eq!(finish(sel), got, "round {round}");
            assert!(rx2.try_recv().is_err(), "round {round}: two arms completed");
        }
        sched.stop();
    });
}

/// CPU time the calling thread has used.
fn thread_cpu() -> Duration {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: a valid out-pointer.
    assert_eq!(
        unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) },
        0
    );
    Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)
}

/// A select that sends and receives on one rendezvous channel, alone on it, waits out its
/// timeout asleep: its own offer must not wake it (it used to spin at 100% CPU), and it
/// never pairs with itself.
#[test]
fn a_select_alone_on_both_ends_of_a_rendezvous_channel_sleeps() {
    with_deadline(|| {
        let (tx, rx) = mpsc::sync_channel::<u32>(0);
        let (mtx, mrx) = mpmc::sync_channel::<u32>(0);
        let waited = std::thread::spawn(move || {
            let c0 = thread_cpu();
            let a = fibra::select! {
                send(tx, 1) -> _ => "sent",
                recv(rx) -> _ => "received",
                default(Duration::from_millis(300)) => "timeout",
            };
            let b = fibra::select! {
                send(mtx, 1) -> _ => "sent",
                recv(mrx) -> _ => "received",
                default(Duration::from_millis(300)) => "timeout",
            };
            ((a, b), thread_cpu() - c0)
        });
        let (outcome, cpu) = waited.join().unwrap();
        assert_eq!(outcome, ("timeout", "timeout"));
        assert!(
            cpu < Duration::from_millis(200),
            "two 300 ms waits burnt {cpu:?}"
        );
    });
}

/// Two selects each offering a send and waiting to receive on ONE rendezvous channel (Go's
/// `select { case ch <- x: case y := <-ch: }`): every round one sends and the other
/// receives that very message, and they meet without waiting out their timeouts.
#[test]
fn two_selects_exchanging_on_one_rendezvous_channel_meet() {
    with_deadline(|| {
        const ROUNDS: usize = 300;
        let sched = started(2);
        let (tx, rx) = mpmc::sync_channel::<u64>(0);
        let side = |me: u64, tx: mpmc::SyncSender<u64>, rx: mpmc::Receiver<u64>| {
            move || {
                let (mut sent, mut got) = (Vec::new(), Vec::new());
                for i in 0..ROUNDS as u64 {
                    fibra::select! {
                        send(tx, me << 32 | i) -> r => { r.unwrap(); sent.push(me << 32 | i) },
                        recv(rx) -> m => got.push(m.unwrap()),
                        default(LIMIT) => panic!("side {me} round {i}: no partner"),
                    }
                }
                (sent, got)
            }
        };
        // Plain threads, then fibers.
        let a = std::thread::spawn(side(1, tx.clone(), rx.clone()));
        let b = std::thread::spawn(side(2, tx.clone(), rx.clone()));
        let ((a_sent, a_got), (b_sent, b_got)) = (a.join().unwrap(), b.join().unwrap());
        assert_eq!((a_sent, b_sent), (b_got, a_got));
        let a = sched.spawn(side(3, tx.clone(), rx.clone()));
        let b = sched.spawn(side(4, tx, rx));
        let ((a_sent, a_got), (b_sent, b_got)) = (finish(a), finish(b));
        assert_eq!((a_sent, b_sent), (b_got, a_got));
        sched.stop();
    });
}

/// A task waker of a hand-rolled executor that has shut down: `wake` drops the task, and
/// with it the future it owns.
struct DroppingTask {
    fut: std::sync::Mutex<Option<std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>>>>,
}

impl std::task::Wake for DroppingTask {
    fn wake(self: Arc<Self>) {
        drop(self);
    }
}

/// A send fires the watcher of a pending `recv_async` future; the waker it wakes belongs to
/// an executor that has shut down and drops the task, whose future's `Drop` takes the
/// channel's lock. Wakers are woken after the lock is released (the send used to deadlock).
/// The send runs in a child process, so a deadlocked sender cannot outlive the test.
#[test]
fn a_send_waking_a_waker_that_drops_its_recv_future_returns() {
    crate::common::in_child(|| {
        let (tx, rx) = mpsc::channel::<u32>();
        let rx = Arc::new(rx);
        let r = rx.clone();
        let task = Arc::new(DroppingTask {
            fut: std::sync::Mutex::new(Some(Box::pin(async move {
                let _ = r.recv_async().await;
            }))),
        });
        let waker = std::task::Waker::from(task.clone());
        let mut fut = task.fut.lock().unwrap().take().unwrap();
        let mut cx = std::task::Context::from_waker(&waker);
        assert!(fut.as_mut().poll(&mut cx).is_pending());
        // Only the waker registered in the channel keeps the task, and the future, alive.
        *task.fut.lock().unwrap() = Some(fut);
        drop((waker, task));
        let (done_tx, done) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            tx.send(1).unwrap();
            done_tx.send(()).unwrap();
        });
        assert!(
            done.recv_timeout(LIMIT).is_ok(),
            "the send did not return within {LIMIT:?}"
        );
    })
    .assert_ok("a send that wakes a waker dropping its recv future did not return");
}
