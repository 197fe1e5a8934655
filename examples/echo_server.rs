//! An echo server on 127.0.0.1: one fiber per connection, plain blocking-style code.
//!
//! ```sh
//! cargo run --release --example echo_server -- --port 7000      # serves until killed
//! cargo run --release --example echo_server -- --selftest       # loads itself, then exits
//! ```
//!
//! `--selftest` starts the server on a free port, runs `--clients` client fibers (default
//! 100) on the same scheduler, each sending `--messages` messages (default 1 000) and checking
//! every echo, prints the round trips per second and exits: 0 if every echo came back intact.

use std::io::{Read, Write};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use fibra::net::{TcpListener, TcpStream};

struct Options {
    threads: usize,
    port: u16,
    selftest: bool,
    clients: usize,
    messages: usize,
}

fn options() -> Result<Options, String> {
    let mut o = Options {
        threads: std::thread::available_parallelism().map_or(1, |n| n.get()),
        port: 0,
        selftest: false,
        clients: 100,
        messages: 1_000,
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
            "--selftest" => o.selftest = true,
            "--clients" => o.clients = number("--clients")?,
            "--messages" => o.messages = number("--messages")?,
            "-h" | "--help" => {
                println!(
                    "usage: echo_server [--threads N] [--port P] \
                     [--selftest [--clients C] [--messages M]]"
                );
                std::process::exit(0);
            }
            other => return Err(format!("unknown argument {other:?} (try --help)")),
        }
    }
    Ok(o)
}

/// Echoes everything `conn` sends until it closes the connection.
fn echo(mut conn: TcpStream) {
    let _ = conn.set_nodelay(true);
    let mut buf = [0u8; 4096];
    loop {
        match conn.read(&mut buf) {
            Ok(0) | Err(_) => return,
            Ok(n) => {
                if conn.write_all(&buf[..n]).is_err() {
                    return;
                }
            }
        }
    }
}

/// One self-test client: `messages` round trips, each checked.
fn client(addr: SocketAddr, id: usize, messages: usize) -> Result<(), String> {
    let mut s = TcpStream::connect(addr).map_err(|e| format!("client {id}: connect: {e}"))?;
    s.set_nodelay(true).map_err(|e| e.to_string())?;
    let mut back = Vec::new();
    for m in 0..messages {
        let msg = format!("client {id} message {m}\n");
        s.write_all(msg.as_bytes())
            .map_err(|e| format!("client {id}: write: {e}"))?;
        back.resize(msg.len(), 0);
        s.read_exact(&mut back)
            .map_err(|e| format!("client {id}: read: {e}"))?;
        if back != msg.as_bytes() {
            return Err(format!("client {id}: message {m} came back changed"));
        }
    }
    Ok(())
}

fn main() {
    let o = options().unwrap_or_else(|e| {
        eprintln!("echo_server: {e}");
        std::process::exit(2);
    });
    let sched = Arc::new(
        fibra::Scheduler::builder()
            .threads(o.threads)
            .name("echo")
            .build()
            .unwrap_or_else(|e| {
                eprintln!("echo_server: {e}");
                std::process::exit(2);
            }),
    );
    sched.start();
    let listener =
        TcpListener::bind(SocketAddr::from(([127, 0, 0, 1], o.port))).unwrap_or_else(|e| {
            eprintln!("echo_server: cannot bind port {}: {e}", o.port);
            std::process::exit(1);
        });
    let addr = listener.local_addr().expect("bound");
    println!("echo server listening on {addr} with {} workers", o.threads);

    let s = sched.clone();
    let acceptor = sched
        .submit(
            move || {
                let mut delay = Duration::ZERO;
                for conn in listener.incoming() {
                    match conn {
                        Ok(conn) => {
                            delay = Duration::ZERO;
                            let _ = s.submit(move || echo(conn), None);
                        }
                        // Out of descriptors or memory: an immediate retry fails again. Back
                        // off (5 ms doubling to 1 s) while the open connections close theirs.
                        Err(e)
                            if matches!(
                                e.raw_os_error(),
                                Some(libc::EMFILE | libc::ENFILE | libc::ENOBUFS | libc::ENOMEM)
                            ) =>
                        {
                            delay =
                                (delay * 2).clamp(Duration::from_millis(5), Duration::from_secs(1));
                            eprintln!("echo_server: accept: {e}; retrying in {delay:?}");
                            fibra::sleep(delay);
                        }
                        Err(e) => eprintln!("echo_server: accept: {e}"),
                    }
                }
            },
            None,
        )
        .expect("scheduler running");

    if !o.selftest {
        let _ = acceptor.join();
        return;
    }
    let start = Instant::now();
    let clients: Vec<_> = (0..o.clients)
        .map(|id| {
            let messages = o.messages;
            sched
                .submit(move || client(addr, id, messages), None)
                .expect("scheduler running")
        })
        .collect();
    let mut failures = 0;
    for c in clients {
        match c.join() {
            Ok(Ok(())) => {}
            Ok(Err(e)) => {
                eprintln!("{e}");
                failures += 1;
            }
            Err(e) => {
                eprintln!("client fiber failed: {e}");
                failures += 1;
            }
        }
    }
    let elapsed = start.elapsed();
    let trips = (o.clients - failures) * o.messages;
    println!(
        "selftest: {} clients x {} messages: {trips} round trips in {elapsed:.2?} ({:.0}/s), {failures} failed",
        o.clients,
        o.messages,
        trips as f64 / elapsed.as_secs_f64()
    );
    // The acceptor waits forever: cancel it rather than wait.
    sched.stop_timeout(std::time::Duration::from_millis(100));
    std::process::exit(if failures == 0 { 0 } else { 1 });
}
