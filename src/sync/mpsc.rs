//! Multi-producer, single-consumer channels with std's API: [`channel`] (unbounded) and
//! [`sync_channel`] (bounded, or a rendezvous with bound 0). The error types *are* std's.
//!
//! # Design
//! The buffer, the flags and two wait lists share the internal lock:
//! - `receiver` — the receivers waiting for a message, in arrival order (usually one; more
//!   only when threads share one [`Receiver`] by reference, which `Sync` allows so that the
//!   future of [`Receiver::recv_async`] is `Send`). Each node points at a slot on its
//!   receiver's stack; a sender that finds one there puts the message straight into that slot
//!   and wakes it, bypassing the buffer (the buffer is empty whenever a receiver waits, so
//!   order is kept).
//! - `senders` — senders of a full bounded channel, in arrival order, each node pointing at a
//!   slot on its sender's stack that holds its message. When the receiver takes a message
//!   and frees a place, it moves the first blocked sender's message into the buffer and wakes
//!   that sender: the message is sent when the sender wakes, nobody can overtake it. With
//!   bound 0 the receiver takes the message from the first blocked sender directly.
//!
//! A sender that finds room pushes and returns; so uncontended `send`/`recv` are one short
//! lock each, plus an unpark when the other side sleeps. Two refinements speed up channels
//! between threads: the receiver of an unbounded channel takes the whole buffer in one go
//! when it holds several messages (one lock per batch instead of per message, and less
//! contention with the senders; the batch has a spin flag of its own, uncontended unless
//! receivers share the `Receiver`, and a `filled` hint so that a receive finding no batch
//! takes no flag at all), and a receiving *thread* watches its queued node briefly before
//! it parks (see `wait_queue`): a sender that comes meanwhile delivers straight into its
//! slot and neither side makes a futex call (a fiber parks at once: that is only a context
//! switch). Disconnection: the last sender (an atomic count, so cloning takes no lock)
//! wakes the receiver with `DISCONNECTED`; a dropped receiver wakes every blocked sender
//! with `DISCONNECTED` and its message stays in its slot, returned in the `SendError`.
//! Messages are never dropped under the internal lock.

use super::deadline_after;
use super::select::{Offers, Signal, Watchers};
use super::shim::{Arc, AtomicUsize, Ordering, UnsafeCell};
use super::wait_queue::{wait, Guard, Lock, Wait, WaitList};
use crate::dump::WaitOn;
use std::collections::VecDeque;
use std::fmt;
use std::ptr::NonNull;
use std::time::{Duration, Instant};

pub use std::sync::mpsc::{RecvError, RecvTimeoutError, SendError, TryRecvError, TrySendError};

/// Tokens: a waiting receiver got a message in its slot; a blocked sender's message was
/// taken; the other side is gone. (`mpmc` uses the same ones.)
pub(super) const DELIVERED: usize = 1;
pub(super) const TAKEN: usize = 2;
pub(super) const DISCONNECTED: usize = 3;

/// A message slot on a waiter's stack, reachable from its wait-list node (`mpsc` and `mpmc`).
pub(super) struct Slot<T>(NonNull<UnsafeCell<Option<T>>>);

impl<T> Clone for Slot<T> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<T> Copy for Slot<T> {}

// SAFETY: a slot carries a `T` from one thread to another, under the channel's lock; that
// needs `T: Send` and nothing more (a slot is never shared, only handed over).
unsafe impl<T: Send> Send for Slot<T> {}

impl<T> Slot<T> {
    pub(super) fn new(cell: &UnsafeCell<Option<T>>) -> Slot<T> {
        Slot(NonNull::from(cell))
    }

    /// # Safety
    /// The slot's node is linked (so the slot is alive) and the channel's lock is held.
    pub(super) unsafe fn put(self, msg: T) {
        // SAFETY: per the caller; the waiter reads its slot only after it was woken or
        // under the lock, so the lock makes this the only access.
        unsafe { self.0.as_ref().with_mut(|s| *s = Some(msg)) }
    }

