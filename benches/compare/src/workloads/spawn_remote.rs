//! spawn_remote: from a plain (non-worker) thread, submit 10 000 empty tasks, then join them all.
//! Figure: ns per task (first submit to last join, / 10 000).
//!
//! std: spawn 10 000 empty threads and join them (the thread-per-task baseline).

use std::time::Instant;

use super::{Cfg, Peer};
use crate::measure::{ns_per, repeat};
use crate::rt;

const TASKS: usize = 10_000;

pub fn run(peer: Peer, cfg: Cfg) -> Result<Vec<f64>, String> {
    match peer {
        Peer::Fibra => Ok(fibra(cfg)),
        Peer::Tokio => Ok(tokio(cfg)),
        Peer::May => Ok(may(cfg)),
        Peer::Std => Ok(std_threads(cfg)),
        Peer::Go | Peer::FibraNet => Err("not run in-process".into()),
    }
}

fn fibra(cfg: Cfg) -> Vec<f64> {
    let sched = rt::fibra(cfg.threads);
    let v = repeat(cfg.warmup, cfg.reps, || {
        let start = Instant::now();
        let handles: Vec<_> = (0..TASKS)
            .map(|_| sched.submit(|| (), None).expect("submit"))
            .collect();
        for h in handles {
            h.join().expect("empty fiber");
        }
        ns_per(start.elapsed(), TASKS)
    });
    rt::fibra_stop(sched);
    v
}

fn tokio(cfg: Cfg) -> Vec<f64> {
    let rt = rt::tokio(cfg.threads);
    let v = repeat(cfg.warmup, cfg.reps, || {
        let start = Instant::now();
        let handles: Vec<_> = (0..TASKS).map(|_| rt.spawn(async {})).collect();
        rt.block_on(async {
            for h in handles {
                h.await.expect("empty task");
            }
        });
        ns_per(start.elapsed(), TASKS)
    });
    rt::tokio_stop(rt);
    v
}

fn may(cfg: Cfg) -> Vec<f64> {
    rt::may(cfg.threads);
    repeat(cfg.warmup, cfg.reps, || {
        let start = Instant::now();
        let handles: Vec<_> = (0..TASKS).map(|_| rt::may_go(|| ())).collect();
        for h in handles {
            h.join().expect("empty coroutine");
        }
        ns_per(start.elapsed(), TASKS)
    })
}

fn std_threads(cfg: Cfg) -> Vec<f64> {
    repeat(cfg.warmup, cfg.reps, || {
        let start = Instant::now();
        let handles: Vec<_> = (0..TASKS).map(|_| std::thread::spawn(|| ())).collect();
        for h in handles {
            h.join().expect("empty thread");
        }
        ns_per(start.elapsed(), TASKS)
    })
}
