//! [`select!`](crate::select): wait for the first of several channel operations.
//!
//! Each channel keeps, in its locked state, a list of [`Signal`]s of the selects waiting on
//! it, and fires them on every change that can make an operation complete (a message in,
//! a message out, a receiver starting to wait, a side disconnecting). A select tries its
//! operations in an order that starts at a random one; if none completes it registers its
//! signal with every channel, tries once more (a change between the two tries fired the
//! signal, so nothing is missed), and parks until the signal fires or its deadline passes.
//!
//! A send on a rendezvous channel (`sync_channel(0)`) can only complete against a receiver,
//! so a select about to park *offers* it: the message goes into the channel's `Offers`,
//! and a receiver that finds no blocked sender claims it there. Exactly one operation of a
//! select completes: its [`Signal`] carries a claim word that a receiver moves from open to
//! the offering arm, and that the select itself closes when it wakes, before it looks at
//! anything else.

use crate::dump::WaitOn;
use crate::park::{park_until, ParkResult, Unparker};
use crate::sync::mpsc::{RecvError, SendError, TryRecvError, TrySendError};
use crate::sync::wait_queue::{Guard, Wakeups};
use crate::sync::{mpmc, mpsc, CancellationToken};
use std::cell::Cell;
use std::collections::VecDeque;
use std::panic::{catch_unwind, resume_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// What a waiting select is woken through.
#[doc(hidden)]
pub struct Signal {
    fired: AtomicBool,
    waiter: parking_lot::Mutex<Option<Unparker>>,
    /// Who decides which of the select's offered operations completes: `OPEN` while it
    /// waits, `k + 1` once a receiver took the message offered by arm `k`, `CLOSED` once
    /// the select woke and took the decision back (see [`Offers`]).
    claim: super::shim::AtomicUsize,
}

/// [`Signal::claim`]: no decision yet.
const OPEN: usize = 0;
/// [`Signal::claim`]: the select decides by itself.
const CLOSED: usize = usize::MAX;

impl Signal {
    pub(crate) fn new() -> Arc<Signal> {
        Arc::new(Signal {
            fired: AtomicBool::new(false),
            waiter: parking_lot::Mutex::new(None),
            claim: super::shim::AtomicUsize::new(OPEN),
        })
    }

    /// A receiver completes the offered send of arm `arm`, if the select has not decided.
    fn claim_for(&self, arm: usize) -> bool {
        // AcqRel/Acquire: one winner between the receivers and the select's `close`; the
        // message itself moves under the channel's lock, which the select takes to withdraw.
        self.claim
            .compare_exchange(OPEN, arm + 1, Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
    }

    /// The select takes the decision back; returns the arm a receiver claimed, if one did.
    pub(crate) fn close(&self) -> Option<usize> {
        match self
            .claim
            .compare_exchange(OPEN, CLOSED, Ordering::AcqRel, Ordering::Acquire)
        {
            Ok(_) | Err(CLOSED) => None,
            Err(k) => Some(k - 1),
        }
    }

    /// Marks the signal fired and takes its waiter's unparker out. The waiter is unparked
    /// by the caller, with no lock held: unparking a waker runs foreign code, which may drop
    /// the very future that waits (and with it its registration, which takes the channel's
    /// lock) or poll it again (which takes `waiter`).
    fn take_waiter(&self) -> Option<Unparker> {
        self.fired.store(true, Ordering::Release);
        self.waiter.lock().take()
    }

    /// Fires the signal and wakes its waiter now (no lock may be held).
    fn fire(&self) {
        let waiter = self.take_waiter();
        if let Some(u) = waiter {
            u.unpark_owned();
        }
    }

    /// Fires the signal under a primitive's lock: its waiter is woken by the guard, after
    /// the lock is released.
    pub(crate) fn fire_into(&self, wakes: &mut Wakeups) {
        if let Some(u) = self.take_waiter() {
            #[cfg(not(loom))]
            wakes.push(u);
            // Under loom the guards collect the model's unparkers, and a select's waiter is
            // a real one (no loom model parks a select): it is woken at once.
            #[cfg(loom)]
            {
                let _ = wakes;
                u.unpark_owned();
            }
        }
    }

    /// Whether it fired since the last reset.
    pub(crate) fn fired(&self) -> bool {
        self.fired.load(Ordering::Acquire)
    }

    /// Forgets a firing that was seen: the next [`park`](Signal::park) waits for a new one.
    pub(crate) fn reset(&self) {
        self.fired.store(false, Ordering::Relaxed);
    }

    /// Parks until the signal fires (at once if it fired since the last reset), or until
    /// `deadline`. `on` is what a fiber dump shows the waiter waiting for.
    pub(crate) fn park(&self, deadline: Option<Instant>, on: WaitOn) -> ParkResult {
        park_until(deadline, on, |u| {
            let mut w = self.waiter.lock();
            if self.fired.load(Ordering::Acquire) {
                drop(w);
                u.unpark_owned();
            } else {
                *w = Some(u);
            }
        })
    }

    /// Makes the next firing wake `waker`'s task (an async waiter instead of a parked one).
    pub(crate) fn set_waker(&self, waker: &std::task::Waker) {
        *self.waiter.lock() = Some(Unparker::from_waker(waker.clone()));
    }
}

/// A signal is a waker too: `crate::future::block_on` polls with one, and a wake from any
/// thread fires it (no allocation: the waker is this `Arc`).
impl std::task::Wake for Signal {
    fn wake(self: Arc<Self>) {
        self.fire();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        self.fire();
    }
}

/// The selects waiting on one side of a channel; lives in the channel's locked state.
#[derive(Default)]
pub(crate) struct Watchers(Vec<Arc<Signal>>);

impl Watchers {
    /// Something changed that may let a waiting select's operation complete: fires every
    /// watcher; they are woken after the lock is released (`wakes` is the guard's).
    #[inline]
    pub(crate) fn notify(&self, wakes: &mut Wakeups) {
        if !self.0.is_empty() {
            self.notify_all(None, wakes);
        }
    }

    /// [`notify`](Watchers::notify) but for `me`: a select's own offer must not wake
    /// itself (it would find nothing new, offer again, and spin).
    #[inline]
    pub(crate) fn notify_except(&self, me: &Arc<Signal>, wakes: &mut Wakeups) {
        if !self.0.is_empty() {
            self.notify_all(Some(me), wakes);
        }
    }

    #[cold]
    fn notify_all(&self, except: Option<&Arc<Signal>>, wakes: &mut Wakeups) {
        for s in &self.0 {
            if !except.is_some_and(|me| Arc::ptr_eq(me, s)) {
                s.fire_into(wakes);
            }
        }
    }

    pub(crate) fn add(&mut self, s: &Arc<Signal>) {
        self.0.push(s.clone());
    }

    pub(crate) fn remove(&mut self, s: &Arc<Signal>) {
        if let Some(i) = self.0.iter().position(|w| Arc::ptr_eq(w, s)) {
            self.0.swap_remove(i);
        }
    }
}

// The guard is the wait queue's (`crate::park::wait_queue`), which knows nothing of selects:
// this is the one place where its state meets them.
impl<S> Guard<'_, S> {
    /// Fires the select watchers that `of` picks out of the state; they are woken with the
    /// other wake-ups, after the lock is released.
    #[inline]
    pub(crate) fn notify(&mut self, of: impl FnOnce(&S) -> &Watchers) {
        let (st, wakes) = self.parts();
        of(st).notify(wakes);
    }
}

/// The sends that waiting selects offer on a rendezvous channel; lives in the channel's
/// locked state. A receiver that finds neither a buffered message nor a blocked sender
/// [`claim`](Offers::claim)s the oldest offer whose select has not decided yet; a select
/// that wakes [`withdraw`](Offers::withdraw)s its offer, unless a receiver took it. The
/// message stays here, owned by the channel, while it is offered.
// Boxed on purpose: one word inline instead of a `VecDeque`'s four (see `default`).
#[allow(clippy::box_collection)]
pub(crate) struct Offers<T>(Option<Box<VecDeque<Offer<T>>>>);

struct Offer<T> {
    signal: Arc<Signal>,
    arm: usize,
    msg: T,
}

impl<T> Default for Offers<T> {
    /// No list until the first offer: one word in every channel's state, whose hot fields
    /// share few cache lines (a `VecDeque` inline would spread them over more, and slow down
    /// every receive).
    fn default() -> Self {
        Offers(None)
    }
}

impl<T> Offers<T> {
    /// Offers `msg` for the send of arm `arm` of the select waiting on `signal`, and fires
    /// the receive side's watchers — if `open`: a rendezvous channel whose receivers are
    /// alive and none waits in `recv` (that one fired the select's signal when it began to
    /// wait, and the select's next try delivers to it). Otherwise gives the message back.
    pub(crate) fn offer(
        &mut self,
        open: bool,
        rx_watch: &Watchers,
        wakes: &mut Wakeups,
        signal: &Arc<Signal>,
        arm: usize,
        msg: T,
    ) -> Result<(), T> {
        if !open {
            return Err(msg);
        }
        self.0.get_or_insert_default().push_back(Offer {
            signal: signal.clone(),
            arm,
            msg,
        });
        rx_watch.notify_except(signal, wakes);
        Ok(())
    }

    /// Takes back the offer of arm `arm` of the select waiting on `signal`: `None` if a
    /// receiver took it.
    pub(crate) fn withdraw(&mut self, signal: &Arc<Signal>, arm: usize) -> Option<T> {
        let list = self.0.as_mut()?;
        let i = list
            .iter()
            .position(|o| Arc::ptr_eq(&o.signal, signal) && o.arm == arm)?;
        list.remove(i).map(|o| o.msg)
    }

    /// Takes the message of the oldest offer whose select has not decided yet, completing
    /// that select's send, and wakes the select.
    #[inline]
    pub(crate) fn claim(&mut self, wakes: &mut Wakeups) -> Option<T> {
        match &mut self.0 {
            Some(list) if !list.is_empty() => Self::claim_slow(list, wakes),
            _ => None,
        }
    }

    #[cold]
    fn claim_slow(list: &mut VecDeque<Offer<T>>, wakes: &mut Wakeups) -> Option<T> {
        // A select that closed its claim is awake and withdraws its offer itself.
        let i = list.iter().position(|o| o.signal.claim_for(o.arm))?;
        let o = list.remove(i).expect("the claimed offer is there");
        o.signal.fire_into(wakes);
        Some(o.msg)
    }
}

/// One operation of a select, as the macro builds it.
#[doc(hidden)]
pub trait Op {
    /// Completes the operation if that needs no waiting; returns whether it did.
    fn try_complete(&mut self) -> bool;
    fn watch(&self, s: &Arc<Signal>);
    fn unwatch(&self, s: &Arc<Signal>);
    /// While the select waits on `s`, offers the operation to the other side as arm `arm`
    /// (a send on a rendezvous channel; nothing for the others).
    fn offer(&mut self, _s: &Arc<Signal>, _arm: usize) {}
    /// Takes the offer of arm `arm` back once the select woke; `taken`: a receiver
    /// completed it.
    fn withdraw(&mut self, _s: &Arc<Signal>, _arm: usize, _taken: bool) {}
}

/// What `recv(..)` in [`select!`](crate::select) accepts: fibra's [`mpsc::Receiver`],
/// [`mpmc::Receiver`] and [`CancellationToken`] (ready once cancelled, with `Ok(())`).
pub trait SelectRecv: sealed::Sealed {
    /// What a receive yields.
    type Item;
    #[doc(hidden)]
    fn try_recv_now(&self) -> Option<Result<Self::Item, RecvError>>;
    #[doc(hidden)]
    fn watch_recv(&self, s: &Arc<Signal>, on: bool);
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
    /// Offers `msg` as arm `arm` of the select waiting on `s`, if this is a rendezvous
    /// channel with its receiver alive and none blocked in `recv`; else gives it back.
    #[doc(hidden)]
    fn offer_send(&self, msg: Self::Item, s: &Arc<Signal>, arm: usize) -> Result<(), Self::Item>;
    /// Takes back the offer of arm `arm` of the select waiting on `s`; `None` if a
    /// receiver took it.
    #[doc(hidden)]
    fn withdraw_send(&self, s: &Arc<Signal>, arm: usize) -> Option<Self::Item>;
}

mod sealed {
    pub trait Sealed {}
}

/// A `recv(r)` arm.
#[doc(hidden)]
pub struct RecvOp<'a, R: SelectRecv> {
    r: &'a R,
    out: Option<Result<R::Item, RecvError>>,
}

