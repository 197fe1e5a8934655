//! Unix-domain sockets with the API of [`std::os::unix::net`]: [`UnixListener`],
//! [`UnixStream`] and [`UnixDatagram`], waiting in the reactor instead of the kernel.
//!
//! Two waits the kernel never reports as readiness are retried after short, growing sleeps
//! instead (50 µs up to 10 ms): connecting to a listener whose backlog is full, and sending a
//! datagram to an unconnected peer whose receive queue is full. Both are overload cases; std
//! blocks the thread in them, fibra blocks only the fiber.
//!
//! ```
//! use std::io::{Read, Write};
//! use fibra::net::unix::UnixStream;
//!
//! let sched = fibra::Scheduler::builder().threads(1).build().unwrap();
//! sched.start();
//! let (a, mut b) = UnixStream::pair().unwrap();
//! let echo = sched.submit(move || {
//!     let mut buf = [0u8; 5];
//!     b.read_exact(&mut buf).unwrap();
//!     b.write_all(&buf).unwrap();
//! }, None).unwrap();
//! let got = sched.block_on(move || {
//!     (&a).write_all(b"hello").unwrap();
//!     let mut buf = [0u8; 5];
//!     (&a).read_exact(&mut buf).unwrap();
//!     buf
//! });
//! assert_eq!(&got, b"hello");
//! echo.join().unwrap();
//! ```

use super::registration::{Registration, Timeouts, READABLE, READ_SHUT, WRITABLE};
use super::tcp::{fd_traits, stream_io};
use nix::errno::Errno;
use nix::sys::socket::{AddressFamily, MsgFlags, SockFlag, SockType, UnixAddr};
use std::io;
use std::net::Shutdown;
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::linux::net::SocketAddrExt;
use std::os::unix::net::{self as stdunix, SocketAddr};
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// First pause of a retry the kernel gives no readiness event for.
const MIN_RETRY_PAUSE: Duration = Duration::from_micros(50);
/// Longest pause between such retries.
const MAX_RETRY_PAUSE: Duration = Duration::from_millis(10);

/// Runs `op` until it does not fail with `WouldBlock`, sleeping between tries (the fiber
/// only, in a fiber) with pauses growing from [`MIN_RETRY_PAUSE`] to [`MAX_RETRY_PAUSE`];
/// gives up with `WouldBlock` at `deadline`. For the waits no epoll event ends.
fn retry_sleeping<R>(
    deadline: Option<Instant>,
    mut op: impl FnMut() -> io::Result<R>,
) -> io::Result<R> {
    let mut pause = MIN_RETRY_PAUSE;
    loop {
        match op() {
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            r => return r,
        }
        let now = Instant::now();
        let wake = match deadline {
            Some(d) if d <= now => {
                return Err(io::Error::new(
                    io::ErrorKind::WouldBlock,
                    "timed out waiting for the socket",
                ))
            }
            Some(d) => d.min(now + pause),
            None => now + pause,
        };
        crate::time::sleep_until(wake);
        pause = (pause * 2).min(MAX_RETRY_PAUSE);
    }
}

/// The `nix` form of a std Unix socket address (path or abstract name).
fn nix_addr(addr: &SocketAddr) -> io::Result<UnixAddr> {
    if let Some(path) = addr.as_pathname() {
        Ok(UnixAddr::new(path)?)
    } else if let Some(name) = addr.as_abstract_name() {
        Ok(UnixAddr::new_abstract(name)?)
    } else {
        Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "cannot connect or send to an unnamed address",
        ))
    }
}

fn new_socket(ty: SockType) -> io::Result<OwnedFd> {
    Ok(nix::sys::socket::socket(
        AddressFamily::Unix,
        ty,
        SockFlag::SOCK_NONBLOCK | SockFlag::SOCK_CLOEXEC,
        None,
    )?)
}

