//! One operation of a select: the [`Op`] the macros and [`Select`](super::Select) drive, the
//! `recv` and `send` arms, and what channels they take ([`SelectRecv`], [`SelectSend`]).

use super::Signal;
use crate::sync::mpsc::{RecvError, SendError, TryRecvError, TrySendError};
use crate::sync::{mpmc, mpsc, CancellationToken};
use std::sync::Arc;

/// One operation of a select, as the macro builds it.
#[doc(hidden)]
pub trait Op {
    /// Completes the operation if that needs no waiting; returns whether it did.
    fn try_complete(&mut self) -> bool;
    fn watch(&self, s: &Arc<Signal>);
    fn unwatch(&self, s: &Arc<Signal>);
    /// While the select waits on `s`, offers the operation to the other side as arm `arm`
    /// (a send or a receive on a rendezvous channel; nothing for the others).
    fn offer(&mut self, _s: &Arc<Signal>, _arm: usize) {}
    /// Takes the offer of arm `arm` back once the select woke; `taken`: the other side
    /// completed it.
    fn withdraw(&mut self, _s: &Arc<Signal>, _arm: usize, _taken: bool) {}
    /// The select unwinds (its fiber was cancelled) after the other side completed this
    /// operation's offer: a received message goes on to the channel's next receiver.
    fn pass_on(&mut self) {}
    /// When the operation becomes possible by the clock alone, if it does.
    fn ready_at(&self) -> Option<std::time::Instant> {
        None
    }
}

/// What `recv(..)` in [`select!`](crate::select) accepts: fibra's [`mpsc::Receiver`],
/// [`mpmc::Receiver`] and [`CancellationToken`] (ready once cancelled, with `Ok(())`).
pub trait SelectRecv: sealed::Sealed {
    /// What a receive yields.
    type Item;
    #[doc(hidden)]
    fn try_recv_now(&self) -> Option<Result<Self::Item, RecvError>>;
    /// Whether a receive would complete now (with an error, if every sender is gone),
    /// without taking anything.
    #[doc(hidden)]
    fn ready_to_recv(&self) -> bool;
    /// What identifies the channel, the same for every handle of it (`Select` checks that a
    /// chosen operation is finished on its own channel).
    #[doc(hidden)]
    fn channel_id(&self) -> *const ();
    #[doc(hidden)]
    fn watch_recv(&self, s: &Arc<Signal>, on: bool);
    /// Offers the receive as arm `arm` of the select waiting on `s`, if this is a
    /// rendezvous channel whose senders are alive; returns whether it did.
    #[doc(hidden)]
    fn offer_recv(&self, _s: &Arc<Signal>, _arm: usize) -> bool {
        false
    }
    /// Takes back the offer of arm `arm` of the select waiting on `s`, with the message a
    /// sender put in it, if one did.
    #[doc(hidden)]
    fn withdraw_recv(&self, _s: &Arc<Signal>, _arm: usize) -> Option<Self::Item> {
        None
    }
    /// Hands a received message that nobody will take here to the channel's next
    /// receiver, first in line.
    #[doc(hidden)]
    fn pass_on(&self, _msg: Self::Item) {}
    /// When a receive becomes possible by the clock alone (`after`, `tick`): a waiting
    /// select parks no longer than that.
    #[doc(hidden)]
    fn ready_at(&self) -> Option<std::time::Instant> {
        None
    }
}

/// What `send(..)` in [`select!`](crate::select) accepts: the senders of fibra's
/// [`mpsc`] and [`mpmc`] channels.
pub trait SelectSend: sealed::Sealed {
    /// What is sent.
    type Item;
    /// `Err(msg)` if sending would wait.
    #[doc(hidden)]
    fn try_send_now(
        &self,
        msg: Self::Item,
    ) -> Result<Result<(), SendError<Self::Item>>, Self::Item>;
    #[doc(hidden)]
    fn watch_send(&self, s: &Arc<Signal>, on: bool);
    /// Whether a send could complete now (with an error, if the receivers are gone).
    #[doc(hidden)]
    fn ready_to_send(&self) -> bool;
    /// Whether a waiting select may offer a send here (a rendezvous channel).
    #[doc(hidden)]
    fn may_offer(&self) -> bool;
    /// A send that waits for room if it must (for `Select`'s selected operation).
    #[doc(hidden)]
    fn send_waiting(&self, msg: Self::Item) -> Result<(), SendError<Self::Item>>;
    /// What identifies the channel (see `SelectRecv::channel_id`).
    #[doc(hidden)]
    fn channel_id(&self) -> *const ();
    /// Offers `msg` as arm `arm` of the select waiting on `s`, if this is a rendezvous
    /// channel with its receiver alive and none blocked in `recv`; else gives it back.
    #[doc(hidden)]
    fn offer_send(&self, msg: Self::Item, s: &Arc<Signal>, arm: usize) -> Result<(), Self::Item>;
    /// Takes back the offer of arm `arm` of the select waiting on `s`; `None` if a
    /// receiver took it.
    #[doc(hidden)]
    fn withdraw_send(&self, s: &Arc<Signal>, arm: usize) -> Option<Self::Item>;
}

