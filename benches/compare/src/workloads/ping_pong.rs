//! ping_pong: 1 000 pairs; each pair's first task spawns its partner and the two round-trip two
//! oneshot messages (ping, pong). The last pair to finish signals the main thread.
//! Figure: ns per round trip (start to last signal, / 1 000), spawns included, as in tokio's
//! `rt_multi_threaded` bench.
//!
//! fibra: `fibra::sync::oneshot`. tokio: `tokio::sync::oneshot`. may: `may::sync::mpsc` used
//! once.
//! std: two threads per pair and `std::sync::mpsc`.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{mpsc, Arc};
use std::time::Instant;

use super::{Cfg, Peer};
use crate::measure::{ns_per, repeat};
use crate::rt;

const PAIRS: usize = 1_000;

pub fn run(peer: Peer, cfg: Cfg) -> Result<Vec<f64>, String> {
    match peer {
        Peer::Fibra => Ok(fibra(cfg)),
        Peer::Tokio => Ok(tokio(cfg)),
        Peer::May => Ok(may(cfg)),
        Peer::Std => Ok(std_threads(cfg)),
        Peer::Go | Peer::FibraNet => Err("not run in-process".into()),
    }
}

/// Counts a finished pair down; the last one signals the main thread.
pub(super) fn pair_done(rem: &AtomicUsize, done: &mpsc::SyncSender<()>) {
    if rem.fetch_sub(1, Ordering::AcqRel) == 1 {
        done.send(()).expect("main thread waits");
    }
}

fn fibra(cfg: Cfg) -> Vec<f64> {
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
                            let (ping_tx, ping_rx) = fibra::sync::oneshot::channel::<()>();
                            let (pong_tx, pong_rx) = fibra::sync::oneshot::channel::<()>();
                            let partner = s2.submit(
                                move || {
                                    ping_rx.recv().expect("ping");
                                    pong_tx.send(()).expect("pong");
                                },
                                None,
                            );
                            drop(partner.expect("submit"));
                            ping_tx.send(()).expect("ping");
                            pong_rx.recv().expect("pong");
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
        ns_per(t, PAIRS)
    });
    rt::fibra_stop(sched);
    v
}

fn tokio(cfg: Cfg) -> Vec<f64> {
    let rt = rt::tokio(cfg.threads);
    let v = repeat(cfg.warmup, cfg.reps, || {
        let (done, all_done) = mpsc::sync_channel(1);
        let rem = Arc::new(AtomicUsize::new(PAIRS));
        let start = Instant::now();
        let outer = rt.spawn(async move {
            for _ in 0..PAIRS {
                let (rem, done) = (rem.clone(), done.clone());
                tokio::spawn(async move {
                    let (ping_tx, ping_rx) = tokio::sync::oneshot::channel::<()>();
                    let (pong_tx, pong_rx) = tokio::sync::oneshot::channel::<()>();
                    tokio::spawn(async move {
                        ping_rx.await.expect("ping");
                        pong_tx.send(()).expect("pong");
                    });
                    ping_tx.send(()).expect("ping");
                    pong_rx.await.expect("pong");
                    pair_done(&rem, &done);
                });
            }
        });
        all_done.recv().expect("last pair signals");
        let t = start.elapsed();
        rt.block_on(outer).expect("outer task");
        ns_per(t, PAIRS)
    });
    rt::tokio_stop(rt);
    v
}

fn may(cfg: Cfg) -> Vec<f64> {
    rt::may(cfg.threads);
    repeat(cfg.warmup, cfg.reps, || {
        let (done, all_done) = mpsc::sync_channel(1);
        let rem = Arc::new(AtomicUsize::new(PAIRS));
        let start = Instant::now();
        let outer = rt::may_go(move || {
            for _ in 0..PAIRS {
                let (rem, done) = (rem.clone(), done.clone());
                rt::may_go(move || {
                    let (ping_tx, ping_rx) = may::sync::mpsc::channel::<()>();
                    let (pong_tx, pong_rx) = may::sync::mpsc::channel::<()>();
                    rt::may_go(move || {
                        ping_rx.recv().expect("ping");
                        pong_tx.send(()).expect("pong");
                    });
                    ping_tx.send(()).expect("ping");
                    pong_rx.recv().expect("pong");
                    pair_done(&rem, &done);
                });
            }
        });
        all_done.recv().expect("last pair signals");
        let t = start.elapsed();
        outer.join().expect("outer coroutine");
        ns_per(t, PAIRS)
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
                    let (ping_tx, ping_rx) = mpsc::channel::<()>();
                    let (pong_tx, pong_rx) = mpsc::channel::<()>();
                    std::thread::spawn(move || {
                        ping_rx.recv().expect("ping");
                        pong_tx.send(()).expect("pong");
                    });
                    ping_tx.send(()).expect("ping");
                    pong_rx.recv().expect("pong");
                    pair_done(&rem, &done);
                });
            }
        });
        all_done.recv().expect("last pair signals");
        let t = start.elapsed();
        outer.join().expect("outer thread");
        ns_per(t, PAIRS)
    })
}
