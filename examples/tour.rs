//! A narrated tour of fibra. Run it with `cargo run --release --example tour`.

use std::cell::RefCell;
use std::rc::Rc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

fn main() -> Result<(), fibra::Error> {
    println!("== 1. Workers start");
    let sched = Arc::new(
        fibra::Scheduler::builder()
            .threads(2)
            .name("tour")
            .build()?,
    );
    sched.start();
    println!(
        "   a scheduler with {} workers named tour-0, tour-1",
        sched.threads()
    );

    println!("\n== 2. Pinned and unpinned tasks");
    for pin in [Some(0), Some(1), None, None] {
        let h = sched
            .submit(
                move || {
                    let thread = std::thread::current();
                    format!(
                        "   pinned {pin:?} -> ran on worker {:?} (thread {:?})",
                        fibra::current_worker().unwrap(),
                        thread.name().unwrap_or("?")
                    )
                },
                pin,
            )
            .expect("scheduler is running");
        println!("{}", h.join().expect("no panic"));
    }

    println!("\n== 3. Fibers yielding interleave on one worker");
    let log = Arc::new(Mutex::new(Vec::new()));
    let handles: Vec<_> = ["a", "b", "c"]
        .into_iter()
        .map(|name| {
            let log = log.clone();
            sched
                .submit(
                    move || {
                        // An Rc held across yields: sound, because a started fiber never
                        // changes thread.
                        let steps = Rc::new(RefCell::new(0));
                        for _ in 0..3 {
                            *steps.borrow_mut() += 1;
                            log.lock()
                                .unwrap()
                                .push(format!("{name}{}", steps.borrow()));
                            fibra::Fiber::yield_now();
                        }
                    },
                    Some(0),
                )
                .expect("scheduler is running")
        })
        .collect();
    for h in handles {
        h.join().expect("no panic");
    }
    println!("   order on worker 0: {}", log.lock().unwrap().join(" "));

    println!("\n== 4. A panic is caught and reported through join (fibra prints its panic report, like std does for threads)");
    let h = sched
        .submit(|| -> u32 { panic!("something went wrong") }, None)
        .expect("scheduler is running");
    match h.join() {
        Ok(_) => println!("   unexpected success"),
        Err(e) => println!("   join() -> Err: {e} (is_panic = {})", e.is_panic()),
    }
    let alive = sched.submit(|| "still here", Some(0)).expect("running");
    println!(
        "   worker 0 afterwards: {}",
        alive.join().expect("no panic")
    );

    println!("\n== 5. Sleeping fibers do not block their worker");
    let started = Instant::now();
    let sleepers: Vec<_> = (0..1000)
        .map(|_| {
            sched
                .submit(|| fibra::sleep(Duration::from_millis(100)), None)
                .expect("running")
        })
        .collect();
    for h in sleepers {
        h.join().expect("no panic");
    }
    println!(
        "   1000 fibers slept 100 ms each on 2 threads in {:?}",
        started.elapsed()
    );

    println!(
        "\n== 6. A delayed executor (Timer): six jobs given out of order run in deadline order"
    );
    let timer = fibra::time::Timer::new();
    let t0 = Instant::now();
    for (n, ms) in [
        (3, 200u64),
        (1, 50),
        (6, 1000),
        (5, 500),
        (2, 100),
        (4, 300),
    ] {
        let due = Duration::from_millis(ms);
        timer.schedule(due, move || {
            let late = t0.elapsed().saturating_sub(due);
            println!(
                "   {n} (after {ms:>4} ms, {:.2} ms late)",
                late.as_secs_f64() * 1e3
            );
        });
    }
    timer.shutdown();

    println!("\n== 7. Fibers on a one-worker scheduler sleep while others keep running");
    let one = fibra::Scheduler::builder()
        .threads(1)
        .name("solo")
        .build()?;
    one.start();
    let t0 = Instant::now();
    let sleepers: Vec<_> = [100u64, 500]
        .into_iter()
        .map(|ms| {
            one.submit(
                move || {
                    fibra::sleep(Duration::from_millis(ms));
                    println!(
                        "   slept {ms} ms, woke at {:>3} ms",
                        t0.elapsed().as_millis()
                    );
                },
                None,
            )
            .expect("running")
        })
        .collect();
    let ticker = one
        .submit(
            move || {
                for i in 0..5 {
                    println!(
                        "   tick {i} at {:>3} ms on the same thread",
                        t0.elapsed().as_millis()
                    );
                    fibra::sleep(Duration::from_millis(120));
                }
            },
            None,
        )
        .expect("running");
    for h in sleepers {
        h.join().expect("no panic");
    }
    ticker.join().expect("no panic");
    one.stop();

    sockets_and_channels(&sched);

    println!("\n== 9. The CPU an idle scheduler uses over 1 s");
    let before = cpu_time();
    std::thread::sleep(Duration::from_secs(1));
    let used = cpu_time() - before;
    println!(
        "   {:.3} ms of CPU (workers sleep on a futex; no polling)",
        used.as_secs_f64() * 1e3
    );

    println!("\n== 10. stop() drains: parked fibers woken later still finish");
    let done = Arc::new(AtomicUsize::new(0));
    for _ in 0..100 {
        let done = done.clone();
        sched
            .submit(
                move || {
                    fibra::sleep(Duration::from_millis(50));
                    done.fetch_add(1, Ordering::SeqCst);
                },
                None,
            )
            .expect("running");
    }
    sched.stop();
    println!(
        "   after stop(): {} of 100 finished; submit now -> {}",
        done.load(Ordering::SeqCst),
        sched.submit(|| (), None).unwrap_err()
    );

    executors_and_tasks();
    structured_concurrency();
    async_bridge();
    observability();
    staying_home();
    Ok(())
}

