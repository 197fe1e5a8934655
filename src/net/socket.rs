//! [`TcpSocket`]: a TCP socket to configure before it listens or connects.

use super::tcp::{connect_spent, TcpListener, TcpStream};
use nix::sys::socket::{
    self as sock, sockopt, AddressFamily, SockFlag, SockType, SockaddrLike, SockaddrStorage,
};
use std::fmt;
use std::io;
use std::net::{SocketAddr, SocketAddrV4, SocketAddrV6};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, IntoRawFd, OwnedFd, RawFd};
use std::time::Duration;

/// A TCP socket that has not yet become a listener or a connection, to set options first
/// — the shape of tokio's `TcpSocket`. [`listen`](TcpSocket::listen) turns it into a
/// [`TcpListener`], [`connect`](TcpSocket::connect) into a [`TcpStream`].
///
/// The socket is created non-blocking and close-on-exec. Only `connect` may wait: it
/// suspends just the calling fiber (a plain thread blocks), exactly like
/// [`TcpStream::connect`]. The option setters and getters are the plain `setsockopt(2)` and
/// `getsockopt(2)` calls and never wait.
///
/// ```
/// use std::io::{Read, Write};
/// use fibra::net::TcpSocket;
///
/// let sched = fibra::Scheduler::builder().threads(2).build()?;
/// sched.start();
/// let socket = TcpSocket::new_v4()?;
/// socket.set_reuseaddr(true)?;
/// socket.bind("127.0.0.1:0".parse().unwrap())?;
/// let listener = socket.listen(64)?;
/// let addr = listener.local_addr()?;
/// let client = sched.submit(move || -> std::io::Result<()> {
///     let socket = TcpSocket::new_v4()?;
///     socket.set_nodelay(true)?;
///     let mut stream = socket.connect(addr)?; // suspends only this fiber
///     stream.write_all(b"hi")
/// }, None).unwrap();
/// let (mut conn, _) = listener.accept()?;
/// let mut buf = [0u8; 2];
/// conn.read_exact(&mut buf)?;
/// assert_eq!(&buf, b"hi");
/// client.join().unwrap()?;
/// sched.stop();
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub struct TcpSocket {
    fd: OwnedFd,
}

/// A `u32` option value as the kernel's `int`: larger values saturate (the kernel clamps
/// them to its own maximum anyway).
fn saturate(n: u32) -> usize {
    n.min(i32::MAX as u32) as usize
}

impl TcpSocket {
    /// A new IPv4 TCP socket (`AF_INET`), non-blocking and close-on-exec.
    pub fn new_v4() -> io::Result<TcpSocket> {
        TcpSocket::new(AddressFamily::Inet)
    }

    /// A new IPv6 TCP socket (`AF_INET6`), non-blocking and close-on-exec.
    pub fn new_v6() -> io::Result<TcpSocket> {
        TcpSocket::new(AddressFamily::Inet6)
    }

    /// A new socket of the family `addr` belongs to.
    pub(super) fn for_addr(addr: &SocketAddr) -> io::Result<TcpSocket> {
        match addr {
            SocketAddr::V4(_) => TcpSocket::new_v4(),
            SocketAddr::V6(_) => TcpSocket::new_v6(),
        }
    }

    /// The socket's fd, still non-blocking.
    pub(super) fn into_fd(self) -> OwnedFd {
        self.fd
    }

    fn new(family: AddressFamily) -> io::Result<TcpSocket> {
        let fd = sock::socket(
            family,
            SockType::Stream,
            SockFlag::SOCK_NONBLOCK | SockFlag::SOCK_CLOEXEC,
            None,
        )?;
        Ok(TcpSocket { fd })
    }

    /// Sets `SO_REUSEADDR`: whether `bind` may reuse a local address that connections
    /// closed a moment ago still hold (in `TIME_WAIT`). [`TcpListener::bind`] sets it, as
    /// std does on Unix.
    pub fn set_reuseaddr(&self, reuseaddr: bool) -> io::Result<()> {
        Ok(sock::setsockopt(&self.fd, sockopt::ReuseAddr, &reuseaddr)?)
    }

