#![cfg(feature = "tokio")]
//! With `Builder::tokio_handle`, a worker is inside the runtime's context for as long as it
//! runs fibers: tokio futures may be made, polled and dropped anywhere in a fiber, fibers
//! that interleave on a worker never drop guards out of order, and a cancelled fiber drops
//! its future inside the context. Each case failed when the context was entered per poll.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use crate::common::{finish, with_deadline};
use fibra::future::block_on;
use fibra::Scheduler;

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_time()
        .build()
        .unwrap()
}

fn sched(threads: usize, rt: &tokio::runtime::Runtime) -> Scheduler {
    let s = Scheduler::builder()
        .threads(threads)
        .tokio_handle(rt.handle().clone())
        .build()
        .unwrap();
    s.start();
    s
}

/// Calls `tokio::spawn` as it is dropped, as pooled connections do to close themselves.
struct SpawnsOnDrop(Arc<AtomicUsize>);

impl Drop for SpawnsOnDrop {
    fn drop(&mut self) {
        let n = self.0.clone();
        drop(tokio::spawn(async move {
            n.fetch_add(1, Ordering::SeqCst);
        }));
    }
}

#[test]
fn a_fiber_cancelled_in_block_on_drops_its_future_inside_the_context() {
    // The report: "there is no reactor running", a panic in a destructor, SIGABRT (5/5).
    with_deadline(|| {
        let rt = runtime();
        let s = sched(1, &rt);
        let spawned = Arc::new(AtomicUsize::new(0));
        let n = spawned.clone();
        let h = s.spawn(move || {
            block_on(async move {
                let _conn = SpawnsOnDrop(n);
                tokio::time::sleep(Duration::from_secs(3600)).await;
            })
        });
        crate::common::wait_until("the fiber to wait in block_on", || {
            s.dump().fibers().iter().any(|e| {
                e.id() == h.id()
                    && e.status() == fibra::dump::Status::Parked(fibra::dump::WaitOn::Future)
            })
        });
        h.cancel();
        assert!(h.join().unwrap_err().is_cancelled());
        crate::common::wait_until("the destructor's tokio task to run", || {
            spawned.load(Ordering::SeqCst) == 1
        });
        s.stop();
    });
}

#[test]
fn fibers_interleaving_inside_polls_of_fibra_futures_never_upset_tokio() {
    // The report: recv_async and oneshot spent the budget inside poll and yielded there; two
    // such fibers on a worker dropped their guards out of order (20/20).
    with_deadline(|| {
        let rt = runtime();
        let s = sched(1, &rt);
        let fibers: Vec<_> = (0..2)
            .map(|_| {
                s.spawn(|| {
                    let (tx, rx) = fibra::sync::mpsc::channel::<u32>();
                    for i in 0..2_000 {
                        tx.send(i).unwrap();
                    }
                    block_on(async move {
                        let mut sum = 0u64;
                        for _ in 0..2_000 {
                            sum += u64::from(rx.recv_async().await.unwrap());
                            let (otx, orx) = fibra::sync::oneshot::channel();
                            otx.send(1u64).unwrap();
                            sum += orx.await.unwrap();
                        }
                        sum
                    })
                })
            })
            .collect();
        for f in fibers {
            assert_eq!(finish(f), (0..2_000u64).sum::<u64>() + 2_000);
        }
        // Every message was there: each fiber's one poll took them all, spending its budget
        // many times over without yielding inside the poll. The worker is still right.
        let ok = s.block_on(|| {
            block_on(async { tokio::time::sleep(Duration::from_millis(1)).await });
            tokio::runtime::Handle::try_current().is_ok()
        });
        assert!(ok);
        s.stop();
    });
}

#[test]
fn tokio_futures_made_outside_block_on_and_block_on_nested_in_polls_work() {
    // The report: `block_on(tokio::time::sleep(d))` panicked "no reactor running"; a
    // `block_on` nested in a poll, in two fibers, failed with a handle.
    with_deadline(|| {
        let rt = runtime();
        let s = sched(1, &rt);
        let hs: Vec<_> = (0..2)
            .map(|i| {
                s.spawn(move || {
                    // Made in the fiber, before any block_on; one is dropped unpolled.
                    let sleep = tokio::time::sleep(Duration::from_millis(5));
                    drop(tokio::time::sleep(Duration::from_secs(5)));
                    block_on(sleep);
                    block_on(async move {
                        // A block_on inside a poll: it parks this fiber, and the other runs.
                        block_on(async { tokio::time::sleep(Duration::from_millis(5)).await });
                        i
                    })
                })
            })
            .collect();
        let got: Vec<_> = hs.into_iter().map(finish).collect();
        assert_eq!(got, [0, 1]);
        s.stop();
    });
}

#[test]
fn only_a_scheduler_with_a_handle_puts_its_fibers_in_the_context() {
    with_deadline(|| {
        let rt = runtime();
        let with = sched(1, &rt);
        assert!(with.block_on(|| tokio::runtime::Handle::try_current().is_ok()));
        let without = fibra::Scheduler::builder().threads(1).build().unwrap();
        without.start();
        assert!(without.block_on(|| tokio::runtime::Handle::try_current().is_err()));
        // Nor does a plain thread get it from either.
        assert!(tokio::runtime::Handle::try_current().is_err());
        with.stop();
        without.stop();
    });
}
