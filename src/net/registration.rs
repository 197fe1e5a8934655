//! What every fibra socket shares: its lazy registration with the reactor, the retry loop
//! around non-blocking system calls, and std-style timeouts.

use crate::error::WhenReadableError;
use crate::io::reactor::{reactor, Continuation, IoRecord, GONE};
use crate::sys::deadline_after;
use std::io;
use std::os::fd::RawFd;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

pub(crate) use crate::io::reactor::{READABLE, READ_SHUT, WRITABLE};

/// A socket's link to the reactor, made the first time the socket has to wait.
///
/// Drop it *before* closing the fd (declare it before the socket in a struct): deregistering
/// goes by fd number, and once the fd is closed another thread may reuse that number for a
/// socket of its own, whose registration `EPOLL_CTL_DEL` would then remove.
pub(crate) struct Registration {
    fd: RawFd,
    record: OnceLock<Arc<IoRecord>>,
}

impl Registration {
    pub(crate) fn new(fd: RawFd) -> Self {
        // The socket waits through this registration: hooked calls on it pass through.
        #[cfg(feature = "hook")]
        crate::hook::fd::own(fd);
        Registration {
            fd,
            record: OnceLock::new(),
        }
    }

    fn record(&self) -> io::Result<&Arc<IoRecord>> {
        if let Some(r) = self.record.get() {
            return Ok(r);
        }
        let r = crate::io::reactor::registering()?.register(self.fd)?;
        // A concurrent first wait may have won; the reactor returned the same record then.
        let _ = self.record.set(r);
        Ok(self.record.get().expect("just set"))
    }

    /// Runs `op` until it does not fail with `WouldBlock`, waiting for `interest` between
    /// tries; gives up with `WouldBlock` at `deadline`. Spends one unit of the cooperative
    /// budget first.
    pub(crate) fn io<R>(
        &self,
        interest: u32,
        deadline: Option<Instant>,
        op: impl FnMut() -> io::Result<R>,
    ) -> io::Result<R> {
        crate::coop::spend();
        self.io_spent(interest, deadline, op)
    }

    /// [`io`](Registration::io) for an operation that spent its unit of budget already,
    /// before a first system call of its own (a connect: it spends even when `connect(2)`
    /// fails at once, and must not spend twice when it then waits).
    pub(crate) fn io_spent<R>(
        &self,
        interest: u32,
        deadline: Option<Instant>,
        op: impl FnMut() -> io::Result<R>,
    ) -> io::Result<R> {
        self.io_or_shut(interest, deadline, op, None::<fn() -> io::Result<R>>)
    }

    /// [`io`](Registration::io) for a datagram socket's receive: once the socket's receive
    /// side is shut down (by `shutdown`, here or on any thread), its non-blocking receive
    /// still fails with `WouldBlock`, where a blocking one returns at once what `shut`
    /// makes (0 bytes).
    pub(crate) fn recv_datagram<R>(
        &self,
        deadline: Option<Instant>,
        op: impl FnMut() -> io::Result<R>,
        shut: impl FnOnce() -> io::Result<R>,
    ) -> io::Result<R> {
        crate::coop::spend();
        self.io_or_shut(READABLE, deadline, op, Some(shut))
    }

    fn io_or_shut<R>(
        &self,
        interest: u32,
        deadline: Option<Instant>,
        mut op: impl FnMut() -> io::Result<R>,
        mut shut: Option<impl FnOnce() -> io::Result<R>>,
    ) -> io::Result<R> {
        loop {
            let seen = self.record.get().map(|r| r.snapshot());
            if seen.is_some_and(|s| s as u32 & GONE != 0) {
                // Deregistered while this socket owns the fd: it was closed or replaced
                // behind the socket's back (the `hook` feature's `close` or `dup2`). The
                // number may name another file by now: no call goes to it.
                return Err(io::Error::from_raw_os_error(libc::EBADF));
            }
            match op() {
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    if seen.is_some_and(|s| s as u32 & READ_SHUT != 0) {
                        if let Some(shut) = shut.take() {
                            return shut();
                        }
                    }
                    // The wait found the socket ready at (or past) the deadline, and the
                    // call still would block: time is up.
                    if deadline.is_some_and(|d| Instant::now() >= d) {
                        return Err(e);
                    }
                    let record = self.record()?;
                    // Nothing seen before the call means the record is new: nothing to clear.
                    if let Some(seen) = seen {
                        record.clear(seen, interest);
                    }
                    record.wait(interest, deadline)?;
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                r => return r,
            }
        }
    }

