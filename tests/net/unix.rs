//! `fibra::net::unix`: stream and datagram round trips over filesystem paths, abstract names
//! and socket pairs; timeouts; shutdown waking a blocked reader (of a stream and of a
//! datagram socket); a full datagram queue —
//! each case with fibers and again with plain threads.

use std::io::{self, Read, Write};
use std::net::Shutdown;
use std::os::linux::net::SocketAddrExt;
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::common::child_ok;
use crate::util::{fibers_and_threads, Actors};
use fibra::net::unix::{UnixDatagram, UnixListener, UnixStream};

/// A fresh, empty directory for socket files, unique per call.
fn scratch_dir(what: &str) -> PathBuf {
    static N: AtomicUsize = AtomicUsize::new(0);
    let dir = std::env::temp_dir().join(format!(
        "fibra-net-unix-{}-{what}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    ));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("create scratch dir");
    dir
}

const CLIENTS: usize = 50;
const MESSAGES: usize = 50;

fn stream_round_trip(actors: &Actors) {
    let dir = scratch_dir("stream");
    let path = dir.join("echo.sock");
    let listener = UnixListener::bind(&path).expect("bind");
    assert_eq!(
        listener.local_addr().unwrap().as_pathname(),
        Some(path.as_path())
    );
    let spawner = actors.clone();
    let server = actors.spawn(move || {
        let mut conns = Vec::new();
        for conn in listener.incoming().take(CLIENTS) {
            let mut conn = conn.expect("accept");
            conns.push(spawner.spawn(move || {
                let mut buf = [0u8; 1024];
                loop {
                    match conn.read(&mut buf) {
                        Ok(0) | Err(_) => return,
                        Ok(n) => conn.write_all(&buf[..n]).expect("echo"),
                    }
                }
            }));
        }
        for c in conns {
            c.join();
        }
    });
    let clients: Vec<_> = (0..CLIENTS)
        .map(|c| {
            let path = path.clone();
            actors.spawn(move || {
                let mut s = UnixStream::connect(&path).expect("connect");
                assert_eq!(s.peer_addr().unwrap().as_pathname(), Some(path.as_path()));
                for m in 0..MESSAGES {
                    let msg = format!("unix client {c} message {m}\n");
                    s.write_all(msg.as_bytes()).unwrap();
                    let mut back = vec![0u8; msg.len()];
                    s.read_exact(&mut back).unwrap();
                    assert_eq!(back, msg.as_bytes());
                }
            })
        })
        .collect();
    for c in clients {
        c.join();
    }
    server.join();
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn unix_stream_echo_round_trips() {
    fibers_and_threads(1, stream_round_trip);
}

fn abstract_and_pair(actors: &Actors) {
    let name = format!("fibra-test-{}-{:?}", std::process::id(), Instant::now());
    let addr = std::os::unix::net::SocketAddr::from_abstract_name(name.as_bytes()).unwrap();
    let listener = UnixListener::bind_addr(&addr).expect("bind abstract");
    let acceptor = actors.spawn(move || {
        let (mut s, _) = listener.accept().expect("accept");
        s.write_all(b"abstract").unwrap();
    });
    let mut s = UnixStream::connect_addr(&addr).expect("connect abstract");
    let mut got = String::new();
    s.read_to_string(&mut got).unwrap();
    assert_eq!(got, "abstract");
    acceptor.join();

    let (a, b) = UnixStream::pair().expect("pair");
    let b = Arc::new(b);
    let b2 = b.clone();
    let reader = actors.spawn(move || {
        let mut buf = [0u8; 4];
        (&*b2).read_exact(&mut buf).unwrap();
        buf
    });
    (&a).write_all(b"pair").unwrap();
    assert_eq!(&reader.join(), b"pair");
    let mut buf = [0u8; 4];
    (&a).write_all(b"peek").unwrap();
    assert_eq!(b.peek(&mut buf).unwrap(), 4);
    (&*b).read_exact(&mut buf).unwrap();
    assert_eq!(&buf, b"peek");
    let c = a.try_clone().unwrap();
    c.set_read_timeout(Some(Duration::from_secs(3))).unwrap();
    assert_eq!(a.read_timeout().unwrap(), Some(Duration::from_secs(3)));
    assert!(format!("{a:?}").contains("UnixStream"));
}

#[test]
fn unix_abstract_names_pairs_peek_and_clones() {
    fibers_and_threads(1, abstract_and_pair);
}

fn stream_timeout_and_shutdown(actors: &Actors) {
    let (a, b) = UnixStream::pair().expect("pair");
    let timeout = Duration::from_millis(120);
    a.set_read_timeout(Some(timeout)).unwrap();
    let start = Instant::now();
    let err = (&a).read(&mut [0u8; 8]).expect_err("nothing sent");
    assert!(
        matches!(
            err.kind(),
            io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
        ),
        "{err:?}"
    );
    assert!(start.elapsed() >= timeout);
    a.set_read_timeout(None).unwrap();
    let a = Arc::new(a);
    let a2 = a.clone();
    let reader = actors.spawn(move || (&*a2).read(&mut [0u8; 8]).map_err(|e| e.kind()));
    fibra::sleep(Duration::from_millis(50));
    a.shutdown(Shutdown::Read).expect("shutdown");
    assert_eq!(reader.join(), Ok(0));

    // The peer closing wakes a blocked reader of the other end too.
    let a3 = a.clone();
    let (c, d) = UnixStream::pair().unwrap();
    let reader = actors.spawn(move || {
        let mut got = Vec::new();
        (&d).read_to_end(&mut got)
            .map(|_| got)
            .map_err(|e| e.kind())
    });
    fibra::sleep(Duration::from_millis(50));
    (&c).write_all(b"bye").unwrap();
    drop(c);
    assert_eq!(reader.join(), Ok(b"bye".to_vec()));
    drop((a3, b));
}

#[test]
fn unix_stream_timeout_and_shutdown_wake() {
    fibers_and_threads(1, stream_timeout_and_shutdown);
}

/// A datagram socket's receive side shut down: its receives return nothing at once, as std's
/// blocking ones do, and a receiver parked before the shutdown (made here or, on the raw fd,
/// by another thread) wakes with it. (Its non-blocking receive still says `WouldBlock`: a
/// retry loop that only waited for readiness again would wait for ever.)
fn datagram_shutdown(actors: &Actors) {
    let (a, _b) = UnixDatagram::pair().expect("pair");
    a.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    a.shutdown(Shutdown::Read).expect("shutdown");
    let start = Instant::now();
    let mut buf = [0u8; 8];
    assert_eq!(a.recv(&mut buf).map_err(|e| e.kind()), Ok(0));
    assert_eq!(a.peek(&mut buf).map_err(|e| e.kind()), Ok(0));
    let (n, from) = a.recv_from(&mut buf).expect("recv_from");
    assert_eq!((n, from.is_unnamed()), (0, true));
    assert!(
        start.elapsed() < Duration::from_secs(10),
        "{:?}",
        start.elapsed()
    );

    for raw in [false, true] {
        let (c, _d) = UnixDatagram::pair().expect("pair");
        let c = Arc::new(c);
        let c2 = c.clone();
        let reader = actors.spawn(move || c2.recv(&mut [0u8; 8]).map_err(|e| e.kind()));
        fibra::sleep(Duration::from_millis(50));
        if raw {
            let fd = std::os::fd::AsRawFd::as_raw_fd(&*c);
            std::thread::spawn(move || {
                // SAFETY: shutting down a socket `c` keeps open until the reader is joined.
                assert_eq!(unsafe { libc::shutdown(fd, libc::SHUT_RD) }, 0);
            })
            .join()
            .unwrap();
        } else {
            c.shutdown(Shutdown::Read).expect("shutdown");
        }
        assert_eq!(reader.join(), Ok(0), "shut down by a raw call: {raw}");
    }
}

#[test]
fn unix_datagram_shut_down_receives_nothing_at_once() {
    fibers_and_threads(1, datagram_shutdown);
}

/// The same on plain threads in a process that never ran a scheduler, so no poller reports
/// the shutdown: the waiting thread's own `poll` must say it.
#[test]
fn unix_datagram_shut_down_by_a_raw_call_wakes_a_thread_with_no_scheduler_around() {
    child_ok(|| {
        let (c, _d) = UnixDatagram::pair().expect("pair");
        let c = Arc::new(c);
        let c2 = c.clone();
        let reader = std::thread::spawn(move || c2.recv(&mut [0u8; 8]).map_err(|e| e.kind()));
        std::thread::sleep(Duration::from_millis(100));
        // SAFETY: shutting down a socket `c` keeps open.
        assert_eq!(
            unsafe { libc::shutdown(std::os::fd::AsRawFd::as_raw_fd(&*c), libc::SHUT_RD) },
            0
        );
        let start = Instant::now();
        while !reader.is_finished() && start.elapsed() < Duration::from_secs(20) {
            std::thread::sleep(Duration::from_millis(10));
        }
        assert!(
            reader.is_finished(),
            "the reader still waits 20 s after the shutdown"
        );
        assert_eq!(reader.join().unwrap(), Ok(0));
    });
}

fn datagram_round_trip(actors: &Actors) {
    let dir = scratch_dir("dgram");
    let server_path = dir.join("server.sock");
    let client_path = dir.join("client.sock");
    let server = UnixDatagram::bind(&server_path).expect("bind");
    let echo = actors.spawn(move || {
        let mut buf = [0u8; 256];
        for _ in 0..100 {
            let (n, from) = server.recv_from(&mut buf).expect("recv_from");
            let from = from.as_pathname().expect("bound client").to_owned();
            server.send_to(&buf[..n], from).expect("send_to");
        }
    });
    let client = UnixDatagram::bind(&client_path).expect("bind");
    client.connect(&server_path).expect("connect");
    assert_eq!(
        client.peer_addr().unwrap().as_pathname(),
        Some(server_path.as_path())
    );
    let mut buf = [0u8; 256];
    for i in 0..100 {
        let msg = format!("unix datagram {i}");
        client.send(msg.as_bytes()).expect("send");
        let n = client.peek(&mut buf).expect("peek");
        assert_eq!(&buf[..n], msg.as_bytes());
        let (n, from) = client.recv_from(&mut buf).expect("recv_from");
        assert_eq!(&buf[..n], msg.as_bytes());
        assert_eq!(from.as_pathname(), Some(server_path.as_path()));
    }
    echo.join();

    let (a, b) = UnixDatagram::pair().expect("pair");
    let receiver = actors.spawn(move || {
        let mut buf = [0u8; 16];
        let n = b.recv(&mut buf).unwrap();
        buf[..n].to_vec()
    });
    fibra::sleep(Duration::from_millis(20));
    a.send(b"paired").unwrap();
    assert_eq!(receiver.join(), b"paired");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn unix_datagram_round_trips() {
    fibers_and_threads(1, datagram_round_trip);
}

fn datagram_full_queue(actors: &Actors) {
    let dir = scratch_dir("full");
    let path = dir.join("slow.sock");
    let receiver = UnixDatagram::bind(&path).expect("bind");
    let sender = UnixDatagram::unbound().expect("unbound");
    // Fill the receiver's queue: the write timeout ends the retries with WouldBlock.
    let timeout = Duration::from_millis(100);
    sender.set_write_timeout(Some(timeout)).unwrap();
    let mut queued = 0;
    let waited = loop {
        let start = Instant::now();
        match sender.send_to(&[1u8; 64], &path) {
            Ok(_) => queued += 1,
            Err(e) => {
                assert!(
                    matches!(
                        e.kind(),
                        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                    ),
                    "{e:?}"
                );
                break start.elapsed();
            }
        }
        assert!(queued < 1_000_000, "the queue never filled");
    };
    assert!(waited >= timeout, "{waited:?}");
    // Without a timeout the send waits until the receiver makes room.
    sender.set_write_timeout(None).unwrap();
    let blocked = actors.spawn(move || sender.send_to(b"last", &path).map_err(|e| e.kind()));
    fibra::sleep(Duration::from_millis(50));
    let mut buf = [0u8; 64];
    for _ in 0..queued {
        assert_eq!(receiver.recv(&mut buf).unwrap(), 64);
    }
    assert_eq!(blocked.join(), Ok(4));
    assert_eq!(receiver.recv(&mut buf).unwrap(), 4);
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn unix_datagram_send_to_a_full_queue_waits_for_room() {
    fibers_and_threads(1, datagram_full_queue);
}
