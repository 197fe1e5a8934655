//! Criterion benchmarks of `fibra::sync` alone (the comparison with tokio, std and
//! crossbeam-channel belongs in `benches/compare`).
//!
//! - `ping_pong`: 1 000 pairs of fibers; each pair round-trips two oneshot messages (ping,
//!   pong). Spawns included, as in tokio's `rt_multi_threaded` bench. Time per iteration /
//!   1 000 = ns per round trip.
//! - `mpsc`: 1, 4 or 16 producer fibers send `MESSAGES` integers in total through one
//!   unbounded channel to one consumer fiber. Reported as messages per second.
//! - `mutex`: uncontended lock/unlock from a thread (the one-atomic fast path), and 16 fibers
//!   on two workers contending for one lock.

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use fibra::sync::{mpsc, oneshot, Mutex, WaitGroup};
use std::hint::black_box;
use std::sync::Arc;

/// Worker threads: the machines that run these have 2 cores.
const THREADS: usize = 2;
const PAIRS: usize = 1_000;
const MESSAGES: u64 = 100_000;

fn scheduler() -> Arc<fibra::Scheduler> {
    let s = fibra::Scheduler::builder()
        .threads(THREADS)
        .build()
        .expect("valid configuration");
    s.start();
    Arc::new(s)
}

fn ping_pong(c: &mut Criterion) {
    let sched = scheduler();
    let mut g = c.benchmark_group("ping_pong");
    g.throughput(Throughput::Elements(PAIRS as u64));
    g.bench_function(BenchmarkId::from_parameter(PAIRS), |b| {
        b.iter(|| {
            let s = sched.clone();
            sched.block_on(move || {
                let all = WaitGroup::new();
                for _ in 0..PAIRS {
                    let (s2, done) = (s.clone(), all.clone());
                    let pair = s.submit(
                        move || {
                            let (ping_tx, ping_rx) = oneshot::channel::<()>();
                            let (pong_tx, pong_rx) = oneshot::channel::<()>();
                            let partner = s2.submit(
                                move || {
                                    ping_rx.recv().expect("ping");
                                    pong_tx.send(()).expect("pong");
                                },
                                None,
                            );
                            drop(partner.expect("running"));
                            ping_tx.send(()).expect("ping");
                            pong_rx.recv().expect("pong");
                            drop(done);
                        },
                        None,
                    );
                    drop(pair.expect("running"));
                }
                all.wait();
            })
        })
    });
    g.finish();
}

fn mpsc_throughput(c: &mut Criterion) {
    let sched = scheduler();
    let mut g = c.benchmark_group("mpsc");
    g.throughput(Throughput::Elements(MESSAGES));
    for producers in [1u64, 4, 16] {
        g.bench_function(BenchmarkId::new("producers", producers), |b| {
            b.iter(|| {
                let s = sched.clone();
                sched.block_on(move || {
                    let (tx, rx) = mpsc::channel::<u64>();
                    for p in 0..producers {
                        let tx = tx.clone();
                        let per = MESSAGES / producers;
                        let h = s.submit(
                            move || {
                                for i in 0..per {
                                    tx.send(p * per + i).expect("receiver alive");
                                }
                            },
                            None,
                        );
                        drop(h.expect("running"));
                    }
                    drop(tx);
                    black_box(rx.iter().fold(0u64, |a, v| a.wrapping_add(v)))
                })
            })
        });
    }
    g.finish();
}

fn mutex(c: &mut Criterion) {
    let mut g = c.benchmark_group("mutex");
    let m = Mutex::new(0u64);
    g.throughput(Throughput::Elements(1));
    g.bench_function("uncontended", |b| {
        b.iter(|| *black_box(&m).lock().expect("not poisoned") += 1)
    });
    const FIBERS: u64 = 16;
    const ROUNDS: u64 = 1_000;
    let sched = scheduler();
    g.throughput(Throughput::Elements(FIBERS * ROUNDS));
    g.bench_function(BenchmarkId::new("contended_fibers", FIBERS), |b| {
        b.iter(|| {
            let m = Arc::new(Mutex::new(0u64));
            let hs: Vec<_> = (0..FIBERS)
                .map(|_| {
                    let m = m.clone();
                    sched
                        .submit(
                            move || {
                                for _ in 0..ROUNDS {
                                    *m.lock().expect("not poisoned") += 1;
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

criterion_group!(benches, ping_pong, mpsc_throughput, mutex);
criterion_main!(benches);
