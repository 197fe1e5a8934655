//! Futures in fibers: [`block_on`] runs async code from a fiber (or a thread).
//!
//! The bridge goes both ways. From a fiber, `block_on(fut)` polls `fut` and parks only the
//! fiber between polls, so a worker runs other fibers while the future waits. From async
//! code, a fiber's [`JoinHandle`](crate::JoinHandle) is a future of its result, a
//! [`oneshot::Receiver`](crate::sync::oneshot::Receiver) is a future of its value and
//! [`mpsc::Receiver::recv_async`](crate::sync::mpsc::Receiver::recv_async) a future of the
//! next message.
//!
//! Futures that need a runtime's context — tokio's sockets and timers, and what is built on
//! them (reqwest, hyper, tonic) — need that runtime: with the `tokio` feature, give a
//! scheduler a handle ([`Builder::tokio_handle`](crate::Builder)) and its worker threads
//! are inside the runtime's context for as long as they run fibers, while tokio's own
//! threads drive its reactor and timers. Every fiber can make, poll and drop tokio futures
//! anywhere: inside `block_on` or before it, and in a destructor run as a cancelled fiber
//! unwinds. Without a handle, such a future fails the way tokio reports it: a panic saying
//! there is no reactor running, which reaches the fiber's `JoinHandle`.
//!
//! What blocks what: `block_on` in a fiber parks the fiber; on a plain thread it blocks the
//! thread (do not call it on an async runtime's own threads: that blocks the executor). A
//! poll must not block, as in any executor. fibra's own futures never suspend the fiber
//! that polls them, and a poll made by `block_on` never yields for the
//! [cooperative budget](crate::coop) (the poll as a whole spends one unit). Do not hold a
//! tokio `EnterGuard` of your own across a suspension: the fibers of a worker share its
//! thread's context stack.

use crate::sync::select::Signal;
use std::future::Future;
use std::pin::pin;
use std::task::{Context, Poll, Waker};

/// Runs `fut` to completion and returns its output.
///
/// In a scheduled fiber only the fiber waits: its waker unparks it, from any thread, and
/// waking or cloning the waker allocates nothing. On a plain thread (or in a standalone
/// fiber) it blocks the thread between polls, like `futures::executor::block_on`. Each poll
/// spends one unit of the fiber's [cooperative budget](crate::coop).
///
/// ```
/// let sched = fibra::Scheduler::builder().threads(1).build().unwrap();
/// sched.start();
/// let (tx, rx) = fibra::sync::oneshot::channel();
/// let fiber = sched.submit(move || fibra::future::block_on(async { rx.await.unwrap() * 2 }), None).unwrap();
/// tx.send(21).unwrap();
/// assert_eq!(fiber.join().unwrap(), 42);
/// ```
pub fn block_on<F: Future>(fut: F) -> F::Output {
    let mut fut = pin!(fut);
    let signal = Signal::new();
    let waker = Waker::from(signal.clone());
    let mut cx = Context::from_waker(&waker);
    loop {
        crate::coop::spend();
        // Forget earlier wakes: this poll sees whatever they announced.
        signal.reset();
        // One unit was spent above, for the whole poll: fibra calls inside it (a receiver's
        // `try_recv`, say) never yield the fiber in the middle of someone's `poll`.
        let polled = crate::coop::unconstrained(|| fut.as_mut().poll(&mut cx));
        if let Poll::Ready(v) = polled {
            return v;
        }
        signal.park(None, crate::dump::WaitOn::Future);
    }
}
