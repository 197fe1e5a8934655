//! Property tests of every channel kind against a sequential model of its documented
//! semantics, and of what must hold when producers and consumers run at once.
//!
//! - **Sequential.** A random sequence of operations on the handles of one channel (sends in
//!   every form, receives in every form, handles cloned and dropped, the occupancy queries,
//!   broadcast's subscriptions) runs on a plain thread and again in a fiber, and each result
//!   is compared with the model's (a `VecDeque`, the handle counts and the bound; for
//!   broadcast, each receiver's position in a ring). Only operations that cannot block for
//!   ever are made: where the model says a blocking `send` or `recv` would wait, its
//!   zero-timeout or `try_` form runs instead. Messages count themselves ([`Tok`]), so the
//!   number alive is checked after every step against the number the model says the channel
//!   still holds: a message dropped too early, twice or never fails the property.
//! - **Concurrent.** Producers on fibers of a two-worker scheduler and on plain threads send
//!   numbered messages while consumers (fibers or threads) receive them, some stopping
//!   early: every message made is received once, given back by a failed send, or dropped
//!   with the last receiver — and that last only if every receiver stopped early; each
//!   consumer sees each producer's messages in order (broadcast: every receiver sees the
//!   same message at each position of one order, its lags counted exactly).
//!
//! Case counts are explicit and small enough for a loaded two-core machine; failures are
//! not persisted to files (see `tests/common/props.rs`).

use std::collections::VecDeque;
use std::fmt::Debug;
use std::sync::atomic::{AtomicIsize, Ordering};
use std::sync::{Arc, Mutex as StdMutex};
use std::task::Poll;
use std::time::Duration;

use proptest::prelude::*;
use proptest::test_runner::TestCaseError;

use crate::props_common::{check, ctx, go, in_both_contexts, pause, pick, poll_once, Ctx, Joiner};
use fibra::sync::{broadcast, mpmc, mpsc, oneshot};
use fibra::{Fiber, Scheduler};

/// A message that counts the live copies of every message of its run: made, cloned, dropped.
#[derive(Debug)]
struct Tok {
    id: u32,
    live: Arc<AtomicIsize>,
}

impl Tok {
    fn new(id: u32, live: &Arc<AtomicIsize>) -> Tok {
        live.fetch_add(1, Ordering::SeqCst);
        Tok {
            id,
            live: live.clone(),
        }
    }
}

impl Clone for Tok {
    fn clone(&self) -> Tok {
        Tok::new(self.id, &self.live)
    }
}

impl Drop for Tok {
    fn drop(&mut self) {
        self.live.fetch_sub(1, Ordering::SeqCst);
    }
}

/// What an operation returned, as the model and fibra are compared.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Got {
    /// A send, a clone, a drop: done.
    Done,
    /// No handle of that kind to use.
    Skipped,
    Msg(u32),
    /// `try_send` found no room; the message came back.
    Full(u32),
    /// A zero timeout ran out (a send's message came back).
    Timeout(Option<u32>),
    /// The other side is gone (a send's message came back).
    Disconnected(Option<u32>),
    Empty,
    Pending,
    Lagged(u64),
    Closed,
    Count(usize),
    Flag(bool),
    Cap(Option<usize>),
    Msgs(Vec<u32>),
    List(Vec<Got>),
}

/// Compares one step's results and the live messages against the model's.
fn step_ok(
    step: usize,
    op: &dyn Debug,
    want: &Got,
    got: &Got,
    live: &AtomicIsize,
    want_live: usize,
) -> Result<(), String> {
    if want != got {
        return Err(format!(
            "step {step} {op:?}: the model says {want:?}, fibra gave {got:?}"
        ));
    }
    let live = live.load(Ordering::SeqCst);
    if live != want_live as isize {
        return Err(format!(
            "after step {step} {op:?}: {live} messages alive, the model holds {want_live}"
        ));
    }
    Ok(())
}

// -------------------------------------------------------------- mpsc and mpmc: the model

/// A channel's bound.
#[derive(Debug, Clone, Copy)]
enum Kind {
    Unbounded,
    Bounded(usize),
    Rendezvous,
}

impl Kind {
    fn bound(self) -> Option<usize> {
        match self {
            Kind::Unbounded => None,
            Kind::Bounded(n) => Some(n),
            Kind::Rendezvous => Some(0),
        }
    }
}

fn kinds() -> impl Strategy<Value = Kind> {
    prop_oneof![
        Just(Kind::Unbounded),
        (1usize..=4).prop_map(Kind::Bounded),
        Just(Kind::Rendezvous),
    ]
}

/// The sequential model of an `mpsc` or `mpmc` channel, from their docs: a FIFO of at most
/// `bound` messages (a rendezvous channel holds none: with nobody waiting, every send needs
/// a receiver that is not there), counts of senders and receivers; a send fails once every
/// receiver is gone, and the last receiver's drop drops what the channel holds; a receive
/// takes the oldest message, and fails once the channel is empty and every sender is gone.
#[derive(Debug)]
struct ChanModel {
    queue: VecDeque<u32>,
    bound: Option<usize>,
    senders: usize,
    receivers: usize,
}

/// Why the model's send or receive did not complete.
#[derive(Debug, PartialEq)]
enum Fail {
    /// It would wait (no room; nothing to receive).
    Wait,
    Disconnected,
}

impl ChanModel {
    fn new(kind: Kind) -> ChanModel {
        ChanModel {
            queue: VecDeque::new(),
            bound: kind.bound(),
            senders: 1,
            receivers: 1,
        }
    }

    fn send(&mut self, id: u32) -> Result<(), Fail> {
        if self.receivers == 0 {
            return Err(Fail::Disconnected);
        }
        if self.bound.is_some_and(|b| self.queue.len() >= b) {
            return Err(Fail::Wait);
        }
        self.queue.push_back(id);
        Ok(())
    }

    fn send_would_wait(&self) -> bool {
        self.receivers > 0 && self.bound.is_some_and(|b| self.queue.len() >= b)
    }

    fn recv(&mut self) -> Result<u32, Fail> {
        match self.queue.pop_front() {
            Some(id) => Ok(id),
            None if self.senders == 0 => Err(Fail::Disconnected),
            None => Err(Fail::Wait),
        }
    }

    fn recv_would_wait(&self) -> bool {
        self.queue.is_empty() && self.senders > 0
    }

    fn drop_receiver(&mut self) {
        self.receivers -= 1;
        if self.receivers == 0 {
            self.queue.clear();
        }
    }

    fn len(&self) -> usize {
        self.queue.len()
    }

    fn is_full(&self) -> bool {
        self.bound.is_some_and(|b| self.queue.len() >= b)
    }
}

/// A model's send as a `send` (or `send_timeout` never reached) reports it.
fn sent(r: Result<(), Fail>, id: u32, wait: fn(u32) -> Got) -> Got {
    match r {
        Ok(()) => Got::Done,
        Err(Fail::Wait) => wait(id),
        Err(Fail::Disconnected) => Got::Disconnected(Some(id)),
    }
}

/// A model's receive as a receive that would not wait reports it.
fn received(r: Result<u32, Fail>, wait: Got) -> Got {
    match r {
        Ok(id) => Got::Msg(id),
        Err(Fail::Wait) => wait,
        Err(Fail::Disconnected) => Got::Disconnected(None),
    }
}

/// An operation on an `mpsc` or `mpmc` channel; `u8`s pick a handle (modulo the count).
#[derive(Debug, Clone)]
enum ChanOp {
    Send(u8),
    TrySend(u8),
    /// `mpmc` only.
    SendTimeout0(u8),
    Recv(u8),
    TryRecv(u8),
    RecvTimeout0(u8),
    /// `mpsc` only: one poll of `recv_async`'s future.
    PollRecvAsync(u8),
    TryIter(u8),
    CloneSender(u8),
    DropSender(u8),
    /// `mpmc` only.
    CloneReceiver(u8),
    DropReceiver(u8),
    /// The occupancy queries: on a sender (`mpmc` only) or a receiver.
    Len(bool, u8),
    IsEmpty(bool, u8),
    /// `mpmc` only.
    IsFull(bool, u8),
    Capacity(bool, u8),
}

