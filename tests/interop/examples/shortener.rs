//! A URL shortener written for threads — `std::net`, the synchronous `redis` client, a
//! connection pool — served two ways: a fiber per connection on a few workers with the
//! `hook` feature (`--mode fibers`), or an OS thread per connection (`--mode threads`). The
//! code that serves a connection is the same; so is the pool, `fibra::sync::Pool`, whose
//! wait parks a fiber and blocks a thread.
//!
//! ```sh
//! redis-server --port 6391 --save "" --appendonly no &
//! cargo run --release -p fibra-interop --example shortener --features hook -- \
//!     --mode fibers --threads 2 --port 8090 --redis-port 6391
//! curl -X POST 'http://127.0.0.1:8090/shorten?url=https://example.com/'   # → 2
//! curl -i http://127.0.0.1:8090/s/2                                       # → 302
//! cargo run -p fibra-interop --example shortener --features hook -- --selftest  # its own redis-server
//! wrk -t1 -c100 -d5s --latency http://127.0.0.1:8090/s/1
//! ```
//!
//! Routes: `POST /shorten?url=U` stores `U` under a new id (`INCR`, `SET`) and answers the
//! id; `GET /s/ID` answers a redirect to the stored URL and counts the hit (`GET`, `INCR`),
//! or 404; `GET /hits/ID` answers the count. At start the server stores
//! `https://example.com/first` as id 1. HTTP/1.1 with keep-alive; a malformed request
//! closes its connection. A shared `std::sync::Mutex<redis::Connection>` in place of the
//! pool would freeze a worker (see the README's "Shared state in blocking code").

use std::io::{BufRead, BufReader, Write};
use std::net::{TcpListener, TcpStream};
use std::time::Duration;

use redis::Commands;

#[path = "../tests/interop/redis_manager.rs"]
mod redis_manager;
use redis_manager::RedisManager as Redis;

type Pool = fibra::sync::Pool<Redis>;

struct Options {
    fibers: bool,
    threads: usize,
    port: u16,
    redis_port: u16,
    pool: u32,
    selftest: bool,
}

fn options() -> Result<Options, String> {
    let mut o = Options {
        fibers: true,
        threads: 2,
        port: 8090,
        redis_port: 6379,
        pool: 8,
        selftest: false,
    };
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        let mut value = |name: &str| args.next().ok_or_else(|| format!("{name} needs a value"));
        let number = |name: &str, v: String| v.parse::<u32>().map_err(|e| format!("{name}: {e}"));
        match arg.as_str() {
            "--mode" => {
                o.fibers = match value("--mode")?.as_str() {
                    "fibers" => true,
                    "threads" => false,
                    m => return Err(format!("--mode: fibers or threads, not {m}")),
                }
            }
            "--threads" => o.threads = number("--threads", value("--threads")?)? as usize,
            "--port" => o.port = number("--port", value("--port")?)? as u16,
            "--redis-port" => o.redis_port = number("--redis-port", value("--redis-port")?)? as u16,
            "--pool" => o.pool = number("--pool", value("--pool")?)?,
            "--selftest" => o.selftest = true,
            other => return Err(format!("unknown option {other}")),
        }
    }
    Ok(o)
}

fn main() {
    let mut o = options().unwrap_or_else(|e| {
        eprintln!("shortener: {e}");
        std::process::exit(2)
    });
    // The selftest brings its own redis-server, on a free port.
    let _redis = o.selftest.then(|| {
        let (child, port) = redis_server();
        o.redis_port = port;
        KillOnDrop(child)
    });
    let client = redis::Client::open(format!("redis://127.0.0.1:{}/", o.redis_port))
        .expect("a valid redis URL");
    let pool = Pool::builder()
        .max_size(o.pool)
        .connection_timeout(Duration::from_secs(3))
        .test_on_check_out(false)
        .build(Redis(client))
        .unwrap_or_else(|e| {
            eprintln!("shortener: redis at port {}: {e}", o.redis_port);
            std::process::exit(1)
        });
    {
        let mut con = pool.get().expect("a connection");
        let _: () = con.set("url:1", "https://example.com/first").unwrap();
        let _: () = con.set_nx("next_id", 1).unwrap();
    }
    if o.selftest {
        for fibers in [true, false] {
            let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
            let addr = listener.local_addr().unwrap();
            let sched = start(fibers, o.threads, listener, pool.clone());
            selftest(addr);
            if let Some(sched) = sched {
                // Cancels the accept loop and the connections' fibers, which end.
                sched.stop_timeout(Duration::from_millis(100));
            }
        }
        println!("shortener: selftest passed, a fiber per connection and a thread per connection");
        return;
    }
    let listener = TcpListener::bind(("127.0.0.1", o.port)).expect("bind");
    println!(
        "shortener: {} on 127.0.0.1:{}, {} redis connections",
        if o.fibers {
            format!("a fiber per connection on {} workers", o.threads)
        } else {
            "a thread per connection".to_string()
        },
        o.port,
        o.pool
    );
    let _sched = start(o.fibers, o.threads, listener, pool);
    loop {
        std::thread::park();
    }
}

