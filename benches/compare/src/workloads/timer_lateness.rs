//! timer_p50 / timer_p99: 10 000 tasks each sleep 10 ms once, all at the same time; each
//! measures how much later than asked it woke. Figure: the 50th / 99th percentile of that
//! lateness, in µs. A sleep that returned early would show up as a negative lateness; none
//! may.
//!
//! Each task writes its lateness into its own slot and the last one wakes the main thread,
//! as Go's version does (a slice and a `WaitGroup`). Sending each lateness over a channel
//! instead would wake the waiting main thread up to 10 000 times, and on few cores that
//! thread would take CPU from the workers while they are still waking sleepers, so the
//! figure would measure the channel more than the timers.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{mpsc, Arc};
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

/// Where the tasks put their lateness: a slot each, and one wake of the main thread.
struct Board {
    /// Lateness in µs, as `f64` bits.
    late: Vec<AtomicU64>,
    left: AtomicUsize,
    done: mpsc::SyncSender<()>,
}

impl Board {
    /// Task `i` woke from a sleep it began at `started`.
    fn record(&self, i: usize, started: Instant) {
        self.late[i].store(lateness_us(started).to_bits(), Ordering::Relaxed);
        // AcqRel: the last task's decrement follows every earlier store, and the send
        // hands them all to the main thread.
        if self.left.fetch_sub(1, Ordering::AcqRel) == 1 {
            self.done.send(()).expect("main waits");
        }
    }
}

/// Starts the tasks with `spawn_all`, waits for the last, returns the percentile.
fn storm(pct: Pct, spawn_all: impl FnOnce(&Arc<Board>)) -> f64 {
    let (done, all_in) = mpsc::sync_channel(1);
    let board = Arc::new(Board {
        late: (0..TASKS).map(|_| AtomicU64::new(0)).collect(),
        left: AtomicUsize::new(TASKS),
        done,
    });
    spawn_all(&board);
    all_in.recv().expect("the last task reports");
    let mut late: Vec<f64> = board
        .late
        .iter()
        .map(|l| f64::from_bits(l.load(Ordering::Relaxed)))
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
        storm(pct, |board| {
            for i in 0..TASKS {
                let board = board.clone();
                let h = sched.submit(
                    move || {
                        let t = Instant::now();
                        fibra::sleep(NAP);
                        board.record(i, t);
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
        storm(pct, |board| {
            for i in 0..TASKS {
                let board = board.clone();
                rt.spawn(async move {
                    let t = Instant::now();
                    tokio::time::sleep(NAP).await;
                    board.record(i, t);
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
        storm(pct, |board| {
            for i in 0..TASKS {
                let board = board.clone();
                rt::may_go(move || {
                    let t = Instant::now();
                    may::coroutine::sleep(NAP);
                    board.record(i, t);
                });
            }
        })
    })
}
