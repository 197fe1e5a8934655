//! An idle scheduler costs ~0 CPU: its workers park instead of busy-waiting.
//! Alone in this file so that no other test's threads add CPU time while the
//! process's consumption is measured.

use std::fs;
use std::thread;
use std::time::Duration;

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

#[test]
fn an_idle_scheduler_uses_almost_no_cpu() {
    crate::common::child_ok(|| {
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
