//! Behaviours that crossbeam-channel's and tokio's own suites check of their channels and
//! `select!`, checked of fibra's: each test runs its body twice, once with plain threads and
//! once with fibers of a two-worker scheduler (the body itself in a fiber too).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::common::{started, with_deadline};
use fibra::sync::{mpmc, mpsc};

/// Starts concurrent work the way the current mode does.
#[derive(Clone, Copy)]
pub enum Mode {
    Threads,
    Fibers,
}

/// A started thread or fiber.
pub enum Joiner<T> {
    Thread(std::thread::JoinHandle<T>),
    Fiber(fibra::JoinHandle<T>),
}

impl<T: Send + 'static> Joiner<T> {
    pub fn join(self) -> T {
        match self {
            Joiner::Thread(h) => h.join().expect("the thread panicked"),
            Joiner::Fiber(h) => h.join().expect("the fiber failed"),
        }
    }
}

impl Mode {
    pub fn go<T: Send + 'static>(self, f: impl FnOnce() -> T + Send + 'static) -> Joiner<T> {
        match self {
            Mode::Threads => Joiner::Thread(std::thread::spawn(f)),
            Mode::Fibers => Joiner::Fiber(fibra::spawn(f)),
        }
    }

    /// Sleeps the way the mode's code does (both work in either; this keeps fibers honest).
    pub fn sleep(self, d: Duration) {
        match self {
            Mode::Threads => std::thread::sleep(d),
            Mode::Fibers => fibra::sleep(d),
        }
    }
}

/// Runs `body` with threads, then in a fiber with fibers.
pub fn both(body: fn(Mode)) {
    with_deadline(move || {
        body(Mode::Threads);
        let s = started(2);
        s.block_on(move || body(Mode::Fibers));
        s.stop();
    });
}

/// Retries `f` every millisecond until it returns true, for at most 10 s.
fn eventually(m: Mode, what: &str, mut f: impl FnMut() -> bool) {
    let t = Instant::now();
    while !f() {
        assert!(t.elapsed() < Duration::from_secs(10), "never: {what}");
        m.sleep(Duration::from_millis(1));
    }
}

// ------------------------------------------------------------ rendezvous and waiting selects

#[test]
fn a_try_send_completes_a_select_waiting_to_receive_on_a_rendezvous_channel() {
    // crossbeam select_macro: try_send meets a select parked in recv.
    both(|m| {
        let (s, r) = mpsc::sync_channel::<u32>(0);
        let waiter = m.go(move || {
            fibra::select! {
                recv(r) -> v => v.unwrap(),
            }
        });
        eventually(m, "a try_send to meet the select", || s.try_send(7).is_ok());
        assert_eq!(waiter.join(), 7);
    });
}

#[test]
fn a_non_waiting_select_send_completes_a_select_waiting_to_receive() {
    both(|m| {
        let (s, r) = mpmc::sync_channel::<u32>(0);
        let waiter = m.go(move || {
            fibra::select! {
                recv(r) -> v => v.unwrap(),
            }
        });
        eventually(m, "a select's send with default to meet it", || {
            fibra::select! {
                send(s, 9) -> r => r.is_ok(),
                default => false,
            }
        });
        assert_eq!(waiter.join(), 9);
    });
}

#[test]
fn two_selects_meet_on_a_rendezvous_channel_whichever_waits_first() {
    both(|m| {
        for receiver_first in [true, false] {
            let (s, r) = mpsc::sync_channel::<u32>(0);
            let (s2, r2) = mpsc::sync_channel::<u32>(0);
            let recv_side = move || {
                fibra::select! {
                    recv(r) -> v => v.unwrap(),
                    recv(r2) -> v => v.unwrap() + 100,
                }
            };
            let send_side = move || {
                fibra::select! {
                    send(s, 1) -> r => r.unwrap(),
                    send(s2, 2) -> r => r.unwrap(),
                }
            };
            let (a, b) = if receiver_first {
                let a = m.go(recv_side);
                m.sleep(Duration::from_millis(20));
                (a, m.go(send_side))
            } else {
                let b = m.go(send_side);
                m.sleep(Duration::from_millis(20));
                (m.go(recv_side), b)
            };
            b.join();
            assert!([1, 102].contains(&a.join()));
        }
    });
}

#[test]
fn sends_offered_by_a_waiting_select_are_chosen_at_random() {
    // crossbeam zero::fairness_duplicates: five send arms on one rendezvous channel, taken
    // by a selecting receiver and by a plain one: every arm gets its share.
    both(|m| {
        const ROUNDS: usize = 2_000;
        for selecting in [true, false] {
            let (s, r) = mpsc::sync_channel::<usize>(0);
            let sender = m.go(move || {
                for _ in 0..ROUNDS {
                    fibra::select! {
                        send(s, 0) -> _ => {},
                        send(s, 1) -> _ => {},
                        send(s, 2) -> _ => {},
                        send(s, 3) -> _ => {},
                        send(s, 4) -> _ => {},
                    }
                }
            });
            let mut hits = [0usize; 5];
            for _ in 0..ROUNDS {
                let i = if selecting {
                    fibra::select! {
                        recv(r) -> v => v.unwrap(),
                    }
                } else {
                    r.recv().unwrap()
                };
                hits[i] += 1;
            }
            sender.join();
            assert!(
                hits.iter().all(|&h| h >= ROUNDS / 5 / 2),
                "selecting receiver: {selecting}, arms chosen {hits:?}"
            );
        }
    });
}

#[test]
fn a_select_cancelled_after_a_sender_filled_its_receive_passes_the_message_on() {
    with_deadline(|| {
        let s = started(1);
        let (tx, rx) = mpsc::sync_channel::<u32>(0);
        let rx = Arc::new(rx);
        let got = Arc::new(AtomicUsize::new(0));
        let (r, g) = (rx.clone(), got.clone());
        // One worker: the select parks; the sender fills its offer and, before the select
        // resumes, the select is cancelled.
        let waiter = s.spawn(move || {
            fibra::select! {
                recv(r) -> v => g.store(v.unwrap() as usize, Ordering::SeqCst),
            }
        });
        crate::common::wait_until("the select to park", || {
            s.metrics().workers()[0].parks() > 0
        });
        let w = Arc::new(waiter);
        let w2 = w.clone();
        s.block_on(move || {
            tx.try_send(5).unwrap();
            w2.cancel();
        });
        let w = Arc::try_unwrap(w).unwrap();
        assert!(w.join().unwrap_err().is_cancelled());
        assert_eq!(got.load(Ordering::SeqCst), 0);
        // The message was not lost: the next receiver has it.
        assert_eq!(rx.try_recv(), Ok(5));
        s.stop();
    });
}

// ------------------------------------------------------------ select! syntax and evaluation

#[test]
fn a_send_message_is_evaluated_only_when_that_send_is_selected() {
    // crossbeam array::recv_in_send: a full channel's send never evaluates its message; one
    // with room evaluates it, and the evaluation may even receive from that very channel.
    both(|_| {
        let (s, r) = mpsc::sync_channel::<()>(1);
        s.send(()).unwrap();
        let ran = fibra::select! {
            send(s, panic!("evaluated though not selected")) -> _ => false,
            default => true,
        };
        assert!(ran);
        let (s, r2) = mpsc::sync_channel::<()>(2);
        s.send(()).unwrap();
        fibra::select! {
            send(s, assert_eq!(r2.recv(), Ok(()))) -> res => res.unwrap(),
        }
        assert_eq!(r2.try_recv(), Ok(()));
        drop(r);
        // A message that borrows what the arm's body then changes.
        let (s, r) = mpsc::channel::<u32>();
        let mut pending = vec![1, 2, 3];
        fibra::select! {
            send(s, pending.pop().unwrap()) -> res => {
                res.unwrap();
                pending.push(30);
            }
        }
        assert_eq!((pending, r.try_recv()), (vec![1, 2, 30], Ok(3)));
    });
}

