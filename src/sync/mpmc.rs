//! Multi-producer, multi-consumer channels with std's `mpsc` API shape: [`channel`]
//! (unbounded) and [`sync_channel`] (bounded, or a rendezvous with bound 0). Unlike
//! [`mpsc`](super::mpsc), the [`Receiver`] is `Clone` and `Sync`: any number of consumers,
//! fibers or threads, take messages from one channel, each message going to exactly one of
//! them. The error types are std's (the same as [`mpsc`](super::mpsc)'s), plus
//! [`SendTimeoutError`] for [`SyncSender::send_timeout`].
//!
//! # Design
//! The buffer, the flags and two wait lists share the internal lock, as in `mpsc`:
//! - `receivers` — receivers waiting for a message, in arrival order. Each node points at a
//!   slot on its receiver's stack; a sender that finds a receiver waiting puts the message
//!   straight into the first one's slot and wakes it (receivers only wait while the buffer
//!   is empty, so order is kept).
//! - `senders` — senders of a full bounded channel, in arrival order, each node pointing at
//!   a slot on its sender's stack that holds its message. A receiver that takes a message
//!   and frees a place moves the first blocked sender's message into the buffer and wakes
//!   that sender; with bound 0 it takes the message from the first blocked sender directly.
//!
//! Nothing is lost at the edges of a wait. A wake that races with a receiver's deadline wins
//! (the wait queue's rule), so the receiver returns the message it was given. A receiving
//! fiber cancelled by [`Scheduler::stop_timeout`](crate::Scheduler::stop_timeout) just as a
//! message was put into its slot passes the message on: to the next waiting receiver, or to
//! the front of the buffer. A sender whose deadline passes gets its message back.
//!
//! Disconnection: the last sender (an atomic count, so cloning takes no lock) wakes every
//! waiting receiver with `DISCONNECTED`; the last receiver drops the buffered messages and
//! wakes every blocked sender with `DISCONNECTED`, each sender's message staying in its slot
//! and coming back in the error. Messages are never dropped under the internal lock.

use super::deadline_after;
use super::mpsc::Slot;
use super::select::{Offers, Signal, Watchers};
use super::shim::{Arc, AtomicUsize, Ordering, UnsafeCell};
use super::wait_queue::{wait, Guard, Lock, Wait, WaitList};
use crate::dump::WaitOn;
use std::collections::VecDeque;
use std::error::Error;
use std::fmt;
use std::time::{Duration, Instant};

pub use super::mpsc::{RecvError, RecvTimeoutError, SendError, TryRecvError, TrySendError};

/// Tokens: a waiting receiver got a message in its slot; a blocked sender's message was
/// taken; the other side is gone.
use super::mpsc::{DELIVERED, DISCONNECTED, TAKEN};

/// The error of [`SyncSender::send_timeout`]: the message comes back in either case. The
/// same as crossbeam-channel's, and as std's `mpsc::SendTimeoutError`, which is not stable
/// yet.
#[derive(PartialEq, Eq, Clone, Copy)]
pub enum SendTimeoutError<T> {
    /// The channel stayed full until the deadline.
    Timeout(T),
    /// Every receiver is gone.
    Disconnected(T),
}

impl<T> SendTimeoutError<T> {
    /// The message that could not be sent.
    pub fn into_inner(self) -> T {
        match self {
            SendTimeoutError::Timeout(m) | SendTimeoutError::Disconnected(m) => m,
        }
    }
}

impl<T> fmt::Debug for SendTimeoutError<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SendTimeoutError::Timeout(..) => f.write_str("Timeout(..)"),
            SendTimeoutError::Disconnected(..) => f.write_str("Disconnected(..)"),
        }
    }
}

impl<T> fmt::Display for SendTimeoutError<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SendTimeoutError::Timeout(..) => f.write_str("timed out waiting on send operation"),
            SendTimeoutError::Disconnected(..) => f.write_str("sending on a closed channel"),
        }
    }
}

impl<T> Error for SendTimeoutError<T> {}

impl<T> From<SendError<T>> for SendTimeoutError<T> {
    fn from(err: SendError<T>) -> SendTimeoutError<T> {
        SendTimeoutError::Disconnected(err.0)
    }
}

/// Takes the message out of the caller's own slot.
///
/// # Safety
/// The slot's node is not linked (the wait ended): nobody else can reach the cell.
unsafe fn take_own<T>(slot: &UnsafeCell<Option<T>>) -> Option<T> {
    // SAFETY: per the caller, the cell is ours alone.
    slot.with_mut(|s| unsafe { (*s).take() })
}

