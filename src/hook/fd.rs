//! What the hooks know about each file descriptor, by number.
//!
//! A slot says whether calls on the fd are hooked and, if so, what the *user* believes its
//! blocking mode is. A hooked fd is always non-blocking in the kernel (fibra switched it on
//! first use in a fiber); the user's view lives here, kept by the `fcntl`/`ioctl(FIONBIO)`
//! hooks, and decides whether a call that would block waits (parking the fiber, or polling
//! on a plain thread) or returns `EAGAIN` at once.
//!
//! The table is two-level: chunks of slots allocated on first use and never freed, so a
//! lookup is two loads with no lock. Creating and closing fds through the hooks resets their
//! slots; an fd closed behind the hooks' back (by a shared library) leaves a stale slot until
//! its number is reused by a hooked creator or closed by a hooked `close`.

use crate::io::reactor::{reactor, IoRecord};
use parking_lot::Mutex;
use std::io;
use std::sync::atomic::{AtomicPtr, AtomicU32, Ordering};
use std::sync::Arc;

const CHUNK_SHIFT: u32 = 10;
const CHUNK: usize = 1 << CHUNK_SHIFT;
/// Chunks: fds up to 2^21 have slots; calls on higher fds pass through unhooked.
const CHUNKS: usize = 1 << 11;

/// Not looked at since the fd was created or closed.
pub(crate) const UNKNOWN: u32 = 0;
/// Not hooked: a regular file, a directory, a standard stream, or an fd fibra could not make
/// non-blocking.
pub(crate) const PASS: u32 = 1;
/// Hooked: non-blocking in the kernel; the user's view is in [`USER_NONBLOCK`].
pub(crate) const HOOKED: u32 = 2;
/// A socket of `fibra::net`, which waits through its own registration: passes through.
pub(crate) const OWNED: u32 = 3;
const KIND: u32 = 3;
/// The user put the fd in non-blocking mode: calls never wait.
pub(crate) const USER_NONBLOCK: u32 = 4;
/// The fd is a socket (it may have `SO_RCVTIMEO`/`SO_SNDTIMEO`).
pub(crate) const SOCKET: u32 = 8;

pub(crate) struct Slot {
    state: AtomicU32,
    /// Bumped by every close: a waiter that sees it change returns `EBADF`.
    generation: AtomicU32,
    /// The reactor record, once a call on this fd had to wait. Also serialises first looks.
    record: Mutex<Option<Arc<IoRecord>>>,
}

static TABLE: [AtomicPtr<Slot>; CHUNKS] = [const { AtomicPtr::new(std::ptr::null_mut()) }; CHUNKS];

fn split(fd: libc::c_int) -> Option<(usize, usize)> {
    let fd = usize::try_from(fd).ok()?;
    let chunk = fd >> CHUNK_SHIFT;
    (chunk < CHUNKS).then_some((chunk, fd & (CHUNK - 1)))
}

/// The slot of `fd`, if its chunk exists.
#[inline]
pub(crate) fn lookup(fd: libc::c_int) -> Option<&'static Slot> {
    let (chunk, i) = split(fd)?;
    let base = TABLE[chunk].load(Ordering::Acquire);
    // SAFETY: a non-null chunk pointer is a leaked allocation of CHUNK slots, never freed;
    // `i < CHUNK`.
    (!base.is_null()).then(|| unsafe { &*base.add(i) })
}

/// The slot of `fd`, allocating its chunk if needed. `None` for negative or huge fds.
pub(crate) fn slot(fd: libc::c_int) -> Option<&'static Slot> {
    if let Some(s) = lookup(fd) {
        return Some(s);
    }
    let (chunk, i) = split(fd)?;
    let fresh: Box<[Slot]> = (0..CHUNK)
        .map(|_| Slot {
            state: AtomicU32::new(UNKNOWN),
            generation: AtomicU32::new(0),
            record: Mutex::new(None),
        })
        .collect();
    let fresh = Box::into_raw(fresh).cast::<Slot>();
    let base = match TABLE[chunk].compare_exchange(
        std::ptr::null_mut(),
        fresh,
        Ordering::AcqRel,
        Ordering::Acquire,
    ) {
        Ok(_) => fresh,
        Err(won) => {
            // SAFETY: `fresh` came from `Box::into_raw` of a CHUNK-slot slice just above and
            // was never shared.
            drop(unsafe { Box::from_raw(std::ptr::slice_from_raw_parts_mut(fresh, CHUNK)) });
            won
        }
    };
    // SAFETY: as in `lookup`.
    Some(unsafe { &*base.add(i) })
}

impl Slot {
    #[inline]
    pub(crate) fn state(&self) -> u32 {
        self.state.load(Ordering::Acquire)
    }

    pub(crate) fn generation(&self) -> u32 {
        self.generation.load(Ordering::Acquire)
    }

    /// Whether calls on this fd wait for it (hooked, and blocking in the user's view).
    #[inline]
    pub(crate) fn waits(state: u32) -> bool {
        state & (KIND | USER_NONBLOCK) == HOOKED
    }