    /// # Safety
    /// As for [`Slot::put`].
    pub(super) unsafe fn take(self) -> T {
        // SAFETY: per the caller.
        let msg = unsafe { self.0.as_ref().with_mut(|s| (*s).take()) };
        msg.expect("a blocked sender's slot holds its message")
    }
}

struct Chan<T> {
    state: Lock<State<T>>,
    /// Live `Sender`s and `SyncSender`s.
    senders: AtomicUsize,
}

struct State<T> {
    buffer: VecDeque<T>,
    /// `None`: unbounded.
    bound: Option<usize>,
    senders_gone: bool,
    receiver_gone: bool,
    receiver: WaitList<Slot<T>>,
    senders: WaitList<Slot<T>>,
    /// Selects waiting to receive, and to send (see `select`).
    rx_watch: Watchers,
    tx_watch: Watchers,
    /// Sends that waiting selects offer on a rendezvous channel (see `select`).
    offers: Offers<T>,
}

fn new_chan<T>(bound: Option<usize>) -> Arc<Chan<T>> {
    Arc::new(Chan {
        state: Lock::new(State {
            buffer: VecDeque::new(),
            bound,
            senders_gone: false,
            receiver_gone: false,
            receiver: WaitList::new(),
            senders: WaitList::new(),
            rx_watch: Watchers::default(),
            tx_watch: Watchers::default(),
            offers: Offers::default(),
        }),
        senders: AtomicUsize::new(1),
    })
}

/// Creates an unbounded channel, like [`std::sync::mpsc::channel`]: `send` never blocks.
///
/// Senders and the receiver may be fibers or plain threads, in any mix; a receiving fiber is
/// suspended while the channel is empty.
///
/// ```
/// use fibra::sync::mpsc;
///
/// let sched = fibra::Scheduler::builder().threads(2).build()?;
/// sched.start();
/// let (tx, rx) = mpsc::channel();
/// for i in 0..10u64 {
///     let tx = tx.clone();
///     drop(sched.submit(move || tx.send(i).unwrap(), None).unwrap());
/// }
/// drop(tx); // the iterator ends when every sender is gone
/// let sum = sched.block_on(move || rx.iter().sum::<u64>());
/// assert_eq!(sum, 45);
/// sched.stop();
/// # Ok::<(), fibra::Error>(())
/// ```
pub fn channel<T>() -> (Sender<T>, Receiver<T>) {
    let chan = new_chan(None);
    (Sender { chan: chan.clone() }, Receiver::new(chan))
}

/// Creates a bounded channel holding at most `bound` messages, like
/// [`std::sync::mpsc::sync_channel`]: `send` waits while it is full. With `bound` 0 every
/// `send` waits until the receiver takes its message (a rendezvous).
///
/// ```
/// use fibra::sync::mpsc;
///
/// let sched = fibra::Scheduler::builder().threads(1).build()?;
/// sched.start();
/// let (tx, rx) = mpsc::sync_channel(1);
/// let producer = sched.submit(move || for i in 0..100 { tx.send(i).unwrap() }, None).unwrap();
/// let consumer = sched.submit(move || rx.iter().count(), None).unwrap();
/// producer.join().unwrap();
/// assert_eq!(consumer.join().unwrap(), 100);
/// sched.stop();
/// # Ok::<(), fibra::Error>(())
/// ```
pub fn sync_channel<T>(bound: usize) -> (SyncSender<T>, Receiver<T>) {
    let chan = new_chan(Some(bound));
    (SyncSender { chan: chan.clone() }, Receiver::new(chan))
}

/// The sending half of a [`channel`]. Clone it for more producers.
pub struct Sender<T> {
    chan: Arc<Chan<T>>,
}

/// The sending half of a [`sync_channel`]. Clone it for more producers.
pub struct SyncSender<T> {
    chan: Arc<Chan<T>>,
}