#[test]
fn every_form_of_crossbeams_syntax_is_accepted() {
    both(|m| {
        let (s, r) = mpsc::channel::<u32>();
        // Trailing commas in the operations and after the last arm.
        s.send(1).unwrap();
        let v = fibra::select! {
            recv(r,) -> v => v.unwrap(),
            send(s, 2,) -> _ => 0,
        };
        assert!(v == 1 || v == 0);
        while r.try_recv().is_ok() {}
        // Only a default, with and without parentheses or a timeout.
        assert_eq!(fibra::select! { default => 5 }, 5);
        assert_eq!(fibra::select! { default() => 6, }, 6);
        let t = Instant::now();
        assert_eq!(
            fibra::select! { default(Duration::from_millis(20)) => 7 },
            7
        );
        assert!(t.elapsed() >= Duration::from_millis(20));
        // Channels by reference, behind Deref, and as temporaries.
        let shared = Arc::new(r);
        let boxed = Box::new(s.clone());
        let by_ref = &s;
        by_ref.send(8).unwrap();
        let v = fibra::select! { recv(&shared) -> v => v.unwrap() };
        assert_eq!(v, 8);
        fibra::select! { send(boxed, 9) -> r => r.unwrap() }
        let get = || shared.clone();
        let v = fibra::select! { recv(get()) -> v => v.unwrap() };
        assert_eq!(v, 9);
        // Blocks with and without commas between them.
        s.send(10).unwrap();
        let v = fibra::select! {
            recv(shared) -> v => { v.unwrap() }
            default(Duration::from_secs(5)) => { 0 },
        };
        assert_eq!(v, 10);
        // More operations than twelve.
        let chans: Vec<_> = (0..16).map(|_| mpsc::channel::<usize>()).collect();
        chans[15].0.send(15).unwrap();
        let c = &chans;
        let v = fibra::select! {
            recv(c[0].1) -> v => v.unwrap(), recv(c[1].1) -> v => v.unwrap(),
            recv(c[2].1) -> v => v.unwrap(), recv(c[3].1) -> v => v.unwrap(),
            recv(c[4].1) -> v => v.unwrap(), recv(c[5].1) -> v => v.unwrap(),
            recv(c[6].1) -> v => v.unwrap(), recv(c[7].1) -> v => v.unwrap(),
            recv(c[8].1) -> v => v.unwrap(), recv(c[9].1) -> v => v.unwrap(),
            recv(c[10].1) -> v => v.unwrap(), recv(c[11].1) -> v => v.unwrap(),
            recv(c[12].1) -> v => v.unwrap(), recv(c[13].1) -> v => v.unwrap(),
            recv(c[14].1) -> v => v.unwrap(), recv(c[15].1) -> v => v.unwrap(),
        };
        assert_eq!(v, 15);
        let _ = m;
    });
}

#[test]
fn select_biased_prefers_the_first_ready_arm_and_offers_in_order() {
    both(|m| {
        let (a_tx, a) = mpsc::channel::<u32>();
        let (b_tx, b) = mpsc::channel::<u32>();
        for i in 0..100 {
            a_tx.send(i).unwrap();
            b_tx.send(i).unwrap();
        }
        for i in 0..100 {
            let got = fibra::select_biased! {
                recv(a) -> v => ("a", v.unwrap()),
                recv(b) -> v => ("b", v.unwrap()),
            };
            assert_eq!(got, ("a", i));
        }
        // A waiting biased select's sends on one rendezvous channel: the first arm's goes.
        let (s, r) = mpsc::sync_channel::<u32>(0);
        let sender = m.go(move || {
            for _ in 0..50 {
                fibra::select_biased! {
                    send(s, 0) -> _ => {},
                    send(s, 1) -> _ => {},
                }
            }
        });
        let mut firsts = 0;
        for _ in 0..50 {
            m.sleep(Duration::from_micros(200));
            if r.recv().unwrap() == 0 {
                firsts += 1;
            }
        }
        sender.join();
        assert_eq!(firsts, 50);
    });
}

// ------------------------------------------------------------ after, tick, never

#[test]
fn after_delivers_one_message_at_its_time() {
    // crossbeam after: one message, the instant it was due, not before; then nothing.
    both(|m| {
        let start = Instant::now();
        let r = fibra::sync::after(Duration::from_millis(30));
        assert!(r.try_recv().is_err());
        let due = r.recv().unwrap();
        assert!(
            due >= start + Duration::from_millis(30)
                && start.elapsed() >= Duration::from_millis(30)
        );
        assert!(r.try_recv().is_err());
        assert!(r.recv_timeout(Duration::from_millis(10)).is_err());
        // Zero: due at once. Clones share the one message.
        let r = fibra::sync::after(Duration::ZERO);
        let c = r.clone();
        assert!(r.try_recv().is_ok());
        assert!(c.try_recv().is_err());
        // Duration::MAX: never.
        let r = fibra::sync::after(Duration::MAX);
        assert!(r.recv_timeout(Duration::from_millis(5)).is_err());
        // In a select: the timeout arm of a loop.
        let (_tx, rx) = mpsc::channel::<u32>();
        let timeout = fibra::sync::after(Duration::from_millis(20));
        let t = Instant::now();
        let timed_out = fibra::select! {
            recv(rx) -> _ => false,
            recv(timeout) -> _ => true,
        };
        assert!(timed_out && t.elapsed() >= Duration::from_millis(20));
        let _ = m;
    });
}

#[test]
fn tick_delivers_each_period_and_skips_what_was_not_received() {
    both(|m| {
        let start = Instant::now();
        let r = fibra::sync::tick(Duration::from_millis(10));
        let mut last = start;
        for _ in 0..3 {
            let due = r.recv().unwrap();
            assert!(due >= last + Duration::from_millis(10), "{:?}", due - last);
            last = due;
        }
        // Late: one tick waits, the ones missed meanwhile are gone.
        m.sleep(Duration::from_millis(50));
        assert!(r.try_recv().is_ok());
        assert!(r.try_recv().is_err());
        // In a select with other work: it wakes the select each period.
        let (_tx, rx) = mpsc::channel::<u32>();
        let ticker = fibra::sync::tick(Duration::from_millis(5));
        let t = Instant::now();
        let mut ticks = 0;
        while ticks < 4 {
            fibra::select! {
                recv(rx) -> _ => unreachable!(),
                recv(ticker) -> _ => ticks += 1,
            }
        }
        assert!(t.elapsed() >= Duration::from_millis(20));
    });
}

#[test]
fn never_is_never_chosen() {
    both(|_| {
        let n = fibra::sync::never::<u32>();
        assert!(n.try_recv().is_err());
        assert!(n.recv_timeout(Duration::from_millis(5)).is_err());
        let (tx, rx) = mpsc::channel::<u32>();
        tx.send(1).unwrap();
        for _ in 0..20 {
            let v = fibra::select! {
                recv(n) -> _ => unreachable!(),
                recv(rx) -> v => v.unwrap(),
                default(Duration::from_millis(1)) => 0,
            };
            assert!(v <= 1);
        }
        let v = fibra::select! {
            recv(n) -> _ => 1,
            default => 2,
        };
        assert_eq!(v, 2);
    });
}

