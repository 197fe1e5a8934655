//! unblock_seq: the latency of one blocking call at a time. N tasks (N = worker threads) each
//! make 2 000 no-op blocking calls one after another, so every call waits for the previous
//! one's result: park, hand-off to a pool thread, wake-up, resume. Figure: ns per call.
//!
//! fibra: `fibra::unblock(|| black_box(0))`. tokio: `spawn_blocking(|| black_box(0)).await`.
//! may, Go and std have no blocking pool to compare (see `skip_reason`).

use std::hint::black_box;
use std::time::Instant;

use super::{Cfg, Peer};
use crate::measure::{ns_per, repeat};
use crate::rt;

const CALLS: usize = 2_000;

pub fn run(peer: Peer, cfg: Cfg) -> Result<Vec<f64>, String> {
    match peer {
        Peer::Fibra => Ok(fibra(cfg)),
        Peer::Tokio => Ok(tokio(cfg)),
        Peer::May | Peer::Std | Peer::Go | Peer::FibraNet => {
            Err("no blocking pool to compare".into())
        }
    }
}

fn fibra(cfg: Cfg) -> Vec<f64> {
    let sched = rt::fibra(cfg.threads);
    let v = repeat(cfg.warmup, cfg.reps, || {
        let start = Instant::now();
        let tasks: Vec<_> = (0..cfg.threads)
            .map(|_| {
                sched
                    .submit(
                        || {
                            for _ in 0..CALLS {
                                black_box(fibra::unblock(|| black_box(0)));
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
        ns_per(start.elapsed(), CALLS)
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
                    for _ in 0..CALLS {
                        let v = tokio::task::spawn_blocking(|| black_box(0)).await;
                        black_box(v.expect("no-op call"));
                    }
                });
            }
            tasks.join_all().await;
        });
        ns_per(start.elapsed(), CALLS)
    });
    rt::tokio_stop(rt);
    v
}