/// The [`Op`] methods a wrapper forwards to its `op` field as they are: `watch`, `unwatch`,
/// `withdraw`, `pass_on` and `ready_at` (each wrapper writes `try_complete` and `offer`).
macro_rules! forward_op {
    () => {
        fn watch(&self, s: &Arc<Signal>) {
            self.op.watch(s);
        }
        fn unwatch(&self, s: &Arc<Signal>) {
            self.op.unwatch(s);
        }
        fn withdraw(&mut self, s: &Arc<Signal>, arm: usize, taken: bool) {
            self.op.withdraw(s, arm, taken);
        }
        fn pass_on(&mut self) {
            self.op.pass_on();
        }
        fn ready_at(&self) -> Option<std::time::Instant> {
            self.op.ready_at()
        }
    };
}
pub(super) use forward_op;

/// The channel a `recv(..)` arm names, reached by method-call auto-deref (`&r`, `Arc`,
/// `Box`): the macros call this, with the trait in scope.
#[doc(hidden)]
pub trait SelectRecvRef: SelectRecv {
    fn __fibra_select_recv(&self) -> &Self {
        self
    }
}
impl<R: SelectRecv> SelectRecvRef for R {}

/// The channel a `send(..)` arm names, as [`SelectRecvRef`].
#[doc(hidden)]
pub trait SelectSendRef: SelectSend {
    fn __fibra_select_send(&self) -> &Self {
        self
    }
}
impl<S: SelectSend> SelectSendRef for S {}

pub(crate) mod sealed {
    pub trait Sealed {}
}

/// A `recv(r)` arm.
#[doc(hidden)]
pub struct RecvOp<'a, R: SelectRecv> {
    r: &'a R,
    out: Option<Result<R::Item, RecvError>>,
    /// The receive is offered on the channel (see `RecvOffers`).
    offered: bool,
}

impl<'a, R: SelectRecv> RecvOp<'a, R> {
    pub fn new(r: &'a R) -> Self {
        RecvOp {
            r,
            out: None,
            offered: false,
        }
    }

    /// The receiver.
    pub(super) fn channel(&self) -> &'a R {
        self.r
    }

    /// The result of the completed receive.
    pub fn take(&mut self) -> Result<R::Item, RecvError> {
        self.out.take().expect("the selected receive completed")
    }
}

impl<R: SelectRecv> Op for RecvOp<'_, R> {
    fn try_complete(&mut self) -> bool {
        self.out = self.r.try_recv_now();
        self.out.is_some()
    }
    fn watch(&self, s: &Arc<Signal>) {
        self.r.watch_recv(s, true);
    }
    fn unwatch(&self, s: &Arc<Signal>) {
        self.r.watch_recv(s, false);
    }
    fn offer(&mut self, s: &Arc<Signal>, arm: usize) {
        self.offered = self.r.offer_recv(s, arm);
    }
    fn withdraw(&mut self, s: &Arc<Signal>, arm: usize, taken: bool) {
        if !std::mem::take(&mut self.offered) {
            return;
        }
        let msg = self.r.withdraw_recv(s, arm);
        if taken {
            let msg = msg.expect("a claimed receive offer holds its message");
            self.out = Some(Ok(msg));
        }
    }
    fn pass_on(&mut self) {
        if let Some(Ok(msg)) = self.out.take() {
            self.r.pass_on(msg);
        }
    }
    fn ready_at(&self) -> Option<std::time::Instant> {
        self.r.ready_at()
    }
}

/// A `send(s, msg)` arm. The message is made (`make` called) only when the send is tried
/// against a channel that can take it now, or offered by a waiting select on a rendezvous
/// channel: a select that completes another operation never evaluates it, as in crossbeam.
#[doc(hidden)]
pub struct SendOp<'a, S: SelectSend, M> {
    s: &'a S,
    make: Option<M>,
    msg: Option<S::Item>,
    out: Option<Result<(), SendError<S::Item>>>,
    /// The message is offered on the channel (see `Offers`).
    offered: bool,
}

impl<'a, S: SelectSend, M: FnOnce() -> S::Item> SendOp<'a, S, M> {
    pub fn new(s: &'a S, make: M) -> Self {
        SendOp {
            s,
            make: Some(make),
            msg: None,
            out: None,
            offered: false,
        }
    }

    /// The result of the completed send.
    pub fn take(&mut self) -> Result<(), SendError<S::Item>> {
        self.out.take().expect("the selected send completed")
    }

    /// The message: made now if it was not yet.
    fn message(&mut self) -> S::Item {
        match self.msg.take() {
            Some(msg) => msg,
            None => (self.make.take().expect("a send's message is made once"))(),
        }
    }
}