impl ChanOp {
    /// The handle the operation picks.
    fn handle(&self) -> u8 {
        match *self {
            ChanOp::Send(h)
            | ChanOp::TrySend(h)
            | ChanOp::SendTimeout0(h)
            | ChanOp::Recv(h)
            | ChanOp::TryRecv(h)
            | ChanOp::RecvTimeout0(h)
            | ChanOp::PollRecvAsync(h)
            | ChanOp::TryIter(h)
            | ChanOp::CloneSender(h)
            | ChanOp::DropSender(h)
            | ChanOp::CloneReceiver(h)
            | ChanOp::DropReceiver(h)
            | ChanOp::Len(_, h)
            | ChanOp::IsEmpty(_, h)
            | ChanOp::IsFull(_, h)
            | ChanOp::Capacity(_, h) => h,
        }
    }
}

fn chan_ops(mpmc: bool) -> impl Strategy<Value = Vec<ChanOp>> {
    let h = any::<u8>();
    let side = if mpmc {
        any::<bool>().boxed()
    } else {
        Just(false).boxed()
    };
    let common = prop_oneof![
        6 => h.prop_map(ChanOp::Send),
        4 => h.prop_map(ChanOp::TrySend),
        5 => h.prop_map(ChanOp::Recv),
        4 => h.prop_map(ChanOp::TryRecv),
        3 => h.prop_map(ChanOp::RecvTimeout0),
        1 => h.prop_map(ChanOp::TryIter),
        2 => h.prop_map(ChanOp::CloneSender),
        2 => h.prop_map(ChanOp::DropSender),
        1 => h.prop_map(ChanOp::DropReceiver),
        1 => (side.clone(), h).prop_map(|(s, h)| ChanOp::Len(s, h)),
        1 => (side.clone(), h).prop_map(|(s, h)| ChanOp::IsEmpty(s, h)),
        1 => (side.clone(), h).prop_map(|(s, h)| ChanOp::Capacity(s, h)),
    ];
    let op = if mpmc {
        prop_oneof![
            20 => common,
            3 => h.prop_map(ChanOp::SendTimeout0),
            2 => h.prop_map(ChanOp::CloneReceiver),
            1 => (side, h).prop_map(|(s, h)| ChanOp::IsFull(s, h)),
        ]
        .boxed()
    } else {
        prop_oneof![20 => common, 2 => h.prop_map(ChanOp::PollRecvAsync)].boxed()
    };
    prop::collection::vec(op, 0..60)
}

// ------------------------------------------------------------------------- mpsc, sequential

enum MpscTx {
    Unbounded(mpsc::Sender<Tok>),
    Bounded(mpsc::SyncSender<Tok>),
}

impl Clone for MpscTx {
    fn clone(&self) -> Self {
        match self {
            MpscTx::Unbounded(t) => MpscTx::Unbounded(t.clone()),
            MpscTx::Bounded(t) => MpscTx::Bounded(t.clone()),
        }
    }
}

impl MpscTx {
    fn send(&self, m: Tok) -> Got {
        let r = match self {
            MpscTx::Unbounded(t) => t.send(m),
            MpscTx::Bounded(t) => t.send(m),
        };
        match r {
            Ok(()) => Got::Done,
            Err(mpsc::SendError(m)) => Got::Disconnected(Some(m.id)),
        }
    }

    /// `try_send`; the unbounded `Sender` has none, and its `send` never waits.
    fn try_send(&self, m: Tok) -> Got {
        match self {
            MpscTx::Unbounded(_) => self.send(m),
            MpscTx::Bounded(t) => match t.try_send(m) {
                Ok(()) => Got::Done,
                Err(mpsc::TrySendError::Full(m)) => Got::Full(m.id),
                Err(mpsc::TrySendError::Disconnected(m)) => Got::Disconnected(Some(m.id)),
            },
        }
    }
}

fn mpsc_recv(r: Result<Tok, mpsc::RecvError>) -> Got {
    match r {
        Ok(m) => Got::Msg(m.id),
        Err(mpsc::RecvError) => Got::Disconnected(None),
    }
}

fn mpsc_try_recv(r: Result<Tok, mpsc::TryRecvError>) -> Got {
    match r {
        Ok(m) => Got::Msg(m.id),
        Err(mpsc::TryRecvError::Empty) => Got::Empty,
        Err(mpsc::TryRecvError::Disconnected) => Got::Disconnected(None),
    }
}

fn mpsc_recv_timeout(r: Result<Tok, mpsc::RecvTimeoutError>) -> Got {
    match r {
        Ok(m) => Got::Msg(m.id),
        Err(mpsc::RecvTimeoutError::Timeout) => Got::Timeout(None),
        Err(mpsc::RecvTimeoutError::Disconnected) => Got::Disconnected(None),
    }
}

fn run_mpsc((kind, ops): (Kind, Vec<ChanOp>)) -> Result<(), String> {
    let live = Arc::new(AtomicIsize::new(0));
    let mut model = ChanModel::new(kind);
    let (tx, rx) = match kind.bound() {
        None => {
            let (t, r) = mpsc::channel();
            (MpscTx::Unbounded(t), r)
        }
        Some(bound) => {
            let (t, r) = mpsc::sync_channel(bound);
            (MpscTx::Bounded(t), r)
        }
    };
    let mut txs = vec![tx];
    let mut rx = Some(rx);
    for (step, op) in ops.iter().enumerate() {
        let id = step as u32;
        let tok = || Tok::new(id, &live);
        let (want, got) = match (op, pick(&txs, op.handle()), rx.as_ref()) {
            (ChanOp::Send(_), Some(t), _) if !model.send_would_wait() => {
                (sent(model.send(id), id, Got::Full), txs[t].send(tok()))
            }
            // `Send` included when it would wait for ever: its `try_` form instead.
            (ChanOp::Send(_) | ChanOp::TrySend(_), Some(t), _) => {
                (sent(model.send(id), id, Got::Full), txs[t].try_send(tok()))
            }
            (ChanOp::Recv(_), _, Some(rx)) if !model.recv_would_wait() => {
                (received(model.recv(), Got::Empty), mpsc_recv(rx.recv()))
            }
            // `Recv` included when it would wait for ever: with a zero timeout instead.
            (ChanOp::Recv(_) | ChanOp::RecvTimeout0(_), _, Some(rx)) => (
                received(model.recv(), Got::Timeout(None)),
                mpsc_recv_timeout(rx.recv_timeout(Duration::ZERO)),
            ),
            (ChanOp::TryRecv(_), _, Some(rx)) => (
                received(model.recv(), Got::Empty),
                mpsc_try_recv(rx.try_recv()),
            ),
            (ChanOp::PollRecvAsync(_), _, Some(rx)) => {
                let got = match poll_once(rx.recv_async()) {
                    Poll::Ready(r) => mpsc_recv(r),
                    Poll::Pending => Got::Pending,
                };
                (received(model.recv(), Got::Pending), got)
            }
            (ChanOp::TryIter(_), _, Some(rx)) => {
                let want = Got::Msgs(model.queue.drain(..).collect());
                (want, Got::Msgs(rx.try_iter().map(|m| m.id).collect()))
            }
            (ChanOp::CloneSender(_), Some(t), _) => {
                model.senders += 1;
                txs.push(txs[t].clone());
                (Got::Done, Got::Done)
            }
            (ChanOp::DropSender(_), Some(t), _) => {
                model.senders -= 1;
                txs.swap_remove(t);
                (Got::Done, Got::Done)
            }
            (ChanOp::DropReceiver(_), _, Some(_)) => {
                model.drop_receiver();
                rx = None;
                (Got::Done, Got::Done)
            }
            (ChanOp::Len(..), _, Some(rx)) => (Got::Count(model.len()), Got::Count(rx.len())),
            (ChanOp::IsEmpty(..), _, Some(rx)) => {
                (Got::Flag(model.len() == 0), Got::Flag(rx.is_empty()))
            }
            (ChanOp::Capacity(..), _, Some(rx)) => (Got::Cap(model.bound), Got::Cap(rx.capacity())),
            _ => (Got::Skipped, Got::Skipped),
        };
        step_ok(step, op, &want, &got, &live, model.queue.len())?;
    }
    drop((txs, rx));
    step_ok(ops.len(), &"the end", &Got::Done, &Got::Done, &live, 0)
}

