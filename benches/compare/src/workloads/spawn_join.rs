//! spawn_join: from a plain (non-worker) thread, spawn one empty task and join it before
//! spawning the next, 2 000 times. Figure: ns per round trip (spawn, run, join).
//!
//! Where spawn_remote measures how fast a plain thread can hand out work, this is the
//! latency of one hand-over and back: a worker has to notice the task, and the joining thread
//! has to get the CPU back once the task is done (on a small machine often the same CPU the
//! worker runs on).
//!
//! std: spawn an empty thread and join it.

use std::time::Instant;

use super::{Cfg, Peer};
use crate::measure::{ns_per, repeat};
use crate::rt;

const ROUND_TRIPS: usize = 2_000;

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
        for _ in 0..ROUND_TRIPS {
            sched.spawn(|| ()).join().expect("empty fiber");
        }
        ns_per(start.elapsed(), ROUND_TRIPS)
    });
    rt::fibra_stop(sched);
    v
}

fn tokio(cfg: Cfg) -> Vec<f64> {
    let rt = rt::tokio(cfg.threads);
    let v = repeat(cfg.warmup, cfg.reps, || {
        let start = Instant::now();
        for _ in 0..ROUND_TRIPS {
            rt.block_on(rt.spawn(async {})).expect("empty task");
        }
        ns_per(start.elapsed(), ROUND_TRIPS)
    });
    rt::tokio_stop(rt);
    v
}

fn may(cfg: Cfg) -> Vec<f64> {
    rt::may(cfg.threads);
    repeat(cfg.warmup, cfg.reps, || {
        let start = Instant::now();
        for _ in 0..ROUND_TRIPS {
            rt::may_go(|| ()).join().expect("empty coroutine");
        }
        ns_per(start.elapsed(), ROUND_TRIPS)
    })
}

fn std_threads(cfg: Cfg) -> Vec<f64> {
    repeat(cfg.warmup, cfg.reps, || {
        let start = Instant::now();
        for _ in 0..ROUND_TRIPS {
            std::thread::spawn(|| ()).join().expect("empty thread");
        }
        ns_per(start.elapsed(), ROUND_TRIPS)
    })
}
