//! Host names are resolved without blocking the worker: in a fiber, `TcpStream::connect`,
//! `TcpListener::bind` and `UdpSocket::bind/connect/send_to` look a name up on the blocking
//! pool (`fibra::unblock`) and park only the calling fiber; literal addresses never touch the
//! pool; on a plain thread a name is looked up on that thread; a name that cannot be resolved
//! is an `io::Error` either way.
//!
//! The checks that count the pool's threads or cap it run in child processes (`in_child`):
//! the pool is process-wide, so each needs a process where nothing else has used it.
//!
//! Only names the machine resolves without a network are used: `localhost` (from
//! `/etc/hosts`, which every resolver configuration consults) and a 1100-character name,
//! longer than any DNS name can be (RFC 1035: 255 octets; glibc refuses names of
//! `MAXDNAME` = 1025 characters or more before building a query), so it fails without a
//! packet being sent.

use std::io;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::common::{child_ok, finish, wait_until, LIMIT};
use fibra::net::{TcpListener, TcpStream, UdpSocket};
use fibra::Scheduler;

/// A name no resolver can look up, refused before any query is sent (see the file's comment).
fn unresolvable() -> String {
    "x".repeat(1100)
}

/// Every address-taking call with literal addresses (and malformed `"host:port"` strings,
/// which fail before any lookup), against the listener at `addr`.
// `&any` and `&addr`: the `&T` forms are part of what is checked.
#[allow(clippy::needless_borrows_for_generic_args)]
fn literal_calls(addr: SocketAddr) {
    let port = addr.port();
    let any = SocketAddr::from((Ipv4Addr::LOCALHOST, 0));
    let listeners = [
        TcpListener::bind("127.0.0.1:0"),
        TcpListener::bind(("127.0.0.1", 0)),
        TcpListener::bind((Ipv4Addr::LOCALHOST, 0)),
        TcpListener::bind((IpAddr::from(Ipv4Addr::LOCALHOST), 0)),
        TcpListener::bind(any),
        TcpListener::bind(&any),
        TcpListener::bind(any.to_string()),
        TcpListener::bind((String::from("127.0.0.1"), 0)),
        TcpListener::bind(&[any][..]),
    ];
    for l in listeners {
        l.expect("bind a literal address");
    }
    // IPv6 may be disabled: only the lack of a lookup matters here.
    let _ = TcpListener::bind("[::1]:0");
    let _ = TcpListener::bind(("::1", 0));

    let connections = [
        TcpStream::connect(addr),
        TcpStream::connect(&addr),
        TcpStream::connect(format!("127.0.0.1:{port}")),
        TcpStream::connect(format!("127.0.0.1:{port}").as_str()),
        TcpStream::connect(("127.0.0.1", port)),
        TcpStream::connect((Ipv4Addr::LOCALHOST, port)),
        TcpStream::connect(&[addr][..]),
    ];
    for c in connections {
        c.expect("connect to a literal address");
    }

    let udp = UdpSocket::bind("127.0.0.1:0").expect("bind udp");
    let peer = UdpSocket::bind(("127.0.0.1", 0)).expect("bind udp");
    let to = peer.local_addr().unwrap();
    udp.connect(format!("127.0.0.1:{}", to.port()))
        .expect("connect udp");
    udp.send_to(b"a", to).expect("send_to");
    udp.send_to(b"b", ("127.0.0.1", to.port()))
        .expect("send_to");
    udp.send_to(b"c", format!("127.0.0.1:{}", to.port()))
        .expect("send_to");

    for bad in [
        "localhost",
        "localhost:port",
        "localhost:65536",
        "127.0.0.1",
    ] {
        let e = TcpStream::connect(bad).expect_err(bad);
        assert_eq!(e.kind(), io::ErrorKind::InvalidInput, "{bad}: {e}");
        let e = UdpSocket::bind(bad).expect_err(bad);
        assert_eq!(e.kind(), io::ErrorKind::InvalidInput, "{bad}: {e}");
    }
}

/// Every address-taking call with the name `localhost`, against the listener on port `port`
/// of 127.0.0.1.
fn name_calls(port: u16) {
    let s = TcpStream::connect(("localhost", port)).expect("connect to localhost");
    assert_eq!(s.peer_addr().unwrap().port(), port);
    TcpStream::connect(format!("localhost:{port}")).expect("connect to localhost");
    TcpStream::connect((String::from("localhost"), port)).expect("connect to localhost");
    TcpListener::bind("localhost:0").expect("bind localhost");
    let udp = UdpSocket::bind(("localhost", 0)).expect("bind udp to localhost");
    let peer = UdpSocket::bind("127.0.0.1:0").expect("bind udp");
    let to = peer.local_addr().unwrap().port();
    udp.connect(("localhost", to))
        .expect("connect udp to localhost");
    udp.send_to(b"x", format!("localhost:{to}"))
        .expect("send_to localhost");
}

/// Every address-taking call with a name that cannot be resolved: each an `io::Error`.
fn unresolvable_calls() {
    let name = unresolvable();
    let with_port = format!("{name}:80");
    let errors = [
        TcpStream::connect((name.as_str(), 80)).map(drop),
        TcpStream::connect(with_port.as_str()).map(drop),
        TcpListener::bind((name.as_str(), 0)).map(drop),
        UdpSocket::bind(with_port.as_str()).map(drop),
        UdpSocket::bind("127.0.0.1:0").and_then(|u| u.connect((name.as_str(), 80))),
        UdpSocket::bind("127.0.0.1:0").and_then(|u| u.send_to(b"x", &with_port).map(drop)),
    ];
    for (i, e) in errors.into_iter().enumerate() {
        let e = e.expect_err("an unresolvable name");
        assert!(!e.to_string().is_empty(), "call {i}: {e:?}");
    }
}

