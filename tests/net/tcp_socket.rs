//! `fibra::net::TcpSocket` and `TcpListener::bind`'s backlog on 127.0.0.1: options round-trip,
//! `SO_REUSEPORT` shares a port, `listen` and `connect` work from fibers and from plain
//! threads, refused connects are errors, a burst of 500 connects fits the listen queue, and
//! running out of descriptors is an error (in a child process, which may lower its limit).

use std::io::{self, Read, Write};
use std::net::{Ipv4Addr, SocketAddr};
use std::os::fd::{AsFd, AsRawFd, FromRawFd, IntoRawFd, RawFd};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use crate::common::{child_ok, finish, started, with_deadline, LIMIT};
use crate::util::{fibers_and_threads, Actors};
use fibra::net::{TcpListener, TcpSocket, TcpStream};

fn localhost() -> SocketAddr {
    SocketAddr::from((Ipv4Addr::LOCALHOST, 0))
}

/// An address on 127.0.0.1 where nothing listens (a listener's, closed again).
fn closed_port() -> SocketAddr {
    let l = TcpListener::bind("127.0.0.1:0").expect("bind");
    l.local_addr().unwrap()
}

fn fcntl(fd: RawFd, cmd: libc::c_int) -> libc::c_int {
    // SAFETY: F_GETFL / F_GETFD read a descriptor's flags and touch no memory of ours.
    let r = unsafe { libc::fcntl(fd, cmd) };
    assert!(r >= 0, "fcntl: {}", io::Error::last_os_error());
    r
}

fn is_nonblocking(fd: RawFd) -> bool {
    fcntl(fd, libc::F_GETFL) & libc::O_NONBLOCK != 0
}

// --- TcpListener::bind's backlog -----------------------------------------------------------

#[test]
fn five_hundred_connects_at_once_all_complete_before_the_first_accept() {
    with_deadline(|| {
        // The kernel caps every backlog at net.core.somaxconn; where that is below 500 the
        // test can only ask for what the system allows.
        let somaxconn = std::fs::read_to_string("/proc/sys/net/core/somaxconn")
            .ok()
            .and_then(|s| s.trim().parse::<usize>().ok())
            .unwrap_or(4096);
        let clients = 500.min(somaxconn);
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
        let addr = listener.local_addr().unwrap();
        let sched = started(2);
        let connected = Arc::new(AtomicUsize::new(0));
        let start = Instant::now();
        let tasks: Vec<_> = (0..clients)
            .map(|_| {
                let connected = connected.clone();
                sched
                    .submit(
                        move || {
                            let s = TcpStream::connect(addr).expect("connect");
                            connected.fetch_add(1, Ordering::SeqCst);
                            s
                        },
                        None,
                    )
                    .expect("submit")
            })
            .collect();
        // Nobody accepts yet: every handshake must complete into the listen queue. With
        // std's backlog of 128 the kernel drops the surplus SYNs, and those clients retry
        // after 1 s, 3 s, 7 s, … and never get in while nobody accepts.
        let bound = Duration::from_secs(10);
        while connected.load(Ordering::SeqCst) < clients {
            assert!(
                start.elapsed() < bound,
                "only {} of {clients} connects completed within {bound:?}",
                connected.load(Ordering::SeqCst)
            );
            thread::sleep(Duration::from_millis(5));
        }
        // Now accept them all, on this plain thread; each is queued already.
        let mut peers = Vec::with_capacity(clients);
        for _ in 0..clients {
            let (conn, peer) = listener.accept().expect("accept");
            peers.push(peer);
            drop(conn);
        }
        assert!(start.elapsed() < LIMIT);
        let mut locals: Vec<_> = tasks
            .into_iter()
            .map(|t| finish(t).local_addr().unwrap())
            .collect();
        locals.sort();
        peers.sort();
        assert_eq!(locals, peers, "accepted exactly the clients' connections");
        sched.stop();
    });
}

#[test]
fn bind_tries_every_address_and_reports_the_last_error() {
    with_deadline(|| {
        let taken = TcpListener::bind("127.0.0.1:0").expect("bind");
        let taken_addr = taken.local_addr().unwrap();
        let err = TcpListener::bind(taken_addr).expect_err("address in use");
        assert_eq!(err.kind(), io::ErrorKind::AddrInUse, "{err:?}");
        // The first address fails, the second works.
        let both = [taken_addr, localhost()];
        let l = TcpListener::bind(&both[..]).expect("the second address");
        assert_ne!(l.local_addr().unwrap(), taken_addr);
        let err = TcpListener::bind(&[][..] as &[SocketAddr]).expect_err("no address");
        assert_eq!(err.kind(), io::ErrorKind::InvalidInput, "{err:?}");
        // Close-on-exec and non-blocking, like every fibra socket.
        assert!(fcntl(l.as_raw_fd(), libc::F_GETFD) & libc::FD_CLOEXEC != 0);
        assert!(is_nonblocking(l.as_raw_fd()));
    });
}

