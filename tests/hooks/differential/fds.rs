//! The harness's own look at descriptors, with raw system calls that no hook sees: the fd
//! numbers a program uses, what the kernel holds (queued bytes, readiness, flags), and the
//! waits that make TCP on loopback deterministic.
//!
//! Every side of a run gets the same fd numbers: before a side starts, every free number
//! below [`base`] is filled with a placeholder (a copy of `/dev/null`, kept for the life of
//! the process) and the numbers from [`base`] to [`end`] must all be free, so the kernel
//! (lowest free number first) hands out the same numbers in the same order on each side. At
//! its end a side closes whatever it left in that range.

use libc::c_int;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// How many numbers from [`base`] on are the program's: programs make fewer than 100 fds,
/// from `base` up or from [`high`] up.
const RANGE: c_int = 200;

/// The first fd number a program gets: the lowest from 100 up with [`RANGE`] free numbers
/// from it (the process may have inherited fds up there), found once, before the first
/// placeholder.
pub fn base() -> c_int {
    static BASE: OnceLock<c_int> = OnceLock::new();
    *BASE.get_or_init(|| {
        let mut b = 100;
        while let Some(open) = (b..b + RANGE).rev().find(|&fd| is_open(fd)) {
            b = open + 1;
        }
        assert!(
            b + RANGE < UNUSED,
            "harness: no {RANGE} free fd numbers below {UNUSED}"
        );
        b
    })
}

/// Past the last fd number a program may use.
pub fn end() -> c_int {
    base() + RANGE
}

/// Numbers programs name as targets of `dup2`/`dup3`/`F_DUPFD` (free until they do).
pub fn high() -> c_int {
    base() + 80
}

/// How many [`high`] numbers there are.
pub const HIGHS: c_int = 8;
/// A number never open (inside the descriptor table the harness grew, see [`prepare`]).
pub const UNUSED: c_int = 1000;
/// How long a wait of the harness's own may take before it gives up (a hang): generous, for
/// a loaded machine.
pub const LIMIT: Duration = Duration::from_secs(120);

/// The calling thread's `errno`.
pub fn errno() -> c_int {
    std::io::Error::last_os_error().raw_os_error().unwrap_or(0)
}

/// Sets the calling thread's `errno`.
pub fn set_errno(e: c_int) {
    // SAFETY: the thread's own errno location.
    unsafe { *libc::__errno_location() = e };
}

/// `fcntl` as the system call.
pub fn fcntl(fd: c_int, cmd: c_int, arg: libc::c_long) -> c_int {
    // SAFETY: the commands used here take an integer or nothing.
    unsafe { libc::syscall(libc::SYS_fcntl, fd, cmd, arg) as c_int }
}

/// Whether `fd` is open.
pub fn is_open(fd: c_int) -> bool {
    fcntl(fd, libc::F_GETFD, 0) >= 0
}

/// `close` as the system call (harness-owned descriptors only).
pub fn close(fd: c_int) {
    // SAFETY: a descriptor the harness owns.
    unsafe { libc::syscall(libc::SYS_close, fd) };
}

/// An integer `ioctl` as the system call: its result, or `-errno`.
pub fn ioctl_int(fd: c_int, req: libc::c_ulong) -> c_int {
    let mut v: c_int = 0;
    // SAFETY: FIONREAD/SIOCOUTQ write one int.
    let r = unsafe { libc::syscall(libc::SYS_ioctl, fd, req, &mut v as *mut c_int) };
    if r < 0 {
        -errno()
    } else {
        v
    }
}

/// Bytes queued to be read on `fd` (a datagram socket: the next datagram's length).
pub fn queued(fd: c_int) -> c_int {
    ioctl_int(fd, libc::FIONREAD)
}

/// A socket's bytes not yet taken by its peer (Unix: the memory its skbs hold; TCP: not yet
/// acknowledged).
pub fn outq(fd: c_int) -> c_int {
    ioctl_int(fd, libc::TIOCOUTQ)
}