// ------------------------------------------------------------ handles

#[test]
fn lengths_capacities_and_same_channel_as_crossbeam_reports_them() {
    fn unwind_safe<T: std::panic::UnwindSafe + std::panic::RefUnwindSafe>(_: &T) {}
    both(|m| {
        let (s, r) = mpmc::sync_channel::<u32>(2);
        assert_eq!((s.capacity(), r.capacity()), (Some(2), Some(2)));
        assert!(s.is_empty() && !s.is_full());
        s.send(1).unwrap();
        assert_eq!((s.len(), r.len()), (1, 1));
        s.send(2).unwrap();
        assert!(s.is_full() && r.is_full());
        // A blocked sender's message is not counted until it moves in.
        let s2 = s.clone();
        let blocked = m.go(move || s2.send(3).unwrap());
        m.sleep(Duration::from_millis(20));
        assert_eq!(r.len(), 2);
        assert_eq!(r.recv(), Ok(1));
        blocked.join();
        assert_eq!(r.len(), 2);
        // Unbounded: never full; try_send and send_timeout never wait.
        let (s, r) = mpmc::channel::<u32>();
        assert_eq!((s.capacity(), r.capacity()), (None, None));
        s.try_send(1).unwrap();
        s.send_timeout(2, Duration::ZERO).unwrap();
        assert!(!s.is_full() && s.len() == 2);
        drop(r);
        assert!(matches!(
            s.try_send(3),
            Err(mpmc::TrySendError::Disconnected(3))
        ));
        assert!(matches!(
            s.send_timeout(4, Duration::from_secs(1)),
            Err(mpmc::SendTimeoutError::Disconnected(4))
        ));
        // A rendezvous channel holds nothing and is always full.
        let (s, r) = mpmc::sync_channel::<u32>(0);
        assert!(s.is_full() && r.is_empty() && s.capacity() == Some(0));
        // same_channel.
        let (s2, r2) = mpmc::channel::<u32>();
        assert!(r.same_channel(&r.clone()) && !r.same_channel(&mpmc::sync_channel(0).1));
        assert!(s2.same_channel(&s2.clone()) && s.same_channel(&s.clone()));
        unwind_safe(&s);
        unwind_safe(&s2);
        unwind_safe(&r2);
        // mpsc's receiver counts what it took in a batch too.
        let (tx, rx) = mpsc::channel::<u32>();
        for i in 0..10 {
            tx.send(i).unwrap();
        }
        assert_eq!(rx.recv(), Ok(0));
        assert_eq!(rx.len(), 9);
        assert_eq!(rx.capacity(), None);
        unwind_safe(&tx);
        unwind_safe(&rx);
    });
}

// ------------------------------------------------------------ broadcast (tokio's shape)

#[test]
fn broadcast_lengths_resubscribe_and_closed_as_tokio_reports_them() {
    use fibra::sync::broadcast;
    both(|m| {
        let (tx, mut rx) = broadcast::channel::<u32>(4);
        assert!(tx.is_empty() && rx.is_empty());
        tx.send(1).unwrap();
        tx.send(2).unwrap();
        assert_eq!((tx.len(), rx.len()), (2, 2));
        let mut late = rx.resubscribe();
        assert_eq!(
            late.len(),
            0,
            "a resubscribed receiver sees only what comes next"
        );
        // A receive takes what is waiting at once (up to 16): the channel holds nothing
        // for rx any more, though rx has one message still to return (tokio: 1 and 1).
        assert_eq!(rx.recv(), Ok(1));
        assert_eq!((tx.len(), rx.len()), (0, 1));
        assert_eq!(rx.recv(), Ok(2));
        assert_eq!(tx.len(), 0);
        tx.send(3).unwrap();
        assert_eq!(late.recv(), Ok(3));
        // More than the capacity unread: the receiver's len says so, and it lags.
        for i in 0..6 {
            tx.send(10 + i).unwrap();
        }
        assert_eq!(rx.len(), 7);
        assert!(matches!(rx.recv(), Err(broadcast::RecvError::Lagged(3))));
        // closed() waits for the last receiver.
        assert!(!tx.is_closed());
        let t2 = tx.clone();
        let waiter = m.go(move || {
            t2.closed();
            t2.is_closed()
        });
        m.sleep(Duration::from_millis(20));
        drop((rx, late));
        assert!(waiter.join());
        tx.closed();
        // A sender made alone, with a receiver later.
        let tx = broadcast::Sender::<u32>::new(2);
        assert!(tx.is_closed() && tx.send(1).is_err());
        let mut rx = tx.subscribe();
        tx.send(5).unwrap();
        assert_eq!(rx.recv(), Ok(5));
    });
}

// ------------------------------------------------------------ Select, by index (crossbeam's)

#[test]
fn select_by_index_chooses_receives_and_sends_and_finishes_them() {
    use fibra::sync::Select;
    both(|m| {
        let (s1, r1) = mpmc::channel::<u32>();
        let (s2, r2) = mpmc::sync_channel::<u32>(0);
        // Nothing ready: try_select fails, select_timeout times out.
        {
            let mut sel = Select::new();
            sel.recv(&r1);
            sel.recv(&r2);
            assert!(sel.try_select().is_err());
            let t = Instant::now();
            assert!(sel.select_timeout(Duration::from_millis(20)).is_err());
            assert!(t.elapsed() >= Duration::from_millis(20));
            assert!(sel.try_ready().is_err());
        }
        // A buffered message: the receive is chosen and finished with its message.
        s1.send(5).unwrap();
        let mut sel = Select::new();
        let i1 = sel.recv(&r1);
        let i2 = sel.recv(&r2);
        let oper = sel.select();
        assert_eq!(oper.index(), i1);
        assert_eq!(oper.recv(&r1), Ok(5));
        // A rendezvous receive chosen against a sender that arrives later.
        let keep = s2.clone();
        let sender = m.go(move || s2.send(7).unwrap());
        let oper = sel.select();
        assert_eq!(oper.index(), i2);
        assert_eq!(oper.recv(&r2), Ok(7));
        sender.join();
        // Disconnected: the receive is chosen, with the error.
        drop(s1);
        let oper = sel.select();
        assert_eq!(oper.index(), i1);
        assert!(oper.recv(&r1).is_err());
        // Removed operations are never chosen; indices stay.
        sel.remove(i1);
        assert!(sel.try_select().is_err());
        drop(keep);
        // Sends: chosen when the channel could take a message, finished with one.
        let (s3, r3) = mpmc::sync_channel::<u32>(1);
        let (s4, r4) = mpmc::sync_channel::<u32>(0);
        let mut sel = Select::new();
        let i3 = sel.send(&s3);
        let i4 = sel.send(&s4);
        let oper = sel.select();
        assert_eq!(oper.index(), i3);
        oper.send(&s3, 30).unwrap();
        // s3 full, s4 has no receiver: the select waits for a receiver of s4.
        let receiver = m.go(move || r4.recv().unwrap());
        let oper = sel.select();
        assert_eq!(oper.index(), i4);
        oper.send(&s4, 40).unwrap();
        assert_eq!(receiver.join(), 40);
        assert_eq!(r3.recv(), Ok(30));
    });
}