#[test]
fn mpsc_matches_the_sequential_model_on_threads_and_in_fibers() {
    check(
        128,
        || (kinds(), chan_ops(false)),
        |s, v| in_both_contexts(s, v, run_mpsc),
    );
}

// ------------------------------------------------------------------------- mpmc, sequential

enum MpmcTx {
    Unbounded(mpmc::Sender<Tok>),
    Bounded(mpmc::SyncSender<Tok>),
}

impl Clone for MpmcTx {
    fn clone(&self) -> Self {
        match self {
            MpmcTx::Unbounded(t) => MpmcTx::Unbounded(t.clone()),
            MpmcTx::Bounded(t) => MpmcTx::Bounded(t.clone()),
        }
    }
}

impl MpmcTx {
    fn send(&self, m: Tok) -> Got {
        let r = match self {
            MpmcTx::Unbounded(t) => t.send(m),
            MpmcTx::Bounded(t) => t.send(m),
        };
        match r {
            Ok(()) => Got::Done,
            Err(mpmc::SendError(m)) => Got::Disconnected(Some(m.id)),
        }
    }

    fn try_send(&self, m: Tok) -> Got {
        let r = match self {
            MpmcTx::Unbounded(t) => t.try_send(m),
            MpmcTx::Bounded(t) => t.try_send(m),
        };
        match r {
            Ok(()) => Got::Done,
            Err(mpmc::TrySendError::Full(m)) => Got::Full(m.id),
            Err(mpmc::TrySendError::Disconnected(m)) => Got::Disconnected(Some(m.id)),
        }
    }

    fn send_timeout0(&self, m: Tok) -> Got {
        let r = match self {
            MpmcTx::Unbounded(t) => t.send_timeout(m, Duration::ZERO),
            MpmcTx::Bounded(t) => t.send_timeout(m, Duration::ZERO),
        };
        match r {
            Ok(()) => Got::Done,
            Err(mpmc::SendTimeoutError::Timeout(m)) => Got::Timeout(Some(m.id)),
            Err(mpmc::SendTimeoutError::Disconnected(m)) => Got::Disconnected(Some(m.id)),
        }
    }

    fn len(&self) -> usize {
        match self {
            MpmcTx::Unbounded(t) => t.len(),
            MpmcTx::Bounded(t) => t.len(),
        }
    }

    fn is_empty(&self) -> bool {
        match self {
            MpmcTx::Unbounded(t) => t.is_empty(),
            MpmcTx::Bounded(t) => t.is_empty(),
        }
    }

    fn is_full(&self) -> bool {
        match self {
            MpmcTx::Unbounded(t) => t.is_full(),
            MpmcTx::Bounded(t) => t.is_full(),
        }
    }

    fn capacity(&self) -> Option<usize> {
        match self {
            MpmcTx::Unbounded(t) => t.capacity(),
            MpmcTx::Bounded(t) => t.capacity(),
        }
    }
}

fn run_mpmc((kind, ops): (Kind, Vec<ChanOp>)) -> Result<(), String> {
    let live = Arc::new(AtomicIsize::new(0));
    let mut model = ChanModel::new(kind);
    let (tx, rx) = match kind.bound() {
        None => {
            let (t, r) = mpmc::channel();
            (MpmcTx::Unbounded(t), r)
        }
        Some(bound) => {
            let (t, r) = mpmc::sync_channel(bound);
            (MpmcTx::Bounded(t), r)
        }
    };
    let mut txs = vec![tx];
    let mut rxs = vec![rx];
    for (step, op) in ops.iter().enumerate() {
        let id = step as u32;
        let tok = || Tok::new(id, &live);
        let (t, r) = (pick(&txs, op.handle()), pick(&rxs, op.handle()));
        let (want, got) = match (op, t, r) {
            (ChanOp::Send(_), Some(t), _) if !model.send_would_wait() => {
                (sent(model.send(id), id, Got::Full), txs[t].send(tok()))
            }
            // `Send` included when it would wait for ever: with a zero timeout instead.
            (ChanOp::Send(_) | ChanOp::SendTimeout0(_), Some(t), _) => (
                sent(model.send(id), id, |id| Got::Timeout(Some(id))),
                txs[t].send_timeout0(tok()),
            ),
            (ChanOp::TrySend(_), Some(t), _) => {
                (sent(model.send(id), id, Got::Full), txs[t].try_send(tok()))
            }
            (ChanOp::Recv(_), _, Some(r)) if !model.recv_would_wait() => {
                (received(model.recv(), Got::Empty), mpsc_recv(rxs[r].recv()))
            }
            (ChanOp::Recv(_) | ChanOp::RecvTimeout0(_), _, Some(r)) => (
                received(model.recv(), Got::Timeout(None)),
                mpsc_recv_timeout(rxs[r].recv_timeout(Duration::ZERO)),
            ),
            (ChanOp::TryRecv(_), _, Some(r)) => (
                received(model.recv(), Got::Empty),
                mpsc_try_recv(rxs[r].try_recv()),
            ),
            (ChanOp::TryIter(_), _, Some(r)) => {
                let got = Got::Msgs(rxs[r].try_iter().map(|m| m.id).collect());
                (Got::Msgs(model.queue.drain(..).collect()), got)
            }
            (ChanOp::CloneSender(_), Some(t), _) => {
                model.senders += 1;
                txs.push(txs[t].clone());
                (Got::Done, Got::Done)
            }
            (ChanOp::DropSender(_), Some(t), _) => {
                model.senders -= 1;
                txs.swap_remove(t);
                (Got::Done, Got::Done)
            }
            (ChanOp::CloneReceiver(_), _, Some(r)) => {
                model.receivers += 1;
                rxs.push(rxs[r].clone());
                (Got::Done, Got::Done)
            }
            (ChanOp::DropReceiver(_), _, Some(r)) => {
                model.drop_receiver();
                rxs.swap_remove(r);
                (Got::Done, Got::Done)
            }
            (ChanOp::Len(true, _), Some(t), _) => {
                (Got::Count(model.len()), Got::Count(txs[t].len()))
            }
            (ChanOp::Len(false, _), _, Some(r)) => {
                (Got::Count(model.len()), Got::Count(rxs[r].len()))
            }
            (ChanOp::IsEmpty(true, _), Some(t), _) => {
                (Got::Flag(model.len() == 0), Got::Flag(txs[t].is_empty()))
            }
            (ChanOp::IsEmpty(false, _), _, Some(r)) => {
                (Got::Flag(model.len() == 0), Got::Flag(rxs[r].is_empty()))
            }
            (ChanOp::IsFull(true, _), Some(t), _) => {
                (Got::Flag(model.is_full()), Got::Flag(txs[t].is_full()))
            }
            (ChanOp::IsFull(false, _), _, Some(r)) => {
                (Got::Flag(model.is_full()), Got::Flag(rxs[r].is_full()))
            }
            (ChanOp::Capacity(true, _), Some(t), _) => {
                (Got::Cap(model.bound), Got::Cap(txs[t].capacity()))
            }
            (ChanOp::Capacity(false, _), _, Some(r)) => {
                (Got::Cap(model.bound), Got::Cap(rxs[r].capacity()))
            }
            _ => (Got::Skipped, Got::Skipped),
        };
        step_ok(step, op, &want, &got, &live, model.queue.len())?;
    }
    drop((txs, rxs));
    step_ok(ops.len(), &"the end", &Got::Done, &Got::Done, &live, 0)
}

