//! Parking a plain thread (or a standalone fiber, which has no scheduler): the thread's
//! park slot, a 32-bit park word with the encoding of `protocol::word` and a 30-bit
//! generation, waited on with a futex. The thread stands in for the home worker: it alone
//! parks its word and moves it on to the next generation, an `Unparker` wins the wake with
//! the compare-and-swap from `Parked` to `Notified` of the fiber's protocol, and a park that
//! times out withdraws with a compare-and-swap of its own from `Parked` back to idle. It
//! touches only the calling thread's slot and, through an `Unparker`, another thread's.
//!
//! Two rules keep an unparker from waking any park but its own. A wait that finds the
//! thread's slot parked is nested (inside `register`, or in a standalone fiber or destructor
//! run from there) and takes a fresh slot of its own. And a slot whose generations have run
//! out is retired for a fresh one, so an unparker kept from 2^30 parks ago (same
//! generation) cannot wake the current park.

use super::protocol::word::{NOTIFIED, PARKED, RUNNING as IDLE, STATE_BITS};
use super::{ParkResult, Unparker};
use crate::sys::futex;
use std::cell::RefCell;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Instant;

const GEN_MASK: u32 = u32::MAX >> STATE_BITS;
const STATE_MASK: u32 = (1 << STATE_BITS) - 1;

/// A thread's park word: `(generation << 2) | state`, waited on with a futex.
pub(crate) struct ThreadSlot {
    word: AtomicU32,
}

impl ThreadSlot {
    fn new() -> Arc<ThreadSlot> {
        Arc::new(ThreadSlot {
            word: AtomicU32::new(IDLE),
        })
    }

    pub(super) fn unpark(&self, gen: u32) {
        let parked = (gen << STATE_BITS) | PARKED;
        let notified = (gen << STATE_BITS) | NOTIFIED;
        // Release: what the waker wrote before unparking is visible to the woken thread,
        // which reads the word with Acquire.
        if self
            .word
            .compare_exchange(parked, notified, Ordering::Release, Ordering::Relaxed)
            .is_ok()
        {
            futex::wake(&self.word, 1);
        }
    }
}

thread_local! {
    /// The thread's slot. Replaced by a fresh one once its generations run out, so that an
    /// unparker kept from 2^30 parks ago (same generation) cannot wake the current park.
    static SLOT: RefCell<Arc<ThreadSlot>> = RefCell::new(ThreadSlot::new());
}

/// Restores a thread slot to idle with the next generation, even if `register` panics; after
/// the last generation, retires it.
struct NextGeneration<'a> {
    slot: &'a Arc<ThreadSlot>,
    gen: u32,
}

impl Drop for NextGeneration<'_> {
    fn drop(&mut self) {
        let next = (self.gen.wrapping_add(1) & GEN_MASK) << STATE_BITS;
        self.slot.word.store(next | IDLE, Ordering::Relaxed);
        if self.gen == GEN_MASK {
            // The unparkers of this slot's old parks keep it alive, but nothing parks on it
            // again, so their compare-and-swap never matches.
            let _ = SLOT.try_with(|s| {
                if let Ok(mut s) = s.try_borrow_mut() {
                    if Arc::ptr_eq(&s, self.slot) {
                        *s = ThreadSlot::new();
                    }
                }
            });
        }
    }
}