#[test]
fn ready_reports_an_operation_that_could_complete_without_completing_it() {
    use fibra::sync::Select;
    both(|m| {
        let (s, r) = mpmc::channel::<u32>();
        let (s2, r2) = mpmc::sync_channel::<u32>(0);
        let mut sel = Select::new();
        let i = sel.recv(&r);
        let j = sel.recv(&r2);
        assert!(sel.try_ready().is_err());
        assert!(sel.ready_timeout(Duration::from_millis(10)).is_err());
        s.send(1).unwrap();
        assert_eq!(sel.ready(), i);
        // Nothing was taken.
        assert_eq!(r.try_recv(), Ok(1));
        // A blocked sender makes a rendezvous receive ready.
        let sender = m.go(move || s2.send(2).unwrap());
        assert_eq!(sel.ready(), j);
        assert_eq!(r2.recv(), Ok(2));
        sender.join();
        // Biased: the first added of the ready ones.
        s.send(3).unwrap();
        let (t, tr) = mpmc::channel::<u32>();
        t.send(4).unwrap();
        let mut sel = Select::new_biased();
        let a = sel.recv(&tr);
        sel.recv(&r);
        for _ in 0..10 {
            assert_eq!(sel.ready(), a);
        }
    });
}

#[test]
fn a_selected_operation_is_checked_and_must_be_finished() {
    use fibra::sync::Select;
    use std::panic::{catch_unwind, AssertUnwindSafe};
    both(|_| {
        let (s, r) = mpmc::channel::<u32>();
        let (_s2, other) = mpmc::channel::<u32>();
        s.send(1).unwrap();
        let mut sel = Select::new();
        sel.recv(&r);
        let oper = sel.select();
        // The wrong receiver panics; so does dropping a chosen operation unfinished.
        let p = catch_unwind(AssertUnwindSafe(|| oper.recv(&other))).unwrap_err();
        let msg = crate::common::panic_message(&*p).unwrap();
        assert!(msg.contains("another channel"), "{msg}");
        s.send(2).unwrap();
        let p = catch_unwind(AssertUnwindSafe(|| drop(sel.select()))).unwrap_err();
        let msg = crate::common::panic_message(&*p).unwrap();
        assert!(msg.contains("without being finished"), "{msg}");
    });
}

#[test]
fn select_arms_and_select_wake_for_a_timed_arm() {
    // Every form of select parks no later than its `after` arm is due.
    both(|_| {
        let (_tx, rx) = mpsc::channel::<u32>();
        let t = Instant::now();
        let timeout = fibra::sync::after(Duration::from_millis(20));
        let mut arms = fibra::sync::SelectArms::new();
        arms.recv(&rx, |_| false).recv(&timeout, |_| true);
        assert!(arms.wait());
        let timeout = fibra::sync::after(Duration::from_millis(20));
        let mut sel = fibra::sync::Select::new();
        sel.recv(&rx);
        let i = sel.recv(&timeout);
        let oper = sel.select();
        assert_eq!(oper.index(), i);
        assert!(oper.recv(&timeout).is_ok());
        assert!(t.elapsed() >= Duration::from_millis(40));
    });
}

// ------------------------------------------------------------ the three flavours alike

/// A send the way one flavour sends (`Err`: the message back, disconnected).
type SendFn = Box<dyn Fn(u32) -> Result<(), u32> + Send + Sync>;

/// An mpmc channel of each of crossbeam's flavours: list (unbounded), array (bound 2) and
/// zero (rendezvous), as a sender that sends the way the flavour does and a receiver.
fn flavours() -> Vec<(&'static str, SendFn, mpmc::Receiver<u32>)> {
    let (s, r) = mpmc::channel::<u32>();
    let list: SendFn = Box::new(move |v| s.send(v).map_err(|e| e.0));
    let (s, ra) = mpmc::sync_channel::<u32>(2);
    let array: SendFn = Box::new(move |v| s.send(v).map_err(|e| e.0));
    let (s, rz) = mpmc::sync_channel::<u32>(0);
    let zero: SendFn = Box::new(move |v| s.send(v).map_err(|e| e.0));
    vec![("list", list, r), ("array", array, ra), ("zero", zero, rz)]
}

#[test]
fn every_flavour_delivers_in_order_once_and_reports_disconnection() {
    // crossbeam list/array/zero: spsc and mpmc delivery, order per sender, nothing lost or
    // doubled, disconnection waking a waiting receiver, recv_timeout.
    both(|m| {
        for (name, send, r) in flavours() {
            assert!(r.recv_timeout(Duration::from_millis(5)).is_err(), "{name}");
            let send = Arc::new(send);
            let senders: Vec<_> = (0..3u32)
                .map(|k| {
                    let send = send.clone();
                    m.go(move || {
                        for i in 0..200 {
                            send(k * 1000 + i).unwrap();
                        }
                    })
                })
                .collect();
            let receivers: Vec<_> = (0..2)
                .map(|_| {
                    let r = r.clone();
                    m.go(move || {
                        let mut got = Vec::new();
                        while got.len() < 300 {
                            got.push(r.recv().unwrap());
                        }
                        got
                    })
                })
                .collect();
            senders.into_iter().for_each(|s| s.join());
            let mut all = Vec::new();
            for rx in receivers {
                let got = rx.join();
                // Each receiver sees each sender's messages in the order they were sent.
                for k in 0..3 {
                    let mine: Vec<_> = got.iter().filter(|v| **v / 1000 == k).collect();
                    assert!(
                        mine.windows(2).all(|w| w[0] < w[1]),
                        "{name}: order of sender {k}"
                    );
                }
                all.extend(got);
            }
            all.sort_unstable();
            let want: Vec<u32> = (0..3)
                .flat_map(|k| (0..200).map(move |i| k * 1000 + i))
                .collect();
            assert_eq!(all, want, "{name}: every message once");
            // The last sender gone wakes a waiting receiver with the error.
            let waiter = {
                let r = r.clone();
                m.go(move || r.recv())
            };
            m.sleep(Duration::from_millis(10));
            drop(send);
            assert!(waiter.join().is_err(), "{name}");
            assert!(r.try_recv().is_err() && r.recv().is_err(), "{name}");
        }
    });
}

#[test]
fn messages_are_dropped_exactly_once_whatever_becomes_of_them() {
    // crossbeam drops: a random mix of sends and receives, then the channel dropped with
    // messages inside; every message is dropped once.
    both(|_| {
        static DROPS: AtomicUsize = AtomicUsize::new(0);
        struct D;
        impl Drop for D {
            fn drop(&mut self) {
                DROPS.fetch_add(1, Ordering::SeqCst);
            }
        }
        for bound in [None, Some(5)] {
            DROPS.store(0, Ordering::SeqCst);
            let (made, taken) = {
                let (s, r) = match bound {
                    None => {
                        let (s, r) = mpmc::channel::<D>();
                        (
                            Box::new(move |d| s.send(d).map_err(drop))
                                as Box<dyn Fn(D) -> Result<(), ()>>,
                            r,
                        )
                    }
                    Some(b) => {
                        let (s, r) = mpmc::sync_channel::<D>(b);
                        (
                            Box::new(move |d| s.try_send(d).map_err(drop))
                                as Box<dyn Fn(D) -> Result<(), ()>>,
                            r,
                        )
                    }
                };
                let (mut made, mut taken) = (0, 0);
                for i in 0..100usize {
                    if i % 3 == 2 {
                        if r.try_recv().is_ok() {
                            taken += 1;
                        }
                    } else {
                        made += 1;
                        let _ = s(D);
                    }
                }
                (made, taken)
            };
            assert_eq!(
                DROPS.load(Ordering::SeqCst),
                made,
                "bound {bound:?}, {taken} taken"
            );
        }
    });
}

