//! million_park: 1 000 000 tasks spawned from the main thread and parked at once, then all
//! woken and joined. Each task counts itself in and blocks on one shared wait (a channel's
//! receiver or a one-shot flag) that the main thread fires once the count reaches 1 000 000.
//! Run in a fresh process per repetition, no warm-up: a million stacks is heavy, and the
//! figure includes faulting in every task's memory the first time.
//!
//! Figures, each in µs per task:
//! - `million_park`: from the first spawn until the last task has counted itself in (the task
//!   that makes the count 1 000 000 tells the main thread through a std channel, so there is
//!   no polling interval in the figure);
//! - `million_wake` (a derived row): from firing the wait until the main thread has joined
//!   every task.
//!
//! A task counts itself in just before it blocks, so the last few may still be on their way
//! into the wait when it is fired; they then find it fired and return at once, which every
//! peer's primitive allows. Nothing else is needed for correctness, and the gap is one task's
//! few instructions.
//!
//! fibra: `fibra::sync::mpmc` receiver clones, woken by dropping the only sender (default
//! stack size). tokio: `tokio::sync::watch` receiver clones awaiting `changed()`, woken by one
//! `send`. may: one `may::sync::SyncFlag`, woken by `fire()`; skipped where
//! `vm.max_map_count` cannot hold a million may stacks. Go: one channel, woken by `close`.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

use super::{Cfg, Figures, Peer};
use crate::rt;

const TASKS: usize = 1_000_000;
/// Bound on waiting for all tasks to park, so that a lost task fails the run instead of
/// hanging it until the parent's limit.
const PARK_LIMIT: Duration = Duration::from_secs(150);

pub fn run(peer: Peer, cfg: Cfg) -> Result<Vec<Figures>, String> {
    let f = match peer {
        Peer::Fibra => {
            fibra_fits()?;
            fibra
        }
        Peer::Tokio => tokio,
        Peer::May => {
            may_fits()?;
            may
        }
        Peer::Go | Peer::Std | Peer::FibraNet => return Err("not run in-process".into()),
    };
    Ok((0..cfg.reps).map(|_| f(cfg)).collect())
}

/// The count of tasks in their wait, and the channel its last increment reports on.
struct Arrivals {
    parked: AtomicUsize,
    all: mpsc::SyncSender<()>,
}

impl Arrivals {
    fn new() -> (Arc<Arrivals>, mpsc::Receiver<()>) {
        let (all, all_parked) = mpsc::sync_channel(1);
        let a = Arrivals {
            parked: AtomicUsize::new(0),
            all,
        };
        (Arc::new(a), all_parked)
    }

    /// Called by each task right before it blocks.
    fn arrive(&self) {
        if self.parked.fetch_add(1, Ordering::AcqRel) + 1 == TASKS {
            // Capacity 1, sent once: never blocks.
            self.all.send(()).expect("main thread waits");
        }
    }
}

/// Waits for the last arrival; panics (failing the child) after [`PARK_LIMIT`].
fn wait_all(all_parked: &mpsc::Receiver<()>, arrivals: &Arrivals) {
    if all_parked.recv_timeout(PARK_LIMIT).is_err() {
        panic!(
            "only {} of {TASKS} tasks parked within {PARK_LIMIT:?}",
            arrivals.parked.load(Ordering::Acquire)
        );
    }
}

/// µs per task for the spawn + park phase and the wake + join phase.
fn figures(spawn_park: Duration, wake_join: Duration) -> Figures {
    let us = |d: Duration| d.as_secs_f64() * 1e6 / TASKS as f64;
    Figures {
        value: us(spawn_park),
        also: vec![("million_wake", us(wake_join))],
    }
}

