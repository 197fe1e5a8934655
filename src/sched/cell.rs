//! Task cells: the one allocation behind each submitted task, shared by the run queues, the
//! `JoinHandle` and the `Unparker`s through [`TaskArc`], a reference-counted pointer like
//! `Arc` whose memory comes from per-thread caches of blocks rather than straight from the
//! global allocator.
//!
//! Why not `Arc` and `malloc`: a task is usually allocated on one thread (the spawner's) and
//! freed on another (the worker that ran it last). glibc's per-thread arenas handle that flow
//! badly: the spawner's arena grows a page at a time with `mprotect` (a TLB shootdown on
//! every other core the process runs on), frees from the other thread take the spawner's
//! arena lock, and the consolidated memory is trimmed back to the kernel between bursts, to
//! be grown again by the next one. In a burst of spawns on two workers, that is most of the
//! cost of a spawn.
//!
//! The cache is a magazine allocator (Bonwick and Adams, 2001): each thread keeps, per size
//! class, a stack of free blocks; a thread that frees more than it allocates hands
//! magazines of `MAGAZINE` blocks to a global depot, and one that allocates more takes them
//! from there — one lock per `MAGAZINE` blocks, so memory flows from the threads that end
//! tasks back to the ones that spawn them without touching `malloc`. Blocks are only ever
//! obtained from, and returned to, the slab layer ([`slabs`]) by class, so any thread may
//! free any block by either route; that layer takes them from the global allocator, or, once
//! a class has many out, from 2 MiB slabs backed by huge pages. What the caches hold is
//! bounded: `2 × MAGAZINE` blocks per class per thread, and `DEPOT_BYTES` per class in the
//! depot; beyond that blocks go back to where they came from. A thread's blocks go to the
//! depot when it exits.

use std::alloc::{dealloc, handle_alloc_error, Layout};
use std::cell::RefCell;
use std::marker::PhantomData;
use std::mem::{offset_of, ManuallyDrop};
use std::ops::Deref;
use std::ptr::NonNull;
use std::sync::atomic::{fence, AtomicUsize, Ordering};

/// What a [`TaskArc`] points to: the reference count, then the value.
#[repr(C)]
pub(crate) struct Inner<U: ?Sized> {
    refs: AtomicUsize,
    value: U,
}

/// A shared reference to a task cell, like `Arc<U>`, allocated from the block caches.
pub(crate) struct TaskArc<U: ?Sized> {
    ptr: NonNull<Inner<U>>,
    _owns: PhantomData<Inner<U>>,
}

// SAFETY: as for `Arc`: the value is shared between threads (Sync) and dropped on whichever
// thread drops the last reference (Send); the count is atomic.
unsafe impl<U: ?Sized + Send + Sync> Send for TaskArc<U> {}
// SAFETY: as for Send.
unsafe impl<U: ?Sized + Send + Sync> Sync for TaskArc<U> {}

// A reference never pins its cell, as `Arc`: moving the pointer moves no value.
impl<U: ?Sized> Unpin for TaskArc<U> {}

impl<U> TaskArc<U> {
    /// Moves the value `make` returns into a new cell.
    #[inline(always)]
    pub(crate) fn new(make: impl FnOnce() -> U) -> TaskArc<U> {
        let [this] = Self::new_refs(make);
        this
    }

    /// Moves the value `make` returns into a new cell and returns two references to it:
    /// `new` and a `clone`, without the clone's atomic increment (a spawn needs one for its
    /// handle and one for the run queue).
    #[inline(always)]
    pub(crate) fn new_pair(make: impl FnOnce() -> U) -> (TaskArc<U>, TaskArc<U>) {
        let [a, b] = Self::new_refs(make);
        (a, b)
    }

