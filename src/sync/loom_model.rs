//! Model checks of `fibra::sync`'s state machines under loom (`ci/loom.sh`): every
//! interleaving of a few threads, within loom's preemption bound, is explored, and loom
//! reports deadlocks (a lost wake-up), data races on the cells (a broken hand-over of a
//! node's token or unparker, a message slot, a oneshot value) and leaked allocations.
//!
//! Threads stand in for fibers: under loom, `park` is the shim's model, whose contract is the
//! real one's (registration after commitment to wait, one wake per park, a deadline that
//! may pass at any moment), so the protocols checked are the ones fibers run.

use super::shim::Arc;
use super::wait_queue::{wait, Lock, Wait, WaitList};
use super::{
    broadcast, mpmc, mpsc, oneshot, Barrier, Condvar, Mutex, RwLock, Semaphore, WaitGroup,
};
use crate::dump::WaitOn;
use loom::sync::atomic::{AtomicUsize, Ordering};
use loom::thread;
use std::time::{Duration, Instant};

struct Flag {
    set: bool,
    waiters: WaitList<()>,
}

fn flag() -> Arc<Lock<Flag>> {
    Arc::new(Lock::new(Flag {
        set: false,
        waiters: WaitList::new(),
    }))
}

/// Sets the flag and wakes the waiters with token 7; returns how many were woken.
fn raise(flag: &Lock<Flag>) -> usize {
    let mut g = flag.lock();
    g.set = true;
    let (st, wakes) = g.parts();
    st.waiters.wake_all(7, wakes)
}

#[test]
fn wait_queue_no_lost_wakeup() {
    loom::model(|| {
        let f = flag();
        let f2 = f.clone();
        let waker = thread::spawn(move || raise(&f2));
        let g = f.lock();
        if !g.set {
            match wait(
                g,
                |s| &mut s.waiters,
                (),
                None,
                WaitOn::Park,
                || {},
                |_, _| {},
            ) {
                Wait::Woken(t) => assert_eq!(t, 7),
                Wait::TimedOut(_) => unreachable!(),
            }
        }
        waker.join().unwrap();
    });
}

#[test]
fn wait_queue_timeout_races_a_wake() {
    loom::model(|| {
        let f = flag();
        let f2 = f.clone();
        let waker = thread::spawn(move || raise(&f2));
        let g = f.lock();
        let woken = if g.set {
            drop(g);
            None
        } else {
            let deadline = Some(Instant::now());
            match wait(
                g,
                |s| &mut s.waiters,
                (),
                deadline,
                WaitOn::Park,
                || {},
                |_, _| {},
            ) {
                Wait::Woken(t) => {
                    assert_eq!(t, 7);
                    Some(true)
                }
                Wait::TimedOut(g) => {
                    assert!(g.waiters.is_empty(), "a timed-out node leaves the list");
                    Some(false)
                }
            }
        };
        let count = waker.join().unwrap();
        match woken {
            // The waker found the node exactly when the waiter reports a wake.
            Some(w) => assert_eq!(count, usize::from(w)),
            None => assert_eq!(count, 0),
        }
        assert!(f.lock().waiters.is_empty());
    });
}

#[test]
fn mutex_excludes_and_hands_over() {
    loom::model(|| {
        let m = Arc::new(Mutex::new(0usize));
        let threads: Vec<_> = (0..2)
            .map(|_| {
                let m = m.clone();
                thread::spawn(move || {
                    let mut g = m.lock().unwrap();
                    let v = *g;
                    thread::yield_now();
                    *g = v + 1;
                })
            })
            .collect();
        {
            let mut g = m.lock().unwrap();
            *g += 1;
        }
        for t in threads {
            t.join().unwrap();
        }
        assert_eq!(*m.lock().unwrap(), 3);
        assert!(m.try_lock().is_ok(), "unlocked, with no stale QUEUED bit");
    });
}

