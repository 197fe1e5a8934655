//! The slab allocator behind every stack pool: per size class, a bump pointer into the
//! current slab, a spare list of idle stacks that pools handed over with their memory, and
//! a free list of stacks whose memory has been given back.
//!
//! It is the slow path — pools come here only when they run dry (in batches) or trim — so a
//! `parking_lot` mutex guards it. Slabs are never unmapped: an idle stack costs address space
//! and, once trimmed, no memory.

use super::FiberStack;
use crate::sys::page_size;
use crate::sys::spin::SpinLock;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicBool, AtomicU8, AtomicUsize, Ordering};
use std::time::Duration;

/// Address space reserved per slab, in bytes (a slab holds at least `MIN_STACKS_PER_SLAB`).
const SLAB_BYTES: usize = 64 << 20;
const MIN_STACKS_PER_SLAB: usize = 8;

/// `madvise` advice that installs guard markers in the page tables (Linux 6.13+). The libc
/// crate does not define it yet.
const MADV_GUARD_INSTALL: libc::c_int = 102;

struct Class {
    size: usize,
    stride: usize,
    /// The uncarved rest of the current slab: `[next, end)`.
    next: usize,
    end: usize,
    /// Idle stacks that pools handed over beyond their cap, memory kept (see `spare`),
    /// oldest first.
    spare: Vec<FiberStack>,
    /// When a stack last went into or out of `spare` (`mono_ns`).
    spare_used: u64,
    /// Stacks handed back by pools, memory released.
    free: Vec<FiberStack>,
}

static CLASSES: SpinLock<Vec<Class>> = SpinLock::new(Vec::new());
/// This process's pidfd, with the pid it was opened for: after a `fork` the child must not
/// advise its parent's address space through an inherited one.
static SELF_PIDFD: SpinLock<Option<(libc::pid_t, OwnedFd)>> = SpinLock::new(None);
static SLABS: AtomicUsize = AtomicUsize::new(0);
static RESERVED: AtomicUsize = AtomicUsize::new(0);
static CARVED: AtomicUsize = AtomicUsize::new(0);
/// Spare stacks of all sizes, changed with the lists (under `CLASSES`): an idle worker looks
/// here before it takes the lock to trim them, which it would otherwise do at every sleep.
static SPARE: AtomicUsize = AtomicUsize::new(0);

/// The class of `size`-byte stacks, created if new.
fn class_of(classes: &mut Vec<Class>, size: usize, stride: usize) -> &mut Class {
    let i = match classes.iter().position(|c| c.size == size) {
        Some(i) => i,
        None => {
            classes.push(Class {
                size,
                stride,
                next: 0,
                end: 0,
                spare: Vec::new(),
                spare_used: 0,
                free: Vec::new(),
            });
            classes.len() - 1
        }
    };
    &mut classes[i]
}

/// The stack slabs' `fork` handlers (`crate::fork::Slot::Stacks`).
static FORK: crate::fork::Handlers = crate::fork::Handlers {
    prepare: fork_hold,
    release: |_| fork_release(),
};

/// Locks the stack classes and then the pidfd, for a `fork` (see `crate::fork`):
/// code that advises under `CLASSES` takes the pidfd after it.
fn fork_hold() {
    CLASSES.fork_hold();
    SELF_PIDFD.fork_hold();
}

/// Unlocks what `fork_hold` locked, in the parent or the child alike.
fn fork_release() {
    // SAFETY: `fork_hold` locked both on this thread; nothing released them since.
    unsafe {
        SELF_PIDFD.fork_release();
        CLASSES.fork_release();
    }
}