    /// A new cell holding what `make` returns, with its count started at `N`: the `N`
    /// references. `make` runs once the block is allocated, so that the value (a task's
    /// 400-byte header, say) can be built where it will live instead of being built on the
    /// stack and copied there.
    #[inline(always)]
    fn new_refs<const N: usize>(make: impl FnOnce() -> U) -> [TaskArc<U>; N] {
        let layout = Layout::new::<Inner<U>>();
        let block = blocks::alloc(layout).cast::<Inner<U>>();
        // Gives the block back if `make` panics.
        struct Unused(NonNull<u8>, Layout);
        impl Drop for Unused {
            fn drop(&mut self) {
                blocks::free(self.0, self.1);
            }
        }
        let unused = Unused(block.cast(), layout);
        // SAFETY: `block` is a fresh allocation that fits `layout` (see `blocks::alloc`).
        unsafe {
            block.as_ptr().write(Inner {
                refs: AtomicUsize::new(N),
                value: make(),
            })
        };
        std::mem::forget(unused);
        [(); N].map(|()| TaskArc {
            ptr: block,
            _owns: PhantomData,
        })
    }

    /// A new reference to the cell that holds `value`.
    ///
    /// # Safety
    /// `value` must be the value of a live `TaskArc<U>` cell (reached through one).
    #[inline]
    pub(crate) unsafe fn from_value(value: &U) -> TaskArc<U> {
        let inner = (value as *const U)
            .cast::<u8>()
            .wrapping_sub(offset_of!(Inner<U>, value))
            .cast::<Inner<U>>()
            .cast_mut();
        // Per the contract `inner` is the cell around `value`, alive while the caller's
        // reference is; the new reference is `clone`'s increment, and the borrowed one is
        // never dropped.
        let this = ManuallyDrop::new(TaskArc {
            // SAFETY: derived from a reference, so not null.
            ptr: unsafe { NonNull::new_unchecked(inner) },
            _owns: PhantomData,
        });
        TaskArc::clone(&this)
    }

    /// The same cell seen as a `V` (a trait object `U` implements).
    ///
    /// # Safety
    /// `coerce` must be the unsizing coercion of its argument (`|p| p`): the result must
    /// point to the same cell, with `V`'s metadata for a `U`.
    #[inline]
    pub(crate) unsafe fn unsize<V: ?Sized>(
        self,
        coerce: impl FnOnce(NonNull<Inner<U>>) -> NonNull<Inner<V>>,
    ) -> TaskArc<V> {
        let this = ManuallyDrop::new(self);
        let ptr = coerce(this.ptr);
        debug_assert_eq!(ptr.cast::<u8>(), this.ptr.cast::<u8>());
        TaskArc {
            ptr,
            _owns: PhantomData,
        }
    }
}

impl<U: ?Sized> TaskArc<U> {
    #[inline(always)]
    fn inner(&self) -> &Inner<U> {
        // SAFETY: the cell lives while any reference does, and `self` is one.
        unsafe { self.ptr.as_ref() }
    }

    /// The address of the value, for as long as some reference lives.
    #[inline]
    pub(crate) fn as_ptr(this: &Self) -> *const U {
        // SAFETY: a place projection inside the live cell.
        unsafe { &raw const (*this.ptr.as_ptr()).value }
    }

    /// The cell's address, for as long as some reference lives; no reference is taken.
    #[inline(always)]
    pub(crate) fn cell_ptr(this: &Self) -> NonNull<Inner<U>> {
        this.ptr
    }

    /// Gives up this reference without dropping it: it lives on in the returned pointer,
    /// until [`TaskArc::from_raw`] takes it back.
    #[inline(always)]
    pub(crate) fn into_raw(this: Self) -> NonNull<Inner<U>> {
        ManuallyDrop::new(this).ptr
    }

    /// Takes back a reference that [`TaskArc::into_raw`] gave up.
    ///
    /// # Safety
    /// `ptr` came from `into_raw` (of a `TaskArc<U>`, or of one that unsizes to it), and
    /// the reference it stands for is taken back once.
    #[inline(always)]
    pub(crate) unsafe fn from_raw(ptr: NonNull<Inner<U>>) -> TaskArc<U> {
        TaskArc {
            ptr,
            _owns: PhantomData,
        }
    }

