//! `select!` offering its sends on rendezvous channels, under stress: rings of selects, twelve
//! arms of mixed kinds, cancellation and `stop_timeout` while offers are claimed, receivers
//! dropped under outstanding offers, non-blocking selects (which never offer), messages
//! whose `Drop` panics, and `recv_async` futures in tokio tasks claiming offers.

use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex as StdMutex};
use std::time::{Duration, Instant};

use crate::common::{finish, started, with_deadline, Counted, LIMIT};
use fibra::sync::{mpmc, mpsc, CancellationToken};

// ------------------------------------------------------------------ select: rings

/// Three selects in a ring, each offering to the next and receiving from the previous,
/// fibers and a thread: for one second they keep exchanging, messages are conserved per
/// channel, and the exchange rate is not a livelock's.
#[test]
fn a_ring_of_three_selects_keeps_exchanging() {
    with_deadline(|| {
        let sched = started(2);
        let stop = Arc::new(AtomicBool::new(false));
        let chans: Vec<_> = (0..3).map(|_| mpsc::sync_channel::<u64>(0)).collect();
        let mut txs: Vec<Option<mpsc::SyncSender<u64>>> =
            chans.iter().map(|(t, _)| Some(t.clone())).collect();
        let mut rxs: Vec<Option<mpsc::Receiver<u64>>> =
            chans.into_iter().map(|(_, r)| Some(r)).collect();
        let party =
            |me: u64, tx: mpsc::SyncSender<u64>, rx: mpsc::Receiver<u64>, stop: Arc<AtomicBool>| {
                move || {
                    let (mut sent, mut got) = (Vec::new(), Vec::new());
                    let mut i = 0u64;
                    while !stop.load(Ordering::Relaxed) {
                        let m = me << 32 | i;
                        fibra::select! {
                            send(tx, m) -> r => if r.is_ok() { sent.push(m); i += 1 },
                            recv(rx) -> m => if let Ok(m) = m { got.push(m) },
                            default(Duration::from_millis(20)) => {},
                        }
                    }
                    // Drain: the sender of my channel may be blocked on an offer I should take.
                    drop(tx);
                    while let Ok(m) = rx.recv_timeout(Duration::from_millis(50)) {
                        got.push(m);
                    }
                    (sent, got)
                }
            };
        // party k sends on channel k, receives on channel (k+2)%3
        let mut hs = Vec::new();
        let mut th = None;
        for k in 0..3u64 {
            let tx = txs[k as usize].take().unwrap();
            let rx = rxs[((k + 2) % 3) as usize].take().unwrap();
            let f = party(k, tx, rx, stop.clone());
            if k == 2 {
                th = Some(std::thread::spawn(f));
            } else {
                hs.push(sched.spawn(f));
            }
        }
        std::thread::sleep(Duration::from_secs(1));
        stop.store(true, Ordering::Relaxed);
        let mut results: Vec<(Vec<u64>, Vec<u64>)> = hs.into_iter().map(finish).collect();
        results.push(th.unwrap().join().unwrap());
        let mut total = 0;
        for k in 0..3usize {
            let sent = &results[k].0;
            let got_by_next = &results[(k + 1) % 3].1;
            assert_eq!(sent, got_by_next, "channel {k}: sent ≠ received");
            total += sent.len();
        }
        eprintln!("ring: {total} exchanges in 1 s");
        assert!(total > 100, "only {total} exchanges in a second: livelock");
        sched.stop();
    });
}

// ------------------------------------------------------------------ select: 12 arms

#[derive(Debug)]
struct Tagged {
    id: u64,
    drops: Arc<AtomicUsize>,
}

impl Drop for Tagged {
    fn drop(&mut self) {
        self.drops.fetch_add(1, Ordering::SeqCst);
    }
}