fn fibra(cfg: Cfg) -> Figures {
    let sched = rt::fibra(cfg.threads);
    let (release, released) = fibra::sync::mpmc::channel::<()>();
    let (arrivals, all_parked) = Arrivals::new();
    let start = Instant::now();
    let mut handles = Vec::with_capacity(TASKS);
    for _ in 0..TASKS {
        let (released, arrivals) = (released.clone(), arrivals.clone());
        let task = move || {
            arrivals.arrive();
            // Nothing is ever sent: the receive ends when the sender is dropped.
            assert!(released.recv().is_err(), "woken by disconnection");
        };
        handles.push(sched.submit(task, None).expect("submit"));
    }
    drop(released);
    wait_all(&all_parked, &arrivals);
    let spawn_park = start.elapsed();
    let woke = Instant::now();
    drop(release);
    for h in handles {
        h.join().expect("parked fiber");
    }
    let wake_join = woke.elapsed();
    rt::fibra_stop(sched);
    figures(spawn_park, wake_join)
}

fn tokio(cfg: Cfg) -> Figures {
    let rt = rt::tokio(cfg.threads);
    let (release, released) = tokio::sync::watch::channel(());
    let (arrivals, all_parked) = Arrivals::new();
    let start = Instant::now();
    let mut handles = Vec::with_capacity(TASKS);
    for _ in 0..TASKS {
        let (mut released, arrivals) = (released.clone(), arrivals.clone());
        handles.push(rt.spawn(async move {
            arrivals.arrive();
            released.changed().await.expect("woken by a send");
        }));
    }
    wait_all(&all_parked, &arrivals);
    let spawn_park = start.elapsed();
    let woke = Instant::now();
    release.send(()).expect("receivers wait");
    rt.block_on(async {
        for h in handles {
            h.await.expect("parked task");
        }
    });
    let wake_join = woke.elapsed();
    drop(released);
    rt::tokio_stop(rt);
    figures(spawn_park, wake_join)
}

/// `vm.max_map_count`, the kernel's cap on a process's memory mappings (0 if unreadable).
fn max_map_count() -> usize {
    std::fs::read_to_string("/proc/sys/vm/max_map_count")
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(0)
}

/// Whether a million stacks with a guard page each fit in `vm.max_map_count` when every guard
/// splits off a mapping of its own (`mprotect` guards: two mappings per stack, counted
/// generously, as neighbouring stacks may or may not merge).
fn guard_mappings_fit(how: &str) -> Result<(), String> {
    let (max, needed) = (max_map_count(), 2 * TASKS + 10_000);
    if max < needed {
        return Err(format!(
            "{how}: two kernel mappings per stack; vm.max_map_count = {max} caps live tasks \
             near {}, 1 000 000 need about {needed}",
            max / 2
        ));
    }
    Ok(())
}

/// fibra's stacks share slab mappings, but their guard pages are `mprotect`ed on kernels
/// without `MADV_GUARD_INSTALL` (before 6.13), which splits a mapping per stack.
fn fibra_fits() -> Result<(), String> {
    if fibra::guard_kind() == "mprotect" {
        guard_mappings_fit(
            "fibra's guard pages are mprotect'ed on this kernel (no MADV_GUARD_INSTALL)",
        )?;
    }
    Ok(())
}

/// may gives each coroutine stack its own `mmap`, its guard page made by `mprotect`.
fn may_fits() -> Result<(), String> {
    guard_mappings_fit("may maps each coroutine stack separately, with an mprotect'ed guard page")
}

fn may(cfg: Cfg) -> Figures {
    rt::may(cfg.threads);
    let release = Arc::new(may::sync::SyncFlag::new());
    let (arrivals, all_parked) = Arrivals::new();
    let start = Instant::now();
    let mut handles = Vec::with_capacity(TASKS);
    for _ in 0..TASKS {
        let (release, arrivals) = (release.clone(), arrivals.clone());
        handles.push(rt::may_go(move || {
            arrivals.arrive();
            release.wait();
        }));
    }
    wait_all(&all_parked, &arrivals);
    let spawn_park = start.elapsed();
    let woke = Instant::now();
    release.fire();
    for h in handles {
        h.join().expect("parked coroutine");
    }
    figures(spawn_park, woke.elapsed())
}
