//! The calls a program makes, two ways: the C library's own functions, found past the
//! executable with `dlsym(RTLD_NEXT)` as fibra's hooks find them (the reference: hooks off),
//! and the executable's names, which the `hook` feature defines (in a fiber: hooked; on a
//! plain thread: passed through). Calls the feature does not hook (`bind`, `listen`,
//! `shutdown`, `setsockopt`...) are the `libc` crate's on every side.

use libc::{
    c_int, c_ulong, c_void, fd_set, iovec, msghdr, nfds_t, pollfd, sigset_t, size_t, sockaddr,
    socklen_t, ssize_t, timespec, timeval,
};
use std::sync::OnceLock;

/// One table of the calls a program makes.
pub struct Calls {
    pub read: unsafe extern "C" fn(c_int, *mut c_void, size_t) -> ssize_t,
    pub write: unsafe extern "C" fn(c_int, *const c_void, size_t) -> ssize_t,
    pub readv: unsafe extern "C" fn(c_int, *const iovec, c_int) -> ssize_t,
    pub writev: unsafe extern "C" fn(c_int, *const iovec, c_int) -> ssize_t,
    pub recv: unsafe extern "C" fn(c_int, *mut c_void, size_t, c_int) -> ssize_t,
    pub recvfrom: unsafe extern "C" fn(
        c_int,
        *mut c_void,
        size_t,
        c_int,
        *mut sockaddr,
        *mut socklen_t,
    ) -> ssize_t,
    pub recvmsg: unsafe extern "C" fn(c_int, *mut msghdr, c_int) -> ssize_t,
    pub send: unsafe extern "C" fn(c_int, *const c_void, size_t, c_int) -> ssize_t,
    pub sendto: unsafe extern "C" fn(
        c_int,
        *const c_void,
        size_t,
        c_int,
        *const sockaddr,
        socklen_t,
    ) -> ssize_t,
    pub sendmsg: unsafe extern "C" fn(c_int, *const msghdr, c_int) -> ssize_t,
    pub poll: unsafe extern "C" fn(*mut pollfd, nfds_t, c_int) -> c_int,
    pub ppoll: unsafe extern "C" fn(*mut pollfd, nfds_t, *const timespec, *const sigset_t) -> c_int,
    pub select:
        unsafe extern "C" fn(c_int, *mut fd_set, *mut fd_set, *mut fd_set, *mut timeval) -> c_int,
    pub fcntl: unsafe extern "C" fn(c_int, c_int, ...) -> c_int,
    pub ioctl: unsafe extern "C" fn(c_int, c_ulong, ...) -> c_int,
    pub dup: unsafe extern "C" fn(c_int) -> c_int,
    pub dup2: unsafe extern "C" fn(c_int, c_int) -> c_int,
    pub dup3: unsafe extern "C" fn(c_int, c_int, c_int) -> c_int,
    pub close: unsafe extern "C" fn(c_int) -> c_int,
    pub socket: unsafe extern "C" fn(c_int, c_int, c_int) -> c_int,
    pub socketpair: unsafe extern "C" fn(c_int, c_int, c_int, *mut c_int) -> c_int,
    pub pipe2: unsafe extern "C" fn(*mut c_int, c_int) -> c_int,
    pub connect: unsafe extern "C" fn(c_int, *const sockaddr, socklen_t) -> c_int,
    pub accept4: unsafe extern "C" fn(c_int, *mut sockaddr, *mut socklen_t, c_int) -> c_int,
}

/// The executable's names: fibra's hooks.
pub static HOOKED: Calls = Calls {
    read: libc::read,
    write: libc::write,
    readv: libc::readv,
    writev: libc::writev,
    recv: libc::recv,
    recvfrom: libc::recvfrom,
    recvmsg: libc::recvmsg,
    send: libc::send,
    sendto: libc::sendto,
    sendmsg: libc::sendmsg,
    poll: libc::poll,
    ppoll: libc::ppoll,
    select: libc::select,
    fcntl: libc::fcntl,
    ioctl: libc::ioctl,
    dup: libc::dup,
    dup2: libc::dup2,
    dup3: libc::dup3,
    close: libc::close,
    socket: libc::socket,
    socketpair: libc::socketpair,
    pipe2: libc::pipe2,
    connect: libc::connect,
    accept4: libc::accept4,
};

/// The C library's own functions.
// Each address becomes the type of the field it fills: the field's declaration is the
// annotation.
#[allow(clippy::missing_transmute_annotations)]
pub fn real() -> &'static Calls {
    static REAL: OnceLock<Calls> = OnceLock::new();
    REAL.get_or_init(|| {
        macro_rules! next {
            ($name:literal) => {{
                // SAFETY: a NUL-terminated name; RTLD_NEXT is a valid pseudo-handle.
                let p =
                    unsafe { libc::dlsym(libc::RTLD_NEXT, concat!($name, "\0").as_ptr().cast()) };
                assert!(!p.is_null(), concat!("the C library has no ", $name));
                // SAFETY: the C library's definition of the symbol, whose signature is the
                // field's (the `libc` crate's declaration of the same name).
                unsafe { std::mem::transmute::<*mut c_void, _>(p) }
            }};
        }
        Calls {
            read: next!("read"),
            write: next!("write"),
            readv: next!("readv"),
            writev: next!("writev"),
            recv: next!("recv"),
            recvfrom: next!("recvfrom"),
            recvmsg: next!("recvmsg"),
            send: next!("send"),
            sendto: next!("sendto"),
            sendmsg: next!("sendmsg"),
            poll: next!("poll"),
            ppoll: next!("ppoll"),
            select: next!("select"),
            fcntl: next!("fcntl"),
            ioctl: next!("ioctl"),
            dup: next!("dup"),
            dup2: next!("dup2"),
            dup3: next!("dup3"),
            close: next!("close"),
            socket: next!("socket"),
            socketpair: next!("socketpair"),
            pipe2: next!("pipe2"),
            connect: next!("connect"),
            accept4: next!("accept4"),
        }
    })
}