/// The receiving half of a [`channel`] or [`sync_channel`]. `Send` and `Sync`: the
/// receiving futures of [`recv_async`](Receiver::recv_async) borrow it and may move to
/// another thread; receivers sharing one (through `&`) each get different messages.
pub struct Receiver<T> {
    chan: Arc<Chan<T>>,
    /// Messages moved out of an unbounded channel's buffer in one go, so that a busy
    /// consumer takes the channel's lock once per batch rather than once per message. Older
    /// than anything still in the shared buffer; refilled only under the channel's lock.
    batch: Batch<T>,
}

/// The receiver's batch of messages, guarded by a spin flag: only receivers touch it, each
/// time for a `pop_front` or a swap and nothing else (no allocation, no drop, no panic, no
/// suspension), so a second receiver sharing the `Receiver` waits a few instructions at
/// most; a single receiver pays one atomic swap and a store, half of a mutex's cost.
struct Batch<T> {
    busy: std::sync::atomic::AtomicBool,
    /// Whether `queue` may hold messages: set by a refill, cleared by the pop that empties
    /// it, both under `busy`. A receiver that reads it clear skips the flag; one that holds
    /// the channel's lock cannot read it clear while a refill left messages (refills happen
    /// under that lock too).
    filled: std::sync::atomic::AtomicBool,
    queue: std::cell::UnsafeCell<VecDeque<T>>,
}

// SAFETY: the queue is only reached through `with`, which holds the flag: one thread at a
// time, and the messages it holds move between threads like the channel's (`T: Send`).
unsafe impl<T: Send> Sync for Batch<T> {}

impl<T> Batch<T> {
    fn new() -> Self {
        Batch {
            busy: std::sync::atomic::AtomicBool::new(false),
            filled: std::sync::atomic::AtomicBool::new(false),
            queue: std::cell::UnsafeCell::new(VecDeque::new()),
        }
    }

    /// Runs `f` on the queue. `f` must be a `pop_front`, a `push_front` or a swap: it must
    /// not panic, block or call back into the channel.
    #[inline]
    fn with<R>(&self, f: impl FnOnce(&mut VecDeque<T>) -> R) -> R {
        use std::sync::atomic::Ordering as O;
        while self.busy.swap(true, O::Acquire) {
            while self.busy.load(O::Relaxed) {
                std::hint::spin_loop();
            }
        }
        // SAFETY: the flag is ours until the store below, so no other reference to the queue
        // exists; `f` cannot unwind (see above), so the flag is always released.
        let r = f(unsafe { &mut *self.queue.get() });
        self.busy.store(false, O::Release);
        r
    }

    fn pop(&self) -> Option<T> {
        use std::sync::atomic::Ordering as O;
        if !self.filled.load(O::Relaxed) {
            return None;
        }
        self.with(|q| {
            let msg = q.pop_front();
            if q.is_empty() {
                self.filled.store(false, O::Relaxed);
            }
            msg
        })
    }

    /// Puts `msg` back in front of the messages the queue holds, which came after it; gives
    /// it back if the queue is empty. Called under the channel's lock, so a refill cannot be
    /// under way.
    fn put_front(&self, msg: T) -> Option<T> {
        use std::sync::atomic::Ordering as O;
        if !self.filled.load(O::Relaxed) {
            return Some(msg);
        }
        self.with(|q| {
            if q.is_empty() {
                Some(msg)
            } else {
                q.push_front(msg);
                None
            }
        })
    }
}

impl<T> Sender<T> {
    /// Sends a message; never blocks.
    ///
    /// # Errors
    /// Gives the message back if the receiver has been dropped.
    pub fn send(&self, msg: T) -> Result<(), SendError<T>> {
        match self.chan.send(msg, false) {
            Ok(()) => Ok(()),
            Err(TrySendError::Disconnected(m)) => Err(SendError(m)),
            Err(TrySendError::Full(_)) => unreachable!("an unbounded channel is never full"),
        }
    }
}

