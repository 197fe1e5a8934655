//! Waiting for one fd on a plain thread: `poll(2)`, which the reactor's waits use outside
//! a scheduled fiber (and after a fiber's wait timed out, to look at the fd itself).

use super::reactor::{CLOSED, READABLE, READ_SHUT, WRITABLE};
#[cfg(feature = "hook")]
use crate::sys::real;
#[cfg(not(feature = "hook"))]
use libc as real;
use std::io;
use std::os::fd::RawFd;
use std::time::Instant;

/// Blocks the thread until `fd` is ready for `interest`, or until `deadline`; returns the
/// readiness bits that `poll(2)` reported (`READ_SHUT` too, for a read). A deadline that has
/// passed still looks once: an fd ready now is ready, whatever the time.
pub(crate) fn poll_fd(fd: RawFd, interest: u32, deadline: Option<Instant>) -> io::Result<u32> {
    loop {
        let timeout = match deadline {
            None => -1,
            // Rounded up so a sub-millisecond remainder does not spin.
            Some(d) => (d.saturating_duration_since(Instant::now()).as_nanos())
                .div_ceil(1_000_000)
                .min(i32::MAX as u128) as i32,
        };
        match poll_once(fd, interest, timeout) {
            Ok(0) if deadline.is_some_and(|d| Instant::now() >= d) => return Err(timed_out()),
            Ok(0) => {}
            Ok(bits) => return Ok(bits),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
}

/// One `poll(2)` of `fd` for `interest` waiting at most `timeout` ms (-1: for ever): the
/// readiness it reports, 0 if none. A hang-up or an error (whose call then reports it) is
/// `CLOSED` with both directions.
pub(crate) fn poll_once(fd: RawFd, interest: u32, timeout: i32) -> io::Result<u32> {
    let mut events = 0;
    if interest & READABLE != 0 {
        events |= libc::POLLIN | libc::POLLRDHUP;
    }
    if interest & WRITABLE != 0 {
        events |= libc::POLLOUT;
    }
    let mut pfd = libc::pollfd {
        fd,
        events,
        revents: 0,
    };
    // SAFETY: one valid pollfd on our stack.
    let n = unsafe { real::poll(&mut pfd, 1, timeout) };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    let (e, mut bits) = (pfd.revents, 0);
    if e & libc::POLLIN != 0 {
        bits |= READABLE;
    }
    if e & libc::POLLOUT != 0 {
        bits |= WRITABLE;
    }
    if e & libc::POLLRDHUP != 0 {
        bits |= READABLE | READ_SHUT;
    }
    if e & (libc::POLLHUP | libc::POLLERR | libc::POLLNVAL) != 0 {
        bits |= READABLE | WRITABLE | CLOSED;
    }
    Ok(bits)
}

/// The error of a wait whose deadline passed with the fd not ready.
pub(super) fn timed_out() -> io::Error {
    io::Error::new(
        io::ErrorKind::WouldBlock,
        "timed out waiting for the socket",
    )
}
