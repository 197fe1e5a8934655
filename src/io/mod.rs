//! Waiting for file descriptors: the epoll reactor (`reactor.rs`) and the public
//! [`wait_readable`] / [`wait_writable`] for any non-blocking fd fibra does not wrap.

pub(crate) mod home;
mod poll;
pub(crate) mod reactor;

use std::io;
use std::os::fd::RawFd;
use std::time::{Duration, Instant};

fn deadline(timeout: Option<Duration>) -> Option<Instant> {
    timeout.map(crate::sys::deadline_after)
}

fn wait(fd: RawFd, interest: u32, timeout: Option<Duration>) -> io::Result<()> {
    crate::coop::spend();
    let record = reactor::registering()?.register(fd)?;
    record.wait(interest, deadline(timeout))
}

/// Waits until the non-blocking `fd` is readable (or hung up), at most `timeout`.
///
/// Inside a fiber only the fiber waits; on a plain thread the thread blocks in `poll(2)`.
/// The fd stays registered with fibra's epoll instance (edge-triggered) until
/// [`deregister`] — call it before closing the fd, so waiters wake instead of hanging.
/// A timeout is an error of kind [`io::ErrorKind::WouldBlock`], as std reports socket
/// timeouts.
///
/// Readiness is a hint, as with any edge-triggered poller: after waking, try the operation
/// and wait again on `EAGAIN`.
///
/// ```
/// use std::io::{Read, Write};
/// use std::os::fd::AsRawFd;
/// use std::os::unix::net::UnixStream;
/// use std::time::Duration;
///
/// let (mut a, mut b) = UnixStream::pair().unwrap();
/// b.set_nonblocking(true).unwrap();
/// let sched = fibra::Scheduler::builder().threads(1).build().unwrap();
/// let reader = sched.submit(move || {
///     fibra::io::wait_readable(b.as_raw_fd(), Some(Duration::from_secs(30))).unwrap();
///     let mut buf = [0u8; 5];
///     b.read_exact(&mut buf).unwrap();
///     fibra::io::deregister(b.as_raw_fd());
///     buf
/// }, None).unwrap();
/// sched.start();
/// a.write_all(b"hello").unwrap();
/// assert_eq!(&reader.join().unwrap(), b"hello");
/// ```
pub fn wait_readable(fd: RawFd, timeout: Option<Duration>) -> io::Result<()> {
    wait(fd, reactor::READABLE, timeout)
}

/// Waits until the non-blocking `fd` is writable (or hung up), at most `timeout`. See
/// [`wait_readable`].
pub fn wait_writable(fd: RawFd, timeout: Option<Duration>) -> io::Result<()> {
    wait(fd, reactor::WRITABLE, timeout)
}

/// Removes `fd` from fibra's epoll instance and wakes the fibers waiting on it (their wait
/// returns as if the fd were hung up). Call it before closing an fd used with
/// [`wait_readable`] or [`wait_writable`]. Unknown fds are ignored.
///
/// A plain thread waiting on `fd` blocks in `poll(2)`, outside the reactor: for sockets the
/// kernel wakes it on `shutdown`, but for other fds `deregister` cannot reach it.
pub fn deregister(fd: RawFd) {
    if let Some(r) = reactor::get() {
        r.deregister_fd(fd);
    }
}
