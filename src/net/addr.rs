//! [`ToSocketAddrs`]: the addresses fibra's sockets bind, connect and send to, and host-name
//! resolution that parks only the calling fiber.
//!
//! std's [`std::net::ToSocketAddrs`] hides whether a value is a literal address or a host
//! name behind one blocking call (`getaddrinfo(3)` for names), which in a fiber would stall
//! every fiber of its worker for as long as the lookup takes. fibra's own, sealed trait tells
//! the two apart (as tokio's does): literals are used at once, names are looked up on the
//! blocking pool ([`unblock`](crate::unblock())).

use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV4, SocketAddrV6};

/// A value that names one or more socket addresses: what
/// [`TcpListener::bind`](super::TcpListener::bind),
/// [`TcpStream::connect`](super::TcpStream::connect),
/// [`UdpSocket::bind`](super::UdpSocket::bind),
/// [`UdpSocket::connect`](super::UdpSocket::connect) and
/// [`UdpSocket::send_to`](super::UdpSocket::send_to) take.
///
/// It is implemented for the types std implements [`std::net::ToSocketAddrs`] for, with the
/// same meaning: [`SocketAddr`], [`SocketAddrV4`], [`SocketAddrV6`], `(IpAddr, u16)`,
/// `(Ipv4Addr, u16)`, `(Ipv6Addr, u16)`, `(&str, u16)`, `(String, u16)`, [`str`] and
/// [`String`] (`"host:port"`), `&[SocketAddr]`, and references to any of them. Where std
/// resolves every value the same way, fibra resolves only what needs it:
///
/// * **Literal addresses** — socket address values, IP addresses with a port, and strings
///   such as `"127.0.0.1:8080"`, `"[::1]:443"` or `("10.0.0.1", 53)` — are parsed in place,
///   with no system call and no thread hop.
/// * **Host names** (`"localhost:8080"`, `("example.com", 443)`) are looked up with
///   `getaddrinfo(3)`, as std does. Inside a scheduled fiber the lookup runs on the blocking
///   pool ([`unblock`](crate::unblock())) while only the calling fiber waits; its worker goes on running
///   other fibers. Anywhere else it runs on the calling thread.
///
/// The trait is sealed: it has no methods you can call and cannot be implemented outside
/// fibra. Code generic over std's trait must pass a concrete address (or a resolved
/// `SocketAddr`) instead.
///
/// ```
/// use fibra::net::{TcpListener, TcpStream};
/// use std::net::{Ipv4Addr, SocketAddr};
///
/// let sched = fibra::Scheduler::builder().threads(1).build().unwrap();
/// sched.block_on(|| {
///     let listener = TcpListener::bind("127.0.0.1:0").unwrap(); // a literal: parsed
///     let port = listener.local_addr().unwrap().port();
///     let a = TcpStream::connect((Ipv4Addr::LOCALHOST, port)).unwrap();
///     let b = TcpStream::connect(SocketAddr::from(([127, 0, 0, 1], port))).unwrap();
///     // A name: resolved on the blocking pool while other fibers run.
///     let c = TcpStream::connect(format!("localhost:{port}")).unwrap();
///     assert_eq!(a.peer_addr().unwrap(), b.peer_addr().unwrap());
///     assert_eq!(c.peer_addr().unwrap().port(), port);
/// });
/// ```
pub trait ToSocketAddrs: sealed::ToSocketAddrsPriv {}

pub(crate) mod sealed {
    //! The sealed part of [`ToSocketAddrs`](super::ToSocketAddrs): public items in a module
    //! other crates cannot name, so they can neither call nor implement it.

    use std::io;
    use std::net::SocketAddr;

    /// How a [`ToSocketAddrs`](super::ToSocketAddrs) value becomes addresses.
    pub trait ToSocketAddrsPriv {
        /// The literal addresses this value names, or the host name to look up; an error
        /// for a malformed `"host:port"` string.
        fn lookup(&self) -> io::Result<Lookup<'_>>;
    }

    /// What [`ToSocketAddrsPriv::lookup`] found.
    pub enum Lookup<'a> {
        /// Addresses known without a lookup.
        Ready(Addrs<'a>),
        /// A host name (not an IP literal) and the port to pair its addresses with.
        Name(&'a str, u16),
    }

    /// Resolved addresses, in the order std would give them; no allocation for one literal.
    pub enum Addrs<'a> {
        /// A single literal address (`None` once iterated over).
        One(Option<SocketAddr>),
        /// The caller's slice.
        Slice(std::slice::Iter<'a, SocketAddr>),
        /// The result of a lookup.
        Owned(std::vec::IntoIter<SocketAddr>),
    }

    impl Addrs<'_> {
        /// The addresses not yet iterated over.
        pub fn as_slice(&self) -> &[SocketAddr] {
            match self {
                Addrs::One(a) => a.as_slice(),
                Addrs::Slice(it) => it.as_slice(),
                Addrs::Owned(it) => it.as_slice(),
            }
        }
    }

