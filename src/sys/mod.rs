//! Thin wrappers over the Linux system calls fibra needs (futex, page size, clocks and the
//! deadline arithmetic of timed waits, CPU affinity), and with the `hook` feature the C
//! library's own functions behind the hooks (`real`). Everything here but `real` is safe to
//! call; the `unsafe` stays inside.

pub(crate) mod futex;
#[cfg(feature = "hook")]
pub(crate) mod real;
pub(crate) mod slice;
pub(crate) mod spin;
pub(crate) mod thread_view;

/// Starts loading the cache lines of `len` bytes at `addr` (at most `max_lines` of them),
/// without waiting: a hint that never faults and changes nothing the program sees.
#[inline(always)]
pub(crate) fn prefetch(addr: *const u8, len: usize, max_lines: usize) {
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
        let first = addr.addr() & !63;
        let lines = (addr.addr() & 63).saturating_add(len).div_ceil(64);
        for line in 0..lines.min(max_lines) {
            // SAFETY: a prefetch is a hint: it reads nothing the program sees, changes no
            // memory and never faults, whatever the address.
            unsafe { _mm_prefetch::<_MM_HINT_T0>(first.wrapping_add(line * 64) as *const i8) };
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = (addr, len, max_lines);
}

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

/// The instant `d` from now, saturating about thirty years away instead of overflowing.
pub(crate) fn deadline_after(d: std::time::Duration) -> std::time::Instant {
    let now = std::time::Instant::now();
    now.checked_add(d).unwrap_or_else(|| far_future_from(now))
}

/// A deadline that saturates instead of overflowing (about thirty years away).
pub(crate) fn far_future() -> std::time::Instant {
    far_future_from(std::time::Instant::now())
}

fn far_future_from(now: std::time::Instant) -> std::time::Instant {
    now.checked_add(std::time::Duration::from_secs(30 * 365 * 24 * 3600))
        .unwrap_or(now)
}

/// `d` as a `timespec` for a system call's timeout (seconds capped far beyond any real wait).
pub(crate) fn timespec(d: std::time::Duration) -> libc::timespec {
    libc::timespec {
        tv_sec: d.as_secs().min(i64::MAX as u64 / 2) as libc::time_t,
        tv_nsec: d.subsec_nanos() as libc::c_long,
    }
}

/// The CPU this thread runs on (a few ns: glibc reads it from rseq), or `None` if the kernel
/// cannot tell.
pub(crate) fn current_cpu() -> Option<u32> {
    // SAFETY: `sched_getcpu` takes no arguments and writes no memory of ours.
    u32::try_from(unsafe { libc::sched_getcpu() }).ok()
}

/// `CLOCK_MONOTONIC` in nanoseconds: the clock `Instant` reads.
pub(crate) fn mono_ns() -> u64 {
    clock_ns(libc::CLOCK_MONOTONIC)
}

/// `CLOCK_MONOTONIC_COARSE` in nanoseconds: the same clock as [`mono_ns`] as of the last
/// kernel tick (1–4 ms behind at most), at a fraction of the cost. For diagnostics'
/// timestamps.
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

/// Keeps the calling thread on one CPU until dropped: made by [`CpuHold::on`], it then
/// gives the thread back the CPUs it was allowed before.
///
/// For a worker's short naps only (see docs/design.md, "Sharing a CPU"). If the thread's
/// affinity was changed while held (by the program, or by a cpuset update), the change is
/// kept and the old set is not restored. A thread spawned from a held one would inherit the
/// single CPU, so nothing may spawn threads while one is held: a napping worker runs none of
/// its fibers.
pub(crate) struct CpuHold {
    before: libc::cpu_set_t,
    held: libc::cpu_set_t,
}

impl CpuHold {
    /// Holds the calling thread on `cpu`, or `None` where that cannot be done: the kernel
    /// refuses (a seccomp filter, a cpuset without `cpu`), the thread may not run on `cpu`
    /// anyway, or the machine has more CPUs than a `cpu_set_t` holds. A refusal other than
    /// for `cpu` itself turns the holds off for good.
    pub(crate) fn on(cpu: u32) -> Option<CpuHold> {
        use std::sync::atomic::{AtomicBool, Ordering};
        static REFUSED: AtomicBool = AtomicBool::new(false);
        let cpu = usize::try_from(cpu).ok()?;
        if REFUSED.load(Ordering::Relaxed) || cpu >= libc::CPU_SETSIZE as usize {
            return None;
        }
        let before = current_affinity()?;
        // SAFETY: `cpu` is below CPU_SETSIZE (checked), so the bit is within the set.
        if !unsafe { libc::CPU_ISSET(cpu, &before) } {
            return None;
        }
        // SAFETY: an all-zero `cpu_set_t` is the empty set, a valid value.
        let mut held: libc::cpu_set_t = unsafe { std::mem::zeroed() };
        // SAFETY: as above, the bit is within the set.
        unsafe { libc::CPU_SET(cpu, &mut held) };
        if !set_affinity(&held) {
            let e = std::io::Error::last_os_error().raw_os_error();
            if e != Some(libc::EINVAL) {
                REFUSED.store(true, Ordering::Relaxed);
            }
            return None;
        }
        Some(CpuHold { before, held })
    }
}

impl Drop for CpuHold {
    fn drop(&mut self) {
        // Changed while held: keep what the program (or a cpuset) asked for.
        // SAFETY: `CPU_EQUAL` compares two valid sets.
        if current_affinity().is_some_and(|now| unsafe { libc::CPU_EQUAL(&now, &self.held) }) {
            // A refusal leaves the thread on one CPU, which is still correct, only less free.
            set_affinity(&self.before);
        }
    }
}

/// The calling thread's CPU set, or `None` if the kernel does not tell.
fn current_affinity() -> Option<libc::cpu_set_t> {
    // SAFETY: an all-zero `cpu_set_t` is the empty set, a valid value.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    // SAFETY: pid 0 is the calling thread; the kernel writes at most `size_of` bytes into
    // `set`, which lives across the call.
    let r = unsafe { libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set) };
    (r == 0).then_some(set)
}

