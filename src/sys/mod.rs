//! Thin wrappers over the Linux system calls fibra needs (futex, page size).
//! Everything here is safe to call; the `unsafe` stays inside.

pub(crate) mod futex;

/// The size of a memory page, read once.
pub(crate) fn page_size() -> usize {
    use std::sync::OnceLock;
    static PAGE: OnceLock<usize> = OnceLock::new();
    *PAGE.get_or_init(|| {
        // SAFETY: sysconf has no preconditions.
        let p = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
        if p > 0 {
            p as usize
        } else {
            4096
        }
    })
}
