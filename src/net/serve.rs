//! Serving a connection with readiness continuations: [`TcpStream::serve`] (and
//! [`UnixStream::serve`](super::unix::UnixStream::serve)) run a handler as a fresh task each
//! time the socket turns readable, and [`TcpListener::serve`] is an accept loop that serves
//! every connection that way.

use super::registration::{register_continuation, Registration};
use super::{TcpListener, TcpStream};
use crate::error::WhenReadableError;
use std::io;
use std::net::SocketAddr;
use std::time::Duration;

/// What a connection's handler asks for when it returns (see [`TcpStream::serve`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Serve {
    /// Run the handler again, as a new task, once the socket is readable: it has more data,
    /// or the peer hung up. If it is readable now, the task is queued at once.
    Again,
    /// Done with the connection: the socket and the handler are dropped (which closes the
    /// socket, unless the handler kept a `try_clone` of it).
    Close,
}

/// A stream type's `serve`: runs `handler` as a readiness continuation of `stream`, and
/// again each time it returns [`Serve::Again`].
#[track_caller]
pub(crate) fn serve<S, F>(
    stream: S,
    handler: F,
    reg: fn(&S) -> &Registration,
) -> Result<(), WhenReadableError<S, F>>
where
    S: Send + 'static,
    F: FnMut(&mut S) -> Serve + Send + 'static,
{
    let location = std::panic::Location::caller();
    let turn = Turn {
        handler,
        reg,
        location,
    };
    register_continuation(stream, turn, Turn::run, reg, location).map_err(|e| match e {
        WhenReadableError::NoScheduler(s, t) => WhenReadableError::NoScheduler(s, t.handler),
        WhenReadableError::Stopped(s, t) => WhenReadableError::Stopped(s, t.handler),
        WhenReadableError::Io(s, t, e) => WhenReadableError::Io(s, t.handler, e),
    })
}

/// One turn of a served connection: the continuation that `serve` registers, which runs the
/// handler and registers the next turn.
struct Turn<S, F> {
    handler: F,
    reg: fn(&S) -> &Registration,
    /// Where `serve` was called: every turn's task is named by it.
    location: &'static std::panic::Location<'static>,
}

impl<S: Send + 'static, F: FnMut(&mut S) -> Serve + Send + 'static> Turn<S, F> {
    /// Runs the handler on `stream`; registers the next turn if it asks for one.
    fn run(mut self, mut stream: S) {
        if (self.handler)(&mut stream) == Serve::Close {
            return;
        }
        let (reg, location) = (self.reg, self.location);
        if let Err(e) = register_continuation(stream, self, Turn::run, reg, location) {
            // Only while the scheduler stops (and cancels what is left) or when the reactor
            // refuses the socket: there is nobody to hand them back to, so the connection
            // closes, as a fiber parked in `read` would be cancelled.
            if !matches!(e, WhenReadableError::Stopped(..)) {
                eprintln!("fibra: serve: {e}; the connection is closed");
            }
        }
    }
}

/// The accept errors that are about the process or the system, not the connection (see
/// [`TcpListener::accept`]): retried after a pause.
fn out_of_resources(e: &io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(libc::EMFILE | libc::ENFILE | libc::ENOBUFS | libc::ENOMEM)
    )
}

impl TcpListener {
    /// Accepts connections for as long as the calling fiber runs, and serves each with
    /// [`TcpStream::serve`] and the handler that `handler_for` makes for it: the way to
    /// write a latency-critical server (see [`TcpStream::serve`]).
    ///
    /// `handler_for` runs in this fiber, once per connection, with the accepted socket
    /// (to set options on, `set_nodelay` say) and the peer's address; it returns the
    /// connection's handler, which carries the connection's state, or `None` to close the
    /// connection at once. Out of descriptors or memory (`EMFILE`, `ENFILE`, `ENOBUFS`,
    /// `ENOMEM`), the loop backs off as Go's `http.Server` does — 5 ms, doubling up to 1 s,
    /// reset by a success — so the connections that would close descriptors get time to
    /// run; other accept errors (a peer that gave up first) are skipped.
    ///
    /// # Errors
    /// Returns `Ok(())` once the calling fiber is cancelled (a `stop_timeout` that gives
    /// up waiting, or [`JoinHandle::cancel`](crate::JoinHandle::cancel), whose `join` then
    /// reports the cancellation); an error, at once, if it is not
    /// called from a fiber of a [`Scheduler`](crate::Scheduler), or if accepting fails for
    /// good (`EBADF`, `EINVAL`: the listener was shut down).
    ///
    /// ```
    /// use std::io::{Read, Write};
    /// use fibra::net::{Serve, TcpListener, TcpStream};
    ///
    /// let sched = fibra::Scheduler::builder().threads(2).build().unwrap();
    /// sched.start();
    /// let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    /// let addr = listener.local_addr().unwrap();
    /// // An echo server: each connection's handler echoes what has come, then waits for
    /// // more holding no fiber.
    /// let server = sched.spawn(move || {
    ///     listener.serve(|_conn, _peer| {
    ///         let mut buf = vec![0u8; 4096];
    ///         Some(move |conn: &mut TcpStream| loop {
    ///             match conn.try_read(&mut buf) {
    ///                 Ok(0) => return Serve::Close,
    ///                 Ok(n) if conn.write_all(&buf[..n]).is_ok() => {}
    ///                 Ok(_) => return Serve::Close,
    ///                 Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return Serve::Again,
    ///                 Err(_) => return Serve::Close,
    ///             }
    ///         })
    ///     })
    /// });
    /// let reply = sched.block_on(move || {
    ///     let mut s = TcpStream::connect(addr).unwrap();
    ///     s.write_all(b"ping").unwrap();
    ///     let mut buf = [0u8; 4];
    ///     s.read_exact(&mut buf).unwrap();
    ///     buf
    /// });
    /// assert_eq!(&reply, b"ping");
    /// server.cancel(); // the accept loop ends; the connection ended with the client
    /// assert!(server.join().is_err());
    /// sched.stop();
    /// ```
    pub fn serve<M, F>(&self, mut handler_for: M) -> io::Result<()>
    where
        M: FnMut(&mut TcpStream, SocketAddr) -> Option<F>,
        F: FnMut(&mut TcpStream) -> Serve + Send + 'static,
    {
        if crate::sched::worker::current_shared().is_none() || !crate::fiber::in_scheduled_fiber() {
            return Err(io::Error::other(
                "TcpListener::serve called outside a fiber of a fibra Scheduler",
            ));
        }
        let mut delay = Duration::ZERO;
        loop {
            match self.accept() {
                Ok((mut conn, peer)) => {
                    delay = Duration::ZERO;
                    if let Some(handler) = handler_for(&mut conn, peer) {
                        match conn.serve(handler) {
                            // The scheduler stops: the next accept says so.
                            Ok(()) | Err(WhenReadableError::Stopped(..)) => {}
                            // The reactor refused the socket (out of memory for epoll):
                            // that connection closes, the next may do better.
                            Err(e) => eprintln!("fibra: TcpListener::serve: {e}"),
                        }
                    }
                }
                Err(e) if e.raw_os_error() == Some(libc::ECANCELED) => return Ok(()),
                Err(e) if out_of_resources(&e) => {
                    delay = (delay * 2).clamp(Duration::from_millis(5), Duration::from_secs(1));
                    crate::time::sleep(delay);
                }
                Err(e) if matches!(e.raw_os_error(), Some(libc::EBADF | libc::EINVAL)) => {
                    return Err(e)
                }
                Err(_) => {}
            }
        }
    }
}
