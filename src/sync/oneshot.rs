//! A channel for exactly one value: [`channel`], [`Sender`], [`Receiver`].
//!
//! # The slot
//! One allocation holds the value cell, the receiver's unparker cell and a state word of four
//! flags, each set once:
//! - `WAITING` — the receiver's unparker is in the `waiter` cell (set by the park
//!   registration, after the receiving fiber has switched out);
//! - `SENT` — the value is in the `value` cell;
//! - `TX_GONE` — the sender was dropped without sending;
//! - `RX_GONE` — the receiver was dropped.
//!
//! The sender writes the value, then sets `SENT` with one `fetch_or`; if that shows
//! `WAITING`, it takes the unparker and wakes the receiver. The receiver publishes its
//! unparker and sets `WAITING` with a `fetch_or`; if that shows `SENT` or `TX_GONE`, the
//! sender's side came first and never looks at the cell, so the receiver wakes itself. A receiver whose deadline passes clears `WAITING`
//! with a `fetch_and`: if neither `SENT` nor `TX_GONE` had been set, the waiter cell is its
//! own again; otherwise the sender owns the waiter cell and the receiver leaves it alone.
//! No lock and no queue: a oneshot has at most one waiter, by construction (`Receiver`'s
//! waiting methods take `self` or `&mut self`), so the wait queue's FIFO would only add a
//! lock to the hottest path of `ping_pong`. The handshake is the same as the wait queue's
//! node handshake (publish after suspend, exactly one unpark) and is model-checked likewise.

use super::deadline_after;
use super::shim::{park, Arc, AtomicUsize, Ordering, ParkResult, Unparker, UnsafeCell};
use crate::dump::WaitOn;
use std::fmt;
use std::time::{Duration, Instant};

pub use std::sync::mpsc::{RecvError, RecvTimeoutError, TryRecvError};

const WAITING: usize = 0b0001;
const SENT: usize = 0b0010;
const TX_GONE: usize = 0b0100;
const RX_GONE: usize = 0b1000;

struct Inner<T> {
    state: AtomicUsize,
    /// Written by the sender before `SENT`; read by the receiver after it saw `SENT`; taken
    /// back by the sender if the receiver was already gone.
    value: UnsafeCell<Option<T>>,
    /// Written by the receiver before `WAITING`; taken by whoever sets `SENT` or `TX_GONE`
    /// while `WAITING` is set, else by the receiver again.
    waiter: UnsafeCell<Option<Unparker>>,
}

// SAFETY: the cells are handed between the two ends by the state word's protocol (module
// docs), so the slot moves a `T` from the sender's thread to the receiver's: `T: Send`.
unsafe impl<T: Send> Send for Inner<T> {}
// SAFETY: as above.
unsafe impl<T: Send> Sync for Inner<T> {}

/// Creates a oneshot channel: one [`Sender::send`], one receive.
///
/// Either end works from fibers and from plain threads; a receiving fiber is suspended, a
/// receiving thread blocked.
///
/// ```
/// let sched = fibra::Scheduler::builder().threads(2).build()?;
/// sched.start();
/// let (tx, rx) = fibra::sync::oneshot::channel();
/// let fiber = sched.submit(move || rx.recv().unwrap() * 2, None).unwrap();
/// std::thread::spawn(move || tx.send(21).unwrap());
/// assert_eq!(fiber.join().unwrap(), 42);
/// sched.stop();
/// # Ok::<(), fibra::Error>(())
/// ```
pub fn channel<T>() -> (Sender<T>, Receiver<T>) {
    let inner = Arc::new(Inner {
        state: AtomicUsize::new(0),
        value: UnsafeCell::new(None),
        waiter: UnsafeCell::new(None),
    });
    (
        Sender {
            inner: Some(inner.clone()),
        },
        Receiver {
            inner,
            polled: false,
        },
    )
}

/// The sending end of a [`oneshot`](self) channel.
pub struct Sender<T> {
    /// `None` once the value is sent.
    inner: Option<Arc<Inner<T>>>,
}

/// The receiving end of a [`oneshot`](self) channel.
///
/// It is also a [`Future`](std::future::Future) of the value, so async code can `.await`
/// it (`Err(RecvError)` if the sender was dropped without sending).
pub struct Receiver<T> {
    inner: Arc<Inner<T>>,
    /// A poll left a waker in the waiter cell (WAITING may be set): withdraw it before
    /// waiting another way.
    polled: bool,
}

