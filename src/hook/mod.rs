//! Hooks: with the `hook` feature, blocking calls that code in a fiber makes to the C
//! library suspend only that fiber — whether the code is yours, std's or a third-party
//! crate's. `std::net::TcpStream::read`, `std::thread::sleep`, a blocking HTTP or Redis
//! client: all of them park the fiber and let its worker run others.
//!
//! # How
//! The feature defines the C library's functions below in the executable (`#[no_mangle]`).
//! A definition in the executable takes precedence over the shared C library's for every call
//! linked into the executable — std's included — and the hook reaches the real function with
//! `dlsym(RTLD_NEXT, …)`. Each hook first asks whether it runs in a scheduled fiber with
//! hooks on ([`is_active`]); if not, it is the real call (see below for fds fibra switched).
//!
//! In a fiber, the first call on a pollable fd (socket, pipe, FIFO, character device,
//! eventfd and the like) switches it to non-blocking mode in the kernel; a call that would
//! block then parks the fiber on fibra's reactor until the fd is ready. The user's view of the
//! mode is kept apart: `fcntl(F_GETFL)` and `ioctl(FIONBIO)` report and set what the user
//! asked for, and an fd the user made non-blocking still fails with `EAGAIN` at once.
//! `SO_RCVTIMEO`/`SO_SNDTIMEO` (std's `set_read_timeout`/`set_write_timeout`) are honoured:
//! the call fails with `EAGAIN` after that long, as the kernel's would. A plain thread that
//! uses an fd fibra switched gets the blocking behaviour emulated with `poll(2)`, timeouts
//! included.
//!
//! # What is hooked
//! | calls | in a fiber with hooks on |
//! |---|---|
//! | `read`, `readv`, `recv`, `recvfrom`, `recvmsg` | wait until readable (`SO_RCVTIMEO` bounds the wait); `recv`, `recvfrom` and `recvmsg` with `MSG_WAITALL` on a stream socket wait for the whole buffer (with `MSG_PEEK` too on TCP: they peek it whole; a Unix socket's peek returns what is queued), as the kernel's do (a datagram socket's return one datagram, and a receive ends with a part that brings ancillary data such as fds, at the urgent mark, or at end-of-file); a datagram socket whose receive side is shut down returns 0 at once; `MSG_ERRQUEUE` on an Internet socket never waits |
//! | `write`, `writev`, `send`, `sendto`, `sendmsg` | wait until writable (`SO_SNDTIMEO`); on a blocking fd they return only when all bytes went, as the kernel's do (`sendmsg`'s ancillary data goes with the first part) |
//! | `connect` | waits for the connection (`SO_SNDTIMEO`: `EINPROGRESS` at the timeout, as Linux does), also for one an earlier timed-out call left under way; a failure leaves the socket ready for another try; a Unix socket whose listener's backlog is full is tried again on a timer (1 ms, doubling to 50 ms) |
//! | `accept`, `accept4` | wait for a connection (`SO_RCVTIMEO`) |
//! | `poll`, `ppoll` (without a signal mask), `select` | park until an fd is ready (`POLLPRI` and `select`'s exception set: urgent data too; `POLLRDNORM`, `POLLWRNORM` and the band bits as their plain forms) or the timeout passes; a zero timeout is the real call; `select` takes any `n` up to the descriptor limit, sets larger than `fd_set` included |
//! | `sleep`, `usleep`, `nanosleep`, `clock_nanosleep` (relative and `TIMER_ABSTIME`, realtime, monotonic and boottime clocks) | [`crate::sleep`]: std's `thread::sleep` uses `nanosleep` |
//! | `splice`, `tee`, `sendfile`, `sendfile64` (std's `io::copy` between pipes, sockets and files) | wait for whichever side held the transfer up, then return once something moved (`sendfile`: all it was asked for), as the kernel's blocking calls do; `SPLICE_F_NONBLOCK`, or a side the user made non-blocking, fails with `EAGAIN` at once |
//! | `vmsplice` | waits for room or data in the pipe (the kernel's call ignores the pipe's mode) |
//! | `recvmmsg`, `sendmmsg` | a receive waits for all `vlen` messages (`MSG_WAITFORONE`: the first; its `timeout` is looked at as each message comes, as in the kernel), a send sends every message whole |
//! | `getaddrinfo` | runs on fibra's blocking pool ([`unblock`](crate::unblock())) |
//! | `close` | wakes fibers waiting on the fd (they fail with `EBADF`), forgets it in the reactor |
//! | `fcntl` (`F_GETFL`, `F_SETFL`, `F_DUPFD`…), `ioctl(FIONBIO)`, `dup`, `dup2`, `dup3`, `socket`, `socketpair`, `pipe`, `pipe2` | keep the per-fd state right; otherwise the real call |
//!
//! Other names of the same calls are hooked too: `fcntl64` and `__fcntl` (C code built with
//! `_FILE_OFFSET_BITS=64` calls `fcntl64`), and the `_FORTIFY_SOURCE` forms `__read_chk`,
//! `__recv_chk`, `__recvfrom_chk`, `__poll_chk` and `__ppoll_chk`.
//!
//! MSG_DONTWAIT makes a call not wait, as it would in the kernel. Every hooked call that may
//! wait spends one unit of the fiber's [cooperative budget](crate::coop).
//!
//! # What is not
//! - Regular files, directories and block devices: their calls pass through (the kernel
//!   never reports them as not ready). Use [`crate::fs`] for file I/O that must not block.
//! - The standard streams (fds 0, 1, 2): their open file is shared with the parent process,
//!   so fibra never switches them; a read of a terminal blocks the worker.
//! - Calls made inside other shared libraries (`libssl.so`, `libpq.so`…) reach the C
//!   library directly: only code linked into the executable — all Rust code, and C code
//!   built into it — is hooked. Likewise, calls the C library makes internally
//!   (`fread`, the resolver's own sockets) are not hooked.
//! - `copy_file_range` works on regular files only (the kernel refuses pipes and sockets,
//!   and std's `io::copy` then uses `splice` or `sendfile`): it never waits.
//! - `epoll_wait`, `io_uring`, `open` of a FIFO, `flock`, `wait`/`waitpid`, futex-based
//!   locks (`std::sync::Mutex`): they block the worker.
//! - Static executables (musl): the feature needs a dynamically linked C library (glibc) to
//!   find the real functions, and fails the build elsewhere.
//!
//! # Caveats
//! - **Signals.** Hooked calls in a fiber never fail with `EINTR`: a wait is not a system
//!   call a signal could interrupt. Emulated waits on plain threads retry after `EINTR`, as
//!   with `SA_RESTART`. A signal handler that runs on a worker thread must not make hooked
//!   calls on hooked fds (they would try to park the interrupted fiber); wrap such code in
//!   [`without`] or keep it to the standard streams.
//! - **`fork`.** In the child, hooks never park (the child has no workers) and keep the
//!   table of the user's views as it was at the fork, so blocking calls on the fds fibra
//!   switched to non-blocking mode are still emulated; a program the child `exec`s sees those
//!   fds non-blocking.
//! - **Cancellation.** A fiber cancelled (by [`JoinHandle::cancel`](crate::JoinHandle::cancel)
//!   or `stop_timeout`) while it waits in a hooked call cannot unwind through the C frames
//!   that called it: the call fails with `ECANCELED` instead (a sleep just ends), later
//!   hooked calls that would wait fail the same way, and the cancellation is raised at the
//!   fiber's next suspension in fibra's own code.
//! - **Shared open files.** A socket or pipe inherited from another process, or passed over a
//!   Unix socket, is switched like any other: the other process sees the mode change. The
//!   switch is made to the open file, which every duplicate of the fd shares, and so is the
//!   user's blocking mode: a duplicate (`dup`, `try_clone`, before or after the switch) and an fd
//!   received over `SCM_RIGHTS` while another fd of this process holds its open file share
//!   one view, which `O_NONBLOCK` set through any of them changes. What the hooks cannot
//!   know: an fd received over `SCM_RIGHTS` whose open file was switched in another
//!   process, or here through fds all closed since (a hand-off that sends an fd and closes
//!   it), looks non-blocking by the user's choice, and its calls fail with `EAGAIN` instead
//!   of waiting. Keep an fd to one process, or set its mode on receipt
//!   (`set_nonblocking(false)`).
//!
//!   A plain thread already inside a real blocking call on the fd when a fiber switches it
//!   keeps blocking semantics: should the kernel restart that call after a signal
//!   (`SA_RESTART`), it fails with `EAGAIN` in non-blocking mode, and the hook goes on
//!   waiting.
//! - **Bad pointers and counts** get the kernel's error (`EFAULT`, `EINVAL`, `EMSGSIZE`), as
//!   from libc: the hooks read a caller's memory only after the kernel has, or after asking it
//!   with `process_vm_readv`. Under a seccomp filter that refuses `process_vm_readv`, a bad
//!   pointer given to a sleep, to `select`, to `ioctl(FIONBIO)` or to a `MSG_WAITALL`
//!   `recvmsg` faults in the hook instead. A `poll` array the kernel takes but that is not aligned for `pollfd` gets the
//!   real call, which blocks the worker.
//! - An fd closed behind the hooks' back (by a shared library) keeps its slot until its number
//!   is reused by a hooked call that creates fds, or closed by the hooked `close`.
//!
//! ```
//! use std::time::{Duration, Instant};
//!
//! let sched = fibra::Scheduler::builder().threads(1).build().unwrap();
//! sched.start();
//! let start = Instant::now();
//! let sleepers: Vec<_> = (0..100)
//!     .map(|_| sched.submit(|| {
//!         assert!(fibra::hook::is_active());
//!         std::thread::sleep(Duration::from_millis(50)); // parks only this fiber
//!     }, None).unwrap())
//!     .collect();
//! sleepers.into_iter().for_each(|h| h.join().unwrap());
//! // 100 sleeps of 50 ms on one worker take about 50 ms, not 5 s.
//! assert!(start.elapsed() < Duration::from_secs(4));
//! assert!(!fibra::hook::is_active()); // not in a fiber
//! sched.stop();
//! ```