// --- TcpSocket ------------------------------------------------------------------------------

/// Every setter's value reads back through its getter.
fn round_trip(s: &TcpSocket) {
    for on in [true, false, true] {
        s.set_reuseaddr(on).unwrap();
        assert_eq!(s.reuseaddr().unwrap(), on);
        s.set_reuseport(on).unwrap();
        assert_eq!(s.reuseport().unwrap(), on);
        s.set_nodelay(on).unwrap();
        assert_eq!(s.nodelay().unwrap(), on);
    }
    // Linux doubles buffer sizes (and clamps them to its limits): at least what was asked
    // for, and a bigger request gives a bigger buffer.
    s.set_send_buffer_size(8 * 1024).unwrap();
    let small = s.send_buffer_size().unwrap();
    s.set_send_buffer_size(64 * 1024).unwrap();
    let big = s.send_buffer_size().unwrap();
    assert!(
        small >= 8 * 1024 && big >= 64 * 1024 && big > small,
        "{small} {big}"
    );
    s.set_recv_buffer_size(8 * 1024).unwrap();
    let small = s.recv_buffer_size().unwrap();
    s.set_recv_buffer_size(64 * 1024).unwrap();
    let big = s.recv_buffer_size().unwrap();
    assert!(
        small >= 8 * 1024 && big >= 64 * 1024 && big > small,
        "{small} {big}"
    );
    // Huge sizes saturate into the kernel's maximum instead of failing.
    s.set_send_buffer_size(u32::MAX).unwrap();
    assert!(s.send_buffer_size().unwrap() >= big / 2);
    s.set_recv_buffer_size(u32::MAX).unwrap();
    assert!(s.recv_buffer_size().unwrap() >= big / 2);

    assert_eq!(s.linger().unwrap(), None);
    s.set_linger(Some(Duration::from_secs(5))).unwrap();
    assert_eq!(s.linger().unwrap(), Some(Duration::from_secs(5)));
    s.set_linger(Some(Duration::ZERO)).unwrap();
    assert_eq!(s.linger().unwrap(), Some(Duration::ZERO));
    // Whole seconds: the fraction is dropped.
    s.set_linger(Some(Duration::from_millis(2_900))).unwrap();
    assert_eq!(s.linger().unwrap(), Some(Duration::from_secs(2)));
    // Saturates at i32::MAX seconds.
    s.set_linger(Some(Duration::MAX)).unwrap();
    let max = s.linger().unwrap().expect("on");
    assert!(max >= Duration::from_secs(1 << 30), "{max:?}");
    s.set_linger(None).unwrap();
    assert_eq!(s.linger().unwrap(), None);
}

#[test]
fn every_option_round_trips_on_v4_and_v6_sockets() {
    let v4 = TcpSocket::new_v4().expect("new_v4");
    round_trip(&v4);
    assert_eq!(
        v4.local_addr().unwrap(),
        SocketAddr::from((Ipv4Addr::UNSPECIFIED, 0))
    );
    v4.bind(localhost()).unwrap();
    let bound = v4.local_addr().unwrap();
    assert_eq!(bound.ip(), Ipv4Addr::LOCALHOST);
    assert_ne!(bound.port(), 0);
    assert!(format!("{v4:?}").contains(&bound.to_string()));
    match TcpSocket::new_v6() {
        Ok(v6) => {
            round_trip(&v6);
            let unbound = v6.local_addr().unwrap();
            assert!(unbound.is_ipv6() && unbound.port() == 0, "{unbound}");
        }
        // A kernel without IPv6 cannot make the socket at all; nothing more to check.
        Err(e) => assert_eq!(e.raw_os_error(), Some(libc::EAFNOSUPPORT), "{e:?}"),
    }
}

#[test]
fn sockets_are_nonblocking_and_close_on_exec_and_fds_convert_both_ways() {
    let s = TcpSocket::new_v4().unwrap();
    assert!(is_nonblocking(s.as_raw_fd()));
    assert!(fcntl(s.as_raw_fd(), libc::F_GETFD) & libc::FD_CLOEXEC != 0);
    assert_eq!(s.as_fd().as_raw_fd(), s.as_raw_fd());
    s.set_reuseaddr(true).unwrap();
    // Given up in blocking mode, like fibra's other sockets.
    let fd = s.into_raw_fd();
    assert!(!is_nonblocking(fd));
    // SAFETY: `fd` is the open TCP socket just given up, and ours.
    let s = unsafe { TcpSocket::from_raw_fd(fd) };
    assert!(is_nonblocking(fd));
    assert!(s.reuseaddr().unwrap(), "an option survives the round trip");
    // A socket that std made blocking works too.
    let std_fd = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .into_raw_fd();
    // SAFETY: as above; std's listener gave the fd up.
    let l = unsafe { TcpSocket::from_raw_fd(std_fd) };
    assert!(is_nonblocking(l.as_raw_fd()));
}