    impl Iterator for Addrs<'_> {
        type Item = SocketAddr;

        fn next(&mut self) -> Option<SocketAddr> {
            match self {
                Addrs::One(a) => a.take(),
                Addrs::Slice(it) => it.next().copied(),
                Addrs::Owned(it) => it.next(),
            }
        }

        fn size_hint(&self) -> (usize, Option<usize>) {
            let n = self.as_slice().len();
            (n, Some(n))
        }
    }
}

use sealed::{Addrs, Lookup, ToSocketAddrsPriv};

/// The addresses `addr` names. A host name is resolved on the blocking pool when called from
/// a scheduled fiber (only the fiber waits), directly otherwise; literals are never looked up.
pub(crate) fn resolve<A: ToSocketAddrs + ?Sized>(addr: &A) -> io::Result<Addrs<'_>> {
    match addr.lookup()? {
        Lookup::Ready(addrs) => Ok(addrs),
        // `unblock` runs the closure inline outside a scheduled fiber.
        Lookup::Name(host, port) => Ok(Addrs::Owned(
            crate::unblock(|| getaddrinfo(host, port))?.into_iter(),
        )),
    }
}

/// The first address `addr` names, as std's `send_to` uses.
pub(crate) fn resolve_first<A: ToSocketAddrs + ?Sized>(addr: &A) -> io::Result<SocketAddr> {
    resolve(addr)?
        .next()
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "no addresses to send data to"))
}

/// Looks up the host name `host` (blocking): std's resolution, `getaddrinfo(3)`.
fn getaddrinfo(host: &str, port: u16) -> io::Result<Vec<SocketAddr>> {
    #[cfg(test)]
    if let Some(found) = tests::fake_getaddrinfo(host, port) {
        return found;
    }
    Ok(std::net::ToSocketAddrs::to_socket_addrs(&(host, port))?.collect())
}

fn one(addr: impl Into<SocketAddr>) -> Lookup<'static> {
    Lookup::Ready(Addrs::One(Some(addr.into())))
}

/// `(host, port)` as std reads it: an IPv4 or IPv6 literal, else a name to look up.
fn host_port(host: &str, port: u16) -> Lookup<'_> {
    if let Ok(ip) = host.parse::<Ipv4Addr>() {
        return one((ip, port));
    }
    if let Ok(ip) = host.parse::<Ipv6Addr>() {
        return one((ip, port));
    }
    Lookup::Name(host, port)
}

/// `"host:port"` as std reads it: a socket address literal, else split at the last colon,
/// with std's errors for a missing or bad port.
fn host_port_str(s: &str) -> io::Result<Lookup<'_>> {
    if let Ok(addr) = s.parse::<SocketAddr>() {
        return Ok(one(addr));
    }
    let invalid = |msg| io::Error::new(io::ErrorKind::InvalidInput, msg);
    let (host, port) = s
        .rsplit_once(':')
        .ok_or_else(|| invalid("invalid socket address"))?;
    let port = port.parse().map_err(|_| invalid("invalid port value"))?;
    Ok(host_port(host, port))
}

macro_rules! literal {
    ($($ty:ty),*) => {$(
        impl ToSocketAddrs for $ty {}
        impl ToSocketAddrsPriv for $ty {
            fn lookup(&self) -> io::Result<Lookup<'_>> {
                Ok(one(*self))
            }
        }
    )*};
}

literal!(
    SocketAddr,
    SocketAddrV4,
    SocketAddrV6,
    (IpAddr, u16),
    (Ipv4Addr, u16),
    (Ipv6Addr, u16)
);

impl ToSocketAddrs for (&str, u16) {}
impl ToSocketAddrsPriv for (&str, u16) {
    fn lookup(&self) -> io::Result<Lookup<'_>> {
        Ok(host_port(self.0, self.1))
    }
}

impl ToSocketAddrs for (String, u16) {}
impl ToSocketAddrsPriv for (String, u16) {
    fn lookup(&self) -> io::Result<Lookup<'_>> {
        Ok(host_port(&self.0, self.1))
    }
}

