//! join_chain: each task spawns the next and waits for it to finish, 2 000 deep, so that 2 000
//! tasks (and, for the stackful peers, 2 000 stacks) are alive at once at the bottom of the
//! chain. The last task returns 0, every other one its child's result plus one; the root's
//! result is checked (2 000). Figure: ns per hop (root spawned from the main thread until the
//! main thread has its result, / 2 000).
//!
//! Each hop is a spawn, a blocking wait in the parent, the child's whole life and a wake-up of
//! the parent, which then finishes and wakes its own parent: the chain unwinds one task at a
//! time. The workload runs twice, with N workers (`join_chain`) and with one
//! (`join_chain_1w`, a variant row that runs this same code with `--threads 1`), to show what
//! a second worker costs or gains on a strictly sequential chain.
//!
//! fibra: `JoinHandle::join` in the fiber. tokio: `.await` on the `JoinHandle`. may:
//! `JoinHandle::join` in the coroutine. Go: a channel of capacity 1 per hop (`go/workloads.go`).

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Instant;

use super::{Cfg, Peer};
use crate::measure::{ns_per, repeat};
use crate::rt;

const DEPTH: usize = 2_000;

pub fn run(peer: Peer, cfg: Cfg) -> Result<Vec<f64>, String> {
    match peer {
        Peer::Fibra => Ok(fibra(cfg)),
        Peer::Tokio => Ok(tokio(cfg)),
        Peer::May => Ok(may(cfg)),
        Peer::Go | Peer::Std | Peer::FibraNet => Err("not run in-process".into()),
    }
}

/// Times one chain (`chain` runs it to the end and returns the root's result) and checks it.
fn time_chain(chain: impl FnOnce() -> usize) -> f64 {
    let start = Instant::now();
    let depth = chain();
    let t = start.elapsed();
    assert_eq!(depth, DEPTH, "join_chain depth");
    ns_per(t, DEPTH)
}

fn fibra(cfg: Cfg) -> Vec<f64> {
    fn hop(s: &Arc<fibra::Scheduler>, n: usize) -> usize {
        if n == 0 {
            return 0;
        }
        let next = s.clone();
        let child = s.submit(move || hop(&next, n - 1), None).expect("submit");
        child.join().expect("child fiber") + 1
    }
    let sched = rt::fibra(cfg.threads);
    let v = repeat(cfg.warmup, cfg.reps, || {
        time_chain(|| {
            let s = sched.clone();
            let root = sched.submit(move || hop(&s, DEPTH), None);
            root.expect("submit").join().expect("root fiber")
        })
    });
    rt::fibra_stop(sched);
    v
}

fn tokio(cfg: Cfg) -> Vec<f64> {
    fn hop(n: usize) -> Pin<Box<dyn Future<Output = usize> + Send>> {
        Box::pin(async move {
            if n == 0 {
                return 0;
            }
            tokio::spawn(hop(n - 1)).await.expect("child task") + 1
        })
    }
    let rt = rt::tokio(cfg.threads);
    let v = repeat(cfg.warmup, cfg.reps, || {
        time_chain(|| {
            let root = rt.spawn(hop(DEPTH));
            rt.block_on(root).expect("root task")
        })
    });
    rt::tokio_stop(rt);
    v
}

fn may(cfg: Cfg) -> Vec<f64> {
    fn hop(n: usize) -> usize {
        if n == 0 {
            return 0;
        }
        rt::may_go(move || hop(n - 1))
            .join()
            .expect("child coroutine")
            + 1
    }
    rt::may(cfg.threads);
    repeat(cfg.warmup, cfg.reps, || {
        time_chain(|| rt::may_go(|| hop(DEPTH)).join().expect("root coroutine"))
    })
}