    /// Whether the two point to the same cell.
    #[cfg(all(test, not(loom)))]
    pub(crate) fn ptr_eq(a: &Self, b: &Self) -> bool {
        a.ptr.cast::<u8>() == b.ptr.cast::<u8>()
    }

    /// How many references there are (racy unless the caller holds all of them).
    #[cfg(all(test, not(loom)))]
    pub(crate) fn strong_count(this: &Self) -> usize {
        this.inner().refs.load(Ordering::Acquire)
    }
}

impl<U: ?Sized> Clone for TaskArc<U> {
    #[inline]
    fn clone(&self) -> Self {
        // Relaxed, as `Arc`: a new reference is made from an existing one, which already
        // orders everything the cloning thread can see of the value.
        let old = self.inner().refs.fetch_add(1, Ordering::Relaxed);
        if old > isize::MAX as usize {
            // Leaked references by the billion: stop before the count can wrap.
            std::process::abort();
        }
        TaskArc {
            ptr: self.ptr,
            _owns: PhantomData,
        }
    }
}

impl<U: ?Sized> Deref for TaskArc<U> {
    type Target = U;

    #[inline(always)]
    fn deref(&self) -> &U {
        &self.inner().value
    }
}

impl<U: ?Sized> Drop for TaskArc<U> {
    #[inline]
    fn drop(&mut self) {
        // Release, then an Acquire fence by the last one, as `Arc`: every use of the value
        // through any reference happens before it is dropped.
        if self.inner().refs.fetch_sub(1, Ordering::Release) != 1 {
            return;
        }
        fence(Ordering::Acquire);
        // SAFETY: this was the last reference, so nothing else reaches the cell; it is freed
        // with the layout it was allocated with (`Layout::for_value` of the same type, or of
        // the trait object whose metadata describes that type).
        unsafe { release(self.ptr) };
    }
}

/// Drops the value in `ptr`'s cell and frees the block, even if the value's drop panics.
///
/// # Safety
/// `ptr` is a cell made by `TaskArc::new` whose last reference is gone.
#[inline(never)]
unsafe fn release<U: ?Sized>(ptr: NonNull<Inner<U>>) {
    struct Free(NonNull<u8>, Layout);
    impl Drop for Free {
        fn drop(&mut self) {
            blocks::free(self.0, self.1);
        }
    }
    // SAFETY: the cell is alive until `Free` runs, which is after the value's drop.
    let layout = Layout::for_value(unsafe { ptr.as_ref() });
    let _free = Free(ptr.cast(), layout);
    // SAFETY: per the contract nobody else reaches the cell; it is dropped once.
    unsafe { std::ptr::drop_in_place(ptr.as_ptr()) };
}

mod slabs;

pub(crate) use slabs::trim as trim_slabs;

/// The task cells' `fork` handlers (`crate::fork::Slot::Cells`), registered where blocks
/// are first taken (`slabs::take`).
static FORK: crate::fork::Handlers = crate::fork::Handlers {
    prepare: fork_hold,
    release: |_| fork_release(),
};

/// Takes the locks of the depot and the slabs before a `fork` (see `crate::fork`).
fn fork_hold() {
    blocks::fork_hold();
    slabs::fork_hold();
}

/// Releases what [`fork_hold`] took, in the parent or the child of the `fork`.
fn fork_release() {
    slabs::fork_release();
    blocks::fork_release();
}

/// The per-thread block caches and the depot behind them.
mod blocks {
    use super::*;
    use crate::sys::spin::SpinLock;

    /// Size classes are multiples of `GRAIN` bytes up to `CLASSES × GRAIN`; larger cells, and
    /// cells aligned beyond `ALIGN`, go straight to the global allocator.
    const GRAIN: usize = 64;
    pub(super) const CLASSES: usize = 16;
    const ALIGN: usize = 16;
    /// Blocks moved between a thread and the depot at a time.
    pub(super) const MAGAZINE: usize = 32;
    /// Most bytes of blocks the depot keeps per class.
    pub(super) const DEPOT_BYTES: usize = 4 << 20;