fibra::fiber_local! {
    /// How many steps the running fiber has taken: one counter per fiber.
    static STEPS: std::cell::Cell<u32> = std::cell::Cell::new(0);
}

/// What fibers that never change thread allow: `!Send` state shared by a worker's fibers,
/// a value per fiber, and a coroutine written by hand scheduled like a task.
fn staying_home() {
    println!("\n== 15. Staying home: spawn_local, fiber_local!, a Fiber handed to its worker");
    let sched = fibra::Scheduler::builder()
        .threads(2)
        .build()
        .expect("scheduler");
    let (total, log) = sched.block_on(|| {
        // `Rc<RefCell<_>>` shared by local fibers: no lock, no Send.
        let shared = Rc::new(RefCell::new(Vec::new()));
        let fibers: Vec<_> = (0..3)
            .map(|i| {
                let shared = shared.clone();
                fibra::spawn_local(move || {
                    for _ in 0..i + 1 {
                        STEPS.with(|s| s.set(s.get() + 1));
                        fibra::Fiber::yield_now();
                    }
                    shared.borrow_mut().push((i, STEPS.with(|s| s.get())));
                })
            })
            .collect();
        // A standalone coroutine, resumed by the worker at each of its yields.
        let log = Rc::new(RefCell::new(Vec::new()));
        let l = log.clone();
        let coroutine = fibra::Fiber::new(move || {
            for step in ["open", "read", "close"] {
                l.borrow_mut().push(step);
                fibra::Fiber::yield_now();
            }
        });
        let handed = fibra::spawn_local_fiber(coroutine);
        fibers.into_iter().for_each(|h| h.join().expect("no panic"));
        handed.join().expect("no panic");
        let total = shared.borrow().clone();
        (total, log.take())
    });
    println!("   local fibers (index, its own step count): {total:?}");
    println!("   the handed-over Fiber's steps, between its yields: {log:?}");
    sched.stop();
}

