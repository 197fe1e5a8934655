//! A broadcast channel with tokio's semantics: every [`Receiver`] sees every message sent
//! after it subscribed, in order; a receiver that falls too far behind is told how many
//! messages it missed ([`RecvError::Lagged`]) instead of holding the senders back.
//!
//! [`channel`] makes a [`Sender`] and a first [`Receiver`]; [`Sender::subscribe`] adds
//! receivers. `recv` waits by suspending the fiber (or blocking the thread) while nothing
//! new is there; `send` never waits.
//!
//! # Differences from tokio's, on purpose
//! - The capacity is exactly what is asked for (tokio rounds it up to a power of two), so
//!   a receiver lags after exactly `capacity` unread messages.
//! - A receiver that holds the last reference to a message moves the value out instead of
//!   cloning it: one clone fewer, so a `Clone` that counts or fails is called less often.
//! - A receive takes up to 16 waiting messages at once (one lock for many): those it has
//!   taken and not yet returned are no longer in the channel, so [`Sender::len`] does not
//!   count them (tokio's does); [`Receiver::len`] does.
//! - [`Sender::closed`] waits like fibra's other calls (suspending a fiber, blocking a
//!   thread) rather than being a future.
//!
//! # Design
//! One ring of `capacity` entries, the position of the next message (`tail`, counting every
//! message ever sent), the handle counts and a wait list of receivers share the internal
//! lock. A message at position `p` lives in entry `p % capacity` until message
//! `p + capacity` overwrites it; each receiver keeps the position it reads next. A receiver
//! whose next position has been overwritten reports `Lagged(missed)` and moves to the oldest
//! message still there (tokio's rule; tokio rounds the capacity up to a power of two, this
//! channel keeps exactly `capacity`).
//!
//! A message is stored once, in a block counting one reference per receiver that will see
//! it, set by `send` to the number of receivers (a plain write: nobody else can see the
//! block yet). The ring's entry holds the references of the receivers that have not taken
//! it yet (`rem`); a receiver takes its own under the lock — moving it out of the entry, no
//! atomic operation — and clones the value after releasing the lock (so a `Clone` impl may
//! use this very channel, and one that panics leaves the channel as it was, minus that
//! receiver's copy). Releasing a reference is one atomic decrement; the last one drops the
//! value, and a receiver holding the only reference left moves the value out without
//! cloning. An `Arc` per message would cost each receiver an increment *and* a decrement on
//! the message's count, two contended operations with receivers on several cores.
//! Overwritten and fully received values, and those a dropped receiver no longer needs, are
//! dropped after the lock is released.
//!
//! A receiver takes up to 16 waiting messages' references per lock and hands them out one
//! per receive before it takes the lock again: with the lock taken for every receive, two
//! of the four atomic read-modify-writes per message and receiver would be the lock's.
//! Lagging stays exactly as if each receive took the lock: before it returns a message it
//! took, a receiver reads how many messages have been sent (an atomic copy of `tail` that
//! `send` stores under the lock), and a message overwritten since it was taken is missed,
//! counted in `Lagged` and dropped, as one still in the ring would have been.
//!
//! A send wakes every waiting receiver; each then takes the lock and reads for itself, so
//! nothing is handed over and a receiver that times out or is cancelled leaves nothing
//! behind. The last sender's drop wakes them all to see the channel closed.

use super::deadline_after;
use super::shim::{Arc, AtomicU64, AtomicUsize, Ordering};
use super::wait_queue::{wait, Lock, Wait, WaitList};
use crate::dump::WaitOn;
use std::collections::VecDeque;
use std::error::Error;
use std::fmt;
use std::ptr::NonNull;
use std::time::{Duration, Instant};

/// Tokens: a message was sent; the last sender is gone. A woken receiver looks for itself.
const SENT: usize = 1;
const CLOSED: usize = 2;

/// The most messages a receiver takes from the ring under one lock.
const TAKE_AT_ONCE: usize = 16;