struct Chan<T> {
    state: Lock<State<T>>,
    /// Live `Sender`s and `SyncSender`s.
    senders: AtomicUsize,
    /// Live `Receiver`s.
    receivers: AtomicUsize,
}

struct State<T> {
    buffer: VecDeque<T>,
    /// `None`: unbounded.
    bound: Option<usize>,
    senders_gone: bool,
    receivers_gone: bool,
    receivers: WaitList<Slot<T>>,
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
            receivers_gone: false,
            receivers: WaitList::new(),
            senders: WaitList::new(),
            rx_watch: Watchers::default(),
            tx_watch: Watchers::default(),
            offers: Offers::default(),
        }),
        senders: AtomicUsize::new(1),
        receivers: AtomicUsize::new(1),
    })
}

/// Creates an unbounded multi-consumer channel: `send` never blocks.
///
/// Senders and receivers may be fibers or plain threads, in any mix; a receiving fiber is
/// suspended while the channel is empty. Clone the [`Receiver`] for more consumers: each
/// message goes to exactly one of them.
///
/// ```
/// use fibra::sync::mpmc;
///
/// let sched = fibra::Scheduler::builder().threads(2).build()?;
/// sched.start();
/// let (tx, rx) = mpmc::channel();
/// let consumers: Vec<_> = (0..4)
///     .map(|_| {
///         let rx = rx.clone();
///         sched.submit(move || rx.iter().sum::<u64>(), None).unwrap()
///     })
///     .collect();
/// drop(rx);
/// for i in 0..100u64 {
///     tx.send(i).unwrap();
/// }
/// drop(tx); // the consumers' iterators end when every sender is gone
/// let total: u64 = consumers.into_iter().map(|c| c.join().unwrap()).sum();
/// assert_eq!(total, 4950); // every message received exactly once
/// sched.stop();
/// # Ok::<(), fibra::Error>(())
/// ```
pub fn channel<T>() -> (Sender<T>, Receiver<T>) {
    let chan = new_chan(None);
    (Sender { chan: chan.clone() }, Receiver { chan })
}

/// Creates a bounded multi-consumer channel holding at most `bound` messages: `send` waits
/// while it is full. With `bound` 0 every `send` waits until a receiver takes its message
/// (a rendezvous).
///
/// ```
/// use fibra::sync::mpmc;
///
/// let sched = fibra::Scheduler::builder().threads(1).build()?;
/// sched.start();
/// let (tx, rx) = mpmc::sync_channel(2);
/// let producers: Vec<_> = (0..2)
///     .map(|p| {
///         let tx = tx.clone();
///         sched.submit(move || for i in 0..50 { tx.send(p * 50 + i).unwrap() }, None).unwrap()
///     })
///     .collect();
/// drop(tx);
/// let consumers: Vec<_> = (0..3)
///     .map(|_| {
///         let rx = rx.clone();
///         sched.submit(move || rx.iter().count(), None).unwrap()
///     })
///     .collect();
/// drop(rx);
/// for p in producers {
///     p.join().unwrap();
/// }
/// assert_eq!(consumers.into_iter().map(|c| c.join().unwrap()).sum::<usize>(), 100);
/// sched.stop();
/// # Ok::<(), fibra::Error>(())
/// ```
pub fn sync_channel<T>(bound: usize) -> (SyncSender<T>, Receiver<T>) {
    let chan = new_chan(Some(bound));
    (SyncSender { chan: chan.clone() }, Receiver { chan })
}

/// The sending half of a [`channel`]. Clone it for more producers.
pub struct Sender<T> {
    chan: Arc<Chan<T>>,
}

/// The sending half of a [`sync_channel`]. Clone it for more producers.
pub struct SyncSender<T> {
    chan: Arc<Chan<T>>,
}

/// The receiving half of a [`channel`] or [`sync_channel`]. Clone it (or share it: it is
/// `Sync`) for more consumers; each message is received by exactly one of them, and waiting
/// receivers are served in arrival order.
pub struct Receiver<T> {
    chan: Arc<Chan<T>>,
}

impl<T> Sender<T> {
    /// Sends a message; never blocks.
    ///
    /// # Errors
    /// Gives the message back if every receiver has been dropped.
    pub fn send(&self, msg: T) -> Result<(), SendError<T>> {
        match self.chan.send(msg, Some(None)) {
            Ok(()) => Ok(()),
            Err(SendTimeoutError::Disconnected(m)) => Err(SendError(m)),
            Err(SendTimeoutError::Timeout(_)) => unreachable!("an unbounded send never waits"),
        }
    }
}