/// Sets the calling thread's CPU set; whether the kernel accepted it.
fn set_affinity(set: &libc::cpu_set_t) -> bool {
    // SAFETY: pid 0 is the calling thread; the kernel reads `size_of` bytes from `set`, a
    // valid set that lives across the call.
    unsafe { libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), set) == 0 }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A prefetch of any range, mapped or not, wrapping or empty, is harmless and changes
    /// nothing.
    #[test]
    fn prefetching_any_range_is_harmless() {
        let local = [7u8; 1024];
        for (addr, len) in [
            (std::ptr::null(), 0),
            (std::ptr::null(), 4096),
            (local.as_ptr(), local.len()),
            (local.as_ptr().wrapping_sub(64), 64),
            (std::ptr::without_provenance(usize::MAX - 63), 1 << 20),
            (std::ptr::without_provenance(0x0000_7fff_ffff_f000), 8192),
        ] {
            prefetch(addr, len, 16);
        }
        assert_eq!(local, [7u8; 1024]);
    }

    fn allowed() -> Vec<usize> {
        let set = current_affinity().expect("sched_getaffinity");
        // SAFETY: every index is below CPU_SETSIZE.
        (0..libc::CPU_SETSIZE as usize)
            .filter(|&c| unsafe { libc::CPU_ISSET(c, &set) })
            .collect()
    }

    /// Runs `f` on a thread of its own, whose CPU set no other test shares.
    fn on_own_thread(f: impl FnOnce() + Send + 'static) {
        std::thread::spawn(f).join().unwrap();
    }

    fn here() -> u32 {
        super::current_cpu().expect("sched_getcpu")
    }

    #[test]
    fn a_hold_keeps_the_thread_on_its_cpu_and_gives_the_old_set_back() {
        on_own_thread(|| {
            let before = allowed();
            let cpu = here();
            let hold = CpuHold::on(cpu).expect("the thread may run where it runs");
            assert_eq!(allowed(), vec![cpu as usize]);
            assert_eq!(here(), cpu);
            drop(hold);
            assert_eq!(allowed(), before);
        });
    }

    #[test]
    fn a_hold_on_a_cpu_the_thread_may_not_use_is_refused() {
        on_own_thread(|| {
            let before = allowed();
            let cpu = here();
            // Outside CPU_SETSIZE, and (where there is one) a CPU outside the allowed set.
            assert!(CpuHold::on(libc::CPU_SETSIZE as u32).is_none());
            assert!(CpuHold::on(u32::MAX).is_none());
            if let Some(other) = (0..libc::CPU_SETSIZE as usize).find(|c| !before.contains(c)) {
                assert!(CpuHold::on(other as u32).is_none());
            }
            assert_eq!(allowed(), before, "refusals change nothing");
            // And holds still work afterwards: a refusal for the CPU itself is not sticky.
            drop(CpuHold::on(cpu).expect("hold"));
            assert_eq!(allowed(), before);
        });
    }

    #[test]
    fn an_affinity_changed_while_held_is_kept() {
        on_own_thread(|| {
            let before = allowed();
            let cpu = here() as usize;
            let hold = CpuHold::on(cpu as u32).expect("hold");
            // The program moves the thread meanwhile, to another CPU where it may run one.
            let Some(&other) = before.iter().find(|&&c| c != cpu) else {
                drop(hold);
                assert_eq!(allowed(), before, "one CPU: nothing else to move to");
                return;
            };
            let set_of = |cpus: &[usize]| {
                // SAFETY: an all-zero `cpu_set_t` is the empty set, a valid value.
                let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
                for &c in cpus {
                    // SAFETY: every CPU the kernel listed is below CPU_SETSIZE.
                    unsafe { libc::CPU_SET(c, &mut set) };
                }
                set
            };
            assert!(set_affinity(&set_of(&[other])));
            drop(hold);
            assert_eq!(allowed(), vec![other], "the program's change stays");
            assert!(set_affinity(&set_of(&before)));
        });
    }
}