#[test]
fn mpmc_matches_the_sequential_model_on_threads_and_in_fibers() {
    check(
        128,
        || (kinds(), chan_ops(true)),
        |s, v| in_both_contexts(s, v, run_mpmc),
    );
}

// ---------------------------------------------------------------------- oneshot, sequential

/// An operation on a oneshot channel.
#[derive(Debug, Clone)]
enum OneOp {
    Send,
    DropSender,
    IsClosed,
    Recv,
    TryRecv,
    RecvTimeout0,
    /// One poll of the receiver as a future.
    Poll,
    DropReceiver,
}

/// What became of a oneshot's sender.
#[derive(Debug, PartialEq)]
enum OneTx {
    Alive,
    /// Consumed by `send` (successful or not).
    Sent,
    Dropped,
}

/// The sequential model of a oneshot channel, from its docs: one `send`, which fails (giving
/// the value back) once the receiver is gone; a receive gets the value once it is there, is
/// told `Empty` before, and `Disconnected` if the sender was dropped without sending or the
/// value was already received. A value not received is dropped with the receiver.
#[derive(Debug)]
struct OneModel {
    tx: OneTx,
    /// The value in the channel.
    value: Option<u32>,
    rx: bool,
}

impl OneModel {
    fn recv(&mut self) -> Result<u32, Fail> {
        match self.value.take() {
            Some(id) => Ok(id),
            None if self.tx == OneTx::Alive => Err(Fail::Wait),
            None => Err(Fail::Disconnected),
        }
    }
}

fn oneshot_recv_timeout(r: Result<Tok, oneshot::RecvTimeoutError>) -> Got {
    match r {
        Ok(m) => Got::Msg(m.id),
        Err(oneshot::RecvTimeoutError::Timeout) => Got::Timeout(None),
        Err(oneshot::RecvTimeoutError::Disconnected) => Got::Disconnected(None),
    }
}

fn run_oneshot(ops: Vec<OneOp>) -> Result<(), String> {
    let live = Arc::new(AtomicIsize::new(0));
    let mut model = OneModel {
        tx: OneTx::Alive,
        value: None,
        rx: true,
    };
    let (tx, rx) = oneshot::channel::<Tok>();
    let (mut tx, mut rx) = (Some(tx), Some(rx));
    for (step, op) in ops.iter().enumerate() {
        let id = step as u32;
        let (want, got) = match (op, tx.is_some(), rx.as_mut()) {
            (OneOp::Send, true, _) => {
                let want = if model.rx {
                    model.value = Some(id);
                    Got::Done
                } else {
                    Got::Disconnected(Some(id))
                };
                model.tx = OneTx::Sent;
                let got = match tx.take().unwrap().send(Tok::new(id, &live)) {
                    Ok(()) => Got::Done,
                    Err(m) => Got::Disconnected(Some(m.id)),
                };
                (want, got)
            }
            (OneOp::DropSender, true, _) => {
                model.tx = OneTx::Dropped;
                tx = None;
                (Got::Done, Got::Done)
            }
            (OneOp::IsClosed, true, _) => (
                Got::Flag(!model.rx),
                Got::Flag(tx.as_ref().unwrap().is_closed()),
            ),
            (OneOp::Recv, _, Some(_)) if model.value.is_some() || model.tx != OneTx::Alive => {
                model.rx = false;
                let got = match rx.take().unwrap().recv() {
                    Ok(m) => Got::Msg(m.id),
                    Err(oneshot::RecvError) => Got::Disconnected(None),
                };
                (received(model.recv(), Got::Empty), got)
            }
            // `Recv` included when it would wait for ever: with a zero timeout instead.
            (OneOp::Recv | OneOp::RecvTimeout0, _, Some(rx)) => (
                received(model.recv(), Got::Timeout(None)),
                oneshot_recv_timeout(rx.recv_timeout(Duration::ZERO)),
            ),
            (OneOp::TryRecv, _, Some(rx)) => (
                received(model.recv(), Got::Empty),
                mpsc_try_recv(rx.try_recv()),
            ),
            (OneOp::Poll, _, Some(rx)) => {
                let got = match poll_once(rx) {
                    Poll::Ready(r) => mpsc_recv(r),
                    Poll::Pending => Got::Pending,
                };
                (received(model.recv(), Got::Pending), got)
            }
            (OneOp::DropReceiver, _, Some(_)) => {
                model.rx = false;
                model.value = None;
                rx = None;
                (Got::Done, Got::Done)
            }
            _ => (Got::Skipped, Got::Skipped),
        };
        let held = usize::from(model.value.is_some() && model.rx);
        step_ok(step, op, &want, &got, &live, held)?;
    }
    drop((tx, rx));
    step_ok(ops.len(), &"the end", &Got::Done, &Got::Done, &live, 0)
}

#[test]
fn oneshot_matches_the_sequential_model_on_threads_and_in_fibers() {
    check(
        256,
        || {
            prop::collection::vec(
                prop_oneof![
                    Just(OneOp::Send),
                    Just(OneOp::DropSender),
                    Just(OneOp::IsClosed),
                    Just(OneOp::Recv),
                    Just(OneOp::TryRecv),
                    Just(OneOp::RecvTimeout0),
                    Just(OneOp::Poll),
                    Just(OneOp::DropReceiver),
                ],
                0..10,
            )
        },
        |s, v| in_both_contexts(s, v, run_oneshot),
    );
}

// -------------------------------------------------------------------- broadcast, sequential

/// An operation on a broadcast channel; `u8`s pick a handle (modulo the count).
#[derive(Debug, Clone)]
enum BcOp {
    Send(u8),
    /// `n` sends in a row, to fill the ring and make receivers lag.
    Burst(u8, u8),
    CloneSender(u8),
    DropSender(u8),
    Subscribe(u8),
    Resubscribe(u8),
    DropReceiver(u8),
    Recv(u8),
    TryRecv(u8),
    RecvTimeout0(u8),
    RxLen(u8),
    RxIsEmpty(u8),
    TxLen(u8),
    TxIsEmpty(u8),
    ReceiverCount(u8),
    IsClosed(u8),
    /// `Sender::closed`, which waits for every receiver to go.
    Closed(u8),
}

/// A receiver in the broadcast model: where it subscribed, the next position it returns
/// (`read`), and the next it takes from the ring (`fetched`): a receive takes up to
/// [`TAKE_AT_ONCE`] waiting messages at once, and those between `read` and `fetched` are
/// the receiver's, no longer the channel's (the module docs and `Sender::len`'s).
#[derive(Debug, Clone)]
struct BcRx {
    start: u64,
    read: u64,
    fetched: u64,
}

/// The most waiting messages one receive takes from the ring (broadcast's docs).
const TAKE_AT_ONCE: u64 = 16;

/// The sequential model of a broadcast channel, from its docs: a ring of `capacity`
/// messages; each receiver reads every message sent after it subscribed, in order; one
/// whose next message was overwritten is told `Lagged(missed)` and goes on from the oldest
/// message retained; `Closed` once every sender is gone and it has read everything; a send
/// fails (giving the value back) when there is no receiver, else reports how many
/// receivers will see it.
#[derive(Debug)]
struct BcModel {
    capacity: u64,
    /// The id of the message at each position.
    ids: Vec<u32>,
    senders: usize,
    rxs: Vec<BcRx>,
}

