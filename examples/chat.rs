//! A line-based chat server: every line a client sends goes to every connected client.
//!
//! Built from the toolkit: a `broadcast` channel carries the lines, a `JoinSet` holds each
//! connection's two fibers, a `CancellationToken` shuts everything down, and accept errors
//! back off as `TcpListener::accept`'s docs show.
//!
//! ```text
//! cargo run --release --example chat -- [--addr 127.0.0.1:7000] [--threads N]
//! cargo run --release --example chat -- --selftest [--clients 50] [--messages 20]
//! ```
//!
//! Each connection has a reader fiber (socket → channel) and a writer fiber (channel →
//! socket). A client too slow to keep up with the room loses lines rather than slowing the
//! room down: its writer gets `Lagged(n)` from the channel and tells it so. The self-test
//! starts the server on a free port, connects `--clients` clients that each send
//! `--messages` lines and read until they have seen every line of every client, and exits
//! non-zero if any client misses a line or the whole test takes longer than 60 s.

use std::io::{BufRead, BufReader, Write};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use fibra::net::{TcpListener, TcpStream};
use fibra::sync::broadcast::{self, RecvError};
use fibra::sync::CancellationToken;
use fibra::JoinSet;

/// Lines the room keeps for slow readers before they lag.
const BACKLOG: usize = 4096;

struct Options {
    addr: SocketAddr,
    threads: usize,
    selftest: bool,
    clients: usize,
    messages: usize,
}

fn options() -> Options {
    let mut o = Options {
        addr: "127.0.0.1:7000".parse().expect("a valid address"),
        threads: std::thread::available_parallelism().map_or(2, |n| n.get()),
        selftest: false,
        clients: 50,
        messages: 20,
    };
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        let mut value = || args.next().unwrap_or_else(|| panic!("{a} needs a value"));
        match a.as_str() {
            "--addr" => o.addr = value().parse().expect("--addr: an IP:port"),
            "--threads" => o.threads = value().parse().expect("--threads: a number"),
            "--clients" => o.clients = value().parse().expect("--clients: a number"),
            "--messages" => o.messages = value().parse().expect("--messages: a number"),
            "--selftest" => o.selftest = true,
            other => panic!("unknown argument {other}"),
        }
    }
    if o.selftest {
        o.addr = "127.0.0.1:0".parse().expect("a valid address");
    }
    o
}

fn main() {
    let o = options();
    let sched = Arc::new(
        fibra::Scheduler::builder()
            .threads(o.threads)
            .name("chat")
            .build()
            .expect("valid configuration"),
    );
    sched.start();
    let listener = TcpListener::bind(o.addr).expect("bind the chat port");
    let addr = listener
        .local_addr()
        .expect("a bound listener has an address");
    println!("chat server on {addr} with {} workers", o.threads);
    let shutdown = CancellationToken::new();
    let server = {
        let shutdown = shutdown.clone();
        sched.spawn(move || serve(listener, shutdown))
    };
    if !o.selftest {
        let _ = server.join();
        return;
    }
    let ok = selftest(&sched, addr, o.clients, o.messages);
    shutdown.cancel();
    // The acceptor waits in accept: cancel it too.
    server.cancel();
    let _ = server.join();
    sched.stop();
    std::process::exit(if ok { 0 } else { 1 });
}

/// Accepts clients until `shutdown`, each served by a reader and a writer fiber.
fn serve(listener: TcpListener, shutdown: CancellationToken) {
    let (room, _) = broadcast::channel::<Arc<str>>(BACKLOG);
    let mut connections = JoinSet::new();
    let mut delay = Duration::ZERO;
    let mut next_id = 0u64;
    while !shutdown.is_cancelled() {
        match listener.accept() {
            Ok((conn, _)) => {
                delay = Duration::ZERO;
                next_id += 1;
                let id = next_id;
                let (room, inbox) = (room.clone(), room.subscribe());
                let stop = shutdown.child_token();
                let reader_conn = conn.try_clone().expect("clone a connected socket");
                connections.spawn(move || read_lines(id, reader_conn, room, stop));
                connections.spawn(move || write_lines(conn, inbox));
            }
            Err(e)
                if matches!(
                    e.raw_os_error(),
                    Some(libc::EMFILE | libc::ENFILE | libc::ENOBUFS | libc::ENOMEM)
                ) =>
            {
                delay = (delay * 2).clamp(Duration::from_millis(5), Duration::from_secs(1));
                eprintln!("chat: accept: {e}; retrying in {delay:?}");
                fibra::sleep(delay);
            }
            Err(e) => eprintln!("chat: accept: {e}"),
        }
        // Reap finished connections as we go.
        while connections.try_join_next().is_some() {}
    }
}

