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

/// Maps `len` bytes of fresh anonymous read-write memory where the kernel chooses, committed
/// only as pages are touched (`MAP_NORESERVE`): the address, or the `mmap` error.
pub(crate) fn map_lazy(len: usize) -> std::io::Result<usize> {
    // SAFETY: an anonymous private mapping at an address of the kernel's choosing touches no
    // existing memory.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
            -1,
            0,
        )
    };
    if p == libc::MAP_FAILED {
        Err(std::io::Error::last_os_error())
    } else {
        Ok(p as usize)
    }
}

/// `d` as a `timespec` for a system call's timeout (seconds capped far beyond any real wait).
pub(crate) fn timespec(d: std::time::Duration) -> libc::timespec {
    libc::timespec {
        tv_sec: d.as_secs().min(i64::MAX as u64 / 2) as libc::time_t,
        tv_nsec: d.subsec_nanos() as libc::c_long,
    }
}

/// `CLOCK_MONOTONIC` in nanoseconds: the clock `Instant` reads.
pub(crate) fn mono_ns() -> u64 {
    clock_ns(libc::CLOCK_MONOTONIC)
}

/// `CLOCK_MONOTONIC_COARSE` in nanoseconds: the same clock as [`mono_ns`] as of the last
/// kernel tick (1–4 ms behind at most), at a fifth of the cost. For diagnostics' timestamps.
pub(crate) fn coarse_ns() -> u64 {
    clock_ns(libc::CLOCK_MONOTONIC_COARSE)
}

fn clock_ns(clock: libc::clockid_t) -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec; both clocks exist on every Linux fibra
    // supports, and on failure `ts` stays zero.
    unsafe { libc::clock_gettime(clock, &mut ts) };
    (ts.tv_sec as u64)
        .wrapping_mul(1_000_000_000)
        .wrapping_add(ts.tv_nsec as u64)
}

/// `membarrier(2)` commands (the libc crate does not define them).
const MEMBARRIER_CMD_PRIVATE_EXPEDITED: libc::c_long = 1 << 3;
const MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED: libc::c_long = 1 << 4;

/// Whether [`membarrier`] works in this process: registered once, on first use.
pub(crate) fn membarrier_ready() -> bool {
    use std::sync::OnceLock;
    static READY: OnceLock<bool> = OnceLock::new();
    *READY.get_or_init(|| {
        // SAFETY: registration has no memory effects; on kernels without the command it
        // fails with EINVAL or ENOSYS, which we report as not ready.
        unsafe {
            libc::syscall(
                libc::SYS_membarrier,
                MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED,
                0,
                0,
            ) == 0
        }
    })
}

/// Makes every running thread of this process execute a full memory barrier before this
/// returns (`membarrier(MEMBARRIER_CMD_PRIVATE_EXPEDITED)`); threads not running pass
/// through one when they are switched back in. Only after [`membarrier_ready`] said yes.
/// Returns whether it did (it cannot fail after a successful registration, but a caller
/// must not rely on barriers that did not happen).
pub(crate) fn membarrier() -> bool {
    // SAFETY: the command only issues barriers on this process's CPUs; the registration it
    // needs was made (see `membarrier_ready`).
    unsafe { libc::syscall(libc::SYS_membarrier, MEMBARRIER_CMD_PRIVATE_EXPEDITED, 0, 0) == 0 }
}
