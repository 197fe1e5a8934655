//! skynet: a 10-ary tree of tasks with 1 000 000 leaves; each leaf returns its number, each inner
//! task spawns its 10 children, joins them and returns the sum. Figure: ms for the whole tree.
//! The sum is checked (499 999 500 000) so that a wrong scheduler cannot look fast.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Instant;

use super::{Cfg, Peer};
use crate::measure::{ms, repeat};
use crate::rt;

const LEAVES: u64 = 1_000_000;
const FANOUT: u64 = 10;
const EXPECTED: u64 = LEAVES * (LEAVES - 1) / 2;

pub fn run(peer: Peer, cfg: Cfg) -> Result<Vec<f64>, String> {
    match peer {
        Peer::Fibra => Ok(fibra(cfg)),
        Peer::Tokio => Ok(tokio(cfg)),
        Peer::May => Ok(may(cfg)),
        Peer::Go | Peer::Std | Peer::FibraNet => Err("not run in-process".into()),
    }
}

/// Times one tree and checks its sum.
fn time_tree(tree: impl FnOnce() -> u64) -> f64 {
    let start = Instant::now();
    let sum = tree();
    let t = start.elapsed();
    assert_eq!(sum, EXPECTED, "skynet sum");
    ms(t)
}

fn fibra(cfg: Cfg) -> Vec<f64> {
    fn node(s: &Arc<fibra::Scheduler>, num: u64, size: u64) -> u64 {
        if size == 1 {
            return num;
        }
        let step = size / FANOUT;
        let children: Vec<_> = (0..FANOUT)
            .map(|i| {
                let s2 = s.clone();
                s.submit(move || node(&s2, num + i * step, step), None)
                    .expect("submit")
            })
            .collect();
        children.into_iter().map(|h| h.join().expect("child")).sum()
    }
    let sched = rt::fibra(cfg.threads);
    let v = repeat(cfg.warmup, cfg.reps, || {
        time_tree(|| {
            let s = sched.clone();
            let root = sched.submit(move || node(&s, 0, LEAVES), None);
            root.expect("submit").join().expect("root fiber")
        })
    });
    rt::fibra_stop(sched);
    v
}

fn tokio(cfg: Cfg) -> Vec<f64> {
    fn node(num: u64, size: u64) -> Pin<Box<dyn Future<Output = u64> + Send>> {
        Box::pin(async move {
            if size == 1 {
                return num;
            }
            let step = size / FANOUT;
            let children: Vec<_> = (0..FANOUT)
                .map(|i| tokio::spawn(node(num + i * step, step)))
                .collect();
            let mut sum = 0;
            for h in children {
                sum += h.await.expect("child");
            }
            sum
        })
    }
    let rt = rt::tokio(cfg.threads);
    let v = repeat(cfg.warmup, cfg.reps, || {
        time_tree(|| {
            let root = rt.spawn(node(0, LEAVES));
            rt.block_on(root).expect("root task")
        })
    });
    rt::tokio_stop(rt);
    v
}

fn may(cfg: Cfg) -> Vec<f64> {
    fn node(num: u64, size: u64) -> u64 {
        if size == 1 {
            return num;
        }
        let step = size / FANOUT;
        let children: Vec<_> = (0..FANOUT)
            .map(|i| rt::may_go(move || node(num + i * step, step)))
            .collect();
        children.into_iter().map(|h| h.join().expect("child")).sum()
    }
    rt::may(cfg.threads);
    repeat(cfg.warmup, cfg.reps, || {
        time_tree(|| {
            rt::may_go(|| node(0, LEAVES))
                .join()
                .expect("root coroutine")
        })
    })
}
