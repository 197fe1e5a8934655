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

/// How many idle stacks of one size a pool keeps with their memory once its thread goes idle.
/// Beyond this, idle stacks give their pages back to the kernel (`MADV_DONTNEED`) but stay
/// mapped, so a burst of fibers does not pin its peak RSS and the next burst does not pay
/// for `mmap` again. Trimming waits for idle time so a burst of finishing fibers is not
/// slowed down by system calls.
const HOT_CAP: usize = 256;

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

    /// Gives the touched pages back to the kernel; the stack stays mapped and usable (pages
    /// come back zeroed on the next touch).
    fn release_memory(&self) {
        let start = self.limit + self.guard;
        // SAFETY: the range is inside our own mapping and holds no live data: the fiber that
        // used it has finished.
        unsafe {
            libc::madvise(
                start as *mut libc::c_void,
                self.base - start,
                libc::MADV_DONTNEED,
            );
        }
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

/// The idle stacks of one thread (a worker, or a thread running standalone fibers), by size.
/// Recently used ("hot") stacks are reused first, LIFO, while their pages are still in cache;
/// [`StackPool::trim`] turns the oldest beyond [`HOT_CAP`] per size "cold", their memory given
/// back.
#[derive(Debug, Default)]
pub(crate) struct StackPool {
    classes: Vec<SizeClass>,
}

#[derive(Debug)]
struct SizeClass {
    size: usize,
    hot: Vec<FiberStack>,
    cold: Vec<FiberStack>,
}

impl StackPool {
    fn class(&mut self, size: usize) -> &mut SizeClass {
        let i = match self.classes.iter().position(|c| c.size == size) {
            Some(i) => i,
            None => {
                self.classes.push(SizeClass {
                    size,
                    hot: Vec::new(),
                    cold: Vec::new(),
                });
                self.classes.len() - 1
            }
        };
        &mut self.classes[i]
    }

    /// A stack of `size` usable bytes (already rounded), from the pool or freshly mapped.
    pub(crate) fn take(&mut self, size: usize) -> io::Result<FiberStack> {
        let class = self.class(size);
        if let Some(stack) = class.hot.pop().or_else(|| class.cold.pop()) {
            return Ok(stack);
        }
        FiberStack::new(size)
    }

    /// Returns a stack whose fiber has finished.
    pub(crate) fn give(&mut self, stack: FiberStack) {
        self.class(stack.size()).hot.push(stack);
    }

    /// Gives back the memory of the least recently used idle stacks beyond [`HOT_CAP`] per
    /// size. Called when the owning thread has nothing else to do.
    pub(crate) fn trim(&mut self) {
        for class in &mut self.classes {
            if class.hot.len() > HOT_CAP {
                let excess = class.hot.len() - HOT_CAP;
                for stack in class.hot.drain(..excess) {
                    stack.release_memory();
                    class.cold.push(stack);
                }
            }
        }
    }
}
