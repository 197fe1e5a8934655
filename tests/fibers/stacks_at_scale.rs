//! Stacks at scale: 100 000 fibers parked at once with default settings, a mapping count that
//! stays small, memory handed back after a burst, and overflow detection with the `mprotect`
//! fallback guard as well as the default one.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::common::{in_child, in_child_with};
use crate::overflow::aborted;

fn maps_count() -> usize {
    std::fs::read_to_string("/proc/self/maps")
        .expect("Linux /proc")
        .lines()
        .count()
}

#[test]
fn a_hundred_thousand_parked_fibers_all_complete() {
    crate::common::child_ok(|| {
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
    });
}

#[test]
fn idle_workers_give_burst_memory_back() {
    crate::common::child_ok(|| {
        let s = one_worker_keeping_16_stacks();
        crate::common::park_burst::<0>(&s, 2_000, None, || {});
        // The worker goes idle, keeps 16 stacks and hands the rest, memory released, to the
        // shared free list (other tests running in parallel can only add to it).
        assert!(stacks_freed(2_000 - 16), "{:?}", fibra::stack_stats());
    });
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

/// In a child process: overflows the 64 KiB stack of a fiber named `deep-thought` on worker
/// 1 (the overflow aborts the process).
fn overflow_a_named_fiber() {
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

#[test]
fn overflow_names_the_fiber_its_worker_and_stack_size() {
    let run = in_child(overflow_a_named_fiber);
    let stderr = aborted(&run);
    assert!(
        stderr.contains("fiber 'deep-thought' (#")
            && stderr.contains(") on worker 1 overflowed its 64 KiB stack"),
        "{stderr}"
    );
}

#[test]
fn overflow_is_reported_with_the_mprotect_guard_too() {
    let run = in_child_with(&[("FIBRA_GUARD", "mprotect")], overflow_a_named_fiber);
    let stderr = aborted(&run);
    assert!(
        stderr.contains("fiber 'deep-thought' (#")
            && stderr.contains("overflowed its 64 KiB stack"),
        "{stderr}"
    );
}

/// Resident memory of this process, in KiB.
fn rss_kib() -> usize {
    std::fs::read_to_string("/proc/self/status")
        .expect("Linux /proc")
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("a VmRSS line")
}

/// Trimmed stacks really give their memory back (the release is batched into
/// `process_madvise` calls where the kernel allows): after 2 000 fibers touched 32 KiB each
/// (62.5 MiB), the idle worker keeps 16 stacks and the rest of that memory leaves the process.
///
/// The burst runs in a child process (alone, so its resident memory is its own): 2 000 fibers
/// each touch 32 KiB of their stack, end, and the idle worker trims its cache to 16 stacks.
/// The child prints the resident memory before the burst, at its peak and after the trim.
#[test]
fn trimmed_stacks_give_their_memory_back() {
    let run = in_child(|| {
        let s = one_worker_keeping_16_stacks();
        let before = rss_kib();
        let mut peak = 0;
        crate::common::park_burst::<32>(&s, 2_000, None, || peak = rss_kib());
        assert!(stacks_freed(2_000 - 16), "{:?}", fibra::stack_stats());
        eprintln!("RSS {before} {peak} {}", rss_kib());
    });
    let stderr = &run.stderr;
    run.assert_ok("the child's burst and trim failed");
    let line = stderr
        .lines()
        .find_map(|l| l.strip_prefix("RSS "))
        .unwrap_or_else(|| panic!("no RSS line in {stderr}"));
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
