//! [`TcpListener`] and [`TcpStream`]: std's TCP API, waiting in the reactor instead of the
//! kernel.

use super::addr::{resolve, ToSocketAddrs};
use super::registration::{Registration, Timeouts, READABLE, WRITABLE};
use super::socket::TcpSocket;
use crate::sys::deadline_after;
use nix::errno::Errno;
use nix::sys::socket::SockaddrStorage;
use std::io;
use std::net::{Shutdown, SocketAddr};
use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// A TCP socket server, like [`std::net::TcpListener`]; `accept` suspends only the calling
/// fiber.
pub struct TcpListener {
    // `reg` before `inner`: fields drop in order, and the fd must leave epoll before it is
    // closed (see `Registration`).
    reg: Registration,
    inner: std::net::TcpListener,
}

/// `IP_TTL` and `SO_ERROR`, forwarded to the std socket in `inner` (listeners and streams).
macro_rules! ip_socket_options {
    ($T:ident) => {
        impl $T {
            /// Sets `IP_TTL`.
            pub fn set_ttl(&self, ttl: u32) -> io::Result<()> {
                self.inner.set_ttl(ttl)
            }

            /// Reads `IP_TTL`.
            pub fn ttl(&self) -> io::Result<u32> {
                self.inner.ttl()
            }

            /// Takes the pending socket error (`SO_ERROR`).
            pub fn take_error(&self) -> io::Result<Option<io::Error>> {
                self.inner.take_error()
            }
        }
    };
}

/// The listen backlog of [`TcpListener::bind`], tokio's default.
const BACKLOG: u32 = 1024;

/// Calls `f` with each address `addr` names until one works, as std does; the last error
/// if none does.
fn each_addr<A: ToSocketAddrs + ?Sized, T>(
    addr: &A,
    mut f: impl FnMut(&SocketAddr) -> io::Result<T>,
) -> io::Result<T> {
    let mut last = None;
    for a in resolve(addr)? {
        match f(&a) {
            Ok(t) => return Ok(t),
            Err(e) => last = Some(e),
        }
    }
    Err(last.unwrap_or_else(|| {
        io::Error::new(
            io::ErrorKind::InvalidInput,
            "could not resolve to any addresses",
        )
    }))
}

impl TcpListener {
    /// Binds to `addr` and listens (the first address that works, as std does). A host name
    /// is resolved without blocking the worker (see [`ToSocketAddrs`]).
    ///
    /// The socket is set up as std sets up its listeners on Unix — close-on-exec,
    /// `SO_REUSEADDR` — but listens with a backlog of 1024 connections waiting to be
    /// accepted, as tokio's listeners do, instead of std's 128 (the kernel caps it at its
    /// `net.core.somaxconn`). With 128, a burst of a few hundred connects overflows the
    /// queue before the accept loop runs; the kernel drops the surplus SYNs and those
    /// clients retry only after a second or more. For another backlog, or other options
    /// before listening, use [`TcpSocket`](super::TcpSocket).
    pub fn bind<A: ToSocketAddrs>(addr: A) -> io::Result<TcpListener> {
        each_addr(&addr, |a| {
            let socket = TcpSocket::for_addr(a)?;
            socket.set_reuseaddr(true)?;
            socket.bind(*a)?;
            socket.listen(BACKLOG)
        })
    }

