//! Loopback TCP (`fibra::net`): an echo server (an accept loop and a fiber per connection),
//! clients that check every byte that comes back, connections closed mid-stream by either
//! side, and a `sync::Pool` of connections to the server.
//!
//! A connection starts with a 5-byte header: mode 0 echoes until the client closes; mode 1
//! echoes the number of bytes the header names and then closes the connection, whatever
//! the client still sends (the server's close mid-stream).

use std::io::{ErrorKind, Read, Write};
use std::net::{Shutdown, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use fibra::net::{TcpListener, TcpStream};
use fibra::sync::{ManageConnection, Pool, PoolError};
use fibra::Scheduler;

use crate::acct::{fail, wrap, Op, SchedCounts, Ticket, Tracked, ACCT};
use crate::rng::Rng;
use crate::Round;

const MODE_ECHO: u8 = 0;
const MODE_CLOSE_AFTER: u8 = 1;
/// The pool's size.
const POOL_SIZE: u32 = 4;

/// What a round's actors reach: the server's address and a pool of connections to it.
pub struct Shared {
    pub addr: SocketAddr,
    pub pool: Pool<EchoManager>,
}

/// A running echo server: its accept loop, cancelled at the round's end.
pub struct Server {
    acceptor: Tracked<()>,
    shared: Option<Shared>,
}

impl Server {
    /// Binds a loopback port and starts the accept loop on `sched`.
    pub fn start(sched: &Scheduler, counts: &Arc<SchedCounts>) -> Server {
        let listener = TcpListener::bind("127.0.0.1:0").expect("a loopback listener");
        let addr = listener.local_addr().expect("its address");
        let c = counts.clone();
        let (ticket, stub) = Ticket::new(counts);
        let acceptor = sched
            .task()
            .name("soak-acceptor")
            .submit(wrap(ticket, move || accept_loop(&listener, &c)), None)
            .unwrap_or_else(|e| panic!("the main scheduler refused the accept loop: {e}"));
        let pool = Pool::builder()
            .max_size(POOL_SIZE)
            .min_idle(Some(0))
            .connection_timeout(Duration::from_secs(5))
            .build(EchoManager { addr })
            .expect("a pool that opens no connection yet");
        Server {
            acceptor: Tracked {
                handle: acceptor,
                stub,
            },
            shared: Some(Shared { addr, pool }),
        }
    }

    /// What the round's actors share (once).
    pub fn shared(&mut self) -> Shared {
        self.shared.take().expect("taken once")
    }

    /// Ends the accept loop (a cancel); the connections end as their clients close them.
    pub fn stop(self) {
        self.acceptor.handle.cancel();
        check!(
            self.acceptor.join("the accept loop").is_cancelled(),
            "the accept loop ended otherwise than by its cancel"
        );
    }
}

/// Accepts until cancelled; a fiber per connection.
fn accept_loop(listener: &TcpListener, counts: &Arc<SchedCounts>) {
    let mut rng = Rng::stream(crate::acct::seed(), 1 << 20, 0);
    loop {
        match listener.accept() {
            Ok((conn, _)) => {
                let (ticket, _stub) = Ticket::new(counts);
                let mut crng = rng.fork();
                // Detached: its ticket accounts for it.
                drop(fibra::spawn(wrap(ticket, move || serve(conn, &mut crng))));
            }
            Err(e) => {
                // A connection reset before its accept, or out of descriptors: back off.
                if e.kind() != ErrorKind::ConnectionAborted {
                    eprintln!("soak: accept: {e}");
                }
                fibra::sleep(Duration::from_millis(10));
            }
        }
    }
}

/// One connection: its header, then echo.
fn serve(mut conn: TcpStream, rng: &mut Rng) {
    let mut header = [0u8; 5];
    if conn.read_exact(&mut header).is_err() {
        return;
    }
    let limit = match header[0] {
        MODE_CLOSE_AFTER => u64::from(u32::from_le_bytes(header[1..5].try_into().expect("4"))),
        _ => u64::MAX,
    };
    let mut buf = vec![0u8; rng.range_usize(1, 16 << 10)];
    let mut echoed = 0u64;
    loop {
        let room = (limit - echoed).min(buf.len() as u64) as usize;
        if room == 0 {
            ACCT.server_aborts.inc();
            return; // closed with what the client still sends unread: mid-stream
        }
        let n = match conn.read(&mut buf[..room]) {
            Ok(0) | Err(_) => return,
            Ok(n) => n,
        };
        ACCT.bytes_echoed.add(n as u64);
        if conn.write_all(&buf[..n]).is_err() {
            return;
        }
        echoed += n as u64;
    }
}

/// Opens connections to the echo server for the pool.
pub struct EchoManager {
    addr: SocketAddr,
}

/// A pooled connection; `broken` set by a user makes the pool drop it when it comes back.
pub struct EchoConn {
    stream: TcpStream,
    broken: bool,
    rng: Rng,
}

impl ManageConnection for EchoManager {
    type Connection = EchoConn;
    type Error = std::io::Error;

    fn connect(&self) -> std::io::Result<EchoConn> {
        let mut stream = TcpStream::connect(self.addr)?;
        stream.write_all(&[MODE_ECHO, 0, 0, 0, 0])?;
        ACCT.pool_connects.inc();
        ACCT.tcp_conns.inc();
        let seed = u64::from(self.addr.port()) ^ ACCT.pool_connects.get();
        Ok(EchoConn {
            stream,
            broken: false,
            rng: Rng::stream(crate::acct::seed(), 1 << 21, seed),
        })
    }

    fn is_valid(&self, conn: &mut EchoConn) -> std::io::Result<()> {
        ping(conn)
    }

    fn has_broken(&self, conn: &mut EchoConn) -> bool {
        conn.broken
    }
}

/// A round trip of a few bytes, checked.
fn ping(c: &mut EchoConn) -> std::io::Result<()> {
    let mut out = [0u8; 8];
    c.rng.fill(&mut out);
    let mut back = [0u8; 8];
    ACCT.bytes_written.add(8);
    c.stream.write_all(&out)?;
    c.stream.read_exact(&mut back)?;
    if back != out {
        fail("pool: a ping came back changed".into());
    } else {
        ACCT.bytes_verified.add(8);
    }
    Ok(())
}

pub fn step(r: &Arc<Round>, rng: &mut Rng) -> Op {
    const OPS: [(Op, u32); 3] = [(Op::TcpEcho, 10), (Op::TcpAbort, 6), (Op::Pool, 8)];
    let op = OPS[rng.weighted(&OPS.map(|o| o.1))].0;
    match op {
        Op::TcpEcho => echo(r.net.addr, rng),
        Op::TcpAbort => abort(r.net.addr, rng),
        _ => pool(&r.net.pool, rng),
    }
    op
}

/// Connects, one way or the other; a failure fails the run (the server listens all round).
fn connect(addr: SocketAddr, mode: u8, limit: u32, rng: &mut Rng) -> Option<TcpStream> {
    let conn = if rng.chance(50) {
        TcpStream::connect(addr)
    } else {
        TcpStream::connect_timeout(&addr, Duration::from_secs(30))
    };
    let mut conn = match conn {
        Ok(c) => c,
        Err(e) => {
            fail(format!("tcp: connect to the echo server: {e}"));
            return None;
        }
    };
    ACCT.tcp_conns.inc();
    if rng.chance(50) {
        let _ = conn.set_nodelay(true);
    }
    let mut header = [mode, 0, 0, 0, 0];
    header[1..5].copy_from_slice(&limit.to_le_bytes());
    if let Err(e) = conn.write_all(&header) {
        fail(format!("tcp: writing a header: {e}"));
        return None;
    }
    Some(conn)
}

/// Random bytes to send.
fn payload(rng: &mut Rng, max: usize) -> Vec<u8> {
    let mut v = vec![0u8; rng.range_usize(1, max)];
    rng.fill(&mut v);
    v
}

/// A clean connection: every byte comes back, then the server closes after the client's
/// shutdown.
fn echo(addr: SocketAddr, rng: &mut Rng) {
    let Some(mut conn) = connect(addr, MODE_ECHO, 0, rng) else {
        return;
    };
    for _ in 0..rng.range(1, 4) {
        let out = payload(rng, 32 << 10);
        let mut back = vec![0u8; out.len()];
        ACCT.bytes_written.add(out.len() as u64);
        if let Err(e) = conn.write_all(&out) {
            return fail(format!("tcp echo: write: {e}"));
        }
        if let Err(e) = conn.read_exact(&mut back) {
            return fail(format!("tcp echo: read: {e}"));
        }
        if back != out {
            return fail(format!("tcp echo: {} bytes came back changed", out.len()));
        }
        ACCT.bytes_verified.add(out.len() as u64);
    }
    if rng.chance(50) {
        if let Err(e) = conn.shutdown(Shutdown::Write) {
            return fail(format!("tcp echo: shutdown: {e}"));
        }
        let mut byte = [0u8; 1];
        match conn.read(&mut byte) {
            Ok(0) => {}
            Ok(_) => fail("tcp echo: a byte after everything came back".into()),
            Err(e) => fail(format!("tcp echo: the server's close: {e}")),
        }
    }
}

/// A connection closed mid-stream, by the client (with echoed bytes unread) or by the
/// server (with sent bytes unread): what came back is a prefix of what was sent.
fn abort(addr: SocketAddr, rng: &mut Rng) {
    let out = payload(rng, 32 << 10);
    if rng.chance(50) {
        ACCT.client_aborts.inc();
        let Some(mut conn) = connect(addr, MODE_ECHO, 0, rng) else {
            return;
        };
        ACCT.bytes_written.add(out.len() as u64);
        if let Err(e) = conn.write_all(&out) {
            return fail(format!("tcp abort: write: {e}"));
        }
        let k = rng.range_usize(0, out.len());
        let mut back = vec![0u8; k];
        if let Err(e) = conn.read_exact(&mut back) {
            return fail(format!("tcp abort: read: {e}"));
        }
        check!(back == out[..k], "tcp abort: a prefix came back changed");
        ACCT.bytes_verified.add(k as u64);
        if rng.chance(30) {
            let _ = conn.shutdown(Shutdown::Both);
        }
        drop(conn); // with the rest unread
    } else {
        let limit = rng.range(0, out.len() as u64) as u32;
        let Some(mut conn) = connect(addr, MODE_CLOSE_AFTER, limit, rng) else {
            return;
        };
        ACCT.bytes_written.add(out.len() as u64);
        // The server may close before it has read everything: the write may fail.
        let _ = conn.write_all(&out);
        let mut back = Vec::new();
        let mut buf = [0u8; 4096];
        loop {
            match conn.read(&mut buf) {
                Ok(0) | Err(_) => break,
                Ok(n) => back.extend_from_slice(&buf[..n]),
            }
        }
        check!(
            back.len() <= limit as usize && back == out[..back.len()],
            "tcp abort: the server, closing after {limit} bytes, sent back {} bytes{}",
            back.len(),
            if back.len() <= out.len() && back == out[..back.len()] {
                ""
            } else {
                ", changed"
            }
        );
        ACCT.bytes_verified.add(back.len() as u64);
    }
}

/// A checkout from the pool: a ping, and now and then the connection marked broken.
fn pool(pool: &Pool<EchoManager>, rng: &mut Rng) {
    let conn = if rng.chance(20) {
        pool.try_get()
    } else {
        match pool.get_timeout(Duration::from_secs(10)) {
            Ok(c) => Some(c),
            Err(PoolError::Timeout { last_error }) => {
                // Four connections, held briefly: only a starved machine waits 10 s.
                eprintln!("soak: a pool checkout timed out ({last_error:?})");
                None
            }
            Err(e) => {
                fail(format!("pool: {e}"));
                None
            }
        }
    };
    let Some(mut conn) = conn else {
        return;
    };
    let state = pool.state();
    check!(
        state.connections <= POOL_SIZE && state.idle_connections <= state.connections,
        "pool: {state:?} with a maximum of {POOL_SIZE}"
    );
    if let Err(e) = ping(&mut conn) {
        fail(format!("pool: a ping: {e}"));
        conn.broken = true;
    }
    if rng.chance(10) {
        conn.broken = true;
        ACCT.pool_broken.inc();
    }
}

/// Gives every worker of `sched` its own epoll instance (which it keeps for good) before
/// the baseline of open descriptors is taken: a client fiber pinned to each worker waits
/// there for its echo.
pub fn prime(sched: &Scheduler, counts: &Arc<SchedCounts>) {
    let mut server = Server::start(sched, counts);
    let addr = server.shared().addr;
    let clients: Vec<_> = (0..sched.threads())
        .map(|w| {
            let (ticket, stub) = Ticket::new(counts);
            let mut rng = Rng::stream(crate::acct::seed(), 1 << 22, w as u64);
            let handle = sched
                .submit(wrap(ticket, move || echo(addr, &mut rng)), Some(w))
                .unwrap_or_else(|e| panic!("the main scheduler refused a task: {e}"));
            Tracked { handle, stub }
        })
        .collect();
    for c in clients {
        check!(
            c.join("priming").completed().is_some(),
            "a priming client failed"
        );
    }
    server.stop();
}
