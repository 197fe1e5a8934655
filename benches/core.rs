//! Criterion benchmarks of fibra alone (the comparison with tokio, may and Go lives in
//! `benches/compare`). Workloads: spawn_many, yield_many and chained_spawn, as in that
//! harness, and spawn_join (spawn against spawn_local).

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

const THREADS: usize = 2;

fn scheduler() -> Arc<fibra::Scheduler> {
    let s = fibra::Scheduler::builder()
        .threads(THREADS)
        .build()
        .expect("valid configuration");
    s.start();
    Arc::new(s)
}

/// From inside a fiber, spawn N tasks that each decrement a counter; the last one signals.
fn spawn_many(c: &mut Criterion) {
    const N: usize = 10_000;
    let sched = scheduler();
    let mut g = c.benchmark_group("spawn_many");
    g.throughput(Throughput::Elements(N as u64));
    g.bench_function(BenchmarkId::from_parameter(N), |b| {
        b.iter(|| {
            let s = sched.clone();
            sched.block_on(move || {
                let left = Arc::new(AtomicUsize::new(N));
                let waiter = Arc::new(Mutex::new(None::<fibra::Unparker>));
                for _ in 0..N {
                    let (left, waiter) = (left.clone(), waiter.clone());
                    s.submit(
                        move || {
                            if left.fetch_sub(1, Ordering::AcqRel) == 1 {
                                if let Some(u) = waiter.lock().unwrap().take() {
                                    u.unpark();
                                }
                            }
                        },
                        None,
                    )
                    .expect("running");
                }
                // Publish our Unparker, then check: either the last task sees it, or we
                // see that the count reached zero (unpark is idempotent).
                fibra::park(|u| {
                    *waiter.lock().unwrap() = Some(u.clone());
                    if left.load(Ordering::Acquire) == 0 {
                        u.unpark();
                    }
                });
            })
        })
    });
    g.finish();
}

/// 200 fibers, each yielding 1 000 times.
fn yield_many(c: &mut Criterion) {
    const FIBERS: usize = 200;
    const YIELDS: usize = 1_000;
    let sched = scheduler();
    let mut g = c.benchmark_group("yield_many");
    g.throughput(Throughput::Elements((FIBERS * YIELDS) as u64));
    g.bench_function(BenchmarkId::from_parameter(FIBERS * YIELDS), |b| {
        b.iter(|| {
            let hs: Vec<_> = (0..FIBERS)
                .map(|_| {
                    sched
                        .submit(
                            || {
                                for _ in 0..YIELDS {
                                    fibra::Fiber::yield_now();
                                }
                            },
                            None,
                        )
                        .expect("running")
                })
                .collect();
            for h in hs {
                h.join().expect("no panic");
            }
        })
    });
    g.finish();
}

/// Each task spawns the next, 1 000 deep; the last one reports back.
fn chained_spawn(c: &mut Criterion) {
    const DEPTH: usize = 1_000;
    fn link(s: Arc<fibra::Scheduler>, n: usize, done: std::sync::mpsc::SyncSender<()>) {
        if n == 0 {
            done.send(()).expect("receiver waits");
        } else {
            let s2 = s.clone();
            s.submit(move || link(s2, n - 1, done), None)
                .expect("running");
        }
    }
    let sched = scheduler();
    let mut g = c.benchmark_group("chained_spawn");
    g.throughput(Throughput::Elements(DEPTH as u64));
    g.bench_function(BenchmarkId::from_parameter(DEPTH), |b| {
        b.iter(|| {
            let (tx, rx) = std::sync::mpsc::sync_channel(1);
            let s = sched.clone();
            sched
                .submit(move || link(s, DEPTH, tx), None)
                .expect("running");
            rx.recv().expect("chain completes");
        })
    });
    g.finish();
}

/// From inside a fiber, spawn N tasks and join each: `fibra::spawn` (any worker), a submit
/// pinned to the spawner's worker, and `fibra::spawn_local` (the same worker, no `Send`
/// bound: the same pinned path plus the thread checks of its `!Send` wrapper).
fn spawn_local(c: &mut Criterion) {
    const N: usize = 1_000;
    let sched = scheduler();
    let mut g = c.benchmark_group("spawn_join");
    g.throughput(Throughput::Elements(N as u64));
    g.bench_function("spawn", |b| {
        b.iter(|| {
            sched.block_on(|| {
                let hs: Vec<_> = (0..N).map(|i| fibra::spawn(move || i)).collect();
                hs.into_iter().map(|h| h.join().unwrap()).sum::<usize>()
            })
        })
    });
    g.bench_function("pinned", |b| {
        b.iter(|| {
            let s = sched.clone();
            sched.block_on(move || {
                let here = fibra::current_worker();
                let hs: Vec<_> = (0..N).map(|i| s.submit(move || i, here).unwrap()).collect();
                hs.into_iter().map(|h| h.join().unwrap()).sum::<usize>()
            })
        })
    });
    g.bench_function("spawn_local", |b| {
        b.iter(|| {
            sched.block_on(|| {
                let hs: Vec<_> = (0..N).map(|i| fibra::spawn_local(move || i)).collect();
                hs.into_iter().map(|h| h.join().unwrap()).sum::<usize>()
            })
        })
    });
    g.finish();
}

criterion_group!(benches, spawn_many, yield_many, chained_spawn, spawn_local);
criterion_main!(benches);
