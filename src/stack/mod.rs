//! Fiber stacks: guarded stacks carved from large slabs, and the per-thread pools that keep
//! the kernel off the spawn path.
//!
//! This module owns stack memory and nothing else.
//!
//! - **Slabs** (`slab.rs`): large `MAP_NORESERVE` reservations, one per size class at a time,
//!   carved into stacks of that size. Each stack gets a guard page under it. With
//!   `madvise(MADV_GUARD_INSTALL)` (Linux 6.13+) the guard is a marker in the page tables,
//!   so a slab stays a single kernel mapping however many stacks it holds, and adjacent
//!   slabs merge: a million fibers do not run into `vm.max_map_count` (65 530 by default),
//!   which stops runtimes that `mmap` + `mprotect` each stack near 32 000. Older kernels get
//!   `mprotect` guards (two mappings per stack), and [`guard_kind`] says so.
//! - **Pools** ([`StackPool`]): each worker (and each thread running standalone fibers) keeps
//!   recently freed stacks in a LIFO list, so a hot stack is reused while its pages are still
//!   in cache. Beyond a cap, when the thread is idle, the oldest give their memory back
//!   (`MADV_DONTNEED`) and move to the slab allocator's global free list, where any thread
//!   can pick them up. A burst of fibers therefore does not pin its peak RSS.
//!
//! A [`FiberStack`] is handed to corosensei when a fiber starts and returns to the pool of the
//! same thread when the fiber ends. The overflow handler (`overflow.rs`) reads its guard range.

pub(crate) mod overflow;
mod slab;

pub use slab::{guard_kind, stack_stats, StackStats};

use crate::error::Error;
use crate::sys::page_size;
use std::io;
use std::time::Duration;

/// The smallest stack a fiber may ask for, in bytes: 64 KiB. Smaller sizes given to
/// [`TaskBuilder::stack_size`](crate::TaskBuilder::stack_size) and
/// [`Fiber::with_options`](crate::Fiber::with_options) are raised to it;
/// [`Builder::stack_size`](crate::Builder::stack_size) refuses them.
///
/// It is sized for the deepest thing a fiber does that it did not write: reporting its own
/// panic. The panic hook runs on the panicking fiber's stack (so that a backtrace shows the
/// fiber's frames), and with `RUST_BACKTRACE=1` or `full` the report symbolises the backtrace,
/// which std's debug-info reader does with deep, large frames. On x86_64 a fiber whose top
/// frame panics needs about 28 KiB of stack to survive that report as a scheduled task in a
/// debug build, 24 KiB otherwise (release builds, standalone fibers) and 8 KiB without a
/// backtrace, most of it to symbolise (the same with `1` or `full`, and whether fibra prints
/// the report or std's default hook does under an application's hook); a smaller stack
/// overflows there and aborts the process. 64 KiB leaves more than twice that for
/// architectures whose unwinder keeps more registers per frame (aarch64), other std versions
/// and application hooks that do a little more than std's. It costs no memory: a stack's
/// pages are committed only when touched, so a larger minimum only reserves address space.
pub const MIN_STACK_SIZE: usize = 64 * 1024;

/// The default fiber stack size, 256 KiB.
///
/// Only touched pages cost memory (a parked fiber typically uses one or two 4 KiB pages), so
/// the size is a reservation of address space, not of RAM. 256 KiB is deep enough for ordinary
/// Rust code (formatting, serde, regex compilation) and still lets a 64-bit process reserve
/// millions of stacks. Use `Builder::stack_size` for deeper recursion.
pub const DEFAULT_STACK_SIZE: usize = 256 * 1024;

/// The default number of idle stacks per size a worker keeps with their memory
/// (`Builder::stack_cache`).
pub const DEFAULT_STACK_CACHE: usize = 256;

/// How many stacks a pool takes from the slab allocator at once when it runs dry.
const REFILL: usize = 32;

/// A stack for one fiber: `[limit, limit + guard)` is the guard, `[limit + guard, base)` the
/// usable memory. Carved from a slab that is never unmapped; a stack goes back to a pool or
/// to the slab allocator's free list, never to the kernel.
#[derive(Debug)]
pub(crate) struct FiberStack {
    base: usize,
    limit: usize,
    guard: usize,
}

// SAFETY: a FiberStack is only a description of memory reserved for it; moving it to another
// thread moves that reservation, which is fine while no fiber runs on it.
unsafe impl Send for FiberStack {}

// SAFETY: `base` and `limit` are page aligned (so STACK_ALIGNMENT aligned) and describe memory
// reserved for this stack alone, whose lowest `guard` bytes fault on access (guard marker or
// PROT_NONE), and which is larger than corosensei's MIN_STACK_SIZE since ours is larger.
unsafe impl corosensei::stack::Stack for FiberStack {
    fn base(&self) -> corosensei::stack::StackPointer {
        corosensei::stack::StackPointer::new(self.base).expect("stacks are never at address 0")
    }
    fn limit(&self) -> corosensei::stack::StackPointer {
        corosensei::stack::StackPointer::new(self.limit).expect("stacks are never at address 0")
    }
}

