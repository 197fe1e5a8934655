//! Task memory: every task's cell (header, closure, result) comes from per-thread block
//! caches that freeing threads refill through a global depot. These tests pin the places
//! where that could go wrong: values dropped exactly once whichever thread drops the last
//! reference, threads exiting with cached blocks, a handle dropped by a thread-local
//! destructor after the caches are gone, odd sizes and alignments, and destructors that panic.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use crate::common::{finish, started, wait_until, with_deadline, Counted};

/// Plain threads submit tasks and exit; each task's closure and result is dropped once,
/// whether its handle is joined, dropped before the task ends, or dropped after.
#[test]
fn values_drop_once_across_threads_that_come_and_go() {
    with_deadline(|| {
        let sched = Arc::new(started(2));
        let drops = Arc::new(AtomicUsize::new(0));
        const THREADS: usize = 8;
        const TASKS: usize = 2_000;
        for round in 0..3 {
            let threads: Vec<_> = (0..THREADS)
                .map(|t| {
                    let (sched, drops) = (sched.clone(), drops.clone());
                    std::thread::spawn(move || {
                        let mut kept = Vec::new();
                        for i in 0..TASKS {
                            let captured = Counted(drops.clone());
                            let result = Counted(drops.clone());
                            let h = sched
                                .submit(
                                    move || {
                                        let _captured = captured;
                                        if i % 7 == 0 {
                                            fibra::Fiber::yield_now();
                                        }
                                        (result, vec![t as u8; i % 300])
                                    },
                                    None,
                                )
                                .unwrap();
                            match i % 3 {
                                0 => drop(h),
                                1 => kept.push(h),
                                _ => drop(finish(h)),
                            }
                        }
                        for h in kept {
                            drop(finish(h));
                        }
                    })
                })
                .collect();
            for t in threads {
                t.join().unwrap();
            }
            // Detached tasks may still be running: wait until every value is dropped.
            let want = 2 * THREADS * TASKS * (round + 1);
            wait_until("every value dropped", || {
                drops.load(Ordering::SeqCst) >= want
            });
            assert_eq!(drops.load(Ordering::SeqCst), want, "round {round}");
        }
        Arc::try_unwrap(sched).ok().unwrap().stop();
    });
}

thread_local! {
    static LATE: LateDrop = const { LateDrop(std::cell::RefCell::new(Vec::new())) };
}

struct LateDrop(std::cell::RefCell<Vec<fibra::JoinHandle<Counted>>>);

impl Drop for LateDrop {
    fn drop(&mut self) {
        // Runs while the thread exits, possibly after the block cache of this thread is gone:
        // the last references go back to the global allocator then.
        self.0.borrow_mut().clear();
    }
}

