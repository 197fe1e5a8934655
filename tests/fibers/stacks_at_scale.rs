//! Stacks at scale: 100 000 fibers parked at once with default settings, a mapping count that
//! stays small, memory handed back after a burst, and overflow detection with the `mprotect`
//! fallback guard as well as the default one.

use std::process::Command;
use std::sync::{Arc, Mutex};
use std::time::Duration;

fn maps_count() -> usize {
    std::fs::read_to_string("/proc/self/maps")
        .expect("Linux /proc")
        .lines()
        .count()
}

#[test]
fn a_hundred_thousand_parked_fibers_all_complete() {
    const FIBERS: usize = 100_000;
    let s = fibra::Scheduler::builder().threads(2).build().unwrap();
    s.start();
    let unparkers = Arc::new(Mutex::new(Vec::with_capacity(FIBERS)));
    let handles: Vec<_> = (0..FIBERS)
        .map(|i| {
            let unparkers = unparkers.clone();
            s.submit(
                move || {
                    fibra::park(|u| unparkers.lock().unwrap().push(u));
                    i
                },
                None,
            )
            .unwrap()
        })
        .collect();
    let mut waited = Duration::ZERO;
    while unparkers.lock().unwrap().len() < FIBERS {
        assert!(waited < Duration::from_secs(120), "fibers did not all park");
        std::thread::sleep(Duration::from_millis(10));
        waited += Duration::from_millis(10);
    }
    let maps = maps_count();
    eprintln!(
        "{FIBERS} parked fibers: {maps} lines in /proc/self/maps, guard: {}",
        fibra::guard_kind()
    );
    if fibra::guard_kind().starts_with("madvise") {
        // One mapping per stack would be 100 000+; slabs with guard markers merge.
        assert!(maps < 5_000, "{maps} mappings");
    }
    for u in unparkers.lock().unwrap().drain(..) {
        u.unpark();
    }
    for (i, h) in handles.into_iter().enumerate() {
        assert_eq!(h.join().unwrap(), i);
    }
}

#[test]
fn idle_workers_give_burst_memory_back() {
    let s = one_worker_keeping_16_stacks();
    crate::common::park_burst::<0>(&s, 2_000, None, || {});
    // The worker goes idle, keeps 16 stacks and hands the rest, memory released, to the
    // shared free list (other tests running in parallel can only add to it).
    assert!(stacks_freed(2_000 - 16), "{:?}", fibra::stack_stats());
}

/// A started scheduler of one worker that keeps at most 16 idle stacks.
fn one_worker_keeping_16_stacks() -> fibra::Scheduler {
    let s = fibra::Scheduler::builder()
        .threads(1)
        .stack_cache(16)
        .build()
        .unwrap();
    s.start();
    s
}

/// Waits (at most 30 s) until the global free list holds `n` stacks; returns whether it
/// does.
fn stacks_freed(n: usize) -> bool {
    let mut waited = Duration::ZERO;
    while fibra::stack_stats().stacks_free < n {
        if waited >= Duration::from_secs(30) {
            return false;
        }
        std::thread::sleep(Duration::from_millis(10));
        waited += Duration::from_millis(10);
    }
    true
}

const CHILD: &str = "FIBRA_STACKS_CHILD";

/// Not a test of its own: the body of a child process that overflows a named fiber.
#[test]
#[ignore = "child process of overflow_is_reported_with_the_mprotect_guard_too"]
fn child_overflows_a_named_fiber() {
    if std::env::var_os(CHILD).is_none() {
        return;
    }
    fn recurse(n: u64) -> u64 {
        let pad = std::hint::black_box([0u8; 512]);
        if std::hint::black_box(n) == u64::MAX {
            return 0;
        }
        recurse(n + 1) + u64::from(std::hint::black_box(pad)[(n % 512) as usize])
    }
    let s = fibra::Scheduler::builder().threads(2).build().unwrap();
    s.start();
    let h = s
        .task()
        .name("deep-thought")
        .stack_size(64 * 1024)
        .submit(|| recurse(0), Some(1))
        .unwrap();
    let _ = h.join();
    unreachable!("the overflow aborts the process");
}

