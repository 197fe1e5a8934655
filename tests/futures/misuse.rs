//! The async bridge misused: futures that misbehave in `block_on` (wakes from odd threads,
//! polls after completion, panics), fibra's futures dropped or raced from async code, and,
//! with the `tokio` feature, tokio's context under many fibers and cancellation.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
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

fn noop_waker() -> Waker {
    Waker::noop().clone()
}

/// Wakes itself synchronously in every poll, `n` times, then is ready.
struct SelfWake(usize);
impl Future for SelfWake {
    type Output = usize;
    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<usize> {
        if self.0 == 0 {
            return Poll::Ready(7);
        }
        self.0 -= 1;
        cx.waker().wake_by_ref();
        Poll::Pending
    }
}

#[test]
fn self_waking_future_completes_and_lets_others_run() {
    with_deadline(|| {
        let s = sched(1);
        let ticks = Arc::new(AtomicUsize::new(0));
        let t = ticks.clone();
        let ticker = s
            .submit(
                move || {
                    for _ in 0..20 {
                        t.fetch_add(1, Ordering::SeqCst);
                        fibra::sleep(Duration::from_micros(1));
                    }
                },
                None,
            )
            .unwrap();
        let h = s.submit(|| block_on(SelfWake(200_000)), None).unwrap();
        assert_eq!(finish(h), 7);
        finish(ticker);
        assert_eq!(ticks.load(Ordering::SeqCst), 20);
        // On a plain thread too.
        assert_eq!(block_on(SelfWake(10_000)), 7);
        s.stop();
    });
}