impl BcModel {
    fn tail(&self) -> u64 {
        self.ids.len() as u64
    }

    /// The oldest position still in the ring.
    fn oldest(&self) -> u64 {
        self.tail().saturating_sub(self.capacity)
    }

    fn send(&mut self, id: u32) -> Got {
        if self.rxs.is_empty() {
            return Got::Disconnected(Some(id));
        }
        self.ids.push(id);
        Got::Count(self.rxs.len())
    }

    fn subscribe(&mut self) {
        let tail = self.tail();
        self.rxs.push(BcRx {
            start: tail,
            read: tail,
            fetched: tail,
        });
    }

    /// Receiver `i`'s receive; `Empty` stands for "would wait".
    fn recv(&mut self, i: usize) -> Got {
        let (oldest, tail) = (self.oldest(), self.tail());
        let rx = &mut self.rxs[i];
        if rx.read < rx.fetched {
            // Taken earlier, not yet returned: unless overwritten since, which counts as
            // missed like a message still in the ring.
            if rx.read < oldest {
                let missed = oldest - rx.read;
                rx.read = oldest;
                rx.fetched = rx.fetched.max(oldest);
                return Got::Lagged(missed);
            }
        } else {
            if rx.fetched == tail {
                return if self.senders == 0 {
                    Got::Closed
                } else {
                    Got::Empty
                };
            }
            if rx.fetched < oldest {
                let missed = oldest - rx.fetched;
                rx.read = oldest;
                rx.fetched = oldest;
                return Got::Lagged(missed);
            }
            rx.fetched += (tail - rx.fetched).min(TAKE_AT_ONCE);
        }
        rx.read += 1;
        Got::Msg(self.ids[(rx.read - 1) as usize])
    }

    fn recv_would_wait(&self, i: usize) -> bool {
        let rx = &self.rxs[i];
        rx.read == rx.fetched && rx.fetched == self.tail() && self.senders > 0
    }

    /// `Sender::len`: messages in the ring that a receiver has yet to take.
    fn tx_len(&self) -> usize {
        (self.oldest()..self.tail())
            .filter(|&p| self.rxs.iter().any(|rx| rx.start <= p && rx.fetched <= p))
            .count()
    }

    /// Messages alive: those a receiver has yet to take from the ring, and those it took
    /// and has yet to return.
    fn alive(&self) -> usize {
        let oldest = self.oldest();
        (0..self.tail())
            .filter(|&p| {
                self.rxs
                    .iter()
                    .any(|rx| rx.start <= p && rx.read <= p && (p < rx.fetched || p >= oldest))
            })
            .count()
    }
}

fn bc_recv(r: Result<Tok, broadcast::RecvError>) -> Got {
    match r {
        Ok(m) => Got::Msg(m.id),
        Err(broadcast::RecvError::Lagged(n)) => Got::Lagged(n),
        Err(broadcast::RecvError::Closed) => Got::Closed,
    }
}

fn bc_try_recv(r: Result<Tok, broadcast::TryRecvError>) -> Got {
    match r {
        Ok(m) => Got::Msg(m.id),
        Err(broadcast::TryRecvError::Lagged(n)) => Got::Lagged(n),
        Err(broadcast::TryRecvError::Closed) => Got::Closed,
        Err(broadcast::TryRecvError::Empty) => Got::Empty,
    }
}

fn bc_recv_timeout(r: Result<Tok, broadcast::RecvTimeoutError>) -> Got {
    match r {
        Ok(m) => Got::Msg(m.id),
        Err(broadcast::RecvTimeoutError::Lagged(n)) => Got::Lagged(n),
        Err(broadcast::RecvTimeoutError::Closed) => Got::Closed,
        Err(broadcast::RecvTimeoutError::Timeout) => Got::Timeout(None),
    }
}

fn bc_send(tx: &broadcast::Sender<Tok>, m: Tok) -> Got {
    match tx.send(m) {
        Ok(n) => Got::Count(n),
        Err(broadcast::SendError(m)) => Got::Disconnected(Some(m.id)),
    }
}

fn run_broadcast((capacity, ops): (usize, Vec<BcOp>)) -> Result<(), String> {
    let live = Arc::new(AtomicIsize::new(0));
    let mut model = BcModel {
        capacity: capacity as u64,
        ids: Vec::new(),
        senders: 1,
        rxs: Vec::new(),
    };
    model.subscribe();
    let (tx, rx) = broadcast::channel::<Tok>(capacity);
    let (mut txs, mut rxs) = (vec![tx], vec![rx]);
    let mut next_id = 0;
    let mut tok = || {
        next_id += 1;
        Tok::new(next_id, &live)
    };
    for (step, op) in ops.iter().enumerate() {
        let h = match *op {
            BcOp::Send(h)
            | BcOp::Burst(h, _)
            | BcOp::CloneSender(h)
            | BcOp::DropSender(h)
            | BcOp::Subscribe(h)
            | BcOp::Resubscribe(h)
            | BcOp::DropReceiver(h)
            | BcOp::Recv(h)
            | BcOp::TryRecv(h)
            | BcOp::RecvTimeout0(h)
            | BcOp::RxLen(h)
            | BcOp::RxIsEmpty(h)
            | BcOp::TxLen(h)
            | BcOp::TxIsEmpty(h)
            | BcOp::ReceiverCount(h)
            | BcOp::IsClosed(h)
            | BcOp::Closed(h) => h,
        };
        let (t, r) = (pick(&txs, h), pick(&rxs, h));
        let (want, got) = match (op, t, r) {
            (BcOp::Send(_), Some(t), _) => {
                let m = tok();
                (model.send(m.id), bc_send(&txs[t], m))
            }
            (BcOp::Burst(_, n), Some(t), _) => {
                let (mut want, mut got) = (Vec::new(), Vec::new());
                for _ in 0..*n {
                    let m = tok();
                    want.push(model.send(m.id));
                    got.push(bc_send(&txs[t], m));
                }
                (Got::List(want), Got::List(got))
            }
            (BcOp::CloneSender(_), Some(t), _) => {
                model.senders += 1;
                txs.push(txs[t].clone());
                (Got::Done, Got::Done)
            }
            (BcOp::DropSender(_), Some(t), _) => {
                model.senders -= 1;
                txs.swap_remove(t);
                (Got::Done, Got::Done)
            }
            (BcOp::Subscribe(_), Some(t), _) => {
                model.subscribe();
                rxs.push(txs[t].subscribe());
                (Got::Done, Got::Done)
            }
            (BcOp::Resubscribe(_), _, Some(r)) => {
                model.subscribe();
                rxs.push(rxs[r].resubscribe());
                (Got::Done, Got::Done)
            }
            (BcOp::DropReceiver(_), _, Some(r)) => {
                model.rxs.swap_remove(r);
                rxs.swap_remove(r);
                (Got::Done, Got::Done)
            }
            (BcOp::Recv(_), _, Some(r)) if !model.recv_would_wait(r) => {
                (model.recv(r), bc_recv(rxs[r].recv()))
            }
            // `Recv` included when it would wait for ever: with a zero timeout instead.
            (BcOp::Recv(_) | BcOp::RecvTimeout0(_), _, Some(r)) => {
                let want = match model.recv(r) {
                    Got::Empty => Got::Timeout(None),
                    g => g,
                };
                (want, bc_recv_timeout(rxs[r].recv_timeout(Duration::ZERO)))
            }
            (BcOp::TryRecv(_), _, Some(r)) => (model.recv(r), bc_try_recv(rxs[r].try_recv())),
            (BcOp::RxLen(_), _, Some(r)) => {
                let want = model.tail() - model.rxs[r].read;
                (Got::Count(want as usize), Got::Count(rxs[r].len()))
            }
            (BcOp::RxIsEmpty(_), _, Some(r)) => {
                let want = model.tail() == model.rxs[r].read;
                (Got::Flag(want), Got::Flag(rxs[r].is_empty()))
            }
            (BcOp::TxLen(_), Some(t), _) => (Got::Count(model.tx_len()), Got::Count(txs[t].len())),
            (BcOp::TxIsEmpty(_), Some(t), _) => {
                (Got::Flag(model.tx_len() == 0), Got::Flag(txs[t].is_empty()))
            }
            (BcOp::ReceiverCount(_), Some(t), _) => (
                Got::Count(model.rxs.len()),
                Got::Count(txs[t].receiver_count()),
            ),
            (BcOp::Closed(_), Some(t), _) if model.rxs.is_empty() => {
                txs[t].closed();
                (Got::Done, Got::Done)
            }
            // `Closed` included while receivers remain (it would wait for ever): `is_closed`.
            (BcOp::IsClosed(_) | BcOp::Closed(_), Some(t), _) => (
                Got::Flag(model.rxs.is_empty()),
                Got::Flag(txs[t].is_closed()),
            ),
            _ => (Got::Skipped, Got::Skipped),
        };
        step_ok(step, op, &want, &got, &live, model.alive())?;
    }
    drop((txs, rxs));
    step_ok(ops.len(), &"the end", &Got::Done, &Got::Done, &live, 0)
}

