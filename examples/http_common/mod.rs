//! The HTTP side shared by `http_hello` (written with `fibra::net`), `http_std` (written
//! with `std::net` and the `hook` feature) and `http_cont` (`fibra::net` with readiness
//! continuations): the responses, the request framing and the `--selftest` clients. With it
//! in one place the servers answer byte for byte alike and differ only in their I/O, which is
//! what the benchmark harness compares.
//!
//! Requests are parsed with `httparse`. A malformed request is answered `400 Bad Request`
//! and the connection closed; a request head over [`MAX_HEAD`] bytes or [`MAX_HEADERS`]
//! headers is refused with `431 Request Header Fields Too Large` and closed. Bodies
//! announced by `Content-Length` are read and discarded; chunked bodies are refused with
//! `501`. Pipelined requests are answered in order, in one write. Each server uses part of
//! this module (`http_cont` has its own loop instead of [`serve`]; only two have a
//! `--selftest`), hence the `allow`.
#![allow(dead_code)]

use std::io::{Read, Write};
use std::net::SocketAddr;
use std::time::{Duration, Instant};

/// A connection [`serve`] can drive: `std::net::TcpStream` (in `http_std`, under the hooks)
/// and `fibra::net::TcpStream` (in `http_hello`).
pub trait Conn: std::io::Read + std::io::Write {
    /// Sends a FIN and bounds later reads by [`LINGER`].
    fn finish_writing(&mut self) -> std::io::Result<()>;
}

impl Conn for std::net::TcpStream {
    fn finish_writing(&mut self) -> std::io::Result<()> {
        self.shutdown(std::net::Shutdown::Write)?;
        // std's read timeout keeps its meaning under the hooks: the read fails after it.
        self.set_read_timeout(Some(LINGER))
    }
}

impl Conn for fibra::net::TcpStream {
    fn finish_writing(&mut self) -> std::io::Result<()> {
        self.shutdown(std::net::Shutdown::Write)?;
        self.set_read_timeout(Some(LINGER))
    }
}

/// A listener whose connections [`serve`] can drive: `std::net::TcpListener` (in `http_std`,
/// under the hooks) and `fibra::net::TcpListener` (in `http_hello`).
pub trait Listen {
    type Conn: Conn + Send + 'static;
    /// Accepts a connection, with `TCP_NODELAY` set.
    fn accept_conn(&self) -> std::io::Result<Self::Conn>;
}

impl Listen for std::net::TcpListener {
    type Conn = std::net::TcpStream;
    fn accept_conn(&self) -> std::io::Result<Self::Conn> {
        let (conn, _) = self.accept()?;
        let _ = conn.set_nodelay(true);
        Ok(conn)
    }
}

impl Listen for fibra::net::TcpListener {
    type Conn = fibra::net::TcpStream;
    fn accept_conn(&self) -> std::io::Result<Self::Conn> {
        let (conn, _) = self.accept()?;
        let _ = conn.set_nodelay(true);
        Ok(conn)
    }
}

/// Accepts connections and starts one fiber per connection running [`serve`], until the
/// calling fiber is cancelled. A started fiber never changes worker, so the connections are
/// dealt to the workers in turn: that is what balances the load. Out of descriptors or
/// memory, it backs off with `sleep` (5 ms doubling to 1 s, as Go's `http.Server` does) and
/// lets the connections being served close theirs. `name` prefixes its messages.
pub fn accept_loop(
    name: &str,
    listener: impl Listen,
    sched: &fibra::Scheduler,
    sleep: fn(Duration),
) {
    let workers = sched.threads();
    let mut next = 0;
    let mut delay = Duration::ZERO;
    loop {
        match listener.accept_conn() {
            Ok(conn) => {
                delay = Duration::ZERO;
                let _ = sched.submit(move || serve(conn), Some(next));
                next = (next + 1) % workers;
            }
            Err(e) if out_of_resources(&e) => {
                delay = (delay * 2).clamp(Duration::from_millis(5), Duration::from_secs(1));
                eprintln!("{name}: accept: {e}; retrying in {delay:?}");
                sleep(delay);
            }
            // The fiber was cancelled (the scheduler is stopping): with the hooks, every
            // later call that would wait fails the same way, so stop here.
            Err(e) if e.raw_os_error() == Some(libc::ECANCELED) => return,
            // The peer gave up before we got to it, and the like: next one.
            Err(e) => eprintln!("{name}: accept: {e}"),
        }
    }
}

