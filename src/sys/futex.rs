//! `futex(2)` wait and wake on an `AtomicU32`: the one way a fibra thread sleeps.

use std::sync::atomic::AtomicU32;
use std::time::Duration;

/// Sleeps while `*word == expected`, at most `timeout`. Returns early on a wake, a signal, or
/// when the word already differs; callers re-check their condition in a loop.
pub(crate) fn wait(word: &AtomicU32, expected: u32, timeout: Option<Duration>) {
    let ts = timeout.map(crate::sys::timespec);
    let ts_ptr = ts
        .as_ref()
        .map_or(std::ptr::null(), |t| t as *const libc::timespec);
    // SAFETY: `word` is a valid, aligned u32 for the duration of the call; the timespec pointer
    // is null or points to a live local. FUTEX_PRIVATE_FLAG is right because every waiter and
    // waker lives in this process.
    unsafe {
        libc::syscall(
            libc::SYS_futex,
            word.as_ptr(),
            libc::FUTEX_WAIT | libc::FUTEX_PRIVATE_FLAG,
            expected,
            ts_ptr,
        );
    }
}

/// Wakes at most `n` threads sleeping in [`wait`] on `word`.
pub(crate) fn wake(word: &AtomicU32, n: i32) {
    // SAFETY: waking on any address is harmless; `word` is valid.
    unsafe {
        libc::syscall(
            libc::SYS_futex,
            word.as_ptr(),
            libc::FUTEX_WAKE | libc::FUTEX_PRIVATE_FLAG,
            n,
        );
    }
}
