//! Criterion benchmarks of `fibra::unblock` and `fibra::fs` alone (the comparison with
//! tokio's `spawn_blocking` is the `unblock` workload of `benches/compare`).
//!
//! - `unblock/round_trip`: one fiber makes no-op calls one after another: the latency of
//!   a single call (park, hand-off to a pool thread, unpark, resume).
//! - `unblock/batch16`: tokio's `spawn_blocking` benchmark shape: 2 tasks × 100 batches of
//!   16 concurrent no-op calls (16 fibers per batch), reported per call.
//! - `unblock/inline`: the same call outside a fiber, where it runs inline (the floor).
//! - `fs/read_4k`: `fibra::fs::read` of a 4 KiB file (page cache) from a fiber.

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use std::hint::black_box;
use std::sync::Arc;
use std::time::{Duration, Instant};

const THREADS: usize = 2;
const BATCHES: usize = 100;
const BATCH: usize = 16;

fn scheduler() -> Arc<fibra::Scheduler> {
    let s = fibra::Scheduler::builder()
        .threads(THREADS)
        .build()
        .expect("valid configuration");
    s.start();
    Arc::new(s)
}

fn unblock(c: &mut Criterion) {
    let sched = scheduler();
    let mut g = c.benchmark_group("unblock");
    g.throughput(Throughput::Elements(1));
    g.bench_function("round_trip", |b| {
        b.iter_custom(|iters| {
            sched.block_on(move || {
                let start = Instant::now();
                for _ in 0..iters {
                    black_box(fibra::unblock(|| black_box(0)));
                }
                start.elapsed()
            })
        })
    });
    g.bench_function("batch16", |b| {
        b.iter_custom(|iters| {
            let calls = (THREADS * BATCHES * BATCH) as u64;
            let mut total = Duration::ZERO;
            // One iteration is one call: run whole rounds until `iters` calls are covered.
            for _ in 0..iters.div_ceil(calls) {
                let start = Instant::now();
                let tasks: Vec<_> = (0..THREADS)
                    .map(|_| {
                        let s = sched.clone();
                        sched.submit(move || batches(&s), None).expect("running")
                    })
                    .collect();
                for t in tasks {
                    t.join().expect("no panic");
                }
                total += start.elapsed();
            }
            total.mul_f64(iters as f64 / (iters.div_ceil(calls) * calls) as f64)
        })
    });
    g.bench_function("inline", |b| b.iter(|| fibra::unblock(|| black_box(0))));
    g.finish();
    sched.stop();
}

/// One task of `batch16`: 100 batches of 16 fibers that each make one no-op call.
fn batches(s: &Arc<fibra::Scheduler>) {
    for _ in 0..BATCHES {
        let batch: Vec<_> = (0..BATCH)
            .map(|_| {
                s.submit(|| fibra::unblock(|| black_box(0)), None)
                    .expect("running")
            })
            .collect();
        for h in batch {
            h.join().expect("no panic");
        }
    }
}

fn fs(c: &mut Criterion) {
    let sched = scheduler();
    let path = std::env::temp_dir().join(format!("fibra-bench-fs-{}", std::process::id()));
    std::fs::write(&path, vec![7u8; 4096]).expect("write the bench file");
    let mut g = c.benchmark_group("fs");
    g.throughput(Throughput::Bytes(4096));
    let p = path.clone();
    g.bench_function("read_4k", |b| {
        b.iter_custom(|iters| {
            let p = p.clone();
            sched.block_on(move || {
                let start = Instant::now();
                for _ in 0..iters {
                    black_box(fibra::fs::read(&p).expect("read"));
                }
                start.elapsed()
            })
        })
    });
    g.finish();
    sched.stop();
    let _ = std::fs::remove_file(path);
}

criterion_group!(benches, unblock, fs);
criterion_main!(benches);