impl<T> SyncSender<T> {
    /// Sends a message, waiting (suspending a fiber, blocking a thread) while the channel is
    /// full; with bound 0, until the receiver has taken it. Blocked senders go in arrival
    /// order.
    ///
    /// # Errors
    /// Gives the message back if the receiver has been (or gets) dropped.
    pub fn send(&self, msg: T) -> Result<(), SendError<T>> {
        match self.chan.send(msg, true) {
            Ok(()) => Ok(()),
            Err(TrySendError::Disconnected(m)) => Err(SendError(m)),
            Err(TrySendError::Full(_)) => unreachable!("a blocking send does not fail as full"),
        }
    }

    /// Sends a message only if that needs no waiting.
    ///
    /// # Errors
    /// [`TrySendError::Full`] if there is no room (for bound 0: no receiver waiting),
    /// [`TrySendError::Disconnected`] if the receiver is gone; both give the message back.
    pub fn try_send(&self, msg: T) -> Result<(), TrySendError<T>> {
        self.chan.send(msg, false)
    }
}

/// The future of [`Receiver::recv_async`].
#[must_use = "futures do nothing unless polled"]
pub struct RecvFuture<'a, T> {
    rx: &'a Receiver<T>,
    /// Registered with the channel's receive watchers while the future waits.
    signal: Option<std::sync::Arc<Signal>>,
}

impl<T> RecvFuture<'_, T> {
    fn done(&mut self) {
        if let Some(s) = self.signal.take() {
            self.rx.watch(&s, false);
        }
    }
}

impl<T> std::future::Future for RecvFuture<'_, T> {
    type Output = Result<T, RecvError>;

    fn poll(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Self::Output> {
        let this = &mut *self;
        loop {
            if let Some(r) = super::ready(this.rx.try_recv()) {
                this.done();
                return std::task::Poll::Ready(r);
            }
            match &this.signal {
                Some(s) => {
                    // Watching already; a message that came after the try above fires the
                    // signal, which wakes the waker set here.
                    s.set_waker(cx.waker());
                    if !s.fired() {
                        return std::task::Poll::Pending;
                    }
                    s.reset();
                }
                None => {
                    // Watch, then try again: a message between the try and the watch is
                    // seen by the second try.
                    let s = Signal::new();
                    s.set_waker(cx.waker());
                    this.rx.watch(&s, true);
                    this.signal = Some(s);
                }
            }
        }
    }
}

impl<T> Drop for RecvFuture<'_, T> {
    fn drop(&mut self) {
        self.done();
    }
}

impl<T> fmt::Debug for RecvFuture<'_, T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RecvFuture").finish_non_exhaustive()
    }
}

impl<T> Chan<T> {
    fn send(&self, msg: T, block: bool) -> Result<(), TrySendError<T>> {
        crate::coop::spend();
        let mut st = self.state.lock();
        if st.receiver_gone {
            return Err(TrySendError::Disconnected(msg));
        }
        let Some(msg) = deliver(&mut st, msg) else {
            return Ok(());
        };
        let room = match st.bound {
            None => true,
            Some(bound) => st.buffer.len() < bound && st.senders.is_empty(),
        };
        if room {
            st.buffer.push_back(msg);
            st.notify(|s| &s.rx_watch);
            return Ok(());
        }
        if !block {
            return Err(TrySendError::Full(msg));
        }
        // A blocked sender is a message a select can receive (for a rendezvous channel).
        st.notify(|s| &s.rx_watch);
        let slot = UnsafeCell::new(Some(msg));
        match wait(
            st,
            |st| &mut st.senders,
            Slot::new(&slot),
            None,
            WaitOn::Channel("mpsc::SyncSender::send"),
            || {},
            // A cancelled sender's message stays in its slot and is dropped with it, after
            // the lock is released.
            |_, _| {},
        ) {
            Wait::Woken(TAKEN) => Ok(()),
            Wait::Woken(DISCONNECTED) => {
                // SAFETY: woken, so unlinked: the slot is ours alone again.
                let msg = slot.with_mut(|s| unsafe { (*s).take() });
                Err(TrySendError::Disconnected(msg.expect("not taken")))
            }
            Wait::Woken(t) => unreachable!("sender woken with token {t}"),
            Wait::TimedOut(_) => unreachable!("sends have no deadline"),
        }
    }