impl<'a, R: SelectRecv> RecvOp<'a, R> {
    pub fn new(r: &'a R) -> Self {
        RecvOp { r, out: None }
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
}

/// A `send(s, msg)` arm.
#[doc(hidden)]
pub struct SendOp<'a, S: SelectSend> {
    s: &'a S,
    msg: Option<S::Item>,
    out: Option<Result<(), SendError<S::Item>>>,
    /// The message is offered on the channel (see `Offers`).
    offered: bool,
}

impl<'a, S: SelectSend> SendOp<'a, S> {
    pub fn new(s: &'a S, msg: S::Item) -> Self {
        SendOp {
            s,
            msg: Some(msg),
            out: None,
            offered: false,
        }
    }

    /// The result of the completed send.
    pub fn take(&mut self) -> Result<(), SendError<S::Item>> {
        self.out.take().expect("the selected send completed")
    }
}

impl<S: SelectSend> Op for SendOp<'_, S> {
    fn try_complete(&mut self) -> bool {
        let msg = self.msg.take().expect("a send completes once");
        match self.s.try_send_now(msg) {
            Ok(r) => {
                self.out = Some(r);
                true
            }
            Err(msg) => {
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
        let msg = self
            .msg
            .take()
            .expect("an uncompleted send holds its message");
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

/// How long a select may wait.
#[doc(hidden)]
pub enum Mode {
    /// Until an operation completes.
    Block,
    /// Not at all (`default =>`).
    Now,
    /// At most this long (`default(timeout) =>`).
    For(Duration),
}

thread_local! {
    static RNG: Cell<u32> = const { Cell::new(0x2545_F491) };
}

/// A cheap random start, so that no ready arm is always preferred.
fn random_start(n: usize) -> usize {
    RNG.with(|r| {
        let mut x = r.get();
        x ^= x << 13;
        x ^= x >> 17;
        x ^= x << 5;
        r.set(x);
        x as usize % n
    })
}

/// Runs a select: returns the index of the operation that completed, or `None` when none
/// did in the time `mode` allows.
#[doc(hidden)]
pub fn run(ops: &mut [&mut dyn Op], mode: Mode) -> Option<usize> {
    crate::coop::spend();
    let deadline = match mode {
        Mode::For(d) => Some(crate::sys::deadline_after(d)),
        _ => None,
    };
    let n = ops.len();
    let attempt = |ops: &mut [&mut dyn Op]| -> Option<usize> {
        let start = random_start(n.max(1));
        (0..n)
            .map(|k| (start + k) % n)
            .find(|&i| ops[i].try_complete())
    };
    loop {
        if let Some(i) = attempt(ops) {
            return Some(i);
        }
        if matches!(mode, Mode::Now) || deadline.is_some_and(|d| Instant::now() >= d) {
            return None;
        }
        let signal = Signal::new();
        for op in ops.iter() {
            op.watch(&signal);
        }
        let done = attempt(ops);
        // A cancellation unwinds out of the park: the channels must forget the signal then
        // too, or they would keep it (and fire it) for ever.
        let parked = if done.is_some() {
            Ok(ParkResult::Unparked)
        } else {
            // Nothing is ready: offer the rendezvous sends (a change since the try above
            // has fired the signal, and the park returns at once).
            for (i, op) in ops.iter_mut().enumerate() {
                op.offer(&signal, i);
            }
            catch_unwind(AssertUnwindSafe(|| {
                signal.park(deadline, WaitOn::Channel("select"))
            }))
        };
        // From here on the select decides: a receiver that took an offer before this
        // completed that arm, and no other arm may complete.
        let claimed = signal.close();
        for (i, op) in ops.iter_mut().enumerate() {
            op.withdraw(&signal, i, claimed == Some(i));
        }
        for op in ops.iter() {
            op.unwatch(&signal);
        }
        let parked = parked.unwrap_or_else(|unwind| resume_unwind(unwind));
        if claimed.is_some() {
            return claimed;
        }
        if done.is_some() {
            return done;
        }
        if parked == ParkResult::TimedOut {
            // One last look: a change may have come with the deadline.
            return attempt(ops);
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
            fn watch_recv(&self, s: &Arc<Signal>, on: bool) {
                self.watch(s, on);
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

/// A select over a set of operations built at run time — any number of them, each with
/// the closure that handles its result; [`select!`](crate::select) is the fixed-set form.
///
/// [`wait`](Select::wait) completes exactly one operation (chosen at random among the ready
/// ones), runs its closure and returns what it returns.
///
/// ```
/// use fibra::sync::{mpsc, Select};
///
/// let channels: Vec<_> = (0..5).map(|_| mpsc::channel::<u32>()).collect();
/// channels[3].0.send(30).unwrap();
/// let mut sel = Select::new();
/// for (i, (_, rx)) in channels.iter().enumerate() {
///     sel.recv(rx, move |msg| (i, msg.unwrap()));
/// }
/// assert_eq!(sel.wait(), (3, 30));
/// ```
pub struct Select<'a, R> {
    arms: Vec<Box<dyn Arm<R> + 'a>>,
}

/// An operation with the closure for its result.
trait Arm<R>: Op {
    fn finish(&mut self) -> R;
}

struct RecvArm<'a, Rx: SelectRecv, F> {
    op: RecvOp<'a, Rx>,
    f: Option<F>,
}

struct SendArm<'a, Tx: SelectSend, F> {
    op: SendOp<'a, Tx>,
    f: Option<F>,
}

macro_rules! delegate_op {
    ($arm:ident, $bound:ident, $out:ty) => {
        impl<Ch: $bound, F> Op for $arm<'_, Ch, F> {
            fn try_complete(&mut self) -> bool {
                self.op.try_complete()
            }
            fn watch(&self, s: &Arc<Signal>) {
                self.op.watch(s);
            }
            fn unwatch(&self, s: &Arc<Signal>) {
                self.op.unwatch(s);
            }
            fn offer(&mut self, s: &Arc<Signal>, arm: usize) {
                self.op.offer(s, arm);
            }
            fn withdraw(&mut self, s: &Arc<Signal>, arm: usize, taken: bool) {
                self.op.withdraw(s, arm, taken);
            }
        }
        impl<Ch: $bound, F: FnOnce($out) -> R, R> Arm<R> for $arm<'_, Ch, F> {
            fn finish(&mut self) -> R {
                let f = self.f.take().expect("an arm finishes once");
                f(self.op.take())
            }
        }
    };
}
delegate_op!(RecvArm, SelectRecv, Result<Ch::Item, RecvError>);
delegate_op!(SendArm, SelectSend, Result<(), SendError<Ch::Item>>);

impl<R> Default for Select<'_, R> {
    fn default() -> Self {
        Select::new()
    }
}

impl<'a, R> Select<'a, R> {
    /// No operations yet.
    pub fn new() -> Self {
        Select { arms: Vec::new() }
    }

    /// Adds a receive from `r`; `f` gets its result if it is the one completed.
    pub fn recv<Rx: SelectRecv>(
        &mut self,
        r: &'a Rx,
        f: impl FnOnce(Result<Rx::Item, RecvError>) -> R + 'a,
    ) -> &mut Self {
        self.arms.push(Box::new(RecvArm {
            op: RecvOp::new(r),
            f: Some(f),
        }));
        self
    }

    /// Adds a send of `msg` on `s`; `f` gets its result if it is the one completed (the
    /// message is dropped otherwise).
    pub fn send<Tx: SelectSend>(
        &mut self,
        s: &'a Tx,
        msg: Tx::Item,
        f: impl FnOnce(Result<(), SendError<Tx::Item>>) -> R + 'a,
    ) -> &mut Self {
        self.arms.push(Box::new(SendArm {
            op: SendOp::new(s, msg),
            f: Some(f),
        }));
        self
    }

    /// How many operations were added.
    pub fn len(&self) -> usize {
        self.arms.len()
    }

    /// Whether no operation was added.
    pub fn is_empty(&self) -> bool {
        self.arms.is_empty()
    }

    /// Waits until one operation completes and returns what its closure returns.
    ///
    /// # Panics
    /// With no operations (it would wait for ever).
    pub fn wait(self) -> R {
        assert!(!self.is_empty(), "Select::wait with no operations");
        self.finish(Mode::Block)
            .expect("a blocking select completes an operation")
    }

    /// Waits at most `timeout`; `None` if no operation completed in time.
    pub fn wait_timeout(self, timeout: Duration) -> Option<R> {
        self.finish(Mode::For(timeout))
    }

    /// Completes an operation only if one can complete now.
    pub fn try_wait(self) -> Option<R> {
        self.finish(Mode::Now)
    }

    fn finish(mut self, mode: Mode) -> Option<R> {
        let i = {
            let mut ops: Vec<&mut dyn Op> = self
                .arms
                .iter_mut()
                .map(|a| &mut **a as &mut dyn Op)
                .collect();
            if ops.is_empty() {
                return None;
            }
            run(&mut ops, mode)?
        };
        Some(self.arms[i].finish())
    }
}

impl<R> std::fmt::Debug for Select<'_, R> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Select")
            .field("operations", &self.len())
            .finish()
    }
}