impl FiberStack {
    /// Starts loading the line a new fiber writes first (its initial frame, at the top),
    /// and its page's translation: the pool calls it on the stack it will hand out next, so
    /// that the next start does not stall on a stack last touched long ago (a chain of 2 000
    /// live fibers cycles through 2 000 pages, beyond the TLB). A hint: it never faults.
    #[inline(always)]
    pub(crate) fn prefetch_top(&self) {
        crate::sys::prefetch(std::ptr::without_provenance(self.base - 64), 64, 1);
    }

    /// Usable bytes above the guard.
    pub(crate) fn size(&self) -> usize {
        self.base - self.limit - self.guard
    }

    /// The guard range, for the overflow handler.
    pub(crate) fn guard_range(&self) -> (usize, usize) {
        (self.limit, self.limit + self.guard)
    }

    /// The usable memory above the guard: (address, length).
    fn usable(&self) -> (usize, usize) {
        let start = self.limit + self.guard;
        (start, self.base - start)
    }

    /// Gives the touched pages back to the kernel; the stack stays reserved and usable (pages
    /// come back zeroed on the next touch). See also `slab::release_memory` for many.
    fn release_memory(&self) {
        let start = self.limit + self.guard;
        // SAFETY: the range is this stack's own usable memory and holds no live data: the
        // fiber that used it has finished.
        unsafe {
            libc::madvise(
                start as *mut libc::c_void,
                self.base - start,
                libc::MADV_DONTNEED,
            );
        }
    }
}

/// Gives an idle stack's memory back and hands it to the global free list, for a stack
/// whose thread has no pool to return it to (the thread is exiting).
pub(crate) fn release(stack: FiberStack) {
    stack.release_memory();
    slab::free(vec![stack]);
}

/// The largest fiber stack fibra will map, 1 GiB.
const MAX_STACK_SIZE: usize = 1 << 30;

/// Checks a fiber stack size as the builders (and `Fiber::with_options`) do, and rounds it
/// up to whole pages.
pub(crate) fn check_stack_size(bytes: usize) -> Result<usize, Error> {
    if bytes < MIN_STACK_SIZE {
        return Err(Error::StackTooSmall {
            requested: bytes,
            minimum: MIN_STACK_SIZE,
        });
    }
    if bytes > MAX_STACK_SIZE {
        return Err(Error::StackTooLarge { requested: bytes });
    }
    Ok(round_size(bytes))
}

/// Rounds a requested stack size up to whole pages (saturating: an impossible size stays
/// impossible and fails to map, rather than wrapping to a small one).
fn round_size(size: usize) -> usize {
    let page = page_size();
    size.checked_next_multiple_of(page)
        .unwrap_or(usize::MAX - (page - 1))
}

/// The idle stacks of one thread (a worker, or a thread running standalone fibers), by size.
/// Recently used stacks are reused first, LIFO, while their pages are still in cache;
/// [`StackPool::trim`] hands the oldest beyond the cap, memory released, to the slab
/// allocator's global free list.
#[derive(Debug)]
pub(crate) struct StackPool {
    classes: Vec<(usize, Vec<FiberStack>)>,
    cap: usize,
    /// Whether stacks beyond the cap go to the spare list (see `give`). Only a worker's pool
    /// does that: idle workers trim the spare list, and a thread running standalone fibers
    /// has no idle moment to do it in, so its pool trims its own excess as it goes.
    spill: bool,
}

impl Default for StackPool {
    fn default() -> Self {
        StackPool::new(DEFAULT_STACK_CACHE)
    }
}

impl StackPool {
    /// A pool that keeps up to `cap` idle stacks per size, and the rest until `trim`.
    pub(crate) fn new(cap: usize) -> Self {
        StackPool {
            classes: Vec::new(),
            cap,
            spill: false,
        }
    }

    /// A worker's pool: up to `cap` idle stacks per size, the rest to the spare list.
    pub(crate) fn spilling(cap: usize) -> Self {
        let mut pool = StackPool::new(cap);
        pool.spill = true;
        pool
    }

    fn class(&mut self, size: usize) -> &mut Vec<FiberStack> {
        let i = match self.classes.iter().position(|c| c.0 == size) {
            Some(i) => i,
            None => {
                self.classes.push((size, Vec::new()));
                self.classes.len() - 1
            }
        };
        &mut self.classes[i].1
    }

    /// A stack of `size` usable bytes (already rounded): the most recently used one, or a
    /// batch from the slab allocator.
    pub(crate) fn take(&mut self, size: usize) -> io::Result<FiberStack> {
        let list = self.class(size);
        if let Some(stack) = list.pop() {
            if let Some(next) = list.last() {
                next.prefetch_top();
            }
            return Ok(stack);
        }
        slab::alloc(size, REFILL, list)?;
        list.pop()
            .ok_or_else(|| io::Error::from_raw_os_error(libc::ENOMEM))
    }