mod calls;
pub(crate) mod fd;
// The C library's own functions, which the hooks and fibra's internals call: low-level
// plumbing, in `sys` so that the reactor reaches it without the hooks.
pub(crate) use crate::sys::real;
mod wait;

use crate::fiber::{current_meta, Cancelled, FiberMeta};
use crate::io::reactor::{poll_fd, poll_once, IoRecord, CLOSED, READABLE, READ_SHUT};
use crate::sys::deadline_after;
use std::os::raw::c_int;
use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Whether C library calls made here are hooked: true inside a scheduled fiber, outside
/// [`without`]. False on plain threads, in standalone [`Fiber`](crate::Fiber)s and on the
/// blocking pool.
pub fn is_active() -> bool {
    current_meta().is_some_and(|m| m.worker.is_some() && !m.hooks_off.get()) && !in_forked_child()
}

/// Runs `f` with hooks off for the running fiber: its C library calls are the real ones and
/// block the worker thread. Nests; restores the previous setting when `f` returns or unwinds.
/// Outside a fiber it just calls `f`.
///
/// ```
/// let sched = fibra::Scheduler::builder().threads(1).build().unwrap();
/// sched.start();
/// let (inside, within) = sched.block_on(|| {
///     (fibra::hook::is_active(), fibra::hook::without(fibra::hook::is_active))
/// });
/// assert_eq!((inside, within), (true, false));
/// ```
pub fn without<R>(f: impl FnOnce() -> R) -> R {
    crate::fiber::with_flag(|m| &m.hooks_off, f)
}