/// A child process killed when this is dropped.
struct KillOnDrop(std::process::Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Starts `redis-server` on a free loopback port, without persistence, and waits until it
/// accepts connections.
fn redis_server() -> (std::process::Child, u16) {
    let port = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let port_arg = port.to_string();
    let args = [
        "--port",
        &port_arg,
        "--bind",
        "127.0.0.1",
        "--save",
        "",
        "--appendonly",
        "no",
    ];
    let child = std::process::Command::new("redis-server")
        .args(args)
        .stdout(std::process::Stdio::null())
        .spawn()
        .unwrap_or_else(|e| {
            eprintln!("shortener: --selftest needs redis-server (Debian's package): {e}");
            std::process::exit(1)
        });
    let t = std::time::Instant::now();
    while TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(
            t.elapsed() < Duration::from_secs(10),
            "redis-server did not start"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    (child, port)
}

/// Starts serving `listener` in the background: an accept loop in a fiber of a scheduler
/// with `threads` workers (returned) that spawns a fiber per connection, or on a thread
/// that starts a thread per connection.
fn start(
    fibers: bool,
    threads: usize,
    listener: TcpListener,
    pool: Pool,
) -> Option<fibra::Scheduler> {
    if fibers {
        let sched = fibra::Scheduler::builder()
            .threads(threads)
            .build()
            .expect("scheduler");
        sched.start();
        // The accept loop is a fiber too: its hooked accept parks it.
        drop(sched.spawn(move || serve(listener, pool, |f| drop(fibra::spawn(f)))));
        Some(sched)
    } else {
        std::thread::spawn(move || serve(listener, pool, |f| drop(std::thread::spawn(f))));
        None
    }
}

/// Checks the routes, then 50 clients × 20 keep-alive redirects and their hit count.
fn selftest(addr: std::net::SocketAddr) {
    let ask = |con: &mut BufReader<TcpStream>, req: &str| -> (String, String) {
        con.get_mut().write_all(req.as_bytes()).unwrap();
        let (mut status, mut len, mut location) = (String::new(), 0, String::new());
        con.read_line(&mut status).unwrap();
        loop {
            let mut h = String::new();
            con.read_line(&mut h).unwrap();
            if h == "\r\n" {
                break;
            }
            if let Some(v) = h.strip_prefix("Content-Length: ") {
                len = v.trim().parse().unwrap();
            }
            if let Some(v) = h.strip_prefix("Location: ") {
                location = v.trim().to_string();
            }
        }
        let mut body = vec![0u8; len];
        std::io::Read::read_exact(con, &mut body).unwrap();
        let body = String::from_utf8(body).unwrap();
        (
            status.trim().to_string(),
            if location.is_empty() { body } else { location },
        )
    };
    let connect = move || BufReader::new(TcpStream::connect(addr).unwrap());
    let mut con = connect();
    let (status, id) = ask(
        &mut con,
        "POST /shorten?url=https://example.org/x HTTP/1.1\r\n\r\n",
    );
    assert_eq!(status, "HTTP/1.1 200 OK");
    let id = id.trim().to_string();
    let redirect = ask(&mut con, &format!("GET /s/{id} HTTP/1.1\r\n\r\n"));
    assert_eq!(
        redirect,
        ("HTTP/1.1 302 Found".into(), "https://example.org/x".into())
    );
    let missing = ask(&mut con, "GET /s/none HTTP/1.1\r\n\r\n");
    assert_eq!(missing.0, "HTTP/1.1 404 Not Found");
    let hits = |con: &mut BufReader<TcpStream>| -> u64 {
        ask(con, "GET /hits/1 HTTP/1.1\r\n\r\n")
            .1
            .trim()
            .parse()
            .unwrap()
    };
    let before = hits(&mut con);
    let clients: Vec<_> = (0..50)
        .map(|_| {
            std::thread::spawn(move || {
                let mut con = connect();
                for _ in 0..20 {
                    let (status, to) = ask(&mut con, "GET /s/1 HTTP/1.1\r\n\r\n");
                    assert_eq!(
                        (status.as_str(), to.as_str()),
                        ("HTTP/1.1 302 Found", "https://example.com/first")
                    );
                }
            })
        })
        .collect();
    for c in clients {
        c.join().unwrap();
    }
    assert_eq!(hits(&mut con), before + 1000);
}

/// Accepts connections, each served by `start(f)`: a fiber or a thread. Ends when the fiber
/// it runs in is cancelled: its hooked accept then fails with `ECANCELED`, and so would
/// every later one.
fn serve(listener: TcpListener, pool: Pool, start: impl Fn(Box<dyn FnOnce() + Send>)) {
    loop {
        match listener.accept() {
            Ok((stream, _)) => {
                let pool = pool.clone();
                start(Box::new(move || {
                    let _ = stream.set_nodelay(true);
                    if let Err(e) = connection(stream, &pool) {
                        use std::io::ErrorKind::{ConnectionReset, UnexpectedEof};
                        if !matches!(e.kind(), UnexpectedEof | ConnectionReset) {
                            eprintln!("shortener: connection: {e}");
                        }
                    }
                }));
            }
            Err(e) if e.raw_os_error() == Some(libc::ECANCELED) => return,
            Err(e) => {
                eprintln!("shortener: accept: {e}");
                std::thread::sleep(Duration::from_millis(10));
            }
        }
    }
}

/// Serves one keep-alive connection until the client closes it.
fn connection(stream: TcpStream, pool: &Pool) -> std::io::Result<()> {
    let mut out = stream.try_clone()?;
    let mut reader = BufReader::new(stream);
    let mut line = String::new();
    loop {
        line.clear();
        if reader.read_line(&mut line)? == 0 {
            return Ok(());
        }
        let mut parts = line.split_whitespace();
        let (method, target) = match (parts.next(), parts.next()) {
            (Some(m), Some(t)) => (m.to_string(), t.to_string()),
            _ => return Err(std::io::Error::other("malformed request line")),
        };
        // Headers up to the blank line; requests have no body.
        let mut header = String::new();
        loop {
            header.clear();
            if reader.read_line(&mut header)? == 0 {
                return Ok(());
            }
            if header == "\r\n" || header == "\n" {
                break;
            }
        }
        let (status, extra, body) = match route(&method, &target, pool) {
            Ok(answer) => answer,
            Err(e) => ("503 Service Unavailable", String::new(), format!("{e}\n")),
        };
        let response = format!(
            "HTTP/1.1 {status}\r\nContent-Length: {}\r\n{extra}\r\n{body}",
            body.len()
        );
        out.write_all(response.as_bytes())?;
    }
}

/// What a request gets: (status, extra header lines, body).
fn route(
    method: &str,
    target: &str,
    pool: &Pool,
) -> Result<(&'static str, String, String), Box<dyn std::error::Error>> {
    let mut con = pool.get()?;
    Ok(match (method, target) {
        ("POST", t) if t.starts_with("/shorten?url=") => {
            let url = &t["/shorten?url=".len()..];
            let id: u64 = con.incr("next_id", 1)?;
            let _: () = con.set(format!("url:{id}"), url)?;
            ("200 OK", String::new(), format!("{id}\n"))
        }
        ("GET", t) if t.starts_with("/s/") => {
            let id = &t[3..];
            match con.get::<_, Option<String>>(format!("url:{id}"))? {
                Some(url) => {
                    let _: u64 = con.incr(format!("hits:{id}"), 1)?;
                    ("302 Found", format!("Location: {url}\r\n"), String::new())
                }
                None => ("404 Not Found", String::new(), String::new()),
            }
        }
        ("GET", t) if t.starts_with("/hits/") => {
            let hits: Option<u64> = con.get(format!("hits:{}", &t[6..]))?;
            ("200 OK", String::new(), format!("{}\n", hits.unwrap_or(0)))
        }
        _ => ("404 Not Found", String::new(), String::new()),
    })
}