    fn add_sender(&self) {
        // Relaxed: like `Arc::clone`, a new sender comes from a live one.
        self.senders.fetch_add(1, Ordering::Relaxed);
    }

    fn drop_sender(&self) {
        // AcqRel: exactly one drop sees the count reach zero (like `Arc`'s), after every other
        // sender's last send.
        if self.senders.fetch_sub(1, Ordering::AcqRel) == 1 {
            let mut st = self.state.lock();
            st.senders_gone = true;
            st.notify(|s| &s.rx_watch);
            let (st, wakes) = st.parts();
            st.receiver.wake_all(DISCONNECTED, wakes);
        }
    }
}

/// Takes the next message: from the buffer (refilling it from the first blocked sender), or,
/// for a rendezvous channel, straight from the first blocked sender.
fn take_message<T>(st: &mut Guard<'_, State<T>>) -> Option<T> {
    let (st, wakes) = st.parts();
    if st.bound.is_none() {
        // Unbounded: no sender ever blocks, no select waits to send (its send completes at
        // once), nothing is offered.
        return st.buffer.pop_front();
    }
    let msg = st.buffer.pop_front();
    if msg.is_some() || !st.senders.is_empty() {
        // Room for a select's send.
        st.tx_watch.notify(wakes);
    }
    if let Some(slot) = st.senders.front() {
        // SAFETY: the sender's node is linked and we hold the lock.
        let blocked = unsafe { slot.take() };
        st.senders.wake_front(TAKEN, wakes);
        match msg {
            Some(msg) => {
                st.buffer.push_back(blocked);
                return Some(msg);
            }
            None => return Some(blocked),
        }
    }
    // A rendezvous channel's message is never buffered: a select's offered send is next.
    msg.or_else(|| st.offers.claim(wakes))
}

impl<T> Receiver<T> {
    fn new(chan: Arc<Chan<T>>) -> Receiver<T> {
        Receiver {
            chan,
            batch: Batch::new(),
        }
    }

    /// Waits for a message, suspending a fiber (or blocking a thread) while the channel is
    /// empty.
    ///
    /// # Errors
    /// [`RecvError`] once the channel is empty and every sender is gone.
    pub fn recv(&self) -> Result<T, RecvError> {
        self.recv_until(None).map_err(|_| RecvError)
    }

    /// Takes a message if one is there; never waits.
    ///
    /// # Errors
    /// [`TryRecvError::Empty`], or [`TryRecvError::Disconnected`] once the channel is empty
    /// and every sender is gone.
    pub fn try_recv(&self) -> Result<T, TryRecvError> {
        crate::coop::spend();
        if let Some(msg) = self.batch.pop() {
            return Ok(msg);
        }
        let mut st = self.chan.state.lock();
        match self.take(&mut st) {
            Some(msg) => Ok(msg),
            None if st.senders_gone => Err(TryRecvError::Disconnected),
            None => Err(TryRecvError::Empty),
        }
    }

    /// Waits at most `timeout` for a message.
    ///
    /// ```
    /// use fibra::sync::mpsc::{self, RecvTimeoutError};
    /// use std::time::Duration;
    /// let (tx, rx) = mpsc::channel::<u8>();
    /// assert_eq!(rx.recv_timeout(Duration::from_millis(5)), Err(RecvTimeoutError::Timeout));
    /// drop(tx);
    /// assert_eq!(rx.recv_timeout(Duration::from_millis(5)), Err(RecvTimeoutError::Disconnected));
    /// ```
    ///
    /// # Errors
    /// [`RecvTimeoutError::Timeout`] if the time ran out, [`RecvTimeoutError::Disconnected`]
    /// once the channel is empty and every sender is gone.
    pub fn recv_timeout(&self, timeout: Duration) -> Result<T, RecvTimeoutError> {
        self.recv_until(deadline_after(timeout))
    }