impl ToSocketAddrs for str {}
impl ToSocketAddrsPriv for str {
    fn lookup(&self) -> io::Result<Lookup<'_>> {
        host_port_str(self)
    }
}

impl ToSocketAddrs for String {}
impl ToSocketAddrsPriv for String {
    fn lookup(&self) -> io::Result<Lookup<'_>> {
        host_port_str(self)
    }
}

impl ToSocketAddrs for &[SocketAddr] {}
impl ToSocketAddrsPriv for &[SocketAddr] {
    fn lookup(&self) -> io::Result<Lookup<'_>> {
        Ok(Lookup::Ready(Addrs::Slice(self.iter())))
    }
}

impl<T: ToSocketAddrs + ?Sized> ToSocketAddrs for &T {}
impl<T: ToSocketAddrs + ?Sized> ToSocketAddrsPriv for &T {
    fn lookup(&self) -> io::Result<Lookup<'_>> {
        (**self).lookup()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::net::TcpStream;
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
    use std::sync::{Arc, Mutex};
    use std::time::{Duration, Instant};

    /// A name only [`fake_getaddrinfo`] answers (never sent to a real resolver).
    const SLOW_NAME: &str = "slow-lookup.fibra-test";
    /// How many times the ticker fiber must run while the slow lookup is in flight.
    const TICKS_WANTED: usize = 20;
    const LIMIT: Duration = Duration::from_secs(30);

    static TICKS: AtomicUsize = AtomicUsize::new(0);
    static LOOKUP_THREAD: Mutex<Option<String>> = Mutex::new(None);

