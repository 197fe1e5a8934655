//! `fibra::sync::WaitGroup`: dropping the last handle releases every waiter, fibers and
//! threads alike; `wait_timeout` gives up, never early.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::common::{finish, started, wait_until, with_deadline, LIMIT};
use fibra::sync::WaitGroup;

#[test]
fn dropping_the_last_handle_releases_fifty_waiting_fibers() {
    with_deadline(|| {
        let sched = started(2);
        let gate = WaitGroup::new();
        let about_to_wait = Arc::new(AtomicUsize::new(0));
        let released = Arc::new(AtomicUsize::new(0));
        let handles: Vec<_> = (0..50)
            .map(|_| {
                let (gate, about, released) =
                    (gate.clone(), about_to_wait.clone(), released.clone());
                sched
                    .submit(
                        move || {
                            about.fetch_add(1, Ordering::SeqCst);
                            gate.wait();
                            released.fetch_add(1, Ordering::SeqCst);
                        },
                        None,
                    )
                    .expect("submit")
            })
            .collect();
        wait_until("every fiber reached wait", || {
            about_to_wait.load(Ordering::SeqCst) == 50
        });
        assert_eq!(released.load(Ordering::SeqCst), 0, "nobody passes early");
        drop(gate);
        for h in handles {
            finish(h);
        }
        assert_eq!(released.load(Ordering::SeqCst), 50);
        sched.stop();
    });
}

#[test]
fn a_thread_waits_for_fibers() {
    with_deadline(|| {
        let sched = started(2);
        let wg = WaitGroup::new();
        let done = Arc::new(AtomicUsize::new(0));
        for _ in 0..100 {
            let (wg, done) = (wg.clone(), done.clone());
            drop(
                sched
                    .submit(
                        move || {
                            fibra::sleep(Duration::from_millis(1));
                            done.fetch_add(1, Ordering::SeqCst);
                            drop(wg);
                        },
                        None,
                    )
                    .expect("submit"),
            );
        }
        wg.wait();
        assert_eq!(done.load(Ordering::SeqCst), 100);
        sched.stop();
    });
}

#[test]
fn wait_timeout_gives_up_never_early_and_reports_success() {
    with_deadline(|| {
        let sched = started(1);
        let timeout = Duration::from_millis(30);
        let check = move || {
            let wg = WaitGroup::new();
            let other = wg.clone();
            let start = Instant::now();
            assert!(!wg.clone().wait_timeout(timeout));
            let waited = start.elapsed();
            assert!(waited >= timeout, "woke early: {waited:?}");
            drop(other);
            assert!(wg.wait_timeout(LIMIT), "no other handle left");
        };
        finish(sched.submit(check, None).expect("submit"));
        check();
        sched.stop();
    });
}
