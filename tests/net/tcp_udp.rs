//! `fibra::net` over TCP and UDP on 127.0.0.1: many concurrent connections on one worker,
//! timeouts that never end early, refused and reset connections reported as errors, blocked
//! fibers woken by a shutdown, a reader and a writer sharing one socket — each case with
//! fibers and again with plain threads.

use std::io::{self, Read, Write};
use std::net::{Shutdown, SocketAddr};
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::util::{fibers_and_threads, on_fibers, Actors};
use fibra::net::{TcpListener, TcpStream, UdpSocket};

const CLIENTS: usize = 200;
const MESSAGES: usize = 100;

/// Serves `n` connections, one actor each, echoing until the peer closes.
fn echo_server(actors: &Actors, n: usize) -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = listener.local_addr().expect("local_addr");
    let spawner = actors.clone();
    actors.spawn(move || {
        for _ in 0..n {
            let (mut conn, _) = listener.accept().expect("accept");
            spawner.spawn(move || {
                let mut buf = [0u8; 4096];
                loop {
                    match conn.read(&mut buf) {
                        Ok(0) | Err(_) => return,
                        Ok(k) => {
                            if conn.write_all(&buf[..k]).is_err() {
                                return;
                            }
                        }
                    }
                }
            });
        }
    });
    addr
}

fn echo_clients(actors: &Actors) {
    let addr = echo_server(actors, CLIENTS);
    let clients: Vec<_> = (0..CLIENTS)
        .map(|c| {
            actors.spawn(move || {
                let mut s = TcpStream::connect(addr).expect("connect");
                s.set_nodelay(true).expect("nodelay");
                for m in 0..MESSAGES {
                    let msg = format!("client {c:03} message {m:03}\n");
                    s.write_all(msg.as_bytes()).expect("write");
                    let mut back = vec![0u8; msg.len()];
                    s.read_exact(&mut back).expect("read");
                    assert_eq!(back, msg.as_bytes());
                }
                MESSAGES
            })
        })
        .collect();
    let total: usize = clients.into_iter().map(|t| t.join()).sum();
    assert_eq!(total, CLIENTS * MESSAGES);
}

#[test]
fn two_hundred_echo_clients_times_hundred_messages_on_one_worker() {
    fibers_and_threads(1, echo_clients);
}

fn read_timeout(actors: &Actors) {
    let _ = actors;
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
    let mut client = TcpStream::connect(listener.local_addr().unwrap()).expect("connect");
    let (_server, _) = listener.accept().expect("accept");
    let timeout = Duration::from_millis(150);
    client.set_read_timeout(Some(timeout)).unwrap();
    assert_eq!(client.read_timeout().unwrap(), Some(timeout));
    for _ in 0..2 {
        let start = Instant::now();
        let err = client.read(&mut [0u8; 16]).expect_err("nothing was sent");
        let waited = start.elapsed();
        assert!(
            matches!(
                err.kind(),
                io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
            ),
            "{err:?}"
        );
        assert!(
            waited >= timeout,
            "returned after {waited:?}, before {timeout:?}"
        );
        assert!(waited < Duration::from_secs(10), "took {waited:?}");
    }
    assert!(client
        .set_read_timeout(Some(Duration::ZERO))
        .is_err_and(|e| e.kind() == io::ErrorKind::InvalidInput));
}

#[test]
fn read_timeout_is_would_block_and_never_early() {
    fibers_and_threads(1, read_timeout);
}

fn connect_refused(_: &Actors) {
    let addr = {
        let l = TcpListener::bind("127.0.0.1:0").expect("bind");
        l.local_addr().unwrap()
    };
    let err = TcpStream::connect(addr).expect_err("nobody listens");
    assert_eq!(err.kind(), io::ErrorKind::ConnectionRefused, "{err:?}");
    let err = TcpStream::connect_timeout(&addr, Duration::from_secs(10)).expect_err("refused");
    assert_eq!(err.kind(), io::ErrorKind::ConnectionRefused, "{err:?}");
}

#[test]
fn connect_to_a_closed_port_is_refused() {
    fibers_and_threads(1, connect_refused);
}

fn peer_reset(actors: &Actors) {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = listener.local_addr().unwrap();
    let blocked = Arc::new(AtomicBool::new(false));
    let b = blocked.clone();
    let client = actors.spawn(move || {
        let mut s = TcpStream::connect(addr).expect("connect");
        b.store(true, Ordering::SeqCst);
        // Blocks until the reset arrives.
        let first = s.read(&mut [0u8; 16]);
        // After the reset has been reported, writing cannot succeed for long.
        let mut write_failed = false;
        for _ in 0..100 {
            if s.write_all(&[0u8; 1024]).is_err() {
                write_failed = true;
                break;
            }
        }
        (first.map_err(|e| e.kind()), write_failed)
    });
    let (server, _) = listener.accept().expect("accept");
    while !blocked.load(Ordering::SeqCst) {
        fibra::sleep(Duration::from_millis(1));
    }
    fibra::sleep(Duration::from_millis(50));
    crate::common::reset(server);
    let (first, write_failed) = client.join();
    assert_eq!(first, Err(io::ErrorKind::ConnectionReset));
    assert!(write_failed, "writes kept succeeding after a reset");
}