/// Metrics, the fiber dump and the watchdog.
fn observability() {
    println!("\n== 14. Seeing inside: metrics, the fiber dump, the watchdog");
    let sched = fibra::Scheduler::builder()
        .threads(2)
        .name("tour-watch")
        .watchdog(Duration::from_millis(50))
        .build()
        .expect("valid configuration");
    sched.start();
    let lock = Arc::new(fibra::sync::Mutex::new(()));
    let guard_holder = {
        let lock = lock.clone();
        sched
            .task()
            .name("holder")
            .submit(
                move || {
                    let _g = lock.lock().expect("not poisoned");
                    fibra::sleep(Duration::from_millis(300));
                },
                None,
            )
            .expect("running")
    };
    fibra::sleep(Duration::from_millis(20));
    let waiter = {
        let lock = lock.clone();
        sched
            .task()
            .name("waiter")
            .submit(move || drop(lock.lock().expect("not poisoned")), None)
            .expect("running")
    };
    fibra::sleep(Duration::from_millis(20));
    let dump = sched.dump();
    for e in dump.fibers() {
        println!(
            "   dump: fiber {} '{}' on worker {}: {:?}, submitted at {}",
            e.id(),
            e.name().unwrap_or("?"),
            e.worker(),
            e.status(),
            e.location()
        );
    }
    // A fiber that computes for 120 ms without suspending: the watchdog (50 ms here)
    // reports it on stderr.
    let hog = sched
        .task()
        .name("hog")
        .submit(
            || {
                let end = Instant::now() + Duration::from_millis(120);
                while Instant::now() < end {
                    std::hint::spin_loop();
                }
            },
            None,
        )
        .expect("running");
    hog.join().expect("no panic");
    guard_holder.join().expect("no panic");
    waiter.join().expect("no panic");
    let m = sched.metrics();
    let w: Vec<String> = m
        .workers()
        .iter()
        .map(|w| {
            format!(
                "worker {}: {} resumes, {} parks",
                w.index(),
                w.resumes(),
                w.parks()
            )
        })
        .collect();
    println!(
        "   metrics: {} spawned, {}; the table: println!(\"{{}}\", sched.metrics())",
        m.spawned(),
        w.join(", ")
    );
    sched.stop();
}

/// Scoped fibers that borrow, a JoinSet in completion order, cancelling one task, and a
/// cancellation token shared by workers.
fn structured_concurrency() {
    use fibra::sync::CancellationToken;
    use fibra::JoinSet;

    println!("\n== 12. Scopes, JoinSets, cancelling one task, cancellation tokens, select!");
    let sched = fibra::Scheduler::builder()
        .threads(2)
        .name("tour-tasks")
        .build()
        .expect("valid configuration");
    let (sum, order, cancelled, rounds) = sched.block_on(|| {
        // Scoped fibers borrow the caller's data; the scope waits for them.
        let data: Vec<u64> = (1..=1_000).collect();
        let sum = fibra::scope(|s| {
            let halves: Vec<_> = data
                .chunks(500)
                .map(|c| s.spawn(move || c.iter().sum::<u64>()))
                .collect();
            halves
                .into_iter()
                .map(|h| h.join().expect("no panic"))
                .sum::<u64>()
        });
        // A JoinSet hands results back in the order the tasks finish.
        let mut set = JoinSet::new();
        for ms in [30u64, 10, 20] {
            set.spawn(move || {
                fibra::sleep(Duration::from_millis(ms));
                ms
            });
        }
        let mut order = Vec::new();
        while let Some(r) = set.join_next() {
            order.push(r.expect("no panic"));
        }
        // One task cancelled: it unwinds out of its sleep at once.
        let sleeper = fibra::spawn(|| fibra::sleep(Duration::from_secs(3600)));
        sleeper.cancel();
        let cancelled = sleeper.join().map_err(|e| e.is_cancelled()) == Err(true);
        // Workers stop when the token they share is cancelled.
        let token = CancellationToken::new();
        let workers: Vec<_> = (0..3)
            .map(|_| {
                let token = token.child_token();
                fibra::spawn(move || {
                    let mut rounds = 0u32;
                    while !token.cancelled_timeout(Duration::from_millis(1)) {
                        rounds += 1;
                    }
                    rounds
                })
            })
            .collect();
        fibra::sleep(Duration::from_millis(10));
        token.cancel();
        let rounds: u32 = workers
            .into_iter()
            .map(|w| w.join().expect("no panic"))
            .sum();
        // select!: whichever comes first — a message, or the token.
        let (tx, rx) = fibra::sync::mpsc::channel::<&str>();
        let stop = CancellationToken::new();
        let s = stop.clone();
        let listener = fibra::spawn(move || {
            let mut heard = Vec::new();
            loop {
                fibra::select! {
                    recv(rx) -> msg => heard.push(msg.unwrap_or("(senders gone)")),
                    recv(s) -> _ => return heard,
                }
            }
        });
        tx.send("hello").expect("the listener listens");
        fibra::sleep(Duration::from_millis(5));
        stop.cancel();
        let heard = listener.join().expect("no panic");
        println!("   select!: heard {heard:?}, then the token ended the loop");
        (sum, order, cancelled, rounds)
    });
    println!("   scope: two scoped fibers summed a borrowed Vec to {sum}");
    println!("   JoinSet: finished in the order {order:?} (ms slept)");
    println!("   JoinHandle::cancel: the hour-long sleeper ended cancelled: {cancelled}");
    println!("   CancellationToken: 3 workers stopped after {rounds} rounds in all");
    sched.stop();
}

