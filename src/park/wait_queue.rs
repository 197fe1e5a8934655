//! The FIFO wait queue that every blocking primitive of `fibra::sync` waits in, and with
//! them the joiners of a task and the threads waiting for a scheduler to drain. Built on
//! [`park`](crate::park) alone; it knows nothing of the primitives (a select's watchers
//! are fired through [`Guard::parts`], from `sync::select`).
//!
//! # Pieces
//! - [`Lock<S>`] holds a primitive's state `S` behind the internal lock (a spin lock,
//!   `shim::RawLock`, held for a few instructions and never across a park). Its [`Guard`] collects the
//!   wake-ups decided under the lock ([`Wakeups`]) and performs them after unlocking, so a
//!   woken waiter never bumps into a lock its waker still holds.
//! - [`WaitList<D>`] is an intrusive, doubly linked FIFO of waiters stored inside `S`. Each
//!   entry carries a `D`: what its waiter asks for (a number of permits, read or write, a
//!   pointer to a value slot). Wakers pop from the front, so waiters are served in the order
//!   in which they found the primitive busy; a timed-out waiter unlinks itself in O(1).
//! - [`wait`] links the caller into a list, releases the lock, parks, and reports how the
//!   wait ended: woken with a *token* chosen by the waker (the lock is yours, a value was
//!   delivered, the channel closed, …) or timed out.
//!
//! # Where a node lives
//! A waiter's [`Node`] is a local of [`wait`], pinned on the waiter's own stack (a fiber's
//! stack or a thread's): a wait allocates nothing. That is sound because the list is the only
//! way to reach a node, and `wait` never returns or unwinds while its node is linked:
//! - it returns normally only after a waker unlinked the node and marked it `WOKEN`, or after
//!   it took the lock and unlinked the node itself (timeout);
//! - if the waiting fiber is cancelled (`Scheduler::stop_timeout` unwinds it out of `park`),
//!   the `Withdraw` guard takes the lock and unlinks the node during the unwind;
//! - a parked fiber's stack stays mapped and untouched until the fiber resumes: it is only
//!   recycled after the fiber has finished, which means after `wait` returned or unwound.
//!
//! # The node handshake
//! A waiter links its node (state `WAITING`) under the lock, releases the lock and parks.
//! Its `Unparker` exists only once the fiber has switched out (docs/design.md, "Principles"), so the
//! park registration publishes it: write the unparker into the node, then compare-and-swap
//! `WAITING → PUBLISHED`. A waker holding the lock unlinks the node, writes the token and
//! swaps the state to `WOKEN` (a plain store when it reads `PUBLISHED`: from there on only
//! wakers, under the lock, write the state):
//! - if it saw `PUBLISHED`, it takes the unparker (still under the lock) and unparks after
//!   unlocking;
//! - if it saw `WAITING`, the registration has not run yet; its compare-and-swap then fails
//!   on `WOKEN` and it unparks its own park, so the fiber is simply resumed at once.
//!
//! Either way the waiter is unparked exactly once, and the registration takes no lock. After
//! the swap a waker touches the node only to take a published unparker, under the lock.
//!
//! A waiting *thread* first watches its node for a few microseconds (bounded backoff): a
//! wake that comes meanwhile finds `WAITING`, and the thread goes on without any futex call
//! on either side. A fiber parks at once: it would otherwise hold up its whole worker.
//!
//! A timed-out waiter takes the lock: a node still linked is removed and the wait timed out;
//! a node already unlinked was woken, and the waker's token stands (a wake that races with
//! the deadline wins, so a grant such as a handed-over lock is never lost).

use super::shim::{
    may_spin, park, AtomicU8, Ordering, ParkResult, RawGuard, RawLock, Unparker, UnsafeCell,
};
use crate::park::WaitOn;
use std::marker::PhantomPinned;
use std::mem::ManuallyDrop;
use std::ops::{Deref, DerefMut};
use std::pin::pin;
use std::ptr::NonNull;
use std::time::Instant;

