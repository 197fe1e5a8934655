//! [`UdpSocket`]: std's UDP API, waiting in the reactor instead of the kernel.

use super::addr::{resolve, resolve_first, ToSocketAddrs};
use super::registration::{Registration, Timeouts, WRITABLE};
use super::tcp::fd_traits;
use nix::sys::socket::SockaddrStorage;
use std::io;
use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr};
use std::os::fd::AsRawFd;
use std::sync::Arc;
use std::time::Duration;

/// A UDP socket, like [`std::net::UdpSocket`]. Receiving (and sending into a full buffer)
/// suspends only the calling fiber; on a plain thread it blocks the thread, as std does.
///
/// ```
/// use fibra::net::UdpSocket;
///
/// let sched = fibra::Scheduler::builder().threads(1).build().unwrap();
/// sched.start();
/// let echo = UdpSocket::bind("127.0.0.1:0").unwrap();
/// let echo_addr = echo.local_addr().unwrap();
/// let server = sched.submit(move || {
///     let mut buf = [0u8; 64];
///     let (n, from) = echo.recv_from(&mut buf).unwrap();
///     echo.send_to(&buf[..n], from).unwrap();
/// }, None).unwrap();
/// let reply = sched.block_on(move || {
///     let client = UdpSocket::bind("127.0.0.1:0").unwrap();
///     client.connect(echo_addr).unwrap();
///     client.send(b"marco").unwrap();
///     let mut buf = [0u8; 64];
///     let n = client.recv(&mut buf).unwrap();
///     buf[..n].to_vec()
/// });
/// assert_eq!(reply, b"marco");
/// server.join().unwrap();
/// ```
pub struct UdpSocket {
    // Before `inner`: the fd leaves epoll before it is closed (see `Registration`).
    reg: Registration,
    inner: std::net::UdpSocket,
    timeouts: Arc<Timeouts>,
}

impl UdpSocket {
    /// Binds to `addr` (the first address that works, as std does). A host name is
    /// resolved without blocking the worker (see [`ToSocketAddrs`]).
    pub fn bind<A: ToSocketAddrs>(addr: A) -> io::Result<UdpSocket> {
        let addrs = resolve(&addr)?;
        Ok(UdpSocket::from(std::net::UdpSocket::bind(
            addrs.as_slice(),
        )?))
    }

    /// Sets the default destination of [`send`](UdpSocket::send) and the only source
    /// [`recv`](UdpSocket::recv) accepts (the first address that works, as std does). Does not
    /// wait for the peer: UDP has no handshake. A host name is resolved without blocking the
    /// worker (see [`ToSocketAddrs`]).
    pub fn connect<A: ToSocketAddrs>(&self, addr: A) -> io::Result<()> {
        let addrs = resolve(&addr)?;
        self.inner.connect(addrs.as_slice())
    }

    /// Sends `buf` to the connected peer; returns the bytes sent.
    pub fn send(&self, buf: &[u8]) -> io::Result<usize> {
        let fd = self.inner.as_raw_fd();
        self.reg.io(WRITABLE, self.timeouts.write_deadline(), || {
            super::send::send(fd, buf)
        })
    }

    /// Sends `buf` to `addr` (its first resolved address, as std does); returns the bytes
    /// sent. A host name is resolved without blocking the worker (see [`ToSocketAddrs`]), on
    /// every call: to send to a name often, resolve it once (`fibra::unblock(|| ...)` around
    /// std's `to_socket_addrs`) and pass the `SocketAddr`.
    pub fn send_to<A: ToSocketAddrs>(&self, buf: &[u8], addr: A) -> io::Result<usize> {
        let addr = SockaddrStorage::from(resolve_first(&addr)?);
        let fd = self.inner.as_raw_fd();
        self.reg.io(WRITABLE, self.timeouts.write_deadline(), || {
            super::send::send_to(fd, buf, &addr)
        })
    }

    /// Like [`recv`](UdpSocket::recv), but leaves the datagram queued.
    pub fn peek(&self, buf: &mut [u8]) -> io::Result<usize> {
        self.reg.recv_datagram(
            self.timeouts.read_deadline(),
            || self.inner.peek(buf),
            || Ok(0),
        )
    }