    /// A free block of some class: memory with no value in it, owned by whoever holds this.
    pub(super) struct Block(pub(super) NonNull<u8>);
    // SAFETY: a free block is plain memory owned by its holder; moving it to another thread
    // moves that ownership.
    unsafe impl Send for Block {}

    fn class_of(layout: Layout) -> Option<usize> {
        (layout.align() <= ALIGN && layout.size() <= CLASSES * GRAIN)
            .then(|| layout.size().max(1).div_ceil(GRAIN) - 1)
    }

    pub(super) fn class_layout(class: usize) -> Layout {
        // Unwrap: (class + 1) × GRAIN ≤ 1 KiB with a power-of-two alignment is a valid layout.
        Layout::from_size_align((class + 1) * GRAIN, ALIGN).expect("a valid class layout")
    }

    /// Full magazines, and empty ones kept so that moving blocks allocates nothing.
    struct Depot {
        full: Vec<Vec<Block>>,
        empty: Vec<Vec<Block>>,
    }

    static DEPOT: [SpinLock<Depot>; CLASSES] = [const {
        SpinLock::new(Depot {
            full: Vec::new(),
            empty: Vec::new(),
        })
    }; CLASSES];

    /// Locks every class's depot, the guards forgotten (see `crate::fork`).
    pub(super) fn fork_hold() {
        for depot in &DEPOT {
            depot.fork_hold();
        }
    }

    /// Unlocks what `fork_hold` locked.
    pub(super) fn fork_release() {
        for depot in DEPOT.iter().rev() {
            // SAFETY: `fork_hold` locked it on this thread; nothing released it since.
            unsafe { depot.fork_release() };
        }
    }

    /// This thread's free blocks, per class (at most `2 × MAGAZINE` each).
    struct Local {
        free: [Vec<Block>; CLASSES],
    }

    impl Drop for Local {
        /// The thread exits: its blocks go to the depot (or back to where they came from).
        fn drop(&mut self) {
            for (class, list) in self.free.iter_mut().enumerate() {
                while !list.is_empty() {
                    let n = list.len().min(MAGAZINE);
                    let start = list.len() - n;
                    let mut mag = DEPOT[class].lock().empty.pop().unwrap_or_default();
                    mag.extend(list.drain(start..));
                    stash(class, mag);
                }
            }
        }
    }

    thread_local! {
        static LOCAL: RefCell<Local> = const {
            RefCell::new(Local {
                free: [const { Vec::new() }; CLASSES],
            })
        };
    }

    /// Puts a full magazine in the depot, or gives its blocks back to their slabs if the
    /// depot holds enough (outside the depot's lock: the slabs take their own).
    fn stash(class: usize, mut mag: Vec<Block>) {
        let limit = (DEPOT_BYTES / (MAGAZINE * (class + 1) * GRAIN)).max(2);
        {
            let mut depot = DEPOT[class].lock();
            if depot.full.len() < limit {
                depot.full.push(mag);
                return;
            }
        }
        super::slabs::give(class, mag.drain(..));
        DEPOT[class].lock().empty.push(mag);
    }

    /// A block for `layout`.
    #[inline]
    pub(super) fn alloc(layout: Layout) -> NonNull<u8> {
        let Some(class) = class_of(layout) else {
            return global(layout);
        };
        let cached = LOCAL
            .try_with(|local| {
                let mut local = local.try_borrow_mut().ok()?;
                let list = &mut local.free[class];
                if let Some(b) = list.pop() {
                    return Some(b);
                }
                refill(list, class);
                list.pop()
            })
            .ok()
            .flatten();
        match cached {
            Some(block) => block.0,
            None => uncached(class),
        }
    }

    /// A block of `class` straight from the slab layer: this thread's cache is gone (it is
    /// exiting) or in use further up the stack.
    #[cold]
    #[inline(never)]
    fn uncached(class: usize) -> NonNull<u8> {
        let mut one = Vec::with_capacity(1);
        super::slabs::take(class, 1, &mut one);
        one.pop().expect("`take` adds at least one block").0
    }

