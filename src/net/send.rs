//! Every write fibra makes to a socket: `send(2)`, `sendmsg(2)` and `sendto(2)` with
//! `MSG_NOSIGNAL`.
//!
//! A write to a stream whose peer has gone (or to any socket shut down for writing) fails
//! with `EPIPE`, and unless the call passes `MSG_NOSIGNAL` the kernel also raises `SIGPIPE`
//! in the calling thread. Rust programs normally ignore that signal, but a process that
//! keeps its default action — fibra embedded in a C program, or Rust built with
//! `-Zon-broken-pipe=kill` — dies of it. std's socket `write` passes the flag, but its
//! `write_vectored` is a plain `writev(2)`, which cannot. Going through these functions for
//! every write path of every socket type keeps the error an `io::Error`, as it is in std's
//! `write`.

use nix::sys::socket::{MsgFlags, SockaddrLike};
use std::io::{self, IoSlice};
use std::os::fd::RawFd;

/// `send(2)` of `buf` on the connected socket `fd`, without `SIGPIPE`.
pub(crate) fn send(fd: RawFd, buf: &[u8]) -> io::Result<usize> {
    Ok(nix::sys::socket::send(fd, buf, MsgFlags::MSG_NOSIGNAL)?)
}

/// A gathering write of `bufs` on the connected socket `fd`: `sendmsg(2)` with an iovec,
/// without `SIGPIPE`. Like std's `writev`, it passes at most `UIO_MAXIOV` slices (more is
/// `EMSGSIZE`), so it may write only a prefix; `write_all_vectored` goes on from there.
pub(crate) fn send_vectored(fd: RawFd, bufs: &[IoSlice<'_>]) -> io::Result<usize> {
    let max = usize::try_from(libc::UIO_MAXIOV).unwrap_or(usize::MAX);
    let bufs = &bufs[..bufs.len().min(max)];
    Ok(nix::sys::socket::sendmsg::<()>(
        fd,
        bufs,
        &[],
        MsgFlags::MSG_NOSIGNAL,
        None,
    )?)
}

/// `sendto(2)` of `buf` to `addr` on the socket `fd`, without `SIGPIPE`.
pub(crate) fn send_to(fd: RawFd, buf: &[u8], addr: &dyn SockaddrLike) -> io::Result<usize> {
    Ok(nix::sys::socket::sendto(
        fd,
        buf,
        addr,
        MsgFlags::MSG_NOSIGNAL,
    )?)
}