    /// Waits for a connection and returns it with the peer's address.
    ///
    /// # Errors
    /// As `accept(2)`. Some errors are about the process or the system, not the
    /// connection: `EMFILE` (out of descriptors), `ENFILE`, `ENOBUFS`, `ENOMEM`. The pending
    /// connection stays queued, so retrying at once fails again: an accept loop must not
    /// spin on them but back off and give the fibers that would close descriptors time to
    /// run, as Go's `http.Server` does — 5 ms, doubling up to 1 s, reset by a success:
    ///
    /// ```no_run
    /// use std::time::Duration;
    /// # fn serve(_: fibra::net::TcpStream) {}
    /// # let sched = fibra::Scheduler::builder().build().unwrap();
    /// # sched.start();
    /// # sched.block_on(|| {
    /// let listener = fibra::net::TcpListener::bind("127.0.0.1:8080")?;
    /// let mut delay = Duration::ZERO;
    /// loop {
    ///     match listener.accept() {
    ///         Ok((conn, _)) => {
    ///             delay = Duration::ZERO;
    ///             fibra::spawn(move || serve(conn));
    ///         }
    ///         Err(e) if matches!(
    ///             e.raw_os_error(),
    ///             Some(libc::EMFILE | libc::ENFILE | libc::ENOBUFS | libc::ENOMEM)
    ///         ) => {
    ///             delay = (delay * 2).clamp(Duration::from_millis(5), Duration::from_secs(1));
    ///             eprintln!("accept: {e}; retrying in {delay:?}");
    ///             fibra::sleep(delay);
    ///         }
    ///         // The peer gave up before we got to it, and the like: next one.
    ///         Err(e) => eprintln!("accept: {e}"),
    ///     }
    /// }
    /// # #[allow(unreachable_code)] std::io::Result::Ok(())
    /// # }).unwrap();
    /// ```
    ///
    /// Each call spends from the fiber's cooperative budget ([`crate::coop`]), so even a
    /// loop that retries at once lets the other fibers of its worker run now and then.
    pub fn accept(&self) -> io::Result<(TcpStream, SocketAddr)> {
        let (s, addr) = self.reg.io(READABLE, None, || self.inner.accept())?;
        Ok((TcpStream::from(s), addr))
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
    pub fn try_clone(&self) -> io::Result<TcpListener> {
        Ok(TcpListener::from(self.inner.try_clone()?))
    }
}

ip_socket_options!(TcpListener);

/// Iterator over [`TcpListener::accept`]ed streams; from [`TcpListener::incoming`].
pub struct Incoming<'a> {
    listener: &'a TcpListener,
}

impl Iterator for Incoming<'_> {
    type Item = io::Result<TcpStream>;
    fn next(&mut self) -> Option<io::Result<TcpStream>> {
        Some(self.listener.accept().map(|(s, _)| s))
    }
}

impl From<std::net::TcpListener> for TcpListener {
    /// Takes over a std listener, switching it to non-blocking mode.
    fn from(inner: std::net::TcpListener) -> Self {
        // Cannot fail on a valid socket; if it did, accept would block the thread, no worse.
        let _ = inner.set_nonblocking(true);
        let reg = Registration::new(inner.as_raw_fd());
        TcpListener { inner, reg }
    }
}

impl From<TcpListener> for std::net::TcpListener {
    /// Gives the socket back to std, in blocking mode again.
    fn from(l: TcpListener) -> Self {
        let TcpListener { inner, reg } = l;
        drop(reg);
        let _ = inner.set_nonblocking(false);
        inner
    }
}

/// A TCP connection, like [`std::net::TcpStream`]. Reads, writes and connects suspend only
/// the calling fiber. One fiber may read while another writes (`Read` and `Write` are
/// implemented for `&TcpStream` too).
pub struct TcpStream {
    // Before `inner`, as in `TcpListener`.
    reg: Registration,
    inner: std::net::TcpStream,
    timeouts: Arc<Timeouts>,
}

impl TcpStream {
    /// Connects to `addr`, trying each resolved address in turn like std. A host name is
    /// resolved without blocking the worker (see [`ToSocketAddrs`]).
    pub fn connect<A: ToSocketAddrs>(addr: A) -> io::Result<TcpStream> {
        crate::coop::spend();
        each_addr(&addr, |a| connect_addr(a, None))
    }

    /// Connects to `addr`, giving up after `timeout` with [`io::ErrorKind::TimedOut`].
    pub fn connect_timeout(addr: &SocketAddr, timeout: Duration) -> io::Result<TcpStream> {
        crate::coop::spend();
        if timeout.is_zero() {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "cannot set a 0 duration timeout",
            ));
        }
        connect_addr(addr, Some(deadline_after(timeout))).map_err(|e| {
            if e.kind() == io::ErrorKind::WouldBlock {
                io::Error::new(io::ErrorKind::TimedOut, "connection timed out")
            } else {
                e
            }
        })
    }

    /// The remote address.
    pub fn peer_addr(&self) -> io::Result<SocketAddr> {
        self.inner.peer_addr()
    }

    /// The local address.
    pub fn local_addr(&self) -> io::Result<SocketAddr> {
        self.inner.local_addr()
    }

    /// Shuts down the read, write or both halves. Fibers waiting on this socket wake and see
    /// the end-of-file or error.
    pub fn shutdown(&self, how: Shutdown) -> io::Result<()> {
        self.inner.shutdown(how)?;
        self.reg.wake(match how {
            Shutdown::Read => READABLE,
            Shutdown::Write => WRITABLE,
            Shutdown::Both => READABLE | WRITABLE,
        });
        Ok(())
    }

    /// Sets `TCP_NODELAY`.
    pub fn set_nodelay(&self, nodelay: bool) -> io::Result<()> {
        self.inner.set_nodelay(nodelay)
    }

    /// Reads `TCP_NODELAY`.
    pub fn nodelay(&self) -> io::Result<bool> {
        self.inner.nodelay()
    }

    /// Reads without consuming, waiting for data like `read`.
    pub fn peek(&self, buf: &mut [u8]) -> io::Result<usize> {
        self.reg.io(READABLE, self.timeouts.read_deadline(), || {
            self.inner.peek(buf)
        })
    }
}