impl<T> SyncSender<T> {
    /// Sends a message, waiting (suspending a fiber, blocking a thread) while the channel is
    /// full; with bound 0, until a receiver has taken it. Blocked senders go in arrival
    /// order.
    ///
    /// # Errors
    /// Gives the message back if every receiver has been (or gets) dropped.
    pub fn send(&self, msg: T) -> Result<(), SendError<T>> {
        match self.chan.send(msg, Some(None)) {
            Ok(()) => Ok(()),
            Err(SendTimeoutError::Disconnected(m)) => Err(SendError(m)),
            Err(SendTimeoutError::Timeout(_)) => unreachable!("a send without deadline"),
        }
    }

    /// Sends a message only if that needs no waiting.
    ///
    /// # Errors
    /// [`TrySendError::Full`] if there is no room (for bound 0: no receiver waiting),
    /// [`TrySendError::Disconnected`] if every receiver is gone; both give the message back.
    pub fn try_send(&self, msg: T) -> Result<(), TrySendError<T>> {
        match self.chan.send(msg, None) {
            Ok(()) => Ok(()),
            Err(SendTimeoutError::Disconnected(m)) => Err(TrySendError::Disconnected(m)),
            Err(SendTimeoutError::Timeout(m)) => Err(TrySendError::Full(m)),
        }
    }

    /// Sends a message, waiting at most `timeout` for room (with bound 0: for a receiver).
    /// `Duration::MAX` waits for ever.
    ///
    /// ```
    /// use fibra::sync::mpmc::{self, SendTimeoutError};
    /// use std::time::Duration;
    /// let (tx, rx) = mpmc::sync_channel(1);
    /// tx.send_timeout(1, Duration::from_millis(5)).unwrap();
    /// assert_eq!(tx.send_timeout(2, Duration::from_millis(5)), Err(SendTimeoutError::Timeout(2)));
    /// drop(rx);
    /// assert_eq!(tx.send_timeout(3, Duration::ZERO), Err(SendTimeoutError::Disconnected(3)));
    /// ```
    ///
    /// # Errors
    /// [`SendTimeoutError::Timeout`] if the time ran out, [`SendTimeoutError::Disconnected`]
    /// if every receiver is (or gets) dropped; both give the message back.
    pub fn send_timeout(&self, msg: T, timeout: Duration) -> Result<(), SendTimeoutError<T>> {
        self.chan.send(msg, Some(deadline_after(timeout)))
    }
}

