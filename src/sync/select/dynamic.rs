//! [`SelectArms`]: a select over operations chosen at run time, each with a closure for its
//! result.

use super::ops::forward_op;
use super::{run, Mode, Op, RecvOp, SelectRecv, SelectSend, SendOp, Signal};
use crate::sync::mpsc::{RecvError, SendError};
use std::sync::Arc;
use std::time::Duration;

/// A select over a set of operations built at run time — any number of them, each with
/// the closure that handles its result; [`select!`](crate::select) is the fixed-set form,
/// and [`Select`](super::Select) crossbeam's form, by index.
///
/// [`wait`](SelectArms::wait) completes exactly one operation (chosen at random among the ready
/// ones), runs its closure and returns what it returns.
///
/// ```
/// use fibra::sync::{mpsc, SelectArms};
///
/// let channels: Vec<_> = (0..5).map(|_| mpsc::channel::<u32>()).collect();
/// channels[3].0.send(30).unwrap();
/// let mut sel = SelectArms::new();
/// for (i, (_, rx)) in channels.iter().enumerate() {
///     sel.recv(rx, move |msg| (i, msg.unwrap()));
/// }
/// assert_eq!(sel.wait(), (3, 30));
/// ```
pub struct SelectArms<'a, R> {
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
    op: SendOp<'a, Tx, Box<dyn FnOnce() -> Tx::Item + 'a>>,
    f: Option<F>,
}

macro_rules! delegate_op {
    ($arm:ident, $bound:ident, $out:ty) => {
        impl<Ch: $bound, F> Op for $arm<'_, Ch, F> {
            fn try_complete(&mut self) -> bool {
                self.op.try_complete()
            }
            fn offer(&mut self, s: &Arc<Signal>, arm: usize) {
                self.op.offer(s, arm);
            }
            forward_op!();
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

impl<R> Default for SelectArms<'_, R> {
    fn default() -> Self {
        SelectArms::new()
    }
}

impl<'a, R> SelectArms<'a, R> {
    /// No operations yet.
    pub fn new() -> Self {
        SelectArms { arms: Vec::new() }
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
            op: SendOp::new(s, Box::new(move || msg)),
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
        assert!(!self.is_empty(), "SelectArms::wait with no operations");
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

impl<R> std::fmt::Debug for SelectArms<'_, R> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SelectArms")
            .field("operations", &self.len())
            .finish()
    }
}