/// Creates a broadcast channel that retains the last `capacity` messages for slow receivers,
/// and returns its sender and a first receiver.
///
/// ```
/// use fibra::sync::broadcast::{self, RecvError};
///
/// let sched = fibra::Scheduler::builder().threads(2).build()?;
/// sched.start();
/// let (tx, rx) = broadcast::channel::<u32>(16);
/// let receivers: Vec<_> = std::iter::once(rx)
///     .chain((0..3).map(|_| tx.subscribe()))
///     .map(|mut rx| {
///         sched.submit(move || {
///             let mut got = Vec::new();
///             while let Ok(v) = rx.recv() {
///                 got.push(v);
///             }
///             got
///         }, None).unwrap()
///     })
///     .collect();
/// for i in 0..10 {
///     assert_eq!(tx.send(i).unwrap(), 4); // four receivers will see it
/// }
/// drop(tx); // receivers see RecvError::Closed once they have everything
/// for r in receivers {
///     assert_eq!(r.join().unwrap(), (0..10).collect::<Vec<_>>());
/// }
/// sched.stop();
/// # Ok::<(), fibra::Error>(())
/// ```
///
/// # Panics
/// If `capacity` is 0 (as tokio's), or if its ring (allocated at once, a few words per
/// message) cannot be allocated.
pub fn channel<T: Clone>(capacity: usize) -> (Sender<T>, Receiver<T>) {
    assert!(capacity > 0, "broadcast channel capacity cannot be zero");
    let mut ring = Vec::new();
    if ring.try_reserve_exact(capacity).is_err() {
        panic!("broadcast channel capacity {capacity}: cannot allocate its ring");
    }
    ring.extend((0..capacity).map(|_| Entry { rem: 0, msg: None }));
    let chan = Arc::new(Chan {
        state: Lock::new(State {
            ring: ring.into_boxed_slice(),
            tail: 0,
            senders: 1,
            receivers: 1,
            waiters: WaitList::new(),
            closers: WaitList::new(),
        }),
        capacity,
        sent: AtomicU64::new(0),
    });
    (Sender { chan: chan.clone() }, Receiver::new(chan, 0))
}

struct Chan<T> {
    state: Lock<State<T>>,
    /// The ring's length.
    capacity: usize,
    /// `State::tail`, stored by `send` under the lock, read by receivers without it.
    sent: AtomicU64,
}

struct State<T> {
    /// Message `p` lives in `ring[p % ring.len()]` while `tail - ring.len() <= p < tail`.
    ring: Box<[Entry<T>]>,
    /// The position of the next message.
    tail: u64,
    senders: usize,
    receivers: usize,
    /// Receivers waiting for a message.
    waiters: WaitList<()>,
    /// Senders waiting in [`Sender::closed`] for the last receiver to go.
    closers: WaitList<()>,
}

struct Entry<T> {
    /// Receivers yet to take this message: the references to `msg` this entry holds.
    rem: usize,
    /// `None` once `rem` is 0.
    msg: Option<MsgRef<T>>,
}

impl<T> Entry<T> {
    /// Moves one of the entry's references out, for a receiver that takes the message or no
    /// longer needs it (`rem` > 0).
    fn take_ref(&mut self) -> MsgRef<T> {
        self.rem -= 1;
        let msg = self
            .msg
            .as_ref()
            .expect("a message still to be taken has its value");
        // SAFETY: the entry holds `rem + 1` references (before the decrement above) and
        // gives one of them away; `msg` itself goes with the last.
        let r = unsafe { msg.alias() };
        if self.rem == 0 {
            // The last reference: `r` is `msg`'s, and the entry must not release it again.
            std::mem::forget(self.msg.take());
        }
        r
    }
}

impl<T> Drop for Entry<T> {
    /// Releases the references of receivers that never took the message (it was
    /// overwritten, or the channel is gone).
    fn drop(&mut self) {
        if let Some(msg) = self.msg.take() {
            // SAFETY: the entry holds `rem` references, all to be released here: `msg` is
            // one of them and its drop releases it.
            unsafe { msg.release_more(self.rem - 1) };
            drop(msg);
        }
    }
}

/// A message and the number of references to it (see the module docs).
struct Msg<T> {
    refs: AtomicUsize,
    value: T,
}

/// Owns one reference to a [`Msg`]; releasing the last drops the message.
struct MsgRef<T>(NonNull<Msg<T>>);

