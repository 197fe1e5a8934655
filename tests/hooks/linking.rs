//! The `hook` feature's C library definitions are in a binary exactly when the feature is
//! on: without it nothing is interposed.

use std::ffi::CStr;

/// The C library's own address of `name`.
fn libc_symbol(name: &CStr) -> usize {
    // SAFETY: dlopen of the already-loaded C library (RTLD_NOLOAD) and dlsym of a symbol
    // by a NUL-terminated name.
    unsafe {
        let handle = libc::dlopen(c"libc.so.6".as_ptr(), libc::RTLD_NOW | libc::RTLD_NOLOAD);
        assert!(!handle.is_null(), "the C library is not libc.so.6");
        let addr = libc::dlsym(handle, name.as_ptr()) as usize;
        libc::dlclose(handle);
        addr
    }
}

#[test]
fn hooks_are_interposed_exactly_when_the_feature_is_on() {
    // Building a scheduler is what links the hooks in (when the feature is on).
    drop(fibra::Scheduler::builder().threads(1).build().unwrap());
    // What calls in this executable resolve to, against the C library's definitions.
    let ours: [(&CStr, usize); 6] = [
        (c"read", libc::read as *const () as usize),
        (c"write", libc::write as *const () as usize),
        (c"connect", libc::connect as *const () as usize),
        (c"nanosleep", libc::nanosleep as *const () as usize),
        (c"poll", libc::poll as *const () as usize),
        (c"close", libc::close as *const () as usize),
    ];
    for (name, addr) in ours {
        let interposed = addr != libc_symbol(name);
        assert_eq!(
            interposed,
            cfg!(feature = "hook"),
            "{name:?}: interposed {interposed}, feature hook {}",
            cfg!(feature = "hook")
        );
    }
}