/// Serves one connection until the client closes it or a request ends it: plain blocking
/// code, in which each `read` that finds nothing parks only the calling fiber (fibra::net's
/// sockets by themselves, std's through the `hook` feature).
pub fn serve(mut conn: impl Conn) {
    let mut buf = [0u8; MAX_HEAD];
    let mut out = Vec::with_capacity(4 * OK_KEEP_ALIVE_10.len());
    let (mut start, mut end) = (0, 0);
    // Bytes of a request body still to be read and discarded.
    let mut body_left = 0usize;
    loop {
        if start == end {
            (start, end) = (0, 0);
        } else if end == buf.len() {
            buf.copy_within(start..end, 0);
            (start, end) = (0, end - start);
        }
        match conn.read(&mut buf[end..]) {
            Ok(0) | Err(_) => return,
            Ok(n) => end += n,
        }
        out.clear();
        let next = answer(&buf, &mut start, end, &mut body_left, &mut out);
        if !out.is_empty() && conn.write_all(&out).is_err() {
            return;
        }
        if let Next::Close = next {
            linger_close(&mut conn, &mut buf);
            return;
        }
    }
}

/// Closes after an answer that ends the connection. Closing a socket with unread input
/// makes the kernel send a reset, which can destroy the answer before the client reads it,
/// so send a FIN first and drain what the client still sends, for a bounded time and amount.
pub fn linger_close(conn: &mut impl Conn, buf: &mut [u8]) {
    if conn.finish_writing().is_err() {
        return;
    }
    let mut drained = 0;
    while drained < LINGER_BYTES {
        match conn.read(buf) {
            Ok(0) | Err(_) => return,
            Ok(n) => drained += n,
        }
    }
}

/// The largest request head accepted (request line and headers).
pub const MAX_HEAD: usize = 8 * 1024;
/// The most headers a request may carry.
pub const MAX_HEADERS: usize = 64;
/// How long a connection being closed drains what the client still sends.
pub const LINGER: std::time::Duration = std::time::Duration::from_secs(2);
/// How much a connection being closed drains at most.
pub const LINGER_BYTES: usize = 64 * 1024;

/// The answer to an HTTP/1.1 request that keeps the connection open.
pub const OK_KEEP_ALIVE: &[u8] =
    b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 13\r\n\r\nHello, World!";
/// For HTTP/1.0 clients that asked to keep the connection open.
pub const OK_KEEP_ALIVE_10: &[u8] = b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 13\r\nConnection: keep-alive\r\n\r\nHello, World!";
/// The answer to a request that ends the connection.
pub const OK_CLOSE: &[u8] = b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 13\r\nConnection: close\r\n\r\nHello, World!";
const BAD_REQUEST: &[u8] =
    b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\nConnection: close\r\n\r\n";
const TOO_LARGE: &[u8] = b"HTTP/1.1 431 Request Header Fields Too Large\r\nContent-Length: 0\r\nConnection: close\r\n\r\n";
const NOT_IMPLEMENTED: &[u8] =
    b"HTTP/1.1 501 Not Implemented\r\nContent-Length: 0\r\nConnection: close\r\n\r\n";

/// Whether an `accept` error is about the process or the system rather than the connection:
/// out of descriptors or memory. The connection then stays queued and an immediate retry
/// fails again, so the accept loop should back off.
pub fn out_of_resources(e: &std::io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(libc::EMFILE | libc::ENFILE | libc::ENOBUFS | libc::ENOMEM)
    )
}

