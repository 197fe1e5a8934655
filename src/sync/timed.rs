//! Receivers whose messages come from the clock, in crossbeam-channel's shape: [`after`]
//! delivers one message once a duration has passed, [`tick`] one per period, [`never`]
//! none. They hold no thread and no timer of their own: a receive waits with a deadline
//! (fibra's timers, for a fiber), and a `select!` over one parks until the earliest of its
//! arms' delivery times, so an idle one costs nothing.
//!
//! Differences from crossbeam, where they are `Receiver<Instant>`: they are types of their
//! own ([`After`], [`Tick`], [`Never`]), which `select!`'s `recv` takes like any receiver.

use super::select::{SelectRecv, SelectRecvSealed};
use crate::sync::mpsc::{RecvError, RecvTimeoutError, TryRecvError};
use std::marker::PhantomData;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// A receiver that delivers one message, the [`Instant`] it was due, once `duration` has
/// passed; after that it is empty for ever (never disconnected). Clones share the message:
/// one of them receives it.
///
/// ```
/// use std::time::{Duration, Instant};
/// let start = Instant::now();
/// let timeout = fibra::sync::after(Duration::from_millis(20));
/// let (_tx, rx) = fibra::sync::mpsc::channel::<u32>();
/// let timed_out = fibra::select! {
///     recv(rx) -> _ => false,
///     recv(timeout) -> due => due.unwrap() >= start + Duration::from_millis(20),
/// };
/// assert!(timed_out && start.elapsed() >= Duration::from_millis(20));
/// ```
pub fn after(duration: Duration) -> After {
    After(Arc::new(AfterState {
        due: super::deadline_after(duration),
        taken: AtomicBool::new(false),
    }))
}

/// A receiver that delivers the [`Instant`] each period was due, every `period`: the first
/// one `period` from now. It holds at most one message: a tick not received before the next
/// is due is skipped, and the next is due a period after a receive that came late.
pub fn tick(period: Duration) -> Tick {
    Tick(Arc::new(parking_lot::Mutex::new(TickState {
        due: super::deadline_after(period),
        period,
    })))
}

/// A receiver that never delivers anything: in a `select!`, an arm that is never chosen (a
/// way to turn one off); its `recv` waits for ever.
pub fn never<T>() -> Never<T> {
    Never(PhantomData)
}

/// The receiver of [`after`].
#[derive(Clone, Debug)]
pub struct After(Arc<AfterState>);

#[derive(Debug)]
struct AfterState {
    /// `None`: too far for the clock, never.
    due: Option<Instant>,
    taken: AtomicBool,
}

/// The receiver of [`tick`].
#[derive(Clone, Debug)]
pub struct Tick(Arc<parking_lot::Mutex<TickState>>);

#[derive(Debug)]
struct TickState {
    due: Option<Instant>,
    period: Duration,
}

/// The receiver of [`never()`].
pub struct Never<T>(PhantomData<fn() -> T>);

impl<T> Clone for Never<T> {
    fn clone(&self) -> Self {
        Never(PhantomData)
    }
}

impl<T> std::fmt::Debug for Never<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Never")
    }
}

/// What the three share: a message due at a time, taken at most once each time.
trait Timed {
    type Item;
    /// The receiver's identity, the same for its clones (every `Never` is alike).
    fn id(&self) -> *const ();
    /// When the next message is due (`None`: never).
    fn due(&self) -> Option<Instant>;
    /// The message, if one is due now.
    fn take_due(&self) -> Option<Self::Item>;
}

impl Timed for After {
    type Item = Instant;
    fn id(&self) -> *const () {
        Arc::as_ptr(&self.0).cast()
    }
    fn due(&self) -> Option<Instant> {
        self.0.due.filter(|_| !self.0.taken.load(Ordering::Acquire))
    }
    fn take_due(&self) -> Option<Instant> {
        let due = self.due()?;
        (Instant::now() >= due && !self.0.taken.swap(true, Ordering::AcqRel)).then_some(due)
    }
}

impl Timed for Tick {
    type Item = Instant;
    fn id(&self) -> *const () {
        Arc::as_ptr(&self.0).cast()
    }
    fn due(&self) -> Option<Instant> {
        self.0.lock().due
    }
    fn take_due(&self) -> Option<Instant> {
        let mut st = self.0.lock();
        let due = st.due?;
        let now = Instant::now();
        if now < due {
            return None;
        }
        st.due = now.checked_add(st.period);
        Some(due)
    }
}

impl<T> Timed for Never<T> {
    type Item = T;
    fn id(&self) -> *const () {
        std::ptr::null()
    }
    fn due(&self) -> Option<Instant> {
        None
    }
    fn take_due(&self) -> Option<T> {
        None
    }
}

/// The receiving calls, on each of the three.
macro_rules! receiving {
    ($ty:ty, $item:ty, [$($gen:tt)*]) => {
        impl<$($gen)*> $ty {
            /// Waits for the next message — suspending a fiber, blocking a thread — for ever
            /// if none will come. Never fails: these receivers are never disconnected.
            ///
            /// # Errors
            /// None; the `Result` is the shape of the other receivers'.
            pub fn recv(&self) -> Result<$item, RecvError> {
                loop {
                    if let Some(v) = self.take_due() {
                        return Ok(v);
                    }
                    wait_until(self.due());
                }
            }

            /// The message if one is due now.
            ///
            /// # Errors
            /// [`TryRecvError::Empty`] if none is.
            pub fn try_recv(&self) -> Result<$item, TryRecvError> {
                self.take_due().ok_or(TryRecvError::Empty)
            }

            /// Waits at most `timeout` for the next message.
            ///
            /// # Errors
            /// [`RecvTimeoutError::Timeout`] if none came in time.
            pub fn recv_timeout(&self, timeout: Duration) -> Result<$item, RecvTimeoutError> {
                let limit = super::deadline_after(timeout);
                loop {
                    if let Some(v) = self.take_due() {
                        return Ok(v);
                    }
                    if limit.is_some_and(|l| Instant::now() >= l) {
                        return Err(RecvTimeoutError::Timeout);
                    }
                    wait_until(match (self.due(), limit) {
                        (Some(a), Some(b)) => Some(a.min(b)),
                        (a, b) => a.or(b),
                    });
                }
            }
        }

        impl<$($gen)*> SelectRecvSealed for $ty {}
        impl<$($gen)*> SelectRecv for $ty {
            type Item = $item;
            fn try_recv_now(&self) -> Option<Result<$item, RecvError>> {
                self.take_due().map(Ok)
            }
            fn ready_to_recv(&self) -> bool {
                self.due().is_some_and(|due| Instant::now() >= due)
            }
            fn channel_id(&self) -> *const () {
                self.id()
            }
            fn watch_recv(&self, _s: &Arc<super::select::Signal>, _on: bool) {
                // Nothing to watch: the select parks until `ready_at`.
            }
            fn ready_at(&self) -> Option<Instant> {
                self.due()
            }
        }
    };
}
receiving!(After, Instant, []);
receiving!(Tick, Instant, []);
receiving!(Never<T>, T, [T]);

/// Sleeps until `when` (for ever if `None`): a fiber's timer, or the thread's sleep.
fn wait_until(when: Option<Instant>) {
    match when {
        Some(when) => crate::sleep_until(when),
        None => crate::sleep(Duration::MAX),
    }
}
