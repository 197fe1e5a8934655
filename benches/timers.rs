//! Which timer structure a worker should use, measured at 1 000 000 pending timers: fibra's
//! hierarchical timing wheel (6 levels x 64 slots, 1 ms ticks), a 4-ary heap with handles
//! (the alternative that supports cancelling), and `std`'s binary heap.
//!
//! Workload ("hold model"): 1 000 000 timers pending with deadlines spread over 10 s; each
//! step fires the earliest timer and schedules a new one a pseudo-random 1..10 000 ms later.
//! A second benchmark cancels and re-inserts random pending timers (O(1) on the wheel, O(log n)
//! on the 4-ary heap; `std`'s heap cannot cancel at all, only skip stale entries lazily).
//!
//! A third measures what a timer is for, precision: how long `fibra::sleep(d)` really takes in
//! a fiber, back to back, for d = 1 ms and 20 µs, against `std::thread::sleep(d)` (the time per
//! iteration *is* the sleep's duration). Deadlines are exact, so 1 ms takes 1 ms plus the
//! kernel's timer slack and the wake-up, as for std, not the 2 ms of a 1 ms tick.

use criterion::{criterion_group, criterion_main, BatchSize, Criterion, Throughput};
use fibra::__bench::{TimerId, TimerWheel};
use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::time::{Duration, Instant};

const PENDING: usize = 1_000_000;
const STEPS: u64 = 10_000;

/// xorshift64: deterministic pseudo-random offsets.
struct Rng(u64);
impl Rng {
    fn next_ms(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        1 + self.0 % 10_000
    }
}

/// A 4-ary min-heap with handles (so that a timer can be cancelled), the alternative the
/// wheel is measured against.
struct QuadHeap {
    heap: Vec<(Instant, u64, usize)>,
    slots: Vec<usize>,
    free: Vec<usize>,
}

impl QuadHeap {
    fn new() -> Self {
        QuadHeap {
            heap: Vec::new(),
            slots: Vec::new(),
            free: Vec::new(),
        }
    }
    fn insert(&mut self, deadline: Instant, value: u64) -> usize {
        let slot = self.free.pop().unwrap_or_else(|| {
            self.slots.push(0);
            self.slots.len() - 1
        });
        self.heap.push((deadline, value, slot));
        let i = self.heap.len() - 1;
        self.slots[slot] = i;
        self.up(i);
        slot
    }
    fn remove(&mut self, slot: usize) -> u64 {
        self.remove_at(self.slots[slot])
    }
    fn pop(&mut self) -> (Instant, u64) {
        let d = self.heap[0].0;
        (d, self.remove_at(0))
    }
    fn remove_at(&mut self, i: usize) -> u64 {
        let last = self.heap.len() - 1;
        self.swap(i, last);
        let (_, v, slot) = self.heap.pop().expect("non-empty");
        self.free.push(slot);
        if i < self.heap.len() {
            self.up(i);
            self.down(i);
        }
        v
    }
    fn up(&mut self, mut i: usize) {
        while i > 0 && self.heap[i].0 < self.heap[(i - 1) / 4].0 {
            self.swap(i, (i - 1) / 4);
            i = (i - 1) / 4;
        }
    }
    fn down(&mut self, mut i: usize) {
        loop {
            let first = 4 * i + 1;
            let end = (first + 4).min(self.heap.len());
            let Some(best) = (first..end).min_by_key(|&c| self.heap[c].0) else {
                break;
            };
            if self.heap[best].0 >= self.heap[i].0 {
                break;
            }
            self.swap(i, best);
            i = best;
        }
    }
    fn swap(&mut self, a: usize, b: usize) {
        self.heap.swap(a, b);
        self.slots[self.heap[a].2] = a;
        self.slots[self.heap[b].2] = b;
    }
}