    /// One try of `op`, without waiting: on `WouldBlock` the socket's remembered `interest`
    /// readiness is forgotten (unless an event came during the call), so that a wait or a
    /// continuation registered next waits for the next edge.
    pub(crate) fn try_io<R>(
        &self,
        interest: u32,
        op: impl FnOnce() -> io::Result<R>,
    ) -> io::Result<R> {
        // No record yet: nothing remembered to forget.
        let seen = self.record.get().map(|r| (r, r.snapshot()));
        let r = op();
        if let (Some((record, seen)), Err(e)) = (seen, &r) {
            if e.kind() == io::ErrorKind::WouldBlock {
                record.clear(seen, interest);
            }
        }
        r
    }

    /// Wakes this socket's waiters for `bits` (after a local shutdown).
    pub(crate) fn wake(&self, bits: u32) {
        if let Some(r) = self.record.get() {
            r.wake(bits);
        }
    }
}

/// `spawn_when_readable` for any socket type `S` whose registration `reg` finds: registers
/// `f(socket)` to be submitted as a new task of the calling fiber's scheduler once the
/// socket is readable (or hung up), or submits it at once if it is readable now.
#[track_caller]
pub(crate) fn spawn_when_readable<S, F>(
    socket: S,
    f: F,
    reg: fn(&S) -> &Registration,
) -> Result<(), WhenReadableError<S, F>>
where
    S: Send + 'static,
    F: FnOnce(S) + Send + 'static,
{
    register_continuation(socket, f, |f, s| f(s), reg, std::panic::Location::caller())
}

/// Registers `run(work, socket)` as a readiness continuation of `socket` (see
/// `spawn_when_readable`), its task named by `location`; `work` comes back in the error if
/// nothing is registered.
pub(crate) fn register_continuation<S, W>(
    socket: S,
    work: W,
    run: fn(W, S),
    reg: fn(&S) -> &Registration,
    location: &'static std::panic::Location<'static>,
) -> Result<(), WhenReadableError<S, W>>
where
    S: Send + 'static,
    W: Send + 'static,
{
    let shared = match crate::sched::worker::current_shared() {
        Some(shared) if crate::fiber::in_scheduled_fiber() => shared,
        _ => return Err(WhenReadableError::NoScheduler(socket, work)),
    };
    let record = match reg(&socket).record() {
        Ok(r) => r.clone(),
        Err(e) => return Err(WhenReadableError::Io(socket, work, e)),
    };
    // The continuation holds a unit of `live` from here until its task ends (or it is
    // cancelled): `stop` waits for it as for a parked fiber.
    if !shared.admit() {
        return Err(WhenReadableError::Stopped(socket, work));
    }
    shared.continuations.fetch_add(1, Ordering::SeqCst);
    let run = Box::new(move || run(work, socket));
    record.on_ready(
        READABLE,
        Continuation {
            shared,
            run,
            location,
        },
    );
    Ok(())
}

impl Drop for Registration {
    fn drop(&mut self) {
        if let Some(r) = self.record.get() {
            reactor().deregister(r);
        }
        #[cfg(feature = "hook")]
        crate::hook::fd::disown(self.fd);
    }
}

/// Read and write timeouts, shared by a socket and its `try_clone`s like std's socket
/// options. Zero means none.
#[derive(Default)]
pub(crate) struct Timeouts {
    read: AtomicU64,
    write: AtomicU64,
}

fn encode(t: Option<Duration>) -> io::Result<u64> {
    match t {
        None => Ok(0),
        Some(d) if d.is_zero() => Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "cannot set a 0 duration timeout",
        )),
        Some(d) => Ok(u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)),
    }
}

fn decode(n: u64) -> Option<Duration> {
    (n != 0).then(|| Duration::from_nanos(n))
}