/// Adds up to `n` stacks of `size` usable bytes to `out`: spare ones first (their memory is
/// still there, most recently handed over first), then ones whose memory was given back, then
/// freshly carved. Fails only if not even one can be had.
pub(super) fn alloc(size: usize, n: usize, out: &mut Vec<FiberStack>) -> io::Result<()> {
    let guard = page_size();
    let stride = size
        .checked_add(guard)
        .ok_or_else(|| io::Error::from_raw_os_error(libc::ENOMEM))?;
    // Stacks are allocated here before any is handed back.
    crate::fork::register(crate::fork::Slot::Stacks, &FORK);
    mprotect_forced();
    let mut classes = CLASSES.lock();
    let class = class_of(&mut classes, size, stride);
    let spare = n.min(class.spare.len());
    if spare > 0 {
        out.extend(class.spare.drain(class.spare.len() - spare..));
        class.spare_used = crate::sys::mono_ns();
        SPARE.fetch_sub(spare, Ordering::Relaxed);
    }
    let recycled = (n - spare).min(class.free.len());
    out.extend(class.free.drain(class.free.len() - recycled..));
    let recycled = spare + recycled;
    let before = out.len();
    for _ in recycled..n {
        if class.next == class.end {
            if let Err(e) = new_slab(class) {
                if out.len() > before || recycled > 0 {
                    break;
                }
                return Err(e);
            }
        }
        let limit = class.next;
        class.next += stride;
        out.push(FiberStack {
            base: limit + stride,
            limit,
            guard,
        });
    }
    // All the new stacks' guards in as few system calls as the kernel allows. A stack whose
    // guard could not be installed is not handed out (its address space stays carved).
    let limits: Vec<usize> = out[before..].iter().map(|s| s.limit).collect();
    if let Err((installed, e)) = install_guards(&limits, guard) {
        out.truncate(before + installed);
        if out.is_empty() {
            return Err(e);
        }
    }
    CARVED.fetch_add(out.len() - before, Ordering::Relaxed);
    Ok(())
}

/// Takes idle stacks from a pool beyond its cap, memory and all, for any thread's pool to
/// reuse. A deep burst that ends on one worker and comes back on another (a spawn-and-join
/// chain whose root lands on either) would otherwise find the second worker's pool empty
/// and fault in every stack's pages again while the first worker's sit idle, which makes
/// each hop of such a chain several times slower. Idle workers give the memory of spare
/// stacks back once none has gone in or out for a while (see `trim_spare`).
pub(super) fn spare(stacks: Vec<FiberStack>) {
    let Some(first) = stacks.first() else { return };
    let (size, stride) = (first.size(), first.base - first.limit);
    let mut classes = CLASSES.lock();
    let class = class_of(&mut classes, size, stride);
    SPARE.fetch_add(stacks.len(), Ordering::Relaxed);
    class.spare.extend(stacks);
    class.spare_used = crate::sys::mono_ns();
}

/// Gives back the memory of up to `max` spare stacks, oldest first, of the sizes whose spare
/// list has seen no stack go in or out for `quiet`, and moves them to the free list. Returns
/// how long until this should be called again: `None` if no spare stack is left.
pub(super) fn trim_spare(max: usize, quiet: Duration) -> Option<Duration> {
    // The lock-free look is for the idle path; a dropped pool (`quiet` zero) always looks
    // under the lock, whatever this thread last saw of other threads' hand-overs.
    if !quiet.is_zero() && SPARE.load(Ordering::Relaxed) == 0 {
        return None;
    }
    let now = crate::sys::mono_ns();
    let quiet = u64::try_from(quiet.as_nanos()).unwrap_or(u64::MAX);
    let mut batch = Vec::new();
    let mut again: Option<u64> = None;
    {
        let mut classes = CLASSES.lock();
        for class in classes.iter_mut().filter(|c| !c.spare.is_empty()) {
            let idle_for = now.saturating_sub(class.spare_used);
            let wait = if idle_for >= quiet {
                let n = class.spare.len().min(max - batch.len());
                batch.extend(class.spare.drain(..n));
                0
            } else {
                quiet - idle_for
            };
            if !class.spare.is_empty() {
                again = Some(again.map_or(wait, |a| a.min(wait)));
            }
        }
        SPARE.fetch_sub(batch.len(), Ordering::Relaxed);
    }
    release_memory(&batch);
    free(batch);
    again.map(Duration::from_nanos)
}

/// How many spare stacks there are, of all sizes.
pub(super) fn spare_count() -> usize {
    SPARE.load(Ordering::Relaxed)
}

/// Takes back stacks whose memory has been released.
pub(super) fn free(stacks: Vec<FiberStack>) {
    if stacks.is_empty() {
        return;
    }
    let mut classes = CLASSES.lock();
    for stack in stacks {
        let size = stack.size();
        if let Some(c) = classes.iter_mut().find(|c| c.size == size) {
            c.free.push(stack);
        }
    }
}

fn new_slab(class: &mut Class) -> io::Result<()> {
    let count = (SLAB_BYTES / class.stride).max(MIN_STACKS_PER_SLAB);
    let bytes = count
        .checked_mul(class.stride)
        .ok_or_else(|| io::Error::from_raw_os_error(libc::ENOMEM))?;
    // Pages are committed only when a fiber touches them.
    let ptr = crate::sys::map_lazy(bytes)?;
    class.next = ptr;
    class.end = ptr + bytes;
    SLABS.fetch_add(1, Ordering::Relaxed);
    RESERVED.fetch_add(bytes, Ordering::Relaxed);
    Ok(())
}

