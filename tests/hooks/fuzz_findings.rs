#![cfg(feature = "hook")]
//! What the differential fuzzing of the hooks (`fuzz/`, `tests/hooks/differential`) found
//! where a hooked call in a fiber differed from the C library's: each case as a plain test,
//! the fiber's result against libc's on a plain thread.

use std::io::Write;
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixStream;

use crate::common::{child_ok, errno, same_as_libc, unmapped_page, with_deadline};

/// A result as compared: the return value, and `errno` after a failure.
fn res(r: isize) -> (isize, i32) {
    (r, if r < 0 { errno() } else { 0 })
}

/// `ioctl(FIONBIO)` with an unmapped argument on a socket the hooks switched (in a fiber: a
/// read made it non-blocking in the kernel): the kernel fails with `EFAULT` and changes
/// nothing; the socket stays blocking.
fn fionbio_bad_pointer() -> ((isize, i32), bool) {
    let (mut a, mut b) = UnixStream::pair().unwrap();
    b.write_all(b"x").unwrap();
    let mut one = [0u8; 1];
    std::io::Read::read_exact(&mut a, &mut one).unwrap();
    // SAFETY: FIONBIO with a pointer no call may read: the kernel refuses it.
    let r = unsafe { libc::ioctl(a.as_raw_fd(), libc::FIONBIO, unmapped_page()) };
    let got = res(r as isize);
    // SAFETY: F_GETFL takes no argument.
    let nonblocking = unsafe { libc::fcntl(a.as_raw_fd(), libc::F_GETFL) } & libc::O_NONBLOCK != 0;
    (got, nonblocking)
}

#[test]
fn fionbio_with_a_bad_pointer_fails_with_efault() {
    // In a child: the defect was a fault that ends the process.
    child_ok(|| {
        with_deadline(|| {
            same_as_libc(
                fionbio_bad_pointer,
                ((-1, libc::EFAULT), false),
                "FIONBIO with an unmapped argument",
            );
        });
    });
}
