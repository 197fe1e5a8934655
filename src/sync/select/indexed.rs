//! [`Select`]: crossbeam-channel's select over operations added at run time, by index.
//!
//! `select` completes a receive when it chooses it (the message waits in the
//! [`SelectedOperation`] for [`recv`](SelectedOperation::recv)); a send is chosen when the
//! channel could take a message, and completes when [`send`](SelectedOperation::send) gives
//! it. `ready` completes nothing: it says which operation could.

use super::ops::forward_op;
use super::{run, run_biased, Mode, Op, RecvOp, SelectRecv, SelectSend, Signal};
use crate::sync::mpsc::{RecvError, SendError};
use std::any::Any;
use std::fmt;
use std::marker::PhantomData;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// A select over channel operations added at run time, each known by the index its
/// [`recv`](Select::recv) or [`send`](Select::send) returned, in crossbeam-channel's shape.
/// [`select!`](crate::select) is the fixed-set form; [`SelectArms`](super::SelectArms) runs
/// a closure per operation instead.
///
/// ```
/// use fibra::sync::{mpsc, Select};
///
/// let (tx1, rx1) = mpsc::channel::<u32>();
/// let (tx2, rx2) = mpsc::channel::<&str>();
/// tx2.send("hi").unwrap();
/// let mut sel = Select::new();
/// let first = sel.recv(&rx1);
/// let second = sel.recv(&rx2);
/// let oper = sel.select();
/// match oper.index() {
///     i if i == first => println!("{}", oper.recv(&rx1).unwrap()),
///     i if i == second => assert_eq!(oper.recv(&rx2), Ok("hi")),
///     _ => unreachable!(),
/// }
/// # drop(tx1);
/// ```
///
/// Differences from crossbeam: a receive's message type must be `'static` (the chosen
/// message waits, type-erased, in the [`SelectedOperation`]); and a chosen send that another
/// sender beat to the channel's room waits for room when it is given its message (crossbeam
/// reserves the room).
pub struct Select<'a> {
    ops: Vec<Option<Entry<'a>>>,
    biased: bool,
}

struct Entry<'a> {
    op: Box<dyn IndexedOp + 'a>,
    chan: *const (),
}

/// An operation as [`Select`] drives it.
trait IndexedOp: Op {
    /// `true`: only find out whether the operation could complete (`ready`, and every
    /// send); `false`: complete it (a receive in `select`).
    fn set_probe(&mut self, probe: bool);
    /// The completed receive's result, type-erased.
    fn take_any(&mut self) -> Option<Box<dyn Any + Send>>;
}

struct RecvEntry<'a, R: SelectRecv> {
    op: RecvOp<'a, R>,
    probe: bool,
}

impl<R: SelectRecv> Op for RecvEntry<'_, R>
where
    R::Item: Send + 'static,
{
    fn try_complete(&mut self) -> bool {
        if self.probe {
            self.op.channel().ready_to_recv()
        } else {
            self.op.try_complete()
        }
    }
    fn offer(&mut self, s: &Arc<Signal>, arm: usize) {
        if !self.probe {
            self.op.offer(s, arm);
        }
    }
    forward_op!();
}

impl<R: SelectRecv> IndexedOp for RecvEntry<'_, R>
where
    R::Item: Send + 'static,
{
    fn set_probe(&mut self, probe: bool) {
        self.probe = probe;
    }
    fn take_any(&mut self) -> Option<Box<dyn Any + Send>> {
        (!self.probe).then(|| Box::new(self.op.take()) as Box<dyn Any + Send>)
    }
}

struct SendEntry<'a, S: SelectSend> {
    s: &'a S,
}

impl<S: SelectSend> Op for SendEntry<'_, S> {
    fn try_complete(&mut self) -> bool {
        self.s.ready_to_send()
    }
    fn watch(&self, s: &Arc<Signal>) {
        self.s.watch_send(s, true);
    }
    fn unwatch(&self, s: &Arc<Signal>) {
        self.s.watch_send(s, false);
    }
}

impl<S: SelectSend> IndexedOp for SendEntry<'_, S> {
    fn set_probe(&mut self, _probe: bool) {}
    fn take_any(&mut self) -> Option<Box<dyn Any + Send>> {
        None
    }
}

impl Default for Select<'_> {
    fn default() -> Self {
        Select::new()
    }
}

impl<'a> Select<'a> {
    /// No operations yet; when several are ready, one is chosen at random.
    pub fn new() -> Self {
        Select {
            ops: Vec::new(),
            biased: false,
        }
    }