/// How guard pages are made on this kernel, probed on first use.
const GUARD_UNKNOWN: u8 = 0;
const GUARD_MADVISE: u8 = 1;
const GUARD_MPROTECT: u8 = 2;
static GUARD_KIND: AtomicU8 = AtomicU8::new(GUARD_UNKNOWN);

/// `FIBRA_GUARD=mprotect` forces the fallback, to test it on new kernels: 0 not read yet,
/// 1 not set, 2 set.
static FORCE_MPROTECT: AtomicU8 = AtomicU8::new(0);

/// Whether `FIBRA_GUARD=mprotect` is set, read once. Read first outside the stack lock:
/// reading the environment takes std's lock, which a thread that forks for a `Command` with
/// `pre_exec` holds while fibra's fork handler waits for the stack lock.
fn mprotect_forced() -> bool {
    match FORCE_MPROTECT.load(Ordering::Relaxed) {
        0 => {
            let set = std::env::var_os("FIBRA_GUARD").is_some_and(|v| v == "mprotect");
            FORCE_MPROTECT.store(1 + u8::from(set), Ordering::Relaxed);
            set
        }
        v => v == 2,
    }
}

fn install_guard(addr: usize, len: usize) -> io::Result<()> {
    let mut kind = GUARD_KIND.load(Ordering::Relaxed);
    if kind == GUARD_UNKNOWN {
        kind = if mprotect_forced() {
            GUARD_MPROTECT
        } else {
            GUARD_MADVISE
        };
    }
    if kind == GUARD_MADVISE {
        // SAFETY: the range is the lowest page of a stack we are carving from our own slab.
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
    }
    GUARD_KIND.store(GUARD_MPROTECT, Ordering::Relaxed);
    // SAFETY: as above; PROT_NONE makes the page fault on any access.
    if unsafe { libc::mprotect(addr as *mut libc::c_void, len, libc::PROT_NONE) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Installs a guard of `len` bytes at each of `addrs`, in order. On failure, returns how
/// many got theirs before it.
///
/// With guard markers, one `process_madvise(2)` call on this process covers a whole batch:
/// each `madvise` ends with a TLB flush that interrupts every other core running one of the
/// process's threads, and spawning a million fresh fibers (`million_park`) spends much of
/// its time there. A batch costs less per stack than a call each. Kernels that refuse the
/// advice there get one `madvise` per stack.
fn install_guards(addrs: &[usize], len: usize) -> Result<(), (usize, io::Error)> {
    let mut done = 0;
    if addrs.len() > 1 && GUARD_KIND.load(Ordering::Relaxed) == GUARD_MADVISE {
        done = batch_guard_install(addrs, len);
    }
    for (i, &addr) in addrs.iter().enumerate().skip(done) {
        install_guard(addr, len).map_err(|e| (i, e))?;
    }
    Ok(())
}

/// `process_madvise(MADV_GUARD_INSTALL)` over `addrs`; returns how many, from the front,
/// got their guard (0 where the kernel cannot).
fn batch_guard_install(addrs: &[usize], len: usize) -> usize {
    /// Cleared once the kernel refused the batch.
    static BATCH_OK: AtomicBool = AtomicBool::new(true);
    let ranges: Vec<(usize, usize)> = addrs.iter().map(|&a| (a, len)).collect();
    self_madvise(&ranges, MADV_GUARD_INSTALL, &BATCH_OK)
}

/// Gives the memory of `stacks` back to the kernel (`MADV_DONTNEED` on each one's usable
/// range): with one `process_madvise` per 1 024 stacks where the kernel allows it — each
/// `madvise` flushes the TLB of every core running the process, and one per stack after a
/// million-fiber burst would keep a dropping scheduler busy for seconds — else one
/// `madvise` each.
pub(super) fn release_memory(stacks: &[FiberStack]) {
    static BATCH_OK: AtomicBool = AtomicBool::new(true);
    let ranges: Vec<(usize, usize)> = stacks.iter().map(FiberStack::usable).collect();
    let done = if ranges.len() > 1 {
        self_madvise(&ranges, libc::MADV_DONTNEED, &BATCH_OK)
    } else {
        0
    };
    for stack in &stacks[done..] {
        stack.release_memory();
    }
}

/// `process_madvise(advice)` on this process over `ranges` (address, length), in chunks of
/// IOV_MAX (1 024); returns how many ranges, from the front, were advised. Where the kernel
/// (or a seccomp filter) refuses, clears `ok` for good and returns what was done; a passing
/// shortage (descriptors, memory) returns without clearing it.
fn self_madvise(ranges: &[(usize, usize)], advice: libc::c_int, ok: &AtomicBool) -> usize {
    let passing =
        |errno: Option<i32>| matches!(errno, Some(libc::EMFILE | libc::ENFILE | libc::ENOMEM));
    if !ok.load(Ordering::Relaxed) {
        return 0;
    }
    // SAFETY: getpid has no preconditions.
    let pid = unsafe { libc::getpid() };
    let mut cached = SELF_PIDFD.lock();
    if cached.as_ref().is_none_or(|(p, _)| *p != pid) {
        // SAFETY: pidfd_open on our own pid; on success we own the descriptor.
        let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) };
        if fd < 0 {
            if !passing(io::Error::last_os_error().raw_os_error()) {
                ok.store(false, Ordering::Relaxed);
            }
            return 0;
        }
        // SAFETY: a fresh descriptor nothing else owns.
        *cached = Some((pid, unsafe { OwnedFd::from_raw_fd(fd as RawFd) }));
    }
    let Some((_, pidfd)) = cached.as_ref() else {
        return 0;
    };
    let mut done = 0;
    for chunk in ranges.chunks(1024) {
        let iov: Vec<libc::iovec> = chunk
            .iter()
            .map(|&(addr, len)| libc::iovec {
                iov_base: addr as *mut libc::c_void,
                iov_len: len,
            })
            .collect();
        // SAFETY: every range belongs to a stack of our own slabs that no fiber runs on (a
        // guard page being carved, or the usable memory of an idle stack); `iov` lives
        // across the call; the pidfd is this process's (checked above).
        let r = unsafe {
            libc::syscall(
                libc::SYS_process_madvise,
                pidfd.as_raw_fd(),
                iov.as_ptr(),
                iov.len(),
                advice,
                0u32,
            )
        };
        if r < 0 {
            if !passing(io::Error::last_os_error().raw_os_error()) {
                ok.store(false, Ordering::Relaxed);
            }
            return done;
        }
        // Ranges are advised in order; a short count means the rest were not.
        let mut bytes = r as usize;
        for &(_, len) in chunk {
            if bytes < len {
                return done;
            }
            bytes -= len;
            done += 1;
        }
    }
    done
}