#[test]
fn condvar_notify_one_is_not_lost() {
    loom::model(|| {
        let pair = Arc::new((Mutex::new(false), Condvar::new()));
        let p = pair.clone();
        let notifier = thread::spawn(move || {
            *p.0.lock().unwrap() = true;
            p.1.notify_one();
        });
        let (m, cv) = &*pair;
        let g = cv.wait_while(m.lock().unwrap(), |ready| !*ready).unwrap();
        assert!(*g);
        drop(g);
        notifier.join().unwrap();
    });
}

#[test]
fn condvar_wait_timeout_races_a_notify() {
    loom::model(|| {
        let pair = Arc::new((Mutex::new(0), Condvar::new()));
        let p = pair.clone();
        let notifier = thread::spawn(move || {
            *p.0.lock().unwrap() += 1;
            p.1.notify_all();
        });
        let (m, cv) = &*pair;
        let (g, _) = cv
            .wait_timeout(m.lock().unwrap(), Duration::from_millis(1))
            .unwrap();
        drop(g);
        notifier.join().unwrap();
        assert_eq!(*m.lock().unwrap(), 1);
    });
}

#[test]
fn semaphore_hands_permits_over() {
    loom::model(|| {
        let sem = Arc::new(Semaphore::new(1));
        let inside = Arc::new(AtomicUsize::new(0));
        let threads: Vec<_> = (0..2)
            .map(|_| {
                let (sem, inside) = (sem.clone(), inside.clone());
                thread::spawn(move || {
                    let _p = sem.acquire();
                    assert_eq!(inside.fetch_add(1, Ordering::SeqCst), 0);
                    inside.fetch_sub(1, Ordering::SeqCst);
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        assert_eq!(sem.available_permits(), 1);
    });
}

#[test]
fn rwlock_writer_and_reader() {
    loom::model(|| {
        let lock = Arc::new(RwLock::new(0));
        let l = lock.clone();
        let writer = thread::spawn(move || *l.write().unwrap() += 1);
        let seen = *lock.read().unwrap();
        assert!(seen == 0 || seen == 1);
        writer.join().unwrap();
        assert_eq!(*lock.read().unwrap(), 1);
    });
}

#[test]
fn barrier_releases_both() {
    loom::model(|| {
        let b = Arc::new(Barrier::new(2));
        let b2 = b.clone();
        let t = thread::spawn(move || b2.wait().is_leader());
        let me = b.wait().is_leader();
        let other = t.join().unwrap();
        assert!(me ^ other, "exactly one leader");
    });
}

#[test]
fn waitgroup_last_drop_wakes_the_waiter() {
    loom::model(|| {
        let wg = WaitGroup::new();
        let done = Arc::new(AtomicUsize::new(0));
        let (w, d) = (wg.clone(), done.clone());
        let t = thread::spawn(move || {
            d.store(1, Ordering::Relaxed);
            drop(w);
        });
        wg.wait();
        // The dropper's write is visible to the waiter it released.
        assert_eq!(done.load(Ordering::Relaxed), 1);
        t.join().unwrap();
    });
}

#[test]
fn oneshot_send_races_recv() {
    loom::model(|| {
        let (tx, rx) = oneshot::channel::<usize>();
        let t = thread::spawn(move || tx.send(5).unwrap());
        assert_eq!(rx.recv(), Ok(5));
        t.join().unwrap();
    });
}

#[test]
fn oneshot_sender_drop_races_recv() {
    loom::model(|| {
        let (tx, rx) = oneshot::channel::<usize>();
        let t = thread::spawn(move || drop(tx));
        assert!(rx.recv().is_err());
        t.join().unwrap();
    });
}

#[test]
fn oneshot_recv_timeout_races_send() {
    loom::model(|| {
        let (tx, mut rx) = oneshot::channel::<usize>();
        let t = thread::spawn(move || tx.send(5).unwrap());
        let first = rx.recv_timeout(Duration::from_millis(1));
        t.join().unwrap();
        match first {
            Ok(v) => assert_eq!(v, 5),
            Err(_) => assert_eq!(rx.try_recv(), Ok(5), "a timed-out receiver still gets it"),
        }
    });
}

#[test]
fn oneshot_receiver_drop_races_send() {
    loom::model(|| {
        let (tx, rx) = oneshot::channel::<Arc<usize>>();
        let t = thread::spawn(move || tx.send(Arc::new(1)).is_ok());
        drop(rx);
        // Either way the value is dropped exactly once (loom checks for leaks).
        let _ = t.join().unwrap();
    });
}

#[test]
fn mpsc_two_senders_one_receiver() {
    loom::model(|| {
        let (tx, rx) = mpsc::channel::<usize>();
        let tx2 = tx.clone();
        let a = thread::spawn(move || tx.send(1).unwrap());
        let b = thread::spawn(move || tx2.send(2).unwrap());
        let sum: usize = rx.iter().sum();
        assert_eq!(sum, 3, "both arrive, then the disconnection");
        a.join().unwrap();
        b.join().unwrap();
    });
}

#[test]
fn mpsc_bounded_sender_blocks_and_is_handed_over() {
    loom::model(|| {
        let (tx, rx) = mpsc::sync_channel::<usize>(1);
        let t = thread::spawn(move || {
            tx.send(1).unwrap();
            tx.send(2).unwrap();
        });
        assert_eq!(rx.recv(), Ok(1));
        assert_eq!(rx.recv(), Ok(2));
        assert!(rx.recv().is_err());
        t.join().unwrap();
    });
}

#[test]
fn mpsc_rendezvous_and_receiver_drop() {
    loom::model(|| {
        let (tx, rx) = mpsc::sync_channel::<Arc<usize>>(0);
        let t = thread::spawn(move || tx.send(Arc::new(1)).is_ok());
        let got = rx.recv_timeout(Duration::from_millis(1)).is_ok();
        drop(rx);
        let sent = t.join().unwrap();
        assert!(!got || sent, "a received message was sent");
    });
}

#[test]
fn mpmc_receivers_racing_their_deadlines_lose_nothing() {
    loom::model(|| {
        let (tx, rx) = mpmc::channel::<usize>();
        let rx2 = rx.clone();
        let s = thread::spawn(move || tx.send(1).unwrap());
        let r = thread::spawn(move || rx2.recv_timeout(Duration::from_millis(1)).ok());
        let mine = rx.recv_timeout(Duration::from_millis(1)).ok();
        s.join().unwrap();
        let theirs = r.join().unwrap();
        let left = rx.try_recv().ok();
        let got: Vec<usize> = [mine, theirs, left].into_iter().flatten().collect();
        assert_eq!(got, [1], "received exactly once, or still in the channel");
    });
}

#[test]
fn mpmc_bounded_sender_is_handed_over_to_either_receiver() {
    loom::model(|| {
        let (tx, rx) = mpmc::sync_channel::<usize>(0);
        let rx2 = rx.clone();
        let s = thread::spawn(move || {
            tx.send(1).unwrap();
            tx.send(2).unwrap();
        });
        let r = thread::spawn(move || rx2.recv().ok());
        let mine = rx.recv().ok();
        let theirs = r.join().unwrap();
        s.join().unwrap();
        let mut got: Vec<usize> = [mine, theirs].into_iter().flatten().collect();
        got.sort_unstable();
        assert_eq!(got, [1, 2]);
        assert!(rx.recv().is_err(), "then the disconnection");
    });
}

#[test]
fn broadcast_send_and_close_race_recv() {
    loom::model(|| {
        let (tx, mut rx) = broadcast::channel::<usize>(1);
        let t = thread::spawn(move || {
            tx.send(1).unwrap();
        });
        assert_eq!(rx.recv(), Ok(1));
        assert_eq!(rx.recv(), Err(broadcast::RecvError::Closed));
        t.join().unwrap();
    });
}

/// A receiver hands out messages it took under one lock while a sender overwrites them:
/// whichever it sees, what it returns plus what it is told it missed is everything, in order.
#[test]
fn broadcast_taken_messages_race_their_overwrite() {
    loom::model(|| {
        let (tx, mut rx) = broadcast::channel::<usize>(2);
        tx.send(0).unwrap();
        tx.send(1).unwrap();
        // Takes both under the lock, returns the first.
        assert_eq!(rx.recv(), Ok(0));
        let t = thread::spawn(move || {
            tx.send(2).unwrap();
            tx.send(3).unwrap();
        });
        let mut seen = vec![0];
        let mut missed = 0;
        loop {
            match rx.recv() {
                Ok(v) => {
                    assert!(v > *seen.last().unwrap(), "in order: {seen:?} then {v}");
                    seen.push(v);
                }
                Err(broadcast::RecvError::Lagged(n)) => missed += n as usize,
                Err(broadcast::RecvError::Closed) => break,
            }
        }
        t.join().unwrap();
        assert_eq!(seen.len() + missed, 4, "seen {seen:?}, missed {missed}");
        assert_eq!(seen.last(), Some(&3), "the newest is never missed");
    });
}

/// A message taken under the lock and overwritten by another thread's send that finished
/// before this receive began is missed, exactly as if it had still been in the ring.
#[test]
fn broadcast_taken_message_overwritten_by_a_finished_send_is_missed() {
    loom::model(|| {
        let (tx, mut rx) = broadcast::channel::<usize>(2);
        tx.send(0).unwrap();
        tx.send(1).unwrap();
        assert_eq!(rx.recv(), Ok(0));
        thread::spawn(move || {
            tx.send(2).unwrap();
            tx.send(3).unwrap();
        })
        .join()
        .unwrap();
        assert_eq!(rx.recv(), Err(broadcast::RecvError::Lagged(1)));
        assert_eq!(rx.recv(), Ok(2));
        assert_eq!(rx.recv(), Ok(3));
        assert_eq!(rx.recv(), Err(broadcast::RecvError::Closed));
    });
}

/// A message is shared by one count of references, one per receiver: two receivers take
/// theirs on their own threads (each takes both messages, returns one and leaves holding the
/// other) while the sender overwrites both, releasing the references nobody took yet. Every
/// value is dropped exactly once: loom reports a leaked or twice-dropped `Arc`, and the
/// count of the token says no copy is left.
#[test]
fn broadcast_message_references_are_released_once_across_threads() {
    loom::model(|| {
        let (tx, mut a) = broadcast::channel::<Arc<()>>(2);
        let mut b = tx.subscribe();
        let token = Arc::new(());
        tx.send(token.clone()).unwrap();
        tx.send(token.clone()).unwrap();
        let ta = thread::spawn(move || drop(a.recv()));
        let tb = thread::spawn(move || drop(b.recv()));
        // Fails, giving the value back, once both receivers have left.
        drop(tx.send(token.clone()));
        drop(tx.send(token.clone()));
        ta.join().unwrap();
        tb.join().unwrap();
        drop(tx);
        assert_eq!(Arc::strong_count(&token), 1);
    });
}

#[test]
fn broadcast_recv_timeout_races_send() {
    loom::model(|| {
        let (tx, mut rx) = broadcast::channel::<usize>(1);
        let t = thread::spawn(move || tx.send(1).unwrap());
        let got = rx.recv_timeout(Duration::from_millis(1));
        t.join().unwrap();
        match got {
            Ok(v) => assert_eq!(v, 1),
            Err(e) => {
                assert_eq!(e, broadcast::RecvTimeoutError::Timeout);
                assert_eq!(rx.try_recv(), Ok(1), "a timed-out receiver missed nothing");
            }
        }
    });
}

/// A waiting select's offered rendezvous send (`select::Offers`) against a receiver: either
/// the receiver claims it first, and the select finds its arm claimed and its offer gone, or
/// the select closes first and takes its message back; never both, never neither.
#[test]
fn select_offer_is_claimed_or_withdrawn_exactly_once() {
    loom::model(|| {
        let (tx, rx) = mpsc::sync_channel::<u32>(0);
        let signal = super::select::Signal::new();
        assert!(tx.select_offer(5, &signal, 1).is_ok());
        let receiver = thread::spawn(move || rx.try_recv().ok());
        let claimed = signal.close();
        let back = tx.select_withdraw(&signal, 1);
        let got = receiver.join().unwrap();
        match claimed {
            Some(1) => assert_eq!((back, got), (None, Some(5))),
            None => assert_eq!((back, got), (Some(5), None)),
            other => panic!("claimed {other:?}"),
        }
    });
}
