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
//! written with `std::net` and the `hook` feature, and `http_cont`, the same server with
//! readiness continuations instead of a fiber per connection.
//!
//! Per connection the fiber owns one fixed read buffer and one reused output buffer, so the
//! request path allocates nothing. Connections are handed to the workers in turn: a started
//! fiber never changes worker, so dealing them out evenly is what balances the load.
//!
//! `--selftest` starts the server on a free loopback port and runs the self-test clients of
//! `http_std` against it (`--clients`, default 50, of `--rounds`, default 20, rounds of one
//! to three pipelined requests, some split across writes, then a `Connection: close`
//! request), checking every response byte for byte; it exits 0 if all were right.
//! Otherwise the server runs until killed. It prints `listening on <addr>` once it accepts.

use std::sync::Arc;

use fibra::net::{TcpListener, TcpStream};

mod http_common;
use http_common::{accept_loop, selftest, start, CLIENT_TIMEOUT};

fn main() {
    let (opts, sched, listener, addr) =
        start("http_hello", TcpListener::bind, TcpListener::local_addr);
    let sched = Arc::new(sched);
    let s = sched.clone();
    if !opts.selftest {
        sched.block_on(move || accept_loop("http_hello", listener, &s, fibra::sleep));
        return;
    }
    let acceptor = sched.spawn(move || accept_loop("http_hello", listener, &s, fibra::sleep));
    let connect = |addr| {
        let conn = TcpStream::connect(addr)?;
        conn.set_read_timeout(Some(CLIENT_TIMEOUT))?;
        Ok(conn)
    };
    selftest(
        "http_hello",
        &sched,
        acceptor,
        (addr, &opts),
        connect,
        fibra::sleep,
    );
}