/// Which guard mechanism fiber stacks use on this kernel: `"madvise(MADV_GUARD_INSTALL)"`
/// (a page-table marker: no extra kernel mapping) or `"mprotect"` (kernels before 6.13: one
/// extra mapping per stack, so `vm.max_map_count` caps live fibers near 32 000).
pub fn guard_kind() -> &'static str {
    if GUARD_KIND.load(Ordering::Relaxed) == GUARD_UNKNOWN {
        let mut probe = Vec::new();
        // The probe stack stays in the free list for later use; a failure says nothing
        // about guards and leaves the kind unknown ("mprotect" is then the safe answer).
        if alloc(super::DEFAULT_STACK_SIZE, 1, &mut probe).is_ok() {
            free(probe);
        }
    }
    match GUARD_KIND.load(Ordering::Relaxed) {
        GUARD_MADVISE => "madvise(MADV_GUARD_INSTALL)",
        _ => "mprotect",
    }
}

/// Process-wide figures of the stack allocator, from [`stack_stats`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StackStats {
    /// Slabs reserved so far (never unmapped).
    pub slabs: usize,
    /// Address space reserved by those slabs, in bytes (not memory: pages are committed
    /// only when touched).
    pub reserved_bytes: usize,
    /// Stacks carved from slabs so far.
    pub stacks_carved: usize,
    /// Idle stacks in the global free list, their memory given back.
    pub stacks_free: usize,
    /// [`guard_kind`].
    pub guard: &'static str,
}

/// How much the stack allocator has reserved and carved so far.
///
/// ```
/// let stats = fibra::stack_stats();
/// assert!(stats.reserved_bytes >= stats.stacks_carved * fibra::MIN_STACK_SIZE);
/// ```
pub fn stack_stats() -> StackStats {
    let guard = guard_kind();
    // Before the lock, as any first use of the slabs (see `crate::fork::register`).
    crate::fork::register(crate::fork::Slot::Stacks, &FORK);
    let stacks_free = CLASSES.lock().iter().map(|c| c.free.len()).sum();
    StackStats {
        slabs: SLABS.load(Ordering::Relaxed),
        reserved_bytes: RESERVED.load(Ordering::Relaxed),
        stacks_carved: CARVED.load(Ordering::Relaxed),
        stacks_free,
        guard,
    }
}