/// Makes the linker keep the hooks: referencing them from code every program that uses a
/// scheduler links pulls in the object that defines them, so they take precedence over the
/// C library for std's calls too. Called when a scheduler is built.
pub(crate) fn link() {
    std::hint::black_box(&calls::HOOKS);
    static AT_FORK: std::sync::Once = std::sync::Once::new();
    AT_FORK.call_once(|| {
        // SAFETY: registers a plain function with no preconditions as the child handler.
        unsafe { libc::pthread_atfork(None, None, Some(forked)) };
    });
}

/// Set in a child process made by `fork`: it has none of the parent's worker threads, so a
/// fiber's thread copied into it must not park, and the fd table must not take locks that
/// another parent thread may have held at the fork.
static FORKED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

extern "C" fn forked() {
    FORKED.store(true, std::sync::atomic::Ordering::Relaxed);
}

/// Whether this process is a `fork` child of one that built a scheduler.
#[inline(always)]
pub(crate) fn in_forked_child() -> bool {
    FORKED.load(std::sync::atomic::Ordering::Relaxed)
}

/// The fiber a hook acts for: a scheduled fiber with hooks on, not already inside a hook.
#[inline(always)]
fn active() -> Option<&'static FiberMeta> {
    let m = current_meta()?;
    (m.worker.is_some() && !m.hooks_off.get() && !m.in_hook.get() && !in_forked_child())
        .then_some(m)
}

