//! Model checks of the scheduler's own atomics under loom (`ci/loom.sh`): the park word, the
//! idle protocol and the wake-versus-free guard. Each model runs the real types of
//! `park/protocol.rs`, `idle.rs` and `live.rs` (their atomics are loom's under `--cfg
//! loom`); the threads stand in for a home worker, wakers, a timer and a canceller.

use super::idle::{Idlers, WorkerSleep};
use super::live::LiveCount;
use crate::park::protocol::{ParkWord, WakerCount};
use loom::cell::UnsafeCell;
use loom::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use loom::sync::Arc;
use loom::thread;

/// An unparker, the timer and the canceller race for one park: exactly one wins, and the
/// home worker resumes the fiber once.
#[test]
fn park_word_one_winner_among_unpark_timer_and_cancel() {
    loom::model(|| {
        let word = Arc::new(ParkWord::new());
        let wins = Arc::new(AtomicUsize::new(0));
        word.begin_run();
        let gen = word.publish_parked();
        let racers: Vec<_> = (0..3)
            .map(|who| {
                let (word, wins) = (word.clone(), wins.clone());
                thread::spawn(move || {
                    let won = if who == 2 {
                        // The canceller looks first, as `cancel_all` does.
                        word.parked().is_some_and(|g| word.notify(g))
                    } else {
                        word.notify(gen)
                    };
                    if won {
                        wins.fetch_add(1, Ordering::SeqCst);
                    }
                })
            })
            .collect();
        for r in racers {
            r.join().unwrap();
        }
        assert_eq!(wins.load(Ordering::SeqCst), 1);
        assert_eq!(word.parked(), None);
    });
}

/// A stale unparker (from an earlier park) racing the next park never wakes it; the new
/// park's own unparker does.
#[test]
fn park_word_a_stale_unparker_never_wakes_a_later_park() {
    loom::model(|| {
        let word = Arc::new(ParkWord::new());
        word.begin_run();
        let first = word.publish_parked();
        assert!(word.notify(first));
        let stale = {
            let word = word.clone();
            thread::spawn(move || word.notify(first))
        };
        word.begin_run();
        let second = word.publish_parked();
        assert!(!stale.join().unwrap(), "a stale unparker won");
        assert_eq!(word.parked(), Some(second));
        assert!(word.notify(second));
    });
}

/// The placement the worker writes before parking is visible to the waker that wins (the
/// Release of `publish_parked` and the Acquire of `notify`).
#[test]
fn park_word_publishes_the_placement_to_the_winner() {
    loom::model(|| {
        let word = Arc::new(ParkWord::new());
        let placement = Arc::new(UnsafeCell::new(0usize));
        let worker = {
            let (word, placement) = (word.clone(), placement.clone());
            thread::spawn(move || {
                // SAFETY (model): no waker reads it before winning the park published below.
                placement.with_mut(|p| unsafe { *p = 7 });
                word.begin_run();
                word.publish_parked()
            })
        };
        // The first park is generation 1 (`begin_run` moved the word from 0).
        if word.notify(1) {
            // SAFETY (model): written before the Release store our CAS acquired; loom
            // reports a race if that ordering were missing.
            assert_eq!(placement.with(|p| unsafe { *p }), 7);
        }
        assert_eq!(worker.join().unwrap(), 1);
    });
}

/// A submit racing a worker on its way to sleep: the work is always found — the worker sees
/// it when it looks again, or the submitter sees the announcement and wakes it. A lost
/// wake-up leaves the worker asleep for ever, which loom reports as a deadlock.
#[test]
fn idle_protocol_never_loses_a_submit() {
    loom::model(|| {
        let idlers = Arc::new(Idlers::new(1));
        let parker = Arc::new(WorkerSleep::new());
        let queued = Arc::new(AtomicBool::new(false));
        let submitter = {
            let (idlers, parker, queued) = (idlers.clone(), parker.clone(), queued.clone());
            thread::spawn(move || {
                queued.store(true, Ordering::SeqCst);
                if let Some(0) = idlers.to_wake() {
                    parker.wake();
                }
            })
        };
        // The worker: found nothing; announce, look again, sleep, until the work is there.
        loop {
            idlers.announce(0);
            if queued.load(Ordering::SeqCst) {
                idlers.withdraw(0);
                break;
            }
            parker.sleep(None);
            idlers.withdraw(0);
        }
        submitter.join().unwrap();
    });
}