/// 12 arms of every kind: 5 offered rendezvous sends (mpsc and mpmc) taken by recv_timeout,
/// try_recv, recv_async and selects; 5 receives on channels fed by peers; a token; and a
/// send on a bounded(1) channel kept full. Many rounds, fibers and a thread: exactly one arm per
/// select completes, and every message is either received once or dropped once.
#[test]
fn twelve_arms_of_mixed_kinds_complete_exactly_one_and_conserve_messages() {
    with_deadline(|| {
        let sched = started(2);
        const ROUNDS: u64 = 400;
        let drops = Arc::new(AtomicUsize::new(0));
        let created = Arc::new(AtomicUsize::new(0));
        let stop = Arc::new(AtomicBool::new(false));
        // Offered sends: 3 mpsc rendezvous, 2 mpmc rendezvous.
        let (s0, r0) = mpsc::sync_channel::<Tagged>(0);
        let (s1, r1) = mpsc::sync_channel::<Tagged>(0);
        let (s2, r2) = mpsc::sync_channel::<Tagged>(0);
        let (s3, r3) = mpmc::sync_channel::<Tagged>(0);
        let (s4, r4) = mpmc::sync_channel::<Tagged>(0);
        // Receives: fed channels.
        let (f5, q5) = mpsc::channel::<Tagged>();
        let (f6, q6) = mpsc::sync_channel::<Tagged>(2);
        let (f7, q7) = mpmc::channel::<Tagged>();
        let (f8, q8) = mpmc::sync_channel::<Tagged>(0);
        let (f9, q9) = mpsc::sync_channel::<Tagged>(0);
        let token = CancellationToken::new();
        // A bounded(1) channel kept full (the send never completes unless drained).
        let (s11, r11) = mpsc::sync_channel::<Tagged>(1);
        s11.send(Tagged {
            id: u64::MAX,
            drops: drops.clone(),
        })
        .unwrap();
        created.fetch_add(1, Ordering::SeqCst);

        let received = Arc::new(StdMutex::new(Vec::<u64>::new()));
        // Peers taking the offered sends: each a different kind of receive.
        let mut peers = Vec::new();
        {
            let (st, got) = (stop.clone(), received.clone());
            peers.push(std::thread::spawn(move || {
                while !st.load(Ordering::Relaxed) {
                    if let Ok(m) = r0.recv_timeout(Duration::from_millis(1)) {
                        got.lock().unwrap().push(m.id);
                    }
                }
                r0
            }));
        }
        {
            let (st, got) = (stop.clone(), received.clone());
            peers.push(std::thread::spawn(move || {
                while !st.load(Ordering::Relaxed) {
                    if let Ok(m) = r1.try_recv() {
                        got.lock().unwrap().push(m.id);
                    } else {
                        std::thread::sleep(Duration::from_micros(300));
                    }
                }
                r1
            }));
        }
        {
            let (st, got) = (stop.clone(), received.clone());
            peers.push(std::thread::spawn(move || {
                while !st.load(Ordering::Relaxed) {
                    let fut = async {
                        let r = r2.recv_async().await;
                        r
                    };
                    // block_on with a timeout via a select-free approach: poll once via a
                    // tiny wrapper that gives up after a short time.
                    let r = fibra::future::block_on(Timeout {
                        fut: Box::pin(fut),
                        until: Instant::now() + Duration::from_millis(2),
                    });
                    if let Some(Ok(m)) = r {
                        got.lock().unwrap().push(m.id);
                    }
                }
                r2
            }));
        }
        let mk_sel_rx = |rx: mpmc::Receiver<Tagged>| {
            let (st, got) = (stop.clone(), received.clone());
            sched.spawn(move || {
                while !st.load(Ordering::Relaxed) {
                    fibra::select! {
                        recv(rx) -> m => if let Ok(m) = m { got.lock().unwrap().push(m.id) },
                        default(Duration::from_millis(1)) => {},
                    }
                }
            })
        };
        let fiber_peers = vec![mk_sel_rx(r3), mk_sel_rx(r4)];
        // Feeders for the receive arms.
        let fed = Arc::new(AtomicUsize::new(0));
        let feeders: Vec<_> = (0..2)
            .map(|k| {
                let (f5, f6, f7, f8, f9) =
                    (f5.clone(), f6.clone(), f7.clone(), f8.clone(), f9.clone());
                let (st, drops, created) = (stop.clone(), drops.clone(), created.clone());
                std::thread::spawn(move || {
                    let mut n = 0u64;
                    while !st.load(Ordering::Relaxed) {
                        n += 1;
                        let id = (1 << 40) | (k << 36) | n;
                        created.fetch_add(1, Ordering::SeqCst);
                        let m = Tagged {
                            id,
                            drops: drops.clone(),
                        };
                        let r = match n % 5 {
                            0 => f5.send(m).map_err(|e| e.0),
                            // Never a blocking send: once the selects are done, nothing
                            // drains the bounded channel, and the feeder must see `stop`.
                            1 => f6.try_send(m).map_err(|e| match e {
                                mpsc::TrySendError::Full(m)
                                | mpsc::TrySendError::Disconnected(m) => m,
                            }),
                            2 => f7.send(m).map_err(|e| e.0),
                            3 => f8
                                .send_timeout(m, Duration::from_millis(1))
                                .map_err(|e| e.into_inner()),
                            _ => f9.try_send(m).map_err(|e| match e {
                                mpsc::TrySendError::Full(m)
                                | mpsc::TrySendError::Disconnected(m) => m,
                            }),
                        };
                        if r.is_err() {
                            // not sent: dropped here
                        }
                        std::thread::sleep(Duration::from_micros(200));
                    }
                })
            })
            .collect();
        let _ = fed;
        drop((f5, f6, f7, f8, f9));

        // The selects: fibers and one thread.
        let selected = Arc::new(StdMutex::new(Vec::<(usize, u64)>::new()));
        let run_rounds = {
            let drops = drops.clone();
            let created = created.clone();
            let selected = selected.clone();
            move |who: u64,
                  s0: mpsc::SyncSender<Tagged>,
                  s1: mpsc::SyncSender<Tagged>,
                  s2: mpsc::SyncSender<Tagged>,
                  s3: mpmc::SyncSender<Tagged>,
                  s4: mpmc::SyncSender<Tagged>,
                  q5: Arc<mpsc::Receiver<Tagged>>,
                  q6: Arc<mpsc::Receiver<Tagged>>,
                  q7: mpmc::Receiver<Tagged>,
                  q8: mpmc::Receiver<Tagged>,
                  q9: Arc<mpsc::Receiver<Tagged>>,
                  token: CancellationToken,
                  s11: mpsc::SyncSender<Tagged>| {
                move || {
                    for round in 0..ROUNDS {
                        let base = (who << 48) | (round << 4);
                        let mk = |k: u64| {
                            created.fetch_add(1, Ordering::SeqCst);
                            Tagged {
                                id: base | k,
                                drops: drops.clone(),
                            }
                        };
                        let (arm, id) = fibra::select! {
                            send(s0, mk(0)) -> r => { r.unwrap(); (0, base) },
                            send(s1, mk(1)) -> r => { r.unwrap(); (1, base | 1) },
                            send(s2, mk(2)) -> r => { r.unwrap(); (2, base | 2) },
                            send(s3, mk(3)) -> r => { r.unwrap(); (3, base | 3) },
                            send(s4, mk(4)) -> r => { r.unwrap(); (4, base | 4) },
                            recv(*q5) -> m => (5, m.unwrap().id),
                            recv(*q6) -> m => (6, m.unwrap().id),
                            recv(q7) -> m => (7, m.unwrap().id),
                            recv(q8) -> m => (8, m.unwrap().id),
                            recv(*q9) -> m => (9, m.unwrap().id),
                            recv(token) -> _ => (10, u64::MAX - 1),
                            send(s11, mk(11)) -> r => { r.unwrap(); (11, base | 11) },
                        };
                        selected.lock().unwrap().push((arm, id));
                    }
                }
            }
        };
        let q5 = Arc::new(q5);
        let q6 = Arc::new(q6);
        let q9 = Arc::new(q9);
        let mut sels = Vec::new();
        for who in 0..2u64 {
            sels.push(sched.spawn(run_rounds.clone()(
                who,
                s0.clone(),
                s1.clone(),
                s2.clone(),
                s3.clone(),
                s4.clone(),
                q5.clone(),
                q6.clone(),
                q7.clone(),
                q8.clone(),
                q9.clone(),
                token.clone(),
                s11.clone(),
            )));
        }
        let th = std::thread::spawn(run_rounds.clone()(
            2,
            s0.clone(),
            s1.clone(),
            s2.clone(),
            s3.clone(),
            s4.clone(),
            q5.clone(),
            q6.clone(),
            q7.clone(),
            q8.clone(),
            q9.clone(),
            token.clone(),
            s11.clone(),
        ));
        for h in sels {
            finish(h);
        }
        th.join().unwrap();
        stop.store(true, Ordering::Relaxed);
        for f in feeders {
            f.join().unwrap();
        }
        let peer_rx: Vec<_> = peers.into_iter().map(|p| p.join().unwrap()).collect();
        for h in fiber_peers {
            finish(h);
        }
        drop(peer_rx);
        // Drain the receive channels.
        let mut left = 0;
        left += q5.try_iter().count();
        left += q6.try_iter().count();
        left += q7.try_iter().count();
        left += q8.try_iter().count();
        left += q9.try_iter().count();
        let selected = selected.lock().unwrap().clone();
        assert_eq!(selected.len() as u64, 3 * ROUNDS);
        // Sends that reported success ⇔ received by a peer (exactly once).
        let mut sent: Vec<u64> = selected
            .iter()
            .filter(|(a, _)| *a <= 4)
            .map(|&(_, id)| id)
            .collect();
        let mut got = received.lock().unwrap().clone();
        sent.sort_unstable();
        got.sort_unstable();
        assert_eq!(sent, got, "offered sends: reported ≠ received");
        // Arm 11 never: the channel stays full... unless nobody drains it: check it holds 1.
        let elevens = selected.iter().filter(|(a, _)| *a == 11).count();
        assert_eq!(elevens, 0, "a send to a full bounded channel completed");
        assert_eq!(r11.try_iter().count(), 1);
        // Received-arm ids are unique.
        let rec: Vec<u64> = selected
            .iter()
            .filter(|(a, _)| (5..=9).contains(a))
            .map(|&(_, id)| id)
            .collect();
        let uniq: HashSet<_> = rec.iter().collect();
        assert_eq!(uniq.len(), rec.len(), "a fed message was received twice");
        eprintln!(
            "12 arms: {} sends, {} receives, {left} left",
            sent.len(),
            rec.len()
        );
        drop((s0, s1, s2, s3, s4, s11, q7, q8, token));
        drop(selected);
        drop(run_rounds);
        // Everything created was dropped exactly once.
        sched.stop();
        assert_eq!(drops.load(Ordering::SeqCst), created.load(Ordering::SeqCst));
    });
}