#[test]
fn reuseport_lets_two_sockets_bind_the_same_port() {
    let first = TcpSocket::new_v4().unwrap();
    first.set_reuseport(true).unwrap();
    first.bind(localhost()).unwrap();
    let addr = first.local_addr().unwrap();
    let first = first.listen(16).unwrap();
    let second = TcpSocket::new_v4().unwrap();
    second.set_reuseport(true).unwrap();
    second.bind(addr).expect("both set SO_REUSEPORT");
    let second = second.listen(16).unwrap();
    assert_eq!(second.local_addr().unwrap(), addr);
    // A third without the option is refused.
    let third = TcpSocket::new_v4().unwrap();
    let err = third.bind(addr).expect_err("in use");
    assert_eq!(err.kind(), io::ErrorKind::AddrInUse, "{err:?}");
    // A connection lands on exactly one of the two listeners.
    let client = TcpStream::connect(addr).unwrap();
    let mut fds = [&first, &second].map(|l| libc::pollfd {
        fd: l.as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    });
    let limit = LIMIT.as_millis() as libc::c_int;
    // SAFETY: two valid pollfds, for the length of the call.
    let n = unsafe { libc::poll(fds.as_mut_ptr(), 2, limit) };
    assert_eq!(n, 1, "exactly one listener has the connection");
    let l = if fds[0].revents & libc::POLLIN != 0 {
        &first
    } else {
        &second
    };
    let (_conn, peer) = l.accept().unwrap();
    assert_eq!(peer, client.local_addr().unwrap());
}

fn listen_accept_and_echo(actors: &Actors) {
    for backlog in [0, 16, u32::MAX] {
        let socket = TcpSocket::new_v4().unwrap();
        socket.bind(localhost()).unwrap();
        let listener = socket.listen(backlog).expect("listen");
        let addr = listener.local_addr().unwrap();
        let client = actors.spawn(move || {
            let socket = TcpSocket::new_v4().unwrap();
            socket.set_nodelay(true).unwrap();
            socket.bind(localhost()).unwrap();
            let local = socket.local_addr().unwrap();
            let mut s = socket.connect(addr).expect("connect");
            assert_eq!(
                s.local_addr().unwrap(),
                local,
                "connects from its bound address"
            );
            assert!(s.nodelay().unwrap(), "options stay on the stream");
            s.write_all(b"ping").unwrap();
            let mut buf = [0u8; 4];
            s.read_exact(&mut buf).unwrap();
            assert_eq!(&buf, b"ping");
            local
        });
        let (mut conn, peer) = listener.accept().expect("accept");
        let mut buf = [0u8; 4];
        conn.read_exact(&mut buf).unwrap();
        conn.write_all(&buf).unwrap();
        assert_eq!(client.join(), peer);
    }
}

#[test]
fn listen_then_accept_works_from_fibers_and_threads() {
    fibers_and_threads(2, listen_accept_and_echo);
}

fn refused(_: &Actors) {
    let addr = closed_port();
    let err = TcpSocket::new_v4()
        .unwrap()
        .connect(addr)
        .expect_err("nobody listens");
    assert_eq!(err.kind(), io::ErrorKind::ConnectionRefused, "{err:?}");
    let err = TcpStream::connect(addr).expect_err("nobody listens");
    assert_eq!(err.kind(), io::ErrorKind::ConnectionRefused, "{err:?}");
    let err = TcpStream::connect_timeout(&addr, Duration::MAX).expect_err("nobody listens");
    assert_eq!(err.kind(), io::ErrorKind::ConnectionRefused, "{err:?}");
    let err = TcpStream::connect_timeout(&addr, Duration::ZERO).expect_err("zero");
    assert_eq!(err.kind(), io::ErrorKind::InvalidInput, "{err:?}");
    // The wrong family fails at once instead of waiting.
    let err = TcpSocket::new_v4()
        .unwrap()
        .connect("[::1]:9".parse().unwrap())
        .expect_err("an IPv6 address on an IPv4 socket");
    assert_ne!(err.kind(), io::ErrorKind::WouldBlock, "{err:?}");
}

