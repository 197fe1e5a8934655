//! chained_spawn: each task spawns the next, 1 000 deep; the last one signals the main thread.
//! Figure: ns per hop (start to signal, / 1 000).
//!
//! std: each thread spawns the next thread (detached).

use std::sync::{mpsc, Arc};
use std::time::Instant;

use super::{Cfg, Peer};
use crate::measure::{ns_per, repeat};
use crate::rt;

const DEPTH: usize = 1_000;

pub fn run(peer: Peer, cfg: Cfg) -> Result<Vec<f64>, String> {
    match peer {
        Peer::Fibra => Ok(fibra(cfg)),
        Peer::Tokio => Ok(tokio(cfg)),
        Peer::May => Ok(may(cfg)),
        Peer::Std => Ok(std_threads(cfg)),
        Peer::Go | Peer::FibraNet => Err("not run in-process".into()),
    }
}

/// Times one chain: `first` starts hop `DEPTH`; hop 0 sends on the channel.
fn time_chain(first: impl FnOnce(mpsc::SyncSender<()>)) -> f64 {
    let (done, chain_done) = mpsc::sync_channel(1);
    let start = Instant::now();
    first(done);
    chain_done.recv().expect("end of the chain signals");
    ns_per(start.elapsed(), DEPTH)
}

fn fibra(cfg: Cfg) -> Vec<f64> {
    fn hop(s: Arc<fibra::Scheduler>, done: mpsc::SyncSender<()>, n: usize) {
        if n == 0 {
            done.send(()).expect("main waits");
        } else {
            let next = s.clone();
            drop(
                s.submit(move || hop(next, done, n - 1), None)
                    .expect("submit"),
            );
        }
    }
    let sched = rt::fibra(cfg.threads);
    let v = repeat(cfg.warmup, cfg.reps, || {
        time_chain(|done| hop(sched.clone(), done, DEPTH))
    });
    rt::fibra_stop(sched);
    v
}

fn tokio(cfg: Cfg) -> Vec<f64> {
    fn hop(done: mpsc::SyncSender<()>, n: usize) {
        if n == 0 {
            done.send(()).expect("main waits");
        } else {
            tokio::spawn(async move { hop(done, n - 1) });
        }
    }
    let rt = rt::tokio(cfg.threads);
    let v = repeat(cfg.warmup, cfg.reps, || {
        time_chain(|done| {
            rt.spawn(async move { hop(done, DEPTH) });
        })
    });
    rt::tokio_stop(rt);
    v
}

fn may(cfg: Cfg) -> Vec<f64> {
    fn hop(done: mpsc::SyncSender<()>, n: usize) {
        if n == 0 {
            done.send(()).expect("main waits");
        } else {
            rt::may_go(move || hop(done, n - 1));
        }
    }
    rt::may(cfg.threads);
    repeat(cfg.warmup, cfg.reps, || {
        time_chain(|done| {
            rt::may_go(move || hop(done, DEPTH));
        })
    })
}

fn std_threads(cfg: Cfg) -> Vec<f64> {
    fn hop(done: mpsc::SyncSender<()>, n: usize) {
        if n == 0 {
            done.send(()).expect("main waits");
        } else {
            std::thread::spawn(move || hop(done, n - 1));
        }
    }
    repeat(cfg.warmup, cfg.reps, || {
        time_chain(|done| {
            std::thread::spawn(move || hop(done, DEPTH));
        })
    })
}