#[test]
fn a_channel_sent_through_a_channel_works_and_iterators_end_with_the_senders() {
    // crossbeam channel_through_channel and iter: recv_iter stops at disconnection,
    // try_iter takes only what is there, into_iter owns the receiver.
    both(|m| {
        let (s, r) = mpmc::channel::<mpmc::Sender<u32>>();
        let (inner_s, inner_r) = mpmc::channel::<u32>();
        let peer = m.go(move || {
            let back = r.recv().unwrap();
            for i in 0..5 {
                back.send(i).unwrap();
            }
        });
        s.send(inner_s).unwrap();
        peer.join();
        assert_eq!(inner_r.try_iter().collect::<Vec<_>>(), [0, 1, 2, 3, 4]);
        assert!(inner_r.try_iter().next().is_none());
        let (s, r) = mpmc::sync_channel::<u32>(1);
        let producer = m.go(move || (0..10).for_each(|i| s.send(i).unwrap()));
        let got: Vec<_> = r.iter().collect();
        producer.join();
        assert_eq!(got, (0..10).collect::<Vec<_>>());
        let (s, r) = mpmc::channel::<u32>();
        s.send(1).unwrap();
        drop(s);
        assert_eq!(r.into_iter().collect::<Vec<_>>(), [1]);
    });
}

#[test]
fn a_select_that_returns_nothing_could_not_have_completed_anything() {
    // crossbeam linearizable_default/_timeout/_try: a thread sends on its channel 1 and
    // selects at once without waiting, while a thief first sends on channel 2 and then takes
    // from channel 1: at every moment one of the two holds a message, so the select never
    // takes its default.
    both(|m| {
        const ROUNDS: usize = 20_000;
        for bound in [1, 1 << 20] {
            let bounded = bound == 1;
            let ((s1, r1), (s2, r2)) = (
                mpmc::sync_channel::<u32>(bound),
                mpmc::sync_channel::<u32>(bound),
            );
            let (go_s, go_r) = mpmc::sync_channel::<()>(0);
            let (done_s, done_r) = mpmc::sync_channel::<()>(0);
            let (t1, t2) = (r1.clone(), s2.clone());
            let thief = m.go(move || {
                for _ in 0..ROUNDS {
                    go_r.recv().unwrap();
                    t2.send(2).unwrap();
                    let _ = t1.try_recv();
                    done_r.recv().unwrap();
                }
            });
            for round in 0..ROUNDS {
                go_s.send(()).unwrap();
                s1.send(1).unwrap();
                let got = match round % 4 {
                    0 => fibra::select! {
                        recv(r1) -> _ => true,
                        recv(r2) -> _ => true,
                        default => false,
                    },
                    // Channel 2 first: the order in which a single round can miss.
                    3 => fibra::select_biased! {
                        recv(r2) -> _ => true,
                        recv(r1) -> _ => true,
                        default => false,
                    },
                    1 => fibra::select! {
                        recv(r1) -> _ => true,
                        recv(r2) -> _ => true,
                        default(Duration::ZERO) => false,
                    },
                    _ => {
                        let mut sel = fibra::sync::Select::new();
                        sel.recv(&r1);
                        sel.recv(&r2);
                        match sel.try_select() {
                            Ok(oper) if oper.index() == 0 => oper.recv(&r1).is_ok(),
                            Ok(oper) => oper.recv(&r2).is_ok(),
                            Err(_) => false,
                        }
                    }
                };
                assert!(
                    got,
                    "round {round} (bounded: {bounded}): a ready channel was missed"
                );
                done_s.send(()).unwrap();
                let _ = r2.try_recv();
                let _ = r1.try_recv();
            }
            thief.join();
        }
    });
}

#[test]
fn a_chosen_operation_is_finished_on_any_handle_of_its_channel() {
    // crossbeam issue 1096: the chosen operation is the channel's, not the handle's.
    use fibra::sync::Select;
    both(|_| {
        let (s, r) = mpmc::channel::<u32>();
        s.send(1).unwrap();
        let mut sel = Select::new();
        sel.recv(&r);
        let oper = sel.select();
        assert_eq!(oper.recv(&r.clone()), Ok(1));
        let mut sel = Select::new();
        sel.send(&s);
        let oper = sel.select();
        oper.send(&s.clone(), 2).unwrap();
        assert_eq!(r.recv(), Ok(2));
    });
}

#[test]
fn rendezvous_edges_as_crossbeam_and_std_report_them() {
    both(|m| {
        // A plain send blocked on a rendezvous channel fails when the receiver goes, with
        // its message; try_send with no receiver left says Disconnected, not Full.
        let (s, r) = mpmc::sync_channel::<u32>(0);
        let s2 = s.clone();
        let blocked = m.go(move || s2.send(7));
        m.sleep(Duration::from_millis(20));
        drop(r);
        assert_eq!(blocked.join().unwrap_err().0, 7);
        assert!(matches!(
            s.try_send(8),
            Err(mpmc::TrySendError::Disconnected(8))
        ));
        // try_recv takes a blocked sender's message.
        let (s, r) = mpmc::sync_channel::<u32>(0);
        let sender = m.go(move || s.send(9).unwrap());
        eventually(m, "try_recv to take the blocked send", || {
            r.try_recv() == Ok(9)
        });
        sender.join();
        // A disconnected receive and a send with no receiver are ready.
        let (s, r) = mpmc::channel::<u32>();
        drop(s);
        let (s3, r3) = mpmc::channel::<u32>();
        drop(r3);
        let mut sel = fibra::sync::Select::new();
        let i = sel.recv(&r);
        assert_eq!(sel.try_ready(), Ok(i));
        let mut sel = fibra::sync::Select::new();
        let j = sel.send(&s3);
        assert_eq!(sel.ready_timeout(Duration::from_secs(1)), Ok(j));
        // Every message dropped once on a rendezvous channel too.
        static DROPS: AtomicUsize = AtomicUsize::new(0);
        struct D;
        impl Drop for D {
            fn drop(&mut self) {
                DROPS.fetch_add(1, Ordering::SeqCst);
            }
        }
        DROPS.store(0, Ordering::SeqCst);
        let (s, r) = mpmc::sync_channel::<D>(0);
        let senders: Vec<_> = (0..4)
            .map(|_| {
                let s = s.clone();
                m.go(move || (0..25).filter(|_| s.send(D).is_ok()).count())
            })
            .collect();
        let mut received = 0;
        for _ in 0..50 {
            drop(r.recv().unwrap());
            received += 1;
        }
        drop(r);
        let sent: usize = senders.into_iter().map(|h| h.join()).sum();
        assert_eq!(sent, received);
        assert_eq!(
            DROPS.load(Ordering::SeqCst),
            100,
            "every message made was dropped once"
        );
    });
}

#[test]
fn a_sender_clone_dropped_while_a_select_waits_neither_ends_the_wait_nor_loses_a_message() {
    // crossbeam cloning1/2/3: only the last sender's drop disconnects.
    both(|m| {
        let (s, r) = mpmc::channel::<u32>();
        let (s2, r2) = mpmc::channel::<u32>();
        let clone = s.clone();
        let waiter = m.go(move || {
            fibra::select! {
                recv(r) -> v => v.unwrap(),
                recv(r2) -> v => v.unwrap() + 100,
            }
        });
        m.sleep(Duration::from_millis(10));
        drop(clone);
        m.sleep(Duration::from_millis(10));
        s.send(1).unwrap();
        assert_eq!(waiter.join(), 1);
        drop(s2);
    });
}