// SAFETY: a reference lets its owner read the value (`&T`, from any thread, possibly while
// other owners read it on theirs: `T: Sync`) and drop or move it out when it is the last
// (on the owner's thread: `T: Send`) — what `Arc<T>` allows under the same bounds.
unsafe impl<T: Send + Sync> Send for MsgRef<T> {}
// SAFETY: `&MsgRef` only reads the value: `T: Sync`, as for `Arc<T>`.
unsafe impl<T: Send + Sync> Sync for MsgRef<T> {}

impl<T> MsgRef<T> {
    /// Shares a new message: the result owns all of its references (see
    /// [`alias`](Self::alias)).
    fn new(msg: Box<Msg<T>>) -> MsgRef<T> {
        debug_assert!(msg.refs.load(Ordering::Relaxed) > 0);
        MsgRef(NonNull::from(Box::leak(msg)))
    }

    fn msg(&self) -> &Msg<T> {
        // SAFETY: the message lives while a reference to it is unreleased, and `self` is one.
        unsafe { self.0.as_ref() }
    }

    /// Another owner of one of the message's references.
    ///
    /// # Safety
    /// The count includes a reference that nobody else owns, which the result now owns.
    unsafe fn alias(&self) -> MsgRef<T> {
        MsgRef(self.0)
    }

    /// Releases `n` more references, which the caller owns besides `self`'s (so this never
    /// releases the last).
    ///
    /// # Safety
    /// The caller owns those `n` references and uses none of them afterwards.
    unsafe fn release_more(&self, n: usize) {
        if n > 0 {
            // Release: as in `drop`; `self`'s reference keeps the count above zero.
            self.msg().refs.fetch_sub(n, Ordering::Release);
        }
    }

    /// Releases this reference, unless it is the last: that one is given back, for the
    /// caller to drop (with the value) when it may.
    fn release_unless_last(self) -> Option<MsgRef<T>> {
        let refs = &self.msg().refs;
        let mut n = refs.load(Ordering::Relaxed);
        loop {
            if n == 1 {
                return Some(self);
            }
            // Release: as in `drop` (never the last here, so no Acquire is needed).
            match refs.compare_exchange_weak(n, n - 1, Ordering::Release, Ordering::Relaxed) {
                Ok(_) => {
                    std::mem::forget(self);
                    return None;
                }
                Err(now) => n = now,
            }
        }
    }

    /// The value: moved out if this is the only reference left, else cloned (and the
    /// reference released). The reference is released even if `clone` panics.
    fn into_value(self) -> T
    where
        T: Clone,
    {
        // Acquire: every other owner's use of the value (their clones) happened before
        // their release; the count never grows, so 1 means nobody else can reach it.
        if self.msg().refs.load(Ordering::Acquire) == 1 {
            let ptr = self.0;
            std::mem::forget(self);
            // SAFETY: the last reference, ours: the block is ours to free, once.
            return unsafe { Box::from_raw(ptr.as_ptr()) }.value;
        }
        T::clone(&self.msg().value)
    }
}

impl<T> Drop for MsgRef<T> {
    fn drop(&mut self) {
        // AcqRel: Release publishes this owner's reads of the value to whoever drops it;
        // Acquire (for the last) sees every other owner's before dropping.
        if self.msg().refs.fetch_sub(1, Ordering::AcqRel) == 1 {
            // SAFETY: that was the last reference: nobody else can reach the block.
            drop(unsafe { Box::from_raw(self.0.as_ptr()) });
        }
    }
}

/// The sending half of a broadcast [`channel`]. Clone it for more senders; the channel
/// closes when the last one is dropped.
pub struct Sender<T> {
    chan: Arc<Chan<T>>,
}

/// A receiving half of a broadcast [`channel`], made by [`channel`] or
/// [`Sender::subscribe`]. Each receiver sees every message sent after it was made, in
/// order, independently of the others.
///
/// A receive takes up to 16 waiting messages from the channel at once and returns them one
/// at a time: those not yet returned live in the receiver, and are dropped with it if it goes
/// first. Lagging is unchanged: one of them overwritten in the channel meanwhile is reported
/// missed and dropped, as if it had stayed there.
///
/// `Send` and `Sync` when `T` is both: a message is shared by the receivers until each has
/// taken its copy.
pub struct Receiver<T> {
    chan: Arc<Chan<T>>,
    /// The position this receiver takes from the ring next.
    next: u64,
    /// Messages taken from the ring and not yet returned, oldest first: the positions
    /// `next - taken.len()` to `next - 1`.
    taken: VecDeque<MsgRef<T>>,
    /// Taken messages found overwritten and not yet reported in a `Lagged`.
    missed: u64,
}

