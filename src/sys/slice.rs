//! The kernel time slice of a thread: `sched_setattr`'s `sched_runtime` for a thread of the
//! fair class, which the EEVDF scheduler (Linux 6.12 and later) takes as the thread's
//! slice: how long it may run before a thread that waits for its CPU gets it, and how soon a
//! woken thread preempts it. Older kernels ignore it.

use std::io;
use std::time::Duration;

/// The shortest slice the kernel takes.
pub(crate) const MIN_SLICE: Duration = Duration::from_micros(100);
/// The longest slice the kernel takes.
pub(crate) const MAX_SLICE: Duration = Duration::from_millis(100);

/// `struct sched_attr` as of Linux 4.13 (`SCHED_ATTR_SIZE_VER1`), which the libc crate does
/// not define.
#[repr(C)]
#[derive(Default)]
struct SchedAttr {
    size: u32,
    sched_policy: u32,
    sched_flags: u64,
    sched_nice: i32,
    sched_priority: u32,
    sched_runtime: u64,
    sched_deadline: u64,
    sched_period: u64,
    sched_util_min: u32,
    sched_util_max: u32,
}

/// The calling thread's scheduling attributes.
fn get() -> io::Result<SchedAttr> {
    let mut attr = SchedAttr::default();
    // SAFETY: `attr` is a live, writable `sched_attr` of the size passed; 0 is this thread.
    let r = unsafe {
        libc::syscall(
            libc::SYS_sched_getattr,
            0,
            &mut attr as *mut SchedAttr,
            std::mem::size_of::<SchedAttr>() as libc::c_uint,
            0,
        )
    };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(attr)
}

/// Sets the calling thread's slice to `slice` (within `MIN_SLICE..=MAX_SLICE`), keeping its
/// policy and nice value. Only for the fair class (`SCHED_OTHER`, `SCHED_BATCH`): a real-time
/// thread's `sched_runtime` means something else, so it is left alone (`Ok`).
pub(crate) fn set_time_slice(slice: Duration) -> io::Result<()> {
    let mut attr = get()?;
    if !matches!(
        attr.sched_policy as i32,
        libc::SCHED_OTHER | libc::SCHED_BATCH
    ) {
        return Ok(());
    }
    attr.size = std::mem::size_of::<SchedAttr>() as u32;
    attr.sched_flags = 0;
    attr.sched_runtime = slice.as_nanos() as u64;
    // SAFETY: `attr` is a live `sched_attr` with its size set; 0 is this thread.
    let r = unsafe { libc::syscall(libc::SYS_sched_setattr, 0, &attr as *const SchedAttr, 0) };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// The calling thread's slice as the kernel reports it (0: the default).
#[cfg(test)]
pub(crate) fn time_slice() -> io::Result<Duration> {
    Ok(Duration::from_nanos(get()?.sched_runtime))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Whether the running kernel's release is at least `major.minor`.
    fn kernel_at_least(major: u32, minor: u32) -> bool {
        // SAFETY: `utsname` is plain data, filled by the call.
        let mut u: libc::utsname = unsafe { std::mem::zeroed() };
        // SAFETY: a live, writable `utsname`.
        assert_eq!(unsafe { libc::uname(&mut u) }, 0);
        // SAFETY: the kernel NUL-terminates the release.
        let release = unsafe { std::ffi::CStr::from_ptr(u.release.as_ptr()) };
        let mut parts = release.to_str().unwrap_or("").split(['.', '-']);
        let mut next = || {
            parts
                .next()
                .and_then(|p| p.parse::<u32>().ok())
                .unwrap_or(0)
        };
        (next(), next()) >= (major, minor)
    }

    /// On a thread of its own (the attribute stays with the thread): the slice set is the
    /// slice read back, on kernels that take one.
    #[test]
    fn a_slice_set_is_read_back() {
        std::thread::spawn(|| {
            set_time_slice(Duration::from_micros(300)).expect("sched_setattr");
            let read = time_slice().expect("sched_getattr");
            assert!(
                read == Duration::from_micros(300) || !kernel_at_least(6, 12),
                "read back {read:?}"
            );
        })
        .join()
        .unwrap();
    }

    /// A scheduler's worker threads run with the slice asked for; a slice the kernel does not
    /// take is refused by `build`, with the value in the error.
    #[test]
    fn workers_run_with_the_builders_slice() {
        let sched = crate::Scheduler::builder()
            .threads(2)
            .time_slice(Duration::from_micros(500))
            .build()
            .expect("a valid slice");
        sched.start();
        let read = sched.block_on(|| time_slice().expect("sched_getattr"));
        assert!(
            read == Duration::from_micros(500) || !kernel_at_least(6, 12),
            "a worker's slice is {read:?}"
        );
        sched.stop();
        for bad in [
            Duration::from_micros(99),
            Duration::from_millis(101),
            Duration::MAX,
        ] {
            let e = crate::Scheduler::builder().time_slice(bad).build().err();
            assert_eq!(e, Some(crate::Error::InvalidTimeSlice { requested: bad }));
        }
    }
}