#[test]
fn duplicated_arms_and_sends_with_room_are_chosen_evenly() {
    // crossbeam fairness_duplicates / duplicate_operations / fairness_send / fairness1.
    both(|_| {
        const N: usize = 4_000;
        let (s, r) = mpmc::channel::<()>();
        for _ in 0..N {
            s.send(()).unwrap();
        }
        let mut hits = [0usize; 4];
        for _ in 0..N {
            fibra::select! {
                recv(r) -> _ => hits[0] += 1,
                recv(r) -> _ => hits[1] += 1,
                recv(r) -> _ => hits[2] += 1,
                recv(r) -> _ => hits[3] += 1,
            }
        }
        assert!(
            hits.iter().all(|&h| h >= N / 4 / 2),
            "duplicated receives {hits:?}"
        );
        let (a, _ra) = mpmc::channel::<()>();
        let (b, _rb) = mpmc::sync_channel::<()>(N);
        let mut sent = [0usize; 2];
        for _ in 0..N {
            fibra::select! {
                send(a, ()) -> _ => sent[0] += 1,
                send(b, ()) -> _ => sent[1] += 1,
            }
        }
        assert!(
            sent.iter().all(|&h| h >= N / 2 / 2),
            "sends with room {sent:?}"
        );
        // Across flavours and the clock's receivers, all ready.
        let (u, ru) = mpmc::channel::<()>();
        let (bb, rb) = mpmc::sync_channel::<()>(N);
        for _ in 0..N {
            u.send(()).unwrap();
            bb.send(()).unwrap();
        }
        let mut hits = [0usize; 4];
        for _ in 0..N {
            let after = fibra::sync::after(Duration::ZERO);
            let tick = fibra::sync::tick(Duration::ZERO);
            fibra::select! {
                recv(ru) -> _ => hits[0] += 1,
                recv(rb) -> _ => hits[1] += 1,
                recv(after) -> _ => hits[2] += 1,
                recv(tick) -> _ => hits[3] += 1,
            }
        }
        assert!(
            hits.iter().all(|&h| h >= N / 4 / 2),
            "across flavours {hits:?}"
        );
    });
}

#[test]
fn after_and_tick_shared_between_threads_deliver_each_message_once() {
    // crossbeam after/tick select, recv_two, recv_race, stress_default, intervals.
    both(|m| {
        // One after, two takers: exactly one gets it.
        let a = fibra::sync::after(Duration::from_millis(10));
        let takers: Vec<_> = (0..2)
            .map(|_| {
                let a = a.clone();
                m.go(move || a.recv_timeout(Duration::from_millis(200)).is_ok())
            })
            .collect();
        let got = takers
            .into_iter()
            .filter(|_| true)
            .map(|t| t.join() as u32)
            .sum::<u32>();
        assert_eq!(got, 1);
        // The earlier of two afters wins; an after(0) beats a default, a far one does not.
        let early = fibra::sync::after(Duration::from_millis(5));
        let late = fibra::sync::after(Duration::from_millis(500));
        let first = fibra::select! {
            recv(late) -> _ => "late",
            recv(early) -> _ => "early",
        };
        assert_eq!(first, "early");
        let zero = fibra::sync::after(Duration::ZERO);
        assert!(fibra::select! { recv(zero) -> _ => true, default => false });
        let far = fibra::sync::after(Duration::from_millis(100));
        assert!(fibra::select! { recv(far) -> _ => false, default => true });
        // A tick received late gives the first missed due time, and the next is due a
        // period after that receive.
        let period = Duration::from_millis(10);
        let start = Instant::now();
        let t = fibra::sync::tick(period);
        m.sleep(Duration::from_millis(35));
        let due = t.recv().unwrap();
        assert!(due >= start + period && due < start + 2 * period + Duration::from_millis(50));
        // The receive came at least 35 ms in: the next is due a period after it, not on
        // the first schedule (20, 30, 40 ms).
        let next = t.recv().unwrap();
        assert!(
            next >= start + Duration::from_millis(45),
            "{:?}",
            next - start
        );
        // recv_timeout shorter than the period times out, then the tick comes.
        let t = fibra::sync::tick(Duration::from_millis(30));
        assert!(t.recv_timeout(Duration::from_millis(5)).is_err());
        assert!(t.recv_timeout(Duration::from_millis(100)).is_ok());
        // Two ticks shared by three takers for ~100 ms: every delivery goes to one taker.
        let ticks = [
            fibra::sync::tick(Duration::from_millis(10)),
            fibra::sync::tick(Duration::from_millis(10)),
        ];
        let until = Instant::now() + Duration::from_millis(100);
        let takers: Vec<_> = (0..3)
            .map(|_| {
                let [a, b] = ticks.clone();
                m.go(move || {
                    let mut got = Vec::new();
                    while Instant::now() < until {
                        fibra::select! {
                            recv(a) -> d => got.push((0, d.unwrap())),
                            recv(b) -> d => got.push((1, d.unwrap())),
                            default(Duration::from_millis(5)) => {},
                        }
                    }
                    got
                })
            })
            .collect();
        let mut all: Vec<(i32, Instant)> = takers.into_iter().flat_map(|t| t.join()).collect();
        let n = all.len();
        all.sort();
        all.dedup();
        assert_eq!(all.len(), n, "a tick was delivered twice");
        assert!(n >= 4, "{n} ticks in 100 ms of two 10 ms tickers");
    });
}

#[test]
fn selects_pairing_on_one_rendezvous_channel_leave_nothing_over() {
    // crossbeam matching / matching_with_leftover: an odd number of selects that each
    // either send or receive on one rendezvous channel, plus one plain send: all pair up.
    both(|m| {
        const PARTIES: usize = 21;
        let (s, r) = mpmc::sync_channel::<usize>(0);
        let parties: Vec<_> = (0..PARTIES)
            .map(|i| {
                let (s, r) = (s.clone(), r.clone());
                m.go(move || {
                    fibra::select! {
                        recv(r) -> v => { v.unwrap(); }
                        send(s, i) -> v => v.unwrap(),
                    }
                })
            })
            .collect();
        s.send(99).unwrap();
        for p in parties {
            p.join();
        }
        assert!(r.try_recv().is_err(), "nothing left over");
    });
}

#[test]
fn lengths_stay_exact_under_traffic_and_zero_on_a_rendezvous_channel() {
    // crossbeam array len / zero len / list+array linearizable (send then try_recv).
    both(|m| {
        let (s, r) = mpmc::sync_channel::<u32>(5);
        for round in 0..200u32 {
            for i in 0..(round % 5) {
                s.send(i).unwrap();
                assert_eq!(s.len(), i as usize + 1);
                assert!(s.len() <= 5 && r.len() == s.len());
            }
            while r.try_recv().is_ok() {}
            assert_eq!(r.len(), 0);
        }
        let (s, r) = mpmc::sync_channel::<u32>(0);
        let sender = m.go(move || {
            for i in 0..100 {
                s.send(i).unwrap();
            }
        });
        for i in 0..100 {
            assert_eq!(r.len(), 0);
            assert_eq!(r.recv(), Ok(i));
        }
        sender.join();
        // A send followed by a try_recv always finds a message, whatever other threads do.
        let (s, r) = mpmc::channel::<u32>();
        let workers: Vec<_> = (0..3)
            .map(|_| {
                let (s, r) = (s.clone(), r.clone());
                m.go(move || {
                    for i in 0..2_000 {
                        s.send(i).unwrap();
                        assert!(r.try_recv().is_ok());
                    }
                })
            })
            .collect();
        workers.into_iter().for_each(|w| w.join());
    });
}

