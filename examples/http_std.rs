//! A hello-world HTTP/1.1 server written as ordinary blocking `std::net` code, served by
//! fibra's fibers through the `hook` feature.
//!
//! ```sh
//! cargo run --release --example http_std --features hook -- --threads 2 --port 8080
//! wrk -t1 -c100 -d5s http://127.0.0.1:8080/
//! cargo run --release --example http_std --features hook -- --selftest   # loads itself, exits
//! ```
//!
//! Look at [`accept_loop`] and `http_common::serve`: a `std::net::TcpListener`, one
//! `std::net::TcpStream` per connection, `Read::read` and `Write::write_all`, and even
//! `std::thread::sleep` for the accept back-off. Nothing there knows about fibra except the
//! one `submit` that starts a fiber per connection. On threads, this would be a
//! thread-per-connection server. With the `hook` feature, fibra interposes the C library
//! calls under std's methods (`accept4`, `recv`, `send`, `nanosleep`…): made from a fiber, a
//! call that would block parks only that fiber, and its worker thread runs the other
//! connections meanwhile. So a few workers serve thousands of connections, and any blocking
//! crate (a database client, an HTTP client) gets the same treatment without being rewritten.
//! See the `fibra::hook` module for what is and is not hooked.
//!
//! It is the same server as `http_hello`, which uses `fibra::net`: same command line, same
//! responses, same request framing (`examples/http_common/mod.rs`: `httparse`, pipelined
//! requests answered in order in one write), connections dealt to the workers in turn. The
//! benchmark harness (`benches/compare`, workload `http_hooked`) measures the two side by
//! side: the difference is the cost of going through the hooks.
//!
//! `--selftest` starts the server on a free loopback port, runs `--clients` client fibers
//! (default 50), themselves plain `std::net` code, each sending `--rounds` rounds (default
//! 20) of one to three pipelined requests, some split across writes, then a final
//! `Connection: close` request; every response is checked byte for byte. It exits 0 if all
//! were right. The server otherwise runs until killed and prints `listening on <addr>` once
//! it accepts.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::Arc;
use std::time::{Duration, Instant};

mod http_common;
use http_common::{out_of_resources, serve, OK_CLOSE, OK_KEEP_ALIVE};

struct Options {
    threads: usize,
    port: u16,
    selftest: bool,
    clients: usize,
    rounds: usize,
}

fn options() -> Result<Options, String> {
    let mut opts = Options {
        threads: std::thread::available_parallelism().map_or(1, |n| n.get()),
        port: 0,
        selftest: false,
        clients: 50,
        rounds: 20,
    };
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        let mut value = |name: &str| args.next().ok_or_else(|| format!("{name} needs a value"));
        match arg.as_str() {
            "--threads" => {
                opts.threads = value("--threads")?
                    .parse()
                    .map_err(|e| format!("--threads: {e}"))?
            }
            "--port" => {
                opts.port = value("--port")?
                    .parse()
                    .map_err(|e| format!("--port: {e}"))?
            }
            "--selftest" => opts.selftest = true,
            "--clients" => {
                opts.clients = value("--clients")?
                    .parse()
                    .map_err(|e| format!("--clients: {e}"))?
            }
            "--rounds" => {
                opts.rounds = value("--rounds")?
                    .parse()
                    .map_err(|e| format!("--rounds: {e}"))?
            }
            "-h" | "--help" => {
                println!(
                    "usage: http_std [--threads N] [--port P] [--selftest [--clients C] \
                     [--rounds R]]   (port 0: any free port)"
                );
                std::process::exit(0);
            }
            other => return Err(format!("unknown argument {other:?} (try --help)")),
        }
    }
    if opts.threads == 0 {
        return Err("--threads must be at least 1".into());
    }
    Ok(opts)
}

fn main() {
    let opts = options().unwrap_or_else(|e| {
        eprintln!("http_std: {e}");
        std::process::exit(2);
    });
    let sched = Arc::new(
        fibra::Scheduler::builder()
            .threads(opts.threads)
            .name("http")
            .build()
            .unwrap_or_else(|e| {
                eprintln!("http_std: {e}");
                std::process::exit(2);
            }),
    );
    sched.start();
    // Bound on this plain thread: outside a fiber, the hooks pass every call straight through.
    let port = if opts.selftest { 0 } else { opts.port };
    let listener =
        TcpListener::bind(SocketAddr::from(([127, 0, 0, 1], port))).unwrap_or_else(|e| {
            eprintln!("http_std: cannot bind port {port}: {e}");
            std::process::exit(1);
        });
    let addr = listener.local_addr().expect("bound");
    println!("listening on {addr} with {} workers", opts.threads);

    if !opts.selftest {
        let s = sched.clone();
        sched.block_on(move || accept_loop(listener, &s));
        return;
    }
    let s = sched.clone();
    let acceptor = sched.spawn(move || accept_loop(listener, &s));
    let ok = selftest(&sched, addr, opts.clients, opts.rounds);
    // The acceptor waits for connections forever: cancel it rather than wait. Its `accept`
    // then fails with ECANCELED and `accept_loop` returns.
    sched.stop_timeout(Duration::from_millis(100));
    drop(acceptor);
    std::process::exit(if ok { 0 } else { 1 });
}