    /// An iterator that waits for each message and ends when the channel disconnects.
    pub fn iter(&self) -> Iter<'_, T> {
        Iter { rx: self }
    }

    /// An iterator over the messages already there; never waits.
    pub fn try_iter(&self) -> TryIter<'_, T> {
        TryIter { rx: self }
    }

    /// Takes the next message under the lock; from an unbounded channel holding several,
    /// moves them all into `batch` (no sender waits for room there, so nothing changes for
    /// the senders).
    fn take(&self, st: &mut Guard<'_, State<T>>) -> Option<T> {
        // Another receiver sharing this one may have refilled the batch since we looked.
        if let Some(msg) = self.batch.pop() {
            return Some(msg);
        }
        if st.bound.is_none() && st.buffer.len() > 1 {
            // The batch is empty (refills happen only under the channel's lock, which we
            // hold): the shared buffer keeps the batch's allocation for the senders.
            return self.batch.with(|batch| {
                std::mem::swap(&mut st.buffer, batch);
                let msg = batch.pop_front();
                if !batch.is_empty() {
                    self.batch
                        .filled
                        .store(true, std::sync::atomic::Ordering::Relaxed);
                }
                msg
            });
        }
        take_message(st)
    }

    fn recv_until(&self, deadline: Option<Instant>) -> Result<T, RecvTimeoutError> {
        crate::coop::spend();
        if let Some(msg) = self.batch.pop() {
            return Ok(msg);
        }
        let mut st = self.chan.state.lock();
        if let Some(msg) = self.take(&mut st) {
            return Ok(msg);
        }
        if st.senders_gone {
            return Err(RecvTimeoutError::Disconnected);
        }
        // A waiting receiver takes a select's send on a rendezvous channel (on any other,
        // an empty buffer already had room for it).
        if st.bound == Some(0) {
            st.notify(|s| &s.tx_watch);
        }
        let slot = UnsafeCell::new(None);
        match wait(
            st,
            |st| &mut st.receiver,
            Slot::new(&slot),
            deadline,
            WaitOn::Channel("mpsc::Receiver::recv"),
            || {},
            |st, token| {
                if token == Some(DELIVERED) {
                    // Cancelled with a message in hand: pass it on, first in line — to the
                    // next receiver waiting on a shared `&Receiver`, else back in front of
                    // what came after it: the batch another receiver sharing this one took
                    // meanwhile, or the buffer. A waiting select or `recv_async` must hear
                    // of it.
                    // SAFETY: woken, so unlinked; we hold the lock.
                    if let Some(msg) = slot.with_mut(|s| unsafe { (*s).take() }) {
                        if let Some(msg) = deliver(st, msg) {
                            if let Some(msg) = self.batch.put_front(msg) {
                                st.buffer.push_front(msg);
                            }
                            st.notify(|s| &s.rx_watch);
                        }
                    }
                }
            },
        ) {
            Wait::Woken(DELIVERED) => {
                // SAFETY: woken, so unlinked: the slot is ours alone again.
                let msg = slot.with_mut(|s| unsafe { (*s).take() });
                Ok(msg.expect("a delivered message"))
            }
            Wait::Woken(DISCONNECTED) => Err(RecvTimeoutError::Disconnected),
            Wait::Woken(t) => unreachable!("receiver woken with token {t}"),
            Wait::TimedOut(_) => Err(RecvTimeoutError::Timeout),
        }
    }
}

/// Puts `msg` into the slot of the first receiver waiting in `list` of the locked state `st`
/// and wakes it; gives the message back if no receiver waits. (`mpmc` shares it.)
pub(super) fn deliver_to<S, T>(
    st: &mut Guard<'_, S>,
    list: impl FnOnce(&mut S) -> &mut WaitList<Slot<T>>,
    msg: T,
) -> Option<T> {
    let (st, wakes) = st.parts();
    let receivers = list(st);
    let Some(slot) = receivers.front() else {
        return Some(msg);
    };
    // SAFETY: the receiver's node is linked and we hold the lock.
    unsafe { slot.put(msg) };
    receivers.wake_front(DELIVERED, wakes);
    None
}

