//! broadcast: one sender task sends 10 000 messages through a broadcast channel of capacity
//! 1 024 to 16 receiver tasks, each receiving until the channel closes. The sender yields
//! every 64 messages, so that receivers homed on its worker keep up instead of lagging.
//! Figure: ns per message sent (first spawn to the last receiver's end, / 10 000). Each
//! receiver checks that it received or was told it missed every message.
//!
//! fibra: `fibra::sync::broadcast`. tokio: `tokio::sync::broadcast`. may and std have no
//! broadcast channel; Go has no version.

use std::sync::mpsc;
use std::time::Instant;

use super::{Cfg, Peer};
use crate::measure::{ns_per, repeat};
use crate::rt;

const RECEIVERS: usize = 16;
const MESSAGES: usize = 10_000;
const CAPACITY: usize = 1_024;
const YIELD_EVERY: usize = 64;

pub fn run(peer: Peer, cfg: Cfg) -> Result<Vec<f64>, String> {
    match peer {
        Peer::Fibra => Ok(fibra(cfg)),
        Peer::Tokio => Ok(tokio(cfg)),
        Peer::May | Peer::Std | Peer::Go | Peer::FibraNet => Err("not run in-process".into()),
    }
}

/// A receiver's tally: messages received and messages it was told it missed.
fn check(received: usize, missed: u64) {
    assert_eq!(
        received as u64 + missed,
        MESSAGES as u64,
        "every message received or reported missed"
    );
}

fn fibra(cfg: Cfg) -> Vec<f64> {
    use fibra::sync::broadcast::{self, RecvError};
    let sched = rt::fibra(cfg.threads);
    let v = repeat(cfg.warmup, cfg.reps, || {
        let (done, all_done) = mpsc::sync_channel(RECEIVERS);
        let start = Instant::now();
        let (tx, rx) = broadcast::channel::<usize>(CAPACITY);
        let receivers: Vec<_> = std::iter::once(rx)
            .chain((1..RECEIVERS).map(|_| tx.subscribe()))
            .collect();
        for mut rx in receivers {
            let done = done.clone();
            let h = sched.submit(
                move || {
                    let (mut received, mut missed) = (0, 0);
                    loop {
                        match rx.recv() {
                            Ok(_) => received += 1,
                            Err(RecvError::Lagged(n)) => missed += n,
                            Err(RecvError::Closed) => break,
                        }
                    }
                    check(received, missed);
                    done.send(()).expect("main waits");
                },
                None,
            );
            drop(h.expect("submit"));
        }
        let sender = sched.submit(
            move || {
                for i in 0..MESSAGES {
                    tx.send(i).expect("receivers wait");
                    if i % YIELD_EVERY == YIELD_EVERY - 1 {
                        fibra::Fiber::yield_now();
                    }
                }
            },
            None,
        );
        drop(sender.expect("submit"));
        for _ in 0..RECEIVERS {
            all_done.recv().expect("every receiver signals");
        }
        ns_per(start.elapsed(), MESSAGES)
    });
    rt::fibra_stop(sched);
    v
}

fn tokio(cfg: Cfg) -> Vec<f64> {
    use tokio::sync::broadcast::{self, error::RecvError};
    let rt = rt::tokio(cfg.threads);
    let v = repeat(cfg.warmup, cfg.reps, || {
        let (done, all_done) = mpsc::sync_channel(RECEIVERS);
        let start = Instant::now();
        let (tx, rx) = broadcast::channel::<usize>(CAPACITY);
        let receivers: Vec<_> = std::iter::once(rx)
            .chain((1..RECEIVERS).map(|_| tx.subscribe()))
            .collect();
        for mut rx in receivers {
            let done = done.clone();
            rt.spawn(async move {
                let (mut received, mut missed) = (0, 0);
                loop {
                    match rx.recv().await {
                        Ok(_) => received += 1,
                        Err(RecvError::Lagged(n)) => missed += n,
                        Err(RecvError::Closed) => break,
                    }
                }
                check(received, missed);
                done.send(()).expect("main waits");
            });
        }
        rt.spawn(async move {
            for i in 0..MESSAGES {
                tx.send(i).expect("receivers wait");
                if i % YIELD_EVERY == YIELD_EVERY - 1 {
                    tokio::task::yield_now().await;
                }
            }
        });
        for _ in 0..RECEIVERS {
            all_done.recv().expect("every receiver signals");
        }
        ns_per(start.elapsed(), MESSAGES)
    });
    rt::tokio_stop(rt);
    v
}
