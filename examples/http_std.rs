//! A hello-world HTTP/1.1 server written as ordinary blocking `std::net` code, served by
//! fibra's fibers through the `hook` feature.
//!
//! ```sh
//! cargo run --release --example http_std --features hook -- --threads 2 --port 8080
//! wrk -t1 -c100 -d5s http://127.0.0.1:8080/
//! cargo run --release --example http_std --features hook -- --selftest   # loads itself, exits
//! ```
//!
//! Look at `main` and `http_common::{accept_loop, serve}`: a `std::net::TcpListener`, one
//! `std::net::TcpStream` per connection, `Read::read` and `Write::write_all`, and even
//! `std::thread::sleep` for the accept back-off. Nothing there knows about fibra except the
//! one `submit` that starts a fiber per connection (`http_hello` runs the same loop over
//! `fibra::net`'s types). On threads, this would be a
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

use std::net::{TcpListener, TcpStream};
use std::sync::Arc;

mod http_common;
use http_common::{accept_loop, selftest, start, CLIENT_TIMEOUT};

fn main() {
    // Bound on this plain thread: outside a fiber, the hooks pass every call straight through.
    let (opts, sched, listener, addr) =
        start("http_std", TcpListener::bind, TcpListener::local_addr);
    let sched = Arc::new(sched);
    if !opts.selftest {
        let s = sched.clone();
        sched.block_on(move || accept_loop("http_std", listener, &s, std::thread::sleep));
        return;
    }
    let s = sched.clone();
    let acceptor = sched.spawn(move || accept_loop("http_std", listener, &s, std::thread::sleep));
    // The clients are plain std code too, parked by the hooks like the server.
    let connect = |addr| {
        let conn = TcpStream::connect(addr)?;
        conn.set_read_timeout(Some(CLIENT_TIMEOUT))?;
        Ok(conn)
    };
    selftest(
        "http_std",
        &sched,
        acceptor,
        (addr, &opts),
        connect,
        std::thread::sleep,
    );
}