pub(super) fn block_thread(
    deadline: Option<Instant>,
    register: impl FnOnce(Unparker),
) -> ParkResult {
    // The thread's slot, unless it is already parked: a wait inside `register` (or in a
    // standalone fiber or a destructor run from there) must not take the outer park's
    // generation, which the outer unparker would then wake. A thread-local destructor may
    // also wait after this thread's slot is gone. Either gets a slot of its own for this
    // one wait.
    let slot = SLOT
        .try_with(|s| s.borrow().clone())
        .ok()
        .filter(|s| s.word.load(Ordering::Relaxed) & STATE_MASK == IDLE)
        .unwrap_or_else(ThreadSlot::new);
    // Only this thread writes the word while it is IDLE, so a plain store is enough.
    let gen = slot.word.load(Ordering::Relaxed) >> STATE_BITS;
    let parked = (gen << STATE_BITS) | PARKED;
    let notified = (gen << STATE_BITS) | NOTIFIED;
    slot.word.store(parked, Ordering::Relaxed);
    let _next = NextGeneration { slot: &slot, gen };
    register(Unparker::for_thread(slot.clone(), gen));
    loop {
        let w = slot.word.load(Ordering::Acquire);
        if w == notified {
            return ParkResult::Unparked;
        }
        let timeout = match deadline {
            None => None,
            Some(d) => {
                let now = Instant::now();
                if now >= d {
                    // Withdraw; if that fails, an unpark just won the race.
                    match slot.word.compare_exchange(
                        parked,
                        (gen << STATE_BITS) | IDLE,
                        Ordering::Acquire,
                        Ordering::Acquire,
                    ) {
                        Ok(_) => return ParkResult::TimedOut,
                        Err(_) => return ParkResult::Unparked,
                    }
                }
                Some(d - now)
            }
        };
        futex::wait(&slot.word, w, timeout);
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use crate::park::{park, park_timeout};
    use std::time::Duration;
    /// A thread's unparker (and its clones) hold the thread's slot; all of them released,
    /// the slot is back to the thread's own reference, and a stale clone does nothing.
    #[test]
    fn a_thread_unparker_releases_its_slot() {
        let before = SLOT.with(|s| Arc::strong_count(&s.borrow()));
        let mut stale = None;
        let mut waker = None;
        park(|u| {
            assert!(format!("{u:?}").contains("thread"));
            stale = Some(u.clone());
            let u2 = u.clone();
            drop(u);
            waker = Some(std::thread::spawn(move || u2.unpark_owned()));
        });
        // The waker releases its unparker just after the unpark.
        waker.expect("registered").join().unwrap();
        let stale = stale.expect("registered");
        assert_eq!(SLOT.with(|s| Arc::strong_count(&s.borrow())), before + 1);
        // A new park: the stale unparker cannot end it.
        stale.unpark();
        let r = park_timeout(Instant::now() + Duration::from_millis(20), |_| {});
        assert_eq!(r, ParkResult::TimedOut);
        drop(stale);
        assert_eq!(SLOT.with(|s| Arc::strong_count(&s.borrow())), before);
    }

    /// The generation of a thread's slot has 30 bits: an unparker kept from a park 2^30
    /// parks ago carries the generation of a current one. The slot is retired once its
    /// generations run out, so that unparker wakes nothing. (The thread's generation is
    /// moved on by hand here; parking 2^30 times takes over a minute.)
    #[test]
    fn an_unparker_from_before_the_generations_ran_out_wakes_nothing() {
        let set_gen =
            |g: u32| SLOT.with(|s| s.borrow().word.store(g << STATE_BITS, Ordering::Relaxed));
        set_gen(5);
        let mut stale = None;
        park(|u| {
            stale = Some(u.clone());
            u.unpark();
        });
        let stale = stale.expect("registered");
        // The last generation; then, on whatever slot the thread has now, generation 5 again.
        set_gen(GEN_MASK);
        assert_eq!(park_timeout(Instant::now(), |_| {}), ParkResult::TimedOut);
        set_gen(5);
        let r = park_timeout(Instant::now() + Duration::from_millis(300), |_| {
            // Unparked from another thread while this one is parked.
            let stale = stale.clone();
            std::thread::spawn(move || stale.unpark());
        });
        assert_eq!(
            r,
            ParkResult::TimedOut,
            "a stale unparker ended a later park"
        );
    }

    /// A wait queue's waiter on a plain thread woken by an unpark that was not its own (a
    /// bug elsewhere, simulated by flipping its slot's word by hand) must not leave its
    /// node linked: it waits on, and the real wake still reaches it.
    #[test]
    fn a_stray_thread_wake_leaves_a_wait_queue_waiter_waiting() {
        use crate::park::wait_queue::{wait, Lock, Wait, WaitList};
        use crate::park::WaitOn;
        const TOKEN: usize = 7;
        let queue = Arc::new(Lock::new(WaitList::<()>::new()));
        let (tx, rx) = std::sync::mpsc::channel();
        let q = queue.clone();
        let t = std::thread::spawn(move || {
            tx.send(SLOT.with(|s| s.borrow().clone())).unwrap();
            let on = WaitOn::Other("test");
            match wait(q.lock(), |l| l, (), None, on, || {}, |_, _| {}) {
                Wait::Woken(token) => token,
                Wait::TimedOut(_) => unreachable!("no deadline"),
            }
        });
        let slot = rx.recv().unwrap();
        let until = Instant::now() + Duration::from_millis(300);
        while Instant::now() < until {
            let w = slot.word.load(Ordering::Acquire);
            if w & STATE_MASK == PARKED
                && slot
                    .word
                    .compare_exchange(
                        w,
                        w - PARKED + NOTIFIED,
                        Ordering::Release,
                        Ordering::Relaxed,
                    )
                    .is_ok()
            {
                futex::wake(&slot.word, 1);
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        assert!(!t.is_finished(), "the waiter left the queue");
        // The waiter is in the queue (or, on a slow machine, about to join it): wake it there.
        loop {
            let mut g = queue.lock();
            let (list, wakes) = g.parts();
            if list.wake_all(TOKEN, wakes) == 1 {
                break;
            }
            drop(g);
            std::thread::sleep(Duration::from_millis(1));
        }
        assert_eq!(
            t.join().expect("the waiter"),
            TOKEN,
            "the real wake's token"
        );
    }
}
