//! spawn_many: from inside a task, spawn 10 000 tasks that each decrement an atomic; the last one
//! signals the waiting main thread. Figure: ns per task (spawn start to last signal, / 10 000).
//!
//! std: a spawner thread starts 10 000 detached threads (the thread-per-task baseline).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{mpsc, Arc};
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

/// The body of every spawned task: count down, and the last one signals.
fn task(rem: &AtomicUsize, done: &mpsc::SyncSender<()>) {
    if rem.fetch_sub(1, Ordering::AcqRel) == 1 {
        done.send(()).expect("main thread waits for the signal");
    }
}

fn fibra(cfg: Cfg) -> Vec<f64> {
    let sched = rt::fibra(cfg.threads);
    let v = repeat(cfg.warmup, cfg.reps, || {
        let (tx, rx) = mpsc::sync_channel(1);
        let rem = Arc::new(AtomicUsize::new(TASKS));
        let s = sched.clone();
        let start = Instant::now();
        let spawner = sched
            .submit(
                move || {
                    for _ in 0..TASKS {
                        let (tx, rem) = (tx.clone(), rem.clone());
                        drop(s.submit(move || task(&rem, &tx), None).expect("submit"));
                    }
                },
                None,
            )
            .expect("submit");
        rx.recv().expect("last task signals");
        let t = start.elapsed();
        spawner.join().expect("spawner fiber");
        ns_per(t, TASKS)
    });
    rt::fibra_stop(sched);
    v
}

fn tokio(cfg: Cfg) -> Vec<f64> {
    let rt = rt::tokio(cfg.threads);
    let v = repeat(cfg.warmup, cfg.reps, || {
        let (tx, rx) = mpsc::sync_channel(1);
        let rem = Arc::new(AtomicUsize::new(TASKS));
        let start = Instant::now();
        let spawner = rt.spawn(async move {
            for _ in 0..TASKS {
                let (tx, rem) = (tx.clone(), rem.clone());
                tokio::spawn(async move { task(&rem, &tx) });
            }
        });
        rx.recv().expect("last task signals");
        let t = start.elapsed();
        rt.block_on(spawner).expect("spawner task");
        ns_per(t, TASKS)
    });
    rt::tokio_stop(rt);
    v
}

fn may(cfg: Cfg) -> Vec<f64> {
    rt::may(cfg.threads);
    repeat(cfg.warmup, cfg.reps, || {
        let (tx, rx) = mpsc::sync_channel(1);
        let rem = Arc::new(AtomicUsize::new(TASKS));
        let start = Instant::now();
        let spawner = rt::may_go(move || {
            for _ in 0..TASKS {
                let (tx, rem) = (tx.clone(), rem.clone());
                rt::may_go(move || task(&rem, &tx));
            }
        });
        rx.recv().expect("last task signals");
        let t = start.elapsed();
        spawner.join().expect("spawner coroutine");
        ns_per(t, TASKS)
    })
}

fn std_threads(cfg: Cfg) -> Vec<f64> {
    repeat(cfg.warmup, cfg.reps, || {
        let (tx, rx) = mpsc::sync_channel(1);
        let rem = Arc::new(AtomicUsize::new(TASKS));
        let start = Instant::now();
        let spawner = std::thread::spawn(move || {
            for _ in 0..TASKS {
                let (tx, rem) = (tx.clone(), rem.clone());
                std::thread::spawn(move || task(&rem, &tx));
            }
        });
        rx.recv().expect("last thread signals");
        let t = start.elapsed();
        spawner.join().expect("spawner thread");
        ns_per(t, TASKS)
    })
}