    /// Reads `SO_REUSEADDR`.
    pub fn reuseaddr(&self) -> io::Result<bool> {
        Ok(sock::getsockopt(&self.fd, sockopt::ReuseAddr)?)
    }

    /// Sets `SO_REUSEPORT`: several sockets that all set it (as the same user) may bind the
    /// same address and port; the kernel spreads incoming connections over their listeners.
    pub fn set_reuseport(&self, reuseport: bool) -> io::Result<()> {
        Ok(sock::setsockopt(&self.fd, sockopt::ReusePort, &reuseport)?)
    }

    /// Reads `SO_REUSEPORT`.
    pub fn reuseport(&self) -> io::Result<bool> {
        Ok(sock::getsockopt(&self.fd, sockopt::ReusePort)?)
    }

    /// Sets the send buffer size (`SO_SNDBUF`). Linux doubles the value (for its own
    /// bookkeeping) and clamps it to its limits, so [`send_buffer_size`] reads back about
    /// twice `size`; sizes beyond `i32::MAX` saturate.
    ///
    /// [`send_buffer_size`]: TcpSocket::send_buffer_size
    pub fn set_send_buffer_size(&self, size: u32) -> io::Result<()> {
        Ok(sock::setsockopt(
            &self.fd,
            sockopt::SndBuf,
            &saturate(size),
        )?)
    }

    /// Reads the send buffer size (`SO_SNDBUF`), as the kernel reports it.
    pub fn send_buffer_size(&self) -> io::Result<u32> {
        let n = sock::getsockopt(&self.fd, sockopt::SndBuf)?;
        Ok(u32::try_from(n).unwrap_or(u32::MAX))
    }

    /// Sets the receive buffer size (`SO_RCVBUF`); Linux doubles and clamps it as for
    /// [`set_send_buffer_size`](TcpSocket::set_send_buffer_size).
    pub fn set_recv_buffer_size(&self, size: u32) -> io::Result<()> {
        Ok(sock::setsockopt(
            &self.fd,
            sockopt::RcvBuf,
            &saturate(size),
        )?)
    }

    /// Reads the receive buffer size (`SO_RCVBUF`), as the kernel reports it.
    pub fn recv_buffer_size(&self) -> io::Result<u32> {
        let n = sock::getsockopt(&self.fd, sockopt::RcvBuf)?;
        Ok(u32::try_from(n).unwrap_or(u32::MAX))
    }

    /// Sets `TCP_NODELAY` (no Nagle delay for small writes); a stream from
    /// [`connect`](TcpSocket::connect) keeps it.
    pub fn set_nodelay(&self, nodelay: bool) -> io::Result<()> {
        Ok(sock::setsockopt(&self.fd, sockopt::TcpNoDelay, &nodelay)?)
    }

    /// Reads `TCP_NODELAY`.
    pub fn nodelay(&self) -> io::Result<bool> {
        Ok(sock::getsockopt(&self.fd, sockopt::TcpNoDelay)?)
    }

    /// Sets `SO_LINGER`. `None` (the default): closing returns at once and the kernel sends
    /// what is left in the background. `Some(d)`: closing a blocking socket waits up to `d`
    /// for unsent data to go out; `Some(Duration::ZERO)` makes close discard unsent data and
    /// reset the connection. The kernel counts whole seconds: the fraction of `d` is
    /// dropped, and more than `i32::MAX` seconds saturates.
    pub fn set_linger(&self, linger: Option<Duration>) -> io::Result<()> {
        let value = libc::linger {
            l_onoff: linger.is_some().into(),
            l_linger: linger.map_or(0, |d| {
                libc::c_int::try_from(d.as_secs()).unwrap_or(libc::c_int::MAX)
            }),
        };
        Ok(sock::setsockopt(&self.fd, sockopt::Linger, &value)?)
    }

    /// Reads `SO_LINGER`, in whole seconds.
    pub fn linger(&self) -> io::Result<Option<Duration>> {
        let value = sock::getsockopt(&self.fd, sockopt::Linger)?;
        Ok((value.l_onoff != 0)
            .then(|| Duration::from_secs(u64::try_from(value.l_linger).unwrap_or(0))))
    }