/// A future that gives up (`None`) once `until` passes; polls on a short timer thread.
struct Timeout<F> {
    fut: std::pin::Pin<Box<F>>,
    until: Instant,
}

impl<F: std::future::Future> std::future::Future for Timeout<F> {
    type Output = Option<F::Output>;
    fn poll(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Self::Output> {
        if let std::task::Poll::Ready(v) = self.fut.as_mut().poll(cx) {
            return std::task::Poll::Ready(Some(v));
        }
        if Instant::now() >= self.until {
            return std::task::Poll::Ready(None);
        }
        let w = cx.waker().clone();
        let until = self.until;
        std::thread::spawn(move || {
            std::thread::sleep(until.saturating_duration_since(Instant::now()));
            w.wake();
        });
        std::task::Poll::Pending
    }
}

// ------------------------------------------------------------------ select: fibers on one worker

/// The symmetric exchange on one rendezvous channel between fibers of ONE worker, and a ring
/// of three fibers on one worker: they must meet (a fiber whose park returns at once must
/// still let the other fibers run).
#[test]
fn exchanges_between_fibers_of_one_worker_meet() {
    with_deadline(|| {
        let sched = started(1);
        const ROUNDS: usize = 200;
        let (tx, rx) = mpmc::sync_channel::<u64>(0);
        let side = |me: u64, tx: mpmc::SyncSender<u64>, rx: mpmc::Receiver<u64>| {
            move || {
                let (mut sent, mut got) = (Vec::new(), Vec::new());
                let t0 = Instant::now();
                let mut i = 0;
                while sent.len() + got.len() < ROUNDS {
                    assert!(t0.elapsed() < LIMIT, "side {me}: no partner");
                    let m = me << 32 | i;
                    fibra::select! {
                        send(tx, m) -> r => { r.unwrap(); sent.push(m); i += 1 },
                        recv(rx) -> m => got.push(m.unwrap()),
                        default(Duration::from_secs(5)) => {},
                    }
                }
                (sent, got)
            }
        };
        let a = sched.spawn(side(1, tx.clone(), rx.clone()));
        let b = sched.spawn(side(2, tx, rx));
        let (a_sent, a_got) = finish(a);
        let (b_sent, b_got) = finish(b);
        assert_eq!(a_sent, b_got);
        assert_eq!(b_sent, a_got);
        sched.stop();
    });
}

// ------------------------------------------------------------------ select: cancellation

/// A select offering three sends (mpsc and mpmc rendezvous) is cancelled at a random moment
/// while receivers on threads and fibers race for its offers: at most one message per round
/// is received, a round that reports a send had that message received, and every message
/// is dropped exactly once.
#[test]
fn cancelling_a_select_while_its_offers_are_claimed_conserves_messages() {
    with_deadline(|| {
        let sched = started(2);
        let drops = Arc::new(AtomicUsize::new(0));
        let created = Arc::new(AtomicUsize::new(0));
        let stop = Arc::new(AtomicBool::new(false));
        let got = Arc::new(StdMutex::new(Vec::<u64>::new()));
        let (a, ar) = mpsc::sync_channel::<Tagged>(0);
        let (b, br) = mpmc::sync_channel::<Tagged>(0);
        let (c, cr) = mpmc::sync_channel::<Tagged>(0);
        let (_never_tx, never) = mpsc::channel::<Tagged>();
        let never = Arc::new(never);
        let t1 = {
            let (stop, got) = (stop.clone(), got.clone());
            std::thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    if let Ok(m) = ar.recv_timeout(Duration::from_micros(700)) {
                        got.lock().unwrap().push(m.id);
                    }
                }
            })
        };
        let t2 = {
            let (stop, got, br) = (stop.clone(), got.clone(), br.clone());
            std::thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    if let Ok(m) = br.try_recv() {
                        got.lock().unwrap().push(m.id);
                    }
                    std::thread::yield_now();
                }
            })
        };
        let f3 = {
            let (stop, got) = (stop.clone(), got.clone());
            sched.spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    fibra::select! {
                        recv(cr) -> m => if let Ok(m) = m { got.lock().unwrap().push(m.id); },
                        recv(br) -> m => if let Ok(m) = m { got.lock().unwrap().push(m.id); },
                        default(Duration::from_micros(500)) => {},
                    }
                }
            })
        };
        let mut reported = Vec::new();
        let mut cancelled = 0;
        for round in 0..400u64 {
            let (a, b, c, never) = (a.clone(), b.clone(), c.clone(), never.clone());
            let (drops2, created2) = (drops.clone(), created.clone());
            let h = sched.spawn(move || {
                let mk = |k: u64| {
                    created2.fetch_add(1, Ordering::SeqCst);
                    Tagged {
                        id: round << 4 | k,
                        drops: drops2.clone(),
                    }
                };
                fibra::select! {
                    send(a, mk(0)) -> r => { r.unwrap(); 0u64 },
                    send(b, mk(1)) -> r => { r.unwrap(); 1 },
                    send(c, mk(2)) -> r => { r.unwrap(); 2 },
                    recv(*never) -> _ => unreachable!(),
                }
            });
            std::thread::sleep(Duration::from_micros(round % 7 * 150));
            h.cancel();
            assert!(
                h.wait_timeout(LIMIT),
                "round {round}: cancelled select hangs"
            );
            match h.join() {
                Ok(k) => reported.push(round << 4 | k),
                Err(e) => {
                    assert!(e.is_cancelled());
                    cancelled += 1;
                }
            }
        }
        std::thread::sleep(Duration::from_millis(20));
        stop.store(true, Ordering::Relaxed);
        t1.join().unwrap();
        t2.join().unwrap();
        finish(f3);
        let got = got.lock().unwrap().clone();
        let mut rounds: Vec<u64> = got.iter().map(|id| id >> 4).collect();
        rounds.sort_unstable();
        let n = rounds.len();
        rounds.dedup();
        assert_eq!(rounds.len(), n, "two messages of one select were received");
        let got_set: HashSet<u64> = got.iter().copied().collect();
        for id in &reported {
            assert!(got_set.contains(id), "reported send {id:#x} never received");
        }
        eprintln!(
            "cancel: {} reported, {cancelled} cancelled, {} received",
            reported.len(),
            got.len()
        );
        sched.stop();
        assert_eq!(drops.load(Ordering::SeqCst), created.load(Ordering::SeqCst));
    });
}