impl Timeouts {
    pub(crate) fn set_read(&self, t: Option<Duration>) -> io::Result<()> {
        self.read.store(encode(t)?, Ordering::Relaxed);
        Ok(())
    }
    pub(crate) fn set_write(&self, t: Option<Duration>) -> io::Result<()> {
        self.write.store(encode(t)?, Ordering::Relaxed);
        Ok(())
    }
    pub(crate) fn read(&self) -> Option<Duration> {
        decode(self.read.load(Ordering::Relaxed))
    }
    pub(crate) fn write(&self) -> Option<Duration> {
        decode(self.write.load(Ordering::Relaxed))
    }
    /// The deadline for a read starting now.
    pub(crate) fn read_deadline(&self) -> Option<Instant> {
        self.read().map(deadline_after)
    }
    /// The deadline for a write starting now.
    pub(crate) fn write_deadline(&self) -> Option<Instant> {
        self.write().map(deadline_after)
    }
}

/// What every socket with its own `Registration` and shared `Timeouts` has alike
/// (`TcpStream`, `UdpSocket`, `UnixStream`, `UnixDatagram`): `try_clone`, std's timeout
/// accessors and the conversions from and to the std socket `$Std`. The type must have the
/// fields `inner` (the std socket), `reg` and `timeouts`.
macro_rules! timed_socket {
    ($T:ident, $Std:path) => {
        impl From<$Std> for $T {
            /// Takes over a std socket, switching it to non-blocking mode (fibra emulates
            /// blocking for plain threads). Its std timeouts are not carried over.
            fn from(inner: $Std) -> Self {
                // Cannot fail on a valid socket; if it did, calls would block the thread,
                // no worse.
                let _ = inner.set_nonblocking(true);
                $T {
                    reg: Registration::new(inner.as_raw_fd()),
                    inner,
                    timeouts: Arc::default(),
                }
            }
        }

        impl From<$T> for $Std {
            /// Gives the socket back to std, in blocking mode again.
            fn from(s: $T) -> Self {
                let $T { inner, reg, .. } = s;
                drop(reg);
                let _ = inner.set_nonblocking(false);
                inner
            }
        }

        impl $T {
            /// Another handle to the same socket (a duplicated fd). Timeouts are shared, like
            /// std's socket options.
            pub fn try_clone(&self) -> io::Result<$T> {
                let inner = self.inner.try_clone()?;
                Ok($T {
                    reg: Registration::new(inner.as_raw_fd()),
                    inner,
                    timeouts: self.timeouts.clone(),
                })
            }

            /// Sets the read timeout (`None`: wait forever); a read or receive that times
            /// out fails with [`io::ErrorKind::WouldBlock`]. A zero duration is an error, as
            /// in std.
            pub fn set_read_timeout(&self, timeout: Option<Duration>) -> io::Result<()> {
                self.timeouts.set_read(timeout)
            }

            /// Sets the write timeout (`None`: wait forever); a write or send that times out
            /// fails with [`io::ErrorKind::WouldBlock`]. A zero duration is an error, as in
            /// std.
            pub fn set_write_timeout(&self, timeout: Option<Duration>) -> io::Result<()> {
                self.timeouts.set_write(timeout)
            }

            /// The read timeout.
            pub fn read_timeout(&self) -> io::Result<Option<Duration>> {
                Ok(self.timeouts.read())
            }

            /// The write timeout.
            pub fn write_timeout(&self) -> io::Result<Option<Duration>> {
                Ok(self.timeouts.write())
            }
        }
    };
}

/// The receiving half every datagram socket has alike (`UdpSocket`, `UnixDatagram`):
/// `recv` and `recv_from`, std's calls on `inner` retried through the reactor with the
/// socket's read timeout. `$Addr` is the socket's address type.
macro_rules! datagram_recv {
    ($T:ident, $Addr:ty) => {
        impl $T {
            /// Receives one datagram from the connected peer into `buf` (the excess of a
            /// longer datagram is discarded); returns its length.
            ///
            /// Once the socket's receive side is shut down, returns 0 at once, as std's does.
            pub fn recv(&self, buf: &mut [u8]) -> io::Result<usize> {
                self.reg.recv_datagram(
                    self.timeouts.read_deadline(),
                    || self.inner.recv(buf),
                    || Ok(0),
                )
            }

            /// Receives one datagram into `buf`; returns its length and its sender.
            ///
            /// Once the socket's receive side is shut down, returns at once what std's does
            /// then (the kernel's empty receive, which names no sender).
            pub fn recv_from(&self, buf: &mut [u8]) -> io::Result<(usize, $Addr)> {
                self.reg.recv_datagram(
                    self.timeouts.read_deadline(),
                    || self.inner.recv_from(buf),
                    || self.shut_recv_from(),
                )
            }
        }
    };
}