/// A primitive's state behind the internal lock.
pub(crate) struct Lock<S> {
    raw: RawLock<S>,
}

impl<S> Lock<S> {
    const_unless_loom! {
        pub(crate) fn new(state: S) -> Lock<S> {
            Lock {
                raw: RawLock::new(state),
            }
        }
    }

    /// Takes the lock. Spins, then yields the thread until it is free: only ever held for a
    /// few instructions, never across a park, so this does not stall a worker in practice
    /// (only a holder preempted by the kernel keeps it waiting).
    #[inline]
    pub(crate) fn lock(&self) -> Guard<'_, S> {
        Guard {
            lock: self,
            raw: ManuallyDrop::new(self.raw.lock()),
            wakes: ManuallyDrop::new(Wakeups::new()),
        }
    }
}

/// The locked state. Dropping it releases the lock, then performs the collected wake-ups.
pub(crate) struct Guard<'a, S> {
    lock: &'a Lock<S>,
    raw: ManuallyDrop<RawGuard<'a, S>>,
    /// Taken and performed by `drop`, after unlocking.
    wakes: ManuallyDrop<Wakeups>,
}

impl<S> Guard<'_, S> {
    /// The state and the pending wake-ups, borrowed together (to wake waiters of a list
    /// that lives in the state).
    #[inline]
    pub(crate) fn parts(&mut self) -> (&mut S, &mut Wakeups) {
        (&mut self.raw, &mut self.wakes)
    }
}

impl<S> Deref for Guard<'_, S> {
    type Target = S;

    #[inline]
    fn deref(&self) -> &S {
        &self.raw
    }
}

impl<S> DerefMut for Guard<'_, S> {
    #[inline]
    fn deref_mut(&mut self) -> &mut S {
        &mut self.raw
    }
}

impl<S> Drop for Guard<'_, S> {
    #[inline(always)]
    fn drop(&mut self) {
        // SAFETY: `raw` is dropped exactly once, here; it is not used afterwards.
        unsafe { ManuallyDrop::drop(&mut self.raw) };
        // SAFETY: `wakes` is taken exactly once, here; it is not used afterwards. Its
        // wake-ups run with the lock free.
        unsafe { ManuallyDrop::take(&mut self.wakes) }.unpark();
    }
}

/// Unparkers taken out of woken nodes under the lock, unparked by the guard after it unlocks.
pub(crate) struct Wakeups {
    /// The common case, a single wake, needs no allocation.
    first: Option<Unparker>,
    rest: Vec<Unparker>,
}

impl Wakeups {
    const fn new() -> Wakeups {
        Wakeups {
            first: None,
            rest: Vec::new(),
        }
    }

    #[inline]
    pub(crate) fn push(&mut self, u: Unparker) {
        if self.first.is_none() {
            self.first = Some(u);
        } else {
            self.rest.push(u);
        }
    }

    /// Unparks them all, in order. Inline, and without a destructor of its own: the usual
    /// guard, with one wake-up or none, pays one test instead of two calls of drop glue.
    #[inline(always)]
    fn unpark(self) {
        let Wakeups { first, rest } = self;
        if rest.capacity() == 0 {
            // Nothing was ever allocated.
            std::mem::forget(rest);
            if let Some(u) = first {
                u.unpark_owned();
            }
        } else {
            unpark_all(first, rest);
        }
    }
}

/// [`Wakeups::unpark`] with more than one. An unparker that panics (a waker's `wake`)
/// does not keep the ones after it from being unparked: its panic goes on once they all
/// are (a later panic, reported by the panic hook like the first, goes no further).
#[cold]
#[inline(never)]
fn unpark_all(first: Option<Unparker>, rest: Vec<Unparker>) {
    let mut panicked = None;
    for u in first.into_iter().chain(rest) {
        if let Err(p) = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| u.unpark_owned()))
        {
            match panicked {
                None => panicked = Some(p),
                Some(_) => crate::report::drop_catching(p),
            }
        }
    }
    if let Some(p) = panicked {
        std::panic::resume_unwind(p);
    }
}