    /// The local address: the one given to [`bind`](TcpSocket::bind), with the port the
    /// kernel chose for port 0; the unspecified address and port 0 before any bind.
    pub fn local_addr(&self) -> io::Result<SocketAddr> {
        let addr: SockaddrStorage = sock::getsockname(self.fd.as_raw_fd())?;
        if let Some(a) = addr.as_sockaddr_in() {
            Ok(SocketAddrV4::from(*a).into())
        } else if let Some(a) = addr.as_sockaddr_in6() {
            Ok(SocketAddrV6::from(*a).into())
        } else {
            Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!("not an IP socket address: family {:?}", addr.family()),
            ))
        }
    }

    /// Binds the socket to `addr` (port 0: the kernel picks a free port). Fails with
    /// `AddrInUse` if another socket holds the address, unless both set
    /// [`set_reuseport`](TcpSocket::set_reuseport).
    pub fn bind(&self, addr: SocketAddr) -> io::Result<()> {
        Ok(sock::bind(
            self.fd.as_raw_fd(),
            &SockaddrStorage::from(addr),
        )?)
    }

    /// Starts listening, with at most `backlog` connections waiting to be accepted (the
    /// kernel caps it at its `net.core.somaxconn`; values beyond `i32::MAX` saturate). An
    /// unbound socket listens on an ephemeral port of every address. Never waits.
    pub fn listen(self, backlog: u32) -> io::Result<TcpListener> {
        let backlog = libc::c_int::try_from(backlog).unwrap_or(libc::c_int::MAX);
        // SAFETY: `listen(2)` takes a descriptor, which `self.fd` keeps open for this
        // call, and an integer; it touches no memory of ours.
        if unsafe { libc::listen(self.fd.as_raw_fd(), backlog) } == -1 {
            return Err(io::Error::last_os_error());
        }
        Ok(TcpListener::from(std::net::TcpListener::from(self.fd)))
    }

    /// Connects to `addr`, as [`TcpStream::connect`] does: the connect is non-blocking and
    /// only the calling fiber waits for the handshake (a plain thread blocks). Options set
    /// before stay on the stream. Fails like `connect(2)`: `ConnectionRefused` when nothing
    /// listens at `addr`, an error when `addr` is not of the socket's family.
    pub fn connect(self, addr: SocketAddr) -> io::Result<TcpStream> {
        crate::coop::spend();
        connect_spent(self.fd, &addr, None)
    }
}

impl AsRawFd for TcpSocket {
    fn as_raw_fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }
}

impl AsFd for TcpSocket {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }
}

impl IntoRawFd for TcpSocket {
    /// Gives up the fd, in blocking mode (as std's sockets are and fibra's other sockets
    /// give theirs up); still close-on-exec.
    fn into_raw_fd(self) -> RawFd {
        set_nonblocking(self.fd, false).into_raw_fd()
    }
}

impl FromRawFd for TcpSocket {
    /// Takes over `fd`, switching it to non-blocking mode.
    ///
    /// # Safety
    /// `fd` must be an open socket that the caller owns. `listen` and `connect` work only
    /// on a TCP socket that neither listens nor is connected.
    unsafe fn from_raw_fd(fd: RawFd) -> TcpSocket {
        // SAFETY: the caller's contract: `fd` is open and theirs to give away.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        TcpSocket {
            fd: set_nonblocking(fd, true),
        }
    }
}

/// `fd` switched to (non-)blocking mode, through std's `set_nonblocking` (`FIONBIO`), which
/// works on any socket. It cannot fail on a valid socket; if it did, the mode would stay as
/// it was — no harm for `from_raw_fd`, as `listen` and `connect` switch the fd again when it
/// becomes a fibra listener or stream.
fn set_nonblocking(fd: OwnedFd, nonblocking: bool) -> OwnedFd {
    let socket = std::net::TcpStream::from(fd);
    let _ = socket.set_nonblocking(nonblocking);
    OwnedFd::from(socket)
}

impl fmt::Debug for TcpSocket {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut d = f.debug_struct("TcpSocket");
        if let Ok(addr) = self.local_addr() {
            d.field("addr", &addr);
        }
        d.field("fd", &self.fd.as_raw_fd()).finish()
    }
}
