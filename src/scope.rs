//! [`scope`]: fibers that may borrow from the caller, like `std::thread::scope`.

use crate::dump::WaitOn;
use crate::fiber::Cancelled;
use crate::join::{JoinError, JoinHandle};
use crate::sched::worker::{current_shared, Shared};
use crate::sync::wait_queue::{wait, Lock, WaitList};
use std::fmt;
use std::marker::PhantomData;
use std::panic::{catch_unwind, resume_unwind, AssertUnwindSafe};
use std::sync::Arc;

/// The token the last scoped fiber to end wakes the scope with.
const ALL_DONE: usize = 1;

/// Scoped fibers still running, and whoever waits for them to end.
struct Running {
    count: usize,
    /// Scoped fibers that panicked and whose handle has not taken the panic.
    unjoined_panics: usize,
    waiters: WaitList<()>,
}

/// What one scoped fiber leaves: its value or panic, until joined.
struct Packet<T> {
    result: parking_lot::Mutex<Option<std::thread::Result<T>>>,
}

/// A scope to spawn fibers in that may borrow anything that outlives it; see [`scope`].
pub struct Scope<'scope, 'env: 'scope> {
    shared: Arc<Shared>,
    running: Arc<Lock<Running>>,
    /// Invariant in `'scope` and `'env`, as std's scope is.
    scope: PhantomData<&'scope mut &'scope ()>,
    env: PhantomData<&'env mut &'env ()>,
}

/// An owned permission to join a scoped fiber; see [`Scope::spawn`].
pub struct ScopedJoinHandle<'scope, T> {
    handle: JoinHandle<()>,
    packet: Arc<Packet<T>>,
    running: Arc<Lock<Running>>,
    scope: PhantomData<&'scope ()>,
}

/// Runs `f` with a [`Scope`] whose fibers may borrow from the caller's stack, and waits for
/// all of them before returning — like [`std::thread::scope`], with fibers of the current
/// scheduler instead of threads. Inside a fiber only the fiber waits.
///
/// All scoped fibers are waited for also when `f` panics or when one of them panics, and
/// also when the calling fiber is cancelled (the cancellation is raised once they have all
/// ended). Then `f`'s panic is resumed, or, if a scoped fiber panicked and its handle was
/// not joined, this panics. A scoped fiber that a stopping scheduler abandons (it did not
/// end when cancelled; see [`Scheduler::stop_timeout`](crate::Scheduler::stop_timeout))
/// never ends, so neither does the scope: its caller is abandoned with it.
///
/// # Panics
/// Outside a fiber of a scheduler (from a plain thread, run it in one with
/// [`Scheduler::block_on`](crate::Scheduler::block_on)); and as said above.
///
/// ```
/// let sched = fibra::Scheduler::builder().threads(2).build().unwrap();
/// let total = sched.block_on(|| {
///     let data: Vec<u64> = (1..=1000).collect();
///     let (left, right) = data.split_at(500);
///     fibra::scope(|s| {
///         let a = s.spawn(|| left.iter().sum::<u64>());
///         let b = s.spawn(|| right.iter().sum::<u64>());
///         a.join().unwrap() + b.join().unwrap()
///     })
/// });
/// assert_eq!(total, 500_500);
/// ```
///
/// A borrow cannot outlive the scope:
///
/// ```compile_fail
/// let sched = fibra::Scheduler::builder().threads(1).build().unwrap();
/// sched.block_on(|| {
///     let mut leaked = None;
///     fibra::scope(|s| {
///         let local = vec![1, 2, 3];
///         leaked = Some(s.spawn(|| local.len())); // error: `local` does not outlive the scope
///     });
/// });
/// ```
pub fn scope<'env, F, T>(f: F) -> T
where
    F: for<'scope> FnOnce(&'scope Scope<'scope, 'env>) -> T,
{
    let shared = match current_shared() {
        Some(shared) if crate::fiber::in_scheduled_fiber() => shared,
        _ => panic!(
            "fibra::scope must be called from a fiber of a fibra Scheduler; \
             from a plain thread, run it in Scheduler::block_on"
        ),
    };
    let scope = Scope {
        shared,
        running: Arc::new(Lock::new(Running {
            count: 0,
            unjoined_panics: 0,
            waiters: WaitList::new(),
        })),
        scope: PhantomData,
        env: PhantomData,
    };
    // Waits for every scoped fiber on every way out of here, unwinding included: they may
    // borrow what lives in `f`'s caller.
    struct WaitAll<'a, 'scope, 'env>(&'a Scope<'scope, 'env>);
    impl Drop for WaitAll<'_, '_, '_> {
        fn drop(&mut self) {
            self.0.wait_all();
        }
    }
    let result = {
        let _wait = WaitAll(&scope);
        catch_unwind(AssertUnwindSafe(|| f(&scope)))
    };
    match result {
        Err(payload) => resume_unwind(payload),
        Ok(value) => {
            if scope.running.lock().unjoined_panics > 0 {
                panic!("a scoped fiber panicked");
            }
            value
        }
    }
}