#[test]
fn a_reset_from_the_peer_is_an_error() {
    fibers_and_threads(1, peer_reset);
}

fn shutdown_wakes_reader(actors: &Actors) {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
    let client = Arc::new(TcpStream::connect(listener.local_addr().unwrap()).expect("connect"));
    let (_server, _) = listener.accept().expect("accept");
    let c = client.clone();
    let reader = actors.spawn(move || {
        let start = Instant::now();
        let r = (&*c).read(&mut [0u8; 16]).map_err(|e| e.kind());
        (r, start.elapsed())
    });
    fibra::sleep(Duration::from_millis(100));
    client.shutdown(Shutdown::Both).expect("shutdown");
    let (r, waited) = reader.join();
    assert_eq!(r, Ok(0), "a shut-down socket reads end-of-file");
    assert!(waited < Duration::from_secs(20));
}

#[test]
fn shutdown_wakes_a_blocked_reader_with_eof() {
    fibers_and_threads(1, shutdown_wakes_reader);
}

fn shutdown_wakes_writer(actors: &Actors) {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
    let client = Arc::new(TcpStream::connect(listener.local_addr().unwrap()).expect("connect"));
    // The server never reads: the client's writes fill both buffers and block.
    let (_server, _) = listener.accept().expect("accept");
    let c = client.clone();
    let blocked = Arc::new(AtomicBool::new(false));
    let b = blocked.clone();
    let writer = actors.spawn(move || {
        let chunk = vec![7u8; 64 * 1024];
        let mut written = 0usize;
        loop {
            if written > 512 * 1024 {
                b.store(true, Ordering::SeqCst);
            }
            match (&*c).write(&chunk) {
                Ok(n) => written += n,
                Err(e) => return (e.kind(), written),
            }
            assert!(written < 1 << 30, "a gigabyte written and never blocked");
        }
    });
    while !blocked.load(Ordering::SeqCst) {
        fibra::sleep(Duration::from_millis(1));
    }
    fibra::sleep(Duration::from_millis(100));
    client.shutdown(Shutdown::Write).expect("shutdown");
    let (kind, written) = writer.join();
    assert_eq!(kind, io::ErrorKind::BrokenPipe, "after {written} bytes");
}

#[test]
fn shutdown_wakes_a_blocked_writer_with_an_error() {
    fibers_and_threads(1, shutdown_wakes_writer);
}

fn peer_close_wakes_reader(actors: &Actors) {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = listener.local_addr().unwrap();
    let reader = actors.spawn(move || {
        let mut s = TcpStream::connect(addr).expect("connect");
        let mut got = Vec::new();
        s.read_to_end(&mut got).expect("read_to_end");
        got
    });
    let (mut server, _) = listener.accept().expect("accept");
    fibra::sleep(Duration::from_millis(50));
    server.write_all(b"last words").unwrap();
    drop(server);
    assert_eq!(reader.join(), b"last words");
}

#[test]
fn peer_close_wakes_a_blocked_reader_with_eof() {
    fibers_and_threads(1, peer_close_wakes_reader);
}

fn connect_timeout(actors: &Actors) {
    // Success.
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
    let s = TcpStream::connect_timeout(&listener.local_addr().unwrap(), Duration::from_secs(10))
        .expect("connect_timeout to a listener");
    assert_eq!(s.peer_addr().unwrap(), listener.local_addr().unwrap());
    assert!(
        TcpStream::connect_timeout(&listener.local_addr().unwrap(), Duration::ZERO)
            .is_err_and(|e| e.kind() == io::ErrorKind::InvalidInput)
    );

    // Time-out: a listener with a backlog of 0 that never accepts drops further SYNs once
    // its accept queue holds one connection, so a connect there never completes.
    let full = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    // SAFETY: re-listening on a valid listening socket only changes its backlog.
    assert_eq!(unsafe { libc::listen(full.as_raw_fd(), 0) }, 0);
    let addr = full.local_addr().unwrap();
    let timeout = Duration::from_millis(300);
    let mut held = Vec::new();
    let mut timed_out = None;
    for _ in 0..16 {
        let start = Instant::now();
        match TcpStream::connect_timeout(&addr, timeout) {
            Ok(s) => held.push(s),
            Err(e) => {
                timed_out = Some((e.kind(), start.elapsed()));
                break;
            }
        }
    }
    let (kind, waited) = timed_out.expect("a connect to a full backlog timed out");
    assert!(
        matches!(kind, io::ErrorKind::TimedOut | io::ErrorKind::WouldBlock),
        "{kind:?}"
    );
    assert!(waited >= timeout, "gave up after {waited:?}");
    assert!(waited < Duration::from_secs(10), "gave up after {waited:?}");
    let _ = actors;
}

