//! ping_pong_mpsc: 200 pairs; each pair's first task spawns its partner, and the two make 50
//! round trips over two unbounded mpsc channels made for the pair (the number goes one way,
//! plus one comes back, and is checked). The last pair to finish signals the main thread.
//! Figure: ns per round trip (start to last signal, / 10 000), spawns included.
//!
//! Where `ping_pong` measures a pair's one round trip over oneshots (mostly spawning and a
//! first wake-up), this one measures a long-lived pair's repeated wait and wake on the same
//! channels.
//!
//! fibra: `fibra::sync::mpsc::channel`. tokio: `tokio::sync::mpsc::unbounded_channel`. may:
//! `may::sync::mpsc::channel`. std: two threads per pair and `std::sync::mpsc::channel`. Go:
//! channels of capacity 1 (`go/workloads.go`; one message is ever in flight per channel).

use std::sync::atomic::AtomicUsize;
use std::sync::{mpsc, Arc};
use std::time::Instant;

use super::ping_pong::pair_done;
use super::{Cfg, Peer};
use crate::measure::{ns_per, repeat};
use crate::rt;

const PAIRS: usize = 200;
const ROUND_TRIPS: u64 = 50;

pub fn run(peer: Peer, cfg: Cfg) -> Result<Vec<f64>, String> {
    match peer {
        Peer::Fibra => Ok(fibra(cfg)),
        Peer::Tokio => Ok(tokio(cfg)),
        Peer::May => Ok(may(cfg)),
        Peer::Std => Ok(std_threads(cfg)),
        Peer::Go | Peer::FibraNet => Err("not run in-process".into()),
    }
}

/// Round trips in all, the figure's divisor.
const TOTAL: usize = PAIRS * ROUND_TRIPS as usize;

fn fibra(cfg: Cfg) -> Vec<f64> {
    use fibra::sync::mpsc::channel;
    let sched = rt::fibra(cfg.threads);
    let v = repeat(cfg.warmup, cfg.reps, || {
        let (done, all_done) = mpsc::sync_channel(1);
        let rem = Arc::new(AtomicUsize::new(PAIRS));
        let s = sched.clone();
        let start = Instant::now();
        let outer = sched.submit(
            move || {
                for _ in 0..PAIRS {
                    let (s2, rem, done) = (s.clone(), rem.clone(), done.clone());
                    let pair = s.submit(
                        move || {
                            let (ping_tx, ping_rx) = channel::<u64>();
                            let (pong_tx, pong_rx) = channel::<u64>();
                            let partner = s2.submit(
                                move || {
                                    while let Ok(n) = ping_rx.recv() {
                                        pong_tx.send(n + 1).expect("pong");
                                    }
                                },
                                None,
                            );
                            drop(partner.expect("submit"));
                            for n in 0..ROUND_TRIPS {
                                ping_tx.send(n).expect("ping");
                                assert_eq!(pong_rx.recv(), Ok(n + 1), "the answer");
                            }
                            pair_done(&rem, &done);
                        },
                        None,
                    );
                    drop(pair.expect("submit"));
                }
            },
            None,
        );
        let outer = outer.expect("submit");
        all_done.recv().expect("last pair signals");
        let t = start.elapsed();
        outer.join().expect("outer fiber");
        ns_per(t, TOTAL)
    });
    rt::fibra_stop(sched);
    v
}

fn tokio(cfg: Cfg) -> Vec<f64> {
    use tokio::sync::mpsc::unbounded_channel;
    let rt = rt::tokio(cfg.threads);
    let v = repeat(cfg.warmup, cfg.reps, || {
        let (done, all_done) = mpsc::sync_channel(1);
        let rem = Arc::new(AtomicUsize::new(PAIRS));
        let start = Instant::now();
        let outer = rt.spawn(async move {
            for _ in 0..PAIRS {
                let (rem, done) = (rem.clone(), done.clone());
                tokio::spawn(async move {
                    let (ping_tx, mut ping_rx) = unbounded_channel::<u64>();
                    let (pong_tx, mut pong_rx) = unbounded_channel::<u64>();
                    tokio::spawn(async move {
                        while let Some(n) = ping_rx.recv().await {
                            pong_tx.send(n + 1).expect("pong");
                        }
                    });
                    for n in 0..ROUND_TRIPS {
                        ping_tx.send(n).expect("ping");
                        assert_eq!(pong_rx.recv().await, Some(n + 1), "the answer");
                    }
                    pair_done(&rem, &done);
                });
            }
        });
        all_done.recv().expect("last pair signals");
        let t = start.elapsed();
        rt.block_on(outer).expect("outer task");
        ns_per(t, TOTAL)
    });
    rt::tokio_stop(rt);
    v
}

fn may(cfg: Cfg) -> Vec<f64> {
    use may::sync::mpsc::channel;
    rt::may(cfg.threads);
    repeat(cfg.warmup, cfg.reps, || {
        let (done, all_done) = mpsc::sync_channel(1);
        let rem = Arc::new(AtomicUsize::new(PAIRS));
        let start = Instant::now();
        let outer = rt::may_go(move || {
            for _ in 0..PAIRS {
                let (rem, done) = (rem.clone(), done.clone());
                rt::may_go(move || {
                    let (ping_tx, ping_rx) = channel::<u64>();
                    let (pong_tx, pong_rx) = channel::<u64>();
                    rt::may_go(move || {
                        while let Ok(n) = ping_rx.recv() {
                            pong_tx.send(n + 1).expect("pong");
                        }
                    });
                    for n in 0..ROUND_TRIPS {
                        ping_tx.send(n).expect("ping");
                        assert_eq!(pong_rx.recv().ok(), Some(n + 1), "the answer");
                    }
                    pair_done(&rem, &done);
                });
            }
        });
        all_done.recv().expect("last pair signals");
        let t = start.elapsed();
        outer.join().expect("outer coroutine");
        ns_per(t, TOTAL)
    })
}

fn std_threads(cfg: Cfg) -> Vec<f64> {
    repeat(cfg.warmup, cfg.reps, || {
        let (done, all_done) = mpsc::sync_channel(1);
        let rem = Arc::new(AtomicUsize::new(PAIRS));
        let start = Instant::now();
        let outer = std::thread::spawn(move || {
            for _ in 0..PAIRS {
                let (rem, done) = (rem.clone(), done.clone());
                std::thread::spawn(move || {
                    let (ping_tx, ping_rx) = mpsc::channel::<u64>();
                    let (pong_tx, pong_rx) = mpsc::channel::<u64>();
                    std::thread::spawn(move || {
                        while let Ok(n) = ping_rx.recv() {
                            pong_tx.send(n + 1).expect("pong");
                        }
                    });
                    for n in 0..ROUND_TRIPS {
                        ping_tx.send(n).expect("ping");
                        assert_eq!(pong_rx.recv(), Ok(n + 1), "the answer");
                    }
                    pair_done(&rem, &done);
                });
            }
        });
        all_done.recv().expect("last pair signals");
        let t = start.elapsed();
        outer.join().expect("outer thread");
        ns_per(t, TOTAL)
    })
}
