//! The calls that make, copy or end descriptors, or change their mode: `close`, `fcntl`,
//! `ioctl`, `dup`, `dup2`, `dup3`, `socket`, `socketpair`, `pipe` and `pipe2`. They keep
//! `hook::fd`'s table right, and show the user's view of `O_NONBLOCK` on the descriptors
//! fibra switched to non-blocking mode.

use crate::hook::{self, fd, real};
use libc::{c_int, c_ulong};

#[no_mangle]
pub unsafe extern "C" fn close(fd: c_int) -> c_int {
    fd::forget(fd);
    // SAFETY: the caller's fd.
    unsafe { real::close(fd) }
}

/// `fcntl(fd, cmd, arg)`. The C function is variadic; on the 64-bit Linux ABIs fibra
/// supports, an integer or pointer third argument travels in the same register either way,
/// so it is taken (and passed on) as one machine word.
#[no_mangle]
pub unsafe extern "C" fn fcntl(fd: c_int, cmd: c_int, arg: c_ulong) -> c_int {
    match cmd {
        libc::F_GETFL => {
            // SAFETY: F_GETFL takes no argument.
            let flags = unsafe { real::fcntl(fd, cmd, arg) };
            let state = if flags >= 0 && flags & libc::O_NONBLOCK != 0 {
                fd::look_nonblocking(fd)
            } else {
                fd::lookup(fd).map(|s| s.state())
            };
            match state {
                Some(s) if flags >= 0 && s & 3 == fd::HOOKED => {
                    (flags & !libc::O_NONBLOCK)
                        | if s & fd::USER_NONBLOCK != 0 {
                            libc::O_NONBLOCK
                        } else {
                            0
                        }
                }
                _ => flags,
            }
        }
        libc::F_SETFL => {
            let Some(slot) = hooked_for_mode(fd) else {
                // SAFETY: F_SETFL takes an int of flags.
                return unsafe { real::fcntl(fd, cmd, arg) };
            };
            // The kernel mode stays non-blocking; the user's view changes only if the kernel
            // takes the rest of the request.
            // SAFETY: as above.
            let r = unsafe { real::fcntl(fd, cmd, arg | libc::O_NONBLOCK as c_ulong) };
            if r == 0 {
                slot.set_user_nonblock(fd, arg as c_int & libc::O_NONBLOCK != 0);
            }
            r
        }
        libc::F_DUPFD | libc::F_DUPFD_CLOEXEC => {
            // SAFETY: the caller's arguments.
            let r = unsafe { real::fcntl(fd, cmd, arg) };
            if r >= 0 {
                fd::duplicated(fd, r);
            }
            r
        }
        // SAFETY: the caller's arguments, passed on in the same register.
        _ => unsafe { real::fcntl(fd, cmd, arg) },
    }
}

/// The slot of `fd` if it is hooked, for a change of its blocking mode. An fd nothing
/// looked at yet whose open file is non-blocking in the kernel is looked at first: another
/// hooked fd may hold that open file's view (the kernel's flag then kept by fibra, or set
/// by the user), which the change must reach. With the kernel's flag clear no hooked fd
/// holds the open file, and the change is the kernel's alone.
fn hooked_for_mode(fd: c_int) -> Option<&'static fd::Slot> {
    fd::look_nonblocking(fd);
    fd::lookup(fd).filter(|s| s.hooked())
}