/// The bridge to async code: futures in fibers, and fibers (and fibra channels) awaited by
/// async code.
fn async_bridge() {
    use fibra::future::block_on;

    println!("\n== 13. Futures in fibers, fibers in async code");
    let sched = fibra::Scheduler::builder()
        .threads(1)
        .name("tour-async")
        .build()
        .expect("valid configuration");
    sched.start();
    // A fiber runs async code: only the fiber waits between polls.
    let (tx, rx) = fibra::sync::mpsc::channel::<u32>();
    let consumer = sched
        .submit(
            move || {
                block_on(async {
                    let mut sum = 0;
                    while let Ok(v) = rx.recv_async().await {
                        sum += v;
                    }
                    sum
                })
            },
            None,
        )
        .expect("running");
    let producer = sched
        .submit(
            move || {
                for v in 1..=10 {
                    tx.send(v).expect("the consumer listens");
                    fibra::sleep(Duration::from_millis(1));
                }
            },
            None,
        )
        .expect("running");
    // Async code (any executor; here block_on on this plain thread) awaits fibers.
    let (sum, ()) = block_on(async {
        (
            consumer.await.expect("no panic"),
            producer.await.expect("no panic"),
        )
    });
    println!("   a fiber summed 1..=10 from recv_async().await: {sum}; main awaited both fibers");
    println!("   (with the `tokio` feature and Builder::tokio_handle, tokio's sockets and timers");
    println!("   work in fibers too: see README, \"Futures in fibers, fibers in async code\")");
    sched.stop();
}

/// Blocking-style socket code in fibers: an echo round trip over loopback, with the server
/// reporting through a fiber-aware channel.
fn sockets_and_channels(sched: &fibra::Scheduler) {
    use fibra::net::{TcpListener, TcpStream};
    use std::io::{Read, Write};

    println!("\n== 8. Sockets and channels: an echo round trip over loopback, in fibers");
    let listener = TcpListener::bind("127.0.0.1:0").expect("loopback is available");
    let addr = listener.local_addr().expect("bound");
    let (report, reports) = fibra::sync::mpsc::channel::<String>();
    let server = sched
        .submit(
            move || {
                let (mut conn, peer) = listener.accept().expect("a client connects");
                let mut buf = [0u8; 64];
                let mut echoed = 0;
                loop {
                    // Parks this fiber, not the worker, until the client writes.
                    let n = conn.read(&mut buf).expect("read");
                    if n == 0 {
                        break;
                    }
                    conn.write_all(&buf[..n]).expect("write");
                    echoed += n;
                }
                let w = fibra::current_worker().expect("in a fiber");
                report
                    .send(format!(
                        "server echoed {echoed} bytes to {peer} on worker {w}"
                    ))
                    .expect("the receiver waits");
            },
            None,
        )
        .expect("running");
    let client = sched
        .submit(
            move || {
                let mut s = TcpStream::connect(addr).expect("the server listens");
                for msg in ["hello", "fibra"] {
                    s.write_all(msg.as_bytes()).expect("write");
                    let mut back = vec![0u8; msg.len()];
                    s.read_exact(&mut back).expect("echo");
                    println!(
                        "   client sent {msg:?}, got {:?} back",
                        String::from_utf8_lossy(&back)
                    );
                }
                s.shutdown(std::net::Shutdown::Write).expect("shutdown");
            },
            None,
        )
        .expect("running");
    client.join().expect("no panic");
    server.join().expect("no panic");
    // A plain thread receiving from a fiber through the same channel type.
    println!("   {}", reports.recv().expect("the server reported"));
}

