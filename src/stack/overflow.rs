//! Stack overflow reporting: a SIGSEGV/SIGBUS handler, running on an alternate signal stack,
//! that recognises a hit on the running fiber's guard page, names the fiber and aborts.
//! Any other fault goes to the handler that was installed before ours (std's, which reports
//! thread overflows, or the default action).
//!
//! Which fiber runs, and its guard page, are the fiber layer's to know: it installs the
//! handler with a [`Describe`] function that answers for the faulting address.

use std::cell::Cell;
use std::fmt::Write as _;
use std::sync::{Once, OnceLock};

/// Whether a fault at this address hit the guard page of the running fiber's stack; if so,
/// it has written which fiber overflowed (its name, id, worker and stack size) to the
/// buffer. Called in the signal handler: it must not allocate or take a lock.
pub(crate) type Describe = fn(usize, &mut dyn std::fmt::Write) -> bool;

static INSTALL: Once = Once::new();
static DESCRIBE: OnceLock<Describe> = OnceLock::new();
static PREV_SEGV: OnceLock<libc::sigaction> = OnceLock::new();
static PREV_BUS: OnceLock<libc::sigaction> = OnceLock::new();

/// Size of the alternate signal stack fibra gives a thread that has none.
const ALT_STACK_SIZE: usize = 64 * 1024;

/// Installs the handler once per process; `describe` recognises and names an overflowing
/// fiber (the first call's is kept).
pub(crate) fn install_handler(describe: Describe) {
    INSTALL.call_once(|| {
        // Before the handler can run.
        let _ = DESCRIBE.set(describe);
        for (sig, slot) in [(libc::SIGSEGV, &PREV_SEGV), (libc::SIGBUS, &PREV_BUS)] {
            // SAFETY: a zeroed sigaction is a valid "no handler" value; we fill in a handler
            // with the SA_SIGINFO signature and ask for the alternate stack, which every thread
            // that runs fibers gets from `ensure_alt_stack`.
            unsafe {
                let mut action: libc::sigaction = std::mem::zeroed();
                action.sa_sigaction = on_fault as *const () as usize;
                action.sa_flags = libc::SA_SIGINFO | libc::SA_ONSTACK;
                libc::sigemptyset(&mut action.sa_mask);
                let mut prev: libc::sigaction = std::mem::zeroed();
                if libc::sigaction(sig, &action, &mut prev) == 0 {
                    let _ = slot.set(prev);
                }
            }
        }
    });
}

thread_local! {
    static ALT_STACK: AltStack = const { AltStack { mapping: Cell::new(0) } };
}

/// An alternate signal stack this module mapped for the current thread, unmapped at exit.
struct AltStack {
    mapping: Cell<usize>,
}

impl Drop for AltStack {
    fn drop(&mut self) {
        let addr = self.mapping.get();
        // 0: none; usize::MAX: another owner's alternate stack (std's), left alone.
        if addr != 0 && addr != usize::MAX {
            // SAFETY: disable the alternate stack before unmapping it, so no signal can land
            // on freed memory; both calls only concern this thread and our own mapping.
            unsafe {
                let mut ss: libc::stack_t = std::mem::zeroed();
                ss.ss_flags = libc::SS_DISABLE;
                libc::sigaltstack(&ss, std::ptr::null_mut());
                libc::munmap(addr as *mut libc::c_void, ALT_STACK_SIZE);
            }
        }
    }
}

/// Makes sure this thread has an alternate signal stack, so the handler can run while the
/// fiber stack is exhausted. std gives one to the threads it spawns; foreign threads may lack it.
///
/// std's goes away when the thread's main function returns, before the thread-local
/// destructors run. With `recheck` (a standalone fiber, which a thread-local destructor may
/// make) a thread that had std's is asked again (one system call), so that such a destructor's
/// fiber gets a stack of ours. Workers trust what they found, to spare `block_on` the call: a
/// worker's loop runs in a thread's main function (except `use_caller`'s, driven from a
/// thread-local destructor: not covered). A call after this module's own record was destroyed
/// installs a stack that is never unmapped (the thread is exiting).
pub(crate) fn ensure_alt_stack(recheck: bool) {
    let done = ALT_STACK.try_with(|alt| {
        let m = alt.mapping.get();
        if m != 0 && (m != usize::MAX || !recheck) {
            return; // ours, installed until the record's destructor; or std's, trusted
        }
        match install_unless_present() {
            None => alt.mapping.set(usize::MAX), // someone else's: keep it, never unmap it
            Some(p) => alt.mapping.set(p),
        }
    });
    if done.is_err() {
        // The record is gone; what we install now is leaked with the exiting thread.
        let _ = install_unless_present();
    }
}