/// A waiting *thread* watches its own node this many times, with growing pauses (spins,
/// then yields: crossbeam's `Backoff`), before it parks. A waker that finds the node still
/// unpublished marks it woken and needs no unpark at all, so a wait that ends within a few
/// microseconds costs neither side a futex call. Fibers park at once (see `may_spin`).
const SPIN_STEPS: u32 = 10;
/// Up to this step a pause is `2^step` spin hints; from it on, a `thread::yield_now`.
const SPIN_LIMIT: u32 = 6;

/// Node states. See the module docs for the handshake.
const WAITING: u8 = 0;
const PUBLISHED: u8 = 1;
const WOKEN: u8 = 2;

struct Links<D> {
    prev: Option<NonNull<Node<D>>>,
    next: Option<NonNull<Node<D>>>,
}

impl<D> Clone for Links<D> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<D> Copy for Links<D> {}

/// One waiter, on its own stack.
pub(crate) struct Node<D> {
    /// Guarded by the list's lock.
    links: UnsafeCell<Links<D>>,
    /// What the waiter asks for; immutable.
    data: D,
    /// Written by the waker under the lock before the swap to `WOKEN`; read by the waiter
    /// after it has seen `WOKEN`.
    token: UnsafeCell<usize>,
    /// Written by the waiter before `WAITING → PUBLISHED`; taken by the waker after it has
    /// seen `PUBLISHED`, or by the waiter again if that compare-and-swap failed.
    unparker: UnsafeCell<Option<Unparker>>,
    state: AtomicU8,
    /// Linked nodes must not move.
    _pinned: PhantomPinned,
}

impl<D: Copy> Node<D> {
    fn new(data: D) -> Node<D> {
        Node {
            links: UnsafeCell::new(Links {
                prev: None,
                next: None,
            }),
            data,
            token: UnsafeCell::new(0),
            unparker: UnsafeCell::new(None),
            state: AtomicU8::new(WAITING),
            _pinned: PhantomPinned,
        }
    }

    fn links(&self) -> Links<D> {
        // SAFETY: callers hold the list's lock, which guards `links`.
        self.links.with(|l| unsafe { *l })
    }

    fn set_links(&self, links: Links<D>) {
        // SAFETY: as for `links`.
        self.links.with_mut(|l| unsafe { *l = links });
    }

    /// The park registration: hand the waiter's `Unparker` to its future waker.
    fn publish(&self, u: Unparker) {
        // SAFETY: while the state is WAITING no waker reads `unparker` (it reads it only
        // after seeing PUBLISHED), and only this waiter writes it.
        self.unparker.with_mut(|p| unsafe { *p = Some(u) });
        // Release: a waker that sees PUBLISHED sees the unparker written above.
        // Acquire on failure: the waker's token and unlinking happen before we take the
        // unparker back and resume.
        if self
            .state
            .compare_exchange(WAITING, PUBLISHED, Ordering::Release, Ordering::Acquire)
            .is_err()
        {
            // Woken before we published: the waker never touched `unparker`; wake ourselves.
            // SAFETY: the waker saw WAITING, so the unparker is still ours alone.
            let u = self.unparker.with_mut(|p| unsafe { (*p).take() });
            if let Some(u) = u {
                u.unpark();
            }
        }
    }

    /// The token of a node a waker marked WOKEN.
    fn token(&self) -> usize {
        // SAFETY: the waker wrote the token before its Release swap to WOKEN, which the
        // caller has observed (Acquire, or under the lock); nobody writes it afterwards.
        self.token.with(|t| unsafe { *t })
    }
}

