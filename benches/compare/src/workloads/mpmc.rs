//! mpmc: 4 producers and 4 consumers share one bounded channel of capacity 128; the producers
//! send 100 000 messages in all (25 000 each), the consumers receive until the channel is
//! disconnected. Figure: ns per message (first spawn to the last consumer's end, / 100 000).
//! Every consumer's count is added up and checked.
//!
//! fibra: `fibra::sync::mpmc::sync_channel` between fibers. tokio: `async-channel`'s bounded
//! channel between tasks (tokio itself has no multi-consumer channel). std: crossbeam-channel's
//! `bounded` between plain threads. may's mpmc channel is unbounded only; Go has no version.

use std::sync::mpsc;
use std::time::Instant;

use super::{Cfg, Peer};
use crate::measure::{ns_per, repeat};
use crate::rt;

const PRODUCERS: usize = 4;
const CONSUMERS: usize = 4;
const MESSAGES: usize = 100_000;
const PER_PRODUCER: usize = MESSAGES / PRODUCERS;
const CAPACITY: usize = 128;

pub fn run(peer: Peer, cfg: Cfg) -> Result<Vec<f64>, String> {
    match peer {
        Peer::Fibra => Ok(fibra(cfg)),
        Peer::Tokio => Ok(tokio(cfg)),
        Peer::Std => Ok(std_threads(cfg)),
        Peer::May | Peer::Go | Peer::FibraNet => Err("not run in-process".into()),
    }
}

/// Adds up the consumers' counts and checks that every message arrived once.
fn check(counts: impl IntoIterator<Item = usize>) {
    let total: usize = counts.into_iter().sum();
    assert_eq!(total, MESSAGES, "every message received once");
}

fn fibra(cfg: Cfg) -> Vec<f64> {
    let sched = rt::fibra(cfg.threads);
    let v = repeat(cfg.warmup, cfg.reps, || {
        let (done, all_done) = mpsc::sync_channel(CONSUMERS);
        let start = Instant::now();
        let (tx, rx) = fibra::sync::mpmc::sync_channel::<usize>(CAPACITY);
        for _ in 0..CONSUMERS {
            let (rx, done) = (rx.clone(), done.clone());
            let h = sched.submit(
                move || done.send(rx.iter().count()).expect("main waits"),
                None,
            );
            drop(h.expect("submit"));
        }
        drop(rx);
        for p in 0..PRODUCERS {
            let tx = tx.clone();
            let h = sched.submit(
                move || {
                    for i in 0..PER_PRODUCER {
                        tx.send(p * PER_PRODUCER + i).expect("consumers wait");
                    }
                },
                None,
            );
            drop(h.expect("submit"));
        }
        drop(tx);
        check((0..CONSUMERS).map(|_| all_done.recv().expect("every consumer signals")));
        ns_per(start.elapsed(), MESSAGES)
    });
    rt::fibra_stop(sched);
    v
}

fn tokio(cfg: Cfg) -> Vec<f64> {
    let rt = rt::tokio(cfg.threads);
    let v = repeat(cfg.warmup, cfg.reps, || {
        let (done, all_done) = mpsc::sync_channel(CONSUMERS);
        let start = Instant::now();
        let (tx, rx) = async_channel::bounded::<usize>(CAPACITY);
        for _ in 0..CONSUMERS {
            let (rx, done) = (rx.clone(), done.clone());
            rt.spawn(async move {
                let mut n = 0;
                while rx.recv().await.is_ok() {
                    n += 1;
                }
                done.send(n).expect("main waits");
            });
        }
        drop(rx);
        for p in 0..PRODUCERS {
            let tx = tx.clone();
            rt.spawn(async move {
                for i in 0..PER_PRODUCER {
                    tx.send(p * PER_PRODUCER + i).await.expect("consumers wait");
                }
            });
        }
        drop(tx);
        check((0..CONSUMERS).map(|_| all_done.recv().expect("every consumer signals")));
        ns_per(start.elapsed(), MESSAGES)
    });
    rt::tokio_stop(rt);
    v
}

fn std_threads(cfg: Cfg) -> Vec<f64> {
    repeat(cfg.warmup, cfg.reps, || {
        let start = Instant::now();
        let (tx, rx) = crossbeam_channel::bounded::<usize>(CAPACITY);
        let consumers: Vec<_> = (0..CONSUMERS)
            .map(|_| {
                let rx = rx.clone();
                std::thread::spawn(move || rx.iter().count())
            })
            .collect();
        drop(rx);
        let producers: Vec<_> = (0..PRODUCERS)
            .map(|p| {
                let tx = tx.clone();
                std::thread::spawn(move || {
                    for i in 0..PER_PRODUCER {
                        tx.send(p * PER_PRODUCER + i).expect("consumers wait");
                    }
                })
            })
            .collect();
        drop(tx);
        for p in producers {
            p.join().expect("producer thread");
        }
        check(
            consumers
                .into_iter()
                .map(|c| c.join().expect("consumer thread")),
        );
        ns_per(start.elapsed(), MESSAGES)
    })
}
