//! Multi-producer, single-consumer channels with std's API: [`channel`] (unbounded) and
//! [`sync_channel`] (bounded, or a rendezvous with bound 0). The error types *are* std's.
//!
//! # Design
//! The channel is the core in `chan`, shared with [`mpmc`](super::mpmc): the buffer, the
//! flags and two wait lists (waiting receivers, blocked senders) under the internal lock;
//! its docs give the hand-overs. Here the receivers' list usually holds one receiver; more
//! only when threads share one [`Receiver`] by reference, which `Sync` allows so that the
//! future of [`Receiver::recv_async`] is `Send`. When the receiver takes a message and frees
//! a place, it moves the first blocked sender's message into the buffer and wakes that
//! sender: the message is sent when the sender wakes, nobody can overtake it.
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
//! switch). The receiver of an unbounded channel also skips what only bounded channels
//! need (blocked senders, a select's sends and offers).

use super::chan::{wait_message, Chan, State, TAKEN};
use super::deadline_after;
use super::select::Signal;
use super::shim::Arc;
use super::wait_queue::Guard;
use std::collections::VecDeque;
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

pub use std::sync::mpsc::{RecvError, RecvTimeoutError, SendError, TryRecvError, TrySendError};

/// What a blocked send and a waiting receive wait on, as dumps show it (`WaitOn::Channel`).
const SEND: &str = "mpsc::SyncSender::send";
const RECV: &str = "mpsc::Receiver::recv";

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
    let chan = Arc::new(Chan::new(None));
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
    let chan = Arc::new(Chan::new(Some(bound)));
    (SyncSender { chan: chan.clone() }, Receiver::new(chan))
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

    /// Runs `f` on the queue. `f` must be a `pop_front`, a `push_front`, a swap or a `len`: it must
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

impl<T> Future for RecvFuture<'_, T> {
    type Output = Result<T, RecvError>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = &mut *self;
        loop {
            if let Some(r) = super::ready(this.rx.try_take()) {
                this.done();
                return Poll::Ready(r);
            }
            match &this.signal {
                Some(s) => {
                    // Watching already; a message that came after the try above fires the
                    // signal, which wakes the waker set here.
                    s.set_waker(cx.waker());
                    if !s.fired() {
                        return Poll::Pending;
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
        self.try_take()
    }

    /// [`try_recv`](Receiver::try_recv) without spending the budget: a future's `poll`
    /// never yields the fiber that polls it.
    fn try_take(&self) -> Result<T, TryRecvError> {
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
    /// Messages sent and not yet received (a blocked sender's, on a full channel, is not
    /// counted until it moves in; a rendezvous channel holds none).
    pub fn len(&self) -> usize {
        let st = self.chan.state.lock();
        // The batch is refilled only under the channel's lock, held here.
        st.buffer.len() + self.batch.with(|b| b.len())
    }

    /// Whether no message waits to be received.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Whether a receive would complete now (see `Chan::can_recv`), the batch included.
    pub(crate) fn select_ready_to_recv(&self) -> bool {
        self.batch.filled.load(std::sync::atomic::Ordering::Relaxed) || self.chan.can_recv()
    }

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
        // A message given to a receiver cancelled meanwhile goes back in front of what came
        // after it: the batch another receiver sharing this one took meanwhile, or the
        // buffer.
        wait_message(st, deadline, RECV, |msg| self.batch.put_front(msg))
    }
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
}

impl<T> Drop for Receiver<T> {
    fn drop(&mut self) {
        self.chan.drop_receivers();
    }
}

channel_handles!(gone: "the receiver", taker: "the receiver");