#[inline(always)]
fn errno() -> c_int {
    // SAFETY: errno's location is valid for the calling thread.
    unsafe { *libc::__errno_location() }
}

#[inline(always)]
fn set_errno(e: c_int) {
    // SAFETY: as above.
    unsafe { *libc::__errno_location() = e }
}

/// Whether the caller's `len` bytes at `ptr` can be read, asked of the kernel:
/// `process_vm_readv` on this process copies them into a scratch buffer, and fails with
/// `EFAULT` where they are not mapped readable. The hooks read a caller's array or struct
/// themselves only after this, where the real call would read it first: a bad pointer then
/// gets libc's `EFAULT` instead of a fault. Where the kernel does not offer the call (a
/// seccomp filter refusing it) the answer is yes, as without the check. Keeps `errno`.
fn readable(ptr: *const libc::c_void, len: usize) -> bool {
    if len == 0 {
        return true;
    }
    if ptr.is_null() {
        return false;
    }
    let saved = errno();
    let mut scratch = [0u8; 512];
    let mut off = 0;
    let ok = loop {
        if off >= len {
            break true;
        }
        let n = (len - off).min(scratch.len());
        let local = libc::iovec {
            iov_base: scratch.as_mut_ptr().cast(),
            iov_len: n,
        };
        let remote = libc::iovec {
            iov_base: ptr.wrapping_byte_add(off).cast_mut(),
            iov_len: n,
        };
        // SAFETY: `local` is our scratch buffer of `n` bytes; the kernel checks `remote`,
        // which it only reads.
        let r = unsafe { libc::process_vm_readv(libc::getpid(), &local, 1, &remote, 1, 0) };
        if r < 0 {
            break errno() != libc::EFAULT;
        }
        if r as usize != n {
            // Stopped at a page it could not read.
            break false;
        }
        off += n;
    };
    set_errno(saved);
    ok
}

/// Writes `src` to the caller's memory at `dst` the way the kernel writes a result back:
/// `process_vm_writev` on this process fails with `EFAULT` where the memory cannot be
/// written (read-only, unmapped), and the answer is then false, nothing written. Where the
/// kernel does not offer the call (a seccomp filter refusing it), writes directly, as
/// before the check. Keeps `errno`.
///
/// # Safety
/// `dst` is memory the caller gave a hooked call to write `src.len()` bytes of results to.
unsafe fn write_user(dst: *mut libc::c_void, src: &[u8]) -> bool {
    if src.is_empty() {
        return true;
    }
    let saved = errno();
    let local = libc::iovec {
        iov_base: src.as_ptr().cast_mut().cast(),
        iov_len: src.len(),
    };
    let remote = libc::iovec {
        iov_base: dst,
        iov_len: src.len(),
    };
    // SAFETY: `local` is `src`, which the kernel only reads; it checks `remote`.
    let r = unsafe { libc::process_vm_writev(libc::getpid(), &local, 1, &remote, 1, 0) };
    let ok = if r < 0 && errno() != libc::EFAULT {
        // SAFETY: the caller's guarantee; no way to ask the kernel first.
        unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), dst.cast::<u8>(), src.len()) };
        true
    } else {
        r as usize == src.len()
    };
    set_errno(saved);
    ok
}

/// Runs the fiber half of a hook: marks the fiber as inside a hook, and turns a cancellation
/// that arrives while it waits into `on_cancel()` instead of an unwind into C frames. The
/// cancellation is re-raised at the fiber's next suspension outside hooks.
fn in_fiber<R>(meta: &FiberMeta, on_cancel: impl FnOnce() -> R, f: impl FnOnce() -> R) -> R {
    let prev = meta.in_hook.replace(true);
    let r = std::panic::catch_unwind(AssertUnwindSafe(f));
    meta.in_hook.set(prev);
    match r {
        Ok(r) => r,
        Err(p) if p.is::<Cancelled>() => {
            crate::fiber::caught_cancelled();
            meta.hook_cancel.set(true);
            on_cancel()
        }
        Err(_) => {
            // Only fibra's own waiting code runs in here; a panic is a bug in it, and it
            // cannot cross the C frames that called the hook.
            let msg = b"fibra: hook: a panic inside a hooked call; aborting\n";
            // SAFETY: writing a static buffer to stderr with the raw system call.
            unsafe { libc::syscall(libc::SYS_write, 2, msg.as_ptr(), msg.len()) };
            std::process::abort();
        }
    }
}

