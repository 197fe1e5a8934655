//! Where the block caches get their memory once a class holds many blocks: 2 MiB slabs,
//! carved into blocks.
//!
//! A burst of tasks that stay alive (a million parked fibers, a server's connections) needs a
//! fresh block for each, and each new page of blocks costs a page fault. On a virtual
//! machine a fault costs microseconds, and a million 512-byte cells fault in 125 000 pages.
//! So once a class has `BULK_BYTES` of blocks out, its further blocks come from slabs
//! advised `MADV_HUGEPAGE`: where transparent huge pages are enabled (`always` or `madvise`),
//! the kernel backs each with one 2 MiB page, one fault instead of 512. Below that, blocks
//! come from the global allocator: a program with a few thousand tasks keeps its footprint,
//! and spawn-heavy workloads whose tasks come and go stay on the global allocator's memory,
//! which serves their spawns faster than slabs do at the same instruction count (why is not
//! known).
//!
//! The slab layer is the slow path: the caches come here a magazine at a time, when the
//! depot has none to give or holds enough to keep. One `parking_lot` mutex per class guards
//! it. Blocks are carved from the slab opened last that has idle blocks, so that bursts fill
//! slabs before they spread over more.
//!
//! A slab all of whose blocks have come back is *empty*. Empty slabs are kept for the next
//! burst (unmapping and faulting them in again would zero them again, 2 MiB at a time), and
//! unmapped by an idle worker once none went empty or was reused for a while ([`trim`]), and
//! by a worker that exits, so memory returns to the system after a burst. A class keeps its
//! last slab. A block's slab is found from its address: slabs are 2 MiB-aligned, and a block
//! whose aligned base is not a slab of its class came from the global allocator (below
//! `BULK_BYTES`, or when no slab could be mapped) and goes back there.

use crate::sys::spin::SpinLock;
use std::alloc::{dealloc, handle_alloc_error};
use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use super::blocks::{class_layout, Block, CLASSES};

/// Bytes per slab, and their alignment: one huge page on x86_64 and on aarch64 and riscv64
/// with 4 KiB pages.
pub(super) const SLAB: usize = 2 << 20;

/// One slab: `[base, base + SLAB)`, carved into blocks of its class's size.
struct Slab {
    /// Free blocks given back, linked through their first word (null ends the list).
    free: *mut u8,
    /// Blocks not in anybody's hands: given back, or never carved.
    idle: usize,
    /// Offset of the first block never carved; blocks from here to the end are idle.
    uncarved: usize,
}

/// Bytes of blocks a class has out before it carves further ones from slabs. (Tests use a
/// smaller figure, to stay small.)
#[cfg(not(all(test, not(loom))))]
const BULK_BYTES: usize = 32 << 20;
#[cfg(all(test, not(loom)))]
pub(super) const BULK_BYTES: usize = 8 << 20;

/// Hashes a slab's base (a multiple of `SLAB`) for the map of slabs.
#[derive(Default)]
struct BaseHasher(u64);

impl Hasher for BaseHasher {
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0 ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3);
        }
    }
    fn write_usize(&mut self, base: usize) {
        self.0 = ((base / SLAB) as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    }
    fn finish(&self) -> u64 {
        self.0
    }
}

/// The slabs of one class.
struct ClassSlabs {
    slabs: HashMap<usize, Slab, BuildHasherDefault<BaseHasher>>,
    /// Bases of the slabs with idle blocks but some in use, the one to carve from last.
    open: Vec<usize>,
    /// Bases of the empty slabs, taken (last first) when no slab is open.
    empty: Vec<usize>,
    /// When a slab last went into or out of `empty` (`mono_ns`).
    empty_used: u64,
    /// Blocks handed out and not given back, from slabs and the global allocator.
    out: usize,
}

// SAFETY: the raw pointers are free blocks inside the class's own slabs, reached only under
// the class's mutex.
unsafe impl Send for ClassSlabs {}

static SLABS: [SpinLock<Option<ClassSlabs>>; CLASSES] = [const { SpinLock::new(None) }; CLASSES];
/// Empty slabs of all classes that [`trim`] may unmap (not a class's last), changed with the
/// lists: an idle worker looks here before it takes the locks.
static TRIMMABLE: AtomicUsize = AtomicUsize::new(0);

impl ClassSlabs {
    /// Empty slabs that `trim` may unmap: all but the class's last.
    fn trimmable(&self) -> usize {
        self.empty
            .len()
            .saturating_sub(usize::from(self.slabs.len() == self.empty.len()))
    }

