//! An idle scheduler costs ~nothing even with 100 000 fibers asleep for an hour: workers sleep
//! until their next timer deadline instead of polling. Alone in its file (its own process), so
//! no other test's threads add CPU time.

use std::time::Duration;

/// CPU time (user + system) of this process, from /proc/self/stat (clock ticks of 10 ms).
fn cpu_time() -> Duration {
    let stat = std::fs::read_to_string("/proc/self/stat").expect("Linux /proc");
    // Fields after the parenthesised command name; utime and stime are fields 14 and 15.
    let rest = &stat[stat.rfind(')').expect("stat format") + 2..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let ticks: u64 = fields[11].parse::<u64>().unwrap() + fields[12].parse::<u64>().unwrap();
    Duration::from_millis(ticks * 10)
}

#[test]
fn a_hundred_thousand_sleeping_fibers_cost_no_cpu_while_idle() {
    crate::common::child_ok(|| {
        let s = fibra::Scheduler::builder().threads(2).build().unwrap();
        s.start();
        let started = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let handles: Vec<_> = (0..100_000)
            .map(|_| {
                let started = started.clone();
                s.submit(
                    move || {
                        started.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        fibra::sleep(Duration::from_secs(3600))
                    },
                    None,
                )
                .unwrap()
            })
            .collect();
        // Let every fiber start and park (on a loaded machine that takes a while), and stack
        // trimming finish; then measure.
        let deadline = std::time::Instant::now() + Duration::from_secs(60);
        while started.load(std::sync::atomic::Ordering::Relaxed) < 100_000 {
            assert!(
                std::time::Instant::now() < deadline,
                "the fibers did not all start"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        std::thread::sleep(Duration::from_secs(1));
        let before = cpu_time();
        std::thread::sleep(Duration::from_secs(2));
        let used = cpu_time() - before;
        eprintln!("100 000 sleeping fibers: {used:?} of CPU in 2 s");
        assert!(used < Duration::from_millis(50), "{used:?} of CPU in 2 s");
        assert_eq!(s.stop_timeout(Duration::ZERO), 100_000);
        assert!(handles
            .into_iter()
            .all(|h| h.join().unwrap_err().is_cancelled()));
    });
}
