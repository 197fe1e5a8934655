//! What the hooks know about each file descriptor, by number.
//!
//! A slot says whether calls on the fd are hooked and, if so, what the *user* believes its
//! blocking mode is. A hooked fd is always non-blocking in the kernel (fibra switched it on
//! first use in a fiber); the user's view lives here, kept by the `fcntl`/`ioctl(FIONBIO)`
//! hooks, and decides whether a call that would block waits (parking the fiber, or polling
//! on a plain thread) or returns `EAGAIN` at once. The kernel's flag belongs to the open
//! file, so the view does too: fds known to share one (duplicates made through the hooks,
//! fds received over `SCM_RIGHTS` while another fd here holds their open file) are marked
//! shared, and a change of the view through one reaches them all.
//!
//! The table is two-level: chunks of slots allocated on first use and never freed, so a
//! lookup is two loads with no lock. Creating and closing fds through the hooks resets their
//! slots; an fd closed behind the hooks' back (by a shared library) leaves a stale slot until
//! its number is reused by a hooked creator or closed by a hooked `close`.

use crate::io::reactor::{reactor, IoRecord};
use parking_lot::Mutex;
use std::io;
use std::sync::atomic::{AtomicPtr, AtomicU32, AtomicU64, Ordering};
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
/// Other hooked fds may share this one's open file (a duplicate made through the hooks, or
/// an fd whose open file another hooked fd holds): a change of the user's blocking mode goes
/// to them too.
const SHARED: u32 = 16;
/// Not hooked yet, and made by a hooked call that creates fds (`socket`, `accept`, `pipe`,
/// ...) and neither duplicated nor sent over `SCM_RIGHTS` since: no other fd shares its
/// open file, so its first look need not search for one.
const FRESH: u32 = 64;
/// Not hooked yet, and known to share its open file with other fds not looked at yet
/// either (duplicates made through the hooks): `file` names that open file, and the first
/// look at any of them gives the others its state ([`Slot::spread`]), so that a copy made
/// before the switch keeps the view even once the fd that was switched is closed.
const LINKED: u32 = 128;

