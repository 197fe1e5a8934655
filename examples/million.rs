//! One million fibers parked at once, each on its own guarded 256 KiB stack, with default
//! settings and the default `vm.max_map_count`. Prints the time to spawn and park them, the
//! resident memory per parked fiber and the number of kernel mappings.
//!
//! `cargo run --release --example million [count]`

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

fn rss_kib() -> u64 {
    let statm = std::fs::read_to_string("/proc/self/statm").expect("Linux /proc");
    let pages: u64 = statm
        .split_whitespace()
        .nth(1)
        .and_then(|p| p.parse().ok())
        .expect("statm has a resident field");
    pages * 4
}

fn maps() -> usize {
    std::fs::read_to_string("/proc/self/maps")
        .expect("Linux /proc")
        .lines()
        .count()
}

fn main() -> Result<(), fibra::Error> {
    let count: usize = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(1_000_000);
    let max_map_count = std::fs::read_to_string("/proc/sys/vm/max_map_count")
        .map(|s| s.trim().to_string())
        .unwrap_or_else(|_| "?".into());
    println!(
        "{count} fibers, 2 workers, {} KiB stacks, guard: {}, vm.max_map_count = {max_map_count}",
        fibra::DEFAULT_STACK_SIZE / 1024,
        fibra::guard_kind()
    );
    let sched = fibra::Scheduler::builder().threads(2).build()?;
    sched.start();
    let unparkers = Arc::new(Mutex::new(Vec::with_capacity(count)));
    let rss_before = rss_kib();
    let maps_before = maps();
    let start = Instant::now();
    let handles: Vec<_> = (0..count)
        .map(|_| {
            let unparkers = unparkers.clone();
            sched
                .submit(
                    move || fibra::park(|u| unparkers.lock().unwrap().push(u)),
                    None,
                )
                .expect("running")
        })
        .collect();
    while unparkers.lock().unwrap().len() < count {
        std::thread::sleep(Duration::from_millis(1));
    }
    let spawned = start.elapsed();
    let rss = rss_kib();
    let per_fiber = (rss - rss_before) as f64 / count as f64;
    println!(
        "spawned and parked in {spawned:?} ({:.0} ns per fiber)",
        spawned.as_nanos() as f64 / count as f64
    );
    println!(
        "RSS {:.0} MiB (+{:.0} MiB): {per_fiber:.2} KiB per parked fiber (JoinHandle and Unparker included)",
        rss as f64 / 1024.0,
        (rss - rss_before) as f64 / 1024.0
    );
    println!("kernel mappings: {} (before: {maps_before})", maps());
    let stats = fibra::stack_stats();
    println!(
        "stack slabs: {} reserving {} GiB of address space, {} stacks carved",
        stats.slabs,
        stats.reserved_bytes >> 30,
        stats.stacks_carved
    );
    let start = Instant::now();
    for u in unparkers.lock().unwrap().drain(..) {
        u.unpark();
    }
    for h in handles {
        h.join().expect("no panic");
    }
    println!("woke and joined all in {:?}", start.elapsed());
    sched.stop();
    Ok(())
}