    /// Publishes a change of `trimmable` from `before`.
    fn publish(&self, before: usize) {
        let after = self.trimmable();
        if after > before {
            TRIMMABLE.fetch_add(after - before, Ordering::Relaxed);
        } else if after < before {
            TRIMMABLE.fetch_sub(before - after, Ordering::Relaxed);
        }
    }
}

/// Blocks per slab for `class`.
fn per_slab(class: usize) -> usize {
    SLAB / class_layout(class).size()
}

/// Tests: the class (plus one) for which no slab can be mapped, as if `mmap` failed.
#[cfg(all(test, not(loom)))]
pub(super) static FAIL_MAP: AtomicUsize = AtomicUsize::new(0);

/// Maps a new slab for `class`, 2 MiB-aligned, advised for huge pages.
fn map_slab(class: usize) -> Option<usize> {
    #[cfg(all(test, not(loom)))]
    if FAIL_MAP.load(Ordering::SeqCst) == class + 1 {
        return None;
    }
    #[cfg(not(all(test, not(loom))))]
    let _ = class;
    // Twice the size, to cut an aligned slab out of it; pages are committed only when a
    // block is touched.
    let len = 2 * SLAB;
    let start = crate::sys::map_lazy(len).ok()?;
    let base = start.next_multiple_of(SLAB);
    let (head, tail) = (base - start, start + len - (base + SLAB));
    // SAFETY: both ranges lie in the mapping just made, outside `[base, base + SLAB)`, and
    // nobody else knows of them.
    unsafe {
        if head > 0 {
            libc::munmap(start as *mut libc::c_void, head);
        }
        if tail > 0 {
            libc::munmap((base + SLAB) as *mut libc::c_void, tail);
        }
    }
    // SAFETY: advice on our own fresh mapping; failure (no THP support) only means small
    // pages.
    unsafe { libc::madvise(base as *mut libc::c_void, SLAB, libc::MADV_HUGEPAGE) };
    Some(base)
}

/// Locks every class's slabs, the guards forgotten (see `crate::fork`).
pub(super) fn fork_hold() {
    for class in &SLABS {
        class.fork_hold();
    }
}

/// Unlocks what `fork_hold` locked.
pub(super) fn fork_release() {
    for class in SLABS.iter().rev() {
        // SAFETY: `fork_hold` locked it on this thread; nothing released it since.
        unsafe { class.fork_release() };
    }
}

/// Adds `n` blocks of `class` (at least one) to `out`: from slabs once the class has
/// `BULK_BYTES` out, from the global allocator before, or if no slab can be mapped (whose
/// failure aborts, as `handle_alloc_error` does).
pub(super) fn take(class: usize, n: usize, out: &mut Vec<Block>) {
    let layout = class_layout(class);
    let n = n.max(1);
    // Blocks are taken here before any is cached or given back.
    crate::fork::register(crate::fork::Slot::Cells, &super::FORK);
    let mut guard = SLABS[class].lock();
    let cs = guard.get_or_insert_with(|| ClassSlabs {
        slabs: HashMap::default(),
        open: Vec::new(),
        empty: Vec::new(),
        empty_used: 0,
        out: 0,
    });
    let before = cs.trimmable();
    let mut want = n;
    let bulk = cs.out.saturating_mul(layout.size()) >= BULK_BYTES;
    while bulk && want > 0 {
        let base = if let Some(&b) = cs.open.last() {
            b
        } else if let Some(b) = cs.empty.pop() {
            cs.empty_used = crate::sys::mono_ns();
            cs.open.push(b);
            b
        } else if let Some(b) = map_slab(class) {
            let slab = Slab {
                free: std::ptr::null_mut(),
                idle: per_slab(class),
                uncarved: 0,
            };
            cs.slabs.insert(b, slab);
            cs.open.push(b);
            b
        } else {
            break;
        };
        let slab = cs.slabs.get_mut(&base).expect("an open slab is mapped");
        while want > 0 && slab.idle > 0 {
            let block = if !slab.free.is_null() {
                let b = slab.free;
                // SAFETY: a block on the free list is ours, and its first word is the link.
                slab.free = unsafe { b.cast::<*mut u8>().read() };
                b
            } else {
                let b = (base + slab.uncarved) as *mut u8;
                slab.uncarved += layout.size();
                b
            };
            slab.idle -= 1;
            want -= 1;
            out.push(Block(
                NonNull::new(block).expect("slab blocks are not null"),
            ));
        }
        if slab.idle == 0 {
            cs.open.pop();
        }
    }
    cs.out += n;
    cs.publish(before);
    drop(guard);
    for _ in 0..want {
        // SAFETY: the layout has a non-zero size.
        let p = unsafe { std::alloc::alloc(layout) };
        out.push(Block(
            NonNull::new(p).unwrap_or_else(|| handle_alloc_error(layout)),
        ));
    }
}

