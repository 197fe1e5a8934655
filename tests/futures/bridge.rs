//! `fibra::future`: async code in fibers (and on threads), and fibra's handles and channels
//! awaited from async code.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

use crate::common::{finish, with_deadline};
use fibra::future::block_on;
use fibra::sync::{mpsc, oneshot};
use fibra::Scheduler;

fn sched(threads: usize) -> Arc<Scheduler> {
    let s = Arc::new(Scheduler::builder().threads(threads).build().unwrap());
    s.start();
    s
}

/// Pending until `fire` runs (from any thread); counts its polls.
#[derive(Default)]
struct Gate {
    open: AtomicBool,
    waker: parking_lot::Mutex<Option<Waker>>,
    polls: AtomicUsize,
}

impl Gate {
    fn fire(&self) {
        self.open.store(true, Ordering::SeqCst);
        if let Some(w) = self.waker.lock().take() {
            w.wake();
        }
    }
}

struct Wait(Arc<Gate>);

impl Future for Wait {
    type Output = ();
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        self.0.polls.fetch_add(1, Ordering::SeqCst);
        *self.0.waker.lock() = Some(cx.waker().clone());
        if self.0.open.load(Ordering::SeqCst) {
            Poll::Ready(())
        } else {
            Poll::Pending
        }
    }
}

#[test]
fn block_on_in_a_fiber_parks_only_the_fiber() {
    with_deadline(|| {
        let s = sched(1);
        let gate = Arc::new(Gate::default());
        let g = gate.clone();
        let waiter = s.submit(move || block_on(Wait(g)), None).unwrap();
        // The one worker is free to run another fiber, which opens the gate.
        let g = gate.clone();
        let opener = s
            .submit(
                move || {
                    fibra::sleep(Duration::from_millis(20));
                    g.fire();
                },
                None,
            )
            .unwrap();
        finish(opener);
        finish(waiter);
        // Polled once at the start and once after the wake: no busy polling.
        assert_eq!(gate.polls.load(Ordering::SeqCst), 2);
        s.stop();
    });
}

#[test]
fn block_on_wakes_from_plain_threads_and_on_plain_threads() {
    with_deadline(|| {
        let s = sched(2);
        let gates: Vec<Arc<Gate>> = (0..100).map(|_| Arc::new(Gate::default())).collect();
        let fibers: Vec<_> = gates
            .iter()
            .map(|g| {
                let g = g.clone();
                s.submit(move || block_on(Wait(g)), None).unwrap()
            })
            .collect();
        std::thread::sleep(Duration::from_millis(20));
        let openers: Vec<_> = gates
            .chunks(25)
            .map(|c| {
                let c = c.to_vec();
                std::thread::spawn(move || c.iter().for_each(|g| g.fire()))
            })
            .collect();
        openers.into_iter().for_each(|t| t.join().unwrap());
        fibers.into_iter().for_each(finish);
        // And on a plain thread it blocks the thread until the wake.
        let gate = Arc::new(Gate::default());
        let g = gate.clone();
        let opener = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(20));
            g.fire();
        });
        let t = Instant::now();
        block_on(Wait(gate));
        assert!(t.elapsed() >= Duration::from_millis(19));
        opener.join().unwrap();
        s.stop();
    });
}

#[test]
fn a_ready_future_and_nested_block_on() {
    assert_eq!(block_on(async { 1 + 1 }), 2);
    let s = sched(1);
    let r = s.block_on(|| block_on(async { block_on(async { 40 }) + 2 }));
    assert_eq!(r, 42);
    s.stop();
}