ip_socket_options!(TcpStream);

timed_socket!(TcpStream, std::net::TcpStream);

/// A fresh socket for `addr`, connected by [`connect_spent`].
fn connect_addr(addr: &SocketAddr, deadline: Option<Instant>) -> io::Result<TcpStream> {
    connect_spent(TcpSocket::for_addr(addr)?.into_fd(), addr, deadline)
}

/// Connects the unconnected socket `fd` to `addr`: a non-blocking `connect(2)`, then a wait
/// in the reactor until the handshake ends; gives up with `WouldBlock` at `deadline`. The
/// one connect of [`TcpStream::connect`], [`TcpStream::connect_timeout`] and
/// [`TcpSocket::connect`], whose callers have spent the operation's unit of budget.
pub(super) fn connect_spent(
    fd: OwnedFd,
    addr: &SocketAddr,
    deadline: Option<Instant>,
) -> io::Result<TcpStream> {
    let stream = TcpStream::from(std::net::TcpStream::from(fd));
    match nix::sys::socket::connect(stream.as_raw_fd(), &SockaddrStorage::from(*addr)) {
        Ok(()) => return Ok(stream),
        // In progress (EINTR too: the connection carries on in the background).
        Err(Errno::EINPROGRESS) | Err(Errno::EINTR) => {}
        Err(e) => return Err(e.into()),
    }
    stream.reg.io_spent(WRITABLE, deadline, || {
        if let Some(e) = stream.inner.take_error()? {
            return Err(e);
        }
        match stream.inner.peer_addr() {
            Ok(_) => Ok(()),
            Err(e) if e.raw_os_error() == Some(libc::ENOTCONN) => {
                Err(io::ErrorKind::WouldBlock.into())
            }
            Err(e) => Err(e),
        }
    })?;
    Ok(stream)
}

stream_io!(TcpStream);

