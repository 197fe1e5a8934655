//! Fiber stacks: allocation with a guard page under every stack, and the per-worker pool that
//! keeps `mmap` off the spawn path.
//!
//! This module owns stack memory and nothing else. A [`FiberStack`] is handed to corosensei
//! when a fiber starts and comes back to the [`StackPool`] of the same thread when the fiber
//! ends. The overflow handler (`overflow.rs`) reads the guard range recorded here.

pub(crate) mod overflow;

use crate::sys::page_size;
use std::io;
use std::sync::atomic::{AtomicU8, Ordering};

/// The smallest stack a fiber may ask for, in bytes. Below this, a panic's unwinding and the
/// message formatting of the panic hook can overflow.
pub const MIN_STACK_SIZE: usize = 16 * 1024;

/// The default fiber stack size, 256 KiB.
///
/// Only touched pages cost memory (a parked fiber typically uses one or two 4 KiB pages), so
/// the size is a reservation of address space, not of RAM. 256 KiB is deep enough for ordinary
/// Rust code (formatting, serde, regex compilation) and still lets a 64-bit process reserve
/// millions of stacks. Use `Builder::stack_size` for deeper recursion.
pub const DEFAULT_STACK_SIZE: usize = 256 * 1024;

/// How many idle stacks a pool keeps before it returns memory to the kernel.
const POOL_CAP: usize = 256;

/// `madvise` advice that installs guard markers in the page tables (Linux 6.13+). The libc
/// crate does not define it yet.
const MADV_GUARD_INSTALL: libc::c_int = 102;

/// A stack for one fiber: `[limit, limit + guard)` is the guard, `[limit + guard, base)` the
/// usable memory. Owns its mapping.
#[derive(Debug)]
pub(crate) struct FiberStack {
    base: usize,
    limit: usize,
    guard: usize,
}

// SAFETY: a FiberStack is only a description of a private mapping; moving it to another
// thread moves ownership of that mapping, which is fine while no fiber runs on it.
unsafe impl Send for FiberStack {}

// SAFETY: `base` and `limit` describe a mapping we own, page aligned (so STACK_ALIGNMENT
// aligned), whose lowest `guard` bytes fault on access, and which is larger than
// corosensei's MIN_STACK_SIZE because our own minimum is larger.
unsafe impl corosensei::stack::Stack for FiberStack {
    fn base(&self) -> corosensei::stack::StackPointer {
        corosensei::stack::StackPointer::new(self.base).expect("mapping is not at 0")
    }
    fn limit(&self) -> corosensei::stack::StackPointer {
        corosensei::stack::StackPointer::new(self.limit).expect("mapping is not at 0")
    }
}

impl FiberStack {
    /// Maps a new stack of `size` usable bytes (a multiple of the page size) with a guard page.
    pub(crate) fn new(size: usize) -> io::Result<FiberStack> {
        let guard = page_size();
        let Some(len) = size.checked_add(guard) else {
            return Err(io::Error::from_raw_os_error(libc::ENOMEM));
        };
        // SAFETY: an anonymous private mapping at an address of the kernel's choosing touches
        // no existing memory. MAP_NORESERVE: pages are committed only when touched.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE | libc::MAP_STACK,
                -1,
                0,
            )
        };
        if ptr == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        let stack = FiberStack {
            base: ptr as usize + len,
            limit: ptr as usize,
            guard,
        };
        install_guard(stack.limit, guard)?;
        Ok(stack)
    }

    /// Usable bytes above the guard.
    pub(crate) fn size(&self) -> usize {
        self.base - self.limit - self.guard
    }

    /// The guard range, for the overflow handler.
    pub(crate) fn guard_range(&self) -> (usize, usize) {
        (self.limit, self.limit + self.guard)
    }
}

impl Drop for FiberStack {
    fn drop(&mut self) {
        // SAFETY: we own exactly this mapping and nothing runs on it any more.
        unsafe {
            libc::munmap(self.limit as *mut libc::c_void, self.base - self.limit);
        }
    }
}

/// How guard pages are made on this kernel, probed once.
const GUARD_UNKNOWN: u8 = 0;
const GUARD_MADVISE: u8 = 1;
const GUARD_MPROTECT: u8 = 2;
static GUARD_KIND: AtomicU8 = AtomicU8::new(GUARD_UNKNOWN);

/// Which guard mechanism stacks use: `"madvise(MADV_GUARD_INSTALL)"` (no extra mapping) or
/// `"mprotect"` (one extra mapping per stack, on kernels before 6.13).
pub fn guard_kind() -> &'static str {
    if GUARD_KIND.load(Ordering::Relaxed) == GUARD_UNKNOWN {
        // Probe with a throwaway stack; failure to map says nothing about guards.
        let _ = FiberStack::new(MIN_STACK_SIZE);
    }
    match GUARD_KIND.load(Ordering::Relaxed) {
        GUARD_MADVISE => "madvise(MADV_GUARD_INSTALL)",
        _ => "mprotect",
    }
}

fn install_guard(addr: usize, len: usize) -> io::Result<()> {
    if GUARD_KIND.load(Ordering::Relaxed) != GUARD_MPROTECT {
        // SAFETY: the range is the lowest page of a mapping we just created.
        let r = unsafe { libc::madvise(addr as *mut libc::c_void, len, MADV_GUARD_INSTALL) };
        if r == 0 {
            GUARD_KIND.store(GUARD_MADVISE, Ordering::Relaxed);
            return Ok(());
        }
        let err = io::Error::last_os_error();
        if err.raw_os_error() != Some(libc::EINVAL) {
            return Err(err);
        }
        // EINVAL: the kernel predates guard markers; use mprotect from now on.
        GUARD_KIND.store(GUARD_MPROTECT, Ordering::Relaxed);
    }
    // SAFETY: as above; PROT_NONE makes the page fault on any access.
    if unsafe { libc::mprotect(addr as *mut libc::c_void, len, libc::PROT_NONE) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Rounds a requested stack size up to whole pages (saturating: an impossible size stays
/// impossible and fails to map, rather than wrapping to a small one).
pub(crate) fn round_size(size: usize) -> usize {
    let page = page_size();
    size.checked_next_multiple_of(page)
        .unwrap_or(usize::MAX - (page - 1))
}

/// A LIFO cache of idle stacks owned by one thread (a worker, or a thread running standalone
/// fibers). LIFO so a hot stack, still in cache, is reused first.
#[derive(Debug, Default)]
pub(crate) struct StackPool {
    free: Vec<FiberStack>,
}

impl StackPool {
    /// A stack of `size` usable bytes (already rounded), from the pool or freshly mapped.
    pub(crate) fn take(&mut self, size: usize) -> io::Result<FiberStack> {
        if let Some(i) = self.free.iter().rposition(|s| s.size() == size) {
            return Ok(self.free.swap_remove(i));
        }
        FiberStack::new(size)
    }

    /// Returns a stack whose fiber has finished.
    pub(crate) fn give(&mut self, stack: FiberStack) {
        if self.free.len() < POOL_CAP {
            self.free.push(stack);
        }
        // Beyond the cap the stack is unmapped by its Drop.
    }
}
