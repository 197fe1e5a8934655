//! Multi-producer, multi-consumer channels with std's `mpsc` API shape: [`channel`]
//! (unbounded) and [`sync_channel`] (bounded, or a rendezvous with bound 0). Unlike
//! [`mpsc`](super::mpsc), the [`Receiver`] is `Clone` and `Sync`: any number of consumers,
//! fibers or threads, take messages from one channel, each message going to exactly one of
//! them. The error types are std's (the same as [`mpsc`](super::mpsc)'s), plus
//! [`SendTimeoutError`] for [`SyncSender::send_timeout`].
//!
//! # Design
//! The channel is the core in `chan`, shared with [`mpsc`](super::mpsc): the buffer, the
//! flags and two wait lists (waiting receivers, blocked senders) under the internal lock;
//! its docs give the hand-overs. A receiver that takes a message moves blocked senders'
//! messages into the buffer while there is room. What `mpmc` adds is a count of receivers,
//! and a receive that serves any number of them.
//!
//! Nothing is lost at the edges of a wait. A wake that races with a receiver's deadline wins
//! (the wait queue's rule), so the receiver returns the message it was given. A receiving
//! fiber cancelled by [`Scheduler::stop_timeout`](crate::Scheduler::stop_timeout) just as a
//! message was put into its slot passes the message on: to the next waiting receiver, or to
//! the front of the buffer. A sender whose deadline passes gets its message back.
//!
//! Disconnection: the last sender wakes every waiting receiver; the last receiver (an
//! atomic count, as the senders', so cloning takes no lock) drops the buffered messages and
//! wakes every blocked sender, whose message comes back in the error.

use super::chan::{self, wait_message, State, TAKEN};
use super::deadline_after;
use super::select::Signal;
use super::shim::{Arc, AtomicUsize, Ordering};
use super::wait_queue::Guard;
use std::error::Error;
use std::fmt;
use std::ops::Deref;
use std::time::{Duration, Instant};

pub use super::mpsc::{RecvError, RecvTimeoutError, SendError, TryRecvError, TrySendError};

/// What a blocked send and a waiting receive wait on, as dumps show it (`WaitOn::Channel`).
const SEND: &str = "mpmc::Sender::send";
const RECV: &str = "mpmc::Receiver::recv";

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

/// The channel core, and the count of live receivers that only an `mpmc` channel has.
struct Chan<T> {
    core: chan::Chan<T>,
    /// Live `Receiver`s.
    receivers: AtomicUsize,
}

impl<T> Deref for Chan<T> {
    type Target = chan::Chan<T>;

    #[inline]
    fn deref(&self) -> &chan::Chan<T> {
        &self.core
    }
}

fn new_chan<T>(bound: Option<usize>) -> Arc<Chan<T>> {
    Arc::new(Chan {
        core: chan::Chan::new(bound),
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

/// The receiving half of a [`channel`] or [`sync_channel`]. Clone it (or share it: it is
/// `Sync`) for more consumers; each message is received by exactly one of them, and waiting
/// receivers are served in arrival order.
pub struct Receiver<T> {
    chan: Arc<Chan<T>>,
}

/// How full the channel is, as crossbeam-channel's handles tell it: on each of the three.
macro_rules! occupancy {
    ($handle:ident) => {
        impl<T> $handle<T> {
            /// Messages sent and not yet received (a blocked sender's, on a full channel,
            /// is not counted until it moves in; a rendezvous channel holds none).
            pub fn len(&self) -> usize {
                self.chan.len()
            }

            /// Whether no message waits to be received.
            pub fn is_empty(&self) -> bool {
                self.len() == 0
            }

            /// Whether a send would find no room: a bounded channel holding its bound (a
            /// rendezvous channel always); never for an unbounded one.
            pub fn is_full(&self) -> bool {
                self.chan
                    .capacity()
                    .is_some_and(|bound| self.len() >= bound)
            }
        }
    };
}
occupancy!(Sender);
occupancy!(SyncSender);
occupancy!(Receiver);

impl<T> Sender<T> {
    /// The bound: `None`, as for every [`channel`].
    pub fn capacity(&self) -> Option<usize> {
        None
    }

    /// Sends a message; as [`send`](Sender::send), it never waits (the channel is
    /// unbounded), so it fails only when every receiver is gone. For code written against
    /// crossbeam's `Sender`, which has one type for bounded and unbounded channels.
    ///
    /// # Errors
    /// [`TrySendError::Disconnected`], with the message.
    pub fn try_send(&self, msg: T) -> Result<(), TrySendError<T>> {
        self.chan.send(msg, None, SEND)
    }

    /// [`send`](Sender::send), which never waits; the timeout is never reached.
    ///
    /// # Errors
    /// [`SendTimeoutError::Disconnected`], with the message.
    pub fn send_timeout(&self, msg: T, _timeout: Duration) -> Result<(), SendTimeoutError<T>> {
        self.send(msg)
            .map_err(|e| SendTimeoutError::Disconnected(e.0))
    }
}

impl<T> SyncSender<T> {
    /// The channel's bound (`Some(0)` for a rendezvous).
    pub fn capacity(&self) -> Option<usize> {
        self.chan.capacity()
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
        match self.chan.send(msg, Some(deadline_after(timeout)), SEND) {
            Ok(()) => Ok(()),
            Err(TrySendError::Disconnected(m)) => Err(SendTimeoutError::Disconnected(m)),
            Err(TrySendError::Full(m)) => Err(SendTimeoutError::Timeout(m)),
        }
    }
}

impl<T> Chan<T> {
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
        // A message given to a receiver cancelled meanwhile goes to the front of the buffer.
        wait_message(st, deadline, RECV, Some)
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
}

impl<T> Receiver<T> {
    /// Whether a receive would complete now (see `Chan::can_recv`).
    pub(crate) fn select_ready_to_recv(&self) -> bool {
        self.chan.can_recv()
    }

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

impl<T> Drop for Receiver<T> {
    fn drop(&mut self) {
        // AcqRel: as for the senders' count.
        if self.chan.receivers.fetch_sub(1, Ordering::AcqRel) != 1 {
            return;
        }
        self.chan.drop_receivers();
    }
}

channel_handles!(gone: "every receiver", taker: "a receiver");