#[test]
fn rendezvous_timed_sends_and_receives_race_without_losing_or_reordering() {
    // crossbeam zero/array stress_timeout_two_threads, std's stress_recv_timeout_*.
    both(|m| {
        for bound in [0usize, 2] {
            let (s, r) = mpmc::sync_channel::<u32>(bound);
            let sender = m.go(move || {
                for i in 0..300u32 {
                    loop {
                        match s.send_timeout(i, Duration::from_micros(200)) {
                            Ok(()) => break,
                            Err(mpmc::SendTimeoutError::Timeout(_)) => {}
                            Err(e) => panic!("{e:?}"),
                        }
                    }
                }
            });
            let mut next = 0;
            while next < 300 {
                if let Ok(v) = r.recv_timeout(Duration::from_micros(150)) {
                    assert_eq!(v, next, "bound {bound}");
                    next += 1;
                }
            }
            sender.join();
        }
    });
}

#[test]
fn broadcast_resubscribe_and_closed_at_the_edges() {
    // tokio resubscribe_lagged, resubscribe_to_closed_channel,
    // broadcast_sender_closed_with_extra_subscribe, receiver_len_after_lag_error.
    use fibra::sync::broadcast;
    both(|m| {
        let (tx, mut rx) = broadcast::channel::<u32>(2);
        for i in 0..5 {
            tx.send(i).unwrap();
        }
        let mut fresh = rx.resubscribe();
        assert!(matches!(rx.recv(), Err(broadcast::RecvError::Lagged(3))));
        assert_eq!(rx.len(), 2, "after the lag: the retained messages only");
        assert!(fresh.is_empty() && fresh.try_recv().is_err());
        tx.send(9).unwrap();
        assert_eq!(fresh.recv(), Ok(9));
        drop(tx);
        let mut again = fresh.resubscribe();
        assert!(matches!(again.recv(), Err(broadcast::RecvError::Closed)));
        // closed() waits again once a receiver is subscribed after the channel closed.
        let tx = broadcast::Sender::<u32>::new(2);
        tx.closed();
        let rx = tx.subscribe();
        let t2 = tx.clone();
        let waiter = m.go(move || {
            t2.closed();
            true
        });
        m.sleep(Duration::from_millis(20));
        drop(rx);
        assert!(waiter.join());
        drop((again, fresh));
    });
}

#[test]
fn selects_nest_and_panics_in_channel_expressions_propagate() {
    // crossbeam nesting, parse_nesting, panic_sender, panic_receiver.
    both(|_| {
        let (s, r) = mpmc::channel::<u32>();
        s.send(1).unwrap();
        s.send(2).unwrap();
        let v = fibra::select! {
            recv(r) -> a => fibra::select! {
                recv(r) -> b => a.unwrap() * 10 + b.unwrap(),
                default => 0,
            },
            default => 0,
        };
        assert_eq!(v, 12);
        fn no_sender() -> mpmc::Sender<u32> {
            panic!("no sender")
        }
        let p = std::panic::catch_unwind(|| {
            fibra::select! { send(no_sender(), unreachable!("the message")) -> _ => {} }
        })
        .unwrap_err();
        assert_eq!(
            crate::common::panic_message(&*p).as_deref(),
            Some("no sender")
        );
        fn no_receiver() -> mpmc::Receiver<u32> {
            panic!("no receiver")
        }
        let p = std::panic::catch_unwind(|| fibra::select! { recv(no_receiver()) -> _ => {} })
            .unwrap_err();
        assert_eq!(
            crate::common::panic_message(&*p).as_deref(),
            Some("no receiver")
        );
    });
}

#[test]
fn a_non_waiting_select_takes_a_waiting_selects_offer_and_a_select_alone_sends_to_itself() {
    // crossbeam select_macro try_recv, send_recv_same_channel (unbounded half), sync3.
    both(|m| {
        let (s, r) = mpmc::sync_channel::<u32>(0);
        let offering = m.go(move || {
            fibra::select! {
                send(s, 5) -> v => v.unwrap(),
            }
        });
        eventually(m, "a select with default to take the offered send", || {
            fibra::select! {
                recv(r) -> v => v == Ok(5),
                default => false,
            }
        });
        offering.join();
        // On an unbounded channel a select on both ends completes its send at once.
        let (s, r) = mpmc::channel::<u32>();
        let which = fibra::select! {
            send(s, 1) -> _ => "send",
            recv(r) -> _ => "recv",
        };
        assert_eq!(which, "send");
        // Both ready (a rendezvous sender waiting, an unbounded message): one completes,
        // the other is left as it was.
        let (zs, zr) = mpmc::sync_channel::<u32>(0);
        let (us, ur) = mpmc::channel::<u32>();
        us.send(2).unwrap();
        let sender = m.go(move || zs.send(1).unwrap());
        m.sleep(Duration::from_millis(20));
        let got = fibra::select! {
            recv(zr) -> v => v.unwrap(),
            recv(ur) -> v => v.unwrap(),
        };
        if got == 1 {
            assert_eq!(ur.try_recv(), Ok(2));
        } else {
            assert_eq!(zr.recv(), Ok(1));
        }
        sender.join();
    });
}

#[test]
fn receivers_travel_through_channels_a_thousand_hops_via_select() {
    // crossbeam channel_through_channel: each hop sends the receiver of a new channel
    // through the current one, with select!, on rendezvous and bounded channels.
    type Hop = Box<dyn std::any::Any + Send>;
    both(|m| {
        for bound in [0usize, 1, 2] {
            let (s, r) = mpmc::sync_channel::<Hop>(bound);
            let sender = m.go(move || {
                let mut s = s;
                for _ in 0..1_000 {
                    let (next_s, next_r) = mpmc::sync_channel::<Hop>(bound);
                    let hop: Hop = Box::new(Some(next_r));
                    fibra::select! { send(s, hop) -> res => res.unwrap() }
                    s = next_s;
                }
            });
            let mut r = r;
            for _ in 0..1_000 {
                r = fibra::select! {
                    recv(r) -> hop => hop
                        .unwrap()
                        .downcast_mut::<Option<mpmc::Receiver<Hop>>>()
                        .unwrap()
                        .take()
                        .unwrap(),
                };
            }
            sender.join();
            assert!(r.recv().is_err(), "the last sender is gone");
        }
    });
}