    /// Fills `list` (empty) with a full magazine from the depot, or with a magazine's worth
    /// of blocks from the slabs.
    #[cold]
    fn refill(list: &mut Vec<Block>, class: usize) {
        let mut depot = DEPOT[class].lock();
        if let Some(mut mag) = depot.full.pop() {
            list.append(&mut mag);
            depot.empty.push(mag);
            return;
        }
        drop(depot);
        super::slabs::take(class, MAGAZINE, list);
    }

    fn global(layout: Layout) -> NonNull<u8> {
        // SAFETY: task cells are never zero-sized (they hold a reference count).
        let p = unsafe { std::alloc::alloc(layout) };
        NonNull::new(p).unwrap_or_else(|| handle_alloc_error(layout))
    }

    /// Frees a block allocated by `alloc(layout)`.
    #[inline]
    pub(super) fn free(block: NonNull<u8>, layout: Layout) {
        let Some(class) = class_of(layout) else {
            // SAFETY: allocated by `global(layout)`.
            unsafe { dealloc(block.as_ptr(), layout) };
            return;
        };
        let kept = LOCAL
            .try_with(|local| {
                let Ok(mut local) = local.try_borrow_mut() else {
                    return false;
                };
                let list = &mut local.free[class];
                if list.len() >= 2 * MAGAZINE {
                    spill(list, class);
                }
                list.push(Block(block));
                true
            })
            .unwrap_or(false);
        if !kept {
            give_uncached(class, block);
        }
    }

    /// Gives a block of `class` straight back to its slab (see `uncached`).
    #[cold]
    #[inline(never)]
    fn give_uncached(class: usize, block: NonNull<u8>) {
        super::slabs::give(class, [Block(block)]);
    }

    /// Moves a magazine's worth of `list`'s blocks to the depot.
    #[cold]
    fn spill(list: &mut Vec<Block>, class: usize) {
        let mut mag = DEPOT[class].lock().empty.pop().unwrap_or_default();
        mag.extend(list.drain(list.len() - MAGAZINE..));
        stash(class, mag);
    }

    /// Blocks of `class` this thread holds, and full magazines in the depot.
    #[cfg(all(test, not(loom)))]
    pub(super) fn counts(layout: Layout) -> (usize, usize) {
        let class = class_of(layout).expect("a cached size");
        let local = LOCAL.with(|l| l.borrow().free[class].len());
        (local, DEPOT[class].lock().full.len())
    }

