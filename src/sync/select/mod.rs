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
//! and a receive against a sender, so a select about to park *offers* them: a send's
//! message goes into the channel's `Offers`, where a receiver that finds no blocked sender
//! claims it; a receive goes into its `RecvOffers`, which a sender that finds no waiting
//! receiver fills. Exactly one operation of a select completes: its [`Signal`] carries a
//! claim word that the other side moves from open to the offering arm, and that the select
//! itself closes when it wakes, before it looks at anything else.
//!
//! # Differences from crossbeam-channel, on purpose
//! - `select!`'s send message is evaluated in a closure, so that it is made only when the
//!   send is chosen: `?` and `return` in it act on that closure.
//! - A waiting `select!` offers a rendezvous send by making its message (the other side must
//!   be able to take it without waiting for the select): if another operation then
//!   completes, that message is dropped unsent, where crossbeam never makes it.
//! - [`Select`]'s receives need `'static` message types (the chosen message waits,
//!   type-erased, in the [`SelectedOperation`]), and a chosen send that another sender beat
//!   to the room waits for room when given its message (crossbeam reserves the room).
//! - `after`, `tick` and `never` are receivers of their own types, not `Receiver<Instant>`.
//! - [`Select::ready`] may report an operation that another fiber or thread completes before
//!   the caller does, as crossbeam's may.
//!
//! | file | what |
//! | --- | --- |
//! | `mod.rs` | [`Signal`], the watchers a channel keeps |
//! | `offers` | the offers of waiting selects on rendezvous channels |
//! | `ops` | one operation (`Op`, `RecvOp`, `SendOp`) and what channels it takes |
//! | `run` | a select's run: tries, watches, offers, parks |
//! | `indexed` | [`Select`], crossbeam's select of operations added at run time |
//! | `dynamic` | [`SelectArms`], the same with a closure per operation |
//! | `macros` | `select!` and `select_biased!` |

mod dynamic;
mod indexed;
mod macros;
mod offers;
mod ops;
mod run;

pub use dynamic::SelectArms;
pub use indexed::{
    ReadyTimeoutError, Select, SelectTimeoutError, SelectedOperation, TryReadyError, TrySelectError,
};
pub(crate) use offers::{Offers, RecvOffers};
pub(crate) use ops::sealed::Sealed as SelectRecvSealed;
#[doc(hidden)]
pub use ops::{Op, RecvOp, SelectRecvRef, SelectSendRef, SendOp};
pub use ops::{SelectRecv, SelectSend};
#[doc(hidden)]
pub use run::{run, run_biased, Mode};

use crate::dump::WaitOn;
use crate::park::{park_until, ParkResult, Unparker};
use crate::sync::wait_queue::{Guard, Wakeups};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Instant;

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