#[test]
fn block_on_nested_in_a_poll() {
    with_deadline(|| {
        let s = sched(2);
        struct Outer(Option<oneshot::Receiver<u32>>);
        impl Future for Outer {
            type Output = u32;
            fn poll(mut self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<u32> {
                let rx = self.0.take().unwrap();
                Poll::Ready(block_on(async move { rx.await.unwrap() + 1 }))
            }
        }
        let (tx, rx) = oneshot::channel();
        let h = s.submit(move || block_on(Outer(Some(rx))), None).unwrap();
        std::thread::sleep(Duration::from_millis(20));
        tx.send(41).unwrap();
        assert_eq!(finish(h), 42);
        s.stop();
    });
}

#[test]
fn join_handle_polled_by_two_executors_in_turn() {
    with_deadline(|| {
        let s = sched(1);
        let (tx, rx) = oneshot::channel::<()>();
        let mut h = s
            .submit(
                move || {
                    rx.recv().unwrap();
                    5
                },
                None,
            )
            .unwrap();
        // Executor 1: polls once with a waker that is then dropped.
        {
            let w = noop_waker();
            let mut cx = Context::from_waker(&w);
            assert!(Pin::new(&mut h).poll(&mut cx).is_pending());
        }
        // Executor 2: a plain thread's block_on.
        let t = std::thread::spawn(move || block_on(h));
        std::thread::sleep(Duration::from_millis(20));
        tx.send(()).unwrap();
        assert_eq!(t.join().unwrap().unwrap(), 5);
        s.stop();
    });
}

#[test]
fn oneshot_polled_then_recv_timeout_then_polled() {
    with_deadline(|| {
        let s = sched(2);
        let (tx, mut rx) = oneshot::channel::<u32>();
        let h = s
            .submit(
                move || {
                    let w = noop_waker();
                    let mut cx = Context::from_waker(&w);
                    assert!(Pin::new(&mut rx).poll(&mut cx).is_pending());
                    assert_eq!(
                        rx.recv_timeout(Duration::from_millis(10)),
                        Err(oneshot::RecvTimeoutError::Timeout)
                    );
                    assert!(Pin::new(&mut rx).poll(&mut cx).is_pending());
                    block_on(rx).unwrap()
                },
                None,
            )
            .unwrap();
        std::thread::sleep(Duration::from_millis(60));
        tx.send(9).unwrap();
        assert_eq!(finish(h), 9);
        s.stop();
    });
}

#[test]
fn oneshot_polled_then_sender_dropped_then_recv_timeout() {
    with_deadline(|| {
        let (tx, mut rx) = oneshot::channel::<u32>();
        let w = noop_waker();
        let mut cx = Context::from_waker(&w);
        assert!(Pin::new(&mut rx).poll(&mut cx).is_pending());
        drop(tx);
        assert_eq!(
            rx.recv_timeout(Duration::from_millis(10)),
            Err(oneshot::RecvTimeoutError::Disconnected)
        );
    });
}

#[test]
fn recv_async_dropped_mid_flight_loses_nothing() {
    with_deadline(|| {
        const N: usize = 20_000;
        let s = sched(2);
        let (tx, rx) = mpsc::channel::<usize>();
        let sender = s
            .submit(
                move || {
                    for i in 0..N {
                        tx.send(i).unwrap();
                        if i % 64 == 0 {
                            fibra::sleep(Duration::from_micros(1));
                        }
                    }
                },
                Some(0),
            )
            .unwrap();
        let receiver = s
            .submit(
                move || {
                    let w = noop_waker();
                    let mut cx = Context::from_waker(&w);
                    let mut got = Vec::with_capacity(N);
                    let mut k = 0usize;
                    while got.len() < N {
                        k += 1;
                        if k.is_multiple_of(3) {
                            // Poll once and drop: a taken message must be returned.
                            let mut f = rx.recv_async();
                            if let Poll::Ready(r) = Pin::new(&mut f).poll(&mut cx) {
                                got.push(r.unwrap());
                            }
                        } else if k % 3 == 1 {
                            let f = rx.recv_async();
                            drop(f);
                        } else {
                            got.push(block_on(rx.recv_async()).unwrap());
                        }
                    }
                    got
                },
                Some(1),
            )
            .unwrap();
        finish(sender);
        let got = finish(receiver);
        assert_eq!(got, (0..N).collect::<Vec<_>>());
        s.stop();
    });
}

#[test]
fn shared_receiver_many_threads_recv_timeout_zero() {
    with_deadline(|| {
        const N: usize = 100_000;
        let (tx, rx) = mpsc::channel::<usize>();
        let rx = Arc::new(rx);
        let seen = Arc::new(Mutex::new(vec![0u8; N]));
        let count = Arc::new(AtomicUsize::new(0));
        let threads: Vec<_> = (0..8)
            .map(|k| {
                let (rx, seen, count) = (rx.clone(), seen.clone(), count.clone());
                std::thread::spawn(move || {
                    let deadline = Instant::now() + crate::common::LIMIT;
                    while count.load(Ordering::SeqCst) < N {
                        assert!(Instant::now() < deadline);
                        let r = match k % 3 {
                            0 => rx.recv_timeout(Duration::ZERO).ok(),
                            1 => rx.try_recv().ok(),
                            _ => rx.recv_timeout(Duration::from_micros(50)).ok(),
                        };
                        if let Some(i) = r {
                            seen.lock().unwrap()[i] += 1;
                            count.fetch_add(1, Ordering::SeqCst);
                        }
                    }
                })
            })
            .collect();
        let senders: Vec<_> = (0..4)
            .map(|k| {
                let tx = tx.clone();
                std::thread::spawn(move || {
                    for i in (k..N).step_by(4) {
                        tx.send(i).unwrap();
                    }
                })
            })
            .collect();
        drop(tx);
        senders.into_iter().for_each(|t| t.join().unwrap());
        threads.into_iter().for_each(|t| t.join().unwrap());
        assert!(seen.lock().unwrap().iter().all(|&c| c == 1));
    });
}

#[test]
fn cancel_a_fiber_inside_block_on() {
    with_deadline(|| {
        let s = sched(1);
        struct DropFlag(Arc<AtomicUsize>);
        impl Drop for DropFlag {
            fn drop(&mut self) {
                self.0.fetch_add(1, Ordering::SeqCst);
            }
        }
        let dropped = Arc::new(AtomicUsize::new(0));
        let d = dropped.clone();
        let h = s
            .submit(
                move || {
                    let flag = DropFlag(d);
                    block_on(async move {
                        let _f = flag;
                        std::future::pending::<()>().await
                    })
                },
                None,
            )
            .unwrap();
        std::thread::sleep(Duration::from_millis(30));
        h.cancel();
        assert!(h.wait_timeout(crate::common::LIMIT));
        assert!(h.join().unwrap_err().is_cancelled());
        assert_eq!(dropped.load(Ordering::SeqCst), 1);
        // And stop_timeout with fibers parked in block_on.
        for _ in 0..50 {
            s.submit(|| block_on(std::future::pending::<()>()), None)
                .unwrap();
        }
        std::thread::sleep(Duration::from_millis(20));
        let t = Instant::now();
        s.stop_timeout(Duration::from_millis(50));
        assert!(t.elapsed() < Duration::from_secs(10));
    });
}

#[test]
fn waker_woken_after_the_fiber_ended() {
    with_deadline(|| {
        let s = sched(2);
        let slot: Arc<Mutex<Vec<Waker>>> = Arc::default();
        for _ in 0..200 {
            let sl = slot.clone();
            let h = s
                .submit(
                    move || {
                        let mut first = true;
                        block_on(std::future::poll_fn(move |cx| {
                            sl.lock().unwrap().push(cx.waker().clone());
                            if first {
                                first = false;
                                cx.waker().wake_by_ref();
                                Poll::Pending
                            } else {
                                Poll::Ready(())
                            }
                        }))
                    },
                    None,
                )
                .unwrap();
            finish(h);
        }
        // The fibers are gone: waking their wakers must be harmless.
        let ws = std::mem::take(&mut *slot.lock().unwrap());
        let ws2 = ws.clone();
        let t = std::thread::spawn(move || ws2.into_iter().for_each(Waker::wake));
        ws.iter().for_each(Waker::wake_by_ref);
        t.join().unwrap();
        // The scheduler still works.
        assert_eq!(finish(s.submit(|| 3, None).unwrap()), 3);
        s.stop();
    });
}

#[test]
fn join_handle_awaited_in_many_fibers_of_other_fibers() {
    with_deadline(|| {
        let s = sched(2);
        let hs: Vec<_> = (0..2000usize)
            .map(|i| {
                s.submit(
                    move || {
                        fibra::sleep(Duration::from_micros(1));
                        i
                    },
                    None,
                )
                .unwrap()
            })
            .collect();
        let sum = s
            .submit(
                move || {
                    block_on(async move {
                        let mut sum = 0;
                        for h in hs {
                            sum += h.await.unwrap();
                        }
                        sum
                    })
                },
                None,
            )
            .unwrap();
        assert_eq!(finish(sum), (0..2000).sum::<usize>());
        s.stop();
    });
}

#[cfg(feature = "tokio")]
mod with_tokio {
    use super::*;

    #[test]
    fn tokio_sleep_without_a_handle_fails_the_fiber_not_the_worker() {
        with_deadline(|| {
            let s = sched(1);
            let h = s
                .submit(
                    || block_on(tokio::time::sleep(Duration::from_millis(10))),
                    None,
                )
                .unwrap();
            assert!(h.wait_timeout(crate::common::LIMIT));
            let e = h.join().unwrap_err();
            assert!(e.is_panic());
            assert_eq!(finish(s.submit(|| 1, None).unwrap()), 1);
            s.stop();
        });
    }

    /// 500 fibers using tokio timers and tasks through block_on, then one cancelled while
    /// its tokio sleep is pending.
    #[test]
    fn tokio_context_with_many_fibers_and_cancel() {
        with_deadline(|| {
            let rt = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .enable_all()
                .build()
                .unwrap();
            let s = Arc::new(
                Scheduler::builder()
                    .threads(2)
                    .tokio_handle(rt.handle().clone())
                    .build()
                    .unwrap(),
            );
            s.start();
            let hs: Vec<_> = (0..500)
                .map(|i| {
                    s.submit(
                        move || {
                            block_on(async move {
                                tokio::time::sleep(Duration::from_millis(1 + i % 10)).await;
                                let (tx, rx) = tokio::sync::oneshot::channel();
                                tokio::spawn(async move { tx.send(i).unwrap() });
                                rx.await.unwrap()
                            })
                        },
                        None,
                    )
                    .unwrap()
                })
                .collect();
            let sleeper = s
                .submit(
                    || block_on(async { tokio::time::sleep(Duration::from_secs(3600)).await }),
                    None,
                )
                .unwrap();
            for (i, h) in hs.into_iter().enumerate() {
                assert_eq!(finish(h), i as u64);
            }
            sleeper.cancel();
            assert!(sleeper.wait_timeout(crate::common::LIMIT));
            assert!(sleeper.join().unwrap_err().is_cancelled());
            s.stop();
            drop(rt);
        });
    }
}
