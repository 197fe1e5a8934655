//! The libc functions the hooks stand in front of, found with `dlsym(RTLD_NEXT, …)`: the next
//! definition after the executable's own, which is the C library's. fibra's internals call
//! these directly so they never meet their own hooks.
//!
//! Each address is looked up on first use and cached; a race looks it up twice and stores the
//! same value. The signatures are libc's, so `use libc as real` is a drop-in replacement in a
//! build without the `hook` feature.

#![allow(clippy::missing_safety_doc)]

use libc::{
    addrinfo, c_char, c_int, c_uint, c_ulong, c_void, iovec, msghdr, nfds_t, pollfd, size_t,
    sockaddr, socklen_t, ssize_t, timespec,
};
use std::sync::atomic::{AtomicUsize, Ordering};

/// Looks up `name` (NUL-terminated) past the executable; aborts if the C library lacks it,
/// since a hook with nothing behind it cannot do its job.
#[cold]
fn resolve(name: &'static str, cache: &AtomicUsize) -> usize {
    // SAFETY: `name` is a NUL-terminated static string; RTLD_NEXT is a valid pseudo-handle.
    let p = unsafe { libc::dlsym(libc::RTLD_NEXT, name.as_ptr().cast()) };
    if p.is_null() {
        let msg = b"fibra: hook: the C library has no such function\n";
        // SAFETY: writing a static buffer to stderr with the raw system call.
        unsafe { libc::syscall(libc::SYS_write, 2, msg.as_ptr(), msg.len()) };
        std::process::abort();
    }
    cache.store(p as usize, Ordering::Relaxed);
    p as usize
}

macro_rules! real {
    ($( fn $name:ident($($arg:ident: $ty:ty),*) -> $ret:ty; )*) => {$(
        #[doc = concat!("The C library's `", stringify!($name), "`.")]
        #[inline]
        pub(crate) unsafe fn $name($($arg: $ty),*) -> $ret {
            static ADDR: AtomicUsize = AtomicUsize::new(0);
            let mut addr = ADDR.load(Ordering::Relaxed);
            if addr == 0 {
                addr = resolve(concat!(stringify!($name), "\0"), &ADDR);
            }
            // SAFETY: `addr` is the C library's definition of this very symbol, whose C
            // signature this one mirrors.
            let f: unsafe extern "C" fn($($ty),*) -> $ret = unsafe { std::mem::transmute(addr) };
            // SAFETY: the caller upholds the C function's contract.
            unsafe { f($($arg),*) }
        }
    )*};
}

real! {
    fn read(fd: c_int, buf: *mut c_void, n: size_t) -> ssize_t;
    fn readv(fd: c_int, iov: *const iovec, n: c_int) -> ssize_t;
    fn recv(fd: c_int, buf: *mut c_void, n: size_t, flags: c_int) -> ssize_t;
    fn recvfrom(fd: c_int, buf: *mut c_void, n: size_t, flags: c_int, addr: *mut sockaddr, len: *mut socklen_t) -> ssize_t;
    fn recvmsg(fd: c_int, msg: *mut msghdr, flags: c_int) -> ssize_t;
    fn write(fd: c_int, buf: *const c_void, n: size_t) -> ssize_t;
    fn writev(fd: c_int, iov: *const iovec, n: c_int) -> ssize_t;
    fn send(fd: c_int, buf: *const c_void, n: size_t, flags: c_int) -> ssize_t;
    fn sendto(fd: c_int, buf: *const c_void, n: size_t, flags: c_int, addr: *const sockaddr, len: socklen_t) -> ssize_t;
    fn sendmsg(fd: c_int, msg: *const msghdr, flags: c_int) -> ssize_t;
    fn connect(fd: c_int, addr: *const sockaddr, len: socklen_t) -> c_int;
    fn accept(fd: c_int, addr: *mut sockaddr, len: *mut socklen_t) -> c_int;
    fn accept4(fd: c_int, addr: *mut sockaddr, len: *mut socklen_t, flags: c_int) -> c_int;
    fn poll(fds: *mut pollfd, n: nfds_t, timeout: c_int) -> c_int;
    fn ppoll(fds: *mut pollfd, n: nfds_t, timeout: *const timespec, mask: *const libc::sigset_t) -> c_int;
    fn select(n: c_int, r: *mut libc::fd_set, w: *mut libc::fd_set, e: *mut libc::fd_set, timeout: *mut libc::timeval) -> c_int;
    fn sleep(secs: c_uint) -> c_uint;
    fn usleep(usecs: libc::useconds_t) -> c_int;
    fn nanosleep(req: *const timespec, rem: *mut timespec) -> c_int;
    fn clock_nanosleep(clock: libc::clockid_t, flags: c_int, req: *const timespec, rem: *mut timespec) -> c_int;
    fn getaddrinfo(node: *const c_char, service: *const c_char, hints: *const addrinfo, res: *mut *mut addrinfo) -> c_int;
    fn close(fd: c_int) -> c_int;
    fn fcntl(fd: c_int, cmd: c_int, arg: c_ulong) -> c_int;
    fn ioctl(fd: c_int, request: c_ulong, arg: c_ulong) -> c_int;
    fn dup(fd: c_int) -> c_int;
    fn dup2(fd: c_int, new: c_int) -> c_int;
    fn dup3(fd: c_int, new: c_int, flags: c_int) -> c_int;
    fn socket(domain: c_int, ty: c_int, proto: c_int) -> c_int;
    fn socketpair(domain: c_int, ty: c_int, proto: c_int, fds: *mut c_int) -> c_int;
    fn pipe(fds: *mut c_int) -> c_int;
    fn pipe2(fds: *mut c_int, flags: c_int) -> c_int;
    fn splice(fd_in: c_int, off_in: *mut libc::loff_t, fd_out: c_int, off_out: *mut libc::loff_t, len: size_t, flags: c_uint) -> ssize_t;
    fn tee(fd_in: c_int, fd_out: c_int, len: size_t, flags: c_uint) -> ssize_t;
    fn vmsplice(fd: c_int, iov: *const iovec, nr_segs: size_t, flags: c_uint) -> ssize_t;
    fn sendfile(out_fd: c_int, in_fd: c_int, offset: *mut libc::off_t, count: size_t) -> ssize_t;
    fn recvmmsg(fd: c_int, msgs: *mut libc::mmsghdr, n: c_uint, flags: c_int, timeout: *mut timespec) -> c_int;
    fn sendmmsg(fd: c_int, msgs: *mut libc::mmsghdr, n: c_uint, flags: c_int) -> c_int;
}