impl<T> Receiver<T> {
    fn new(chan: Arc<Chan<T>>, next: u64) -> Receiver<T> {
        Receiver {
            chan,
            next,
            taken: VecDeque::new(),
            missed: 0,
        }
    }

    /// Messages sent since this receiver last received and not yet received by it. More
    /// than the channel's capacity means some were overwritten: the next receive reports
    /// [`RecvError::Lagged`].
    pub fn len(&self) -> usize {
        // Acquire: pairs with `send`'s Release of the tail.
        let tail = self.chan.sent.load(Ordering::Acquire);
        let first = self.next - self.taken.len() as u64;
        usize::try_from(tail.saturating_sub(first)).unwrap_or(usize::MAX)
    }

    /// Whether this receiver has received every message sent so far.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// A new receiver of the same channel that sees only the messages sent from now on
    /// (not those this one has yet to receive), as [`Sender::subscribe`] makes.
    pub fn resubscribe(&self) -> Receiver<T> {
        Receiver::at_tail(&self.chan)
    }

    /// A new receiver of `chan` that sees the messages sent from now on.
    fn at_tail(chan: &Arc<Chan<T>>) -> Receiver<T> {
        let mut st = chan.state.lock();
        st.receivers += 1;
        let next = st.tail;
        drop(st);
        Receiver::new(chan.clone(), next)
    }
}

impl<T> Sender<T> {
    /// Sends `value` to every receiver; never waits. The oldest message is overwritten if
    /// the channel is full, and receivers that had not seen it will report
    /// [`RecvError::Lagged`].
    ///
    /// Returns how many receivers will see the message.
    ///
    /// # Errors
    /// Gives the value back if there is no receiver (it may get one later through
    /// [`subscribe`](Sender::subscribe)).
    pub fn send(&self, value: T) -> Result<usize, SendError<T>> {
        crate::coop::spend();
        // Allocated before taking the lock; the count is set under it, before anyone else
        // can see the message.
        let block = Box::new(Msg {
            refs: AtomicUsize::new(0),
            value,
        });
        let mut st = self.chan.state.lock();
        let receivers = st.receivers;
        if receivers == 0 {
            drop(st);
            return Err(SendError(block.value));
        }
        // Relaxed: the lock publishes it with the message.
        block.refs.store(receivers, Ordering::Relaxed);
        let msg = MsgRef::new(block);
        let i = index(st.ring.len() as u64, st.tail);
        let old = std::mem::replace(
            &mut st.ring[i],
            Entry {
                rem: receivers,
                msg: Some(msg),
            },
        );
        st.tail += 1;
        self.chan.sent.store(st.tail, Ordering::Release);
        {
            let (st, wakes) = st.parts();
            st.waiters.wake_all(SENT, wakes);
        }
        drop(st);
        // An overwritten message is dropped outside the lock.
        drop(old);
        Ok(receivers)
    }

    /// A new receiver that sees every message sent from now on.
    pub fn subscribe(&self) -> Receiver<T> {
        Receiver::at_tail(&self.chan)
    }

    /// How many receivers exist now.
    pub fn receiver_count(&self) -> usize {
        self.chan.state.lock().receivers
    }

    /// Messages the channel holds for receivers that have not taken them yet: each stays
    /// until every receiver that existed when it was sent took it, or a later send
    /// overwrote it. Unlike tokio's, a message a receiver has taken (a receive takes up to
    /// 16 waiting messages at once) and not yet returned is not counted: it is no longer in
    /// the channel. [`Receiver::len`] counts it.
    pub fn len(&self) -> usize {
        self.chan
            .state
            .lock()
            .ring
            .iter()
            .filter(|e| e.rem > 0)
            .count()
    }

    /// Whether the channel holds no message any receiver has yet to take.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Whether every receiver is gone (a send would fail, until a
    /// [`subscribe`](Sender::subscribe)).
    pub fn is_closed(&self) -> bool {
        self.chan.state.lock().receivers == 0
    }