#[test]
fn join_handles_oneshots_and_recv_async_are_futures() {
    with_deadline(|| {
        let s = sched(2);
        // A thread awaits fibers.
        let hs: Vec<_> = (0..100u64)
            .map(|i| {
                s.submit(
                    move || {
                        fibra::sleep(Duration::from_millis(i % 7));
                        i * i
                    },
                    None,
                )
                .unwrap()
            })
            .collect();
        let sum = block_on(async {
            let mut sum = 0;
            for h in hs {
                sum += h.await.unwrap();
            }
            sum
        });
        assert_eq!(sum, (0..100u64).map(|i| i * i).sum());
        // A panic reaches the awaiting task.
        let p = s.submit(|| panic!("boom"), None).unwrap();
        assert!(block_on(p).unwrap_err().is_panic());
        // oneshot: a value, and a sender dropped unsent.
        let (tx, rx) = oneshot::channel();
        s.submit(
            move || {
                fibra::sleep(Duration::from_millis(10));
                tx.send("late").unwrap();
            },
            None,
        )
        .unwrap();
        assert_eq!(block_on(rx), Ok("late"));
        let (tx, rx) = oneshot::channel::<u8>();
        s.submit(move || drop(tx), None).unwrap();
        assert!(block_on(rx).is_err());
        // A oneshot polled once, then received by blocking: the waker left behind is taken
        // back first.
        let (tx, mut rx) = oneshot::channel();
        let waker = Waker::noop();
        assert!(Pin::new(&mut rx)
            .poll(&mut Context::from_waker(waker))
            .is_pending());
        s.submit(move || tx.send(5).unwrap(), None).unwrap();
        assert_eq!(rx.recv(), Ok(5));
        // mpsc: messages in order, a future dropped while pending loses nothing, then the
        // disconnection.
        let (tx, rx) = mpsc::channel();
        {
            let mut early = Box::pin(rx.recv_async());
            assert!(early
                .as_mut()
                .poll(&mut Context::from_waker(waker))
                .is_pending());
        }
        s.submit(
            move || {
                for i in 0..1000 {
                    if i % 100 == 0 {
                        fibra::sleep(Duration::from_millis(1));
                    }
                    tx.send(i).unwrap();
                }
            },
            None,
        )
        .unwrap();
        let got = block_on(async {
            let mut got = Vec::new();
            while let Ok(v) = rx.recv_async().await {
                got.push(v);
            }
            got
        });
        assert_eq!(got, (0..1000).collect::<Vec<_>>());
        s.stop();
    });
}

#[test]
fn recv_async_on_a_rendezvous_channel_meets_blocking_senders() {
    with_deadline(|| {
        let s = sched(1);
        for sender_first in [true, false] {
            let (tx, rx) = mpsc::sync_channel::<u32>(0);
            let h = s
                .submit(
                    move || {
                        if !sender_first {
                            fibra::sleep(Duration::from_millis(20));
                        }
                        (0..10).for_each(|i| tx.send(i).unwrap());
                    },
                    None,
                )
                .unwrap();
            if sender_first {
                std::thread::sleep(Duration::from_millis(20));
            }
            let got = block_on(async {
                let mut got = Vec::new();
                while let Ok(v) = rx.recv_async().await {
                    got.push(v);
                }
                got
            });
            assert_eq!(got, (0..10).collect::<Vec<_>>());
            finish(h);
        }
        s.stop();
    });
}

#[test]
#[should_panic(expected = "polled after it returned its result")]
fn a_join_handle_polled_after_its_result_panics() {
    let s = sched(1);
    let mut h = s.submit(|| 1, None).unwrap();
    assert_eq!(block_on(&mut h).unwrap(), 1);
    let _ = block_on(&mut h);
}

#[test]
fn a_cancelled_fiber_in_block_on_unwinds() {
    with_deadline(|| {
        let s = sched(1);
        let gate = Arc::new(Gate::default());
        let g = gate.clone();
        let h = s.submit(move || block_on(Wait(g)), None).unwrap();
        std::thread::sleep(Duration::from_millis(20));
        h.cancel();
        assert!(h.wait_timeout(crate::common::LIMIT));
        assert!(h.join().unwrap_err().is_cancelled());
        // A wake after the fiber is gone is harmless.
        gate.fire();
        s.stop();
    });
}

/// Counts the allocations of the calling thread.
struct Counting;

thread_local! {
    static ALLOCS: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
}

