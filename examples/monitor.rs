//! Watching a running scheduler: metrics once a second, the watchdog, and a fiber dump.
//!
//! `cargo run --release --example monitor [seconds]` runs a mixed workload for `seconds`
//! (default 3): 200 sleepers, an echo server with 20 client fibers over loopback, a mutex
//! that fibers queue on, and a "cruncher" fiber that now and then computes for 150 ms
//! without suspending, which the watchdog reports on stderr. Every second it prints
//! `Scheduler::metrics()` as rates over that second; at the end, the dump.
//!
//! `cargo run --release --example monitor -- --dump-bench [fibers]` parks that many fibers
//! (default 100 000) and measures how long `Scheduler::dump` pauses each worker.

use std::io::{Read, Write};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use fibra::net::{TcpListener, TcpStream};
use fibra::Scheduler;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.first().map(String::as_str) == Some("--dump-bench") {
        let fibers = args.get(1).map_or(Ok(100_000), |a| a.parse())?;
        return dump_bench(fibers);
    }
    let seconds: u64 = args.first().map_or(Ok(3), |a| a.parse())?;
    let sched = Arc::new(Scheduler::builder().threads(2).name("monitor").build()?);
    sched.start();
    let stop = Arc::new(AtomicBool::new(false));
    let mut tasks = Vec::new();

    // Sleepers: timers.
    for i in 0..200u64 {
        let stop = stop.clone();
        tasks.push(sched.task().name(format!("sleeper-{i}")).submit(
            move || {
                while !stop.load(Ordering::Relaxed) {
                    fibra::sleep(Duration::from_millis(10 + i % 40));
                }
            },
            None,
        )?);
    }

    // Socket traffic: an echo server and 20 clients.
    let listener = TcpListener::bind("127.0.0.1:0")?;
    let addr = listener.local_addr()?;
    let acceptor = sched.task().name("acceptor").submit(
        move || {
            for _ in 0..20 {
                let Ok((mut conn, _)) = listener.accept() else {
                    return;
                };
                fibra::spawn(move || {
                    let mut buf = [0u8; 64];
                    while let Ok(n @ 1..) = conn.read(&mut buf) {
                        if conn.write_all(&buf[..n]).is_err() {
                            return;
                        }
                    }
                });
            }
        },
        None,
    )?;
    for i in 0..20 {
        let stop = stop.clone();
        tasks.push(sched.task().name(format!("client-{i}")).submit(
            move || {
                let mut conn = TcpStream::connect(addr).expect("the echo server listens");
                let mut buf = [0u8; 16];
                while !stop.load(Ordering::Relaxed) {
                    conn.write_all(b"ping").expect("echo");
                    conn.read_exact(&mut buf[..4]).expect("echo");
                    fibra::sleep(Duration::from_millis(1));
                }
            },
            None,
        )?);
    }

    // Fibers queueing on one lock.
    let lock = Arc::new(fibra::sync::Mutex::new(0u64));
    for i in 0..5 {
        let (stop, lock) = (stop.clone(), lock.clone());
        tasks.push(sched.task().name(format!("locker-{i}")).submit(
            move || {
                while !stop.load(Ordering::Relaxed) {
                    let mut g = lock.lock().expect("not poisoned");
                    *g += 1;
                    fibra::sleep(Duration::from_millis(5));
                }
            },
            None,
        )?);
    }

    // A fiber that hogs its worker now and then: the watchdog reports it.
    let s = stop.clone();
    tasks.push(sched.task().name("cruncher").submit(
        move || {
            while !s.load(Ordering::Relaxed) {
                let end = Instant::now() + Duration::from_millis(150);
                let mut x = 0u64;
                while Instant::now() < end {
                    x = std::hint::black_box(x.wrapping_mul(31).wrapping_add(7));
                }
                fibra::sleep(Duration::from_millis(700));
            }
        },
        None,
    )?);

    let mut prev = sched.metrics();
    for second in 1..=seconds {
        std::thread::sleep(Duration::from_secs(1));
        let now = sched.metrics();
        println!("--- second {second}: rates over the last second");
        print!("{}", now.delta(&prev));
        prev = now;
    }

    println!("\n--- the dump at the end");
    print!("{}", sched.dump());

    stop.store(true, Ordering::Relaxed);
    for t in tasks {
        t.join().expect("no panic");
    }
    acceptor.cancel();
    sched.stop();
    Ok(())
}

/// Parks `fibers` fibers and reports what `Scheduler::dump` costs the workers.
fn dump_bench(fibers: usize) -> Result<(), Box<dyn std::error::Error>> {
    let sched = Scheduler::builder().threads(2).name("dumpbench").build()?;
    sched.start();
    let gate = Arc::new(fibra::sync::Barrier::new(fibers + 1));
    let started = Instant::now();
    let handles: Vec<_> = (0..fibers)
        .map(|_| {
            let g = gate.clone();
            sched.spawn(move || {
                g.wait();
            })
        })
        .collect();
    while sched.metrics().stacks_in_use() < fibers {
        std::thread::sleep(Duration::from_millis(5));
    }
    println!(
        "{fibers} fibers parked in {:.2} s on {} workers",
        started.elapsed().as_secs_f64(),
        sched.threads()
    );
    let mut pauses: Vec<Duration> = Vec::new();
    let mut took: Vec<Duration> = Vec::new();
    for _ in 0..7 {
        let d = sched.dump();
        assert_eq!(d.fibers().len(), fibers);
        pauses.extend(d.workers().iter().filter_map(|w| w.pause()));
        took.push(d.took());
    }
    pauses.sort();
    took.sort();
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    println!(
        "dump: worker pause min {:.2} ms, median {:.2} ms, max {:.2} ms ({} answers); \
         whole dump median {:.2} ms",
        ms(pauses[0]),
        ms(pauses[pauses.len() / 2]),
        ms(pauses[pauses.len() - 1]),
        pauses.len(),
        ms(took[took.len() / 2]),
    );
    gate.wait();
    for h in handles {
        h.join().expect("no panic");
    }
    sched.stop();
    Ok(())
}