/// A Unix-domain stream socket server, like [`std::os::unix::net::UnixListener`]; `accept`
/// suspends only the calling fiber.
///
/// ```
/// use std::io::{Read, Write};
/// use fibra::net::unix::{UnixListener, UnixStream};
///
/// let dir = std::env::temp_dir().join(format!("fibra-doc-listener-{}", std::process::id()));
/// std::fs::create_dir_all(&dir).unwrap();
/// let path = dir.join("sock");
/// let _ = std::fs::remove_file(&path);
/// let listener = UnixListener::bind(&path).unwrap();
///
/// let sched = fibra::Scheduler::builder().threads(2).build().unwrap();
/// sched.start();
/// let server = sched.submit(move || {
///     let (mut conn, _) = listener.accept().unwrap();
///     conn.write_all(b"hi").unwrap();
/// }, None).unwrap();
/// let p = path.clone();
/// let got = sched.block_on(move || {
///     let mut s = UnixStream::connect(&p).unwrap();
///     let mut got = String::new();
///     s.read_to_string(&mut got).unwrap();
///     got
/// });
/// assert_eq!(got, "hi");
/// server.join().unwrap();
/// std::fs::remove_dir_all(&dir).unwrap();
/// ```
pub struct UnixListener {
    // Before `inner`: the fd leaves epoll before it is closed (see `Registration`).
    reg: Registration,
    inner: stdunix::UnixListener,
}

impl UnixListener {
    /// Creates a listener bound to the filesystem path `path` (which must not exist).
    pub fn bind<P: AsRef<Path>>(path: P) -> io::Result<UnixListener> {
        Ok(UnixListener::from(stdunix::UnixListener::bind(path)?))
    }

    /// Creates a listener bound to `addr` (a path or, on Linux, an abstract name).
    pub fn bind_addr(addr: &SocketAddr) -> io::Result<UnixListener> {
        Ok(UnixListener::from(stdunix::UnixListener::bind_addr(addr)?))
    }

    /// Waits for a connection and returns it with the peer's address.
    pub fn accept(&self) -> io::Result<(UnixStream, SocketAddr)> {
        let (s, addr) = self.reg.io(READABLE, None, || self.inner.accept())?;
        Ok((UnixStream::from(s), addr))
    }

    /// An endless iterator of accepted connections, like std's.
    pub fn incoming(&self) -> Incoming<'_> {
        Incoming { listener: self }
    }

    /// The address this listener is bound to.
    pub fn local_addr(&self) -> io::Result<SocketAddr> {
        self.inner.local_addr()
    }

    /// Another handle to the same socket (a duplicated fd).
    pub fn try_clone(&self) -> io::Result<UnixListener> {
        Ok(UnixListener::from(self.inner.try_clone()?))
    }

    /// Takes the pending socket error (`SO_ERROR`).
    pub fn take_error(&self) -> io::Result<Option<io::Error>> {
        self.inner.take_error()
    }
}

/// Iterator over [`UnixListener::accept`]ed streams; from [`UnixListener::incoming`].
pub struct Incoming<'a> {
    listener: &'a UnixListener,
}

impl Iterator for Incoming<'_> {
    type Item = io::Result<UnixStream>;
    fn next(&mut self) -> Option<io::Result<UnixStream>> {
        Some(self.listener.accept().map(|(s, _)| s))
    }
}

impl From<stdunix::UnixListener> for UnixListener {
    /// Takes over a std listener, switching it to non-blocking mode.
    fn from(inner: stdunix::UnixListener) -> Self {
        // Cannot fail on a valid socket; if it did, accept would block the thread, no worse.
        let _ = inner.set_nonblocking(true);
        UnixListener {
            reg: Registration::new(inner.as_raw_fd()),
            inner,
        }
    }
}

impl From<UnixListener> for stdunix::UnixListener {
    /// Gives the socket back to std, in blocking mode again.
    fn from(l: UnixListener) -> Self {
        let UnixListener { inner, reg } = l;
        drop(reg);
        let _ = inner.set_nonblocking(false);
        inner
    }
}

/// A Unix-domain stream socket, like [`std::os::unix::net::UnixStream`]. Reads, writes and
/// connects suspend only the calling fiber. One fiber may read while another writes (`Read`
/// and `Write` are implemented for `&UnixStream` too).
pub struct UnixStream {
    // Before `inner`: the fd leaves epoll before it is closed (see `Registration`).
    reg: Registration,
    inner: stdunix::UnixStream,
    timeouts: Arc<Timeouts>,
}

impl UnixStream {
    /// Connects to the socket bound at `path`.
    pub fn connect<P: AsRef<Path>>(path: P) -> io::Result<UnixStream> {
        connect_stream(&UnixAddr::new(path.as_ref())?)
    }

