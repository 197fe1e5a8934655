//! Async code that needs tokio, run in fibers (feature `tokio`), and tokio tasks waiting for
//! fibers. Run with `cargo test -p fibra-interop --features tokio`.
#![cfg(feature = "tokio")]

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::common::{finish, with_deadline};
use fibra::future::block_on;
use fibra::Scheduler;

fn runtime(threads: usize) -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(threads)
        .enable_all()
        .build()
        .unwrap()
}

fn sched(threads: usize, rt: &tokio::runtime::Runtime) -> Arc<Scheduler> {
    let s = Arc::new(
        Scheduler::builder()
            .threads(threads)
            .tokio_handle(rt.handle().clone())
            .build()
            .unwrap(),
    );
    s.start();
    s
}

#[test]
fn tokio_sleep_in_a_thousand_fibers_on_one_worker_takes_one_sleep() {
    with_deadline(|| {
        let rt = runtime(1);
        let s = sched(1, &rt);
        let start = Instant::now();
        let hs: Vec<_> = (0..1000)
            .map(|_| {
                s.submit(
                    || block_on(async { tokio::time::sleep(Duration::from_millis(100)).await }),
                    None,
                )
                .unwrap()
            })
            .collect();
        hs.into_iter().for_each(finish);
        let took = start.elapsed();
        assert!(took >= Duration::from_millis(100), "{took:?}");
        assert!(
            took < Duration::from_secs(2),
            "1000 tokio sleeps took {took:?}"
        );
        s.stop();
    });
}

#[test]
fn reqwest_from_a_thousand_fibers_against_an_axum_server() {
    with_deadline(|| {
        let rt = runtime(2);
        let listener = rt
            .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
            .unwrap();
        let addr = listener.local_addr().unwrap();
        let served = Arc::new(AtomicUsize::new(0));
        let counter = served.clone();
        let app = axum::Router::new().route(
            "/hello/{n}",
            axum::routing::get(move |axum::extract::Path(n): axum::extract::Path<u32>| {
                let counter = counter.clone();
                async move {
                    counter.fetch_add(1, Ordering::Relaxed);
                    tokio::time::sleep(Duration::from_millis(20)).await;
                    format!("hello {n}")
                }
            }),
        );
        rt.spawn(async move { axum::serve(listener, app).await.unwrap() });
        let s = sched(2, &rt);
        let client = reqwest::Client::new();
        let start = Instant::now();
        let hs: Vec<_> = (0..1000u32)
            .map(|i| {
                let client = client.clone();
                s.submit(
                    move || {
                        block_on(async {
                            let url = format!("http://{addr}/hello/{i}");
                            client.get(url).send().await?.text().await
                        })
                    },
                    None,
                )
                .unwrap()
            })
            .collect();
        for (i, h) in hs.into_iter().enumerate() {
            assert_eq!(finish(h).unwrap(), format!("hello {i}"));
        }
        assert_eq!(served.load(Ordering::Relaxed), 1000);
        // 1000 answers of 20 ms one after another would take 20 s.
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "{:?}",
            start.elapsed()
        );
        s.stop();
    });
}

#[test]
fn tokio_channels_both_ways_between_a_task_and_a_fiber() {
    with_deadline(|| {
        let rt = runtime(1);
        let s = sched(1, &rt);
        let (to_task, mut task_rx) = tokio::sync::mpsc::channel::<u64>(8);
        let (to_fiber, mut fiber_rx) = tokio::sync::mpsc::channel::<u64>(8);
        // The tokio task doubles what it gets.
        let task = rt.spawn(async move {
            while let Some(v) = task_rx.recv().await {
                to_fiber.send(v * 2).await.unwrap();
            }
        });
        let fiber = s
            .submit(
                move || {
                    let mut sum = 0;
                    for i in 0..1000u64 {
                        block_on(to_task.send(i)).unwrap();
                        sum += block_on(fiber_rx.recv()).unwrap();
                    }
                    sum
                },
                None,
            )
            .unwrap();
        assert_eq!(finish(fiber), 2 * (0..1000u64).sum::<u64>());
        rt.block_on(task).unwrap();
        s.stop();
    });
}

#[test]
fn a_tokio_task_awaits_ten_thousand_fibers_and_fibra_channels() {
    with_deadline(|| {
        let rt = runtime(2);
        let s = sched(2, &rt);
        let hs: Vec<_> = (0..10_000u64)
            .map(|i| s.submit(move || i, None).unwrap())
            .collect();
        let (tx, rx) = fibra::sync::mpsc::channel();
        let (otx, orx) = fibra::sync::oneshot::channel();
        s.submit(
            move || {
                for i in 0..100u64 {
                    tx.send(i).unwrap();
                    fibra::sleep(Duration::from_micros(100));
                }
                otx.send("done").unwrap();
            },
            None,
        )
        .unwrap();
        // A spawned task needs a Send future: join handles, `recv_async` and oneshots are.
        let total = rt
            .block_on(rt.spawn(async move {
                let mut total = 0;
                for h in hs {
                    total += h.await.unwrap();
                }
                let mut got = 0;
                while let Ok(v) = rx.recv_async().await {
                    got += v;
                }
                assert_eq!(orx.await, Ok("done"));
                total + got
            }))
            .unwrap();
        assert_eq!(
            total,
            (0..10_000u64).sum::<u64>() + (0..100u64).sum::<u64>()
        );
        s.stop();
    });
}

#[test]
fn without_a_handle_tokio_reports_the_missing_runtime() {
    with_deadline(|| {
        let s = Scheduler::builder().threads(1).build().unwrap();
        s.start();
        let h = s
            .submit(
                || block_on(async { tokio::time::sleep(Duration::from_millis(1)).await }),
                None,
            )
            .unwrap();
        let err = h.join().unwrap_err();
        assert!(err.is_panic());
        let msg = err.to_string();
        assert!(msg.contains("Tokio 1.x runtime"), "{msg}");
        s.stop();
    });
}