/// Waits for the first of several channel operations to complete and runs its arm, with
/// crossbeam-channel's syntax:
///
/// ```text
/// select! {
///     recv(rx) -> msg => { … },        // msg: Result<T, RecvError>
///     send(tx, value) -> res => { … }, // res: Result<(), SendError<T>>
///     default => { … },                // none is ready now (optional)
///     default(timeout) => { … },       // none got ready within timeout (instead)
/// }
/// ```
///
/// `recv` takes a fibra [`mpsc::Receiver`](crate::sync::mpsc::Receiver),
/// [`mpmc::Receiver`](crate::sync::mpmc::Receiver) or
/// [`CancellationToken`](crate::sync::CancellationToken) (ready once cancelled, with
/// `Ok(())`); `send` an `mpsc` or `mpmc` `Sender` or `SyncSender`. A receive from a channel
/// whose senders are all gone, and a send to one whose receivers are gone, complete at once
/// with an error, as in crossbeam. Each channel and message expression is evaluated once,
/// before waiting; a send that is not selected drops its message.
///
/// Without `default` the select waits — suspending a fiber, blocking a plain thread — until
/// one operation completes. When several are ready, one is chosen at random, so none
/// starves. Exactly one operation completes. Arm bodies run outside any loop of the macro,
/// so `break`, `continue`, `return` and `?` act on the surrounding code. At most 12
/// operations per select.
///
/// On a rendezvous channel (`sync_channel(0)`) a send completes only when a receiver takes
/// the message: a waiting select offers its send there, and a receiver — `recv`,
/// `try_recv`, or another select's `recv` — takes it; selects on the two ends of one such
/// channel meet, as with crossbeam. If a select's offered send and another of its
/// operations become possible together, exactly one of them completes.
///
/// ```
/// use fibra::sync::{mpsc, CancellationToken};
/// use std::time::Duration;
///
/// let sched = fibra::Scheduler::builder().threads(2).build().unwrap();
/// sched.start();
/// let (tx, rx) = mpsc::channel::<u32>();
/// let stop = CancellationToken::new();
/// let s = stop.clone();
/// let worker = sched.spawn(move || {
///     let mut sum = 0;
///     loop {
///         fibra::select! {
///             recv(rx) -> msg => match msg {
///                 Ok(n) => sum += n,
///                 Err(_) => break, // every sender gone
///             },
///             recv(s) -> _ => break, // cancelled
///             default(Duration::from_secs(10)) => panic!("nothing for 10 s"),
///         }
///     }
///     sum
/// });
/// for n in 1..=4 {
///     tx.send(n).unwrap();
/// }
/// drop(tx);
/// assert_eq!(worker.join().unwrap(), 10);
/// stop.cancel();
/// ```
#[macro_export]
macro_rules! select {
    ($($tokens:tt)*) => {
        $crate::__select_internal!(@parse [] [] (0 1 2 3 4 5 6 7 8 9 10 11) $($tokens)*)
    };
}