impl<T> Chan<T> {
    /// Sends `msg`. `wait`: `None` never waits; `Some(deadline)` waits for room until the
    /// deadline (`Some(None)`: for ever). A send that would have to wait past its deadline
    /// (or at all, for `None`) fails as `Timeout`.
    fn send(&self, msg: T, wait_for: Option<Option<Instant>>) -> Result<(), SendTimeoutError<T>> {
        crate::coop::spend();
        let mut st = self.state.lock();
        if st.receivers_gone {
            return Err(SendTimeoutError::Disconnected(msg));
        }
        let msg = match deliver(&mut st, msg) {
            None => return Ok(()),
            Some(msg) => msg,
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
        let Some(deadline) = wait_for else {
            return Err(SendTimeoutError::Timeout(msg));
        };
        // A blocked sender is a message a select can receive (for a rendezvous channel).
        st.notify(|s| &s.rx_watch);
        let slot = UnsafeCell::new(Some(msg));
        let res = wait(
            st,
            |st| &mut st.senders,
            Slot::new(&slot),
            deadline,
            WaitOn::Channel("mpmc::Sender::send"),
            || {},
            // A cancelled sender's message (if not taken) stays in its slot and is dropped
            // with it, after the lock is released.
            |_, _| {},
        );
        match res {
            Wait::Woken(TAKEN) => Ok(()),
            Wait::Woken(DISCONNECTED) => {
                // SAFETY: woken, so unlinked: the slot is ours alone again.
                let msg = unsafe { take_own(&slot) };
                Err(SendTimeoutError::Disconnected(msg.expect("not taken")))
            }
            Wait::Woken(t) => unreachable!("sender woken with token {t}"),
            Wait::TimedOut(st) => {
                drop(st);
                // SAFETY: timed out, so the node was removed: the slot is ours alone again.
                let msg = unsafe { take_own(&slot) };
                Err(SendTimeoutError::Timeout(msg.expect("not taken")))
            }
        }
    }

    /// Takes the next message: from the buffer (refilling it from blocked senders while
    /// there is room), or, for a rendezvous channel, straight from the first blocked sender.
    fn take(st: &mut Guard<'_, State<T>>) -> Option<T> {
        let (st, wakes) = st.parts();
        if !st.buffer.is_empty() || !st.senders.is_empty() {
            // Room for a select's send.
            st.tx_watch.notify(wakes);
        }
        match st.buffer.pop_front() {
            Some(msg) => {
                // Unbounded: nobody blocks. A bound of 0 never buffers, except for a message
                // a cancelled receiver put back: then no sender moves in.
                let bound = st.bound.unwrap_or(0);
                while st.buffer.len() < bound {
                    let Some(slot) = st.senders.front() else {
                        break;
                    };
                    // SAFETY: the sender's node is linked and we hold the lock.
                    st.buffer.push_back(unsafe { slot.take() });
                    st.senders.wake_front(TAKEN, wakes);
                }
                Some(msg)
            }
            None => {
                // A rendezvous channel's message: a blocked sender's, else a select's offer.
                let Some(slot) = st.senders.front() else {
                    return st.offers.claim(wakes);
                };
                // SAFETY: as above.
                let msg = unsafe { slot.take() };
                st.senders.wake_front(TAKEN, wakes);
                Some(msg)
            }
        }
    }

    fn recv(&self, deadline: Option<Instant>) -> Result<T, RecvTimeoutError> {
        crate::coop::spend();
        let mut st = self.state.lock();
        if let Some(msg) = Chan::take(&mut st) {
            return Ok(msg);
        }
        if st.senders_gone {
            return Err(RecvTimeoutError::Disconnected);
        }
        // A waiting receiver takes a select's send on a rendezvous channel.
        st.notify(|s| &s.tx_watch);
        let slot = UnsafeCell::new(None);
        let res = wait(
            st,
            |st| &mut st.receivers,
            Slot::new(&slot),
            deadline,
            WaitOn::Channel("mpmc::Receiver::recv"),
            || {},
            |st, token| {
                if token == Some(DELIVERED) {
                    // Cancelled with a message in hand: pass it on, first in line.
                    // SAFETY: woken, so unlinked; the slot is ours alone.
                    if let Some(msg) = unsafe { take_own(&slot) } {
                        if let Some(msg) = deliver(st, msg) {
                            st.buffer.push_front(msg);
                            st.notify(|s| &s.rx_watch);
                        }
                    }
                }
            },
        );
        match res {
            Wait::Woken(DELIVERED) => {
                // SAFETY: woken, so unlinked: the slot is ours alone again.
                let msg = unsafe { take_own(&slot) };
                Ok(msg.expect("a delivered message"))
            }
            Wait::Woken(DISCONNECTED) => Err(RecvTimeoutError::Disconnected),
            Wait::Woken(t) => unreachable!("receiver woken with token {t}"),
            Wait::TimedOut(_) => Err(RecvTimeoutError::Timeout),
        }
    }

    fn try_recv(&self) -> Result<T, TryRecvError> {
        crate::coop::spend();
        let mut st = self.state.lock();
        match Chan::take(&mut st) {
            Some(msg) => Ok(msg),
            None if st.senders_gone => Err(TryRecvError::Disconnected),
            None => Err(TryRecvError::Empty),
        }
    }

    fn add_sender(&self) {
        // Relaxed: like `Arc::clone`, a new handle comes from a live one.
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
            st.receivers.wake_all(DISCONNECTED, wakes);
        }
    }
}

/// Puts `msg` into the slot of the first waiting receiver and wakes it; gives the message
/// back if no receiver waits.
fn deliver<T>(st: &mut Guard<'_, State<T>>, msg: T) -> Option<T> {
    super::mpsc::deliver_to(st, |s| &mut s.receivers, msg)
}

impl<T> Receiver<T> {
    /// Waits for a message, suspending a fiber (or blocking a thread) while the channel is
    /// empty.
    ///
    /// # Errors
    /// [`RecvError`] once the channel is empty and every sender is gone.
    pub fn recv(&self) -> Result<T, RecvError> {
        self.chan.recv(None).map_err(|_| RecvError)
    }

    /// Takes a message if one is there; never waits.
    ///
    /// # Errors
    /// [`TryRecvError::Empty`], or [`TryRecvError::Disconnected`] once the channel is empty
    /// and every sender is gone.
    pub fn try_recv(&self) -> Result<T, TryRecvError> {
        self.chan.try_recv()
    }