/// `ioctl(fd, request, arg)`: variadic like `fcntl`, taken the same way.
#[no_mangle]
pub unsafe extern "C" fn ioctl(fd: c_int, request: c_ulong, arg: c_ulong) -> c_int {
    if request == libc::FIONBIO as c_ulong && arg != 0 {
        if let Some(slot) = hooked_for_mode(fd) {
            // The kernel reads the argument first: one it cannot read gets its EFAULT (and
            // the mode stays as it was).
            if !hook::readable(arg as *const libc::c_void, size_of::<c_int>()) {
                // SAFETY: the caller's arguments, for the kernel to refuse.
                return unsafe { real::ioctl(fd, request, arg) };
            }
            // SAFETY: FIONBIO's argument points to the caller's int, readable (just asked).
            let on = unsafe { *(arg as *const c_int) } != 0;
            let one: c_int = 1;
            // SAFETY: FIONBIO with a pointer to a live int: the kernel mode stays
            // non-blocking; the user's view changes if the kernel takes the request.
            let r = unsafe { real::ioctl(fd, request, &one as *const c_int as c_ulong) };
            if r == 0 {
                slot.set_user_nonblock(fd, on);
            }
            return r;
        }
    }
    // SAFETY: the caller's arguments, passed on in the same registers.
    unsafe { real::ioctl(fd, request, arg) }
}

#[no_mangle]
pub unsafe extern "C" fn dup(fd: c_int) -> c_int {
    // SAFETY: the caller's fd.
    let r = unsafe { real::dup(fd) };
    if r >= 0 {
        fd::duplicated(fd, r);
    }
    r
}

/// Whether `fd` is open (a failed `dup2`/`dup3` must leave its target alone).
fn is_open(fd: c_int) -> bool {
    // SAFETY: F_GETFD takes no argument.
    unsafe { real::fcntl(fd, libc::F_GETFD, 0) >= 0 }
}

#[no_mangle]
pub unsafe extern "C" fn dup2(fd: c_int, new: c_int) -> c_int {
    if fd != new && is_open(fd) {
        // `new` is closed by the call: forget it first, as `close` would (after, a waiter
        // or the reactor would meet the number's new file).
        fd::forget(new);
    }
    // SAFETY: the caller's fds.
    let r = unsafe { real::dup2(fd, new) };
    if r >= 0 && fd != new {
        fd::duplicated(fd, r);
    }
    r
}

#[no_mangle]
pub unsafe extern "C" fn dup3(fd: c_int, new: c_int, flags: c_int) -> c_int {
    // The kernel refuses these before touching `new`.
    if fd != new && flags & !libc::O_CLOEXEC == 0 && is_open(fd) {
        fd::forget(new);
    }
    // SAFETY: the caller's arguments.
    let r = unsafe { real::dup3(fd, new, flags) };
    if r >= 0 {
        fd::duplicated(fd, r);
    }
    r
}

#[no_mangle]
pub unsafe extern "C" fn socket(domain: c_int, ty: c_int, proto: c_int) -> c_int {
    // SAFETY: no pointers.
    let r = unsafe { real::socket(domain, ty, proto) };
    if r >= 0 {
        fd::created(r);
    }
    r
}

#[no_mangle]
pub unsafe extern "C" fn socketpair(
    domain: c_int,
    ty: c_int,
    proto: c_int,
    fds: *mut c_int,
) -> c_int {
    // SAFETY: the caller's array of two fds.
    let r = unsafe { real::socketpair(domain, ty, proto, fds) };
    if r == 0 {
        // SAFETY: filled in by the successful call.
        unsafe { forget_pair(fds) };
    }
    r
}

#[no_mangle]
pub unsafe extern "C" fn pipe(fds: *mut c_int) -> c_int {
    // SAFETY: the caller's array of two fds.
    let r = unsafe { real::pipe(fds) };
    if r == 0 {
        // SAFETY: filled in by the successful call.
        unsafe { forget_pair(fds) };
    }
    r
}

#[no_mangle]
pub unsafe extern "C" fn pipe2(fds: *mut c_int, flags: c_int) -> c_int {
    // SAFETY: the caller's array of two fds.
    let r = unsafe { real::pipe2(fds, flags) };
    if r == 0 {
        // SAFETY: filled in by the successful call.
        unsafe { forget_pair(fds) };
    }
    r
}

unsafe fn forget_pair(fds: *const c_int) {
    // SAFETY: the caller's two-fd array.
    let (a, b) = unsafe { (*fds, *fds.add(1)) };
    fd::created(a);
    fd::created(b);
}
