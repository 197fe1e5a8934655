//! sleep_storm: 10 000 tasks each sleep 10 ms five times; the main thread waits for all of them.
//! Figure: ms beyond the 50 ms ideal (timer resolution, wake-up cost and queueing).

use std::sync::mpsc;
use std::time::{Duration, Instant};

use super::{Cfg, Peer};
use crate::measure::{ms, repeat};
use crate::rt;

const TASKS: usize = 10_000;
const SLEEPS: usize = 5;
const NAP: Duration = Duration::from_millis(10);
const IDEAL_MS: f64 = 50.0;

pub fn run(peer: Peer, cfg: Cfg) -> Result<Vec<f64>, String> {
    match peer {
        Peer::Fibra => Ok(fibra(cfg)),
        Peer::Tokio => Ok(tokio(cfg)),
        Peer::May => Ok(may(cfg)),
        Peer::Go | Peer::Std | Peer::FibraNet => Err("not run in-process".into()),
    }
}

/// Starts the storm with `spawn_all`, waits for every task's signal, returns ms beyond ideal.
fn time_storm(spawn_all: impl FnOnce(mpsc::SyncSender<()>)) -> f64 {
    let (done, rx) = mpsc::sync_channel(TASKS);
    let start = Instant::now();
    spawn_all(done);
    for _ in 0..TASKS {
        rx.recv().expect("every sleeper signals");
    }
    ms(start.elapsed()) - IDEAL_MS
}

fn fibra(cfg: Cfg) -> Vec<f64> {
    let sched = rt::fibra(cfg.threads);
    let v = repeat(cfg.warmup, cfg.reps, || {
        time_storm(|done| {
            for _ in 0..TASKS {
                let done = done.clone();
                let h = sched.submit(
                    move || {
                        for _ in 0..SLEEPS {
                            fibra::sleep(NAP);
                        }
                        done.send(()).expect("main waits");
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

fn tokio(cfg: Cfg) -> Vec<f64> {
    let rt = rt::tokio(cfg.threads);
    let v = repeat(cfg.warmup, cfg.reps, || {
        time_storm(|done| {
            for _ in 0..TASKS {
                let done = done.clone();
                rt.spawn(async move {
                    for _ in 0..SLEEPS {
                        tokio::time::sleep(NAP).await;
                    }
                    done.send(()).expect("main waits");
                });
            }
        })
    });
    rt::tokio_stop(rt);
    v
}

fn may(cfg: Cfg) -> Vec<f64> {
    rt::may(cfg.threads);
    repeat(cfg.warmup, cfg.reps, || {
        time_storm(|done| {
            for _ in 0..TASKS {
                let done = done.clone();
                rt::may_go(move || {
                    for _ in 0..SLEEPS {
                        may::coroutine::sleep(NAP);
                    }
                    done.send(()).expect("main waits");
                });
            }
        })
    })
}