fn overflow_child(guard: Option<&str>) -> (std::process::ExitStatus, String) {
    let mut cmd = Command::new(std::env::current_exe().unwrap());
    cmd.args(["--ignored", "child_overflows_a_named_fiber", "--nocapture"])
        .env(CHILD, "1");
    if let Some(g) = guard {
        cmd.env("FIBRA_GUARD", g);
    }
    let out = cmd.output().unwrap();
    (
        out.status,
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn overflow_names_the_fiber_its_worker_and_stack_size() {
    use std::os::unix::process::ExitStatusExt;
    let (status, stderr) = overflow_child(None);
    assert_eq!(status.signal(), Some(libc_sigabrt()), "{stderr}");
    assert!(
        stderr.contains("fiber 'deep-thought' (#")
            && stderr.contains(") on worker 1 overflowed its 64 KiB stack"),
        "{stderr}"
    );
}

#[test]
fn overflow_is_reported_with_the_mprotect_guard_too() {
    use std::os::unix::process::ExitStatusExt;
    let (status, stderr) = overflow_child(Some("mprotect"));
    assert_eq!(status.signal(), Some(libc_sigabrt()), "{stderr}");
    assert!(
        stderr.contains("fiber 'deep-thought' (#")
            && stderr.contains("overflowed its 64 KiB stack"),
        "{stderr}"
    );
}

/// SIGABRT on Linux (tests do not depend on libc).
fn libc_sigabrt() -> i32 {
    6
}

const RSS_CHILD: &str = "FIBRA_STACKS_RSS_CHILD";

/// Resident memory of this process, in KiB.
fn rss_kib() -> usize {
    std::fs::read_to_string("/proc/self/status")
        .expect("Linux /proc")
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("a VmRSS line")
}

/// Not a test of its own: the body of a child process (alone, so its resident memory is
/// its own) in which 2 000 fibers each touch 32 KiB of their stack, end, and the idle worker
/// trims its cache to 16 stacks. Prints the resident memory before the burst, at its peak and
/// after the trim.
#[test]
#[ignore = "child process of trimmed_stacks_give_their_memory_back"]
fn child_touches_and_trims_stacks() {
    if std::env::var_os(RSS_CHILD).is_none() {
        return;
    }
    let s = one_worker_keeping_16_stacks();
    let before = rss_kib();
    let mut peak = 0;
    crate::common::park_burst::<32>(&s, 2_000, None, || peak = rss_kib());
    assert!(stacks_freed(2_000 - 16), "{:?}", fibra::stack_stats());
    println!("RSS {before} {peak} {}", rss_kib());
}

/// Trimmed stacks really give their memory back (the release is batched into
/// `process_madvise` calls where the kernel allows): after 2 000 fibers touched 32 KiB each
/// (62.5 MiB), the idle worker keeps 16 stacks and the rest of that memory leaves the process.
#[test]
fn trimmed_stacks_give_their_memory_back() {
    let out = Command::new(std::env::current_exe().unwrap())
        .args(["--ignored", "child_touches_and_trims_stacks", "--nocapture"])
        .env(RSS_CHILD, "1")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let line = stdout
        .lines()
        .find_map(|l| l.strip_prefix("RSS "))
        .unwrap_or_else(|| panic!("no RSS line in {stdout}"));
    let v: Vec<usize> = line.split(' ').map(|x| x.parse().unwrap()).collect();
    let (before, peak, after) = (v[0], v[1], v[2]);
    assert!(
        peak > before + 50 * 1024,
        "the burst touched little: {v:?} KiB"
    );
    assert!(
        after < before + 20 * 1024,
        "trimmed stacks kept their memory: before {before}, peak {peak}, after {after} KiB"
    );
}