    #[cfg(all(test, not(loom)))]
    pub(super) fn class_of_for_test(layout: Layout) -> Option<usize> {
        class_of(layout)
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicUsize;
    use std::sync::Arc;
    use std::time::Duration;

    struct Counted(Arc<AtomicUsize>, [u8; 100]);
    impl Drop for Counted {
        fn drop(&mut self) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }

    trait Speak: Send + Sync {
        fn speak(&self) -> u8;
    }
    impl Speak for Counted {
        fn speak(&self) -> u8 {
            self.1[7]
        }
    }

    #[test]
    fn clones_share_one_value_dropped_once() {
        let drops = Arc::new(AtomicUsize::new(0));
        let a = TaskArc::new(|| Counted(drops.clone(), [7; 100]));
        let b = a.clone();
        // SAFETY: the identity coercion.
        let c: TaskArc<dyn Speak> =
            unsafe { b.clone().unsize(|p| -> NonNull<Inner<dyn Speak>> { p }) };
        assert!(TaskArc::ptr_eq(&a, &b));
        assert_eq!(c.speak(), 7);
        assert_eq!(TaskArc::strong_count(&a), 3);
        // SAFETY: `a`'s value lives in a TaskArc cell.
        let d = unsafe { TaskArc::from_value(&*a) };
        assert_eq!(TaskArc::strong_count(&a), 4);
        drop((a, b, d));
        assert_eq!(drops.load(Ordering::SeqCst), 0);
        drop(c);
        assert_eq!(drops.load(Ordering::SeqCst), 1);
    }

    #[test]
    fn a_panicking_drop_still_frees_and_propagates() {
        struct Boom;
        impl Drop for Boom {
            fn drop(&mut self) {
                panic!("boom in drop");
            }
        }
        let a = TaskArc::new(|| Boom);
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| drop(a)));
        assert!(r.is_err());
    }

    /// A value that panics while it is being made gives its block back: the next cell of
    /// that size on this thread gets the same block (this thread's cache hands out the
    /// block it got last).
    #[test]
    fn a_panic_while_making_the_value_gives_the_block_back() {
        let first = TaskArc::new(|| [1u8; 600]);
        let addr = TaskArc::as_ptr(&first) as usize;
        drop(first);
        let r = std::panic::catch_unwind(|| TaskArc::<[u8; 600]>::new(|| panic!("no value")));
        assert!(r.is_err());
        let again = TaskArc::new(|| [2u8; 600]);
        assert_eq!(
            TaskArc::as_ptr(&again) as usize,
            addr,
            "the block was given back"
        );
        assert_eq!(again[599], 2);
    }

    #[test]
    fn sizes_map_to_classes_and_odd_ones_bypass() {
        let class = blocks::class_of_for_test;
        assert_eq!(class(Layout::from_size_align(1, 1).unwrap()), Some(0));
        assert_eq!(class(Layout::from_size_align(64, 8).unwrap()), Some(0));
        assert_eq!(class(Layout::from_size_align(65, 8).unwrap()), Some(1));
        assert_eq!(class(Layout::from_size_align(1024, 16).unwrap()), Some(15));
        assert_eq!(class(Layout::from_size_align(1025, 8).unwrap()), None);
        assert_eq!(class(Layout::from_size_align(64, 32).unwrap()), None);
        // Big and over-aligned cells work all the same, through the global allocator.
        #[repr(align(128))]
        struct Aligned(u8);
        let a = TaskArc::new(|| Aligned(3));
        assert_eq!(TaskArc::as_ptr(&a) as usize % 128, 0);
        assert_eq!(a.0, 3);
        let big = TaskArc::new(|| [5u8; 4096]);
        assert_eq!(big[4095], 5);
    }

    /// The class of `layout`'s blocks, which the calling test alone trims (see
    /// `slabs::PRIVATE`): no other test in this process may use it.
    fn private_class(layout: Layout) -> usize {
        let class = blocks::class_of_for_test(layout).expect("a cached size");
        slabs::PRIVATE.fetch_or(1 << class, Ordering::SeqCst);
        class
    }

    #[test]
    fn a_burst_maps_slabs_and_gives_them_back() {
        // A size no other test in this process uses (class 14: 897..=960 bytes).
        type Payload = [u8; 900];
        let layout = Layout::new::<Inner<Payload>>();
        let class = private_class(layout);
        // The first `BULK_BYTES` come from the global allocator, the rest from slabs.
        let n = slabs::BULK_BYTES / 960 + 10 * (slabs::SLAB / 960);
        for round in 0..4 {
            let cells: Vec<_> = (0..n).map(|i| TaskArc::new(|| [i as u8; 900])).collect();
            // Every cell is its own memory: no block was handed out twice.
            let addrs: std::collections::HashSet<usize> =
                cells.iter().map(|c| TaskArc::as_ptr(c) as usize).collect();
            assert_eq!(addrs.len(), n, "round {round}");
            for (i, c) in cells.iter().enumerate() {
                assert!(c.iter().all(|&b| b == i as u8), "round {round}: cell {i}");
            }
            // Ten slabs' worth of blocks; later rounds reuse the slabs kept.
            let mapped = slabs::count(class);
            assert!(mapped >= 10, "round {round}: {mapped} slabs");
            assert!(
                mapped <= 12,
                "round {round}: {mapped} slabs for 10 slabs' worth"
            );
            drop(cells);
        }
        // Idle: the empty slabs go. The blocks the depot keeps (at most 4 MiB, two slabs'
        // worth, but after four rounds spread over about eight) and this thread's cache (at
        // most 64) keep theirs.
        let before = slabs::count(class);
        slabs::trim_class(class, usize::MAX, Duration::ZERO);
        let left = slabs::count(class);
        assert!(left < before, "{left} of {before} slabs left");
        assert!(left >= 1, "a class keeps its last slab");
    }

    #[test]
    fn empty_slabs_are_kept_for_a_while_then_unmapped() {
        // A class no other test in this process uses (15: 961..=1024 bytes), straight at
        // the slab layer, below the caches.
        let class = private_class(Layout::from_size_align(1000, 8).unwrap());
        let per_slab = slabs::SLAB / 1024;
        // The first `BULK_BYTES` come from the global allocator.
        let mut small = Vec::new();
        slabs::take(class, slabs::BULK_BYTES / 1024, &mut small);
        assert_eq!(slabs::count(class), 0);
        let mut taken = Vec::new();
        slabs::take(class, 20 * per_slab, &mut taken);
        assert_eq!(taken.len(), 20 * per_slab);
        assert_eq!(slabs::count(class), 20);
        assert!(small
            .iter()
            .all(|b| (b.0.as_ptr() as usize).is_multiple_of(16)));
        slabs::give(class, small);
        // No block handed out twice: each holds its own number until it goes back.
        for (i, b) in taken.iter().enumerate() {
            // SAFETY: each block is 1 024 bytes of memory owned by this test.
            unsafe { std::ptr::write_bytes(b.0.as_ptr(), (i % 251) as u8, 1024) };
        }
        for (i, b) in taken.iter().enumerate() {
            // SAFETY: as above.
            let bytes = unsafe { std::slice::from_raw_parts(b.0.as_ptr(), 1024) };
            assert!(bytes.iter().all(|&x| x == (i % 251) as u8), "block {i}");
        }
        // Back in a scattered order, half of them from another thread.
        let (evens, odds): (Vec<_>, Vec<_>) =
            taken.into_iter().enumerate().partition(|(i, _)| i % 2 == 0);
        let odds: Vec<_> = odds.into_iter().rev().map(|(_, b)| b).collect();
        std::thread::spawn(move || slabs::give(class, odds))
            .join()
            .unwrap();
        assert_eq!(slabs::count(class), 20, "no slab is empty yet");
        slabs::give(class, evens.into_iter().map(|(_, b)| b));
        // Empty slabs are kept for the next burst.
        assert_eq!(slabs::count(class), 20);
        // Not idle for long enough: nothing goes, and the trimmer is told when to return.
        let hour = Duration::from_secs(3600);
        let trim = |max, quiet| slabs::trim_class(class, max, quiet);
        assert!(trim(usize::MAX, hour).is_some_and(|w| w > hour / 2));
        assert_eq!(slabs::count(class), 20);
        // A few at a time, then the rest; the class keeps its last slab.
        assert_eq!(trim(3, Duration::ZERO), Some(Duration::ZERO));
        assert_eq!(slabs::count(class), 17);
        assert_eq!(trim(usize::MAX, Duration::ZERO), None);
        assert_eq!(slabs::count(class), 1, "every empty slab but the last went");
        // The one kept is used again, carved afresh or from its free list.
        let mut again = Vec::new();
        slabs::take(class, per_slab, &mut again);
        assert_eq!(slabs::count(class), 1);
        slabs::give(class, again);
    }

    #[test]
    fn blocks_come_from_the_global_allocator_when_no_slab_can_be_mapped() {
        // A size no other test in this process uses (class 13: 833..=896 bytes).
        type Payload = [u8; 850];
        let layout = Layout::new::<Inner<Payload>>();
        let class = private_class(layout);
        let n = slabs::BULK_BYTES / 896 + 300;
        slabs::FAIL_MAP.store(class + 1, Ordering::SeqCst);
        let from_malloc: Vec<_> = (0..n).map(|i| TaskArc::new(|| [i as u8; 850])).collect();
        assert_eq!(slabs::count(class), 0, "no slab could be mapped");
        slabs::FAIL_MAP.store(0, Ordering::SeqCst);
        let from_slabs: Vec<_> = (0..300)
            .map(|i| TaskArc::new(|| [!(i as u8); 850]))
            .collect();
        assert_eq!(slabs::count(class), 1);
        for (i, a) in from_malloc.iter().enumerate() {
            assert!(a.iter().all(|&x| x == i as u8));
        }
        for (i, b) in from_slabs.iter().enumerate() {
            assert!(b.iter().all(|&x| x == !(i as u8)));
        }
        // Freed from another thread, mixed: each block goes back where it came from (a
        // block of the global allocator handed to a slab would corrupt it, and a slab block
        // handed to `free` would make glibc abort).
        std::thread::spawn(move || {
            let mut slabs = from_slabs.into_iter();
            let mut all: Vec<_> = from_malloc.into_iter().map(|a| (a, slabs.next())).collect();
            all.reverse();
            drop(all);
        })
        .join()
        .unwrap();
        let again: Vec<_> = (0..n).map(|i| TaskArc::new(|| [i as u8; 850])).collect();
        assert!(again.iter().enumerate().all(|(i, c)| c[849] == i as u8));
        drop(again);
        assert_eq!(slabs::count(class), 1);
    }

    /// One thread allocates, another frees: the blocks come back to the allocating thread
    /// through the depot, a magazine at a time, and what the caches keep stays bounded.
    #[test]
    fn blocks_flow_back_from_the_freeing_thread() {
        // A size no other test in this process uses (class 12: 769..=832 bytes).
        type Payload = [u8; 800];
        const N: usize = 1000;
        let layout = Layout::new::<Inner<Payload>>();
        let (tx, rx) = std::sync::mpsc::channel::<Vec<TaskArc<Payload>>>();
        let (ack, acked) = std::sync::mpsc::channel::<()>();
        let freer = std::thread::spawn(move || {
            for batch in rx {
                drop(batch);
                ack.send(()).unwrap();
            }
            blocks::counts(layout).0
        });
        let mut previous: Vec<usize> = Vec::new();
        for round in 0..20 {
            let batch: Vec<_> = (0..N).map(|i| TaskArc::new(|| [i as u8; 800])).collect();
            let addrs: Vec<usize> = batch.iter().map(|c| TaskArc::as_ptr(c) as usize).collect();
            if round > 0 {
                // All of the previous round's blocks but those the freer keeps (and this
                // thread's few) came back through the depot.
                let reused = addrs.iter().filter(|a| previous.contains(a)).count();
                assert!(
                    reused >= N - 3 * blocks::MAGAZINE,
                    "round {round}: only {reused} of {N} blocks reused"
                );
            }
            previous = addrs;
            tx.send(batch).unwrap();
            acked.recv().unwrap();
        }
        drop(tx);
        let freer_kept = freer.join().unwrap();
        // The freer has exited: its blocks went to the depot, whose size is capped.
        let (local, depot) = blocks::counts(layout);
        assert!(local <= 2 * blocks::MAGAZINE);
        let limit = blocks::DEPOT_BYTES / (blocks::MAGAZINE * 832);
        assert!(depot <= limit.max(2), "{depot} magazines in the depot");
        assert!(
            depot >= N / blocks::MAGAZINE - 3,
            "{depot} magazines in the depot"
        );
        assert!(
            freer_kept <= 2 * blocks::MAGAZINE,
            "{freer_kept} blocks kept"
        );
        let (local, depot) = blocks::counts(layout);
        assert!(local <= 2 * blocks::MAGAZINE);
        let limit = blocks::DEPOT_BYTES / (blocks::MAGAZINE * 832);
        assert!(depot <= limit.max(2), "{depot} magazines in the depot");
        assert!(depot >= 1, "the freer's blocks never reached the depot");
    }
}