/// The last reference to finished tasks is dropped by a thread-local destructor while the
/// thread exits, before or after the thread's block cache is gone: no crash, no leak of the
/// values, no double free.
#[test]
fn handles_dropped_by_a_thread_local_destructor() {
    with_deadline(|| {
        let sched = Arc::new(started(2));
        let drops = Arc::new(AtomicUsize::new(0));
        let threads: Vec<_> = (0..4)
            .map(|t| {
                let (sched, drops) = (sched.clone(), drops.clone());
                std::thread::spawn(move || {
                    // Thread-local destructors run in the reverse order of first use: half
                    // the threads have LATE's run after the block cache's, half before.
                    if t % 2 == 0 {
                        LATE.with(|_| ());
                    }
                    assert_eq!(finish(sched.submit(|| 1, None).unwrap()), 1);
                    let handles: Vec<_> = (0..100)
                        .map(|_| {
                            let d = drops.clone();
                            sched.submit(move || Counted(d), None).unwrap()
                        })
                        .collect();
                    for h in &handles {
                        assert!(h.wait_timeout(crate::common::LIMIT));
                    }
                    LATE.with(|l| l.0.borrow_mut().extend(handles));
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        // A task's result is published before its worker drops its own references, so the
        // worker may hold the last one (and drop the value) just after the handle is gone.
        wait_until("every value dropped", || {
            drops.load(Ordering::SeqCst) >= 400
        });
        assert_eq!(drops.load(Ordering::SeqCst), 400);
        Arc::try_unwrap(sched).ok().unwrap().stop();
    });
}

/// Closures bigger than the cached sizes and over-aligned ones take the global allocator's
/// path; they run, and their captures are dropped once.
#[test]
fn big_and_over_aligned_tasks() {
    #[repr(align(128))]
    struct Aligned([u8; 200]);
    with_deadline(|| {
        let sched = started(2);
        let drops = Arc::new(AtomicUsize::new(0));
        let handles: Vec<_> = (0..200)
            .map(|i| {
                let tally = Counted(drops.clone());
                let big = [i as u8; 4096];
                let aligned = Aligned([i as u8; 200]);
                sched
                    .submit(
                        move || {
                            let _t = tally;
                            assert_eq!(&aligned as *const Aligned as usize % 128, 0);
                            big.iter().map(|&b| b as usize).sum::<usize>() + aligned.0[199] as usize
                        },
                        None,
                    )
                    .unwrap()
            })
            .collect();
        for (i, h) in handles.into_iter().enumerate() {
            assert_eq!(finish(h), (i % 256) * 4096 + i % 256);
        }
        assert_eq!(drops.load(Ordering::SeqCst), 200);
        sched.stop();
    });
}

/// A detached task's result whose destructor panics is dropped by the worker that ran it
/// (the task's last reference): the worker survives and its memory is reused.
#[test]
fn a_result_whose_drop_panics_leaves_the_worker_alive() {
    struct Boom;
    impl Drop for Boom {
        fn drop(&mut self) {
            panic!("boom while dropping a detached result");
        }
    }
    with_deadline(|| {
        let sched = started(1);
        for _ in 0..50 {
            drop(sched.submit(|| Boom, None).unwrap());
        }
        // Still alive and serving.
        assert_eq!(finish(sched.submit(|| 7, None).unwrap()), 7);
        sched.stop();
    });
}

/// A burst of live tasks big enough (45 MiB of cells of one size) that its later cells come
/// from huge-page slabs rather than `malloc`: every task runs with its own captures intact,
/// submitted from a plain thread and from fibers, woken from another thread, and all of it
/// twice, so the second burst reuses the first one's slabs; captures are dropped once.
#[test]
fn a_burst_of_live_tasks_past_the_slab_threshold_keeps_every_cell_intact() {
    with_deadline(|| {
        let sched = Arc::new(started(2));
        let drops = Arc::new(AtomicUsize::new(0));
        // A 400-byte capture makes a cell of about 900 bytes (the cached sizes go up to
        // 1 KiB), so 50 000 of them make about 45 MiB.
        const TASKS: usize = 50_000;
        for round in 0..2 {
            let (release, released) = fibra::sync::mpmc::channel::<()>();
            let spawn = |i: usize| {
                let (released, tally) = (released.clone(), Counted(drops.clone()));
                let payload = [(i % 251) as u8; 400];
                move || {
                    let _t = tally;
                    released.recv().expect("released");
                    assert!(payload.iter().all(|&b| b == (i % 251) as u8), "task {i}");
                    i
                }
            };
            // Half from this thread, half from a fiber.
            let mut handles: Vec<_> = (0..TASKS / 2)
                .map(|i| sched.submit(spawn(i), None).unwrap())
                .collect();
            let from_fiber: Vec<_> = (TASKS / 2..TASKS).map(spawn).collect();
            let s = sched.clone();
            let inner = sched
                .submit(
                    move || {
                        from_fiber
                            .into_iter()
                            .map(|f| s.submit(f, None).unwrap())
                            .collect::<Vec<_>>()
                    },
                    None,
                )
                .unwrap();
            handles.extend(finish(inner));
            drop(released);
            let waker = std::thread::spawn(move || {
                for _ in 0..TASKS {
                    release.send(()).unwrap();
                }
            });
            for (i, h) in handles.into_iter().enumerate() {
                assert_eq!(finish(h), i, "round {round}");
            }
            waker.join().unwrap();
            assert_eq!(drops.load(Ordering::SeqCst), (round + 1) * TASKS);
        }
        sched.stop();
    });
}
