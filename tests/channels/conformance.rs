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