impl<'scope, 'env> Scope<'scope, 'env> {
    /// Runs `f` as a fiber of the scheduler the scope was made in (on any worker). It may
    /// borrow anything that outlives the scope; the scope waits for it. If the scheduler
    /// refuses new work (it is stopping), `f` is dropped unrun and its handle reports
    /// cancelled.
    #[track_caller]
    pub fn spawn<F, T>(&'scope self, f: F) -> ScopedJoinHandle<'scope, T>
    where
        F: FnOnce() -> T + Send + 'scope,
        T: Send + 'scope,
    {
        let packet = Arc::new(Packet {
            result: parking_lot::Mutex::new(None),
        });
        let out = packet.clone();
        let running = self.running.clone();
        let body: Box<dyn FnOnce() + Send + 'scope> = Box::new(move || {
            let r = catch_unwind(AssertUnwindSafe(f));
            if let Err(p) = &r {
                if p.is::<Cancelled>() {
                    // Cancelled: the task reports it, the packet stays empty.
                    drop(out);
                    resume_unwind(r.err().expect("matched above"));
                }
            }
            if r.is_err() {
                running.lock().unjoined_panics += 1;
            }
            *out.result.lock() = Some(r);
            // With the handle dropped, this is the packet's last reference, and the value's
            // destructor runs here: its panic is a panic of this fiber that nobody joins.
            if let Err(p) = catch_unwind(AssertUnwindSafe(move || drop(out))) {
                if p.is::<Cancelled>() {
                    crate::fiber::raise_cancelled(p);
                } else {
                    running.lock().unjoined_panics += 1;
                    crate::report::drop_catching(p);
                }
            }
        });
        // SAFETY: only the lifetime changes. The closure, and the `T` it produces, may
        // borrow for `'scope`; `scope` does not return (nor unwind past its frame) before
        // every fiber spawned here has ended — `WaitAll` waits for the count that each
        // one's completion hook decrements, and a fiber's completion comes after its body
        // and the drop of its closure. The packet that may hold a `T` is read only through
        // a `ScopedJoinHandle`, which cannot outlive `'scope`. A cancellation of the caller
        // while it waits is held back until they have ended (`wait_all`). A scoped fiber
        // abandoned by a stopping scheduler has not ended and is not counted down (see the
        // hook below); its scope then waits until the caller is abandoned too, never resumed,
        // its stack never freed, so the borrows stay valid.
        let body: Box<dyn FnOnce() + Send + 'static> = unsafe { std::mem::transmute(body) };
        self.running.lock().count += 1;
        let handle = crate::sched::spawn_on(&self.shared, body);
        let running = self.running.clone();
        handle.on_result(move |r| {
            if r.as_ref().is_err_and(JoinError::is_abandoned) {
                // Not ended: abandoned alive by a stopping scheduler, its frames may still
                // borrow the caller's (a blocking-pool call, say). The scope keeps waiting;
                // its caller, a fiber of that scheduler, is abandoned in turn.
                return;
            }
            let mut g = running.lock();
            g.count -= 1;
            if g.count == 0 {
                let (st, wakes) = g.parts();
                st.waiters.wake_all(ALL_DONE, wakes);
            }
        });
        ScopedJoinHandle {
            handle,
            packet,
            running: self.running.clone(),
            scope: PhantomData,
        }
    }

    /// Waits until no fiber of the scope runs. A cancellation of the caller that arrives
    /// meanwhile is raised only then: unwinding out of the scope earlier would free what its
    /// fibers borrow.
    fn wait_all(&self) {
        let mut cancelled = None;
        loop {
            let g = self.running.lock();
            if g.count == 0 {
                break;
            }
            let r = catch_unwind(AssertUnwindSafe(|| {
                let _ = wait(
                    g,
                    |st| &mut st.waiters,
                    (),
                    None,
                    WaitOn::Other("scope"),
                    || {},
                    |_, _| {},
                );
            }));
            match r {
                Ok(()) => {}
                Err(p) if p.is::<Cancelled>() => {
                    crate::fiber::caught_cancelled();
                    cancelled = Some(p);
                }
                Err(p) => resume_unwind(p),
            }
        }
        // Raised now, unless this wait runs while the fiber already unwinds (the scope is in
        // a destructor): a second unwind there would abort, so it is raised after that one.
        if let Some(p) = cancelled {
            crate::fiber::raise_cancelled(p);
        }
    }
}

impl<T> ScopedJoinHandle<'_, T> {
    /// Waits for the fiber and returns its value, or why there is none (its panic, or a
    /// cancellation). Joining a fiber that panicked keeps the scope from panicking for it.
    pub fn join(self) -> Result<T, JoinError> {
        let ended = self.handle.join();
        match self.packet.result.lock().take() {
            Some(Ok(value)) => Ok(value),
            Some(Err(payload)) => {
                self.running.lock().unjoined_panics -= 1;
                Err(JoinError::panic(payload))
            }
            None => Err(ended.err().unwrap_or_else(JoinError::cancelled)),
        }
    }

    /// Whether the fiber has finished.
    pub fn is_finished(&self) -> bool {
        self.handle.is_finished()
    }

    /// Cancels the fiber (see [`JoinHandle::cancel`]).
    pub fn cancel(&self) {
        self.handle.cancel();
    }
}

impl fmt::Debug for Scope<'_, '_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Scope")
            .field("running", &self.running.lock().count)
            .finish()
    }
}

impl<T> fmt::Debug for ScopedJoinHandle<'_, T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ScopedJoinHandle")
            .field("id", &self.handle.id())
            .finish()
    }
}