    /// Connects to the socket bound at `addr` (a path or, on Linux, an abstract name).
    pub fn connect_addr(addr: &SocketAddr) -> io::Result<UnixStream> {
        connect_stream(&nix_addr(addr)?)
    }

    /// An unnamed pair of connected sockets.
    pub fn pair() -> io::Result<(UnixStream, UnixStream)> {
        let (a, b) = stdunix::UnixStream::pair()?;
        Ok((UnixStream::from(a), UnixStream::from(b)))
    }

    /// The local address.
    pub fn local_addr(&self) -> io::Result<SocketAddr> {
        self.inner.local_addr()
    }

    /// The remote address.
    pub fn peer_addr(&self) -> io::Result<SocketAddr> {
        self.inner.peer_addr()
    }

    /// Shuts down the read, write or both halves. Fibers waiting on this socket wake and see
    /// the end-of-file or error.
    pub fn shutdown(&self, how: Shutdown) -> io::Result<()> {
        self.inner.shutdown(how)?;
        self.reg.wake(shutdown_bits(how));
        Ok(())
    }

    /// Reads without consuming, waiting for data like `read`.
    pub fn peek(&self, buf: &mut [u8]) -> io::Result<usize> {
        peek(&self.reg, &self.timeouts, self.inner.as_raw_fd(), buf)
    }

    /// Takes the pending socket error (`SO_ERROR`).
    pub fn take_error(&self) -> io::Result<Option<io::Error>> {
        self.inner.take_error()
    }
}

timed_socket!(UnixStream, stdunix::UnixStream);

fn shutdown_bits(how: Shutdown) -> u32 {
    match how {
        Shutdown::Read => READABLE | READ_SHUT,
        Shutdown::Write => WRITABLE,
        Shutdown::Both => READABLE | READ_SHUT | WRITABLE,
    }
}

/// A non-blocking connect. A Unix stream connect completes at once or fails with `EAGAIN`
/// when the listener's backlog is full, which no readiness event announces the end of: retry.
fn connect_stream(addr: &UnixAddr) -> io::Result<UnixStream> {
    let stream = UnixStream::from(stdunix::UnixStream::from(new_socket(SockType::Stream)?));
    retry_sleeping(None, || {
        match nix::sys::socket::connect(stream.as_raw_fd(), addr) {
            Ok(()) => Ok(()),
            Err(Errno::EAGAIN) => Err(io::ErrorKind::WouldBlock.into()),
            Err(e) => Err(e.into()),
        }
    })?;
    Ok(stream)
}

stream_io!(UnixStream);

/// A Unix-domain datagram socket, like [`std::os::unix::net::UnixDatagram`]. Receives (and
/// sends into a full queue) suspend only the calling fiber.
///
/// ```
/// use fibra::net::unix::UnixDatagram;
///
/// let sched = fibra::Scheduler::builder().threads(1).build().unwrap();
/// sched.start();
/// let (a, b) = UnixDatagram::pair().unwrap();
/// let receiver = sched.submit(move || {
///     let mut buf = [0u8; 16];
///     let n = b.recv(&mut buf).unwrap();
///     buf[..n].to_vec()
/// }, None).unwrap();
/// a.send(b"datagram").unwrap();
/// assert_eq!(receiver.join().unwrap(), b"datagram");
/// ```
pub struct UnixDatagram {
    // Before `inner`: the fd leaves epoll before it is closed (see `Registration`).
    reg: Registration,
    inner: stdunix::UnixDatagram,
    timeouts: Arc<Timeouts>,
}

impl UnixDatagram {
    /// Creates a socket bound to the filesystem path `path` (which must not exist).
    pub fn bind<P: AsRef<Path>>(path: P) -> io::Result<UnixDatagram> {
        Ok(UnixDatagram::from(stdunix::UnixDatagram::bind(path)?))
    }

    /// Creates a socket bound to `addr` (a path or, on Linux, an abstract name).
    pub fn bind_addr(addr: &SocketAddr) -> io::Result<UnixDatagram> {
        Ok(UnixDatagram::from(stdunix::UnixDatagram::bind_addr(addr)?))
    }

    /// Creates a socket bound to no address.
    pub fn unbound() -> io::Result<UnixDatagram> {
        Ok(UnixDatagram::from(stdunix::UnixDatagram::unbound()?))
    }

    /// An unnamed pair of connected sockets.
    pub fn pair() -> io::Result<(UnixDatagram, UnixDatagram)> {
        let (a, b) = stdunix::UnixDatagram::pair()?;
        Ok((UnixDatagram::from(a), UnixDatagram::from(b)))
    }