impl<S: SelectSend, M: FnOnce() -> S::Item> Op for SendOp<'_, S, M> {
    fn try_complete(&mut self) -> bool {
        if self.msg.is_none() && !self.s.ready_to_send() {
            return false;
        }
        let msg = self.message();
        match self.s.try_send_now(msg) {
            Ok(r) => {
                self.out = Some(r);
                true
            }
            Err(msg) => {
                // Taken meanwhile by another sender: the message is made, and kept.
                self.msg = Some(msg);
                false
            }
        }
    }
    fn watch(&self, s: &Arc<Signal>) {
        self.s.watch_send(s, true);
    }
    fn unwatch(&self, s: &Arc<Signal>) {
        self.s.watch_send(s, false);
    }
    fn offer(&mut self, s: &Arc<Signal>, arm: usize) {
        if !self.s.may_offer() {
            return;
        }
        let msg = self.message();
        match self.s.offer_send(msg, s, arm) {
            Ok(()) => self.offered = true,
            Err(msg) => self.msg = Some(msg),
        }
    }
    fn withdraw(&mut self, s: &Arc<Signal>, arm: usize, taken: bool) {
        if !std::mem::take(&mut self.offered) {
            return;
        }
        if taken {
            self.out = Some(Ok(()));
        } else {
            let msg = self.s.withdraw_send(s, arm);
            self.msg = Some(msg.expect("an offer no receiver took is still there"));
        }
    }
}

macro_rules! select_recv {
    ($($ty:ident)::+) => {
        impl<T> sealed::Sealed for $($ty)::+<T> {}
        impl<T> SelectRecv for $($ty)::+<T> {
            type Item = T;
            fn try_recv_now(&self) -> Option<Result<T, RecvError>> {
                match self.try_recv() {
                    Ok(v) => Some(Ok(v)),
                    Err(TryRecvError::Disconnected) => Some(Err(RecvError)),
                    Err(TryRecvError::Empty) => None,
                }
            }
            fn ready_to_recv(&self) -> bool {
                self.select_ready_to_recv()
            }
            fn channel_id(&self) -> *const () {
                self.select_channel_id()
            }
            fn watch_recv(&self, s: &Arc<Signal>, on: bool) {
                self.watch(s, on);
            }
            fn offer_recv(&self, s: &Arc<Signal>, arm: usize) -> bool {
                self.select_offer_recv(s, arm)
            }
            fn withdraw_recv(&self, s: &Arc<Signal>, arm: usize) -> Option<T> {
                self.select_withdraw_recv(s, arm)
            }
            fn pass_on(&self, msg: T) {
                self.select_pass_on(msg);
            }
        }
    };
}
select_recv!(mpsc::Receiver);
select_recv!(mpmc::Receiver);

impl sealed::Sealed for CancellationToken {}
impl SelectRecv for CancellationToken {
    type Item = ();
    fn try_recv_now(&self) -> Option<Result<(), RecvError>> {
        self.is_cancelled().then_some(Ok(()))
    }
    fn ready_to_recv(&self) -> bool {
        self.is_cancelled()
    }
    fn channel_id(&self) -> *const () {
        self.select_id()
    }
    fn watch_recv(&self, s: &Arc<Signal>, on: bool) {
        self.watch(s, on);
    }
}

macro_rules! select_send {
    ($($ty:ident)::+) => {
        impl<T> sealed::Sealed for $($ty)::+<T> {}
        impl<T> SelectSend for $($ty)::+<T> {
            type Item = T;
            fn try_send_now(&self, msg: T) -> Result<Result<(), SendError<T>>, T> {
                match self.select_try_send(msg) {
                    Ok(()) => Ok(Ok(())),
                    Err(TrySendError::Disconnected(m)) => Ok(Err(SendError(m))),
                    Err(TrySendError::Full(m)) => Err(m),
                }
            }
            fn watch_send(&self, s: &Arc<Signal>, on: bool) {
                self.watch(s, on);
            }
            fn ready_to_send(&self) -> bool {
                self.select_ready()
            }
            fn may_offer(&self) -> bool {
                self.select_may_offer()
            }
            fn send_waiting(&self, msg: T) -> Result<(), SendError<T>> {
                self.send(msg)
            }
            fn channel_id(&self) -> *const () {
                self.select_channel_id()
            }
            fn offer_send(&self, msg: T, s: &Arc<Signal>, arm: usize) -> Result<(), T> {
                self.select_offer(msg, s, arm)
            }
            fn withdraw_send(&self, s: &Arc<Signal>, arm: usize) -> Option<T> {
                self.select_withdraw(s, arm)
            }
        }
    };
}
select_send!(mpsc::Sender);
select_send!(mpsc::SyncSender);
select_send!(mpmc::Sender);
select_send!(mpmc::SyncSender);