    /// How many idle stacks the pool holds, of all sizes.
    pub(crate) fn cached(&self) -> usize {
        self.classes.iter().map(|c| c.1.len()).sum()
    }

    /// Returns a stack whose fiber has finished. In a spilling pool, beyond the cap (and
    /// some slack, so that a pool at its cap does not hand over a batch at every finish),
    /// the oldest `REFILL` go to the slab allocator's spare list with their memory, where
    /// any pool that runs dry takes them before it carves or faults in new ones.
    pub(crate) fn give(&mut self, stack: FiberStack) {
        let (cap, spill) = (self.cap, self.spill);
        let list = self.class(stack.size());
        list.push(stack);
        if spill && list.len() >= cap.saturating_add(2 * REFILL) {
            slab::spare(list.drain(..REFILL).collect());
        }
    }

    /// Releases the memory of up to `max` of the least recently used idle stacks beyond the
    /// cap and hands them to the global free list. Returns whether more remain beyond the
    /// cap. Each stack costs a TLB flush (one `madvise`, or a share of a `process_madvise`), so
    /// callers trim in small batches while idle.
    pub(crate) fn trim(&mut self, max: usize) -> bool {
        let cap = self.cap;
        let mut budget = max;
        let mut more = false;
        for (_, list) in &mut self.classes {
            let excess = list.len().saturating_sub(cap);
            let n = excess.min(budget);
            if n > 0 {
                let oldest: Vec<FiberStack> = list.drain(..n).collect();
                slab::release_memory(&oldest);
                slab::free(oldest);
                budget -= n;
            }
            more |= excess > n;
        }
        more
    }
}

impl Drop for StackPool {
    /// Gives back the memory of every idle stack of this pool and, for a worker's pool, of
    /// every spare one: a stopping scheduler's worker may have been the last that would have
    /// trimmed them. A thread that ran standalone fibers leaves the spare list alone (a
    /// program whose short-lived threads run fibers would otherwise empty it at every exit,
    /// under a busy scheduler's feet).
    fn drop(&mut self) {
        self.cap = 0;
        self.trim(usize::MAX);
        if self.spill {
            slab::trim_spare(usize::MAX, Duration::ZERO);
        }
    }
}

/// Gives back the memory of up to `max` spare stacks (see `slab::spare`) of the sizes none
/// of which went in or out for `quiet`. Returns how long until there may be more to give
/// back, or `None` if no spare stack is left.
pub(crate) fn trim_spare(max: usize, quiet: Duration) -> Option<Duration> {
    slab::trim_spare(max, quiet)
}

/// How many spare stacks the process holds, memory and all (see `slab::spare`).
pub(crate) fn spare_count() -> usize {
    slab::spare_count()
}

/// Lines of a suspended fiber's stack [`prefetch_near`] asks for: from 4 lines below the
/// address its `suspend` left (the registers the switch saved) to 12 above (the frames the
/// resumption returns through first).
/// Cache lines below a suspended fiber's stack pointer that `prefetch_near` loads.
const PREFETCH_BELOW: usize = 4;
/// Cache lines from its stack pointer up, into the frames it resumes in, that
/// `prefetch_near` loads.
const PREFETCH_ABOVE: usize = 12;

/// Asks the CPU to bring the part of a suspended fiber's stack around `addr` (its
/// `FiberMeta::suspended_at`; 0 = never suspended, nothing to do) into the cache, and its
/// page into the TLB, ahead of resuming it.
///
/// A worker that wakes many fibers at once (timers that expire together) otherwise takes a
/// cache and TLB miss at each resumption, one after the other; prefetched when they are
/// woken, the misses overlap, and a burst of sleeps that expire together wakes close to its
/// deadline instead of each fiber waiting out the misses of those before it (see
/// docs/design.md, "Timers").
#[inline]
pub(crate) fn prefetch_near(addr: usize) {
    if addr != 0 {
        let lines = PREFETCH_BELOW + PREFETCH_ABOVE;
        let first = std::ptr::without_provenance(addr.wrapping_sub(PREFETCH_BELOW * 64));
        crate::sys::prefetch(first, lines * 64, lines);
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn prefetching_any_address_is_harmless() {
        let local = [0u8; 256];
        for addr in [
            0,
            1,
            64,
            local.as_ptr() as usize,
            usize::MAX,
            usize::MAX - 63,
            0xffff_8000_0000_0000, // the kernel's half
            0x0000_7fff_ffff_f000, // the top of user space, unmapped here
        ] {
            super::prefetch_near(addr);
        }
        assert_eq!(local, [0u8; 256], "a prefetch changes no memory");
    }
}