pub(crate) struct Slot {
    state: AtomicU32,
    /// Bumped by every close: a waiter that sees it change returns `EBADF`.
    generation: AtomicU32,
    /// While hooked: which open file the fd is, as far as the hooks know — numbered when the
    /// fd is switched, copied to the duplicates and received copies that share it. Written
    /// before the state that makes it meaningful is published.
    file: AtomicU64,
    /// While hooked: the fd's `st_dev` and `st_ino`, to find the open file of a received fd.
    dev: AtomicU64,
    ino: AtomicU64,
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
            file: AtomicU64::new(0),
            dev: AtomicU64::new(0),
            ino: AtomicU64::new(0),
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
        let linked = (s & LINKED != 0).then(|| self.file.load(Ordering::Relaxed));
        let looked = self.look(fd, s);
        if let (Some(file), HOOKED) = (linked, looked & KIND) {
            self.spread(fd, file);
        }
        looked
    }

    /// The first look at `fd` (state `s`), for [`Slot::classify`], which holds the lock.
    fn look(&self, fd: libc::c_int, s: u32) -> u32 {
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
        if flags & libc::O_NONBLOCK != 0 && s & FRESH == 0 {
            // Non-blocking: the user's choice, unless another hooked fd holds this open
            // file (a duplicate made before the switch, a received copy): then it takes
            // that fd's view, which fibra may have kept non-blocking in the kernel.
            if let Some(s) = self.adopt(fd, &st) {
                return s;
            }
        }
        self.file.store(new_file(), Ordering::Relaxed);
        self.dev.store(st.st_dev, Ordering::Relaxed);
        self.ino.store(st.st_ino, Ordering::Relaxed);
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

    /// Gives this slot's state, just looked at (`fd`'s, hooked), to the slots linked to it
    /// under open-file number `file` ([`LINKED`]) whose fds do share its open file. One that
    /// another thread is looking at meanwhile is left to that look, which finds this fd by
    /// its search.
    fn spread(&self, fd: libc::c_int, file: u64) {
        let mut linked = Vec::new();
        for_each_slot(|other_fd, other| {
            if other_fd != fd
                && other.state() & (KIND | LINKED) == LINKED
                && other.file.load(Ordering::Relaxed) == file
            {
                linked.push((other_fd, other));
            }
        });
        let socket = self.state() & SOCKET != 0;
        for (other_fd, other) in linked {
            if same_open_file(fd, other_fd, socket) != Same::Yes {
                continue;
            }
            let Some(_first) = other.record.try_lock() else {
                continue;
            };
            let _views = VIEWS.lock();
            if other.state() & (KIND | LINKED) == LINKED {
                other.copy_from(self);
            }
        }
    }

    /// Whether calls on this fd are hooked (its blocking mode is the user's view).
    pub(crate) fn hooked(&self) -> bool {
        self.state() & KIND == HOOKED
    }

    /// Records the user's blocking mode of hooked `fd` (this slot's), after the kernel took
    /// the request, and of the hooked fds that share its open file (the kernel's flag
    /// belongs to the open file). A slot whose fd turns out not to share it is stale (its
    /// fd was closed behind the hooks' back and the number reused) and is reset.
    pub(crate) fn set_user_nonblock(&self, fd: libc::c_int, on: bool) {
        let mut stale = Vec::new();
        let views = VIEWS.lock();
        let set = |slot: &Slot| {
            slot.state
                .fetch_update(Ordering::AcqRel, Ordering::Acquire, |s| {
                    (s & KIND == HOOKED).then_some(if on {
                        s | USER_NONBLOCK
                    } else {
                        s & !USER_NONBLOCK
                    })
                })
                .unwrap_or(0)
        };
        if set(self) & SHARED == 0 {
            return;
        }
        let file = self.file.load(Ordering::Relaxed);
        let socket = self.state() & SOCKET != 0;
        for_each_hooked(|other_fd, other| {
            if other_fd == fd || other.file.load(Ordering::Relaxed) != file {
                return;
            }
            match same_open_file(fd, other_fd, socket) {
                Same::Yes => {
                    set(other);
                }
                Same::No => stale.push(other),
                Same::Unknown => {}
            }
        });
        // Reset outside the lock: a reset takes the slot's own lock, which a first look
        // holds while it takes this one.
        drop(views);
        for other in stale {
            other.reset();
        }
    }

    /// Takes the view of a hooked fd that shares `fd`'s open file (`st` is `fd`'s), if there
    /// is one: the kernel's `O_NONBLOCK` on `fd` is then that file's, set by fibra (the view
    /// is blocking) or kept by it after the user cleared it through the other fd, or the
    /// user's (the view is non-blocking). Both are marked shared, so that a change of the
    /// view through either reaches the other. Returns the new state.
    ///
    /// Candidates share `fd`'s inode, and each costs a `kcmp`. A socket's or a pipe's inode
    /// has one or two open files; every eventfd, timerfd or epoll fd shares one anonymous
    /// inode, so after [`ADOPT_TRIES`] candidates the search gives up (the fd's mode is
    /// then taken as the user's): with thousands of switched eventfds, an unbounded search
    /// would make each received one cost milliseconds.
    fn adopt(&self, fd: libc::c_int, st: &libc::stat) -> Option<u32> {
        let socket = st.st_mode & libc::S_IFMT == libc::S_IFSOCK;
        let mut found = None;
        let mut tries = 0;
        for_each_hooked(|other_fd, other| {
            if found.is_none()
                && tries < ADOPT_TRIES
                && other_fd != fd
                && other.dev.load(Ordering::Relaxed) == st.st_dev
                && other.ino.load(Ordering::Relaxed) == st.st_ino
            {
                tries += 1;
                if same_open_file(fd, other_fd, socket) == Same::Yes {
                    found = Some(other);
                }
            }
        });
        let other = found?;
        let _views = VIEWS.lock();
        self.copy_from(other);
        Some(self.state())
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

    /// Makes this slot (of a new fd) a copy of `other`'s, whose open file it shares: the
    /// kernel mode and the user's view come along. Marks both as shared if hooked. Called
    /// under `VIEWS`, so that no change of the view falls between the copy and the mark.
    fn copy_from(&self, other: &Slot) {
        let s = other.state();
        if s & KIND != HOOKED {
            self.state.store(UNKNOWN, Ordering::Release);
            return;
        }
        for (to, from) in [
            (&self.file, &other.file),
            (&self.dev, &other.dev),
            (&self.ino, &other.ino),
        ] {
            to.store(from.load(Ordering::Relaxed), Ordering::Relaxed);
        }
        self.state.store(s | SHARED, Ordering::Release);
        other.state.fetch_or(SHARED, Ordering::AcqRel);
    }
}

/// How many fds of the same inode [`Slot::adopt`] compares with at most.
const ADOPT_TRIES: usize = 64;

/// Serialises changes of the user's blocking mode with the copies of it that duplicates and
/// received fds take, so that fds sharing an open file never end up with different views.
static VIEWS: Mutex<()> = Mutex::new(());

/// A new open-file number.
fn new_file() -> u64 {
    static FILES: AtomicU64 = AtomicU64::new(1);
    FILES.fetch_add(1, Ordering::Relaxed)
}

/// Calls `f(fd, slot)` for every slot.
fn for_each_slot(mut f: impl FnMut(libc::c_int, &'static Slot)) {
    for (c, chunk) in TABLE.iter().enumerate() {
        let base = chunk.load(Ordering::Acquire);
        if base.is_null() {
            continue;
        }
        for i in 0..CHUNK {
            // SAFETY: as in `lookup`.
            let slot: &'static Slot = unsafe { &*base.add(i) };
            f(((c << CHUNK_SHIFT) | i) as libc::c_int, slot);
        }
    }
}

/// Calls `f(fd, slot)` for every hooked fd's slot.
fn for_each_hooked(mut f: impl FnMut(libc::c_int, &'static Slot)) {
    for_each_slot(|fd, slot| {
        if slot.state() & KIND == HOOKED {
            f(fd, slot);
        }
    });
}

/// `fd` is about to be closed, or its number is new: forget what we knew. In a forked child
/// only the state is cleared: a lock or the reactor may have been held by a thread of the
/// parent, which the child does not have.
pub(crate) fn forget(fd: libc::c_int) {
    if let Some(s) = lookup(fd) {
        if super::in_forked_child() {
            s.generation.fetch_add(1, Ordering::AcqRel);
            s.state.store(UNKNOWN, Ordering::Release);
        } else {
            let owned = s.state() & KIND == OWNED;
            if s.state() != UNKNOWN || s.record.lock().is_some() {
                s.reset();
            }
            if owned {
                // A `fibra::net` socket's fd closed or replaced behind its back: its record
                // is the socket's, not the slot's. Deregistering wakes its waiters, which
                // then fail with `EBADF` (`Registration`), as the kernel drops the epoll
                // entry without an event.
                if let Some(r) = crate::io::reactor::get() {
                    r.deregister_fd(fd);
                }
            }
        }
    }
}

/// `fd` was just made by a hooked call that creates fds: forget what we knew, and remember
/// that no other fd shares its open file.
pub(crate) fn created(fd: libc::c_int) {
    forget(fd);
    if let Some(s) = slot(fd) {
        let _ = s
            .state
            .compare_exchange(UNKNOWN, FRESH, Ordering::AcqRel, Ordering::Relaxed);
    }
}

/// `fd` was just sent over `SCM_RIGHTS`: a copy of its open file may come back to this
/// process, so it is no longer known to be that file's only fd.
pub(crate) fn sent(fd: libc::c_int) {
    if let Some(s) = lookup(fd) {
        s.state.fetch_and(!FRESH, Ordering::AcqRel);
    }
}

/// `new` was just made a duplicate of `old`.
pub(crate) fn duplicated(old: libc::c_int, new: libc::c_int) {
    forget(new);
    let (Some(o), Some(n)) = (lookup(old), slot(new)) else {
        return;
    };
    if super::in_forked_child() {
        // No locks here (see `forget`); the duplicate shares the switched open file, so it
        // goes on emulating blocking as `old` does.
        let s = o.state();
        if s & KIND == HOOKED {
            n.state.store(s, Ordering::Release);
        }
        return;
    }
    // Serialised with a first look at `old`, which spreads its state to the linked slots.
    let _first = o.record.lock();
    let _views = VIEWS.lock();
    // `old`'s open file is shared now: its first look must search, like `new`'s.
    o.state.fetch_and(!FRESH, Ordering::AcqRel);
    let s = o.state();
    if s & KIND == UNKNOWN {
        // Neither is looked at yet: linked, so that the first look at either (or at another
        // copy) gives its state to the rest.
        if s & LINKED == 0 {
            o.file.store(new_file(), Ordering::Relaxed);
            o.state.fetch_or(LINKED, Ordering::AcqRel);
        }
        n.file
            .store(o.file.load(Ordering::Relaxed), Ordering::Relaxed);
        n.state.store(LINKED, Ordering::Release);
    } else {
        n.copy_from(o);
    }
}

/// The state of `fd`; a slot never looked at, of an fd that `O_NONBLOCK` in the kernel, is
/// looked at now, so that an fd whose open file fibra switched through another fd (a
/// duplicate made before the switch, a received copy) shows the user's view. This never
/// switches an fd (a plain thread may call it): a blocking one is left unlooked.
pub(crate) fn look_nonblocking(fd: libc::c_int) -> Option<u32> {
    let s = slot(fd)?;
    let st = s.state();
    if st & KIND != UNKNOWN || st & FRESH != 0 || super::in_forked_child() {
        return Some(st);
    }
    // SAFETY: F_GETFL takes no argument.
    let flags = unsafe { super::real::fcntl(fd, libc::F_GETFL, 0) };
    if flags < 0 || flags & libc::O_NONBLOCK == 0 {
        return Some(st);
    }
    Some(s.classify(fd))
}

/// `fd` just arrived over `SCM_RIGHTS`. Its number is new to the hooks; its open file may
/// be one the hooks switched to non-blocking mode through another fd of this process, in
/// which case it takes that fd's view of the blocking mode instead of the kernel's flag
/// (which fibra set, not the user): [`look_nonblocking`] finds it (see [`Slot::adopt`]).
pub(crate) fn received(fd: libc::c_int) {
    forget(fd);
    look_nonblocking(fd);
}

#[derive(PartialEq, Eq)]
enum Same {
    Yes,
    /// Not the same open file, or `b` is not open.
    No,
    /// Cannot tell (no `kcmp` here, and not sockets).
    Unknown,
}

/// Whether `a` and `b` are the same open file: `kcmp(KCMP_FILE)`; where it is not available
/// (ENOSYS, or EPERM under a restrictive policy), sockets (`socket`: `a` is one) compare by
/// inode, which is one open file for a socket.
fn same_open_file(a: libc::c_int, b: libc::c_int, socket: bool) -> Same {
    const KCMP_FILE: libc::c_int = 0;
    // SAFETY: getpid has no preconditions; kcmp only compares this process's fds.
    let r = unsafe {
        let pid = libc::getpid();
        libc::syscall(libc::SYS_kcmp, pid, pid, KCMP_FILE, a, b)
    };
    match r {
        0 => return Same::Yes,
        r if r > 0 => return Same::No,
        _ if std::io::Error::last_os_error().raw_os_error() == Some(libc::EBADF) => {
            return Same::No
        }
        _ => {}
    }
    if !socket {
        return Same::Unknown;
    }
    let ident = |fd| {
        // SAFETY: an all-zero `stat` is a valid value to be overwritten.
        let mut st: libc::stat = unsafe { std::mem::zeroed() };
        // SAFETY: `st` is a live, writable stat buffer.
        (unsafe { libc::fstat(fd, &mut st) } == 0).then_some((st.st_dev, st.st_ino))
    };
    match (ident(a), ident(b)) {
        (Some(x), Some(y)) if x == y => Same::Yes,
        _ => Same::No,
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