    /// Waits at most `timeout` for a message. `Duration::MAX` waits for ever.
    ///
    /// ```
    /// use fibra::sync::mpmc::{self, RecvTimeoutError};
    /// use std::time::Duration;
    /// let (tx, rx) = mpmc::channel::<u8>();
    /// assert_eq!(rx.recv_timeout(Duration::from_millis(5)), Err(RecvTimeoutError::Timeout));
    /// drop(tx);
    /// assert_eq!(rx.recv_timeout(Duration::from_millis(5)), Err(RecvTimeoutError::Disconnected));
    /// ```
    ///
    /// # Errors
    /// [`RecvTimeoutError::Timeout`] if the time ran out, [`RecvTimeoutError::Disconnected`]
    /// once the channel is empty and every sender is gone.
    pub fn recv_timeout(&self, timeout: Duration) -> Result<T, RecvTimeoutError> {
        self.chan.recv(deadline_after(timeout))
    }

    /// An iterator that waits for each message and ends when the channel disconnects.
    pub fn iter(&self) -> Iter<'_, T> {
        Iter { rx: self }
    }

    /// An iterator over the messages already there; never waits.
    pub fn try_iter(&self) -> TryIter<'_, T> {
        TryIter { rx: self }
    }
}

impl<T> Clone for Receiver<T> {
    fn clone(&self) -> Receiver<T> {
        // Relaxed: a new receiver comes from a live one.
        self.chan.receivers.fetch_add(1, Ordering::Relaxed);
        Receiver {
            chan: self.chan.clone(),
        }
    }
}

impl<T> Chan<T> {
    /// A waiting select's send on a rendezvous channel (see `select::Offers::offer`).
    fn offer(&self, msg: T, s: &std::sync::Arc<Signal>, arm: usize) -> Result<(), T> {
        let mut guard = self.state.lock();
        let (st, wakes) = guard.parts();
        let open = st.bound == Some(0) && !st.receivers_gone && st.receivers.is_empty();
        st.offers.offer(open, &st.rx_watch, wakes, s, arm, msg)
    }

    fn withdraw(&self, s: &std::sync::Arc<Signal>, arm: usize) -> Option<T> {
        self.state.lock().offers.withdraw(s, arm)
    }

    fn watch(&self, recv: bool, s: &std::sync::Arc<Signal>, on: bool) {
        let mut st = self.state.lock();
        let list = if recv {
            &mut st.rx_watch
        } else {
            &mut st.tx_watch
        };
        if on {
            list.add(s);
        } else {
            list.remove(s);
        }
    }
}

impl<T> Receiver<T> {
    /// Registers (or removes) a waiting select's signal.
    pub(crate) fn watch(&self, s: &std::sync::Arc<Signal>, on: bool) {
        self.chan.watch(true, s, on);
    }
}

impl<T> Sender<T> {
    pub(crate) fn watch(&self, s: &std::sync::Arc<Signal>, on: bool) {
        self.chan.watch(false, s, on);
    }

    /// A send for `select!` (never full: the channel is unbounded).
    pub(crate) fn select_try_send(&self, msg: T) -> Result<(), TrySendError<T>> {
        self.chan.send(msg, None).map_err(|e| match e {
            SendTimeoutError::Disconnected(m) => TrySendError::Disconnected(m),
            SendTimeoutError::Timeout(m) => TrySendError::Full(m),
        })
    }
}

impl<T> SyncSender<T> {
    pub(crate) fn watch(&self, s: &std::sync::Arc<Signal>, on: bool) {
        self.chan.watch(false, s, on);
    }

    pub(crate) fn select_try_send(&self, msg: T) -> Result<(), TrySendError<T>> {
        self.try_send(msg)
    }
}

impl<T> Drop for Receiver<T> {
    fn drop(&mut self) {
        // AcqRel: as for the senders' count.
        if self.chan.receivers.fetch_sub(1, Ordering::AcqRel) != 1 {
            return;
        }
        let mut st = self.chan.state.lock();
        st.receivers_gone = true;
        st.notify(|s| &s.tx_watch);
        let unread = std::mem::take(&mut st.buffer);
        {
            let (st, wakes) = st.parts();
            st.senders.wake_all(DISCONNECTED, wakes);
        }
        drop(st);
        // Dropped outside the lock: a message's destructor may use this very channel, or
        // panic.
        drop(unread);
    }
}

channel_handles!();