#[test]
fn connect_to_a_closed_port_is_refused_from_fibers_and_threads() {
    fibers_and_threads(1, refused);
}

#[test]
fn binding_twice_is_an_error() {
    let s = TcpSocket::new_v4().unwrap();
    s.bind(localhost()).unwrap();
    let err = s.bind(localhost()).expect_err("bound already");
    assert_eq!(err.raw_os_error(), Some(libc::EINVAL), "{err:?}");
    // Still usable.
    let l = s.listen(1).unwrap();
    let _c = TcpStream::connect(l.local_addr().unwrap()).unwrap();
    l.accept().unwrap();
}

#[test]
fn a_fiber_connecting_in_a_loop_to_a_closed_port_lets_others_run() {
    with_deadline(|| {
        let sched = started(1);
        let addr = closed_port();
        let ran = sched.block_on(move || {
            let flag = Arc::new(AtomicBool::new(false));
            let f = flag.clone();
            let other = fibra::spawn(move || f.store(true, Ordering::SeqCst));
            // Each connect spends from the budget, so this loop yields long before its end.
            for _ in 0..10 * fibra::coop::BUDGET {
                if flag.load(Ordering::SeqCst) {
                    break;
                }
                let _ = TcpSocket::new_v4().unwrap().connect(addr);
            }
            other.join().unwrap();
            flag.load(Ordering::SeqCst)
        });
        assert!(ran);
        sched.stop();
    });
}

// --- Out of descriptors (a child process lowers its own limit) ------------------------------

#[test]
fn out_of_descriptors_is_an_error_from_fibers_and_threads() {
    child_ok(|| {
        let sched = started(1);
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        // Queued before the table fills: accept must fail on it, then succeed later.
        let pending = TcpStream::connect(addr).unwrap();
        let mut limit = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        // SAFETY: `limit` is a valid rlimit for the call to fill.
        assert_eq!(
            unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) },
            0
        );
        let low = libc::rlimit {
            rlim_cur: limit.rlim_cur.min(256),
            rlim_max: limit.rlim_max,
        };
        // SAFETY: lowers this process's soft limit; `low` is valid for the call.
        assert_eq!(unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &low) }, 0);
        let mut filler = Vec::new();
        for _ in 0..low.rlim_cur {
            match std::fs::File::open("/dev/null") {
                Ok(f) => filler.push(f),
                Err(e) => {
                    assert_eq!(e.raw_os_error(), Some(libc::EMFILE), "{e:?}");
                    break;
                }
            }
        }
        assert!(is_emfile(TcpSocket::new_v4()));
        assert!(TcpSocket::new_v6().is_err());
        assert!(is_emfile(TcpListener::bind("127.0.0.1:0")));
        assert!(is_emfile(TcpStream::connect(addr)));
        assert!(is_emfile(listener.accept()));
        let (ok, yielded) = sched.block_on(move || {
            let ok = is_emfile(TcpSocket::new_v4())
                && is_emfile(TcpListener::bind("127.0.0.1:0"))
                && is_emfile(TcpStream::connect(addr))
                && is_emfile(TcpStream::connect_timeout(&addr, Duration::MAX));
            // A connect loop that fails at once still spends from the budget and yields.
            let flag = Arc::new(AtomicBool::new(false));
            let f = flag.clone();
            let other = fibra::spawn(move || f.store(true, Ordering::SeqCst));
            for _ in 0..10 * fibra::coop::BUDGET {
                if flag.load(Ordering::SeqCst) {
                    break;
                }
                assert!(is_emfile(TcpStream::connect(addr)));
            }
            let yielded = flag.load(Ordering::SeqCst);
            // The table is full; `other` has run (or runs now) without needing a descriptor.
            other.join().unwrap();
            (ok, yielded)
        });
        assert!(ok, "a fiber did not get EMFILE");
        assert!(yielded, "a connect loop failing with EMFILE never yielded");
        drop(filler);
        // Descriptors again: everything works, and the queued connection is still there.
        let (conn, peer) = listener.accept().expect("accept after EMFILE");
        assert_eq!(peer, pending.local_addr().unwrap());
        drop(conn);
        let s = TcpSocket::new_v4().unwrap();
        s.bind(localhost()).unwrap();
        let l = s.listen(8).unwrap();
        let _c = TcpStream::connect(l.local_addr().unwrap()).unwrap();
        l.accept().unwrap();
        // SAFETY: restores the limit read above; `limit` is valid for the call.
        assert_eq!(unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &limit) }, 0);
        sched.stop();
    });
}

fn is_emfile<T>(r: io::Result<T>) -> bool {
    matches!(r, Err(e) if e.raw_os_error() == Some(libc::EMFILE))
}
