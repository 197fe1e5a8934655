//! Name resolution: `getaddrinfo` runs on the blocking pool (`crate::unblock`) while the
//! fiber waits, and cleans up after a cancellation.

use crate::hook::{active, in_fiber, real, set_errno};
use libc::{addrinfo, c_char, c_int};

struct Args(
    *const c_char,
    *const c_char,
    *const addrinfo,
    *mut *mut addrinfo,
);
// SAFETY: the pointers are the caller's, valid until the hook returns, and the hook waits for
// the pool thread to finish with them (also when the fiber is cancelled meanwhile).
unsafe impl Send for Args {}

#[no_mangle]
pub unsafe extern "C" fn getaddrinfo(
    node: *const c_char,
    service: *const c_char,
    hints: *const addrinfo,
    res: *mut *mut addrinfo,
) -> c_int {
    let Some(meta) = active() else {
        // SAFETY: the caller's arguments.
        return unsafe { real::getaddrinfo(node, service, hints, res) };
    };
    if meta.hook_cancel.get() {
        // A hook caught this fiber's cancellation already: like every hooked call that
        // would wait, fail at once rather than resolve (this call always waits).
        set_errno(libc::ECANCELED);
        return libc::EAI_SYSTEM;
    }
    let args = Args(node, service, hints, res);
    // What the pool's call returned, written by the pool thread itself: if the fiber is
    // cancelled while it waits, `unblock` still waits for the call but its value is lost.
    const NOT_RUN: c_int = c_int::MIN;
    let returned = std::sync::atomic::AtomicI32::new(NOT_RUN);
    let cancelled = std::cell::Cell::new(false);
    let rc = in_fiber(
        meta,
        || {
            cancelled.set(true);
            libc::EAI_SYSTEM
        },
        || {
            let returned = &returned;
            crate::unblock(move || {
                let a = args;
                // SAFETY: the caller's arguments, alive until this hook returns.
                let rc = unsafe { real::getaddrinfo(a.0, a.1, a.2, a.3) };
                returned.store(rc, std::sync::atomic::Ordering::Release);
                rc
            })
        },
    );
    if cancelled.get() {
        // Cancelled: the caller sees an error, so it will not free a list the call made.
        if returned.load(std::sync::atomic::Ordering::Acquire) == 0 {
            // SAFETY: the successful call wrote the list to the caller's out-pointer.
            unsafe {
                libc::freeaddrinfo(*res);
                *res = std::ptr::null_mut();
            }
        }
        set_errno(libc::ECANCELED);
    }
    rc
}