/// `stop_timeout` while fibers wait in selects offering sends (nobody receives): every
/// message is dropped exactly once, and afterwards no offer is left on the channels.
#[test]
fn stop_timeout_with_selects_offering_drops_each_message_once() {
    with_deadline(|| {
        let sched = started(2);
        let drops = Arc::new(AtomicUsize::new(0));
        let (tx, rx) = mpmc::sync_channel::<Counted>(0);
        let (tx2, rx2) = mpsc::sync_channel::<Counted>(0);
        let tx2 = Arc::new(StdMutex::new(tx2));
        let mut hs = Vec::new();
        for i in 0..50 {
            let (tx, d) = (tx.clone(), drops.clone());
            let tx2 = tx2.lock().unwrap().clone();
            hs.push(sched.spawn(move || {
                let token = CancellationToken::new();
                if i % 2 == 0 {
                    fibra::select! {
                        send(tx, Counted(d.clone())) -> _ => panic!("nobody receives"),
                        send(tx2, Counted(d.clone())) -> _ => panic!("nobody receives"),
                        recv(token) -> _ => unreachable!(),
                    }
                } else {
                    let mut s = fibra::sync::SelectArms::new();
                    s.send(&tx, Counted(d.clone()), |_| panic!("nobody"));
                    s.send(&tx2, Counted(d), |_| panic!("nobody"));
                    s.wait();
                }
            }));
        }
        std::thread::sleep(Duration::from_millis(50));
        sched.stop_timeout(Duration::from_millis(20));
        for h in hs {
            assert!(h.wait_timeout(LIMIT));
            assert!(h.join().unwrap_err().is_cancelled());
        }
        assert_eq!(drops.load(Ordering::SeqCst), 100);
        assert!(rx.try_recv().is_err(), "an offer outlived its select");
        assert!(rx2.try_recv().is_err(), "an offer outlived its select");
    });
}