/// A FIFO of waiters, kept inside a [`Lock`]ed state and only touched under that lock.
pub(crate) struct WaitList<D> {
    head: Option<NonNull<Node<D>>>,
    tail: Option<NonNull<Node<D>>>,
    len: usize,
}

// SAFETY: the list only holds pointers to nodes, which it dereferences under the lock that
// owns it (see the module docs for why linked nodes are alive). The `D` values it hands out
// are `Send`.
unsafe impl<D: Send> Send for WaitList<D> {}

impl<D: Copy> WaitList<D> {
    pub(crate) const fn new() -> WaitList<D> {
        WaitList {
            head: None,
            tail: None,
            len: 0,
        }
    }

    /// How many waiters are queued.
    #[inline]
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    #[inline]
    pub(crate) fn is_empty(&self) -> bool {
        self.head.is_none()
    }

    /// What the first waiter asks for.
    pub(crate) fn front(&self) -> Option<D> {
        // SAFETY: a linked node is alive (module docs); `data` is immutable.
        self.head.map(|n| unsafe { n.as_ref() }.data)
    }

    /// Appends `node`.
    ///
    /// # Safety
    /// `node` is not in any list and stays at its address, alive, until it has been removed
    /// (by [`WaitList::remove`] or a wake).
    unsafe fn push_back(&mut self, node: NonNull<Node<D>>) {
        // SAFETY: the caller guarantees `node` is alive; linked nodes are alive.
        unsafe {
            node.as_ref().set_links(Links {
                prev: self.tail,
                next: None,
            });
            match self.tail {
                Some(t) => {
                    let mut l = t.as_ref().links();
                    l.next = Some(node);
                    t.as_ref().set_links(l);
                }
                None => self.head = Some(node),
            }
        }
        self.tail = Some(node);
        self.len += 1;
    }

    /// Unlinks `node`.
    ///
    /// # Safety
    /// `node` is in this list.
    unsafe fn remove(&mut self, node: NonNull<Node<D>>) {
        // SAFETY: `node` and its neighbours are linked, hence alive.
        unsafe {
            let Links { prev, next } = node.as_ref().links();
            match prev {
                Some(p) => {
                    let mut l = p.as_ref().links();
                    l.next = next;
                    p.as_ref().set_links(l);
                }
                None => self.head = next,
            }
            match next {
                Some(n) => {
                    let mut l = n.as_ref().links();
                    l.prev = prev;
                    n.as_ref().set_links(l);
                }
                None => self.tail = prev,
            }
        }
        self.len -= 1;
    }

    /// Wakes the first waiter with `token` and returns what it asked for.
    pub(crate) fn wake_front(&mut self, token: usize, wakes: &mut Wakeups) -> Option<D> {
        let node = self.head?;
        // SAFETY: `node` is the head of this list.
        unsafe { self.remove(node) };
        // SAFETY: the node is alive until we mark it WOKEN below: its waiter cannot leave
        // `wait` before seeing WOKEN or taking the lock we hold.
        let node = unsafe { node.as_ref() };
        let data = node.data;
        // SAFETY: only a waker writes the token, under the lock, before WOKEN.
        node.token.with_mut(|t| unsafe { *t = token });
        // Release hands the token (and whatever this waker did under the lock) to the waiter,
        // which reads WOKEN with Acquire; Acquire makes the unparker it published visible
        // when we see PUBLISHED. A published node's state is written only by wakers, under
        // the lock we hold (the waiter's one write is WAITING → PUBLISHED), so once we see
        // PUBLISHED a plain store does what the swap would, without a locked instruction:
        // the usual case, a waiter parked a while ago.
        let before = if node.state.load(Ordering::Acquire) == PUBLISHED {
            node.state.store(WOKEN, Ordering::Release);
            PUBLISHED
        } else {
            node.state.swap(WOKEN, Ordering::AcqRel)
        };
        if before == PUBLISHED {
            // SAFETY: the waiter is parked and can only resume through this unparker or by a
            // timeout/cancellation, which must take the lock we hold first; so the node is
            // still alive and its unparker ours to take.
            let u = node.unparker.with_mut(|p| unsafe { (*p).take() });
            wakes.push(u.expect("a published node holds its unparker"));
        }
        // From here on the node may be gone: a waiter that saw WOKEN returns.
        Some(data)
    }