fn deliver<T>(st: &mut Guard<'_, State<T>>, msg: T) -> Option<T> {
    deliver_to(st, |s| &mut s.receiver, msg)
}

impl<T> Receiver<T> {
    /// A future of the next message, for async code: `rx.recv_async().await` is
    /// [`recv`](Receiver::recv) without blocking the executor's thread. The future is `Send`
    /// (for `T: Send`), so a tokio task can await it; dropping it before it is ready loses
    /// nothing.
    ///
    /// ```
    /// use fibra::sync::mpsc;
    /// let (tx, rx) = mpsc::channel();
    /// let sched = fibra::Scheduler::builder().threads(1).build().unwrap();
    /// sched.start();
    /// sched.submit(move || { fibra::sleep(std::time::Duration::from_millis(5)); tx.send(7) }, None).unwrap();
    /// // Any executor; here fibra's `block_on` on this plain thread.
    /// assert_eq!(fibra::future::block_on(rx.recv_async()), Ok(7));
    /// assert!(fibra::future::block_on(rx.recv_async()).is_err()); // sender gone
    /// ```
    ///
    /// # Errors
    /// [`RecvError`] once the channel is empty and every sender is gone.
    pub fn recv_async(&self) -> RecvFuture<'_, T> {
        RecvFuture {
            rx: self,
            signal: None,
        }
    }

    /// Registers (or removes) a waiting select's signal.
    pub(crate) fn watch(&self, s: &std::sync::Arc<Signal>, on: bool) {
        let mut st = self.chan.state.lock();
        if on {
            st.rx_watch.add(s);
        } else {
            st.rx_watch.remove(s);
        }
    }
}

impl<T> Chan<T> {
    fn watch_send(&self, s: &std::sync::Arc<Signal>, on: bool) {
        let mut st = self.state.lock();
        if on {
            st.tx_watch.add(s);
        } else {
            st.tx_watch.remove(s);
        }
    }

    /// A waiting select's send on a rendezvous channel (see `select::Offers::offer`).
    fn offer(&self, msg: T, s: &std::sync::Arc<Signal>, arm: usize) -> Result<(), T> {
        let mut guard = self.state.lock();
        let (st, wakes) = guard.parts();
        let open = st.bound == Some(0) && !st.receiver_gone && st.receiver.is_empty();
        st.offers.offer(open, &st.rx_watch, wakes, s, arm, msg)
    }

    fn withdraw(&self, s: &std::sync::Arc<Signal>, arm: usize) -> Option<T> {
        self.state.lock().offers.withdraw(s, arm)
    }
}

impl<T> Sender<T> {
    pub(crate) fn watch(&self, s: &std::sync::Arc<Signal>, on: bool) {
        self.chan.watch_send(s, on);
    }

    /// A send for `select!` (never full: the channel is unbounded).
    pub(crate) fn select_try_send(&self, msg: T) -> Result<(), TrySendError<T>> {
        self.chan.send(msg, false)
    }
}

impl<T> SyncSender<T> {
    pub(crate) fn watch(&self, s: &std::sync::Arc<Signal>, on: bool) {
        self.chan.watch_send(s, on);
    }

    pub(crate) fn select_try_send(&self, msg: T) -> Result<(), TrySendError<T>> {
        self.try_send(msg)
    }
}

impl<T> Drop for Receiver<T> {
    fn drop(&mut self) {
        let mut st = self.chan.state.lock();
        st.receiver_gone = true;
        st.notify(|s| &s.tx_watch);
        let unread = std::mem::take(&mut st.buffer);
        {
            let (st, wakes) = st.parts();
            st.senders.wake_all(DISCONNECTED, wakes);
        }
        drop(st);
        // Dropped outside the lock: a message's destructor may use this very channel.
        drop(unread);
    }
}

channel_handles!();