    /// Stands in for `getaddrinfo` for [`SLOW_NAME`]: a lookup that blocks its thread (as one
    /// waiting for a slow DNS server does) until the ticker fiber has run [`TICKS_WANTED`]
    /// more times, then answers 127.0.0.1. If it ran on the worker, the ticker could never run:
    /// it gives up after [`LIMIT`] with an error naming the stall.
    pub(super) fn fake_getaddrinfo(host: &str, port: u16) -> Option<io::Result<Vec<SocketAddr>>> {
        if host != SLOW_NAME {
            return None;
        }
        *LOOKUP_THREAD.lock().unwrap() = std::thread::current().name().map(String::from);
        let deadline = Instant::now() + LIMIT;
        let start = TICKS.load(Ordering::SeqCst);
        while TICKS.load(Ordering::SeqCst) < start + TICKS_WANTED {
            if Instant::now() > deadline {
                return Some(Err(io::Error::other(
                    "no other fiber ran while the lookup blocked its thread",
                )));
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        Some(Ok(vec![SocketAddr::from((Ipv4Addr::LOCALHOST, port))]))
    }

    /// What `lookup` makes of `addr`: `Ok(addresses)` for a literal, `Err(name)` for a name.
    fn classify<A: ToSocketAddrs + ?Sized>(addr: &A) -> Result<Vec<SocketAddr>, (String, u16)> {
        match addr.lookup().expect("well-formed") {
            Lookup::Ready(a) => Ok(a.collect()),
            Lookup::Name(host, port) => Err((host.to_string(), port)),
        }
    }

    fn std_addrs(addr: impl std::net::ToSocketAddrs) -> Vec<SocketAddr> {
        addr.to_socket_addrs().expect("std resolves it").collect()
    }

    #[test]
    fn literals_are_parsed_like_std_and_names_are_left_for_a_lookup() {
        let v4 = SocketAddr::from(([127, 0, 0, 1], 80));
        let v6: SocketAddr = "[::1]:443".parse().unwrap();
        let SocketAddr::V4(v4_only) = v4 else {
            unreachable!()
        };
        let SocketAddr::V6(v6_only) = v6 else {
            unreachable!()
        };
        assert_eq!(classify(&v4), Ok(std_addrs(v4)));
        assert_eq!(classify(&v4_only), Ok(std_addrs(v4_only)));
        assert_eq!(classify(&v6_only), Ok(std_addrs(v6_only)));
        assert_eq!(classify(&(v4.ip(), 80)), Ok(std_addrs((v4.ip(), 80))));
        assert_eq!(
            classify(&(Ipv4Addr::LOCALHOST, 8)),
            Ok(std_addrs((Ipv4Addr::LOCALHOST, 8)))
        );
        assert_eq!(
            classify(&(Ipv6Addr::LOCALHOST, 9)),
            Ok(std_addrs((Ipv6Addr::LOCALHOST, 9)))
        );
        for s in ["127.0.0.1:80", "[::1]:443", "0.0.0.0:0", "[fe80::1%2]:7"] {
            assert_eq!(classify(s), Ok(std_addrs(s)), "{s}");
            assert_eq!(classify(&s.to_string()), Ok(std_addrs(s)), "{s}");
        }
        // std's `(host, port)` tries IPv4 and IPv6 literals before a lookup; so does "::1:80",
        // split at its last colon.
        for (host, port) in [("10.1.2.3", 53), ("::1", 22), ("fe80::2", 0)] {
            assert_eq!(classify(&(host, port)), Ok(std_addrs((host, port))));
            assert_eq!(
                classify(&(host.to_string(), port)),
                Ok(std_addrs((host, port)))
            );
        }
        assert_eq!(classify("::1:80"), Ok(std_addrs("::1:80")));
        let many = [v4, v6];
        assert_eq!(classify(&&many[..]), Ok(many.to_vec()));
        let empty: &[SocketAddr] = &[];
        assert_eq!(classify(&empty), Ok(vec![]));
        assert_eq!(classify(&&&v4), Ok(vec![v4]));

        let name = || Err(("localhost".to_string(), 80));
        assert_eq!(classify("localhost:80"), name());
        assert_eq!(classify(&"localhost:80".to_string()), name());
        assert_eq!(classify(&("localhost", 80)), name());
        assert_eq!(classify(&("localhost".to_string(), 80)), name());
    }

    #[test]
    fn malformed_strings_fail_without_a_lookup_like_std() {
        for s in [
            "localhost",
            "localhost:http",
            "localhost:65536",
            "127.0.0.1",
            "",
        ] {
            let ours = match s.lookup() {
                Ok(_) => panic!("{s:?} was accepted"),
                Err(e) => e,
            };
            let std = std::net::ToSocketAddrs::to_socket_addrs(s).expect_err("std refuses it");
            assert_eq!(ours.kind(), io::ErrorKind::InvalidInput, "{s:?}: {ours}");
            assert_eq!(ours.kind(), std.kind(), "{s:?}");
            assert_eq!(ours.to_string(), std.to_string(), "{s:?}");
        }
    }

    /// The worker keeps running fibers while one of them waits for a slow name lookup: on a
    /// one-worker scheduler, a fiber connects to [`SLOW_NAME`], whose stand-in resolver
    /// blocks its thread until a second fiber has ticked [`TICKS_WANTED`] times. With the
    /// lookup on the worker (as `std::net::ToSocketAddrs` would run it) the ticker never
    /// runs and the resolver gives up after [`LIMIT`], failing the connect.
    ///
    /// A stand-in because no real lookup can be made slow on purpose without a network or a
    /// nameserver under the test's control; the integration tests (`tests/net/resolve.rs`)
    /// check the real `getaddrinfo` path.
    #[test]
    fn a_slow_lookup_parks_only_its_fiber() {
        let sched = crate::Scheduler::builder()
            .threads(1)
            .name("resolve")
            .build()
            .unwrap();
        sched.start();
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let done = Arc::new(AtomicBool::new(false));

        let d = done.clone();
        let ticker = sched
            .submit(
                move || {
                    let deadline = Instant::now() + LIMIT;
                    while !d.load(Ordering::SeqCst) && Instant::now() < deadline {
                        TICKS.fetch_add(1, Ordering::SeqCst);
                        crate::sleep(Duration::from_millis(1));
                    }
                },
                None,
            )
            .unwrap();
        let d = done.clone();
        let client = sched
            .submit(
                move || {
                    let s = TcpStream::connect((SLOW_NAME, port));
                    d.store(true, Ordering::SeqCst);
                    s.and_then(|s| s.peer_addr())
                },
                None,
            )
            .unwrap();

        assert!(client.wait_timeout(2 * LIMIT), "the connect did not end");
        let peer = client.join().unwrap();
        assert!(ticker.wait_timeout(LIMIT), "the ticker did not end");
        assert_eq!(
            peer.expect("connect to the slow name"),
            SocketAddr::from((Ipv4Addr::LOCALHOST, port))
        );
        assert!(TICKS.load(Ordering::SeqCst) >= TICKS_WANTED);
        let thread = LOOKUP_THREAD.lock().unwrap().clone().unwrap_or_default();
        assert!(
            thread.starts_with("fibra-unblock"),
            "the lookup ran on {thread:?}, not on the blocking pool"
        );
        drop(listener);
        sched.stop();
    }
}
