//! unblock: the round trip of a no-op blocking call made from a task, in the shape of
//! tokio's own `spawn_blocking` benchmark: N tasks (N = worker threads), each runs 100
//! batches of 16 concurrent no-op blocking calls and awaits every batch before the next.
//! Figure: ns per call (start to the last task's end, / (N × 1 600)).
//!
//! fibra: `fibra::unblock(|| black_box(0))` from 16 fibers per batch, joined by the task's
//! fiber (one unblock call per fiber: that is how a fibra program issues 16 blocking calls at
//! once). tokio: `JoinSet::spawn_blocking` × 16, then `join_all().await`, as in tokio's bench.
//! may, Go and std have no blocking pool to compare (see `skip_reason`).

use std::hint::black_box;
use std::sync::Arc;
use std::time::Instant;

use super::{Cfg, Peer};
use crate::measure::{ns_per, repeat};
use crate::rt;

/// Batches per task and calls per batch, as in tokio's benchmark.
const BATCHES: usize = 100;
const BATCH: usize = 16;

pub fn run(peer: Peer, cfg: Cfg) -> Result<Vec<f64>, String> {
    match peer {
        Peer::Fibra => Ok(fibra(cfg)),
        Peer::Tokio => Ok(tokio(cfg)),
        Peer::May | Peer::Std | Peer::Go | Peer::FibraNet => {
            Err("no blocking pool to compare".into())
        }
    }
}

fn calls(cfg: Cfg) -> usize {
    cfg.threads * BATCHES * BATCH
}

fn fibra(cfg: Cfg) -> Vec<f64> {
    let sched = rt::fibra(cfg.threads);
    let v = repeat(cfg.warmup, cfg.reps, || {
        let start = Instant::now();
        let tasks: Vec<_> = (0..cfg.threads)
            .map(|_| {
                let s = Arc::clone(&sched);
                sched
                    .submit(
                        move || {
                            for _ in 0..BATCHES {
                                let batch: Vec<_> = (0..BATCH)
                                    .map(|_| {
                                        s.submit(|| fibra::unblock(|| black_box(0)), None)
                                            .expect("submit")
                                    })
                                    .collect();
                                for h in batch {
                                    h.join().expect("no-op call");
                                }
                            }
                        },
                        None,
                    )
                    .expect("submit")
            })
            .collect();
        for t in tasks {
            t.join().expect("task");
        }
        ns_per(start.elapsed(), calls(cfg))
    });
    rt::fibra_stop(sched);
    v
}

fn tokio(cfg: Cfg) -> Vec<f64> {
    let rt = rt::tokio(cfg.threads);
    let v = repeat(cfg.warmup, cfg.reps, || {
        let start = Instant::now();
        rt.block_on(async {
            let mut tasks = tokio::task::JoinSet::new();
            for _ in 0..cfg.threads {
                tasks.spawn(async {
                    for _ in 0..BATCHES {
                        let mut batch = tokio::task::JoinSet::new();
                        for _ in 0..BATCH {
                            batch.spawn_blocking(|| black_box(0));
                        }
                        batch.join_all().await;
                    }
                });
            }
            tasks.join_all().await;
        });
        ns_per(start.elapsed(), calls(cfg))
    });
    rt::tokio_stop(rt);
    v
}
