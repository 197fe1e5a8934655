//! The process's resources as the kernel reports them: open file descriptors
//! (`/proc/self/fd`), threads and resident memory (`/proc/self/status`).

use std::alloc::{GlobalAlloc, Layout, System};
use std::collections::HashMap;
use std::fmt;
use std::sync::atomic::{AtomicI64, Ordering};
use std::time::Duration;

/// Live heap bytes, as [`Counting`] sees them.
static LIVE: AtomicI64 = AtomicI64::new(0);

/// The system allocator, counting the bytes it has handed out and not had back: a leak
/// check finer than RSS (fibra's own caches of task cells live here too, bounded; its stacks
/// and slabs are mapped outside it).
pub struct Counting;

// SAFETY: every method forwards to `System` with the caller's arguments unchanged, so
// `System`'s guarantees hold; the counting touches only an atomic.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: the caller's contract for `alloc` is `System.alloc`'s.
        let p = unsafe { System.alloc(layout) };
        if !p.is_null() {
            LIVE.fetch_add(layout.size() as i64, Ordering::Relaxed);
        }
        p
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        // SAFETY: as `alloc`.
        let p = unsafe { System.alloc_zeroed(layout) };
        if !p.is_null() {
            LIVE.fetch_add(layout.size() as i64, Ordering::Relaxed);
        }
        p
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: `ptr` came from this allocator, that is from `System`, with `layout`.
        unsafe { System.dealloc(ptr, layout) };
        LIVE.fetch_sub(layout.size() as i64, Ordering::Relaxed);
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: `ptr` came from `System` with `layout`; the caller's contract is
        // `System.realloc`'s.
        let p = unsafe { System.realloc(ptr, layout, new_size) };
        if !p.is_null() {
            LIVE.fetch_add(new_size as i64 - layout.size() as i64, Ordering::Relaxed);
        }
        p
    }
}

/// One reading.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Resources {
    pub fds: usize,
    pub threads: usize,
    pub rss_kib: u64,
    /// Bytes allocated through the global allocator and not freed ([`Counting`]).
    pub heap: u64,
}

impl fmt::Display for Resources {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} fds, {} threads, RSS {:.1} MiB, heap {:.2} MiB",
            self.fds,
            self.threads,
            self.rss_kib as f64 / 1024.0,
            self.heap as f64 / (1024.0 * 1024.0)
        )
    }
}

/// Reads the resources now. (Listing `/proc/self/fd` opens one descriptor, which the listing
/// includes: the same one in every reading.)
pub fn read() -> Resources {
    let fds = std::fs::read_dir("/proc/self/fd").map_or(0, |d| d.count());
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let field = |name: &str| -> u64 {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.split_whitespace().next())
            .and_then(|v| v.parse().ok())
            .unwrap_or(0)
    };
    Resources {
        fds,
        threads: field("Threads:") as usize,
        rss_kib: field("VmRSS:"),
        heap: LIVE.load(Ordering::Relaxed).max(0) as u64,
    }
}

/// Gives the C allocator's free memory back to the OS, where it can (glibc's
/// `malloc_trim`), so that a reading of RSS counts live memory rather than the allocator's
/// caches.
pub fn trim_allocator() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim only walks and releases the allocator's own free memory.
    unsafe {
        libc::malloc_trim(0);
    }
}

/// How long each of this process's threads has waited for a CPU while runnable, by thread
/// id (`/proc/self/task/*/schedstat`, its second field, in ns): how much other load (the
/// soak may run under SCHED_IDLE on a shared machine) kept it from running.
pub fn run_delays() -> HashMap<u64, u64> {
    let Ok(dir) = std::fs::read_dir("/proc/self/task") else {
        return HashMap::new();
    };
    dir.filter_map(|e| e.ok())
        .filter_map(|e| {
            let tid = e.file_name().to_str()?.parse::<u64>().ok()?;
            let s = std::fs::read_to_string(e.path().join("schedstat")).ok()?;
            Some((tid, s.split_whitespace().nth(1)?.parse::<u64>().ok()?))
        })
        .collect()
}

/// The longest any one thread waited for a CPU between two [`run_delays`] readings.
pub fn most_delayed(before: &HashMap<u64, u64>, after: &HashMap<u64, u64>) -> Duration {
    let ns = after
        .iter()
        .map(|(tid, &d)| d.saturating_sub(before.get(tid).copied().unwrap_or(0)))
        .max()
        .unwrap_or(0);
    Duration::from_nanos(ns)
}