    /// Waits until every receiver is gone — suspending a fiber, blocking a thread — and
    /// returns at once if none is left. tokio's is a future; this waits like fibra's other
    /// calls.
    ///
    /// ```
    /// let (tx, rx) = fibra::sync::broadcast::channel::<u8>(4);
    /// let waiter = std::thread::spawn(move || tx.closed());
    /// drop(rx);
    /// waiter.join().unwrap();
    /// ```
    pub fn closed(&self) {
        let st = self.chan.state.lock();
        if st.receivers == 0 {
            return;
        }
        match wait(
            st,
            |st| &mut st.closers,
            (),
            None,
            WaitOn::Channel("broadcast::Sender::closed"),
            || {},
            |_, _| {},
        ) {
            Wait::Woken(_) => {}
            Wait::TimedOut(_) => unreachable!("a wait without deadline"),
        }
    }
}

impl<T: Clone> Sender<T> {
    /// A sender of a new channel with room for `capacity` messages, and no receiver yet
    /// (see [`subscribe`](Sender::subscribe)).
    ///
    /// # Panics
    /// If `capacity` is 0, as [`channel`].
    pub fn new(capacity: usize) -> Sender<T> {
        channel(capacity).0
    }
}

/// The index of position `pos` in a ring of `len` entries.
fn index(len: u64, pos: u64) -> usize {
    // The remainder is below `len`, the length of a slice: it fits a `usize`.
    (pos % len) as usize
}

/// What a receiver found under the lock.
enum Found {
    /// Messages, now in the receiver's `taken`.
    Messages,
    Lagged(u64),
    Nothing,
}

impl<T: Clone> Receiver<T> {
    /// Waits for the next message, suspending a fiber (or blocking a thread) while there is
    /// none.
    ///
    /// If `T::clone` panics, the panic propagates and this receiver skips that message.
    ///
    /// # Errors
    /// [`RecvError::Lagged`]`(n)` if this receiver missed `n` messages, overwritten before it
    /// read them; the next `recv` returns the oldest message still retained.
    /// [`RecvError::Closed`] once every sender is gone and this receiver has seen every
    /// message.
    pub fn recv(&mut self) -> Result<T, RecvError> {
        match self.recv_until(None) {
            Ok(v) => Ok(v),
            Err(RecvTimeoutError::Lagged(n)) => Err(RecvError::Lagged(n)),
            Err(RecvTimeoutError::Closed) => Err(RecvError::Closed),
            Err(RecvTimeoutError::Timeout) => unreachable!("a wait without deadline"),
        }
    }

    /// Takes the next message if one is there; never waits.
    ///
    /// ```
    /// use fibra::sync::broadcast::{self, TryRecvError};
    /// let (tx, mut rx) = broadcast::channel(2);
    /// assert_eq!(rx.try_recv(), Err(TryRecvError::Empty));
    /// for i in 0..3 {
    ///     tx.send(i).unwrap();
    /// }
    /// assert_eq!(rx.try_recv(), Err(TryRecvError::Lagged(1))); // 0 was overwritten
    /// assert_eq!(rx.try_recv(), Ok(1));
    /// assert_eq!(rx.try_recv(), Ok(2));
    /// drop(tx);
    /// assert_eq!(rx.try_recv(), Err(TryRecvError::Closed));
    /// ```
    ///
    /// # Errors
    /// [`TryRecvError::Empty`] if there is no new message, [`TryRecvError::Lagged`] and
    /// [`TryRecvError::Closed`] as for [`recv`](Receiver::recv).
    pub fn try_recv(&mut self) -> Result<T, TryRecvError> {
        crate::coop::spend();
        if let Some(r) = self.next_taken() {
            return r.map_err(TryRecvError::Lagged);
        }
        // Allocates the first time only, and never under the lock.
        self.taken.reserve(TAKE_AT_ONCE);
        let mut st = self.chan.state.lock();
        match take(&mut self.next, &mut self.taken, &mut st) {
            Found::Messages => {
                drop(st);
                Ok(self.pop_taken().expect("just taken"))
            }
            Found::Lagged(n) => Err(TryRecvError::Lagged(n)),
            Found::Nothing if st.senders == 0 => Err(TryRecvError::Closed),
            Found::Nothing => Err(TryRecvError::Empty),
        }
    }