/// An mpmc rendezvous receiver clone is dropped while a select offers: the remaining clone
/// takes the offer; then the last one is dropped and the next select's send fails with its
/// message back.
#[test]
fn dropping_receiver_clones_while_offers_wait() {
    with_deadline(|| {
        let sched = started(2);
        let (tx, rx) = mpmc::sync_channel::<u32>(0);
        let rx2 = rx.clone();
        let t2 = tx.clone();
        let h = sched.spawn(move || {
            fibra::select! {
                send(t2, 5) -> r => r.map_err(|e| e.0),
                default(LIMIT) => panic!("never met"),
            }
        });
        std::thread::sleep(Duration::from_millis(20));
        drop(rx);
        std::thread::sleep(Duration::from_millis(5));
        assert_eq!(rx2.recv_timeout(LIMIT), Ok(5));
        assert_eq!(finish(h), Ok(()));
        let t2 = tx.clone();
        let h = sched.spawn(move || {
            fibra::select! {
                send(t2, 6) -> r => r.map_err(|e| e.0),
                default(LIMIT) => panic!("the drop must wake it"),
            }
        });
        std::thread::sleep(Duration::from_millis(20));
        drop(rx2);
        assert_eq!(finish(h), Err(6));
        sched.stop();
    });
}

/// A `default` select never offers: a try_recv loop on the other end never gets a message
/// from it, however many times it runs.
#[test]
fn non_blocking_selects_never_offer() {
    with_deadline(|| {
        let (tx, rx) = mpsc::sync_channel::<u32>(0);
        let stop = Arc::new(AtomicBool::new(false));
        let s = stop.clone();
        let th = std::thread::spawn(move || {
            let mut n = 0u64;
            while !s.load(Ordering::Relaxed) {
                fibra::select! {
                    send(tx, 1) -> _ => panic!("a non-blocking send completed"),
                    default => n += 1,
                }
                fibra::select! {
                    send(tx, 2) -> _ => panic!("a zero-timeout send completed"),
                    default(Duration::ZERO) => n += 1,
                }
            }
            n
        });
        let t0 = Instant::now();
        while t0.elapsed() < Duration::from_millis(200) {
            assert!(
                rx.try_recv().is_err(),
                "got a message from a non-blocking select"
            );
        }
        stop.store(true, Ordering::Relaxed);
        assert!(th.join().unwrap() > 0);
    });
}