#[test]
fn an_unresolvable_name_is_an_error_on_a_thread() {
    crate::common::with_deadline(unresolvable_calls);
}

#[test]
fn an_unresolvable_name_is_an_error_in_a_fiber() {
    let sched = Scheduler::builder().threads(1).build().expect("build");
    sched.start();
    finish(
        sched
            .submit(unresolvable_calls, None)
            .expect("submit the lookups"),
    );
    sched.stop();
}

#[test]
fn literal_addresses_never_use_the_blocking_pool() {
    child_ok(|| {
        assert_eq!(fibra::unblock::threads(), 0, "a fresh process has no pool");
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
        let addr = listener.local_addr().unwrap();
        let sched = Scheduler::builder().threads(1).build().expect("build");
        sched.start();
        finish(
            sched
                .submit(move || literal_calls(addr), None)
                .expect("submit"),
        );
        literal_calls(addr);
        assert_eq!(
            fibra::unblock::threads(),
            0,
            "a literal address was resolved on the blocking pool"
        );
        sched.stop();
    });
}

#[test]
fn names_on_a_plain_thread_are_resolved_on_that_thread() {
    child_ok(|| {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
        name_calls(listener.local_addr().unwrap().port());
        unresolvable_calls();
        assert_eq!(
            fibra::unblock::threads(),
            0,
            "a name looked up outside a fiber went to the blocking pool"
        );
    });
}

/// The real `getaddrinfo` path, made slow deterministically: the pool is capped at one
/// thread and another fiber holds that thread in a blocking call, so a lookup queued on the
/// pool cannot finish until the test lets it. On a one-worker scheduler, fiber A connects to
/// `localhost` while fiber B ticks. The test requires that B keeps ticking while A is inside
/// `connect` and that A's connect does not finish before the pool is released: both fail if
/// the lookup runs on the worker (A then finishes at once, blocking the worker for as long as
/// `getaddrinfo` takes). The unit test `net::addr::tests::a_slow_lookup_parks_only_its_fiber`
/// checks the same with a lookup that itself blocks.
#[test]
fn a_fiber_looking_up_a_name_waits_on_the_blocking_pool() {
    child_ok(|| {
        fibra::unblock::set_max_threads(1);
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
        let port = listener.local_addr().unwrap().port();
        let sched = Scheduler::builder().threads(1).build().expect("build");
        sched.start();

        let holding = Arc::new(AtomicBool::new(false));
        let release = Arc::new(AtomicBool::new(false));
        let (h, r) = (holding.clone(), release.clone());
        let holder = sched
            .submit(
                move || {
                    fibra::unblock(|| {
                        h.store(true, Ordering::SeqCst);
                        let deadline = Instant::now() + LIMIT;
                        while !r.load(Ordering::SeqCst) && Instant::now() < deadline {
                            std::thread::sleep(Duration::from_millis(1));
                        }
                    })
                },
                None,
            )
            .expect("submit the holder");
        wait_until("the pool's only thread to be held", || {
            holding.load(Ordering::SeqCst)
        });

        let ticks = Arc::new(AtomicUsize::new(0));
        // The tick count when the client entered `connect`, plus one (0: not yet).
        let entered_at = Arc::new(AtomicUsize::new(0));
        let connected = Arc::new(AtomicBool::new(false));
        let (e, c, t) = (entered_at.clone(), connected.clone(), ticks.clone());
        let client = sched
            .submit(
                move || {
                    e.store(t.load(Ordering::SeqCst) + 1, Ordering::SeqCst);
                    let s = TcpStream::connect(("localhost", port));
                    c.store(true, Ordering::SeqCst);
                    s.and_then(|s| s.peer_addr())
                },
                None,
            )
            .expect("submit the client");
        let (c, t) = (connected.clone(), ticks.clone());
        let ticker = sched
            .submit(
                move || {
                    let deadline = Instant::now() + LIMIT;
                    while !c.load(Ordering::SeqCst) && Instant::now() < deadline {
                        t.fetch_add(1, Ordering::SeqCst);
                        fibra::sleep(Duration::from_millis(1));
                    }
                },
                None,
            )
            .expect("submit the ticker");

        wait_until(
            "the connect to end or the ticker to run 50 times while it waits",
            || {
                let at = entered_at.load(Ordering::SeqCst);
                connected.load(Ordering::SeqCst)
                    || (at > 0 && ticks.load(Ordering::SeqCst) >= at - 1 + 50)
            },
        );
        let finished_early = connected.load(Ordering::SeqCst);
        release.store(true, Ordering::SeqCst); // first, so that a failure below does not wait
        assert!(
            !finished_early,
            "connect(\"localhost\") finished while the blocking pool's only thread was busy: \
             the name was not looked up on the pool"
        );
        finish(holder);
        let peer = finish(client).expect("connect to localhost");
        assert_eq!(peer, SocketAddr::from((Ipv4Addr::LOCALHOST, port)));
        finish(ticker);
        assert_eq!(fibra::unblock::threads(), 1);

        // The other calls and a failed lookup, through the pool as well.
        finish(
            sched
                .submit(move || name_calls(port), None)
                .expect("submit"),
        );
        finish(sched.submit(unresolvable_calls, None).expect("submit"));
        sched.stop();
    });
}