    /// Waits at most `timeout` for the next message. `Duration::MAX` waits for ever.
    ///
    /// ```
    /// use fibra::sync::broadcast::{self, RecvTimeoutError};
    /// use std::time::Duration;
    /// let (tx, mut rx) = broadcast::channel::<u8>(4);
    /// assert_eq!(rx.recv_timeout(Duration::from_millis(5)), Err(RecvTimeoutError::Timeout));
    /// drop(tx);
    /// assert_eq!(rx.recv_timeout(Duration::from_millis(5)), Err(RecvTimeoutError::Closed));
    /// ```
    ///
    /// # Errors
    /// [`RecvTimeoutError::Timeout`] if the time ran out; `Lagged` and `Closed` as for
    /// [`recv`](Receiver::recv).
    pub fn recv_timeout(&mut self, timeout: Duration) -> Result<T, RecvTimeoutError> {
        self.recv_until(deadline_after(timeout))
    }

    fn recv_until(&mut self, deadline: Option<Instant>) -> Result<T, RecvTimeoutError> {
        crate::coop::spend();
        if let Some(r) = self.next_taken() {
            return r.map_err(RecvTimeoutError::Lagged);
        }
        // Allocates the first time only, and never under the lock.
        self.taken.reserve(TAKE_AT_ONCE);
        let mut st = self.chan.state.lock();
        loop {
            match take(&mut self.next, &mut self.taken, &mut st) {
                Found::Messages => {
                    drop(st);
                    return Ok(self.pop_taken().expect("just taken"));
                }
                Found::Lagged(n) => return Err(RecvTimeoutError::Lagged(n)),
                Found::Nothing if st.senders == 0 => return Err(RecvTimeoutError::Closed),
                Found::Nothing => {}
            }
            // Nothing is handed to a waiter, so a cancelled one has nothing to pass on.
            match wait(
                st,
                |st| &mut st.waiters,
                (),
                deadline,
                WaitOn::Channel("broadcast::Receiver::recv"),
                || {},
                |_, _| {},
            ) {
                Wait::Woken(SENT | CLOSED) => st = self.chan.state.lock(),
                Wait::Woken(t) => unreachable!("broadcast receiver woken with token {t}"),
                // Every send and the close wake all waiters: not woken means nothing new.
                Wait::TimedOut(_) => return Err(RecvTimeoutError::Timeout),
            }
        }
    }
}

impl<T: Clone> Receiver<T> {
    /// The oldest message taken and not yet returned, without the lock, or `Err(missed)` if
    /// messages it took have been overwritten since: those are dropped, and if they were all
    /// it had taken, `next` moves to the oldest message still in the ring. Each is counted in
    /// `missed` before it is dropped, so a `Drop` that panics loses no count: the next
    /// receive reports it. Else as [`pop_taken`](Self::pop_taken).
    fn next_taken(&mut self) -> Option<Result<T, u64>> {
        if !self.taken.is_empty() {
            let len = self.chan.capacity as u64;
            let oldest = self.chan.sent.load(Ordering::Acquire).saturating_sub(len);
            while !self.taken.is_empty() && self.next - (self.taken.len() as u64) < oldest {
                let gone = self.taken.pop_front();
                self.missed += 1;
                drop(gone);
            }
            if self.taken.is_empty() && self.next < oldest {
                self.missed += oldest - self.next;
                self.next = oldest;
            }
        }
        if self.missed > 0 {
            return Some(Err(std::mem::take(&mut self.missed)));
        }
        self.pop_taken().map(Ok)
    }

    /// The oldest message taken, without the lag check: moved out if nobody else holds it
    /// any more, else cloned. Removed before it is cloned, so a panicking `Clone` skips it.
    fn pop_taken(&mut self) -> Option<T> {
        Some(self.taken.pop_front()?.into_value())
    }
}

/// Under the lock: moves up to [`TAKE_AT_ONCE`] messages from a receiver's position `next`
/// on into its `taken` (empty on entry), or says how many it missed; moves `next` on.
fn take<T>(next: &mut u64, taken: &mut VecDeque<MsgRef<T>>, st: &mut State<T>) -> Found {
    debug_assert!(taken.is_empty());
    if *next == st.tail {
        return Found::Nothing;
    }
    let len = st.ring.len() as u64;
    let oldest = st.tail.saturating_sub(len);
    if *next < oldest {
        let missed = oldest - *next;
        *next = oldest;
        return Found::Lagged(missed);
    }
    // At most `len` messages are retained, and `len` is a slice's length: fits a `usize`.
    let waiting = (st.tail - *next) as usize;
    for _ in 0..waiting.min(TAKE_AT_ONCE) {
        let entry = &mut st.ring[index(len, *next)];
        *next += 1;
        taken.push_back(entry.take_ref());
    }
    Found::Messages
}

