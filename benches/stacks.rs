//! Fiber creation cost: create + run + drop a fiber on a recycled pooled stack (fibra) versus
//! a coroutine on a freshly mapped corosensei `DefaultStack` (what a runtime without a stack
//! pool pays per spawn).

use criterion::{criterion_group, criterion_main, Criterion};

fn create_run_drop(c: &mut Criterion) {
    let mut g = c.benchmark_group("create_run_drop");
    g.bench_function("fibra_recycled_stack", |b| {
        b.iter(|| {
            let mut f = fibra::Fiber::new(|| {
                std::hint::black_box(1 + 1);
            });
            f.resume();
        })
    });
    g.bench_function("corosensei_fresh_default_stack", |b| {
        b.iter(|| {
            let mut co = corosensei::Coroutine::<(), (), ()>::new(|_y, ()| {
                std::hint::black_box(1 + 1);
            });
            let _ = co.resume(());
        })
    });
    g.finish();
}

criterion_group!(benches, create_run_drop);
criterion_main!(benches);
