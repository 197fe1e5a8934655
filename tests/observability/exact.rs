//! Figures that mean what they say: counters never go backwards between two reads, a dump's
//! durations are right within a few milliseconds, a one-fd `poll` waits on that fd.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::common::{started, with_deadline};

#[test]
fn no_counter_goes_backwards_under_churn() {
    // The report: `spawned()` (finished read first, live later) went backwards 1.3 M times
    // in 10.9 M reads; `busy()` (run time minus sleep time, read apart) did too.
    with_deadline(|| {
        let s = Arc::new(started(2));
        let stop = Arc::new(AtomicBool::new(false));
        let churn: Vec<_> = (0..2)
            .map(|_| {
                let (s, stop) = (s.clone(), stop.clone());
                std::thread::spawn(move || {
                    while !stop.load(Ordering::Relaxed) {
                        let hs: Vec<_> = (0..64)
                            .map(|i| {
                                s.spawn(move || {
                                    if i % 8 == 0 {
                                        fibra::sleep(Duration::from_micros(200));
                                    }
                                })
                            })
                            .collect();
                        hs.into_iter().for_each(|h| h.join().unwrap());
                        // Idle now and then: the workers sleep, and wake.
                        std::thread::sleep(Duration::from_micros(300));
                    }
                })
            })
            .collect();
        let mut last = s.metrics();
        let mut reads = 0u64;
        let t = Instant::now();
        while t.elapsed() < Duration::from_secs(1) {
            let m = s.metrics();
            reads += 1;
            assert!(
                m.spawned() >= last.spawned(),
                "spawned: {} then {}",
                last.spawned(),
                m.spawned()
            );
            for (w, l) in m.workers().iter().zip(last.workers()) {
                let pairs = [
                    ("resumes", l.resumes(), w.resumes()),
                    ("yields", l.yields(), w.yields()),
                    ("parks", l.parks(), w.parks()),
                    ("finished", l.finished(), w.finished()),
                    ("sleeps", l.sleeps(), w.sleeps()),
                    ("local wakes", l.local_wakes(), w.local_wakes()),
                    ("remote wakes", l.remote_wakes(), w.remote_wakes()),
                    ("steals", l.steals(), w.steals()),
                ];
                for (what, before, now) in pairs {
                    assert!(
                        now >= before,
                        "worker {}: {what} {before} then {now}",
                        w.index()
                    );
                }
                assert!(
                    w.busy() >= l.busy(),
                    "worker {}: busy {:?} then {:?}",
                    w.index(),
                    l.busy(),
                    w.busy()
                );
                assert!(
                    w.slept() >= l.slept(),
                    "worker {}: slept {:?} then {:?}",
                    w.index(),
                    l.slept(),
                    w.slept()
                );
            }
            last = m;
        }
        stop.store(true, Ordering::Relaxed);
        churn.into_iter().for_each(|c| c.join().unwrap());
        assert!(reads > 1_000, "{reads} reads");
        // Every task joined: once the workers counted their ends, the two agree.
        crate::common::wait_until("the workers to count every end", || {
            let m = s.metrics();
            m.spawned() == m.workers().iter().map(|w| w.finished()).sum::<u64>()
        });
        let m = s.metrics();
        assert!(m.workers().iter().all(|w| w.sleeps() > 0), "{m}");
        s.stop();
    });
}

#[test]
fn a_fiber_that_parks_after_a_long_computation_of_another_is_dated_right() {
    // The report: fibers that parked right after a neighbour's long computation were shown
    // parked that much too long (the park was dated from a clock read before it).
    with_deadline(|| {
        // Without a watchdog (with one, the old code refreshed its clock after a long run).
        let s = fibra::Scheduler::builder()
            .threads(1)
            .watchdog(Duration::ZERO)
            .build()
            .unwrap();
        s.start();
        let (tx, rx) = std::sync::mpsc::channel();
        // One worker: the computation, then the sleeper, which parks at once.
        let computer = s.spawn(move || {
            let t = Instant::now();
            while t.elapsed() < Duration::from_millis(400) {
                std::hint::spin_loop();
            }
        });
        let sleeper = s.spawn(move || {
            tx.send(()).unwrap();
            fibra::sleep(Duration::from_secs(3600));
        });
        rx.recv().unwrap();
        computer.join().unwrap();
        std::thread::sleep(Duration::from_millis(50));
        let d = s.dump();
        let e = d
            .fibers()
            .iter()
            .find(|e| e.id() == sleeper.id())
            .expect("listed");
        let parked = e.duration().expect("a parked fiber's duration");
        assert!(
            parked >= Duration::from_millis(40) && parked < Duration::from_millis(300),
            "parked for {parked:?} by the dump, about 50 ms in truth\n{d}"
        );
        sleeper.cancel();
        s.stop();
    });
}

#[cfg(feature = "hook")]
#[test]
fn a_hooked_poll_of_one_fd_waits_on_that_fd() {
    use std::os::fd::AsRawFd;
    with_deadline(|| {
        let s = started(1);
        let (r, w) = std::io::pipe().unwrap();
        let fd = r.as_raw_fd();
        let h = s.spawn(move || {
            let mut p = libc::pollfd {
                fd,
                events: libc::POLLIN,
                revents: 0,
            };
            // SAFETY: one live pollfd.
            unsafe { libc::poll(&mut p, 1, 10_000) }
        });
        crate::common::parked_on_io(&s, 1);
        let d = s.dump();
        let e = d
            .fibers()
            .iter()
            .find(|e| e.id() == h.id())
            .expect("listed");
        assert_eq!(
            e.status(),
            fibra::dump::Status::Parked(fibra::dump::WaitOn::Io {
                fd,
                readable: true,
                writable: false
            }),
            "{d}"
        );
        drop(w);
        assert_eq!(h.join().unwrap(), 1);
        drop(r);
        s.stop();
    });
}
