//! The blocking pool's threads sleep once calls stop: a thread that has served back-to-back
//! calls spins only briefly (tens of microseconds) for the next one. Alone in its process,
//! so that no other test's calls keep the pool busy while its CPU time is measured.

use crate::common::{finish, with_deadline};
use std::fs;
use std::thread;
use std::time::Duration;

const IDLE_FOR: Duration = Duration::from_secs(1);
/// Far above what sleeping threads use, far below a thread spinning for the whole second.
const BUDGET: Duration = Duration::from_millis(50);

/// CPU time (ns) used so far by each thread of this process whose name starts with
/// `prefix`, from `/proc/self/task/*/{comm,schedstat}`.
fn threads_cpu_ns(prefix: &str) -> Vec<(String, u64)> {
    let mut out = Vec::new();
    for task in fs::read_dir("/proc/self/task").expect("/proc/self/task") {
        let dir = task.expect("a task entry").path();
        let (Ok(comm), Ok(stat)) = (
            fs::read_to_string(dir.join("comm")),
            fs::read_to_string(dir.join("schedstat")),
        ) else {
            continue; // the thread exited meanwhile
        };
        let comm = comm.trim().to_string();
        if comm.starts_with(prefix) {
            let ns = stat.split_whitespace().next().unwrap().parse().unwrap();
            out.push((comm, ns));
        }
    }
    out
}

#[test]
fn pool_threads_sleep_after_back_to_back_calls() {
    crate::common::child_ok(|| {
        with_deadline(|| {
            let s = fibra::Scheduler::builder().threads(2).build().unwrap();
            s.start();
            // Back-to-back calls from a fiber on each worker: the pool spins between them.
            let handles: Vec<_> = (0..2)
                .map(|w| {
                    s.submit(
                        || {
                            (0..5_000u64)
                                .map(|k| fibra::unblock(move || k))
                                .sum::<u64>()
                        },
                        Some(w),
                    )
                    .unwrap()
                })
                .collect();
            for h in handles {
                assert_eq!(finish(h), (0..5_000u64).sum::<u64>());
            }
            let before = threads_cpu_ns("fibra-unblock");
            assert!(!before.is_empty(), "the calls ran on pool threads");
            thread::sleep(IDLE_FOR);
            let after = threads_cpu_ns("fibra-unblock");
            let used: u64 = after
                .iter()
                .map(|(name, ns)| {
                    let was = before
                        .iter()
                        .find(|(n, _)| n == name)
                        .map_or(0, |(_, ns)| *ns);
                    ns.saturating_sub(was)
                })
                .sum();
            assert!(
                Duration::from_nanos(used) < BUDGET,
                "idle blocking threads used {:?} of CPU in {IDLE_FOR:?}",
                Duration::from_nanos(used)
            );
            s.stop();
        });
    });
}