#[test]
fn broadcast_matches_the_sequential_model_on_threads_and_in_fibers() {
    check(
        96,
        || {
            let h = any::<u8>();
            let op = prop_oneof![
                6 => h.prop_map(BcOp::Send),
                2 => (h, 1u8..=24).prop_map(|(h, n)| BcOp::Burst(h, n)),
                1 => h.prop_map(BcOp::CloneSender),
                1 => h.prop_map(BcOp::DropSender),
                2 => h.prop_map(BcOp::Subscribe),
                1 => h.prop_map(BcOp::Resubscribe),
                1 => h.prop_map(BcOp::DropReceiver),
                5 => h.prop_map(BcOp::Recv),
                5 => h.prop_map(BcOp::TryRecv),
                3 => h.prop_map(BcOp::RecvTimeout0),
                1 => h.prop_map(BcOp::RxLen),
                1 => h.prop_map(BcOp::RxIsEmpty),
                1 => h.prop_map(BcOp::TxLen),
                1 => h.prop_map(BcOp::TxIsEmpty),
                1 => h.prop_map(BcOp::ReceiverCount),
                1 => h.prop_map(BcOp::IsClosed),
                1 => h.prop_map(BcOp::Closed),
            ];
            let capacity = prop_oneof![1usize..=4, 15usize..=20];
            (capacity, prop::collection::vec(op, 0..80))
        },
        |s, v| in_both_contexts(s, v, run_broadcast),
    );
}

// -------------------------------------------------------------------------- concurrent

/// How a producer sends: `send` (waiting), `try_send` retried after a yield, or a send with
/// a short timeout retried (`mpmc`'s bounded channels; `try_send` elsewhere).
#[derive(Debug, Clone, Copy)]
enum SendHow {
    Wait,
    Try,
    Timeout(u8),
}

/// How a consumer receives: `recv`, `try_recv` retried after a yield, or `recv_timeout`
/// with a short timeout retried.
#[derive(Debug, Clone, Copy)]
enum RecvHow {
    Wait,
    Try,
    Timeout(u8),
}

fn send_how() -> impl Strategy<Value = SendHow> {
    prop_oneof![
        Just(SendHow::Wait),
        Just(SendHow::Try),
        (0u8..3).prop_map(SendHow::Timeout)
    ]
}

fn recv_how() -> impl Strategy<Value = RecvHow> {
    prop_oneof![
        Just(RecvHow::Wait),
        Just(RecvHow::Try),
        (0u8..3).prop_map(RecvHow::Timeout)
    ]
}

/// The messages dropped while armed: by the channel, never received nor given back.
type DropLog = Arc<StdMutex<Vec<(usize, u32)>>>;

/// Message `seq` of producer `p`. Armed, its drop is logged; a consumer that receives it,
/// or a producer that gets it back, disarms it.
struct Note {
    p: usize,
    seq: u32,
    log: Option<DropLog>,
}

impl Note {
    fn disarm(mut self) -> (usize, u32) {
        self.log = None;
        (self.p, self.seq)
    }
}

impl Drop for Note {
    fn drop(&mut self) {
        if let Some(log) = &self.log {
            log.lock().unwrap().push((self.p, self.seq));
        }
    }
}

/// A sender of either flavour, as the concurrent properties use it: `put` retries a send
/// that found no room until it goes through, and gives the message back if every receiver
/// is gone.
trait Put: Send + 'static {
    fn put(&self, how: SendHow, m: Note) -> Result<(), Note>;
}

/// A receiver of either flavour: `take` retries until a message comes (`None`: every sender
/// is gone and the channel is empty).
trait Take: Send + 'static {
    fn take(&self, how: RecvHow) -> Option<Note>;
}

/// `try_send` retried after a yield while there is no room.
fn try_until_room(
    try_send: impl Fn(Note) -> Result<(), mpsc::TrySendError<Note>>,
    mut m: Note,
) -> Result<(), Note> {
    loop {
        match try_send(m) {
            Ok(()) => return Ok(()),
            Err(mpsc::TrySendError::Full(back)) => {
                m = back;
                Fiber::yield_now();
            }
            Err(mpsc::TrySendError::Disconnected(back)) => return Err(back),
        }
    }
}

impl Put for mpsc::Sender<Note> {
    fn put(&self, _: SendHow, m: Note) -> Result<(), Note> {
        self.send(m).map_err(|e| e.0)
    }
}

impl Put for mpsc::SyncSender<Note> {
    fn put(&self, how: SendHow, m: Note) -> Result<(), Note> {
        match how {
            SendHow::Wait => self.send(m).map_err(|e| e.0),
            SendHow::Try | SendHow::Timeout(_) => try_until_room(|m| self.try_send(m), m),
        }
    }
}

impl Put for mpmc::Sender<Note> {
    fn put(&self, how: SendHow, m: Note) -> Result<(), Note> {
        match how {
            SendHow::Wait => self.send(m).map_err(|e| e.0),
            SendHow::Try => try_until_room(|m| self.try_send(m), m),
            SendHow::Timeout(ms) => self
                .send_timeout(m, Duration::from_millis(ms.into()))
                .map_err(mpmc::SendTimeoutError::into_inner),
        }
    }
}

impl Put for mpmc::SyncSender<Note> {
    fn put(&self, how: SendHow, mut m: Note) -> Result<(), Note> {
        match how {
            SendHow::Wait => self.send(m).map_err(|e| e.0),
            SendHow::Try => try_until_room(|m| self.try_send(m), m),
            SendHow::Timeout(ms) => loop {
                match self.send_timeout(m, Duration::from_millis(ms.into())) {
                    Ok(()) => return Ok(()),
                    Err(mpmc::SendTimeoutError::Timeout(back)) => m = back,
                    Err(mpmc::SendTimeoutError::Disconnected(back)) => return Err(back),
                }
            },
        }
    }
}

