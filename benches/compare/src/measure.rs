//! Measurement helpers shared by every workload: process CPU time (`getrusage`), resident set size
//! (`/proc/self/statm`), medians, and the warm-up + repetitions loop.

use std::time::{Duration, Instant};

/// User + system CPU time consumed so far by this whole process (all threads).
pub fn process_cpu() -> Duration {
    // SAFETY: `rusage` is plain old data, so an all-zero value is valid; `getrusage` only writes
    // into the struct we pass, which lives on this stack frame for the whole call.
    let usage = unsafe {
        let mut usage: libc::rusage = std::mem::zeroed();
        let rc = libc::getrusage(libc::RUSAGE_SELF, &mut usage);
        assert_eq!(
            rc,
            0,
            "getrusage failed: {}",
            std::io::Error::last_os_error()
        );
        usage
    };
    let tv = |t: libc::timeval| Duration::new(t.tv_sec as u64, t.tv_usec as u32 * 1000);
    tv(usage.ru_utime) + tv(usage.ru_stime)
}

/// Resident set size of this process in KiB, from the second field of `/proc/self/statm`.
pub fn rss_kib() -> u64 {
    let statm = std::fs::read_to_string("/proc/self/statm").expect("read /proc/self/statm");
    let pages: u64 = statm
        .split_whitespace()
        .nth(1)
        .and_then(|f| f.parse().ok())
        .expect("resident field in /proc/self/statm");
    // SAFETY: sysconf has no preconditions; it only reads a system constant.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    pages * page as u64 / 1024
}

/// Median of the samples (mean of the two middle ones for an even count); `None` when empty.
pub fn median(samples: &[f64]) -> Option<f64> {
    if samples.is_empty() {
        return None;
    }
    let mut v = samples.to_vec();
    v.sort_by(f64::total_cmp);
    let mid = v.len() / 2;
    Some(if v.len() % 2 == 1 {
        v[mid]
    } else {
        (v[mid - 1] + v[mid]) / 2.0
    })
}

/// Nanoseconds per item for a batch of `items` that took `elapsed`.
pub fn ns_per(elapsed: Duration, items: usize) -> f64 {
    elapsed.as_nanos() as f64 / items as f64
}

/// Milliseconds in a duration, as a float.
pub fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

/// How long a child warms up: it repeats the workload untimed until this much time has passed
/// (at least once).
///
/// One repetition fills stack pools, allocator caches and lazily started workers, but not the
/// kernel's view of the process: a kernel may keep a fresh process's busy worker threads on
/// one CPU for its first tens of milliseconds, and balance them apart only once it has seen
/// them busy for a while. Repetitions timed in that stretch measure the kernel's start-up
/// placement, not the runtime, so a child warms up for longer than that; criterion, which
/// tokio's own benchmarks use, warms up for 3 s.
pub const WARM_UP_FOR: Duration = Duration::from_millis(200);

/// Runs `rep` untimed when `warmup` is set, once and then until [`WARM_UP_FOR`] has passed,
/// then `reps` times, and returns the figure each timed repetition reported.
pub fn repeat(warmup: bool, reps: usize, mut rep: impl FnMut() -> f64) -> Vec<f64> {
    if warmup {
        let start = Instant::now();
        rep();
        while start.elapsed() < WARM_UP_FOR {
            rep();
        }
    }
    (0..reps).map(|_| rep()).collect()
}

/// Waits (sleeping in small steps on this plain thread) until `done()` holds; panics after
/// `limit` so that a lost wake-up turns into a clear failure instead of a hang.
pub fn wait_until(limit: Duration, what: &str, mut done: impl FnMut() -> bool) {
    let start = Instant::now();
    while !done() {
        assert!(
            start.elapsed() < limit,
            "timed out after {limit:?} waiting for {what}"
        );
        std::thread::sleep(Duration::from_millis(1));
    }
}
