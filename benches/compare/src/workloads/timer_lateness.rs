//! timer_p50 / timer_p99: 10 000 tasks each sleep 10 ms once, all at the same time; each
//! measures how much later than asked it woke. Figure: the 50th / 99th percentile of that
//! lateness, in µs (the time issue's "timer lateness p50/p99 for 10 000 concurrent 10 ms
//! sleeps"). A sleep that returned early would show up as a negative lateness; none may.

use std::sync::mpsc;
use std::time::{Duration, Instant};

use super::{Cfg, Peer};
use crate::measure::repeat;
use crate::rt;

const TASKS: usize = 10_000;
const NAP: Duration = Duration::from_millis(10);

/// Which percentile the workload reports.
#[derive(Clone, Copy)]
pub enum Pct {
    P50,
    P99,
}

pub fn run(peer: Peer, cfg: Cfg, pct: Pct) -> Result<Vec<f64>, String> {
    match peer {
        Peer::Fibra => Ok(fibra(cfg, pct)),
        Peer::Tokio => Ok(tokio(cfg, pct)),
        Peer::May => Ok(may(cfg, pct)),
        Peer::Go | Peer::Std | Peer::FibraNet => Err("not run in-process".into()),
    }
}

/// Lateness of one sleep in µs, from inside the sleeping task.
fn lateness_us(started: Instant) -> f64 {
    (started.elapsed().as_secs_f64() - NAP.as_secs_f64()) * 1e6
}

/// Starts the tasks with `spawn_all`, collects every lateness, returns the percentile.
fn storm(pct: Pct, spawn_all: impl FnOnce(mpsc::SyncSender<f64>)) -> f64 {
    let (tx, rx) = mpsc::sync_channel(TASKS);
    spawn_all(tx);
    let mut late: Vec<f64> = (0..TASKS)
        .map(|_| rx.recv().expect("every task reports"))
        .collect();
    late.sort_by(f64::total_cmp);
    assert!(late[0] >= 0.0, "a sleep returned {:.1} µs early", -late[0]);
    match pct {
        Pct::P50 => late[TASKS / 2],
        Pct::P99 => late[TASKS * 99 / 100],
    }
}

fn fibra(cfg: Cfg, pct: Pct) -> Vec<f64> {
    let sched = rt::fibra(cfg.threads);
    let v = repeat(cfg.warmup, cfg.reps, || {
        storm(pct, |tx| {
            for _ in 0..TASKS {
                let tx = tx.clone();
                let h = sched.submit(
                    move || {
                        let t = Instant::now();
                        fibra::sleep(NAP);
                        tx.send(lateness_us(t)).expect("main waits");
                    },
                    None,
                );
                drop(h.expect("submit"));
            }
        })
    });
    rt::fibra_stop(sched);
    v
}

fn tokio(cfg: Cfg, pct: Pct) -> Vec<f64> {
    let rt = rt::tokio(cfg.threads);
    let v = repeat(cfg.warmup, cfg.reps, || {
        storm(pct, |tx| {
            for _ in 0..TASKS {
                let tx = tx.clone();
                rt.spawn(async move {
                    let t = Instant::now();
                    tokio::time::sleep(NAP).await;
                    tx.send(lateness_us(t)).expect("main waits");
                });
            }
        })
    });
    rt::tokio_stop(rt);
    v
}

fn may(cfg: Cfg, pct: Pct) -> Vec<f64> {
    rt::may(cfg.threads);
    repeat(cfg.warmup, cfg.reps, || {
        storm(pct, |tx| {
            for _ in 0..TASKS {
                let tx = tx.clone();
                rt::may_go(move || {
                    let t = Instant::now();
                    may::coroutine::sleep(NAP);
                    tx.send(lateness_us(t)).expect("main waits");
                });
            }
        })
    })
}