impl<T> Clone for Sender<T> {
    fn clone(&self) -> Sender<T> {
        self.chan.state.lock().senders += 1;
        Sender {
            chan: self.chan.clone(),
        }
    }
}

impl<T> Drop for Sender<T> {
    fn drop(&mut self) {
        let mut st = self.chan.state.lock();
        st.senders -= 1;
        if st.senders == 0 {
            let (st, wakes) = st.parts();
            st.waiters.wake_all(CLOSED, wakes);
        }
    }
}

impl<T> Drop for Receiver<T> {
    fn drop(&mut self) {
        let mut st = self.chan.state.lock();
        st.receivers -= 1;
        if st.receivers == 0 {
            let (st, wakes) = st.parts();
            st.closers.wake_all(CLOSED, wakes);
        }
        // This receiver no longer counts for the messages it has not seen.
        let len = st.ring.len() as u64;
        let start = self.next.max(st.tail.saturating_sub(len));
        let mut unneeded = Vec::new();
        for pos in start..st.tail {
            let r = st.ring[index(len, pos)].take_ref();
            // Only a last reference needs dropping outside the lock (it drops the value).
            unneeded.extend(r.release_unless_last());
        }
        drop(st);
        // Dropped outside the lock: a message's destructor may use this very channel, or
        // panic.
        drop(unneeded);
    }
}

/// The error of [`Sender::send`] when there is no receiver; the value comes back.
#[derive(PartialEq, Eq, Clone, Copy)]
pub struct SendError<T>(pub T);

impl<T> fmt::Debug for SendError<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SendError").finish_non_exhaustive()
    }
}

impl<T> fmt::Display for SendError<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("channel closed")
    }
}

impl<T> Error for SendError<T> {}

/// The error of [`Receiver::recv`].
#[derive(Debug, PartialEq, Eq, Clone, Copy)]
pub enum RecvError {
    /// Every sender is gone and every message has been received.
    Closed,
    /// The receiver missed this many messages, overwritten before it read them; it now
    /// reads from the oldest message retained.
    Lagged(u64),
}

impl fmt::Display for RecvError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RecvError::Closed => f.write_str("channel closed"),
            RecvError::Lagged(n) => write!(f, "channel lagged by {n}"),
        }
    }
}

impl Error for RecvError {}

/// The error of [`Receiver::try_recv`].
#[derive(Debug, PartialEq, Eq, Clone, Copy)]
pub enum TryRecvError {
    /// No new message for now.
    Empty,
    /// Every sender is gone and every message has been received.
    Closed,
    /// The receiver missed this many messages, overwritten before it read them; it now
    /// reads from the oldest message retained.
    Lagged(u64),
}

impl fmt::Display for TryRecvError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TryRecvError::Empty => f.write_str("channel empty"),
            TryRecvError::Closed => f.write_str("channel closed"),
            TryRecvError::Lagged(n) => write!(f, "channel lagged by {n}"),
        }
    }
}

impl Error for TryRecvError {}

/// The error of [`Receiver::recv_timeout`].
#[derive(Debug, PartialEq, Eq, Clone, Copy)]
pub enum RecvTimeoutError {
    /// No new message came before the deadline.
    Timeout,
    /// Every sender is gone and every message has been received.
    Closed,
    /// The receiver missed this many messages, overwritten before it read them; it now
    /// reads from the oldest message retained.
    Lagged(u64),
}

impl fmt::Display for RecvTimeoutError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RecvTimeoutError::Timeout => f.write_str("timed out waiting on channel"),
            RecvTimeoutError::Closed => f.write_str("channel closed"),
            RecvTimeoutError::Lagged(n) => write!(f, "channel lagged by {n}"),
        }
    }
}

impl Error for RecvTimeoutError {}

impl<T> fmt::Debug for Sender<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Sender").finish_non_exhaustive()
    }
}

impl<T> fmt::Debug for Receiver<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Receiver")
            .field("next", &self.next)
            .finish_non_exhaustive()
    }
}