    /// No operations yet; when several are ready, the first added is chosen.
    pub fn new_biased() -> Self {
        Select {
            ops: Vec::new(),
            biased: true,
        }
    }

    /// Adds a receive from `r`: a fibra `mpsc` or `mpmc` `Receiver`, a
    /// [`CancellationToken`](crate::sync::CancellationToken), or an
    /// [`after`](crate::sync::after)/[`tick`](crate::sync::tick)/[`never`](crate::sync::never)
    /// receiver. Returns its index.
    pub fn recv<R: SelectRecv>(&mut self, r: &'a R) -> usize
    where
        R::Item: Send + 'static,
    {
        self.push(
            Box::new(RecvEntry {
                op: RecvOp::new(r),
                probe: false,
            }),
            r.channel_id(),
        )
    }

    /// Adds a send on `s` (its message is given to [`SelectedOperation::send`]). Returns its
    /// index.
    pub fn send<S: SelectSend>(&mut self, s: &'a S) -> usize {
        self.push(Box::new(SendEntry { s }), s.channel_id())
    }

    fn push(&mut self, op: Box<dyn IndexedOp + 'a>, chan: *const ()) -> usize {
        self.ops.push(Some(Entry { op, chan }));
        self.ops.len() - 1
    }

    /// Removes the operation of index `index`; the indices of the others stay.
    ///
    /// # Panics
    /// If there is no such operation (never added, or removed already).
    pub fn remove(&mut self, index: usize) {
        let entry = self.ops.get_mut(index).and_then(Option::take);
        assert!(
            entry.is_some(),
            "Select::remove: no operation with index {index}"
        );
    }

    /// Chooses an operation that can complete now, if one can.
    ///
    /// # Errors
    /// [`TrySelectError`] if none can.
    pub fn try_select(&mut self) -> Result<SelectedOperation<'a>, TrySelectError> {
        self.choose(false, Mode::Now).ok_or(TrySelectError)
    }

    /// Waits — suspending a fiber, blocking a thread — until an operation can complete, and
    /// chooses it.
    ///
    /// # Panics
    /// With no operations (it would wait for ever).
    pub fn select(&mut self) -> SelectedOperation<'a> {
        assert!(self.live() > 0, "Select::select with no operations");
        self.choose(false, Mode::Block)
            .expect("a blocking select chooses an operation")
    }

    /// [`select`](Select::select), waiting at most `timeout`.
    ///
    /// # Errors
    /// [`SelectTimeoutError`] if no operation could complete in time.
    pub fn select_timeout(
        &mut self,
        timeout: Duration,
    ) -> Result<SelectedOperation<'a>, SelectTimeoutError> {
        self.choose(false, Mode::For(timeout))
            .ok_or(SelectTimeoutError)
    }

    /// [`select`](Select::select), waiting until `deadline` at the latest.
    ///
    /// # Errors
    /// [`SelectTimeoutError`] if no operation could complete in time.
    pub fn select_deadline(
        &mut self,
        deadline: Instant,
    ) -> Result<SelectedOperation<'a>, SelectTimeoutError> {
        self.select_timeout(deadline.saturating_duration_since(Instant::now()))
    }

    /// The index of an operation that could complete now, completing nothing.
    ///
    /// # Errors
    /// [`TryReadyError`] if none could.
    pub fn try_ready(&mut self) -> Result<usize, TryReadyError> {
        self.choose(true, Mode::Now)
            .map(|o| o.into_index())
            .ok_or(TryReadyError)
    }

    /// Waits until an operation could complete and returns its index, completing nothing:
    /// by the time the caller acts, another thread or fiber may have taken the chance.
    ///
    /// # Panics
    /// With no operations.
    pub fn ready(&mut self) -> usize {
        assert!(self.live() > 0, "Select::ready with no operations");
        self.choose(true, Mode::Block)
            .expect("a blocking select chooses an operation")
            .into_index()
    }

    /// [`ready`](Select::ready), waiting at most `timeout`.
    ///
    /// # Errors
    /// [`ReadyTimeoutError`] if no operation became ready in time.
    pub fn ready_timeout(&mut self, timeout: Duration) -> Result<usize, ReadyTimeoutError> {
        self.choose(true, Mode::For(timeout))
            .map(|o| o.into_index())
            .ok_or(ReadyTimeoutError)
    }

    /// [`ready`](Select::ready), waiting until `deadline` at the latest.
    ///
    /// # Errors
    /// [`ReadyTimeoutError`] if no operation became ready in time.
    pub fn ready_deadline(&mut self, deadline: Instant) -> Result<usize, ReadyTimeoutError> {
        self.ready_timeout(deadline.saturating_duration_since(Instant::now()))
    }

    fn live(&self) -> usize {
        self.ops.iter().flatten().count()
    }

    fn choose(&mut self, probe: bool, mode: Mode) -> Option<SelectedOperation<'a>> {
        let biased = self.biased;
        let mut indices = Vec::with_capacity(self.ops.len());
        let mut ops: Vec<&mut dyn Op> = Vec::with_capacity(self.ops.len());
        for (i, entry) in self.ops.iter_mut().enumerate() {
            if let Some(entry) = entry {
                entry.op.set_probe(probe);
                indices.push(i);
                ops.push(&mut *entry.op as &mut dyn Op);
            }
        }
        if ops.is_empty() {
            if let Mode::For(d) = mode {
                crate::sleep(d);
            }
            return None;
        }
        let k = if biased {
            run_biased(&mut ops, mode)?
        } else {
            run(&mut ops, mode)?
        };
        let index = indices[k];
        let entry = self.ops[index].as_mut().expect("a live operation");
        Some(SelectedOperation {
            index,
            chan: entry.chan,
            got: entry.op.take_any(),
            finished: probe,
            _select: PhantomData,
        })
    }
}

