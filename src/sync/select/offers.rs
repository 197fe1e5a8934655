//! The offers of waiting selects on rendezvous channels: sends ([`Offers`]) and receives
//! ([`RecvOffers`]), kept in the channel's locked state.

use super::{Signal, Watchers, OPEN};
use crate::sync::wait_queue::Wakeups;
use std::collections::VecDeque;
use std::sync::atomic::Ordering;
use std::sync::Arc;

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

    /// Whether a receiver would find an offer to claim now.
    pub(crate) fn any_open(&self) -> bool {
        self.0.as_ref().is_some_and(|list| {
            list.iter()
                .any(|o| o.signal.claim.load(Ordering::Acquire) == OPEN)
        })
    }

    /// Takes back the offer of arm `arm` of the select waiting on `signal`: `None` if a
    /// receiver took it.
    pub(crate) fn withdraw(&mut self, signal: &Arc<Signal>, arm: usize) -> Option<T> {
        take_offer(self.0.as_deref_mut()?, |o| (&o.signal, o.arm), signal, arm).map(|o| o.msg)
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

/// The receives that waiting selects offer on a rendezvous channel; lives in the channel's
/// locked state. A sender that finds no waiting receiver [`fill`](RecvOffers::fill)s the
/// oldest offer whose select has not decided yet — `try_send` too, and another select's
/// send, as with crossbeam — completing that select's receive; the message waits in the
/// offer until the select, awake, [`withdraw`](RecvOffers::withdraw)s it.
// Boxed on purpose, as `Offers`.
#[allow(clippy::box_collection)]
pub(crate) struct RecvOffers<T>(Option<Box<VecDeque<RecvOffer<T>>>>);

struct RecvOffer<T> {
    signal: Arc<Signal>,
    arm: usize,
    msg: Option<T>,
}

impl<T> Default for RecvOffers<T> {
    fn default() -> Self {
        RecvOffers(None)
    }
}

impl<T> RecvOffers<T> {
    /// Offers the receive of arm `arm` of the select waiting on `signal`, and fires the send
    /// side's watchers (but the select's own).
    pub(crate) fn offer(
        &mut self,
        tx_watch: &Watchers,
        wakes: &mut Wakeups,
        signal: &Arc<Signal>,
        arm: usize,
    ) {
        self.0.get_or_insert_default().push_back(RecvOffer {
            signal: signal.clone(),
            arm,
            msg: None,
        });
        tx_watch.notify_except(signal, wakes);
    }

    /// Whether a sender would find an offer to fill now.
    pub(crate) fn any_open(&self) -> bool {
        self.0.as_ref().is_some_and(|list| {
            list.iter()
                .any(|o| o.msg.is_none() && o.signal.claim.load(Ordering::Acquire) == OPEN)
        })
    }

    /// Completes the oldest offer whose select has not decided yet with `msg`, and wakes
    /// the select; gives `msg` back if there is none.
    #[inline]
    pub(crate) fn fill(&mut self, msg: T, wakes: &mut Wakeups) -> Result<(), T> {
        match &mut self.0 {
            Some(list) if !list.is_empty() => Self::fill_slow(list, msg, wakes),
            _ => Err(msg),
        }
    }

    #[cold]
    fn fill_slow(list: &mut VecDeque<RecvOffer<T>>, msg: T, wakes: &mut Wakeups) -> Result<(), T> {
        // A filled offer's select has decided (its claim is taken): `claim_for` skips it.
        let Some(o) = list
            .iter_mut()
            .find(|o| o.msg.is_none() && o.signal.claim_for(o.arm))
        else {
            return Err(msg);
        };
        o.msg = Some(msg);
        o.signal.fire_into(wakes);
        Ok(())
    }

    /// Takes the offer of arm `arm` of the select waiting on `signal` back, with the message
    /// a sender put in it, if one did.
    pub(crate) fn withdraw(&mut self, signal: &Arc<Signal>, arm: usize) -> Option<T> {
        take_offer(self.0.as_deref_mut()?, |o| (&o.signal, o.arm), signal, arm).and_then(|o| o.msg)
    }
}

/// Removes the offer of arm `arm` of the select waiting on `signal` from `list` (`whose`
/// tells an offer's select and arm).
fn take_offer<O>(
    list: &mut VecDeque<O>,
    whose: impl Fn(&O) -> (&Arc<Signal>, usize),
    signal: &Arc<Signal>,
    arm: usize,
) -> Option<O> {
    let i = list.iter().position(|o| {
        let (s, a) = whose(o);
        Arc::ptr_eq(s, signal) && a == arm
    })?;
    list.remove(i)
}