#[test]
fn connect_timeout_connects_or_times_out() {
    fibers_and_threads(1, connect_timeout);
}

/// Bytes of the stream one actor writes while another reads the same socket.
const DUPLEX_BYTES: usize = 8 << 20;

fn pattern(i: usize) -> u8 {
    (i % 251) as u8
}

fn read_while_writing(actors: &Actors) {
    let addr = echo_server(actors, 1);
    let stream = Arc::new(TcpStream::connect(addr).expect("connect"));
    let w = stream.clone();
    let writer = actors.spawn(move || {
        let mut chunk = vec![0u8; 64 * 1024];
        let mut sent = 0;
        while sent < DUPLEX_BYTES {
            let n = chunk.len().min(DUPLEX_BYTES - sent);
            for (k, b) in chunk[..n].iter_mut().enumerate() {
                *b = pattern(sent + k);
            }
            (&*w).write_all(&chunk[..n]).expect("write");
            sent += n;
        }
        sent
    });
    let r = stream.clone();
    let reader = actors.spawn(move || {
        let mut buf = vec![0u8; 48 * 1024];
        let mut got = 0;
        while got < DUPLEX_BYTES {
            let n = (&*r).read(&mut buf).expect("read");
            assert_ne!(n, 0, "early end-of-file after {got} bytes");
            for (k, &b) in buf[..n].iter().enumerate() {
                assert_eq!(b, pattern(got + k), "byte {}", got + k);
            }
            got += n;
        }
        got
    });
    assert_eq!(writer.join(), DUPLEX_BYTES);
    assert_eq!(reader.join(), DUPLEX_BYTES);
}

#[test]
fn one_reader_and_one_writer_share_a_socket() {
    fibers_and_threads(1, read_while_writing);
    // And with the reader and writer likely on different workers.
    on_fibers(2, read_while_writing);
}

fn tcp_misc(_: &Actors) {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = listener.local_addr().unwrap();
    let client = TcpStream::connect(addr).expect("connect");
    let (server, peer) = listener.accept().expect("accept");
    assert_eq!(peer, client.local_addr().unwrap());
    assert_eq!(server.peer_addr().unwrap(), client.local_addr().unwrap());
    let clone = client.try_clone().expect("try_clone");
    clone
        .set_write_timeout(Some(Duration::from_secs(5)))
        .unwrap();
    assert_eq!(
        client.write_timeout().unwrap(),
        Some(Duration::from_secs(5))
    );
    (&clone).write_all(b"peek").unwrap();
    let mut buf = [0u8; 4];
    assert_eq!(server.peek(&mut buf).unwrap(), 4);
    (&server).read_exact(&mut buf).unwrap();
    assert_eq!(&buf, b"peek");
    assert!(format!("{client:?}").contains("TcpStream"));

    // Round trip through std and raw fds.
    let std_stream: std::net::TcpStream = client.into();
    let client = TcpStream::from(std_stream);
    let fd = std::os::fd::IntoRawFd::into_raw_fd(client);
    // SAFETY: `fd` was just given up by its owner.
    let client = unsafe { <TcpStream as std::os::fd::FromRawFd>::from_raw_fd(fd) };
    (&client).write_all(b"raw!").unwrap();
    (&server).read_exact(&mut buf).unwrap();
    assert_eq!(&buf, b"raw!");
}

#[test]
fn addresses_clones_peek_and_conversions() {
    fibers_and_threads(1, tcp_misc);
}

fn udp_round_trip(actors: &Actors) {
    let server = UdpSocket::bind("127.0.0.1:0").expect("bind");
    let server_addr = server.local_addr().unwrap();
    let echo = actors.spawn(move || {
        let mut buf = [0u8; 1500];
        for _ in 0..100 {
            let (n, from) = server.recv_from(&mut buf).expect("recv_from");
            server.send_to(&buf[..n], from).expect("send_to");
        }
    });
    let client = UdpSocket::bind("127.0.0.1:0").expect("bind");
    client.connect(server_addr).expect("connect");
    assert_eq!(client.peer_addr().unwrap(), server_addr);
    client
        .set_read_timeout(Some(Duration::from_secs(20)))
        .unwrap();
    let mut buf = [0u8; 1500];
    for i in 0..100u32 {
        let msg = format!("datagram {i}");
        client.send(msg.as_bytes()).expect("send");
        // Loopback does not drop datagrams at this rate; a loss would time out, not hang.
        let n = client.peek(&mut buf).expect("peek");
        assert_eq!(&buf[..n], msg.as_bytes());
        let n = client.recv(&mut buf).expect("recv");
        assert_eq!(&buf[..n], msg.as_bytes());
    }
    echo.join();
}