/// What to do after answering the requests read so far.
pub enum Next {
    /// Read more requests.
    KeepGoing,
    /// The last answer ends the connection: close it (after draining, see `LINGER`).
    Close,
}

/// Answers every complete request in `buf[*start..end]`, appending the responses to `out`
/// and advancing `*start` past them. `body_left` carries the bytes of a request body still
/// to be skipped from one call to the next.
pub fn answer(
    buf: &[u8],
    start: &mut usize,
    end: usize,
    body_left: &mut usize,
    out: &mut Vec<u8>,
) -> Next {
    loop {
        if *body_left > 0 {
            let skip = (*body_left).min(end - *start);
            *start += skip;
            *body_left -= skip;
            if *body_left > 0 {
                return Next::KeepGoing;
            }
        }
        if *start == end {
            return Next::KeepGoing;
        }
        let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
        let mut req = httparse::Request::new(&mut headers);
        let head_len = match req.parse(&buf[*start..end]) {
            Ok(httparse::Status::Complete(len)) => len,
            Ok(httparse::Status::Partial) => {
                // A partial head that already fills the buffer will never fit.
                if *start == 0 && end == buf.len() {
                    out.extend_from_slice(TOO_LARGE);
                    return Next::Close;
                }
                return Next::KeepGoing;
            }
            Err(httparse::Error::TooManyHeaders) => {
                out.extend_from_slice(TOO_LARGE);
                return Next::Close;
            }
            Err(_) => {
                out.extend_from_slice(BAD_REQUEST);
                return Next::Close;
            }
        };
        *start += head_len;
        match request_framing(&req) {
            Ok(framing) => {
                *body_left = framing.body;
                if framing.keep_alive {
                    out.extend_from_slice(if req.version == Some(0) {
                        OK_KEEP_ALIVE_10
                    } else {
                        OK_KEEP_ALIVE
                    });
                } else {
                    out.extend_from_slice(OK_CLOSE);
                    return Next::Close;
                }
            }
            Err(response) => {
                out.extend_from_slice(response);
                return Next::Close;
            }
        }
    }
}

struct Framing {
    /// Body bytes that follow the head.
    body: usize,
    /// Whether the connection stays open after the response.
    keep_alive: bool,
}

/// Reads the headers that matter for framing; an error is the response to send before
/// closing.
fn request_framing(req: &httparse::Request<'_, '_>) -> Result<Framing, &'static [u8]> {
    // HTTP/1.1 keeps connections open unless told otherwise; HTTP/1.0 closes them unless told.
    let mut keep_alive = req.version == Some(1);
    let mut body = None;
    for h in req.headers.iter() {
        if h.name.eq_ignore_ascii_case("content-length") {
            let n = std::str::from_utf8(h.value)
                .ok()
                .and_then(|v| v.trim().parse::<usize>().ok())
                .ok_or(BAD_REQUEST)?;
            // Two different lengths make the framing ambiguous (RFC 9112, 6.3).
            if body.is_some_and(|b| b != n) {
                return Err(BAD_REQUEST);
            }
            body = Some(n);
        } else if h.name.eq_ignore_ascii_case("transfer-encoding") {
            return Err(NOT_IMPLEMENTED);
        } else if h.name.eq_ignore_ascii_case("connection") {
            for token in h.value.split(|&b| b == b',') {
                let token = token.trim_ascii();
                if token.eq_ignore_ascii_case(b"close") {
                    keep_alive = false;
                } else if token.eq_ignore_ascii_case(b"keep-alive") {
                    keep_alive = true;
                }
            }
        }
    }
    Ok(Framing {
        body: body.unwrap_or(0),
        keep_alive,
    })
}

/// The command line of the servers with a `--selftest`.
pub struct Options {
    pub threads: usize,
    pub port: u16,
    pub selftest: bool,
    pub clients: usize,
    pub rounds: usize,
    /// The workers' kernel time slice in µs (`Builder::time_slice`); 0: the kernel's.
    pub time_slice_us: u64,
}