/// `Read` and `Write` for a stream type and for a shared reference to it, retried through the
/// reactor with the stream's timeouts. Reads are the std calls on `inner`; writes go through
/// `net::send`, so that neither `write` nor `write_vectored` can raise
/// `SIGPIPE` (std's `write_vectored` is a plain `writev`, which does).
///
/// Also the stream's non-waiting calls, `try_read` and `try_write`, and
/// `spawn_when_readable`, its readiness continuation.
macro_rules! stream_io {
    ($ty:ty) => {
        impl $ty {
            /// Reads what the socket has now, without waiting: `WouldBlock` if it has
            /// nothing. Ignores the read timeout. Pairs with
            #[doc = concat!("[`spawn_when_readable`](", stringify!($ty), "::spawn_when_readable)")]
            /// for code that lets go of the socket between readinesses.
            pub fn try_read(&self, buf: &mut [u8]) -> ::std::io::Result<usize> {
                self.reg.try_io($crate::net::registration::READABLE, || {
                    ::std::io::Read::read(&mut &self.inner, buf)
                })
            }

            /// Writes what the socket's buffer takes now, without waiting: `WouldBlock` if it
            /// takes nothing. Ignores the write timeout; never raises `SIGPIPE`.
            pub fn try_write(&self, buf: &[u8]) -> ::std::io::Result<usize> {
                self.reg.try_io($crate::net::registration::WRITABLE, || {
                    $crate::net::send::send(::std::os::fd::AsRawFd::as_raw_fd(&self.inner), buf)
                })
            }

            /// Hands the socket to `f`, run as a new task of the calling fiber's scheduler,
            /// once the socket is readable: it has data, or the peer hung up or the socket
            /// failed (so that `f`'s read returns 0 or the error). If it is readable now, the
            /// task is submitted at once.
            ///
            /// This is the way to wait for a request without a fiber. A fiber parked in `read`
            /// keeps its stack and stays on its worker (a started fiber never changes thread);
            /// a continuation keeps only its closure, and when the data comes the task may
            /// start on any worker, an idle one included. A server that serves each
            /// connection as a chain of such tasks holds no stack per idle connection, and a
            /// worker the kernel preempts holds none of its connections back: see
            /// `examples/http_cont.rs` and "Readiness continuations" in `docs/design.md`.
            ///
            /// Meant to follow a [`try_read`](Self::try_read) that returned `WouldBlock`. A
            /// readiness left over from before that call can start `f` once for nothing: `f`
            /// then gets `WouldBlock` again and registers anew.
            ///
            /// Until it is submitted the continuation counts as a live task: `stop` waits for
            /// it as for a fiber parked in `read`, [`Metrics::live_tasks`](crate::Metrics::live_tasks)
            /// counts it, and a `stop_timeout` that gives up waiting drops it unrun (dropping
            /// the socket closes it) and counts it among the cancelled. The socket's read
            /// timeout does not apply: nothing ends the wait but readiness or that
            /// cancellation. For an idle timeout, keep a `try_clone` of the socket and shut
            /// its reading side down when the time is up (`shutdown(Shutdown::Read)`, from a
            /// sleeping fiber or a timer): the task then runs and reads end of file. The task
            /// is detached, with the scheduler's stack size; a panic in it ends only that task.
            ///
            /// # Errors
            /// Nothing is registered, and the socket and `f` come back in the error, when it
            /// is called outside a fiber of a [`Scheduler`](crate::Scheduler), when that
            /// scheduler's shutdown has stopped waiting and cancels what is left (during a
            /// `stop` that still waits, its fibers may register, as they may spawn), or when
            /// the socket cannot be registered with the reactor.
            #[track_caller]
            pub fn spawn_when_readable<F>(
                self,
                f: F,
            ) -> ::std::result::Result<(), $crate::WhenReadableError<$ty, F>>
            where
                F: FnOnce($ty) + Send + 'static,
            {
                $crate::net::registration::spawn_when_readable(self, f, |s: &$ty| &s.reg)
            }

            /// Serves the connection with readiness continuations: each time the socket is
            /// readable (it has data, or the peer hung up), `handler` runs as a new task of
            /// the calling fiber's scheduler, on whichever worker takes it first, and its
            /// answer says whether to wait for the next readiness
            /// ([`Serve::Again`](crate::net::Serve::Again)) or to close the connection
            /// ([`Serve::Close`](crate::net::Serve::Close)).
            ///
            /// This is the way to write a latency-critical server. A fiber per connection
            /// parks in `read` between requests, holding a stack, on its worker: a started
            /// fiber never changes thread, so when the kernel preempts that worker (a load
            /// generator or another process shares the CPUs) the connection's next request
            /// waits until the worker runs again. Here a connection between requests is only
            /// its handler — a `Send` value that carries the connection's state (buffers, a
            /// parser) in its captures — and each turn is a fresh task on a stack from the
            /// worker's cache, which any worker, an idle one included, may start.
            ///
            /// Within a turn the handler is blocking-style code like any fiber's: it may
            /// `write_all` a response, `sleep`, lock, call the blocking pool; those park the
            /// turn's task. It should read with
            /// [`try_read`](Self::try_read) until `WouldBlock` and then return
            /// `Serve::Again` (with a partial request kept in its captures): a blocking
            /// `read` would hold the turn's fiber and stack until the client's next request,
            /// which is what `serve` exists to avoid. A turn that returns `Again` while the
            /// socket still has unread data runs again at once.
            ///
            /// The connection counts as a live task while it waits (see
            #[doc = concat!("[`spawn_when_readable`](", stringify!($ty), "::spawn_when_readable)):")]
            /// `stop` waits for it, and a `stop_timeout` that gives up drops it, which closes
            /// the socket. A panic in the handler ends that connection alone.
            ///
            /// # Errors
            /// As
            #[doc = concat!("[`spawn_when_readable`](", stringify!($ty), "::spawn_when_readable):")]
            /// nothing is registered, and the socket and the handler come back, when it is
            /// called outside a fiber of a [`Scheduler`](crate::Scheduler), when that
            /// scheduler cancels what is left of its work, or when the reactor refuses the
            /// socket. A later turn that cannot register closes the connection.
            #[track_caller]
            pub fn serve<F>(
                self,
                handler: F,
            ) -> ::std::result::Result<(), $crate::WhenReadableError<$ty, F>>
            where
                F: FnMut(&mut $ty) -> $crate::net::Serve + Send + 'static,
            {
                $crate::net::serve::serve(self, handler, |s: &$ty| &s.reg)
            }
        }

        impl ::std::io::Read for &$ty {
            fn read(&mut self, buf: &mut [u8]) -> ::std::io::Result<usize> {
                let deadline = self.timeouts.read_deadline();
                self.reg
                    .io($crate::net::registration::READABLE, deadline, || {
                        (&self.inner).read(buf)
                    })
            }

            fn read_vectored(
                &mut self,
                bufs: &mut [::std::io::IoSliceMut<'_>],
            ) -> ::std::io::Result<usize> {
                let deadline = self.timeouts.read_deadline();
                self.reg
                    .io($crate::net::registration::READABLE, deadline, || {
                        (&self.inner).read_vectored(bufs)
                    })
            }
        }

        impl ::std::io::Write for &$ty {
            fn write(&mut self, buf: &[u8]) -> ::std::io::Result<usize> {
                let deadline = self.timeouts.write_deadline();
                self.reg
                    .io($crate::net::registration::WRITABLE, deadline, || {
                        $crate::net::send::send(::std::os::fd::AsRawFd::as_raw_fd(&self.inner), buf)
                    })
            }

            fn write_vectored(
                &mut self,
                bufs: &[::std::io::IoSlice<'_>],
            ) -> ::std::io::Result<usize> {
                let deadline = self.timeouts.write_deadline();
                self.reg
                    .io($crate::net::registration::WRITABLE, deadline, || {
                        $crate::net::send::send_vectored(
                            ::std::os::fd::AsRawFd::as_raw_fd(&self.inner),
                            bufs,
                        )
                    })
            }

            fn flush(&mut self) -> ::std::io::Result<()> {
                Ok(())
            }
        }

        impl ::std::io::Read for $ty {
            fn read(&mut self, buf: &mut [u8]) -> ::std::io::Result<usize> {
                (&*self).read(buf)
            }

            fn read_vectored(
                &mut self,
                bufs: &mut [::std::io::IoSliceMut<'_>],
            ) -> ::std::io::Result<usize> {
                (&*self).read_vectored(bufs)
            }
        }

        impl ::std::io::Write for $ty {
            fn write(&mut self, buf: &[u8]) -> ::std::io::Result<usize> {
                (&*self).write(buf)
            }

            fn write_vectored(
                &mut self,
                bufs: &[::std::io::IoSlice<'_>],
            ) -> ::std::io::Result<usize> {
                (&*self).write_vectored(bufs)
            }

            fn flush(&mut self) -> ::std::io::Result<()> {
                Ok(())
            }
        }
    };
}

pub(crate) use stream_io;

/// The fd conversions, `From`/`Into` raw fds and `Debug` of a fibra socket type `$ty` that
/// wraps the std socket `$std` in a field `inner`; shared by every socket module.
macro_rules! fd_traits {
    ($ty:ty, $std:ty) => {
        impl ::std::os::fd::AsRawFd for $ty {
            fn as_raw_fd(&self) -> ::std::os::fd::RawFd {
                ::std::os::fd::AsRawFd::as_raw_fd(&self.inner)
            }
        }

        impl ::std::os::fd::AsFd for $ty {
            fn as_fd(&self) -> ::std::os::fd::BorrowedFd<'_> {
                ::std::os::fd::AsFd::as_fd(&self.inner)
            }
        }

        impl ::std::os::fd::IntoRawFd for $ty {
            /// Gives up the fd, in blocking mode again (as std's sockets are).
            fn into_raw_fd(self) -> ::std::os::fd::RawFd {
                ::std::os::fd::IntoRawFd::into_raw_fd(<$std>::from(self))
            }
        }

        impl ::std::os::fd::FromRawFd for $ty {
            /// Takes over `fd`, switching it to non-blocking mode.
            ///
            /// # Safety
            /// `fd` must be an open socket of the right kind that the caller owns.
            unsafe fn from_raw_fd(fd: ::std::os::fd::RawFd) -> Self {
                // SAFETY: the caller's contract, passed on to std.
                <$ty>::from(unsafe { <$std as ::std::os::fd::FromRawFd>::from_raw_fd(fd) })
            }
        }

        impl ::std::fmt::Debug for $ty {
            fn fmt(&self, f: &mut ::std::fmt::Formatter<'_>) -> ::std::fmt::Result {
                ::std::fmt::Debug::fmt(&self.inner, f)
            }
        }
    };
}
pub(crate) use fd_traits;

fd_traits!(TcpListener, std::net::TcpListener);
fd_traits!(TcpStream, std::net::TcpStream);
