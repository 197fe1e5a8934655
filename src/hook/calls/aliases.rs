//! Other names of the same calls.
//!
//! C code built with `_FILE_OFFSET_BITS=64` calls `fcntl64` (glibc's headers rename `fcntl`),
//! and code built with `_FORTIFY_SOURCE` calls the `__*_chk` forms where the compiler knows
//! the buffer's size: without these, such code would bypass the hooks and block a worker.
//! Each checks what glibc's checks and calls the hook of its plain name.

use super::fd_table::fcntl;
use super::poll::{poll, ppoll};
use super::read_write::{read, recv, recvfrom};
use libc::{
    c_int, c_ulong, c_void, nfds_t, pollfd, size_t, sockaddr, socklen_t, ssize_t, timespec,
};

#[no_mangle]
pub unsafe extern "C" fn fcntl64(fd: c_int, cmd: c_int, arg: c_ulong) -> c_int {
    // SAFETY: the caller's arguments, as `fcntl` takes them.
    unsafe { fcntl(fd, cmd, arg) }
}

#[no_mangle]
pub unsafe extern "C" fn __fcntl(fd: c_int, cmd: c_int, arg: c_ulong) -> c_int {
    // SAFETY: as above.
    unsafe { fcntl(fd, cmd, arg) }
}

extern "C" {
    /// glibc's report of a buffer overflow caught by a `_chk` function: it aborts.
    fn __chk_fail() -> !;
}

#[no_mangle]
pub unsafe extern "C" fn __read_chk(
    fd: c_int,
    buf: *mut c_void,
    n: size_t,
    buflen: size_t,
) -> ssize_t {
    if n > buflen {
        // SAFETY: no arguments; it does not return.
        unsafe { __chk_fail() }
    }
    // SAFETY: the caller's arguments, checked as glibc's `__read_chk` does.
    unsafe { read(fd, buf, n) }
}

#[no_mangle]
pub unsafe extern "C" fn __recv_chk(
    fd: c_int,
    buf: *mut c_void,
    n: size_t,
    buflen: size_t,
    flags: c_int,
) -> ssize_t {
    if n > buflen {
        // SAFETY: as above.
        unsafe { __chk_fail() }
    }
    // SAFETY: as above.
    unsafe { recv(fd, buf, n, flags) }
}

#[no_mangle]
pub unsafe extern "C" fn __recvfrom_chk(
    fd: c_int,
    buf: *mut c_void,
    n: size_t,
    buflen: size_t,
    flags: c_int,
    addr: *mut sockaddr,
    len: *mut socklen_t,
) -> ssize_t {
    if n > buflen {
        // SAFETY: as above.
        unsafe { __chk_fail() }
    }
    // SAFETY: as above.
    unsafe { recvfrom(fd, buf, n, flags, addr, len) }
}

#[no_mangle]
pub unsafe extern "C" fn __poll_chk(
    fds: *mut pollfd,
    n: nfds_t,
    timeout: c_int,
    fdslen: size_t,
) -> c_int {
    if fdslen / std::mem::size_of::<pollfd>() < n as usize {
        // SAFETY: as above.
        unsafe { __chk_fail() }
    }
    // SAFETY: as above.
    unsafe { poll(fds, n, timeout) }
}

#[no_mangle]
pub unsafe extern "C" fn __ppoll_chk(
    fds: *mut pollfd,
    n: nfds_t,
    timeout: *const timespec,
    mask: *const libc::sigset_t,
    fdslen: size_t,
) -> c_int {
    if fdslen / std::mem::size_of::<pollfd>() < n as usize {
        // SAFETY: as above.
        unsafe { __chk_fail() }
    }
    // SAFETY: as above.
    unsafe { ppoll(fds, n, timeout, mask) }
}
