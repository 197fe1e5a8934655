//! [`Timer`]: a standalone delayed executor. One thread, a deadline-ordered
//! map of jobs, and a condition variable the thread sleeps on until the earliest job is due;
//! scheduling an earlier job wakes it.

use std::collections::BTreeMap;
use std::panic::AssertUnwindSafe;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

type Job = Box<dyn FnOnce() + Send>;

/// Jobs are keyed by deadline, then by submission order, so equal deadlines run FIFO.
type Key = (Instant, u64);

#[derive(Default)]
struct State {
    jobs: BTreeMap<Key, Job>,
    next_seq: u64,
    /// Stop once the map is empty (graceful `shutdown`, or the `Timer` was dropped).
    drain: bool,
    /// Stop now, dropping what is left (`shutdown_now`).
    halt: bool,
}

struct Shared {
    state: Mutex<State>,
    wake: Condvar,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        // A job never runs under the lock, so a poisoned lock only means a panic between
        // two of our own statements; the map is still consistent.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// A delayed executor on its own thread: [`schedule`](Timer::schedule)`(delay, f)` runs `f`
/// on the timer thread once `delay` has passed. Jobs run in deadline order; equal deadlines
/// in submission order. A panicking job is reported and the timer carries on.
///
/// Dropping the `Timer` lets its thread finish the pending jobs in the background.
///
/// ```
/// use std::sync::mpsc;
/// use std::time::Duration;
/// let timer = fibra::time::Timer::new();
/// let (tx, rx) = mpsc::channel();
/// for (n, ms) in [(2, 20), (1, 10), (3, 30)] {
///     let tx = tx.clone();
///     timer.schedule(Duration::from_millis(ms), move || tx.send(n).unwrap());
/// }
/// timer.shutdown();
/// assert_eq!(rx.try_iter().collect::<Vec<_>>(), [1, 2, 3]);
/// ```
pub struct Timer {
    shared: Arc<Shared>,
    thread: Option<std::thread::JoinHandle<()>>,
}

/// Cancels one scheduled job; from [`Timer::schedule`].
#[derive(Clone)]
pub struct TimerHandle {
    shared: Arc<Shared>,
    key: Key,
}

impl TimerHandle {
    /// Removes the job if it has not started; returns whether it did.
    pub fn cancel(&self) -> bool {
        let removed = self.shared.lock().jobs.remove(&self.key);
        removed.is_some()
    }
}

impl std::fmt::Debug for TimerHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TimerHandle")
            .field("deadline", &self.key.0)
            .finish()
    }
}

impl Default for Timer {
    fn default() -> Self {
        Timer::new()
    }
}

impl Timer {
    /// Starts the timer thread (named `fibra-timer`).
    ///
    /// # Panics
    /// If the OS refuses to create the thread, like [`std::thread::spawn`].
    pub fn new() -> Timer {
        let shared = Arc::new(Shared {
            state: Mutex::new(State::default()),
            wake: Condvar::new(),
        });
        let s = shared.clone();
        let thread = std::thread::Builder::new()
            .name("fibra-timer".into())
            .spawn(move || run(&s))
            .expect("fibra: cannot spawn the timer thread");
        Timer {
            shared,
            thread: Some(thread),
        }
    }

    /// Runs `f` on the timer thread once `delay` has passed. A delay too large for
    /// `Instant` saturates to decades away.
    pub fn schedule(&self, delay: Duration, f: impl FnOnce() + Send + 'static) -> TimerHandle {
        let deadline = crate::sys::deadline_after(delay);
        let mut st = self.shared.lock();
        st.next_seq += 1;
        let key = (deadline, st.next_seq);
        let earliest = st.jobs.first_key_value().is_none_or(|(k, _)| key < *k);
        st.jobs.insert(key, Box::new(f));
        drop(st);
        if earliest {
            self.shared.wake.notify_one();
        }
        TimerHandle {
            shared: self.shared.clone(),
            key,
        }
    }

    /// How many jobs wait.
    pub fn pending(&self) -> usize {
        self.shared.lock().jobs.len()
    }

    /// Runs every pending job at its deadline, then joins the thread.
    pub fn shutdown(mut self) {
        self.shared.lock().drain = true;
        self.shared.wake.notify_one();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }

    /// Drops the pending jobs unrun, joins the thread (after a job that is running right now
    /// finishes) and returns how many were dropped.
    pub fn shutdown_now(mut self) -> usize {
        let dropped = {
            let mut st = self.shared.lock();
            st.halt = true;
            std::mem::take(&mut st.jobs)
        };
        self.shared.wake.notify_one();
        let n = dropped.len();
        drop(dropped);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        n
    }
}

impl Drop for Timer {
    fn drop(&mut self) {
        if self.thread.is_some() {
            self.shared.lock().drain = true;
            self.shared.wake.notify_one();
        }
    }
}

fn run(shared: &Shared) {
    let mut st = shared.lock();
    loop {
        if st.halt {
            return;
        }
        let now = Instant::now();
        let next = st.jobs.first_key_value().map(|(k, _)| k.0);
        match next {
            None if st.drain => return,
            None => st = shared.wake.wait(st).unwrap_or_else(|e| e.into_inner()),
            Some(deadline) if deadline <= now => {
                let (_, job) = st.jobs.pop_first().expect("checked non-empty");
                drop(st);
                // The panic hook has reported it; the timer thread lives on.
                // The panic hook reported it; the payload's own destructor may panic too.
                if let Err(payload) = std::panic::catch_unwind(AssertUnwindSafe(job)) {
                    crate::report::drop_catching(payload);
                }
                st = shared.lock();
            }
            Some(deadline) => {
                st = shared
                    .wake
                    .wait_timeout(st, deadline - now)
                    .unwrap_or_else(|e| e.into_inner())
                    .0;
            }
        }
    }
}