/// Tasks across fibra's executors: a task on a `Looper` awaits task 2 on a `ThreadPool`
/// and task 3 on a `NewThread`; each step prints its thread, and every continuation of the
/// task is back on the looper thread. Then asyncify: blocking file I/O through
/// `fibra::unblock` (`fibra::fs`) while the looper keeps ticking.
fn executors_and_tasks() {
    use fibra::exec::{Executor, Looper, NewThread, ThreadPool};

    println!("\n== 11. Executors and tasks: every continuation back on the looper");
    let looper = Looper::new();
    let pool = Arc::new(ThreadPool::new(2));
    let t0 = Instant::now();
    let step = move |what: &str| {
        let thread = std::thread::current();
        println!(
            "   [{:>4} ms] {:<14} {what}",
            t0.elapsed().as_millis(),
            format!("{}:", thread.name().unwrap_or("main"))
        );
    };
    let p = pool.clone();
    let task = looper.spawn(move || {
        step("task start ...");
        fibra::sleep(Duration::from_millis(100));
        step("slept 100 ms");
        let two = p
            .spawn(move || {
                step("task 2 start ...");
                fibra::sleep(Duration::from_millis(300));
                step("task 2 returns after 300 ms");
                2
            })
            .join()
            .expect("task 2");
        step(&format!("returns from task 2: {two}"));
        let three = NewThread
            .spawn(move || {
                step("task 3 start ...");
                fibra::sleep(Duration::from_millis(200));
                step("task 3 returns after 200 ms");
                3
            })
            .join()
            .expect("task 3");
        step(&format!("returns from task 3: {three}"));
        1 + two + three
    });
    task.then(move |v| step(&format!("then: simple task end: {v}")))
        .catching(move |e| step(&format!("catching: {e}")));
    let v = task.join().expect("the task");
    step(&format!("join (get_result): {v}"));

    println!("   a failing task: fibra's panic hook reports it, then `catching` sees it");
    let failing = looper.spawn(|| -> i32 {
        fibra::sleep(Duration::from_millis(10));
        panic!("task 4 failed on purpose")
    });
    failing
        .then(move |v| step(&format!("then: {v} (not printed)")))
        .catching(move |e| step(&format!("catching: {e}")))
        .finally(move || step("finally: runs either way"));
    let _ = failing.join();

    println!("\n   asyncify: fibra::fs on the looper while another looper job ticks");
    let path = std::env::temp_dir().join(format!("fibra-tour-{}.txt", std::process::id()));
    let ticker = looper.spawn(move || {
        for i in 0..3 {
            step(&format!("tick {i}: the looper is free"));
            fibra::sleep(Duration::from_millis(5));
        }
    });
    let io = looper.spawn(move || -> std::io::Result<usize> {
        let data = vec![b'x'; 1 << 20];
        fibra::fs::write(&path, &data)?;
        let back = fibra::fs::read(&path)?;
        fibra::fs::remove_file(&path)?;
        let on_pool = fibra::unblock(|| std::thread::current().name().map(String::from));
        step(&format!(
            "wrote and read back {} KiB; the blocking calls ran on {}",
            back.len() >> 10,
            on_pool.as_deref().unwrap_or("?")
        ));
        Ok(back.len())
    });
    ticker.join().expect("ticker");
    io.join().expect("no panic").expect("file round trip");
    looper.shutdown(true);
    pool.shutdown();
}

/// User + system CPU time of this process.
fn cpu_time() -> Duration {
    // SAFETY: getrusage writes into the zeroed struct we pass and has no other effect.
    let usage = unsafe {
        let mut u: libc::rusage = std::mem::zeroed();
        libc::getrusage(libc::RUSAGE_SELF, &mut u);
        u
    };
    let tv = |t: libc::timeval| Duration::new(t.tv_sec as u64, t.tv_usec as u32 * 1000);
    tv(usage.ru_utime) + tv(usage.ru_stime)
}
