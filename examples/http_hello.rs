//! A hello-world HTTP/1.1 server: one fiber per connection, keep-alive, a fixed
//! `Hello, World!` body. It is the server `wrk` measures in the comparison harness
//! (`benches/compare`, workload `http`).
//!
//! ```sh
//! cargo run --release --example http_hello -- --threads 2 --port 8080
//! wrk -t1 -c100 -d5s http://127.0.0.1:8080/
//! ```
//!
//! The responses and the request framing (`httparse`; pipelined requests answered in order,
//! in one write) are in `examples/http_common/mod.rs`, shared with `http_std`, the same server
//! written with `std::net` and the `hook` feature.
//!
//! Per connection the fiber owns one fixed read buffer and one reused output buffer, so the
//! request path allocates nothing. Connections are handed to the workers in turn: a started
//! fiber never changes worker, so dealing them out evenly is what balances the load.
//!
//! The server runs until killed. It prints `listening on <addr>` once it accepts.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use fibra::net::TcpListener;

mod http_common;
use http_common::{out_of_resources, serve};

struct Options {
    threads: usize,
    port: u16,
}

fn options() -> Result<Options, String> {
    let mut opts = Options {
        threads: std::thread::available_parallelism().map_or(1, |n| n.get()),
        port: 0,
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
            "-h" | "--help" => {
                println!("usage: http_hello [--threads N] [--port P]   (port 0: any free port)");
                std::process::exit(0);
            }
            other => return Err(format!("unknown argument {other:?} (try --help)")),
        }
    }
    Ok(opts)
}

fn main() {
    let opts = options().unwrap_or_else(|e| {
        eprintln!("http_hello: {e}");
        std::process::exit(2);
    });
    let sched = Arc::new(
        fibra::Scheduler::builder()
            .threads(opts.threads)
            .name("http")
            .build()
            .unwrap_or_else(|e| {
                eprintln!("http_hello: {e}");
                std::process::exit(2);
            }),
    );
    sched.start();
    let listener =
        TcpListener::bind(SocketAddr::from(([127, 0, 0, 1], opts.port))).unwrap_or_else(|e| {
            eprintln!("http_hello: cannot bind port {}: {e}", opts.port);
            std::process::exit(1);
        });
    println!(
        "listening on {} with {} workers",
        listener.local_addr().expect("bound"),
        opts.threads
    );
    let workers = opts.threads;
    let s = sched.clone();
    sched.block_on(move || {
        let mut next = 0;
        let mut delay = Duration::ZERO;
        loop {
            match listener.accept() {
                Ok((conn, _)) => {
                    delay = Duration::ZERO;
                    // Deal connections out to the workers in turn (see the module docs).
                    let _ = s.submit(
                        move || {
                            let _ = conn.set_nodelay(true);
                            serve(conn)
                        },
                        Some(next),
                    );
                    next = (next + 1) % workers;
                }
                // Out of descriptors or memory: the connection stays queued and an immediate
                // retry fails again. Back off as Go's http.Server does (5 ms doubling to
                // 1 s) and let the connections being served close theirs.
                Err(e) if out_of_resources(&e) => {
                    delay = (delay * 2).clamp(Duration::from_millis(5), Duration::from_secs(1));
                    eprintln!("http_hello: accept: {e}; retrying in {delay:?}");
                    fibra::sleep(delay);
                }
                // The peer gave up before we got to it, and the like: next one.
                Err(e) => eprintln!("http_hello: accept: {e}"),
            }
        }
    });
}