/// Installs a fresh alternate signal stack if the thread has none enabled; returns its
/// address, or `None` if one was there (or none could be made: then the handler cannot run
/// on an exhausted stack, as without this module).
fn install_unless_present() -> Option<usize> {
    // SAFETY: querying the current alternate stack only writes to `old`.
    let mut old: libc::stack_t = unsafe { std::mem::zeroed() };
    // SAFETY: as above.
    unsafe { libc::sigaltstack(std::ptr::null(), &mut old) };
    if old.ss_flags & libc::SS_DISABLE == 0 {
        return None;
    }
    // SAFETY: a fresh anonymous mapping; on success it is installed as this thread's
    // alternate stack, and the caller records it (or leaks it).
    unsafe {
        let p = libc::mmap(
            std::ptr::null_mut(),
            ALT_STACK_SIZE,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        );
        if p == libc::MAP_FAILED {
            return None;
        }
        let ss = libc::stack_t {
            ss_sp: p,
            ss_flags: 0,
            ss_size: ALT_STACK_SIZE,
        };
        if libc::sigaltstack(&ss, std::ptr::null_mut()) == 0 {
            Some(p as usize)
        } else {
            libc::munmap(p, ALT_STACK_SIZE);
            None
        }
    }
}

/// A fixed buffer for formatting inside the signal handler, where allocating is not allowed.
struct SignalBuf {
    bytes: [u8; 512],
    len: usize,
}

impl std::fmt::Write for SignalBuf {
    fn write_str(&mut self, s: &str) -> std::fmt::Result {
        let n = s.len().min(self.bytes.len() - self.len);
        self.bytes[self.len..self.len + n].copy_from_slice(&s.as_bytes()[..n]);
        self.len += n;
        Ok(())
    }
}

extern "C" fn on_fault(sig: libc::c_int, info: *mut libc::siginfo_t, ctx: *mut libc::c_void) {
    // SAFETY: the kernel passes a valid siginfo for SA_SIGINFO handlers.
    let addr = unsafe { (*info).si_addr() } as usize;
    if let Some(describe) = DESCRIBE.get() {
        let mut buf = SignalBuf {
            bytes: [0; 512],
            len: 0,
        };
        if describe(addr, &mut buf) {
            let _ = writeln!(buf, "\nfatal runtime error: stack overflow, aborting");
            // SAFETY: the write system call and abort(3) are async-signal-safe; the buffer is
            // ours. The raw system call, not libc's `write`: that may be fibra's hook, which
            // must not run in a signal handler.
            unsafe {
                libc::syscall(libc::SYS_write, 2, buf.bytes.as_ptr(), buf.len);
                libc::abort();
            }
        }
    }
    let prev = if sig == libc::SIGBUS {
        PREV_BUS.get()
    } else {
        PREV_SEGV.get()
    };
    forward(sig, info, ctx, prev);
}

/// Hands a fault that is not ours to the previous handler, or restores the default action
/// and returns so the faulting instruction runs again and the process dies as it would have.
fn forward(
    sig: libc::c_int,
    info: *mut libc::siginfo_t,
    ctx: *mut libc::c_void,
    prev: Option<&libc::sigaction>,
) {
    match prev {
        Some(p) if p.sa_sigaction != libc::SIG_DFL && p.sa_sigaction != libc::SIG_IGN => {
            if p.sa_flags & libc::SA_SIGINFO != 0 {
                // SAFETY: the previous handler was installed with the three-argument
                // signature; we pass on exactly what the kernel gave us.
                let f: extern "C" fn(libc::c_int, *mut libc::siginfo_t, *mut libc::c_void) =
                    unsafe { std::mem::transmute(p.sa_sigaction) };
                f(sig, info, ctx);
            } else {
                // SAFETY: likewise, with the one-argument signature.
                let f: extern "C" fn(libc::c_int) = unsafe { std::mem::transmute(p.sa_sigaction) };
                f(sig);
            }
        }
        _ => {
            // SAFETY: restoring the default disposition of a signal is always allowed.
            unsafe {
                let mut dfl: libc::sigaction = std::mem::zeroed();
                dfl.sa_sigaction = libc::SIG_DFL;
                libc::sigemptyset(&mut dfl.sa_mask);
                libc::sigaction(sig, &dfl, std::ptr::null_mut());
            }
        }
    }
}