// SAFETY: forwards to the system allocator; the counter is a const-initialised thread-local
// without a destructor, usable at any time.
unsafe impl std::alloc::GlobalAlloc for Counting {
    unsafe fn alloc(&self, l: std::alloc::Layout) -> *mut u8 {
        ALLOCS.with(|a| a.set(a.get() + 1));
        // SAFETY: the caller's layout.
        unsafe { std::alloc::System.alloc(l) }
    }
    unsafe fn dealloc(&self, p: *mut u8, l: std::alloc::Layout) {
        // SAFETY: as the caller promises.
        unsafe { std::alloc::System.dealloc(p, l) }
    }
}

#[global_allocator]
static COUNTING: Counting = Counting;

/// Hands out the waker it is polled with.
struct Capture(Option<std::sync::mpsc::Sender<Waker>>);

impl Future for Capture {
    type Output = ();
    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        if let Some(tx) = self.0.take() {
            tx.send(cx.waker().clone()).unwrap();
            return Poll::Pending;
        }
        Poll::Ready(())
    }
}

#[test]
fn the_waker_clones_and_wakes_without_allocating() {
    with_deadline(|| {
        let s = sched(1);
        let (tx, rx) = std::sync::mpsc::channel();
        let fiber = s.submit(move || block_on(Capture(Some(tx))), None).unwrap();
        let waker = rx.recv().unwrap();
        let mut clones = Vec::with_capacity(1000);
        let count = || ALLOCS.with(|a| a.get());
        let before = count();
        for _ in 0..1000 {
            clones.push(waker.clone());
        }
        assert_eq!(count() - before, 0, "cloning the waker allocated");
        // The first wake unparks the fiber: it goes into its worker's queue, which may grow
        // by a block now and then (the queue's allocation, not the waker's).
        let before = count();
        clones[0].wake_by_ref();
        assert!(count() - before <= 1);
        finish(fiber);
        let before = count();
        for w in &clones {
            w.wake_by_ref();
        }
        drop(clones);
        assert_eq!(count() - before, 0, "waking allocated");
        s.stop();
    });
}

#[test]
fn receivers_sharing_one_mpsc_receiver_get_every_message_once() {
    with_deadline(|| {
        let s = sched(2);
        let (tx, rx) = mpsc::channel::<u32>();
        let rx = Arc::new(rx);
        const PER: u32 = 20_000;
        for p in 0..4u32 {
            let tx = tx.clone();
            s.submit(
                move || {
                    for i in 0..PER {
                        tx.send(p * PER + i).unwrap();
                        if i % 1000 == 0 {
                            fibra::sleep(Duration::from_micros(200));
                        }
                    }
                },
                None,
            )
            .unwrap();
        }
        drop(tx);
        // Two plain threads with `recv`, two fibers with `recv_async` in `block_on`, and a
        // third thread with `recv_timeout`, all on the one receiver.
        let mut threads = Vec::new();
        for kind in 0..3 {
            let rx = rx.clone();
            threads.push(std::thread::spawn(move || {
                let mut got = Vec::new();
                loop {
                    let r = match kind {
                        0 | 1 => rx.recv().ok(),
                        _ => match rx.recv_timeout(Duration::from_millis(5)) {
                            Ok(v) => Some(v),
                            Err(mpsc::RecvTimeoutError::Timeout) => continue,
                            Err(mpsc::RecvTimeoutError::Disconnected) => None,
                        },
                    };
                    match r {
                        Some(v) => got.push(v),
                        None => return got,
                    }
                }
            }));
        }
        let fibers: Vec<_> = (0..2)
            .map(|_| {
                let rx = rx.clone();
                s.submit(
                    move || {
                        block_on(async {
                            let mut got = Vec::new();
                            while let Ok(v) = rx.recv_async().await {
                                got.push(v);
                            }
                            got
                        })
                    },
                    None,
                )
                .unwrap()
            })
            .collect();
        let mut all: Vec<u32> = threads
            .into_iter()
            .flat_map(|t| t.join().unwrap())
            .chain(fibers.into_iter().flat_map(finish))
            .collect();
        all.sort_unstable();
        assert_eq!(all.len(), 4 * PER as usize);
        assert!(all.iter().enumerate().all(|(i, &v)| v == i as u32));
        s.stop();
    });
}