/// A spinning worker means the submitter wakes nobody; the spinner must then find the work.
#[test]
fn idle_protocol_a_spinner_finds_the_work() {
    loom::model(|| {
        let idlers = Arc::new(Idlers::new(2));
        let queued = Arc::new(AtomicBool::new(false));
        assert!(idlers.try_spin(0));
        let submitter = {
            let (idlers, queued) = (idlers.clone(), queued.clone());
            thread::spawn(move || {
                queued.store(true, Ordering::SeqCst);
                idlers.to_wake()
            })
        };
        let woken = submitter.join().unwrap();
        assert_eq!(woken, None, "nobody announced, so nobody is woken");
        // The spinner's next look (after the submitter's push) finds it.
        assert!(queued.load(Ordering::SeqCst));
        assert!(idlers.stop_spinning(0));
    });
}

/// The remote wake of `protocol::unpark_fiber` against the fiber finishing and the scheduler being
/// freed at once: the waker's touch of the worker after its push (the unpark) always happens
/// before the free. Without the count, loom reports the touch racing the free.
#[test]
fn remote_wake_never_touches_a_freed_worker() {
    loom::model(|| {
        let word = Arc::new(ParkWord::new());
        let wakers = Arc::new(WakerCount::new());
        let inbox = Arc::new(AtomicBool::new(false));
        // Stands for the worker's memory: the waker reads it, the free writes it.
        let worker_memory = Arc::new(UnsafeCell::new(1u32));
        word.begin_run();
        let gen = word.publish_parked();
        let waker = {
            let (word, wakers, inbox, mem) = (
                word.clone(),
                wakers.clone(),
                inbox.clone(),
                worker_memory.clone(),
            );
            thread::spawn(move || {
                if word.notify(gen) {
                    wakers.enter();
                    inbox.store(true, Ordering::Release);
                    // The parker's unpark after the push. SAFETY (model): loom checks that
                    // this read never races the free below.
                    mem.with(|m| unsafe { assert_eq!(*m, 1) });
                    wakers.leave();
                }
            })
        };
        // The home worker pops the fiber, which finishes; the scheduler is then dropped.
        while !inbox.load(Ordering::Acquire) {
            thread::yield_now();
        }
        wakers.wait_out();
        // SAFETY (model): the free; loom checks it never races the waker's read.
        worker_memory.with_mut(|m| unsafe { *m = 0 });
        waker.join().unwrap();
    });
}

/// The live count never reads zero while a task lives: a parent counted in on worker 0
/// spawns a child there, which is counted out on worker 1 (stolen) while the parent still
/// runs; a reader that sees zero must also see the parent's end. (Adding up each line's
/// difference in turn fails here: line 0 read before the spawn, line 1 after the child's
/// end.)
#[test]
fn live_count_never_reads_zero_while_a_task_lives() {
    loom::model(|| {
        let live = Arc::new(LiveCount::new(2));
        live.admit(Some(0)); // the parent
        let handed = Arc::new(AtomicBool::new(false));
        let parent_ended = Arc::new(AtomicBool::new(false));
        let parent = {
            let (live, handed, parent_ended) = (live.clone(), handed.clone(), parent_ended.clone());
            thread::spawn(move || {
                live.admit(Some(0)); // the child
                handed.store(true, Ordering::Release);
                parent_ended.store(true, Ordering::SeqCst);
                live.done(Some(0));
            })
        };
        let thief = {
            let (live, handed) = (live.clone(), handed.clone());
            thread::spawn(move || {
                if handed.load(Ordering::Acquire) {
                    live.done(Some(1)); // the child ends
                    true
                } else {
                    false
                }
            })
        };
        if live.get() == 0 {
            assert!(
                parent_ended.load(Ordering::SeqCst),
                "zero while the parent lives"
            );
        }
        let child_ended = thief.join().unwrap();
        parent.join().unwrap();
        if !child_ended {
            live.done(None);
        }
        assert_eq!(live.get(), 0);
    });
}
