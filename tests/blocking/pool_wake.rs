//! Which pool thread a call wakes. A submitter picks, among the most recently idle pool
//! threads, one that went to sleep on another CPU than its own, and takes it out of the idle
//! list by position; an idle thread whose keep-alive runs out takes itself out of the same
//! list. Here calls come from four workers at once, with gaps that let idle threads time out
//! between them, so picks race exits all along. Alone in its process: the keep-alive is
//! process-wide.

use crate::common::{finish, wait_until, with_deadline};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

/// The highest pool thread number seen (threads are named `fibra-unblock-<n>`, numbered in
/// the order they start).
static HIGHEST: AtomicUsize = AtomicUsize::new(0);

fn note_thread() {
    let name = std::thread::current().name().map(String::from);
    let n = name
        .as_deref()
        .and_then(|n| n.strip_prefix("fibra-unblock-"))
        .and_then(|n| n.parse().ok())
        .expect("a pool thread");
    HIGHEST.fetch_max(n, Ordering::Relaxed);
}

const FIBERS: u64 = 16;
const CALLS: u64 = 300;

/// The gap before call `i` of fiber `f`: none for two calls in three (back to back), else
/// 0–999 µs, spread so that the fibers' gaps differ.
fn gap(f: u64, i: u64) -> Option<Duration> {
    i.is_multiple_of(3)
        .then(|| Duration::from_micros((i * 37 + f * 101) % 1_000))
}

#[test]
fn calls_from_every_worker_complete_while_idle_pool_threads_time_out() {
    crate::common::child_ok(|| {
        with_deadline(|| {
            fibra::unblock::set_keep_alive(Duration::from_micros(300));
            let sched = fibra::Scheduler::builder().threads(4).build().unwrap();
            sched.start();
            let handles: Vec<_> = (0..FIBERS)
                .map(|f| {
                    sched
                        .submit(
                            move || {
                                let mut sum = 0;
                                for i in 0..CALLS {
                                    if let Some(d) = gap(f, i) {
                                        fibra::sleep(d);
                                    }
                                    let v = fibra::unblock(move || {
                                        note_thread();
                                        f * 1_000 + i
                                    });
                                    assert_eq!(v, f * 1_000 + i, "fiber {f}, call {i}");
                                    sum += v;
                                }
                                sum
                            },
                            None,
                        )
                        .unwrap()
                })
                .collect();
            for (f, h) in (0..FIBERS).zip(handles) {
                let want: u64 = (0..CALLS).map(|i| f * 1_000 + i).sum();
                assert_eq!(finish(h), want, "fiber {f}");
            }
            // At most one call per fiber runs at a time, so more threads than fibers means that
            // idle ones timed out and were replaced while the calls went on.
            let started = HIGHEST.load(Ordering::Relaxed) + 1;
            assert!(
                started > FIBERS as usize,
                "only {started} pool threads started: none timed out during the calls"
            );
            // Every thread that served a call goes idle and exits: none is lost to, or kept by,
            // a pick that raced its exit.
            wait_until("every idle pool thread to exit", || {
                fibra::unblock::threads() == 0
            });
            sched.stop();
            fibra::unblock::set_keep_alive(fibra::unblock::DEFAULT_KEEP_ALIVE);
        });
    });
}
