//! Redis GET load from the synchronous `redis` crate, run in fibra fibers with the `hook`
//! feature: the fibra side of the benchmark harness's `redis_get` workload
//! (`benches/compare`), which builds and runs it against the `redis-server` it started.
//!
//! ```sh
//! redis-server --port 6390 --save "" --appendonly no &
//! cargo run --release --example redis_load --features hook -- --port 6390 --threads 2
//! ```
//!
//! `redis::Connection` is a blocking client: `con.get(key)` writes the command and waits in
//! `read` for the answer. In a fiber with hooks on, that wait parks only the fiber, so
//! `--connections` fibers (default 50), each with its own connection, share a few worker
//! threads: while one waits for its answer, its worker runs the others. No OS thread per
//! connection, and no async rewrite of the client.
//!
//! The connections are opened in fibers (dealt to the workers in turn; a started fiber stays
//! on its worker) before anything is timed, and the key is SET once. A repetition then runs
//! one fiber per connection, each doing `--gets` GETs (default 2 000) of the key and checking
//! every value. After untimed warm-up repetitions, at least one and for 200 ms (left out with
//! `--no-warmup`), each of `--reps` repetitions (default 5) prints `value <ns per GET>`: the
//! repetition's wall time divided by all its GETs. Any error is printed and ends the program with status 1.

use std::io::Write;
use std::time::{Duration, Instant};

use redis::Commands;

/// The key every GET reads (the harness's tokio side uses the same key and value).
const KEY: &str = "fibra-compare:redis_get";
const VALUE: &str = "the value of fibra-compare's redis_get key";

struct Options {
    threads: usize,
    port: u16,
    reps: usize,
    warmup: bool,
    connections: usize,
    gets: usize,
}

fn options() -> Result<Options, String> {
    let mut o = Options {
        threads: std::thread::available_parallelism().map_or(1, |n| n.get()),
        port: 6379,
        reps: 5,
        warmup: true,
        connections: 50,
        gets: 2_000,
    };
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        let mut number = |name: &str| -> Result<usize, String> {
            args.next()
                .ok_or_else(|| format!("{name} needs a value"))?
                .parse()
                .map_err(|e| format!("{name}: {e}"))
        };
        match arg.as_str() {
            "--threads" => o.threads = number("--threads")?,
            "--port" => {
                o.port = u16::try_from(number("--port")?).map_err(|e| format!("--port: {e}"))?
            }
            "--reps" => o.reps = number("--reps")?,
            "--no-warmup" => o.warmup = false,
            "--connections" => o.connections = number("--connections")?,
            "--gets" => o.gets = number("--gets")?,
            "-h" | "--help" => {
                println!(
                    "usage: redis_load [--port P] [--threads N] [--reps R] [--no-warmup] \
                     [--connections C] [--gets G]   (redis-server on 127.0.0.1:P, default 6379)"
                );
                std::process::exit(0);
            }
            other => return Err(format!("unknown argument {other:?} (try --help)")),
        }
    }
    if o.threads == 0 || o.connections == 0 || o.gets == 0 {
        return Err("--threads, --connections and --gets must be at least 1".into());
    }
    Ok(o)
}

fn main() {
    let o = options().unwrap_or_else(|e| fail(&e));
    if let Err(e) = run(&o) {
        fail(&e);
    }
}

fn fail(e: &str) -> ! {
    eprintln!("redis_load: {e}");
    std::process::exit(1);
}

fn run(o: &Options) -> Result<(), String> {
    let sched = fibra::Scheduler::builder()
        .threads(o.threads)
        .name("redis")
        .build()
        .map_err(|e| e.to_string())?;
    sched.start();
    let client = redis::Client::open(format!("redis://127.0.0.1:{}/", o.port))
        .map_err(|e| format!("redis URL: {e}"))?;

    // Open every connection in a fiber: each `connect` parks only its fiber.
    let opening: Vec<_> = (0..o.connections)
        .map(|i| {
            let client = client.clone();
            sched
                .submit(move || client.get_connection(), Some(i % o.threads))
                .map_err(|_| "the scheduler refused a fiber".to_string())
        })
        .collect::<Result<_, _>>()?;
    let mut conns = Vec::with_capacity(o.connections);
    for h in opening {
        let conn = h.join().map_err(|e| format!("connecting fiber: {e}"))?;
        conns.push(conn.map_err(|e| format!("connect to redis-server: {e}"))?);
    }
    let first = conns.swap_remove(0);
    let (first, set) = sched.block_on(move || {
        let mut first = first;
        let set: redis::RedisResult<()> = first.set(KEY, VALUE);
        (first, set)
    });
    set.map_err(|e| format!("SET: {e}"))?;
    conns.push(first);

    let gets = o.gets;
    let mut rep = || -> Result<f64, String> {
        let start = Instant::now();
        let fibers: Vec<_> = conns
            .drain(..)
            .enumerate()
            .map(|(i, mut conn)| {
                sched
                    .submit(
                        move || -> Result<redis::Connection, String> {
                            for _ in 0..gets {
                                let v: String = conn.get(KEY).map_err(|e| format!("GET: {e}"))?;
                                if v != VALUE {
                                    return Err(format!("GET {KEY} returned {v:?}"));
                                }
                            }
                            Ok(conn)
                        },
                        Some(i % o.threads),
                    )
                    .map_err(|_| "the scheduler refused a fiber".to_string())
            })
            .collect::<Result<_, _>>()?;
        for f in fibers {
            conns.push(f.join().map_err(|e| format!("GET fiber: {e}"))??);
        }
        Ok(start.elapsed().as_nanos() as f64 / (conns.len() * gets) as f64)
    };
    if o.warmup {
        // Untimed, once and then until 200 ms have passed, as fibra-compare's own children
        // do (its `WARM_UP_FOR`): a fresh process's threads are placed by the kernel first.
        let warm = Instant::now();
        rep()?;
        while warm.elapsed() < Duration::from_millis(200) {
            rep()?;
        }
    }
    let mut out = std::io::stdout();
    for _ in 0..o.reps {
        let ns = rep()?;
        writeln!(out, "value {ns}").map_err(|e| e.to_string())?;
        out.flush().map_err(|e| e.to_string())?;
    }
    drop(conns);
    sched.stop();
    Ok(())
}