    /// Wakes every waiter with `token`, in order; returns how many.
    pub(crate) fn wake_all(&mut self, token: usize, wakes: &mut Wakeups) -> usize {
        let mut n = 0;
        while self.wake_front(token, wakes).is_some() {
            n += 1;
        }
        n
    }
}

/// How a [`wait`] ended.
pub(crate) enum Wait<'a, S> {
    /// A waker unlinked the node and chose this token.
    Woken(usize),
    /// The deadline passed first; the node has been removed and the lock is held again.
    TimedOut(Guard<'a, S>),
}

/// Joins the back of the list that `list` selects in the locked state, releases the lock,
/// runs `before_park` (Condvar releases its mutex there) and parks until a waker picks the
/// node or `deadline` passes. `on` is what a fiber dump shows the waiter waiting for.
///
/// If the waiting fiber is cancelled (unwound out of `park`), the node is withdrawn under the
/// lock and `on_cancel` runs with the lock held: with `Some(token)` if a waker had already
/// picked it (pass on what it granted), with `None` if it was still queued.
#[inline(always)]
pub(crate) fn wait<'a, S, D: Copy>(
    mut guard: Guard<'a, S>,
    list: fn(&mut S) -> &mut WaitList<D>,
    data: D,
    deadline: Option<Instant>,
    on: WaitOn,
    before_park: impl FnOnce(),
    on_cancel: impl FnOnce(&mut Guard<'a, S>, Option<usize>),
) -> Wait<'a, S> {
    let node = pin!(Node::new(data));
    let node: &Node<D> = &node;
    let ptr = NonNull::from(node);
    // SAFETY: the node is pinned in this frame, and this frame is not left (returned from or
    // unwound) while it is linked: see `Withdraw`.
    unsafe { list(&mut guard).push_back(ptr) };
    // Armed before the guard goes: dropping it performs the wake-ups the caller collected,
    // and a foreign waker that panics there unwinds this frame, which must unlink the node.
    let withdraw = Withdraw {
        lock: guard.lock,
        list,
        node: ptr,
        on_cancel: Some(on_cancel),
    };
    drop(guard);
    before_park();
    if may_spin() {
        for step in 0..SPIN_STEPS {
            // Acquire: as after a park (see `Withdraw::finish`).
            if node.state.load(Ordering::Acquire) == WOKEN {
                // Woken before we published: nobody will unpark us, so there is nothing
                // to withdraw; this is exactly the state an unparked waiter finds.
                return withdraw.finish(ParkResult::Unparked);
            }
            if step < SPIN_LIMIT {
                for _ in 0..1u32 << step {
                    std::hint::spin_loop();
                }
            } else {
                std::thread::yield_now();
            }
        }
    }
    loop {
        let parked = park(deadline, on, |u| node.publish(u));
        // Acquire: as in `Withdraw::finish`.
        if parked == ParkResult::TimedOut || node.state.load(Ordering::Acquire) == WOKEN {
            return withdraw.finish(parked);
        }
        // Unparked, yet no waker marked the node: an unpark that was not this park's. `park`
        // promises none, but the node must never be left linked when this frame goes away,
        // so re-arm it under the lock and park again.
        let stale = {
            let _g = withdraw.lock.lock();
            // Relaxed: under the lock, which every waker holds when it swaps to WOKEN.
            if node.state.load(Ordering::Relaxed) == WOKEN {
                drop(_g);
                return withdraw.finish(parked);
            }
            node.state.store(WAITING, Ordering::Relaxed);
            // SAFETY: it was PUBLISHED and we hold the lock, so no waker has taken the
            // unparker or can until we release it; back in WAITING, none reads it until it
            // is published again.
            node.unparker.with_mut(|p| unsafe { (*p).take() })
        };
        drop(stale);
    }
}