impl fmt::Debug for Select<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Select")
            .field("operations", &self.live())
            .field("biased", &self.biased)
            .finish()
    }
}

/// The operation a [`Select`] chose: finish it with [`recv`](SelectedOperation::recv) or
/// [`send`](SelectedOperation::send), on the very channel it was added with.
///
/// # Panics
/// Dropped without being finished (the chosen receive's message would be lost), unless the
/// thread is already panicking.
#[must_use = "a chosen operation must be finished with recv or send"]
pub struct SelectedOperation<'a> {
    index: usize,
    chan: *const (),
    /// A receive's result, taken when it was chosen.
    got: Option<Box<dyn Any + Send>>,
    finished: bool,
    _select: PhantomData<&'a ()>,
}

impl SelectedOperation<'_> {
    /// The index of the operation chosen.
    pub fn index(&self) -> usize {
        self.index
    }

    fn into_index(mut self) -> usize {
        self.finished = true;
        self.index
    }

    /// Finishes the chosen receive: its message, or [`RecvError`] if every sender was gone.
    ///
    /// # Panics
    /// If `r` is not a receiver of the channel the operation was added with (a clone of the
    /// handle is one), or the operation is a send.
    pub fn recv<R: SelectRecv>(mut self, r: &R) -> Result<R::Item, RecvError>
    where
        R::Item: 'static,
    {
        assert!(
            r.channel_id() == self.chan,
            "SelectedOperation::recv with a receiver of another channel than the chosen operation's"
        );
        let got = self
            .got
            .take()
            .expect("SelectedOperation::recv on a chosen send");
        self.finished = true;
        *got.downcast::<Result<R::Item, RecvError>>()
            .expect("the chosen receive's message type")
    }

    /// Finishes the chosen send with `msg`. If another sender took the room the choice saw,
    /// it waits for room (suspending a fiber, blocking a thread).
    ///
    /// # Errors
    /// Gives the message back if every receiver is gone.
    ///
    /// # Panics
    /// If `s` is not a sender of the channel the operation was added with (a clone of the
    /// handle is one), or the operation is a receive.
    pub fn send<S: SelectSend>(mut self, s: &S, msg: S::Item) -> Result<(), SendError<S::Item>> {
        assert!(
            s.channel_id() == self.chan && self.got.is_none(),
            "SelectedOperation::send with a sender of another channel than the chosen operation's"
        );
        self.finished = true;
        s.send_waiting(msg)
    }
}

impl Drop for SelectedOperation<'_> {
    fn drop(&mut self) {
        if !self.finished && !std::thread::panicking() {
            panic!("a SelectedOperation dropped without being finished with recv or send");
        }
    }
}

impl fmt::Debug for SelectedOperation<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SelectedOperation")
            .field("index", &self.index)
            .finish()
    }
}

/// The errors of [`Select`]'s calls that do not wait, or wait for a while: no operation was
/// ready (in time).
macro_rules! select_error {
    ($name:ident, $text:literal) => {
        #[doc = concat!("The error of a [`Select`] call: ", $text, ".")]
        #[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
        pub struct $name;

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str($text)
            }
        }

        impl std::error::Error for $name {}
    };
}
select_error!(TrySelectError, "no operation could complete now");
select_error!(SelectTimeoutError, "no operation could complete in time");
select_error!(TryReadyError, "no operation was ready");
select_error!(ReadyTimeoutError, "no operation became ready in time");
