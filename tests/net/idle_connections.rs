//! 10 000 idle TCP connections held open by 10 000 fibers on 2 workers, then all answered.
//!
//! The clients live in a child process (this test binary re-run with `FIBRA_IDLE_CLIENTS`
//! set), so that each process needs only ~10 000 file descriptors: a common hard limit is
//! 20 000, too few for both ends of 10 000 connections in one process.

use std::io::{self, BufRead, BufReader, Read, Write};
use std::net::SocketAddr;
use std::os::fd::AsRawFd;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::common::{wait_until, with_deadline};
use fibra::net::TcpListener;

const CONNECTIONS: usize = 10_000;
/// Descriptors beyond the connections: std, the test harness, epoll, eventfd, pipes.
const SPARE_FDS: u64 = 200;
const CLIENT_ENV: &str = "FIBRA_IDLE_CLIENTS";
const TEST_NAME: &str = "ten_thousand_idle_connections_on_two_workers_then_all_answered";

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

/// The child's part: open every connection, report, wait for "go", then send one byte on
/// each and read its answer.
fn clients(addr: SocketAddr) {
    raise_fd_limit(CONNECTIONS as u64 + SPARE_FDS).expect("client fd limit");
    let mut conns = Vec::with_capacity(CONNECTIONS);
    for i in 0..CONNECTIONS {
        let s =
            std::net::TcpStream::connect(addr).unwrap_or_else(|e| panic!("connection {i}: {e}"));
        s.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
        conns.push(s);
    }
    println!("connected {}", conns.len());
    let mut line = String::new();
    io::stdin().read_line(&mut line).expect("read go");
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
    println!("answered {answered}");
}

#[test]
fn ten_thousand_idle_connections_on_two_workers_then_all_answered() {
    if let Ok(addr) = std::env::var(CLIENT_ENV) {
        clients(addr.parse().expect("address"));
        return;
    }
    if let Err(why) = raise_fd_limit(CONNECTIONS as u64 + SPARE_FDS) {
        println!("skipped: {why}");
        return;
    }
    with_deadline(|| {
        let sched = Arc::new(
            fibra::Scheduler::builder()
                .threads(2)
                .name("idle")
                .stack_size(fibra::MIN_STACK_SIZE)
                .build()
                .expect("build"),
        );
        sched.start();
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
        // A deep accept queue: on a loaded machine the acceptor's worker can be preempted for
        // milliseconds while the client connects on, and a SYN refused by a full queue is
        // retried only a second later.
        // SAFETY: re-listening on a valid listening socket only changes its backlog.
        assert_eq!(unsafe { libc::listen(listener.as_raw_fd(), 4096) }, 0);
        let addr = listener.local_addr().unwrap();
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

        let mut child = Command::new(std::env::current_exe().expect("test binary"))
            .args([TEST_NAME, "--nocapture", "--test-threads=1"])
            .env(CLIENT_ENV, addr.to_string())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("start the client process");
        let mut out = BufReader::new(child.stdout.take().unwrap());
        let mut line = String::new();
        let start = Instant::now();
        loop {
            line.clear();
            assert_ne!(
                out.read_line(&mut line).expect("child output"),
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
        println!("{CONNECTIONS} connections open after {:?}", start.elapsed());

        writeln!(child.stdin.as_mut().unwrap(), "go").expect("tell the client");
        let mut rest = String::new();
        out.read_to_string(&mut rest).expect("child output");
        let status = child.wait().expect("client process");
        assert!(status.success(), "client process failed: {status}");
        assert!(
            rest.contains(&format!("answered {CONNECTIONS}")),
            "client said: {rest}"
        );
        wait_until("every fiber answered", || {
            answered.load(Ordering::SeqCst) == CONNECTIONS
        });
        // The clients have exited: every fiber sees end-of-file and finishes.
        sched.stop();
    });
}