/// Fails a waiting call of a cancelled fiber: -1 (of the call's return type) with
/// `ECANCELED`.
fn cancelled<R: From<i8>>() -> R {
    set_errno(libc::ECANCELED);
    R::from(-1)
}

/// Where a call that would block waits.
#[derive(Clone, Copy)]
enum Ctx {
    Fiber(&'static FiberMeta),
    /// A plain thread (or a fiber with hooks off) on an fd fibra switched: emulate blocking.
    Thread,
}

/// Which way a call goes: its readiness interest and its socket timeout option.
#[derive(Clone, Copy)]
struct Dir {
    interest: u32,
    timeout: c_int,
}

const READ: Dir = Dir {
    interest: crate::io::reactor::READABLE,
    timeout: libc::SO_RCVTIMEO,
};
const WRITE: Dir = Dir {
    interest: crate::io::reactor::WRITABLE,
    timeout: libc::SO_SNDTIMEO,
};

/// How long a fiber first waits before it looks again at an fd the reactor could not take,
/// doubling up to [`RECHECK_MAX`] (`poll` in a fiber does the same).
const RECHECK_FIRST: Duration = Duration::from_millis(1);
/// See [`RECHECK_FIRST`].
const RECHECK_MAX: Duration = Duration::from_millis(16);

/// One call on a hooked fd that is blocking in the user's view.
struct Blocking {
    ctx: Ctx,
    fd: c_int,
    slot: &'static fd::Slot,
    state: u32,
    dir: Dir,
    /// Computed at the first wait: `Some(None)` means no timeout.
    deadline: Option<Option<Instant>>,
    generation: u32,
    /// The receive side was seen shut down (`READ_SHUT`): a read that still fails with
    /// `EAGAIN` is a datagram socket's, whose blocking read returns 0 then.
    read_shut: bool,
    /// How long a fiber sleeps before it looks again at an fd the reactor cannot take.
    recheck: Duration,
}

impl Blocking {
    fn new(ctx: Ctx, fd: c_int, slot: &'static fd::Slot, state: u32, dir: Dir) -> Self {
        Blocking {
            ctx,
            fd,
            slot,
            state,
            dir,
            deadline: None,
            generation: slot.generation(),
            read_shut: false,
            recheck: RECHECK_FIRST,
        }
    }

    /// The reactor readiness before an attempt (fibers only), for the edge-triggered
    /// clear-then-wait in [`Blocking::wait`].
    fn before(&self) -> Option<(Arc<IoRecord>, u64)> {
        match self.ctx {
            Ctx::Fiber(_) => self.slot.record().map(|r| {
                let seen = r.snapshot();
                (r, seen)
            }),
            Ctx::Thread => None,
        }
    }

    /// The socket timeout for this direction, read from the kernel (where std's
    /// `set_read_timeout` put it) once per call, on its first wait.
    fn deadline(&mut self) -> Option<Instant> {
        *self.deadline.get_or_insert_with(|| {
            if self.state & fd::SOCKET == 0 {
                return None;
            }
            let mut tv = libc::timeval {
                tv_sec: 0,
                tv_usec: 0,
            };
            let mut len = std::mem::size_of::<libc::timeval>() as libc::socklen_t;
            // SAFETY: `tv` and `len` are live and sized for the option.
            let r = unsafe {
                libc::getsockopt(
                    self.fd,
                    libc::SOL_SOCKET,
                    self.dir.timeout,
                    (&mut tv as *mut libc::timeval).cast(),
                    &mut len,
                )
            };
            let d = Duration::new(tv.tv_sec.max(0) as u64, (tv.tv_usec.max(0) * 1000) as u32);
            (r == 0 && !d.is_zero()).then(|| deadline_after(d))
        })
    }