/// A receive in the way `how` says, with the receiver's three calls. The retrying forms
/// wait a millisecond every fourth try: on a rendezvous channel a `try_recv` only meets a
/// sender that waits, and a `try_send` a receiver that waits, so two sides that only try
/// would never meet.
fn take_with(
    how: RecvHow,
    recv: impl Fn() -> Result<Note, mpsc::RecvError>,
    try_recv: impl Fn() -> Result<Note, mpsc::TryRecvError>,
    recv_timeout: impl Fn(Duration) -> Result<Note, mpsc::RecvTimeoutError>,
) -> Option<Note> {
    let mut tries = 0u32;
    loop {
        tries += 1;
        let r = match how {
            RecvHow::Wait => return recv().ok(),
            _ if tries.is_multiple_of(4) => recv_timeout(Duration::from_millis(1)),
            RecvHow::Try => match try_recv() {
                Ok(m) => Ok(m),
                Err(mpsc::TryRecvError::Empty) => {
                    Fiber::yield_now();
                    Err(mpsc::RecvTimeoutError::Timeout)
                }
                Err(mpsc::TryRecvError::Disconnected) => Err(mpsc::RecvTimeoutError::Disconnected),
            },
            RecvHow::Timeout(ms) => recv_timeout(Duration::from_millis(ms.into())),
        };
        match r {
            Ok(m) => return Some(m),
            Err(mpsc::RecvTimeoutError::Timeout) => {}
            Err(mpsc::RecvTimeoutError::Disconnected) => return None,
        }
    }
}

impl Take for mpsc::Receiver<Note> {
    fn take(&self, how: RecvHow) -> Option<Note> {
        take_with(
            how,
            || self.recv(),
            || self.try_recv(),
            |d| self.recv_timeout(d),
        )
    }
}

impl Take for mpmc::Receiver<Note> {
    fn take(&self, how: RecvHow) -> Option<Note> {
        take_with(
            how,
            || self.recv(),
            || self.try_recv(),
            |d| self.recv_timeout(d),
        )
    }
}

/// A producer: where it runs, how many messages it sends, how, and how often it pauses.
#[derive(Debug, Clone)]
struct Producer {
    ctx: Ctx,
    count: u32,
    how: SendHow,
    pause: u8,
}

/// A consumer: where it runs, how it receives, and after how many messages it drops its
/// receiver (`None`: it receives until the channel disconnects).
#[derive(Debug, Clone)]
struct Consumer {
    ctx: Ctx,
    how: RecvHow,
    stop_after: Option<u32>,
    pause: u8,
}

fn producers(most: usize) -> impl Strategy<Value = Vec<Producer>> {
    let p = (ctx(), 0u32..40, send_how(), 0u8..4).prop_map(|(ctx, count, how, pause)| Producer {
        ctx,
        count,
        how,
        pause,
    });
    prop::collection::vec(p, 1..=most)
}

fn consumers(most: usize) -> impl Strategy<Value = Vec<Consumer>> {
    let stop = prop_oneof![3 => Just(None), 1 => (0u32..30).prop_map(Some)];
    let c = (ctx(), recv_how(), stop, 0u8..4).prop_map(|(ctx, how, stop_after, pause)| Consumer {
        ctx,
        how,
        stop_after,
        pause,
    });
    prop::collection::vec(c, 1..=most)
}

/// What a producer did: how many messages it made, and the one a failed send gave back.
struct Produced {
    made: u32,
    returned: Option<u32>,
}

fn produce(tx: impl Put, p: usize, plan: Producer, log: DropLog) -> Produced {
    for seq in 0..plan.count {
        let m = Note {
            p,
            seq,
            log: Some(log.clone()),
        };
        if let Err(back) = tx.put(plan.how, m) {
            return Produced {
                made: seq + 1,
                returned: Some(back.disarm().1),
            };
        }
        pause(plan.pause, seq);
    }
    Produced {
        made: plan.count,
        returned: None,
    }
}

/// What a consumer received, in order, and whether it stopped early (before the channel
/// disconnected).
struct Consumed {
    got: Vec<(usize, u32)>,
    stopped: bool,
}

fn consume(rx: impl Take, plan: Consumer) -> Consumed {
    let mut got = Vec::new();
    loop {
        if plan.stop_after == Some(got.len() as u32) {
            return Consumed { got, stopped: true };
        }
        match rx.take(plan.how) {
            Some(m) => got.push(m.disarm()),
            None => {
                return Consumed {
                    got,
                    stopped: false,
                }
            }
        }
        pause(plan.pause, got.len() as u32);
    }
}

/// Runs the plan on a channel of either flavour (`rx` cloned for each consumer by `split`)
/// and checks conservation and per-producer order.
fn run_plan<T: Put + Clone, R: Take>(
    sched: &Scheduler,
    (tx, rx): (T, R),
    split: impl Fn(&R) -> R,
    producers: Vec<Producer>,
    consumers: Vec<Consumer>,
) -> Result<(), TestCaseError> {
    let log = DropLog::default();
    let last = consumers.len() - 1;
    let mut rx = Some(rx);
    let consuming: Vec<_> = consumers
        .iter()
        .enumerate()
        .map(|(i, c)| {
            let mine = if i == last {
                rx.take().unwrap()
            } else {
                split(rx.as_ref().unwrap())
            };
            let plan = c.clone();
            go(sched, c.ctx, move || consume(mine, plan))
        })
        .collect();
    let producing: Vec<_> = producers
        .iter()
        .enumerate()
        .map(|(p, plan)| {
            let (tx, plan, log) = (tx.clone(), plan.clone(), log.clone());
            go(sched, plan.ctx, move || produce(tx, p, plan, log))
        })
        .collect();
    drop(tx);
    let produced: Vec<Produced> = producing.into_iter().map(Joiner::join).collect();
    let consumed: Vec<Consumed> = consuming.into_iter().map(Joiner::join).collect();
    let dropped = std::mem::take(&mut *log.lock().unwrap());

    // Every message made is received once, given back once, or dropped once by the channel.
    let mut accounted: Vec<(usize, u32)> = consumed.iter().flat_map(|c| c.got.clone()).collect();
    accounted.extend(
        produced
            .iter()
            .enumerate()
            .filter_map(|(p, r)| Some((p, r.returned?))),
    );
    accounted.extend(dropped.iter().copied());
    accounted.sort_unstable();
    let made: Vec<(usize, u32)> = produced
        .iter()
        .enumerate()
        .flat_map(|(p, r)| (0..r.made).map(move |seq| (p, seq)))
        .collect();
    prop_assert_eq!(&accounted, &made, "received + given back + dropped != made");
    // Only the last receiver's drop disconnects the senders and drops what is left.
    if consumed.iter().any(|c| !c.stopped) {
        prop_assert!(
            dropped.is_empty(),
            "dropped with a receiver still there: {:?}",
            dropped
        );
        for (p, r) in produced.iter().enumerate() {
            prop_assert_eq!(r.returned, None, "producer {} disconnected", p);
            prop_assert_eq!(r.made, producers[p].count);
        }
    }
    // Each consumer gets each producer's messages in the order they were sent.
    for (i, c) in consumed.iter().enumerate() {
        for p in 0..producers.len() {
            let seqs: Vec<u32> = c.got.iter().filter(|m| m.0 == p).map(|m| m.1).collect();
            prop_assert!(
                seqs.windows(2).all(|w| w[0] < w[1]),
                "consumer {} got producer {}'s messages out of order: {:?}",
                i,
                p,
                seqs
            );
        }
    }
    Ok(())
}

#[test]
fn mpsc_conserves_messages_and_keeps_each_producers_order_under_concurrency() {
    check(
        48,
        || (kinds(), producers(4), consumers(1)),
        |sched, (kind, producers, consumers)| match kind.bound() {
            None => run_plan(
                sched,
                mpsc::channel(),
                |_| unreachable!(),
                producers,
                consumers,
            ),
            Some(bound) => run_plan(
                sched,
                mpsc::sync_channel(bound),
                |_| unreachable!(),
                producers,
                consumers,
            ),
        },
    );
}

#[test]
fn mpmc_conserves_messages_and_keeps_each_producers_order_under_concurrency() {
    check(
        48,
        || (kinds(), producers(4), consumers(3)),
        |sched, (kind, producers, consumers)| match kind.bound() {
            None => run_plan(
                sched,
                mpmc::channel(),
                mpmc::Receiver::clone,
                producers,
                consumers,
            ),
            Some(bound) => run_plan(
                sched,
                mpmc::sync_channel(bound),
                mpmc::Receiver::clone,
                producers,
                consumers,
            ),
        },
    );
}

