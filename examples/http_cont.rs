//! The hello-world HTTP/1.1 server of `http_hello`, written with readiness continuations:
//! between requests a connection is not a parked fiber but a closure registered with
//! [`TcpStream::spawn_when_readable`]. When the next request arrives, a new task serves it,
//! on whichever worker takes it first. It is the server of the comparison harness's
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
//! only its buffers.
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
use std::time::Duration;

use fibra::net::{TcpListener, TcpStream};

mod http_common;
use http_common::{
    answer, linger_close, out_of_resources, selftest, start, Next, CLIENT_TIMEOUT, MAX_HEAD,
    OK_KEEP_ALIVE_10,
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

/// Answers what the socket has, then registers the connection to be served again when the
/// client sends more. Returning without registering closes the connection.
fn serve(mut stream: TcpStream, mut c: State) {
    loop {
        if c.start == c.end {
            (c.start, c.end) = (0, 0);
        } else if c.end == c.buf.len() {
            c.buf.copy_within(c.start..c.end, 0);
            (c.start, c.end) = (0, c.end - c.start);
        }
        match stream.try_read(&mut c.buf[c.end..]) {
            Ok(0) => return,
            Ok(n) => c.end += n,
            Err(e) if e.kind() == ErrorKind::WouldBlock => {
                // Refused only while the scheduler stops (or on a reactor error): the
                // connection is then dropped, which closes it.
                if let Err(e) = stream.spawn_when_readable(move |stream| serve(stream, c)) {
                    eprintln!("http_cont: {e}");
                }
                return;
            }
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(_) => return,
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
            return;
        }
        if let Next::Close = next {
            // As in `http_hello`, with blocking reads: this task drains and closes.
            linger_close(&mut stream, &mut c.buf[..]);
            return;
        }
    }
}

/// Accepts connections until the fiber is cancelled; each connection's first request is
/// served like every later one, by a task started when it arrives, on any worker.
fn accept_loop(listener: TcpListener) {
    let mut delay = Duration::ZERO;
    loop {
        match listener.accept() {
            Ok((stream, _)) => {
                delay = Duration::ZERO;
                let _ = stream.set_nodelay(true);
                fibra::spawn(move || serve(stream, State::new()));
            }
            // Out of descriptors or memory: back off as `http_hello` does.
            Err(e) if out_of_resources(&e) => {
                delay = (delay * 2).clamp(Duration::from_millis(5), Duration::from_secs(1));
                eprintln!("http_cont: accept: {e}; retrying in {delay:?}");
                fibra::sleep(delay);
            }
            // The fiber was cancelled (the scheduler is stopping).
            Err(e) if e.raw_os_error() == Some(libc::ECANCELED) => return,
            Err(e) => eprintln!("http_cont: accept: {e}"),
        }
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