#[doc(hidden)]
#[macro_export]
macro_rules! __select_internal {
    // ---- parsing: one arm at a time into [ (index op pat body) ... ] and [ default ] ----
    (@parse [$($arms:tt)*] [$($def:tt)*] ($i:tt $($is:tt)*)
        recv($r:expr) -> $p:pat => $body:expr, $($rest:tt)*) => {
        $crate::__select_internal!(@parse [$($arms)* ($i ($crate::sync::select::RecvOp::new(&$r)) ($p) ($body))] [$($def)*] ($($is)*) $($rest)*)
    };
    (@parse [$($arms:tt)*] [$($def:tt)*] ($i:tt $($is:tt)*)
        recv($r:expr) -> $p:pat => $body:block $($rest:tt)*) => {
        $crate::__select_internal!(@parse [$($arms)* ($i ($crate::sync::select::RecvOp::new(&$r)) ($p) ($body))] [$($def)*] ($($is)*) $($rest)*)
    };
    (@parse [$($arms:tt)*] [$($def:tt)*] ($i:tt $($is:tt)*)
        recv($r:expr) -> $p:pat => $body:expr) => {
        $crate::__select_internal!(@parse [$($arms)* ($i ($crate::sync::select::RecvOp::new(&$r)) ($p) ($body))] [$($def)*] ($($is)*))
    };
    (@parse [$($arms:tt)*] [$($def:tt)*] ($i:tt $($is:tt)*)
        send($s:expr, $v:expr) -> $p:pat => $body:expr, $($rest:tt)*) => {
        $crate::__select_internal!(@parse [$($arms)* ($i ($crate::sync::select::SendOp::new(&$s, $v)) ($p) ($body))] [$($def)*] ($($is)*) $($rest)*)
    };
    (@parse [$($arms:tt)*] [$($def:tt)*] ($i:tt $($is:tt)*)
        send($s:expr, $v:expr) -> $p:pat => $body:block $($rest:tt)*) => {
        $crate::__select_internal!(@parse [$($arms)* ($i ($crate::sync::select::SendOp::new(&$s, $v)) ($p) ($body))] [$($def)*] ($($is)*) $($rest)*)
    };
    (@parse [$($arms:tt)*] [$($def:tt)*] ($i:tt $($is:tt)*)
        send($s:expr, $v:expr) -> $p:pat => $body:expr) => {
        $crate::__select_internal!(@parse [$($arms)* ($i ($crate::sync::select::SendOp::new(&$s, $v)) ($p) ($body))] [$($def)*] ($($is)*))
    };
    (@parse [$($arms:tt)*] [] ($($is:tt)*) default($t:expr) => $body:expr $(, $($rest:tt)*)?) => {
        $crate::__select_internal!(@parse [$($arms)*] [($crate::sync::select::Mode::For($t)) ($body)] ($($is)*) $($($rest)*)?)
    };
    (@parse [$($arms:tt)*] [] ($($is:tt)*) default => $body:expr $(, $($rest:tt)*)?) => {
        $crate::__select_internal!(@parse [$($arms)*] [($crate::sync::select::Mode::Now) ($body)] ($($is)*) $($($rest)*)?)
    };
    (@parse [$($arms:tt)*] [$($def:tt)+] ($($is:tt)*) default $($rest:tt)*) => {
        ::core::compile_error!("select!: more than one `default` arm")
    };
    (@parse [$($arms:tt)*] [$($def:tt)*] () $($rest:tt)+) => {
        ::core::compile_error!("select!: at most 12 operations")
    };
    // ---- done: emit ----
    (@parse [] [$($def:tt)*] ($($is:tt)*)) => {
        ::core::compile_error!("select!: no `recv` or `send` operation")
    };
    (@parse [$(($i:tt ($op:expr) ($p:pat) ($body:expr)))+] [] ($($is:tt)*)) => {
        $crate::__select_internal!(@emit [$(($i ($op) ($p) ($body)))+] ($crate::sync::select::Mode::Block) (::core::unreachable!("a blocking select completes an operation")))
    };
    (@parse [$(($i:tt ($op:expr) ($p:pat) ($body:expr)))+] [($mode:expr) ($dbody:expr)] ($($is:tt)*)) => {
        $crate::__select_internal!(@emit [$(($i ($op) ($p) ($body)))+] ($mode) ($dbody))
    };
    (@parse $($other:tt)*) => {
        ::core::compile_error!("select!: expected `recv(r) -> pat => body`, `send(s, v) -> pat => body`, `default => body` or `default(timeout) => body`")
    };
    (@emit [$(($i:tt ($op:expr) ($p:pat) ($body:expr)))+] ($mode:expr) ($dbody:expr)) => {{
        let mut __ops = ($($op,)+);
        let __selected = $crate::sync::select::run(
            &mut [$(&mut __ops.$i as &mut dyn $crate::sync::select::Op),+],
            $mode,
        );
        match __selected {
            $(::core::option::Option::Some($i) => {
                let $p = __ops.$i.take();
                $body
            })+
            ::core::option::Option::None => $dbody,
            ::core::option::Option::Some(_) => ::core::unreachable!(),
        }
    }};
}
