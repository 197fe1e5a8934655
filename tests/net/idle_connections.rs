//! 10 000 idle TCP connections held open by 10 000 fibers on 2 workers, then all answered.
//!
//! The test runs in a child process (`in_child`), and its clients in a process forked from
//! that one before its scheduler starts, so that each process needs only ~10 000 file
//! descriptors: a common hard limit is 20 000, too few for both ends of 10 000 connections
//! in one process. The two talk over a socket pair: the clients say when every connection is
//! open, wait for "go", then send one byte on each, read its answer and say how many came.

use std::io::{self, BufRead, BufReader, Read, Write};
use std::net::SocketAddr;
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::common::{child_runs, describe, in_child, wait_child, wait_until, with_deadline, LIMIT};
use fibra::net::TcpListener;

const CONNECTIONS: usize = 10_000;
/// Descriptors beyond the connections: std, the test harness, epoll, eventfd, pipes.
const SPARE_FDS: u64 = 200;

/// Raises the soft descriptor limit to what is needed, up to the hard limit.
fn raise_fd_limit(needed: u64) -> Result<(), String> {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: `lim` is a valid rlimit for getrlimit to fill.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) } != 0 {
        return Err(format!("getrlimit: {}", io::Error::last_os_error()));
    }
    if lim.rlim_cur >= needed {
        return Ok(());
    }
    if lim.rlim_max < needed {
        return Err(format!(
            "RLIMIT_NOFILE hard limit is {}, {needed} descriptors are needed",
            lim.rlim_max
        ));
    }
    lim.rlim_cur = needed;
    // SAFETY: as above; raising the soft limit up to the hard one needs no privilege.
    if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &lim) } != 0 {
        return Err(format!("setrlimit: {}", io::Error::last_os_error()));
    }
    Ok(())
}

/// The forked clients' part: open every connection, say so on `ctl`, wait for "go", then
/// send one byte on each, read its answer and say how many came.
fn clients(addr: SocketAddr, ctl: UnixStream) {
    let mut conns = Vec::with_capacity(CONNECTIONS);
    for i in 0..CONNECTIONS {
        let s =
            std::net::TcpStream::connect(addr).unwrap_or_else(|e| panic!("connection {i}: {e}"));
        s.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
        conns.push(s);
    }
    writeln!(&ctl, "connected {}", conns.len()).expect("report the connections");
    let mut line = String::new();
    BufReader::new(&ctl).read_line(&mut line).expect("read go");
    assert_eq!(line.trim(), "go");
    for s in &mut conns {
        s.write_all(b"?").expect("request");
    }
    let mut answered = 0;
    for s in &mut conns {
        let mut b = [0u8; 1];
        s.read_exact(&mut b).expect("answer");
        assert_eq!(&b, b"!");
        answered += 1;
    }
    writeln!(&ctl, "answered {answered}").expect("report the answers");
}

#[test]
fn ten_thousand_idle_connections_on_two_workers_then_all_answered() {
    let run = in_child(|| {
        if let Err(why) = raise_fd_limit(CONNECTIONS as u64 + SPARE_FDS) {
            eprintln!("skipped: {why}");
            return;
        }
        with_deadline(serve_idle_connections);
    });
    if let Some(skipped) = run.stderr.lines().find(|l| l.starts_with("skipped: ")) {
        println!("{skipped}");
    }
    run.assert_ok("10 000 idle connections were not all held, then answered");
}

/// The server's part, in the child process: forks the clients, then accepts every
/// connection into a fiber of its own, checks that all are held open and idle, and tells the
/// clients to go.
fn serve_idle_connections() {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
    // A deep accept queue: on a loaded machine the acceptor's worker can be preempted for
    // milliseconds while the client connects on, and a SYN refused by a full queue is
    // retried only a second later.
    // SAFETY: re-listening on a valid listening socket only changes its backlog.
    assert_eq!(unsafe { libc::listen(listener.as_raw_fd(), 4096) }, 0);
    let addr = listener.local_addr().unwrap();
    let (ctl, client_ctl) = UnixStream::pair().expect("control socket pair");
    // SAFETY: no scheduler runs yet: the other threads of this child process (the test
    // harness's and `with_deadline`'s callers) only wait, holding no lock; the forked process
    // runs `clients` and exits.
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0, "fork: {}", io::Error::last_os_error());
    if pid == 0 {
        drop(ctl);
        child_runs(move || clients(addr, client_ctl));
    }
    drop(client_ctl);

    let sched = Arc::new(
        fibra::Scheduler::builder()
            .threads(2)
            .name("idle")
            .stack_size(fibra::MIN_STACK_SIZE)
            .build()
            .expect("build"),
    );
    sched.start();
    let accepted = Arc::new(AtomicUsize::new(0));
    let answered = Arc::new(AtomicUsize::new(0));
    let (s, acc, ans) = (sched.clone(), accepted.clone(), answered.clone());
    let acceptor = sched
        .submit(
            move || {
                for i in 0..CONNECTIONS {
                    let (mut conn, _) = listener.accept().expect("accept");
                    acc.fetch_add(1, Ordering::SeqCst);
                    let ans = ans.clone();
                    s.submit(
                        move || {
                            let mut b = [0u8; 1];
                            conn.read_exact(&mut b).expect("request");
                            conn.write_all(b"!").expect("answer");
                            ans.fetch_add(1, Ordering::SeqCst);
                            // Hold the connection until the client closes it.
                            let _ = conn.read(&mut b);
                        },
                        Some(i % 2),
                    )
                    .expect("submit");
                }
            },
            None,
        )
        .expect("submit");

    let mut out = BufReader::new(&ctl);
    let mut line = String::new();
    let start = Instant::now();
    loop {
        line.clear();
        assert_ne!(
            out.read_line(&mut line).expect("the clients' report"),
            0,
            "client process ended early"
        );
        if line.contains("connected") {
            break;
        }
    }
    wait_until("every connection accepted", || {
        accepted.load(Ordering::SeqCst) == CONNECTIONS
    });
    crate::common::finish(acceptor);
    // All held open and idle: nobody has been answered yet.
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(answered.load(Ordering::SeqCst), 0);
    eprintln!("{CONNECTIONS} connections open after {:?}", start.elapsed());

    writeln!(&ctl, "go").expect("tell the clients");
    let mut rest = String::new();
    out.read_to_string(&mut rest).expect("the clients' report");
    let status = describe(wait_child(pid, LIMIT));
    assert_eq!(status, "ok", "client process failed");
    assert!(
        rest.contains(&format!("answered {CONNECTIONS}")),
        "client said: {rest}"
    );
    wait_until("every fiber answered", || {
        answered.load(Ordering::SeqCst) == CONNECTIONS
    });
    // The clients have exited: every fiber sees end-of-file and finishes.
    sched.stop();
}