/// Gives blocks of `class` back: to their slab, or to the global allocator for blocks that
/// came from it.
pub(super) fn give(class: usize, blocks: impl IntoIterator<Item = Block>) {
    let per = per_slab(class);
    let mut guard = SLABS[class].lock();
    // Every block given back was taken, which made the class's entry.
    let cs = guard
        .as_mut()
        .expect("blocks are taken before they are given back");
    let before = cs.trimmable();
    for block in blocks {
        let p = block.0.as_ptr();
        let base = p as usize & !(SLAB - 1);
        cs.out -= 1;
        if !cs.slabs.contains_key(&base) {
            // SAFETY: not carved from a slab of this class, so allocated by `take` from the
            // global allocator with the class's layout.
            unsafe { dealloc(p, class_layout(class)) };
            continue;
        }
        let slab = cs.slabs.get_mut(&base).expect("looked up above");
        // SAFETY: the block is ours again; its first word becomes the link.
        unsafe { p.cast::<*mut u8>().write(slab.free) };
        slab.free = p;
        slab.idle += 1;
        if slab.idle == 1 {
            cs.open.push(base);
        }
        if slab.idle == per {
            // Empty (`per` ≥ 2, so it was open).
            let i = cs.open.iter().rposition(|&b| b == base);
            cs.open
                .swap_remove(i.expect("a slab with idle blocks is open"));
            cs.empty.push(base);
            cs.empty_used = crate::sys::mono_ns();
        }
    }
    cs.publish(before);
}

/// Unmaps slabs taken out of their class's map.
fn unmap_all(bases: &[usize]) {
    for &base in bases {
        // SAFETY: every block of the slab came back and the slab is gone from its class's
        // map, so nobody holds or can hand out a pointer into it.
        unsafe { libc::munmap(base as *mut libc::c_void, SLAB) };
    }
}

/// Unmaps up to `max` empty slabs of the classes none of whose slabs went empty or was
/// reused for `quiet`, keeping each class's last slab. Returns how long until there may be
/// more to unmap, or `None` if there are none.
pub(crate) fn trim(max: usize, quiet: Duration) -> Option<Duration> {
    if TRIMMABLE.load(Ordering::Relaxed) == 0 {
        return None;
    }
    #[cfg(all(test, not(loom)))]
    let private = PRIVATE.load(Ordering::SeqCst);
    #[cfg(not(all(test, not(loom))))]
    let private = 0;
    trim_classes((0..CLASSES).filter(|&c| private & 1 << c == 0), max, quiet)
}

/// Tests: the classes (a bit each) that only their tests trim, with [`trim_class`]: the
/// workers of other tests, idle or exiting, leave them alone.
#[cfg(all(test, not(loom)))]
pub(super) static PRIVATE: AtomicUsize = AtomicUsize::new(0);

/// [`trim`] for one class.
#[cfg(all(test, not(loom)))]
pub(super) fn trim_class(class: usize, max: usize, quiet: Duration) -> Option<Duration> {
    trim_classes(std::iter::once(class), max, quiet)
}

fn trim_classes(
    classes: impl Iterator<Item = usize>,
    max: usize,
    quiet: Duration,
) -> Option<Duration> {
    let now = crate::sys::mono_ns();
    let quiet = u64::try_from(quiet.as_nanos()).unwrap_or(u64::MAX);
    let mut unmap = Vec::new();
    let mut again: Option<u64> = None;
    for class in classes {
        let mut guard = SLABS[class].lock();
        let Some(cs) = guard.as_mut().filter(|cs| cs.trimmable() > 0) else {
            continue;
        };
        let idle_for = now.saturating_sub(cs.empty_used);
        if idle_for < quiet {
            let wait = quiet - idle_for;
            again = Some(again.map_or(wait, |a| a.min(wait)));
            continue;
        }
        let before = cs.trimmable();
        let n = before.min(max - unmap.len());
        for base in cs.empty.drain(..n) {
            cs.slabs.remove(&base);
            unmap.push(base);
        }
        cs.publish(before);
        if cs.trimmable() > 0 || unmap.len() == max {
            // More to unmap here, or perhaps in the classes not looked at.
            again = Some(0);
        }
        if unmap.len() == max {
            break;
        }
    }
    unmap_all(&unmap);
    again.map(Duration::from_nanos)
}

/// The slabs `class` has mapped (for tests).
#[cfg(all(test, not(loom)))]
pub(super) fn count(class: usize) -> usize {
    SLABS[class].lock().as_ref().map_or(0, |cs| cs.slabs.len())
}
