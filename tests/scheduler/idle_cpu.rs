//! Idle workers cost ~no CPU: a freshly started scheduler and one back from a burst of work
//! park instead of busy-waiting; 100 000 fibers asleep for an hour cost nothing while idle
//! (workers sleep until their next timer deadline instead of polling); and an idle worker
//! watching a busy peer that spawns nothing backs off. Each test runs its body in a child
//! process of its own (`child_ok`), so that no other test's threads add CPU time or wake-ups
//! while the process's consumption is measured.

use std::fs;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use crate::common::{child_ok, finish, started, with_deadline};
use fibra::Scheduler;

const IDLE_FOR: Duration = Duration::from_secs(2);
const BUDGET: Duration = Duration::from_millis(20);

/// CPU time used so far by every thread of this process.
///
/// Sums the nanosecond run time of each thread from `/proc/self/task/*/schedstat`;
/// falls back to utime + stime of `/proc/self/stat` (in clock ticks of 10 ms).
fn process_cpu_time() -> Duration {
    schedstat_cpu_time().unwrap_or_else(stat_cpu_time)
}

fn schedstat_cpu_time() -> Option<Duration> {
    let mut total_ns = 0u64;
    for task in fs::read_dir("/proc/self/task").ok()? {
        let path = task.ok()?.path().join("schedstat");
        let Ok(text) = fs::read_to_string(path) else {
            continue; // the thread exited meanwhile
        };
        total_ns += text.split_whitespace().next()?.parse::<u64>().ok()?;
    }
    Some(Duration::from_nanos(total_ns))
}

fn stat_cpu_time() -> Duration {
    let stat = fs::read_to_string("/proc/self/stat").expect("/proc/self/stat is readable");
    // The command name may contain spaces and parentheses: fields resume after the last ')'.
    let after_name = &stat[stat.rfind(')').expect("stat has a command name") + 1..];
    let fields: Vec<&str> = after_name.split_whitespace().collect();
    // Fields 14 (utime) and 15 (stime) of proc(5); `fields[0]` is field 3.
    let ticks: u64 =
        fields[11].parse::<u64>().expect("utime") + fields[12].parse::<u64>().expect("stime");
    Duration::from_millis(ticks * 10)
}

fn cpu_used_while_idle() -> Duration {
    let before = process_cpu_time();
    thread::sleep(IDLE_FOR);
    process_cpu_time().saturating_sub(before)
}

/// An idle scheduler's workers park instead of busy-waiting, both freshly started and
/// after a burst of work.
#[test]
fn an_idle_scheduler_uses_almost_no_cpu() {
    child_ok(|| {
        let sched = Scheduler::builder().threads(2).build().expect("build");
        sched.start();
        // Make sure both workers are up, then give them time to stop spinning.
        for worker in 0..2 {
            let handle = sched.submit(|| (), Some(worker)).expect("submit");
            assert!(handle.wait_timeout(Duration::from_secs(30)));
        }
        thread::sleep(Duration::from_millis(100));
        let fresh = cpu_used_while_idle();
        assert!(
            fresh < BUDGET,
            "a freshly started idle scheduler used {fresh:?} of CPU in {IDLE_FOR:?}"
        );

        // After a burst of work, the workers go back to sleep.
        let handles: Vec<_> = (0..10_000u64)
            .map(|i| sched.submit(move || i * 2, None).expect("submit"))
            .collect();
        for handle in handles {
            assert!(handle.wait_timeout(Duration::from_secs(30)));
        }
        thread::sleep(Duration::from_millis(100));
        let after_work = cpu_used_while_idle();
        assert!(
            after_work < BUDGET,
            "an idle scheduler used {after_work:?} of CPU in {IDLE_FOR:?} after a burst of work"
        );
        sched.stop();
    });
}

/// 100 000 fibers asleep for an hour cost ~nothing while the scheduler is otherwise idle:
/// its workers sleep until the next timer deadline instead of polling.
#[test]
fn a_hundred_thousand_sleeping_fibers_cost_no_cpu_while_idle() {
    child_ok(|| {
        let s = Scheduler::builder().threads(2).build().unwrap();
        s.start();
        let started = Arc::new(AtomicUsize::new(0));
        let handles: Vec<_> = (0..100_000)
            .map(|_| {
                let started = started.clone();
                s.submit(
                    move || {
                        started.fetch_add(1, Ordering::Relaxed);
                        fibra::sleep(Duration::from_secs(3600))
                    },
                    None,
                )
                .unwrap()
            })
            .collect();
        // Let every fiber start and park (on a loaded machine that takes a while), and stack
        // trimming finish; then measure.
        let deadline = Instant::now() + Duration::from_secs(60);
        while started.load(Ordering::Relaxed) < 100_000 {
            assert!(Instant::now() < deadline, "the fibers did not all start");
            thread::sleep(Duration::from_millis(50));
        }
        thread::sleep(Duration::from_secs(1));
        let used = cpu_used_while_idle();
        eprintln!("100 000 sleeping fibers: {used:?} of CPU in {IDLE_FOR:?}");
        assert!(
            used < Duration::from_millis(50),
            "{used:?} of CPU in {IDLE_FOR:?}"
        );
        assert_eq!(s.stop_timeout(Duration::ZERO), 100_000);
        assert!(handles
            .into_iter()
            .all(|h| h.join().unwrap_err().is_cancelled()));
    });
}

/// An idle worker that watches a busy peer's `next` slot (a help request from the peer's
/// burst) backs off while the slot stays empty: after a burst spawned on worker 1, whose
/// other fiber then keeps yielding without spawning, worker 0 wakes a few hundred times a
/// second at most. It woke every 50–150 µs (7 000 times a second) for as long as the peer
/// stayed busy.
#[test]
fn an_idle_worker_backs_off_watching_a_busy_peer_that_spawns_nothing() {
    child_ok(|| {
        with_deadline(|| {
            const WINDOW: Duration = Duration::from_millis(300);
            let sched = Arc::new(started(2));
            let stop = Arc::new(AtomicBool::new(false));
            let stop2 = stop.clone();
            let busy = sched
                .submit(
                    move || {
                        while !stop2.load(Ordering::Relaxed) {
                            fibra::Fiber::yield_now();
                        }
                    },
                    Some(1),
                )
                .unwrap();
            let sleeps = |s: &fibra::Scheduler| s.metrics().workers()[0].sleeps();
            let mut worst = 0;
            for _ in 0..3 {
                let s = sched.clone();
                let burst = move || {
                    (0..200)
                        .map(|_| {
                            s.spawn(|| {
                                let until = Instant::now() + Duration::from_micros(20);
                                while Instant::now() < until {
                                    std::hint::spin_loop();
                                }
                            })
                        })
                        .collect::<Vec<_>>()
                };
                for h in finish(sched.submit(burst, Some(1)).unwrap()) {
                    finish(h);
                }
                let before = sleeps(&sched);
                thread::sleep(WINDOW);
                worst = worst.max(sleeps(&sched) - before);
            }
            stop.store(true, Ordering::Relaxed);
            finish(busy);
            eprintln!("worker 0's most wake-ups in {WINDOW:?} after a burst: {worst}");
            // 3 000 a second: a loaded machine only stretches the naps.
            assert!(worst < 900, "worker 0 woke {worst} times in {WINDOW:?}");
            sched.stop();
        });
    });
}