/// The TCP state of `fd` (`TCP_ESTABLISHED` is 1, `TCP_CLOSE` 7), or -1.
pub fn tcp_state(fd: c_int) -> c_int {
    // SAFETY: an all-zero tcp_info is valid; the kernel fills what fits.
    let mut info: libc::tcp_info = unsafe { std::mem::zeroed() };
    let mut len = size_of::<libc::tcp_info>() as libc::socklen_t;
    // SAFETY: a live tcp_info of `len` bytes.
    let r = unsafe {
        libc::getsockopt(
            fd,
            libc::IPPROTO_TCP,
            libc::TCP_INFO,
            (&mut info as *mut libc::tcp_info).cast(),
            &mut len,
        )
    };
    if r < 0 {
        -1
    } else {
        c_int::from(info.tcpi_state)
    }
}

/// `revents` of `fd` for `events` now, without waiting.
pub fn ready(fd: c_int, events: i16) -> i16 {
    let mut p = libc::pollfd {
        fd,
        events,
        revents: 0,
    };
    let zero = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: one live pollfd, a zero timeout, no mask.
    let r = unsafe {
        libc::syscall(
            libc::SYS_ppoll,
            &mut p as *mut libc::pollfd,
            1,
            &zero,
            std::ptr::null::<libc::sigset_t>(),
            0,
        )
    };
    if r < 0 {
        0
    } else {
        p.revents
    }
}

/// Sleeps with the system call (no hook parks a fiber here).
pub fn nap(d: Duration) {
    let ts = libc::timespec {
        tv_sec: d.as_secs() as libc::time_t,
        tv_nsec: d.subsec_nanos() as libc::c_long,
    };
    // SAFETY: a live timespec, no remainder wanted.
    unsafe {
        libc::syscall(
            libc::SYS_nanosleep,
            &ts,
            std::ptr::null_mut::<libc::timespec>(),
        )
    };
}

/// An integer socket option, or -1.
pub fn sockopt(fd: c_int, level: c_int, name: c_int) -> c_int {
    let mut v: c_int = 0;
    let mut len = size_of::<c_int>() as libc::socklen_t;
    // SAFETY: an int-sized option into a live int.
    let r = unsafe { libc::getsockopt(fd, level, name, (&mut v as *mut c_int).cast(), &mut len) };
    if r < 0 {
        -1
    } else {
        v
    }
}

/// Whether socket `fd` has a timeout for `opt` (`SO_RCVTIMEO`/`SO_SNDTIMEO`).
pub fn has_timeout(fd: c_int, opt: c_int) -> bool {
    let mut tv = libc::timeval {
        tv_sec: 0,
        tv_usec: 0,
    };
    let mut len = size_of::<libc::timeval>() as libc::socklen_t;
    // SAFETY: a timeval-sized option into a live timeval.
    let r = unsafe {
        libc::getsockopt(
            fd,
            libc::SOL_SOCKET,
            opt,
            (&mut tv as *mut libc::timeval).cast(),
            &mut len,
        )
    };
    r == 0 && (tv.tv_sec != 0 || tv.tv_usec != 0)
}

/// Sets socket timeout `opt` of `fd` to `ms` milliseconds.
pub fn set_timeout(fd: c_int, opt: c_int, ms: u32) {
    let tv = libc::timeval {
        tv_sec: 0,
        tv_usec: (ms * 1000) as libc::suseconds_t,
    };
    // SAFETY: a live timeval of the option's size.
    let r = unsafe {
        libc::setsockopt(
            fd,
            libc::SOL_SOCKET,
            opt,
            (&tv as *const libc::timeval).cast(),
            size_of::<libc::timeval>() as _,
        )
    };
    assert_eq!(r, 0, "harness: setsockopt timeout");
}

