//! `fibra::select!`: the first of several channel operations, fairly chosen, with
//! `default` and timeouts, from fibers and threads.

mod common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{finish, started, with_deadline, LIMIT};
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
        let mut sel = fibra::sync::Select::new();
        for (i, rx) in receivers.iter().enumerate() {
            sel.recv(rx, move |m| (i, m.unwrap()));
        }
        assert_eq!(sel.len(), 64);
        assert_eq!(sel.wait(), (41, 4100));
        finish(h);
        // Nothing ready: try_wait and wait_timeout say so.
        let mut sel = fibra::sync::Select::new();
        sel.recv(&receivers[0], |_| ());
        assert!(sel.try_wait().is_none());
        let mut sel = fibra::sync::Select::new();
        sel.recv(&receivers[0], |_| ());
        sel.send(&senders[1], 5, |_| ());
        assert!(sel.wait_timeout(Duration::from_millis(5)).is_none());
        assert!(fibra::sync::Select::<()>::new().try_wait().is_none());
        sched.stop();
    });
}