    /// Like [`recv_from`](UdpSocket::recv_from), but leaves the datagram queued.
    pub fn peek_from(&self, buf: &mut [u8]) -> io::Result<(usize, SocketAddr)> {
        self.reg.recv_datagram(
            self.timeouts.read_deadline(),
            || self.inner.peek_from(buf),
            || self.shut_recv_from(),
        )
    }

    /// What std's blocking `recv_from` returns once the receive side is shut down (by
    /// `shutdown(2)` on the fd: std's UDP socket has no method for it): the kernel's empty
    /// receive names no sender, which std refuses.
    fn shut_recv_from(&self) -> io::Result<(usize, SocketAddr)> {
        Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "the socket's receive side is shut down: no datagram, no sender",
        ))
    }

    /// The address this socket is bound to.
    pub fn local_addr(&self) -> io::Result<SocketAddr> {
        self.inner.local_addr()
    }

    /// The connected peer's address (`NotConnected` if there is none).
    pub fn peer_addr(&self) -> io::Result<SocketAddr> {
        self.inner.peer_addr()
    }

    /// Sets `SO_BROADCAST`.
    pub fn set_broadcast(&self, broadcast: bool) -> io::Result<()> {
        self.inner.set_broadcast(broadcast)
    }

    /// Reads `SO_BROADCAST`.
    pub fn broadcast(&self) -> io::Result<bool> {
        self.inner.broadcast()
    }

    /// Sets `IP_TTL`.
    pub fn set_ttl(&self, ttl: u32) -> io::Result<()> {
        self.inner.set_ttl(ttl)
    }

    /// Reads `IP_TTL`.
    pub fn ttl(&self) -> io::Result<u32> {
        self.inner.ttl()
    }

    /// Sets `IP_MULTICAST_LOOP`.
    pub fn set_multicast_loop_v4(&self, on: bool) -> io::Result<()> {
        self.inner.set_multicast_loop_v4(on)
    }

    /// Reads `IP_MULTICAST_LOOP`.
    pub fn multicast_loop_v4(&self) -> io::Result<bool> {
        self.inner.multicast_loop_v4()
    }

    /// Sets `IP_MULTICAST_TTL`.
    pub fn set_multicast_ttl_v4(&self, ttl: u32) -> io::Result<()> {
        self.inner.set_multicast_ttl_v4(ttl)
    }

    /// Reads `IP_MULTICAST_TTL`.
    pub fn multicast_ttl_v4(&self) -> io::Result<u32> {
        self.inner.multicast_ttl_v4()
    }

    /// Joins the IPv4 multicast group `multiaddr` on the interface with address `interface`
    /// (`UNSPECIFIED`: the system's choice).
    pub fn join_multicast_v4(&self, multiaddr: &Ipv4Addr, interface: &Ipv4Addr) -> io::Result<()> {
        self.inner.join_multicast_v4(multiaddr, interface)
    }

    /// Leaves an IPv4 multicast group joined with
    /// [`join_multicast_v4`](UdpSocket::join_multicast_v4).
    pub fn leave_multicast_v4(&self, multiaddr: &Ipv4Addr, interface: &Ipv4Addr) -> io::Result<()> {
        self.inner.leave_multicast_v4(multiaddr, interface)
    }

    /// Joins the IPv6 multicast group `multiaddr` on interface number `interface` (0: any).
    pub fn join_multicast_v6(&self, multiaddr: &Ipv6Addr, interface: u32) -> io::Result<()> {
        self.inner.join_multicast_v6(multiaddr, interface)
    }

    /// Leaves an IPv6 multicast group joined with
    /// [`join_multicast_v6`](UdpSocket::join_multicast_v6).
    pub fn leave_multicast_v6(&self, multiaddr: &Ipv6Addr, interface: u32) -> io::Result<()> {
        self.inner.leave_multicast_v6(multiaddr, interface)
    }

    /// Takes the pending socket error (`SO_ERROR`), such as an ICMP "port unreachable"
    /// reported for an earlier send.
    pub fn take_error(&self) -> io::Result<Option<io::Error>> {
        self.inner.take_error()
    }
}

datagram_recv!(UdpSocket, SocketAddr);
timed_socket!(UdpSocket, std::net::UdpSocket);

fd_traits!(UdpSocket, std::net::UdpSocket);
