//! What the kernel says a thread is doing, read from `/proc` without stopping it: whether it
//! is blocked in a system call (and which), and how long it has run on a CPU.
//! For the watchdog, which must tell a fiber that computes from a worker blocked in the
//! kernel or kept off its CPU.

use std::io::Read;

/// A thread's state as `/proc/self/task/<tid>/{stat,syscall,schedstat}` report it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct ThreadView {
    /// Asleep in the kernel (state `S` or `D`) inside this system call.
    pub(crate) blocked_in: Option<libc::c_long>,
    /// Time it has run on a CPU, in ns.
    pub(crate) on_cpu_ns: u64,
}

/// Reads `/proc/self/task/<tid>/<file>` into `buf`; its text, or `None`.
fn read<'a>(tid: i32, file: &str, buf: &'a mut [u8]) -> Option<&'a str> {
    let mut f = std::fs::File::open(format!("/proc/self/task/{tid}/{file}")).ok()?;
    let n = f.read(buf).ok()?;
    std::str::from_utf8(&buf[..n]).ok()
}

/// Thread `tid`'s view, or `None` if `/proc` cannot tell (not mounted, or the thread ended).
pub(crate) fn of(tid: i32) -> Option<ThreadView> {
    let mut buf = [0u8; 512];
    // `schedstat`: run time, wait time (ns), timeslices.
    let sched = read(tid, "schedstat", &mut buf)?;
    let on_cpu_ns = sched.split_whitespace().next()?.parse::<u64>().ok()?;
    // `stat`: the state is the field after the command name, which is in parentheses and
    // may hold spaces: look after the last ')'.
    let stat = read(tid, "stat", &mut buf)?;
    let state = stat.rsplit_once(')')?.1.split_whitespace().next()?;
    let asleep = matches!(state, "S" | "D");
    // `syscall`: the number and arguments of the call it is in, `-1 …` outside one, or
    // `running` while it runs.
    let blocked_in = if asleep {
        read(tid, "syscall", &mut buf)
            .and_then(|s| s.split_whitespace().next()?.parse::<libc::c_long>().ok())
            .filter(|&nr| nr >= 0)
    } else {
        None
    };
    Some(ThreadView {
        blocked_in,
        on_cpu_ns,
    })
}

/// The name of system call `nr`, for the ones a worker is likely to be found blocked in.
pub(crate) fn syscall_name(nr: libc::c_long) -> Option<&'static str> {
    let known: &[(libc::c_long, &str)] = &[
        (libc::SYS_futex, "futex"),
        (libc::SYS_read, "read"),
        (libc::SYS_write, "write"),
        (libc::SYS_pread64, "pread64"),
        (libc::SYS_pwrite64, "pwrite64"),
        (libc::SYS_readv, "readv"),
        (libc::SYS_writev, "writev"),
        (libc::SYS_recvfrom, "recvfrom"),
        (libc::SYS_sendto, "sendto"),
        (libc::SYS_recvmsg, "recvmsg"),
        (libc::SYS_sendmsg, "sendmsg"),
        (libc::SYS_recvmmsg, "recvmmsg"),
        (libc::SYS_sendmmsg, "sendmmsg"),
        (libc::SYS_ppoll, "ppoll"),
        (libc::SYS_pselect6, "pselect6"),
        (libc::SYS_epoll_pwait, "epoll_pwait"),
        (libc::SYS_nanosleep, "nanosleep"),
        (libc::SYS_clock_nanosleep, "clock_nanosleep"),
        (libc::SYS_accept4, "accept4"),
        (libc::SYS_connect, "connect"),
        (libc::SYS_wait4, "wait4"),
        (libc::SYS_waitid, "waitid"),
        (libc::SYS_flock, "flock"),
        (libc::SYS_fcntl, "fcntl"),
        (libc::SYS_fsync, "fsync"),
        (libc::SYS_fdatasync, "fdatasync"),
        (libc::SYS_openat, "openat"),
        (libc::SYS_splice, "splice"),
        (libc::SYS_sendfile, "sendfile"),
        (libc::SYS_copy_file_range, "copy_file_range"),
        (libc::SYS_msgrcv, "msgrcv"),
        (libc::SYS_semop, "semop"),
        #[cfg(target_arch = "x86_64")]
        (libc::SYS_poll, "poll"),
        #[cfg(target_arch = "x86_64")]
        (libc::SYS_select, "select"),
        #[cfg(target_arch = "x86_64")]
        (libc::SYS_epoll_wait, "epoll_wait"),
        #[cfg(target_arch = "x86_64")]
        (libc::SYS_accept, "accept"),
        #[cfg(target_arch = "x86_64")]
        (libc::SYS_open, "open"),
        #[cfg(target_arch = "x86_64")]
        (libc::SYS_pause, "pause"),
    ];
    known.iter().find(|(n, _)| *n == nr).map(|(_, name)| *name)
}

/// The calling thread's id.
pub(crate) fn gettid() -> i32 {
    // SAFETY: a system call without arguments.
    unsafe { libc::syscall(libc::SYS_gettid) as i32 }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A thread blocked on a futex (a std mutex another thread holds) is seen blocked in
    /// `futex`; the calling thread, which runs, is not blocked.
    #[test]
    fn a_thread_blocked_on_a_std_mutex_is_seen_in_futex() {
        let m = std::sync::Arc::new(std::sync::Mutex::new(()));
        let held = m.lock().unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        let m2 = m.clone();
        let t = std::thread::spawn(move || {
            tx.send(gettid()).unwrap();
            drop(m2.lock().unwrap());
        });
        let tid = rx.recv().unwrap();
        let mut seen = None;
        for _ in 0..500 {
            seen = of(tid).and_then(|v| v.blocked_in);
            if seen.is_some() {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(2));
        }
        assert_eq!(seen.and_then(syscall_name), Some("futex"));
        drop(held);
        t.join().unwrap();
        let me = of(gettid()).expect("/proc");
        assert_eq!(me.blocked_in, None);
        assert!(me.on_cpu_ns > 0);
    }
}
