//! `fibra::time::Timer`, the standalone delayed executor: deadline order, FIFO among equal
//! deadlines, cancel, graceful and immediate shutdown, and surviving a panicking job.

use fibra::time::Timer;
use std::sync::mpsc;
use std::time::{Duration, Instant};

#[test]
fn jobs_scheduled_out_of_order_run_in_deadline_order() {
    let timer = Timer::new();
    let (tx, rx) = mpsc::channel();
    // The seed's demo, scaled down: delays given out of order, numbered by deadline.
    for (n, ms) in [(1, 10u64), (5, 50), (2, 20), (6, 60), (3, 30), (4, 40)] {
        let tx = tx.clone();
        timer.schedule(Duration::from_millis(ms * 2), move || tx.send(n).unwrap());
    }
    timer.shutdown();
    assert_eq!(rx.try_iter().collect::<Vec<_>>(), [1, 2, 3, 4, 5, 6]);
}

#[test]
fn equal_deadlines_run_in_submission_order_and_never_early() {
    let timer = Timer::new();
    let (tx, rx) = mpsc::channel();
    let start = Instant::now();
    for n in 0..100 {
        let tx = tx.clone();
        timer.schedule(Duration::from_millis(30), move || {
            tx.send((n, start.elapsed())).unwrap()
        });
    }
    timer.shutdown();
    let got: Vec<_> = rx.try_iter().collect();
    // Separate calls to schedule compute separate deadlines, each no earlier than the last.
    assert_eq!(
        got.iter().map(|(n, _)| *n).collect::<Vec<_>>(),
        (0..100).collect::<Vec<_>>()
    );
    assert!(got.iter().all(|(_, t)| *t >= Duration::from_millis(30)));
}

#[test]
fn cancel_removes_a_pending_job_only() {
    let timer = Timer::new();
    let (tx, rx) = mpsc::channel();
    let tx2 = tx.clone();
    let keep = timer.schedule(Duration::from_millis(10), move || tx.send("kept").unwrap());
    let drop_me = timer.schedule(Duration::from_millis(20), move || {
        tx2.send("cancelled").unwrap()
    });
    assert!(drop_me.cancel());
    assert!(!drop_me.cancel(), "a second cancel finds nothing");
    assert_eq!(rx.recv_timeout(Duration::from_secs(30)).unwrap(), "kept");
    assert!(!keep.cancel(), "a job that ran cannot be cancelled");
    timer.shutdown();
    assert!(rx.try_recv().is_err());
}

#[test]
fn shutdown_now_drops_pending_jobs_promptly() {
    let timer = Timer::new();
    let (tx, rx) = mpsc::channel::<()>();
    for _ in 0..10 {
        let tx = tx.clone();
        timer.schedule(Duration::from_secs(3600), move || tx.send(()).unwrap());
    }
    assert_eq!(timer.pending(), 10);
    let t = Instant::now();
    assert_eq!(timer.shutdown_now(), 10);
    assert!(t.elapsed() < Duration::from_secs(5), "{:?}", t.elapsed());
    drop(tx);
    assert!(rx.recv().is_err(), "no job ran and every job was dropped");
}

#[test]
fn an_earlier_job_wakes_the_sleeping_timer() {
    let timer = Timer::new();
    let (tx, rx) = mpsc::channel();
    let tx2 = tx.clone();
    timer.schedule(Duration::from_secs(3600), move || tx2.send("late").unwrap());
    std::thread::sleep(Duration::from_millis(20));
    let t = Instant::now();
    timer.schedule(Duration::from_millis(10), move || tx.send("early").unwrap());
    assert_eq!(rx.recv_timeout(Duration::from_secs(30)).unwrap(), "early");
    assert!(t.elapsed() < Duration::from_secs(10));
    assert_eq!(timer.shutdown_now(), 1);
}

#[test]
fn a_panicking_job_does_not_stop_the_timer() {
    let timer = Timer::new();
    let (tx, rx) = mpsc::channel();
    timer.schedule(Duration::from_millis(5), || panic!("job failed"));
    timer.schedule(Duration::from_millis(10), move || tx.send(1).unwrap());
    assert_eq!(rx.recv_timeout(Duration::from_secs(30)).unwrap(), 1);
    timer.shutdown();
}
