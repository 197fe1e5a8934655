//! The `hook` feature: blocking C library calls made by std or any crate in a fiber park
//! only that fiber, with libc's semantics (errors, `errno`, blocking modes) everywhere else.
//! Without the feature only the linking check runs: `cargo test --features hook --test hooks`
//! runs them all.

#[path = "../common/mod.rs"]
mod common;

mod blocking_code;
mod calls;
#[cfg(feature = "hook")]
mod differential;
mod fd_modes;
mod fuzz_corpus;
mod fuzz_findings;
mod interference;
mod linking;
mod std_calls;
mod transfers;

/// One raw `getaddrinfo("localhost", "80")`, its list freed: the call's return value, and
/// `errno` when it failed.
#[cfg(feature = "hook")]
fn resolve_localhost() -> (i32, i32) {
    let mut res: *mut libc::addrinfo = std::ptr::null_mut();
    // SAFETY: NUL-terminated strings, a live out-pointer.
    let r = unsafe {
        libc::getaddrinfo(
            c"localhost".as_ptr(),
            c"80".as_ptr(),
            std::ptr::null(),
            &mut res,
        )
    };
    let e = std::io::Error::last_os_error().raw_os_error().unwrap_or(0);
    if r == 0 {
        assert!(!res.is_null());
        // SAFETY: the list the call made.
        unsafe { libc::freeaddrinfo(res) };
        (0, 0)
    } else {
        assert!(res.is_null(), "an error with a list: {r}");
        (r, e)
    }
}