/// Sets an integer socket option (the harness's setup; failures are the harness's).
pub fn set_sockopt(fd: c_int, level: c_int, name: c_int, v: c_int) {
    // SAFETY: a live int of the option's size.
    let r = unsafe {
        libc::setsockopt(
            fd,
            level,
            name,
            (&v as *const c_int).cast(),
            size_of::<c_int>() as _,
        )
    };
    assert_eq!(r, 0, "harness: setsockopt {name}");
}

/// Whether `fd` is a TCP socket.
pub fn is_tcp(fd: c_int) -> bool {
    sockopt(fd, libc::SOL_SOCKET, libc::SO_DOMAIN) == libc::AF_INET
        && sockopt(fd, libc::SOL_SOCKET, libc::SO_TYPE) == libc::SOCK_STREAM
}

/// Whether `a` and `b` are the same open file.
pub fn same_file(a: c_int, b: c_int) -> bool {
    // SAFETY: compares two descriptors of this process.
    unsafe {
        let pid = libc::getpid();
        libc::syscall(libc::SYS_kcmp, pid, pid, 0, a, b) == 0
    }
}

/// The placeholder's source: `/dev/null`, opened once.
fn devnull() -> c_int {
    static NULL: OnceLock<c_int> = OnceLock::new();
    *NULL.get_or_init(|| {
        // SAFETY: a NUL-terminated path.
        let fd = unsafe { libc::open(c"/dev/null".as_ptr(), libc::O_RDONLY | libc::O_CLOEXEC) };
        assert!(fd >= 0, "harness: open /dev/null");
        fd
    })
}

/// Readies the process for a side: fills the free numbers below [`base`], checks that the
/// program's range is free, and (once) grows the descriptor table to 1024 entries, so that
/// `select`'s view of the table (it ignores bits past its size) is the same on every side.
pub fn prepare() {
    static GROWN: OnceLock<()> = OnceLock::new();
    let base = base();
    let null = devnull();
    GROWN.get_or_init(|| {
        // SAFETY: duplicates the harness's own /dev/null onto a free number, then closes it.
        unsafe {
            assert!(!is_open(1023), "harness: fd 1023 is in use");
            assert_eq!(
                libc::syscall(libc::SYS_dup3, null, 1023, libc::O_CLOEXEC),
                1023
            );
        }
        close(1023);
    });
    for fd in 0..base {
        if !is_open(fd) {
            // SAFETY: fills a free number with a copy of the harness's /dev/null.
            let r = unsafe { libc::syscall(libc::SYS_dup3, null, fd, libc::O_CLOEXEC) };
            assert_eq!(r, fd as libc::c_long, "harness: placeholder for fd {fd}");
        }
    }
    for fd in base..end() {
        assert!(
            !is_open(fd),
            "harness: fd {fd} in the program's range is open"
        );
    }
    assert!(!is_open(UNUSED), "harness: fd {UNUSED} is open");
}

/// Closes what a side left in the program's range with its own `close`; TCP sockets reset
/// (no TIME_WAIT left behind by thousands of runs).
pub fn cleanup(close_fn: unsafe extern "C" fn(c_int) -> c_int) {
    for fd in base()..end() {
        if is_open(fd) {
            if is_tcp(fd) {
                let l = libc::linger {
                    l_onoff: 1,
                    l_linger: 0,
                };
                // SAFETY: a live linger of the option's size.
                unsafe {
                    libc::setsockopt(
                        fd,
                        libc::SOL_SOCKET,
                        libc::SO_LINGER,
                        (&l as *const libc::linger).cast(),
                        size_of::<libc::linger>() as _,
                    )
                };
            }
            // SAFETY: a descriptor of the program's range, which the side owns.
            unsafe { close_fn(fd) };
        }
    }
}

/// Waits (by the clock, bounded by [`LIMIT`]) until `cond` holds; false if it never did.
pub fn wait_for(mut cond: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + LIMIT;
    let mut pause = Duration::from_micros(20);
    while !cond() {
        if Instant::now() >= deadline {
            return false;
        }
        nap(pause);
        pause = (pause * 2).min(Duration::from_millis(2));
    }
    true
}