    /// The state of `fd`, looking at it first if nobody has since it was created: regular
    /// files, directories, block devices and the standard streams pass through; anything
    /// else pollable is hooked and switched to non-blocking mode in the kernel.
    pub(crate) fn classify(&self, fd: libc::c_int) -> u32 {
        let s = self.state();
        if s & KIND != UNKNOWN {
            return s;
        }
        let _first = self.record.lock();
        let s = self.state();
        if s & KIND != UNKNOWN {
            return s;
        }
        // SAFETY: an all-zero `stat` is a valid value to be overwritten.
        let mut st: libc::stat = unsafe { std::mem::zeroed() };
        // SAFETY: `st` is a live, writable stat buffer.
        if fd <= 2 || unsafe { libc::fstat(fd, &mut st) } != 0 {
            // A standard stream shares its open file with the parent: switching it to
            // non-blocking mode would leak out of the process. A bad fd is left for the real
            // call to report.
            if fd <= 2 {
                self.state.store(PASS, Ordering::Release);
            }
            return PASS;
        }
        let fmt = st.st_mode & libc::S_IFMT;
        if matches!(
            fmt,
            libc::S_IFREG | libc::S_IFDIR | libc::S_IFBLK | libc::S_IFLNK
        ) {
            self.state.store(PASS, Ordering::Release);
            return PASS;
        }
        let socket = if fmt == libc::S_IFSOCK { SOCKET } else { 0 };
        // SAFETY: F_GETFL takes no argument.
        let flags = unsafe { super::real::fcntl(fd, libc::F_GETFL, 0) };
        if flags < 0 {
            return PASS;
        }
        if flags & libc::O_NONBLOCK != 0 {
            let s = HOOKED | USER_NONBLOCK | socket;
            self.state.store(s, Ordering::Release);
            return s;
        }
        // Published before the switch: a plain thread that sees the fd non-blocking must
        // already know to emulate blocking.
        let s = HOOKED | socket;
        self.state.store(s, Ordering::Release);
        // SAFETY: F_SETFL takes an int of flags.
        if unsafe { super::real::fcntl(fd, libc::F_SETFL, (flags | libc::O_NONBLOCK) as _) } < 0 {
            self.state.store(PASS, Ordering::Release);
            return PASS;
        }
        s
    }

    /// Records the user's blocking mode of a hooked fd; returns false if the fd is not
    /// hooked (the caller then passes the request to the kernel as is).
    pub(crate) fn set_user_nonblock(&self, on: bool) -> bool {
        self.state
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |s| {
                (s & KIND == HOOKED).then_some(if on {
                    s | USER_NONBLOCK
                } else {
                    s & !USER_NONBLOCK
                })
            })
            .is_ok()
    }

    /// The reactor record, if this fd has one.
    pub(crate) fn record(&self) -> Option<Arc<IoRecord>> {
        self.record.lock().clone()
    }

    /// The reactor record to wait on, registering `fd` first if needed — also when the
    /// record this slot had is no longer the fd's registration: another owner of the fd may
    /// have deregistered the record the slot shares with it (a `fibra::net` socket made from
    /// the std one and given back, `io::deregister`), and epoll no longer reports it.
    pub(crate) fn register(&self, fd: libc::c_int) -> io::Result<Arc<IoRecord>> {
        let mut r = self.record.lock();
        if let Some(r) = &*r {
            if reactor().is_current(r) {
                return Ok(r.clone());
            }
        }
        let rec = crate::io::reactor::registering()?.register(fd)?;
        *r = Some(rec.clone());
        Ok(rec)
    }

    /// Forgets everything about the fd (it was closed, or its number is new): waiters wake
    /// and see the generation change, the reactor forgets the fd.
    fn reset(&self) {
        self.generation.fetch_add(1, Ordering::AcqRel);
        let rec = {
            let mut r = self.record.lock();
            self.state.store(UNKNOWN, Ordering::Release);
            r.take()
        };
        if let Some(rec) = rec {
            reactor().deregister(&rec);
        }
    }

    fn copy_from(&self, other: &Slot) {
        let s = other.state();
        // A dup shares the open file: the kernel mode and the user's view come along.
        self.state.store(
            if s & KIND == HOOKED { s } else { UNKNOWN },
            Ordering::Release,
        );
    }
}

/// `fd` is about to be closed, or was just created: forget what we knew.
pub(crate) fn forget(fd: libc::c_int) {
    if super::in_forked_child() {
        return;
    }
    if let Some(s) = lookup(fd) {
        if s.state() != UNKNOWN || s.record.lock().is_some() {
            s.reset();
        }
    }
}

/// `new` was just made a duplicate of `old`.
pub(crate) fn duplicated(old: libc::c_int, new: libc::c_int) {
    if super::in_forked_child() {
        return;
    }
    forget(new);
    if let (Some(o), Some(n)) = (lookup(old), slot(new)) {
        n.copy_from(o);
    }
}

/// A `fibra::net` socket took `fd`: hooks leave it alone.
pub(crate) fn own(fd: libc::c_int) {
    if let Some(s) = slot(fd) {
        s.state.store(OWNED, Ordering::Release);
    }
}

/// A `fibra::net` socket let go of `fd` (it closes it, or gives it back to std), after
/// deregistering the reactor record the slot may share with it.
pub(crate) fn disown(fd: libc::c_int) {
    if let Some(s) = lookup(fd) {
        let _ = s
            .state
            .compare_exchange(OWNED, UNKNOWN, Ordering::AcqRel, Ordering::Relaxed);
        s.record.lock().take();
    }
}