/// What every server does first: parses its command line (exiting with 2 and a message on a
/// bad one), builds and starts its scheduler, and binds its listener with `bind` on
/// 127.0.0.1 (any free port for a self-test), exiting with 1 if that fails. Prints
/// `listening on <addr>`.
pub fn start<L>(
    name: &str,
    bind: impl FnOnce(SocketAddr) -> std::io::Result<L>,
    local_addr: impl FnOnce(&L) -> std::io::Result<SocketAddr>,
) -> (Options, fibra::Scheduler, L, SocketAddr) {
    let fail = |code, e: &dyn std::fmt::Display| -> ! {
        eprintln!("{name}: {e}");
        std::process::exit(code);
    };
    let opts = options(name).unwrap_or_else(|e| fail(2, &e));
    let sched = fibra::Scheduler::builder()
        .threads(opts.threads)
        .name("http")
        .time_slice(Duration::from_micros(opts.time_slice_us))
        .build()
        .unwrap_or_else(|e| fail(2, &e));
    sched.start();
    let port = if opts.selftest { 0 } else { opts.port };
    let listener = bind(SocketAddr::from(([127, 0, 0, 1], port)))
        .unwrap_or_else(|e| fail(1, &format!("cannot bind port {port}: {e}")));
    let addr = local_addr(&listener).expect("bound");
    println!("listening on {addr} with {} workers", opts.threads);
    (opts, sched, listener, addr)
}