/// Socket → room, one line at a time, until the client leaves or the server stops.
fn read_lines(
    id: u64,
    conn: TcpStream,
    room: broadcast::Sender<Arc<str>>,
    stop: CancellationToken,
) {
    let mut lines = BufReader::new(conn);
    let mut line = String::new();
    while !stop.is_cancelled() {
        line.clear();
        match lines.read_line(&mut line) {
            Ok(0) | Err(_) => break,
            Ok(_) => {
                let text: Arc<str> = format!("{id}: {}", line.trim_end()).into();
                // Nobody listening is fine: the room is empty.
                let _ = room.send(text);
            }
        }
    }
    let _ = lines.get_ref().shutdown(std::net::Shutdown::Both);
}

/// Room → socket, until the room closes or the client is gone.
fn write_lines(mut conn: TcpStream, mut inbox: broadcast::Receiver<Arc<str>>) {
    loop {
        let out = match inbox.recv() {
            Ok(line) => format!("{line}\n"),
            Err(RecvError::Lagged(n)) => format!("* you missed {n} lines\n"),
            Err(RecvError::Closed) => return,
        };
        if conn.write_all(out.as_bytes()).is_err() {
            return;
        }
    }
}

/// `clients` clients each send `messages` lines and read until they saw all of them.
fn selftest(sched: &fibra::Scheduler, addr: SocketAddr, clients: usize, messages: usize) -> bool {
    let start = Instant::now();
    let deadline = Duration::from_secs(60);
    let all_in = Arc::new(fibra::sync::Barrier::new(clients));
    let mut set = JoinSet::new();
    for c in 0..clients {
        let all_in = all_in.clone();
        set.spawn_on(sched, move || -> Result<usize, String> {
            let conn = TcpStream::connect(addr).map_err(|e| format!("connect: {e}"))?;
            conn.set_read_timeout(Some(deadline))
                .map_err(|e| e.to_string())?;
            // Everybody is connected (and subscribed) before anybody speaks.
            fibra::sleep(Duration::from_millis(50));
            all_in.wait();
            let mut writer = conn.try_clone().map_err(|e| e.to_string())?;
            for m in 0..messages {
                writeln!(writer, "client {c} line {m}").map_err(|e| format!("write: {e}"))?;
            }
            let mut seen = 0;
            let mut lines = BufReader::new(conn);
            let mut line = String::new();
            while seen < clients * messages {
                line.clear();
                match lines.read_line(&mut line) {
                    Ok(0) => return Err(format!("closed after {seen} lines")),
                    Ok(_) if line.starts_with('*') => return Err(line.trim().to_string()),
                    Ok(_) => seen += 1,
                    Err(e) => return Err(format!("read after {seen} lines: {e}")),
                }
            }
            Ok(seen)
        });
    }
    let mut failures = 0;
    while let Some(r) = set.join_next() {
        match r {
            Ok(Ok(_)) => {}
            Ok(Err(e)) => {
                failures += 1;
                eprintln!("chat selftest: a client failed: {e}");
            }
            Err(e) => {
                failures += 1;
                eprintln!("chat selftest: a client panicked: {e}");
            }
        }
    }
    let elapsed = start.elapsed();
    let lines = clients * clients * messages;
    println!(
        "chat selftest: {clients} clients x {messages} lines, {lines} lines delivered in {:.1} ms ({:.0} lines/s), {failures} failures",
        elapsed.as_secs_f64() * 1e3,
        lines as f64 / elapsed.as_secs_f64()
    );
    failures == 0 && elapsed < deadline
}
