//! The channel core that [`mpsc`](super::mpsc) and [`mpmc`](super::mpmc) are built on: the
//! state behind the internal lock, the message slots on waiters' stacks and the tokens that
//! wake them, the send (waiting or not), a receiver's wait, the disconnections, a select's
//! watchers and offers, and what the handles of both have alike (`channel_handles!`). Each
//! channel module adds its own receiving side on top: `mpsc` its batch and single-receiver
//! fast paths, `mpmc` its count of receivers. It touches nothing outside `sync`.
//!
//! # The state
//! The buffer, the flags and two wait lists share the internal lock:
//! - `receivers` — receivers waiting for a message, in arrival order. Each node points at a
//!   slot on its receiver's stack; a sender that finds one waiting puts the message straight
//!   into the first one's slot and wakes it, bypassing the buffer (receivers only wait while
//!   the buffer is empty, so order is kept).
//! - `senders` — senders of a full bounded channel, in arrival order, each node pointing at
//!   a slot on its sender's stack that holds its message. A receiver that takes a message
//!   and frees a place moves a blocked sender's message into the buffer and wakes that
//!   sender; with bound 0 it takes the message from the first blocked sender directly.
//!
//! Disconnection: the last sender (an atomic count, so cloning takes no lock) wakes every
//! waiting receiver with `DISCONNECTED`; the last receiver drops the buffered messages and
//! wakes every blocked sender with `DISCONNECTED`, each sender's message staying in its slot
//! and coming back in the error. Messages are never dropped under the internal lock.

use super::select::{Offers, RecvOffers, Signal, Watchers};
use super::shim::{AtomicUsize, Ordering, UnsafeCell};
use super::wait_queue::{wait, Guard, Lock, Wait, WaitList};
use crate::dump::WaitOn;
use std::collections::VecDeque;
use std::ptr::NonNull;
use std::sync::mpsc::{RecvTimeoutError, SendError, TrySendError};
use std::time::Instant;

/// Tokens: a waiting receiver got a message in its slot; a blocked sender's message was
/// taken; the other side is gone.
pub(super) const DELIVERED: usize = 1;
pub(super) const TAKEN: usize = 2;
pub(super) const DISCONNECTED: usize = 3;

/// A message slot on a waiter's stack, reachable from its wait-list node.
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
    #[inline]
    pub(super) fn new(cell: &UnsafeCell<Option<T>>) -> Slot<T> {
        Slot(NonNull::from(cell))
    }

    /// # Safety
    /// The slot's node is linked (so the slot is alive) and the channel's lock is held.
    #[inline]
    pub(super) unsafe fn put(self, msg: T) {
        // SAFETY: per the caller; the waiter reads its slot only after it was woken or
        // under the lock, so the lock makes this the only access.
        unsafe { self.0.as_ref().with_mut(|s| *s = Some(msg)) }
    }

    /// # Safety
    /// As for [`Slot::put`].
    #[inline]
    pub(super) unsafe fn take(self) -> T {
        // SAFETY: per the caller.
        let msg = unsafe { self.0.as_ref().with_mut(|s| (*s).take()) };
        msg.expect("a blocked sender's slot holds its message")
    }
}

/// Takes the message out of the caller's own slot.
///
/// # Safety
/// The slot's node is not linked (the wait ended): nobody else can reach the cell.
#[inline]
unsafe fn take_own<T>(slot: &UnsafeCell<Option<T>>) -> Option<T> {
    // SAFETY: per the caller, the cell is ours alone.
    slot.with_mut(|s| unsafe { (*s).take() })
}

/// A channel: its state, and the count of live senders.
pub(super) struct Chan<T> {
    pub(super) state: Lock<State<T>>,
    /// Live `Sender`s and `SyncSender`s.
    senders: AtomicUsize,
    /// `State::bound`, which never changes, readable without the lock.
    bound: Option<usize>,
}

pub(super) struct State<T> {
    pub(super) buffer: VecDeque<T>,
    /// `None`: unbounded.
    pub(super) bound: Option<usize>,
    pub(super) senders_gone: bool,
    pub(super) receivers_gone: bool,
    pub(super) receivers: WaitList<Slot<T>>,
    pub(super) senders: WaitList<Slot<T>>,
    /// Selects waiting to receive, and to send (see `select`).
    pub(super) rx_watch: Watchers,
    pub(super) tx_watch: Watchers,
    /// Sends that waiting selects offer on a rendezvous channel (see `select`).
    pub(super) offers: Offers<T>,
    /// Receives that waiting selects offer on a rendezvous channel (see `select`).
    pub(super) recv_offers: RecvOffers<T>,
}