    /// Waits until the fd may be ready again. `Err(errno)`: `EAGAIN` at the timeout, `EBADF`
    /// if the fd was closed meanwhile, `ECANCELED` for a cancelled fiber.
    fn wait(&mut self, seen: Option<(Arc<IoRecord>, u64)>) -> Result<(), c_int> {
        let deadline = self.deadline();
        let interest = self.dir.interest;
        let Ctx::Fiber(meta) = self.ctx else {
            return self.block_thread(deadline);
        };
        if meta.hook_cancel.get() {
            return Err(libc::ECANCELED);
        }
        let rec = match seen {
            Some((rec, seen)) if crate::io::reactor::reactor().is_current(&rec) => {
                rec.clear(seen, interest);
                rec
            }
            // New to the reactor, or deregistered by another owner of the fd: registering
            // reports the current readiness.
            _ => {
                let saved = errno();
                let registered = self.slot.register(self.fd);
                set_errno(saved);
                match registered {
                    Ok(rec) => rec,
                    // The reactor cannot take it (no epoll instance for want of descriptors,
                    // no memory): look again on a timer, keeping the worker free.
                    Err(_) => {
                        let soon = Instant::now() + self.recheck;
                        self.recheck = (self.recheck * 2).min(RECHECK_MAX);
                        crate::sleep_until(deadline.map_or(soon, |d| d.min(soon)));
                        return Ok(());
                    }
                }
            }
        };
        rec.wait(interest, deadline).map_err(|_| libc::EAGAIN)?;
        if self.slot.generation() != self.generation {
            return Err(libc::EBADF);
        }
        self.read_shut |= rec.snapshot() as u32 & READ_SHUT != 0;
        Ok(())
    }

    /// Waits in `poll(2)`, blocking the thread, and keeps what it says of the receive side.
    fn block_thread(&mut self, deadline: Option<Instant>) -> Result<(), c_int> {
        let bits = poll_fd(self.fd, self.dir.interest, deadline).map_err(os_error)?;
        self.read_shut |= bits & READ_SHUT != 0;
        Ok(())
    }

    /// Whether a read that failed with `EAGAIN` (after the readiness `seen`, fibers only)
    /// found the receive side shut down: a blocking read would have returned 0.
    fn ended(&mut self, seen: &Option<(Arc<IoRecord>, u64)>) -> bool {
        if let Some((_, bits)) = seen {
            self.read_shut |= *bits as u32 & READ_SHUT != 0;
        }
        self.read_shut && self.dir.interest == READ.interest
    }

    /// Runs `op` (a non-blocking attempt: `-1` with `errno` on failure) until it does not
    /// fail with `EAGAIN`, waiting in between.
    fn run(&mut self, mut op: impl FnMut() -> isize) -> isize {
        loop {
            let seen = self.before();
            let r = op();
            if r >= 0 || errno() != libc::EAGAIN {
                return r;
            }
            if self.ended(&seen) {
                return 0;
            }
            if let Err(e) = self.again(seen) {
                set_errno(e);
                return -1;
            }
        }
    }