    /// Sets the default destination of [`send`](UnixDatagram::send) and the only source
    /// [`recv`](UnixDatagram::recv) accepts. Does not wait.
    pub fn connect<P: AsRef<Path>>(&self, path: P) -> io::Result<()> {
        self.inner.connect(path)
    }

    /// Like [`connect`](UnixDatagram::connect), to a path or abstract address.
    pub fn connect_addr(&self, addr: &SocketAddr) -> io::Result<()> {
        self.inner.connect_addr(addr)
    }

    /// The address this socket is bound to.
    pub fn local_addr(&self) -> io::Result<SocketAddr> {
        self.inner.local_addr()
    }

    /// The connected peer's address.
    pub fn peer_addr(&self) -> io::Result<SocketAddr> {
        self.inner.peer_addr()
    }

    /// Sends `buf` to the connected peer; returns the bytes sent.
    pub fn send(&self, buf: &[u8]) -> io::Result<usize> {
        let fd = self.inner.as_raw_fd();
        self.reg.io(WRITABLE, self.timeouts.write_deadline(), || {
            super::send::send(fd, buf)
        })
    }

    /// Sends `buf` to the socket bound at `path`; returns the bytes sent.
    ///
    /// If the receiver's queue is full, the send is retried after short sleeps until it
    /// fits (or the write timeout ends it): for an unconnected sender the kernel reports no
    /// event when that queue drains.
    pub fn send_to<P: AsRef<Path>>(&self, buf: &[u8], path: P) -> io::Result<usize> {
        self.send_to_nix(buf, &UnixAddr::new(path.as_ref())?)
    }

    /// Like [`send_to`](UnixDatagram::send_to), to a path or abstract address.
    pub fn send_to_addr(&self, buf: &[u8], addr: &SocketAddr) -> io::Result<usize> {
        self.send_to_nix(buf, &nix_addr(addr)?)
    }

    fn send_to_nix(&self, buf: &[u8], addr: &UnixAddr) -> io::Result<usize> {
        let fd = self.inner.as_raw_fd();
        retry_sleeping(self.timeouts.write_deadline(), || {
            super::send::send_to(fd, buf, addr)
        })
    }

    /// Like [`recv`](UnixDatagram::recv), but leaves the datagram queued.
    pub fn peek(&self, buf: &mut [u8]) -> io::Result<usize> {
        peek(&self.reg, &self.timeouts, self.inner.as_raw_fd(), buf)
    }

    /// Shuts down the read, write or both halves. Fibers waiting on this socket wake and see
    /// the end-of-file or error.
    pub fn shutdown(&self, how: Shutdown) -> io::Result<()> {
        self.inner.shutdown(how)?;
        self.reg.wake(shutdown_bits(how));
        Ok(())
    }

    /// Takes the pending socket error (`SO_ERROR`).
    pub fn take_error(&self) -> io::Result<Option<io::Error>> {
        self.inner.take_error()
    }
}

datagram_recv!(UnixDatagram, SocketAddr);

impl UnixDatagram {
    /// What std's blocking `recv_from` returns once the receive side is shut down: no bytes,
    /// from an unnamed address (the kernel's empty receive names none).
    fn shut_recv_from(&self) -> io::Result<(usize, SocketAddr)> {
        Ok((0, stdunix::UnixDatagram::unbound()?.local_addr()?))
    }
}
timed_socket!(UnixDatagram, stdunix::UnixDatagram);

fd_traits!(UnixListener, stdunix::UnixListener);
fd_traits!(UnixStream, stdunix::UnixStream);
fd_traits!(UnixDatagram, stdunix::UnixDatagram);

/// `recv(MSG_PEEK)` through the reactor: std's Unix sockets have no `peek`.
fn peek(
    reg: &Registration,
    timeouts: &Timeouts,
    fd: std::os::fd::RawFd,
    buf: &mut [u8],
) -> io::Result<usize> {
    // A stream's receive never fails with `WouldBlock` once shut down: `shut` is for a
    // datagram socket's.
    reg.recv_datagram(
        timeouts.read_deadline(),
        || Ok(nix::sys::socket::recv(fd, buf, MsgFlags::MSG_PEEK)?),
        || Ok(0),
    )
}