impl<T> Chan<T> {
    /// A channel with one sender; `bound` `None` is unbounded.
    pub(super) fn new(bound: Option<usize>) -> Chan<T> {
        Chan {
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
                recv_offers: RecvOffers::default(),
            }),
            senders: AtomicUsize::new(1),
            bound,
        }
    }

    /// Sends `msg`. `wait_for`: `None` never waits; `Some(deadline)` waits for room until the
    /// deadline (`Some(None)`: for ever), as `WaitOn::Channel(on)` in dumps. A send that would
    /// have to wait past its deadline (or at all, for `None`) fails as `Full`.
    ///
    /// `#[inline]`, like the rest of the hand-over here (the slots, `deliver`, `wait_message`,
    /// the sender count): the handles that call it are in other modules, which rustc may
    /// compile apart from this one, out of reach of the optimiser without the attribute.
    #[inline]
    pub(super) fn send(
        &self,
        msg: T,
        wait_for: Option<Option<Instant>>,
        on: &'static str,
    ) -> Result<(), TrySendError<T>> {
        crate::coop::spend();
        let mut st = self.state.lock();
        if st.receivers_gone {
            return Err(TrySendError::Disconnected(msg));
        }
        let Some(msg) = deliver(&mut st, msg) else {
            return Ok(());
        };
        // A rendezvous channel whose receiving select waits: complete its receive.
        let msg = if st.bound == Some(0) {
            let (st, wakes) = st.parts();
            match st.recv_offers.fill(msg, wakes) {
                Ok(()) => return Ok(()),
                Err(msg) => msg,
            }
        } else {
            msg
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
            return Err(TrySendError::Full(msg));
        };
        // A blocked sender is a message a select can receive (for a rendezvous channel).
        st.notify(|s| &s.rx_watch);
        let slot = UnsafeCell::new(Some(msg));
        let res = wait(
            st,
            |st| &mut st.senders,
            Slot::new(&slot),
            deadline,
            WaitOn::Channel(on),
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
                Err(TrySendError::Disconnected(msg.expect("not taken")))
            }
            Wait::Woken(t) => unreachable!("sender woken with token {t}"),
            Wait::TimedOut(st) => {
                drop(st);
                // SAFETY: timed out, so the node was removed: the slot is ours alone again.
                let msg = unsafe { take_own(&slot) };
                Err(TrySendError::Full(msg.expect("not taken")))
            }
        }
    }

    /// An unbounded channel's `send`: there is always room, so it never waits (and carries
    /// no code for waiting). Not `#[inline]`, nor is `send_blocking`: a send stays one call to
    /// a function with the whole hand-over inlined, as when each channel had its own.
    pub(super) fn send_unbounded(&self, msg: T) -> Result<(), SendError<T>> {
        match self.send(msg, None, "") {
            Ok(()) => Ok(()),
            Err(TrySendError::Disconnected(m)) => Err(SendError(m)),
            Err(TrySendError::Full(_)) => unreachable!("an unbounded channel is never full"),
        }
    }

    /// A bounded channel's `send`: waits for room (with bound 0, for a receiver) for ever.
    pub(super) fn send_blocking(&self, msg: T, on: &'static str) -> Result<(), SendError<T>> {
        match self.send(msg, Some(None), on) {
            Ok(()) => Ok(()),
            Err(TrySendError::Disconnected(m)) => Err(SendError(m)),
            Err(TrySendError::Full(_)) => unreachable!("a send without deadline"),
        }
    }

    #[inline]
    pub(super) fn add_sender(&self) {
        // Relaxed: like `Arc::clone`, a new sender comes from a live one.
        self.senders.fetch_add(1, Ordering::Relaxed);
    }

    #[inline]
    pub(super) fn drop_sender(&self) {
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

    /// The last receiver is gone: wakes the blocked senders (their messages come back to
    /// them) and drops the unread messages.
    pub(super) fn drop_receivers(&self) {
        let mut st = self.state.lock();
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

    /// Registers (or removes) a waiting select's signal, to receive (`recv`) or to send.
    pub(super) fn watch(&self, recv: bool, s: &std::sync::Arc<Signal>, on: bool) {
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

    /// Whether a send would complete now, with its message or with an error: the receivers
    /// are gone, one waits, there is room, or a waiting select offers its receive.
    pub(super) fn can_send(&self) -> bool {
        if self.bound.is_none() {
            // Unbounded: a send always completes (with an error once the receivers are
            // gone), so no need for the lock.
            return true;
        }
        let st = self.state.lock();
        st.receivers_gone
            || !st.receivers.is_empty()
            || match st.bound {
                None => true,
                Some(0) => st.recv_offers.any_open(),
                Some(bound) => st.buffer.len() < bound && st.senders.is_empty(),
            }
    }

    /// Whether a receive would complete now, with a message or with an error: one is
    /// buffered, a sender is blocked, a waiting select offers its send, or every sender is
    /// gone.
    pub(super) fn can_recv(&self) -> bool {
        let st = self.state.lock();
        !st.buffer.is_empty() || !st.senders.is_empty() || st.offers.any_open() || st.senders_gone
    }

    /// Messages in the buffer: sent and not yet received (a blocked sender's message is not
    /// in it yet).
    pub(super) fn len(&self) -> usize {
        self.state.lock().buffer.len()
    }

    /// The bound, `None` if unbounded.
    pub(super) fn capacity(&self) -> Option<usize> {
        self.bound
    }

    /// Whether this is a rendezvous channel, where a waiting select offers its sends.
    pub(super) fn rendezvous(&self) -> bool {
        self.bound == Some(0)
    }

    /// A waiting select's send on a rendezvous channel (see `select::Offers::offer`).
    pub(super) fn offer(&self, msg: T, s: &std::sync::Arc<Signal>, arm: usize) -> Result<(), T> {
        let mut guard = self.state.lock();
        let (st, wakes) = guard.parts();
        let open = st.bound == Some(0) && !st.receivers_gone && st.receivers.is_empty();
        st.offers.offer(open, &st.rx_watch, wakes, s, arm, msg)
    }

    pub(super) fn withdraw(&self, s: &std::sync::Arc<Signal>, arm: usize) -> Option<T> {
        self.state.lock().offers.withdraw(s, arm)
    }

    /// A waiting select's receive on a rendezvous channel whose senders are alive (see
    /// `select::RecvOffers`); returns whether it was offered.
    pub(super) fn offer_recv(&self, s: &std::sync::Arc<Signal>, arm: usize) -> bool {
        let mut guard = self.state.lock();
        let (st, wakes) = guard.parts();
        if st.bound != Some(0) || st.senders_gone {
            return false;
        }
        st.recv_offers.offer(&st.tx_watch, wakes, s, arm);
        true
    }

    /// A message received by a select that unwinds instead of taking it: to a waiting
    /// receiver, else to the front of the buffer (where a cancelled `recv` puts its own, see
    /// `wait_message`), and the selects waiting to receive hear of it.
    pub(super) fn pass_on(&self, msg: T) {
        let mut st = self.state.lock();
        if let Some(msg) = deliver(&mut st, msg) {
            st.buffer.push_front(msg);
            st.notify(|s| &s.rx_watch);
        }
    }

    /// Takes a select's receive offer back, with the message a sender put in it, if one did.
    pub(super) fn withdraw_recv(&self, s: &std::sync::Arc<Signal>, arm: usize) -> Option<T> {
        self.state.lock().recv_offers.withdraw(s, arm)
    }
}

/// Puts `msg` into the slot of the first waiting receiver and wakes it; gives the message
/// back if no receiver waits.
#[inline]
pub(super) fn deliver<T>(st: &mut Guard<'_, State<T>>, msg: T) -> Option<T> {
    let (st, wakes) = st.parts();
    let Some(slot) = st.receivers.front() else {
        return Some(msg);
    };
    // SAFETY: the receiver's node is linked and we hold the lock.
    unsafe { slot.put(msg) };
    st.receivers.wake_front(DELIVERED, wakes);
    None
}

/// A receiver that found no message waits in `receivers` until a sender delivers one, every
/// sender is gone, or `deadline` passes, as `WaitOn::Channel(on)` in dumps.
///
/// A receiver cancelled just as a message was put into its slot passes the message on,
/// first in line: to the next waiting receiver, else to `put_front` (which keeps it, or gives
/// it back: `mpsc`'s batch of messages taken out of the buffer is ahead of the buffer), else
/// to the front of the buffer; a waiting select or `recv_async` hears of it.
#[inline]
pub(super) fn wait_message<T>(
    st: Guard<'_, State<T>>,
    deadline: Option<Instant>,
    on: &'static str,
    put_front: impl FnOnce(T) -> Option<T>,
) -> Result<T, RecvTimeoutError> {
    let slot = UnsafeCell::new(None);
    let res = wait(
        st,
        |st| &mut st.receivers,
        Slot::new(&slot),
        deadline,
        WaitOn::Channel(on),
        || {},
        |st, token| {
            if token == Some(DELIVERED) {
                // SAFETY: woken, so unlinked; the slot is ours alone.
                if let Some(msg) = unsafe { take_own(&slot) } {
                    if let Some(msg) = deliver(st, msg) {
                        if let Some(msg) = put_front(msg) {
                            st.buffer.push_front(msg);
                        }
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

/// What the handles of the `mpsc` and `mpmc` channels have alike: the senders and their
/// sends (the docs name the receivers as `gone`, which disconnects the channel, and as
/// `taker`, which takes a rendezvous message), the senders' count kept on clone and drop,
/// what a select asks of the handles (watching, a send that never waits, an offer of a send;
/// see `select::Offers`), the receiver's iterators, and `Debug`. Expanded inside each module,
/// where `Chan` (this core, or one that derefs to it), `SEND` (what a blocked send waits on)
/// and `Receiver` (with `recv`, `try_recv` and `iter`) are in scope, along with `Arc`, `fmt`,
/// `Signal`, `SendError` and `TrySendError`.
macro_rules! channel_handles {
    (gone: $gone:literal, taker: $taker:literal) => {
        /// The sending half of a [`channel`]. Clone it for more producers.
        pub struct Sender<T> {
            chan: Arc<Chan<T>>,
        }

        /// The sending half of a [`sync_channel`]. Clone it for more producers.
        pub struct SyncSender<T> {
            chan: Arc<Chan<T>>,
        }

        channel_handles!(@sender Sender);
        channel_handles!(@sender SyncSender);

        impl<T> Sender<T> {
            /// Sends a message; never blocks.
            ///
            /// # Errors
            #[doc = concat!("Gives the message back if ", $gone, " has been dropped.")]
            pub fn send(&self, msg: T) -> Result<(), SendError<T>> {
                self.chan.send_unbounded(msg)
            }

            /// A send for `select!` (never full: the channel is unbounded).
            pub(crate) fn select_try_send(&self, msg: T) -> Result<(), TrySendError<T>> {
                self.chan.send(msg, None, SEND)
            }
        }

        impl<T> SyncSender<T> {
            /// Sends a message, waiting (suspending a fiber, blocking a thread) while the
            #[doc = concat!("channel is full; with bound 0, until ", $taker, " has taken it.")]
            /// Blocked senders go in arrival order.
            ///
            /// # Errors
            #[doc = concat!("Gives the message back if ", $gone, " has been (or gets) dropped.")]
            pub fn send(&self, msg: T) -> Result<(), SendError<T>> {
                self.chan.send_blocking(msg, SEND)
            }

            /// Sends a message only if that needs no waiting.
            ///
            /// # Errors
            /// [`TrySendError::Full`] if there is no room (for bound 0: no receiver waiting),
            #[doc = concat!("[`TrySendError::Disconnected`] if ", $gone, " is gone; both give")]
            /// the message back.
            pub fn try_send(&self, msg: T) -> Result<(), TrySendError<T>> {
                self.chan.send(msg, None, SEND)
            }

            pub(crate) fn select_try_send(&self, msg: T) -> Result<(), TrySendError<T>> {
                self.try_send(msg)
            }
        }

        impl<T> std::panic::UnwindSafe for Receiver<T> {}
        impl<T> std::panic::RefUnwindSafe for Receiver<T> {}

        impl<T> Receiver<T> {
            /// Whether `self` and `other` receive from the same channel.
            pub fn same_channel(&self, other: &Self) -> bool {
                Arc::ptr_eq(&self.chan, &other.chan)
            }

            /// The channel's identity, for `Select`.
            pub(crate) fn select_channel_id(&self) -> *const () {
                Arc::as_ptr(&self.chan).cast()
            }

            /// The bound of a [`sync_channel`], `None` for a [`channel`].
            pub fn capacity(&self) -> Option<usize> {
                self.chan.capacity()
            }

            /// Registers (or removes) a waiting select's signal.
            pub(crate) fn watch(&self, s: &std::sync::Arc<Signal>, on: bool) {
                self.chan.watch(true, s, on);
            }

            /// A waiting select's offer of its receive (see `Chan::offer_recv`).
            pub(crate) fn select_offer_recv(&self, s: &std::sync::Arc<Signal>, arm: usize) -> bool {
                self.chan.offer_recv(s, arm)
            }

            /// A message a cancelled select received: to the next receiver, first in line.
            pub(crate) fn select_pass_on(&self, msg: T) {
                self.chan.pass_on(msg);
            }

            /// Takes a select's receive offer back, with its message if a sender filled it.
            pub(crate) fn select_withdraw_recv(
                &self,
                s: &std::sync::Arc<Signal>,
                arm: usize,
            ) -> Option<T> {
                self.chan.withdraw_recv(s, arm)
            }
        }

        /// Iterator from [`Receiver::iter`]: waits for each message, ends on disconnection.
        #[derive(Debug)]
        pub struct Iter<'a, T: 'a> {
            rx: &'a Receiver<T>,
        }

        /// Iterator from [`Receiver::try_iter`]: yields what is there now, never waits.
        #[derive(Debug)]
        pub struct TryIter<'a, T: 'a> {
            rx: &'a Receiver<T>,
        }

        /// Owning iterator from `Receiver::into_iter`: waits for each message, ends on disconnection.
        #[derive(Debug)]
        pub struct IntoIter<T> {
            rx: Receiver<T>,
        }

        impl<T> Iterator for Iter<'_, T> {
            type Item = T;

            fn next(&mut self) -> Option<T> {
                self.rx.recv().ok()
            }
        }

        impl<T> Iterator for TryIter<'_, T> {
            type Item = T;

            fn next(&mut self) -> Option<T> {
                self.rx.try_recv().ok()
            }
        }

        impl<T> Iterator for IntoIter<T> {
            type Item = T;

            fn next(&mut self) -> Option<T> {
                self.rx.recv().ok()
            }
        }

        impl<'a, T> IntoIterator for &'a Receiver<T> {
            type Item = T;
            type IntoIter = Iter<'a, T>;

            fn into_iter(self) -> Iter<'a, T> {
                self.iter()
            }
        }

        impl<T> IntoIterator for Receiver<T> {
            type Item = T;
            type IntoIter = IntoIter<T>;

            fn into_iter(self) -> IntoIter<T> {
                IntoIter { rx: self }
            }
        }

        impl<T> fmt::Debug for Receiver<T> {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.debug_struct("Receiver").finish_non_exhaustive()
            }
        }
    };
    (@sender $sender:ident) => {
        impl<T> Clone for $sender<T> {
            fn clone(&self) -> $sender<T> {
                self.chan.add_sender();
                $sender {
                    chan: self.chan.clone(),
                }
            }
        }

        impl<T> Drop for $sender<T> {
            fn drop(&mut self) {
                self.chan.drop_sender();
            }
        }

        impl<T> fmt::Debug for $sender<T> {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.debug_struct(stringify!($sender)).finish_non_exhaustive()
            }
        }

        // A panic never leaves a channel half-changed (no lock is held while user code runs):
        // a handle seen after one is usable, as crossbeam's are.
        impl<T> std::panic::UnwindSafe for $sender<T> {}
        impl<T> std::panic::RefUnwindSafe for $sender<T> {}

        impl<T> $sender<T> {
            /// Whether `self` and `other` send to the same channel.
            pub fn same_channel(&self, other: &Self) -> bool {
                Arc::ptr_eq(&self.chan, &other.chan)
            }

            /// The channel's identity, for `Select`.
            pub(crate) fn select_channel_id(&self) -> *const () {
                Arc::as_ptr(&self.chan).cast()
            }

            pub(crate) fn watch(&self, s: &std::sync::Arc<Signal>, on: bool) {
                self.chan.watch(false, s, on);
            }

            /// Whether a send would complete now (see `Chan::can_send`).
            pub(crate) fn select_ready(&self) -> bool {
                self.chan.can_send()
            }

            /// Whether a waiting select offers its sends here (a rendezvous channel).
            pub(crate) fn select_may_offer(&self) -> bool {
                self.chan.rendezvous()
            }

            /// A waiting select's offer of its send (see `Chan::offer`; never made on an
            /// unbounded channel, which is no rendezvous).
            pub(crate) fn select_offer(
                &self,
                msg: T,
                s: &std::sync::Arc<Signal>,
                arm: usize,
            ) -> Result<(), T> {
                self.chan.offer(msg, s, arm)
            }

            /// Takes a select's offer back: `None` if a receiver took it.
            pub(crate) fn select_withdraw(
                &self,
                s: &std::sync::Arc<Signal>,
                arm: usize,
            ) -> Option<T> {
                self.chan.withdraw(s, arm)
            }
        }
    };
}