#[test]
fn select_by_index_in_lockstep_with_peers_and_after_a_forgotten_choice() {
    // crossbeam select both_ready, loop_try, forget_select_*.
    use fibra::sync::Select;
    both(|m| {
        // One Select holding a rendezvous receive and a rendezvous send, against a peer
        // that sends then receives: both complete over two selects.
        let (s1, r1) = mpmc::sync_channel::<u32>(0);
        let (s2, r2) = mpmc::sync_channel::<u32>(0);
        let peer = m.go(move || {
            s1.send(1).unwrap();
            r2.recv().unwrap()
        });
        let mut done = (false, false);
        while done != (true, true) {
            let mut sel = Select::new();
            let a = (!done.0).then(|| sel.recv(&r1));
            let b = (!done.1).then(|| sel.send(&s2));
            let oper = sel.select();
            if Some(oper.index()) == a {
                assert_eq!(oper.recv(&r1), Ok(1));
                done.0 = true;
            } else if Some(oper.index()) == b {
                oper.send(&s2, 2).unwrap();
                done.1 = true;
            } else {
                unreachable!();
            }
        }
        assert_eq!(peer.join(), 2);
        // try_select in a loop meets a peer waiting in select_timeout.
        let (s, r) = mpmc::sync_channel::<u32>(0);
        let waiting = m.go(move || {
            let mut sel = Select::new();
            sel.recv(&r);
            match sel.select_timeout(Duration::from_secs(10)) {
                Ok(oper) => oper.recv(&r).unwrap(),
                Err(_) => 0,
            }
        });
        eventually(m, "a try_select send to meet the waiting select", || {
            let mut sel = Select::new();
            sel.send(&s);
            match sel.try_select() {
                Ok(oper) => oper.send(&s, 3).is_ok(),
                Err(_) => false,
            }
        });
        assert_eq!(waiting.join(), 3);
        // A chosen operation forgotten: the channels drop cleanly afterwards.
        let (s, r) = mpmc::channel::<u32>();
        s.send(1).unwrap();
        let mut sel = Select::new();
        sel.recv(&r);
        std::mem::forget(sel.select());
        drop(sel);
        drop((s, r));
    });
}

#[test]
fn iterators_left_early_and_try_sends_waking_receivers() {
    // std's test_recv_iter_break and issue_15761, crossbeam stress_oneshot.
    both(|m| {
        let (s, r) = mpmc::sync_channel::<u32>(3);
        let taker = m.go(move || {
            let mut n = 0;
            for v in r.iter() {
                n += v;
                if n >= 6 {
                    break;
                }
            }
            n
        });
        for _ in 0..3 {
            s.send(2).unwrap();
        }
        assert_eq!(taker.join(), 6);
        // The receiver is gone with the iterator: further sends fail quietly.
        assert!(s.send(2).is_err() || s.send(2).is_err());
        // A try_send into a bounded channel wakes a receiver blocked in recv.
        let (s, r) = mpmc::sync_channel::<u32>(3);
        let blocked = m.go(move || r.recv().unwrap());
        m.sleep(Duration::from_millis(10));
        s.try_send(4).unwrap();
        assert_eq!(blocked.join(), 4);
        // Many fresh channels, one message each, across two parties.
        for _ in 0..2_000 {
            let (s, r) = mpmc::sync_channel::<u32>(1);
            let t = m.go(move || s.send(1).unwrap());
            assert_eq!(r.recv(), Ok(1));
            t.join();
        }
    });
}

#[test]
fn ready_and_select_by_index_cover_the_select_macros_cases() {
    // crossbeam ready/select: default_only, both_ready, send_recv_same_channel, fairness,
    // duplicate_operations, nesting; select_macro unfairness_timeout/_try.
    use fibra::sync::Select;
    both(|m| {
        // An empty Select: try_* return at once, *_timeout wait their timeout.
        let mut sel = Select::new();
        assert!(sel.try_ready().is_err() && sel.try_select().is_err());
        let t = Instant::now();
        assert!(sel.ready_timeout(Duration::from_millis(20)).is_err());
        assert!(sel.select_timeout(Duration::from_millis(20)).is_err());
        assert!(t.elapsed() >= Duration::from_millis(40));
        // A rendezvous send is ready while a receiver waits.
        let (s, r) = mpmc::sync_channel::<u32>(0);
        let receiver = m.go(move || r.recv().unwrap());
        let mut sel = Select::new();
        let i = sel.send(&s);
        assert_eq!(sel.ready(), i);
        s.send(8).unwrap();
        assert_eq!(receiver.join(), 8);
        // Alone on both ends of a rendezvous channel: nothing is ever ready; of an
        // unbounded one, the send is.
        let (s, r) = mpmc::sync_channel::<u32>(0);
        let mut sel = Select::new();
        sel.recv(&r);
        sel.send(&s);
        assert!(sel.ready_timeout(Duration::from_millis(20)).is_err());
        let (s, r) = mpmc::channel::<u32>();
        let mut sel = Select::new();
        sel.recv(&r);
        let j = sel.send(&s);
        assert_eq!(sel.ready(), j);
        // Duplicated receives on one channel, chosen evenly by index, and a Select inside
        // the finishing of another.
        let (s, r) = mpmc::channel::<u32>();
        const N: usize = 2_000;
        for i in 0..N as u32 {
            s.send(i).unwrap();
        }
        let mut hits = [0usize; 3];
        let mut sel = Select::new();
        let ids = [sel.recv(&r), sel.recv(&r), sel.recv(&r)];
        for _ in 0..N / 2 {
            let oper = sel.select();
            let k = ids.iter().position(|i| *i == oper.index()).unwrap();
            hits[k] += 1;
            oper.recv(&r).unwrap();
            let mut inner = Select::new();
            inner.recv(&r);
            inner.select().recv(&r).unwrap();
        }
        assert!(hits.iter().all(|&h| h >= N / 2 / 3 / 2), "{hits:?}");
        // A biased select with a default still prefers its first ready arm.
        let (a, ra) = mpmc::channel::<()>();
        let (b, rb) = mpmc::channel::<()>();
        for _ in 0..50 {
            a.send(()).unwrap();
            b.send(()).unwrap();
        }
        for k in 0..100 {
            let first = if k % 2 == 0 {
                fibra::select_biased! {
                    recv(ra) -> _ => true,
                    recv(rb) -> _ => false,
                    default(Duration::from_secs(1)) => unreachable!(),
                }
            } else {
                fibra::select_biased! {
                    recv(ra) -> _ => true,
                    recv(rb) -> _ => false,
                    default() => unreachable!(),
                }
            };
            assert_eq!(first, k < 50, "round {k}");
        }
    });
}

/// A message of `K` bytes through an unbounded channel, from a sender started as `m` does.
fn big_message<const K: usize>(m: Mode) {
    let (s, r) = mpmc::channel::<[u8; K]>();
    let sender = m.go(move || s.send([7; K]).unwrap());
    assert_eq!(r.recv().unwrap()[K - 1], 7);
    sender.join();
}

#[test]
fn big_messages_on_fiber_stacks_and_clones_of_timed_receivers_across_threads() {
    // crossbeam list::stack_overflow (a 32 KiB message), after/tick stress_clone. In a debug
    // build a send or receive holds many copies of its message on the stack (unoptimised
    // code gives every temporary a slot): 32 KiB ones overflow a fiber's 256 KiB there, so
    // fibers move 1 KiB messages in debug builds and 32 KiB ones in optimised builds.
    both(|m| {
        match m {
            Mode::Threads => big_message::<{ 32 * 1024 }>(m),
            Mode::Fibers if cfg!(debug_assertions) => big_message::<1024>(m),
            Mode::Fibers => big_message::<{ 32 * 1024 }>(m),
        }
        for _ in 0..10 {
            let a = fibra::sync::after(Duration::from_millis(1));
            let takers: Vec<_> = (0..4)
                .map(|_| {
                    let a = a.clone();
                    m.go(move || {
                        let c = a.clone();
                        drop(a);
                        c.recv_timeout(Duration::from_millis(20)).is_ok() as u32
                    })
                })
                .collect();
            drop(a);
            assert_eq!(takers.into_iter().map(|t| t.join()).sum::<u32>(), 1);
        }
    });
}