impl<T> Sender<T> {
    /// Sends the value, waking the receiver if it waits. Never blocks.
    ///
    /// # Errors
    /// Gives the value back if the receiver has been dropped.
    pub fn send(mut self, value: T) -> Result<(), T> {
        crate::coop::spend();
        let inner = self.inner.take().expect("a sender sends once");
        // SAFETY: before SENT only the sender touches `value`.
        inner.value.with_mut(|v| unsafe { *v = Some(value) });
        // AcqRel: Release publishes the value to the receiver (which reads SENT with
        // Acquire); Acquire makes the unparker the receiver published with WAITING visible.
        let prev = inner.state.fetch_or(SENT, Ordering::AcqRel);
        if prev & RX_GONE != 0 {
            // SAFETY: the receiver is gone and never touched `value` (it had not seen SENT).
            let value = inner.value.with_mut(|v| unsafe { (*v).take() });
            return Err(value.expect("the value we just stored"));
        }
        if prev & WAITING != 0 {
            wake_receiver(&inner);
        }
        Ok(())
    }

    /// Whether the receiver has been dropped (a `send` would fail).
    pub fn is_closed(&self) -> bool {
        self.inner
            .as_ref()
            // Relaxed: a snapshot; `send` decides for itself.
            .is_none_or(|i| i.state.load(Ordering::Relaxed) & RX_GONE != 0)
    }
}

/// Wakes the receiver after setting SENT or TX_GONE over WAITING.
fn wake_receiver<T>(inner: &Inner<T>) {
    // SAFETY: we saw WAITING in the same read-modify-write that set SENT/TX_GONE (with
    // Acquire), so the receiver's unparker is written, and from now on the receiver leaves
    // the cell to us (its withdrawal sees our flag).
    let u = inner.waiter.with_mut(|w| unsafe { (*w).take() });
    if let Some(u) = u {
        u.unpark_owned();
    }
}

impl<T> Drop for Sender<T> {
    fn drop(&mut self) {
        if let Some(inner) = self.inner.take() {
            // AcqRel: Acquire for the receiver's unparker, as in `send`; Release so the
            // receiver that sees TX_GONE knows no value will come.
            let prev = inner.state.fetch_or(TX_GONE, Ordering::AcqRel);
            if prev & WAITING != 0 {
                wake_receiver(&inner);
            }
        }
    }
}

impl<T> Receiver<T> {
    /// Waits for the value, suspending a fiber (or blocking a thread).
    ///
    /// # Errors
    /// [`RecvError`] if the sender was dropped without sending.
    pub fn recv(mut self) -> Result<T, RecvError> {
        self.recv_until(None).map_err(|_| RecvError)
    }

    /// Waits at most `timeout` for the value. After a timeout the receiver can wait again.
    ///
    /// ```
    /// use std::sync::mpsc::RecvTimeoutError;
    /// use std::time::Duration;
    /// let (tx, mut rx) = fibra::sync::oneshot::channel::<u32>();
    /// assert_eq!(rx.recv_timeout(Duration::from_millis(5)), Err(RecvTimeoutError::Timeout));
    /// tx.send(7).unwrap();
    /// assert_eq!(rx.recv_timeout(Duration::from_millis(5)), Ok(7));
    /// ```
    ///
    /// # Errors
    /// [`RecvTimeoutError::Timeout`] if the time ran out, [`RecvTimeoutError::Disconnected`]
    /// if the sender was dropped without sending (or the value was already received).
    pub fn recv_timeout(&mut self, timeout: Duration) -> Result<T, RecvTimeoutError> {
        self.recv_until(deadline_after(timeout))
    }

    /// Takes the value if it has arrived; never waits.
    ///
    /// # Errors
    /// [`TryRecvError::Empty`] if not yet, [`TryRecvError::Disconnected`] if it never will
    /// (the sender was dropped, or the value was already received).
    pub fn try_recv(&mut self) -> Result<T, TryRecvError> {
        crate::coop::spend();
        self.take()
    }

    /// [`try_recv`](Receiver::try_recv) without spending the budget: a future's `poll`
    /// never yields the fiber that polls it.
    fn take(&mut self) -> Result<T, TryRecvError> {
        let inner = &*self.inner;
        // Acquire: pairs with the sender's Release, for the value.
        let s = inner.state.load(Ordering::Acquire);
        if s & SENT != 0 {
            // SAFETY: after SENT the value belongs to the receiver, and `&mut self` excludes
            // other receives.
            let value = inner.value.with_mut(|v| unsafe { (*v).take() });
            value.ok_or(TryRecvError::Disconnected)
        } else if s & TX_GONE != 0 {
            Err(TryRecvError::Disconnected)
        } else {
            Err(TryRecvError::Empty)
        }
    }

    /// Takes back the waker a poll left, so the waiter cell is free again. Returns whether
    /// the sender's side finished meanwhile.
    fn unpoll(&mut self) -> bool {
        std::mem::replace(&mut self.polled, false) && withdraw_waiter(&self.inner)
    }