/// Accepts connections and starts one fiber per connection, until the fiber is cancelled.
/// Runs in a fiber, so each `accept` that finds no connection parks only this fiber.
fn accept_loop(listener: TcpListener, sched: &fibra::Scheduler) {
    let workers = sched.threads();
    let mut next = 0;
    let mut delay = Duration::ZERO;
    loop {
        match listener.accept() {
            Ok((conn, _)) => {
                delay = Duration::ZERO;
                // A started fiber never changes worker, so dealing connections out to the
                // workers in turn is what balances the load.
                let _ = sched.submit(
                    move || {
                        let _ = conn.set_nodelay(true);
                        serve(conn)
                    },
                    Some(next),
                );
                next = (next + 1) % workers;
            }
            // Out of descriptors or memory: back off (5 ms doubling to 1 s, as Go's
            // http.Server does) and let the connections being served close theirs. A plain
            // `thread::sleep`: in a fiber it sleeps the fiber, not the worker.
            Err(e) if out_of_resources(&e) => {
                delay = (delay * 2).clamp(Duration::from_millis(5), Duration::from_secs(1));
                eprintln!("http_std: accept: {e}; retrying in {delay:?}");
                std::thread::sleep(delay);
            }
            // The fiber was cancelled (the scheduler is stopping): every later call that
            // would wait fails the same way, so stop here.
            Err(e) if e.raw_os_error() == Some(libc::ECANCELED) => return,
            // The peer gave up before we got to it, and the like: next one.
            Err(e) => eprintln!("http_std: accept: {e}"),
        }
    }
}

/// A request as a load generator sends it.
const GET: &[u8] = b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n";
const GET_CLOSE: &[u8] = b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n";
/// How long a self-test client waits for a response before it reports a failure.
const CLIENT_TIMEOUT: Duration = Duration::from_secs(10);

/// Runs `clients` client fibers against the server at `addr` and reports; true if every
/// response was right.
fn selftest(sched: &fibra::Scheduler, addr: SocketAddr, clients: usize, rounds: usize) -> bool {
    let started = Instant::now();
    let handles: Vec<_> = (0..clients)
        .map(|id| sched.spawn(move || client(addr, id, rounds)))
        .collect();
    let (mut requests, mut failures) = (0, 0);
    for h in handles {
        match h.join() {
            Ok(Ok(n)) => requests += n,
            Ok(Err(e)) => {
                eprintln!("http_std: selftest: {e}");
                failures += 1;
            }
            Err(e) => {
                eprintln!("http_std: selftest: client fiber failed: {e}");
                failures += 1;
            }
        }
    }
    println!(
        "selftest: {clients} clients, {requests} requests answered correctly in {:.2?}, \
         {failures} clients failed",
        started.elapsed()
    );
    failures == 0 && clients > 0
}

/// One self-test client, itself blocking std code in a fiber: `rounds` rounds of one to
/// three pipelined requests (every third round split across two writes with a sleep in
/// between, so the server sees a partial request), then a `Connection: close` request after
/// which the server must close. Returns the number of requests answered.
fn client(addr: SocketAddr, id: usize, rounds: usize) -> Result<usize, String> {
    let fail = |what: &str, e: &dyn std::fmt::Display| format!("client {id}: {what}: {e}");
    let mut conn = TcpStream::connect(addr).map_err(|e| fail("connect", &e))?;
    conn.set_read_timeout(Some(CLIENT_TIMEOUT))
        .map_err(|e| fail("set_read_timeout", &e))?;
    let mut answered = 0;
    let mut got = Vec::new();
    for round in 0..rounds {
        let pipelined = 1 + (id + round) % 3;
        let batch = GET.repeat(pipelined);
        if round % 3 == 2 {
            let (a, b) = batch.split_at(GET.len() / 2);
            conn.write_all(a).map_err(|e| fail("write", &e))?;
            std::thread::sleep(Duration::from_millis(1));
            conn.write_all(b).map_err(|e| fail("write", &e))?;
        } else {
            conn.write_all(&batch).map_err(|e| fail("write", &e))?;
        }
        got.resize(pipelined * OK_KEEP_ALIVE.len(), 0);
        conn.read_exact(&mut got)
            .map_err(|e| fail(&format!("round {round}: read"), &e))?;
        if got != OK_KEEP_ALIVE.repeat(pipelined) {
            return Err(format!(
                "client {id}: round {round}: unexpected response {:?}",
                String::from_utf8_lossy(&got)
            ));
        }
        answered += pipelined;
    }
    conn.write_all(GET_CLOSE).map_err(|e| fail("write", &e))?;
    got.clear();
    conn.read_to_end(&mut got)
        .map_err(|e| fail("last read", &e))?;
    if got != OK_CLOSE {
        return Err(format!(
            "client {id}: expected the closing response and the end of the connection, got {:?}",
            String::from_utf8_lossy(&got)
        ));
    }
    Ok(answered + 1)
}