/// A broadcast message: producer `p`'s message `seq`, counting the live copies of the run.
#[derive(Debug)]
struct BcNote {
    p: usize,
    seq: u32,
    live: Arc<AtomicIsize>,
}

impl BcNote {
    fn new(p: usize, seq: u32, live: &Arc<AtomicIsize>) -> BcNote {
        live.fetch_add(1, Ordering::SeqCst);
        BcNote {
            p,
            seq,
            live: live.clone(),
        }
    }
}

impl Clone for BcNote {
    fn clone(&self) -> BcNote {
        BcNote::new(self.p, self.seq, &self.live)
    }
}

impl Drop for BcNote {
    fn drop(&mut self) {
        self.live.fetch_sub(1, Ordering::SeqCst);
    }
}

/// What a broadcast receiver saw, in order.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Seen {
    Msg(usize, u32),
    Lagged(u64),
}

/// Receives the way `plan` says until the channel closes (the bool: it saw `Closed`) or it
/// has received `stop_after` messages.
fn bc_consume(mut rx: broadcast::Receiver<BcNote>, plan: Consumer) -> (Vec<Seen>, bool) {
    let mut seen = Vec::new();
    let mut msgs = 0;
    loop {
        if plan.stop_after == Some(msgs) {
            return (seen, false);
        }
        let r = match plan.how {
            RecvHow::Wait => rx.recv(),
            RecvHow::Try => loop {
                match rx.try_recv() {
                    Ok(m) => break Ok(m),
                    Err(broadcast::TryRecvError::Empty) => Fiber::yield_now(),
                    Err(broadcast::TryRecvError::Lagged(n)) => {
                        break Err(broadcast::RecvError::Lagged(n))
                    }
                    Err(broadcast::TryRecvError::Closed) => {
                        break Err(broadcast::RecvError::Closed)
                    }
                }
            },
            RecvHow::Timeout(ms) => loop {
                match rx.recv_timeout(Duration::from_millis(ms.into())) {
                    Ok(m) => break Ok(m),
                    Err(broadcast::RecvTimeoutError::Timeout) => {}
                    Err(broadcast::RecvTimeoutError::Lagged(n)) => {
                        break Err(broadcast::RecvError::Lagged(n))
                    }
                    Err(broadcast::RecvTimeoutError::Closed) => {
                        break Err(broadcast::RecvError::Closed)
                    }
                }
            },
        };
        match r {
            Ok(m) => {
                seen.push(Seen::Msg(m.p, m.seq));
                msgs += 1;
            }
            Err(broadcast::RecvError::Lagged(n)) => seen.push(Seen::Lagged(n)),
            Err(broadcast::RecvError::Closed) => return (seen, true),
        }
        pause(plan.pause, seen.len() as u32);
    }
}

/// What a broadcast producer did: messages made, the one a failed send gave back, and the
/// receiver counts its sends reported.
struct BcProduced {
    made: u32,
    returned: Option<u32>,
    counts: Vec<usize>,
}

fn bc_produce(
    tx: broadcast::Sender<BcNote>,
    p: usize,
    plan: Producer,
    live: Arc<AtomicIsize>,
) -> BcProduced {
    let mut counts = Vec::new();
    for seq in 0..plan.count {
        match tx.send(BcNote::new(p, seq, &live)) {
            Ok(n) => counts.push(n),
            Err(broadcast::SendError(m)) => {
                return BcProduced {
                    made: seq + 1,
                    returned: Some(m.seq),
                    counts,
                }
            }
        }
        pause(plan.pause, seq);
    }
    BcProduced {
        made: plan.count,
        returned: None,
        counts,
    }
}

fn run_broadcast_plan(
    sched: &Scheduler,
    (capacity, producers, consumers): (usize, Vec<Producer>, Vec<Consumer>),
) -> Result<(), TestCaseError> {
    let live = Arc::new(AtomicIsize::new(0));
    let (tx, rx) = broadcast::channel::<BcNote>(capacity);
    // Every receiver subscribes before the first send: all of them start at position 0.
    let mut rxs: Vec<_> = (1..consumers.len()).map(|_| tx.subscribe()).collect();
    rxs.push(rx);
    let receiving: Vec<_> = consumers
        .iter()
        .zip(rxs)
        .map(|(plan, rx)| {
            let plan = plan.clone();
            go(sched, plan.ctx, move || bc_consume(rx, plan))
        })
        .collect();
    let sending: Vec<_> = producers
        .iter()
        .enumerate()
        .map(|(p, plan)| {
            let (tx, plan, live) = (tx.clone(), plan.clone(), live.clone());
            go(sched, plan.ctx, move || bc_produce(tx, p, plan, live))
        })
        .collect();
    drop(tx);
    let produced: Vec<BcProduced> = sending.into_iter().map(Joiner::join).collect();
    let received: Vec<(Vec<Seen>, bool)> = receiving.into_iter().map(Joiner::join).collect();
    prop_assert_eq!(
        live.load(Ordering::SeqCst),
        0,
        "messages leaked or dropped twice"
    );

    let sent: u64 = produced
        .iter()
        .map(|r| u64::from(r.made) - u64::from(r.returned.is_some()))
        .sum();
    let n = consumers.len();
    for (p, r) in produced.iter().enumerate() {
        prop_assert!(
            r.counts.iter().all(|&c| (1..=n).contains(&c)),
            "producer {}: counts {:?}",
            p,
            r.counts
        );
    }
    // A send fails only once every receiver is gone.
    if received.iter().any(|r| r.1) {
        prop_assert!(
            produced.iter().all(|r| r.returned.is_none()),
            "a send failed while a receiver read on"
        );
    }
    // Each receiver's messages and lags, laid out by position, agree with the others': one
    // order of all messages, in which each producer's are in its order.
    let mut order: Vec<Option<(usize, u32)>> = vec![None; sent as usize];
    for (i, (seen, closed)) in received.iter().enumerate() {
        let mut pos = 0u64;
        for s in seen {
            match *s {
                Seen::Msg(p, seq) => {
                    prop_assert!(pos < sent, "receiver {} got more than was sent", i);
                    let at = &mut order[pos as usize];
                    prop_assert!(
                        at.is_none_or(|m| m == (p, seq)),
                        "receiver {} disagrees at {}",
                        i,
                        pos
                    );
                    *at = Some((p, seq));
                    pos += 1;
                }
                Seen::Lagged(missed) => {
                    prop_assert!(
                        missed > 0 && capacity < sent as usize,
                        "receiver {}: {:?}",
                        i,
                        s
                    );
                    pos += missed;
                }
            }
        }
        if *closed {
            prop_assert_eq!(pos, sent, "receiver {} saw Closed before the end", i);
        }
    }
    let known: Vec<(usize, u32)> = order.iter().flatten().copied().collect();
    let mut unique = known.clone();
    unique.sort_unstable();
    unique.dedup();
    prop_assert_eq!(unique.len(), known.len(), "a message at two positions");
    for p in 0..producers.len() {
        let seqs: Vec<u32> = known.iter().filter(|m| m.0 == p).map(|m| m.1).collect();
        prop_assert!(
            seqs.windows(2).all(|w| w[0] < w[1]),
            "producer {} out of order: {:?}",
            p,
            seqs
        );
    }
    Ok(())
}

#[test]
fn broadcast_receivers_agree_on_one_order_and_count_their_lags_exactly() {
    check(
        48,
        || {
            let capacity = prop_oneof![1usize..=6, Just(256)];
            (capacity, producers(3), consumers(3))
        },
        run_broadcast_plan,
    );
}