    /// After an attempt that would block: waits as [`Blocking::wait`], unless a wait
    /// already found the fd ready at (or past) the timeout and the call still would block:
    /// time is up, `Err(EAGAIN)`.
    fn again(&mut self, seen: Option<(Arc<IoRecord>, u64)>) -> Result<(), c_int> {
        if matches!(self.deadline, Some(Some(d)) if Instant::now() >= d) {
            return Err(libc::EAGAIN);
        }
        self.wait(seen)
    }
}

/// A timeout from `poll_fd` has no OS error: it is `EAGAIN`.
fn os_error(e: std::io::Error) -> c_int {
    e.raw_os_error().unwrap_or(libc::EAGAIN)
}

/// How a call on `fd` goes: through unchanged, or blocking in a fiber or on a thread.
enum Route {
    Pass,
    Wait(Ctx, &'static fd::Slot, u32),
}

#[inline(always)]
fn route(fd: c_int) -> Route {
    if let Some(meta) = active() {
        // The standard streams classify as passing through, unless a hooked fd was
        // duplicated onto one (`Slot::classify`, `fd::duplicated`).
        if let Some(slot) = fd::slot(fd) {
            let state = slot.classify(fd);
            if fd::Slot::waits(state) {
                return Route::Wait(Ctx::Fiber(meta), slot, state);
            }
        }
        return Route::Pass;
    }
    match fd::lookup(fd) {
        Some(slot) if fd::Slot::waits(slot.state()) => Route::Wait(Ctx::Thread, slot, slot.state()),
        _ => Route::Pass,
    }
}

/// Where a call that went through unhooked goes on, with how many bytes it already moved:
/// `Some` if it failed with `EAGAIN`, or moved fewer than the `whole` a blocking call moves
/// (a pipe's write looks at the flag as it goes), on an fd that waits now. That is, fibra
/// switched its open file to non-blocking mode while the call was on its way or inside the
/// kernel, and the user's view is blocking. Two ways this happens: a plain thread's real
/// blocking call that a signal interrupts is restarted by the kernel (`SA_RESTART`) and
/// meets the new flag; or a fiber's first call switches the fd between a plain thread's
/// look at its slot and its call (a long pipe write meets it in the kernel too). A blocking
/// call never fails with `EAGAIN` nor stops short then, so it goes on waiting, as if it had
/// been routed.
///
/// A socket with a timeout in this direction keeps its result: that is how its timeout
/// ends, and the kernel does not restart such calls (it fails them with `EINTR`).
#[cold]
fn switched_under(
    fd: c_int,
    r: isize,
    dir: Dir,
    whole: impl FnOnce() -> usize,
) -> Option<(Blocking, usize)> {
    let done = if r < 0 && errno() == libc::EAGAIN {
        0
    } else if r > 0 && (r as usize) < whole() {
        r as usize
    } else {
        return None;
    };
    switched_route(fd, dir).map(|b| (b, done))
}

/// The blocking call that goes on after a call that went through unhooked failed as only a
/// non-blocking call fails (see [`switched_under`]): `Some` if the fd waits now and has no
/// timeout in this direction. Keeps `errno`.
#[cold]
fn switched_route(fd: c_int, dir: Dir) -> Option<Blocking> {
    let saved = errno();
    let go_on = || {
        // An fd never looked at (on a plain thread) whose open file fibra switched through
        // another fd: looking at it now finds that fd's view.
        fd::look_nonblocking(fd);
        let (ctx, slot, state) = match route(fd) {
            Route::Pass => return None,
            Route::Wait(ctx, slot, state) => (ctx, slot, state),
        };
        let mut b = Blocking::new(ctx, fd, slot, state, dir);
        b.deadline().is_none().then_some(b)
    };
    let r = go_on();
    set_errno(saved);
    r
}

/// A read- or write-like call on `fd`: `op` is the real call. `whole` gives the length the
/// kernel would transfer in full before a blocking call returns (0: return after any
/// progress); `op` then gets the offset to go on from. `whole` is asked (once, a
/// `LazyCell`) only after a first call: the calls that take an array of buffers compute it
/// from the array, which the kernel has then accepted (the first call moved bytes, or failed
/// with `EAGAIN`, after reading it), so a bad pointer or count gets the kernel's error, as
/// from libc, and is never read here.
#[inline(always)]
fn io(
    fd: c_int,
    dir: Dir,
    whole: impl FnOnce() -> usize,
    mut op: impl FnMut(usize) -> isize,
) -> isize {
    let whole = std::cell::LazyCell::new(whole);
    let (b, start) = match start(fd, dir, || *whole, || op(0)) {
        Ok(go_on) => go_on,
        Err(r) => return r,
    };
    let call = |b: &mut Blocking| {
        let mut done = start;
        loop {
            let r = b.run(|| op(done));
            if r < 0 {
                // Some bytes went before the failure: report them, as the kernel does.
                return if done > 0 { done as isize } else { r };
            }
            done += r as usize;
            // A receive that waits for all of its buffer ends at the urgent mark once it
            // took something, as the kernel's does.
            if r == 0 || done >= *whole || (dir.interest == READ.interest && at_mark(fd)) {
                return done as isize;
            }
        }
    };
    blocking(b, call)
}

/// How a call on `fd` that may wait begins: `Ok` with the blocking call that goes on (and
/// the bytes a first call already moved) if the fd waits, `Err` with the result of `first`
/// (the real call, made here) if it does not. See [`io`] for `whole`, [`switched_under`] for
/// a first call that met an fd switched while it was on its way.
#[inline(always)]
fn start(
    fd: c_int,
    dir: Dir,
    whole: impl FnOnce() -> usize,
    first: impl FnOnce() -> isize,
) -> Result<(Blocking, usize), isize> {
    match route(fd) {
        Route::Pass => {
            let r = first();
            switched_under(fd, r, dir, whole).ok_or(r)
        }
        Route::Wait(ctx, slot, state) => Ok((Blocking::new(ctx, fd, slot, state, dir), 0)),
    }
}

/// Makes a blocking call `call` with `b`: in a fiber, with the hook's cancellation.
#[inline(always)]
fn blocking(mut b: Blocking, call: impl FnOnce(&mut Blocking) -> isize) -> isize {
    in_ctx(b.ctx, || call(&mut b))
}

/// Runs `call`, a call that may wait, where `ctx` says: in a fiber, it spends a unit of the
/// cooperative budget and a cancellation while it waits fails it with `ECANCELED`.
#[inline(always)]
fn in_ctx(ctx: Ctx, call: impl FnOnce() -> isize) -> isize {
    match ctx {
        Ctx::Thread => call(),
        Ctx::Fiber(meta) => in_fiber(meta, cancelled, || {
            crate::coop::spend();
            call()
        }),
    }
}

/// A `MSG_PEEK | MSG_WAITALL` receive of `whole` bytes on a TCP socket: the kernel waits
/// until that many are queued and copies them without taking them, so `op` peeks from the
/// start every time, and a short peek waits for more data (or the timeout, end-of-file, an
/// error, or a part that brought ancillary data, which `op` sets `ended` for: then what it
/// saw is returned, as the kernel's peek ends there).
pub(crate) fn peek_all(
    fd: c_int,
    whole: usize,
    ended: &std::cell::Cell<bool>,
    mut op: impl FnMut() -> isize,
) -> isize {
    let b = match route(fd) {
        Route::Pass => {
            let r = op();
            // A short peek is what a non-blocking one gives: only EAGAIN goes on here.
            match switched_under(fd, r, READ, || 0) {
                Some((b, _)) => b,
                None => return r,
            }
        }
        Route::Wait(ctx, slot, state) => Blocking::new(ctx, fd, slot, state, READ),
    };
    blocking(b, |b| loop {
        let seen = b.before();
        let r = op();
        let short = r > 0 && (r as usize) < whole;
        if !short && (r >= 0 || errno() != libc::EAGAIN) {
            return r;
        }
        if short && (ended.get() || peek_ends(fd)) {
            return r;
        }
        if !short && b.ended(&seen) {
            return 0;
        }
        if short && matches!(b.ctx, Ctx::Thread) {
            // `poll` says readable while any byte is queued: wait for more by the clock.
            if b.deadline().is_some_and(|d| Instant::now() >= d) {
                return r;
            }
            std::thread::sleep(PEEK_RETRY);
            continue;
        }
        // Past the timeout a wait ends at once, saying readable (what is queued): `again`
        // ends the call there.
        if let Err(e) = b.again(seen) {
            if short {
                return r;
            }
            set_errno(e);
            return -1;
        }
    })
}

/// Whether a short whole peek on `fd` is what the kernel's returns, asked of the kernel: no
/// more data can come (the peer shut its side down, or the connection ended), or urgent
/// data lies ahead (the peek stopped at its mark). The reactor reported either once
/// already, and `poll` says readable for what is queued, so neither would end the wait.
/// Keeps `errno`.
fn peek_ends(fd: c_int) -> bool {
    let saved = errno();
    let end = poll_once(fd, READABLE, 0).is_ok_and(|bits| bits & (READ_SHUT | CLOSED) != 0);
    let mut p = libc::pollfd {
        fd,
        events: libc::POLLPRI,
        revents: 0,
    };
    // SAFETY: one live pollfd, no wait.
    let urgent = !end
        && unsafe { real::poll(&mut p, 1, 0) } > 0
        && p.revents & libc::POLLPRI != 0
        && !at_mark(fd);
    set_errno(saved);
    end || urgent
}

/// Whether the next byte to read on socket `fd` is at its urgent mark (`SIOCATMARK`).
/// Keeps `errno`.
fn at_mark(fd: c_int) -> bool {
    const SIOCATMARK: libc::c_ulong = 0x8905;
    let saved = errno();
    let mut at: c_int = 0;
    // SAFETY: SIOCATMARK writes an int, here a live one.
    let r = unsafe { real::ioctl(fd, SIOCATMARK, (&raw mut at) as libc::c_ulong) };
    set_errno(saved);
    r == 0 && at != 0
}

/// How long a plain thread's short `MSG_PEEK | MSG_WAITALL` waits before it peeks again.
const PEEK_RETRY: Duration = Duration::from_millis(1);
