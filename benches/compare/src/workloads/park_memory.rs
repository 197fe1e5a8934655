//! park_memory: 100 000 tasks parked at once. Each task announces itself and waits to be woken;
//! once all are waiting, the main thread reads the resident set size, then wakes and joins all.
//! Figure: (RSS with everything parked − RSS before spawning) / 100 000, in KiB per task. The
//! figure includes what each peer needs to hold to wake a task later (join handle, waker or
//! sender), as a real program would. Run in a fresh process per repetition.
//!
//! fibra: `fibra::park`, storing each `Unparker` (published after the fiber switched out).
//! tokio: each task awaits a `tokio::sync::oneshot` receiver. may: `may::coroutine::park`,
//! woken through the join handle's `Coroutine::unpark`. All peers use their default stack sizes.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use super::{Cfg, Peer};
use crate::measure::{rss_kib, wait_until};
use crate::rt;

const TASKS: usize = 100_000;
/// Bound on waiting for all tasks to park, so a lost task fails the run instead of hanging it.
const PARK_LIMIT: Duration = Duration::from_secs(20);
/// Lets the last tasks that announced themselves actually reach their wait.
const SETTLE: Duration = Duration::from_millis(20);

pub fn run(peer: Peer, cfg: Cfg) -> Result<Vec<f64>, String> {
    let f = match peer {
        Peer::Fibra => fibra,
        Peer::Tokio => tokio,
        Peer::May => may,
        Peer::Go | Peer::Std | Peer::FibraNet => return Err("not run in-process".into()),
    };
    Ok((0..cfg.reps).map(|_| f(cfg)).collect())
}

/// Waits until `parked` reaches [`TASKS`] and returns KiB per task above `base`.
fn per_task_kib(parked: &AtomicUsize, base: u64) -> f64 {
    wait_until(PARK_LIMIT, "all tasks to park", || {
        parked.load(Ordering::Acquire) == TASKS
    });
    std::thread::sleep(SETTLE);
    (rss_kib() as f64 - base as f64) / TASKS as f64
}

fn fibra(cfg: Cfg) -> f64 {
    let sched = rt::fibra(cfg.threads);
    let unparkers = Arc::new(Mutex::new(Vec::with_capacity(TASKS)));
    let parked = Arc::new(AtomicUsize::new(0));
    let base = rss_kib();
    let handles: Vec<_> = (0..TASKS)
        .map(|_| {
            let (unparkers, parked) = (unparkers.clone(), parked.clone());
            let task = move || {
                fibra::park(|u| {
                    unparkers.lock().expect("unparkers").push(u);
                    parked.fetch_add(1, Ordering::AcqRel);
                })
            };
            sched.submit(task, None).expect("submit")
        })
        .collect();
    let v = per_task_kib(&parked, base);
    for u in unparkers.lock().expect("unparkers").drain(..) {
        u.unpark();
    }
    for h in handles {
        h.join().expect("parked fiber");
    }
    rt::fibra_stop(sched);
    v
}

fn tokio(cfg: Cfg) -> f64 {
    let rt = rt::tokio(cfg.threads);
    let parked = Arc::new(AtomicUsize::new(0));
    let base = rss_kib();
    let mut senders = Vec::with_capacity(TASKS);
    let handles: Vec<_> = (0..TASKS)
        .map(|_| {
            let (tx, rx) = tokio::sync::oneshot::channel::<()>();
            senders.push(tx);
            let parked = parked.clone();
            rt.spawn(async move {
                parked.fetch_add(1, Ordering::AcqRel);
                rx.await.expect("woken");
            })
        })
        .collect();
    let v = per_task_kib(&parked, base);
    for tx in senders {
        tx.send(()).expect("task waits");
    }
    rt.block_on(async {
        for h in handles {
            h.await.expect("parked task");
        }
    });
    rt::tokio_stop(rt);
    v
}

fn may(cfg: Cfg) -> f64 {
    rt::may(cfg.threads);
    rt::may_go(|| ()).join().expect("warm-up coroutine");
    let parked = Arc::new(AtomicUsize::new(0));
    let base = rss_kib();
    let handles: Vec<_> = (0..TASKS)
        .map(|_| {
            let parked = parked.clone();
            rt::may_go(move || {
                parked.fetch_add(1, Ordering::AcqRel);
                may::coroutine::park();
            })
        })
        .collect();
    let v = per_task_kib(&parked, base);
    for h in &handles {
        h.coroutine().unpark();
    }
    for h in handles {
        h.join().expect("parked coroutine");
    }
    v
}