/// An unselected offered message whose Drop panics: the select's caller sees the panic, and
/// the channel is left clean (no offer, no watcher): a later blocking select on it and a
/// receiver meet normally.
#[test]
fn an_unselected_offered_message_panicking_in_drop_leaves_the_channel_clean() {
    struct Bomb;
    impl Drop for Bomb {
        fn drop(&mut self) {
            if !std::thread::panicking() {
                panic!("bomb");
            }
        }
    }
    with_deadline(|| {
        let sched = started(2);
        let (tx, rx) = mpsc::sync_channel::<Bomb>(0);
        let (ftx, frx) = mpsc::channel::<u32>();
        let rx = Arc::new(rx);
        let tx2 = tx.clone();
        let h = sched.spawn(move || {
            fibra::select! {
                send(tx2, Bomb) -> _ => 0,
                recv(frx) -> m => m.unwrap(),
            }
        });
        std::thread::sleep(Duration::from_millis(20));
        ftx.send(9).unwrap();
        assert!(h.wait_timeout(LIMIT));
        let e = h.join().unwrap_err();
        assert!(e.is_panic());
        assert!(rx.try_recv().is_err(), "a stale offer");
        let h = sched.spawn(move || {
            fibra::select! {
                send(tx, Bomb) -> r => { std::mem::forget(r); 1 },
                default(LIMIT) => 2,
            }
        });
        let m = rx
            .recv_timeout(LIMIT)
            .expect("the second select meets the receiver");
        std::mem::forget(m);
        assert_eq!(finish(h), 1);
        sched.stop();
    });
}