#[test]
fn udp_round_trip_fibers_and_threads() {
    fibers_and_threads(1, udp_round_trip);
}

fn udp_timeout_and_options(_: &Actors) {
    let s = UdpSocket::bind("127.0.0.1:0").expect("bind");
    let timeout = Duration::from_millis(100);
    s.set_read_timeout(Some(timeout)).unwrap();
    let start = Instant::now();
    let err = s.recv_from(&mut [0u8; 16]).expect_err("nothing sent");
    assert!(matches!(
        err.kind(),
        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
    ));
    assert!(start.elapsed() >= timeout);
    s.set_broadcast(true).unwrap();
    assert!(s.broadcast().unwrap());
    s.set_ttl(17).unwrap();
    assert_eq!(s.ttl().unwrap(), 17);
    let other = s.try_clone().unwrap();
    assert_eq!(other.read_timeout().unwrap(), Some(timeout));
    other.send_to(b"self", s.local_addr().unwrap()).unwrap();
    let mut buf = [0u8; 8];
    let (n, from) = s.peek_from(&mut buf).unwrap();
    assert_eq!((&buf[..n], from), (&b"self"[..], s.local_addr().unwrap()));
    let (n, _) = s.recv_from(&mut buf).unwrap();
    assert_eq!(&buf[..n], b"self");
}

#[test]
fn udp_read_timeout_and_options() {
    fibers_and_threads(1, udp_timeout_and_options);
}

fn udp_refused_then_timeout(actors: &Actors) {
    // A connected UDP socket sending to a closed port gets the ICMP error reported to a
    // receiver waiting at that moment (EPOLLERR); once that error is taken, the next receive
    // must wait out its timeout, not spin.
    let closed = {
        let s = UdpSocket::bind("127.0.0.1:0").unwrap();
        s.local_addr().unwrap()
    };
    let s = UdpSocket::bind("127.0.0.1:0").unwrap();
    s.connect(closed).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let sender = s.try_clone().unwrap();
    let receiver = actors.spawn(move || {
        let mut buf = [0u8; 16];
        let first = s.recv(&mut buf).map_err(|e| e.kind());
        s.set_read_timeout(Some(Duration::from_millis(200)))
            .unwrap();
        let start = Instant::now();
        let second = s.recv(&mut buf).map_err(|e| e.kind());
        (first, second, start.elapsed())
    });
    fibra::sleep(Duration::from_millis(100));
    sender.send(b"anyone?").unwrap();
    let (first, second, waited) = receiver.join();
    assert_eq!(first, Err(io::ErrorKind::ConnectionRefused));
    assert!(
        matches!(
            second,
            Err(io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut)
        ),
        "{second:?}"
    );
    assert!(waited >= Duration::from_millis(200), "{waited:?}");
}

#[test]
fn udp_error_from_icmp_then_receive_times_out() {
    fibers_and_threads(1, udp_refused_then_timeout);
}

fn io_deregister_wakes(actors: &Actors) {
    let (r, w) = nix_pipe();
    let fd = r.as_raw_fd();
    let waiter = actors.spawn(move || {
        let res = fibra::io::wait_readable(fd, None).map_err(|e| e.kind());
        drop(r);
        res
    });
    fibra::sleep(Duration::from_millis(50));
    fibra::io::deregister(fd);
    assert_eq!(waiter.join(), Ok(()));
    drop(w);
}

fn nix_pipe() -> (std::os::fd::OwnedFd, std::os::fd::OwnedFd) {
    let mut fds = [0; 2];
    // SAFETY: `fds` has room for the two descriptors pipe2 writes.
    assert_eq!(
        unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_NONBLOCK | libc::O_CLOEXEC) },
        0
    );
    // SAFETY: both descriptors are fresh and ours.
    unsafe {
        use std::os::fd::FromRawFd;
        (
            std::os::fd::OwnedFd::from_raw_fd(fds[0]),
            std::os::fd::OwnedFd::from_raw_fd(fds[1]),
        )
    }
}

#[test]
fn deregister_wakes_a_fiber_waiting_on_a_raw_fd() {
    on_fibers(1, io_deregister_wakes);
}