/// Waits with no deadline for a grant that a waker hands over with `token` (the lock, a
/// share of it): the contended path of `Mutex` and `RwLock`, as [`wait`] with nothing to do
/// before parking. It returns once the grant is the caller's; the granter's writes happen
/// before (see [`WaitList::wake_front`]).
#[inline(always)]
pub(crate) fn wait_granted<'a, S, D: Copy>(
    guard: Guard<'a, S>,
    list: fn(&mut S) -> &mut WaitList<D>,
    data: D,
    on: WaitOn,
    token: usize,
    on_cancel: impl FnOnce(&mut Guard<'a, S>, Option<usize>),
) {
    match wait(guard, list, data, None, on, || {}, on_cancel) {
        Wait::Woken(t) if t == token => {}
        Wait::Woken(t) => unreachable!("{on} waiter woken with token {t}"),
        Wait::TimedOut(_) => unreachable!("{on}: a wait without deadline timed out"),
    }
}

/// Takes a waiter's node out of its list on every way out of [`wait`].
struct Withdraw<'a, S, D: Copy, F: FnOnce(&mut Guard<'a, S>, Option<usize>)> {
    lock: &'a Lock<S>,
    list: fn(&mut S) -> &mut WaitList<D>,
    node: NonNull<Node<D>>,
    /// `Some` until the wait ended normally; dropping while `Some` means unwinding.
    on_cancel: Option<F>,
}

impl<'a, S, D: Copy, F: FnOnce(&mut Guard<'a, S>, Option<usize>)> Withdraw<'a, S, D, F> {
    #[inline]
    fn finish(mut self, parked: ParkResult) -> Wait<'a, S> {
        self.on_cancel = None;
        // SAFETY: the node lives in `wait`'s frame, which outlives `self`.
        let node = unsafe { self.node.as_ref() };
        match parked {
            ParkResult::Unparked => {
                // The only unparker of this park was in the node, so a waker marked it
                // WOKEN (or, after a spin, we saw WOKEN ourselves).
                // Acquire pairs with the waker's swap (the token, and what it did under the
                // lock, are visible).
                let state = node.state.load(Ordering::Acquire);
                debug_assert_eq!(state, WOKEN);
                Wait::Woken(node.token())
            }
            ParkResult::TimedOut => {
                let mut g = self.lock.lock();
                // Relaxed: under the lock, which every waker holds when it swaps to WOKEN.
                if node.state.load(Ordering::Relaxed) == WOKEN {
                    Wait::Woken(node.token())
                } else {
                    // SAFETY: not WOKEN, so still linked (only wakers and we unlink it).
                    unsafe { (self.list)(&mut g).remove(self.node) };
                    Wait::TimedOut(g)
                }
            }
        }
    }
}

impl<'a, S, D: Copy, F: FnOnce(&mut Guard<'a, S>, Option<usize>)> Drop for Withdraw<'a, S, D, F> {
    fn drop(&mut self) {
        let Some(on_cancel) = self.on_cancel.take() else {
            return;
        };
        let mut g = self.lock.lock();
        // SAFETY: as in `finish`.
        let node = unsafe { self.node.as_ref() };
        // Relaxed: under the lock, as in `finish`.
        if node.state.load(Ordering::Relaxed) == WOKEN {
            on_cancel(&mut g, Some(node.token()));
        } else {
            // SAFETY: not WOKEN, so still linked.
            unsafe { (self.list)(&mut g).remove(self.node) };
            on_cancel(&mut g, None);
        }
        // The wake-ups `on_cancel` made run as `g` is dropped, while the waiter unwinds: a
        // foreign waker's panic stops in `Unparker` then (see `park::wake_foreign`).
    }
}