/// `recv_async` futures in tokio tasks race for offers of selects on fibers with short
/// timeouts: what the selects report sent is what the futures received.
#[test]
fn recv_async_in_tokio_tasks_claims_offers_exactly_once() {
    with_deadline(|| {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        let sched = started(2);
        let (tx, rx) = mpsc::sync_channel::<u64>(0);
        let rx = Arc::new(rx);
        let stop = Arc::new(AtomicBool::new(false));
        let mut tasks = Vec::new();
        for _ in 0..3 {
            let (rx, stop) = (rx.clone(), stop.clone());
            tasks.push(rt.spawn(async move {
                let mut got = Vec::new();
                while !stop.load(Ordering::Relaxed) {
                    tokio::select! {
                        m = rx.recv_async() => if let Ok(m) = m { got.push(m) },
                        _ = tokio::time::sleep(Duration::from_micros(300)) => {},
                    }
                }
                got
            }));
        }
        let sels: Vec<_> = (0..3u64)
            .map(|who| {
                let tx = tx.clone();
                sched.spawn(move || {
                    let mut ok = Vec::new();
                    for i in 0..300u64 {
                        let m = who << 32 | i;
                        fibra::select! {
                            send(tx, m) -> r => { r.unwrap(); ok.push(m) },
                            default(Duration::from_micros(100 * (i % 5))) => {},
                        }
                    }
                    ok
                })
            })
            .collect();
        let mut sent: Vec<u64> = sels.into_iter().flat_map(finish).collect();
        std::thread::sleep(Duration::from_millis(10));
        stop.store(true, Ordering::Relaxed);
        let mut got: Vec<u64> = Vec::new();
        for t in tasks {
            got.extend(rt.block_on(t).unwrap());
        }
        sent.sort_unstable();
        got.sort_unstable();
        eprintln!("recv_async: {} sent", sent.len());
        assert_eq!(sent, got);
        sched.stop();
        rt.shutdown_timeout(Duration::from_secs(5));
    });
}