fn hold_model(c: &mut Criterion) {
    let t0 = Instant::now();
    let at = |ms: u64| t0 + Duration::from_millis(ms);
    let mut g = c.benchmark_group("timers_1M_pending_fire_and_reschedule");
    g.throughput(Throughput::Elements(STEPS));
    g.sample_size(10);

    g.bench_function("fibra_timer_wheel", |b| {
        b.iter_batched_ref(
            || {
                let mut rng = Rng(0x9E37_79B9_7F4A_7C15);
                let mut w = TimerWheel::new(t0);
                for k in 0..PENDING as u64 {
                    w.insert(at(rng.next_ms()), k);
                }
                (w, rng)
            },
            |(w, rng)| {
                let mut fired = 0;
                while fired < STEPS {
                    let now = w.next_deadline().expect("pending");
                    while let Some(v) = w.pop_due(now) {
                        w.insert(now + Duration::from_millis(rng.next_ms()), v);
                        fired += 1;
                    }
                }
            },
            BatchSize::LargeInput,
        )
    });

    g.bench_function("quad_heap", |b| {
        b.iter_batched_ref(
            || {
                let mut rng = Rng(0x9E37_79B9_7F4A_7C15);
                let mut h = QuadHeap::new();
                for k in 0..PENDING as u64 {
                    h.insert(at(rng.next_ms()), k);
                }
                (h, rng)
            },
            |(h, rng)| {
                for _ in 0..STEPS {
                    let (d, v) = h.pop();
                    h.insert(d + Duration::from_millis(rng.next_ms()), v);
                }
            },
            BatchSize::LargeInput,
        )
    });

    g.bench_function("std_binary_heap", |b| {
        b.iter_batched_ref(
            || {
                let mut rng = Rng(0x9E37_79B9_7F4A_7C15);
                let mut h = BinaryHeap::new();
                for k in 0..PENDING as u64 {
                    h.push(Reverse((at(rng.next_ms()), k)));
                }
                (h, rng)
            },
            |(h, rng)| {
                for _ in 0..STEPS {
                    let Reverse((d, v)) = h.pop().expect("pending");
                    h.push(Reverse((d + Duration::from_millis(rng.next_ms()), v)));
                }
            },
            BatchSize::LargeInput,
        )
    });

    g.finish();
}

fn cancel(c: &mut Criterion) {
    let t0 = Instant::now();
    let mut g = c.benchmark_group("timers_1M_pending_cancel_and_reinsert");
    g.throughput(Throughput::Elements(STEPS));
    g.sample_size(10);
    g.bench_function("fibra_timer_wheel", |b| {
        b.iter_batched_ref(
            || {
                let mut rng = Rng(0x2545_F491_4F6C_DD1D);
                let mut w = TimerWheel::new(t0);
                let ids: Vec<TimerId> = (0..PENDING as u64)
                    .map(|k| w.insert(t0 + Duration::from_millis(rng.next_ms()), k))
                    .collect();
                (w, ids, rng)
            },
            |(w, ids, rng)| {
                for _ in 0..STEPS {
                    let i = rng.next_ms() as usize * 97 % ids.len();
                    let v = w.remove(ids[i]).expect("pending");
                    ids[i] = w.insert(t0 + Duration::from_millis(rng.next_ms()), v);
                }
            },
            BatchSize::LargeInput,
        )
    });
    g.bench_function("quad_heap", |b| {
        b.iter_batched_ref(
            || {
                let mut rng = Rng(0x2545_F491_4F6C_DD1D);
                let mut h = QuadHeap::new();
                let ids: Vec<usize> = (0..PENDING as u64)
                    .map(|k| h.insert(t0 + Duration::from_millis(rng.next_ms()), k))
                    .collect();
                (h, ids, rng)
            },
            |(h, ids, rng)| {
                for _ in 0..STEPS {
                    let i = rng.next_ms() as usize * 97 % ids.len();
                    let v = h.remove(ids[i]);
                    ids[i] = h.insert(t0 + Duration::from_millis(rng.next_ms()), v);
                }
            },
            BatchSize::LargeInput,
        )
    });
    g.finish();
}

fn sleep_precision(c: &mut Criterion) {
    let sched = fibra::Scheduler::builder()
        .threads(2)
        .build()
        .expect("valid configuration");
    sched.start();
    let mut g = c.benchmark_group("sleep_precision");
    g.sample_size(20);
    for (name, d) in [
        ("1ms", Duration::from_millis(1)),
        ("20us", Duration::from_micros(20)),
    ] {
        g.bench_function(format!("fibra_sleep_in_fiber/{name}"), |b| {
            b.iter_custom(|iters| {
                sched.block_on(move || {
                    let t = Instant::now();
                    for _ in 0..iters {
                        fibra::sleep(d);
                    }
                    t.elapsed()
                })
            })
        });
        g.bench_function(format!("std_thread_sleep/{name}"), |b| {
            b.iter(|| std::thread::sleep(d))
        });
    }
    g.finish();
}

criterion_group!(benches, hold_model, cancel, sleep_precision);
criterion_main!(benches);