/// Parses the command line of server `name`.
pub fn options(name: &str) -> Result<Options, String> {
    let mut opts = Options {
        threads: std::thread::available_parallelism().map_or(1, |n| n.get()),
        port: 0,
        selftest: false,
        clients: 50,
        rounds: 20,
        time_slice_us: 0,
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
            "--time-slice-us" => {
                opts.time_slice_us = value("--time-slice-us")?
                    .parse()
                    .map_err(|e| format!("--time-slice-us: {e}"))?
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
                    "usage: {name} [--threads N] [--port P] [--time-slice-us T] \
                     [--selftest [--clients C] [--rounds R]]   (port 0: any free port; \
                     T: the workers' kernel time slice, Builder::time_slice)"
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

/// A request as a load generator sends it.
const GET: &[u8] = b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n";
const GET_CLOSE: &[u8] = b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n";
/// How long a self-test client waits for a response before it reports a failure.
pub const CLIENT_TIMEOUT: Duration = Duration::from_secs(10);

/// The `--selftest` of the servers: runs `opts.clients` client fibers of `opts.rounds`
/// rounds each against the server at `addr`, reports as `name`, cancels the server's
/// `acceptor` fiber (it waits for connections forever; its `accept` then fails with
/// `ECANCELED`) and exits: 0 if every response was right. `connect` opens a client
/// connection whose reads time out after [`CLIENT_TIMEOUT`]; `sleep` pauses a client. Both
/// must park only the fiber.
pub fn selftest<C: Read + Write + 'static>(
    name: &str,
    sched: &fibra::Scheduler,
    acceptor: fibra::JoinHandle<()>,
    (addr, opts): (SocketAddr, &Options),
    connect: fn(SocketAddr) -> std::io::Result<C>,
    sleep: fn(Duration),
) -> ! {
    let (clients, rounds) = (opts.clients, opts.rounds);
    let started = Instant::now();
    let handles: Vec<_> = (0..clients)
        .map(|id| sched.spawn(move || client(addr, id, rounds, connect, sleep)))
        .collect();
    let (mut requests, mut failures) = (0, 0);
    for h in handles {
        match h.join() {
            Ok(Ok(n)) => requests += n,
            Ok(Err(e)) => {
                eprintln!("{name}: selftest: {e}");
                failures += 1;
            }
            Err(e) => {
                eprintln!("{name}: selftest: client fiber failed: {e}");
                failures += 1;
            }
        }
    }
    println!(
        "selftest: {clients} clients, {requests} requests answered correctly in {:.2?}, \
         {failures} clients failed",
        started.elapsed()
    );
    sched.stop_timeout(Duration::from_millis(100));
    drop(acceptor);
    std::process::exit(if failures == 0 && clients > 0 { 0 } else { 1 });
}

/// One self-test client, blocking code in a fiber: `rounds` rounds of one to three pipelined
/// requests (every third round split across two writes with a sleep in between, so the
/// server sees a partial request), then a `Connection: close` request after which the
/// server must close. Returns the number of requests answered.
fn client<C: Read + Write>(
    addr: SocketAddr,
    id: usize,
    rounds: usize,
    connect: fn(SocketAddr) -> std::io::Result<C>,
    sleep: fn(Duration),
) -> Result<usize, String> {
    let fail = |what: &str, e: &dyn std::fmt::Display| format!("client {id}: {what}: {e}");
    let mut conn = connect(addr).map_err(|e| fail("connect", &e))?;
    let mut answered = 0;
    let mut got = Vec::new();
    for round in 0..rounds {
        let pipelined = 1 + (id + round) % 3;
        let batch = GET.repeat(pipelined);
        if round % 3 == 2 {
            let (a, b) = batch.split_at(GET.len() / 2);
            conn.write_all(a).map_err(|e| fail("write", &e))?;
            sleep(Duration::from_millis(1));
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

#[cfg(test)]
mod tests {
    use super::*;

    fn run(input: &[u8]) -> (Vec<u8>, bool, usize) {
        let mut buf = [0u8; MAX_HEAD];
        buf[..input.len()].copy_from_slice(input);
        let (mut start, mut body, mut out) = (0, 0, Vec::new());
        let next = answer(&buf, &mut start, input.len(), &mut body, &mut out);
        (out, matches!(next, Next::Close), start)
    }

    #[test]
    fn pipelined_requests_are_answered_in_order_and_a_partial_one_waits() {
        let (out, close, used) =
            run(b"GET / HTTP/1.1\r\nHost: a\r\n\r\nGET / HTTP/1.1\r\nHost: a\r\n\r\nGET /");
        assert_eq!(out, [OK_KEEP_ALIVE, OK_KEEP_ALIVE].concat());
        assert!(!close);
        assert_eq!(used, 2 * 27);
    }

    #[test]
    fn malformed_oversize_and_close_requests() {
        assert_eq!(run(b"GARBAGE\x01 / HTTP/1.1\r\n\r\n").0, BAD_REQUEST);
        let many: String = (0..=MAX_HEADERS).map(|i| format!("X-{i}: y\r\n")).collect();
        let (out, close, _) = run(format!("GET / HTTP/1.1\r\n{many}\r\n").as_bytes());
        assert_eq!((out.as_slice(), close), (TOO_LARGE, true));
        let (out, close, _) = run(b"GET / HTTP/1.1\r\nConnection: close\r\n\r\n");
        assert_eq!((out.as_slice(), close), (OK_CLOSE, true));
        let (out, close, _) = run(b"GET / HTTP/1.0\r\n\r\n");
        assert_eq!((out.as_slice(), close), (OK_CLOSE, true));
        let (out, close, _) = run(b"GET / HTTP/1.0\r\nConnection: keep-alive\r\n\r\n");
        assert_eq!((out.as_slice(), close), (OK_KEEP_ALIVE_10, false));
    }

    #[test]
    fn bodies_are_skipped() {
        let (out, close, used) =
            run(b"POST / HTTP/1.1\r\nContent-Length: 5\r\n\r\nhelloGET / HTTP/1.1\r\n\r\n");
        assert_eq!(out, [OK_KEEP_ALIVE, OK_KEEP_ALIVE].concat());
        assert!(!close);
        assert_eq!(used, 61);
    }
}