    fn recv_until(&mut self, deadline: Option<Instant>) -> Result<T, RecvTimeoutError> {
        self.unpoll();
        match self.try_recv() {
            Ok(v) => return Ok(v),
            Err(TryRecvError::Disconnected) => return Err(RecvTimeoutError::Disconnected),
            Err(TryRecvError::Empty) => {}
        }
        let inner = &*self.inner;
        // If the fiber is cancelled while parked, withdraw like a timeout does, so the
        // waiter cell is never written while a sender may be reading it.
        let withdraw = Withdraw(inner);
        let parked = park(deadline, WaitOn::Channel("oneshot::Receiver::recv"), |u| {
            publish(inner, u)
        });
        std::mem::forget(withdraw);
        if parked == ParkResult::TimedOut && !withdraw_waiter(inner) {
            return Err(RecvTimeoutError::Timeout);
        }
        self.try_recv().map_err(|e| match e {
            TryRecvError::Disconnected => RecvTimeoutError::Disconnected,
            TryRecvError::Empty => unreachable!("woken without a value or a disconnection"),
        })
    }
}

#[cfg(not(loom))]
impl<T> std::future::Future for Receiver<T> {
    type Output = Result<T, RecvError>;

    fn poll(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Self::Output> {
        let this = &mut *self;
        this.unpoll();
        if let Some(r) = super::ready(this.take()) {
            return std::task::Poll::Ready(r);
        }
        // As a parked receiver publishes its unparker: if the sender's side finished first,
        // `publish` wakes the waker at once and the next poll takes the value.
        publish(&this.inner, Unparker::from_waker(cx.waker().clone()));
        this.polled = true;
        std::task::Poll::Pending
    }
}

/// The park registration: publish the receiver's unparker and set WAITING, unless the
/// sender's side already finished (then wake ourselves).
fn publish<T>(inner: &Inner<T>, u: Unparker) {
    // SAFETY: WAITING is clear (it is only set here, once per wait, and cleared by a
    // timeout), so no sender reads the cell; we are the only receiver.
    inner.waiter.with_mut(|w| unsafe { *w = Some(u) });
    // Release: the sender that sees WAITING (Acquire) sees the unparker.
    // Acquire: if the sender's side finished first, its writes are visible when we resume.
    let prev = inner.state.fetch_or(WAITING, Ordering::AcqRel);
    if prev & (SENT | TX_GONE) != 0 {
        // The sender's side finished without seeing WAITING, so it never touches the cell:
        // take the unparker back and wake ourselves. (WAITING stays set, harmlessly: the
        // sender is done, and a withdrawal sees SENT/TX_GONE and leaves the cell alone.)
        // SAFETY: as above.
        let u = inner.waiter.with_mut(|w| unsafe { (*w).take() });
        if let Some(u) = u {
            u.unpark_owned();
        }
    }
}

/// Clears WAITING after a timeout (or a cancellation). Returns `true` if the sender's side
/// finished first: the value or the disconnection is there, and the sender owns the cell.
fn withdraw_waiter<T>(inner: &Inner<T>) -> bool {
    // Acquire: if SENT/TX_GONE is set, what the sender wrote before is visible.
    let prev = inner.state.fetch_and(!WAITING, Ordering::Acquire);
    if prev & (SENT | TX_GONE) != 0 {
        return true;
    }
    if prev & WAITING != 0 {
        // SAFETY: we cleared WAITING before any sender saw it, so the cell is ours again.
        drop(inner.waiter.with_mut(|w| unsafe { (*w).take() }));
    }
    false
}

/// Withdraws the waiter if the receiving fiber unwinds out of its park.
struct Withdraw<'a, T>(&'a Inner<T>);

impl<T> Drop for Withdraw<'_, T> {
    fn drop(&mut self) {
        withdraw_waiter(self.0);
    }
}

impl<T> Drop for Receiver<T> {
    fn drop(&mut self) {
        // Relaxed: the receiver publishes nothing. A value left behind is dropped with the
        // allocation, whose reference count orders that drop after the sender's write.
        // Once SENT or TX_GONE is set the sender never looks at the state again, so the
        // common case (the value was received) needs no read-modify-write.
        if self.inner.state.load(Ordering::Relaxed) & (SENT | TX_GONE) == 0 {
            self.inner.state.fetch_or(RX_GONE, Ordering::Relaxed);
        }
    }
}

impl<T> fmt::Debug for Sender<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Sender").finish_non_exhaustive()
    }
}

impl<T> fmt::Debug for Receiver<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Receiver").finish_non_exhaustive()
    }
}
