//! yield_many: 200 tasks each yield 1 000 times, then signal the main thread.
//! Figure: ns per yield (first spawn to last signal, / 200 000).

use std::sync::mpsc;
use std::time::Instant;

use super::{Cfg, Peer};
use crate::measure::{ns_per, repeat};
use crate::rt;

const TASKS: usize = 200;
const YIELDS: usize = 1_000;

pub fn run(peer: Peer, cfg: Cfg) -> Result<Vec<f64>, String> {
    match peer {
        Peer::Fibra => Ok(fibra(cfg)),
        Peer::Tokio => Ok(tokio(cfg)),
        Peer::May => Ok(may(cfg)),
        Peer::Go | Peer::Std | Peer::FibraNet => Err("not run in-process".into()),
    }
}

fn fibra(cfg: Cfg) -> Vec<f64> {
    let sched = rt::fibra(cfg.threads);
    let v = repeat(cfg.warmup, cfg.reps, || {
        let (tx, rx) = mpsc::sync_channel(TASKS);
        let start = Instant::now();
        for _ in 0..TASKS {
            let tx = tx.clone();
            let h = sched.submit(
                move || {
                    for _ in 0..YIELDS {
                        fibra::Fiber::yield_now();
                    }
                    tx.send(()).expect("main waits");
                },
                None,
            );
            drop(h.expect("submit"));
        }
        for _ in 0..TASKS {
            rx.recv().expect("every fiber signals");
        }
        ns_per(start.elapsed(), TASKS * YIELDS)
    });
    rt::fibra_stop(sched);
    v
}

fn tokio(cfg: Cfg) -> Vec<f64> {
    let rt = rt::tokio(cfg.threads);
    let v = repeat(cfg.warmup, cfg.reps, || {
        let (tx, rx) = mpsc::sync_channel(TASKS);
        let start = Instant::now();
        for _ in 0..TASKS {
            let tx = tx.clone();
            rt.spawn(async move {
                for _ in 0..YIELDS {
                    tokio::task::yield_now().await;
                }
                tx.send(()).expect("main waits");
            });
        }
        for _ in 0..TASKS {
            rx.recv().expect("every task signals");
        }
        ns_per(start.elapsed(), TASKS * YIELDS)
    });
    rt::tokio_stop(rt);
    v
}

fn may(cfg: Cfg) -> Vec<f64> {
    rt::may(cfg.threads);
    repeat(cfg.warmup, cfg.reps, || {
        let (tx, rx) = mpsc::sync_channel(TASKS);
        let start = Instant::now();
        for _ in 0..TASKS {
            let tx = tx.clone();
            rt::may_go(move || {
                for _ in 0..YIELDS {
                    may::coroutine::yield_now();
                }
                tx.send(()).expect("main waits");
            });
        }
        for _ in 0..TASKS {
            rx.recv().expect("every coroutine signals");
        }
        ns_per(start.elapsed(), TASKS * YIELDS)
    })
}
