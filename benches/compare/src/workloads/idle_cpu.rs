//! idle_cpu: start a runtime with the configured workers, run one trivial task to be sure every
//! part of it is up, then leave it idle for 2 s while the main thread sleeps.
//! Figure: process CPU ms (user + system, `getrusage`) spent in those 2 s. Run in a fresh
//! process per repetition.

use std::time::Duration;

use super::{Cfg, Peer};
use crate::measure::{ms, process_cpu};
use crate::rt;

const IDLE: Duration = Duration::from_secs(2);

pub fn run(peer: Peer, cfg: Cfg) -> Result<Vec<f64>, String> {
    let f = match peer {
        Peer::Fibra => fibra,
        Peer::Tokio => tokio,
        Peer::May => may,
        Peer::Go | Peer::Std | Peer::FibraNet => return Err("not run in-process".into()),
    };
    Ok((0..cfg.reps).map(|_| f(cfg)).collect())
}

/// CPU ms this process burns while the caller's runtime sits idle for [`IDLE`].
fn idle_cpu_ms() -> f64 {
    let before = process_cpu();
    std::thread::sleep(IDLE);
    ms(process_cpu() - before)
}

fn fibra(cfg: Cfg) -> f64 {
    let sched = rt::fibra(cfg.threads);
    sched
        .submit(|| (), None)
        .expect("submit")
        .join()
        .expect("warm-up fiber");
    let v = idle_cpu_ms();
    rt::fibra_stop(sched);
    v
}

fn tokio(cfg: Cfg) -> f64 {
    let rt = rt::tokio(cfg.threads);
    rt.block_on(rt.spawn(async {})).expect("warm-up task");
    let v = idle_cpu_ms();
    rt::tokio_stop(rt);
    v
}

fn may(cfg: Cfg) -> f64 {
    rt::may(cfg.threads);
    rt::may_go(|| ()).join().expect("warm-up coroutine");
    idle_cpu_ms()
}
