//! The hello-world HTTP/1.1 server of `http_hello`, written with `serve`: between requests
//! a connection is not a parked fiber but its handler, registered by
//! [`TcpListener::serve`]. When the next request arrives, a new task serves it, on
//! whichever worker takes it first. It is the server of the comparison harness's
//! `http_cont` row (`benches/compare`).
//!
//! ```sh
//! cargo run --release --example http_cont -- --threads 2 --port 8080
//! wrk -t1 -c100 -d5s http://127.0.0.1:8080/
//! ```
//!
//! Why: a started fiber never changes worker, so in `http_hello` each connection waits for
//! its own worker. When the kernel preempts that worker (more runnable threads than CPUs, as
//! when `wrk` shares the machine), the connection's next request waits out the preemption,
//! up to a scheduler tick of 4 ms, even if the other worker is idle. Here a request that
//! arrives is a new task that any worker may start, and an idle connection holds no stack,
//! only its handler and the buffers it carries.
//!
//! The request framing and responses are `http_hello`'s (`examples/http_common/mod.rs`).
//! Responses are written with the blocking `write_all`: a full socket buffer parks the task
//! until it drains, as in `http_hello`.
//!
//! `--selftest` starts the server on a free loopback port and runs `http_std`'s self-test
//! clients against it (`--clients`, default 50, of `--rounds`, default 20, rounds of one to
//! three pipelined requests, some split across writes, then a `Connection: close` request),
//! checking every response byte for byte; it exits 0 if all were right. Otherwise the server
//! runs until killed. It prints `listening on <addr>` once it accepts.

use std::io::{ErrorKind, Write};

use fibra::net::{Serve, TcpListener, TcpStream};

mod http_common;
use http_common::{
    answer, linger_close, selftest, start, Next, CLIENT_TIMEOUT, MAX_HEAD, OK_KEEP_ALIVE_10,
};

/// What a connection keeps between two tasks besides its socket: the read buffer with the
/// unanswered bytes in `start..end`, what is left of a request body to skip, and the reused
/// output buffer.
struct State {
    buf: Box<[u8; MAX_HEAD]>,
    start: usize,
    end: usize,
    body_left: usize,
    out: Vec<u8>,
}

impl State {
    fn new() -> State {
        State {
            buf: Box::new([0; MAX_HEAD]),
            start: 0,
            end: 0,
            body_left: 0,
            out: Vec::with_capacity(4 * OK_KEEP_ALIVE_10.len()),
        }
    }
}

/// One turn of a connection: answers what the socket has, then asks to be run again when
/// the client sends more. `Close` closes the connection.
fn turn(stream: &mut TcpStream, c: &mut State) -> Serve {
    loop {
        if c.start == c.end {
            (c.start, c.end) = (0, 0);
        } else if c.end == c.buf.len() {
            c.buf.copy_within(c.start..c.end, 0);
            (c.start, c.end) = (0, c.end - c.start);
        }
        match stream.try_read(&mut c.buf[c.end..]) {
            Ok(0) => return Serve::Close,
            Ok(n) => c.end += n,
            Err(e) if e.kind() == ErrorKind::WouldBlock => return Serve::Again,
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(_) => return Serve::Close,
        }
        c.out.clear();
        let next = answer(
            &c.buf[..],
            &mut c.start,
            c.end,
            &mut c.body_left,
            &mut c.out,
        );
        if !c.out.is_empty() && stream.write_all(&c.out).is_err() {
            return Serve::Close;
        }
        if let Next::Close = next {
            // As in `http_hello`, with blocking reads: this task drains and closes.
            linger_close(stream, &mut c.buf[..]);
            return Serve::Close;
        }
    }
}

/// Serves connections until the fiber is cancelled; each connection's first request is
/// served like every later one, by a task started when it arrives, on any worker.
/// (`serve` backs off when out of descriptors, as `http_hello`'s accept loop does.)
fn accept_loop(listener: TcpListener) {
    let served = listener.serve(|conn, _| {
        let _ = conn.set_nodelay(true);
        let mut state = State::new();
        Some(move |conn: &mut TcpStream| turn(conn, &mut state))
    });
    if let Err(e) = served {
        eprintln!("http_cont: accept: {e}");
    }
}

fn main() {
    let (opts, sched, listener, addr) =
        start("http_cont", TcpListener::bind, TcpListener::local_addr);
    if !opts.selftest {
        sched.block_on(move || accept_loop(listener));
        return;
    }
    let acceptor = sched.spawn(move || accept_loop(listener));
    let connect = |addr| {
        let conn = TcpStream::connect(addr)?;
        conn.set_read_timeout(Some(CLIENT_TIMEOUT))?;
        Ok(conn)
    };
    selftest(
        "http_cont",
        &sched,
        acceptor,
        (addr, &opts),
        connect,
        fibra::sleep,
    );
}
